/* params.c: see params.h. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "init.h"
#include "kernels.h"
#include "llama_kernels.h"
#include "params.h"

int param_split_rows(const llama_config *c, param_spec s, shard_layout layout, int tp) {
    bool vocab_rows = (s.kind == P_TOK_EMBEDDINGS || s.kind == P_OUTPUT) && layout == SHARD_ROWS;
    return vocab_rows ? llama_padded_vocab(c, tp) : s.rows;
}

unsigned param_shard_dims_of(const mesh_shape *shape, param_kind kind, unsigned shard_dims, unsigned expert_dims) {
    unsigned dims = param_shard_dims(shard_dims), splitting = 0;
    for (int d = 0; d < MESH_NDIMS; d++)   /* (a dimension of one rank splits nothing: --ep 1) */
        if ((expert_dims & MESH_BIT(d)) && shape->degree[d] > 1) splitting |= MESH_BIT(d);
    return param_kind_is_expert(kind) ? dims & ~splitting : dims;
}

bool param_held_whole(const mesh_shape *shape, param_kind kind, unsigned shard_dims, unsigned expert_dims) {
    return expert_dims && param_kind_is_expert(kind) &&
           mesh_size_over(shape, param_shard_dims_of(shape, kind, shard_dims, expert_dims)) == 1;
}

int param_rank_slice(const llama_config *c, const device_mesh *mesh, unsigned expert_dims, shard_layout tp_layout,
                     param_spec s, int *r0, int *nr, int *c0, int *nc, bool *even) {
    bool by_expert = mesh && expert_dims && param_kind_is_expert(s.kind);
    shard_layout split = by_expert ? SHARD_ROWS : tp_layout;   /* over the expert dimensions, or tp */
    const comm_group *tp = mesh ? mesh->group[MESH_TP] : NULL;
    int p = by_expert ? mesh_size_over(&mesh->shape, expert_dims) : tp ? tp->size : 1;
    int r = by_expert ? mesh_rank_over(&mesh->shape, mesh->coord, expert_dims) : tp ? tp->rank : 0;
    int rows = param_split_rows(c, s, split, p);   /* the vocabulary's padded */
    shard_slice(split, rows, s.cols, r, p, r0, nr, c0, nc);
    *even = !((split == SHARD_ROWS && *nr * p != rows) || (split == SHARD_COLS && *nc * p != s.cols));
    return p;
}

