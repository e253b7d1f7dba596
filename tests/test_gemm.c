/* ranks: 1 */
/* test_gemm.c: the row-major -> column-major mapping against a naive loop, in all four
 * transpose combinations, with explicit leading dimensions, alpha/beta, and strided batches
 * (including a stride-0 operand, as grouped-query attention uses). What passes here is the
 * exact argument tuple cuBLAS receives on the GPU. */
#include <stdlib.h>
#include "comm.h"
#include "device.h"
#include "gemm.h"
#include "init.h"
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

    /* the tuple itself: C = A B^T (a linear layer) must become cuBLAS (T, N, out, rows, in) */
    gemm_args g = gemm_args_from_row_major(false, true, 4, 6, 8, 0, 0, 0);
    CHECK(g.transa == 'T' && g.transb == 'N' && g.m == 6 && g.n == 4 && g.k == 8 &&
          g.lda == 8 && g.ldb == 8 && g.ldc == 6, "linear-layer tuple (%c %c %d %d %d %d %d %d)",
          g.transa, g.transb, g.m, g.n, g.k, g.lda, g.ldb, g.ldc);
    int rc = tu_finish("test_gemm");
    comm_finalize();
    return rc;
}
