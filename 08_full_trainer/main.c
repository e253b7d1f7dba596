/* Chapter 08: the full trainer. Every technique of chapters 01-07 on one 5-D mesh, trained on
 * real text, with what a real run needs around the step: a learning-rate schedule, gradient
 * accumulation and clipping, evaluation, metrics, checkpoints that reshard, an export, a sample.
 *
 *   mesh     pp x dp_replicate x dp_shard x cp x tp = NP        (--dp-shard -1: the rest of NP)
 *   plan     parallelize_llama (parallelize.c): tp + sp + loss, ac, cp, fp8, pp, fsdp/hsdp
 *   data     Tiny Shakespeare, one token per byte (text_corpus, common/harness/data.h)
 *   loop     run_train (common/harness/run.c) with the trainer's hooks (trainer.c)
 *   state    checkpoint.c: sharded safetensors + index; --resume on any mesh; --export
 *
 *   make run-08                                           8 ranks: pp 2 x dp_shard 2 x tp 2
 *   make run-08 NP=8 ARGS="--dp-shard 2 --cp 2 --tp 2"
 *   make run-08 NP=1 ARGS="--plan --plan-model 405b --plan-gpus 16384"
 *   make check-08                                         every 4-D layout beside the baseline
 */
#include <math.h>
#include <stdio.h>
#include <unistd.h>
#include <string.h>
#include "checkpoint.h"
#include "cli.h"
#include "comm.h"
#include "device.h"
#include "log.h"
#include "mesh.h"
#include "model.h"
#include "parallelize.h"
#include "plan_calculator.h"
#include "run.h"
#include "sample.h"
#include "trainer.h"
#include "../04_fsdp/data_parallel.h"
#include "../07_float8/fp8_report.h"

static const char *usage =
    "usage: 08 [flags]   (under mpirun: NP = pp x dp-replicate x dp-shard x cp x tp ranks)\n"
    "the mesh:\n"
    "  --pp N --dp-replicate N --dp-shard N --cp N --tp N   degrees (default 1; --dp-shard -1, the\n"
    "                                        default, takes what the others leave of NP)\n"
    "  --no-sp                               tensor parallelism without sequence parallelism\n"
    "  --ac none|selective|full              activation checkpointing (default none)\n"
    "  --cp-method ring|allgather|alltoall   context-parallel attention (default ring)\n"
    "  --schedule gpipe|1f1b|interleaved|zb-h1  pipeline schedule (default 1f1b)\n"
    "  --microbatches M --virtual-stages V   pipeline microbatches per step (default pp), chunks per stage\n"
    "  --fp8 off|tensorwise|rowwise|delayed  float8 linears in the layers (default off)\n"
    "training:\n"
    "  --data FILE           the text to train on, one token per byte (default the repository's\n"
    "                        08_full_trainer/data/tinyshakespeare.txt); 90% trains, 10% validates\n"
    "  --warmup N            linear warmup steps (default 20, at most steps / 5), then cosine to --lr-min\n"
    "  --lr-min X            the learning rate at the last step (default lr / 10)\n"
    "  --accum N             micro-batches of --batch sequences per optimizer step (default 1)\n"
    "  --eval-every N        validation loss every N steps and at the end (default 50; 0: never)\n"
    "  --eval-batches N      validation batches per evaluation (default 4)\n"
    "  --peak-tflops X       the device's peak for MFU (default: measured by a GEMM probe)\n"
    "checkpoints and outputs:\n"
    "  --ckpt-dir DIR --ckpt-every N   sharded checkpoints every N steps and at the end\n"
    "  --resume              continue from DIR's latest checkpoint (any mesh)\n"
    "  --export FILE         one safetensors with the baseline's names, after training\n"
    "  --sample N            after training, N bytes sampled from --prompt (default \"ROMEO:\")\n"
    "  --temperature X       sampling temperature (default 0.8; 0: the most likely byte)\n"
    "  --plan                no training: memory and communication of meshes for a large model\n";

