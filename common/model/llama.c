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

#include "layer.h"
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
    c.vocab_multiple = 0;   /* the default rule (mesh.h) */
    c.layer = NULL;         /* Llama's layer (layer.h) */
    c.layer_every = 1;      /* on every layer */
    c.precision = DTYPE_F32;   /* fp32 compute; --dtype bf16 sets DTYPE_BF16 */
    c.moe = (moe_config){0};   /* dense */
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
 * The parameter table, described once (as llm.c's fill_in_parameter_sizes): a layer's tensors are
 * its blocks' (layer.h), in block order; the model's ends are below. Everything else is derived:
 * the count, the names, the shapes, the initialisation (params.c), a unit's tensors (params.h),
 * the checkpoint and dump names. Table indices, with K_l = llama_layer_tensors(c, l) (Llama's: 9;
 * under layer_every the layers' K_l differ) and first(l) = 1 + K_0 + ... + K_{l-1}:
 *   0                                  tok_embeddings.weight
 *   first(l) + 0 .. K_l - 1            layer l's (Llama's: attention_norm, wq, wk, wv, wo, ffn_norm,
 *                                      w1, w2, w3)
 *   first(L), first(L) + 1             norm.weight, output.weight
 * ------------------------------------------------------------------------------------------ */

int model_dim_size(const llama_config *c, model_dim x) {
    switch (x) {
    case DIM_1: return 1;
    case DIM_D: return c->dim;
    case DIM_Q: return c->n_heads * llama_head_dim(c);       /* H*hd   */
    case DIM_KV: return c->n_kv_heads * llama_head_dim(c);   /* Hkv*hd */
    case DIM_F: return c->ffn_dim;
    case DIM_E: return c->moe.experts;                       /* E       */
    case DIM_EF: return c->moe.experts * c->moe.expert_dim;  /* E*F_e   */
    case DIM_ED: return c->moe.experts * c->dim;             /* E*D     */
    case DIM_FE: return c->moe.expert_dim;                   /* F_e     */
    default: return c->vocab_size;                           /* DIM_V  */
    }
}

/* The norm weights start at 1, the other tensors at normal(0, 0.02) (init.h). */
#define NORMAL_STD 0.02f
#define ONES 0.0f

/* The model's ends, in the order their unit stores them: the embedding (table index 0), the final
 * norm and the output projection (the table's last two; not tied to the embedding). */
static const block_tensor end_tensors[LLAMA_END_TENSORS] = {
    {.kind = P_TOK_EMBEDDINGS, .name = "tok_embeddings.weight", .rows = DIM_V, .cols = DIM_D, .init_std = NORMAL_STD},
    {.kind = P_NORM, .name = "norm.weight", .rows = DIM_1, .cols = DIM_D, .init_std = ONES},
    {.kind = P_OUTPUT, .name = "output.weight", .rows = DIM_V, .cols = DIM_D, .init_std = NORMAL_STD},
};

/* Layer l's tensor k (0 .. llama_layer_tensors(c, l) - 1): its blocks' tensors, in block order. */
static const block_tensor *layer_tensor(const llama_config *c, int l, int k) {
    const llama_layer *layer = llama_layer_at(c, l);
    for (int b = 0; b < layer->n; k -= layer->block[b]->n_tensors, b++)
        if (k < layer->block[b]->n_tensors) return &layer->block[b]->tensor[k];
    return NULL;
}

int llama_layer_tensors(const llama_config *c, int l) {
    const llama_layer *layer = llama_layer_at(c, l);
    int n = 0;
    for (int b = 0; b < layer->n; b++) n += layer->block[b]->n_tensors;
    return n;
}

bool llama_layer_has(const llama_config *c, int l, param_kind kind) {
    for (int k = 0; k < llama_layer_tensors(c, l); k++)
        if (layer_tensor(c, l, k)->kind == kind) return true;
    return false;
}

/* The table index of layer l's first tensor (l == n_layers: of the final norm): the embedding's
 * 0, then the layers' tensors one layer after the other. */
static int layer_first(const llama_config *c, int l) {
    int i = 1;
    for (int j = 0; j < l; j++) i += llama_layer_tensors(c, j);
    return i;
}

int llama_num_params(const llama_config *c) {
    return layer_first(c, c->n_layers) + LLAMA_END_TENSORS - 1;
}

double llama_parameter_count(const llama_config *c, bool with_embedding) {
    double n = 0;
    for (int i = 0; i < llama_num_params(c); i++) {
        param_spec s = llama_param_spec(c, i);
        if (with_embedding || s.kind != P_TOK_EMBEDDINGS) n += (double)s.rows * s.cols;
    }
    return n;
}

double llama_active_parameter_count(const llama_config *c) {
    double n = 0;
    for (int i = 0; i < llama_num_params(c); i++) {
        param_spec s = llama_param_spec(c, i);
        double share = param_kind_is_expert(s.kind) ? (double)c->moe.top_k / c->moe.experts : 1;   /* k of E */
        if (s.kind != P_TOK_EMBEDDINGS) n += share * s.rows * s.cols;
    }
    return n;
}

double llama_flops_per_token(const llama_config *c) {
    return 6.0 * llama_active_parameter_count(c) + 6.0 * c->n_layers * c->seq_len * c->dim;
}

param_spec llama_param_spec(const llama_config *c, int index) {
    int n = llama_num_params(c), head = layer_first(c, c->n_layers);
    if (index < 0 || index >= n) {
        fprintf(stderr, "llama_param_spec: index %d is not in [0, %d)\n", index, n);
        exit(2);
    }
    bool in_layer = index > 0 && index < head;
    int layer = -1, first = 1;   /* the layer holding it, and that layer's first index */
    if (in_layer)
        for (layer = 0; index >= first + llama_layer_tensors(c, layer); layer++) first += llama_layer_tensors(c, layer);
    const block_tensor *x = in_layer    ? layer_tensor(c, layer, index - first)
                            : index == 0 ? &end_tensors[0]
                                         : &end_tensors[1 + index - head];
    param_spec s;
    memset(&s, 0, sizeof s);
    if (in_layer) snprintf(s.name, sizeof s.name, "layers.%d.%s", layer, x->name);
    else snprintf(s.name, sizeof s.name, "%s", x->name);
    s.kind = x->kind;
    s.layer = layer;
    s.rows = model_dim_size(c, x->rows) * (x->rows_times > 0 ? x->rows_times : 1);
    s.cols = model_dim_size(c, x->cols) * (x->cols_times > 0 ? x->cols_times : 1);
    s.is_vector = x->rows == DIM_1;
    s.init_std = x->init_std;
    return s;
}

int llama_param_index(const llama_config *c, const char *name) {
    for (int i = 0; i < llama_num_params(c); i++) {
        param_spec s = llama_param_spec(c, i);
        if (strcmp(s.name, name) == 0) return i;
    }
    return -1;
}

int llama_param_index_of(const llama_config *c, param_kind kind, int layer) {
    if (kind == P_TOK_EMBEDDINGS) return 0;
    for (int k = 1; k < LLAMA_END_TENSORS; k++)
        if (end_tensors[k].kind == kind) return layer_first(c, c->n_layers) + k - 1;
    if (layer >= 0 && layer < c->n_layers)
        for (int k = 0; k < llama_layer_tensors(c, layer); k++)
            if (layer_tensor(c, layer, k)->kind == kind) return layer_first(c, layer) + k;
    fprintf(stderr, "llama_param_index_of: %d is not a kind of tensor of layer %d of this model\n", (int)kind, layer);
    exit(2);
}

int llama_unit_tensors(const llama_config *c, int u, int idx[LLAMA_UNIT_MAX_TENSORS]) {
    bool ends = u == c->n_layers;
    int n = ends ? LLAMA_END_TENSORS : llama_layer_tensors(c, u), first = ends ? 0 : layer_first(c, u);
    for (int k = 0; k < n; k++)
        idx[k] = ends ? llama_param_index_of(c, end_tensors[k].kind, -1) : first + k;
    return n;
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

int llama_padded_vocab(const llama_config *c, int tp) {
    return vocab_padded_size(c->vocab_size, c->vocab_multiple, tp);
}

