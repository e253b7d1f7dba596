/* tp.c: the tensor-parallel Llama (see tp.h). Read it beside common/llama.c, the baseline:
 * the sequence of layer calls is the same, the shapes are local (Hl heads, Fl units), and
 * chapter 00's f and g sit at the entry and exit of each block.
 *
 * Notation: B batch, T sequence, N = B*T rows, D dim, hd head dim, V vocabulary, L layers;
 * Hl = H/p, Hkvl = Hkv/p, Fl = F/p are this rank's heads, kv heads and ffn units.
 */
#include <stdio.h>
#include <stdlib.h>
#include "../00_naive_tp_mlp/tensor_parallel.h"
#include "comm.h"
#include "device.h"
#include "init.h"
#include "kernels.h"
#include "llama_kernels.h"
#include "tp.h"

tp_layouts megatron_layouts(void) {
    tp_layouts t;
    for (int k = 0; k < TP_NUM_KINDS; k++) t.of[k] = SHARD_REPLICATED;
    /* BEGIN ASSIGNMENT: choose the layout of the attention and feed-forward weights */
    t.of[P_WQ] = t.of[P_WK] = t.of[P_WV] = SHARD_ROWS;   /* column-parallel: split the outputs */
    t.of[P_W1] = t.of[P_W3] = SHARD_ROWS;
    t.of[P_WO] = t.of[P_W2] = SHARD_COLS;                /* row-parallel: split the inputs     */
    /* END ASSIGNMENT */
    return t;
}

#define PARAMS_PER_LAYER 9   /* llama.h's table: per layer attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3 */

float *tp_param(tp_params *w, int i) { return w->params + w->offsets[i]; }
float *tp_grad(tp_params *w, int i) { return w->grads + w->offsets[i]; }

tp_layer_weights tp_layer_view(const tp_params *w, float *block, int l) {
    const size_t *o = w->offsets + 1 + PARAMS_PER_LAYER * l;
    tp_layer_weights v = {.attention_norm = block + o[0], .wq = block + o[1], .wk = block + o[2],
                          .wv = block + o[3], .wo = block + o[4], .ffn_norm = block + o[5],
                          .w1 = block + o[6], .w2 = block + o[7], .w3 = block + o[8]};
    return v;
}

tp_params *tp_params_create(const llama_config *c, comm_group *tp, tp_layouts layouts, uint64_t seed) {
    int p = tp->size;
    /* Whole heads and whole ffn units per rank, or the split does not exist. */
    if (c->n_heads % p) comm_exit_usage("--tp %d does not divide --n-heads %d: each rank must own whole query heads; use a tp that divides %d", p, c->n_heads, c->n_heads);
    if (c->n_kv_heads % p) comm_exit_usage("--tp %d does not divide --n-kv-heads %d: each rank must own whole kv heads; use a tp that divides %d", p, c->n_kv_heads, c->n_kv_heads);
    if (c->ffn_dim % p) comm_exit_usage("--tp %d does not divide --ffn-dim %d: each rank must own ffn_dim/tp units; use a multiple of %d", p, c->ffn_dim, p);
    if ((layouts.of[P_OUTPUT] != SHARD_REPLICATED || layouts.of[P_TOK_EMBEDDINGS] != SHARD_REPLICATED) &&
        c->vocab_size % p) {
        int lo = c->vocab_size / p * p, hi = lo + p;
        if (lo > 0) comm_exit_usage("--vocab %d is not divisible by tp %d: each rank must own vocab/tp rows; the nearest valid sizes are %d and %d", c->vocab_size, p, lo, hi);
        comm_exit_usage("--vocab %d is not divisible by tp %d: each rank must own vocab/tp rows; the nearest valid size is %d", c->vocab_size, p, hi);
    }

    tp_params *w = calloc(1, sizeof *w);
    w->c = *c;
    w->tp = tp;
    w->layouts = layouts;
    w->hd = llama_head_dim(c);
    w->Hl = c->n_heads / p; w->Hkvl = c->n_kv_heads / p; w->Fl = c->ffn_dim / p;

    /* This rank's slice of every tensor, laid out one after another like the baseline's. */
    w->nparams = llama_num_params(c);
    w->specs = calloc(w->nparams, sizeof *w->specs);
    w->r0 = calloc(w->nparams, sizeof(int)); w->nr = calloc(w->nparams, sizeof(int));
    w->c0 = calloc(w->nparams, sizeof(int)); w->nc = calloc(w->nparams, sizeof(int));
    w->offsets = calloc(w->nparams + 1, sizeof(size_t));
    for (int i = 0; i < w->nparams; i++) {
        param_spec *s = &w->specs[i];
        *s = llama_param_spec(c, i);
        shard_slice(layouts.of[s->kind], s->rows, s->cols, tp->rank, p, &w->r0[i], &w->nr[i], &w->c0[i], &w->nc[i]);
        w->offsets[i + 1] = w->offsets[i] + (size_t)w->nr[i] * w->nc[i];
    }
    w->Vl = w->nr[w->nparams - 1];
    w->v0 = w->r0[w->nparams - 1];
    w->num_local = w->offsets[w->nparams];
    w->params = device_alloc_floats(w->num_local, MEM_PARAMS);
    w->grads = device_alloc_floats(w->num_local, MEM_GRADS);
    w->adam_m = device_alloc_floats(w->num_local, MEM_OPTIM);
    w->adam_v = device_alloc_floats(w->num_local, MEM_OPTIM);
    /* The shard-invariant initialiser gives each rank exactly its slice of the baseline. */
    for (int i = 0; i < w->nparams; i++) {
        const param_spec *s = &w->specs[i];
        if (s->is_vector) init_constant_device(tp_param(w, i), (size_t)w->nr[i] * w->nc[i], 1.0f);
        else init_normal_slice_device(tp_param(w, i), s->name, seed, s->init_std, s->rows, s->cols,
                                      w->r0[i], w->nr[i], w->c0[i], w->nc[i]);
    }
    return w;
}

