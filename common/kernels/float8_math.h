/* float8_math.h: the two 8-bit floating-point formats of float8 training, and the scaling
 * recipe that fits a tensor into them (torchao's dynamic scaling).
 *
 * Each formula is defined here once, as in llama_math.h: float8_cpu.c calls these functions in
 * loops, float8_cuda.cu once per thread, so the CPU tests check the arithmetic the GPU runs.
 *
 * The formats (Micikevicius et al. 2022, "FP8 Formats for Deep Learning"; PyTorch's
 * torch.float8_e4m3fn and torch.float8_e5m2):
 *
 *            bits        bias  max finite    min normal  min subnormal  inf     NaN
 *   E4M3fn   s eeee mmm    7   0x7E = 448    2^-6        2^-9           none    0x7F, 0xFF
 *   E5M2     s eeeee mm   15   0x7B = 57344  2^-14       2^-16          0x7C    0x7D-0x7F
 *
 * A code with exponent field e and mantissa field m (mbits mantissa bits) is worth
 *   e > 0:  (1 + m / 2^mbits) 2^(e - bias)       (normal: an implicit leading 1)
 *   e = 0:  (m / 2^mbits) 2^(1 - bias)           (subnormal: no implicit 1, the smallest exponent)
 * and the sign bit negates it. E4M3 has more precision (3 mantissa bits), E5M2 more range
 * (5 exponent bits): forward tensors (activations, weights) use E4M3, gradients E5M2.
 * "fn" = finite, NaN-only: E4M3fn gives up infinities and all but one NaN pattern per sign,
 * so that exponent 15 holds ordinary numbers up to 448 (it would stop at 240 as IEEE-style).
 * E5M2 is IEEE-like: it is exactly the top byte of an fp16, infinities and NaNs included.
 *
 * Encoding (fp32 -> fp8) rounds to nearest, ties to even, and SATURATES: every value beyond
 * the largest finite number, infinities included, becomes +-max. A non-saturating cast (c10's)
 * turns E4M3 overflow into NaN and E5M2 overflow into inf, and one such value poisons the
 * whole GEMM; torchao clamps to +-max before casting, and so do we. NaN stays NaN.
 * The encoder works on the bits of the fp32 number: fp32 is itself s + 8 exponent bits (bias
 * 127) + 23 mantissa bits, so converting is re-biasing the exponent and rounding away the
 * 23 - mbits low mantissa bits.
 */
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "cdefs.h"

typedef enum { FLOAT8_E4M3 = 0, FLOAT8_E5M2 = 1 } float8_format;

/* The codes the formats reserve (with the sign bit clear; | 0x80 for the negative twin). */
#define FLOAT8_E4M3_MAX_CODE 0x7Eu   /* 0 1111 110 = 1.75 * 2^8 = 448                         */
#define FLOAT8_E4M3_NAN_CODE 0x7Fu   /* 0 1111 111: the only NaN (per sign)                   */
#define FLOAT8_E5M2_MAX_CODE 0x7Bu   /* 0 11110 11 = 1.75 * 2^15 = 57344                      */
#define FLOAT8_E5M2_INF_CODE 0x7Cu   /* 0 11111 00: infinity, as in IEEE formats             */
#define FLOAT8_E5M2_NAN_CODE 0x7Eu   /* 0 11111 10: the NaN we write (the quiet NaN: top
                                      * mantissa bit set; the top byte of fp16's 0x7E00, which
                                      * is what c10 writes too). 0x7D and 0x7F are NaNs also. */
/* torchao's floor on amax in the scale (float8_utils.EPS): an all-zero tensor gets a large,
 * finite scale instead of a division by zero. */
#define FLOAT8_AMAX_EPS 1e-12

/* ---- fp32 bits -------------------------------------------------------------------------------
 * The one place that reinterprets a float as its 32 bits and back. memcpy is the portable C way
 * (a pointer cast would break strict aliasing) and compiles to a register move; CUDA device
 * code has intrinsics for it.                                                                  */
