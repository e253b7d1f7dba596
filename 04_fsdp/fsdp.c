/* fsdp.c: ZeRO-3/FSDP (PyTorch FSDP2's fully_shard) as a plan (data_parallel.h): every rank keeps
 * only its shard of the values, the gradients and AdamW's m and v, over the S ranks of the shard
 * group, and gathers a unit's values just before it computes:
 *
 *   weights.acquire / release   gather a unit's values into a slot before use (prefetching the
 *                               next unit's while it computes), free them after; a full-size
 *                               gradient buffer during a unit's backward, whose reduce-scatter
 *                               into the shards starts right after and is finished at the next
 *                               unit's release (dp_units.c: the overlapped reduce-scatter)
 *   reduce_grads                finish the last unit's reduce-scatter
 *   optimizer_step              AdamW on the shards (nothing gathered stays valid)
 *
 * Under HSDP (dp_replicate > 1) the shards' gradients are also all-reduced over the replicas; a
 * chapter may move the gathers in another form than fp32 (dp_gather_ops: chapter 07's float8).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "comm.h"
#include "device.h"
#include "kernels.h"
#include "model.h"
#include "dp_units.h"

/* A unit's gathered values: one padded full tensor after the other. */
enum { SLOT_FREE = -1, SLOT_REDUCING = -2 };
typedef struct {
    float *data;
    int unit;                          /* the unit held; SLOT_FREE; or SLOT_REDUCING: data
                                        * is the send buffer of the reduce-scatter in flight */
    comm_request req[PARAM_UNIT_MAX];  /* its all-gather in flight (a gather hook's: one
                                        * per tensor)                                   */
    int idx[PARAM_UNIT_MAX];           /* the tensors (table indices) of the unit      */
    void *pending[PARAM_UNIT_MAX];     /* a dp_gather_ops's state per gather, or NULL  */
    device_mark issued;                /* when they were issued (timeline)             */
    int n_req;
} unit_slot;

typedef struct {
    dp_state dp;                       /* first: the shared state (dp_units.h)                 */
    unit_slot *slots;                  /* [n_slots], slot 0 for the ends                        */
    int n_slots;
    unit_slot *rs_slot;                /* the slot the reduce-scatter in flight sends from      */
    unit_slot *landing;                /* the slot whose all-gather lands (by rank) in
                                        * stage_in, to be copied out into it after the wait */
} fsdp_state;

/* ==============================================================================================
 * The values of a unit, gathered into a slot.
 * ============================================================================================== */

/* The slot holding unit u's values (gathered, or being gathered), or NULL. */
static unit_slot *slot_holding(fsdp_state *f, int u) {
    for (int k = 0; k < f->n_slots; k++)
        if (f->slots[k].unit == u) return &f->slots[k];
    return NULL;
}

/* Waits for slot's gathers and leaves its values by tensor in slot->data: copied out of the
 * landing buffer (the fp32 gather of the whole unit, stage_in: each part's [S_q, U_q]), or decoded by the gather
 * hook (e.g. float8 bytes back to values, tensor by tensor). Waits; issues nothing. */
static void land_slot(fsdp_state *f, unit_slot *slot) {
    dp_state *s = &f->dp;
    if (!slot->n_req) return;
    comm_wait_all(slot->req, slot->n_req);
    if (f->landing == slot) {
        unit_copy(s, slot->unit, s->stage_in, slot->data, NULL, false);
        f->landing = NULL;
    }
    float *full = slot->data;
    for (int k = 0; s->o.gather && k < slot->n_req; k++) {
        const param_tensor *x = &s->t->t[slot->idx[k]];
        s->o.gather->finish(s->o.gather->ctx, x, full, dp_shard_of(x), slot->pending[k]);
        slot->pending[k] = NULL;
        full += dp_padded(x);
    }
    slot->n_req = 0;
    dp_event_add(s, "comm", &slot->issued, slot->unit == s->L ? "all_gather ends" : "all_gather %d", slot->unit);
}

/* The reduce-scatter in flight finished (finish_unit_reduce), the slot it sent from free again. */
static void finish_reduce(fsdp_state *f) {
    finish_unit_reduce(&f->dp);
    if (f->rs_slot) f->rs_slot->unit = SLOT_FREE;
    f->rs_slot = NULL;
}

/* A free slot for unit u (the ends have slot 0); else the one reducing, once finished. */
static unit_slot *free_slot(fsdp_state *f, int u) {
    dp_state *s = &f->dp;
    unit_slot *slot = NULL;
    for (int pass = 0; pass < 2 && !slot; pass++) {   /* a free slot; else the one reducing, once finished */
        if (pass) finish_reduce(f);
        for (int k = u == s->L ? 0 : 1; k < (u == s->L ? 1 : f->n_slots) && !slot; k++)
            if (f->slots[k].unit == SLOT_FREE) slot = &f->slots[k];
    }
    if (!slot) { fprintf(stderr, "fsdp: no free slot for unit %d\n", u); exit(1); }
    return slot;
}

