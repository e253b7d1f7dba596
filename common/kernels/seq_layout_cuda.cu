/* seq_layout_cuda.cu: the CUDA twin of seq_layout_cpu.c (see seq_layout.h).
 *
 * The CPU loop over i becomes one thread per element (a grid-stride loop). Each thread reads
 * one element and writes one, at the index seq_chunk_index() gives on both backends; consecutive
 * threads touch consecutive channels c, so reads and writes stay coalesced within a row.
 */
#include "seq_layout.h"
#include "cuda_common.h"

static __global__ void chunks_to_sequence_kernel(float *x, const float *chunks, int p, int B,
                                                 int Ts, int C, size_t n) {
    GRID_STRIDE_LOOP(i, n) x[i] = chunks[seq_chunk_index(i, p, B, Ts, C)];
}

static __global__ void sequence_to_chunks_kernel(float *chunks, const float *x, int p, int B,
                                                 int Ts, int C, size_t n) {
    GRID_STRIDE_LOOP(i, n) chunks[seq_chunk_index(i, p, B, Ts, C)] = x[i];
}

void seq_chunks_to_sequence(float *x, const float *chunks, int p, int B, int Ts, int C) {
    size_t n = (size_t)p * B * Ts * C;
    if (n == 0) return;
    chunks_to_sequence_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(x, chunks, p, B,
                                                                                Ts, C, n);
    CUDA_CHECK_LAUNCH();
}

void seq_sequence_to_chunks(float *chunks, const float *x, int p, int B, int Ts, int C) {
    size_t n = (size_t)p * B * Ts * C;
    if (n == 0) return;
    sequence_to_chunks_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(chunks, x, p, B,
                                                                                Ts, C, n);
    CUDA_CHECK_LAUNCH();
}

/* ---- Ulysses: one thread per element, the index maps of seq_layout.h ---- */

static size_t ulysses_numel(ulysses_shape s) { return (size_t)s.C * s.B * s.Tl * s.Hg * s.hd; }

/* gather: dst[o] = src[map(o)]; scatter: dst[map(o)] = src[o] */
static __global__ void ulysses_kernel(float *dst, const float *src, ulysses_shape s, bool by_heads,
                                      bool gather, size_t n) {
    GRID_STRIDE_LOOP(o, n) {
        size_t i = by_heads ? ulysses_head_index(o, s) : ulysses_rank_row_index(o, s);
        if (gather) dst[o] = src[i];
        else dst[i] = src[o];
    }
}

static void ulysses_launch(float *dst, const float *src, ulysses_shape s, bool by_heads, bool gather) {
    size_t n = ulysses_numel(s);
    if (n == 0) return;
    ulysses_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(dst, src, s, by_heads, gather, n);
    CUDA_CHECK_LAUNCH();
}

void ulysses_heads_to_chunks(float *chunks, const float *x, ulysses_shape s) { ulysses_launch(chunks, x, s, true, true); }
void ulysses_chunks_to_heads(float *x, const float *chunks, ulysses_shape s) { ulysses_launch(x, chunks, s, true, false); }
void ulysses_rank_rows_to_sequence(float *y, const float *recv, ulysses_shape s) { ulysses_launch(y, recv, s, false, true); }
void ulysses_sequence_to_rank_rows(float *recv, const float *y, ulysses_shape s) { ulysses_launch(recv, y, s, false, false); }
