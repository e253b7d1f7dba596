/* Chapter 04: data parallelism, from DDP to ZeRO-3/FSDP, HSDP and FSDP x TP.
 *
 * The data ranks (dp_replicate x dp_shard) split the global batch; DDP keeps a whole model on
 * each and all-reduces the gradients, ZeRO-1/2 shard the optimizer state and the gradients,
 * FSDP the values too, gathering each layer just before it computes (data_parallel.h). Rank 0
 * trains the single-device baseline beside it and compares every step; the run ends with the
 * memory per rank beside ZeRO's formulas and the traffic beside each mode's.
 *
 *   make run-04                                        fsdp over 2 ranks
 *   make run-04 NP=4 ARGS="--dp-mode zero1"            ZeRO-1 over 4 ranks
 *   make run-04 NP=4 ARGS="--dp-replicate 2"           HSDP: shard over 2, replicate over 2
 *   make run-04 NP=4 ARGS="--tp 2"                     FSDP x TP on a 2 x 2 mesh
 *   make run-04 ARGS="--dtype bf16 --reduce-dtype bf16"  mixed precision, the gradients summed in bf16
 *   make check-04                                      every mode at dp 1, 2, 4; HSDP; FSDP x TP; the bug
 */
#include <math.h>
#include <stdio.h>
#include "cli.h"
#include "comm.h"
#include "device.h"
#include "log.h"
#include "mesh.h"
#include "model.h"
#include "report.h"
#include "run.h"
#include "../01_transformer_tp/tp.h"
#include "data_parallel.h"
#include "dp_report.h"

static const char *usage =
    "usage: 04 [flags]   (under mpirun: NP = dp_replicate x dp_shard x tp ranks)\n"
    "  --dp-mode ddp|zero1|zero2|fsdp   what each data rank keeps whole (default fsdp)\n"
    "  --dp-shard S                     ranks the state is sharded over (default: NP / (R x T))\n"
    "  --dp-replicate R                 replicas of the sharded state (HSDP; default 1)\n"
    "  --tp T                           tensor parallelism inside each data rank (default 1)\n"
    "  --bucket-kb K                    ddp: all-reduce the gradients in buckets of K KiB of fp32\n"
    "                                   gradients (default 64; K/2 KiB move under --reduce-dtype bf16)\n"
    "  --no-reshard-after-forward       fsdp: keep the gathered layers from forward to backward\n"
    "  --no-prefetch                    fsdp: gather each layer only when it is needed\n"
    "  --reduce-dtype fp32|bf16         the type the gradients are summed in (default fp32; bf16 needs\n"
    "                                   --dtype bf16): FSDP2's reduce_dtype\n";

