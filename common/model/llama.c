/* llama.c: the single-device Llama baseline, forward and backward, in fp32.
 *
 * This is the ground truth every parallel chapter compares against, so it is written to be
 * read: the forward pass is a plain sequence of layer calls (llama_kernels.h) and residual
 * additions (kernels.h), every tensor saved for the backward pass is named with its shape,
 * and the backward pass walks the same sequence in reverse. The layout follows llm.c's
 * train_gpt2.c: one device allocation per kind of memory (parameters, gradients, optimizer
 * state, activations, scratch) and a pointer per tensor into it.
 *
 * Notation: B batch, T sequence, N = B*T token rows, D dim, H heads, Hkv kv heads,
 * hd = D/H head dim, F ffn dim, V vocabulary, L layers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "llama_kernels.h"
#include "kernels.h"
#include "device.h"
#include "init.h"

llama_config llama_config_default(void) {
    llama_config c;
    c.dim = 64;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.ffn_dim = 128;
    c.vocab_size = 256;
    c.seq_len = 32;
    c.norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    return c;
}

adamw_config adamw_config_default(void) {
    adamw_config o;
    o.lr = 1e-3f;
    o.beta1 = 0.9f;
    o.beta2 = 0.95f;
    o.eps = 1e-8f;
    o.weight_decay = 0.1f;
    return o;
}

/* ------------------------------------------------------------------------------------------
 * The parameter table. Index 0 is the embedding, then 9 tensors per layer, then the final
 * norm and the output projection:
 *   0                     tok_embeddings.weight
 *   1 + 9*l + 0 .. 8      attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3 of layer l
 *   1 + 9*L               norm.weight
 *   2 + 9*L               output.weight
 * ------------------------------------------------------------------------------------------ */
#define PARAMS_PER_LAYER 9

int llama_num_params(const llama_config *c) {
    return 1 + PARAMS_PER_LAYER * c->n_layers + 2;
}

/* A [rows, cols] matrix or a [cols] vector (stored [1, cols]). */
static param_spec make_spec(param_kind kind, int layer, const char *name, int rows, int cols,
                            int is_vector) {
    param_spec s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "%s", name);
    s.kind = kind;
    s.layer = layer;
    s.rows = rows;
    s.cols = cols;
    s.is_vector = is_vector;
    s.init_std = is_vector ? 0.0f : 0.02f;   /* vectors are the norm weights, set to 1 */
    return s;
}

param_spec llama_param_spec(const llama_config *c, int index) {
    int D = c->dim, F = c->ffn_dim, V = c->vocab_size;
    int hd = llama_head_dim(c);
    int q_dim = c->n_heads * hd, kv_dim = c->n_kv_heads * hd;
    int L = c->n_layers;
    char name[64];

    if (index < 0 || index >= llama_num_params(c)) {
        fprintf(stderr, "llama_param_spec: index %d is not in [0, %d)\n", index,
                llama_num_params(c));
        exit(2);
    }
    if (index == 0) return make_spec(P_TOK_EMBEDDINGS, -1, "tok_embeddings.weight", V, D, 0);
    if (index == 1 + PARAMS_PER_LAYER * L) return make_spec(P_NORM, -1, "norm.weight", 1, D, 1);
    if (index == 2 + PARAMS_PER_LAYER * L) return make_spec(P_OUTPUT, -1, "output.weight", V, D, 0);

    int l = (index - 1) / PARAMS_PER_LAYER;
    switch ((index - 1) % PARAMS_PER_LAYER) {
    case 0:
        snprintf(name, sizeof name, "layers.%d.attention_norm.weight", l);
        return make_spec(P_ATTENTION_NORM, l, name, 1, D, 1);
    case 1:
        snprintf(name, sizeof name, "layers.%d.attention.wq.weight", l);
        return make_spec(P_WQ, l, name, q_dim, D, 0);
    case 2:
        snprintf(name, sizeof name, "layers.%d.attention.wk.weight", l);
        return make_spec(P_WK, l, name, kv_dim, D, 0);
    case 3:
        snprintf(name, sizeof name, "layers.%d.attention.wv.weight", l);
        return make_spec(P_WV, l, name, kv_dim, D, 0);
    case 4:
        snprintf(name, sizeof name, "layers.%d.attention.wo.weight", l);
        return make_spec(P_WO, l, name, D, q_dim, 0);
    case 5:
        snprintf(name, sizeof name, "layers.%d.ffn_norm.weight", l);
        return make_spec(P_FFN_NORM, l, name, 1, D, 1);
    case 6:
        snprintf(name, sizeof name, "layers.%d.feed_forward.w1.weight", l);
        return make_spec(P_W1, l, name, F, D, 0);
    case 7:
        snprintf(name, sizeof name, "layers.%d.feed_forward.w2.weight", l);
        return make_spec(P_W2, l, name, D, F, 0);
    default:
        snprintf(name, sizeof name, "layers.%d.feed_forward.w3.weight", l);
        return make_spec(P_W3, l, name, F, D, 0);
    }
}