enum {
    OPT_PP = 1, OPT_DPR, OPT_DPS, OPT_CP, OPT_TP, OPT_NO_SP, OPT_AC, OPT_CP_METHOD, OPT_SCHEDULE, OPT_MICRO,
    OPT_VIRTUAL, OPT_FP8, OPT_DATA, OPT_WARMUP, OPT_LR_MIN, OPT_ACCUM, OPT_EVAL_EVERY, OPT_EVAL_BATCHES,
    OPT_PEAK, OPT_CKPT_DIR, OPT_CKPT_EVERY, OPT_RESUME, OPT_EXPORT, OPT_SAMPLE, OPT_PROMPT, OPT_TEMP, OPT_PLAN
};
typedef struct {
    parallel_options par;
    const char *data, *ckpt_dir, *export_path, *prompt;
    int warmup, accum, eval_every, eval_batches, ckpt_every, sample;
    double lr_min, temperature, peak_tflops;
    bool resume, plan, microbatches_given;
    plan_calc_options calc;
} chapter_options;

static void chapter_flag(int code, const char *arg, void *ctx) {
    static const char *const acs[] = {"none", "selective", "full", NULL};
    static const char *const methods[] = {"ring", "allgather", "alltoall", NULL};
    static const char *const recipes[] = {"off", "tensorwise", "rowwise", "delayed", NULL};
    chapter_options *co = ctx;
    int *g = co->par.degree;
    switch (code) {
    case OPT_PP: g[MESH_PP] = cli_int("--pp", arg, 1, 4096); break;
    case OPT_DPR: g[MESH_DP_REPLICATE] = cli_int("--dp-replicate", arg, 1, 65536); break;
    case OPT_DPS:
        g[MESH_DP_SHARD] = strcmp(arg, "-1") == 0 ? -1 : cli_int("--dp-shard (or -1: the rest of NP)", arg, 1, 65536);
        break;
    case OPT_CP: g[MESH_CP] = cli_int("--cp", arg, 1, 4096); break;
    case OPT_TP: g[MESH_TP] = cli_int("--tp", arg, 1, 4096); break;
    case OPT_NO_SP: co->par.sp = false; break;
    case OPT_AC: co->par.ac = (ac_mode)cli_choice("--ac", arg, acs); break;
    case OPT_CP_METHOD: co->par.cp.method = (cp_method)cli_choice("--cp-method", arg, methods); break;
    case OPT_SCHEDULE:
        if (pp_schedule_parse(arg, &co->par.pp.schedule) != 0)
            comm_exit_usage("--schedule '%s' is not valid: use gpipe, 1f1b, interleaved or zb-h1", arg);
        break;
    case OPT_MICRO: co->par.pp.microbatches = cli_int("--microbatches", arg, 1, 4096); co->microbatches_given = true; break;
    case OPT_VIRTUAL: co->par.pp.virtual_stages = cli_int("--virtual-stages", arg, 1, 64); break;
    case OPT_FP8: co->par.fp8.recipe = (fp8_recipe)cli_choice("--fp8", arg, recipes); break;
    case OPT_DATA: co->data = arg; break;
    case OPT_WARMUP: co->warmup = cli_int("--warmup", arg, 0, 1000000); break;
    case OPT_LR_MIN: co->lr_min = cli_float("--lr-min", arg, 0.0f, 10.0f); break;
    case OPT_ACCUM: co->accum = cli_int("--accum", arg, 1, 4096); break;
    case OPT_EVAL_EVERY: co->eval_every = cli_int("--eval-every", arg, 0, 1000000); break;
    case OPT_EVAL_BATCHES: co->eval_batches = cli_int("--eval-batches", arg, 1, 100000); break;
    case OPT_PEAK: co->peak_tflops = cli_float("--peak-tflops", arg, 1e-6f, 1e6f); break;
    case OPT_CKPT_DIR: co->ckpt_dir = arg; break;
    case OPT_CKPT_EVERY: co->ckpt_every = cli_int("--ckpt-every", arg, 1, 1000000); break;
    case OPT_RESUME: co->resume = true; break;
    case OPT_EXPORT: co->export_path = arg; break;
    case OPT_SAMPLE: co->sample = cli_int("--sample", arg, 0, 1000000); break;
    case OPT_PROMPT: co->prompt = arg; break;
    case OPT_TEMP: co->temperature = cli_float("--temperature", arg, 0.0f, 100.0f); break;
    case OPT_PLAN: co->plan = true; break;
    default:
        if (!plan_calculator_flag(&co->calc, code, arg)) comm_exit_usage("internal: flag %d not handled", code);
    }
}