void tp_params_free(tp_params *w) {
    device_free(w->params); device_free(w->grads); device_free(w->adam_m); device_free(w->adam_v);
    free(w->specs); free(w->offsets);
    free(w->r0); free(w->nr); free(w->c0); free(w->nc);
    free(w);
}

void tp_params_zero_grad(tp_params *w) { device_zero(w->grads, w->num_local * sizeof(float)); }

void tp_params_adamw_step(tp_params *w, const adamw_config *o, int step) {
    adamw_step(w->params, w->grads, w->adam_m, w->adam_v, w->num_local, o->lr, o->beta1, o->beta2,
               o->eps, o->weight_decay, step);
}

static void gather(tp_params *w, float *block, int i, float *full) {
    const param_spec *s = &w->specs[i];
    shard_gather_to_host(w->tp, w->layouts.of[s->kind], block + w->offsets[i], s->rows, s->cols, full);
}
void tp_gather_param(tp_params *w, int i, float *full) { gather(w, w->params, i, full); }
void tp_gather_grad(tp_params *w, int i, float *full) { gather(w, w->grads, i, full); }

tp_llama *tp_llama_create(const llama_config *c, comm_group *tp, tp_layouts layouts, int B, int T,
                          uint64_t seed) {
    tp_llama *m = calloc(1, sizeof *m);
    m->w = tp_params_create(c, tp, layouts, seed);
    m->c = *c;
    m->tp = tp;
    m->B = B; m->T = T; m->N = B * T;
    m->hd = m->w->hd; m->Hl = m->w->Hl; m->Hkvl = m->w->Hkvl; m->Fl = m->w->Fl; m->Vl = m->w->Vl;
    int N = m->N, D = c->dim, L = c->n_layers, hd = m->hd;
    int Hl = m->Hl, Hkvl = m->Hkvl, Fl = m->Fl;
    /* Saved activations, per layer (see tp_layer_acts for shapes). */
    m->acts = calloc(L, sizeof *m->acts);
    for (int l = 0; l < L; l++) {
        tp_layer_acts *a = &m->acts[l];
        a->h_in = device_alloc_floats((size_t)N * D, MEM_ACTIVATIONS);
        a->attn_xn = device_alloc_floats((size_t)N * D, MEM_ACTIVATIONS);
        a->attn_rstd = device_alloc_floats(N, MEM_ACTIVATIONS);
        a->q = device_alloc_floats((size_t)N * Hl * hd, MEM_ACTIVATIONS);
        a->k = device_alloc_floats((size_t)N * Hkvl * hd, MEM_ACTIVATIONS);
        a->v = device_alloc_floats((size_t)N * Hkvl * hd, MEM_ACTIVATIONS);
        a->probs = device_alloc_floats((size_t)B * Hl * T * T, MEM_ACTIVATIONS);
        a->attn_out = device_alloc_floats((size_t)N * Hl * hd, MEM_ACTIVATIONS);
        a->h_mid = device_alloc_floats((size_t)N * D, MEM_ACTIVATIONS);
        a->ffn_xn = device_alloc_floats((size_t)N * D, MEM_ACTIVATIONS);
        a->ffn_rstd = device_alloc_floats(N, MEM_ACTIVATIONS);
        a->ffn_a = device_alloc_floats((size_t)N * Fl, MEM_ACTIVATIONS);
        a->ffn_b = device_alloc_floats((size_t)N * Fl, MEM_ACTIVATIONS);
        a->ffn_g = device_alloc_floats((size_t)N * Fl, MEM_ACTIVATIONS);
    }
    m->h_final = device_alloc_floats((size_t)N * D, MEM_ACTIVATIONS);
    m->final_xn = device_alloc_floats((size_t)N * D, MEM_ACTIVATIONS);
    m->final_rstd = device_alloc_floats(N, MEM_ACTIVATIONS);
    m->logits = device_alloc_floats((size_t)N * m->Vl, MEM_ACTIVATIONS);
    m->tokens = device_alloc_ints(N, MEM_BUFFERS);
    m->targets = device_alloc_ints(N, MEM_BUFFERS);
    m->positions = device_alloc_ints(T, MEM_BUFFERS);

    /* Backward scratch, reused by every layer. */
    m->dh = device_alloc_floats((size_t)N * D, MEM_BUFFERS);
    m->dxn = device_alloc_floats((size_t)N * D, MEM_BUFFERS);
    m->dxn_part = device_alloc_floats((size_t)N * D, MEM_BUFFERS);
    m->dattn_out = device_alloc_floats((size_t)N * Hl * hd, MEM_BUFFERS);
    m->dq = device_alloc_floats((size_t)N * Hl * hd, MEM_BUFFERS);
    m->dk = device_alloc_floats((size_t)N * Hkvl * hd, MEM_BUFFERS);
    m->dv = device_alloc_floats((size_t)N * Hkvl * hd, MEM_BUFFERS);
    m->dprobs = device_alloc_floats((size_t)B * Hl * T * T, MEM_BUFFERS);
    m->dffn_g = device_alloc_floats((size_t)N * Fl, MEM_BUFFERS);
    m->dffn_a = device_alloc_floats((size_t)N * Fl, MEM_BUFFERS);
    m->dffn_b = device_alloc_floats((size_t)N * Fl, MEM_BUFFERS);
    return m;
}

