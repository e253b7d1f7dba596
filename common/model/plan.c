/* plan.c: the single-device plan and the local operators every plan starts from (plan.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "llama_kernels.h"
#include "log.h"
#include "model.h"
#include "plan.h"

/* Identity boundaries: on one device (or with the sequence whole) the model passes the same
 * buffer as local and full, and there is nothing to do. */
static void identity_forward(void *state, const llama_plan *p, float *dst, const float *src, int B, int Ts, int C) {
    if (dst != src) device_copy(dst, src, (size_t)B * Ts * C * sizeof(float));
}
static void identity_backward(void *state, const llama_plan *p, float *dst, float *src, int B, int Ts, int C) {
    identity_forward(state, p, dst, src, B, Ts, C);
}
static void identity_exit_forward(void *state, const llama_plan *p, float *y_local, float *y_partial, int B, int Ts, int C) {
    identity_forward(state, p, y_local, y_partial, B, Ts, C);
}
const region_ops region_identity = {NULL, identity_forward, identity_backward, identity_exit_forward, identity_forward};

/* The whole vocabulary on this rank, unpadded (Vl = V): the plain cross-entropy. */
static float local_loss_forward(void *state, const llama_plan *p, const float *logits, const int *targets, int N,
                                int Vl, int v0, int V, float *stats, float *scratch) {
    return cross_entropy_forward(logits, targets, N, Vl);
}
static void local_loss_backward(void *state, const llama_plan *p, float *dlogits, const float *logits,
                                const int *targets, const float *stats, int N, int Vl, int v0, int V,
                                float grad_scale) {
    cross_entropy_backward(dlogits, logits, targets, N, Vl, grad_scale);
}
const loss_ops loss_local = {NULL, 0, local_loss_forward, local_loss_backward};

static void local_attention_forward(void *state, const llama_plan *p, dtype compute, float *out, float *probs,
                                    const float *q, const float *k, const float *v, int B, int T, int H, int Hkv,
                                    int hd) {
    attention_forward_in(compute, out, probs, q, k, v, B, T, H, Hkv, hd);
}
static void local_attention_backward(void *state, const llama_plan *p, dtype compute, float *dq, float *dk, float *dv,
                                     float *dprobs, const float *dout, const float *out, const float *q,
                                     const float *k, const float *v, const float *probs, int B, int T, int H, int Hkv,
                                     int hd) {
    attention_backward_in(compute, dq, dk, dv, dprobs, dout, q, k, v, probs, B, T, H, Hkv, hd);
}
const attention_ops attention_local = {.forward = local_attention_forward, .backward = local_attention_backward,
                                       .saved_numel = NULL};   /* the softmax, B H T T */

/* The GEMMs in the site's precision (fp32, or bf16 operands accumulated in fp32: linear.c). */
static void local_linear_forward(void *state, const llama_plan *p, linear_site site, float *y, const float *x,
                                 const float *W, int N, int in, int out) {
    linear_forward_in(site.compute, y, x, W, N, in, out);
}
static void local_linear_backward(void *state, const llama_plan *p, linear_site site, float *dx, dx_write how,
                                  float *dW, const float *dy, const float *x, const float *W, int N, int in, int out) {
    linear_backward_in(site.compute, dx, how == DX_ADD ? 1.0f : 0.0f, dW, dy, x, W, N, in, out);
}
const linear_ops linear_local = {NULL, local_linear_forward, local_linear_backward};

/* The projection groups, as the model reads without a technique on them: the region's operator
 * and each linear of the group by the plan's linear operator, in order. */
