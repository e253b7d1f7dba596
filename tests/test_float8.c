/* ranks: 1 */
/* test_float8.c: the float8 codecs and casts of float8_math.h and float8.h.
 *
 *   decode:  all 256 codes of each format against the value the test computes itself from the
 *            sign, exponent and mantissa fields with ldexp, NaN and inf codes as the spec says;
 *   encode:  every one of the 2^32 fp32 bit patterns, against the nearest code found from a
 *            table of the format's values and their exact midpoints (ties to the even code,
 *            saturation beyond max, NaN -> NaN), for both formats;
 *   scales:  torchao's reference points (amax 1 -> 448 / 57344, powers of two 256 / 32768,
 *            amax 0 -> 4.48e14) and the saturated cast's (464, 480, inf -> 448; ...);
 *   arrays:  every kernel of float8.h against the scalar functions, on values that include
 *            zeros, subnormals, ties, huge values, infinities and NaN, tensorwise, rowwise and
 *            columnwise; amax (NaN propagated) against the test's own loop;
 *            the signal-to-quantization-noise ratio of a fake-quantized Gaussian tensor.
 * Every array goes through device_alloc and device copies, so the test runs on both backends
 * (the decode and encode tests run the shared header on the host).
 */
#include <float.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "comm.h"
#include "device.h"
#include "float8.h"
#include "test_device.h"
#include "test_util.h"

/* ---- the formats as the spec describes them --------------------------------------------------- */

typedef struct {
    const char *name;
    float8_format fmt;
    int ebits, mbits, bias;
    unsigned max_code, nan_code;   /* the largest finite code; the NaN code the encoder writes */
} format_spec;

static const format_spec FORMATS[2] = {
    {"e4m3", FLOAT8_E4M3, 4, 3, 7, 0x7E, 0x7F},
    {"e5m2", FLOAT8_E5M2, 5, 2, 15, 0x7B, 0x7E},
};

enum { KIND_FINITE, KIND_INF, KIND_NAN };

/* What a code is: E4M3fn has NaN only at exponent and mantissa all ones, no infinity; E5M2 is
 * IEEE-like: exponent all ones is inf (mantissa 0) or NaN. */
static int ref_kind(const format_spec *f, unsigned code) {
    unsigned emax = (1u << f->ebits) - 1, mmax = (1u << f->mbits) - 1;
    unsigned e = (code >> f->mbits) & emax, m = code & mmax;
    if (f->fmt == FLOAT8_E4M3) return (e == emax && m == mmax) ? KIND_NAN : KIND_FINITE;
    if (e == emax) return m == 0 ? KIND_INF : KIND_NAN;
    return KIND_FINITE;
}

/* The value of a code (+-inf, NaN as the kind says), from its fields, in double:
 *   normal     (1 + m / 2^mbits) 2^(e - bias)
 *   subnormal  (m / 2^mbits) 2^(1 - bias)                                                      */
static double ref_value(const format_spec *f, unsigned code) {
    unsigned e = (code >> f->mbits) & ((1u << f->ebits) - 1), m = code & ((1u << f->mbits) - 1);
    double sign = (code & 0x80) ? -1.0 : 1.0;
    if (ref_kind(f, code) == KIND_NAN) return NAN;
    if (ref_kind(f, code) == KIND_INF) return sign * INFINITY;
    double frac = (double)m / (double)(1u << f->mbits);
    if (e == 0) return sign * ldexp(frac, 1 - f->bias);
    return sign * ldexp(1.0 + frac, (int)e - f->bias);
}

static uint32_t bits_of(float x) { uint32_t u; memcpy(&u, &x, sizeof u); return u; }
static float float_of(uint32_t u) { float x; memcpy(&x, &u, sizeof x); return x; }
/* equal bits, or both NaN (a NaN's payload may differ between backends) */
static int same_float(float a, float b) { return (isnan(a) && isnan(b)) || bits_of(a) == bits_of(b); }

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* ---- decode: all 256 codes ------------------------------------------------------------------- */

