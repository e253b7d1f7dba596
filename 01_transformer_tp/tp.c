/* tp.c: Megatron tensor parallelism as a plan (see tp.h). The layer itself is common/model/
 * model.c, the same code the single-device baseline runs; this file says only how the weights
 * are split and what the boundaries of the tensor-parallel region do.
 */
#include <stdio.h>
#include "../00_naive_tp_mlp/tensor_parallel.h"
#include "comm.h"
#include "tp.h"

void megatron_layouts(shard_layout layout[P_NKINDS]) {
    for (int k = 0; k < P_NKINDS; k++) layout[k] = SHARD_REPLICATED;
    /* BEGIN ASSIGNMENT: choose the layout of the attention and feed-forward weights */
    layout[P_WQ] = layout[P_WK] = layout[P_WV] = SHARD_ROWS;   /* column-parallel: split the outputs */
    layout[P_W1] = layout[P_W3] = SHARD_ROWS;
    layout[P_WO] = layout[P_W2] = SHARD_COLS;                  /* row-parallel: split the inputs     */
    /* END ASSIGNMENT */
}

/* The region's operators are chapter 00's f and g. The sequence stays whole (seq_shards = 1),
 * so the model hands the same buffer as local and full: each works in place on B*Ts*C floats. */
static void f_forward(void *state, const llama_plan *p, float *x_full, const float *x_local, int B, int Ts, int C) {
    tp_copy_to_region_forward(p->groups.tp, x_full, (size_t)B * Ts * C);        /* identity */
}
static void f_backward(void *state, const llama_plan *p, float *dx_local, float *dx_full, int B, int Ts, int C) {
    /* BEGIN ASSIGNMENT: f backward: the input's gradient is the sum of every rank's share (chapter 00's f) */
    tp_copy_to_region_backward(p->groups.tp, dx_full, (size_t)B * Ts * C);      /* all-reduce of the partial dx */
    /* END ASSIGNMENT */
}
static void g_forward(void *state, const llama_plan *p, float *y_local, float *y_partial, int B, int Ts, int C) {
    /* BEGIN ASSIGNMENT: g forward: the row-parallel outputs are partial sums (chapter 00's g) */
    tp_reduce_from_region_forward(p->groups.tp, y_partial, (size_t)B * Ts * C); /* all-reduce of the partial y */
    /* END ASSIGNMENT */
}
static void g_backward(void *state, const llama_plan *p, float *dy_full, const float *dy_local, int B, int Ts, int C) {
    tp_reduce_from_region_backward(p->groups.tp, dy_full, (size_t)B * Ts * C);  /* identity */
}
const region_ops megatron_region = {NULL, f_forward, f_backward, g_forward, g_backward};

const plan_technique megatron_technique = {"megatron tp", NULL};

llama_plan megatron_plan(device_mesh *mesh, const llama_config *c) {
    /* (whole heads and whole ffn units per rank, or the split does not exist: mesh_check) */
    llama_plan plan = plan_single_device();
    plan_push(&plan, &megatron_technique, NULL, 0);
    plan.groups.mesh = mesh;
    plan.groups.tp = mesh->group[MESH_TP];
    megatron_layouts(plan.layout);
    plan.region = megatron_region;
    return plan;
}

llama_plan tensor_parallel_or_single(device_mesh *mesh, const llama_config *c) {
    int tp = mesh->group[MESH_TP]->size;
    if (tp == 1) return plan_single_device();
    return megatron_plan(mesh, c);
}

/* --fault skip-backward-allreduce: f's backward forgets to sum the ranks' partial gradients.
 * Every weight gradient stays right (each rank's dW uses its own inputs); dX and everything
 * below the first f go wrong. */
static const char *skip_backward_allreduce(llama_plan *p) {
    p->region.enter_backward = region_identity.enter_backward;   /* no all-reduce: each rank keeps its share */
    return NULL;
}
const plan_fault megatron_faults[] = {
    {"skip-backward-allreduce", "f's backward all-reduce is left out", skip_backward_allreduce},
    {0}};

/* ---- the mesh's rule (tp.h) ---- */

static const char *tp_divides_heads_and_ffn(const mesh_rule *r, const mesh_view *v, char *why, size_t len) {
    long long heads = r->size[0], kv_heads = r->size[1], ffn = r->size[2];
    int T = v->s.tp;
    const char *tp = v->degree[MESH_TP];
    char valid[96];
    if (heads % T)
        return mesh_refuse(why, len, "%s does not divide %s %lld: each tp rank computes whole query heads; use a tp "
                           "that divides %lld", tp, mesh_size_name(v, "--n-heads", "n_heads"), heads, heads);
    if (kv_heads % T)
        return mesh_refuse(why, len, "%s does not divide %s %lld: each tp rank holds whole key/value heads; use a tp "
                           "that divides %lld", tp, mesh_size_name(v, "--n-kv-heads", "n_kv_heads"), kv_heads,
                           kv_heads);
    if (ffn % T)
        return mesh_refuse(why, len, "%s does not divide %s %lld: w1 and w3 are split by rows, w2 by columns; %s", tp,
                           mesh_size_name(v, "--ffn-dim", "ffn_dim"), ffn,
                           mesh_nearest(valid, sizeof valid, "size", ffn, T));
    return NULL;
}

mesh_rule tp_mesh_rule(const llama_config *c) {
    return (mesh_rule){.check = tp_divides_heads_and_ffn, .size = {c->n_heads, c->n_kv_heads, c->ffn_dim}};
}
