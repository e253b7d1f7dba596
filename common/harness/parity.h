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
#include "dtype.h"

C_BEGIN

#define PARITY_LOSS_RTOL 1e-5
#define PARITY_GRAD_RTOL 1e-4
/* Mixed precision (--dtype bf16), derived in docs/design.md "Parity in bf16": both runs round the
 * same GEMM operands, but from fp32 values that differ by fp32 reordering; where such a difference
 * straddles a bf16 rounding boundary the two operands differ by one bf16 ulp (2u, u = 2^-8), and
 * the difference cascades through the GEMM levels to a fixed point of about 2u (relative). The
 * tolerances are twice that: 4u per gradient, in the max norm and in the l2 norm; the loss, a mean
 * over the batch's tokens, 4u / sqrt(tokens). */
#define PARITY_BF16_U 0.00390625          /* 2^-8, bf16's unit roundoff                        */

/* The tolerances of a compute precision: DTYPE_F32 the fp32 ones above; DTYPE_BF16 the bf16 ones,
 * and a second measure per gradient, the relative l2 difference ||ga - gb|| / ||gb||. `tokens`:
 * the tokens a step's loss is the mean of (accum x B x T), for the loss's. */
void parity_set_precision(dtype compute, double tokens);
/* --baseline-dtype: the run is compared with a baseline in another precision by its loss curve
 * alone (run.c); parity_curve records that one comparison, within `rtol` of the baseline's. */
void parity_set_curves(double rtol);
bool parity_curve(double got, double ref);
/* ||got - ref||_2 / ||ref||_2 (0/0 counts as 0, x/0 as inf). */
double parity_rel_l2(const float *got, const float *ref, size_t n);
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
