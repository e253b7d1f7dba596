/* params.c: see params.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "init.h"
#include "kernels.h"
#include "llama_kernels.h"
#include "params.h"

param_table *param_table_create(const llama_config *c, device_mesh *mesh,
                                const shard_layout layout[P_NKINDS], uint64_t seed) {
    param_table *t = calloc(1, sizeof *t);
    t->c = *c;
    t->mesh = mesh;
    t->tp = mesh ? mesh->group[MESH_TP] : NULL;
    int p = t->tp ? t->tp->size : 1, r = t->tp ? t->tp->rank : 0;
    t->n = llama_num_params(c);
    t->t = calloc((size_t)t->n, sizeof *t->t);
    t->layer_first = calloc((size_t)c->n_layers, sizeof *t->layer_first);
    size_t offset = 0;
    for (int i = 0; i < t->n; i++) {
        param_tensor *x = &t->t[i];
        x->spec = llama_param_spec(c, i);
        x->tp_layout = layout ? layout[x->spec.kind] : SHARD_REPLICATED;
        shard_slice(x->tp_layout, x->spec.rows, x->spec.cols, r, p, &x->r0, &x->nr, &x->c0, &x->nc);
        if ((size_t)x->nr * p != (size_t)x->spec.rows && x->tp_layout == SHARD_ROWS) {
            fprintf(stderr, "param_table_create: %s has %d rows, not divisible by tp %d\n", x->spec.name, x->spec.rows, p);
            exit(1);
        }
        if ((size_t)x->nc * p != (size_t)x->spec.cols && x->tp_layout == SHARD_COLS) {
            fprintf(stderr, "param_table_create: %s has %d columns, not divisible by tp %d\n", x->spec.name, x->spec.cols, p);
            exit(1);
        }
        x->offset = offset;
        offset += (size_t)x->nr * x->nc;
        if (x->spec.layer >= 0 && x->spec.kind == P_ATTENTION_NORM) t->layer_first[x->spec.layer] = i;
    }
    t->num_local = offset;
    t->params = device_alloc_floats(offset, MEM_PARAMS);
    t->grads = device_alloc_floats(offset, MEM_GRADS);
    t->adam_m = device_alloc_floats(offset, MEM_OPTIM);
    t->adam_v = device_alloc_floats(offset, MEM_OPTIM);
    /* The shard-invariant initialiser gives each rank exactly its slice of the baseline. */
    for (int i = 0; i < t->n; i++) {
        const param_tensor *x = &t->t[i];
        if (x->spec.is_vector) init_constant_device(param_in(t, t->params, i), param_local_numel(t, i), 1.0f);
        else init_normal_slice_device(param_in(t, t->params, i), x->spec.name, seed, x->spec.init_std,
                                      x->spec.rows, x->spec.cols, x->r0, x->nr, x->c0, x->nc);
    }
    return t;
}

void param_table_free(param_table *t) {
    if (!t) return;
    device_free(t->params); device_free(t->grads); device_free(t->adam_m); device_free(t->adam_v);
    free(t->t);
    free(t->layer_first);
    free(t);
}

int param_index(const param_table *t, param_kind kind, int layer) {
    return llama_param_index_of(&t->c, kind, layer);
}

float *param_in(const param_table *t, float *block, int i) { return block + t->t[i].offset; }
size_t param_local_numel(const param_table *t, int i) { return (size_t)t->t[i].nr * t->t[i].nc; }

unit_weights param_unit(const param_table *t, float *block, int u) {
    static const param_kind ends[] = {P_TOK_EMBEDDINGS, P_NORM, P_OUTPUT};
    static const param_kind layer[] = {P_ATTENTION_NORM, P_WQ, P_WK, P_WV, P_WO, P_FFN_NORM, P_W1, P_W2, P_W3};
    unit_weights w = {0};
    bool is_ends = u == t->c.n_layers;
    const param_kind *kinds = is_ends ? ends : layer;
    int n = is_ends ? 3 : 9;
    for (int k = 0; k < n; k++) w.of[kinds[k]] = param_in(t, block, param_index(t, kinds[k], is_ends ? -1 : u));
    return w;
}

void param_zero_grads(param_table *t) { device_zero(t->grads, t->num_local * sizeof(float)); }

void param_adamw_step(param_table *t, const adamw_config *o, int step) {
    adamw_step(t->params, t->grads, t->adam_m, t->adam_v, t->num_local, o->lr, o->beta1, o->beta2,
               o->eps, o->weight_decay, step);
}

/* Does this rank send its slice of tensor x to the gather? One holder per slice: coordinate 0
 * in every mesh dimension the tensor is not split over. */
static bool holds_for_gather(const param_table *t, const param_tensor *x) {
    for (int d = 0; d < MESH_NDIMS; d++) {
        bool split = d == MESH_TP && x->tp_layout != SHARD_REPLICATED;
        if (!split && t->mesh->coord[d] != 0) return false;
    }
    return true;
}

double param_grad_sq_held(const param_table *t) {
    double sum = 0;
    for (int i = 0; i < t->n; i++) {
        if (t->mesh && !holds_for_gather(t, &t->t[i])) continue;
        size_t n = param_local_numel(t, i);
        float *g = malloc(n * sizeof(float));
        device_copy_to_host(g, param_in(t, t->grads, i), n * sizeof(float));
        for (size_t k = 0; k < n; k++) sum += (double)g[k] * g[k];
        free(g);
    }
    return sum;
}

void param_scale_grads(param_table *t, float coef) { scale_inplace(t->grads, coef, t->num_local); }

void param_gather(const param_table *t, int i, bool grad, float *full) {
    const param_tensor *x = &t->t[i];
    size_t n = param_local_numel(t, i);
    const float *local = param_in(t, grad ? t->grads : t->params, i);
    if (!t->mesh) {                               /* one device: the slice is the tensor */
        device_copy_to_host(full, local, n * sizeof(float));
        return;
    }
    /* Every rank sends a header (does it hold, and which slice) and up to `most` floats; world
     * rank 0 puts each held slice where it belongs. Slice bounds are exact in a float (< 2^24). */
    comm_group *w = comm_world();
    size_t most = (size_t)comm_host_max(w, (double)n);
    bool holds = holds_for_gather(t, x);
    float head[5] = {holds, (float)x->r0, (float)x->nr, (float)x->c0, (float)x->nc};
    float *mine = calloc(most + 1, sizeof(float));
    if (holds) device_copy_to_host(mine, local, n * sizeof(float));
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
            int r0 = (int)h[1], nr = (int)h[2], c0 = (int)h[3], nc = (int)h[4];
            for (int row = 0; row < nr; row++)
                memcpy(full + (size_t)(r0 + row) * cols + c0, data + (size_t)row * nc, nc * sizeof(float));
        }
    }
    free(heads); free(all); free(mine);
}
