/* gemm.c: the row-major -> column-major mapping, shared by both backends.
 *
 * Row-major C[M,N] = op(A)[M,K] op(B)[K,N] is column-major C^T[N,M] = op(B)^T op(A)^T.
 * So the column-major call gets: first operand B, second operand A, m = N, n = M, k = K,
 * transa = trans_b, transb = trans_a, and the same leading dimensions (a row-major leading
 * dimension is the column-major one of the transposed view).
 */
#include <stdio.h>
#include <stdlib.h>
#include "comm.h"
#include "gemm.h"

gemm_args gemm_args_from_row_major(bool trans_a, bool trans_b, int M, int N, int K,
                                   int lda, int ldb, int ldc) {
    /* packed defaults: A is [M,K] (or [K,M] when transposed), B is [K,N] (or [N,K]) */
    if (lda == 0) lda = trans_a ? M : K;
    if (ldb == 0) ldb = trans_b ? K : N;
    if (ldc == 0) ldc = N;
    gemm_args g;
    g.swap_operands = true;
    g.transa = trans_b ? 'T' : 'N';
    g.transb = trans_a ? 'T' : 'N';
    g.m = N;
    g.n = M;
    g.k = K;
    g.lda = ldb;
    g.ldb = lda;
    g.ldc = ldc;
    return g;
}

void matmul(float *C, const float *A, const float *B, int M, int N, int K,
            bool trans_a, bool trans_b, float alpha, float beta) {
    gemm_args g = gemm_args_from_row_major(trans_a, trans_b, M, N, K, 0, 0, 0);
    gemm_colmajor(&g, alpha, B, A, beta, C);
    comm_progress_in_flight();   /* the transfers in flight move between the GEMMs (comm.h) */
}

void gemm_check_types(dtype ab, dtype c) {
    bool known = (ab == DTYPE_F32 || ab == DTYPE_BF16) && (c == DTYPE_F32 || c == DTYPE_BF16);
    if (known && !(ab == DTYPE_F32 && c == DTYPE_BF16)) return;
    fprintf(stderr, "gemm: %s operands into a %s C: the typed GEMM takes fp32 into fp32 and bf16 into fp32 or bf16\n",
            dtype_name(ab), dtype_name(c));
    abort();
}

void matmul_typed(void *C, dtype c, const void *A, const void *B, dtype ab, int M, int N, int K, bool trans_a,
                  bool trans_b, float alpha, float beta) {
    gemm_args g = gemm_args_from_row_major(trans_a, trans_b, M, N, K, 0, 0, 0);
    gemm_colmajor_typed(&g, alpha, B, A, ab, beta, C, c);
    comm_progress_in_flight();
}

void matmul_strided_batched(float *C, const float *A, const float *B, int M, int N, int K,
                            bool trans_a, bool trans_b, int lda, int ldb, int ldc,
                            long long stride_a, long long stride_b, long long stride_c,
                            int batch, float alpha, float beta) {
    gemm_args g = gemm_args_from_row_major(trans_a, trans_b, M, N, K, lda, ldb, ldc);
    gemm_colmajor_strided_batched(&g, alpha, B, stride_b, A, stride_a, beta, C, stride_c, batch);
}

void matmul_strided_batched_typed(float *C, const void *A, const void *B, dtype ab, int M, int N, int K,
                                  bool trans_a, bool trans_b, int lda, int ldb, int ldc, long long stride_a,
                                  long long stride_b, long long stride_c, int batch, float alpha, float beta) {
    gemm_args g = gemm_args_from_row_major(trans_a, trans_b, M, N, K, lda, ldb, ldc);
    gemm_colmajor_strided_batched_typed(&g, alpha, B, stride_b, A, stride_a, ab, beta, C, stride_c, batch);
}
