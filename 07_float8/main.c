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
#include <string.h>
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
#include "../04_fsdp/data_parallel.h"
#include "float8_all_gather.h"
#include "float8_linear.h"

static const char *usage =
    "usage: 07 [flags]   (under mpirun: NP = dp-shard x tp ranks)\n"
    "  --fp8 off|tensorwise|rowwise|delayed   how each operand's scale is chosen (default tensorwise)\n"
    "  --amax-history N                      delayed: the amaxes kept per tensor (default 16)\n"
    "  --tp T                                tensor-parallel degree (default NP / dp-shard)\n"
    "  --dp-shard S                          FSDP over S ranks (chapter 04's fully sharded plan; default 1)\n"
    "  --fp8-all-gather                      FSDP's all-gathers move the block weights as float8 bytes\n"
    "                                        (tensorwise only)\n"
    "  --cast-sample                         write OUT/cast_sample.csv: layer 0's w1 after training, scaled\n"
    "                                        tensorwise into E4M3, before and after the cast (make plot-07)\n";

enum { OPT_FP8 = 1, OPT_HISTORY, OPT_TP, OPT_DP_SHARD, OPT_FP8_GATHER, OPT_SAMPLE };
typedef struct { fp8_options fp8; int tp, dp_shard; bool fp8_all_gather, cast_sample; } chapter_options;
static void chapter_flag(int code, const char *arg, void *ctx) {
    static const char *const recipes[] = {"off", "tensorwise", "rowwise", "delayed", NULL};
    chapter_options *co = ctx;
    if (code == OPT_FP8) co->fp8.recipe = (fp8_recipe)cli_choice("--fp8", arg, recipes);
    else if (code == OPT_HISTORY) co->fp8.amax_history = cli_int("--amax-history", arg, 1, 1024);
    else if (code == OPT_TP) co->tp = cli_int("--tp", arg, 1, 4096);
    else if (code == OPT_DP_SHARD) co->dp_shard = cli_int("--dp-shard", arg, 1, 4096);
    else if (code == OPT_FP8_GATHER) co->fp8_all_gather = true;
    else co->cast_sample = true;
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
static int report_accuracy(const llama_plan *plan, fp8_recipe r, const dp_gather_ops *gather) {
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
        char where[64] = "";
        if (role == FP8_CAST_W && gather)
            snprintf(where, sizeof where, "(already float8: cast in the all-gather, below)");
        else if (mine == all && isfinite(mine))
            snprintf(where, sizeof where, "layers.%d.%s", at[role].layer, kind_name(at[role].kind));
        log0("  %-12s %-9s %6.2f dB  >= %5.2f dB %s %6.2f dB  %s\n", fp8_role_name(role), fmt, one,
             threshold_db(r, role), ok ? "ok   " : "BELOW", all, where);
    }
    if (gather) {   /* the weights' cast, done on the shards before the all-gather */
        double db = -comm_host_max(comm_world(), -float8_all_gather_worst_sqnr(gather));
        bool ok = db >= threshold_db(r, FP8_CAST_W);
        bad += !ok;
        log0("  %-12s %-9s %6.2f dB  >= %5.2f dB %s (each shard with the tensor's scale, over the run)\n",
             "cast W, gather", "E4M3", db, threshold_db(r, FP8_CAST_W), ok ? "ok   " : "BELOW");
    }
    if (bad) parity_fail("a float8 cast or product is further from fp32 than torchao's threshold (above)");
    return bad;
}

/* Step 1's casts, code by code, against the baseline's (rank 0). */
static const char *casts_flipped(const void *baseline) {
    fp8_cast_comparison k = float8_cast_comparison(baseline);
    static char why[200];
    if (k.neighbour == 0 || k.other || k.missing || k.scale_differs) return NULL;   /* judge at fp32 tolerances */
    snprintf(why, sizeof why, "%lld cast value(s) landed on the neighbouring code (on a rounding boundary, the "
             "input different in its last bits): a whole float8 step, see the cast comparison", k.neighbour);
    return why;
}