static void test_decode(const format_spec *f) {
    int bad = 0, nans = 0, infs = 0;
    for (unsigned c = 0; c < 256; c++) {
        float got = float8_decode((uint8_t)c, f->fmt);
        int kind = ref_kind(f, c);
        double want = ref_value(f, c);
        int ok;
        if (kind == KIND_NAN) { nans++; ok = isnan(got); }
        else if (kind == KIND_INF) { infs++; ok = got == want; }
        else ok = (double)(float)want == want && bits_of(got) == bits_of((float)want);  /* -0.0 too */
        /* the format-specific decoder is the generic one's */
        float direct = f->fmt == FLOAT8_E4M3 ? float8_e4m3_decode((uint8_t)c) : float8_e5m2_decode((uint8_t)c);
        ok = ok && same_float(direct, got);
        if (!ok && bad++ < 5)
            fprintf(stderr, "decode %s 0x%02X: got %.9g want %.9g\n", f->name, c, got, want);
    }
    CHECK(bad == 0, "%s: %d of 256 codes decode wrong", f->name, bad);
    /* the spec's table */
    int want_nans = f->fmt == FLOAT8_E4M3 ? 2 : 6, want_infs = f->fmt == FLOAT8_E4M3 ? 0 : 2;
    CHECK(nans == want_nans && infs == want_infs, "%s: %d NaN and %d inf codes", f->name, nans, infs);
    float maxv = float8_decode((uint8_t)f->max_code, f->fmt);
    CHECK(maxv == float8_max(f->fmt) && maxv == (f->fmt == FLOAT8_E4M3 ? 448.0f : 57344.0f),
          "%s: max code 0x%02X decodes to %g, float8_max says %g", f->name, f->max_code, maxv,
          float8_max(f->fmt));
    CHECK(ref_kind(f, f->max_code + 1) != KIND_FINITE, "%s: the code above max is finite", f->name);
    CHECK(float8_decode(0x01, f->fmt) == ldexpf(1.0f, 1 - f->bias - f->mbits),
          "%s: min subnormal %g", f->name, float8_decode(0x01, f->fmt));
    CHECK(float8_decode((uint8_t)(1u << f->mbits), f->fmt) == ldexpf(1.0f, 1 - f->bias),
          "%s: min normal %g", f->name, float8_decode((uint8_t)(1u << f->mbits), f->fmt));
    CHECK(bits_of(float8_decode(0x80, f->fmt)) == 0x80000000u, "%s: 0x80 is not -0.0", f->name);
    printf("decode %s: 256 codes; max %g, min normal %g, min subnormal %g, %d NaN codes, %d inf\n",
           f->name, maxv, float8_decode((uint8_t)(1u << f->mbits), f->fmt),
           float8_decode(0x01, f->fmt), nans, infs);
}

/* ---- encode: every fp32 bit pattern ---------------------------------------------------------
 * Positive floats are ordered like their bit patterns, so the nearest code is constant over
 * runs of consecutive patterns: between two consecutive midpoints of the format's values it is
 * the value in between, at a midpoint (exactly representable: 1 more bit than the format has)
 * it is the code with the even mantissa. The reference walks the table of non-negative finite
 * values in order and hands each run to check_run, which calls the encoder on every pattern of
 * the run and on its negative twin (expected: the same code with the sign bit).            */

static uint64_t check_run(const format_spec *f, uint64_t lo, uint64_t hi, unsigned code) {
    uint64_t bad = 0;
    for (uint64_t p = lo; p <= hi; p++) {
        bad += float8_encode(float_of((uint32_t)p), f->fmt) != code;
        bad += float8_encode(float_of((uint32_t)p | 0x80000000u), f->fmt) != (code | 0x80u);
    }
    if (bad) {   /* say where (a second, slow pass only when something failed) */
        for (uint64_t p = lo; p <= hi; p++) {
            unsigned got = float8_encode(float_of((uint32_t)p), f->fmt);
            unsigned neg = float8_encode(float_of((uint32_t)p | 0x80000000u), f->fmt);
            if (got != code || neg != (code | 0x80u)) {
                fprintf(stderr, "encode %s: x = %.9g (0x%08X) gives 0x%02X (-x: 0x%02X), want 0x%02X\n",
                        f->name, float_of((uint32_t)p), (uint32_t)p, got, neg, code);
                break;
            }
        }
    }
    return bad;
}

