/* gemm_cuda.cu: the CUDA twin of gemm_cpu.c (see gemm.h).
 *
 * Both backends receive the same column-major tuple (transa, transb, m, n, k, lda, ldb, ldc)
 * built once by gemm_args_from_row_major() in gemm.c. gemm_cpu.c hands it to
 * cblas_sgemm(CblasColMajor, ...); here it goes to cublasSgemm unchanged, so the CPU parity
 * tests check exactly the arguments cuBLAS receives. The cuBLAS handle is in fp32 mode without
 * TF32 (device_init), so results match OpenBLAS to fp32 rounding.
 */
#include "gemm.h"
#include "cuda_common.h"

/* 'N' -> no transpose, 'T' -> transpose (the only two values gemm_args holds). */
static cublasOperation_t to_cublas_op(char t) {
    return (t == 'T' || t == 't') ? CUBLAS_OP_T : CUBLAS_OP_N;
}

/* Column-major C[m, n] = alpha * op(first)[m, k] * op(second)[k, n] + beta * C,
 * with leading dimensions g->lda (first), g->ldb (second), g->ldc (C). All pointers are device
 * pointers; alpha and beta are host scalars (the handle's default pointer mode). */
void gemm_colmajor(const gemm_args *g, float alpha, const float *first, const float *second,
                   float beta, float *C) {
    CUBLAS_CHECK(cublasSgemm(cuda_cublas(), to_cublas_op(g->transa), to_cublas_op(g->transb),
                             g->m, g->n, g->k, &alpha, first, g->lda, second, g->ldb,
                             &beta, C, g->ldc));
}

/* The same product for `batch` independent matrices: entry i uses first + i*stride_first,
 * second + i*stride_second and C + i*stride_c (strides in elements). A stride of 0 makes every
 * entry read the same operand (grouped-query attention shares one key head among several
 * query heads this way). */
void gemm_colmajor_strided_batched(const gemm_args *g, float alpha,
                                   const float *first, long long stride_first,
                                   const float *second, long long stride_second, float beta,
                                   float *C, long long stride_c, int batch) {
    CUBLAS_CHECK(cublasSgemmStridedBatched(cuda_cublas(), to_cublas_op(g->transa),
                                           to_cublas_op(g->transb), g->m, g->n, g->k, &alpha,
                                           first, g->lda, stride_first,
                                           second, g->ldb, stride_second,
                                           &beta, C, g->ldc, stride_c, batch));
}

/* The typed product (gemm.h): bf16 or fp32 operands and C, through cublasGemmEx with fp32
 * accumulation (CUBLAS_COMPUTE_32F: the tensor cores take bf16 operands and accumulate in fp32).
 * fp32 throughout stays cublasSgemm (gemm_colmajor), the handle's no-TF32 mode. */
static cudaDataType_t cuda_type(dtype t) { return t == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

void gemm_colmajor_typed(const gemm_args *g, float alpha, const void *first, const void *second, dtype ab,
                         float beta, void *C, dtype c) {
    gemm_check_types(ab, c);
    if (ab == DTYPE_F32) {
        gemm_colmajor(g, alpha, (const float *)first, (const float *)second, beta, (float *)C);
        return;
    }
    CUBLAS_CHECK(cublasGemmEx(cuda_cublas(), to_cublas_op(g->transa), to_cublas_op(g->transb), g->m, g->n, g->k,
                              &alpha, first, cuda_type(ab), g->lda, second, cuda_type(ab), g->ldb, &beta, C,
                              cuda_type(c), g->ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* The batched typed product: bf16 operands at their strides, fp32 C, fp32 accumulation (the
 * tensor cores), one call for the batch as the fp32 twin. */
void gemm_colmajor_strided_batched_typed(const gemm_args *g, float alpha, const void *first, long long stride_first,
                                         const void *second, long long stride_second, dtype ab, float beta,
                                         float *C, long long stride_c, int batch) {
    gemm_check_types(ab, DTYPE_F32);
    if (ab == DTYPE_F32) {
        gemm_colmajor_strided_batched(g, alpha, (const float *)first, stride_first, (const float *)second,
                                      stride_second, beta, C, stride_c, batch);
        return;
    }
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(cuda_cublas(), to_cublas_op(g->transa), to_cublas_op(g->transb), g->m,
                                            g->n, g->k, &alpha, first, cuda_type(ab), g->lda, stride_first, second,
                                            cuda_type(ab), g->ldb, stride_second, &beta, C, CUDA_R_32F, g->ldc,
                                            stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* The GPU has one bf16 path (cublasGemmEx): nothing to force; its operands are bf16. */
void gemm_bf16_force_widen(bool on) { (void)on; }
dtype gemm_bf16_operand_type(void) { return DTYPE_BF16; }
void gemm_bf16_force_bf16_operands(bool on) { (void)on; }
