/* model.c: the Llama model, forward and backward, written once (model.h).
 *
 * Read it as the single-device model first: with plan_single_device() every operator of the
 * plan is the identity or the local kernel, and what remains is llm.c's recipe: a plain
 * sequence of layer calls (llama_kernels.h), every tensor saved for backward named with its
 * shape, and a backward pass that walks the same sequence in reverse. Then read a chapter's plan
 * to see what each operator becomes on several ranks.
 *
 * A linear's backward overwrites its input gradient dx (DX_SET), except where several linears read
 * the same input: wk and wv add to wq's dx, w3 to w1's (DX_ADD). rmsnorm backward and every weight
 * gradient accumulate (+=).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "kernels.h"
#include "llama_kernels.h"
#include "model.h"
#include "seq_layout.h"

/* ---------------------------------------------------------------------------------------------
 * Shapes and memory
 * --------------------------------------------------------------------------------------------- */
/* llama_dims_make's shapes but the row counts N and Ns: a bound computed before the sizes are
 * checked must not form B*T in an int (--batch and --seq-len go to 2^20 each). */
static llama_dims plan_dims(const llama_config *c, const llama_plan *plan, int B) {
    int p = plan->groups.tp ? plan->groups.tp->size : 1, r = plan->groups.tp ? plan->groups.tp->rank : 0;
    int split_heads = plan->layout[P_WQ] == SHARD_ROWS ? p : 1;
    int split_kv = plan->layout[P_WK] == SHARD_ROWS ? p : 1;
    int split_ffn = plan->layout[P_W1] == SHARD_ROWS ? p : 1;
    int split_vocab = plan->layout[P_OUTPUT] == SHARD_ROWS ? p : 1;
    llama_dims d;
    d.B = B;
    d.T = c->seq_len / (plan->groups.cp ? plan->groups.cp->size : 1);    /* this rank's rows of each sequence */
    d.Ts = d.T / plan->sequence.shards;
    d.N = d.Ns = 0;
    d.D = c->dim;
    d.hd = llama_head_dim(c);
    d.Hl = c->n_heads / split_heads;
    d.Hkvl = c->n_kv_heads / split_kv;
    d.Fl = c->ffn_dim / split_ffn;
    /* split, the vocabulary is padded (02: llama_padded_vocab; a rank's rows past V are padding) */
    d.Vl = plan->layout[P_OUTPUT] == SHARD_ROWS ? llama_padded_vocab(c, p) / split_vocab : c->vocab_size;
    d.v0 = split_vocab > 1 ? r * d.Vl : 0;
    d.probs = plan->attention.saved_numel ? plan->attention.saved_numel(plan->attention.state, plan, B, d.T, d.Hl)
                                          : (size_t)B * d.Hl * d.T * d.T;
    return d;
}

llama_dims llama_dims_make(const llama_config *c, const llama_plan *plan, int B) {
    llama_dims d = plan_dims(c, plan, B);
    d.N = B * d.T;
    d.Ns = B * d.Ts;
    return d;
}

/* ---------------------------------------------------------------------------------------------
 * What the forward saves for backward, described once: every tensor's shape in the dims this
 * rank holds. The model allocates from these tables (layer_acts_alloc, llama_saved_alloc) and
 * every activation formula is their sum: llama_layer_act_bytes and llama_head_act_bytes (which
 * chapters 01, 02, 03 and 08's --plan print beside the allocator's count) and llama_model_bytes.
 * --------------------------------------------------------------------------------------------- */
typedef enum { ROWS_STREAM, ROWS_REGION, ROWS_1, N_ROWS } act_rows;   /* Ns, N, 1 */
typedef enum { COLS_D, COLS_1, COLS_Q, COLS_KV, COLS_F, COLS_V, COLS_PROBS, COLS_LOSS, N_COLS } act_cols;
typedef struct { act_rows rows; act_cols cols; } act_shape;

/* One layer's, by ACT_* (model.h's llama_layer_acts names them). */
static const act_shape layer_act_shape[ACT_NLAYER] = {
    [ACT_H_IN]      = {ROWS_STREAM, COLS_D},      /* [Ns, D]                                  */
    [ACT_ATTN_XN]   = {ROWS_STREAM, COLS_D},      /* [Ns, D]                                  */
    [ACT_ATTN_RSTD] = {ROWS_STREAM, COLS_1},      /* [Ns]                                     */
    [ACT_Q]         = {ROWS_REGION, COLS_Q},      /* [N, Hl*hd]                               */
    [ACT_K]         = {ROWS_REGION, COLS_KV},     /* [N, Hkvl*hd]                             */
    [ACT_V]         = {ROWS_REGION, COLS_KV},     /* [N, Hkvl*hd]                             */
    [ACT_PROBS]     = {ROWS_1,      COLS_PROBS},  /* the attention's: [B, Hl, T, T] locally   */
    [ACT_ATTN_OUT]  = {ROWS_REGION, COLS_Q},      /* [N, Hl*hd]                               */
    [ACT_H_MID]     = {ROWS_STREAM, COLS_D},      /* [Ns, D]                                  */
    [ACT_FFN_XN]    = {ROWS_STREAM, COLS_D},      /* [Ns, D]                                  */
    [ACT_FFN_RSTD]  = {ROWS_STREAM, COLS_1},      /* [Ns]                                     */
    [ACT_FFN_A]     = {ROWS_REGION, COLS_F},      /* [N, Fl]                                  */
    [ACT_FFN_B]     = {ROWS_REGION, COLS_F},      /* [N, Fl]                                  */
    [ACT_FFN_G]     = {ROWS_REGION, COLS_F},      /* [N, Fl]                                  */
};