static void test_encode_exhaustive(const format_spec *f) {
    double t0 = seconds_now();
    unsigned K = f->max_code;
    double val[256];
    int increasing = 1;
    for (unsigned k = 0; k <= K; k++) {
        CHECK(ref_kind(f, k) == KIND_FINITE, "%s: code 0x%02X below max is not finite", f->name, k);
        val[k] = ref_value(f, k);
        if (k > 0 && !(val[k] > val[k - 1])) increasing = 0;
    }
    CHECK(increasing, "%s: the non-negative codes are not in increasing order", f->name);
    uint64_t bad = 0, patterns = 0, ties = 0, next = 0;   /* next: the first pattern not yet checked */
    for (unsigned k = 0; k < K; k++) {
        double mid = 0.5 * (val[k] + val[k + 1]);          /* exact in double */
        float midf = (float)mid;
        CHECK((double)midf == mid, "%s: midpoint %.17g not exact in fp32", f->name, mid);
        uint32_t b = bits_of(midf);
        CHECK((double)float_of(b - 1) < mid && (double)float_of(b + 1) > mid,
              "%s: patterns around the midpoint %.17g out of order", f->name, mid);
        if (b > next) { bad += check_run(f, next, b - 1, k); patterns += b - next; }
        bad += check_run(f, b, b, (k & 1) ? k + 1 : k);     /* the tie: the even code */
        patterns++; ties++;
        next = (uint64_t)b + 1;
    }
    /* from the last midpoint to +inf: max (saturation beyond max, inf included) */
    bad += check_run(f, next, 0x7F800000u, K);
    patterns += 0x7F800000u - next + 1;
    /* NaNs: 0x7F800001 .. 0x7FFFFFFF */
    CHECK(ref_kind(f, f->nan_code) == KIND_NAN, "%s: 0x%02X is not a NaN code", f->name, f->nan_code);
    bad += check_run(f, 0x7F800001u, 0x7FFFFFFFu, f->nan_code);
    patterns += 0x7FFFFFFFu - 0x7F800001u + 1;
    double dt = seconds_now() - t0;
    CHECK(patterns == (1ull << 31), "%s: the runs cover %llu positive patterns, not 2^31", f->name,
          (unsigned long long)patterns);
    CHECK(bad == 0, "%s: %llu of 2^32 fp32 patterns encode wrong", f->name, (unsigned long long)bad);
    printf("encode %s: all 2^32 fp32 patterns (%llu ties) in %.1f s\n", f->name,
           (unsigned long long)ties, dt);
}

/* ---- spot values: torchao's scales and the saturated cast (ALGORITHMS.md) ----------------- */

