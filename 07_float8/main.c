/* Chapter 07: float8 training, tensorwise, rowwise and delayed scaling.
 *
 * Every linear inside the transformer blocks multiplies float8 operands (float8_linear.h): the
 * inputs and weights as E4M3, the gradients as E5M2 (rowwise: E4M3), each with a scale chosen by
 * the recipe. The CPU emulates the float8 GEMM as torchao does (dequantized operands, an fp32
 * GEMM). Under tensor parallelism (chapter 01's plan) the amaxes of the tensors that tp cuts are
 * agreed over tp, so each shard casts exactly as one device would.
 *
 * Two comparisons. With --check, rank 0 trains the single-device baseline under the SAME float8
 * recipe beside the parallel run (same scales, same casts), at the fp32 tolerances. And every run
 * measures float8 against fp32: the SQNR of each cast and each product against its fp32 value,
 * judged against torchao's thresholds; `make plot-07` draws the loss curves of fp32 and of each
 * recipe on the same data.
 *
 *   make run-07                                          tensorwise, tp 2, beside the float8 baseline
 *   make run-07 NP=4 ARGS="--fp8 rowwise"
 *   make run-07 NP=1 ARGS="--fp8 delayed --steps 50"
 *   make check-07                                        each recipe at tp 1, 2, 4; the bug
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "cli.h"
#include "comm.h"
#include "device.h"
#include "log.h"
#include "mesh.h"
#include "model.h"
#include "parity.h"
#include "report.h"
#include "run.h"
#include "../01_transformer_tp/tp.h"
#include "float8_linear.h"

static const char *usage =
    "usage: 07 [flags]   (under mpirun: NP = the tensor-parallel degree)\n"
    "  --fp8 off|tensorwise|rowwise|delayed   how each operand's scale is chosen (default tensorwise)\n"
    "  --amax-history N                      delayed: the amaxes kept per tensor (default 16)\n"
    "  --tp T                                tensor-parallel degree (default NP; must equal NP)\n";

enum { OPT_FP8 = 1, OPT_HISTORY, OPT_TP };
typedef struct { fp8_options fp8; int tp; } chapter_options;
static void chapter_flag(int code, const char *arg, void *ctx) {
    static const char *const recipes[] = {"off", "tensorwise", "rowwise", "delayed", NULL};
    chapter_options *co = ctx;
    if (code == OPT_FP8) co->fp8.recipe = (fp8_recipe)cli_choice("--fp8", arg, recipes);
    else if (code == OPT_HISTORY) co->fp8.amax_history = cli_int("--amax-history", arg, 1, 1024);
    else co->tp = cli_int("--tp", arg, 1, 4096);
}

/* torchao's thresholds (its float8 tests): an E4M3 cast at least 25 dB, a linear's output 18 dB,
 * its weight gradient 17 dB. An E5M2 cast has one mantissa bit less, 6.02 dB less signal to
 * rounding noise: 25 - 6.02. The input gradient is held to the output's 18 dB. */
static double threshold_db(fp8_recipe r, int role) {
    switch (role) {
    case FP8_CAST_X: case FP8_CAST_W: case FP8_CAST_DY:
        return fp8_role_format(r, role) == FLOAT8_E4M3 ? 25.0 : 25.0 - 20 * log10(2.0);
    case FP8_OUT_DW: return 17.0;
    default: return 18.0;
    }
}

static const char *kind_name(param_kind k) {
    static const char *names[P_NKINDS] = {"tok_embeddings", "attention_norm", "wq", "wk", "wv", "wo",
                                          "ffn_norm", "w1", "w2", "w3", "norm", "output"};
    return names[k];
}

/* The worst SQNR of each cast and product in step 1 (judged, as torchao's single-step tests) and
 * over the whole run (shown: a delayed scale that lags a growing amax clips), over every rank. */
