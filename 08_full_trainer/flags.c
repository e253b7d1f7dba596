/* flags.c: see flags.h. */
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "comm.h"
#include "checkpoint.h"
#include "flags.h"
#include "../02_loss_parallel/vocab_parallel.h"
#include "../04_fsdp/data_parallel.h"

static const char *usage =
    "usage: 08 [flags]   (under mpirun: NP = pp x dp-replicate x dp-shard x cp x tp ranks)\n"
    "the mesh:\n"
    "  --pp N --dp-replicate N --dp-shard N --cp N --tp N   degrees (default 1; --dp-shard -1, the\n"
    "                                        default, takes what the others leave of NP)\n"
    "  --no-sp                               tensor parallelism without sequence parallelism\n"
    "  --async-tp                            sequence parallelism's collectives decomposed over the tp ring\n"
    "  --vocab-multiple M                    pad the vocabulary split over tp to a multiple of M (default\n"
    "                                        128 x tp when the vocabulary has that many entries, else tp)\n"
    "  --ac none|selective|full              activation checkpointing (default none)\n"
    "  --cp-method ring|allgather|alltoall   context-parallel attention (default ring)\n"
    "  --schedule gpipe|1f1b|interleaved|zb-h1  pipeline schedule (default 1f1b)\n"
    "  --microbatches M --virtual-stages V   pipeline microbatches per step (default pp), chunks per stage\n"
    "  --fp8 off|tensorwise|rowwise|delayed  float8 linears in the layers (default off)\n"
    "  --no-fsdp-over-cp                     FSDP's shards over dp_shard alone, the cp ranks all-reducing\n"
    "                                        their gradients (default: over dp_shard x cp, torchtitan's)\n"
    "  --reduce-dtype fp32|bf16              the type FSDP sums the gradients in (default fp32; bf16\n"
    "                                        needs --dtype bf16): FSDP2's reduce_dtype\n"
    "training:\n"
    "  --data FILE           the text to train on, one token per byte (default the repository's\n"
    "                        08_full_trainer/data/tinyshakespeare.txt); 90% trains, 10% validates\n"
    "  --warmup N            linear warmup steps (default 20, at most steps / 5), then cosine to --lr-min\n"
    "  --lr-min X            the learning rate at the last step (default lr / 10)\n"
    "  --accum N             micro-batches of --batch sequences per optimizer step (default 1)\n"
    "  --eval-every N        validation loss every N steps and at the end (default 50; 0: never)\n"
    "  --eval-batches N      validation batches per evaluation (default 4)\n"
    "  --peak-tflops X       one device's peak for MFU (default: its datasheet's on a known GPU, else a\n"
    "                        GEMM probe); on the CUDA build --dtype defaults to bf16\n"
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
    OPT_PEAK, OPT_CKPT_DIR, OPT_CKPT_EVERY, OPT_RESUME, OPT_EXPORT, OPT_SAMPLE, OPT_PROMPT, OPT_TEMP, OPT_PLAN, OPT_ASYNC_TP,
    OPT_NO_FSDP_OVER_CP, OPT_VOCAB_MULTIPLE, OPT_REDUCE_DTYPE
};
static void chapter_flag(int code, const char *arg, void *ctx) {
    static const char *const acs[] = {"none", "selective", "full", NULL};
    static const char *const methods[] = {"ring", "allgather", "alltoall", NULL};
    static const char *const recipes[] = {"off", "tensorwise", "rowwise", "delayed", NULL};
    trainer_options *co = ctx;
    int *g = co->par.degree;
    switch (code) {
    case OPT_PP: g[MESH_PP] = cli_int("--pp", arg, 1, 4096); break;
    case OPT_DPR: g[MESH_DP_REPLICATE] = cli_int("--dp-replicate", arg, 1, 65536); break;
    case OPT_DPS:
        g[MESH_DP_SHARD] = strcmp(arg, "-1") == 0 ? -1 : cli_int("--dp-shard (or -1: the rest of NP)", arg, 1, 65536);
        break;
    case OPT_CP: g[MESH_CP] = cli_int("--cp", arg, 1, 4096); break;
    case OPT_TP: g[MESH_TP] = cli_int("--tp", arg, 1, 4096); break;
    case OPT_NO_SP: co->par.sp = false; co->no_sp_given = true; break;
    case OPT_AC: co->par.ac = (ac_mode)cli_choice("--ac", arg, acs); break;
    case OPT_CP_METHOD: co->par.cp.method = (cp_method)cli_choice("--cp-method", arg, methods); co->cp_method_given = true; break;
    case OPT_SCHEDULE:
        if (pp_schedule_parse(arg, &co->par.pp.schedule) != 0)
            comm_exit_usage("--schedule '%s' is not valid: use gpipe, 1f1b, interleaved or zb-h1", arg);
        co->schedule_given = true;
        break;
    case OPT_MICRO: co->par.pp.microbatches = cli_int("--microbatches", arg, 1, 4096); co->microbatches_given = true; break;
    case OPT_VIRTUAL: co->par.pp.virtual_stages = cli_int("--virtual-stages", arg, 1, 64); break;
    case OPT_FP8: co->par.fp8.recipe = (float8_recipe)cli_choice("--fp8", arg, recipes); break;
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
    case OPT_PROMPT: co->prompt = arg; co->prompt_given = true; break;
    case OPT_TEMP: co->temperature = cli_float("--temperature", arg, 0.0f, 100.0f); co->temperature_given = true; break;
    case OPT_PLAN: co->plan = true; break;
    case OPT_ASYNC_TP: co->par.async_tp = true; break;
    case OPT_NO_FSDP_OVER_CP: co->par.fsdp_over_cp = false; break;
    case OPT_REDUCE_DTYPE: co->par.reduce_type = cli_dtype("--reduce-dtype", arg); break;
    case OPT_VOCAB_MULTIPLE: co->vocab_multiple = cli_int("--vocab-multiple", arg, 1, 1 << 20); break;
    default:
        if (!plan_calculator_flag(&co->calc, code, arg)) comm_exit_usage("internal: flag %d not handled", code);
    }
}

