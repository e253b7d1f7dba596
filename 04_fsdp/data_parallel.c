/* data_parallel.c: DDP, ZeRO-1, ZeRO-2 and FSDP as a plan (data_parallel.h). The model is
 * common/model/model.c; this file decides where the values, gradients and optimizer state live,
 * and moves them with the plan's operators:
 *
 *   weights.acquire / release   fsdp: gather a unit's values before use, free them after;
 *                               zero2, fsdp: a full-size gradient buffer during a unit's backward,
 *                               whose reduce-scatter into the shards starts right after and is
 *                               finished at the next unit's release; ddp: the finished unit's
 *                               gradients join an all-reduce bucket
 *   reduce_grads                ddp: wait for the buckets; zero2, fsdp: finish the last unit's
 *                               reduce-scatter; zero1: reduce-scatter every unit's gradients
 *   optimizer_step              zero1, zero2: AdamW on the own shard, then all-gather the values
 *
 * Every collective moves one unit (a layer, or the model's ends): each tensor is S chunks (rows,
 * rank-major), and a unit's collective moves every rank's chunks of all its tensors at once, laid
 * out by rank (unit_copy below): one call per unit instead of one per tensor, as FSDP2 moves a
 * module's parameters, so that the per-call costs (on a GPU a kernel launch and NCCL's
 * synchronisation) are paid per unit (README, "One collective per unit"). The S ranks are the
 * shard group: dp_shard, or dp_shard x cp (shard_over_cp, chapter 08).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "kernels.h"
#include "llama_kernels.h"
#include "log.h"
#include "model.h"
#include "data_parallel.h"

#define MAX_EVENTS 4096
#define MAX_REQUESTS 256

/* A unit's gathered values (fsdp): one padded full tensor after the other. */
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

struct dp_state {
    dp_options o;
    int L, S, R;
    comm_group *shard, *replicate, *batch;
    param_table *t;                    /* the model's table, known from the first acquire */
    unit_slot *slots;                  /* fsdp: [n_slots], slot 0 for the ends          */
    int n_slots;
    size_t unit_padded_max, ends_padded;   /* floats of a gathered layer / the ends     */
    float *grad_full[2];               /* zero2, fsdp: a unit's full gradients [0] ends, [1] a layer */
    float *stage_in, *stage_out;       /* [S * U], [U] for the largest unit's U floats of shards:
                                        * a unit by rank (what its collective moves), and this
                                        * rank's shards of it                                   */
    size_t unit_by_rank_max;           /* S * U of the largest unit                          */
    /* zero2, fsdp: the reduce-scatter in flight, at most one: issued after a unit's backward and
     * waited for after the next one's (or when its buffers or the gradients are needed), so it
     * overlaps that backward. Its send buffer, the unit by rank (a slot under fsdp, stage_in
     * under zero2), and stage_out stay busy until then. */
    comm_request rs_req;
    int rs_unit;                       /* its unit, -1: none in flight                         */
    unit_slot *rs_slot;                /* fsdp: the slot it sends from                         */
    device_mark rs_issued;
    unit_slot *landing;                /* fsdp: the slot whose all-gather lands (by rank) in
                                        * stage_in, to be copied out into it after the wait */
    /* ddp: the open bucket (a range of the whole gradient block) and the issued all-reduces */
    size_t bucket_off, bucket_count;
    comm_request reqs[MAX_REQUESTS];
    device_mark req_issued[MAX_REQUESTS];
    int n_reqs;
    /* the gradient reductions, which a fault may replace */
    comm_request (*reduce_scatter)(comm_group *g, const float *send, float *recv, size_t count);
    comm_request (*all_reduce)(comm_group *g, float *buf, size_t count, comm_op op);
    /* what the plan underneath owes after backward (chapter 03's norm gradients over tp, chapter
     * 06's all-reduce over cp), run on the reduced (or sharded) gradients; NULL: nothing */
    grad_reduce_ops below_reduce;
    device_mark t_step0, t_acquired;   /* marks of the compute stream (device.h): on the GPU the
                                        * host's clock says when work was queued, not when it ran */
    double planned_bytes;              /* the transient buffers' bytes, known before allocating  */
    double measured_bytes;             /* what allocating them added to MEM_BUFFERS              */
    bool allocated;                    /* ensure_buffers has run                                 */
    dp_event events[MAX_EVENTS];
    int n_events;
};

const char *dp_mode_name(dp_mode mode) {
    static const char *names[DP_NMODES] = {"ddp", "zero1", "zero2", "fsdp"};
    return mode >= 0 && mode < DP_NMODES ? names[mode] : "?";
}


