/* linear.c: the linear layer y = x W^T, shared by both backends.
 *
 * A linear is GEMMs and nothing else, so it is written once over gemm.h (OpenBLAS or cuBLAS,
 * the same argument tuples): the CPU tests check exactly the calls the GPU makes. W is stored
 * [out, in], as PyTorch's nn.Linear stores it. In mixed precision (the *_in functions at the end)
 * the operands are rounded to bf16 for the call and the GEMMs accumulate in fp32.
 */
#include "device.h"
#include "gemm.h"
#include "kernels.h"
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

/* ---- in a compute precision (mixed precision: --dtype bf16) ---------------------------------- */

/* The elements rounded to bf16 so far (chapter 07 sets a step's count beside its formula). */
static size_t rounded;
size_t linear_bf16_rounded(void) { return rounded; }
void linear_bf16_uncount(size_t n) { rounded -= n; }

/* A bf16 copy of x[n] for the call's GEMMs (MEM_BUFFERS; freed by the caller). */
static uint16_t *bf16_copy(const float *x, size_t n) {
    uint16_t *h = device_alloc_elems(n, DTYPE_BF16, MEM_BUFFERS);
    cast_to_bf16(h, x, n);
    rounded += n;
    return h;
}

float *bf16_values(const float *x, size_t n) {
    uint16_t *h = device_alloc_elems(n, DTYPE_BF16, MEM_BUFFERS);
    float *v = device_alloc_floats(n, MEM_BUFFERS);
    cast_to_bf16(h, x, n);
    cast_from_bf16(v, h, n);   /* exact: a bf16 value is an fp32 value */
    device_free(h);
    return v;
}
float *linear_bf16_values(const float *x, size_t n) {
    rounded += n;
    return bf16_values(x, n);
}

/* y[N, out] = bf16(x) bf16(W)^T, accumulated in fp32 */
void linear_forward_in(dtype compute, float *y, const float *x, const float *W, int N, int in, int out) {
    if (compute != DTYPE_BF16) { linear_forward(y, x, W, N, in, out); return; }
    uint16_t *xh = bf16_copy(x, (size_t)N * in), *Wh = bf16_copy(W, (size_t)out * in);
    matmul_typed(y, DTYPE_F32, xh, Wh, DTYPE_BF16, N, out, in, false, true, 1.0f, 0.0f);
    device_free(xh);
    device_free(Wh);
}

/* dx[N, in] = bf16(dy) bf16(W) + dx_beta dx;  dW[out, in] += bf16(dy)^T bf16(x); fp32 accumulation */
void linear_backward_in(dtype compute, float *dx, float dx_beta, float *dW, const float *dy, const float *x,
                        const float *W, int N, int in, int out) {
    if (compute != DTYPE_BF16) { linear_backward_beta(dx, dx_beta, dW, dy, x, W, N, in, out); return; }
    uint16_t *dyh = bf16_copy(dy, (size_t)N * out);
    if (dx) {
        uint16_t *Wh = bf16_copy(W, (size_t)out * in);
        matmul_typed(dx, DTYPE_F32, dyh, Wh, DTYPE_BF16, N, in, out, false, false, 1.0f, dx_beta);
        device_free(Wh);
    }
    if (dW) {
        uint16_t *xh = bf16_copy(x, (size_t)N * in);
        matmul_typed(dW, DTYPE_F32, dyh, xh, DTYPE_BF16, out, in, N, true, false, 1.0f, 1.0f);
        device_free(xh);
    }
    device_free(dyh);
}