static void test_reference_points(void) {
    CHECK(float8_scale_from_amax(1.0f, FLOAT8_E4M3, 0) == 448.0f, "e4m3 amax 1 -> %g", float8_scale_from_amax(1.0f, FLOAT8_E4M3, 0));
    CHECK(float8_scale_from_amax(1.0f, FLOAT8_E5M2, 0) == 57344.0f, "e5m2 amax 1 -> %g", float8_scale_from_amax(1.0f, FLOAT8_E5M2, 0));
    CHECK(float8_scale_from_amax(1.0f, FLOAT8_E4M3, 1) == 256.0f, "e4m3 pow2 amax 1 -> %g", float8_scale_from_amax(1.0f, FLOAT8_E4M3, 1));
    CHECK(float8_scale_from_amax(1.0f, FLOAT8_E5M2, 1) == 32768.0f, "e5m2 pow2 amax 1 -> %g", float8_scale_from_amax(1.0f, FLOAT8_E5M2, 1));
    float s0 = float8_scale_from_amax(0.0f, FLOAT8_E4M3, 0);
    CHECK_CLOSE(s0, 4.48e14, 0.0, 1e-7, "e4m3 amax 0 -> 448 / 1e-12");
    CHECK(s0 == (float)(448.0 / 1e-12), "e4m3 amax 0: %.9g is not fp32(448 / 1e-12)", s0);
    CHECK_CLOSE(float8_scale_from_amax(0.0f, FLOAT8_E5M2, 0), 5.7344e16, 0.0, 1e-7, "e5m2 amax 0");
    CHECK(float8_scale_from_amax(1e-30f, FLOAT8_E4M3, 0) == s0, "amax below 1e-12 is not clamped");
    CHECK(float8_scale_from_amax(0.0f, FLOAT8_E4M3, 1) == ldexpf(1.0f, 48), "e4m3 pow2 amax 0 -> 2^48");
    CHECK(isnan(float8_scale_from_amax(NAN, FLOAT8_E4M3, 0)), "NaN amax must give a NaN scale");
    CHECK(isnan(float8_scale_from_amax(NAN, FLOAT8_E4M3, 1)), "NaN amax must give a NaN pow2 scale");
    CHECK(float8_scale_from_amax(INFINITY, FLOAT8_E4M3, 0) == 0.0f, "inf amax must give scale 0");
    /* the division is in double, then rounded once: 448 / 3 */
    CHECK(float8_scale_from_amax(3.0f, FLOAT8_E4M3, 0) == (float)(448.0 / 3.0), "448 / 3 rounded once");
    /* power-of-two rounding is down, and exact */
    CHECK(float8_round_scale_pow2(1024.0f) == 1024.0f, "pow2(1024)");
    CHECK(float8_round_scale_pow2(nextafterf(1024.0f, 0.0f)) == 512.0f, "pow2(1024 - ulp)");
    CHECK(float8_round_scale_pow2(3.0e-39f) == ldexpf(1.0f, -128), "pow2 of a subnormal");
    CHECK(float8_round_scale_pow2(0.0f) == 0.0f && isinf(float8_round_scale_pow2(INFINITY)), "pow2(0), pow2(inf)");
    /* saturated cast: c10's cast would give NaN (e4m3) or inf (e5m2) for the large ones */
    CHECK(float8_e4m3_encode(464.0f) == 0x7E, "e4m3 464 (a tie) -> 448");
    CHECK(float8_e4m3_encode(480.0f) == 0x7E, "e4m3 480 -> 448");
    CHECK(float8_e4m3_encode(INFINITY) == 0x7E && float8_e4m3_encode(-INFINITY) == 0xFE, "e4m3 +-inf -> +-448");
    CHECK(float8_e4m3_encode(NAN) == 0x7F && float8_e4m3_encode(-NAN) == 0xFF, "e4m3 NaN keeps its sign");
    CHECK(float8_e5m2_encode(59392.0f) == 0x7B, "e5m2 59392 (a tie with inf) -> 57344");
    CHECK(float8_e5m2_encode(65536.0f) == 0x7B && float8_e5m2_encode(-INFINITY) == 0xFB, "e5m2 65536, -inf");
    CHECK(float8_e5m2_encode(NAN) == 0x7E, "e5m2 NaN -> 0x7E");
    /* E5M2 is the top byte of fp16: 1.0 = 0x3C00, so 0x3C; -2.0 = 0xC000, so 0xC0 */
    CHECK(float8_e5m2_encode(1.0f) == 0x3C && float8_e5m2_encode(-2.0f) == 0xC0, "e5m2 1.0 and -2.0");
    CHECK(float8_e4m3_encode(1.0f) == 0x38 && float8_e4m3_encode(-2.0f) == 0xC0, "e4m3 1.0 and -2.0");
    /* quantize / dequantize of one value */
    CHECK(float8_quantize_value(1.0f, 448.0f, FLOAT8_E4M3) == 0x7E, "1.0 * 448 -> max");
    CHECK(float8_dequantize_value(0x7E, 448.0f, FLOAT8_E4M3) == 1.0f, "448 / 448 -> 1");
    CHECK(float8_fake_quantize_value(0.3f, 1.0f, FLOAT8_E4M3) == 0.3125f, "0.3 -> 0.3125 (1.25 * 2^-2)");
}

/* ---- the array kernels against the scalar functions ----------------------------------------- */

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static float rand_uniform(float lo, float hi) { return tu_rand_uniform(&rng_state, lo, hi); }

/* n test values: +-2^u for u uniform in [-40, 40] (every range of both formats once scaled,
 * fp8 subnormals and beyond max included), some zeros, and the special values first. */
static const float SPECIALS[] = {
    0.0f, -0.0f, 1e-45f, -1e-40f, 1.17549435e-38f, 0.001953125f /* 2^-9 */, 0.0009765625f /* 2^-10: tie */,
    0.0029296875f /* 3 * 2^-10: tie */, 1.0f, -1.0f, 0.3f, 448.0f, 464.0f, -480.0f, 57344.0f, 59392.0f,
    -65536.0f, 1e30f, -FLT_MAX, INFINITY, -INFINITY, NAN,
};
enum { NSPECIAL = sizeof SPECIALS / sizeof SPECIALS[0] };

static void fill_values(float *x, size_t n, int with_nan, int with_inf) {
    for (size_t i = 0; i < n; i++) {
        float r = rand_uniform(0.0f, 1.0f);
        float sign = rand_uniform(0.0f, 1.0f) < 0.5f ? -1.0f : 1.0f;
        x[i] = r < 0.05f ? 0.0f : sign * ldexpf(1.0f + rand_uniform(0.0f, 1.0f), (int)rand_uniform(-40, 40));
    }
    for (size_t i = 0; i < NSPECIAL && i < n; i++) x[i] = SPECIALS[i];
    for (size_t i = 0; i < n; i++)
        if ((!with_nan && isnan(x[i])) || (!with_inf && isinf(x[i]))) x[i] = 1.5f;
}

