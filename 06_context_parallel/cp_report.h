/* cp_report.h: chapter 06's measured figures beside their formulas. Each report prints on rank 0
 * and returns the number of mismatches (the same on every rank). */
#pragma once
#include "model.h"
#include "run.h"
#include "context_parallel.h"

/* Each rank's attention work (score elements per sequence and head in one layer's forward)
 * beside the balance's formula (alltoall: cp_alltoall_work_formula). */
int cp_report_attention_work(const llama_plan *plan, const cp_options *o, int T);
/* The cp group's traffic per step beside the method's formula, and tp's under CP x TP. */
int cp_report_traffic(const run_options *o, const llama_plan *plan, const llama_model *m, const cp_options *cp);
/* What attention keeps and uses per layer on this rank (allocator) beside cp_working_set_formula. */
int cp_report_attention_memory(const llama_plan *plan, const llama_model *m, const cp_options *o);
/* --ring-timeline: each rank's ring steps of the last forward, written by rank 0 to `path`. */
void cp_write_ring_timeline(const llama_plan *plan, const char *path);
