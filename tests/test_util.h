/* test_util.h: the few macros every unit test uses.
 *
 * A test binary runs its checks, prints one line per failed check, and exits 0 only if all
 * passed. Multi-rank tests reduce the verdict over the world so every rank exits alike.
 * The driver (tests/run_tests.sh) counts binaries x rank counts as test cases.
 */
#pragma once
#include <stdio.h>
#include <math.h>
#include <stdint.h>

static int tu_failed = 0, tu_checks = 0;

#define CHECK(cond, ...) do {                                                   \
    tu_checks++;                                                                \
    if (!(cond)) {                                                              \
        tu_failed++;                                                            \
        fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);         \
        fprintf(stderr, __VA_ARGS__);                                           \
        fprintf(stderr, "\n");                                                  \
    }                                                                           \
} while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_CLOSE(a, b, atol, rtol, what) do {                                \
    double _a = (double)(a), _b = (double)(b);                                  \
    CHECK(fabs(_a - _b) <= (atol) + (rtol) * fabs(_b) && !isnan(_a),            \
          "%s: got %.9g want %.9g", (what), _a, _b);                           \
} while (0)

/* The cross-entropy reference of the kernel tests, in double: the sum over rows whose target
 * is not ignore_index of logsumexp(row) - row[target]; logits [n, v]. */
static inline double tu_cross_entropy_sum(const float *logits, const int *targets, int n, int v,
                                          int ignore_index) {
    double total = 0;
    for (int r = 0; r < n; r++) {
        if (targets[r] == ignore_index) continue;
        const float *row = logits + (size_t)r * v;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < v; j++) mx = fmax(mx, row[j]);
        for (int j = 0; j < v; j++) sum += exp(row[j] - mx);
        total += mx + log(sum) - row[targets[r]];
    }
    return total;
}

/* xorshift64*: a fixed, dependency-free stream of test numbers in [lo, hi), advancing *state. */
static inline float tu_rand_uniform(uint64_t *state, float lo, float hi) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    uint64_t bits = *state * 0x2545F4914F6CDD1Dull;
    return lo + (hi - lo) * (float)((bits >> 40) / 16777216.0);
}

/* Central finite differences of a scalar loss with respect to the host array x (the loss
 * function uploads x itself): numeric[i] = (L(x + h e_i) - L(x - h e_i)) / (2h), with h the
 * step fp32 can actually represent at x[i]. */
#define TU_FD_EPS 1e-3f
typedef double (*loss_fn)(void *ctx);
static inline void finite_differences(loss_fn loss, void *ctx, float *x, size_t n, double *numeric) {
    for (size_t i = 0; i < n; i++) {
        float saved = x[i], up = saved + TU_FD_EPS, down = saved - TU_FD_EPS;
        x[i] = up;
        double l_up = loss(ctx);
        x[i] = down;
        double l_down = loss(ctx);
        x[i] = saved;
        numeric[i] = (l_up - l_down) / ((double)up - (double)down);
    }
}

/* Gradient against finite differences. fp32 forwards make the differences noisy at about
 * 1e-3 of the gradient's scale, so: |analytic - numeric| <= 1e-2 |numeric| + 2e-3 max|numeric|. */
static inline void check_grad(const char *what, const float *analytic, const double *numeric, size_t n) {
    double scale = 0.0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(numeric[i]));
    CHECK(scale > 0.0, "%s: the numeric gradient is all zero, the test sees nothing", what);
    for (size_t i = 0; i < n; i++) CHECK_CLOSE(analytic[i], numeric[i], 2e-3 * scale + 1e-6, 1e-2, what);
}

static inline int tu_finish(const char *name) {
    if (tu_failed) fprintf(stderr, "%s: %d of %d checks failed\n", name, tu_failed, tu_checks);
    else printf("%s: %d checks ok\n", name, tu_checks);
    return tu_failed ? 1 : 0;
}