/* An event from the mark `*start` (moved into the event) to now; dp_timeline reads the times. */
static void event(dp_state *s, const char *lane, device_mark *start, const char *fmt, int arg) {
    if (s->n_events == MAX_EVENTS) { device_mark_release(start); return; }
    dp_event *e = &s->events[s->n_events++];
    e->lane = lane;
    snprintf(e->what, sizeof e->what, fmt, arg);
    e->m0 = *start;
    start->event = NULL;   /* the event owns it now */
    e->m1 = device_mark_now();
}

/* A new step's timeline: the previous step's marks go back. */
static void timeline_restart(dp_state *s) {
    for (int i = 0; i < s->n_events; i++) {
        device_mark_release(&s->events[i].m0);
        device_mark_release(&s->events[i].m1);
    }
    s->n_events = 0;
    device_mark_release(&s->t_step0);
    s->t_step0 = device_mark_now();
}

/* A mark of now in *m, the one it held given back first. */
static void mark_now(device_mark *m) {
    device_mark_release(m);
    *m = device_mark_now();
}

static void ensure_buffers(dp_state *s);
static void finish_unit_reduce(dp_state *s);

/* A tensor's padded size: S shards of shard_units rows (elements) of `width`. */
static size_t padded(const dp_state *s, const param_tensor *x) { return (size_t)s->S * x->shard_units * x->width; }
static size_t shard_of(const param_tensor *x) { return (size_t)x->shard_units * x->width; }

/* ==============================================================================================
 * A unit in the two layouts (FSDP2's copy-in and copy-out). Each tensor x is S chunks of
 * shard_of(x) floats; U is the sum of them over the unit's tensors, a rank's share of the unit.
 *
 *   by tensor  [ wq: chunk 0 | chunk 1 | ... | chunk S-1 ][ wk: chunk 0 | ... ] ...   what the
 *              model computes with: each tensor whole (padded), one after the other
 *   by rank    [ rank 0: wq's chunk 0, wk's chunk 0, ... ][ rank 1: wq's chunk 1, ... ] ...   [S, U]
 *
 * Rank r's row of the by-rank layout is exactly what the sharded blocks store (params.h: a unit's
 * tensors lie one after the other), so the unit's all-gather sends the stored shards as they are,
 * and its reduce-scatter hands each rank the gradients of its stored shards. Copying between the
 * layouts costs one strided copy per tensor (device_copy_2d).
 * ============================================================================================== */

/* U: the floats of this rank's shards of unit u (0 when none is stored here: another stage's). */
static size_t unit_shard_floats(const dp_state *s, int u) {
    int idx[PARAM_UNIT_MAX], n = param_unit_tensors(s->t, u, idx);
    size_t U = 0;
    for (int k = 0; k < n; k++) U += shard_of(&s->t->t[idx[k]]);
    return U;
}

/* Unit u between by_rank [S, U] and its tensors by tensor: padded one after the other from
 * `by_tensor`, or, when by_tensor is NULL, each at its place in the whole block `whole` (its real
 * units only: the padding is dropped on the way out and zeroed on the way in). to_ranks: tensors ->
 * by_rank (copy-in); else by_rank -> tensors (copy-out). */
static void unit_copy(dp_state *s, int u, float *by_rank, float *by_tensor, float *whole, bool to_ranks) {
    int idx[PARAM_UNIT_MAX], n = param_unit_tensors(s->t, u, idx);
    size_t U = unit_shard_floats(s, u), at = 0, f = sizeof(float);
    for (int k = 0; k < n; k++) {
        const param_tensor *x = &s->t->t[idx[k]];
        size_t c = shard_of(x);
        if (!c) continue;   /* another stage's tensor */
        float *t = by_tensor ? by_tensor + (size_t)s->S * at : param_in(s->t, whole, idx[k]);
        size_t real = by_tensor ? padded(s, x) : (size_t)x->units * x->width;
        size_t chunks = real / c, rest = real % c;   /* whole chunks, then part of one */
        float *r = by_rank + at;
        if (to_ranks) {
            device_copy_2d(r, U * f, t, c * f, c * f, chunks);
            if (rest) device_copy(r + chunks * U, t + chunks * c, rest * f);
            for (size_t j = chunks; j < (size_t)s->S; j++) {   /* padding: zeros */
                size_t from = j == chunks ? rest : 0;
                device_zero(r + j * U + from, (c - from) * f);
            }
        } else {
            device_copy_2d(t, c * f, r, U * f, c * f, chunks);
            if (rest) device_copy(t + chunks * c, r + chunks * U, rest * f);
        }
        at += c;
    }
}

/* ==============================================================================================
 * The two collectives of sharded data parallelism, on one unit.
 * ============================================================================================== */