/* The head's, kept in every mode, in llama_saved's order. */
enum { HEAD_H_FINAL, HEAD_FINAL_XN, HEAD_FINAL_RSTD, HEAD_LOGITS, HEAD_LOSS_STATS, HEAD_NACTS };
static const act_shape head_act_shape[HEAD_NACTS] = {
    [HEAD_H_FINAL]    = {ROWS_STREAM, COLS_D},    /* [Ns, D]                                  */
    [HEAD_FINAL_XN]   = {ROWS_STREAM, COLS_D},    /* [Ns, D]                                  */
    [HEAD_FINAL_RSTD] = {ROWS_STREAM, COLS_1},    /* [Ns]                                     */
    [HEAD_LOGITS]     = {ROWS_REGION, COLS_V},    /* [N, Vl]                                  */
    [HEAD_LOSS_STATS] = {ROWS_REGION, COLS_LOSS}, /* [N, the loss's saved_per_row]            */
};

/* The sizes the shapes are written in, as doubles: exact, and the rows are B*T and B*Ts, never an
 * int product (plan_dims). */
typedef struct { double rows[N_ROWS], cols[N_COLS]; } act_sizes;

static act_sizes act_sizes_of(const llama_dims *d, int loss_saved_per_row) {
    act_sizes z;
    z.rows[ROWS_STREAM] = (double)d->B * d->Ts;
    z.rows[ROWS_REGION] = (double)d->B * d->T;
    z.rows[ROWS_1] = 1;
    z.cols[COLS_D] = d->D;
    z.cols[COLS_1] = 1;
    z.cols[COLS_Q] = (double)d->Hl * d->hd;
    z.cols[COLS_KV] = (double)d->Hkvl * d->hd;
    z.cols[COLS_F] = d->Fl;
    z.cols[COLS_V] = d->Vl;
    z.cols[COLS_PROBS] = (double)d->probs;
    z.cols[COLS_LOSS] = loss_saved_per_row;
    return z;
}

static double act_elems(const act_sizes *z, act_shape s) { return z->rows[s.rows] * z->cols[s.cols]; }

/* Elements of the layer activations `keep` names (ACT_* bits). */
static double layer_elems(const act_sizes *z, unsigned keep) {
    double n = 0;
    for (int i = 0; i < ACT_NLAYER; i++)
        if (keep & (1u << i)) n += act_elems(z, layer_act_shape[i]);
    return n;
}

static double head_elems(const act_sizes *z) {
    double n = 0;
    for (int i = 0; i < HEAD_NACTS; i++) n += act_elems(z, head_act_shape[i]);
    return n;
}

size_t llama_act_numel(const llama_dims *d, int act) {
    act_sizes z = act_sizes_of(d, 0);
    return (size_t)act_elems(&z, layer_act_shape[act]);
}

double llama_layer_act_bytes(const llama_dims *d, unsigned keep) {
    act_sizes z = act_sizes_of(d, 0);
    return 4 * layer_elems(&z, keep);
}

double llama_head_act_bytes(const llama_dims *d, int loss_saved_per_row) {
    act_sizes z = act_sizes_of(d, loss_saved_per_row);
    return 4 * head_elems(&z);
}

double llama_model_bytes(const llama_config *c, const llama_plan *plan, int B, double *state_bytes,
                         double *act_bytes, double *largest_numel) {
    double p = plan->groups.tp ? plan->groups.tp->size : 1, largest = 0, state = 0;
    double S = plan->groups.mesh ? mesh_size_over(&plan->groups.mesh->shape, param_shard_dims(plan->groups.shard_dims))
                                 : 1;   /* the shard group */
    for (int i = 0; i < llama_num_params(c); i++) {           /* every tensor's local slice */
        param_spec s = llama_param_spec(c, i);
        if (!plan_holds(plan, c->n_layers, s.kind, s.layer)) continue;
        double numel = (double)s.rows * s.cols / (plan->layout[s.kind] == SHARD_REPLICATED ? 1 : p);
        for (int b = 0; b < PARAM_NBLOCKS; b++)               /* values, gradients, m and v */
            state += (b == PARAM_OPTIM ? 8 : 4) * numel / (plan->storage[b] == STORE_SHARD ? S : 1);
        largest = fmax(largest, numel);
    }
    llama_dims d = plan_dims(c, plan, B);
    act_sizes z = act_sizes_of(&d, plan->loss.saved_per_row);
    double N = z.rows[ROWS_REGION], Ns = z.rows[ROWS_STREAM], D = z.cols[COLS_D], q = z.cols[COLS_Q];
    double kv = z.cols[COLS_KV], F = z.cols[COLS_F], V = z.cols[COLS_V], probs = z.cols[COLS_PROBS];
    int held_layers = 0;
    for (int l = 0; l < c->n_layers; l++) held_layers += plan_holds(plan, c->n_layers, P_WQ, l);
    double acts = 4 * (held_layers * layer_elems(&z, ACT_KEEP_ALL)   /* an upper bound: every tensor kept */
                       + head_elems(&z) + N                          /* the head's, the loss's scratch */
                       + 5 * N * D + 2 * Ns * D + 2 * N * q + 2 * N * kv + probs + 3 * N * F + 3 * N); /* scratch */
    double tensors[] = {N * V, N * D, N * q, N * F, probs};
    for (size_t i = 0; i < sizeof tensors / sizeof *tensors; i++) largest = fmax(largest, tensors[i]);
    if (state_bytes) *state_bytes = state;
    if (act_bytes) *act_bytes = acts;
    if (largest_numel) *largest_numel = largest;
    return state + acts;
}

