/* gemm.h: one matrix multiply for both backends.
 *
 * Chapters think in row-major tensors: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C.
 * BLAS libraries (OpenBLAS's cblas_sgemm with CblasColMajor, cuBLAS's cublasSgemm) think
 * column-major. A row-major matrix read as column-major is its transpose, so
 *     C = op(A) op(B)   (row-major)   <=>   C^T = op(B)^T op(A)^T   (column-major)
 * which means: swap the operands, swap their transpose flags, swap M and N.
 * gemm_args_from_row_major() does this once; both backends receive the same tuple, so the
 * CPU parity tests verify exactly the arguments cuBLAS gets.
 */
#pragma once
#include <stdbool.h>
#include "cdefs.h"
#include "dtype.h"

C_BEGIN

typedef struct {
    bool swap_operands;  /* always true: the column-major call takes B first, then A */
    char transa, transb; /* 'N' or 'T', column-major meaning                        */
    int m, n, k;         /* column-major sizes                                      */
    int lda, ldb, ldc;   /* column-major leading dimensions                         */
} gemm_args;

/* Row-major description -> column-major tuple.
 * trans_a: A is stored [K,M] (use A^T); trans_b: B is stored [N,K] (use B^T).
 * lda/ldb/ldc are the row-major leading dimensions (elements between rows); pass 0 for packed. */
gemm_args gemm_args_from_row_major(bool trans_a, bool trans_b, int M, int N, int K,
                                   int lda, int ldb, int ldc);

/* The backend call (gemm_cpu.c: cblas_sgemm; gemm_cuda.cu: cublasSgemm[StridedBatched]).
 * `first` and `second` are the column-major operands (first = row-major B, second = row-major A). */
void gemm_colmajor(const gemm_args *g, float alpha, const float *first, const float *second,
                   float beta, float *C);
void gemm_colmajor_strided_batched(const gemm_args *g, float alpha,
                                   const float *first, long long stride_first,
                                   const float *second, long long stride_second, float beta,
                                   float *C, long long stride_c, int batch);

/* The typed call: the operands `first` and `second` of element type `ab`, C of type `c` (dtype.h),
 * the products accumulated in fp32 and rounded once to C's type (beta reads C in its type). The
 * pairs: fp32 operands and C (gemm_colmajor itself), bf16 operands with an fp32 or a bf16 C; fp32
 * operands into a bf16 C are refused (gemm_check_types: neither cuBLAS nor oneDNN takes them). bf16
 * runs on oneDNN's matmul in gemm_cpu.c (AVX512-BF16 or AMX where the CPU has them; widened to an
 * fp32 sgemm where oneDNN offers no bf16, or when forced by gemm_bf16_force_widen, as test_gemm
 * does to check that path) and on cublasGemmEx, CUBLAS_COMPUTE_32F, in gemm_cuda.cu. */
void gemm_colmajor_typed(const gemm_args *g, float alpha, const void *first, const void *second, dtype ab,
                         float beta, void *C, dtype c);
/* The batched twin into an fp32 C (mixed-precision attention): entry i multiplies the operands at
 * i x stride elements of `ab` and writes C + i stride_c; fp32 operands are
 * gemm_colmajor_strided_batched itself (cublasGemmStridedBatchedEx with bf16 in gemm_cuda.cu; one
 * gemm_colmajor_typed per entry on the CPU, whose BLAS has no batched call either). */
void gemm_colmajor_strided_batched_typed(const gemm_args *g, float alpha, const void *first, long long stride_first,
                                         const void *second, long long stride_second, dtype ab, float beta,
                                         float *C, long long stride_c, int batch);
/* Aborts, naming the pair, on operand and output types the typed call does not take. */
void gemm_check_types(dtype ab, dtype c);
/* The CPU: bf16 products widened to an fp32 sgemm (the path of a CPU without AVX-512) when on;
 * by default when the environment sets GEMM_BF16_WIDEN (read once). The GPU has one path: no-op. */
void gemm_bf16_force_widen(bool on);
/* The element type a bf16 product's operands are best handed over in: DTYPE_BF16 where the
 * backend multiplies bf16 itself (cuBLAS; oneDNN on a CPU with AVX-512), DTYPE_F32 where the
 * typed call would only widen them to an fp32 sgemm (oneDNN 2.x on AVX2, or widening forced). An
 * fp32 operand holding bf16 values (kernels.h's round_to_bf16) then multiplies to the same bits
 * as the bf16 one widened, without the bf16 copy and its widening: one pass over the operand,
 * not two (docs/performance.md, "Mixed precision on a CPU without AVX-512"). */
dtype gemm_bf16_operand_type(void);
/* Tests: gemm_bf16_operand_type answers bf16 while on, whatever the CPU, so that the linear's bf16
 * copies are exercised where its products would take fp32 operands (they are then widened: the
 * path above). The GPU's answer is bf16 anyway: no-op. */
void gemm_bf16_force_bf16_operands(bool on);

/* Row-major conveniences built on the calls above. */
/* C[M,N] = alpha * op(A) op(B) + beta * C, packed operands. */
void matmul(float *C, const float *A, const float *B, int M, int N, int K,
            bool trans_a, bool trans_b, float alpha, float beta);
/* The same with typed operands (mixed precision): A and B of type `ab`, C of type `c`, accumulated
 * in fp32 (gemm_colmajor_typed's pairs). matmul_typed(C, DTYPE_F32, A, B, DTYPE_F32, ...) is matmul. */
void matmul_typed(void *C, dtype c, const void *A, const void *B, dtype ab, int M, int N, int K, bool trans_a,
                  bool trans_b, float alpha, float beta);
/* Same with explicit row-major leading dimensions and `batch` matrices at the given strides
 * (elements). A stride of 0 reuses one operand for every batch entry (for example, the
 * shared key head of grouped-query attention). */
void matmul_strided_batched(float *C, const float *A, const float *B, int M, int N, int K,
                            bool trans_a, bool trans_b, int lda, int ldb, int ldc,
                            long long stride_a, long long stride_b, long long stride_c,
                            int batch, float alpha, float beta);
/* ... with typed operands A and B (`ab`: fp32, or bf16 values from llama_kernels.h's operand_in) into an fp32 C,
 * accumulated in fp32: the batched products of attention under --dtype bf16. Offsets into A and B
 * count elements of `ab`. */
void matmul_strided_batched_typed(float *C, const void *A, const void *B, dtype ab, int M, int N, int K,
                                  bool trans_a, bool trans_b, int lda, int ldb, int ldc, long long stride_a,
                                  long long stride_b, long long stride_c, int batch, float alpha, float beta);

C_END
