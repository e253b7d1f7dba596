/* moe_kernels_cuda.cu: the CUDA twin of moe_kernels_cpu.c (see moe_kernels.h).
 *
 * Same argument lists, same formulas (moe_math.h). The router's rows are short (E experts, a few
 * dozen at most), so its softmax (or sigmoid) is one thread per row; the row movements are one thread per
 * element of the output, each summing its token's copies in order (no atomics); the gates'
 * gradient is one block per copy, its dot product reduced by cub::BlockReduce.
 */
#include <cub/block/block_reduce.cuh>
#include "moe_kernels.h"
#include "moe_math.h"
#include "cuda_common.h"

#define DOT_THREADS 128
typedef cub::BlockReduce<float, DOT_THREADS> BlockReduceFloat;

static __global__ void scores_kernel(float *scores, const float *logits, int N, int E, int sigmoid) {
    GRID_STRIDE_LOOP(n, N) moe_scores_row(scores + n * E, logits + n * E, E, sigmoid);
}
void moe_router_scores(float *scores, const float *logits, int N, int E, int sigmoid) {
    if (N == 0) return;
    scores_kernel<<<cuda_blocks(N), CUDA_THREADS, 0, cuda_stream()>>>(scores, logits, N, E, sigmoid);
    CUDA_CHECK_LAUNCH();
}

static __global__ void scores_backward_kernel(float *dlogits, const float *dscores, const float *scores, int N, int E,
                                              int sigmoid) {
    GRID_STRIDE_LOOP(n, N) moe_scores_backward_row(dlogits + n * E, dscores + n * E, scores + n * E, E, sigmoid);
}
void moe_router_scores_backward(float *dlogits, const float *dscores, const float *scores, int N, int E, int sigmoid) {
    if (N == 0) return;
    scores_backward_kernel<<<cuda_blocks(N), CUDA_THREADS, 0, cuda_stream()>>>(dlogits, dscores, scores, N, E, sigmoid);
    CUDA_CHECK_LAUNCH();
}

static __global__ void gather_kernel(float *dst, const float *src, const int *index, int n, int D) {
    GRID_STRIDE_LOOP(i, (size_t)n * D) dst[i] = src[(size_t)index[i / D] * D + i % D];
}
void moe_gather_rows(float *dst, const float *src, const int *index, int n, int D) {
    if (n == 0 || D == 0) return;
    gather_kernel<<<cuda_blocks((size_t)n * D), CUDA_THREADS, 0, cuda_stream()>>>(dst, src, index, n, D);
    CUDA_CHECK_LAUNCH();
}

static __global__ void combine_kernel(float *h, const float *y, const int *slot, const float *gates, int N, int k,
                                      int D) {
    GRID_STRIDE_LOOP(i, (size_t)N * D) h[i] += moe_combine_elem(y, slot, gates, (int)(i / D), k, D, (int)(i % D));
}
void moe_combine(float *h, const float *y, const int *slot, const float *gates, int N, int k, int D) {
    if (N == 0 || D == 0) return;
    combine_kernel<<<cuda_blocks((size_t)N * D), CUDA_THREADS, 0, cuda_stream()>>>(h, y, slot, gates, N, k, D);
    CUDA_CHECK_LAUNCH();
}

/* One block per copy i = t*k + j: its row of dy, and the dot product dh[t] . y[slot[i]]. */
static __global__ void combine_backward_kernel(float *dy, float *dgates, const float *dh, const float *y,
                                               const int *slot, const float *gates, int k, int D) {
    __shared__ BlockReduceFloat::TempStorage temp;
    size_t i = blockIdx.x, row = (size_t)slot[i] * D;
    const float *g = dh + (i / k) * D;
    if (slot[i] < 0) {   /* dropped: no row, no gradient (the whole block returns alike) */
        if (threadIdx.x == 0) dgates[i] = 0.0f;
        return;
    }
    float dot = 0.0f;
    for (int c = threadIdx.x; c < D; c += DOT_THREADS) {
        dy[row + c] = gates[i] * g[c];
        dot += g[c] * y[row + c];
    }
    dot = BlockReduceFloat(temp).Sum(dot);   /* valid in thread 0 only */
    if (threadIdx.x == 0) dgates[i] = dot;
}
void moe_combine_backward(float *dy, float *dgates, const float *dh, const float *y, const int *slot,
                          const float *gates, int N, int k, int D) {
    if ((size_t)N * k == 0) return;
    combine_backward_kernel<<<(unsigned)((size_t)N * k), DOT_THREADS, 0, cuda_stream()>>>(dy, dgates, dh, y, slot,
                                                                                         gates, k, D);
    CUDA_CHECK_LAUNCH();
}
