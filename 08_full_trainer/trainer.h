/* trainer.h: what a real training run adds around the step of run.h (llm.c's train_gpt2 loop,
 * torchtitan's train.py): batches of real text, a learning-rate schedule, evaluation on held-out
 * text, one line of metrics per step, checkpoints. main.c's loop calls each of them in turn:
 *
 *   for step in first .. steps:
 *       lr = schedule(step)                       linear warmup, then cosine down to lr_min
 *       for micro in 0 .. accum-1:                gradient accumulation
 *           batch = corpus windows (seed, step)   the same global batch on every mesh
 *           forward, backward                     (the mesh's plan: parallelize.h)
 *       clip by the global norm, AdamW(lr)
 *       metrics: loss, lr, grad norm, tokens/s, MFU, memory       -> OUT/metrics.csv
 *       every eval_every steps: validation loss                   -> the same line
 *       every ckpt_every steps: checkpoint                        (checkpoint.h)
 */
#pragma once
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include "data.h"
#include "mesh.h"
#include "llama.h"
#include "model.h"
#include "run.h"

/* The learning rate of step s of n (1-based): lr * s / warmup while s <= warmup, then a cosine
 * from lr at the end of warmup to lr_min at step n (torchtitan's and nanoGPT's schedule). */
typedef struct { double lr, lr_min; int warmup, steps; } lr_schedule;
double lr_at_step(const lr_schedule *s, int step);

/* The training text of `step` (seed o->seed) into loop->tokens, targets: its accum micro-batches
 * of o->batch windows each, rows micro x batch .. of the step's global batch (text_train_batch). */
void trainer_batch(run_loop *loop, const text_corpus *corpus, int step);

/* The model's peak rate for MFU. On a GPU, the device's datasheet figure (--peak-tflops); on the
 * CPU, measured: every rank times the same GEMM, on operands of the run's precision (--dtype), at
 * the same moment (so ranks that share a core share it in the probe too) and the rates are summed
 * over the world. Collective. */
double probe_peak_flops(dtype compute);

/* What the trainer's pieces share over the run (main.c's loop decides when each is due). */
typedef struct {
    const run_options *run;
    const char *ckpt_dir;           /* NULL: no checkpoints                                       */
    char trainer_json[1024];        /* the settings a resume must match (checkpoint.h)            */
    double peak_flops, flops_per_token;
    FILE *csv;                      /* OUT/metrics.csv, rank 0                                    */
    double last_val_loss;           /* NAN until the first evaluation                             */
    double unigram_loss;            /* the corpus's unigram model (byte frequencies): the line to beat */
    int last_ckpt_step;             /* the newest checkpoint this run saved or resumed from; 0: none */
} trainer;

/* The exit status of a run stopped by a non-finite loss or gradient norm (README, "Exit statuses"). */
#define TRAINER_EXIT_NONFINITE 4

/* The settings of a checkpoint (`saved`) against this run's (`now`), both written by the trainer
 * as a JSON object: the number of fields that differ, and in out one line naming each by its flag
 * ("--dim: checkpoint 96, this run 64; --lr: ..."). */
int trainer_settings_diff(const char *saved, const char *now, char *out, size_t len);

/* The state this rank stores (parameters, gradients, AdamW's m and v), as the allocator counted
 * it, beside --plan's formula for its pipeline stage (plan_calc_stage_floats). Every rank compares
 * its own; rank 0 prints its rows. Returns the ranks that differ (the same on every rank).
 * Collective. */
/* BEGIN SOLUTION 08: state per GPU */
/* (the formula: its tp slices, padded to S equal shards, S = dp_shard x cp, or dp_shard when not
 * shard_cp; 4 + 4 + 8 bytes a float) */
/* END SOLUTION */
int report_state_memory(const llama_config *c, const int mesh[MESH_NDIMS], bool shard_cp, int pp_rank,
                        int virtual_stages);

/* The validation loss: the mean token loss over the first n validation batches of `rows`
 * sequences (the global batch, which the model's ranks split as in training). Collective. */
double evaluate(llama_model *m, const text_corpus *corpus, int rows, int n_batches);

/* A non-finite loss or gradient norm (rank 0's values decide: it holds the loss the metrics
 * show) ends every rank with TRAINER_EXIT_NONFINITE and one line naming the step, before that
 * step's checkpoint: the last one saved stays DIR/latest. Collective. */
void trainer_stop_if_nonfinite(const trainer *t, const run_step_result *r);

/* The step's metrics line (rank 0) and OUT/metrics.csv row: loss, validation loss (when
 * `evaluated` this step), lr, gradient norm, tokens/s, time, MFU, the fullest rank's memory
 * peak. Collective (the memory's maximum). */
void trainer_log_step(trainer *t, const run_step_result *r, bool evaluated, double val_loss);

/* The checkpoint of `step` in t->ckpt_dir (checkpoint.h), and its line. A state checkpoint_save
 * refuses as non-finite ends the run as trainer_stop_if_nonfinite does; another failure exits 2
 * with one line. Collective. */
void trainer_checkpoint(trainer *t, llama_model *m, int step);