static int report_accuracy(const llama_plan *plan, fp8_recipe r) {
    double first[FP8_NROLES], worst[FP8_NROLES];
    linear_site at[FP8_NROLES];
    float8_worst_sqnr(plan, first, worst, at);
    int bad = 0;
    log0("float8 against fp32: the lowest SQNR = 20 log10(|fp32| / |fp32 - float8|) over every linear (this rank's "
         "part of each tensor), in step 1 (judged) and over the run (shown):\n");
    log0("  %-12s %-9s %9s  %-14s %9s  %s\n", "", "format", "step 1", "threshold", "the run", "where");
    for (int role = 0; role < FP8_NROLES; role++) {
        double one = -comm_host_max(comm_world(), -first[role]);
        double mine = worst[role], all = -comm_host_max(comm_world(), -mine);
        bool ok = one >= threshold_db(r, role);
        bad += !ok;
        const char *fmt = role <= FP8_CAST_DY ? (fp8_role_format(r, role) == FLOAT8_E4M3 ? "E4M3" : "E5M2") : "fp32 acc.";
        char where[48] = "";
        if (mine == all) snprintf(where, sizeof where, "layers.%d.%s", at[role].layer, kind_name(at[role].kind));
        log0("  %-12s %-9s %6.2f dB  >= %5.2f dB %s %6.2f dB  %s\n", fp8_role_name(role), fmt, one,
             threshold_db(r, role), ok ? "ok   " : "BELOW", all, where);
    }
    if (bad) parity_fail("a float8 cast or product is further from fp32 than torchao's threshold (above)");
    return bad;
}

/* Step 1's casts, code by code, against the baseline's (rank 0). */
static const char *casts_flipped(const void *baseline) {
    fp8_cast_comparison k = float8_cast_comparison(baseline);
    static char why[200];
    if (k.neighbour == 0 || k.other || k.missing) return NULL;   /* exact casts: judge at fp32 tolerances */
    snprintf(why, sizeof why, "%lld cast value(s) landed on the neighbouring code (on a rounding boundary, the "
             "input different in its last bits): a whole float8 step, see the cast comparison", k.neighbour);
    return why;
}

static int report_casts(const llama_plan *baseline) {
    fp8_cast_comparison k = float8_cast_comparison(baseline);
    int bad = k.other > 0 || k.missing > 0;
    log0("step 1's casts against the baseline's, code by code: %lld equal, %lld the neighbouring code (a rounding "
         "boundary), %lld other, %lld not kept  %s\n", k.equal, k.neighbour, k.other, k.missing, bad ? "MISMATCH" : "ok");
    if (k.neighbour)
        log0("  after the first cast with a neighbour, computed from values a float8 step apart (not judged): %lld "
             "equal, %lld different\n", k.equal_after, k.differ_after);
    if (bad) parity_fail("a cast of the parallel run is neither the baseline's code nor its neighbour (above)");
    return bad;
}

/* The exact test: each tp shard's float8 bytes of every block weight against one device's cast. */
static int report_sharded_cast(const llama_plan *plan, llama_model *m) {
    long long compared = 0, bad = float8_sharded_cast_mismatches(plan, m, &compared);
    log0("sharded cast: the tp shards' float8 bytes of every block weight, gathered, against the cast of the "
         "whole weight on one device: %lld of %lld bytes differ  %s\n", bad, compared, bad ? "MISMATCH" : "(exact)");
    if (bad) parity_fail("a shard's float8 cast differs from the single-device cast (above)");
    return bad > 0;
}

