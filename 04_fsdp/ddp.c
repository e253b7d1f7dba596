/* ddp.c: DDP (PyTorch's DistributedDataParallel) as a plan (data_parallel.h): every rank keeps the
 * values, the gradients and AdamW's m and v whole, and the gradients are summed over every data
 * rank (dp_replicate x dp_shard: the batch group) by all-reduces while backward goes on:
 *
 *   weights.acquire / release   the table's own views; after a unit's backward its gradients,
 *                               final, join the open bucket, which is all-reduced once full
 *   reduce_grads                wait for the buckets
 *   optimizer_step              AdamW on every tensor, whole
 *
 * A bucket is a range of the whole gradient block: backward walks the layers down, and the table
 * lays them out in order, so a finished unit's gradients lie just below the open bucket. Under
 * --reduce-dtype bf16 a bucket moves as its bf16 copy, at the same offset of wire_in [the whole
 * block] (dp_units.c: grad_wire_send), widened back after its wait.
 */
#include <stdio.h>
#include <stdlib.h>
#include "comm.h"
#include "device.h"
#include "kernels.h"
#include "model.h"
#include "dp_units.h"

#define MAX_REQUESTS 256

typedef struct {
    dp_state dp;                       /* first: the shared state (dp_units.h)                    */
    /* the open bucket (a range of the whole gradient block) and the issued all-reduces */
    size_t bucket_off, bucket_count;
    comm_request reqs[MAX_REQUESTS];
    size_t req_off[MAX_REQUESTS], req_count[MAX_REQUESTS];   /* each issued bucket's range */
    device_mark req_issued[MAX_REQUESTS];
    int n_reqs;
} ddp_state;

/* ==============================================================================================
 * The finished gradients, all-reduced in buckets while backward goes on.
 * ============================================================================================== */

/* Element `off` of the gradient block as it moves: the gradients themselves, or under a bf16
 * reduction their bf16 copy wire_in (elements of s->grad_wire). */
static void *moved_at(const dp_state *s, size_t off) {
    return dtype_at(s->grad_wire == DTYPE_F32 ? (void *)s->t->grads : s->wire_in, s->grad_wire, off);
}

/* The open bucket, grads [bucket_off, bucket_off + bucket_count) of the whole block, issued, as
 * it moves (moved_at: under a bf16 reduction its range is rounded into the copy first,
 * grad_wire_send). Issues: 1 all-reduce (sum) of bucket_count elements of s->grad_wire over the
 * data ranks, non-blocking: waited for in ddp_reduce_grads. */
static void flush_bucket(ddp_state *d) {
    dp_state *s = &d->dp;
    if (!d->bucket_count) return;
    if (d->n_reqs == MAX_REQUESTS) { fprintf(stderr, "ddp: more than %d buckets\n", MAX_REQUESTS); exit(1); }
    dp_mark_now(&d->req_issued[d->n_reqs]);
    d->req_off[d->n_reqs] = d->bucket_off;
    d->req_count[d->n_reqs] = d->bucket_count;
    grad_wire_send(s, s->t->grads + d->bucket_off, moved_at(s, d->bucket_off), d->bucket_count);
    /* BEGIN ASSIGNMENT: start the all-reduce (sum over the data ranks) of the bucket's gradients (moved_at, as s->grad_wire) */
    d->reqs[d->n_reqs++] = s->all_reduce(s->batch, s->grad_wire, moved_at(s, d->bucket_off), d->bucket_count, COMM_SUM);
    /* END ASSIGNMENT */
    d->bucket_count = 0;
}

/* Unit u's gradients are final: add them to the open bucket (they lie just below it: backward
 * walks the layers down, and the table lays them out in order), issue it once it is full. */
static void bucket_unit(ddp_state *d, int u) {
    dp_state *s = &d->dp;
    size_t off, count;
    param_unit_range(s->t, s->t->grads, u, &off, &count);
    if (d->bucket_count && off + count != d->bucket_off) flush_bucket(d);
    d->bucket_off = off;
    d->bucket_count += count;
    if (d->bucket_count >= s->o.bucket_floats || u == s->L) flush_bucket(d);
}

/* (Progress while computing: on the CPU, Open MPI moves a non-blocking collective's data only
 * inside MPI calls, so the in-flight all-reduces of the buckets move between the layer's GEMMs by
 * comm_progress_in_flight, which every GEMM calls: no wrapper of the linear operator is needed
 * for it.) */

/* ==============================================================================================
 * The plan's operators.
 * ============================================================================================== */

/* ddp's buffers: none in fp32 (the buckets are ranges of the gradient block); under a bf16
 * reduction the bf16 copy of the whole block, wire_in. */
static void ddp_allocate(dp_state *s) {
    if (s->grad_wire != DTYPE_F32) s->wire_in = dp_buffer_elems(s, s->whole_floats, s->grad_wire);
}

/* Unit u's values and gradients, the table's own (whole). No collective. */
static void ddp_acquire(void *state, const llama_plan *p, llama_model *m, int u, bool backward, unit_weights *w,
                        unit_weights *g) {
    dp_state *s = state;
    dp_ensure_buffers(s, ddp_allocate);
    dp_acquire_resident(s, m, u, backward, w, g);
    dp_mark_now(&s->t_acquired);
}

/* After unit u's backward its gradients join a bucket (bucket_unit: perhaps an all-reduce). */
static void ddp_release(void *state, const llama_plan *p, llama_model *m, int u, bool backward) {
    ddp_state *d = state;
    dp_compute_event(&d->dp, u, backward);
    if (backward) bucket_unit(d, u);
}

/* Waits for every bucket's all-reduce: the gradients [whole] are the sums over the data ranks
 * (under a bf16 reduction, widened back from wire_in); then what the plan underneath owes. */
static void ddp_reduce_grads(void *state, const llama_plan *p, llama_model *m) {
    ddp_state *d = state;
    dp_state *s = &d->dp;
    dp_ensure_buffers(s, ddp_allocate);
    for (int k = 0; k < d->n_reqs; k++) {
        comm_wait(&d->reqs[k]);
        grad_wire_back(s, s->t->grads + d->req_off[k], moved_at(s, d->req_off[k]), d->req_count[k]);
        dp_event_add(s, "comm", &d->req_issued[k], "all_reduce %d", k);
    }
    d->n_reqs = 0;
    dp_reduce_below(s, p, m);
}

/* AdamW on every tensor, whole (each rank the same). No collective. */
static void ddp_optimizer_step(void *state, const llama_plan *p, llama_model *m, const adamw_config *o, int step) {
    param_adamw_step(m->params, o, step);
}

/* The buckets' issue marks given back, then the shared state freed. */
void ddp_free(dp_state *s) {
    ddp_state *d = (ddp_state *)s;
    for (int k = 0; k < MAX_REQUESTS; k++) device_mark_release(&d->req_issued[k]);
    dp_free_shared(s);
}

/* DDP on the plan: storage whole, the buckets' operators; transient buffers only under a bf16
 * reduction. */
void ddp_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const dp_options *o) {
    static const block_storage storage[PARAM_NBLOCKS] = {STORE_WHOLE, STORE_WHOLE, STORE_WHOLE};
    dp_state *s = dp_push(plan, mesh, c, o, sizeof(ddp_state), storage);
    dp_install(plan, s, (weight_ops){s, ddp_acquire, ddp_release}, (grad_reduce_ops){s, ddp_reduce_grads},
               (optimizer_ops){s, ddp_optimizer_step});
    dp_plan_buffers(plan, s, ddp_allocate);
}
