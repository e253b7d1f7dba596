/* test_util.h: the few macros every unit test uses.
 *
 * A test binary runs its checks, prints one line per failed check, and exits 0 only if all
 * passed. Multi-rank tests reduce the verdict over the world so every rank exits alike.
 * The driver (tests/run_tests.sh) counts binaries x rank counts as test cases.
 */
#pragma once
#include <stdio.h>
#include <math.h>

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

static inline int tu_finish(const char *name) {
    if (tu_failed) fprintf(stderr, "%s: %d of %d checks failed\n", name, tu_failed, tu_checks);
    else printf("%s: %d checks ok\n", name, tu_checks);
    return tu_failed ? 1 : 0;
}
