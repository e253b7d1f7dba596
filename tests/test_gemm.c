/* ranks: 1 */
/* test_gemm.c: the row-major -> column-major mapping against a naive loop, in all four
 * transpose combinations, with explicit leading dimensions, alpha/beta, and strided batches
 * (including a stride-0 operand, as grouped-query attention uses). What passes here is the
 * exact argument tuple cuBLAS receives on the GPU. Then the typed products (bf16 operands, fp32 or
 * bf16 C: oneDNN here, cublasGemmEx on the GPU) against a sum in double, within the bound of fp32
 * accumulation in any order and, for a bf16 C, its one rounding; and the typed batch (attention's
 * bf16 products: cublasGemmStridedBatchedEx on the GPU) against the fp32 batch on the same values. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "gemm.h"
#include "init.h"
#include "kernels.h"
#include "test_device.h"
#include "test_util.h"

/* C[M,N] = alpha op(A) op(B) + beta C with row-major leading dimensions, in double. */
static void naive(float *C, const float *A, const float *B, int M, int N, int K, int ta, int tb,
                  int lda, int ldb, int ldc, float alpha, float beta) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[k * lda + i] : A[i * lda + k];
                double b = tb ? B[j * ldb + k] : B[k * ldb + j];
                s += a * b;
            }
            C[i * ldc + j] = (float)(alpha * s + beta * C[i * ldc + j]);
        }
}

