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

float *bf16_values(const float *x, size_t n) {
    float *v = device_alloc_overwritten(n * sizeof(float), MEM_BUFFERS);   /* written whole below */
    round_to_bf16(v, x, n);
    return v;
}
float *linear_bf16_values(const float *x, size_t n) {
    rounded += n;
    return bf16_values(x, n);
}

/* x[n] rounded to bf16 for a call's GEMMs (MEM_BUFFERS; freed by the caller), in the element
 * type the backend's bf16 product reads (gemm_bf16_operand_type): bf16, or the same values held in
 * fp32 where the product would widen them to an fp32 sgemm anyway (a CPU without AVX-512). Either
 * way the GEMM multiplies the same values: the same bits. */
static void *bf16_copy(const float *x, size_t n, dtype t) {
    if (t != DTYPE_BF16) return bf16_values(x, n);
    uint16_t *h = device_alloc_overwritten(n * sizeof(uint16_t), MEM_BUFFERS);
    cast_to_bf16(h, x, n);
    return h;
}
/* ... a linear's, counted */
static void *bf16_operand(const float *x, size_t n, dtype t) {
    rounded += n;
    return bf16_copy(x, n, t);
}

const void *operand_in(dtype compute, const float *x, size_t n, dtype *t) {
    if (compute != DTYPE_BF16) {
        *t = DTYPE_F32;
        return x;
    }
    *t = gemm_bf16_operand_type();
    return bf16_copy(x, n, *t);
}
const void *operand_in_place(dtype compute, float *x, size_t n, dtype *t) {
    if (compute == DTYPE_BF16 && gemm_bf16_operand_type() == DTYPE_F32) {
        *t = DTYPE_F32;
        round_to_bf16(x, x, n);
        return x;
    }
    return operand_in(compute, x, n, t);
}
void operand_release(const float *x, const void *operand) {
    if (operand != x) device_free((void *)operand);
}

/* y[N, out] = bf16(x) bf16(W)^T, accumulated in fp32 */
void linear_forward_in(dtype compute, float *y, const float *x, const float *W, int N, int in, int out) {
    if (compute != DTYPE_BF16) { linear_forward(y, x, W, N, in, out); return; }
    dtype t = gemm_bf16_operand_type();
    void *xh = bf16_operand(x, (size_t)N * in, t), *Wh = bf16_operand(W, (size_t)out * in, t);
    matmul_typed(y, DTYPE_F32, xh, Wh, t, N, out, in, false, true, 1.0f, 0.0f);
    device_free(xh);
    device_free(Wh);
}

/* dx[N, in] = bf16(dy) bf16(W) + dx_beta dx;  dW[out, in] += bf16(dy)^T bf16(x); fp32 accumulation */
void linear_backward_in(dtype compute, float *dx, float dx_beta, float *dW, const float *dy, const float *x,
                        const float *W, int N, int in, int out) {
    if (compute != DTYPE_BF16) { linear_backward_beta(dx, dx_beta, dW, dy, x, W, N, in, out); return; }
    dtype t = gemm_bf16_operand_type();
    void *dyh = bf16_operand(dy, (size_t)N * out, t);
    if (dx) {
        void *Wh = bf16_operand(W, (size_t)out * in, t);
        matmul_typed(dx, DTYPE_F32, dyh, Wh, t, N, in, out, false, false, 1.0f, dx_beta);
        device_free(Wh);
    }
    if (dW) {
        void *xh = bf16_operand(x, (size_t)N * in, t);
        matmul_typed(dW, DTYPE_F32, dyh, xh, t, out, in, N, true, false, 1.0f, 1.0f);
        device_free(xh);
    }
    device_free(dyh);
}
