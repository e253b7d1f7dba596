/* float8_report.h: chapter 07's measured figures beside their formulas and thresholds. Each
 * report prints on rank 0 and returns the number of mismatches (the same on every rank). */
#pragma once
#include "mesh.h"
#include "model.h"
#include "run.h"
#include "../04_fsdp/data_parallel.h"
#include "float8_linear.h"

/* --dtype bf16 (with --fp8 off): the elements this rank's linears rounded to bf16 in a step
 * (linear.c counts them; the baseline's are not counted), beside their formula, on every rank. */
int bf16_report_roundings(const run_options *o, const llama_model *m);
/* Per step: tp's all-reduces (chapter 01's, and the float8 linears' amaxes) and, under FSDP,
 * dp_shard's all-gathers (block weights 1 byte per element with the float8 all-gather), reduce-
 * scatters and amax all-reduces, beside their formulas. */
int float8_report_traffic(const run_options *o, device_mesh *mesh, const llama_plan *plan, const llama_model *m,
                          float8_recipe r, bool float8_gather);
/* The lowest SQNR of each cast and product, in step 1 (judged against torchao's thresholds) and
 * over the run (shown), over every rank; with the float8 all-gather (gather != NULL), its casts. */
int float8_report_accuracy(const llama_plan *plan, float8_recipe r, const dp_gather_ops *gather, dtype high);
/* The exact test: the tp shards' float8 bytes of every block weight against one device's cast. */
int float8_report_sharded_cast(const llama_plan *plan, llama_model *m);
/* --cast-sample: layer 0's w1 scaled tensorwise into E4M3, before and after the cast, to `path`. */
void float8_write_cast_sample(llama_model *m, const char *path);
