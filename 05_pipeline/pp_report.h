/* pp_report.h: chapter 05's measured figures beside their formulas: the activation sets each
 * rank held at its peak (the schedule's memory), the point-to-point messages, and the bubble of
 * the last step (its timeline written as CSV for make plot-05). */
#pragma once
#include "model.h"
#include "pipeline.h"
#include "run.h"

/* Per rank: the most (microbatch, chunk) activation sets held at once, and their bytes as the
 * allocator counted them, beside the schedule's closed form x one set's bytes. Exact. */
int report_pipeline_memory(const llama_plan *plan);
/* Per step, over one pipeline (the ranks whose coordinates are 0 but for pp): messages and payload beside
 * 2 M (P V - 1) messages of B/M * T * D floats. */
int report_pipeline_messages(const run_options *o, const llama_plan *plan, const llama_model *m);
/* The last step: every rank's idle share beside the schedule's bubble (timing: printed, judged
 * by make bench-05), and DIR/pipeline_<schedule>_p<P>_m<M>_v<V>.csv (rank, action, microbatch,
 * chunk, start and end in ms) written by rank 0. */
void report_pipeline_bubble(const run_options *o, const llama_plan *plan);