/* Every rank's shards: by_rank [S, count] from shards [count] (this rank's row).
 * Issues: 1 all-gather of S * count floats over dp_shard, non-blocking: wait on the request. */
static comm_request gather_shards(dp_state *s, const float *shards, float *by_rank, size_t count) {
    comm_request req = {0};   /* a request with nothing in flight */
    /* BEGIN ASSIGNMENT: start the all-gather of every rank's shards of one unit into the by-rank buffer */
    req = comm_iall_gather(s->shard, shards, by_rank, count);
    /* END ASSIGNMENT */
    return req;
}

/* The gradients of this rank's shards, summed over the shard group (under shard_over_cp, over the
 * cp ranks too: chapter 06's sum rides in it), in two parts around the overlapped backward.
 * start: by_rank [S, count], this rank's full gradients of one unit laid out by rank (row r: the
 * chunks rank r's shards cover) -> s->stage_out [count], row r of this rank summed over the S
 * ranks, in flight. Issues: 1 reduce-scatter of
 * S * count floats over dp_shard, non-blocking: finish_grad_reduce waits on it. */
static comm_request start_grad_reduce(dp_state *s, const float *by_rank, size_t count) {
    comm_request req = {0};
    /* BEGIN ASSIGNMENT: start the reduce-scatter of the unit's full gradients over dp_shard into s->stage_out */
    req = s->reduce_scatter(s->shard, by_rank, s->stage_out, count);
    /* END ASSIGNMENT */
    return req;
}

/* finish: waits for the reduce-scatter; under HSDP the sums are then summed over the replicas
 * too, in place in s->stage_out [count]. Issues: under HSDP 1 all-reduce of count floats over
 * dp_replicate. */
static void finish_grad_reduce(dp_state *s, comm_request *req, size_t count) {
    comm_wait(req);
    /* BEGIN ASSIGNMENT: all-reduce this rank's summed shards over dp_replicate (HSDP) */
    if (s->R > 1) comm_all_reduce(s->replicate, s->stage_out, count, COMM_SUM);
    /* END ASSIGNMENT */
}

static comm_request real_reduce_scatter(comm_group *g, const float *send, float *recv, size_t count) {
    return comm_ireduce_scatter(g, send, recv, count);
}
static comm_request real_all_reduce(comm_group *g, float *buf, size_t count, comm_op op) {
    return comm_iall_reduce(g, buf, count, op);
}

/* ==============================================================================================
 * fsdp: the values of a unit, gathered into a slot.
 * ============================================================================================== */

static unit_slot *slot_holding(dp_state *s, int u) {
    for (int k = 0; k < s->n_slots; k++)
        if (s->slots[k].unit == u) return &s->slots[k];
    return NULL;
}

/* Waits for slot's gathers and leaves its values by tensor in slot->data: copied out of the
 * landing buffer (the fp32 gather of the whole unit), or decoded by the gather hook (e.g. float8
 * bytes back to values, tensor by tensor). */
static void land_slot(dp_state *s, unit_slot *slot) {
    if (!slot->n_req) return;
    comm_wait_all(slot->req, slot->n_req);
    if (s->landing == slot) {
        unit_copy(s, slot->unit, s->stage_in, slot->data, NULL, false);
        s->landing = NULL;
    }
    float *full = slot->data;
    for (int k = 0; s->o.gather && k < slot->n_req; k++) {
        const param_tensor *x = &s->t->t[slot->idx[k]];
        s->o.gather->finish(s->o.gather->ctx, x, full, shard_of(x), slot->pending[k]);
        slot->pending[k] = NULL;
        full += padded(s, x);
    }
    slot->n_req = 0;
    event(s, "comm", &slot->issued, slot->unit == s->L ? "all_gather ends" : "all_gather %d", slot->unit);
}

/* Issues the all-gather of unit u's values for a free slot (the ends have slot 0): one of the
 * whole unit by rank into the landing buffer stage_in, or, with a gather hook, one per tensor
 * straight into the slot. The landing buffer holds one unit at a time: a gather still landing
 * there is waited for and copied out first (prefetch keeps at most one in flight, so this
 * happens only when a unit is asked for out of the expected order). */