param_table *param_table_create(const llama_config *c, device_mesh *mesh,
                                const shard_layout layout[P_NKINDS],
                                const block_storage storage[PARAM_NBLOCKS], unsigned shard_dims,
                                unsigned expert_dims, const bool *here, uint64_t seed) {
    param_table *t = calloc(1, sizeof *t);
    t->c = *c;
    t->mesh = mesh;
    t->tp = mesh ? mesh->group[MESH_TP] : NULL;
    t->shard_dims = param_shard_dims(shard_dims);
    for (int b = 0; b < PARAM_NBLOCKS; b++) t->storage[b] = storage ? storage[b] : STORE_WHOLE;
    t->expert_dims = mesh ? expert_dims : 0;
    t->n = llama_num_params(c);
    t->t = calloc((size_t)t->n, sizeof *t->t);
    for (int i = 0; i < t->n; i++) {
        param_tensor *x = &t->t[i];
        x->spec = llama_param_spec(c, i);
        x->tp_layout = layout ? layout[x->spec.kind] : SHARD_REPLICATED;
        x->here = here ? here[i] : true;
        /* the experts' weights go whole experts to each rank of the expert dimensions (09) */
        bool even;
        int p = param_rank_slice(c, mesh, t->expert_dims, x->tp_layout, x->spec, &x->r0, &x->nr, &x->c0, &x->nc, &even);
        if (!even) {
            fprintf(stderr, "param_table_create: %s [%d, %d] is not divisible by %s %d\n", x->spec.name,
                    x->spec.rows, x->spec.cols, t->expert_dims && param_kind_is_expert(x->spec.kind) ? "ep" : "tp", p);
            exit(1);
        }
        /* the shard group's split of PyTorch's dim 0: a matrix's rows, a vector's elements */
        x->units = x->spec.is_vector ? x->nc : x->nr;
        x->width = x->spec.is_vector ? 1 : x->nc;
        /* the vocabulary's padding: stored (units), but no part of the tensor (nr, real_units) */
        int real_rows = x->spec.rows - x->r0;
        if (x->nr > real_rows) x->nr = real_rows > 0 ? real_rows : 0;
        x->real_units = x->spec.is_vector ? x->nc : x->nr;
        /* its shard group: the table's, or for an expert the ranks of it that hold the same experts */
        x->shard_dims = mesh ? param_shard_dims_of(&mesh->shape, x->spec.kind, t->shard_dims, t->expert_dims)
                             : t->shard_dims;
        x->shard_ranks = mesh ? mesh_size_over(&mesh->shape, x->shard_dims) : 1;
        x->shard_rank = mesh ? mesh_rank_over(&mesh->shape, mesh->coord, x->shard_dims) : 0;
        x->held_whole = mesh && param_held_whole(&mesh->shape, x->spec.kind, t->shard_dims, t->expert_dims);
        int S = x->shard_ranks, s = x->shard_rank;
        x->shard_units = x->held_whole ? x->units : (x->units + S - 1) / S;
        x->own_first = x->held_whole ? 0 : s * x->shard_units;
        x->own_units = x->real_units - x->own_first;
        if (x->own_units > x->shard_units) x->own_units = x->shard_units;
        if (x->own_units < 0) x->own_units = 0;
        if (!x->here) x->units = x->real_units = x->shard_units = x->own_units = 0;   /* another stage's */
    }
    /* Offsets, unit by unit, so that a unit is one contiguous range in every block; in the shard
     * block its tensors split over the table's shard group first, then the experts (split over
     * their own, or held whole): each part FSDP moves is one range (part 0, part 1). */
    for (int u = 0; u <= c->n_layers; u++) {
        int idx[PARAM_UNIT_MAX], n = llama_unit_tensors(c, u, idx);
        for (int k = 0; k < n; k++) {
            param_tensor *x = &t->t[idx[k]];
            x->offset_whole = t->whole_numel;
            t->whole_numel += (size_t)x->units * x->width;
        }
        for (int part = 0; part < 2; part++)
            for (int k = 0; k < n; k++) {
                param_tensor *x = &t->t[idx[k]];
                if (param_shard_part(t, x) != part) continue;
                x->offset_shard = t->shard_numel;
                t->shard_numel += (size_t)x->shard_units * x->width;
            }
    }
#define BLOCK_NUMEL(b) (t->storage[b] == STORE_SHARD ? t->shard_numel : t->whole_numel)
    t->params = device_alloc_floats(BLOCK_NUMEL(PARAM_VALUES), MEM_PARAMS);
    t->grads = device_alloc_floats(BLOCK_NUMEL(PARAM_GRADS), MEM_GRADS);
    t->adam_m = device_alloc_floats(BLOCK_NUMEL(PARAM_OPTIM), MEM_OPTIM);
    t->adam_v = device_alloc_floats(BLOCK_NUMEL(PARAM_OPTIM), MEM_OPTIM);
#undef BLOCK_NUMEL
    /* The shard-invariant initialiser gives each rank exactly its slice of the baseline: the
     * whole tp slice, or the rows (elements) of its dp shard; padding stays zero (a shard's, and
     * the vocabulary's rows past V: zero with zero gradient is a fixed point of AdamW, weight
     * decay included, so they stay exactly zero). */
    bool sharded = t->storage[PARAM_VALUES] == STORE_SHARD;
    for (int i = 0; i < t->n; i++) {
        const param_tensor *x = &t->t[i];
        float *dst = param_in(t, t->params, i);
        if (!x->here) continue;
        if (x->spec.init_std == 0) {   /* the norm weights: ones */
            init_constant_device(dst, (size_t)(sharded ? x->own_units : x->units) * x->width, 1.0f);
        } else if (sharded) {
            if (x->own_units > 0)
                init_normal_slice_device(dst, x->spec.name, seed, x->spec.init_std, x->spec.rows, x->spec.cols,
                                         x->r0 + x->own_first, x->own_units, x->c0, x->nc);
        } else if (x->nr > 0) {   /* (a tp slice of the vocabulary may be all padding) */
            init_normal_slice_device(dst, x->spec.name, seed, x->spec.init_std, x->spec.rows, x->spec.cols,
                                     x->r0, x->nr, x->c0, x->nc);
        }
    }
    return t;
}

void param_table_free(param_table *t) {
    if (!t) return;
    device_free(t->params); device_free(t->grads); device_free(t->adam_m); device_free(t->adam_v);
    free(t->t);
    free(t);
}

int param_index(const param_table *t, param_kind kind, int layer) {
    return llama_param_index_of(&t->c, kind, layer);
}