int llama_param_index(const llama_config *c, const char *name) {
    for (int i = 0; i < llama_num_params(c); i++) {
        param_spec s = llama_param_spec(c, i);
        if (strcmp(s.name, name) == 0) return i;
    }
    return -1;
}

static size_t spec_numel(const param_spec *s) { return (size_t)s->rows * (size_t)s->cols; }

/* ------------------------------------------------------------------------------------------
 * The model
 * ------------------------------------------------------------------------------------------ */

/* The weights of one layer (pointers into the parameter or the gradient block). */
typedef struct {
    float *attention_norm;   /* [D]            */
    float *wq;               /* [H*hd, D]      */
    float *wk;               /* [Hkv*hd, D]    */
    float *wv;               /* [Hkv*hd, D]    */
    float *wo;               /* [D, H*hd]      */
    float *ffn_norm;         /* [D]            */
    float *w1;               /* [F, D]         */
    float *w2;               /* [D, F]         */
    float *w3;               /* [F, D]         */
} layer_weights;

/* What the forward pass saves for the backward pass, per layer l. */
typedef struct {
    float *h_in;        /* [B, T, D]      residual stream entering the layer                  */
    float *attn_xn;     /* [B, T, D]      rmsnorm(h_in) * attention_norm: input of wq, wk, wv */
    float *attn_rstd;   /* [B, T]         1 / rms of h_in rows                                */
    float *q;           /* [B, T, H, hd]  queries after RoPE                                  */
    float *k;           /* [B, T, Hkv, hd] keys after RoPE                                    */
    float *v;           /* [B, T, Hkv, hd] values                                             */
    float *probs;       /* [B, H, T, T]   softmax of the causal scores                        */
    float *attn_out;    /* [B, T, H*hd]   attention output: input of wo                       */
    float *h_mid;       /* [B, T, D]      residual stream after the attention block           */
    float *ffn_xn;      /* [B, T, D]      rmsnorm(h_mid) * ffn_norm: input of w1, w3          */
    float *ffn_rstd;    /* [B, T]                                                             */
    float *ffn_a;       /* [B, T, F]      w1 m (the gate, before SiLU)                        */
    float *ffn_b;       /* [B, T, F]      w3 m                                                */
    float *ffn_g;       /* [B, T, F]      silu(a) * b: input of w2                            */
} layer_acts;

struct llama_model {
    llama_config c;
    int B, T;
    int nparams;
    param_spec *specs;     /* [nparams] */
    size_t *offsets;       /* [nparams + 1] element offsets into the blocks below */

    /* One block each; tensor i lives at block + offsets[i]. */
    float *params;         /* MEM_PARAMS */
    float *grads;          /* MEM_GRADS  */
    float *adam_m;         /* MEM_OPTIM  */
    float *adam_v;         /* MEM_OPTIM  */
    size_t num_parameters;

    /* Activations (MEM_ACTIVATIONS), one block. */
    float *acts_block;
    layer_acts *acts;      /* [L] */
    float *h_final;        /* [B, T, D]  residual stream after the last layer                   */
    float *final_xn;       /* [B, T, D]  rmsnorm(h_final) * norm: input of output               */
    float *final_rstd;     /* [B, T]                                                            */
    float *logits;         /* [B, T, V]  overwritten with dlogits by the backward pass          */

    /* The inputs of the last forward (MEM_BUFFERS): copied so the caller may reuse its own. */
    int *tokens;           /* [B*T] */
    int *targets;          /* [B*T] */
    int *positions;        /* [T]   */
    float loss_scale;

    /* Scratch for the backward pass (MEM_BUFFERS), one block. */
    float *scratch_block;
    float *dh;             /* [B, T, D]   gradient of the residual stream, flowing backwards */
    float *dxn;            /* [B, T, D]   gradient of a norm output                           */
    float *dxn_part;       /* [B, T, D]   one more contribution to dxn (linear dx is "=")    */
    float *dattn_out;      /* [B, T, H*hd] */
    float *dq;             /* [B, T, H, hd] */
    float *dk;             /* [B, T, Hkv, hd] */
    float *dv;             /* [B, T, Hkv, hd] */
    float *dprobs;         /* [B, H, T, T] */
    float *dffn_g;         /* [B, T, F] */
    float *dffn_a;         /* [B, T, F] */
    float *dffn_b;         /* [B, T, F] */
};

