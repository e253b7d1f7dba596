/* kernels.h: the element-wise kernels of the seed lesson (chapter 00) and a few generic ones.
 * All pointers are device pointers; sizes are element counts. The formulas are in
 * kernel_math.h; kernels_cpu.c and kernels_cuda.cu are the two loops around them.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "cdefs.h"

C_BEGIN

/* out[n] = gelu(x[n]) */
void gelu_forward(float *out, const float *x, size_t n);
/* dx[n] = dout[n] * gelu'(x[n])   (overwrites dx) */
void gelu_backward(float *dx, const float *dout, const float *x, size_t n);

/* Returns sum over n of (y - t)^2 (host value). */
float mse_sum(const float *y, const float *target, size_t n);
/* dy[n] = 2 (y - t) / n_total   (n_total: the count the mean is taken over) */
void mse_backward(float *dy, const float *y, const float *target, size_t n, size_t n_total);

/* p[n] -= lr * g[n] */
void sgd_step(float *p, const float *g, size_t n, float lr);

/* y[n] += x[n] */
void add_inplace(float *y, const float *x, size_t n);
/* y[n] *= a */
void scale_inplace(float *y, float a, size_t n);

/* out[n] = x[n] rounded to bf16 (nearest, ties to even; dtype.h's bf16_from_float): the cast that
 * mixed precision puts before a GEMM's bf16 operands (linear.c). */
void cast_to_bf16(uint16_t *out, const float *x, size_t n);
/* out[n] = x[n] widened to fp32 (exact: a bf16 value is an fp32 value with 16 zero low bits). */
void cast_from_bf16(float *out, const uint16_t *x, size_t n);
/* out[n] = x[n] rounded to bf16 and kept in fp32 (the two casts above in one pass, no bf16
 * buffer; out may be x): the operand a bf16 product reads where the GEMM itself is fp32 (a CPU
 * without bf16 instructions, gemm.h's gemm_bf16_operand_type) or code that works on fp32 buffers. */
void round_to_bf16(float *out, const float *x, size_t n);

C_END