void trainer_parse_flags(run_options *o, trainer_options *t, int argc, char **argv) {
    *o = run_options_default("08", data_parallel_faults);   /* --fault: chapter 04's */
    o->model.dim = 96; o->model.n_layers = 4; o->model.n_heads = 4; o->model.n_kv_heads = 2;
    o->model.ffn_dim = 256; o->model.vocab_size = 256; o->model.seq_len = 64;
    o->batch = 16; o->steps = 500; o->opt.lr = 3e-3f; o->opt.clip_grad_norm = 1.0f;
    *t = (trainer_options){.par = {{1, 1, -1, 1, 1}, true, AC_NONE, {CP_RING, CP_ZIGZAG}, {PP_1F1B, 0, 1}, {FLOAT8_OFF, 16, 1, 1},
                                  false, true},
                          .data = REPO_ROOT "/08_full_trainer/data/tinyshakespeare.txt", .prompt = "ROMEO:", .warmup = -1,
                          .accum = 1, .eval_every = 50, .eval_batches = 4, .lr_min = -1, .temperature = 0.8};
    plan_calc_defaults(&t->calc);
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
        {"plan", no_argument, 0, OPT_PLAN}, {"async-tp", no_argument, 0, OPT_ASYNC_TP},
        {"no-fsdp-over-cp", no_argument, 0, OPT_NO_FSDP_OVER_CP}, {"reduce-dtype", required_argument, 0, OPT_REDUCE_DTYPE},
        {"vocab-multiple", required_argument, 0, OPT_VOCAB_MULTIPLE}, PLAN_CALC_FLAGS, {0, 0, 0, 0}};
    char full_usage[12288];
    snprintf(full_usage, sizeof full_usage, "%s%s", usage, plan_calculator_usage);
    const run_options defaults = *o;
    run_parse(o, argc, argv, flags, chapter_flag, t, full_usage);
    o->model.vocab_multiple = t->vocab_multiple;
    /* on a GPU the trainer computes as every anchor does, in bf16 (tensor cores; with --fp8, bf16 is
     * float8's high precision, as torchao's), unless --dtype says otherwise */
    if (!o->dtype_given && strcmp(device_backend_name(), "cuda") == 0) o->model.precision = DTYPE_BF16;
    if (t->plan) {   /* it trains nothing: the trained model's and mesh's flags are refused, not ignored */
        const char *model_flag = run_model_flag_given(o, &defaults);
        if (model_flag)
            comm_exit_usage("%s configures the trained model; --plan plans with the --plan-* flags (--plan-dim, "
                            "--plan-layers, --plan-global-batch, ...)", model_flag);
        const int mesh_default[MESH_NDIMS] = {1, 1, -1, 1, 1};
        if (memcmp(t->par.degree, mesh_default, sizeof mesh_default))
            comm_exit_usage("--pp, --dp-replicate, --dp-shard, --cp and --tp configure the trained mesh; --plan plans "
                            "one with --plan-mesh pp,dp_replicate,dp_shard,cp,tp");
        return;
    }
    /* flags this run would ignore: refused, as --microbatches without a pipeline is */
    if (t->calc.flag_given)
        comm_exit_usage("--%s configures the --plan calculator: it needs --plan (no training then)", t->calc.flag_given);
    const int *g = t->par.degree;
    if (t->schedule_given && g[MESH_PP] == 1)
        comm_exit_usage("--schedule orders a pipeline's microbatches: it needs --pp 2 or more");
    if (t->cp_method_given && g[MESH_CP] == 1)
        comm_exit_usage("--cp-method chooses context parallelism's attention: it needs --cp 2 or more");
    if (!t->par.fsdp_over_cp && g[MESH_CP] == 1)
        comm_exit_usage("--no-fsdp-over-cp keeps FSDP's shards off the cp ranks: it needs --cp 2 or more");
    if (t->no_sp_given && g[MESH_TP] == 1)
        comm_exit_usage("--no-sp turns off sequence parallelism inside tensor parallelism: it needs --tp 2 or more");
    if (t->vocab_multiple && g[MESH_TP] == 1)
        comm_exit_usage("--vocab-multiple %d pads the vocabulary split over tp: it needs --tp 2 or more", t->vocab_multiple);
    if (t->par.async_tp && (g[MESH_TP] == 1 || !t->par.sp))
        comm_exit_usage("--async-tp decomposes sequence parallelism's all-gathers and reduce-scatters over the tp ring: it needs --tp 2 or more, without --no-sp");
    if ((t->prompt_given || t->temperature_given) && !t->sample)
        comm_exit_usage("%s shapes the text sampled after training: it needs --sample N", t->prompt_given ? "--prompt" : "--temperature");
    if (t->lr_min > o->opt.lr)
        comm_exit_usage("--lr-min %g is greater than --lr %g: the schedule decays from --lr down to --lr-min; use at "
                        "most %g", t->lr_min, o->opt.lr, o->opt.lr);
}