/* Pointers of layer l's weights inside a block laid out like the parameter table. */
static layer_weights layer_view(const llama_model *m, float *block, int l) {
    const size_t *o = m->offsets + 1 + PARAMS_PER_LAYER * l;
    layer_weights w;
    w.attention_norm = block + o[0];
    w.wq = block + o[1];
    w.wk = block + o[2];
    w.wv = block + o[3];
    w.wo = block + o[4];
    w.ffn_norm = block + o[5];
    w.w1 = block + o[6];
    w.w2 = block + o[7];
    w.w3 = block + o[8];
    return w;
}

int llama_config_check(const llama_config *c, int B, int T, char *err, size_t errlen) {
    const char *what = NULL;
    if (c->dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->ffn_dim <= 0 || c->vocab_size <= 0 || B <= 0 || T <= 0)
        what = "every size must be positive";
    else if (c->dim % c->n_heads != 0)
        what = "n_heads must divide dim";
    else if (c->n_heads % c->n_kv_heads != 0)
        what = "n_kv_heads must divide n_heads";
    else if (llama_head_dim(c) % 2 != 0)
        what = "the head dim (dim / n_heads) must be even for RoPE's pairs";
    if (!what) return 0;
    snprintf(err, errlen, "bad model configuration (dim %d, n_layers %d, n_heads %d, n_kv_heads %d, "
             "ffn_dim %d, vocab_size %d, batch %d, seq_len %d): %s", c->dim, c->n_layers,
             c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab_size, B, T, what);
    return -1;
}

static void check_config(const llama_config *c, int B, int T) {
    char err[512];
    if (llama_config_check(c, B, T, err, sizeof err) == 0) return;
    fprintf(stderr, "llama: %s\n", err);
    exit(2);
}

