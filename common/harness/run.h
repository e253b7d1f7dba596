/* run.h: what every Llama chapter does around its plan, written once: the model and training
 * flags, the synthetic batches, the training step with the single-device baseline beside it,
 * the per-step comparison, --dump, --fault, and the verdict. The harness is called; it calls
 * nothing of a chapter's.
 *
 * A chapter's main.c reads: flags (RUN_FLAGS + its own), mesh, plan (+ the --fault it names),
 * model, run_train() (or its own loop over run_step: chapters 07 and 08), its formula tables
 * (report.h), run_finish().
 */
#pragma once
#include <getopt.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include "cdefs.h"
#include "llama.h"
#include "model.h"
#include "outputs.h"
#include "plan.h"

C_BEGIN

/* The settings every chapter shares: the model, the optimizer, the run, the check, the outputs.
 * A chapter's own settings (chapter 08's data, schedule, checkpoints) stay in the chapter. */
typedef struct {
    llama_config model;
    adamw_config opt;
    int batch, steps;
    int accum;               /* micro-batches per optimizer step (gradient accumulation; 0: 1):
                              * the step's loss is the mean over the valid targets of all of
                              * them, and the dump's batch_K holds them one after the other    */
    uint64_t seed;
    bool check;              /* train the baseline on rank 0 and compare every step     */
    bool verbose_grads;      /* print the whole gradient table every step               */
    const char *dump_dir;    /* --dump DIR, or NULL                                     */
    const char *out_dir;     /* CSV files                                               */
    const char *fault;       /* --fault NAME, or NULL                                   */
    const plan_fault *faults;   /* the chapter's deliberate bugs, {NULL}-terminated     */
    bool kv_heads_follow_heads; /* set before parsing: without --n-kv-heads, n_kv_heads =
                                 * n_heads (no grouping), so every tp dividing the heads runs */
    bool kv_heads_given;     /* --n-kv-heads was on the command line                    */
    bool dtype_given;        /* --dtype was on the command line (08 on CUDA defaults to bf16) */
    int baseline_dtype;      /* --baseline-dtype: the --check baseline's precision; -1: --dtype's.
                              * Another than --dtype compares curves, not parity (run.c)   */
} run_options;

