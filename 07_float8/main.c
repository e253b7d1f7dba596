/* Chapter 07: float8 training, tensorwise, rowwise and delayed scaling.
 *
 * Every linear inside the transformer blocks multiplies float8 operands (float8_linear.h): the
 * inputs and weights as E4M3, the gradients as E5M2 (rowwise: E4M3), each with a scale chosen by
 * the recipe. Tensorwise and delayed multiply float8 bytes (cuBLASLt on a GPU, its CPU twin here);
 * rowwise runs torchao's emulation (an fp32 GEMM of the dequantized operands). Under tensor
 * parallelism (chapter 01's plan) the amaxes of the tensors that tp cuts are agreed over tp, so
 * each shard casts exactly as one device would; under FSDP (chapter 04's, --dp-shard) the
 * all-gathers may move the weights as float8 bytes (--fp8-all-gather). The reports are in
 * float8_report.c.
 *
 * Two comparisons. With --check, rank 0 trains the single-device baseline under the SAME float8
 * recipe beside the parallel run (same scales, same casts), at the fp32 tolerances. And every run
 * measures float8 against its high precision (fp32, or bf16): the SQNR of each cast and each product,
 * judged against torchao's thresholds; `make plot-07` draws the loss curves of fp32 and of each
 * recipe on the same data.
 *
 *   make run-07                                          tensorwise, tp 2, beside the float8 baseline
 *   make run-07 NP=4 ARGS="--fp8 rowwise"
 *   make run-07 NP=1 ARGS="--fp8 delayed --steps 50"
 *   make run-07 NP=4 ARGS="--dp-shard 2 --fp8-all-gather"
 *   make check-07                                        each recipe at tp 1, 2, 4; FSDP; the bug
 */
