/* dp_units.c: what DDP, ZeRO-1, ZeRO-2 and FSDP share (dp_units.h): the plan's common state (the
 * groups, the batch split over dp_replicate x dp_shard, the parameter table, the timeline, the
 * gradient reductions a fault may replace, the reduction of the plan underneath), the transient
 * buffers' planning and allocation, a unit in its two layouts, and the collectives on one unit:
 * the all-gather of its shards, the reduce-scatter of its gradients (with HSDP's all-reduce over
 * the replicas), and the reduce-scatter that overlaps the next unit's backward (zero2, fsdp).
 *
 * Every collective moves one unit (a layer, or the model's ends): each tensor is S chunks (rows,
 * rank-major), and a unit's collective moves every rank's chunks of all its tensors at once, laid
 * out by rank (unit_copy below): one call per unit instead of one per tensor, as FSDP2 moves a
 * module's parameters, so that the per-call costs (on a GPU a kernel launch and NCCL's
 * synchronisation) are paid per unit (README, "One collective per unit"). The S ranks are the
 * shard group: dp_shard, or dp_shard x cp (shard_over_cp, chapter 08). A tensor sharded over a
 * narrower group (chapter 09's experts, over the ranks that hold the same experts) is moved in a
 * unit's second part, by a second collective over that group (dp_units.h's unit_part).
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
#include "dp_units.h"

/* An event from the mark `*start` (moved into the event) to now; dp_timeline reads the times. */
void dp_event_add(dp_state *s, const char *lane, device_mark *start, const char *fmt, int arg) {
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
void dp_mark_now(device_mark *m) {
    device_mark_release(m);
    *m = device_mark_now();
}

/* ==============================================================================================
 * A unit in the two layouts (FSDP2's copy-in and copy-out). Each tensor x is S chunks of
 * dp_shard_of(x) floats; U is the sum of them over the unit's tensors, a rank's share of the unit.
 *
 *   by tensor  [ wq: chunk 0 | chunk 1 | ... | chunk S-1 ][ wk: chunk 0 | ... ] ...   what the
 *              model computes with: each tensor whole (padded), one after the other
 *   by rank    [ rank 0: wq's chunk 0, wk's chunk 0, ... ][ rank 1: wq's chunk 1, ... ] ...   [S, U]
 *
 * Rank r's row of the by-rank layout is exactly what the sharded blocks store (params.h: a unit's
 * tensors lie one after the other), so the unit's all-gather sends the stored shards as they are,
 * and its reduce-scatter hands each rank the gradients of its stored shards. Copying between the
 * layouts costs one strided copy per tensor (device_copy_2d). Chapter 09's experts, when sharded
 * over a narrower group of S_1 ranks, are a unit's second part: its own [S_1, U_1] by rank after
 * the first part's [S, U] (dp_units.h's unit_part), stored after the dense shards; experts held
 * whole lie after those, in neither layout.
 * ============================================================================================== */

/* U: the floats of this rank's shards of unit u (0 when none is stored here: another stage's), of
 * the tensors its collectives move (dp_moves); they lie first in the unit's range (params.h). */
size_t unit_shard_floats(const dp_state *s, int u) {
    unit_part part[DP_PARTS];
    return unit_parts(s, u, part);
}

size_t unit_parts(const dp_state *s, int u, unit_part part[DP_PARTS]) {
    int idx[PARAM_UNIT_MAX], n = param_unit_tensors(s->t, u, idx);
    for (int q = 0; q < DP_PARTS; q++) part[q] = (unit_part){.group = s->part_group[q]};
    for (int k = 0; k < n; k++) {
        const param_tensor *x = &s->t->t[idx[k]];
        if (dp_moves(s, x)) part[param_shard_part(s->t, x)].floats += dp_shard_of(x);
    }
    part[1].shards_at = part[0].floats;
    part[1].by_rank_at = part[0].floats * (size_t)(part[0].group ? part[0].group->size : 1);
    return part[0].floats + part[1].floats;
}

/* Unit u between by_rank (each part's [S_q, U_q], part 0's first) and its tensors by tensor:
 * padded one after the other from `by_tensor`, or, when by_tensor is NULL, each at its place in
 * the whole block `whole` (its real units only: the padding is dropped on the way out and zeroed
 * on the way in). to_ranks: tensors -> by_rank (copy-in); else by_rank -> tensors (copy-out). No
 * collective. */
void unit_copy(dp_state *s, int u, float *by_rank, float *by_tensor, float *whole, bool to_ranks) {
    int idx[PARAM_UNIT_MAX], n = param_unit_tensors(s->t, u, idx);
    unit_part part[DP_PARTS];
    unit_parts(s, u, part);
    size_t at[DP_PARTS] = {0}, padded_at = 0, f = sizeof(float);
    for (int k = 0; k < n; k++) {
        const param_tensor *x = &s->t->t[idx[k]];
        size_t c = dp_shard_of(x);
        if (!c || !dp_moves(s, x)) continue;   /* another stage's tensor, or one held whole */
        int q = param_shard_part(s->t, x);
        size_t U = part[q].floats, S = (size_t)x->shard_ranks;
        float *t = by_tensor ? by_tensor + padded_at : param_in(s->t, whole, idx[k]);
        size_t real = by_tensor ? dp_padded(x) : (size_t)x->units * x->width;
        size_t chunks = real / c, rest = real % c;   /* whole chunks, then part of one */
        float *r = by_rank + part[q].by_rank_at + at[q];
        if (to_ranks) {
            device_copy_2d(r, U * f, t, c * f, c * f, chunks);
            if (rest) device_copy(r + chunks * U, t + chunks * c, rest * f);
            for (size_t j = chunks; j < S; j++) {   /* padding: zeros */
                size_t from = j == chunks ? rest : 0;
                device_zero(r + j * U + from, (c - from) * f);
            }
        } else {
            device_copy_2d(t, c * f, r, U * f, c * f, chunks);
            if (rest) device_copy(t + chunks * c, r + chunks * U, rest * f);
        }
        at[q] += c;
        padded_at += dp_padded(x);
    }
}

/* ==============================================================================================
 * The two collectives of sharded data parallelism, on one unit.
 *
 * The gradients move as s->grad_wire (--reduce-dtype, FSDP2's reduce_dtype). fp32: the fp32
 * buffers themselves. bf16: each rank's fp32 gradients are rounded to a bf16 copy (wire_in), the
 * collective sends and sums those (in fp32, rounded once per combining step: comm.h), and the
 * sums (wire_out) are widened back to fp32 after the wait. Half the bytes move; each rank's
 * gradient and every partial sum lose the bits below bf16's 8 (README, "Reducing in bf16").
 * ============================================================================================== */

/* What a gradient collective sends: the fp32 gradients g [n] themselves, or under a bf16
 * reduction their copy rounded into wire [n] (bf16). No collective. */
void *grad_wire_send(const dp_state *s, float *g, void *wire, size_t n) {
    if (s->grad_wire == DTYPE_F32) return g;
    cast_to_bf16(wire, g, n);
    return wire;
}

/* After a gradient collective's wait: under a bf16 reduction, its bf16 sums wire [n] widened back
 * into g [n] (fp32); under fp32 the sums are already there (wire is g). No collective. */
void grad_wire_back(const dp_state *s, float *g, const void *wire, size_t n) {
    if (s->grad_wire != DTYPE_F32) cast_from_bf16(g, wire, n);
}

/* Where a unit's summed gradients land as they move: s->stage_out, or its bf16 twin wire_out,
 * from element `at` on. */
static void *moved_sums(const dp_state *s, size_t at) {
    return s->grad_wire == DTYPE_F32 ? (void *)(s->stage_out + at) : (char *)s->wire_out + at * dtype_size(s->grad_wire);
}

/* Every rank's shards over the shard group g (S ranks): by_rank [S, count] from shards [count]
 * (this rank's row). Issues: 1 all-gather of S * count floats over g, non-blocking: wait on the
 * request. */
comm_request gather_shards(dp_state *s, comm_group *g, const float *shards, float *by_rank, size_t count) {
    comm_request req = {0};   /* a request with nothing in flight */
    /* BEGIN ASSIGNMENT: start the all-gather of every rank's shards of one unit into the by-rank buffer */
    req = comm_iall_gather(g, shards, by_rank, count);
    /* END ASSIGNMENT */
    return req;
}

/* The gradients of this rank's shards of one part of a unit, summed over the part's shard group
 * (under shard_over_cp, over the cp ranks too: chapter 06's sum rides in it), in two parts around
 * the overlapped backward. start: by_rank, this rank's full gradients of the unit laid out by rank
 * (the part's [S_q, U_q] at part->by_rank_at; row r: the chunks rank r's shards cover) -> row r of
 * this rank summed over the S_q ranks, in flight, landing in the part's place of `sums`:
 * s->stage_out (fp32), or its bf16 twin s->wire_out, which the send buffer `send` (by_rank, or
 * its bf16 copy wire_in) matches. Issues: 1 reduce-scatter of S_q U_q elements of s->grad_wire
 * over the part's group, non-blocking: finish_grad_reduce waits on it. */
comm_request start_grad_reduce(dp_state *s, const unit_part *part, const float *by_rank) {
    comm_request req = {0};
    size_t S = (size_t)part->group->size, count = part->floats;
    void *wire = s->wire_in ? (char *)s->wire_in + part->by_rank_at * dtype_size(s->grad_wire) : NULL;
    const void *send = grad_wire_send(s, (float *)by_rank + part->by_rank_at, wire, S * count);
    void *sums = moved_sums(s, part->shards_at);
    /* BEGIN ASSIGNMENT: start the reduce-scatter of the part's full gradients over its shard group (send, as s->grad_wire, into sums) */
    req = s->reduce_scatter(part->group, s->grad_wire, send, sums, count);
    /* END ASSIGNMENT */
    return req;
}

/* finish: waits for the reduce-scatters (n_req, one a part); under HSDP the sums, count elements
 * of both parts, are then summed over the replicas too, in place (in s->grad_wire, as the
 * reduce-scatters: the replicas of an expert's shard are dp_replicate's too); then s->stage_out
 * [count] holds them in fp32. Issues: under HSDP 1 all-reduce of count elements of s->grad_wire
 * over dp_replicate. */
void finish_grad_reduce(dp_state *s, comm_request *req, int n_req, size_t count) {
    comm_wait_all(req, n_req);
    void *sums = moved_sums(s, 0);
    /* BEGIN ASSIGNMENT: all-reduce this rank's summed shards over dp_replicate (HSDP; sums, as s->grad_wire) */
    if (s->R > 1) comm_all_reduce_typed(s->replicate, s->grad_wire, sums, count, COMM_SUM);
    /* END ASSIGNMENT */
    grad_wire_back(s, s->stage_out, sums, count);
}

/* ==============================================================================================
 * zero2, fsdp: a unit's full gradients during its backward, reduce-scattered right after it.
 * ============================================================================================== */

/* Unit u's gradient views *w (the table's, dp_acquire_resident), those of the tensors its
 * collectives move replaced by views of a zeroed full-size buffer for its backward: grad_full[0]
 * [ends' padded floats] for the ends, grad_full[1] [a layer's] for a layer. A tensor held whole
 * keeps the table's view: its backward adds into its stored gradient. No collective. */
void full_grads(dp_state *s, int u, unit_weights *w) {
    float *g = s->grad_full[u == s->L ? 0 : 1];
    int idx[PARAM_UNIT_MAX], n = param_unit_tensors(s->t, u, idx);
    for (int k = 0; k < n; k++) {
        const param_tensor *x = &s->t->t[idx[k]];
        if (!dp_moves(s, x)) continue;
        device_zero(g, dp_padded(x) * sizeof(float));
        w->of[x->spec.kind] = g;
        g += dp_padded(x);
    }
}

/* After unit u's backward, the previous unit's reduce-scatter finished (finish_unit_reduce):
 * u's full gradients (by tensor, grad_full) copied in by rank into by_rank [S_0 U_0 + S_1 U_1],
 * which stays busy until the reduce-scatters are finished, and their reduce-scatters started into
 * stage_out [U_0 + U_1]. Issues: 1 reduce-scatter of S_q U_q floats per part over its shard group
 * (the experts' own: a second), non-blocking. */
void start_unit_reduce(dp_state *s, int u, float *by_rank) {
    unit_part part[DP_PARTS];
    unit_parts(s, u, part);
    unit_copy(s, u, by_rank, s->grad_full[u == s->L ? 0 : 1], NULL, true);
    dp_mark_now(&s->rs_issued);
    for (int q = 0; q < DP_PARTS; q++)
        s->rs_req[q] = part[q].floats ? start_grad_reduce(s, &part[q], by_rank) : (comm_request){0};
    s->rs_unit = u;
}

/* The reduce-scatters in flight, finished: their sums stage_out [U] added into unit rs_unit's
 * gradient shards [U] (U = U_0 + U_1); the send buffer is free again. Waits; issues under HSDP 1
 * all-reduce of U floats over dp_replicate (finish_grad_reduce). */
void finish_unit_reduce(dp_state *s) {
    if (s->rs_unit < 0) return;
    size_t U = unit_shard_floats(s, s->rs_unit), off, count;
    finish_grad_reduce(s, s->rs_req, DP_PARTS, U);
    param_unit_range(s->t, s->t->grads, s->rs_unit, &off, &count);   /* the moved tensors' shards: its first U */
    add_inplace(s->t->grads + off, s->stage_out, U);
    dp_event_add(s, "comm", &s->rs_issued, s->rs_unit == s->L ? "reduce_scatter ends" : "reduce_scatter %d", s->rs_unit);
    s->rs_unit = -1;
}

/* ==============================================================================================
 * The plan: the state, the groups, the storage, the operators and the transient buffers.
 * ============================================================================================== */

/* S_0 U_0 + S_1 U_1 and U_0 + U_1 of each unit [L + 1] (the ends last), from the layout the
 * model's table will have (params.h: each tensor's tp slice, its first dimension split in S_q
 * chunks of ceil(units / S_q) over its shard group), computed without allocating anything. */
static void plan_unit_sizes(dp_state *s, const llama_plan *plan, device_mesh *mesh, const llama_config *c) {
    size_t *unit_sum = calloc((size_t)s->L + 1, sizeof *unit_sum);      /* S_0 U_0 + S_1 U_1 of each unit */
    size_t *unit_shards = calloc((size_t)s->L + 1, sizeof *unit_shards);   /* U_0 + U_1 */
    for (int i = 0; i < llama_num_params(c); i++) {
        param_spec sp = llama_param_spec(c, i);
        unsigned dims = param_shard_dims_of(&mesh->shape, sp.kind, plan->groups.shard_dims, plan->groups.expert_dims);
        if (param_held_whole(&mesh->shape, sp.kind, plan->groups.shard_dims, plan->groups.expert_dims)) {
            s->whole_held = true;   /* held whole: moved by no unit's collective (09's experts, ep = S) */
            continue;
        }
        int r0, nr, c0, nc;
        bool even;   /* (the table checks it) */
        param_rank_slice(c, mesh, plan->groups.expert_dims, plan->layout[sp.kind], sp, &r0, &nr, &c0, &nc, &even);
        size_t units = sp.is_vector ? (size_t)nc : (size_t)nr, width = sp.is_vector ? 1 : (size_t)nc;
        size_t S = (size_t)mesh_size_over(&mesh->shape, dims), shard = (units + S - 1) / S * width;
        int u = sp.layer < 0 ? s->L : sp.layer;
        unit_sum[u] += S * shard;
        unit_shards[u] += shard;
        s->whole_floats += units * width;
    }
    size_t layer_max = 0;
    for (int u = 0; u < s->L; u++) if (unit_sum[u] > layer_max) layer_max = unit_sum[u];
    for (int u = 0; u <= s->L; u++) if (unit_shards[u] > s->unit_shards_max) s->unit_shards_max = unit_shards[u];
    s->unit_padded_max = layer_max;
    s->ends_padded = unit_sum[s->L];
    s->unit_by_rank_max = layer_max > s->ends_padded ? layer_max : s->ends_padded;
    free(unit_sum);
    free(unit_shards);
}

/* Pushes a mode's state ([state_bytes], a dp_state first) on the plan with the batch split over
 * dp_replicate x dp_shard, the shard group (dp_shard, or dp_shard x cp; under shard_over_replicate
 * dp_replicate x those, with no replicas left) and the mode's storage, and sizes the units
 * (plan_unit_sizes). Creates the groups "dp", the shard group when it spans more than dp_shard,
 * and 09's experts' own when they have one; no collective on the data. */
dp_state *dp_push(llama_plan *plan, device_mesh *mesh, const llama_config *c, const dp_options *o,
                  size_t state_bytes, const block_storage storage[PARAM_NBLOCKS]) {
    dp_state *s = plan_push(plan, &data_parallel_technique, calloc(1, state_bytes), 0);
    s->o = *o;
    s->L = c->n_layers;
    /* the shard group: dp_shard, or dp_shard x cp, whose ranks hold the same parameters too but
     * compute the gradients of other rows of the same sequences (chapter 06 splits them) */
    bool over_cp = o->shard_over_cp && mesh->shape.cp > 1;
    if (over_cp && !plan->groups.cp)
        comm_exit_usage("data_parallel_apply: sharding over dp_shard x cp needs context parallelism applied first (the "
                        "cp ranks must split the sequences, or the sum over cp counts each gradient %d times)",
                        mesh->shape.cp);
    /* (09's --full-shard: the replicas share the shards too, every data rank one shard group) */
    bool over_replicate = o->shard_over_replicate && mesh->shape.dp_replicate > 1;
    int shard_dims[3], n_dims = 0;
    if (over_replicate) shard_dims[n_dims++] = MESH_DP_REPLICATE;
    shard_dims[n_dims++] = MESH_DP_SHARD;
    if (over_cp) shard_dims[n_dims++] = MESH_CP;
    const char *shard_name = over_replicate ? (over_cp ? "dp x cp" : "dp (shard)") : "dp_shard x cp";
    s->shard = n_dims > 1 ? mesh_group_over(mesh, shard_dims, n_dims, shard_name) : mesh->group[MESH_DP_SHARD];
    s->replicate = mesh->group[MESH_DP_REPLICATE];
    s->S = s->shard->size;
    s->R = over_replicate ? 1 : s->replicate->size;   /* (HSDP's replicas: none when they shard too) */
    static const int batch_dims[] = {MESH_DP_REPLICATE, MESH_DP_SHARD};
    s->batch = mesh_group_over(mesh, batch_dims, 2, "dp");
    s->reduce_scatter = comm_ireduce_scatter_typed;
    s->rs_unit = -1;
    s->all_reduce = comm_iall_reduce_typed;
    s->grad_wire = o->reduce_type;
    plan->groups.mesh = mesh;
    plan->groups.batch = s->batch;
    plan->groups.shard = s->shard;
    plan->groups.shard_dims = MESH_BIT(MESH_DP_SHARD) | (over_cp ? MESH_BIT(MESH_CP) : 0) |
                              (over_replicate ? MESH_BIT(MESH_DP_REPLICATE) : 0);
    memcpy(plan->storage, storage, sizeof plan->storage);
    /* declared for the techniques below (06's sum over cp): the gradients' reduction sums over the
     * data ranks, and over cp too when the gradients are reduce-scattered into shards over it */
    plan->groups.grads_summed_dims |= MESH_BIT(MESH_DP_REPLICATE) | MESH_BIT(MESH_DP_SHARD) |
                                      (over_cp && storage[PARAM_GRADS] != STORE_WHOLE ? MESH_BIT(MESH_CP) : 0);
    /* 09's experts, split over the ranks of plan->groups.expert_dims already: sharded over the
     * rest of the shard group, the ranks that hold the same experts (their own shard group, a unit's
     * part 1), or held whole when there is no rest (ep = S: param_held_whole), their gradients
     * then summed by the technique that split them. A shard group narrower than the experts'
     * split would leave the dense tensors' sum over the other expert ranks (cp) to a reduction
     * that would sum different experts too. */
    unsigned experts = plan->groups.expert_dims;
    if (experts && (experts & ~plan->groups.shard_dims))
        comm_exit_usage("data_parallel_apply: the shard group (%s) does not span the ranks the experts are split over; "
                        "shard over them and more (dp_shard x cp under --ep-over-cp)", s->shard->name);
    s->part_group[0] = s->shard;
    /* the experts' own shard group, when it is neither the whole shard group (ep 1) nor one rank
     * (held whole): a communicator of its own even over one mesh dimension, so that its traffic
     * is counted apart */
    unsigned rest = param_shard_dims_of(&mesh->shape, P_EXPERT_W1, plan->groups.shard_dims, experts);
    if (experts && rest != plan->groups.shard_dims && mesh_size_over(&mesh->shape, rest) > 1) {
        int dims[MESH_NDIMS], n = 0;
        for (int d = 0; d < MESH_NDIMS; d++) if (rest & MESH_BIT(d)) dims[n++] = d;
        s->part_group[1] = mesh_group_over(mesh, dims, n, "expert shard");
    }
    plan_unit_sizes(s, plan, mesh, c);
    if ((s->whole_held || s->part_group[1]) && o->mode != DP_FSDP)
        comm_exit_usage("data_parallel_apply: the experts, split over the shard ranks already, are built for fsdp "
                        "only, not %s", dp_mode_name(o->mode));
    return s;
}

/* The mode's operators installed: weight access, the gradient reduction (over the plan
 * underneath's, which it calls: dp_reduce_below) and the optimizer step. */
void dp_install(llama_plan *plan, dp_state *s, weight_ops weights, grad_reduce_ops reduce, optimizer_ops optimizer) {
    plan->weights = weights;
    plan_wrap(plan->reduce_grads, s->below_reduce, reduce);
    plan->optimizer = optimizer;
}

/* The transient buffers' bytes, known before allocating: the mode's `allocate` (NULL: none) run
 * as a count, which adds up the floats it asks dp_buffer_floats for and allocates nothing. run_model
 * checks them (plan_buffer_bytes) with the model's own bytes before anything is allocated, and
 * dp_ensure_buffers allocates them at first use. */
void dp_plan_buffers(llama_plan *plan, dp_state *s, void (*allocate)(dp_state *s)) {
    s->planned_bytes = 0;
    s->planning = true;
    if (allocate) allocate(s);
    s->planning = false;
    plan_add_buffer_bytes(plan, &data_parallel_technique, s->planned_bytes);
}

/* A transient buffer of n elements of t (MEM_BUFFERS); while dp_plan_buffers counts, only its
 * bytes (NULL). */
void *dp_buffer_elems(dp_state *s, size_t n, dtype t) {
    if (s->planning) {
        s->planned_bytes += (double)dtype_size(t) * (double)n;
        return NULL;
    }
    return device_alloc_elems(n, t, MEM_BUFFERS);
}
float *dp_buffer_floats(dp_state *s, size_t n) { return dp_buffer_elems(s, n, DTYPE_F32); }

/* The transient buffers (MEM_BUFFERS), allocated by the mode's `allocate` (NULL: none) at the
 * plan's first use, after run_model's check, and measured. */
void dp_ensure_buffers(dp_state *s, void (*allocate)(dp_state *s)) {
    if (s->allocated) return;
    s->allocated = true;
    size_t before = mem_current(MEM_BUFFERS);
    if (allocate) allocate(s);
    s->measured_bytes = (double)(mem_current(MEM_BUFFERS) - before);
}

/* zero2, fsdp: a unit's full gradients, grad_full[0] [ends] and grad_full[1] [a layer]. */
void dp_allocate_grad_full(dp_state *s) {
    s->grad_full[0] = dp_buffer_floats(s, s->ends_padded);
    s->grad_full[1] = dp_buffer_floats(s, s->unit_padded_max);
}

/* zero1, zero2, fsdp: stage_in [S_0 U_0 + S_1 U_1] and stage_out [U_0 + U_1] for the largest
 * unit; under a bf16 reduction their bf16 twins for the gradients, wire_in and wire_out. */
void dp_allocate_stages(dp_state *s) {
    s->stage_in = dp_buffer_floats(s, s->unit_by_rank_max);
    s->stage_out = dp_buffer_floats(s, s->unit_shards_max);
    if (s->grad_wire != DTYPE_F32) {
        s->wire_in = dp_buffer_elems(s, s->unit_by_rank_max, s->grad_wire);
        s->wire_out = dp_buffer_elems(s, s->unit_shards_max, s->grad_wire);
    }
}

/* What every mode holds, freed, and the state itself (after the mode's own). */
void dp_free_shared(dp_state *s) {
    timeline_restart(s);   /* (the marks' events back) */
    device_mark_release(&s->t_step0);
    device_mark_release(&s->t_acquired);
    device_mark_release(&s->rs_issued);
    device_free(s->grad_full[0]); device_free(s->grad_full[1]);
    device_free(s->stage_in); device_free(s->stage_out);
    device_free(s->wire_in); device_free(s->wire_out);
    free(s);
}

/* Every acquire's start: the table known, the step's timeline begun at its first acquire, and
 * the views of unit u's values and gradients where the table holds them. */
void dp_acquire_resident(dp_state *s, llama_model *m, int u, bool backward, unit_weights *w, unit_weights *g) {
    s->t = m->params;
    if (u == s->L && !backward) timeline_restart(s);   /* the first acquire of a step */
    *w = param_unit(m->params, m->params->params, u);
    *g = param_unit(m->params, m->params->grads, u);
}

/* Every release's start: unit u's compute on the timeline (the ends' is not drawn). */
void dp_compute_event(dp_state *s, int u, bool backward) {
    if (u != s->L) dp_event_add(s, "compute", &s->t_acquired, backward ? "bwd %d" : "fwd %d", u);
}

/* What the plan underneath owes (sums over other groups, which commute with the sum over the
 * data ranks), after the data ranks' reduction. */
void dp_reduce_below(dp_state *s, const llama_plan *p, llama_model *m) {
    if (s->below_reduce.reduce) s->below_reduce.reduce(s->below_reduce.state, p, m);
}

double data_parallel_buffer_bytes(const llama_plan *plan) {
    const dp_state *s = plan_state(plan, &data_parallel_technique);
    return !s ? 0 : s->allocated ? s->measured_bytes : 0;
}

comm_group *data_parallel_group_of(const llama_plan *plan, const param_table *t, const param_tensor *x) {
    const dp_state *s = plan_state(plan, &data_parallel_technique);
    if (!s || !param_sharded_here(x)) return NULL;
    return s->part_group[param_shard_part(t, x)];
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
static comm_request keep_own_chunk(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    size_t bytes = count * dtype_size(t);
    device_copy(recv, (const char *)send + (size_t)g->rank * bytes, bytes);
    return (comm_request){0};   /* complete: nothing was sent */
}
static comm_request keep_own_gradient(comm_group *g, dtype t, void *buf, size_t count, comm_op op) {
    return (comm_request){0};   /* a request that is already complete: nothing was sent */
}
static const char *skip_grad_reduce(llama_plan *p) {
    dp_state *s = plan_state(p, &data_parallel_technique);
    s->reduce_scatter = keep_own_chunk;
    s->all_reduce = keep_own_gradient;
    return NULL;
}
/* --fault grad-reduce-bf16: the gradients are summed in bf16 where fp32 was asked (mixed
 * precision's reduce_dtype, --reduce-dtype fp32): the reductions move bf16 copies, as under
 * --reduce-dtype bf16, while the options (and so the formulas) still say fp32. Half the bytes
 * move, which the traffic table's formula (4 bytes an element) catches under any --dtype, and the
 * copies' buffers the memory table's; in fp32 the gradients' parity catches it too (2^-9
 * relative). (Applied after the buffers were planned and before they are allocated: the
 * allocation sees the bf16 copies.) */
static const char *grad_reduce_bf16(llama_plan *p) {
    dp_state *s = plan_state(p, &data_parallel_technique);
    if (s->grad_wire != DTYPE_F32)
        return "the gradients are reduced in bf16 already (--reduce-dtype bf16): the fault sums them in bf16 where "
               "fp32 was asked; run it without --reduce-dtype";
    s->grad_wire = DTYPE_BF16;
    return NULL;
}
const plan_fault data_parallel_faults[] = {
    {"skip-grad-reduce", "the gradients are not summed over the data-parallel ranks", skip_grad_reduce},
    {"grad-reduce-bf16", "the gradients are summed in bf16, where fp32 was asked", grad_reduce_bf16},
    {0}};
