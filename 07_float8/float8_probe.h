/* float8_probe.h: chapter 07's instruments around the float8 linear: how far each cast and each
 * product lands from the high precision (fp32, or bf16 under --dtype bf16), as SQNR = 20 log10(|ref| / |ref - got|) in dB over a whole tensor
 * (torchao's compute_error).
 *
 * A technique of its own, applied over float8_apply by the lesson (07's main.c), never by a
 * trainer: it wraps the plan's linear (float8's) and, on every linear float8 casts, computes the
 * products' references (one fp32 GEMM more per GEMM, on the high precision's values: y = x W^T; dx = dy W; dW = dy^T x) and
 * reads the casts' float8 values as float8 makes them (float8_observe_casts). Each comparison
 * copies both tensors to the host. What it measures changes no number of the run.
 */
#pragma once
#include "plan.h"
#include "float8_linear.h"

/* Wraps plan->linear (float8's: refuses, one line, a plan without float8_apply). */
void float8_probe_apply(llama_plan *plan);
extern const plan_technique float8_probe_technique;

/* first[role] receives the lowest SQNR of step 1 (run_when.step 1, every pass of it), worst[role]
 * the lowest since float8_probe_apply (+inf for a role never seen, and for every role when the
 * probe was not applied), where[role] the site of the latter. */
void float8_worst_sqnr(const llama_plan *plan, double first[FLOAT8_NROLES], double worst[FLOAT8_NROLES],
                       linear_site where[FLOAT8_NROLES]);