/* max |x| in the test's own terms: NaN if there is one, else the largest magnitude */
static float ref_amax(const float *x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i])) return NAN;
        if (fabsf(x[i]) > m) m = fabsf(x[i]);
    }
    return m;
}

static float device_amax(const float *x_h, size_t n) {
    float *x = tu_upload(x_h, n);
    float a = float8_amax(x, n);
    device_free(x);
    return a;
}

static void test_amax(void) {
    size_t n = (size_t)1 << 20;   /* several of cub's tiles */
    float *x = malloc(n * sizeof(float));
    fill_values(x, n, 0, 0);
    float want = ref_amax(x, n), got = device_amax(x, n);
    CHECK(got == want && want > 0.0f, "amax finite: got %g want %g", got, want);
    x[n - 7] = -INFINITY;
    CHECK(device_amax(x, n) == INFINITY, "amax with -inf: %g", device_amax(x, n));
    x[n / 3] = NAN;
    CHECK(isnan(device_amax(x, n)), "amax with NaN must be NaN (propagated)");
    x[0] = NAN;   /* a NaN in the first and in a middle position */
    x[n / 3] = 1.0f;
    CHECK(isnan(device_amax(x, n)), "amax with NaN first must be NaN");
    memset(x, 0, n * sizeof(float));
    x[5] = -0.0f;
    CHECK(device_amax(x, n) == 0.0f, "amax of zeros: %g", device_amax(x, n));
    CHECK(device_amax(x, 0) == 0.0f, "amax of nothing");
    x[0] = -3.0f;
    CHECK(device_amax(x, 1) == 3.0f, "amax of {-3}: %g", device_amax(x, 1));
    free(x);

    /* per row and per column; cols above and below the GPU's 256 threads per row, special rows
     * and columns */
    const int shapes[4][2] = {{9, 777}, {5, 3}, {1, 1}, {300, 7}};
    for (int s = 0; s < 4; s++) {
        int rows = shapes[s][0], cols = shapes[s][1];
        size_t m = (size_t)rows * cols;
        float *h = malloc(m * sizeof(float)), *col = malloc(rows * sizeof(float));
        fill_values(h, m, 0, 0);
        if (rows > 4) {
            for (int c = 0; c < cols; c++) h[1 * cols + c] = 0.0f;              /* all zeros */
            h[2 * cols + cols / 2] = NAN;                                         /* a NaN */
            h[3 * cols + cols - 1] = -INFINITY;                                   /* -inf last */
            for (int c = 0; c < cols; c++) h[4 * cols + c] = -fabsf(h[4 * cols + c]);   /* negative */
        }
        if (cols > 2) for (int r = 0; r < rows; r++) h[(size_t)r * cols + 1] = 0.0f;  /* a zero column */
        float *x_d = tu_upload(h, m);
        for (int by_col = 0; by_col <= 1; by_col++) {
            int k = by_col ? cols : rows;
            float *want = malloc(k * sizeof(float));
            for (int j = 0; j < k; j++) {
                if (by_col) {
                    for (int r = 0; r < rows; r++) col[r] = h[(size_t)r * cols + j];
                    want[j] = ref_amax(col, rows);
                } else {
                    want[j] = ref_amax(h + (size_t)j * cols, cols);
                }
            }
            float *a_d = device_alloc_floats(k, MEM_BUFFERS);
            if (by_col) float8_amax_cols(a_d, x_d, rows, cols);
            else float8_amax_rows(a_d, x_d, rows, cols);
            float *got = tu_download_new(a_d, k);
            int bad = 0, first = 0;
            for (int j = 0; j < k; j++)
                if (!same_float(got[j], want[j]) && bad++ == 0) first = j;
            CHECK(bad == 0, "amax_%s %dx%d: %d of %d wrong (%d: got %g want %g)",
                  by_col ? "cols" : "rows", rows, cols, bad, k, first, got[first], want[first]);
            device_free(a_d);
            free(want); free(got);
        }
        device_free(x_d);
        free(h); free(col);
    }
}

static const char *const SCALING_NAMES[3] = {"tensorwise", "rowwise", "columnwise"};

