/* ep_report.h: what chapter 09 measures beside its formulas: the experts' load in the last step,
 * and the all-to-all traffic of expert parallelism. */
#pragma once
#include "model.h"
#include "plan.h"
#include "run.h"

C_BEGIN

/* The last step's tokens per expert, summed over every layer and rank, beside the balanced share
 * (N_global k L / E) and their imbalance (max / mean). Returns 0 (nothing to mismatch: a load is
 * what the router chose). Collective over the world. */
int ep_report_load(const llama_plan *p, llama_model *m);
/* The ep group's all-to-alls per step, summed over its ranks, and the gradients' all-reduces, beside
 * their formulas; returns the number of mismatches. Collective over the world. */
int ep_report_traffic(const run_options *o, const llama_plan *p, llama_model *m);

/* The parameters: total and active per token (k of E experts), and this rank's share beside its
 * formula (the allocator's count of the parameter block); the dispatch's activations (the rows
 * this rank's experts may receive, dropless) beside theirs. Returns the number of mismatches. */
int ep_report_parameters(const llama_plan *p, llama_model *m, double param_bytes);

C_END
