/* gemm_fp8.h: one float8 matrix multiply for both backends (torch._scaled_mm, tensorwise scales).
 *
 * A float8 linear layer stores its operands as one-byte codes (float8_math.h) plus one fp32
 * scale per tensor, the number that was multiplied in before the cast (q = cast(x * scale)).
 * The product of two such tensors is
 *     C[M, N] = (A / a_scale)[M, K] (B / b_scale)[N, K]^T
 *             = (1 / (a_scale b_scale)) * (codes of A)(codes of B)^T
 * so the GEMM can multiply the codes themselves and apply the two scales once at the end: that
 * is what the GPU's float8 tensor cores do (cuBLASLt, compute capability 8.9 and later).
 *
 *   CPU  (gemm_fp8_cpu.c):  torchao's emulation: decode each operand and divide by its scale
 *                           (float8_dequantize, fp32), then one fp32 GEMM (gemm.h's matmul).
 *   CUDA (gemm_fp8_cuda.cu): one cublasLtMatmul on the codes, fp32 accumulation, the scales
 *                           applied by cuBLASLt (its A/B scale pointers).
 * It is a kernel, not a backend primitive: it is written over the float8 codes and casts
 * (float8_math.h, float8.h) and, on the CPU, over backend's fp32 GEMM (gemm.h).
 * The two agree to fp32 rounding, not bit for bit: the CPU rounds each A / a_scale to fp32
 * before multiplying, the GPU multiplies exact codes and scales the sum; and the GPU's float8
 * tensor cores accumulate in an order and precision of their own. torch compares _scaled_mm
 * with the emulation at 3e-3 (shared ALGORITHMS.md, "Float8").
 *
 * Layouts: everything row-major and packed. A[M, K] and B[N, K] are uint8_t codes with each row
 * running along the contraction K (a weight [out, in] as B; an activation [tokens, in] as A);
 * C[M, N] is fp32 and is overwritten (C =, no accumulation). All pointers are device pointers
 * (host memory on the CPU backend, device.h).
 *
 * The rules cuBLASLt sets for float8 (cuBLAS documentation, section "cublasLtMatmul()", and
 * "Tensor Core Usage"; shared ALGORITHMS.md, "Float8"). Both backends enforce them, so a run on
 * the CPU refuses what a GPU could not run:
 *   - formats: E4M3 x E4M3, E4M3 x E5M2 or E5M2 x E4M3. There is no E5M2 x E5M2 kernel (the
 *     documentation's FP8 type table has no such row; torch._scaled_mm refuses it too). Training
 *     never needs it: gradients are E5M2, but they always meet an E4M3 activation or weight.
 *   - shapes: K and N multiples of 16, M anything >= 1 (gemm_fp8_shape_error below).
 *   - pointers: A, B and C start on 16-byte boundaries (device_alloc's memory does, and so does
 *     a whole-row offset into it, since K and N are multiples of 16).
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "cdefs.h"
#include "float8_math.h"

C_BEGIN

/* Can this device run float8 GEMMs? CPU: always (emulated; `why` is set to ""). CUDA: compute
 * capability 8.9 (Ada) or 9.0 and later (Hopper, Blackwell), the GPUs with float8 tensor
 * cores; otherwise false, with one line in `why` (an A100, 8.0, says so). why may be NULL. */
bool gemm_fp8_supported(char *why, size_t len);

/* C[M, N] (=, fp32, row-major) = (A / a_scale)[M, K] (B / b_scale)[N, K]^T, fp32 accumulation.
 * A, B: float8 codes (row-major, rows along K) in formats fa and fb; a_scale, b_scale: their
 * tensorwise scales as the cast used them (float8_scale_from_amax), so the product is divided
 * by a_scale * b_scale. A bad format pair, shape or pointer is a programming error: the call
 * prints one line naming it (gemm_fp8_check) and aborts. Callers that take shapes from a user
 * ask gemm_fp8_shape_error first.
 * Memory: the CPU twin holds fp32 copies of A and B (MEM_BUFFERS) during the call only; the
 * CUDA twin allocates, on its first call, one MEM_BUFFERS block it keeps for the rest of the
 * run (cuBLASLt's workspace and the two scales), and nothing after that. */
void gemm_fp8(float *C, const uint8_t *A, float8_format fa, float a_scale, const uint8_t *B,
              float8_format fb, float b_scale, int M, int N, int K);