llama_model *llama_create(const llama_config *c, int B, int T, uint64_t seed) {
    check_config(c, B, T);
    llama_model *m = calloc(1, sizeof *m);
    m->c = *c;
    m->B = B;
    m->T = T;

    int D = c->dim, F = c->ffn_dim, V = c->vocab_size, L = c->n_layers;
    int H = c->n_heads, Hkv = c->n_kv_heads, hd = llama_head_dim(c);
    size_t N = (size_t)B * T;

    /* Parameters, gradients and AdamW state: one block each, laid out by the table. */
    m->nparams = llama_num_params(c);
    m->specs = calloc((size_t)m->nparams, sizeof *m->specs);
    m->offsets = calloc((size_t)m->nparams + 1, sizeof *m->offsets);
    for (int i = 0; i < m->nparams; i++) {
        m->specs[i] = llama_param_spec(c, i);
        m->offsets[i + 1] = m->offsets[i] + spec_numel(&m->specs[i]);
    }
    m->num_parameters = m->offsets[m->nparams];
    m->params = device_alloc_floats(m->num_parameters, MEM_PARAMS);
    m->grads = device_alloc_floats(m->num_parameters, MEM_GRADS);
    m->adam_m = device_alloc_floats(m->num_parameters, MEM_OPTIM);
    m->adam_v = device_alloc_floats(m->num_parameters, MEM_OPTIM);

    /* Each tensor from (seed, its name, global element index): the same values whatever
     * slice of it a parallel chapter owns. */
    for (int i = 0; i < m->nparams; i++) {
        const param_spec *s = &m->specs[i];
        float *p = m->params + m->offsets[i];
        if (s->is_vector)
            init_constant_device(p, spec_numel(s), 1.0f);
        else
            init_normal_slice_device(p, s->name, seed, s->init_std, s->rows, s->cols,
                                     0, s->rows, 0, s->cols);
    }

    /* Activations: count first, then carve one block (as llm.c does). */
    size_t per_layer = N * D            /* h_in      */
                     + N * D + N        /* attn_xn, attn_rstd */
                     + N * H * hd       /* q         */
                     + 2 * N * Hkv * hd /* k, v      */
                     + (size_t)B * H * T * T  /* probs */
                     + N * H * hd       /* attn_out  */
                     + N * D            /* h_mid     */
                     + N * D + N        /* ffn_xn, ffn_rstd */
                     + 3 * N * F;       /* ffn_a, ffn_b, ffn_g */
    size_t act_total = per_layer * L + N * D + N * D + N + N * V;
    m->acts_block = device_alloc_floats(act_total, MEM_ACTIVATIONS);
    m->acts = calloc((size_t)L, sizeof *m->acts);
    float *p = m->acts_block;
#define CARVE(ptr, n) do { (ptr) = p; p += (n); } while (0)
    for (int l = 0; l < L; l++) {
        layer_acts *a = &m->acts[l];
        CARVE(a->h_in, N * D);
        CARVE(a->attn_xn, N * D);
        CARVE(a->attn_rstd, N);
        CARVE(a->q, N * H * hd);
        CARVE(a->k, N * Hkv * hd);
        CARVE(a->v, N * Hkv * hd);
        CARVE(a->probs, (size_t)B * H * T * T);
        CARVE(a->attn_out, N * H * hd);
        CARVE(a->h_mid, N * D);
        CARVE(a->ffn_xn, N * D);
        CARVE(a->ffn_rstd, N);
        CARVE(a->ffn_a, N * F);
        CARVE(a->ffn_b, N * F);
        CARVE(a->ffn_g, N * F);
    }
    CARVE(m->h_final, N * D);
    CARVE(m->final_xn, N * D);
    CARVE(m->final_rstd, N);
    CARVE(m->logits, N * V);

    /* Backward scratch: reused by every layer, so its size does not grow with L. */
    size_t scratch_total = 3 * N * D + 2 * N * H * hd + 2 * N * Hkv * hd
                         + (size_t)B * H * T * T + 3 * N * F;
    m->scratch_block = device_alloc_floats(scratch_total, MEM_BUFFERS);
    p = m->scratch_block;
    CARVE(m->dh, N * D);
    CARVE(m->dxn, N * D);
    CARVE(m->dxn_part, N * D);
    CARVE(m->dattn_out, N * H * hd);
    CARVE(m->dq, N * H * hd);
    CARVE(m->dk, N * Hkv * hd);
    CARVE(m->dv, N * Hkv * hd);
    CARVE(m->dprobs, (size_t)B * H * T * T);
    CARVE(m->dffn_g, N * F);
    CARVE(m->dffn_a, N * F);
    CARVE(m->dffn_b, N * F);
#undef CARVE

    m->tokens = device_alloc_ints(N, MEM_BUFFERS);
    m->targets = device_alloc_ints(N, MEM_BUFFERS);
    m->positions = device_alloc_ints((size_t)T, MEM_BUFFERS);
    return m;
}

void llama_free(llama_model *m) {
    if (!m) return;
    device_free(m->params);
    device_free(m->grads);
    device_free(m->adam_m);
    device_free(m->adam_v);
    device_free(m->acts_block);
    device_free(m->scratch_block);
    device_free(m->tokens);
    device_free(m->targets);
    device_free(m->positions);
    free(m->acts);
    free(m->specs);
    free(m->offsets);
    free(m);
}

float *llama_param(llama_model *m, int index) { return m->params + m->offsets[index]; }
float *llama_grad(llama_model *m, int index) { return m->grads + m->offsets[index]; }
const float *llama_embedding_output_grad(llama_model *m) { return m->dh; }

/* ------------------------------------------------------------------------------------------
 * Forward
 * ------------------------------------------------------------------------------------------ */
