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
    d.layer = llama_layer_of(c);
    d.layer_every = c->layer_every;
    /* the experts (09): El of the E on each of the ep ranks */
    d.E = c->moe.experts;
    d.k = c->moe.top_k;
    d.Fe = c->moe.expert_dim;
    d.ep = plan->groups.ep ? plan->groups.ep->size : 1;
    d.El = d.E / d.ep;
    d.e0 = plan->groups.ep ? plan->groups.ep->rank * d.El : 0;
    d.capacity = c->moe.capacity_factor > 0 && d.E > 0 ? moe_capacity(&c->moe, c->seq_len) : 0;
    d.R = 0;
    return d;
}

/* The most rows this rank's experts may receive in one layer. Dropless: every token's k copies on
 * one device; under expert parallelism, every rank's N tokens, each sending at most min(k, El)
 * copies here (its k experts are distinct). With a capacity of C rows per expert and sequence, at
 * most ep x El x (sequences a rank holds) x C, when that is less. */
double llama_expert_rows(const llama_dims *d, double N) {
    double dropless = d->ep == 1 ? N * d->k : (double)d->ep * N * (d->k < d->El ? d->k : d->El);
    if (d->capacity == 0) return dropless;
    double capped = (double)d->ep * d->El * (N / d->T) * d->capacity;
    return capped < dropless ? capped : dropless;
}

llama_dims llama_dims_make(const llama_config *c, const llama_plan *plan, int B) {
    llama_dims d = plan_dims(c, plan, B);
    d.N = B * d.T;
    d.Ns = B * d.Ts;
    d.R = (size_t)llama_expert_rows(&d, d.N);
    return d;
}

/* ---------------------------------------------------------------------------------------------
 * What the forward saves for backward, described once: a layer's activations are its blocks'
 * (layer.h), each with its shape in the dims this rank holds; the head's are below. The model
 * allocates from these (layer_acts_alloc, llama_saved_alloc), sizes the backward's scratch from
 * them (each activation's gradient has its shape), and every activation formula is their sum:
 * llama_layer_act_bytes and llama_head_act_bytes (which chapters 01, 02, 03 and 08's --plan print
 * beside the allocator's count) and llama_model_bytes.
 * --------------------------------------------------------------------------------------------- */
typedef struct { act_rows rows; act_cols cols; int times; dtype type; } act_shape;

/* Layer activation `act`'s shape, as the block that saves it declares it (times 0, no elements,
 * for a slot no block uses). A llama_dims made by hand (layer NULL) has Llama's layer. */
static act_shape layer_act_shape(const llama_layer *layer, int act) {
    if (!layer) layer = &llama_layer_default;
    for (int b = 0; b < layer->n; b++)
        for (int i = 0; i < layer->block[b]->n_acts; i++) {
            const block_act *x = &layer->block[b]->act[i];
            if (x->act == act) return (act_shape){x->rows, x->cols, x->times > 0 ? x->times : 1, x->type};
        }
    return (act_shape){ROWS_1, COLS_1, 0, DTYPE_F32};
}

/* The head's, kept in every mode, in llama_saved's order. */
enum { HEAD_H_FINAL, HEAD_FINAL_XN, HEAD_FINAL_RSTD, HEAD_LOGITS, HEAD_LOSS_STATS, HEAD_NACTS };
static const act_shape head_act_shape[HEAD_NACTS] = {
    [HEAD_H_FINAL]    = {ROWS_STREAM, COLS_D, 1},    /* [Ns, D]                               */
    [HEAD_FINAL_XN]   = {ROWS_STREAM, COLS_D, 1},    /* [Ns, D]                               */
    [HEAD_FINAL_RSTD] = {ROWS_STREAM, COLS_1, 1},    /* [Ns]                                  */
    [HEAD_LOGITS]     = {ROWS_REGION, COLS_V, 1},    /* [N, Vl]                               */
    [HEAD_LOSS_STATS] = {ROWS_REGION, COLS_LOSS, 1}, /* [N, the loss's saved_per_row]         */
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
    z.rows[ROWS_ROUTED] = z.rows[ROWS_REGION] * d->k;
    z.rows[ROWS_EXPERT] = llama_expert_rows(d, z.rows[ROWS_REGION]);
    z.cols[COLS_E] = d->E;
    z.cols[COLS_K] = d->k;
    z.cols[COLS_FE] = d->Fe;
    z.cols[COLS_COUNTS] = 2.0 * d->E + 1;
    return z;
}

static double act_elems(const act_sizes *z, act_shape s) { return z->rows[s.rows] * (s.times * z->cols[s.cols]); }