/* A layer's activations: what `keep` names is the layer's own (MEM_ACTIVATIONS), the rest points
 * into `shared`. With shared == NULL the dropped tensors are allocated as the shared set. */
static void layer_acts_alloc(llama_layer_acts *a, const llama_dims *d, unsigned keep,
                             const llama_layer_acts *shared) {
    for (int i = 0; i < ACT_NLAYER; i++) {
        bool kept = keep & (1u << i);
        if (shared) a->t[i] = kept ? device_alloc_floats(llama_act_numel(d, i), MEM_ACTIVATIONS) : shared->t[i];
        else a->t[i] = kept ? NULL : device_alloc_floats(llama_act_numel(d, i), MEM_BUFFERS);
    }
}
static void layer_acts_free(llama_layer_acts *a, const llama_layer_acts *shared) {
    for (int i = 0; i < ACT_NLAYER; i++)
        if (!shared || a->t[i] != shared->t[i]) device_free(a->t[i]);
}

size_t llama_layer_act_bytes_measured(const llama_dims *d, unsigned keep) {
    llama_layer_acts shared, a;
    layer_acts_alloc(&shared, d, keep, NULL);
    size_t before = mem_current(MEM_ACTIVATIONS);
    layer_acts_alloc(&a, d, keep, &shared);
    size_t bytes = mem_current(MEM_ACTIVATIONS) - before;
    layer_acts_free(&a, &shared);
    layer_acts_free(&shared, NULL);
    return bytes;
}

/* The buffer of the whole sequence when the plan splits it, else the local tensor itself. */
static float *whole(const llama_model *m, float *full_buffer, float *local) {
    return m->plan->sequence.shards > 1 ? full_buffer : local;
}

void llama_saved_alloc(llama_model *m, llama_saved *s, int l0, int l1) {
    const llama_dims *d = &m->d;
    size_t N = d->N;
    memset(s, 0, sizeof *s);
    s->l0 = l0;
    s->l1 = l1;
    s->layers = calloc((size_t)m->c.n_layers, sizeof *s->layers);
    for (int l = l0; l < l1; l++) {
        size_t before = mem_current(MEM_ACTIVATIONS);
        layer_acts_alloc(&s->layers[l], d, m->plan->checkpoint.keep, &m->shared);
        m->layer_act_bytes[l] = mem_current(MEM_ACTIVATIONS) - before;
        s->layer_bytes += m->layer_act_bytes[l];
    }
    s->tokens = device_alloc_ints(N, MEM_BUFFERS);
    s->targets = device_alloc_ints(N, MEM_BUFFERS);
    if (l1 < m->c.n_layers) return;
    /* the head's, kept in every mode (loss_stats NULL when the loss saves nothing) */
    float **head[HEAD_NACTS] = {[HEAD_H_FINAL] = &s->h_final, [HEAD_FINAL_XN] = &s->final_xn,
                                [HEAD_FINAL_RSTD] = &s->final_rstd, [HEAD_LOGITS] = &s->logits,
                                [HEAD_LOSS_STATS] = &s->loss_stats};
    act_sizes z = act_sizes_of(d, m->plan->loss.saved_per_row);
    for (int i = 0; i < HEAD_NACTS; i++) {
        size_t n = (size_t)act_elems(&z, head_act_shape[i]);
        *head[i] = n ? device_alloc_floats(n, MEM_ACTIVATIONS) : NULL;
    }
}

void llama_saved_free(llama_model *m, llama_saved *s) {
    for (int l = s->l0; l < s->l1; l++) layer_acts_free(&s->layers[l], &m->shared);
    float *bufs[] = {s->h_final, s->final_xn, s->final_rstd, s->logits, s->loss_stats};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) device_free(bufs[i]);
    device_free(s->tokens);
    device_free(s->targets);
    free(s->layers);
    memset(s, 0, sizeof *s);
}

