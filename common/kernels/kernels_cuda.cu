/* kernels_cuda.cu: the CUDA twin of kernels_cpu.c (see kernels.h).
 *
 * Each CPU loop `for (i = 0; i < n; i++) out[i] = f(...)` becomes a kernel in which every
 * thread handles the elements i = thread, thread + (threads in the grid), ... (a "grid-stride
 * loop", so any n works with a bounded grid). The formula f is the same function from
 * kernel_math.h on both backends; nothing here re-derives it.
 *
 * All pointers are device pointers. Everything is launched on the rank's one stream
 * (cuda_common.h), so kernels run in the order they were issued; only mse_sum, which returns a
 * host value, waits for the GPU.
 */
#include <cub/block/block_reduce.cuh>
#include "kernels.h"
#include "kernel_math.h"
#include "dtype.h"
#include "cuda_common.h"

/* The index of this thread's first element and the stride to its next one. */
/* ---- GELU ------------------------------------------------------------------------------ */

static __global__ void gelu_forward_kernel(float *out, const float *x, size_t n) {
    GRID_STRIDE_LOOP(i, n) out[i] = gelu_value(x[i]);
}

/* out[n] = gelu(x[n]) */
void gelu_forward(float *out, const float *x, size_t n) {
    if (n == 0) return;
    gelu_forward_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(out, x, n);
    CUDA_CHECK_LAUNCH();
}

static __global__ void gelu_backward_kernel(float *dx, const float *dout, const float *x,
                                            size_t n) {
    GRID_STRIDE_LOOP(i, n) dx[i] = dout[i] * gelu_derivative(x[i]);
}

/* dx[n] = dout[n] * gelu'(x[n])  (overwrites dx; dx may alias dout, each element is read
 * before it is written by the same thread) */
void gelu_backward(float *dx, const float *dout, const float *x, size_t n) {
    if (n == 0) return;
    gelu_backward_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(dx, dout, x, n);
    CUDA_CHECK_LAUNCH();
}

/* ---- mean squared error ------------------------------------------------------------------ */

/* mse_sum reduces with a single block: each of its MSE_THREADS threads adds up every
 * MSE_THREADS-th term in double (as the CPU loop does), then cub::BlockReduce combines the
 * per-thread sums. One block keeps the order of additions fixed from run to run (no atomics,
 * no second pass) and is plenty for the toy model of chapter 00, the only user. */
#define MSE_THREADS 512

/* The sum lands in this device-side global; the host copies it out (no allocation needed, so
 * the memory tables are unaffected). */
static __device__ double g_mse_result;

static __global__ void mse_sum_kernel(const float *y, const float *target, size_t n) {
    typedef cub::BlockReduce<double, MSE_THREADS> BlockReduce;
    __shared__ typename BlockReduce::TempStorage temp;
    double acc = 0.0;
    for (size_t i = threadIdx.x; i < n; i += MSE_THREADS) acc += mse_term(y[i], target[i]);
    double total = BlockReduce(temp).Sum(acc);     /* valid in thread 0 only */
    if (threadIdx.x == 0) g_mse_result = total;
}

/* Returns sum over n of (y - t)^2 as a host float (accumulated in double, like kernels_cpu.c). */
float mse_sum(const float *y, const float *target, size_t n) {
    if (n == 0) return 0.0f;
    mse_sum_kernel<<<1, MSE_THREADS, 0, cuda_stream()>>>(y, target, n);
    CUDA_CHECK_LAUNCH();
    double sum = 0.0;
    CUDA_CHECK(cudaMemcpyFromSymbolAsync(&sum, g_mse_result, sizeof sum, 0,
                                         cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));   /* the host reads `sum` next */
    return (float)sum;
}

static __global__ void mse_backward_kernel(float *dy, const float *y, const float *target,
                                           size_t n, float inv_n) {
    GRID_STRIDE_LOOP(i, n) dy[i] = mse_grad(y[i], target[i], inv_n);
}

/* dy[n] = 2 (y - t) / n_total. The reciprocal is taken once on the host, in float, exactly as
 * the CPU twin does, so both backends multiply by the same number. */
void mse_backward(float *dy, const float *y, const float *target, size_t n, size_t n_total) {
    if (n == 0) return;
    float inv_n = 1.0f / (float)n_total;
    mse_backward_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(dy, y, target, n,
                                                                           inv_n);
    CUDA_CHECK_LAUNCH();
}

/* ---- SGD and generic element-wise helpers ------------------------------------------------- */

static __global__ void sgd_step_kernel(float *p, const float *g, size_t n, float lr) {
    GRID_STRIDE_LOOP(i, n) p[i] = sgd_update(p[i], g[i], lr);
}

/* p[n] -= lr * g[n] */
void sgd_step(float *p, const float *g, size_t n, float lr) {
    if (n == 0) return;
    sgd_step_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(p, g, n, lr);
    CUDA_CHECK_LAUNCH();
}

static __global__ void add_inplace_kernel(float *y, const float *x, size_t n) {
    GRID_STRIDE_LOOP(i, n) y[i] += x[i];
}

/* y[n] += x[n] */
void add_inplace(float *y, const float *x, size_t n) {
    if (n == 0) return;
    add_inplace_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(y, x, n);
    CUDA_CHECK_LAUNCH();
}

static __global__ void scale_inplace_kernel(float *y, float a, size_t n) {
    GRID_STRIDE_LOOP(i, n) y[i] *= a;
}

/* y[n] *= a */
void scale_inplace(float *y, float a, size_t n) {
    if (n == 0) return;
    scale_inplace_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(y, a, n);
    CUDA_CHECK_LAUNCH();
}

/* ---- the cast to bf16 (mixed precision's GEMM operands) --------------------------------- */

static __global__ void cast_to_bf16_kernel(uint16_t *out, const float *x, size_t n) {
    GRID_STRIDE_LOOP(i, n) out[i] = bf16_from_float(x[i]);
}

/* out[n] = x[n] rounded to bf16 (dtype.h's rounding, the CPU's) */
void cast_to_bf16(uint16_t *out, const float *x, size_t n) {
    if (n == 0) return;
    cast_to_bf16_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(out, x, n);
    CUDA_CHECK_LAUNCH();
}

static __global__ void cast_from_bf16_kernel(float *out, const uint16_t *x, size_t n) {
    GRID_STRIDE_LOOP(i, n) out[i] = bf16_to_float(x[i]);
}

/* out[n] = x[n] widened to fp32 (exact) */
void cast_from_bf16(float *out, const uint16_t *x, size_t n) {
    if (n == 0) return;
    cast_from_bf16_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(out, x, n);
    CUDA_CHECK_LAUNCH();
}

static __global__ void round_to_bf16_kernel(float *out, const float *x, size_t n) {
    GRID_STRIDE_LOOP(i, n) out[i] = bf16_to_float(bf16_from_float(x[i]));
}

/* out[n] = x[n] rounded to bf16, kept in fp32 (out may be x: each thread reads then writes its own) */
void round_to_bf16(float *out, const float *x, size_t n) {
    if (n == 0) return;
    round_to_bf16_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(out, x, n);
    CUDA_CHECK_LAUNCH();
}