static int report_casts(const llama_plan *baseline) {
    fp8_cast_comparison k = float8_cast_comparison(baseline);
    int bad = k.other > 0 || k.missing > 0 || k.scale_differs > 0;
    log0("step 1's casts against the baseline's, code by code: %lld equal, %lld the neighbouring code (a rounding "
         "boundary), %lld other, %lld not kept; %lld scales more than 1e-5 apart  %s\n", k.equal, k.neighbour, k.other,
         k.missing, k.scale_differs, bad ? "MISMATCH" : "ok");
    if (k.neighbour)
        log0("  after the first cast with a neighbour, computed from values a float8 step apart (not judged): %lld "
             "equal, %lld different\n", k.equal_after, k.differ_after);
    if (bad) parity_fail("step 1's casts differ from the baseline's: a code neither equal nor the neighbour, or a "
                         "scale more than 1e-5 apart (above)");
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

/* Per step. tp: chapter 01's 4 all-reduces of [N, D] per layer, and the float8 linears' amaxes.
 * dp_shard (FSDP, every tensor gathered before its forward and again before its backward, its
 * gradient reduce-scattered): with --fp8-all-gather the 7 L block weights move 1 byte per element
 * instead of 4, after one amax all-reduce each (over dp_shard, and over tp). */
static int report_traffic(const run_options *o, device_mesh *mesh, const llama_plan *plan, const llama_model *m,
                          fp8_recipe r, bool fp8_gather) {
    double L = o->model.n_layers, N = m->d.N, D = m->d.D;
    bool rowwise = r == FP8_ROWWISE, fp8 = r != FP8_OFF;
    comm_group *groups[2];
    comm_expectation e[4];
    int n_groups = 0, n = 0;
    comm_group *shard = mesh->group[MESH_DP_SHARD];
    if (shard->size > 1) {   /* the tensors' shards: S x ceil(units / S) x width, padded */
        const param_table *t = m->params;
        double fp32 = 0, blocks = 0;
        for (int i = 0; i < t->n; i++) {
            double elems = (double)shard->size * t->t[i].shard_units * t->t[i].width;
            fp32 += 4 * elems;
            if (float8_gathers(t->t[i].spec.kind)) blocks += elems;
        }
        double gathered = fp8_gather ? fp32 - 3 * blocks : fp32;   /* a block weight: 1 byte, not 4 */
        groups[n_groups++] = shard;
        e[n++] = (comm_expectation){shard, COLL_ALL_GATHER, 2.0 * t->n, 2 * gathered,
                                    fp8_gather ? "2 x (S Psi_S x 4 - 3 S Psi_blocks)" : "2 x S Psi_S x 4"};
        e[n++] = (comm_expectation){shard, COLL_REDUCE_SCATTER, t->n, fp32, "S Psi_S x 4"};
        if (fp8_gather) e[n++] = (comm_expectation){shard, COLL_ALL_REDUCE, 2 * 7 * L, 2 * 7 * L * 4, "2 x 7 L amaxes of 4 bytes"};
        if (fp8_gather)
            log0("float8 all-gather: the block weights (S Psi_blocks = %.0f elements with the padding) move %s per "
                 "gather instead of %s, a quarter\n", blocks, fmt_bytes(blocks), fmt_bytes(4 * blocks));
    }
    if (plan->tp) {
        double calls = 4 * L + (fp8 ? 14 * L : 0) + (fp8_gather ? 14 * L : 0);
        double bytes = 4 * L * N * D * 4 + (!fp8 ? 0 : rowwise ? 7 * L * (N + D) * 4 : 14 * L * 4) + (fp8_gather ? 14 * L * 4 : 0);
        const char *formula = !fp8 ? "4 L x N D x 4"
                            : rowwise ? "4 L x N D x 4 + 14 L amaxes: 7 L (N + D) x 4"
                            : fp8_gather ? "4 L x N D x 4 + 28 L amaxes of 4 bytes"
                                         : "4 L x N D x 4 + 14 L amaxes of 4 bytes";
        groups[n_groups++] = plan->tp;
        e[n++] = (comm_expectation){plan->tp, COLL_ALL_REDUCE, calls, bytes, formula};
    }
    return n_groups ? report_communication(groups, n_groups, o->steps, e, n) : 0;
}

/* Layer 0's w1, gathered to rank 0, scaled tensorwise into E4M3 (s = 448 / amax): each element's
 * x, x s and its cast's value decode(q) in the scaled domain, for make plot-07's histogram. */
static void write_cast_sample(llama_model *m, const char *path) {
    const param_table *t = m->params;
    int i = param_index(t, P_W1, 0);
    param_spec spec = t->t[i].spec;
    size_t n = (size_t)spec.rows * spec.cols;
    float *w = comm_world()->rank == 0 ? malloc(n * sizeof(float)) : NULL;
    param_gather(t, i, false, w);
    if (!w) return;
    float amax = 0;
    for (size_t k = 0; k < n; k++) amax = float8_amax_merge(amax, fabsf(w[k]));
    float s = float8_scale_from_amax(amax, FLOAT8_E4M3, 0);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "x,x_scaled,cast_scaled\n");
        for (size_t k = 0; k < n; k++)
            fprintf(f, "%.9g,%.9g,%.9g\n", w[k], w[k] * s, float8_decode(float8_encode(w[k] * s, FLOAT8_E4M3), FLOAT8_E4M3));
        fclose(f);
        log0("cast sample: %s (%zu elements of %s, amax %.6g, scale %.6g)\n", path, n, spec.name, amax, s);
    }
    free(w);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* ---- flags ---- */
    run_options o = run_options_default("07", float8_faults);
    o.kv_heads_follow_heads = true;
    chapter_options co = {{FP8_TENSORWISE, 16, 1}, 0, 1, false, false};
    static const struct option flags[] = {
        {"fp8", required_argument, 0, OPT_FP8}, {"amax-history", required_argument, 0, OPT_HISTORY},
        {"tp", required_argument, 0, OPT_TP}, {"dp-shard", required_argument, 0, OPT_DP_SHARD},
        {"fp8-all-gather", no_argument, 0, OPT_FP8_GATHER}, {"cast-sample", no_argument, 0, OPT_SAMPLE},
        {0, 0, 0, 0}};
    run_parse(&o, argc, argv, flags, chapter_flag, &co, usage);
    const llama_config *c = &o.model;

    /* --dump: the recipe, as the "run_options" metadata, for the outside replay
     * (tests/reference_torch.py emulates these casts; docs/dump-format.md). */
    static const char *const scale_rule[FP8_NRECIPES] = {
        "", "fp32(max/max(amax,1e-12)) per tensor", "pow2_floor(fp32(max/max(amax,1e-12))) per row",
        "fp32(max/max(max(amax history),1e-12)) per tensor"};
    char fp8_json[256];   /* (a metadata value: at most 255 bytes) */
    const char *fmt_name[2] = {"e4m3fn", "e5m2"};
    if (co.fp8.recipe != FP8_OFF) {   /* activation_groups: each dp rank scales its rows apart */
        snprintf(fp8_json, sizeof fp8_json, "{\"float8\":{\"recipe\":\"%s\",\"amax_history\":%d,\"float8_linears\":"
                 "[\"wq\",\"wk\",\"wv\",\"wo\",\"w1\",\"w2\",\"w3\"],\"formats\":{\"x\":\"%s\",\"w\":\"%s\",\"dy\":\"%s\"},"
                 "\"activation_groups\":%d,\"scale_rule\":\"%s\"}}", fp8_recipe_name(co.fp8.recipe), co.fp8.amax_history,
                 fmt_name[fp8_role_format(co.fp8.recipe, FP8_CAST_X)], fmt_name[fp8_role_format(co.fp8.recipe, FP8_CAST_W)],
                 fmt_name[fp8_role_format(co.fp8.recipe, FP8_CAST_DY)], co.dp_shard, scale_rule[co.fp8.recipe]);
        o.dump_run_options = fp8_json;
    }

    if (co.fp8_all_gather && (co.dp_shard < 2 || co.fp8.recipe != FP8_TENSORWISE))
        comm_exit_usage("--fp8-all-gather casts FSDP's gathered weights with the tensorwise scale: it needs --dp-shard 2 "
                        "or more and --fp8 tensorwise (got --dp-shard %d, --fp8 %s)", co.dp_shard,
                        fp8_recipe_name(co.fp8.recipe));

    /* ---- mesh: dp_shard x tp (tp = NP / dp-shard when not given) ---- */
    int S = co.dp_shard, world = comm_world()->size;
    int tp = co.tp ? co.tp : (world % S == 0 ? world / S : 0);
    if (!tp) comm_exit_usage("NP=%d is not divisible by --dp-shard %d: the tp degree would not be whole", world, S);
    device_mesh *mesh = mesh_create((mesh_shape){{1, 1, S, 1, tp}});
    data_parallel_validate_batch(o.batch, 1, S);

    /* ---- the plans: chapter 01's (tp > 1), chapter 04's FSDP (dp-shard > 1), float8 linears on
     * them; the baseline, one device, the same casts (each dp rank's rows scaled apart) ---- */
    llama_plan plan = tensor_parallel_or_single(mesh, c);
    dp_gather_ops gather = {0};
    if (S > 1) {
        if (co.fp8_all_gather) gather = float8_all_gather_ops(plan.tp);
        dp_options dp = {DP_FSDP, true, true, 64 * 256, co.fp8_all_gather ? &gather : NULL};
        data_parallel_apply(&plan, mesh, c, &dp);
    }
    /* (after the plans, which refuse a tp that splits no whole head and a batch the dp ranks cannot share) */
    const char *why = float8_shape_error(c, tp, o.batch / S * c->seq_len, co.fp8.recipe);
    if (why) comm_exit_usage("%s", why);
    float8_apply(&plan, c, &co.fp8);
    llama_plan baseline = plan_single_device();
    fp8_options one_device = co.fp8;
    one_device.activation_groups = S;
    float8_apply(&baseline, c, &one_device);
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

    bool on_gpu = strcmp(device_backend_name(), "cuda") == 0, bytes = co.fp8.recipe != FP8_ROWWISE;
    log0("chapter 07: float8 training, %s scaling%s, %s%stp %d, backend %s (the float8 GEMMs: %s)\n",
         fp8_recipe_name(co.fp8.recipe), co.fp8.recipe == FP8_DELAYED ? " (history)" : "", S > 1 ? "fsdp x " : "",
         co.fp8_all_gather ? "(float8 all-gather) " : "", tp, device_backend_name(),
         co.fp8.recipe == FP8_OFF ? "none, fp32"
         : bytes && on_gpu ? "cuBLASLt on float8 bytes"
         : bytes ? "float8 bytes decoded into an fp32 GEMM, cuBLASLt's CPU twin"
                 : "emulated, an fp32 GEMM of the dequantized operands");
    if (S > 1) log0("fsdp: dp-shard %d; every dp rank scales its own rows' activations (x, dy), and so does the "
                    "baseline, row block by row block\n", S);
    log0("model: dim %d, %d layers, %d heads (%d kv), ffn %d, vocab %d; batch %d x %d tokens; float8: wq wk wv wo "
         "w1 w2 w3 of every layer (the output layer stays fp32)\n", c->dim, c->n_layers, c->n_heads, c->n_kv_heads,
         c->ffn_dim, c->vocab_size, o.batch, c->seq_len);

    /* ---- train, with the float8 baseline beside it ---- */
    char path[512], label[64];
    snprintf(path, sizeof path, "%s/loss_%s_dp%d_tp%d.csv", o.out_dir, fp8_recipe_name(co.fp8.recipe), S, tp);
    snprintf(label, sizeof label, "%s dp=%d tp=%d", fp8_recipe_name(co.fp8.recipe), S, tp);
    run_clock clock = run_train(&o, model, label, path);

    /* ---- measured beside the thresholds and the formulas ---- */
    log0("\n");
    int mismatches = 0;
    mismatches += report_traffic(&o, mesh, &plan, model, co.fp8.recipe, co.fp8_all_gather);
    if (co.fp8.recipe != FP8_OFF) {
        mismatches += report_accuracy(&plan, co.fp8.recipe, co.fp8_all_gather ? &gather : NULL);
        if (o.check) mismatches += report_casts(&baseline);
        if (S == 1) mismatches += report_sharded_cast(&plan, model);   /* (its amax all-reduces after the table) */
        else log0("sharded cast: not run under fsdp (the weights are stored in dp shards); step 1's casts above "
                  "cover the gathered weights\n");
    }
    if (co.cast_sample) {
        snprintf(path, sizeof path, "%s/cast_sample.csv", o.out_dir);
        write_cast_sample(model, path);
    }
    run_clock_report(&clock, o.steps);

    llama_free(model);
    float8_free(&plan);
    float8_free(&baseline);
    if (S > 1) data_parallel_free(&plan);
    float8_all_gather_free(&gather);
    return run_finish(&o, mismatches);
}
