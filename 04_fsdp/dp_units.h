/* dp_units.h: what the four modes of data parallelism share (dp_units.c: a unit by rank and by
 * tensor, the collectives on one unit, the groups, the timeline, the transient buffers, the
 * fault), and the modes' apply functions (ddp.c, zero.c, fsdp.c), which data_parallel_apply
 * dispatches to.
 *
 * A mode's state starts with a dp_state (its first member), so that the plan's stack, the
 * timeline and the faults find the shared part with plan_state(plan, &data_parallel_technique);
 * what only one mode holds (DDP's buckets, FSDP's slots) is in its own state, in its file.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "comm.h"
#include "device.h"
#include "model.h"
#include "data_parallel.h"

#define MAX_EVENTS 4096

/* A unit's collectives move up to two parts, each over its own shard group: part 0 the tensors
 * split over the plan's shard group (dp_shard, or dp_shard x cp), part 1 those split over a
 * narrower one (09's experts, over the ranks of the shard group that hold the same experts:
 * params.h's param_shard_dims_of). Each part is a unit by rank of its own, [S_q, U_q]; a unit by
 * rank is part 0's then part 1's, and this rank's shards of the unit are U_0 then U_1 floats, as
 * the sharded blocks store them. */
enum { DP_PARTS = 2 };
typedef struct {
    comm_group *group;                 /* its shard group, S_q ranks (NULL: the plan has no part 1) */
    size_t floats;                     /* U_q: this rank's shards of the part's tensors          */
    size_t by_rank_at;                 /* where its [S_q, U_q] starts in the unit by rank          */
    size_t shards_at;                  /* where its U_q start in this rank's U_0 + U_1              */
} unit_part;

struct dp_state {
    dp_options o;
    int L, S, R;
    comm_group *shard, *replicate, *batch;
    comm_group *part_group[DP_PARTS];  /* [0] shard; [1] the experts' own shard group (09), NULL
                                        * when there is none (no experts, or held whole)          */
    param_table *t;                    /* the model's table, known from the first acquire */
    size_t unit_padded_max, ends_padded;   /* floats of a gathered layer / the ends     */
    float *grad_full[2];               /* zero2, fsdp: a unit's full gradients [0] ends, [1] a layer */
    float *stage_in, *stage_out;       /* [S_0 U_0 + S_1 U_1], [U_0 + U_1] for the largest unit:
                                        * a unit by rank (what its collectives move), and this
                                        * rank's shards of it                                   */
    size_t unit_by_rank_max;           /* S_0 U_0 + S_1 U_1 of the largest unit               */
    size_t unit_shards_max;            /* U_0 + U_1 of the largest unit                       */
    /* zero2, fsdp: the reduce-scatter in flight, at most one: issued after a unit's backward and
     * waited for after the next one's (or when its buffers or the gradients are needed), so it
     * overlaps that backward. Its send buffer, the unit by rank (a slot under fsdp, stage_in
     * under zero2), and stage_out stay busy until then. */
    comm_request rs_req[DP_PARTS];     /* one per part                                         */
    int rs_unit;                       /* its unit, -1: none in flight                         */
    device_mark rs_issued;
    /* the gradient reductions, typed (comm.h's comm_ireduce_scatter_typed, comm_iall_reduce_typed),
     * which a fault may replace; they move the gradients as grad_wire: fp32, the gradients' own
     * buffers, or bf16 (--reduce-dtype bf16), the bf16 copies below */
    comm_request (*reduce_scatter)(comm_group *g, dtype t, const void *send, void *recv, size_t count);
    comm_request (*all_reduce)(comm_group *g, dtype t, void *buf, size_t count, comm_op op);
    dtype grad_wire;                   /* o.reduce_type (--fault grad-reduce-bf16: bf16 whatever)  */
    void *wire_in, *wire_out;          /* bf16 only: the copies that move, as stage_in and stage_out
                                        * for the largest unit (zero1, zero2, fsdp), or wire_in [the whole
                                        * gradient block] (ddp: each bucket at its offset)        */
    size_t whole_floats;               /* the floats of this rank's whole gradient block (ddp)   */
    /* what the plan underneath owes after backward (chapter 03's norm gradients over tp, chapter
     * 06's all-reduce over cp), run on the reduced (or sharded) gradients; NULL: nothing */
    grad_reduce_ops below_reduce;
    device_mark t_step0, t_acquired;   /* marks of the compute stream (device.h): on the GPU the
                                        * host's clock says when work was queued, not when it ran */
    double planned_bytes;              /* the transient buffers' bytes, known before allocating  */
    bool planning;                     /* `allocate` runs as a count (dp_plan_buffers)           */
    double measured_bytes;             /* what allocating them added to MEM_BUFFERS              */
    bool allocated;                    /* the buffers are allocated (dp_ensure_buffers)          */
    bool whole_held;                   /* some tensors are held whole by every shard rank (09's
                                        * experts under FSDP with ep = S: dp_moves); their
                                        * gradients are the technique's that split them (09 sums
                                        * them over dp_replicate), as the tensors are            */
    dp_event events[MAX_EVENTS];
    int n_events;
};

