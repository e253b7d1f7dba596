/* ep_report.h: what chapter 09 measures beside its formulas: the experts' load in the last step,
 * and the all-to-all traffic of expert parallelism. */
#pragma once
#include "model.h"
#include "plan.h"
#include "run.h"
#include "../05_pipeline/pipeline.h"   /* pp_options */
#include "../07_float8/float8_linear.h"          /* --fp8's recipe */
#include "../08_full_trainer/plan_calculator.h"   /* 09 --plan: chapter 08's calculator */

C_BEGIN

/* The last step's tokens per expert, summed over every layer and rank, beside the balanced share
 * (N_global k L / E) and their imbalance (max / mean). Returns 0 (nothing to mismatch: a load is
 * what the router chose). Collective over the world. */
int ep_report_load(const llama_plan *p, llama_model *m);
/* The ep group's all-to-alls per step, summed over its ranks, and the gradients' all-reduces, beside
 * their formulas (tp's with the amaxes of chapter 07's float8 linears under the recipe fp8);
 * returns the number of mismatches. Collective over the world. */
int ep_report_traffic(const run_options *o, const llama_plan *p, llama_model *m, float8_recipe fp8);

/* The parameters: total and active per token (k of E experts), and this rank's share beside its
 * formula (the allocator's count of the parameter block); the dispatch's activations (the rows
 * this rank's experts may receive, dropless) beside theirs. Returns the number of mismatches. */
int ep_report_parameters(const llama_plan *p, llama_model *m, double param_bytes);

/* The bytes the ep group's all-to-alls move in the forward and backward passes of L mixture layers,
 * summed over its P ranks (N tokens a rank, k copies of D floats each, E experts): exercise 4's
 * formula, which the traffic report judges and chapter 08's calculator plans with. */
double ep_alltoall_bytes(double L, double P, double N, double k, double D, double E);
/* What 09 --plan gives chapter 08's calculator: this chapter's layer and that formula. */
extern const plan_moe_chapter ep_plan_moe_chapter;

/* Chapter 08's --plan calculator (09 --plan) on this run's own mesh, beside what the run measured:
 * the parameters this rank stores and the rows a layer's dispatch may bring its experts (judged on
 * every rank: the calculator's formulas must be the allocator's counts), and the bytes this rank
 * sent in the ep group's all-to-alls per step beside the calculator's "ep" line (printed, not
 * judged: the calculator routes evenly, the run as its router does). On the meshes the calculator plans: FSDP over the ep group
 * (--fsdp, or one data rank) and tp 1 (it plans 02's vocabulary split and 03's sequence parallelism
 * at tp > 1, which this chapter does not run); elsewhere one line says why not.
 * Returns the number of mismatches. Collective over the world. */
int ep_report_plan(const run_options *o, const llama_plan *p, llama_model *m, const pp_options *pipe, double param_bytes);

/* Each step's expert load, as OUT/expert_load.csv written by world rank 0: step, the tokens each
 * expert received (summed over the layers and ranks), the copies dropped, the imbalance (max /
 * mean), and rank 0's time in the ep group's all-to-alls and its step time (ms). Open after
 * run_loop_begin (which resets the communication counters); ep_load_log_step after each run_step,
 * whose tally the technique holds (expert_parallel_last_load). Collective over the world. */
typedef struct ep_load_log ep_load_log;
ep_load_log *ep_load_log_open(const llama_plan *p, llama_model *m, const char *path);
void ep_load_log_step(ep_load_log *log, const run_step_result *r);
void ep_load_log_close(ep_load_log *log);

C_END
