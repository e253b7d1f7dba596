/* dp_report.h: chapter 04's measured figures beside their formulas: the traffic of each mode,
 * the memory per rank beside ZeRO's formulas, and the step's timeline (CSV for make plot-04). */
#pragma once
#include "data_parallel.h"
#include "model.h"
#include "run.h"

/* Per step: every collective of the data-parallel groups (and tp's under FSDP x TP). */
int report_data_parallel_traffic(const run_options *o, const llama_plan *plan, const llama_model *m,
                                 const dp_options *dp);
/* Values, gradients and AdamW state per rank (measured[3] by the allocator) beside the mode's
 * formula, ZeRO's total, and the transient buffers (measured buffer_bytes); rank 0 appends the
 * row to csv_dir/memory_modes.csv for make plot-04. */
int report_data_parallel_memory(const llama_plan *plan, const llama_model *m, const dp_options *dp,
                                const double measured[3], double buffer_bytes, const char *csv_dir);
/* The last step's timeline, per rank, to DIR/timeline_<mode>_rankR.csv; the exposed (waited-for)
 * communication per step on rank 0. */
int report_timeline(const run_options *o, const llama_plan *plan, const dp_options *dp, const run_clock *k);