/* Issues the all-gather of unit u's values for a free slot (the ends have slot 0): one of each
 * part of the unit by rank into the landing buffer stage_in [S_0 U_0 + S_1 U_1], or, with a
 * gather hook, one per tensor straight into the slot [S_q * shard each]. The landing buffer holds
 * one unit at a time: a gather still landing there is waited for and copied out first (prefetch
 * keeps at most one in flight, so this happens only when a unit is asked for out of the expected
 * order). Issues 1 all-gather of S_0 U_0 floats over the shard group, and 1 of S_1 U_1 over the
 * experts' own when they are sharded over it (the hook's: one per tensor), non-blocking. */
static void gather_unit(fsdp_state *f, int u) {
    dp_state *s = &f->dp;
    if (u < 0 || u > s->L || slot_holding(f, u)) return;
    unit_slot *slot = free_slot(f, u);
    int idx[PARAM_UNIT_MAX], n = param_unit_tensors(s->t, u, idx);
    slot->unit = u;
    dp_mark_now(&slot->issued);
    if (!s->o.gather) {
        unit_part part[DP_PARTS];
        size_t U = unit_parts(s, u, part), off, count;
        slot->n_req = 0;
        if (!U) return;   /* nothing of it is stored here */
        if (f->landing) land_slot(f, f->landing);
        param_unit_range(s->t, s->t->params, u, &off, &count);   /* this rank's shards: the first U of count */
        for (int q = 0; q < DP_PARTS; q++)   /* each part over its own shard group */
            if (part[q].floats)
                slot->req[slot->n_req++] = gather_shards(s, part[q].group, s->t->params + off + part[q].shards_at,
                                                         s->stage_in + part[q].by_rank_at, part[q].floats);
        f->landing = slot;
        return;
    }
    float *dst = slot->data;
    slot->n_req = 0;
    for (int k = 0; k < n; k++) {
        const param_tensor *x = &s->t->t[idx[k]];
        if (!dp_moves(s, x)) continue;   /* another stage's (nothing to gather, no room), or held whole */
        const float *shard = param_in(s->t, s->t->params, idx[k]);
        int r = slot->n_req++;
        slot->idx[r] = idx[k];
        slot->pending[r] = NULL;
        slot->req[r] = s->o.gather->start(s->o.gather->ctx, s->part_group[param_shard_part(s->t, x)], x, shard, dst,
                                          dp_shard_of(x), &slot->pending[r]);
        dst += dp_padded(x);
    }
}

/* Waits for slot's gathers; its tensors as views in *w, which holds the table's views of the
 * unit (dp_acquire_resident): a tensor held whole keeps its view of the stored values. */
static void slot_views(fsdp_state *f, unit_slot *slot, unit_weights *w) {
    dp_state *s = &f->dp;
    land_slot(f, slot);
    int idx[PARAM_UNIT_MAX], n = param_unit_tensors(s->t, slot->unit, idx);
    float *p = slot->data;
    for (int k = 0; k < n; k++) {
        const param_tensor *x = &s->t->t[idx[k]];
        if (!dp_moves(s, x)) continue;
        w->of[x->spec.kind] = p;
        p += dp_padded(x);
    }
}

/* Every slot that holds a unit's values freed (a gather still landing waited for first): the
 * values gathered so far are not to be used again. */
static void drop_gathered(fsdp_state *f) {
    for (int k = 0; f->slots && k < f->n_slots; k++) {
        unit_slot *slot = &f->slots[k];
        if (slot->unit < 0) continue;   /* free, or sending a reduce-scatter */
        land_slot(f, slot);
        slot->unit = SLOT_FREE;
    }
}

/* The next unit a pass will ask for: forward runs the ends, 0, 1, ..., L-1; backward the ends,
 * L-1, ..., 0. */
static int next_unit(const dp_state *s, int u, bool backward) {
    if (u == s->L) return backward ? s->L - 1 : 0;
    return backward ? u - 1 : (u + 1 < s->L ? u + 1 : -1);
}

/* After unit u's backward: the previous unit's reduce-scatter finished, then u's full gradients
 * (by tensor) copied in by rank into the unit's slot (each part's [S_q, U_q]: its values are no
 * longer needed; stage_in may be landing the next unit's prefetched gather), which stays taken
 * until the reduce-scatters are finished, and their reduce-scatters started (start_unit_reduce: 1
 * reduce-scatter of S_q U_q floats a part, non-blocking). */
