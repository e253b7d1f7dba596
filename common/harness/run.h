/* run.h: what every Llama chapter does around its plan, written once: the model and training
 * flags, the synthetic batches, the training loop with the single-device baseline beside it,
 * the per-step comparison, --dump, --fault, and the verdict.
 *
 * A chapter's main.c reads: flags (RUN_FLAGS + its own), mesh, plan (+ the --fault it names),
 * model, run_train(), its formula tables (report.h), run_finish(). Nothing else.
 */
#pragma once
#include <getopt.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include "cdefs.h"
#include "llama.h"
#include "model.h"
#include "plan.h"

C_BEGIN

struct run_step;   /* below: what after_step receives */

typedef struct {
    llama_config model;
    adamw_config opt;
    int batch, steps;
    uint64_t seed;
    bool check;              /* train the baseline on rank 0 and compare every step     */
    bool verbose_grads;      /* print the whole gradient table every step               */
    const char *dump_dir;    /* --dump DIR, or NULL                                     */
    const char *dump_run_options; /* --dump: the chapter's settings a replay needs, a JSON
                                 * object (<= 255 bytes) written as the "run_options" metadata
                                 * (dump.h); NULL: none (chapter 07: the float8 recipe)     */
    const char *out_dir;     /* CSV files                                               */
    const char *fault;       /* --fault NAME, or NULL                                   */
    const plan_fault *faults;   /* the chapter's deliberate bugs, {NULL}-terminated     */
    bool kv_heads_follow_heads; /* set before parsing: without --n-kv-heads, n_kv_heads =
                                 * n_heads (no grouping), so every tp dividing the heads runs */
    bool kv_heads_given;     /* --n-kv-heads was on the command line                    */
    const llama_plan *baseline_plan; /* the --check baseline's plan, on one device (NULL:
                                 * plan_single_device(); chapter 07: the same float8 casts) */
    bool judge_first_step_only; /* judge the loss and the gradients of step 1 only, and not the
                                 * parameters after the last step (chapter 07: float8 casts turn
                                 * rounding-level differences into whole quanta after step 1) */
    /* Rank 0, before step 1's gradients are compared: NULL to judge them, or why they are shown
     * and not judged (chapter 07: a cast landed on the neighbouring code; NULL: always judged). */
    const char *(*step1_grads_unjudged)(const void *ctx);
    const void *step1_ctx;
    /* A trainer (chapter 08) around the same loop; every field 0 gives the chapters' default.
     *   next_batch    the global batch [B, T] of (step, micro) on the host, tokens and targets;
     *                 returns the count of padded targets (NULL: the synthetic batches, data.h)
     *   lr_at         the learning rate of step's update (NULL: opt.lr every step); written as
     *                 the third column of the dump's losses.txt
     *   accum         micro-batches per optimizer step (gradient accumulation; 0: 1): the step's
     *                 loss is the mean over the valid targets of all of them, and the dump's
     *                 batch_K holds them one after the other, [accum B, T]
     *   first_step    the first step to run (a resumed run: the checkpoint's step + 1; 0: 1)
     *   after_step    called on every rank after each optimizer step (metrics, evaluation,
     *                 checkpoints)                                                           */
    int (*next_batch)(const void *ctx, int step, int micro, int *tokens, int *targets, int B, int T);
    double (*lr_at)(const void *ctx, int step);
    int accum, first_step;
    void (*after_step)(void *ctx, llama_model *m, const struct run_step *s);
    const void *data_ctx, *lr_ctx;
    void *after_ctx;
    /* The chapter's own paths (outputs.h), checked by run_model with --out and --dump: chapter
     * 08's --data (an input), --ckpt-dir, --export, OUT/metrics.csv. */
    const struct run_path_s *paths;
    int n_paths;
} run_options;

/* What after_step receives about the step just taken. */
typedef struct run_step {
    int step;
    double loss;             /* the step's mean loss over its valid targets, every rank        */
    double lr;               /* the learning rate its update used                               */
    double grad_norm;        /* the global gradient norm before clipping (NAN when not computed) */
    double seconds;          /* wall time of the step's forward, backward and update            */
    long long tokens;        /* the global batch's tokens, accum x batch x seq_len              */
} run_step;

/* getopt_long codes of the shared flags (above any single-character option). */
enum {
    RUN_OPT_DIM = 1000, RUN_OPT_LAYERS, RUN_OPT_HEADS, RUN_OPT_KV_HEADS, RUN_OPT_FFN,
    RUN_OPT_VOCAB, RUN_OPT_SEQ, RUN_OPT_BATCH, RUN_OPT_STEPS, RUN_OPT_LR, RUN_OPT_SEED,
    RUN_OPT_CHECK, RUN_OPT_VERBOSE, RUN_OPT_DUMP, RUN_OPT_OUT, RUN_OPT_FAULT, RUN_OPT_TIMEOUT, RUN_OPT_CLIP, RUN_OPT_HELP
};
#define RUN_FLAGS                                                                              \
    {"dim", required_argument, 0, RUN_OPT_DIM}, {"n-layers", required_argument, 0, RUN_OPT_LAYERS}, \
    {"n-heads", required_argument, 0, RUN_OPT_HEADS},                                           \
    {"n-kv-heads", required_argument, 0, RUN_OPT_KV_HEADS},                                     \
    {"ffn-dim", required_argument, 0, RUN_OPT_FFN}, {"vocab", required_argument, 0, RUN_OPT_VOCAB}, \
    {"seq-len", required_argument, 0, RUN_OPT_SEQ}, {"batch", required_argument, 0, RUN_OPT_BATCH}, \
    {"steps", required_argument, 0, RUN_OPT_STEPS}, {"lr", required_argument, 0, RUN_OPT_LR},    \
    {"seed", required_argument, 0, RUN_OPT_SEED}, {"check", no_argument, 0, RUN_OPT_CHECK},      \
    {"verbose-grads", no_argument, 0, RUN_OPT_VERBOSE},                                         \
    {"dump", required_argument, 0, RUN_OPT_DUMP}, {"out", required_argument, 0, RUN_OPT_OUT},    \
    {"fault", required_argument, 0, RUN_OPT_FAULT}, {"timeout", required_argument, 0, RUN_OPT_TIMEOUT}, \
    {"clip-grad-norm", required_argument, 0, RUN_OPT_CLIP},                                      \
    {"help", no_argument, 0, RUN_OPT_HELP}

