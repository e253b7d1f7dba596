/* ranks: 1 */
/* test_gemm_fp8.c: the float8 GEMM of gemm_fp8.h against the test's own sum in double.
 *
 *   gemm:     C = (A / a_scale)(B / b_scale)^T for each format pair cuBLASLt allows (E4M3 x E4M3,
 *             E4M3 x E5M2, E5M2 x E4M3) and three shapes (M != N, so a transposed output shows;
 *             one M that is not a multiple of 16, which the rule allows), against
 *             sum_k decode(A[i,k]) decode(B[j,k]) / (a_scale b_scale) in double, from the codes'
 *             values (float8_decode); C starts as a sentinel, so an entry left unwritten shows;
 *             calls after the first allocate nothing that stays (MEM_BUFFERS unchanged);
 *   rowwise:  gemm_fp8_rowwise (a power-of-two scale per row of A and of B, one outlier row in
 *             each) on the same shapes and pairs, against the same sum with each row's scale;
 *             on a GPU without per-row scale vectors (before Hopper) it must refuse and leave C;
 *   rules:    gemm_fp8_shape_error accepts K, N multiples of 16 and any M >= 1, refuses K = 40,
 *             N = 8 and M = 0 with a line naming the dimension; gemm_fp8_formats_error refuses
 *             only E5M2 x E5M2; gemm_fp8_supported is true on the CPU.
 * The operands are real tensors cast the way training casts them: values drawn at two very
 * different magnitudes, the scale from their amax (torchao's rule, not a power of two, so the
 * division by it is exercised), the codes from the saturating cast.
 * Every array goes through device_alloc and device copies, so the test runs as it is on the CUDA
 * backend; on a GPU without float8 (compute capability below 8.9, an A100) it prints why and
 * skips the GEMMs. Tolerance, relative to max |C|: 1e-5 on the CPU (an fp32 GEMM of exact fp32
 * inputs); 3e-3 on CUDA, torch's bound for _scaled_mm against the emulation (the float8 tensor
 * cores accumulate in an order and precision of their own).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "gemm_fp8.h"
#include "test_util.h"
#include "test_device.h"

static const char *fmt_name(float8_format f) { return f == FLOAT8_E4M3 ? "E4M3" : "E5M2"; }

/* n codes of a tensor of uniform values in [-amp, amp), cast with the scale from its amax. */
static uint8_t *random_codes(size_t n, float amp, float8_format fmt, uint64_t *rng, float *scale) {
    float *x = malloc(n * sizeof(float));
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        x[i] = tu_rand_uniform(rng, -amp, amp);
        amax = float8_amax_merge(amax, fabsf(x[i]));
    }
    *scale = float8_scale_from_amax(amax, fmt, 0);
    uint8_t *q = malloc(n);
    for (size_t i = 0; i < n; i++) q[i] = float8_quantize_value(x[i], *scale, fmt);
    free(x);
    return q;
}

/* One GEMM on the device against the reference; returns max |C - ref| / max |ref|. */
static double gemm_error(int M, int N, int K, float8_format fa, float8_format fb, uint64_t *rng) {
    float a_scale, b_scale;
    size_t na = (size_t)M * K, nb = (size_t)N * K, nc = (size_t)M * N;
    uint8_t *A = random_codes(na, 3.0f, fa, rng, &a_scale);
    uint8_t *B = random_codes(nb, 0.02f, fb, rng, &b_scale);

    double *ref = malloc(nc * sizeof(double)), ref_max = 0.0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++)
                s += (double)float8_decode(A[(size_t)i * K + k], fa) *
                     (double)float8_decode(B[(size_t)j * K + k], fb);
            ref[(size_t)i * N + j] = s / ((double)a_scale * (double)b_scale);
            ref_max = fmax(ref_max, fabs(ref[(size_t)i * N + j]));
        }

    uint8_t *dA = device_alloc(na, MEM_BUFFERS), *dB = device_alloc(nb, MEM_BUFFERS);
    float *dC = device_alloc_floats(nc, MEM_BUFFERS), *C = malloc(nc * sizeof(float));
    device_copy_to_device(dA, A, na);
    device_copy_to_device(dB, B, nb);
    for (size_t i = 0; i < nc; i++) C[i] = 1e30f;          /* the sentinel: C (=) must replace it */
    device_copy_to_device(dC, C, nc * sizeof(float));

    static int calls = 0;
    size_t before = mem_current(MEM_BUFFERS);
    gemm_fp8(dC, dA, fa, a_scale, dB, fb, b_scale, M, N, K);
    size_t after = mem_current(MEM_BUFFERS);
    if (calls++ > 0)   /* the CUDA twin's first call allocates its workspace, kept for the run */
        CHECK(after == before, "gemm_fp8 %dx%dx%d changed MEM_BUFFERS by %lld bytes", M, N, K,
              (long long)after - (long long)before);
    device_copy_to_host(C, dC, nc * sizeof(float));

    double err = 0.0;
    for (size_t i = 0; i < nc; i++) {
        double d = fabs((double)C[i] - ref[i]);
        if (!(d <= err)) err = d;                          /* NaN becomes the error */
    }
    CHECK(ref_max > 0.0, "%s x %s %dx%dx%d: the reference is all zero, the test sees nothing",
          fmt_name(fa), fmt_name(fb), M, N, K);
    device_free(dA); device_free(dB); device_free(dC);
    free(A); free(B); free(C); free(ref);
    return err / ref_max;
}