void tp_llama_free(tp_llama *m) {
    for (int l = 0; l < m->c.n_layers; l++) {
        tp_layer_acts *a = &m->acts[l];
        float *bufs[] = {a->h_in, a->attn_xn, a->attn_rstd, a->q, a->k, a->v, a->probs, a->attn_out,
                         a->h_mid, a->ffn_xn, a->ffn_rstd, a->ffn_a, a->ffn_b, a->ffn_g};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) device_free(bufs[i]);
    }
    float *bufs[] = {m->h_final, m->final_xn, m->final_rstd, m->logits, m->dh, m->dxn, m->dxn_part,
                     m->dattn_out, m->dq, m->dk, m->dv, m->dprobs, m->dffn_g, m->dffn_a, m->dffn_b};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) device_free(bufs[i]);
    device_free(m->tokens); device_free(m->targets); device_free(m->positions);
    tp_params_free(m->w);
    free(m->acts);
    free(m);
}

/* ------------------------------------------------------------------------------------------
 * One layer, forward. h_in (saved in acts[l]) -> h_out, both [B, T, D] and replicated.
 * ------------------------------------------------------------------------------------------ */
void tp_layer_forward(tp_llama *m, int l, float *h_out) {
    const llama_config *c = &m->c;
    tp_layer_weights w = tp_layer_view(m->w, m->w->params, l);
    tp_layer_acts *a = &m->acts[l];
    int B = m->B, T = m->T, N = m->N, D = c->dim, hd = m->hd;
    int Hl = m->Hl, Hkvl = m->Hkvl, Fl = m->Fl;
    size_t ND = (size_t)N * D;

    /* ---- attention block ---- */
    /* attn_xn[N, D] = rmsnorm(h_in): every rank computes the same replicated norm */
    rmsnorm_forward(a->attn_xn, a->attn_rstd, a->h_in, w.attention_norm, N, D, c->norm_eps);
    tp_copy_to_region_forward(m->tp, a->attn_xn, ND);                       /* f: identity */
    /* q[N, Hl*hd], k and v [N, Hkvl*hd]: this rank's heads only */
    column_parallel_linear_forward(a->q, a->attn_xn, w.wq, N, D, Hl * hd);
    column_parallel_linear_forward(a->k, a->attn_xn, w.wk, N, D, Hkvl * hd);
    column_parallel_linear_forward(a->v, a->attn_xn, w.wv, N, D, Hkvl * hd);
    rope_forward(a->q, m->positions, B, T, Hl, hd, c->rope_theta);
    rope_forward(a->k, m->positions, B, T, Hkvl, hd, c->rope_theta);
    /* Heads are independent: Hl query heads over Hkvl kv heads is ordinary (grouped) attention. */
    attention_forward(a->attn_out, a->probs, a->q, a->k, a->v, B, T, Hl, Hkvl, hd);
    /* h_mid[N, D] = partial attn_out wo^T from this rank's heads, summed by g */
    row_parallel_linear_forward(a->h_mid, a->attn_out, w.wo, N, Hl * hd, D);
    /* BEGIN ASSIGNMENT: g: sum the heads' partial outputs over the tp group */
    tp_reduce_from_region_forward(m->tp, a->h_mid, ND);                      /* g: all-reduce */
    /* END ASSIGNMENT */
    add_inplace(a->h_mid, a->h_in, ND);                                      /* residual */

    /* ---- feed-forward block ---- */
    rmsnorm_forward(a->ffn_xn, a->ffn_rstd, a->h_mid, w.ffn_norm, N, D, c->norm_eps);
    tp_copy_to_region_forward(m->tp, a->ffn_xn, ND);                        /* f: identity */
    column_parallel_linear_forward(a->ffn_a, a->ffn_xn, w.w1, N, D, Fl);    /* [N, Fl] */
    column_parallel_linear_forward(a->ffn_b, a->ffn_xn, w.w3, N, D, Fl);    /* [N, Fl] */
    swiglu_forward(a->ffn_g, a->ffn_a, a->ffn_b, (size_t)N * Fl);           /* element-wise: local */
    row_parallel_linear_forward(h_out, a->ffn_g, w.w2, N, Fl, D);           /* partial [N, D] */
    /* BEGIN ASSIGNMENT: g: sum the ffn units' partial outputs over the tp group */
    tp_reduce_from_region_forward(m->tp, h_out, ND);                        /* g: all-reduce */
    /* END ASSIGNMENT */
    add_inplace(h_out, a->h_mid, ND);                                       /* residual */
}