static void local_in_forward(void *state, const llama_plan *p, const region_ops *region, float *x_full,
                             const float *x_local, const proj_linear *lin, int n, proj_rows r) {
    region->enter_forward(region->state, p, x_full, x_local, r.B, r.Ts, r.C);
    for (int i = 0; i < n; i++)
        p->linear.forward(p->linear.state, p, lin[i].site, lin[i].y, x_full, lin[i].W, r.B * r.T, r.C, lin[i].width);
}
static void local_in_backward(void *state, const llama_plan *p, const region_ops *region, float *dx_local,
                              float *dx_full, const float *x_full, const proj_linear *lin, int n, proj_rows r) {
    for (int i = 0; i < n; i++)   /* x_full feeds every linear: the first writes dx, the others add */
        p->linear.backward(p->linear.state, p, lin[i].site, dx_full, i == 0 ? DX_SET : DX_ADD, lin[i].dW, lin[i].dy,
                           x_full, lin[i].W, r.B * r.T, r.C, lin[i].width);
    region->enter_backward(region->state, p, dx_local, dx_full, r.B, r.Ts, r.C);
}
static void local_out_forward(void *state, const llama_plan *p, const region_ops *region, float *y_local,
                              float *y_partial, const float *x, const proj_linear *lin, proj_rows r) {
    p->linear.forward(p->linear.state, p, lin->site, y_partial, x, lin->W, r.B * r.T, lin->width, r.C);
    region->exit_forward(region->state, p, y_local, y_partial, r.B, r.Ts, r.C);
}
static void local_out_backward(void *state, const llama_plan *p, const region_ops *region, float *dx, float *dy_full,
                               const float *dy_local, const float *x, const proj_linear *lin, proj_rows r) {
    region->exit_backward(region->state, p, dy_full, dy_local, r.B, r.Ts, r.C);
    p->linear.backward(p->linear.state, p, lin->site, dx, DX_SET, lin->dW, dy_full, x, lin->W, r.B * r.T, lin->width, r.C);
}
const projection_ops proj_local = {.in_forward = local_in_forward, .in_backward = local_in_backward,
                                   .out_forward = local_out_forward, .out_backward = local_out_backward};

/* Every expert on this rank: what it sends is what it receives. */
static void local_counts(void *state, const llama_plan *p, size_t *recv, const size_t *send, int E) {
    memcpy(recv, send, (size_t)E * sizeof *recv);
}
static void local_rows(void *state, const llama_plan *p, float *recv, const size_t *recv_rows, const float *send,
                       const size_t *send_rows, int width) {
    device_copy(recv, send, send_rows[0] * (size_t)width * sizeof(float));
}
static void local_sequence_sum(void *state, const llama_plan *p, float *x, size_t n) {}
const expert_exchange_ops expert_exchange_local = {NULL, local_counts, local_rows, local_sequence_sum};

/* Every rank holds its slices for good: the tensors are the table's, nothing to gather or free. */
static void resident_acquire(void *state, const llama_plan *p, llama_model *m, int unit, bool backward,
                             unit_weights *w, unit_weights *g) {
    *w = param_unit(m->params, m->params->params, unit);
    *g = param_unit(m->params, m->params->grads, unit);
}
static void resident_release(void *state, const llama_plan *p, llama_model *m, int unit, bool backward) {}
const weight_ops weights_resident = {NULL, resident_acquire, resident_release};

bool plan_holds(const llama_plan *p, int n_layers, param_kind kind, int layer) {
    const schedule_ops *s = &p->schedule;
    if (!s->holds_layer) return true;
    if (layer >= 0) return s->holds_layer(s->state, p, layer);
    return s->holds_layer(s->state, p, kind == P_TOK_EMBEDDINGS ? 0 : n_layers - 1);   /* the ends */
}

llama_plan plan_single_device(void) {
    llama_plan p = {0};
    p.sequence.shards = 1;
    for (int k = 0; k < P_NKINDS; k++) p.layout[k] = SHARD_REPLICATED;
    p.region = region_identity;
    p.vocab = region_identity;
    p.loss = loss_local;
    p.attention = attention_local;
    p.linear = linear_local;
    p.proj = proj_local;
    p.experts = expert_exchange_local;
    p.weights = weights_resident;
    p.checkpoint.keep = ACT_KEEP_ALL;
    p.schedule.microbatches = 1;
    return p;
}

/* ---- the stack of techniques ------------------------------------------------------------------ */

/* The plan's slots a technique installs into: its placements and its operators (not the groups,
 * which name ranks, not owners). */