/* Layer l's blocks (d->layer, or Llama's in between under layer_every). */
static const llama_layer *dims_layer(const llama_dims *d, int l) { return llama_layer_in(d->layer, d->layer_every, l); }

/* The elements of activation `act` in the layer that holds most of it, of the layers this rank
 * holds (plan_holds: a pipeline stage's): a buffer every layer shares (what none keeps, the
 * backward's scratch) is sized by it. With layer_every the layers are of two kinds (e.g. a mixture
 * of experts and Llama's dense feed-forward), and a stage holding no mixture needs none of its. */
static double act_elems_most(const llama_dims *d, const act_sizes *z, int act, const llama_plan *plan, int n_layers) {
    double n = 0;
    for (int l = 0; l < n_layers; l++)
        if (plan_holds(plan, n_layers, P_WQ, l)) n = fmax(n, act_elems(z, layer_act_shape(dims_layer(d, l), act)));
    return n;
}

/* Bytes of the activations `keep` names (ACT_* bits) of a layer of blocks `layer`: each one's
 * elements times the size of its element type. */
static double layer_bytes(const llama_layer *layer, const act_sizes *z, unsigned keep) {
    double n = 0;
    for (int i = 0; i < ACT_NLAYER; i++) {
        act_shape s = layer_act_shape(layer, i);
        if (keep & (1u << i)) n += act_elems(z, s) * (double)dtype_size(s.type);
    }
    return n;
}

static double head_elems(const act_sizes *z) {
    double n = 0;
    for (int i = 0; i < HEAD_NACTS; i++) n += act_elems(z, head_act_shape[i]);
    return n;
}

double llama_layer_act_bytes(const llama_dims *d, unsigned keep) {
    act_sizes z = act_sizes_of(d, 0);
    return layer_bytes(d->layer, &z, keep);
}

double llama_head_act_bytes(const llama_dims *d, int loss_saved_per_row) {
    act_sizes z = act_sizes_of(d, loss_saved_per_row);
    return 4 * head_elems(&z);
}

/* The activations whose gradients the backward keeps in scratch (one buffer each, reused by every
 * layer): dattn_out, dq, dk, dv, dprobs, dffn_g, dffn_a, dffn_b; and a mixture of experts' (empty
 * for a dense layer): dmoe_x, dmoe_y (also the dispatch's buffers), dmoe_a, dmoe_b, dmoe_g,
 * drouter_probs, dmoe_gates, and moe_rows (x's shape: the received rows permuted). */
static const int grad_scratch[] = {ACT_ATTN_OUT, ACT_Q, ACT_K, ACT_V, ACT_PROBS, ACT_FFN_G, ACT_FFN_A, ACT_FFN_B,
                                   ACT_MOE_X, ACT_MOE_Y, ACT_MOE_A, ACT_MOE_B, ACT_MOE_G, ACT_ROUTER_PROBS,
                                   ACT_MOE_GATES, ACT_MOE_X};

double llama_model_bytes(const llama_config *c, const llama_plan *plan, int B, double *state_bytes,
                         double *act_bytes, double *largest_numel) {
    double p = plan->groups.tp ? plan->groups.tp->size : 1, largest = 0, state = 0;
    const mesh_shape *shape = plan->groups.mesh ? &plan->groups.mesh->shape : NULL;
    for (int i = 0; i < llama_num_params(c); i++) {           /* every tensor's local slice */
        param_spec s = llama_param_spec(c, i);
        if (!plan_holds(plan, c->n_layers, s.kind, s.layer)) continue;
        double ep = plan->groups.ep ? plan->groups.ep->size : 1;   /* the experts' split (09) */
        double split = plan->groups.expert_dims && param_kind_is_expert(s.kind) ? ep
                       : plan->layout[s.kind] == SHARD_REPLICATED           ? 1
                                                                             : p;
        double numel = (double)s.rows * s.cols / split;
        /* a sharded block holds a tensor's shard over its shard group (09's experts: the rest of the
         * shard group beside ep; one rank when held whole) */
        double S = shape ? mesh_size_over(shape, param_shard_dims_of(shape, s.kind, plan->groups.shard_dims,
                                                                     plan->groups.expert_dims))
                         : 1;
        for (int b = 0; b < PARAM_NBLOCKS; b++)               /* values, gradients, m and v */
            state += (b == PARAM_OPTIM ? 8 : 4) * numel / (plan->storage[b] == STORE_SHARD ? S : 1);
        largest = fmax(largest, numel);
    }
    llama_dims d = plan_dims(c, plan, B);
    act_sizes z = act_sizes_of(&d, plan->loss.saved_per_row);
    double N = z.rows[ROWS_REGION], Ns = z.rows[ROWS_STREAM], D = z.cols[COLS_D], V = z.cols[COLS_V];
    /* the backward's scratch: each of these activations' gradient (llama_create) */
    double grads = 0, widest = 0;
    for (size_t i = 0; i < sizeof grad_scratch / sizeof *grad_scratch; i++) {
        double n = act_elems_most(&d, &z, grad_scratch[i], plan, c->n_layers);
        grads += n;
        widest = fmax(widest, n);
    }
    double layers = 0;   /* an upper bound: every tensor of every layer held kept */
    for (int l = 0; l < c->n_layers; l++)
        if (plan_holds(plan, c->n_layers, P_WQ, l)) layers += layer_bytes(dims_layer(&d, l), &z, ACT_KEEP_ALL);
    double acts = layers
                  + 4 * (head_elems(&z) + N                             /* the head's, the loss's scratch */
                         + 5 * N * D + 2 * Ns * D + grads + 3 * N);     /* scratch (fp32) */
    double tensors[] = {N * V, N * D, widest};
    for (size_t i = 0; i < sizeof tensors / sizeof *tensors; i++) largest = fmax(largest, tensors[i]);
    if (state_bytes) *state_bytes = state;
    if (act_bytes) *act_bytes = acts;
    if (largest_numel) *largest_numel = largest;
    return state + acts;
}