static void reduce_unit_grads(fsdp_state *f, int u) {
    dp_state *s = &f->dp;
    finish_reduce(f);
    if (!unit_shard_floats(s, u)) return;
    unit_slot *slot = slot_holding(f, u);
    if (!slot) { fprintf(stderr, "fsdp: unit %d released without its slot\n", u); exit(1); }
    start_unit_reduce(s, u, slot->data);
    f->rs_slot = slot;
    slot->unit = SLOT_REDUCING;
}

/* (Progress while computing: on the CPU, Open MPI moves a non-blocking collective's data only
 * inside MPI calls, so the in-flight gathers (the prefetch) and reduce-scatters move between the
 * layer's GEMMs by comm_progress_in_flight, which every GEMM calls: no wrapper of the linear
 * operator is needed for it.) */

/* ==============================================================================================
 * The plan's operators.
 * ============================================================================================== */

/* fsdp's buffers: the slots (slot 0 the ends' [ends], the others a layer's), a unit's full
 * gradients (grad_full) and the stages. */
static void fsdp_allocate(dp_state *s) {
    fsdp_state *f = (fsdp_state *)s;
    unit_slot *slots = calloc(f->n_slots, sizeof *slots);
    for (int k = 0; k < f->n_slots; k++) {
        slots[k].data = dp_buffer_floats(s, k == 0 ? s->ends_padded : s->unit_padded_max);
        slots[k].unit = SLOT_FREE;
    }
    if (s->planning) free(slots); else f->slots = slots;   /* (dp_plan_buffers: only counted) */
    dp_allocate_grad_full(s);
    dp_allocate_stages(s);
}

/* Unit u's values gathered (waited for here: gather_unit unless prefetched, then slot_views), the
 * next unit's gather issued (prefetch); in backward its gradients in a zeroed full-size buffer. */
static void fsdp_acquire(void *state, const llama_plan *p, llama_model *m, int u, bool backward, unit_weights *w,
                         unit_weights *g) {
    fsdp_state *f = state;
    dp_state *s = &f->dp;
    dp_ensure_buffers(s, fsdp_allocate);
    dp_acquire_resident(s, m, u, backward, w, g);
    /* A whole-model forward begins: what an earlier forward kept gathered for its backward (the
     * ends and the last layer, see fsdp_release) is dropped, e.g. after an evaluation's forward. */
    if (s->o.prefetch && u == s->L && !backward) drop_gathered(f);
    unit_slot *slot = slot_holding(f, u);
    if (!slot) { gather_unit(f, u); slot = slot_holding(f, u); }
    slot_views(f, slot, w);
    if (s->o.prefetch) gather_unit(f, next_unit(s, u, backward));   /* overlaps u's compute */
    if (backward) full_grads(s, u, g);
    dp_mark_now(&s->t_acquired);
}

/* After unit u's backward its gradients' reduce-scatter starts (reduce_unit_grads); its slot is
 * freed after backward, and after forward when resharding (but for what backward asks first). */
static void fsdp_release(void *state, const llama_plan *p, llama_model *m, int u, bool backward) {
    fsdp_state *f = state;
    dp_state *s = &f->dp;
    dp_compute_event(s, u, backward);
    if (backward) reduce_unit_grads(f, u);
    /* After forward, the units backward asks for first stay gathered when units run in order
     * (prefetch's assumption): the ends and the last layer (FSDP2 leaves its root module gathered
     * after forward, torchtitan its last block). A pipeline interleaves microbatches: there,
     * every unit is resharded. */
    bool backward_next = s->o.prefetch && (u == s->L || u == s->L - 1);
    if (backward || (s->o.reshard_after_forward && !backward_next)) {
        unit_slot *slot = slot_holding(f, u);   /* (none after backward: reducing) */
        if (slot) slot->unit = SLOT_FREE;       /* freed: the next unit may use the slot */
    }
}

/* The last unit's reduce-scatter finished (finish_reduce); then what the plan underneath owes. */
static void fsdp_reduce_grads(void *state, const llama_plan *p, llama_model *m) {
    fsdp_state *f = state;
    dp_ensure_buffers(&f->dp, fsdp_allocate);
    finish_reduce(f);
    dp_reduce_below(&f->dp, p, m);
}

/* AdamW on the shards (values, gradients, m and v all sharded alike). No collective. */
static void fsdp_optimizer_step(void *state, const llama_plan *p, llama_model *m, const adamw_config *o, int step) {
    drop_gathered(state);   /* the shards change: nothing gathered stays valid */
    param_adamw_step(m->params, o, step);
}

/* The slots' marks and buffers given back, then the shared state freed. */
void fsdp_free(dp_state *s) {
    fsdp_state *f = (fsdp_state *)s;
    for (int k = 0; f->slots && k < f->n_slots; k++) device_mark_release(&f->slots[k].issued);
    for (int k = 0; f->slots && k < f->n_slots; k++) device_free(f->slots[k].data);
    free(f->slots);
    dp_free_shared(s);
}