/* getopt_long codes of the shared flags (above any single-character option). */
enum {
    RUN_OPT_DIM = 1000, RUN_OPT_LAYERS, RUN_OPT_HEADS, RUN_OPT_KV_HEADS, RUN_OPT_FFN,
    RUN_OPT_VOCAB, RUN_OPT_SEQ, RUN_OPT_BATCH, RUN_OPT_STEPS, RUN_OPT_LR, RUN_OPT_SEED,
    RUN_OPT_CHECK, RUN_OPT_VERBOSE, RUN_OPT_DUMP, RUN_OPT_OUT, RUN_OPT_FAULT, RUN_OPT_TIMEOUT, RUN_OPT_CLIP, RUN_OPT_DTYPE,
    RUN_OPT_BASELINE_DTYPE, RUN_OPT_HELP
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
    {"dtype", required_argument, 0, RUN_OPT_DTYPE},                                              \
    {"baseline-dtype", required_argument, 0, RUN_OPT_BASELINE_DTYPE},                            \
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
/* The first shared flag that set the trained model's shape or batch differently from `defaults`
 * (the chapter's, before parsing): "--dim", "--n-layers", ..., or NULL. A run that trains nothing
 * (chapters 08 and 09's --plan, whose model is the --plan-* flags') refuses it rather than ignore it. */
const char *run_model_flag_given(const run_options *o, const run_options *defaults);
/* After parsing: applies kv_heads_follow_heads; the model must be valid for a [batch, seq_len]
 * batch and --fault must name one of the chapter's faults (exit 2). The output directories are
 * checked by run_model, after every other refusal, so a refused run creates nothing. */
void run_options_validate(run_options *o);

/* Applies --fault (if given) to the plan, before the model is built; prints what it breaks.
 * A fault that does not fit the plan exits 2 with its reason. */
void run_apply_fault(const run_options *o, llama_plan *plan);

/* The model under `plan` (llama_create), after checking up front that it can exist: no tensor
 * of 2^31 elements or more (the kernels index with int), and the bytes it needs on this rank
 * (with --check, rank 0 adds the baseline's) within what the device has available. Otherwise one
 * line naming the figures and exit 2, before anything is allocated or created. Then every path
 * the run writes is checked together (outputs.h: --out, --dump and the chapter's `paths`; exit
 * 2), --dump starts an atomic dump (dump.h: written aside, renamed into place when the training
 * ends; a failure leaves DIR as it was), and --out (with the chapter's directories) is created
 * and locked: one run per directory. Collective. */
llama_model *run_model(const run_options *o, const llama_plan *plan);
/* The same, with the chapter's own paths checked beside --out and --dump (chapter 08's --data,
 * an input, --ckpt-dir, --export, OUT/metrics.csv). */
llama_model *run_model_paths(const run_options *o, const llama_plan *plan, const run_path *paths, int n_paths);

/* --dump: the chapter's settings a replay needs (chapter 07: the float8 recipe), a JSON object
 * of at most 255 bytes, written as the "run_options" metadata of the parameter files (dump.h).
 * Called on every rank before run_model; a value dump.h refuses exits 2 with one line. */
void run_dump_describe(const run_options *o, const char *json);

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

/* ---- the --check baseline ----
 * World rank 0 builds the single-device model from the same initialisation and trains it on the
 * same global batches beside the parallel one; run_step_check compares the losses and gradients
 * of every step (gathered to rank 0), run_loop_end the parameters after the last step. The
 * tolerances and why the gradients are judged on step 1 only: docs/design.md, "Parity". */
typedef struct baseline_check baseline_check;
/* With --check: the check on every rank (the comparisons gather from every rank), the baseline
 * model on world rank 0 under `plan` (NULL: plan_single_device(); chapter 07: the same float8
 * casts on one device; 06, 08, 09 under bf16 with cp: attention in the cp ranks' blocks). first_step_only: judge the loss and the gradients of step 1 only, and
 * not the parameters after the last step (float8 casts turn rounding-level differences into
 * whole quanta once the parameters differ). Without --check: NULL, which every function below
 * accepts. Collective. */
baseline_check *run_baseline_create(const run_options *o, const llama_plan *plan, bool first_step_only);
/* The --check baseline's precision: --baseline-dtype's, else the run's --dtype. */
dtype run_baseline_precision(const run_options *o);
/* Step 1's gradients are shown, not judged, because of `why` (NULL: judged). Called between
 * run_step and run_step_check of step 1 (chapter 07: a float8 cast of step 1 landed on the
 * neighbouring code, which only the step itself can tell). Rank 0 uses it. */
void run_baseline_unjudged(baseline_check *b, const char *why);

/* ---- the training loop, a chapter's or run_train's ----
 *     run_loop loop = run_loop_begin(&o, model, check, label, csv_path);
 *     for (int step = first; step <= o.steps; step++) {
 *         run_synthetic_batch(&loop, step);              (or the chapter's data into loop.tokens)
 *         run_step_result r = run_step(&loop, step, lr); forward, backward: the gradients
 *         run_step_check(&loop, &r);                     --check, --dump
 *         run_update(&loop, &r);                         clipping, AdamW
 *     }
 *     run_clock clock = run_loop_end(&loop);
 */

/* The parallel model's own time: wall seconds between start and stop (synchronised with the
 * device), and the part of them spent inside counted collectives. The baseline and the checks
 * run outside the started segments, so they do not count; but while world rank 0 trains the
 * baseline the other ranks wait for it in their next collective, so under --check the split
 * between compute and communication is not the technique's (beside_baseline: the report says so). */
typedef struct { double t0, c0, seconds, comm_seconds; bool beside_baseline; } run_clock;
void run_clock_start(run_clock *k);
double run_clock_stop(run_clock *k);                 /* returns this segment's seconds */
/* Rank 0: "time per step: X ms (compute Y ms, communication Z ms, P%)", and under --check a line
 * saying that these timings are not a measurement of the technique (make bench-NN measures it). */
void run_clock_report(const run_clock *k, int steps);

typedef struct {
    const run_options *o;
    llama_model *model;
    baseline_check *check;      /* NULL without --check                                       */
    int *tokens, *targets;      /* host [accum x batch, T]: the step's global batch, its accum
                                 * micro-batches one after the other (the chapter's data, or
                                 * run_synthetic_batch)                                         */
    int *dev_tokens, *dev_targets; /* device [batch, T]: the micro-batch on the model          */
    float *dev_scalar;          /* the gradient norm's all-reduce                               */
    const char *label;          /* the step line's: "step N | loss LABEL ..."                   */
    bool own_metrics;           /* the chapter prints each step's metrics itself (chapter 08):
                                 * the step line only beside the baseline, no clipping line     */
    FILE *csv;                  /* rank 0: step,baseline,parallel, or NULL                      */
    run_clock clock;
} run_loop;

/* What a step did. */
typedef struct {
    int step;
    double loss;             /* the step's mean loss over its valid targets, every rank        */
    double base_loss;        /* the baseline's (rank 0 with --check; NAN elsewhere)            */
    double lr;               /* the learning rate of its update, as fp32 (run_step's NAN:
                              * o->opt.lr, set by run_update; the dump then writes no lr)      */
    double grad_norm;        /* the global gradient norm before clipping (NAN when not computed) */
    double seconds;          /* wall time of the step's forward, backward and update            */
    double fb_seconds;       /* of its forward and backward                                     */
    long long tokens;        /* the global batch's tokens, accum x batch x seq_len              */
    int n_pad;               /* its padded targets (-100)                                       */
    const float *dh0;        /* d loss / d h0 of this rank's rows, its last micro-batch's       */
} run_step_result;

/* Before the first step: the batch buffers, --dump's init.safetensors (the parameters before any
 * step), the loss CSV at csv_path (NULL: none), the communication counters reset (the reports
 * count the training steps only) and the memory peaks (the parallel run's own from here on).
 * `check` is the loop's from here on (run_loop_end frees it). Collective. */
run_loop run_loop_begin(const run_options *o, llama_model *model, baseline_check *check, const char *label,
                        const char *csv_path);
/* The synthetic global batch of `step` (data.h; the same whatever the layout) into loop->tokens. */
void run_synthetic_batch(run_loop *l, int step);
/* One step's gradients: zero, then for each micro-batch of loop->tokens the forward and backward
 * (timed; each data-parallel rank of plan->groups.batch takes its rows of the global batch, and the loss
 * is their sum; the plan's reductions run after the last micro-batch); with --check the
 * baseline's on world rank 0, on the same global batch. Then the step line and the CSV row, and
 * a failed write of either ends the run (run_require_written). `lr`: the learning rate of this
 * step's update (NAN: o->opt.lr). --dump writes the batch. Collective. */
run_step_result run_step(run_loop *l, int step, double lr);
/* With --check: the losses (every step, or step 1 only), every gradient and dX compared with the
 * baseline's, gathered to world rank 0 (judged on step 1; a table on step 1 or with
 * --verbose-grads). With --dump: step 1's gradients, and every step's loss (and lr, when the
 * step has one) in losses.txt. Collective. */
void run_step_check(run_loop *l, const run_step_result *r);
/* The update: clipping by the global norm (--clip-grad-norm; both models; r->grad_norm receives
 * the norm before clipping), then AdamW at r->lr on both models (timed: r->seconds). Collective. */
void run_update(run_loop *l, run_step_result *r);
/* After the last step: the CSV closed, with --check the parameters compared with the baseline's
 * (or said not judged), the dump committed (one rename), every buffer and the baseline freed.
 * Returns the parallel model's time over the steps. Collective. */
run_clock run_loop_end(run_loop *l);

/* Chapters 01-06: o->steps steps on the synthetic batches beside the single-device baseline
 * (with --check; under `baseline`, NULL: plan_single_device(), as run_baseline_create), the loop
 * above, each step's line labelled `label`, the CSV at csv_path (NULL: none). Collective. */
run_clock run_train(const run_options *o, llama_model *model, const llama_plan *baseline, const char *label,
                    const char *csv_path);

/* Every rank: a failed write of an output file (files.h's file_write_error, on any rank) ends the
 * run with one line naming the file and the error, and exit 2; the file keeps its previous
 * content. run_step calls it every step, run_finish before the verdict. Collective. */
void run_require_written(void);

/* The verdict, the same in every chapter: `mismatches` measured figures that differ from their
 * formulas (report.h) and, with --check, the parity comparisons. Prints the verdict line,
 * finalises and returns the exit status: 0 pass, 1 a difference. */
int run_finish(const run_options *o, int mismatches);

C_END
