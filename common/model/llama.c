/* llama.c: the Llama configuration, the AdamW defaults and the table of parameters: every
 * tensor's name (torchtitan's), kind and full shape, in one fixed order. The model that uses
 * them is model.c.
 *
 * Notation: D dim, H heads, Hkv kv heads, hd = D/H head dim, F ffn dim, V vocabulary, L layers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

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
    o.clip_grad_norm = 0.0f;
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

double llama_parameter_count(const llama_config *c, bool with_embedding) {
    double n = 0;
    for (int i = 0; i < llama_num_params(c); i++) {
        param_spec s = llama_param_spec(c, i);
        if (with_embedding || s.kind != P_TOK_EMBEDDINGS) n += (double)s.rows * s.cols;
    }
    return n;
}

double llama_flops_per_token(const llama_config *c) {
    return 6.0 * llama_parameter_count(c, false) + 6.0 * c->n_layers * c->seq_len * c->dim;
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

int llama_param_index_of(const llama_config *c, param_kind kind, int layer) {
    static const int position_in_layer[P_NKINDS] = {
        [P_ATTENTION_NORM] = 0, [P_WQ] = 1, [P_WK] = 2, [P_WV] = 3, [P_WO] = 4,
        [P_FFN_NORM] = 5, [P_W1] = 6, [P_W2] = 7, [P_W3] = 8};
    switch (kind) {
    case P_TOK_EMBEDDINGS: return 0;
    case P_NORM: return 1 + PARAMS_PER_LAYER * c->n_layers;
    case P_OUTPUT: return 2 + PARAMS_PER_LAYER * c->n_layers;
    default: return 1 + PARAMS_PER_LAYER * layer + position_in_layer[kind];
    }
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

mesh_requirements llama_mesh_requirements(const llama_config *c, long long batch) {
    return (mesh_requirements){.n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .ffn_dim = c->ffn_dim,
                               .seq_len = c->seq_len, .n_layers = c->n_layers, .batch = batch};
}