/* ------------------------------------------------------------------------------------------
 * One layer, backward. dh[N, D]: d/d h_out in, d/d h_in out. Replicated on every rank.
 * ------------------------------------------------------------------------------------------ */
void tp_layer_backward(tp_llama *m, int l, float *dh) {
    const llama_config *c = &m->c;
    tp_layer_weights w = tp_layer_view(m->w, m->w->params, l);
    tp_layer_weights g = tp_layer_view(m->w, m->w->grads, l);
    tp_layer_acts *a = &m->acts[l];
    int B = m->B, T = m->T, N = m->N, D = c->dim, hd = m->hd;
    int Hl = m->Hl, Hkvl = m->Hkvl, Fl = m->Fl;
    size_t ND = (size_t)N * D;

    /* ---- feed-forward block ---- */
    tp_reduce_from_region_backward(m->tp, dh, ND);                          /* g backward: identity */
    row_parallel_linear_backward(m->dffn_g, g.w2, dh, a->ffn_g, w.w2, N, Fl, D);
    swiglu_backward(m->dffn_a, m->dffn_b, m->dffn_g, a->ffn_a, a->ffn_b, (size_t)N * Fl);
    /* dxn = dffn_a w1 + dffn_b w3, but only over this rank's Fl units: a partial sum */
    column_parallel_linear_backward(m->dxn, g.w1, m->dffn_a, a->ffn_xn, w.w1, N, D, Fl);
    column_parallel_linear_backward(m->dxn_part, g.w3, m->dffn_b, a->ffn_xn, w.w3, N, D, Fl);
    add_inplace(m->dxn, m->dxn_part, ND);
    if (!m->skip_backward_allreduce)
        tp_copy_to_region_backward(m->tp, m->dxn, ND);                      /* f backward: all-reduce */
    /* dh += d/d h_mid through ffn_norm (replicated: same on every rank, so are the norm grads) */
    rmsnorm_backward(dh, g.ffn_norm, m->dxn, a->h_mid, w.ffn_norm, a->ffn_rstd, N, D);

    /* ---- attention block ---- */
    tp_reduce_from_region_backward(m->tp, dh, ND);                          /* g backward: identity */
    row_parallel_linear_backward(m->dattn_out, g.wo, dh, a->attn_out, w.wo, N, Hl * hd, D);
    attention_backward(m->dq, m->dk, m->dv, m->dprobs, m->dattn_out, a->q, a->k, a->v, a->probs,
                       B, T, Hl, Hkvl, hd);
    rope_backward(m->dq, m->positions, B, T, Hl, hd, c->rope_theta);
    rope_backward(m->dk, m->positions, B, T, Hkvl, hd, c->rope_theta);
    /* dxn = dq wq + dk wk + dv wv over this rank's heads: a partial sum */
    column_parallel_linear_backward(m->dxn, g.wq, m->dq, a->attn_xn, w.wq, N, D, Hl * hd);
    column_parallel_linear_backward(m->dxn_part, g.wk, m->dk, a->attn_xn, w.wk, N, D, Hkvl * hd);
    add_inplace(m->dxn, m->dxn_part, ND);
    column_parallel_linear_backward(m->dxn_part, g.wv, m->dv, a->attn_xn, w.wv, N, D, Hkvl * hd);
    add_inplace(m->dxn, m->dxn_part, ND);
    /* BEGIN ASSIGNMENT: f backward: sum the heads' partial input gradients (unless the bug flag is set) */
    if (!m->skip_backward_allreduce)
        tp_copy_to_region_backward(m->tp, m->dxn, ND);                      /* f backward: all-reduce */
    /* END ASSIGNMENT */
    rmsnorm_backward(dh, g.attention_norm, m->dxn, a->h_in, w.attention_norm, a->attn_rstd, N, D);
}