static float *random_host(const char *name, size_t n) {
    float *h = malloc(n * sizeof(float));
    init_normal_slice(h, name, 7, 1.0f, 1, (int)n, 0, 1, 0, (int)n);
    return h;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* bf16 [n] on the device from the host floats x (rounded: x is overwritten with the values held). */
static void *bf16_device(float *x, size_t n) {
    uint16_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_float(h[i] = bf16_from_float(x[i]));
    void *d = device_alloc(n * sizeof *h, MEM_BUFFERS);
    device_copy_to_device(d, h, n * sizeof *h);
    free(h);
    return d;
}

/* C [M, N] of type c = alpha op(A) op(B) + beta C0, A and B bf16, against double: every element
 * within gamma_{K+2} (|alpha| sum_k |a b| + |beta c0|) of the exact value (fp32 accumulation and
 * the two fused scalings, in any order: gamma_n = n u / (1 - n u), u = 2^-24), plus for a bf16 C
 * its rounding, half an ulp of 8 bits: 2^-8 of the value. Returns the worst ratio error / bound. */
static double typed_case(int M, int N, int K, int ta, int tb, dtype c, float alpha, float beta) {
    float *A = random_host("tA", (size_t)M * K), *B = random_host("tB", (size_t)K * N);
    float *C0 = random_host("tC", (size_t)M * N), *got = malloc((size_t)M * N * sizeof(float));
    void *dA = bf16_device(A, (size_t)M * K), *dB = bf16_device(B, (size_t)K * N);
    void *dC = c == DTYPE_BF16 ? bf16_device(C0, (size_t)M * N) : device_alloc_floats((size_t)M * N, MEM_BUFFERS);
    if (c == DTYPE_F32) device_copy_to_device(dC, C0, (size_t)M * N * sizeof(float));
    matmul_typed(dC, c, dA, dB, DTYPE_BF16, M, N, K, ta, tb, alpha, beta);
    if (c == DTYPE_F32) device_copy_to_host(got, dC, (size_t)M * N * sizeof(float));
    else {
        uint16_t *h = malloc((size_t)M * N * sizeof *h);
        device_copy_to_host(h, dC, (size_t)M * N * sizeof *h);
        for (int i = 0; i < M * N; i++) got[i] = bf16_to_float(h[i]);
        free(h);
    }
    const double u = 0x1p-24, gamma = (K + 2) * u / (1 - (K + 2) * u);
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double exact = 0, size = 0;
            for (int k = 0; k < K; k++) {
                double ab = (double)(ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
                exact += ab;
                size += fabs(ab);
            }
            exact = alpha * exact + beta * C0[i * N + j];
            double bound = gamma * (fabs(alpha) * size + fabs(beta * C0[i * N + j]));
            if (c == DTYPE_BF16) bound += 0x1p-8 * (fabs(exact) + bound);
            worst = fmax(worst, fabs(got[i * N + j] - exact) / bound);
        }
    device_free(dA); device_free(dB); device_free(dC);
    free(A); free(B); free(C0); free(got);
    return worst;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    const int M = 5, N = 7, K = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            /* packed */
            float *A = random_host("A", M * K), *B = random_host("B", K * N), *C = random_host("C", M * N);
            float *want = malloc(M * N * sizeof(float)), *dA = device_alloc_floats(M * K, MEM_BUFFERS);
            float *dB = device_alloc_floats(K * N, MEM_BUFFERS), *dC = device_alloc_floats(M * N, MEM_BUFFERS);
            for (int i = 0; i < M * N; i++) want[i] = C[i];
            naive(want, A, B, M, N, K, ta, tb, ta ? M : K, tb ? K : N, N, 0.5f, 2.0f);
            device_copy_to_device(dA, A, M * K * 4);
            device_copy_to_device(dB, B, K * N * 4);
            device_copy_to_device(dC, C, M * N * 4);
            matmul(dC, dA, dB, M, N, K, ta, tb, 0.5f, 2.0f);
            device_copy_to_host(C, dC, M * N * 4);
            CHECK(max_diff(C, want, M * N) < 1e-5, "matmul ta=%d tb=%d differs by %g", ta, tb, max_diff(C, want, M * N));
            device_free(dA); device_free(dB); device_free(dC);
            free(A); free(B); free(C); free(want);
        }

    /* strided batched with padded leading dimensions and a shared (stride 0) B operand */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            const int batch = 3, lda = 11, ldb = 9, ldc = 13;
            const long long sa = 40, sb = 0, sc = 70;   /* A and C at their own offsets, B shared */
            size_t na = sa * batch + 64, nb = 64, nc = sc * batch + 64;
            float *A = random_host("A2", na), *B = random_host("B2", nb), *C = random_host("C2", nc);
            float *want = malloc(nc * sizeof(float));
            for (size_t i = 0; i < nc; i++) want[i] = C[i];
            for (int b = 0; b < batch; b++)
                naive(want + b * sc, A + b * sa, B + b * sb, M, N, K, ta, tb, lda, ldb, ldc, 1.0f, 1.0f);
            float *dA = device_alloc_floats(na, MEM_BUFFERS), *dB = device_alloc_floats(nb, MEM_BUFFERS);
            float *dC = device_alloc_floats(nc, MEM_BUFFERS);
            device_copy_to_device(dA, A, na * 4);
            device_copy_to_device(dB, B, nb * 4);
            device_copy_to_device(dC, C, nc * 4);
            matmul_strided_batched(dC, dA, dB, M, N, K, ta, tb, lda, ldb, ldc, sa, sb, sc, batch, 1.0f, 1.0f);
            device_copy_to_host(C, dC, nc * 4);
            CHECK(max_diff(C, want, nc) < 1e-5, "batched ta=%d tb=%d differs by %g", ta, tb, max_diff(C, want, nc));
            device_free(dA); device_free(dB); device_free(dC);
            free(A); free(B); free(C); free(want);
        }

    /* the typed batch (attention under --dtype bf16): bf16 operands at their strides (in elements of
     * bf16, B shared at stride 0), padded leading dimensions, into fp32 C, against the fp32 batch of
     * the same values (every product of two bf16 values is exact in fp32: the same sums, up to the
     * order a backend adds them), and fp32 operands, which must be the fp32 batch itself */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            const int batch = 3, lda = 11, ldb = 9, ldc = 13;
            const long long sa = 40, sb = 0, sc = 70;
            size_t na = sa * batch + 64, nb = 64, nc = sc * batch + 64;
            float *A = random_host("A3", na), *B = random_host("B3", nb), *C = random_host("C3", nc);
            float *got = malloc(nc * sizeof(float)), *want = malloc(nc * sizeof(float));
            void *hA = bf16_device(A, na), *hB = bf16_device(B, nb);   /* A, B now hold the bf16 values */
            float *dA = device_alloc_floats(na, MEM_BUFFERS), *dB = device_alloc_floats(nb, MEM_BUFFERS);
            float *dC = device_alloc_floats(nc, MEM_BUFFERS), *dW = device_alloc_floats(nc, MEM_BUFFERS);
            device_copy_to_device(dA, A, na * 4);
            device_copy_to_device(dB, B, nb * 4);
            device_copy_to_device(dC, C, nc * 4);
            device_copy_to_device(dW, C, nc * 4);
            matmul_strided_batched(dW, dA, dB, M, N, K, ta, tb, lda, ldb, ldc, sa, sb, sc, batch, 0.5f, 1.0f);
            matmul_strided_batched_typed(dC, hA, hB, DTYPE_BF16, M, N, K, ta, tb, lda, ldb, ldc, sa, sb, sc, batch,
                                         0.5f, 1.0f);
            device_copy_to_host(got, dC, nc * 4);
            device_copy_to_host(want, dW, nc * 4);
            CHECK(max_diff(got, want, nc) < 1e-5, "typed batch ta=%d tb=%d: bf16 differs from the fp32 batch by %g", ta,
                  tb, max_diff(got, want, nc));
            device_copy_to_device(dC, C, nc * 4);
            matmul_strided_batched_typed(dC, dA, dB, DTYPE_F32, M, N, K, ta, tb, lda, ldb, ldc, sa, sb, sc, batch,
                                         0.5f, 1.0f);
            device_copy_to_host(got, dC, nc * 4);
            CHECK(max_diff(got, want, nc) == 0, "typed batch ta=%d tb=%d: fp32 operands differ from the fp32 batch by %g",
                  ta, tb, max_diff(got, want, nc));
            device_free(hA); device_free(hB); device_free(dA); device_free(dB); device_free(dC); device_free(dW);
            free(A); free(B); free(C); free(got); free(want);
        }

    /* typed: bf16 operands, an fp32 or a bf16 C, every transpose, the scalings (and alpha 1, beta
     * 0: a linear's forward); a size with the k loop longer than a tile */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int c = DTYPE_F32; c <= DTYPE_BF16; c++) {
                double r1 = typed_case(M, N, K, ta, tb, (dtype)c, 0.5f, 2.0f);
                double r2 = typed_case(33, 70, 129, ta, tb, (dtype)c, 1.0f, 0.0f);
                CHECK(r1 <= 1 && r2 <= 1, "matmul_typed ta=%d tb=%d C %s: error %.3g and %.3g of the bound", ta, tb,
                      dtype_name((dtype)c), r1, r2);
                /* the CPU's path without oneDNN's bf16 (no AVX-512): widened to an fp32 sgemm */
                gemm_bf16_force_widen(true);
                r1 = typed_case(M, N, K, ta, tb, (dtype)c, 0.5f, 2.0f);
                r2 = typed_case(33, 70, 129, ta, tb, (dtype)c, 1.0f, 0.0f);
                gemm_bf16_force_widen(false);
                CHECK(r1 <= 1 && r2 <= 1, "widened ta=%d tb=%d C %s: error %.3g and %.3g of the bound", ta, tb,
                      dtype_name((dtype)c), r1, r2);
            }

    /* the operands in the type the backend's bf16 product reads (gemm_bf16_operand_type, what
     * linear.c hands it): bf16 where it multiplies bf16 (cuBLAS; oneDNN with AVX-512), fp32
     * holding bf16 values where it would only widen them (forced here). round_to_bf16 is the two
     * casts in one pass (in place, a NaN, an infinity and two ties included), and on the CPU the
     * sgemm of its rounded operands is the widened bf16 product bit for bit: the claim that lets
     * linear.c skip the bf16 copies there. */
    {
        bool cpu = strcmp(device_backend_name(), "cpu") == 0;
        gemm_bf16_force_widen(true);
        dtype forced = gemm_bf16_operand_type();
        gemm_bf16_force_widen(false);
        CHECK(forced == (cpu ? DTYPE_F32 : DTYPE_BF16), "gemm_bf16_operand_type with widening forced: %s",
              dtype_name(forced));
        float v[8] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.5e-3f, 3.0e38f, INFINITY, NAN, 0.1f, -0.0f}, got[8];
        float *dv = tu_upload(v, 8);
        round_to_bf16(dv, dv, 8);
        device_copy_to_host(got, dv, sizeof got);
        int same = 0;
        for (int i = 0; i < 8; i++) {
            float want = bf16_to_float(bf16_from_float(v[i]));
            same += memcmp(&got[i], &want, sizeof want) == 0;
        }
        CHECK(same == 8, "round_to_bf16 (in place): %d of 8 values differ from bf16_from_float then bf16_to_float",
              8 - same);
        device_free(dv);
        if (cpu) {   /* the linear's three products: y = x W^T; dx (+)= dy W; dW += dy^T x */
            const int m = 33, n = 70, k = 129;
            const struct { bool ta, tb; float beta; } shape[3] = {{false, true, 0.0f}, {false, false, 1.0f},
                                                                  {true, false, 1.0f}};
            for (int v = 0; v < 3; v++) {
                size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
                float *A = random_host("rA", na), *B = random_host("rB", nb), *C0 = random_host("rC", nc);
                float *widened = malloc(nc * sizeof(float)), *rounded = malloc(nc * sizeof(float));
                float *dA = tu_upload(A, na), *dB = tu_upload(B, nb), *dC = tu_upload(C0, nc);
                round_to_bf16(dA, dA, na);
                round_to_bf16(dB, dB, nb);
                matmul(dC, dA, dB, m, n, k, shape[v].ta, shape[v].tb, 1.0f, shape[v].beta);
                device_copy_to_host(rounded, dC, nc * sizeof(float));
                void *hA = bf16_device(A, na), *hB = bf16_device(B, nb);
                device_copy_to_device(dC, C0, nc * sizeof(float));
                gemm_bf16_force_widen(true);
                matmul_typed(dC, DTYPE_F32, hA, hB, DTYPE_BF16, m, n, k, shape[v].ta, shape[v].tb, 1.0f, shape[v].beta);
                gemm_bf16_force_widen(false);
                device_copy_to_host(widened, dC, nc * sizeof(float));
                CHECK(memcmp(widened, rounded, nc * sizeof(float)) == 0,
                      "ta=%d tb=%d beta %g: sgemm of round_to_bf16's operands differs from the widened bf16 product "
                      "(max %g)", shape[v].ta, shape[v].tb, shape[v].beta, max_diff(widened, rounded, nc));
                device_free(dA); device_free(dB); device_free(dC); device_free(hA); device_free(hB);
                free(A); free(B); free(C0); free(widened); free(rounded);
            }
        }
    }

    /* the tuple itself: C = A B^T (a linear layer) must become cuBLAS (T, N, out, rows, in) */
    gemm_args g = gemm_args_from_row_major(false, true, 4, 6, 8, 0, 0, 0);
    CHECK(g.transa == 'T' && g.transb == 'N' && g.m == 6 && g.n == 4 && g.k == 8 &&
          g.lda == 8 && g.ldb == 8 && g.ldc == 6, "linear-layer tuple (%c %c %d %d %d %d %d %d)",
          g.transa, g.transb, g.m, g.n, g.k, g.lda, g.ldb, g.ldc);
    int rc = tu_finish("test_gemm");
    comm_finalize();
    return rc;
}