static void gather_unit(dp_state *s, int u) {
    if (u < 0 || u > s->L || slot_holding(s, u)) return;
    unit_slot *slot = NULL;
    for (int pass = 0; pass < 2 && !slot; pass++) {   /* a free slot; else the one reducing, once finished */
        if (pass) finish_unit_reduce(s);
        for (int k = u == s->L ? 0 : 1; k < (u == s->L ? 1 : s->n_slots) && !slot; k++)
            if (s->slots[k].unit == SLOT_FREE) slot = &s->slots[k];
    }
    if (!slot) { fprintf(stderr, "fsdp: no free slot for unit %d\n", u); exit(1); }
    int idx[PARAM_UNIT_MAX], n = param_unit_tensors(s->t, u, idx);
    slot->unit = u;
    mark_now(&slot->issued);
    if (!s->o.gather) {
        size_t U = unit_shard_floats(s, u), off, count;
        slot->n_req = 0;
        if (!U) return;   /* nothing of it is stored here */
        if (s->landing) land_slot(s, s->landing);
        param_unit_range(s->t, s->t->params, u, &off, &count);   /* this rank's shards: count == U */
        slot->req[0] = gather_shards(s, s->t->params + off, s->stage_in, U);
        slot->n_req = 1;
        s->landing = slot;
        return;
    }
    float *dst = slot->data;
    slot->n_req = n;
    for (int k = 0; k < n; k++) {
        const param_tensor *x = &s->t->t[idx[k]];
        const float *shard = param_in(s->t, s->t->params, idx[k]);
        slot->idx[k] = idx[k];
        slot->pending[k] = NULL;
        slot->req[k] = s->o.gather->start(s->o.gather->ctx, s->shard, x, shard, dst, shard_of(x), &slot->pending[k]);
        dst += padded(s, x);
    }
}

/* Waits for slot's gathers; its tensors as views. */
static unit_weights slot_views(dp_state *s, unit_slot *slot) {
    land_slot(s, slot);
    unit_weights w = {0};
    int idx[PARAM_UNIT_MAX], n = param_unit_tensors(s->t, slot->unit, idx);
    float *p = slot->data;
    for (int k = 0; k < n; k++) {
        const param_tensor *x = &s->t->t[idx[k]];
        w.of[x->spec.kind] = p;
        p += padded(s, x);
    }
    return w;
}

/* fsdp: every slot that holds a unit's values freed (a gather still landing waited for first):
 * the values gathered so far are not to be used again. */
static void drop_gathered(dp_state *s) {
    for (int k = 0; s->slots && k < s->n_slots; k++) {
        unit_slot *slot = &s->slots[k];
        if (slot->unit < 0) continue;   /* free, or sending a reduce-scatter */
        land_slot(s, slot);
        slot->unit = SLOT_FREE;
    }
}

/* The next unit a pass will ask for: forward runs the ends, 0, 1, ..., L-1; backward the ends,
 * L-1, ..., 0. */
static int next_unit(const dp_state *s, int u, bool backward) {
    if (u == s->L) return backward ? s->L - 1 : 0;
    return backward ? u - 1 : (u + 1 < s->L ? u + 1 : -1);
}

/* Views of a full-size gradient buffer, zeroed, for unit u's backward. */
static unit_weights full_grads(dp_state *s, int u) {
    float *g = s->grad_full[u == s->L ? 0 : 1];
    int idx[PARAM_UNIT_MAX], n = param_unit_tensors(s->t, u, idx);
    unit_weights w = {0};
    for (int k = 0; k < n; k++) {
        const param_tensor *x = &s->t->t[idx[k]];
        device_zero(g, padded(s, x) * sizeof(float));
        w.of[x->spec.kind] = g;
        g += padded(s, x);
    }
    return w;
}

/* The reduce-scatter in flight, finished: its sums added into unit rs_unit's gradient shards,
 * its send buffer free again (zero2, fsdp). */
static void finish_unit_reduce(dp_state *s) {
    if (s->rs_unit < 0) return;
    size_t U = unit_shard_floats(s, s->rs_unit), off, count;
    finish_grad_reduce(s, &s->rs_req, U);
    param_unit_range(s->t, s->t->grads, s->rs_unit, &off, &count);   /* the shards' gradients: count == U */
    add_inplace(s->t->grads + off, s->stage_out, U);
    if (s->rs_slot) s->rs_slot->unit = SLOT_FREE;
    event(s, "comm", &s->rs_issued, s->rs_unit == s->L ? "reduce_scatter ends" : "reduce_scatter %d", s->rs_unit);
    s->rs_unit = -1;
    s->rs_slot = NULL;
}

/* After unit u's backward (zero2, fsdp): the previous unit's reduce-scatter finished, then u's full
 * gradients (by tensor) copied in by rank and their reduce-scatter started. The by-rank copy goes
 * into the unit's slot under fsdp (its values are no longer needed; stage_in may be landing the
 * next unit's prefetched gather), which stays taken until the reduce-scatter is finished; into
 * stage_in under zero2. */