enum { OPT_MODE = 1, OPT_SHARD, OPT_REPLICATE, OPT_TP, OPT_BUCKET, OPT_NO_RESHARD, OPT_NO_PREFETCH, OPT_REDUCE_DTYPE };
typedef struct { dp_options dp; int shard, replicate, tp; bool bucket_given, no_reshard_given, no_prefetch_given; } chapter_options;
static void chapter_flag(int code, const char *arg, void *ctx) {
    static const char *const modes[] = {"ddp", "zero1", "zero2", "fsdp", NULL};
    chapter_options *co = ctx;
    if (code == OPT_MODE) co->dp.mode = (dp_mode)cli_choice("--dp-mode", arg, modes);
    else if (code == OPT_SHARD) co->shard = cli_int("--dp-shard", arg, 1, 4096);
    else if (code == OPT_REPLICATE) co->replicate = cli_int("--dp-replicate", arg, 1, 4096);
    else if (code == OPT_TP) co->tp = cli_int("--tp", arg, 1, 4096);
    else if (code == OPT_BUCKET) co->dp.bucket_floats = (size_t)cli_int("--bucket-kb", arg, 1, 1 << 20) * 256, co->bucket_given = true;
    else if (code == OPT_NO_RESHARD) co->dp.reshard_after_forward = false, co->no_reshard_given = true;
    else if (code == OPT_REDUCE_DTYPE) co->dp.reduce_type = cli_dtype("--reduce-dtype", arg);
    else co->dp.prefetch = false, co->no_prefetch_given = true;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* ---- flags ---- */
    run_options o = run_options_default("04", data_parallel_faults);
    o.kv_heads_follow_heads = true;
    chapter_options co = {.dp = {.mode = DP_FSDP, .reshard_after_forward = true, .prefetch = true,
                                 .bucket_floats = 64 * 256, .gather = NULL, .shard_over_cp = false},
                          .shard = 0, .replicate = 1, .tp = 1};
    static const struct option flags[] = {
        {"dp-mode", required_argument, 0, OPT_MODE}, {"dp-shard", required_argument, 0, OPT_SHARD},
        {"dp-replicate", required_argument, 0, OPT_REPLICATE}, {"tp", required_argument, 0, OPT_TP},
        {"bucket-kb", required_argument, 0, OPT_BUCKET},
        {"no-reshard-after-forward", no_argument, 0, OPT_NO_RESHARD},
        {"no-prefetch", no_argument, 0, OPT_NO_PREFETCH}, {"reduce-dtype", required_argument, 0, OPT_REDUCE_DTYPE},
        {0, 0, 0, 0}};
    run_parse(&o, argc, argv, flags, chapter_flag, &co, usage);
    const llama_config *c = &o.model;
    /* flags the chosen mode would ignore: refused */
    if (co.bucket_given && co.dp.mode != DP_DDP)
        comm_exit_usage("--bucket-kb sizes DDP's all-reduce buckets: it needs --dp-mode ddp, not %s", dp_mode_name(co.dp.mode));
    if ((co.no_reshard_given || co.no_prefetch_given) && co.dp.mode != DP_FSDP)
        comm_exit_usage("%s changes FSDP's gathers: it needs --dp-mode fsdp, not %s",
                        co.no_reshard_given ? "--no-reshard-after-forward" : "--no-prefetch", dp_mode_name(co.dp.mode));
    data_parallel_refuse_reduce_type(co.dp.reduce_type, c->precision);

    /* ---- mesh: dp_replicate x dp_shard x tp (dp_shard: the rest of NP when not given) ---- */
    mesh_requirements needs = {0};
    mesh_require(&needs, tp_mesh_rule(c));
    mesh_require(&needs, dp_batch_rule(o.batch));
    device_mesh *mesh = mesh_create(
        (mesh_shape){.dp_replicate = co.replicate, .dp_shard = co.shard ? co.shard : MESH_REST, .tp = co.tp}, &needs);
    int R = mesh->shape.dp_replicate, S = mesh->shape.dp_shard, T = mesh->shape.tp;

    /* ---- the plan: chapter 01's inside each data rank (when tp > 1), data parallelism around it ---- */
    llama_plan plan = tensor_parallel_or_single(mesh, c);
    data_parallel_apply(&plan, mesh, c, &co.dp);   /* (its buffers: allocated at first use) */
    char reduce_json[96];   /* --dump: the gradients' reduction type, for the replay */
    run_dump_describe(&o, data_parallel_run_options_json(co.dp.reduce_type, R * S, 1, 1, reduce_json, sizeof reduce_json));
    run_apply_fault(&o, &plan);
    llama_model *model = run_model(&o, &plan);   /* refuses up front what cannot fit */
    double mem[3] = {mem_current(MEM_PARAMS), mem_current(MEM_GRADS), mem_current(MEM_OPTIM)};

    log0("chapter 04: data parallelism, %s, dp_replicate %d x dp_shard %d x tp %d, backend %s\n",
         dp_mode_name(co.dp.mode), R, S, T, device_backend_name());
    plan_describe(&plan);   /* which technique installed which operator; the groups */
    log0("model: dim %d, %d layers, %d heads (%d kv), ffn %d, vocab %d; global batch %d x %d tokens, %d per data rank\n",
         c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab_size, o.batch, c->seq_len,
         model->d.B);
    if (co.dp.mode == DP_FSDP)
        log0("fsdp: reshard after forward %s, prefetch %s\n", co.dp.reshard_after_forward ? "on" : "off",
             co.dp.prefetch ? "on" : "off");

    /* ---- train, with the baseline beside it ---- */
    char path[512], label[64];
    snprintf(path, sizeof path, "%s/loss_%s_r%d_s%d_t%d.csv", o.out_dir, dp_mode_name(co.dp.mode), R, S, T);
    snprintf(label, sizeof label, "%s %dx%dx%d", dp_mode_name(co.dp.mode), R, S, T);
    comm_log_waits(true);   /* report_timeline splits the waiting (comm_wait_split) */
    run_clock clock = run_train(&o, model, NULL, label, path);

    /* ---- measured beside the formulas ---- */
    log0("\n");
    int mismatches = report_data_parallel_traffic(&o, &plan, model, &co.dp);
    mismatches += report_data_parallel_memory(&plan, model, &co.dp, mem, data_parallel_buffer_bytes(&plan), o.out_dir);
    mismatches += report_timeline(&o, &plan, &co.dp, &clock);
    run_clock_report(&clock, o.steps);

    llama_free(model);
    plan_free(&plan);
    return run_finish(&o, mismatches);
}
