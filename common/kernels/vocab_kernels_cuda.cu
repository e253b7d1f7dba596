/* vocab_kernels_cuda.cu: the CUDA twin of vocab_kernels_cpu.c (see vocab_kernels.h).
 *
 * Same argument lists, same formulas (vocab_math.h). The two row reductions (max, sum of
 * exponentials) run one block of ROW_THREADS threads per row: thread x takes columns
 * x, x + ROW_THREADS, ..., and cub::BlockReduce combines the threads' partial results.
 * The target logit is one thread per row, the backward one thread per element, and the loss
 * sum one block that adds the rows in double in a fixed order, so the value the host gets is
 * the same on every run.
 */
#include <cub/block/block_reduce.cuh>
#include "llama_kernels.h"   /* IGNORE_INDEX */
#include "vocab_kernels.h"
#include "vocab_math.h"
#include "cuda_common.h"

#define ROW_THREADS 256
typedef cub::BlockReduce<float, ROW_THREADS> BlockReduceFloat;

/* cub takes the reduction as a function object. */
struct VocabMax {
    __device__ float operator()(const float &a, const float &b) const { return vocab_max(a, b); }
};

/* One block per row n: the local maximum, written by thread 0. */
static __global__ void row_max_kernel(float *row_max, const float *logits_local, int Vl, int Vr) {
    __shared__ BlockReduceFloat::TempStorage temp;
    const float *x = logits_local + (size_t)blockIdx.x * Vl;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < Vl; j += ROW_THREADS) m = vocab_max(m, vocab_masked_logit(x[j], j, Vr));
    m = BlockReduceFloat(temp).Reduce(m, VocabMax());   /* valid in thread 0 only */
    if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

void vocab_shard_row_max(float *row_max, const float *logits_local, int N, int Vl, int Vr) {
    if (N == 0) return;
    row_max_kernel<<<N, ROW_THREADS, 0, cuda_stream()>>>(row_max, logits_local, Vl, Vr);
    CUDA_CHECK_LAUNCH();
}

/* One block per row n: sum of e^(x - M) over the local columns, M the global maximum. */
static __global__ void row_sumexp_kernel(float *row_sumexp, const float *logits_local,
                                         const float *row_max, int Vl, int Vr) {
    __shared__ BlockReduceFloat::TempStorage temp;
    const float *x = logits_local + (size_t)blockIdx.x * Vl;
    float M = row_max[blockIdx.x], s = 0.0f;
    for (int j = threadIdx.x; j < Vl; j += ROW_THREADS) s += vocab_sumexp_term(vocab_masked_logit(x[j], j, Vr), M);
    s = BlockReduceFloat(temp).Sum(s);                   /* valid in thread 0 only */
    if (threadIdx.x == 0) row_sumexp[blockIdx.x] = s;
}

void vocab_shard_row_sumexp(float *row_sumexp, const float *logits_local, const float *row_max,
                            int N, int Vl, int Vr) {
    if (N == 0) return;
    row_sumexp_kernel<<<N, ROW_THREADS, 0, cuda_stream()>>>(row_sumexp, logits_local, row_max, Vl, Vr);
    CUDA_CHECK_LAUNCH();
}

/* One thread per row: the target's logit if this shard owns the target, else 0. */
static __global__ void target_logit_kernel(float *target_logit, const float *logits_local,
                                           const int *targets, int N, int Vl, int v0) {
    GRID_STRIDE_LOOP(n, N) {
        int j = vocab_shard_column(targets[n], v0, Vl);
        target_logit[n] = j >= 0 ? logits_local[n * Vl + j] : 0.0f;
    }
}

void vocab_shard_target_logit(float *target_logit, const float *logits_local, const int *targets,
                              int N, int Vl, int v0) {
    if (N == 0) return;
    target_logit_kernel<<<cuda_blocks(N), CUDA_THREADS, 0, cuda_stream()>>>(
        target_logit, logits_local, targets, N, Vl, v0);
    CUDA_CHECK_LAUNCH();
}

/* One block: thread x adds rows x, x + ROW_THREADS, ... in double, cub adds the threads'
 * sums. The total lands in a device global (no allocation, so the memory tables are
 * unaffected) that the host copies back. */
static __device__ double g_vocab_loss_total;

static __global__ void loss_sum_kernel(const float *row_max, const float *row_sumexp,
                                       const float *target_logit, const int *targets, int N) {
    typedef cub::BlockReduce<double, ROW_THREADS> BlockReduceDouble;
    __shared__ BlockReduceDouble::TempStorage temp;
    double acc = 0.0;
    for (int n = threadIdx.x; n < N; n += ROW_THREADS)
        if (targets[n] != IGNORE_INDEX) acc += vocab_row_loss(row_max[n], row_sumexp[n], target_logit[n]);
    double total = BlockReduceDouble(temp).Sum(acc);     /* valid in thread 0 only */
    if (threadIdx.x == 0) g_vocab_loss_total = total;
}

float vocab_shard_loss_sum(const float *row_max, const float *row_sumexp,
                           const float *target_logit, const int *targets, int N) {
    if (N == 0) return 0.0f;
    loss_sum_kernel<<<1, ROW_THREADS, 0, cuda_stream()>>>(row_max, row_sumexp, target_logit,
                                                          targets, N);
    CUDA_CHECK_LAUNCH();
    double total = 0.0;
    CUDA_CHECK(cudaMemcpyFromSymbolAsync(&total, g_vocab_loss_total, sizeof total, 0,
                                         cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));   /* the host reads `total` next */
    return (float)total;
}

/* One thread per element i = n Vl + j; it reads x[i] before writing dx[i] (aliasing is fine). */
static __global__ void backward_kernel(float *dlogits_local, const float *logits_local,
                                       const int *targets, const float *row_max,
                                       const float *row_sumexp, int N, int Vl, int Vr, int v0,
                                       float grad_scale) {
    GRID_STRIDE_LOOP(i, (size_t)N * Vl) {
        size_t n = i / Vl;
        int j = (int)(i % Vl);
        if (targets[n] == IGNORE_INDEX) { dlogits_local[i] = 0.0f; continue; }
        int t = vocab_shard_column(targets[n], v0, Vl);
        dlogits_local[i] = vocab_grad(vocab_masked_logit(logits_local[i], j, Vr), j == t, row_max[n], row_sumexp[n],
                                      grad_scale);
    }
}

void vocab_shard_cross_entropy_backward(float *dlogits_local, const float *logits_local,
                                        const int *targets, const float *row_max,
                                        const float *row_sumexp, int N, int Vl, int Vr, int v0,
                                        float grad_scale) {
    size_t n = (size_t)N * Vl;
    if (n == 0) return;
    backward_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(
        dlogits_local, logits_local, targets, row_max, row_sumexp, N, Vl, Vr, v0, grad_scale);
    CUDA_CHECK_LAUNCH();
}
