/* zero.c: ZeRO-1 and ZeRO-2 (Rajbhandari et al., 2020) as plans (data_parallel.h): every rank
 * keeps the values whole, but AdamW's m and v (zero1), and the gradients too (zero2), only for
 * its shard of each tensor, over the S ranks of the shard group:
 *
 *   weights.acquire / release   zero2: a full-size gradient buffer during a unit's backward, whose
 *                               reduce-scatter into the shards starts right after and is finished
 *                               at the next unit's release (dp_units.c: the overlapped
 *                               reduce-scatter); zero1: the table's own views
 *   reduce_grads                zero2: finish the last unit's reduce-scatter; zero1: reduce-scatter
 *                               every unit's gradients (whole buffers kept, only the own shard of
 *                               each tensor replaced by its sum)
 *   optimizer_step              AdamW on the own shard, then each unit's updated shards
 *                               all-gathered, so every rank holds the values whole again
 */
#include <stdio.h>
#include <stdlib.h>
#include "comm.h"
#include "device.h"
#include "kernels.h"
#include "llama_kernels.h"
#include "model.h"
#include "dp_units.h"

/* ==============================================================================================
 * zero1: the gradients whole, reduce-scattered after backward.
 * ============================================================================================== */

/* zero1's buffers: stage_in [S * U], stage_out [U] for the largest unit. */
static void zero1_allocate(dp_state *s) { dp_allocate_stages(s); }

/* Unit u's values and gradients, the table's own (whole). No collective. */
static void zero1_acquire(void *state, const llama_plan *p, llama_model *m, int u, bool backward, unit_weights *w,
                          unit_weights *g) {
    dp_state *s = state;
    dp_ensure_buffers(s, zero1_allocate);
    dp_acquire_resident(s, m, u, backward, w, g);
    dp_mark_now(&s->t_acquired);
}

/* After unit u's pass: its compute on the timeline; nothing to free, no collective (zero1 reduces
 * after backward). */
static void zero1_release(void *state, const llama_plan *p, llama_model *m, int u, bool backward) {
    dp_compute_event(state, u, backward);
}

/* Every unit's gradients reduce-scattered now, whole buffers kept (only the own shard of each
 * tensor is replaced by its sum): per unit, the whole gradients copied in by rank into stage_in
 * [S, U], their sums landing in stage_out [U], copied to the own rows. Issues per unit 1
 * reduce-scatter of S * U floats over the shard group (and under HSDP 1 all-reduce of U floats
 * over dp_replicate), each waited for before the next; then what the plan underneath owes. */
static void zero1_reduce_grads(void *state, const llama_plan *p, llama_model *m) {
    dp_state *s = state;
    param_table *t = m->params;
    dp_ensure_buffers(s, zero1_allocate);
    device_mark t0 = device_mark_now();
    for (int u = s->L; u >= 0; u--) {   /* the ends first, then the layers down, as backward ends */
        unit_part part[DP_PARTS];   /* (one part: the experts' own are fsdp's only) */
        size_t U = unit_parts(s, u, part), at = 0;
        if (!U) continue;
        unit_copy(s, u, s->stage_in, NULL, t->grads, true);
        comm_request r = start_grad_reduce(s, &part[0], s->stage_in);
        finish_grad_reduce(s, &r, 1, U);
        int idx[PARAM_UNIT_MAX], n = param_unit_tensors(t, u, idx);
        for (int k = 0; k < n; k++) {   /* each tensor's own rows := their sum */
            const param_tensor *x = &t->t[idx[k]];
            float *own = param_in(t, t->grads, idx[k]) + (size_t)x->own_first * x->width;
            device_copy(own, s->stage_out + at, (size_t)x->own_units * x->width * sizeof(float));
            at += dp_shard_of(x);
        }
    }
    dp_event_add(s, "comm", &t0, "reduce_scatter all", 0);
    dp_reduce_below(s, p, m);
}

/* ==============================================================================================
 * zero2: the gradients sharded, each unit's reduce-scattered right after its backward.
 * ============================================================================================== */

/* zero2's buffers: a unit's full gradients (grad_full) and the stages. */
static void zero2_allocate(dp_state *s) {
    dp_allocate_grad_full(s);
    dp_allocate_stages(s);
}

/* Unit u's values, the table's own (whole); in backward, its gradients in a zeroed full-size
 * buffer (full_grads), the table holding only their shards. No collective. */
static void zero2_acquire(void *state, const llama_plan *p, llama_model *m, int u, bool backward, unit_weights *w,
                          unit_weights *g) {
    dp_state *s = state;
    dp_ensure_buffers(s, zero2_allocate);
    dp_acquire_resident(s, m, u, backward, w, g);
    if (backward) full_grads(s, u, g);
    dp_mark_now(&s->t_acquired);
}

/* After unit u's backward: the previous unit's reduce-scatter finished, then u's full gradients
 * copied in by rank into stage_in [S, U] (zero2 gathers nothing: it is free) and their
 * reduce-scatter started (start_unit_reduce: 1 reduce-scatter of S * U floats, non-blocking). */