void trainer_validate(run_options *o, trainer_options *t) {
    const llama_config *c = &o->model;
    if (!t->microbatches_given) t->par.pp.microbatches = t->par.degree[MESH_PP];
    parallelize_validate(&t->par, c, o->batch);
    if (t->resume && !t->ckpt_dir) comm_exit_usage("--resume needs --ckpt-dir DIR: the checkpoints to continue from");
    if (t->ckpt_every && !t->ckpt_dir) comm_exit_usage("--ckpt-every %d needs --ckpt-dir DIR: where to write them", t->ckpt_every);
    if (t->ckpt_dir && !t->ckpt_every && !t->resume)
        comm_exit_usage("--ckpt-dir %s alone does nothing: add --ckpt-every N to save checkpoints there, or --resume "
                        "to continue from its latest", t->ckpt_dir);
    char why[1400] = "";
    if (t->ckpt_dir && checkpoint_dir_problem(t->ckpt_dir, t->ckpt_every > 0, why, sizeof why))
        comm_require_all(0, "%s", why);   /* (rank 0's line: it looked) */
    if (t->resume && !checkpoint_exists(t->ckpt_dir))
        comm_exit_usage("--resume: --ckpt-dir %s holds no checkpoint (neither DIR/latest nor DIR/index.json)", t->ckpt_dir);
    if (t->resume && t->par.fp8.recipe == FLOAT8_DELAYED)
        comm_exit_usage("--resume with --fp8 delayed is not valid: the checkpoints do not keep the amax history, "
                        "so the resumed casts would differ; use --fp8 tensorwise or rowwise");
    if (t->resume && (o->check || o->dump_dir))
        comm_exit_usage("--resume with %s is not valid: the baseline and the dump's replay start from step 1's "
                        "parameters, a resumed run from a checkpoint's", o->check ? "--check" : "--dump");
    float8_refuse_baseline_dtype(t->par.fp8.recipe, o->baseline_dtype, o->model.precision);
    if (t->par.fp8.recipe != FLOAT8_OFF && t->par.ac == AC_FULL)
        comm_exit_usage("--fp8 with --ac full is not valid here: the recompute would run every float8 linear's "
                        "forward twice a step, casting again (delayed scaling: recording the amax twice); use --ac "
                        "selective or none");
    int cp = t->par.degree[MESH_CP];
    if (t->par.fp8.recipe != FLOAT8_OFF && cp > 1 && o->check)
        comm_exit_usage("--fp8 with --cp %d and --check is not valid: each cp rank scales the activations of its own "
                        "positions, which the single-device float8 baseline cannot reproduce", cp);
    if (t->par.fp8.recipe != FLOAT8_OFF && cp > 1 && o->dump_dir)
        comm_exit_usage("--dump with --fp8 and --cp %d is not valid: each cp rank scales the activations of its own "
                        "positions, which the dump's float8 metadata cannot describe, so no replay could cast as the "
                        "run did; dump with --cp 1", cp);
    data_parallel_refuse_reduce_type(t->par.reduce_type, c->precision);
    if (t->par.reduce_type != DTYPE_F32 && !parallel_has_fsdp(&t->par))
        comm_exit_usage("--reduce-dtype %s sets the type FSDP sums the gradients in: it needs --dp-shard x "
                        "--dp-replicate (x --cp, unless --no-fsdp-over-cp) of 2 or more", dtype_name(t->par.reduce_type));
    if (o->fault && !parallel_has_fsdp(&t->par))
        comm_exit_usage("--fault %s breaks FSDP's gradient reduction: it needs --dp-shard x --dp-replicate (x --cp, "
                        "unless --no-fsdp-over-cp) of 2 or more", o->fault);
    if (t->warmup < 0) t->warmup = o->steps / 5 < 20 ? o->steps / 5 : 20;   /* not given */
    if (t->warmup > o->steps) comm_exit_usage("--warmup %d is longer than --steps %d: use at most %d", t->warmup, o->steps, o->steps);
}