#include <math.h>
#include <stdio.h>
#include "cli.h"
#include "comm.h"
#include "device.h"
#include "log.h"
#include "mesh.h"
#include "model.h"
#include "run.h"
#include "../01_transformer_tp/tp.h"
#include "../04_fsdp/data_parallel.h"
#include "float8_all_gather.h"
#include "float8_linear.h"
#include "float8_probe.h"
#include "float8_report.h"

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
typedef struct { float8_options fp8; int tp, dp_shard; bool gather_in_float8, cast_sample, history_given; } chapter_options;
static void chapter_flag(int code, const char *arg, void *ctx) {
    static const char *const recipes[] = {"off", "tensorwise", "rowwise", "delayed", NULL};
    chapter_options *co = ctx;
    if (code == OPT_FP8) co->fp8.recipe = (float8_recipe)cli_choice("--fp8", arg, recipes);
    else if (code == OPT_HISTORY) co->fp8.amax_history = cli_int("--amax-history", arg, 1, 1024), co->history_given = true;
    else if (code == OPT_TP) co->tp = cli_int("--tp", arg, 1, 4096);
    else if (code == OPT_DP_SHARD) co->dp_shard = cli_int("--dp-shard", arg, 1, 4096);
    else if (code == OPT_FP8_GATHER) co->gather_in_float8 = true;
    else co->cast_sample = true;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* ---- flags ---- */
    run_options o = run_options_default("07", float8_faults);
    o.kv_heads_follow_heads = true;
    chapter_options co = {.fp8 = {.recipe = FLOAT8_TENSORWISE, .amax_history = 16, .activation_groups = 1,
                                  .microbatches = 1},
                          .dp_shard = 1};
    static const struct option flags[] = {
        {"fp8", required_argument, 0, OPT_FP8}, {"amax-history", required_argument, 0, OPT_HISTORY},
        {"tp", required_argument, 0, OPT_TP}, {"dp-shard", required_argument, 0, OPT_DP_SHARD},
        {"fp8-all-gather", no_argument, 0, OPT_FP8_GATHER}, {"cast-sample", no_argument, 0, OPT_SAMPLE},
        {0, 0, 0, 0}};
    run_parse(&o, argc, argv, flags, chapter_flag, &co, usage);
    const llama_config *c = &o.model;

    float8_refuse_baseline_dtype(co.fp8.recipe, o.baseline_dtype, c->precision);
    if (co.history_given && co.fp8.recipe != FLOAT8_DELAYED)
        comm_exit_usage("--amax-history keeps the amaxes of delayed scaling: it needs --fp8 delayed, not %s",
                        float8_recipe_name(co.fp8.recipe));
    if (co.gather_in_float8 && (co.dp_shard < 2 || co.fp8.recipe != FLOAT8_TENSORWISE))
        comm_exit_usage("--fp8-all-gather casts FSDP's gathered weights with the tensorwise scale: it needs --dp-shard 2 "
                        "or more and --fp8 tensorwise (got --dp-shard %d, --fp8 %s)", co.dp_shard,
                        float8_recipe_name(co.fp8.recipe));

    /* ---- mesh: dp_shard x tp (tp: the rest of NP when not given) ---- */
    mesh_requirements needs = {0};
    mesh_require(&needs, tp_mesh_rule(c));
    mesh_require(&needs, dp_batch_rule(o.batch));
    device_mesh *mesh = mesh_create((mesh_shape){.dp_shard = co.dp_shard, .tp = co.tp ? co.tp : MESH_REST}, &needs);
    int S = mesh->shape.dp_shard, tp = mesh->shape.tp;

    /* ---- the plans: chapter 01's (tp > 1), chapter 04's FSDP (dp-shard > 1), float8 linears on
     * them; the baseline, one device, the same casts (each dp rank's rows scaled apart) ---- */
    llama_plan plan = tensor_parallel_or_single(mesh, c);
    dp_gather_ops gather = {0};
    if (S > 1) {
        if (co.gather_in_float8) gather = float8_all_gather_ops(plan.groups.tp, c->precision);
        dp_options dp = {.mode = DP_FSDP, .reshard_after_forward = true, .prefetch = true, .bucket_floats = 64 * 256,
                         .gather = co.gather_in_float8 ? &gather : NULL, .shard_over_cp = false};
        data_parallel_apply(&plan, mesh, c, &dp);
    }
    /* (after the plans, which refuse a tp that splits no whole head and a batch the dp ranks cannot share) */
    const char *why = float8_shape_error(c, tp, o.batch / S * c->seq_len, co.fp8.recipe);
    if (why) comm_exit_usage("%s", why);
    float8_apply(&plan, c, &co.fp8);
    if (co.fp8.recipe != FLOAT8_OFF) float8_probe_apply(&plan);   /* the lesson reports each cast's SQNR */
    llama_plan baseline = plan_single_device();
    float8_options one_device = co.fp8;
    one_device.activation_groups = S;
    float8_apply(&baseline, c, &one_device);
    if (o.check) float8_compare_casts(&plan, &baseline);   /* step 1's casts, code by code, when judged */
    run_apply_fault(&o, &plan);
    /* --dump: the recipe, as the "run_options" metadata, for the outside replay */
    char float8_json[320];   /* (a metadata value: at most 255 bytes, dump.h checks) */
    if (co.fp8.recipe != FLOAT8_OFF) run_dump_describe(&o, float8_run_options_json(&co.fp8, S, 1, float8_json, sizeof float8_json));
    llama_model *model = run_model(&o, &plan);

    log0("chapter 07: float8 training, %s scaling%s, %s%stp %d, backend %s (the float8 GEMMs: %s)\n",
         float8_recipe_name(co.fp8.recipe), co.fp8.recipe == FLOAT8_DELAYED ? " (history)" : "", S > 1 ? "fsdp x " : "",
         co.gather_in_float8 ? "(float8 all-gather) " : "", tp, device_backend_name(), float8_gemm_name(co.fp8.recipe));
    plan_describe(&plan);   /* which technique installed which operator; the groups */
    if (S > 1) log0("fsdp: dp-shard %d; every dp rank scales its own rows' activations (x, dy), and so does the "
                    "baseline, row block by row block\n", S);
    log0("model: dim %d, %d layers, %d heads (%d kv), ffn %d, vocab %d; batch %d x %d tokens; float8: wq wk wv wo "
         "w1 w2 w3 of every layer (the output layer stays %s)\n", c->dim, c->n_layers, c->n_heads, c->n_kv_heads,
         c->ffn_dim, c->vocab_size, o.batch, c->seq_len, c->precision == DTYPE_BF16 ? "a bf16 linear" : "fp32");

    /* ---- train, with the float8 baseline beside it ---- */
    char path[512], label[64];
    snprintf(path, sizeof path, "%s/loss_%s_dp%d_tp%d.csv", o.out_dir, float8_recipe_name(co.fp8.recipe), S, tp);
    snprintf(label, sizeof label, "%s dp=%d tp=%d", float8_recipe_name(co.fp8.recipe), S, tp);
    /* Step 1 starts from the same parameters, so every cast agrees and the gradients match at the
     * fp32 tolerances. After an AdamW step the two runs' parameters differ in their last bits, and
     * a float8 cast turns such a difference into a whole quantum (1/8 of a binade in E4M3) for any
     * value that lies next to a rounding boundary: the runs then drift apart at float8's scale. So
     * step 1 alone is judged, and its gradients only when no cast of it landed on a neighbour. */
    run_loop loop = run_loop_begin(&o, model, run_baseline_create(&o, &baseline, true), label, path);
    for (int step = 1; step <= o.steps; step++) {
        run_synthetic_batch(&loop, step);
        run_step_result r = run_step(&loop, step, NAN);
        if (step == 1) run_baseline_unjudged(loop.check, float8_casts_flipped(&baseline));
        run_step_check(&loop, &r);
        run_update(&loop, &r);
    }
    run_clock clock = run_loop_end(&loop);

    /* ---- measured beside the thresholds and the formulas ---- */
    log0("\n");
    int mismatches = 0;
    mismatches += float8_report_traffic(&o, mesh, &plan, model, co.fp8.recipe, co.gather_in_float8);
    if (c->precision == DTYPE_BF16) mismatches += bf16_report_roundings(&o, model);   /* float8 on or off */
    if (co.fp8.recipe != FLOAT8_OFF) {
        mismatches += float8_report_accuracy(&plan, co.fp8.recipe, co.gather_in_float8 ? &gather : NULL, c->precision);
        if (o.check) mismatches += float8_report_casts(&baseline);
        if (S == 1) mismatches += float8_report_sharded_cast(&plan, model);   /* (its amax all-reduces after the table) */
        else log0("sharded cast: not run under fsdp (the weights are stored in dp shards); step 1's casts above "
                  "cover the gathered weights\n");
    }
    if (co.cast_sample) {
        snprintf(path, sizeof path, "%s/cast_sample.csv", o.out_dir);
        float8_write_cast_sample(model, path);
    }
    run_clock_report(&clock, o.steps);

    llama_free(model);
    plan_free(&plan);
    plan_free(&baseline);
    float8_all_gather_free(&gather);
    return run_finish(&o, mismatches);
}