llama_model *llama_create(const llama_config *c, const llama_plan *plan, int B, uint64_t seed) {
    llama_model *m = calloc(1, sizeof *m);
    m->c = *c;
    m->plan = plan;
    bool *here = malloc((size_t)llama_num_params(c) * sizeof *here);   /* a pipeline stage's tensors */
    for (int i = 0; i < llama_num_params(c); i++) {
        param_spec s = llama_param_spec(c, i);
        here[i] = plan_holds(plan, c->n_layers, s.kind, s.layer);
    }
    m->params = param_table_create(c, plan->groups.mesh, plan->layout, plan->storage, plan->groups.shard_dims,
                                   here, seed);
    free(here);
    m->d = llama_dims_make(c, plan, B);
    const llama_dims *d = &m->d;
    size_t N = d->N, Ns = d->Ns, D = d->D, T = d->T, L = c->n_layers;
    size_t q_dim = (size_t)d->Hl * d->hd, kv_dim = (size_t)d->Hkvl * d->hd, Fl = d->Fl;
    bool split = plan->sequence.shards > 1;

    /* What the layers keep, measured layer by layer by the allocator: the model's own set, unless
     * the plan keeps one per microbatch itself (a pipeline schedule). */
    layer_acts_alloc(&m->shared, d, plan->checkpoint.keep, NULL);
    m->layer_act_bytes = calloc(L, sizeof *m->layer_act_bytes);
    if (!plan->schedule.forward_backward) {
        llama_saved_alloc(m, &m->own, 0, (int)L);
        m->saved = &m->own;
    }
    m->loss_scratch = device_alloc_floats(N, MEM_BUFFERS);
    m->positions = device_alloc_ints(T, MEM_BUFFERS);
    if (plan->groups.cp) {
        size_t rows = (size_t)B * (plan->schedule.microbatches > 1 ? plan->schedule.microbatches : 1);
        m->cp_tokens = device_alloc_ints(rows * T, MEM_BUFFERS);
        m->cp_targets = device_alloc_ints(rows * T, MEM_BUFFERS);
    }
    int *pos = malloc(T * sizeof(int));
    for (size_t t = 0; t < T; t++) pos[t] = (int)t;
    if (plan->sequence.positions) plan->sequence.positions(plan->sequence.state, plan, pos, (int)T);
    device_copy_to_device(m->positions, pos, T * sizeof(int));
    free(pos);
    m->rope_cos_sin = device_alloc_floats(T * d->hd, MEM_BUFFERS);   /* [T, hd/2, 2], once */
    rope_table(m->rope_cos_sin, m->positions, (int)T, d->hd, c->rope_theta);

    /* Scratch. */
    if (split) {
        m->attn_in = device_alloc_floats(N * D, MEM_BUFFERS);
        m->ffn_in = device_alloc_floats(N * D, MEM_BUFFERS);
        m->y_partial = device_alloc_floats(N * D, MEM_BUFFERS);
        m->dy_full = device_alloc_floats(N * D, MEM_BUFFERS);
        m->dxn = device_alloc_floats(Ns * D, MEM_BUFFERS);
    }
    m->dxn_full = device_alloc_floats(N * D, MEM_BUFFERS);
    m->dh = device_alloc_floats(Ns * D, MEM_BUFFERS);
    m->dattn_out = device_alloc_floats(N * q_dim, MEM_BUFFERS);
    m->dq = device_alloc_floats(N * q_dim, MEM_BUFFERS);
    m->dk = device_alloc_floats(N * kv_dim, MEM_BUFFERS);
    m->dv = device_alloc_floats(N * kv_dim, MEM_BUFFERS);
    m->dprobs = device_alloc_floats(llama_act_numel(d, ACT_PROBS), MEM_BUFFERS);
    m->dffn_g = device_alloc_floats(N * Fl, MEM_BUFFERS);
    m->dffn_a = device_alloc_floats(N * Fl, MEM_BUFFERS);
    m->dffn_b = device_alloc_floats(N * Fl, MEM_BUFFERS);
    return m;
}

llama_model *llama_create_baseline(const llama_config *c, int B, uint64_t seed) {
    static llama_plan single;   /* the same for every baseline: no mesh, no state */
    single = plan_single_device();
    return llama_create(c, &single, B, seed);
}

void llama_free(llama_model *m) {
    if (!m) return;
    if (m->saved == &m->own) llama_saved_free(m, &m->own);
    layer_acts_free(&m->shared, NULL);
    float *bufs[] = {m->loss_scratch, m->attn_in, m->ffn_in, m->y_partial, m->dy_full, m->dxn,
                     m->dxn_full, m->dh, m->dattn_out, m->dq, m->dk, m->dv,
                     m->dprobs, m->dffn_g, m->dffn_a, m->dffn_b};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) device_free(bufs[i]);   /* NULL: no-op */
    device_free(m->positions);
    device_free(m->rope_cos_sin);
    device_free(m->cp_tokens);
    device_free(m->cp_targets);
    param_table_free(m->params);
    free(m->layer_act_bytes);
    free(m);
}

/* ---------------------------------------------------------------------------------------------
 * One layer, forward: h_in [Ns, D] -> h_out [Ns, D], from the layer's weights w.
 * --------------------------------------------------------------------------------------------- */