/* The activations of a layer of blocks `layer`: what `keep` names is the layer's own
 * (MEM_ACTIVATIONS), the rest points into `shared`. With shared == NULL (layer NULL) the dropped
 * tensors are allocated as the shared set, each as large as the layer that holds most of it. */
static void layer_acts_alloc(llama_layer_acts *a, const llama_dims *d, const llama_layer *layer, unsigned keep,
                             const llama_layer_acts *shared) {
    act_sizes z = act_sizes_of(d, 0);
    for (int i = 0; i < ACT_NLAYER; i++) {
        bool kept = keep & (1u << i);
        /* its element type, as the block that declares it says (of the shared set: the layer that
         * holds most of it); 0 elements: a slot no block of this layer uses */
        act_shape s = layer_act_shape(shared ? layer : d->layer, i);
        if (!shared && d->layer_every > 1) {
            act_shape t = layer_act_shape(&llama_layer_default, i);
            if (act_elems(&z, t) > act_elems(&z, s)) s = t;
        }
        size_t n = (size_t)act_elems(&z, s);
        if (shared) a->t[i] = kept ? (n ? device_alloc_elems(n, s.type, MEM_ACTIVATIONS) : NULL) : shared->t[i];
        else a->t[i] = kept || !n ? NULL : device_alloc_elems(n, s.type, MEM_BUFFERS);
    }
}
static void layer_acts_free(llama_layer_acts *a, const llama_layer_acts *shared) {
    for (int i = 0; i < ACT_NLAYER; i++)
        if (!shared || a->t[i] != shared->t[i]) device_free(a->t[i]);
}

size_t llama_layer_act_bytes_measured(const llama_dims *d, unsigned keep) {
    llama_layer_acts shared, a;
    layer_acts_alloc(&shared, d, NULL, keep, NULL);
    size_t before = mem_current(MEM_ACTIVATIONS);
    layer_acts_alloc(&a, d, d->layer, keep, &shared);
    size_t bytes = mem_current(MEM_ACTIVATIONS) - before;
    layer_acts_free(&a, &shared);
    layer_acts_free(&shared, NULL);
    return bytes;
}