static void reduce_unit_grads(dp_state *s, int u) {
    finish_unit_reduce(s);
    size_t U = unit_shard_floats(s, u);
    if (!U) return;
    unit_slot *slot = s->o.mode == DP_FSDP ? slot_holding(s, u) : NULL;
    if (s->o.mode == DP_FSDP && !slot) { fprintf(stderr, "fsdp: unit %d released without its slot\n", u); exit(1); }
    float *by_rank = slot ? slot->data : s->stage_in;   /* (stage_in: zero2, which gathers nothing then) */
    unit_copy(s, u, by_rank, s->grad_full[u == s->L ? 0 : 1], NULL, true);
    mark_now(&s->rs_issued);
    s->rs_req = start_grad_reduce(s, by_rank, U);
    s->rs_unit = u;
    s->rs_slot = slot;
    if (slot) slot->unit = SLOT_REDUCING;
}

/* ==============================================================================================
 * ddp: the finished gradients, all-reduced in buckets while backward goes on.
 * ============================================================================================== */

static void flush_bucket(dp_state *s) {
    if (!s->bucket_count) return;
    if (s->n_reqs == MAX_REQUESTS) { fprintf(stderr, "ddp: more than %d buckets\n", MAX_REQUESTS); exit(1); }
    mark_now(&s->req_issued[s->n_reqs]);
    /* BEGIN ASSIGNMENT: start the all-reduce (sum over the data ranks) of the bucket's gradients */
    s->reqs[s->n_reqs++] = s->all_reduce(s->batch, s->t->grads + s->bucket_off, s->bucket_count, COMM_SUM);
    /* END ASSIGNMENT */
    s->bucket_count = 0;
}

/* Unit u's gradients are final: add them to the open bucket (they lie just below it: backward
 * walks the layers down, and the table lays them out in order), issue it once it is full. */
static void bucket_unit(dp_state *s, int u) {
    size_t off, count;
    param_unit_range(s->t, s->t->grads, u, &off, &count);
    if (s->bucket_count && off + count != s->bucket_off) flush_bucket(s);
    s->bucket_off = off;
    s->bucket_count += count;
    if (s->bucket_count >= s->o.bucket_floats || u == s->L) flush_bucket(s);
}

/* (Progress while computing: on the CPU, Open MPI moves a non-blocking collective's data only
 * inside MPI calls, so the in-flight gathers (FSDP's prefetch), reduce-scatters (ZeRO-2, FSDP) and
 * all-reduces (DDP's buckets) move between the layer's GEMMs by comm_progress_in_flight, which
 * every GEMM calls: no wrapper of the linear operator is needed for it.) */

/* ==============================================================================================
 * The plan's operators.
 * ============================================================================================== */

static void dp_acquire(void *state, const llama_plan *p, llama_model *m, int u, bool backward, unit_weights *w,
                       unit_weights *g) {
    dp_state *s = state;
    ensure_buffers(s);
    s->t = m->params;
    if (u == s->L && !backward) timeline_restart(s);   /* the first acquire of a step */
    *w = param_unit(m->params, m->params->params, u);
    *g = param_unit(m->params, m->params->grads, u);
    /* A whole-model forward begins: what an earlier forward kept gathered for its backward (the
     * ends and the last layer, see dp_release) is dropped, e.g. after an evaluation's forward. */
    if (s->o.mode == DP_FSDP && s->o.prefetch && u == s->L && !backward) drop_gathered(s);
    if (s->o.mode == DP_FSDP) {
        unit_slot *slot = slot_holding(s, u);
        if (!slot) { gather_unit(s, u); slot = slot_holding(s, u); }
        *w = slot_views(s, slot);
        if (s->o.prefetch) gather_unit(s, next_unit(s, u, backward));   /* overlaps u's compute */
    }
    if (backward && (s->o.mode == DP_ZERO2 || s->o.mode == DP_FSDP)) *g = full_grads(s, u);
    mark_now(&s->t_acquired);
}

static void dp_release(void *state, const llama_plan *p, llama_model *m, int u, bool backward) {
    dp_state *s = state;
    if (u != s->L) event(s, "compute", &s->t_acquired, backward ? "bwd %d" : "fwd %d", u);
    if (backward && (s->o.mode == DP_ZERO2 || s->o.mode == DP_FSDP)) reduce_unit_grads(s, u);
    if (backward && s->o.mode == DP_DDP) bucket_unit(s, u);
    /* After forward, the units backward asks for first stay gathered when units run in order
     * (prefetch's assumption): the ends and the last layer (FSDP2 leaves its root module gathered
     * after forward, torchtitan its last block). A pipeline interleaves microbatches: there,
     * every unit is resharded. */
    bool backward_next = s->o.prefetch && (u == s->L || u == s->L - 1);
    if (s->o.mode == DP_FSDP && (backward || (s->o.reshard_after_forward && !backward_next))) {
        unit_slot *slot = slot_holding(s, u);   /* (none after backward: reducing) */
        if (slot) slot->unit = SLOT_FREE;       /* freed: the next unit may use the slot */
    }
}

