/* gemm_cpu.c: the column-major tuple handed to OpenBLAS, exactly as cuBLAS gets it; the typed
 * (bf16) products through oneDNN's matmul. */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "gemm.h"

#if DNNL_VERSION_MAJOR != 2
#error "gemm_cpu.c is written for oneDNN 2.x's C API (Debian 12's libdnnl-dev 2.6); oneDNN 3 renamed its descriptors"
#endif

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

/* ---- typed products: oneDNN's matmul ---------------------------------------------------------
 * OpenBLAS 0.3.21 (Debian 12) has no bf16 GEMM; oneDNN's matmul takes bf16 operands, accumulates
 * in fp32 and writes fp32 or bf16, on AVX512-BF16 or AMX tiles where the CPU has them: a quarter
 * of sgemm's time on this project's machine (tools/bench_gemm_bf16.c; docs/performance.md, "bf16
 * GEMMs on the CPU"). oneDNN 2.x offers bf16 only on CPUs with AVX-512; elsewhere (AVX2) the
 * product is computed by widening the operands to fp32 (exact), sgemm, and one rounding of a bf16
 * C: the same arithmetic, slower. oneDNN caches the primitives it creates, so building one per
 * call costs a few microseconds after the first of each shape. */

static void dnnl_check(dnnl_status_t status, const char *what) {
    if (status == dnnl_success) return;
    fprintf(stderr, "gemm_cpu: oneDNN's %s failed (status %d)\n", what, (int)status);
    abort();
}
#define DNNL(call) dnnl_check((call), #call)

static dnnl_engine_t cpu_engine(dnnl_stream_t *stream) {
    static dnnl_engine_t engine;
    static dnnl_stream_t s;
    if (!engine) {
        DNNL(dnnl_engine_create(&engine, dnnl_cpu, 0));
        DNNL(dnnl_stream_create(&s, engine, dnnl_stream_default_flags));
    }
    *stream = s;
    return engine;
}

static dnnl_data_type_t dnnl_type(dtype t) { return t == DTYPE_BF16 ? dnnl_bf16 : dnnl_f32; }

/* A [rows, cols] matrix of type t whose element (i, j) sits at i * row_stride + j * col_stride. */
static dnnl_memory_desc_t matrix_desc(int rows, int cols, long long row_stride, long long col_stride, dtype t) {
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = {rows, cols}, strides = {row_stride, col_stride};
    DNNL(dnnl_memory_desc_init_by_strides(&md, 2, dims, dnnl_type(t), strides));
    return md;
}

/* A column-major bf16 matrix [rows, cols] with leading dimension ld, widened into fp32 (the same
 * layout, exact). */
static float *widened(const void *x, int rows, int cols, int ld) {
    size_t n = (size_t)(cols - 1) * ld + rows;
    float *w = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) w[i] = bf16_to_float(((const uint16_t *)x)[i]);
    return w;
}

/* Without oneDNN's bf16 (a CPU without AVX-512): the operands widened to fp32, sgemm into fp32 (C
 * read in its type when beta is not 0), then one rounding of a bf16 C. */
static void widened_gemm(const gemm_args *g, float alpha, const void *first, const void *second, float beta,
                         void *C, dtype c) {
    int first_rows = g->transa == 'T' ? g->k : g->m, first_cols = g->transa == 'T' ? g->m : g->k;
    int second_rows = g->transb == 'T' ? g->n : g->k, second_cols = g->transb == 'T' ? g->k : g->n;
    float *a = widened(first, first_rows, first_cols, g->lda), *b = widened(second, second_rows, second_cols, g->ldb);
    float *out = c == DTYPE_BF16 ? widened(C, g->m, g->n, g->ldc) : C;
    gemm_colmajor(g, alpha, a, b, beta, out);
    if (c == DTYPE_BF16)
        for (int j = 0; j < g->n; j++)
            for (int i = 0; i < g->m; i++)
                ((uint16_t *)C)[(size_t)j * g->ldc + i] = bf16_from_float(out[(size_t)j * g->ldc + i]);
    free(a);
    free(b);
    if (out != C) free(out);
}

/* The column-major tuple read back as the row-major product it came from (gemm.c): C [M, N] =
 * op(A) [M, K] op(B) [K, N] with A = second, B = first; a transposed operand is the same memory
 * read with its strides swapped. */
static int forced_widen = -1;   /* -1: the environment's GEMM_BF16_WIDEN, at the first bf16 GEMM */
void gemm_bf16_force_widen(bool on) { forced_widen = on; }
static bool widening_forced(void) {
    if (forced_widen < 0) forced_widen = getenv("GEMM_BF16_WIDEN") != NULL;   /* read once, not a GEMM */
    return forced_widen;
}

