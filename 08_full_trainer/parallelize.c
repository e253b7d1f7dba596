/* parallelize.c: see parallelize.h. */
#include <stdio.h>
#include <string.h>
#include "comm.h"
#include "../01_transformer_tp/tp.h"
#include "../02_loss_parallel/vocab_parallel.h"
#include "../03_sequence_parallel/async_tp.h"
#include "../04_fsdp/data_parallel.h"
#include "../06_context_parallel/context_parallel.h"
#include "parallelize.h"

const char *parallel_mesh_name(const parallel_options *o, char *buf, size_t len) {
    const int *g = o->degree;
    snprintf(buf, len, "pp %d x dp_replicate %d x dp_shard %d x cp %d x tp %d (%d ranks)", g[MESH_PP],
             g[MESH_DP_REPLICATE], g[MESH_DP_SHARD], g[MESH_CP], g[MESH_TP],
             g[MESH_PP] * g[MESH_DP_REPLICATE] * g[MESH_DP_SHARD] * g[MESH_CP] * g[MESH_TP]);
    return buf;
}

mesh_shape parallel_mesh_shape(const parallel_options *o) {
    mesh_shape s;
    memcpy(s.degree, o->degree, sizeof s.degree);
    return s;
}

mesh_requirements parallel_mesh_rules(const llama_config *c, long long batch, parallel_mesh_choices k) {
    mesh_requirements needs = {.names = k.names};
    mesh_require(&needs, tp_mesh_rule(c));
    mesh_require(&needs, vocab_mesh_rule(c->vocab_size, c->vocab_multiple));   /* tp > 1 always splits it (02) */
    mesh_require(&needs, cp_sequence_rule(c->seq_len, k.sp));
    if (k.sp) mesh_require(&needs, sp_mesh_rule(c->seq_len));
    if (k.heads_over_cp) mesh_require(&needs, cp_heads_rule(c));
    mesh_require(&needs, pipeline_layers_rule(c->n_layers, k.virtual_stages, k.short_end_chunks));
    mesh_require(&needs, dp_batch_rule(batch));
    mesh_require(&needs, pipeline_microbatches_rule(batch, k.microbatches, k.microbatch_size));
    return needs;
}

mesh_requirements parallel_mesh_requirements(const parallel_options *o, const llama_config *c, long long batch) {
    parallel_mesh_choices k = {.sp = o->sp, .heads_over_cp = o->cp.method == CP_ALLTOALL,
                               .virtual_stages = o->pp.virtual_stages, .microbatches = o->pp.microbatches};
    return parallel_mesh_rules(c, batch, k);
}

void parallelize_validate(parallel_options *o, const llama_config *c, int batch) {
    int world = comm_world()->size;
    if (o->degree[MESH_PP] == 1 && (o->pp.microbatches != 1 || o->pp.virtual_stages != 1))
        comm_exit_usage("--microbatches %d and --virtual-stages %d split a pipeline's step: they need --pp 2 or more",
                        o->pp.microbatches, o->pp.virtual_stages);
    /* every rule relating the degrees to the model and the batch, in the function the --plan
     * calculator asks too; a dp_shard of -1 becomes the rest of NP */
    mesh_requirements needs = parallel_mesh_requirements(o, c, batch);
    mesh_shape s = parallel_mesh_shape(o);
    char why[512];
    if (mesh_check(&s, world, &needs, why, sizeof why)) comm_exit_usage("%s", why);
    memcpy(o->degree, s.degree, sizeof o->degree);
    /* what the techniques ask beyond the mesh's rules */
    int tp = s.tp, cp = s.cp, pp = s.pp, dp = s.dp_replicate * s.dp_shard;
    if (cp > 1) context_parallel_validate(cp);
    if (pp > 1) {
        pipeline_validate(pp, &o->pp);
        if (parallel_has_fsdp(o) && o->pp.schedule == PP_ZB_H1)
            comm_exit_usage("--schedule zb-h1 defers the weight gradients past the moment FSDP reduce-scatters them: "
                            "with --dp-replicate x --dp-shard%s = %d use gpipe, 1f1b or interleaved",
                            o->fsdp_over_cp && cp > 1 ? " x --cp (FSDP's shards span cp)" : "",
                            parallel_shard_ranks(o) * s.dp_replicate);
    }
    int rows = batch / dp / o->pp.microbatches * (c->seq_len / cp);   /* of one float8 GEMM */
    const char *float8_why = float8_shape_error(c, tp, rows, o->fp8.recipe);
    if (float8_why) comm_exit_usage("%s", float8_why);
}

llama_plan parallelize_llama(device_mesh *mesh, const llama_config *c, int batch, const parallel_options *o) {
    const int *g = o->degree;
    int tp = g[MESH_TP], dp = g[MESH_DP_REPLICATE] * g[MESH_DP_SHARD];   /* the batch's split */
    int piece = batch / dp / o->pp.microbatches;   /* the sequences of one forward */
    /* 01, 02, 03: tensor, vocabulary and sequence parallelism on tp; checkpointing */
    llama_plan plan = tensor_parallel_or_single(mesh, c);
    if (tp > 1) loss_parallel_apply(&plan, c);
    if (tp > 1 || o->ac != AC_NONE) sequence_parallel_apply(&plan, c, piece, o->sp && tp > 1, o->ac);
    if (o->async_tp) async_tp_apply(&plan, c, piece);   /* 03: its collectives decomposed over the tp ring */
    /* 06: the sequence split over cp, attention by the chosen method */
    if (g[MESH_CP] > 1) context_parallel_apply(&plan, mesh, c, &o->cp);
    /* 07: float8 linears (scales agreed over tp) */
    if (o->fp8.recipe != FLOAT8_OFF) {
        float8_options f = o->fp8;
        f.microbatches = g[MESH_PP] > 1 ? o->pp.microbatches : 1;   /* each keeps its scales */
        float8_apply(&plan, c, &f);
    }
    /* 05: the pipeline, which schedules the layers above */
    if (g[MESH_PP] > 1) pipeline_apply(&plan, mesh, c, &o->pp);
    /* 04: FSDP (HSDP with replicas) around everything: its weight access and gradient reduction
     * wrap the plan below. Prefetching the next layer assumes the layers run in order, which a
     * pipeline's interleaving of microbatches breaks: it gathers on demand there. The shards span
     * dp_shard x cp (the cp ranks hold the same parameters; 06 applied above, which FSDP over cp
     * requires), so FSDP runs even on dp 1 when cp > 1, unless --no-fsdp-over-cp. The gradients
     * are summed in the trainer's reduce dtype (--reduce-dtype: fp32, or bf16). */
    if (parallel_has_fsdp(o)) {
        /* BEGIN ASSIGNMENT: chapter 04's data parallelism on the plan, with the options this mesh needs (the comment above says why each) */
        dp_options d = {.mode = DP_FSDP, .reshard_after_forward = true, .prefetch = g[MESH_PP] == 1,
                        .bucket_floats = 64 * 256, .gather = NULL, .shard_over_cp = o->fsdp_over_cp,
                        .reduce_type = o->reduce_type};
        data_parallel_apply(&plan, mesh, c, &d);
        /* END ASSIGNMENT */
        if (!plan_has(&plan, &data_parallel_technique))
            comm_exit_usage("parallelize_llama: FSDP spans %d ranks (dp_replicate x dp_shard%s) but no data-parallel "
                            "plan was applied", parallel_shard_ranks(o) * g[MESH_DP_REPLICATE],
                            o->fsdp_over_cp && g[MESH_CP] > 1 ? " x cp" : "");
    }
    plan.groups.mesh = mesh;
    return plan;
}