typedef struct { const char *name; size_t offset, size; } plan_slot;
#define SLOT(member) {#member, offsetof(llama_plan, member), sizeof(((llama_plan *)0)->member)}
static const plan_slot slots[] = {
    SLOT(layout), SLOT(storage), SLOT(sequence), SLOT(region), SLOT(vocab), SLOT(loss), SLOT(attention),
    SLOT(linear), SLOT(proj), SLOT(experts), SLOT(weights), SLOT(checkpoint), SLOT(reduce_grads), SLOT(optimizer),
    SLOT(schedule)};
_Static_assert(sizeof slots / sizeof *slots == PLAN_NSLOTS, "plan.h's PLAN_NSLOTS counts plan.c's slots");

/* A slot's fingerprint: FNV-1a over its bytes (an installed operator changes its functions or
 * its state, a placement its values). */
static unsigned long long slot_fingerprint(const llama_plan *p, int k) {
    const unsigned char *b = (const unsigned char *)p + slots[k].offset;
    unsigned long long h = 1469598103934665603ULL;
    for (size_t i = 0; i < slots[k].size; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

void *plan_push(llama_plan *p, const plan_technique *technique, void *state, double buffer_bytes) {
    plan_stack *a = &p->applied;
    if (a->n == PLAN_MAX_TECHNIQUES)
        comm_exit_usage("plan_push: more than %d techniques on one plan (%s)", PLAN_MAX_TECHNIQUES, technique->name);
    for (int k = 0; k < PLAN_NSLOTS; k++) a->layer[a->n].slots_before[k] = slot_fingerprint(p, k);
    a->layer[a->n].technique = technique;
    a->layer[a->n].state = state;
    a->layer[a->n].buffer_bytes = buffer_bytes;
    a->n++;
    return state;
}

/* Where `technique` sits on the plan's stack, or -1 when it was not applied. */
static int stack_index(const llama_plan *p, const plan_technique *technique) {
    for (int i = 0; i < p->applied.n; i++)
        if (p->applied.layer[i].technique == technique) return i;
    return -1;
}

void *plan_state(const llama_plan *p, const plan_technique *technique) {
    int i = stack_index(p, technique);
    return i < 0 ? NULL : p->applied.layer[i].state;
}

bool plan_has(const llama_plan *p, const plan_technique *technique) { return stack_index(p, technique) >= 0; }

void plan_add_buffer_bytes(llama_plan *p, const plan_technique *technique, double bytes) {
    int i = stack_index(p, technique);
    if (i >= 0) p->applied.layer[i].buffer_bytes += bytes;
}

double plan_buffer_bytes(const llama_plan *p) {
    double bytes = 0;
    for (int i = 0; i < p->applied.n; i++) bytes += p->applied.layer[i].buffer_bytes;
    return bytes;
}

void plan_free(llama_plan *p) {
    for (int i = p->applied.n - 1; i >= 0; i--) {
        const plan_technique *t = p->applied.layer[i].technique;
        if (t->free_state) t->free_state(p->applied.layer[i].state);
    }
    *p = plan_single_device();
}

/* ---- the composition, described --------------------------------------------------------------- */

/* Did technique i change slot k (between its push and the next one's, or now)? */
static bool installed(const llama_plan *p, int i, int k) {
    const plan_stack *a = &p->applied;
    unsigned long long after = i + 1 < a->n ? a->layer[i + 1].slots_before[k] : slot_fingerprint(p, k);
    return after != a->layer[i].slots_before[k];
}

bool plan_slot_installed(const llama_plan *p, const char *slot) {
    for (int k = 0; k < PLAN_NSLOTS; k++) {
        if (strcmp(slots[k].name, slot)) continue;
        for (int i = 0; i < p->applied.n; i++)
            if (installed(p, i, k)) return true;
        return false;
    }
    fprintf(stderr, "plan_slot_installed: no slot \"%s\" in the plan (plan.c's slot table)\n", slot);
    abort();
}

/* The world ranks of world rank 0's group over the mesh dimensions `dims` (MESH_BIT): those whose
 * other coordinates are 0, as "{0,2,4,6}". */
static void group_ranks(const mesh_shape *s, unsigned dims, char *out, size_t len) {
    int world = 1, coord[MESH_NDIMS], n = 0;
    for (int d = 0; d < MESH_NDIMS; d++) world *= s->degree[d];
    size_t used = (size_t)snprintf(out, len, "{");
    for (int r = 0; r < world && used < len; r++) {
        mesh_coords_of(s, r, coord);
        bool in = true;
        for (int d = 0; d < MESH_NDIMS; d++) in &= (dims & MESH_BIT(d)) || coord[d] == 0;
        if (in) used += (size_t)snprintf(out + used, len - used, "%s%d", n++ ? "," : "", r);
    }
    if (used < len) snprintf(out + used, len - used, "}");
}

/* Appends to a text of `len` bytes (truncating at its end). */
typedef struct { char *s; size_t len, used; } text;
static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    if (t->used + 1 >= t->len) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->s + t->used, t->len - t->used, fmt, ap);
    va_end(ap);
    if (n > 0) t->used = t->used + (size_t)n < t->len ? t->used + (size_t)n : t->len - 1;
}