/* Rowwise (gemm_fp8_rowwise): each row of A and of B cast with its own power-of-two scale, rows
 * of very different magnitudes (one outlier row in each), against the double reference
 * sum_k decode(A[i,k]) decode(B[j,k]) / (a_scales[i] b_scales[j]). Returns max |C - ref| / max
 * |ref|, or -1 where the backend has no such GEMM (a GPU before Hopper: gemm_fp8_rowwise says
 * false and leaves C as it was, which the sentinel checks). */
static double rowwise_error(int M, int N, int K, float8_format fa, float8_format fb, uint64_t *rng) {
    size_t na = (size_t)M * K, nb = (size_t)N * K, nc = (size_t)M * N;
    float *x = malloc((na + nb) * sizeof(float)), *sa = malloc((M + N) * sizeof(float)), *sb = sa + M;
    uint8_t *A = malloc(na), *B = malloc(nb);
    for (int i = 0; i < M + N; i++) {   /* row i of A, then row i - M of B */
        float amp = (i == 2 || i == M + 3) ? 300.0f : 0.5f, amax = 0.0f, *row = x + (size_t)i * K;
        float8_format f = i < M ? fa : fb;
        for (int k = 0; k < K; k++) { row[k] = tu_rand_uniform(rng, -amp, amp); amax = float8_amax_merge(amax, fabsf(row[k])); }
        sa[i] = float8_scale_from_amax(amax, f, 1);
        for (int k = 0; k < K; k++) (i < M ? A : B)[(size_t)(i < M ? i : i - M) * K + k] = float8_quantize_value(row[k], sa[i], f);
    }
    double *ref = malloc(nc * sizeof(double)), ref_max = 0.0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double d = 0.0;
            for (int k = 0; k < K; k++)
                d += (double)float8_decode(A[(size_t)i * K + k], fa) * (double)float8_decode(B[(size_t)j * K + k], fb);
            ref[(size_t)i * N + j] = d / ((double)sa[i] * (double)sb[j]);
            ref_max = fmax(ref_max, fabs(ref[(size_t)i * N + j]));
        }
    uint8_t *dA = device_alloc(na, MEM_BUFFERS), *dB = device_alloc(nb, MEM_BUFFERS);
    float *dC = device_alloc_floats(nc, MEM_BUFFERS), *dsa = tu_upload(sa, M), *dsb = tu_upload(sb, N);
    float *C = malloc(nc * sizeof(float));
    device_copy_to_device(dA, A, na);
    device_copy_to_device(dB, B, nb);
    for (size_t i = 0; i < nc; i++) C[i] = 1e30f;
    device_copy_to_device(dC, C, nc * sizeof(float));
    bool done = gemm_fp8_rowwise(dC, dA, fa, dsa, dB, fb, dsb, M, N, K);
    device_copy_to_host(C, dC, nc * sizeof(float));
    double err = 0.0;
    for (size_t i = 0; i < nc; i++) {
        double d = done ? fabs((double)C[i] - ref[i]) : (C[i] == 1e30f ? 0.0 : INFINITY);
        if (!(d <= err)) err = d;
    }
    if (!done) CHECK(err == 0.0, "gemm_fp8_rowwise said false but wrote C");
    device_free(dA); device_free(dB); device_free(dC); device_free(dsa); device_free(dsb);
    free(x); free(sa); free(A); free(B); free(C); free(ref);
    return done ? err / ref_max : -1.0;
}

