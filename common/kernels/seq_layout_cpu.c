/* seq_layout_cpu.c: the CPU loops of seq_layout.h (the CUDA twin is seq_layout_cuda.cu). */
#include "seq_layout.h"

void seq_chunks_to_sequence(float *x, const float *chunks, int p, int B, int Ts, int C) {
    size_t n = (size_t)p * B * Ts * C;
    for (size_t i = 0; i < n; i++) x[i] = chunks[seq_chunk_index(i, p, B, Ts, C)];
}

void seq_sequence_to_chunks(float *chunks, const float *x, int p, int B, int Ts, int C) {
    size_t n = (size_t)p * B * Ts * C;
    for (size_t i = 0; i < n; i++) chunks[seq_chunk_index(i, p, B, Ts, C)] = x[i];
}

static size_t ulysses_numel(ulysses_shape s) { return (size_t)s.C * s.B * s.Tl * s.Hg * s.hd; }

void ulysses_heads_to_chunks(float *chunks, const float *x, ulysses_shape s) {
    for (size_t o = 0; o < ulysses_numel(s); o++) chunks[o] = x[ulysses_head_index(o, s)];
}
void ulysses_chunks_to_heads(float *x, const float *chunks, ulysses_shape s) {
    for (size_t o = 0; o < ulysses_numel(s); o++) x[ulysses_head_index(o, s)] = chunks[o];
}
void ulysses_rank_rows_to_sequence(float *y, const float *recv, ulysses_shape s) {
    for (size_t o = 0; o < ulysses_numel(s); o++) y[o] = recv[ulysses_rank_row_index(o, s)];
}
void ulysses_sequence_to_rank_rows(float *recv, const float *y, ulysses_shape s) {
    for (size_t o = 0; o < ulysses_numel(s); o++) recv[ulysses_rank_row_index(o, s)] = y[o];
}