static void layer_forward(llama_model *m, int l, float *h_out, const unit_weights *wp) {
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    const unit_weights w = *wp;
    llama_layer_acts *a = &m->saved->layers[l];
    int B = d->B, T = d->T, N = d->N, Ns = d->Ns, D = d->D, hd = d->hd;
    int Hl = d->Hl, Hkvl = d->Hkvl, Fl = d->Fl;
    proj_rows rows = {B, T, d->Ts, D};
    float eps = m->c.norm_eps;
    float *attn_in = whole(m, m->attn_in, a->attn_xn);     /* [N, D] */
    float *ffn_in = whole(m, m->ffn_in, a->ffn_xn);        /* [N, D] */

    /* ---- attention block: h_mid = h_in + wo(attention(rope(wq n), rope(wk n), wv n)) ---- */
    /* attn_xn[Ns, D] = rmsnorm(h_in) * attention_norm */
    rmsnorm_forward(a->attn_xn, a->attn_rstd, a->h_in, w.attention_norm, Ns, D, eps);
    /* the region's entry, attn_in[N, D] (every token of the sequence), then q[N, Hl*hd], k and v
     * [N, Hkvl*hd]: three projections of the same normed input (one proj_in group) */
    proj_linear qkv[3] = {{.site = {P_WQ, l}, .W = w.wq, .y = a->q, .width = Hl * hd},
                          {.site = {P_WK, l}, .W = w.wk, .y = a->k, .width = Hkvl * hd},
                          {.site = {P_WV, l}, .W = w.wv, .y = a->v, .width = Hkvl * hd}};
    p->proj.in_forward(p->proj.state, p, &p->region, attn_in, a->attn_xn, qkv, 3, rows);
    /* positions enter through RoPE only: rotate q and k (not v) in place */
    rope_forward(a->q, m->rope_cos_sin, B, T, Hl, hd);
    rope_forward(a->k, m->rope_cos_sin, B, T, Hkvl, hd);
    /* attn_out[N, Hl*hd] = softmax(q k^T / sqrt(hd), causal) v; probs[B, Hl, T, T] saved */
    p->attention.forward(p->attention.state, p, a->attn_out, a->probs, a->q, a->k, a->v, B, T, Hl, Hkvl, hd);
    /* partial[N, D] = attn_out wo^T (this rank's heads' share), then the region's exit: h_mid [Ns, D] */
    proj_linear wo = {.site = {P_WO, l}, .W = w.wo, .width = Hl * hd};
    p->proj.out_forward(p->proj.state, p, &p->region, a->h_mid, whole(m, m->y_partial, a->h_mid), a->attn_out, &wo, rows);

    /* ---- feed-forward block: h_out = h_mid + w2(silu(w1 m) * w3 m) ---- */
    /* h_mid[Ns, D] += h_in (the residual), then ffn_xn[Ns, D] = rmsnorm(h_mid) * ffn_norm, in one
     * pass over each row */
    residual_rmsnorm_forward(a->h_mid, a->ffn_xn, a->ffn_rstd, a->h_in, w.ffn_norm, Ns, D, eps);
    /* the region's entry, ffn_in [N, D], then ffn_a, ffn_b [N, Fl]: the gate and the up projection */
    proj_linear w13[2] = {{.site = {P_W1, l}, .W = w.w1, .y = a->ffn_a, .width = Fl},
                          {.site = {P_W3, l}, .W = w.w3, .y = a->ffn_b, .width = Fl}};
    p->proj.in_forward(p->proj.state, p, &p->region, ffn_in, a->ffn_xn, w13, 2, rows);
    /* ffn_g[N, Fl] = silu(ffn_a) * ffn_b, element-wise */
    swiglu_forward(a->ffn_g, a->ffn_a, a->ffn_b, (size_t)N * Fl);
    if (!h_out) return;     /* a recomputation: backward needs w2's input, not its output */
    /* partial [N, D] = ffn_g w2^T, then the region's exit: h_out [Ns, D] */
    proj_linear w2 = {.site = {P_W2, l}, .W = w.w2, .width = Fl};
    p->proj.out_forward(p->proj.state, p, &p->region, h_out, whole(m, m->y_partial, h_out), a->ffn_g, &w2, rows);
    add_inplace(h_out, a->h_mid, (size_t)Ns * D);                     /* residual */
}

void llama_layer_forward(llama_model *m, int l, float *h_out) {
    const llama_plan *p = m->plan;
    unit_weights w, g;
    p->weights.acquire(p->weights.state, p, m, l, false, &w, &g);
    layer_forward(m, l, h_out, &w);
    p->weights.release(p->weights.state, p, m, l, false);
}

void llama_layer_recompute(llama_model *m, int l, const unit_weights *w) { layer_forward(m, l, NULL, w); }

/* Before layer l's backward: what the checkpointing policy did not keep, then the region's
 * inputs (the column-parallel linears' weight gradients need the whole sequence; when the plan
 * splits it, only this rank's shard was kept and later layers reused the buffers). */
static void layer_restore(llama_model *m, int l, const unit_weights *w) {
    const llama_plan *p = m->plan;
    llama_layer_acts *a = &m->saved->layers[l];
    if (p->checkpoint.recompute && p->checkpoint.recompute(p->checkpoint.state, m, l, w)) return;   /* a full recomputation re-entered already */
    p->region.enter_forward(p->region.state, p, whole(m, m->attn_in, a->attn_xn), a->attn_xn, m->d.B, m->d.Ts, m->d.D);
    p->region.enter_forward(p->region.state, p, whole(m, m->ffn_in, a->ffn_xn), a->ffn_xn, m->d.B, m->d.Ts, m->d.D);
}

/* ---------------------------------------------------------------------------------------------
 * One layer, backward: dh [Ns, D] holds d/d h_out on entry, d/d h_in on return.
 * --------------------------------------------------------------------------------------------- */