/* ------------------------------------------------------------------------------------------
 * The whole model. The embedding, final norm, output layer and loss are replicated: every
 * rank computes the same [N, V] logits (chapter 02 splits them).
 * ------------------------------------------------------------------------------------------ */
float tp_llama_forward(tp_llama *m, const int *tokens, const int *targets, const int *positions,
                       float loss_scale) {
    const llama_config *c = &m->c;
    int N = m->N, D = c->dim, V = c->vocab_size, L = c->n_layers;
    int i_norm = m->w->nparams - 2, i_out = m->w->nparams - 1;
    device_copy(m->tokens, tokens, (size_t)N * sizeof(int));
    device_copy(m->targets, targets, (size_t)N * sizeof(int));
    device_copy(m->positions, positions, (size_t)m->T * sizeof(int));
    m->loss_scale = loss_scale;

    embedding_forward(m->acts[0].h_in, m->tokens, tp_param(m->w, 0), N, D, 0, V);
    for (int l = 0; l < L; l++)
        tp_layer_forward(m, l, l + 1 < L ? m->acts[l + 1].h_in : m->h_final);
    rmsnorm_forward(m->final_xn, m->final_rstd, m->h_final, tp_param(m->w, i_norm), N, D, c->norm_eps);
    linear_forward(m->logits, m->final_xn, tp_param(m->w, i_out), N, D, V);
    return cross_entropy_forward(m->logits, m->targets, N, V) * loss_scale;
}

void tp_llama_backward(tp_llama *m) {
    const llama_config *c = &m->c;
    int N = m->N, D = c->dim, V = c->vocab_size;
    int i_norm = m->w->nparams - 2, i_out = m->w->nparams - 1;
    cross_entropy_backward(m->logits, m->logits, m->targets, N, V, m->loss_scale);
    linear_backward(m->dxn, tp_grad(m->w, i_out), m->logits, m->final_xn, tp_param(m->w, i_out), N, D, V);
    device_zero(m->dh, (size_t)N * D * sizeof(float));
    rmsnorm_backward(m->dh, tp_grad(m->w, i_norm), m->dxn, m->h_final, tp_param(m->w, i_norm),
                     m->final_rstd, N, D);
    for (int l = c->n_layers - 1; l >= 0; l--) tp_layer_backward(m, l, m->dh);
    embedding_backward(tp_grad(m->w, 0), m->dh, m->tokens, N, D, 0, V);
}