/* ==============================================================================================
 * The mixed-precision policy (--dtype bf16): the linears' weights all-gathered as bf16.
 * ============================================================================================== */

/* FSDP2's MixedPrecisionPolicy(param_dtype=bf16) casts each shard to bf16 before its all-gather,
 * half the bytes. Here the tensors whose every use rounds them to bf16 anyway are gathered so:
 * the linears' weights, the GEMMs' operands (linear.c: chapter 09's router and experts are ones
 * too); the norms' weights and the embedding table are read in fp32 and gathered in fp32. The gathered values are
 * then bit for bit what the fp32 gather gives the bf16 run: a linear's cast of a bf16 value is that
 * value. */
bool fsdp_gathers_bf16(param_kind kind) {
    return kind == P_WQ || kind == P_WK || kind == P_WV || kind == P_WO || kind == P_W1 || kind == P_W2 ||
           kind == P_W3 || kind == P_OUTPUT || kind == P_ROUTER || param_kind_is_expert(kind);
}

typedef struct { uint16_t *send, *recv; size_t count; } bf16_pending;   /* the shard's bf16, every shard's */

/* shard [count] -> full [S x count]: a linear's weight cast to bf16 and gathered as 2 bytes an
 * element (widened in finish), any other tensor as chapter 04 gathers it. Issues 1 all-gather. */
static comm_request bf16_gather_start(void *ctx, comm_group *g, const param_tensor *x, const float *shard,
                                      float *full, size_t count, void **pending) {
    if (!fsdp_gathers_bf16(x->spec.kind)) {
        *pending = NULL;
        return comm_iall_gather(g, shard, full, count);
    }
    bf16_pending *p = malloc(sizeof *p);
    p->count = count * (size_t)g->size;
    p->send = device_alloc_elems(count, DTYPE_BF16, MEM_BUFFERS);
    p->recv = device_alloc_elems(p->count, DTYPE_BF16, MEM_BUFFERS);
    cast_to_bf16(p->send, shard, count);
    *pending = p;
    return comm_iall_gather_bytes(g, p->send, p->recv, count * dtype_size(DTYPE_BF16));
}
/* After the wait: full [S x count] (=) the gathered bf16 values, widened (exact). */
static void bf16_gather_finish(void *ctx, const param_tensor *x, float *full, size_t count, void *pending) {
    bf16_pending *p = pending;
    if (!p) return;
    cast_from_bf16(full, p->recv, p->count);
    device_free(p->send);
    device_free(p->recv);
    free(p);
}
static const dp_gather_ops bf16_gather = {bf16_gather_start, bf16_gather_finish, NULL};

void fsdp_gather_counts(const param_table *t, int L, bool twice, bool keep_last, double *calls, double *bf16_elems) {
    *calls = 0;
    *bf16_elems = 0;
    for (int i = 0; i < t->n; i++) {
        const param_tensor *x = &t->t[i];
        if (!param_sharded_here(x)) continue;   /* another stage's, or held whole */
        /* BEGIN ASSIGNMENT: the bf16 gathers: how many times a step all-gathers tensor x, and the elements of those gathers that move as bf16 (add them to *calls and *bf16_elems) */
        bool kept = twice && keep_last && (x->spec.layer < 0 || x->spec.layer == L - 1);
        double gathers = twice && !kept ? 2 : 1, elems = (double)x->shard_ranks * x->shard_units * x->width;
        *calls += gathers;
        if (fsdp_gathers_bf16(x->spec.kind)) *bf16_elems += gathers * elems;
        /* END ASSIGNMENT */
    }
}

/* FSDP on the plan: everything sharded (but a tensor held whole: params.h); the slots, a unit's full gradients and the stages as
 * transient buffers. The slots: the ends, and the layers: every one when they stay gathered from
 * forward to backward (a unit's slot then sends its reduce-scatter too); else one computing, one
 * prefetched, and one sending the reduce-scatter that overlaps the next unit's backward. */
void fsdp_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const dp_options *o) {
    static const block_storage storage[PARAM_NBLOCKS] = {STORE_SHARD, STORE_SHARD, STORE_SHARD};
    fsdp_state *f = (fsdp_state *)dp_push(plan, mesh, c, o, sizeof(fsdp_state), storage);
    dp_state *s = &f->dp;
    if (c->precision == DTYPE_BF16 && !s->o.gather) s->o.gather = &bf16_gather;   /* the policy: param_dtype bf16 */
    dp_install(plan, s, (weight_ops){f, fsdp_acquire, fsdp_release}, (grad_reduce_ops){f, fsdp_reduce_grads},
               (optimizer_ops){f, fsdp_optimizer_step});
    f->n_slots = 1 + (!o->reshard_after_forward ? s->L : o->prefetch ? 3 : 2);
    dp_plan_buffers(plan, s, fsdp_allocate);
}