void llama_layer_backward(llama_model *m, int l, float *dh) {
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    unit_weights w, g;
    p->weights.acquire(p->weights.state, p, m, l, true, &w, &g);
    llama_layer_acts *a = &m->saved->layers[l];
    int B = d->B, T = d->T, N = d->N, Ns = d->Ns, D = d->D, hd = d->hd;
    int Hl = d->Hl, Hkvl = d->Hkvl, Fl = d->Fl;
    proj_rows rows = {B, T, d->Ts, D};

    layer_restore(m, l, &w);
    float *attn_in = whole(m, m->attn_in, a->attn_xn);     /* [N, D] */
    float *ffn_in = whole(m, m->ffn_in, a->ffn_xn);        /* [N, D] */
    float *dy = whole(m, m->dy_full, dh);                   /* [N, D] */
    float *dxn = whole(m, m->dxn, m->dxn_full);             /* [Ns, D] */

    /* ---- feed-forward block. h_out = h_mid + w2(g): the residual path passes dh through
     * unchanged, the branch adds its part below. ---- */
    /* the region's exit backward, dy[N, D] = d/d (w2's output); then dffn_g[N, Fl] = dy w2 and
     * d w2 += dy^T ffn_g */
    proj_linear w2 = {.site = {P_W2, l}, .W = w.w2, .dW = g.w2, .width = Fl};
    p->proj.out_backward(p->proj.state, p, &p->region, m->dffn_g, dy, dh, a->ffn_g, &w2, rows);
    /* dffn_a, dffn_b [N, Fl] through silu(a) * b */
    swiglu_backward(m->dffn_a, m->dffn_b, m->dffn_g, a->ffn_a, a->ffn_b, (size_t)N * Fl);
    /* dxn_full[N, D] = dffn_a w1 + dffn_b w3 (this rank's units' share): ffn_in feeds both, so
     * the second GEMM adds onto the first's output; then the region's entry backward, dxn[Ns, D]
     * summed over ranks */
    proj_linear w13[2] = {{.site = {P_W1, l}, .W = w.w1, .dW = g.w1, .dy = m->dffn_a, .width = Fl},
                          {.site = {P_W3, l}, .W = w.w3, .dW = g.w3, .dy = m->dffn_b, .width = Fl}};
    p->proj.in_backward(p->proj.state, p, &p->region, dxn, m->dxn_full, ffn_in, w13, 2, rows);
    /* dh += d/d h_mid through ffn_norm: dh now holds d loss / d h_mid */
    rmsnorm_backward(dh, g.ffn_norm, dxn, a->h_mid, w.ffn_norm, a->ffn_rstd, Ns, D);

    /* ---- attention block: h_mid = h_in + wo(attn_out), the same pattern ---- */
    /* dy[N, D] through the exit; dattn_out[N, Hl*hd] = dy wo;  d wo += dy^T attn_out */
    proj_linear wo = {.site = {P_WO, l}, .W = w.wo, .dW = g.wo, .width = Hl * hd};
    p->proj.out_backward(p->proj.state, p, &p->region, m->dattn_out, dy, dh, a->attn_out, &wo, rows);
    /* dq, dk, dv: gradients of the rotated q and k and of v */
    p->attention.backward(p->attention.state, p, m->dq, m->dk, m->dv, m->dprobs, m->dattn_out, a->attn_out, a->q, a->k,
                          a->v, a->probs, B, T, Hl, Hkvl, hd);
    /* undo RoPE's rotation on the gradients: now d/d (wq n) and d/d (wk n) */
    rope_backward(m->dq, m->rope_cos_sin, B, T, Hl, hd);
    rope_backward(m->dk, m->rope_cos_sin, B, T, Hkvl, hd);
    /* dxn_full[N, D] = dq wq + dk wk + dv wv: attn_in feeds three projections (summed in the
     * GEMMs); then the region's entry backward, dxn[Ns, D] */
    proj_linear qkv[3] = {{.site = {P_WQ, l}, .W = w.wq, .dW = g.wq, .dy = m->dq, .width = Hl * hd},
                          {.site = {P_WK, l}, .W = w.wk, .dW = g.wk, .dy = m->dk, .width = Hkvl * hd},
                          {.site = {P_WV, l}, .W = w.wv, .dW = g.wv, .dy = m->dv, .width = Hkvl * hd}};
    p->proj.in_backward(p->proj.state, p, &p->region, dxn, m->dxn_full, attn_in, qkv, 3, rows);
    /* dh += d/d h_in through attention_norm: dh now holds d loss / d h_in */
    rmsnorm_backward(dh, g.attention_norm, dxn, a->h_in, w.attention_norm, a->attn_rstd, Ns, D);
    p->weights.release(p->weights.state, p, m, l, true);
}

/* ---------------------------------------------------------------------------------------------
 * The whole model
 * --------------------------------------------------------------------------------------------- */
/* The pieces outside the layers, from the ends' weights w (gradients into g). */

/* tokens [N] -> h0 = saved->layers[0].h_in [Ns, D]: look up the rows of the tokens this rank's
 * table holds (zero rows for the rest), then the vocabulary's exit sums the ranks' lookups
 * (identity with the whole table). */
static void embed_forward(llama_model *m, const int *tokens, const unit_weights *w) {
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    llama_saved *s = m->saved;
    device_copy(s->tokens, tokens, (size_t)d->N * sizeof(int));   /* the backward needs them */
    float *h0 = s->layers[0].h_in, *looked_up = whole(m, m->y_partial, h0);   /* [N, D] */
    embedding_forward(looked_up, s->tokens, w->tok_embeddings, d->N, d->D, d->v0, d->Vl);
    p->vocab.exit_forward(p->vocab.state, p, h0, looked_up, d->B, d->Ts, d->D);
}

