/* seq_layout_cpu.c: the CPU loops of seq_layout.h (the CUDA twin is seq_layout_cuda.cu).
 *
 * Each map keeps a run of floats together: a row of C floats (seq_chunk_index), a row of one
 * rank's Hg heads, Hg hd floats (both Ulysses maps). For o a multiple of that run, element o + k
 * of the run is at index(o) + k on the other side, so each loop evaluates the map once per run
 * and copies the run with memcpy: the same numbers as the element-by-element loop of the CUDA
 * twin, without its 6 to 8 integer divisions per float. Measured in interleaved pairs of runs,
 * element by element -> by rows: chapter 06's all-to-all at make bench-06's size 185 -> 118, 508 ->
 * 297, 248 -> 113 ms a step; chapter 08 at --dp-shard 4 --tp 2, make bench's size, 365 -> 240,
 * 588 -> 521, 752 -> 566 ms (sequence parallelism's copies; the machine shared, load 3.4 to 4.9). */
#include <string.h>
#include "seq_layout.h"

void seq_chunks_to_sequence(float *x, const float *chunks, int p, int B, int Ts, int C) {
    size_t n = (size_t)p * B * Ts * C;
    for (size_t i = 0; i < n; i += C) memcpy(x + i, chunks + seq_chunk_index(i, p, B, Ts, C), C * sizeof(float));
}

void seq_sequence_to_chunks(float *chunks, const float *x, int p, int B, int Ts, int C) {
    size_t n = (size_t)p * B * Ts * C;
    for (size_t i = 0; i < n; i += C) memcpy(chunks + seq_chunk_index(i, p, B, Ts, C), x + i, C * sizeof(float));
}

static size_t ulysses_numel(ulysses_shape s) { return (size_t)s.C * s.B * s.Tl * s.Hg * s.hd; }
static size_t ulysses_run(ulysses_shape s) { return (size_t)s.Hg * s.hd; }   /* one row's Hg heads */

void ulysses_heads_to_chunks(float *chunks, const float *x, ulysses_shape s) {
    size_t run = ulysses_run(s);
    for (size_t o = 0; o < ulysses_numel(s); o += run) memcpy(chunks + o, x + ulysses_head_index(o, s), run * sizeof(float));
}
void ulysses_chunks_to_heads(float *x, const float *chunks, ulysses_shape s) {
    size_t run = ulysses_run(s);
    for (size_t o = 0; o < ulysses_numel(s); o += run) memcpy(x + ulysses_head_index(o, s), chunks + o, run * sizeof(float));
}
void ulysses_rank_rows_to_sequence(float *y, const float *recv, ulysses_shape s) {
    size_t run = ulysses_run(s);
    for (size_t o = 0; o < ulysses_numel(s); o += run) memcpy(y + o, recv + ulysses_rank_row_index(o, s), run * sizeof(float));
}
void ulysses_sequence_to_rank_rows(float *recv, const float *y, ulysses_shape s) {
    size_t run = ulysses_run(s);
    for (size_t o = 0; o < ulysses_numel(s); o += run) memcpy(recv + ulysses_rank_row_index(o, s), y + o, run * sizeof(float));
}