#ifdef __CUDA_ARCH__
HD static inline uint32_t float8_f32_bits(float x) { return __float_as_uint(x); }
HD static inline float float8_f32_from_bits(uint32_t u) { return __uint_as_float(u); }
#else
HD static inline uint32_t float8_f32_bits(float x) { uint32_t u; memcpy(&u, &x, sizeof u); return u; }
HD static inline float float8_f32_from_bits(uint32_t u) { float x; memcpy(&x, &u, sizeof x); return x; }
#endif

/* v / 2^r rounded to the nearest integer, ties to even (1 <= r <= 31, v + 2^(r-1) < 2^32).
 * The r bits shifted out are a fraction f of the last kept bit. Adding 2^(r-1) - 1 carries
 * into the kept bits exactly when f > 1/2; adding the kept LSB as well makes f = 1/2 carry
 * only when the kept number is odd, so a tie lands on the even neighbour. A carry out of the
 * mantissa moves into the exponent field, which is the correct next number (e.g. 1.111b
 * rounds up to 10.000b = the next power of two).                                              */
HD static inline uint32_t float8_shift_round_even(uint32_t v, int r) {
    uint32_t lsb = (v >> r) & 1u;
    return (v + (1u << (r - 1)) - 1u + lsb) >> r;
}

/* ---- the codec, for any layout -------------------------------------------------------------
 * Both formats are fp32 with fewer bits: mbits mantissa bits instead of 23 and an exponent bias
 * `bias` instead of 127. For a normal number the fp32 bits (without the sign) and the fp8 code
 * are related by
 *   fp32 bits = (code << (23 - mbits)) + ((127 - bias) << 23)
 * (the mantissa moves to the top of fp32's mantissa field; the exponent field, which sits just
 * above it, gains 127 - bias). The two format-specific things, the special codes and the
 * largest finite code, are arguments.                                                          */

/* A finite code (sign included) to its value. */
HD static inline float float8_decode_finite(uint8_t code, int mbits, int bias) {
    uint32_t sign = (uint32_t)(code & 0x80u) << 24;   /* bit 7 -> fp32's bit 31 */
    uint32_t mag = code & 0x7Fu;
    if (mag >= (1u << mbits))                          /* exponent field >= 1: normal */
        return float8_f32_from_bits(sign | ((mag << (23 - mbits)) + ((uint32_t)(127 - bias) << 23)));
    /* Subnormal: mag is m, the value m * 2^(1 - bias - mbits). The power of two is an fp32
     * normal number (exponent field 127 + 1 - bias - mbits), and the product of a small integer
     * and a power of two is exact. */
    float step = float8_f32_from_bits((uint32_t)(127 + 1 - bias - mbits) << 23);
    float v = (float)mag * step;
    return sign ? -v : v;                              /* code 0x80 is -0.0 */
}

/* A float to the nearest code, ties to even, saturating at max_code; NaN -> nan_code. */
HD static inline uint8_t float8_encode_saturating(float x, int mbits, int bias, uint32_t max_code,
                                                  uint32_t nan_code) {
    uint32_t u = float8_f32_bits(x);
    uint32_t sign = (u >> 24) & 0x80u;                 /* fp32's bit 31 -> bit 7 */
    uint32_t a = u & 0x7FFFFFFFu;                      /* the bits of |x|; ordered like |x| */
    const int shift = 23 - mbits;                      /* fp32 mantissa bits fp8 drops */
    const uint32_t rebias = (uint32_t)(127 - bias) << 23;
    if (a > 0x7F800000u) return (uint8_t)(sign | nan_code);               /* NaN */
    /* Saturation: |x| >= max (inf included) gives max. Values a little above max would round
     * to max anyway; the rest would round to the next code up, which is NaN (E4M3) or inf
     * (E5M2). Comparing bits is comparing magnitudes, for non-negative floats.               */
    if (a >= (max_code << shift) + rebias) return (uint8_t)(sign | max_code);
    /* Normal range, |x| >= 2^(1 - bias) (fp8 exponent field >= 1): re-bias the exponent and
     * round away the low mantissa bits. Rounding up from the largest mantissa carries into the
     * exponent; it cannot pass max_code, since |x| < max.                                    */
    if (a >= (1u << 23) + rebias) return (uint8_t)(sign | float8_shift_round_even(a - rebias, shift));
    /* Subnormal range: the code is m = |x| / 2^(1 - bias - mbits) rounded to an integer
     * (m = 2^mbits, when it rounds up that far, is exactly the smallest normal code).
     * |x| = S 2^(E - 150) with S = 1.mantissa as a 24-bit integer, E the fp32 exponent field,
     * so m = S / 2^r with r = 151 - bias - mbits - E >= 24 - mbits.                          */
    uint32_t E = a >> 23;
    int r = (int)(151 - bias - mbits) - (int)E;
    /* fp32 zeros and subnormals (E = 0), and anything with r >= 25 (|x| < 1/2 of the smallest
     * fp8 subnormal: S < 2^24, so S / 2^r < 1/2, never a tie), round to zero. */
    if (E == 0 || r >= 25) return (uint8_t)sign;
    uint32_t S = (a & 0x7FFFFFu) | 0x800000u;
    return (uint8_t)(sign | float8_shift_round_even(S, r));
}