float llama_forward(llama_model *m, const int *tokens, const int *targets, const int *positions,
                    float loss_scale) {
    const llama_config *c = &m->c;
    int B = m->B, T = m->T, N = B * T;
    int D = c->dim, F = c->ffn_dim, V = c->vocab_size;
    int H = c->n_heads, Hkv = c->n_kv_heads, hd = llama_head_dim(c);
    float eps = c->norm_eps;

    /* Keep the inputs: the backward pass needs tokens (embedding) and targets (loss). */
    device_copy(m->tokens, tokens, (size_t)N * sizeof(int));
    device_copy(m->targets, targets, (size_t)N * sizeof(int));
    device_copy(m->positions, positions, (size_t)T * sizeof(int));
    m->loss_scale = loss_scale;

    /* h[B, T, D] = tok_embeddings[tokens]: the first layer's input is its residual stream. */
    embedding_forward(m->acts[0].h_in, m->tokens, llama_param(m, 0), N, D, 0, V);

    for (int l = 0; l < c->n_layers; l++) {
        layer_weights w = layer_view(m, m->params, l);
        layer_acts *a = &m->acts[l];
        /* where this layer writes its output: the next layer's input, or h_final */
        float *h_out = l + 1 < c->n_layers ? m->acts[l + 1].h_in : m->h_final;

        /* ---- attention block: h_mid = h_in + wo(attention(rope(q), rope(k), v)) ---- */
        /* attn_xn[B, T, D] = rmsnorm(h_in) * attention_norm */
        rmsnorm_forward(a->attn_xn, a->attn_rstd, a->h_in, w.attention_norm, N, D, eps);
        /* q[B, T, H*hd], k and v [B, T, Hkv*hd]: three projections of the same normed input */
        linear_forward(a->q, a->attn_xn, w.wq, N, D, H * hd);
        linear_forward(a->k, a->attn_xn, w.wk, N, D, Hkv * hd);
        linear_forward(a->v, a->attn_xn, w.wv, N, D, Hkv * hd);
        /* positions enter through RoPE only: rotate q and k (not v) in place */
        rope_forward(a->q, m->positions, B, T, H, hd, c->rope_theta);
        rope_forward(a->k, m->positions, B, T, Hkv, hd, c->rope_theta);
        /* attn_out[B, T, H*hd] = softmax(q k^T / sqrt(hd), causal) v; probs[B, H, T, T] saved */
        attention_forward(a->attn_out, a->probs, a->q, a->k, a->v, B, T, H, Hkv, hd);
        /* h_mid[B, T, D] = attn_out wo^T, then the residual connection adds h_in */
        linear_forward(a->h_mid, a->attn_out, w.wo, N, H * hd, D);
        add_inplace(a->h_mid, a->h_in, (size_t)N * D);

        /* ---- feed-forward block: h_out = h_mid + w2(silu(w1 m) * w3 m) ---- */
        /* ffn_xn[B, T, D] = rmsnorm(h_mid) * ffn_norm */
        rmsnorm_forward(a->ffn_xn, a->ffn_rstd, a->h_mid, w.ffn_norm, N, D, eps);
        /* ffn_a, ffn_b [B, T, F]: the gate and the up projection */
        linear_forward(a->ffn_a, a->ffn_xn, w.w1, N, D, F);
        linear_forward(a->ffn_b, a->ffn_xn, w.w3, N, D, F);
        /* ffn_g[B, T, F] = silu(ffn_a) * ffn_b */
        swiglu_forward(a->ffn_g, a->ffn_a, a->ffn_b, (size_t)N * F);
        /* h_out[B, T, D] = ffn_g w2^T + h_mid */
        linear_forward(h_out, a->ffn_g, w.w2, N, F, D);
        add_inplace(h_out, a->h_mid, (size_t)N * D);
    }

    /* final_xn[B, T, D] = rmsnorm(h_final) * norm */
    int i_norm = m->nparams - 2, i_out = m->nparams - 1;
    rmsnorm_forward(m->final_xn, m->final_rstd, m->h_final, llama_param(m, i_norm), N, D, eps);
    /* logits[B, T, V] = final_xn output^T */
    linear_forward(m->logits, m->final_xn, llama_param(m, i_out), N, D, V);
    /* sum over valid targets of -log softmax(logits)[target], times loss_scale
     * (1 / the global count of valid targets gives the mean) */
    return cross_entropy_forward(m->logits, m->targets, N, V) * loss_scale;
}

/* ------------------------------------------------------------------------------------------
 * Backward: the forward in reverse. dh carries d loss / d (residual stream) from the top of
 * the model down to the embedding output; it starts at zero and each block adds to it.
 * linear_backward overwrites dx, rmsnorm_backward and every dW accumulate.
 * ------------------------------------------------------------------------------------------ */