static void check_rules(void) {
    CHECK(gemm_fp8_shape_error(32, 48, 64) == NULL, "32x48x64 refused: %s", gemm_fp8_shape_error(32, 48, 64));
    CHECK(gemm_fp8_shape_error(16, 16, 16) == NULL, "16x16x16 refused: %s", gemm_fp8_shape_error(16, 16, 16));
    CHECK(gemm_fp8_shape_error(8, 16, 32) == NULL, "M = 8 refused: %s", gemm_fp8_shape_error(8, 16, 32));
    struct { int M, N, K; const char *names; } bad[] = {
        {16, 16, 40, "K = 40"}, {16, 8, 16, "N = 8"}, {0, 16, 16, "M = 0"}, {16, 24, 48, "N = 24"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *why = gemm_fp8_shape_error(bad[i].M, bad[i].N, bad[i].K);
        CHECK(why && strstr(why, bad[i].names), "%dx%dx%d: want a line naming %s, got %s", bad[i].M,
              bad[i].N, bad[i].K, bad[i].names, why ? why : "(accepted)");
        if (why) printf("  refused %dx%dx%d: %s\n", bad[i].M, bad[i].N, bad[i].K, why);
    }
    CHECK(gemm_fp8_formats_error(FLOAT8_E4M3, FLOAT8_E4M3) == NULL, "E4M3 x E4M3 refused");
    CHECK(gemm_fp8_formats_error(FLOAT8_E4M3, FLOAT8_E5M2) == NULL, "E4M3 x E5M2 refused");
    CHECK(gemm_fp8_formats_error(FLOAT8_E5M2, FLOAT8_E4M3) == NULL, "E5M2 x E4M3 refused");
    const char *why = gemm_fp8_formats_error(FLOAT8_E5M2, FLOAT8_E5M2);
    CHECK(why && strstr(why, "E5M2 x E5M2"), "E5M2 x E5M2 accepted");
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    check_rules();

    bool cuda = strcmp(device_backend_name(), "cuda") == 0;
    char why[256] = "unset";
    bool supported = gemm_fp8_supported(why, sizeof why);
    if (!cuda) CHECK(supported && why[0] == '\0', "the CPU backend must always support float8 (%s)", why);
    if (!supported) {
        printf("test_gemm_fp8: skipping the GEMM checks: %s\n", why);
    } else {
        const double tol = cuda ? 3e-3 : 1e-5;
        const int shapes[][3] = {{32, 48, 64}, {16, 16, 16}, {24, 32, 48}};
        const float8_format pairs[][2] = {
            {FLOAT8_E4M3, FLOAT8_E4M3}, {FLOAT8_E4M3, FLOAT8_E5M2}, {FLOAT8_E5M2, FLOAT8_E4M3},
        };
        uint64_t rng = 0x9E3779B97F4A7C15ull;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                double err = gemm_error(M, N, K, pairs[p][0], pairs[p][1], &rng);
                CHECK(err <= tol, "%s x %s %dx%dx%d: error %.3g of max |C| (tolerance %.0e)",
                      fmt_name(pairs[p][0]), fmt_name(pairs[p][1]), M, N, K, err, tol);
                double rerr = rowwise_error(M, N, K, pairs[p][0], pairs[p][1], &rng);
                if (rerr < 0) CHECK(cuda && !gemm_fp8_rowwise_native(), "rowwise refused where the backend has it");
                else CHECK(rerr <= tol, "rowwise %s x %s %dx%dx%d: error %.3g of max |C| (tolerance %.0e)",
                           fmt_name(pairs[p][0]), fmt_name(pairs[p][1]), M, N, K, rerr, tol);
            }
        if (cuda && !gemm_fp8_rowwise_native())
            printf("test_gemm_fp8: rowwise scale vectors need cuBLAS 12.9 on Hopper: this GPU runs the emulation\n");
    }
    int rc = tu_finish("test_gemm_fp8");
    comm_finalize();
    return rc;
}