void plan_describe_text(const llama_plan *p, char *out, size_t len) {
    const plan_stack *a = &p->applied;
    text t = {out, len, 0};
    out[0] = '\0';
    if (a->n == 0) {
        put(&t, "techniques: none (every operator the single device's)\n");
        return;
    }
    put(&t, "techniques: %d, in the order applied, each with what it installed (over: on top of an earlier one's)\n", a->n);
    bool touched[PLAN_NSLOTS] = {0};
    for (int i = 0; i < a->n; i++) {
        put(&t, "  %-18s", a->layer[i].technique->name);
        bool any = false;
        for (int k = 0; k < PLAN_NSLOTS; k++) {
            if (!installed(p, i, k)) continue;
            int below = -1;
            for (int j = 0; j < i; j++)
                if (installed(p, j, k)) below = j;
            put(&t, " %s", slots[k].name);
            if (below >= 0) put(&t, " (over %s)", a->layer[below].technique->name);
            touched[k] = any = true;
        }
        put(&t, "%s\n", any ? "" : " (state only)");
    }
    bool rest = false;
    for (int k = 0; k < PLAN_NSLOTS; k++)
        /* (the experts' exchange is named only where a technique installed it: a dense model has no
         * experts, and its line reads as it did before chapter 09) */
        if (!touched[k] && strcmp(slots[k].name, "experts") != 0) {
            if (!rest) put(&t, "  %-18s", "single device");
            put(&t, " %s", slots[k].name);
            rest = true;
        }
    if (rest) put(&t, "\n");
    const device_mesh *mesh = p->groups.mesh;
    if (!mesh) return;
    static const struct { const char *name; unsigned dims; } kinds[] = {
        {"tp", MESH_BIT(MESH_TP)}, {"cp", MESH_BIT(MESH_CP)}, {"pp", MESH_BIT(MESH_PP)},
        {"batch", MESH_BIT(MESH_DP_REPLICATE) | MESH_BIT(MESH_DP_SHARD)}};
    char ranks[256];
    bool grouped = false;
    put(&t, "  groups of world rank 0:");
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
        if (mesh_size_over(&mesh->shape, kinds[i].dims) > 1) {
            group_ranks(&mesh->shape, kinds[i].dims, ranks, sizeof ranks);
            put(&t, " %s %s", kinds[i].name, ranks);
            grouped = true;
        }
    if (p->groups.shard && p->groups.shard->size > 1) {
        group_ranks(&mesh->shape, param_shard_dims(p->groups.shard_dims), ranks, sizeof ranks);
        put(&t, " shard %s", ranks);
    }
    if (p->groups.ep && p->groups.ep->size > 1) {   /* the experts' split (09) */
        group_ranks(&mesh->shape, p->groups.expert_dims, ranks, sizeof ranks);
        put(&t, " ep %s", ranks);
    }
    put(&t, "%s\n", grouped ? "" : " none (one rank)");
}

void plan_describe(const llama_plan *p) {
    char out[2048];
    plan_describe_text(p, out, sizeof out);
    log0("%s", out);
}
