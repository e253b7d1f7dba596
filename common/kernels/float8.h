/* float8.h: float8 casts of whole device arrays, tensorwise and rowwise (torchao's recipes).
 *
 * All pointers are device pointers (on the CPU backend, host memory: device.h). Float8 data is
 * one byte per element, uint8_t, allocated with device_alloc(n, category). A matrix is
 * [rows, cols], row-major and contiguous.
 *
 *   tensorwise:  one scale for the whole tensor, a host float computed from float8_amax()
 *                (torchao's default recipe: inputs and weights E4M3, gradients E5M2);
 *   rowwise:     one scale per row, scales[rows] on the device, from float8_amax_rows() and
 *                float8_scales_from_amax() (torchao's ROWWISE recipe: E4M3, power-of-two
 *                scales, each row a slice along the GEMM's contraction dimension); or one per
 *                column (float8_amax_cols, the casts with FLOAT8_PER_COL) for an operand whose contraction
 *                dimension runs down its columns.
 *
 * The per-element formulas, the formats and the scale rules are in float8_math.h;
 * float8_cpu.c and float8_cuda.cu are the two loops around them, with the same argument lists.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "cdefs.h"
#include "float8_math.h"

C_BEGIN

/* ---- amax = max |x| -------------------------------------------------------------------------
 * NaN propagates (float8_amax_merge): one NaN element makes the amax, and so the scale, NaN.
 * An infinite element gives inf (and a scale of 0). Nothing to reduce (n = 0, a row of
 * cols = 0, a column of rows = 0): 0.
 *   float8_amax:       a host float (the device waits for it)
 *   float8_amax_rows:  amax[rows] (=), the max |x| of each row of x[rows, cols]
 *   float8_amax_cols:  amax[cols] (=), the max |x| of each column of x[rows, cols]           */
float float8_amax(const float *x, size_t n);
void float8_amax_rows(float *amax, const float *x, int rows, int cols);
void float8_amax_cols(float *amax, const float *x, int rows, int cols);

/* scales[n] (=) = float8_scale_from_amax(amax[n], fmt, round_pow2): the rowwise (or columnwise)
 * scales, on the device, from float8_amax_rows's (float8_amax_cols's) output. */
void float8_scales_from_amax(float *scales, const float *amax, int n, float8_format fmt,
                             int round_pow2);

/* ---- the casts ------------------------------------------------------------------------------
 * Each cast is one backend function over n elements of a [n / cols, cols] matrix, scaled as
 * `how` says (float8_math.h): FLOAT8_PER_TENSOR by `scale` (`scales` unused), FLOAT8_PER_ROW by
 * scales[row], FLOAT8_PER_COL by scales[column] (`scale` unused). The three tensorwise ones
 * after them name the common use.
 *   quantize:       q[n] (=) = saturating_cast(x * scale), one byte per element:
 *                   NaN -> the NaN code, beyond max (inf included) -> +-max
 *   dequantize:     x[n] (=) = decode(q) / scale
 *   fake_quantize:  y[n] (=) = dequantize(quantize(x)): the fp32 numbers an fp8 GEMM multiplies,
 *                   without storing the bytes (the CPU emulation of an fp8 GEMM is an fp32 GEMM
 *                   of fake-quantized operands). y may alias x (in place).                   */
void float8_quantize_scaled(uint8_t *q, const float *x, size_t n, int cols, float8_scaling how,
                            float scale, const float *scales, float8_format fmt);
void float8_dequantize_scaled(float *x, const uint8_t *q, size_t n, int cols, float8_scaling how,
                              float scale, const float *scales, float8_format fmt);
void float8_fake_quantize_scaled(float *y, const float *x, size_t n, int cols, float8_scaling how,
                                 float scale, const float *scales, float8_format fmt);

/* tensorwise: one host scale */
static inline void float8_quantize(uint8_t *q, const float *x, size_t n, float scale,
                                   float8_format fmt) {
    float8_quantize_scaled(q, x, n, 1, FLOAT8_PER_TENSOR, scale, NULL, fmt);
}
static inline void float8_dequantize(float *x, const uint8_t *q, size_t n, float scale,
                                     float8_format fmt) {
    float8_dequantize_scaled(x, q, n, 1, FLOAT8_PER_TENSOR, scale, NULL, fmt);
}
static inline void float8_fake_quantize(float *y, const float *x, size_t n, float scale,
                                        float8_format fmt) {
    float8_fake_quantize_scaled(y, x, n, 1, FLOAT8_PER_TENSOR, scale, NULL, fmt);
}

/* ---- transpose ------------------------------------------------------------------------------
 * dst [cols, rows] (=) the transpose of src [rows, cols], float8 codes (one byte each). cuBLASLt
 * multiplies float8 operands only with the contraction dimension contiguous in both (its "TN"
 * layout), so a GEMM that contracts over another dimension (the backward's dx = dy W and
 * dW = dy^T x) transposes its float8 operands first, as torchao does. */
void float8_transpose(uint8_t *dst, const uint8_t *src, int rows, int cols);

C_END