/* The settings a resumed run must share with the run it continues (the mesh may differ). */
static void trainer_settings(const run_options *o, const chapter_options *co, const text_corpus *corpus,
                             const lr_schedule *lr, char *json, size_t len) {
    const llama_config *c = &o->model;
    snprintf(json, len, "{\"dim\": %d, \"n_layers\": %d, \"n_heads\": %d, \"n_kv_heads\": %d, \"ffn_dim\": %d, "
             "\"vocab\": %d, \"seq_len\": %d, \"batch\": %d, \"accum\": %d, \"steps\": %d, \"seed\": %llu, "
             "\"lr\": %.9g, \"lr_min\": %.9g, \"warmup\": %d, \"clip_grad_norm\": %.9g, \"fp8\": \"%s\", "
             "\"data_bytes\": %zu}", c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab_size,
             c->seq_len, o->batch, co->accum, o->steps, (unsigned long long)o->seed, lr->lr, lr->lr_min, lr->warmup,
             o->opt.clip_grad_norm, fp8_recipe_name(co->par.fp8.recipe), corpus->n);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* ---- flags: the model and the run (defaults sized to learn Shakespeare on a laptop) ---- */
    run_options o = run_options_default("08", data_parallel_faults);   /* --fault: chapter 04's */
    o.model.dim = 96; o.model.n_layers = 4; o.model.n_heads = 4; o.model.n_kv_heads = 2;
    o.model.ffn_dim = 256; o.model.vocab_size = 256; o.model.seq_len = 64;
    o.batch = 16; o.steps = 500; o.opt.lr = 3e-3f; o.opt.clip_grad_norm = 1.0f;
    chapter_options co = {.par = {{1, 1, -1, 1, 1}, true, AC_NONE, {CP_RING, CP_ZIGZAG}, {PP_1F1B, 0, 1}, {FP8_OFF, 16, 1, 1}},
                          .data = REPO_ROOT "/08_full_trainer/data/tinyshakespeare.txt", .prompt = "ROMEO:", .warmup = -1,
                          .accum = 1, .eval_every = 50, .eval_batches = 4, .lr_min = -1, .temperature = 0.8};
    plan_calc_defaults(&co.calc);
    static const struct option flags[] = {
        {"pp", required_argument, 0, OPT_PP}, {"dp-replicate", required_argument, 0, OPT_DPR},
        {"dp-shard", required_argument, 0, OPT_DPS}, {"cp", required_argument, 0, OPT_CP},
        {"tp", required_argument, 0, OPT_TP}, {"no-sp", no_argument, 0, OPT_NO_SP},
        {"ac", required_argument, 0, OPT_AC}, {"cp-method", required_argument, 0, OPT_CP_METHOD},
        {"schedule", required_argument, 0, OPT_SCHEDULE}, {"microbatches", required_argument, 0, OPT_MICRO},
        {"virtual-stages", required_argument, 0, OPT_VIRTUAL}, {"fp8", required_argument, 0, OPT_FP8},
        {"data", required_argument, 0, OPT_DATA}, {"warmup", required_argument, 0, OPT_WARMUP},
        {"lr-min", required_argument, 0, OPT_LR_MIN}, {"accum", required_argument, 0, OPT_ACCUM},
        {"eval-every", required_argument, 0, OPT_EVAL_EVERY}, {"eval-batches", required_argument, 0, OPT_EVAL_BATCHES},
        {"peak-tflops", required_argument, 0, OPT_PEAK}, {"ckpt-dir", required_argument, 0, OPT_CKPT_DIR},
        {"ckpt-every", required_argument, 0, OPT_CKPT_EVERY}, {"resume", no_argument, 0, OPT_RESUME},
        {"export", required_argument, 0, OPT_EXPORT}, {"sample", required_argument, 0, OPT_SAMPLE},
        {"prompt", required_argument, 0, OPT_PROMPT}, {"temperature", required_argument, 0, OPT_TEMP},
        {"plan", no_argument, 0, OPT_PLAN}, PLAN_CALC_FLAGS, {0, 0, 0, 0}};
    char full_usage[8192];
    snprintf(full_usage, sizeof full_usage, "%s%s", usage, plan_calculator_usage);
    run_parse(&o, argc, argv, flags, chapter_flag, &co, full_usage);
    const llama_config *c = &o.model;

    /* ---- --plan: a calculator for a cluster, no training ---- */
    if (co.plan) {
        int status = plan_calculator_run(&co.calc);
        comm_finalize();
        return status;
    }

    /* ---- the run's settings, refused up front when they cannot work ---- */
    if (!co.microbatches_given) co.par.pp.microbatches = co.par.degree[MESH_PP];
    parallelize_validate(&co.par, c, o.batch);
    if (c->vocab_size != 256)
        comm_exit_usage("--vocab %d is not valid here: the text is read one byte per token, so the vocabulary is "
                        "the 256 byte values (--vocab 256)", c->vocab_size);
    if (co.resume && !co.ckpt_dir) comm_exit_usage("--resume needs --ckpt-dir DIR: the checkpoints to continue from");
    if (co.ckpt_every && !co.ckpt_dir) comm_exit_usage("--ckpt-every %d needs --ckpt-dir DIR: where to write them", co.ckpt_every);
    if (co.resume && !checkpoint_exists(co.ckpt_dir))
        comm_exit_usage("--resume: --ckpt-dir %s holds no checkpoint (neither DIR/latest nor DIR/index.json)", co.ckpt_dir);
    if (co.resume && co.par.fp8.recipe == FP8_DELAYED)
        comm_exit_usage("--resume with --fp8 delayed is not valid: the checkpoints do not keep the amax history, "
                        "so the resumed casts would differ; use --fp8 tensorwise or rowwise");
    if (co.resume && (o.check || o.dump_dir))
        comm_exit_usage("--resume with %s is not valid: the baseline and the dump's replay start from step 1's "
                        "parameters, a resumed run from a checkpoint's", o.check ? "--check" : "--dump");
    if (co.par.fp8.recipe != FP8_OFF && co.par.ac == AC_FULL)
        comm_exit_usage("--fp8 with --ac full is not valid here: the recompute would run every float8 linear's "
                        "forward twice a step, casting again (delayed scaling: recording the amax twice); use --ac "
                        "selective or none");
    if (co.par.fp8.recipe != FP8_OFF && co.par.degree[MESH_CP] > 1 && o.check)
        comm_exit_usage("--fp8 with --cp %d and --check is not valid: each cp rank scales the activations of its own "
                        "positions, which the single-device float8 baseline cannot reproduce", co.par.degree[MESH_CP]);
    if (o.fault && co.par.degree[MESH_DP_REPLICATE] * co.par.degree[MESH_DP_SHARD] == 1)
        comm_exit_usage("--fault %s breaks FSDP's gradient reduction: it needs --dp-shard x --dp-replicate of 2 or more",
                        o.fault);
    if (co.warmup < 0) co.warmup = o.steps / 5 < 20 ? o.steps / 5 : 20;   /* not given */
    if (co.warmup > o.steps) comm_exit_usage("--warmup %d is longer than --steps %d: use at most %d", co.warmup, o.steps, o.steps);
    text_corpus corpus;
    char err[1024];
    if (text_corpus_load(&corpus, co.data, c->seq_len, err, sizeof err) != 0) comm_exit_usage("--data: %s", err);
    int val_batches = text_val_batches(&corpus, o.batch, c->seq_len);
    if (co.eval_every && co.eval_batches > val_batches)
        comm_exit_usage("--eval-batches %d is more than the %d batches of %d x %d bytes in %s's validation part",
                        co.eval_batches, val_batches, o.batch, c->seq_len, co.data);
    lr_schedule lr = {o.opt.lr, co.lr_min >= 0 ? co.lr_min : o.opt.lr / 10, co.warmup, o.steps};
    text_source source = {&corpus, o.seed};
    o.next_batch = text_source_batch; o.data_ctx = &source;
    o.lr_at = lr_at_step; o.lr_ctx = &lr;
    o.accum = co.accum;

    /* ---- mesh and plan ---- */
    device_mesh *mesh = mesh_create((mesh_shape){{co.par.degree[0], co.par.degree[1], co.par.degree[2],
                                                  co.par.degree[3], co.par.degree[4]}});
    llama_plan plan = parallelize_llama(mesh, c, o.batch, &co.par);
    llama_plan baseline = plan_single_device();
    if (co.par.fp8.recipe != FP8_OFF) {   /* the baseline casts as the mesh does: each data rank's
                                           * microbatch rows scaled apart (chapter 07) */
        fp8_options one_device = co.par.fp8;
        one_device.activation_groups = co.par.degree[MESH_DP_REPLICATE] * co.par.degree[MESH_DP_SHARD] *
                                       co.par.pp.microbatches;   /* (per micro-batch of --accum) */
        float8_apply(&baseline, c, &one_device);
        o.baseline_plan = &baseline;
        o.judge_first_step_only = true;
        float8_compare_casts(&plan, &baseline);
        o.step1_grads_unjudged = float8_casts_flipped;
        o.step1_ctx = &baseline;
    }
    run_apply_fault(&o, &plan);
    llama_model *model = run_model(&o, &plan);

    /* ---- where the run starts: step 1, or a checkpoint (saved on any mesh) ---- */
    trainer t = {&o, &corpus, co.eval_every, co.eval_batches, co.ckpt_dir, co.ckpt_every, "", 0, 0, NULL, NAN};
    trainer_settings(&o, &co, &corpus, &lr, t.trainer_json, sizeof t.trainer_json);
    if (co.resume) {
        checkpoint_meta meta = {0};
        int rc = checkpoint_load(co.ckpt_dir, model, &meta, err, sizeof err);
        comm_require_all(rc == 0, "--resume: %s", rc == 1 ? "the directory holds no checkpoint" : err);
        if (strcmp(meta.trainer_json, t.trainer_json) != 0)
            comm_exit_usage("--resume: the checkpoint in %s was written by a run with other settings: it has %s, this run "
                            "%s", co.ckpt_dir, meta.trainer_json, t.trainer_json);
        o.first_step = meta.step + 1;
    }

    char mesh_name[128];
    log0("chapter 08: the full trainer on %s, backend %s\n", parallel_mesh_name(&co.par, mesh_name, sizeof mesh_name),
         device_backend_name());
    const int *g = co.par.degree;
    char cp_text[64] = "no cp", pp_text[96] = "no pipeline", dp_text[16] = "no dp";
    if (g[MESH_CP] > 1) snprintf(cp_text, sizeof cp_text, "cp %s (%s)", cp_method_name(co.par.cp.method),
                                 cp_balance_name(co.par.cp.balance));
    if (g[MESH_PP] > 1) snprintf(pp_text, sizeof pp_text, "%s pipeline (%d microbatches, %d virtual stages)",
                                 pp_schedule_name(co.par.pp.schedule), co.par.pp.microbatches, co.par.pp.virtual_stages);
    if (g[MESH_DP_REPLICATE] * g[MESH_DP_SHARD] > 1) snprintf(dp_text, sizeof dp_text, "%s", g[MESH_DP_REPLICATE] > 1 ? "hsdp" : "fsdp");
    log0("plan: %s, ac %s, %s, %s, %s, float8 %s\n",
         g[MESH_TP] == 1 ? "no tp" : co.par.sp ? "tp + loss parallel + sp" : "tp + loss parallel", ac_mode_name(co.par.ac),
         cp_text, pp_text, dp_text, fp8_recipe_name(co.par.fp8.recipe));
    log0("model: dim %d, %d layers, %d heads (%d kv), ffn %d, vocab %d (bytes), %.2f M parameters\n", c->dim, c->n_layers,
         c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab_size, model_parameters(c, true) / 1e6);
    size_t root_len = strlen(REPO_ROOT "/");   /* the shipped corpus: named from the repository */
    const char *data_name = strncmp(co.data, REPO_ROOT "/", root_len) == 0 ? co.data + root_len : co.data;
    log0("data: %s, %zu bytes (%zu train, %zu validation); batch %d x %d tokens x accum %d per step\n", data_name,
         corpus.n, corpus.n_train, corpus.n - corpus.n_train, o.batch, c->seq_len, co.accum);
    log0("schedule: lr %.2e, warmup %d steps, cosine to %.2e at step %d; AdamW, clip %g\n", lr.lr, lr.warmup, lr.lr_min,
         o.steps, o.opt.clip_grad_norm);
    if (o.first_step > 1) log0("resumed from %s at step %d\n", co.ckpt_dir, o.first_step);

    /* ---- train ---- */
    t.flops_per_token = model_flops_per_token(c);
    t.peak_flops = co.peak_tflops > 0 ? co.peak_tflops * 1e12 : probe_peak_flops();
    log0("MFU against %.2f GFLOP/s (%s), %.2f MFLOP per token\n", t.peak_flops / 1e9,
         co.peak_tflops > 0 ? "--peak-tflops" : "measured: a GEMM probe on every rank at once, summed",
         t.flops_per_token / 1e6);
    char path[512];
    snprintf(path, sizeof path, "%s/metrics.csv", o.out_dir);
    if (comm_world()->rank == 0 && !o.check)
        t.csv = csv_open(path, "step,loss,val_loss,lr,grad_norm,tokens_per_s,step_ms,mfu,mem_bytes");
    o.after_step = trainer_after_step;
    o.after_ctx = &t;
    run_clock clock = run_train(&o, model, "4-D", NULL);
    if (t.csv) fclose(t.csv);
    run_clock_report(&clock, o.steps - (o.first_step > 1 ? o.first_step - 1 : 0));

    /* ---- what the run leaves: an export, a sample ---- */
    if (co.export_path) {
        int rc = checkpoint_export(co.export_path, model, err, sizeof err);
        comm_require_all(rc == 0, "--export %s: %s", co.export_path, err);
        log0("exported %s (safetensors, the baseline's tensor names)\n", co.export_path);
    }
    if (!isnan(t.last_val_loss))
        log0("validation loss %.4f; the unigram baseline's (byte frequencies, no context) %.4f\n", t.last_val_loss,
             text_unigram_loss(&corpus));
    if (co.sample) sample_text(model, co.prompt, co.sample, co.temperature, o.seed);

    int mismatches = report_state_memory(c, co.par.degree, mesh->coord[MESH_PP], co.par.pp.virtual_stages);
    if (o.check && co.par.fp8.recipe != FP8_OFF) mismatches += float8_report_casts(&baseline);   /* step 1's, code by code */

    llama_free(model);
    parallelize_free(&plan, &co.par);
    if (co.par.fp8.recipe != FP8_OFF) float8_free(&baseline);
    text_corpus_free(&corpus);
    return run_finish(&o, mismatches);
}