/* ddp: wait for the buckets. zero1: every unit's gradients reduce-scattered now, whole buffers
 * kept (only the own shard of each tensor is replaced by its sum). */
static void dp_reduce_own_grads(dp_state *s, llama_model *m) {
    param_table *t = m->params;
    ensure_buffers(s);
    if (s->o.mode == DP_DDP) {
        for (int k = 0; k < s->n_reqs; k++) {
            comm_wait(&s->reqs[k]);
            event(s, "comm", &s->req_issued[k], "all_reduce %d", k);
        }
        s->n_reqs = 0;
    }
    finish_unit_reduce(s);   /* zero2, fsdp: the last unit's */
    if (s->o.mode != DP_ZERO1) return;
    device_mark t0 = device_mark_now();
    for (int u = s->L; u >= 0; u--) {   /* the ends first, then the layers down, as backward ends */
        size_t U = unit_shard_floats(s, u), at = 0;
        if (!U) continue;
        unit_copy(s, u, s->stage_in, NULL, t->grads, true);
        comm_request r = start_grad_reduce(s, s->stage_in, U);
        finish_grad_reduce(s, &r, U);
        int idx[PARAM_UNIT_MAX], n = param_unit_tensors(t, u, idx);
        for (int k = 0; k < n; k++) {   /* each tensor's own rows := their sum */
            const param_tensor *x = &t->t[idx[k]];
            float *own = param_in(t, t->grads, idx[k]) + (size_t)x->own_first * x->width;
            device_copy(own, s->stage_out + at, (size_t)x->own_units * x->width * sizeof(float));
            at += shard_of(x);
        }
    }
    event(s, "comm", &t0, "reduce_scatter all", 0);
}

/* The data ranks' reduction, then what the plan underneath owes (sums over other groups, which
 * commute with the sum over the data ranks). */
static void dp_reduce_grads(void *state, const llama_plan *p, llama_model *m) {
    dp_state *s = state;
    dp_reduce_own_grads(s, m);
    if (s->below_reduce.reduce) s->below_reduce.reduce(s->below_reduce.state, p, m);
}

/* zero1, zero2: AdamW on the own shard of each tensor (m and v exist only for it), then each
 * unit's updated shards all-gathered and copied out, so every rank holds the values whole again. */
static void dp_optimizer_step(void *state, const llama_plan *p, llama_model *m, const adamw_config *o, int step) {
    dp_state *s = state;
    param_table *t = m->params;
    if (s->o.mode == DP_FSDP) drop_gathered(s);   /* the shards change: nothing gathered stays valid */
    if (s->o.mode == DP_DDP || s->o.mode == DP_FSDP) { param_adamw_step(t, o, step); return; }
    ensure_buffers(s);
    for (int u = 0; u <= s->L; u++) {
        size_t U = unit_shard_floats(s, u), at = 0;
        if (!U) continue;
        int idx[PARAM_UNIT_MAX], n = param_unit_tensors(t, u, idx);
        for (int k = 0; k < n; k++) {
            const param_tensor *x = &t->t[idx[k]];
            int i = idx[k];
            size_t own = (size_t)x->own_first * x->width, count = (size_t)x->own_units * x->width;
            float *value = param_in(t, t->params, i) + own;
            float *grad = param_in(t, t->grads, i) + (s->o.mode == DP_ZERO1 ? own : 0);
            adamw_step(value, grad, param_in(t, t->adam_m, i), param_in(t, t->adam_v, i), count, o->lr,
                       o->beta1, o->beta2, o->eps, o->weight_decay, step);
            /* this rank's row of the unit by rank: the own shard, padded */
            device_zero(s->stage_out + at, shard_of(x) * sizeof(float));
            device_copy(s->stage_out + at, value, count * sizeof(float));
            at += shard_of(x);
        }
        comm_request r = gather_shards(s, s->stage_out, s->stage_in, U);
        comm_wait(&r);
        unit_copy(s, u, s->stage_in, NULL, t->params, false);
    }
}

static void data_parallel_free_state(void *state) {
    dp_state *s = state;
    timeline_restart(s);   /* (the marks' events back) */
    device_mark_release(&s->t_step0);
    device_mark_release(&s->t_acquired);
    device_mark_release(&s->rs_issued);
    for (int k = 0; k < MAX_REQUESTS; k++) device_mark_release(&s->req_issued[k]);
    for (int k = 0; s->slots && k < s->n_slots; k++) device_mark_release(&s->slots[k].issued);
    for (int k = 0; s->slots && k < s->n_slots; k++) device_free(s->slots[k].data);
    free(s->slots);
    device_free(s->grad_full[0]); device_free(s->grad_full[1]);
    device_free(s->stage_in); device_free(s->stage_out);
    free(s);
}
const plan_technique data_parallel_technique = {"data parallel", data_parallel_free_state};

