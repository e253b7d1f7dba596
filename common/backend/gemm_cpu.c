/* gemm_cpu.c: the column-major tuple handed to OpenBLAS, exactly as cuBLAS gets it. */
#include <cblas.h>
#include "gemm.h"

static enum CBLAS_TRANSPOSE to_cblas(char t) { return t == 'T' ? CblasTrans : CblasNoTrans; }

void gemm_colmajor(const gemm_args *g, float alpha, const float *first, const float *second,
                   float beta, float *C) {
    cblas_sgemm(CblasColMajor, to_cblas(g->transa), to_cblas(g->transb), g->m, g->n, g->k,
                alpha, first, g->lda, second, g->ldb, beta, C, g->ldc);
}

/* cuBLAS has cublasSgemmStridedBatched; on the CPU the batch is a loop. */
void gemm_colmajor_strided_batched(const gemm_args *g, float alpha,
                                   const float *first, long long stride_first,
                                   const float *second, long long stride_second, float beta,
                                   float *C, long long stride_c, int batch) {
    for (int i = 0; i < batch; i++)
        gemm_colmajor(g, alpha, first + i * stride_first, second + i * stride_second, beta,
                      C + i * stride_c);
}