block_storage param_storage_of(const param_table *t, const float *block) {
    if (block == t->params) return t->storage[PARAM_VALUES];
    if (block == t->grads) return t->storage[PARAM_GRADS];
    return t->storage[PARAM_OPTIM];
}

float *param_in(const param_table *t, float *block, int i) {
    const param_tensor *x = &t->t[i];
    return block + (param_storage_of(t, block) == STORE_SHARD ? x->offset_shard : x->offset_whole);
}

size_t param_stored_numel(const param_table *t, const float *block, int i) {
    const param_tensor *x = &t->t[i];
    return (size_t)(param_storage_of(t, block) == STORE_SHARD ? x->shard_units : x->units) * x->width;
}

void param_unit_range(const param_table *t, const float *block, int u, size_t *offset, size_t *count) {
    int idx[PARAM_UNIT_MAX], n = llama_unit_tensors(&t->c, u, idx);
    bool shard = param_storage_of(t, block) == STORE_SHARD;
    *offset = SIZE_MAX;
    *count = 0;
    for (int k = 0; k < n; k++) {   /* (in a shard block the first tensor in the table's order may lie later) */
        const param_tensor *x = &t->t[idx[k]];
        size_t at = shard ? x->offset_shard : x->offset_whole;
        if (at < *offset) *offset = at;
        *count += param_stored_numel(t, block, idx[k]);
    }
}

int param_unit_tensors(const param_table *t, int u, int idx[PARAM_UNIT_MAX]) { return llama_unit_tensors(&t->c, u, idx); }

/* unit_weights' named fields alias of[kind]: they must be declared in param_kind's order. */
_Static_assert(offsetof(unit_weights, tok_embeddings) == P_TOK_EMBEDDINGS * sizeof(float *) &&
               offsetof(unit_weights, w3) == P_W3 * sizeof(float *) &&
               offsetof(unit_weights, output) == P_OUTPUT * sizeof(float *) &&
               offsetof(unit_weights, expert_w3) == P_EXPERT_W3 * sizeof(float *),
               "unit_weights' fields follow param_kind");

unit_weights param_unit(const param_table *t, float *block, int u) {
    unit_weights w = {0};
    int idx[PARAM_UNIT_MAX], n = llama_unit_tensors(&t->c, u, idx);
    for (int k = 0; k < n; k++)
        if (t->t[idx[k]].here) w.of[t->t[idx[k]].spec.kind] = param_in(t, block, idx[k]);
    return w;
}

size_t param_block_numel(const param_table *t, const float *block) {
    return param_storage_of(t, block) == STORE_SHARD ? t->shard_numel : t->whole_numel;
}

void param_zero_grads(param_table *t) {
    device_zero(t->grads, param_block_numel(t, t->grads) * sizeof(float));
}

void param_adamw_step(param_table *t, const adamw_config *o, int step) {
    size_t n = t->storage[PARAM_VALUES] == STORE_SHARD ? t->shard_numel : t->whole_numel;
    adamw_step(t->params, t->grads, t->adam_m, t->adam_v, n, o->lr, o->beta1, o->beta2, o->eps,
               o->weight_decay, step);
}

/* See params.h. */
bool param_held_slice(const param_table *t, const float *block, int i, int *r0, int *nr, int *c0, int *nc,
                      size_t *offset) {
    const param_tensor *x = &t->t[i];
    block_storage st = param_storage_of(t, block);
    bool dp_split = st != STORE_WHOLE;
    if (!x->here) return false;
    if (t->mesh)
        for (int d = 0; d < MESH_NDIMS; d++) {
            bool by_expert = t->expert_dims && param_kind_is_expert(x->spec.kind);
            bool split = by_expert ? (t->expert_dims & MESH_BIT(d)) != 0 : d == MESH_TP && x->tp_layout != SHARD_REPLICATED;
            split = split || (dp_split && (x->shard_dims & MESH_BIT(d))) ||
                         d == MESH_PP;   /* one stage stores it (or every stage its copy: the
                                          * pipeline never replicates a tensor) */
            if (!split && t->mesh->coord[d] != 0) return false;
        }
    *r0 = x->r0; *nr = x->nr; *c0 = x->c0; *nc = x->nc;
    *offset = st == STORE_SHARD ? x->offset_shard : x->offset_whole;
    if (!dp_split) return true;
    if (x->spec.is_vector) { *c0 += x->own_first; *nc = x->own_units; }
    else { *r0 += x->own_first; *nr = x->own_units; }
    if (st == STORE_WHOLE_SHARD_VALID) *offset += (size_t)x->own_first * x->width;
    return true;
}

