/* run.h: what every Llama chapter's main does around its technique, written once:
 * the model and training flags, the synthetic batches, the per-step comparison with the
 * single-device baseline, and the --dump export.
 *
 * A chapter's main.c reads: parse flags (RUN_FLAGS + its own), build its mesh and its parallel
 * model, and for each step: run_batch, its forward/backward, the baseline's, run_compare_step,
 * the optimizer; then its report. The parallel model plugs in through one function that brings
 * a full parameter or gradient to rank 0 (run_gather_fn).
 */
#pragma once
#include <getopt.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include "cdefs.h"
#include "llama.h"

C_BEGIN

typedef struct {
    llama_config model;
    adamw_config opt;
    int batch, steps;
    uint64_t seed;
    bool check;              /* train the baseline on rank 0 and compare every step     */
    bool verbose_grads;      /* print the whole gradient table every step               */
    const char *dump_dir;    /* --dump DIR, or NULL                                     */
    const char *out_dir;     /* CSV files                                               */
    bool kv_heads_follow_heads; /* set before parsing: without --n-kv-heads, n_kv_heads =
                                 * n_heads (no grouping), so every tp dividing the heads runs */
    bool kv_heads_given;     /* --n-kv-heads was on the command line                    */
} run_options;

/* getopt_long codes of the shared flags (above any single-character option). */
enum {
    RUN_OPT_DIM = 1000, RUN_OPT_LAYERS, RUN_OPT_HEADS, RUN_OPT_KV_HEADS, RUN_OPT_FFN,
    RUN_OPT_VOCAB, RUN_OPT_SEQ, RUN_OPT_BATCH, RUN_OPT_STEPS, RUN_OPT_LR, RUN_OPT_SEED,
    RUN_OPT_CHECK, RUN_OPT_VERBOSE, RUN_OPT_DUMP, RUN_OPT_OUT, RUN_OPT_HELP
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
    {"help", no_argument, 0, RUN_OPT_HELP}

/* Defaults: llama_config_default(), adamw_config_default(), batch 4, 5 steps, seed 1234,
 * out_dir "out/<chapter>". */
run_options run_options_default(const char *chapter);
/* Handles one shared flag; returns 0 when `code` is not one of them. --help prints the shared
 * part of the usage after `chapter_usage` and exits 0. Bad values exit 2 (cli.h). */
int run_options_parse(run_options *o, int code, const char *arg, const char *chapter_usage);
/* After parsing: applies kv_heads_follow_heads; the model must be valid for a [batch, seq_len] batch (exit 2 otherwise). */
void run_options_validate(run_options *o);

/* Device ints 0..T-1: the global positions of a whole sequence (MEM_BUFFERS). */
int *run_positions(int T);
/* The step's global batch (data.h), copied to the device (and written to --dump DIR).
 * Returns the count of valid targets; *n_pad receives the count of padded ones. */
int run_batch(const run_options *o, int step, int *tokens_dev, int *targets_dev, int *n_pad);
/* 1 / the global count of valid targets; 0 valid targets give 0 (loss 0, zero gradients). */
float run_loss_scale(int n_valid);

/* Brings parameter (grad = false) or gradient (grad = true) `index` of the parallel model to
 * rank 0 of the world as a full host tensor. Collective over the world. */
typedef void (*run_gather_fn)(void *model, int index, bool grad, float *full);

/* Rank 0: the step's line, parallel loss beside the baseline's (base may be NAN without --check). */
void run_print_step(int step, const char *label, double loss, double base_loss, int n_pad,
                    double step_ms);
/* Compares the losses (judged every step), then every gradient (judged on step 1, where both
 * models hold the same parameters; shown after that, see run.c for why), (gathered) and the embedding-output gradient
 * dh0_full (host, rank 0) with the baseline `base` (non-NULL on rank 0 only). Collective.
 * Prints the full table on step 1 (and every step with --verbose-grads), one line otherwise. */
void run_compare_step(const run_options *o, int step, double loss, double base_loss,
                      llama_model *base, run_gather_fn gather, void *model, const float *dh0_full);

/* The baseline's half of a step, on rank 0 only (base == NULL elsewhere: returns NAN): zero its
 * gradients, forward and backward on the same global batch as the parallel model. */
double run_baseline_step(llama_model *base, const int *tokens, const int *targets,
                         const int *positions, float loss_scale);
/* Everything a step does after both backwards, the same in every chapter: print the step's
 * line, append "step,baseline,parallel" to csv (may be NULL), compare with the baseline
 * (--check, see run_compare_step) and export (--dump). Collective. */
void run_step_report(const run_options *o, int step, const char *label, FILE *csv, double loss,
                     double base_loss, int n_pad, double step_ms, llama_model *base,
                     run_gather_fn gather, void *model, const float *dh0_full);

/* The parallel model's own time: wall seconds between start and stop (synchronised with the
 * device), and the part of them spent inside counted collectives. The baseline and the checks
 * run outside the started segments, so they do not count. */
typedef struct { double t0, c0, seconds, comm_seconds; } run_clock;
void run_clock_start(run_clock *k);
double run_clock_stop(run_clock *k);                 /* returns this segment's seconds */
/* Rank 0: "time per step: X ms (compute Y ms, communication Z ms, P%)". */
void run_clock_report(const run_clock *k, int steps);

/* --dump: full parameters before step 1, the batch of each step, the gradients of step 1 and
 * the losses. Collective (the gathers); rank 0 writes. Exit 2 when DIR cannot be written. */
void run_dump_params(const run_options *o, const char *file, bool grads, run_gather_fn gather, void *model);
void run_dump_step(const run_options *o, int step, double loss);

C_END