/* saved->h_final [Ns, D], targets [N] -> the sum of the token losses times loss_scale. */
static float head_forward(llama_model *m, const int *targets, float loss_scale, const unit_weights *w) {
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    llama_saved *s = m->saved;
    int N = d->N, Vl = d->Vl, v0 = d->v0;
    device_copy(s->targets, targets, (size_t)N * sizeof(int));     /* the backward needs them */
    s->loss_scale = loss_scale;
    /* final_xn[Ns, D] = rmsnorm(h_final) * norm, entering the vocabulary's region */
    rmsnorm_forward(s->final_xn, s->final_rstd, s->h_final, w->norm, d->Ns, d->D, m->c.norm_eps);
    /* the vocabulary's entry, xn [N, D] (attn_in is free here), then logits[N, Vl] = xn output^T:
     * this rank's vocabulary rows (a proj_in group of one) */
    proj_linear output = {.site = {P_OUTPUT, -1}, .W = w->output, .y = s->logits, .width = Vl};
    p->proj.in_forward(p->proj.state, p, &p->vocab, whole(m, m->attn_in, s->final_xn), s->final_xn, &output, 1,
                       (proj_rows){d->B, d->T, d->Ts, d->D});
    /* the sum over valid targets of -log softmax(logits)[target] */
    float loss_sum = p->loss.forward(p->loss.state, p, s->logits, s->targets, N, Vl, v0, m->c.vocab_size, s->loss_stats,
                                     m->loss_scratch);
    return loss_sum * loss_scale;
}

/* -> dh [Ns, D] = d loss / d h_final (=); d output, d norm += ... */
static void head_backward(llama_model *m, float *dh, const unit_weights *w, const unit_weights *g) {
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    llama_saved *s = m->saved;
    int B = d->B, Ts = d->Ts, N = d->N, Ns = d->Ns, D = d->D, Vl = d->Vl, v0 = d->v0;
    /* dlogits[N, Vl] = (softmax - onehot(target)) * loss_scale, written over the logits */
    p->loss.backward(p->loss.state, p, s->logits, s->logits, s->targets, s->loss_stats, N, Vl, v0, m->c.vocab_size,
                     s->loss_scale);
    /* the output layer's input again (a split sequence kept only this rank's shard of it) */
    float *xn = whole(m, m->attn_in, s->final_xn);
    p->vocab.enter_forward(p->vocab.state, p, xn, s->final_xn, B, Ts, D);
    /* dxn_full[N, D] = dlogits output (this rank's vocabulary rows' share);  d output += dlogits^T xn;
     * then the vocabulary's entry backward, dxn [Ns, D] */
    float *dxn = whole(m, m->dxn, m->dxn_full);
    proj_linear output = {.site = {P_OUTPUT, -1}, .W = w->output, .dW = g->output, .dy = s->logits, .width = Vl};
    p->proj.in_backward(p->proj.state, p, &p->vocab, dxn, m->dxn_full, xn, &output, 1, (proj_rows){B, d->T, Ts, D});
    /* dh[Ns, D] = d loss / d h_final (through the final norm); d norm += ... */
    device_zero(dh, (size_t)Ns * D * sizeof(float));
    rmsnorm_backward(dh, g->norm, dxn, s->h_final, w->norm, s->final_rstd, Ns, D);
}

/* dh [Ns, D] = d loss / d h0: the vocabulary's exit backward gives every token's row to the rank
 * whose table holds it, and each token's row adds into its table row. */
static void embed_backward(llama_model *m, const float *dh, const unit_weights *g) {
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    float *dh0 = whole(m, m->dy_full, (float *)dh);     /* [N, D] */
    p->vocab.exit_backward(p->vocab.state, p, dh0, dh, d->B, d->Ts, d->D);
    embedding_backward(g->tok_embeddings, dh0, m->saved->tokens, d->N, d->D, d->v0, d->Vl);
}

/* The pieces on their own (a pipeline stage runs one end or the other): each acquires the ends'
 * weights (unit L) for itself. */
void llama_embed_forward(llama_model *m, const int *tokens) {
    const llama_plan *p = m->plan;
    unit_weights w, g;
    p->weights.acquire(p->weights.state, p, m, m->c.n_layers, false, &w, &g);
    embed_forward(m, tokens, &w);
    p->weights.release(p->weights.state, p, m, m->c.n_layers, false);
}

float llama_head_forward(llama_model *m, const int *targets, float loss_scale) {
    const llama_plan *p = m->plan;
    unit_weights w, g;
    p->weights.acquire(p->weights.state, p, m, m->c.n_layers, false, &w, &g);
    float loss = head_forward(m, targets, loss_scale, &w);
    p->weights.release(p->weights.state, p, m, m->c.n_layers, false);
    return loss;
}

void llama_head_backward(llama_model *m, float *dh) {
    const llama_plan *p = m->plan;
    unit_weights w, g;
    p->weights.acquire(p->weights.state, p, m, m->c.n_layers, true, &w, &g);
    head_backward(m, dh, &w, &g);
    p->weights.release(p->weights.state, p, m, m->c.n_layers, true);
}

void llama_embed_backward(llama_model *m, const float *dh) {
    const llama_plan *p = m->plan;
    unit_weights w, g;
    p->weights.acquire(p->weights.state, p, m, m->c.n_layers, true, &w, &g);
    embed_backward(m, dh, &g);
    p->weights.release(p->weights.state, p, m, m->c.n_layers, true);
}