/* The scalar rule the kernels must follow, element by element; and dequantize written out
 * from the test's own decoder: the code's value over the scale, an fp32 division as torchao's
 * (a multiplication by 1 / scale would round differently). x, q, ... are [rows, cols]; the
 * scale of element (r, c) is `scale`, scales[r] or scales[c] as `how` says. */
static void check_casts_against_scalars(const format_spec *f, float8_scaling how, int pow2,
                                        const float *x, int rows, int cols, float scale,
                                        const float *scales, const uint8_t *q, const float *deq,
                                        const float *fake, const float *fake_inplace) {
    size_t n = (size_t)rows * cols, first_q = 0;
    int bad_q = 0, bad_d = 0, bad_f = 0, bad_i = 0;
    for (size_t i = 0; i < n; i++) {
        float s = float8_element_scale(i, how, scale, scales, cols);
        uint8_t want_q = float8_quantize_value(x[i], s, f->fmt);
        /* A NaN code is a NaN code, whatever its sign bit: inf * 0 (a column whose amax is inf
         * has scale 0) makes the processor's default NaN, negative on x86 and positive on an
         * NVIDIA GPU, and the encoder keeps the sign (as c10's cast does). The GPU gave 0x7F
         * where the host's rule gives 0xFF for the two infinities (make gpu-check, H100). */
        if (q[i] != want_q && !(isnan(ref_value(f, q[i])) && isnan(ref_value(f, want_q))) && bad_q++ == 0) first_q = i;
        bad_d += !same_float(deq[i], float8_dequantize_value(q[i], s, f->fmt)) ||
                 !same_float(deq[i], (float)ref_value(f, q[i]) / s);
        bad_f += !same_float(fake[i], float8_fake_quantize_value(x[i], s, f->fmt));
        bad_i += !same_float(fake_inplace[i], fake[i]);
    }
    const char *what = SCALING_NAMES[how];
    float s_first = float8_element_scale(first_q, how, scale, scales, cols);
    CHECK(bad_q == 0, "%s %s (pow2 %d, scale %g) quantize: %d of %zu bytes differ from the scalar rule (the first "
          "at %zu: x %g, its scale %g, code 0x%02X, want 0x%02X)", what, f->name, pow2, scale, bad_q, n, first_q,
          x[first_q], s_first, q[first_q], float8_quantize_value(x[first_q], s_first, f->fmt));
    CHECK(bad_d == 0, "%s %s (pow2 %d, scale %g) dequantize: %d of %zu differ", what, f->name, pow2, scale, bad_d, n);
    CHECK(bad_f == 0, "%s %s (pow2 %d, scale %g) fake_quantize: %d of %zu differ", what, f->name, pow2, scale, bad_f, n);
    CHECK(bad_i == 0, "%s %s (pow2 %d, scale %g) fake_quantize in place: %d of %zu differ", what, f->name, pow2,
          scale, bad_i, n);
}

/* quantize, dequantize and fake_quantize (also in place) of x[rows, cols] on the device, through
 * float8.h's functions for `how` (tensorwise: the named ones); the results downloaded into q, deq, fake,
 * fake_inplace. */
static void run_casts(const format_spec *f, float8_scaling how, const float *x_d, int rows, int cols,
                      float scale, const float *scales_d, uint8_t *q, float *deq, float *fake,
                      float *fake_inplace) {
    size_t n = (size_t)rows * cols;
    uint8_t *q_d = device_alloc(n, MEM_BUFFERS);
    float *deq_d = device_alloc_floats(n, MEM_BUFFERS), *fake_d = device_alloc_floats(n, MEM_BUFFERS);
    float *inplace_d = device_alloc_floats(n, MEM_BUFFERS);
    device_copy(inplace_d, x_d, n * sizeof(float));
    if (how != FLOAT8_PER_TENSOR) {   /* scales[rows] or scales[cols] */
        float8_quantize_scaled(q_d, x_d, n, cols, how, 0.0f, scales_d, f->fmt);
        float8_dequantize_scaled(deq_d, q_d, n, cols, how, 0.0f, scales_d, f->fmt);
        float8_fake_quantize_scaled(fake_d, x_d, n, cols, how, 0.0f, scales_d, f->fmt);
        float8_fake_quantize_scaled(inplace_d, inplace_d, n, cols, how, 0.0f, scales_d, f->fmt);
    } else {
        float8_quantize(q_d, x_d, n, scale, f->fmt);
        float8_dequantize(deq_d, q_d, n, scale, f->fmt);
        float8_fake_quantize(fake_d, x_d, n, scale, f->fmt);
        float8_fake_quantize(inplace_d, inplace_d, n, scale, f->fmt);
    }
    device_copy_to_host(q, q_d, n);
    device_copy_to_host(deq, deq_d, n * sizeof(float));
    device_copy_to_host(fake, fake_d, n * sizeof(float));
    device_copy_to_host(fake_inplace, inplace_d, n * sizeof(float));
    device_free(q_d); device_free(deq_d); device_free(fake_d); device_free(inplace_d);
}