void data_parallel_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const dp_options *o) {
    dp_state *s = plan_push(plan, &data_parallel_technique, calloc(1, sizeof(dp_state)), 0);
    s->o = *o;
    s->L = c->n_layers;
    /* the shard group: dp_shard, or dp_shard x cp, whose ranks hold the same parameters too but
     * compute the gradients of other rows of the same sequences (chapter 06 splits them) */
    bool over_cp = o->shard_over_cp && mesh->shape.cp > 1;
    if (over_cp && !plan->groups.cp)
        comm_exit_usage("data_parallel_apply: sharding over dp_shard x cp needs context parallelism applied first (the "
                        "cp ranks must split the sequences, or the sum over cp counts each gradient %d times)",
                        mesh->shape.cp);
    static const int shard_dims[] = {MESH_DP_SHARD, MESH_CP};
    s->shard = over_cp ? mesh_group_over(mesh, shard_dims, 2, "dp_shard x cp") : mesh->group[MESH_DP_SHARD];
    s->replicate = mesh->group[MESH_DP_REPLICATE];
    s->S = s->shard->size;
    s->R = s->replicate->size;
    static const int batch_dims[] = {MESH_DP_REPLICATE, MESH_DP_SHARD};
    s->batch = mesh_group_over(mesh, batch_dims, 2, "dp");
    s->reduce_scatter = real_reduce_scatter;
    s->rs_unit = -1;
    s->all_reduce = real_all_reduce;
    plan->groups.mesh = mesh;
    plan->groups.batch = s->batch;
    plan->groups.shard = s->shard;
    plan->groups.shard_dims = MESH_BIT(MESH_DP_SHARD) | (over_cp ? MESH_BIT(MESH_CP) : 0);
    static const block_storage storage[DP_NMODES][PARAM_NBLOCKS] = {
        [DP_DDP] = {STORE_WHOLE, STORE_WHOLE, STORE_WHOLE},
        [DP_ZERO1] = {STORE_WHOLE, STORE_WHOLE_SHARD_VALID, STORE_SHARD},
        [DP_ZERO2] = {STORE_WHOLE, STORE_SHARD, STORE_SHARD},
        [DP_FSDP] = {STORE_SHARD, STORE_SHARD, STORE_SHARD}};
    memcpy(plan->storage, storage[o->mode], sizeof plan->storage);
    /* declared for the techniques below (06's sum over cp): the gradients' reduction sums over the
     * data ranks, and over cp too when the gradients are reduce-scattered into shards over it */
    plan->groups.grads_summed_dims = MESH_BIT(MESH_DP_REPLICATE) | MESH_BIT(MESH_DP_SHARD) |
                                     (over_cp && plan->storage[PARAM_GRADS] != STORE_WHOLE ? MESH_BIT(MESH_CP) : 0);
    plan->weights = (weight_ops){s, dp_acquire, dp_release};
    plan_wrap(plan->reduce_grads, s->below_reduce, ((grad_reduce_ops){s, dp_reduce_grads}));
    plan->optimizer = (optimizer_ops){s, dp_optimizer_step};

    /* The transient buffers' sizes, from the layout the model's table will have (params.h: each
     * tensor's tp slice, its first dimension split in S chunks of ceil(units / S)), computed
     * without allocating anything: run_model checks them (plan_buffer_bytes) with the model's
     * own bytes before anything is allocated, and ensure_buffers allocates them at first use. */
    comm_group *tp = mesh->group[MESH_TP];
    int p = tp ? tp->size : 1, r = tp ? tp->rank : 0;
    size_t *unit_sum = calloc((size_t)s->L + 1, sizeof *unit_sum);   /* S * U of each unit */
    for (int i = 0; i < llama_num_params(c); i++) {
        param_spec sp = llama_param_spec(c, i);
        int r0, nr, c0, nc;
        shard_slice(plan->layout[sp.kind], param_split_rows(c, sp, plan->layout[sp.kind], p), sp.cols, r, p, &r0, &nr,
                    &c0, &nc);   /* (the vocabulary's rows padded over tp: 02) */
        size_t units = sp.is_vector ? (size_t)nc : (size_t)nr, width = sp.is_vector ? 1 : (size_t)nc;
        size_t shard = (units + s->S - 1) / s->S * width;
        unit_sum[sp.layer < 0 ? s->L : sp.layer] += (size_t)s->S * shard;
    }
    size_t layer_max = 0;
    for (int u = 0; u < s->L; u++) if (unit_sum[u] > layer_max) layer_max = unit_sum[u];
    s->unit_padded_max = layer_max;
    s->ends_padded = unit_sum[s->L];
    s->unit_by_rank_max = layer_max > s->ends_padded ? layer_max : s->ends_padded;
    free(unit_sum);
    /* fsdp: the ends, and the layers: every one when they stay gathered from forward to backward
     * (a unit's slot then sends its reduce-scatter too); else one computing, one prefetched, and
     * one sending the reduce-scatter that overlaps the next unit's backward */
    if (o->mode == DP_FSDP) s->n_slots = 1 + (!o->reshard_after_forward ? s->L : o->prefetch ? 3 : 2);
    double floats = 0;
    if (o->mode == DP_FSDP) floats += (double)s->ends_padded + (double)(s->n_slots - 1) * layer_max;
    if (o->mode == DP_ZERO2 || o->mode == DP_FSDP) floats += (double)s->ends_padded + layer_max;
    if (o->mode != DP_DDP) floats += (double)s->unit_by_rank_max * (s->S + 1) / s->S;   /* stage_in, stage_out */
    s->planned_bytes = 4 * floats;
    plan_add_buffer_bytes(plan, &data_parallel_technique, s->planned_bytes);
}

