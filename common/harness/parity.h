/* parity.h: compare a parallel run against the single-device baseline.
 *
 * Tolerances (docs/design.md, fp32):
 *   loss:      |a - b| <= 1e-5 * max(1, |b|)        on every step
 *   gradients: max|ga - gb| / max|gb| <= 1e-4      per tensor
 * Every comparison is recorded; parity_report() prints the verdict and returns 1 if any failed. Rank 0 only.
 */
#pragma once
#include <stddef.h>
#include <stdbool.h>
#include "cdefs.h"

C_BEGIN

#define PARITY_LOSS_RTOL 1e-5
#define PARITY_GRAD_RTOL 1e-4

/* true when the losses agree; records a failure otherwise. */
bool parity_loss(int step, double parallel, double baseline);
/* Worst relative difference max|got-ref| / max|ref| (0/0 counts as 0, x/0 as inf). */
double parity_rel_diff(const float *got, const float *ref, size_t n);
/* Records and prints one row "name  rel_diff  ok/FAIL" of the gradient table. */
bool parity_tensor(const char *name, const float *got, const float *ref, size_t n);
void parity_print_header(const char *title);
/* Enforced (the default): a gradient past tolerance is a failure. Not enforced: the row is
 * computed and shown but not judged (see run.h: gradients after step 1). */
void parity_set_grads_enforced(bool enforced);
/* verbose (the default): parity_tensor prints every row; quiet: only failing rows. */
void parity_set_verbose(bool verbose);
/* The worst relative difference recorded by parity_tensor since the last call, and its tensor. */
double parity_worst(const char **name);
/* Records a failed comparison made elsewhere (a measured figure that differs from its formula). */
void parity_fail(const char *what);
/* Prints the verdict line; returns the process exit status (0 pass, 1 fail). */
int parity_report(void);

C_END
