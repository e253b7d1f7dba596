/* seq_layout_cuda.cu: the CUDA twin of seq_layout_cpu.c (see seq_layout.h).
 *
 * The CPU loop over i becomes one thread per element (a grid-stride loop). Each thread reads
 * one element and writes one, at the index seq_chunk_index() gives on both backends; consecutive
 * threads touch consecutive channels c, so reads and writes stay coalesced within a row.
 */
#include "seq_layout.h"
#include "cuda_common.h"

#define GRID_STRIDE_LOOP(i, n)                                                   \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)(n); \
         i += (size_t)gridDim.x * blockDim.x)

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