/* The modes: each pushes its state (a dp_state first) on the plan and installs its operators. */
void ddp_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const dp_options *o);
void zero1_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const dp_options *o);
void zero2_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const dp_options *o);
void fsdp_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const dp_options *o);
/* Their states freed (data_parallel_technique's free dispatches on the mode). */
void ddp_free(dp_state *s);
void zero_free(dp_state *s);
void fsdp_free(dp_state *s);

/* ---- the plan: state, groups, storage, operators, buffers (dp_units.c) ---- */
dp_state *dp_push(llama_plan *plan, device_mesh *mesh, const llama_config *c, const dp_options *o,
                  size_t state_bytes, const block_storage storage[PARAM_NBLOCKS]);
void dp_install(llama_plan *plan, dp_state *s, weight_ops weights, grad_reduce_ops reduce, optimizer_ops optimizer);
void dp_plan_buffers(llama_plan *plan, dp_state *s, void (*allocate)(dp_state *s));
float *dp_buffer_floats(dp_state *s, size_t n);
void *dp_buffer_elems(dp_state *s, size_t n, dtype t);
void dp_ensure_buffers(dp_state *s, void (*allocate)(dp_state *s));
void dp_allocate_grad_full(dp_state *s);
void dp_allocate_stages(dp_state *s);
void dp_free_shared(dp_state *s);
void dp_acquire_resident(dp_state *s, llama_model *m, int u, bool backward, unit_weights *w, unit_weights *g);
void dp_compute_event(dp_state *s, int u, bool backward);
void dp_reduce_below(dp_state *s, const llama_plan *p, llama_model *m);

/* ---- the timeline ---- */
void dp_event_add(dp_state *s, const char *lane, device_mark *start, const char *fmt, int arg);
void dp_mark_now(device_mark *m);

/* ---- a unit, its layouts and its collectives ---- */
/* A tensor's padded size: S_q shards (its shard group's ranks) of shard_units rows (elements) of
 * `width`. */
static inline size_t dp_padded(const param_tensor *x) {
    return (size_t)x->shard_ranks * x->shard_units * x->width;
}
static inline size_t dp_shard_of(const param_tensor *x) { return (size_t)x->shard_units * x->width; }
/* Whether a unit's collectives move tensor x: split over its shard group, and stored on this
 * pipeline stage. A tensor that each rank of the shard group holds whole (09's experts when ep
 * takes the whole shard group: params.h's held_whole) is neither gathered nor reduce-scattered: its
 * values and gradients are used where the table stores them, and its gradient's sum over the
 * ranks that hold the same one is left to the technique that split it (09's, over dp_replicate). */
static inline bool dp_moves(const dp_state *s, const param_tensor *x) {
    return param_sharded_here(x);
}
/* Unit u's parts on this rank: each part's group, its U_q and where it lies (DP_PARTS of them; a
 * part with nothing here has floats 0). Returns U_0 + U_1. */
size_t unit_parts(const dp_state *s, int u, unit_part part[DP_PARTS]);
size_t unit_shard_floats(const dp_state *s, int u);
void unit_copy(dp_state *s, int u, float *by_rank, float *by_tensor, float *whole, bool to_ranks);
comm_request gather_shards(dp_state *s, comm_group *g, const float *shards, float *by_rank, size_t count);
comm_request start_grad_reduce(dp_state *s, const unit_part *part, const float *by_rank);
void finish_grad_reduce(dp_state *s, comm_request *req, int n_req, size_t count);
void *grad_wire_send(const dp_state *s, float *g, void *wire, size_t n);
void grad_wire_back(const dp_state *s, float *g, const void *wire, size_t n);

/* ---- zero2, fsdp: a unit's full gradients and their overlapped reduce-scatter ---- */
void full_grads(dp_state *s, int u, unit_weights *g);
void start_unit_reduce(dp_state *s, int u, float *by_rank);
void finish_unit_reduce(dp_state *s);