/* ---------------------------------------------------------------------------------------------
 * The whole model: the ends' weights acquired once around the layers
 * --------------------------------------------------------------------------------------------- */
float llama_forward(llama_model *m, const int *tokens, const int *targets, float loss_scale) {
    const llama_plan *p = m->plan;
    int L = m->c.n_layers;
    llama_layer_acts *acts = m->saved->layers;
    unit_weights w, g;                                  /* the ends: embedding, final norm, output */
    p->weights.acquire(p->weights.state, p, m, L, false, &w, &g);
    embed_forward(m, tokens, &w);                                        /* h0 = acts[0].h_in */
    for (int l = 0; l < L; l++) llama_layer_forward(m, l, l + 1 < L ? acts[l + 1].h_in : m->saved->h_final);
    float loss = head_forward(m, targets, loss_scale, &w);
    p->weights.release(p->weights.state, p, m, L, false);
    return loss;
}

void llama_backward(llama_model *m) {
    const llama_plan *p = m->plan;
    int L = m->c.n_layers;
    unit_weights w, g;
    p->weights.acquire(p->weights.state, p, m, L, true, &w, &g);
    head_backward(m, m->dh, &w, &g);                    /* dh = d loss / d h_final */
    for (int l = L - 1; l >= 0; l--) llama_layer_backward(m, l, m->dh);
    embed_backward(m, m->dh, &g);                       /* dh is d loss / d h0 */
    p->weights.release(p->weights.state, p, m, L, true);
    if (p->reduce_grads.reduce && !m->accumulating) p->reduce_grads.reduce(p->reduce_grads.state, p, m);
}

void llama_zero_grad(llama_model *m) { param_zero_grads(m->params); }

void llama_adamw_step(llama_model *m, const adamw_config *opt, int step) {
    const optimizer_ops *o = &m->plan->optimizer;
    if (o->step) o->step(o->state, m->plan, m, opt, step);
    else param_adamw_step(m->params, opt, step);
}

void llama_gather_residual(llama_model *m, const float *x_local, int B, float *full) {
    const llama_dims *d = &m->d;
    size_t n = (size_t)B * d->Ts * d->D;
    comm_group *g = m->plan->groups.tp, *batch = m->plan->groups.batch;
    /* 1. this batch slice's [B, T, D] on the tp group's rank 0 (whole on every rank, or its
     *    [p][B][Ts][D] chunks re-laid out when the plan splits the sequence) */
    float *mine = malloc(n * sizeof(float));
    device_copy_to_host(mine, x_local, n * sizeof(float));
    size_t slice = (size_t)B * d->T * d->D;
    float *rows = malloc(slice * sizeof(float));
    if (m->plan->sequence.shards == 1 || !g) {
        memcpy(rows, mine, slice * sizeof(float));
    } else {
        float *chunks = g->rank == 0 ? malloc(n * g->size * sizeof(float)) : NULL;
        comm_host_gather(g, mine, chunks, n, 0);
        if (g->rank == 0)
            for (size_t i = 0; i < slice; i++) rows[i] = chunks[seq_chunk_index(i, g->size, B, d->Ts, d->D)];
        free(chunks);
    }
    /* 2. under context parallelism, the cp ranks' rows [B, Tl, D], each row put at its position in
     *    the whole sequence: [B, T_global, D] on the cp group's rank 0 */
    comm_group *cp = m->plan->groups.cp;
    if (cp) {
        size_t Tl = d->T, T = Tl * cp->size, D = d->D;
        float *pos = malloc(Tl * sizeof(float)), *all_pos = malloc(T * sizeof(float));
        int *ipos = malloc(Tl * sizeof(int));
        device_copy_to_host(ipos, m->positions, Tl * sizeof(int));
        for (size_t t = 0; t < Tl; t++) pos[t] = (float)ipos[t];
        float *all = malloc(slice * cp->size * sizeof(float));
        comm_host_gather(cp, pos, all_pos, Tl, 0);
        comm_host_gather(cp, rows, all, slice, 0);
        free(rows);
        slice *= cp->size;
        rows = malloc(slice * sizeof(float));
        if (cp->rank == 0)
            for (int q = 0; q < cp->size; q++)
                for (int b = 0; b < B; b++)
                    for (size_t t = 0; t < Tl; t++)
                        memcpy(rows + ((size_t)b * T + (size_t)all_pos[q * Tl + t]) * D,
                               all + (((size_t)q * B + b) * Tl + t) * D, D * sizeof(float));
        free(pos); free(all_pos); free(ipos); free(all);
    }
    /* 3. the data-parallel ranks' slices, in batch order, on the batch group's rank 0: world rank
     *    0 is rank 0 of all three groups (every other coordinate of it is 0) */
    bool root = comm_world()->rank == 0;
    if (batch) {   /* every batch group gathers (one per tp rank); only world rank 0's is kept */
        float *all = batch->rank == 0 ? malloc(slice * batch->size * sizeof(float)) : NULL;
        comm_host_gather(batch, rows, all, slice, 0);
        if (root) memcpy(full, all, slice * batch->size * sizeof(float));
        free(all);
    } else if (root) {
        memcpy(full, rows, slice * sizeof(float));
    }
    free(rows);
    free(mine);
}