/* ---- E4M3fn: s eeee mmm, bias 7, max 448, no infinities, NaN = 0x7F / 0xFF ----------------- */
HD static inline float float8_e4m3_decode(uint8_t code) {
    /* exponent 1111 is an ordinary exponent here (values 256..448), except mantissa 111 */
    if ((code & 0x7Fu) == FLOAT8_E4M3_NAN_CODE)
        return float8_f32_from_bits(((uint32_t)(code & 0x80u) << 24) | 0x7FC00000u);
    return float8_decode_finite(code, 3, 7);
}
/* Saturating: 480, 1e30 and inf all give 448 (c10's cast gives NaN for every |x| > 464, the
 * midpoint between 448 and the NaN code's place; 464 itself is a tie and goes to even 448). */
HD static inline uint8_t float8_e4m3_encode(float x) {
    return float8_encode_saturating(x, 3, 7, FLOAT8_E4M3_MAX_CODE, FLOAT8_E4M3_NAN_CODE);
}

/* ---- E5M2: s eeeee mm, bias 15, max 57344, inf = 0x7C / 0xFC, NaN = 0x7D-0x7F / 0xFD-0xFF ---- */
HD static inline float float8_e5m2_decode(uint8_t code) {
    uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    uint32_t mag = code & 0x7Fu;
    if (mag == FLOAT8_E5M2_INF_CODE) return float8_f32_from_bits(sign | 0x7F800000u);
    if (mag > FLOAT8_E5M2_INF_CODE) return float8_f32_from_bits(sign | 0x7FC00000u);
    return float8_decode_finite(code, 2, 15);
}
/* Saturating: everything above 57344, inf included, gives 57344 (c10's cast, through fp16,
 * gives inf from 59392 up: the midpoint to the inf code, a tie that goes to the even 0x7C).
 * The encoder never produces the infinity code. */
HD static inline uint8_t float8_e5m2_encode(float x) {
    return float8_encode_saturating(x, 2, 15, FLOAT8_E5M2_MAX_CODE, FLOAT8_E5M2_NAN_CODE);
}

/* ---- either format ----------------------------------------------------------------------- */
HD static inline float float8_decode(uint8_t code, float8_format fmt) {
    return fmt == FLOAT8_E4M3 ? float8_e4m3_decode(code) : float8_e5m2_decode(code);
}
HD static inline uint8_t float8_encode(float x, float8_format fmt) {
    return fmt == FLOAT8_E4M3 ? float8_e4m3_encode(x) : float8_e5m2_encode(x);
}
/* The largest finite value, torch.finfo(dtype).max: 1.75 * 2^8 and 1.75 * 2^15. */
HD static inline float float8_max(float8_format fmt) {
    return fmt == FLOAT8_E4M3 ? 448.0f : 57344.0f;
}

/* ---- amax: the largest magnitude of a tensor, a row or a column -----------------------------
 * The reduction's combine step, max(a, b) of two magnitudes, with NaN PROPAGATED: if either
 * is NaN the result is NaN. That is torch.max(torch.abs(x))'s behaviour (torchao's amax), and
 * it is deliberate: a NaN in a tensor then gives a NaN scale and a NaN loss, which the training
 * loop sees, instead of being quietly ignored (fmaxf would drop it). Max is exact and this
 * combine is associative and commutative, so every reduction order, CPU loop or GPU tree,
 * gives the same bits. The empty reduction is 0 (every magnitude is >= 0).                   */
