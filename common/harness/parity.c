/* parity.c: the comparison every chapter ends with (rank 0 only). */
#include <math.h>
#include <stdio.h>
#include "log.h"
#include "parity.h"

static double loss_rtol = PARITY_LOSS_RTOL, grad_rtol = PARITY_GRAD_RTOL, grad_l2_rtol = 0;
static bool bf16 = false;   /* parity_set_precision: the bf16 tolerances, and the l2 column */
static double curve_rtol = 0;   /* parity_set_curves: the loss curves alone are judged */
static int failures = 0, comparisons = 0;
static bool verbose = true, enforced = true;
static double worst = 0.0;
static char worst_name[128] = "";

void parity_set_verbose(bool v) { verbose = v; }
void parity_set_grads_enforced(bool e) { enforced = e; }
double parity_worst(const char **name) {
    static char last[128];
    snprintf(last, sizeof last, "%s", worst_name);
    if (name) *name = last;
    double w = worst;
    worst = 0.0;
    worst_name[0] = 0;
    return w;
}

bool parity_loss(int step, double parallel, double baseline) {
    comparisons++;
    double tol = loss_rtol * fmax(1.0, fabs(baseline));
    bool ok = fabs(parallel - baseline) <= tol && !isnan(parallel);
    if (!ok) {
        failures++;
        log0("  step %d: loss %.9g differs from the baseline %.9g by %.3g (tolerance %.3g)\n",
             step, parallel, baseline, fabs(parallel - baseline), tol);
    }
    return ok;
}

void parity_set_precision(dtype compute, double tokens) {
    bf16 = compute == DTYPE_BF16;
    loss_rtol = bf16 ? 4 * PARITY_BF16_U / sqrt(fmax(tokens, 1)) : PARITY_LOSS_RTOL;
    grad_rtol = bf16 ? 4 * PARITY_BF16_U : PARITY_GRAD_RTOL;
    grad_l2_rtol = bf16 ? 4 * PARITY_BF16_U : 0;
}

void parity_set_curves(double rtol) { curve_rtol = rtol; }

bool parity_curve(double got, double ref) {
    bool ok = fabs(got - ref) <= curve_rtol * fabs(ref) && !isnan(got);
    comparisons++;
    failures += !ok;
    return ok;
}

double parity_rel_l2(const float *got, const float *ref, size_t n) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)ref[i];
        diff += d * d;
        norm += (double)ref[i] * ref[i];
    }
    if (isnan(diff)) return INFINITY;
    if (diff == 0.0) return 0.0;
    return norm == 0.0 ? INFINITY : sqrt(diff / norm);
}

double parity_rel_diff(const float *got, const float *ref, size_t n) {
    double max_diff = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (isnan(d)) return INFINITY;
        if (d > max_diff) max_diff = d;
        if (fabs(ref[i]) > max_ref) max_ref = fabs(ref[i]);
    }
    if (max_diff == 0.0) return 0.0;
    return max_ref == 0.0 ? INFINITY : max_diff / max_ref;
}

void parity_print_header(const char *title) {
    if (bf16) log0("%s\n  %-44s %12s %12s  %s\n", title, "tensor", "rel. diff", "rel. l2", "verdict");
    else log0("%s\n  %-44s %12s  %s\n", title, "tensor", "rel. diff", "verdict");
}

bool parity_tensor(const char *name, const float *got, const float *ref, size_t n) {
    double r = parity_rel_diff(got, ref, n), l2 = bf16 ? parity_rel_l2(got, ref, n) : 0;
    bool ok = r <= grad_rtol && (!bf16 || l2 <= grad_l2_rtol);
    if (enforced) comparisons++;
    if (enforced && !ok) failures++;
    if (r >= worst) { worst = r; snprintf(worst_name, sizeof worst_name, "%s", name); }
    /* not enforced: shown for information only, and said so where it would have failed */
    const char *verdict = ok ? "ok" : enforced ? "FAIL" : "beyond, not judged";
    if (!(verbose || (enforced && !ok))) return ok || !enforced;
    if (bf16) log0("  %-44s %12.3e %12.3e  %s\n", name, r, l2, verdict);
    else log0("  %-44s %12.3e  %s\n", name, r, verdict);
    return ok || !enforced;
}

void parity_fail(const char *what) {
    comparisons++;
    failures++;
    log0("  FAIL: %s\n", what);
}

int parity_report(void) {
    char tol[160];
    if (curve_rtol > 0) snprintf(tol, sizeof tol, "the loss curves against the baseline's precision: %.0f%%", 100 * curve_rtol);
    else if (bf16) snprintf(tol, sizeof tol, "bf16: loss %.1e, gradients %.1e max and %.1e l2", loss_rtol, grad_rtol, grad_l2_rtol);
    else snprintf(tol, sizeof tol, "loss %.0e, gradients %.0e", loss_rtol, grad_rtol);
    if (failures == 0)
        log0("PARITY OK: %d comparisons within tolerance (%s)\n", comparisons, tol);
    else
        log0("PARITY FAILED: %d of %d comparisons out of tolerance (%s)\n", failures, comparisons, tol);
    return failures ? 1 : 0;
}