bool param_stored_slice(const param_table *t, const float *block, int i, int *r0, int *nr, int *c0, int *nc,
                        size_t *offset) {
    const param_tensor *x = &t->t[i];
    if (!x->here) return false;
    *r0 = x->r0; *nr = x->nr; *c0 = x->c0; *nc = x->nc;
    if (param_storage_of(t, block) != STORE_SHARD) { *offset = x->offset_whole; return true; }
    *offset = x->offset_shard;
    if (x->spec.is_vector) { *c0 += x->own_first; *nc = x->own_units; }
    else { *r0 += x->own_first; *nr = x->own_units; }
    return true;
}

void param_scatter(param_table *t, float *block, int i, const float *src, int src_r0, int src_c0, size_t src_ld) {
    int r0, nr, c0, nc;
    size_t off;
    if (!param_stored_slice(t, block, i, &r0, &nr, &c0, &nc, &off)) return;
    size_t stored = param_stored_numel(t, block, i);   /* the slice, then a shard's zero padding */
    float *host = calloc(stored + 1, sizeof(float));
    for (int row = 0; row < nr; row++)
        memcpy(host + (size_t)row * nc, src + (size_t)(r0 - src_r0 + row) * src_ld + (size_t)(c0 - src_c0),
               (size_t)nc * sizeof(float));
    device_copy_to_device(block + off, host, stored * sizeof(float));
    free(host);
}

double param_grad_sq_held(const param_table *t) {
    double sum = 0;
    for (int i = 0; i < t->n; i++) {
        int r0, nr, c0, nc;
        size_t off;
        if (!param_held_slice(t, t->grads, i, &r0, &nr, &c0, &nc, &off)) continue;
        size_t n = (size_t)nr * nc;
        float *g = malloc(n * sizeof(float) + 1);
        device_copy_to_host(g, t->grads + off, n * sizeof(float));
        for (size_t k = 0; k < n; k++) sum += (double)g[k] * g[k];
        free(g);
    }
    return sum;
}

void param_scale_grads(param_table *t, float coef) {
    size_t n = t->storage[PARAM_GRADS] == STORE_SHARD ? t->shard_numel : t->whole_numel;
    scale_inplace(t->grads, coef, n);
}

void param_gather(const param_table *t, int i, bool grad, float *full) {
    param_gather_block(t, grad ? t->grads : t->params, i, full);
}

void param_gather_block(const param_table *t, const float *block, int i, float *full) {
    const param_tensor *x = &t->t[i];
    int r0, nr, c0, nc;
    size_t off;
    bool holds = param_held_slice(t, block, i, &r0, &nr, &c0, &nc, &off);
    size_t n = holds ? (size_t)nr * nc : 0;
    if (!t->mesh) {                               /* one device: the slice is the tensor */
        device_copy_to_host(full, block + off, n * sizeof(float));
        return;
    }
    /* Every rank sends a header (does it hold, and which slice) and up to `most` floats; world
     * rank 0 puts each held slice where it belongs. Slice bounds are exact in a float (< 2^24). */
    comm_group *w = comm_world();
    size_t most = (size_t)comm_host_max(w, (double)n);
    float head[5] = {holds, (float)r0, (float)nr, (float)c0, (float)nc};
    float *mine = calloc(most + 1, sizeof(float));
    if (n) device_copy_to_host(mine, block + off, n * sizeof(float));
    bool root = w->rank == 0;
    float *heads = root ? malloc(5 * sizeof(float) * w->size) : NULL;
    float *all = root ? malloc((most + 1) * sizeof(float) * w->size) : NULL;
    comm_host_gather(w, head, heads, 5, 0);
    comm_host_gather(w, mine, all, most + 1, 0);
    if (root) {
        int cols = x->spec.cols;
        for (int q = 0; q < w->size; q++) {
            const float *h = heads + 5 * q, *data = all + (most + 1) * q;
            if (!h[0]) continue;
            int qr0 = (int)h[1], qnr = (int)h[2], qc0 = (int)h[3], qnc = (int)h[4];
            for (int row = 0; row < qnr; row++)
                memcpy(full + (size_t)(qr0 + row) * cols + qc0, data + (size_t)row * qnc, qnc * sizeof(float));
        }
    }
    free(heads); free(all); free(mine);
}
