/* data_parallel.c: DDP, ZeRO-1, ZeRO-2 and FSDP as a plan (data_parallel.h), the entry point: each
 * mode is a technique file of its own, over what they share (dp_units.c: a unit by rank and by
 * tensor, the collectives on one unit, the groups, the timeline, the buffers, the fault):
 *
 *   ddp.c     values, gradients and AdamW's state whole; the gradients all-reduced in buckets
 *             while backward goes on
 *   zero.c    zero1 (AdamW's state sharded) and zero2 (the gradients too): the gradients
 *             reduce-scattered, AdamW on the own shard, the values all-gathered after the step
 *   fsdp.c    everything sharded: a unit's values gathered before use and freed after (with
 *             prefetch), its gradients reduce-scattered right after its backward
 *
 * The S ranks are the shard group: dp_shard, or dp_shard x cp (shard_over_cp, chapter 08). Below,
 * the technique's rule for the mesh (dp_batch_rule).
 */
#include <stdio.h>
#include <stdlib.h>
#include "comm.h"
#include "dp_units.h"

const char *dp_mode_name(dp_mode mode) {
    static const char *names[DP_NMODES] = {"ddp", "zero1", "zero2", "fsdp"};
    return mode >= 0 && mode < DP_NMODES ? names[mode] : "?";
}

/* The mode's state, freed with its buffers. */
static void data_parallel_free_state(void *state) {
    dp_state *s = state;
    switch (s->o.mode) {
    case DP_DDP: ddp_free(s); break;
    case DP_ZERO1: case DP_ZERO2: zero_free(s); break;
    default: fsdp_free(s); break;
    }
}
const plan_technique data_parallel_technique = {"data parallel", data_parallel_free_state};

void data_parallel_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const dp_options *o) {
    switch (o->mode) {
    case DP_DDP: ddp_apply(plan, mesh, c, o); break;
    case DP_ZERO1: zero1_apply(plan, mesh, c, o); break;
    case DP_ZERO2: zero2_apply(plan, mesh, c, o); break;
    default: fsdp_apply(plan, mesh, c, o); break;
    }
}

void data_parallel_refuse_reduce_type(dtype reduce_type, dtype precision) {
    if (reduce_type != DTYPE_F32 && precision != DTYPE_BF16)
        comm_exit_usage("--reduce-dtype %s needs --dtype bf16: an %s run keeps its gradients %s; reducing them in %s "
                        "is part of mixed precision", dtype_name(reduce_type), dtype_name(precision),
                        dtype_name(precision), dtype_name(reduce_type));
}

const char *data_parallel_run_options_json(dtype reduce_type, int data_ranks, int passes, int microbatches, char *buf,
                                           size_t len) {
    if (reduce_type == DTYPE_F32) return NULL;
    char passes_key[32] = "", micro_key[32] = "";   /* (only when above 1) */
    if (passes > 1) snprintf(passes_key, sizeof passes_key, ",\"passes\":%d", passes);
    if (microbatches > 1) snprintf(micro_key, sizeof micro_key, ",\"microbatches\":%d", microbatches);
    snprintf(buf, len, "{\"reduce\":{\"dtype\":\"%s\",\"data_ranks\":%d%s%s}}", dtype_name(reduce_type), data_ranks,
             passes_key, micro_key);
    return buf;
}

/* ---- the mesh's rule (data_parallel.h) ---- */

static const char *dp_divides_batch(const mesh_rule *r, const mesh_view *v, char *why, size_t len) {
    long long batch = r->size[0];
    int R = v->s.dp_replicate, S = v->s.dp_shard, dp = R * S;
    if (batch % dp == 0) return NULL;
    if (v->plan)
        return mesh_refuse(why, len, "the global batch of %lld sequences is not divisible by dp_replicate %d x "
                           "dp_shard %d = %d: each data rank takes an equal share", batch, R, S, dp);
    return mesh_refuse(why, len, "--batch %lld is not divisible by the data-parallel degree dp_replicate %d x dp_shard "
                       "%d = %d: each data rank takes batch / %d sequences", batch, R, S, dp, dp);
}

mesh_rule dp_batch_rule(long long batch) { return (mesh_rule){.check = dp_divides_batch, .size = {batch}}; }