void llama_backward(llama_model *m) {
    const llama_config *c = &m->c;
    int B = m->B, T = m->T, N = B * T;
    int D = c->dim, F = c->ffn_dim, V = c->vocab_size;
    int H = c->n_heads, Hkv = c->n_kv_heads, hd = llama_head_dim(c);
    int i_norm = m->nparams - 2, i_out = m->nparams - 1;

    /* dlogits[B, T, V] = (softmax - onehot(target)) * loss_scale, written over the logits */
    float *dlogits = m->logits;
    cross_entropy_backward(dlogits, m->logits, m->targets, N, V, m->loss_scale);
    /* dxn[B, T, D] = dlogits output;  d output += dlogits^T final_xn */
    linear_backward(m->dxn, llama_grad(m, i_out), dlogits, m->final_xn, llama_param(m, i_out),
                    N, D, V);
    /* dh[B, T, D] = d loss / d h_final (through the final norm); d norm += ... */
    device_zero(m->dh, (size_t)N * D * sizeof(float));
    rmsnorm_backward(m->dh, llama_grad(m, i_norm), m->dxn, m->h_final, llama_param(m, i_norm),
                     m->final_rstd, N, D);

    for (int l = c->n_layers - 1; l >= 0; l--) {
        layer_weights w = layer_view(m, m->params, l);
        layer_weights g = layer_view(m, m->grads, l);
        layer_acts *a = &m->acts[l];

        /* ---- feed-forward block. dh holds d/d h_out; h_out = h_mid + w2(g), so the residual
         * path passes dh through unchanged and the branch adds its part below. ---- */
        /* dffn_g[B, T, F] = dh w2;  d w2 += dh^T ffn_g */
        linear_backward(m->dffn_g, g.w2, m->dh, a->ffn_g, w.w2, N, F, D);
        /* dffn_a, dffn_b [B, T, F] through silu(a) * b */
        swiglu_backward(m->dffn_a, m->dffn_b, m->dffn_g, a->ffn_a, a->ffn_b, (size_t)N * F);
        /* dxn[B, T, D] = dffn_a w1 + dffn_b w3: ffn_xn feeds both projections */
        linear_backward(m->dxn, g.w1, m->dffn_a, a->ffn_xn, w.w1, N, D, F);
        linear_backward(m->dxn_part, g.w3, m->dffn_b, a->ffn_xn, w.w3, N, D, F);
        add_inplace(m->dxn, m->dxn_part, (size_t)N * D);
        /* dh += d/d h_mid through ffn_norm: dh now holds d loss / d h_mid */
        rmsnorm_backward(m->dh, g.ffn_norm, m->dxn, a->h_mid, w.ffn_norm, a->ffn_rstd, N, D);

        /* ---- attention block: h_mid = h_in + wo(attn_out), same pattern ---- */
        /* dattn_out[B, T, H*hd] = dh wo;  d wo += dh^T attn_out */
        linear_backward(m->dattn_out, g.wo, m->dh, a->attn_out, w.wo, N, H * hd, D);
        /* dq, dk, dv: gradients of the rotated q and k and of v */
        attention_backward(m->dq, m->dk, m->dv, m->dprobs, m->dattn_out, a->q, a->k, a->v,
                           a->probs, B, T, H, Hkv, hd);
        /* undo RoPE's rotation on the gradients: now d/d (wq n) and d/d (wk n) */
        rope_backward(m->dq, m->positions, B, T, H, hd, c->rope_theta);
        rope_backward(m->dk, m->positions, B, T, Hkv, hd, c->rope_theta);
        /* dxn[B, T, D] = dq wq + dk wk + dv wv: attn_xn feeds three projections */
        linear_backward(m->dxn, g.wq, m->dq, a->attn_xn, w.wq, N, D, H * hd);
        linear_backward(m->dxn_part, g.wk, m->dk, a->attn_xn, w.wk, N, D, Hkv * hd);
        add_inplace(m->dxn, m->dxn_part, (size_t)N * D);
        linear_backward(m->dxn_part, g.wv, m->dv, a->attn_xn, w.wv, N, D, Hkv * hd);
        add_inplace(m->dxn, m->dxn_part, (size_t)N * D);
        /* dh += d/d h_in through attention_norm: dh now holds d loss / d h_in */
        rmsnorm_backward(m->dh, g.attention_norm, m->dxn, a->h_in, w.attention_norm,
                         a->attn_rstd, N, D);
    }

    /* dh is d loss / d h0 (the embedding output); each token's row adds into its table row */
    embedding_backward(llama_grad(m, 0), m->dh, m->tokens, N, D, 0, V);
}

void llama_zero_grad(llama_model *m) {
    device_zero(m->grads, m->num_parameters * sizeof(float));
}

/* One AdamW update of every tensor; step is 1-based (it sets the bias correction). */
void llama_adamw_step(llama_model *m, const adamw_config *opt, int step) {
    for (int i = 0; i < m->nparams; i++) {
        size_t off = m->offsets[i], n = spec_numel(&m->specs[i]);
        adamw_step(m->params + off, m->grads + off, m->adam_m + off, m->adam_v + off, n,
                   opt->lr, opt->beta1, opt->beta2, opt->eps, opt->weight_decay, step);
    }
}