/* Defaults: llama_config_default(), adamw_config_default(), batch 4, 5 steps, seed 1234,
 * out_dir "out/<chapter>"; `faults` is the chapter's list for --fault (may be NULL). */
run_options run_options_default(const char *chapter, const plan_fault *faults);
/* Handles one shared flag; returns 0 when `code` is not one of them. --help prints
 * `chapter_usage`, the shared flags and the chapter's faults, and exits 0. Bad values exit 2. */
int run_options_parse(run_options *o, int code, const char *arg, const char *chapter_usage);
/* Parses argv with the shared flags plus the chapter's `flags` (getopt_long's table, ending in
 * {0}); each chapter flag goes to `chapter_flag(code, optarg, ctx)`. Then run_options_validate. */
void run_parse(run_options *o, int argc, char **argv, const struct option *flags,
               void (*chapter_flag)(int code, const char *arg, void *ctx), void *ctx,
               const char *chapter_usage);
/* After parsing: applies kv_heads_follow_heads; the model must be valid for a [batch, seq_len]
 * batch and --fault must name one of the chapter's faults (exit 2). The output directories are
 * checked by run_model, after every other refusal, so a refused run creates nothing. */
void run_options_validate(run_options *o);

/* The tensor-parallel degree: --tp's value when it was given (tp_flag > 0), else the number of
 * ranks; `name` receives how a message should call it ("--tp 4", or "NP=4" when --tp was not given). */
int run_tp_degree(int tp_flag, char *name, size_t len);

/* Applies --fault (if given) to the plan, before the model is built; prints what it breaks.
 * A fault that does not fit the plan exits 2 with its reason. */
void run_apply_fault(const run_options *o, llama_plan *plan);

/* The model under `plan` (llama_create), after checking up front that it can exist: no tensor
 * of 2^31 elements or more (the kernels index with int), and the bytes it needs on this rank
 * (with --check, rank 0 adds the baseline's) within what the device has available. Otherwise one
 * line naming the figures and exit 2, before anything is allocated or created. Then every path
 * the run writes is checked together (outputs.h: --out, --dump and o->paths; exit 2), --dump
 * starts an atomic dump (dump.h: written aside, renamed into place when run_train ends; a failure
 * leaves DIR as it was), and --out (with the chapter's directories) is created and locked: one
 * run per directory. Collective. */
llama_model *run_model(const run_options *o, const llama_plan *plan);

/* 1 / the global count of valid targets; 0 valid targets give 0 (loss 0, zero gradients). */
float run_loss_scale(int n_valid);

/* This rank's share of the global batch tokens, targets [batch, T] (device) through the model:
 * its data-parallel rows, its context-parallel positions of them; the forward, and the backward
 * when `backward` (a plan that schedules the step itself, a pipeline, always runs both). Returns
 * the batch's loss, every rank's share summed (the token losses times loss_scale), the same on
 * every rank; *dh0 (if not NULL) receives d loss / d h0 of this rank's rows (see compare_step).
 * Collective. */
float run_forward_backward(llama_model *model, const int *tokens, const int *targets, float loss_scale,
                           bool backward, const float **dh0);

/* The parallel model's own time: wall seconds between start and stop (synchronised with the
 * device), and the part of them spent inside counted collectives. The baseline and the checks
 * run outside the started segments, so they do not count. */
typedef struct { double t0, c0, seconds, comm_seconds; } run_clock;
void run_clock_start(run_clock *k);
double run_clock_stop(run_clock *k);                 /* returns this segment's seconds */
/* Rank 0: "time per step: X ms (compute Y ms, communication Z ms, P%)". */
void run_clock_report(const run_clock *k, int steps);

/* Trains `model` for o->steps AdamW steps on the synthetic batches. Every step: zero the
 * gradients, forward, backward (timed; each data-parallel rank of plan->groups.batch takes its rows of
 * the global batch, and the printed loss is their sum), then with --check the baseline's step on
 * world rank 0 on the same global batch, the losses and every gradient compared (the gradients
 * judged on step 1, where both models hold the same parameters; see run.c), --dump, clipping by
 * the global norm (--clip-grad-norm, both models), and the optimizer.
 * Rank 0 prints one line per step labelled `label` and, when csv_path is not NULL, writes
 * "step,baseline,parallel" there. Collective. Resets the communication counters first, so the
 * report that follows counts the training steps only. */
run_clock run_train(const run_options *o, llama_model *model, const char *label, const char *csv_path);

/* Every rank: a failed write of an output file (files.h's file_write_error, on any rank) ends the
 * run with one line naming the file and the error, and exit 2; the file keeps its previous
 * content. run_train calls it every step, run_finish before the verdict. Collective. */
void run_require_written(void);

/* The verdict, the same in every chapter: `mismatches` measured figures that differ from their
 * formulas (report.h) and, with --check, the parity comparisons. Prints the verdict line,
 * finalises and returns the exit status: 0 pass, 1 a difference. */
int run_finish(const run_options *o, int mismatches);

C_END
