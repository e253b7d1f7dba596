/* Chapter 09: a mixture of experts, and expert parallelism.
 *
 * Every layer's feed-forward becomes E experts of which each token uses k, chosen by a router
 * (moe.h: the block, its routing and its load-balancing loss). The experts are split over the
 * ep ranks (expert_parallel.h), which are also data-parallel ranks: each routes its own tokens,
 * sends every copy to the rank that holds its expert with an all-to-all, and gets the outputs
 * back with another. Rank 0 trains the single-device baseline, every expert on one device, beside
 * it on the same batches (--check) and compares every step, and writes each step's expert load
 * to OUT/expert_load.csv. The run ends with the parameters, the experts' load and the traffic
 * beside their formulas.
 *
 *   make run-09                                   ep 2 (NP=2): 4 experts, top-2
 *   make run-09 NP=4 ARGS="--experts 8 --top-k 1" Switch-style routing over 4 ranks
 *   make run-09 NP=4 ARGS="--ep 2"                experts over 2 ranks, replicated over 2
 *   make run-09 NP=4 ARGS="--pp 2"                chapter 05's pipeline: 2 stages, each with ep 2
 *   make run-09 NP=4 ARGS="--cp 2"                chapter 06's context parallelism under ep 2
 *   make run-09 NP=4 ARGS="--cp 2 --ep-over-cp"   the ep group over dp_shard x cp: ep 4, as torchtitan
 *   make run-09 NP=4 ARGS="--fsdp"                chapter 04's FSDP: the dense tensors sharded over ep 4
 *   make run-09 NP=4 ARGS="--fsdp --cp 2"         the experts sharded too, each over the cp ranks that hold it
 *   make run-09 NP=4 ARGS="--fsdp --ep 2 --full-shard"  every data rank one shard group: each expert over 2
 *   make run-09 ARGS="--moe-every 2 --n-layers 4" the mixture on every other layer, Llama's FFN between
 *   make check-09                                 ep 1, 2, 4, 8; top-1 and top-2; tp; pp; cp; a capacity; the bugs
 *   make plot-09                                  the load over the steps with and without the balancing loss
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "comm.h"
#include "device.h"
#include "log.h"
#include "mesh.h"
#include "model.h"
#include "outputs.h"
#include "run.h"
#include "../01_transformer_tp/tp.h"
#include "../04_fsdp/data_parallel.h"
#include "../05_pipeline/pipeline.h"
#include "../05_pipeline/pp_report.h"
#include "../06_context_parallel/context_parallel.h"
#include "../07_float8/float8_linear.h"
#include "../08_full_trainer/checkpoint.h"
#include "../08_full_trainer/plan_calculator.h"
#include "ep_report.h"
#include "expert_parallel.h"
#include "moe.h"

static const char *usage =
    "usage: 09 [flags]   (under mpirun: NP = pp x dp_replicate x dp_shard x cp x tp ranks; the experts\n"
    "                     split over ep = dp_shard, or dp_shard x cp (--ep-over-cp); each data rank\n"
    "                     takes batch / (dp_replicate x dp_shard) sequences)\n"
    "  --experts E          routed experts per layer (default 4)\n"
    "  --top-k K            experts per token (default 2)\n"
    "  --expert-dim F       each expert's hidden size (default 64)\n"
    "  --shared-expert      a dense SwiGLU of --ffn-dim every token also passes through\n"
    "  --aux-alpha A        weight of the load-balancing loss (default 0.01)\n"
    "  --router R           softmax (the gates the chosen probabilities) or sigmoid (DeepSeek-V3: the gates\n"
    "                       the chosen scores over their sum) (default softmax)\n"
    "  --capacity-factor C  each expert takes at most ceil(C T k / E) copies of a sequence's tokens,\n"
    "                       the rest dropped (default: dropless)\n"
    "  --moe-every K        the mixture on every K-th layer (layers K-1, 2K-1, ...; Llama 4's K = 2), Llama's\n"
    "                       dense feed-forward on the others (default 1: every layer)\n"
    "  --ep P               ranks the experts are split over (default: the data ranks, NP / (tp pp cp));\n"
    "                       the rest replicate them\n"
    "  --tp T               chapter 01's tensor parallelism of the dense parts (default 1)\n"
    "  --cp C               chapter 06's context parallelism: each sequence over C ranks (default 1)\n"
    "  --cp-method M        its attention: ring|allgather|alltoall (default ring)\n"
    "  --ep-over-cp         the ep group is dp_shard x cp (torchtitan's): the experts split over the cp\n"
    "                       ranks too; --ep is then that group's size, a multiple of --cp\n"
    "  --fsdp               chapter 04's FSDP over dp_shard (x cp): the dense tensors sharded over it, each\n"
    "                       expert over the cp ranks that hold it (whole when ep spans them: --ep-over-cp);\n"
    "                       the ranks --ep leaves over replicate the shards (HSDP)\n"
    "  --full-shard         with --fsdp, those ranks shard too: every data rank (x cp) one shard group, each\n"
    "                       expert over the ranks that hold it (torchtitan's dp_shard_mod_ep)\n"
    "  --pp P               chapter 05's pipeline: the layers in P stages, each with its ep group (default 1)\n"
    "  --microbatches M     the pipeline's microbatches (default 1 without --pp, pp with it)\n"
    "  --schedule S         the pipeline's schedule: gpipe|1f1b|interleaved|zb-h1 (default 1f1b)\n"
    "  --virtual-stages V   chunks per pipeline rank (interleaved; default 2 with it, else 1)\n"
    "  --fp8 R              chapter 07's float8 for the dense linears (attention, the shared expert, Llama's\n"
    "                       feed-forward): off|tensorwise|rowwise|delayed (default off); the router and the\n"
    "                       experts stay in --dtype\n"
    "  --save DIR           after the last step, a checkpoint in DIR (chapter 08's: it loads on any mesh)\n"
    "  --resume DIR         start from DIR's latest checkpoint, on this run's mesh (any ep, tp, pp, cp), and\n"
    "                       train --steps more (not with --check: the baseline starts at step 1)\n"
    "  --plan               no training: chapter 08's calculator with this chapter's layer, for a mixture of\n"
    "                       experts at scale (--plan-model mixtral-8x7b|deepseek-v3, the --plan-* flags below)\n";

enum { OPT_EXPERTS = 1, OPT_TOP_K, OPT_EXPERT_DIM, OPT_SHARED, OPT_AUX, OPT_ROUTER, OPT_CAPACITY, OPT_MOE_EVERY, OPT_EP, OPT_TP, OPT_PP, OPT_MICRO,
       OPT_SCHEDULE, OPT_VIRTUAL, OPT_CP, OPT_CP_METHOD, OPT_EP_OVER_CP, OPT_FSDP, OPT_FULL_SHARD, OPT_FP8, OPT_SAVE,
       OPT_RESUME, OPT_PLAN };
typedef struct {
    moe_config *moe;
    int *moe_every;   /* llama_config.layer_every */
    int ep, tp, pp, cp;
    pp_options pipe;
    bool pipe_given, cp_method_given, ep_over_cp, fsdp, full_shard;
    cp_options context;
    float8_recipe fp8;
    const char *save, *resume;
    int train_flag;           /* the first of this chapter's training flags given (a code), 0: none */
    bool plan;
    plan_calc_options calc;   /* --plan's (chapter 08's calculator) */
} chapter_options;
static void chapter_flag(int code, const char *arg, void *ctx) {
    chapter_options *co = ctx;
    moe_config *x = co->moe;
    if (!co->train_flag && code != OPT_PLAN && code < PLAN_OPT_MODEL) co->train_flag = code;
    if (code == OPT_EXPERTS) x->experts = cli_int("--experts", arg, 1, 4096);
    else if (code == OPT_TOP_K) x->top_k = cli_int("--top-k", arg, 1, 4096);
    else if (code == OPT_EXPERT_DIM) x->expert_dim = cli_int("--expert-dim", arg, 1, 1 << 20);
    else if (code == OPT_SHARED) x->shared_expert = true;
    else if (code == OPT_AUX) x->aux_alpha = cli_float("--aux-alpha", arg, 0.0f, 100.0f);
    else if (code == OPT_ROUTER) {
        static const char *const routers[] = {"softmax", "sigmoid", NULL};
        x->router = (moe_router)cli_choice("--router", arg, routers);
    } else if (code == OPT_CAPACITY) x->capacity_factor = cli_float("--capacity-factor", arg, 0.01f, 64.0f);
    else if (code == OPT_MOE_EVERY) *co->moe_every = cli_int("--moe-every", arg, 1, 4096);
    else if (code == OPT_EP) co->ep = cli_int("--ep", arg, 1, 4096);
    else if (code == OPT_TP) co->tp = cli_int("--tp", arg, 1, 4096);
    else if (code == OPT_PP) co->pp = cli_int("--pp", arg, 1, 4096);
    else if (code == OPT_MICRO) co->pipe.microbatches = cli_int("--microbatches", arg, 1, 4096), co->pipe_given = true;
    else if (code == OPT_SCHEDULE) {
        static const char *const schedules[] = {"gpipe", "1f1b", "interleaved", "zb-h1", NULL};
        co->pipe.schedule = (pp_schedule_kind)cli_choice("--schedule", arg, schedules);
        co->pipe_given = true;
    } else if (code == OPT_CP) co->cp = cli_int("--cp", arg, 1, 4096);
    else if (code == OPT_CP_METHOD) {
        static const char *const methods[] = {"ring", "allgather", "alltoall", NULL};
        co->context.method = (cp_method)cli_choice("--cp-method", arg, methods);
        co->cp_method_given = true;
    } else if (code == OPT_EP_OVER_CP) co->ep_over_cp = true;
    else if (code == OPT_FSDP) co->fsdp = true;
    else if (code == OPT_FULL_SHARD) co->full_shard = true;
    else if (code == OPT_FP8) {
        static const char *const recipes[] = {"off", "tensorwise", "rowwise", "delayed", NULL};
        co->fp8 = (float8_recipe)cli_choice("--fp8", arg, recipes);
    }
    else if (code == OPT_VIRTUAL) co->pipe.virtual_stages = cli_int("--virtual-stages", arg, 1, 64), co->pipe_given = true;
    else if (code == OPT_SAVE) co->save = arg;
    else if (code == OPT_RESUME) co->resume = arg;
    else if (code == OPT_PLAN) co->plan = true;
    else if (!plan_calculator_flag(&co->calc, code, arg)) comm_exit_usage("internal: flag %d not handled", code);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* ---- flags: the model's experts ---- */
    run_options o = run_options_default("09", expert_parallel_faults);
    o.model.moe = (moe_config){.experts = 4, .top_k = 2, .expert_dim = 64, .shared_expert = false, .aux_alpha = 0.01f};
    static const struct option flags[] = {
        {"experts", required_argument, 0, OPT_EXPERTS}, {"top-k", required_argument, 0, OPT_TOP_K},
        {"expert-dim", required_argument, 0, OPT_EXPERT_DIM}, {"shared-expert", no_argument, 0, OPT_SHARED},
        {"aux-alpha", required_argument, 0, OPT_AUX},
        {"router", required_argument, 0, OPT_ROUTER}, {"capacity-factor", required_argument, 0, OPT_CAPACITY},
        {"moe-every", required_argument, 0, OPT_MOE_EVERY},
        {"ep", required_argument, 0, OPT_EP}, {"tp", required_argument, 0, OPT_TP}, {"pp", required_argument, 0, OPT_PP},
        {"microbatches", required_argument, 0, OPT_MICRO}, {"schedule", required_argument, 0, OPT_SCHEDULE},
        {"virtual-stages", required_argument, 0, OPT_VIRTUAL}, {"cp", required_argument, 0, OPT_CP},
        {"cp-method", required_argument, 0, OPT_CP_METHOD}, {"ep-over-cp", no_argument, 0, OPT_EP_OVER_CP},
        {"fsdp", no_argument, 0, OPT_FSDP}, {"full-shard", no_argument, 0, OPT_FULL_SHARD},
        {"fp8", required_argument, 0, OPT_FP8},
        {"save", required_argument, 0, OPT_SAVE}, {"resume", required_argument, 0, OPT_RESUME},
        {"plan", no_argument, 0, OPT_PLAN}, PLAN_CALC_FLAGS, {0, 0, 0, 0}};
    chapter_options co = {.moe = &o.model.moe, .moe_every = &o.model.layer_every, .ep = 0, .tp = 1, .pp = 1, .cp = 1, .pipe = {.schedule = PP_1F1B},
                          .context = {.method = CP_RING, .balance = CP_ZIGZAG}};
    plan_calc_defaults(&co.calc);
    static char full_usage[12288];
    snprintf(full_usage, sizeof full_usage, "%s%s", usage, plan_calculator_usage);
    const run_options defaults = o;
    run_parse(&o, argc, argv, flags, chapter_flag, &co, full_usage);

    /* ---- --plan: chapter 08's calculator with this chapter's layer (a mixture at scale) ---- */
    if (co.plan) {   /* (it trains nothing: a flag of the trained model or mesh is refused, not ignored) */
        for (const struct option *f = flags; f->name && co.train_flag; f++)
            if (f->val == co.train_flag)
                comm_exit_usage("--%s configures a training run; --plan plans with the --plan-* flags (--plan-experts, "
                                "--plan-mesh, --plan-ep, ...)", f->name);
        const char *model_flag = run_model_flag_given(&o, &defaults);
        if (model_flag)
            comm_exit_usage("%s configures the trained model; --plan plans with the --plan-* flags (--plan-dim, "
                            "--plan-layers, --plan-global-batch, ...)", model_flag);
        co.calc.moe_chapter = &ep_plan_moe_chapter;   /* this chapter's layer and all-to-all formula */
        int status = plan_calculator_run(&co.calc);
        comm_finalize();
        return status;
    }
    if (co.calc.flag_given)
        comm_exit_usage("--%s configures the --plan calculator: it needs --plan (no training then)", co.calc.flag_given);
    char why[256];
    if (moe_config_check(&o.model, why, sizeof why)) comm_exit_usage("%s", why);
    if (co.resume && o.check)
        comm_exit_usage("--resume starts from a checkpoint and --check's baseline from step 1: leave --check out and "
                        "compare with an uninterrupted run (09_expert_parallel/check_resume.sh)");
    o.model.layer = moe_layer_for(&o.model);   /* the baseline's layer too */
    const llama_config *c = &o.model;

    /* ---- mesh: pp x dp_replicate x dp_shard x cp x tp, the experts split over dp_shard (ep) ---- */
    bool piped = co.pp > 1 || co.pipe_given;   /* chapter 05's pipeline, each stage with its ep group */
    if (!co.pipe.microbatches) co.pipe.microbatches = piped ? co.pp : 1;
    if (!co.pipe.virtual_stages) co.pipe.virtual_stages = co.pipe.schedule == PP_INTERLEAVED ? 2 : 1;
    if (co.cp_method_given && co.cp == 1)
        comm_exit_usage("--cp-method: with one cp rank (--cp 1) no sequence is split; use --cp 2 or more");
    if (co.ep_over_cp && co.cp == 1)
        comm_exit_usage("--ep-over-cp carves the ep group out of dp_shard x cp: it needs --cp 2 or more");
    if (co.full_shard && !co.fsdp)
        comm_exit_usage("--full-shard shards FSDP over every data rank: give it with --fsdp");
    bool fp8 = co.fp8 != FLOAT8_OFF;   /* chapter 07's float8 on the dense linears, as chapter 08 applies it */
    float8_refuse_baseline_dtype(co.fp8, o.baseline_dtype, o.model.precision);
    if (fp8 && co.cp > 1 && o.check)
        comm_exit_usage("--fp8 with --cp %d and --check is not valid: each cp rank scales the activations of its own "
                        "positions, which the single-device float8 baseline cannot reproduce", co.cp);
    if (fp8 && co.cp > 1 && o.dump_dir)
        comm_exit_usage("--dump with --fp8 and --cp %d is not valid: each cp rank scales the activations of its own "
                        "positions, which the dump's float8 metadata cannot describe; dump with --cp 1", co.cp);
    if (co.resume && co.fp8 == FLOAT8_DELAYED)
        comm_exit_usage("--resume with --fp8 delayed is not valid: the checkpoints do not keep the amax history, so the "
                        "resumed casts would differ; use --fp8 tensorwise or rowwise");
    mesh_requirements needs = {0};
    mesh_require(&needs, tp_mesh_rule(c));
    if (co.cp > 1) {
        mesh_require(&needs, cp_sequence_rule(c->seq_len, false));
        if (co.context.method == CP_ALLTOALL) mesh_require(&needs, cp_heads_rule(c));
    }
    mesh_require(&needs, ep_mesh_rule(c, o.batch, co.ep != 0, co.ep_over_cp));
    if (piped) {
        mesh_require(&needs, pipeline_layers_rule(c->n_layers, co.pipe.virtual_stages, false));
        mesh_require(&needs, pipeline_microbatches_rule(o.batch, co.pipe.microbatches, 0));
    }
    int shard = ep_shard_degree(comm_world()->size, co.tp, co.pp, co.cp, co.ep, co.ep_over_cp);   /* dp_shard */
    device_mesh *mesh = mesh_create(
        (mesh_shape){.pp = co.pp, .dp_replicate = MESH_REST, .dp_shard = shard, .cp = co.cp, .tp = co.tp}, &needs);
    if (co.cp > 1) context_parallel_validate(co.cp);
    if (piped) pipeline_validate(co.pp, &co.pipe);
    int data_ranks = mesh->shape.dp_replicate * mesh->shape.dp_shard;
    /* (the widths float8 casts: --ffn-dim only where a shared expert or a dense layer has it) */
    bool ffn_cast = c->moe.shared_expert || c->layer_every > 1;
    llama_config cast = *c;
    if (!ffn_cast) cast.ffn_dim = c->dim;   /* (no linear of that width: nothing to check) */
    const char *float8_why = float8_shape_error(&cast, co.tp, o.batch / data_ranks / co.pipe.microbatches *
                                                              (c->seq_len / co.cp), co.fp8);   /* one GEMM's rows */
    if (float8_why) comm_exit_usage("%s", float8_why);
    if (co.fsdp && piped && co.pipe.schedule == PP_ZB_H1)   /* (chapter 08 refuses it too) */
        comm_exit_usage("--schedule zb-h1 defers the weight gradients past the moment FSDP reduce-scatters them: with "
                        "--fsdp use gpipe, 1f1b or interleaved");

    /* ---- the plan: chapter 01's inside each data rank (when tp > 1), chapter 06's sequence split
     * (when cp > 1) and chapter 05's pipeline (when pp > 1) around it, the experts and the batch
     * split ---- */
    llama_plan plan = tensor_parallel_or_single(mesh, c);
    if (co.cp > 1) context_parallel_apply(&plan, mesh, c, &co.context);
    /* chapter 07's float8 on the dense linears (the router and the experts are not cast:
     * float8_casts_site), each pipeline microbatch keeping its own scales */
    float8_options f8 = {.recipe = co.fp8, .amax_history = 16, .activation_groups = 1,
                         .microbatches = piped ? co.pipe.microbatches : 1};
    if (fp8) float8_apply(&plan, c, &f8);
    if (piped) pipeline_apply(&plan, mesh, c, &co.pipe);
    expert_parallel_apply(&plan, mesh, c, co.ep_over_cp);
    if (co.fsdp)   /* chapter 04's FSDP over dp_shard (x cp; x dp_replicate under --full-shard): the dense
                    * tensors sharded over all of it, the experts over the rest of it beside ep (cp unless ep
                    * spans it, and dp_replicate under --full-shard; none left: held whole) */
        data_parallel_apply(&plan, mesh, c, &(dp_options){.mode = DP_FSDP, .reshard_after_forward = true,
                                                          .prefetch = !piped, .shard_over_cp = co.cp > 1,
                                                          .shard_over_replicate = co.full_shard});
    run_apply_fault(&o, &plan);
    /* the checkpoints' directories, checked with --out and --dump before anything is allocated */
    const char *dir = co.save ? co.save : co.resume;
    if (dir && checkpoint_dir_problem(dir, co.save != NULL, why, sizeof why))
        comm_exit_usage("%s %s: %s", co.save ? "--save" : "--resume", dir, why);
    if (co.resume && !checkpoint_exists(co.resume))   /* (before --out is created: nothing left behind) */
        comm_exit_usage("--resume %s: no checkpoint there (no latest, no index.json)", co.resume);
    run_path paths[] = {
        {"--save", co.save, RUN_PATH_OUTPUT_DIR, "whose files the checkpoints own (DIR/latest, DIR/step_N)", true, true},
        {"--resume", co.resume, RUN_PATH_INPUT, NULL, false, false}};
    llama_model *model = run_model_paths(&o, &plan, paths, 2);   /* refuses up front what cannot fit */
    int first = 1;   /* the first step: 1, or the checkpoint's next */
    char settings[256];
    char fp8_key[48] = "";   /* (as chapter 08's: a float8 run resumes as one; off: as before) */
    if (fp8) snprintf(fp8_key, sizeof fp8_key, ",\"fp8\":\"%s\"", float8_recipe_name(co.fp8));
    snprintf(settings, sizeof settings, "{\"chapter\":\"09\",\"batch\":%d,\"lr\":%.9g,\"aux_alpha\":%.9g,\"capacity_factor\":%.9g%s%s}",
             o.batch, o.opt.lr, c->moe.aux_alpha, c->moe.capacity_factor,
             c->moe.router == MOE_SIGMOID ? ",\"router\":\"sigmoid\"" : "", fp8_key);   /* (softmax: as before) */
    if (co.resume) {
        checkpoint_meta meta;
        char err[512];
        int rc = checkpoint_load(co.resume, model, &meta, err, sizeof err);
        if (rc != 0) comm_exit_usage("--resume %s: %s", co.resume, err);
        if (strcmp(meta.trainer_json, settings) != 0 || meta.seed != o.seed)
            comm_exit_usage("--resume %s: the checkpoint was written with %s and seed %llu; this run has %s and seed %llu",
                            co.resume, meta.trainer_json, (unsigned long long)meta.seed, settings,
                            (unsigned long long)o.seed);
        first = meta.step + 1;
        log0("resumed from %s: step %d done, training steps %d to %d\n", co.resume, meta.step, first, meta.step + o.steps);
    }
    const llama_dims *d = &model->d;
    double param_bytes = mem_current(MEM_PARAMS);

    char stages[96] = "";
    char contexts[64] = "";
    if (piped)
        snprintf(stages, sizeof stages, "pp %d (%s, %d microbatches) x ", mesh->shape.pp,
                 pp_schedule_name(co.pipe.schedule), co.pipe.microbatches);
    if (co.cp > 1) snprintf(contexts, sizeof contexts, "cp %d (%s) x ", co.cp, cp_method_name(co.context.method));
    /* the ranks beside ep: replicas, or under --full-shard shards of the same experts: torchtitan's
     * dp_shard_mod_ep when nothing else shards them (cp 1, or ep spanning cp) */
    const char *rest = !co.full_shard ? "dp_replicate"
                       : co.cp > 1 && !co.ep_over_cp ? "dp_replicate (sharded)" : "dp_shard_mod_ep";
    if (expert_parallel_over_cp(&plan))   /* the ep group is dp_shard x cp */
        log0("chapter 09: mixture of experts, %d experts, top-%d, %s%s %d x dp_shard %d x %stp %d, ep = "
             "dp_shard x cp = %d, backend %s\n", d->E, d->k, stages, rest, mesh->shape.dp_replicate, mesh->shape.dp_shard,
             contexts, mesh->shape.tp, d->ep, device_backend_name());
    else
        log0("chapter 09: mixture of experts, %d experts, top-%d, %s%s %d x ep %d x %stp %d, backend %s\n",
             d->E, d->k, stages, rest, mesh->shape.dp_replicate, mesh->shape.dp_shard, contexts, mesh->shape.tp,
             device_backend_name());
    if (fp8)
        log0("float8 (chapter 07): %s on the dense linears (attention's%s%s), %s; the router and the experts in %s\n",
             float8_recipe_name(co.fp8), c->moe.shared_expert ? ", the shared expert's" : "",
             c->layer_every > 1 ? ", the dense layers' feed-forward" : "", float8_gemm_name(co.fp8),
             dtype_name(c->precision));
    plan_describe(&plan);   /* which technique installed which operator; the groups */
    char every[96] = "";   /* --moe-every: which layers are mixtures */
    for (int l = 0, n = 0; c->layer_every > 1 && l < c->n_layers; l++)
        if (llama_layer_has(c, l, P_ROUTER)) {
            size_t at = strlen(every);
            if (n++ == 4) { snprintf(every + at, sizeof every - at, ", ..."); break; }
            snprintf(every + at, sizeof every - at, "%s%d", n == 1 ? " in layers " : ", ", l);
        }
    if (c->layer_every > 1) {
        size_t at = strlen(every);
        snprintf(every + at, sizeof every - at, " (one in %d)", c->layer_every);
    }
    log0("model: dim %d, %d layers, %d heads (%d kv), experts %d x hidden %d%s%s, vocab %d; global batch %d x %d "
         "tokens, %d per rank%s\n", c->dim, c->n_layers, c->n_heads, c->n_kv_heads, d->E, d->Fe,
         c->moe.shared_expert ? " + a shared expert" : "", every, c->vocab_size, o.batch, c->seq_len,
         d->B * co.pipe.microbatches, piped ? " in microbatches (a microbatch's figures below: B, N)" : "");
    if (d->capacity)
        log0("per rank: %d of %d experts (from expert %d); capacity %d rows per expert and sequence (ceil(c T k / E), "
             "c = %g): at most %zu rows reach them per layer\n", d->El, d->E, d->e0, d->capacity, c->moe.capacity_factor, d->R);
    else
        log0("per rank: %d of %d experts (from expert %d); at most %zu rows reach them per layer (dropless)\n", d->El,
             d->E, d->e0, d->R);

    /* ---- train, with the baseline beside it; each step's expert load and all-to-all time into
     * OUT/expert_load.csv (plot.gp draws it) ---- */
    char path[512], load_path[512], label[64];
    snprintf(path, sizeof path, "%s/loss_e%d_k%d_ep%d.csv", o.out_dir, d->E, d->k, d->ep);
    snprintf(load_path, sizeof load_path, "%s/expert_load.csv", o.out_dir);
    snprintf(label, sizeof label, "moe E%d k%d ep%d", d->E, d->k, d->ep);
    llama_plan baseline = plan_single_device();
    if (fp8) {   /* the baseline casts as the mesh does: each data rank's microbatch rows scaled apart
                  * (chapter 07), judged on step 1 only as there */
        float8_options one_device = f8;
        one_device.microbatches = 1;
        one_device.activation_groups = data_ranks * co.pipe.microbatches;
        float8_apply(&baseline, c, &one_device);
        if (o.check) float8_compare_casts(&plan, &baseline);   /* (the baseline runs with --check only) */
        char float8_json[320];   /* --dump: the recipe and its row blocks, as chapters 07 and 08 write them */
        run_dump_describe(&o, float8_run_options_json(&f8, one_device.activation_groups, 1, float8_json,
                                                      sizeof float8_json));
    }
    /* (under --dtype bf16 with cp, the baseline's attention in the cp ranks' blocks: 06's) */
    bool blocks = co.cp > 1 && context_parallel_baseline(&baseline, run_baseline_precision(&o), &co.context, co.cp);
    run_loop loop = run_loop_begin(&o, model, run_baseline_create(&o, fp8 || blocks ? &baseline : NULL, fp8), label,
                                   path);
    ep_load_log *log = ep_load_log_open(&plan, model, load_path);
    for (int step = first; step < first + o.steps; step++) {
        run_synthetic_batch(&loop, step);
        run_step_result r = run_step(&loop, step, NAN);
        if (step == 1 && fp8) run_baseline_unjudged(loop.check, float8_casts_flipped(&baseline));
        ep_load_log_step(log, &r);   /* the load of this step (the technique tallied it), before the update */
        run_step_check(&loop, &r);
        run_update(&loop, &r);
    }
    run_clock clock = run_loop_end(&loop);
    ep_load_log_close(log);
    if (co.save) {   /* every rank writes the slices it is the one to hold: its experts, ... */
        checkpoint_meta meta = {.step = first + o.steps - 1, .seed = o.seed};
        snprintf(meta.trainer_json, sizeof meta.trainer_json, "%s", settings);
        char err[512];
        if (checkpoint_save(co.save, model, &meta, err, sizeof err) != 0) comm_exit_usage("--save %s: %s", co.save, err);
        log0("saved step %d to %s\n", meta.step, co.save);
    }

    /* ---- measured beside the formulas ---- */
    log0("\n");
    int mismatches = ep_report_parameters(&plan, model, param_bytes);
    mismatches += ep_report_load(&plan, model);
    mismatches += ep_report_traffic(&o, &plan, model, co.fp8);
    mismatches += ep_report_plan(&o, &plan, model, &co.pipe, param_bytes);   /* 08's --plan on this mesh */
    if (piped) {   /* chapter 05's: the activation sets a stage held at its peak, the messages between stages */
        mismatches += report_pipeline_memory(&plan);
        mismatches += report_pipeline_messages(&o, &plan, model);
    }
    if (o.check && fp8) mismatches += float8_report_casts(&baseline);   /* step 1's, code by code */
    run_clock_report(&clock, o.steps);

    llama_free(model);
    plan_free(&plan);
    plan_free(&baseline);
    return run_finish(&o, mismatches);
}