static void test_casts(const format_spec *f) {
    enum { ROWS = 8, COLS = 600, N = ROWS * COLS };
    float *x = malloc(N * sizeof(float)), *deq = malloc(N * sizeof(float));
    float *fake = malloc(N * sizeof(float)), *inplace = malloc(N * sizeof(float));
    uint8_t *q = malloc(N);
    fill_values(x, N, 1, 1);
    x[3 * COLS + 17] = NAN;    /* row 3 and column 17 get a NaN amax, hence a NaN scale */
    for (int c = 0; c < COLS; c++) x[5 * COLS + c] = 0.0f;   /* row 5: zeros, scale 4.48e14 */
    for (int r = 0; r < ROWS; r++) x[r * COLS + 30] = 0.0f;  /* column 30: zeros */
    float *x_d = tu_upload(x, N);

    /* tensorwise: scale 1 (the raw codec), the amax scale of the finite values, its power of two */
    float finite_amax = 0.0f;
    for (int i = 0; i < N; i++)
        if (isfinite(x[i]) && fabsf(x[i]) < 1e20f) finite_amax = fmaxf(finite_amax, fabsf(x[i]));
    const float scales[3] = {1.0f, float8_scale_from_amax(finite_amax, f->fmt, 0),
                             float8_scale_from_amax(finite_amax, f->fmt, 1)};
    for (int s = 0; s < 3; s++) {
        run_casts(f, FLOAT8_PER_TENSOR, x_d, ROWS, COLS, scales[s], NULL, q, deq, fake, inplace);
        check_casts_against_scalars(f, FLOAT8_PER_TENSOR, s == 2, x, ROWS, COLS, scales[s], NULL, q,
                                    deq, fake, inplace);
    }

    /* rowwise and columnwise: amax_rows / amax_cols -> scales_from_amax on the device, plain and
     * power-of-two */
    for (int by_col = 0; by_col <= 1; by_col++) {
        float8_scaling how = by_col ? FLOAT8_PER_COL : FLOAT8_PER_ROW;
        int k = by_col ? COLS : ROWS, nan_at = by_col ? 17 : 3, zero_at = by_col ? 30 : 5;
        float *amax_d = device_alloc_floats(k, MEM_BUFFERS), *scales_d = device_alloc_floats(k, MEM_BUFFERS);
        if (by_col) float8_amax_cols(amax_d, x_d, ROWS, COLS);
        else float8_amax_rows(amax_d, x_d, ROWS, COLS);
        float *amax_h = tu_download_new(amax_d, k);
        for (int pow2 = 0; pow2 <= 1; pow2++) {
            float8_scales_from_amax(scales_d, amax_d, k, f->fmt, pow2);
            float *row_scales = tu_download_new(scales_d, k);
            int bad = 0;
            for (int j = 0; j < k; j++) bad += !same_float(row_scales[j], float8_scale_from_amax(amax_h[j], f->fmt, pow2));
            CHECK(bad == 0, "%s %s scales_from_amax (pow2 %d): %d of %d differ", SCALING_NAMES[how], f->name,
                  pow2, bad, k);
            CHECK(isnan(row_scales[nan_at]) && row_scales[zero_at] == float8_scale_from_amax(0.0f, f->fmt, pow2),
                  "%s %s: NaN slice's scale %g, zero slice's scale %g", SCALING_NAMES[how], f->name,
                  row_scales[nan_at], row_scales[zero_at]);
            run_casts(f, how, x_d, ROWS, COLS, 0.0f, scales_d, q, deq, fake, inplace);
            check_casts_against_scalars(f, how, pow2, x, ROWS, COLS, 0.0f, row_scales, q, deq, fake, inplace);
            free(row_scales);
        }
        device_free(amax_d); device_free(scales_d);
        free(amax_h);
    }
    /* scales_from_amax on the special amaxes */
    const float special_amax[6] = {1.0f, 0.0f, NAN, INFINITY, 3.0f, 1e-30f};
    float *sa_d = tu_upload(special_amax, 6), *ss_d = device_alloc_floats(6, MEM_BUFFERS);
    float8_scales_from_amax(ss_d, sa_d, 6, f->fmt, 0);
    float ss[6];
    device_copy_to_host(ss, ss_d, sizeof ss);
    int bad = 0;
    for (int i = 0; i < 6; i++) bad += !same_float(ss[i], float8_scale_from_amax(special_amax[i], f->fmt, 0));
    CHECK(bad == 0, "%s scales_from_amax on 1, 0, NaN, inf, 3, 1e-30: %d differ", f->name, bad);

    device_free(sa_d); device_free(ss_d); device_free(x_d);
    free(x); free(deq); free(fake); free(inplace); free(q);
}