/* tp's traffic per step: chapter 01's 4 all-reduces of [N, D] per layer, and the amaxes. */
static int report_traffic(const run_options *o, const llama_plan *plan, const llama_model *m, fp8_recipe r) {
    if (!plan->tp) return 0;
    double L = o->model.n_layers, N = m->d.N, D = m->d.D;
    bool rowwise = r == FP8_ROWWISE, fp8 = r != FP8_OFF;
    double calls = 4 * L + (fp8 ? 14 * L : 0);
    double bytes = 4 * L * N * D * 4 + (!fp8 ? 0 : rowwise ? 7 * L * (N + D) * 4 : 14 * L * 4);
    const char *formula = !fp8 ? "4 L x N D x 4"
                        : rowwise ? "4 L x N D x 4 + 14 L amaxes: 7 L (N + D) x 4"
                                  : "4 L x N D x 4 + 14 L amaxes of 4 bytes";
    comm_expectation e[] = {{plan->tp, COLL_ALL_REDUCE, calls, bytes, formula}};
    comm_group *groups[1] = {plan->tp};
    return report_communication(groups, 1, o->steps, e, 1);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* ---- flags ---- */
    run_options o = run_options_default("07", float8_faults);
    o.kv_heads_follow_heads = true;
    chapter_options co = {{FP8_TENSORWISE, 16}, 0};
    static const struct option flags[] = {
        {"fp8", required_argument, 0, OPT_FP8}, {"amax-history", required_argument, 0, OPT_HISTORY},
        {"tp", required_argument, 0, OPT_TP}, {0, 0, 0, 0}};
    run_parse(&o, argc, argv, flags, chapter_flag, &co, usage);
    const llama_config *c = &o.model;

    /* The outside replay (tests/reference_torch.py) computes in fp32: a float8 run's dump would
     * not say how to reproduce it yet. */
    if (o.dump_dir && co.fp8.recipe != FP8_OFF)
        comm_exit_usage("--dump is not available with --fp8 %s yet: the dump's replay does not emulate the float8 "
                        "casts; use --fp8 off", fp8_recipe_name(co.fp8.recipe));

    /* ---- mesh: tp ---- */
    char degree[32];
    int tp = run_tp_degree(co.tp, degree, sizeof degree);
    device_mesh *mesh = mesh_create((mesh_shape){{1, 1, 1, 1, tp}});

    /* ---- the plans: chapter 01's (tp > 1), float8 linears on it; the baseline, one device, the same casts ---- */
    llama_plan plan = tensor_parallel_or_single(mesh, c);
    float8_apply(&plan, c, &co.fp8);
    llama_plan baseline = plan_single_device();
    float8_apply(&baseline, c, &co.fp8);
    o.baseline_plan = &baseline;
    /* Step 1 starts from the same parameters, so every cast agrees and the gradients match at the
     * fp32 tolerances. After an AdamW step the two runs' parameters differ in their last bits, and
     * a float8 cast turns such a difference into a whole quantum (1/8 of a binade in E4M3) for any
     * value that lies next to a rounding boundary: the runs then drift apart at float8's scale. */
    o.judge_first_step_only = true;
    float8_compare_casts(&plan, &baseline);   /* step 1's casts, code by code */
    o.step1_grads_unjudged = casts_flipped;
    o.step1_ctx = &baseline;
    run_apply_fault(&o, &plan);
    llama_model *model = run_model(&o, &plan);

    log0("chapter 07: float8 training, %s scaling%s, tp %d, backend %s (the float8 GEMM emulated: fp32 GEMM of "
         "dequantized operands)\n", fp8_recipe_name(co.fp8.recipe), co.fp8.recipe == FP8_DELAYED ? " (history)" : "",
         tp, device_backend_name());
    log0("model: dim %d, %d layers, %d heads (%d kv), ffn %d, vocab %d; batch %d x %d tokens; float8: wq wk wv wo "
         "w1 w2 w3 of every layer (the output layer stays fp32)\n", c->dim, c->n_layers, c->n_heads, c->n_kv_heads,
         c->ffn_dim, c->vocab_size, o.batch, c->seq_len);

    /* ---- train, with the float8 baseline beside it ---- */
    char path[512], label[64];
    snprintf(path, sizeof path, "%s/loss_%s_tp%d.csv", o.out_dir, fp8_recipe_name(co.fp8.recipe), tp);
    snprintf(label, sizeof label, "%s tp=%d", fp8_recipe_name(co.fp8.recipe), tp);
    run_clock clock = run_train(&o, model, label, path);

    /* ---- measured beside the thresholds and the formulas ---- */
    log0("\n");
    int mismatches = 0;
    mismatches += report_traffic(&o, &plan, model, co.fp8.recipe);
    if (co.fp8.recipe != FP8_OFF) {
        mismatches += report_accuracy(&plan, co.fp8.recipe);
        if (o.check) mismatches += report_casts(&baseline);
        mismatches += report_sharded_cast(&plan, model);   /* (its own amax all-reduces come after the table) */
    }
    run_clock_report(&clock, o.steps);

    llama_free(model);
    float8_free(&plan);
    float8_free(&baseline);
    return run_finish(&o, mismatches);
}