float *llama_whole(const llama_model *m, float *full_buffer, float *local) {
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
        layer_acts_alloc(&s->layers[l], d, dims_layer(d, l), m->plan->checkpoint.keep, &m->shared);
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
                                   plan->groups.expert_dims, here, seed);
    free(here);
    m->d = llama_dims_make(c, plan, B);
    const llama_dims *d = &m->d;
    size_t N = d->N, Ns = d->Ns, D = d->D, T = d->T, L = c->n_layers;
    bool split = plan->sequence.shards > 1;

    /* What the layers keep, measured layer by layer by the allocator: the model's own set, unless
     * the plan keeps one per microbatch itself (a pipeline schedule). */
    layer_acts_alloc(&m->shared, d, NULL, plan->checkpoint.keep, NULL);
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
    /* each activation's gradient, of its shape (grad_scratch's order) */
    float **grad[] = {&m->dattn_out, &m->dq, &m->dk, &m->dv, &m->dprobs, &m->dffn_g, &m->dffn_a, &m->dffn_b,
                      &m->dmoe_x, &m->dmoe_y, &m->dmoe_a, &m->dmoe_b, &m->dmoe_g, &m->drouter_probs, &m->dmoe_gates,
                      &m->moe_rows};
    _Static_assert(sizeof grad / sizeof *grad == sizeof grad_scratch / sizeof *grad_scratch,
                   "one scratch buffer for each activation grad_scratch names, in its order");
    act_sizes z = act_sizes_of(d, 0);
    for (size_t i = 0; i < sizeof grad / sizeof *grad; i++) {
        size_t n = (size_t)act_elems_most(d, &z, grad_scratch[i], plan, c->n_layers);
        *grad[i] = n ? device_alloc_floats(n, MEM_BUFFERS) : NULL;   /* (a dense layer has no experts) */
    }
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
                     m->dprobs, m->dffn_g, m->dffn_a, m->dffn_b, m->dmoe_x, m->dmoe_y, m->dmoe_a,
                     m->dmoe_b, m->dmoe_g, m->drouter_probs, m->dmoe_gates, m->moe_rows};
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
 * One layer: its blocks (layer.h; Llama's are blocks.c) in order forward, in reverse backward.
 * --------------------------------------------------------------------------------------------- */
/* h_in = saved->layers[l].h_in [Ns, D] -> h_out [Ns, D] (NULL: a recomputation), from weights w. */
static void layer_forward(llama_model *m, int l, float *h_out, const unit_weights *w) {
    const llama_layer *layer = dims_layer(&m->d, l);
    layer_pass x = {.m = m, .l = l, .w = w, .a = &m->saved->layers[l], .h_out = h_out};
    for (int b = 0; b < layer->n; b++) layer->block[b]->forward(&x);
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
    /* (a full recomputation has re-entered the region already) */
    if (p->checkpoint.recompute && p->checkpoint.recompute(p->checkpoint.state, m, l, w)) return;
    const llama_dims *d = &m->d;
    p->region.enter_forward(p->region.state, p, llama_whole(m, m->attn_in, a->attn_xn), a->attn_xn, d->B, d->Ts, d->D);
    p->region.enter_forward(p->region.state, p, llama_whole(m, m->ffn_in, a->ffn_xn), a->ffn_xn, d->B, d->Ts, d->D);
}

/* ---------------------------------------------------------------------------------------------
 * One layer, backward: dh [Ns, D] holds d/d h_out on entry, d/d h_in on return.
 * --------------------------------------------------------------------------------------------- */
void llama_layer_backward(llama_model *m, int l, float *dh) {
    const llama_plan *p = m->plan;
    const llama_layer *layer = dims_layer(&m->d, l);
    unit_weights w, g;
    p->weights.acquire(p->weights.state, p, m, l, true, &w, &g);
    layer_restore(m, l, &w);
    layer_pass x = {.m = m, .l = l, .w = &w, .g = &g, .a = &m->saved->layers[l], .dh = dh};
    for (int b = layer->n - 1; b >= 0; b--) layer->block[b]->backward(&x);
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
    float *h0 = s->layers[0].h_in, *looked_up = llama_whole(m, m->y_partial, h0);   /* [N, D] */
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
    proj_linear output = {.site = llama_site(m, P_OUTPUT, -1), .W = w->output, .y = s->logits, .width = Vl};
    p->proj.in_forward(p->proj.state, p, &p->vocab, llama_whole(m, m->attn_in, s->final_xn), s->final_xn, &output, 1,
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
    float *xn = llama_whole(m, m->attn_in, s->final_xn);
    p->vocab.enter_forward(p->vocab.state, p, xn, s->final_xn, B, Ts, D);
    /* dxn_full[N, D] = dlogits output (this rank's vocabulary rows' share);  d output += dlogits^T xn;
     * then the vocabulary's entry backward, dxn [Ns, D] */
    float *dxn = llama_whole(m, m->dxn, m->dxn_full);
    proj_linear output = {.site = llama_site(m, P_OUTPUT, -1), .W = w->output, .dW = g->output, .dy = s->logits, .width = Vl};
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
    float *dh0 = llama_whole(m, m->dy_full, (float *)dh);     /* [N, D] */
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
    m->saved->loss_scale = loss_scale;                  /* (an auxiliary loss of a layer scales by it) */
    m->aux_loss = 0;
    embed_forward(m, tokens, &w);                                        /* h0 = acts[0].h_in */
    for (int l = 0; l < L; l++) llama_layer_forward(m, l, l + 1 < L ? acts[l + 1].h_in : m->saved->h_final);
    float loss = head_forward(m, targets, loss_scale, &w);
    p->weights.release(p->weights.state, p, m, L, false);
    return m->aux_loss != 0 ? loss + m->aux_loss : loss;   /* (a dense model's loss, bit for bit) */
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

void llama_begin_pass(llama_model *m, int step) { m->when = (run_when){step, m->when.pass + 1, 0}; }

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