/* The transient buffers (MEM_BUFFERS), allocated at the plan's first use, after run_model's check. */
static void ensure_buffers(dp_state *s) {
    if (s->allocated) return;
    s->allocated = true;
    size_t before = mem_current(MEM_BUFFERS), layer_max = s->unit_padded_max, ends = s->ends_padded;
    if (s->o.mode == DP_FSDP) {
        s->slots = calloc(s->n_slots, sizeof *s->slots);
        for (int k = 0; k < s->n_slots; k++) {
            s->slots[k].data = device_alloc_floats(k == 0 ? ends : layer_max, MEM_BUFFERS);
            s->slots[k].unit = SLOT_FREE;
        }
    }
    if (s->o.mode == DP_ZERO2 || s->o.mode == DP_FSDP) {
        s->grad_full[0] = device_alloc_floats(ends, MEM_BUFFERS);
        s->grad_full[1] = device_alloc_floats(layer_max, MEM_BUFFERS);
    }
    if (s->o.mode != DP_DDP) {
        s->stage_in = device_alloc_floats(s->unit_by_rank_max, MEM_BUFFERS);
        s->stage_out = device_alloc_floats(s->unit_by_rank_max / s->S, MEM_BUFFERS);
    }
    s->measured_bytes = (double)(mem_current(MEM_BUFFERS) - before);
}

double data_parallel_buffer_bytes(const llama_plan *plan) {
    const dp_state *s = plan_state(plan, &data_parallel_technique);
    return !s ? 0 : s->allocated ? s->measured_bytes : 0;
}

/* The marks read as seconds since the step began (waiting for the device to get there). A
 * collective issued in the previous pass (a reduce-scatter finished late) starts at 0. */
const dp_event *dp_timeline(const llama_plan *plan, int *n) {
    dp_state *s = plan_state(plan, &data_parallel_technique);
    double t_step0 = device_mark_seconds(&s->t_step0);
    for (int i = 0; i < s->n_events; i++) {
        dp_event *e = &s->events[i];
        e->t0 = fmax(device_mark_seconds(&e->m0), t_step0) - t_step0;
        e->t1 = device_mark_seconds(&e->m1) - t_step0;
    }
    *n = s->n_events;
    return s->events;
}

/* --fault skip-grad-reduce: the gradient reduction is left out. ddp keeps each rank's own
 * gradient; the sharded modes keep their own chunk of it instead of the sum over ranks. */
static comm_request keep_own_chunk(comm_group *g, const float *send, float *recv, size_t count) {
    device_copy(recv, send + (size_t)g->rank * count, count * sizeof(float));
    return (comm_request){0};   /* complete: nothing was sent */
}
static comm_request keep_own_gradient(comm_group *g, float *buf, size_t count, comm_op op) {
    return (comm_request){0};   /* a request that is already complete: nothing was sent */
}
static const char *skip_grad_reduce(llama_plan *p) {
    dp_state *s = plan_state(p, &data_parallel_technique);
    s->reduce_scatter = keep_own_chunk;
    s->all_reduce = keep_own_gradient;
    return NULL;
}
const plan_fault data_parallel_faults[] = {
    {"skip-grad-reduce", "the gradients are not summed over the data-parallel ranks", skip_grad_reduce},
    {0}};

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