void gemm_colmajor_typed(const gemm_args *g, float alpha, const void *first, const void *second, dtype ab,
                         float beta, void *C, dtype c) {
    gemm_check_types(ab, c);
    if (ab == DTYPE_F32) {
        gemm_colmajor(g, alpha, first, second, beta, C);
        return;
    }
    if (widening_forced()) {   /* the path of a CPU without AVX-512, forced (test_gemm) */
        widened_gemm(g, alpha, first, second, beta, C, c);
        return;
    }
    int M = g->n, N = g->m, K = g->k;
    bool trans_a = g->transb == 'T', trans_b = g->transa == 'T';
    long long lda = g->ldb, ldb = g->lda;
    dnnl_memory_desc_t a_md = trans_a ? matrix_desc(M, K, 1, lda, ab) : matrix_desc(M, K, lda, 1, ab);
    dnnl_memory_desc_t b_md = trans_b ? matrix_desc(K, N, 1, ldb, ab) : matrix_desc(K, N, ldb, 1, ab);
    dnnl_memory_desc_t c_md = matrix_desc(M, N, g->ldc, 1, c);
    dnnl_primitive_attr_t attr;
    DNNL(dnnl_primitive_attr_create(&attr));
    if (alpha != 1.0f) DNNL(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha));
    dnnl_post_ops_t post_ops = NULL;
    if (beta != 0.0f) {   /* C = alpha op(A) op(B) + beta C, C read in its type, one rounding */
        DNNL(dnnl_post_ops_create(&post_ops));
        DNNL(dnnl_post_ops_append_sum(post_ops, beta));
        DNNL(dnnl_primitive_attr_set_post_ops(attr, post_ops));
    }
    dnnl_stream_t stream;
    dnnl_engine_t engine = cpu_engine(&stream);
    dnnl_matmul_desc_t desc;
    DNNL(dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md));
    dnnl_primitive_desc_t pd;
    dnnl_status_t offered = dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL);
    if (offered == dnnl_unimplemented) {   /* no bf16 on this CPU (oneDNN 2.x needs AVX-512) */
        if (post_ops) dnnl_post_ops_destroy(post_ops);
        dnnl_primitive_attr_destroy(attr);
        widened_gemm(g, alpha, first, second, beta, C, c);
        return;
    }
    DNNL(offered);
    dnnl_primitive_t matmul;
    DNNL(dnnl_primitive_create(&matmul, pd));
    dnnl_memory_t a_mem, b_mem, c_mem;
    DNNL(dnnl_memory_create(&a_mem, &a_md, engine, (void *)second));
    DNNL(dnnl_memory_create(&b_mem, &b_md, engine, (void *)first));
    DNNL(dnnl_memory_create(&c_mem, &c_md, engine, C));
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}};
    DNNL(dnnl_primitive_execute(matmul, stream, 3, args));
    DNNL(dnnl_stream_wait(stream));
    dnnl_memory_destroy(a_mem);
    dnnl_memory_destroy(b_mem);
    dnnl_memory_destroy(c_mem);
    dnnl_primitive_destroy(matmul);
    dnnl_primitive_desc_destroy(pd);
    if (post_ops) dnnl_post_ops_destroy(post_ops);
    dnnl_primitive_attr_destroy(attr);
}

void gemm_colmajor_strided_batched_typed(const gemm_args *g, float alpha, const void *first, long long stride_first,
                                         const void *second, long long stride_second, dtype ab, float beta,
                                         float *C, long long stride_c, int batch) {
    for (int i = 0; i < batch; i++)
        gemm_colmajor_typed(g, alpha, dtype_const_at(first, ab, (size_t)(i * stride_first)),
                            dtype_const_at(second, ab, (size_t)(i * stride_second)), ab, beta, C + i * stride_c,
                            DTYPE_F32);
}

/* Whether oneDNN offers a bf16 matmul on this CPU, asked once with a small product (the answer
 * does not depend on the shape: oneDNN 2.x's bf16 kernels need AVX-512). */
static bool onednn_has_bf16(void) {
    static int known = -1;
    if (known < 0) {
        dnnl_memory_desc_t md = matrix_desc(16, 16, 16, 1, DTYPE_BF16), c_md = matrix_desc(16, 16, 16, 1, DTYPE_F32);
        dnnl_matmul_desc_t desc;
        dnnl_primitive_desc_t pd;
        dnnl_stream_t stream;
        DNNL(dnnl_matmul_desc_init(&desc, &md, &md, NULL, &c_md));
        dnnl_status_t offered = dnnl_primitive_desc_create(&pd, &desc, NULL, cpu_engine(&stream), NULL);
        if (offered != dnnl_unimplemented) DNNL(offered);   /* (anything else is a failure, as below) */
        known = offered == dnnl_success;
        if (known) dnnl_primitive_desc_destroy(pd);
    }
    return known;
}

static bool forced_bf16_operands;
void gemm_bf16_force_bf16_operands(bool on) { forced_bf16_operands = on; }

dtype gemm_bf16_operand_type(void) {
    if (forced_bf16_operands) return DTYPE_BF16;
    return !widening_forced() && onednn_has_bf16() ? DTYPE_BF16 : DTYPE_F32;
}
