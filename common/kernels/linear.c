/* linear.c: the linear layer y = x W^T, shared by both backends.
 *
 * A linear is GEMMs and nothing else, so it is written once over gemm.h (OpenBLAS or cuBLAS,
 * the same argument tuples): the CPU tests check exactly the calls the GPU makes. W is stored
 * [out, in], as PyTorch's nn.Linear stores it.
 */
#include "gemm.h"
#include "llama_kernels.h"

/* x[N, in], W[out, in] -> y[N, out] = x W^T. */
void linear_forward(float *y, const float *x, const float *W, int N, int in, int out) {
    matmul(y, x, W, N, out, in, false, true, 1.0f, 0.0f);
}

/* dx[N, in] = dy W + dx_beta dx (skipped when dx is NULL: the first layer's input needs no
 * gradient); dW[out, in] += dy^T x (beta = 1 accumulates, e.g. over microbatches). */
static void linear_backward_beta(float *dx, float dx_beta, float *dW, const float *dy, const float *x,
                                 const float *W, int N, int in, int out) {
    if (dx) matmul(dx, dy, W, N, in, out, false, false, 1.0f, dx_beta);
    if (dW) matmul(dW, dy, x, out, in, N, true, false, 1.0f, 1.0f);
}

void linear_backward(float *dx, float *dW, const float *dy, const float *x, const float *W,
                     int N, int in, int out) {
    linear_backward_beta(dx, 0.0f, dW, dy, x, W, N, in, out);
}

void linear_backward_accumulate(float *dx, float *dW, const float *dy, const float *x, const float *W,
                                int N, int in, int out) {
    linear_backward_beta(dx, 1.0f, dW, dy, x, W, N, in, out);
}