/* Fake quantization of a Gaussian tensor, tensorwise scale: the noise it adds. For values in
 * the normal range, round to nearest makes each relative error at most 2^-(mbits+1), so
 * SQNR = 20 log10(|x| / |x - y|) >= 6.02 (mbits + 1) dB; torchao's cast tests ask >= 25 dB of
 * E4M3. The bound can fail: a truncating cast or a wrong scale would break it. */
static void test_sqnr(const format_spec *f) {
    enum { N = 4096 };
    float x[N], y[N];
    for (int i = 0; i < N; i += 2) {   /* Box-Muller */
        float u1 = rand_uniform(1e-7f, 1.0f), u2 = rand_uniform(0.0f, 1.0f);
        float r = sqrtf(-2.0f * logf(u1));
        x[i] = r * cosf(6.2831853f * u2);
        x[i + 1] = r * sinf(6.2831853f * u2);
    }
    float *x_d = tu_upload(x, N), *y_d = device_alloc_floats(N, MEM_BUFFERS);
    float scale = float8_scale_from_amax(float8_amax(x_d, N), f->fmt, 0);
    float8_fake_quantize(y_d, x_d, N, scale, f->fmt);
    device_copy_to_host(y, y_d, sizeof y);
    double sig = 0, noise = 0;
    for (int i = 0; i < N; i++) {
        sig += (double)x[i] * x[i];
        noise += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
    }
    double sqnr = 10.0 * log10(sig / noise), bound = 20.0 * log10(2.0) * (f->mbits + 1);
    CHECK(sqnr >= bound, "%s: SQNR %.1f dB below the rounding bound %.1f dB", f->name, sqnr, bound);
    if (f->fmt == FLOAT8_E4M3) CHECK(sqnr >= 25.0, "e4m3: SQNR %.1f dB below torchao's 25 dB", sqnr);
    printf("sqnr %s: %.1f dB for a Gaussian tensor (bound %.1f dB)\n", f->name, sqnr, bound);
    device_free(x_d); device_free(y_d);
}

/* float8_transpose: dst[c][r] = src[r][c], byte for byte, on a shape that is not square. */
static void test_transpose(void) {
    enum { R = 37, C = 19 };
    uint8_t h[R * C], back[R * C];
    for (int i = 0; i < R * C; i++) h[i] = (uint8_t)(i * 7 + 3);
    uint8_t *src = device_alloc(R * C, MEM_BUFFERS), *dst = device_alloc(R * C, MEM_BUFFERS);
    device_copy_to_device(src, h, R * C);
    float8_transpose(dst, src, R, C);
    device_copy_to_host(back, dst, R * C);
    int wrong = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) wrong += back[c * R + r] != h[r * C + c];
    CHECK(wrong == 0, "float8_transpose [%d, %d]: %d bytes misplaced", R, C, wrong);
    device_free(src);
    device_free(dst);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    test_transpose();
    for (int i = 0; i < 2; i++) test_decode(&FORMATS[i]);
    for (int i = 0; i < 2; i++) test_encode_exhaustive(&FORMATS[i]);
    test_reference_points();
    test_amax();
    for (int i = 0; i < 2; i++) test_casts(&FORMATS[i]);
    for (int i = 0; i < 2; i++) test_sqnr(&FORMATS[i]);
    CHECK(mem_current_total() == 0, "allocator still counts %zu bytes after freeing everything", mem_current_total());
    int rc = tu_finish("test_float8");
    comm_finalize();
    return rc;
}