/* Rowwise scaling (torchao's ROWWISE recipe): one scale per row of each operand,
 *     C[M, N] (=) = (A[i, :] / a_scales[i])_i (B[j, :] / b_scales[j])_j^T,   fp32, row-major,
 * a_scales[M] and b_scales[N] on the device (the scales the casts multiplied in). The scales
 * factor out of each dot product, so the GEMM multiplies the codes and scales C[i, j] by
 * 1 / (a_scales[i] b_scales[j]) at the end.
 *   CPU:  the emulation: each row decoded and divided by its scale, then the fp32 GEMM.
 *   CUDA: one cublasLtMatmul with per-row scale vectors on A and B
 *         (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, cuBLAS 12.9 and later, Hopper).
 * The rules are gemm_fp8's. Returns false, leaving C as it was, where the backend has no such
 * kernel for the call (a GPU before Hopper, an older cuBLAS, or no algorithm offered for the
 * shape): the caller then runs the emulation itself. gemm_fp8_rowwise_native says whether the
 * backend multiplies the codes itself (CUDA on Hopper and later), i.e. whether taking this path
 * rather than the emulation gains anything. Memory: MEM_BUFFERS during the call only. */
bool gemm_fp8_rowwise(float *C, const uint8_t *A, float8_format fa, const float *a_scales, const uint8_t *B,
                      float8_format fb, const float *b_scales, int M, int N, int K);
bool gemm_fp8_rowwise_native(void);

/* ---- the rules, written once for both twins -------------------------------------------------
 * Shapes cuBLASLt accepts for float8: NULL, or one line saying what is wrong. The conditions
 * come from the documentation's "Tensor Core Usage" list, which float8 must satisfy: with the
 * column-major call gemm_fp8_cuda.cu makes (m = N, n = M, k = K, both operands' leading
 * dimension K, the output's N), the rows of A and B are K bytes and must be multiples of 16
 * bytes, and C's columns N * 4 bytes. We require N % 16 rather than the N % 4 that fp32 output
 * alone would need: it is torch._scaled_mm's rule (mat1's K and both of mat2's dimensions,
 * pytorch PR #108308), the one a bf16 or float8 output would need too, so the shapes a chapter
 * accepts are the ones PyTorch runs. M (the tokens) is free. The message is in a static buffer,
 * valid until the next call. */
static inline const char *gemm_fp8_shape_error(int M, int N, int K) {
    static char msg[224];
    const char *name = M < 1 ? "M" : N < 1 ? "N" : K < 1 ? "K" : NULL;
    if (name) {
        snprintf(msg, sizeof msg, "%s = %d: a float8 GEMM needs M, N and K of at least 1", name,
                 M < 1 ? M : N < 1 ? N : K);
        return msg;
    }
    name = K % 16 ? "K" : N % 16 ? "N" : NULL;
    if (!name) return NULL;
    snprintf(msg, sizeof msg,
             "%s = %d is not a multiple of 16: cuBLASLt's float8 GEMM needs the contraction K "
             "and the output width N to be multiples of 16 (16-byte aligned rows of codes; "
             "torch._scaled_mm's rule)", name, K % 16 ? K : N);
    return msg;
}

/* Format pairs cuBLASLt has kernels for: NULL, or one line. */
static inline const char *gemm_fp8_formats_error(float8_format fa, float8_format fb) {
    if ((fa != FLOAT8_E4M3 && fa != FLOAT8_E5M2) || (fb != FLOAT8_E4M3 && fb != FLOAT8_E5M2))
        return "a format is neither FLOAT8_E4M3 nor FLOAT8_E5M2";
    if (fa == FLOAT8_E5M2 && fb == FLOAT8_E5M2)
        return "E5M2 x E5M2: cuBLASLt has no float8 GEMM with both operands in E5M2 (its FP8 "
               "type table lists E4M3 x E4M3, E4M3 x E5M2 and E5M2 x E4M3); cast one of them to "
               "E4M3";
    return NULL;
}

/* What both twins check before anything else: formats, shape, 16-byte aligned pointers. A
 * violation is a bug in the caller, so it is reported with the function's name and aborts
 * (a core dump, a backtrace in a debugger) rather than returning. */
static inline void gemm_fp8_check(const float *C, const uint8_t *A, float8_format fa,
                                  const uint8_t *B, float8_format fb, int M, int N, int K) {
    const char *why = gemm_fp8_formats_error(fa, fb);
    if (!why) why = gemm_fp8_shape_error(M, N, K);
    if (!why && (((uintptr_t)A | (uintptr_t)B | (uintptr_t)C) & 15u))
        why = "A, B and C must start on 16-byte boundaries (cuBLASLt's float8 GEMM reads them "
              "in 16-byte pieces)";
    if (why) {
        fprintf(stderr, "gemm_fp8: %s\n", why);
        abort();
    }
}

C_END
