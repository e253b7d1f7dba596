/* sp_report.h: chapter 03's measured figures beyond the common tables, each beside its formula:
 * the traffic beside chapter 01's (ring model), and the activation memory of every mode. */
#pragma once
#include <stdbool.h>
#include "comm.h"
#include "model.h"
#include "run.h"
#include "sequence_parallel.h"

/* The per-rank wire bytes of this run beside chapter 01's all-reduces at the same boundaries.
 * `boundaries`, `regathers`, `recomputed`: the counts the main's table uses; `bf16_gathers`: how
 * many of the all-gathers move bf16 (--dtype bf16: 2 bytes an element). Returns mismatches. */
int report_traffic_beside_chapter_01(const run_options *o, comm_group *tp, bool sp, ac_mode ac,
                                     double boundaries, double regathers, double recomputed, double bf16_gathers);
/* Every mode's layer bytes at this tp (measured by allocating them) beside the formula, written
 * to DIR/activation_memory_tpP.csv; then this run's layers, outside and total. Returns mismatches. */
int report_activation_memory(const run_options *o, const llama_model *m, int p, bool sp, ac_mode ac,
                             double act_bytes);