static void zero2_release(void *state, const llama_plan *p, llama_model *m, int u, bool backward) {
    dp_state *s = state;
    dp_compute_event(s, u, backward);
    if (!backward) return;
    finish_unit_reduce(s);
    if (!unit_shard_floats(s, u)) return;
    start_unit_reduce(s, u, s->stage_in);
}

/* The last unit's reduce-scatter finished (finish_unit_reduce); then what the plan underneath owes. */
static void zero2_reduce_grads(void *state, const llama_plan *p, llama_model *m) {
    dp_state *s = state;
    dp_ensure_buffers(s, zero2_allocate);
    finish_unit_reduce(s);
    dp_reduce_below(s, p, m);
}

/* ==============================================================================================
 * The optimizer of both: AdamW on the own shard, then the values all-gathered.
 * ============================================================================================== */

/* AdamW on the own shard of each tensor (m and v exist only for it), its gradient the own rows of
 * the whole buffer (grads_whole: zero1) or the stored shard (zero2); then each unit's updated
 * shards, this rank's row stage_out [U] (padded), all-gathered into stage_in [S, U] and copied
 * out, so every rank holds the values whole again. Issues per unit 1 all-gather of S * U floats
 * over the shard group, waited for at once. */
static void shard_step(dp_state *s, llama_model *m, const adamw_config *o, int step, bool grads_whole) {
    param_table *t = m->params;
    for (int u = 0; u <= s->L; u++) {
        size_t U = unit_shard_floats(s, u), at = 0;
        if (!U) continue;
        int idx[PARAM_UNIT_MAX], n = param_unit_tensors(t, u, idx);
        for (int k = 0; k < n; k++) {
            const param_tensor *x = &t->t[idx[k]];
            int i = idx[k];
            size_t own = (size_t)x->own_first * x->width, count = (size_t)x->own_units * x->width;
            float *value = param_in(t, t->params, i) + own;
            float *grad = param_in(t, t->grads, i) + (grads_whole ? own : 0);
            adamw_step(value, grad, param_in(t, t->adam_m, i), param_in(t, t->adam_v, i), count, o->lr,
                       o->beta1, o->beta2, o->eps, o->weight_decay, step);
            /* this rank's row of the unit by rank: the own shard, padded */
            device_zero(s->stage_out + at, dp_shard_of(x) * sizeof(float));
            device_copy(s->stage_out + at, value, count * sizeof(float));
            at += dp_shard_of(x);
        }
        comm_request r = gather_shards(s, s->shard, s->stage_out, s->stage_in, U);
        comm_wait(&r);
        unit_copy(s, u, s->stage_in, NULL, t->params, false);
    }
}

/* zero1: the own rows of the whole gradients (shard_step: 1 all-gather of S * U floats per unit). */
static void zero1_optimizer_step(void *state, const llama_plan *p, llama_model *m, const adamw_config *o, int step) {
    dp_ensure_buffers(state, zero1_allocate);
    shard_step(state, m, o, step, true);
}

/* zero2: the stored gradient shards (shard_step: 1 all-gather of S * U floats per unit). */
static void zero2_optimizer_step(void *state, const llama_plan *p, llama_model *m, const adamw_config *o, int step) {
    dp_ensure_buffers(state, zero2_allocate);
    shard_step(state, m, o, step, false);
}

/* zero1, zero2: nothing of their own beyond the shared state. */
void zero_free(dp_state *s) { dp_free_shared(s); }

/* ZeRO-1 on the plan: values and gradients whole (only the own shard of the gradients reduced),
 * AdamW's state sharded; the stages as transient buffers. */
void zero1_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const dp_options *o) {
    static const block_storage storage[PARAM_NBLOCKS] = {STORE_WHOLE, STORE_WHOLE_SHARD_VALID, STORE_SHARD};
    dp_state *s = dp_push(plan, mesh, c, o, sizeof(dp_state), storage);
    dp_install(plan, s, (weight_ops){s, zero1_acquire, zero1_release}, (grad_reduce_ops){s, zero1_reduce_grads},
               (optimizer_ops){s, zero1_optimizer_step});
    dp_plan_buffers(plan, s, zero1_allocate);
}

/* ZeRO-2 on the plan: values whole, gradients and AdamW's state sharded; a unit's full gradients
 * and the stages as transient buffers. */
void zero2_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const dp_options *o) {
    static const block_storage storage[PARAM_NBLOCKS] = {STORE_WHOLE, STORE_SHARD, STORE_SHARD};
    dp_state *s = dp_push(plan, mesh, c, o, sizeof(dp_state), storage);
    dp_install(plan, s, (weight_ops){s, zero2_acquire, zero2_release}, (grad_reduce_ops){s, zero2_reduce_grads},
               (optimizer_ops){s, zero2_optimizer_step});
    dp_plan_buffers(plan, s, zero2_allocate);
}
