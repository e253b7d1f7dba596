/* loss_report.h: what chapter 02 measures beyond the common tables: how the batch falls on the
 * vocabulary shards, the loss's own traffic (counted apart from the rest), and the lesson's claim
 * that no rank ever held the [B, T, V] logits (checked by the allocator). */
#pragma once
#include <stdbool.h>
#include "plan.h"
#include "run.h"

/* Step 1's batch: padded sequences, and tokens | targets per vocabulary shard (rank 0 prints). */
void describe_batch(const run_options *o, int shards);
/* Wraps the plan's loss operator so its collectives are also counted apart (loss_traffic()). */
void count_loss_traffic(llama_plan *plan);
/* The loss's share of the traffic and the all-gather it replaces; the full-logits claim, judged
 * when no other activation is as large as B*T*V*4. Returns the number of mismatches. */
int report_loss_parallel(const run_options *o, comm_group *tp, double largest_measured,
                         double largest_other_bytes);
/* The largest single activation or scratch allocation since the last mem_reset_peaks(). */
double largest_buffer(void);
/* Appends "tp,loss_parallel,measured_bytes,formula_bytes" to DIR/logits_memory.csv (rank 0),
 * with the header when the file is new: make plot-02 collects one row per run. */
void append_memory_csv(const char *dir, int tp, bool loss_parallel, double measured, double formula);