HD static inline float float8_amax_merge(float a, float b) {
    if (isnan(a)) return a;
    if (isnan(b)) return b;
    return b > a ? b : a;
}

/* ---- scales (torchao float8_utils.amax_to_scale) -------------------------------------------
 * A tensor is multiplied by `scale` before the cast, so that its largest magnitude lands on
 * the format's max and the small values keep as many of fp8's few bits as possible.
 *
 * Power-of-two scales (torchao's round_scales_to_power_of_2, the rowwise recipe's default):
 * scale = 2^floor(log2(scale)), rounded DOWN so amax * scale still fits under max. Multiplying
 * by a power of two only changes the exponent, so x * scale and q / scale add no rounding of
 * their own. Computed exactly with frexpf (scale = f 2^e, f in [0.5, 1) -> 2^(e-1)); torchao's
 * exp2(floor(log2(scale))) in fp32 agrees except for a scale within an ulp or so below a power
 * of two, where fp32 log2 can round up to the integer. 0, inf and NaN are returned as they are. */
HD static inline float float8_round_scale_pow2(float scale) {
    if (!(scale > 0.0f) || isinf(scale)) return scale;
    int e;
    frexpf(scale, &e);
    return ldexpf(1.0f, e - 1);
}
/*   scale = fp8_max / max(amax, 1e-12), computed in double, then rounded to fp32,
 * then optionally rounded down to a power of two.
 * amax = 1 -> 448 (E4M3), 57344 (E5M2), or 256 and 32768 as powers of two; amax = 0 ->
 * 448 / 1e-12 = 4.48e14 (the floor keeps it finite). A NaN amax gives a NaN scale (torch.clamp
 * lets NaN through, and so does this comparison, false for NaN), an infinite amax gives 0.    */
HD static inline float float8_scale_from_amax(float amax, float8_format fmt, int round_pow2) {
    double a = (double)amax < FLOAT8_AMAX_EPS ? FLOAT8_AMAX_EPS : (double)amax;
    float scale = (float)((double)float8_max(fmt) / a);
    return round_pow2 ? float8_round_scale_pow2(scale) : scale;
}

/* ---- quantize, dequantize (torchao hp_tensor_to_float8 / _Float8Tensor.to_original_precision)
 *   q  = saturating_cast(x * scale)   the product in fp32, then the saturating encoder
 *   x' = decode(q) / scale            a division, as torchao does (x * (1/scale) could differ
 *                                     in the last bit unless the scale is a power of two)
 * fake_quantize = dequantize(quantize(x)): the fp32 value an fp8 GEMM actually sees, which is
 * how the CPU emulates one ((A / sA) @ (B / sB) in fp32).                                     */
HD static inline uint8_t float8_quantize_value(float x, float scale, float8_format fmt) {
    return float8_encode(x * scale, fmt);
}
HD static inline float float8_dequantize_value(uint8_t q, float scale, float8_format fmt) {
    return float8_decode(q, fmt) / scale;
}
HD static inline float float8_fake_quantize_value(float x, float scale, float8_format fmt) {
    return float8_dequantize_value(float8_quantize_value(x, scale, fmt), scale, fmt);
}

/* How an array [rows, cols] (row-major) is scaled: one scale for the whole tensor, one per row,
 * or one per column. Rowwise scaling takes each slice along the GEMM's contraction dimension:
 * the rows of an operand whose contraction runs along its rows, the columns of one whose
 * contraction runs down its columns (dW = dy^T x contracts over the token rows).             */
typedef enum { FLOAT8_PER_TENSOR = 0, FLOAT8_PER_ROW, FLOAT8_PER_COL } float8_scaling;

/* The scale of element i = r cols + c: `scale`, scales[r] or scales[c]. One kernel serves all
 * three.                                                                                      */
HD static inline float float8_element_scale(size_t i, float8_scaling how, float scale,
                                            const float *scales, int cols) {
    if (how == FLOAT8_PER_ROW) return scales[i / (size_t)cols];
    if (how == FLOAT8_PER_COL) return scales[i % (size_t)cols];
    return scale;
}
