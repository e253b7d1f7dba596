/* llama.h: the Llama model's configuration and its table of parameters (fp32).
 *
 * The model itself, forward and backward, is model/model.h; the single-device baseline is that
 * model under the single-device plan, the ground truth of every chapter.
 *
 * Names and shapes follow torchtitan's Llama so a dump loads into PyTorch as is
 * (linear weights [out_features, in_features], y = x W^T); llama.c's table describes them:
 *
 *   tok_embeddings.weight                     [V, D]
 *   layers.{i}.attention_norm.weight          [D]
 *   layers.{i}.attention.wq.weight            [H*hd, D]
 *   layers.{i}.attention.wk.weight / wv       [Hkv*hd, D]
 *   layers.{i}.attention.wo.weight            [D, H*hd]
 *   layers.{i}.ffn_norm.weight                [D]
 *   layers.{i}.feed_forward.w1.weight / w3    [F, D]
 *   layers.{i}.feed_forward.w2.weight         [D, F]
 *   norm.weight                               [D]
 *   output.weight                             [V, D]   (not tied)
 *
 * forward:  h = tok_embeddings[tokens]
 *           per layer: h += wo(attn(rope(wq n), rope(wk n), wv n)),  n = rmsnorm(h)
 *                      h += w2(silu(w1 m) * w3 m),                     m = rmsnorm(h)
 *           logits = output(rmsnorm(h)); loss = sum of token losses / global valid count
 */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "cdefs.h"
#include "dtype.h"
#include "mesh.h"

C_BEGIN

typedef struct llama_layer llama_layer;   /* the layer's blocks (layer.h) */

/* A mixture-of-experts feed-forward (chapter 09): the sizes its block's tensors and activations
 * are written in. experts 0: a dense model. The block itself, its routing and its loss are the
 * chapter's (09_expert_parallel/moe.c), set as llama_config.layer. */
typedef enum { MOE_SOFTMAX = 0, MOE_SIGMOID } moe_router;   /* the router's scores (09's --router) */
typedef struct {
    int experts;          /* E routed experts per layer (0: none, the dense feed-forward)        */
    int top_k;            /* k experts per token                                                 */
    int expert_dim;       /* F_e, each expert's hidden size (a SwiGLU of its own)               */
    bool shared_expert;   /* a dense SwiGLU of ffn_dim every token passes through as well       */
    float aux_alpha;      /* the weight of the load-balancing loss                              */
    float capacity_factor; /* c > 0: each expert takes at most ceil(c T k / E) copies of each
                           * sequence's tokens, the rest dropped; 0: dropless                    */
    moe_router router;    /* softmax scores, the gates the chosen ones (Switch, GShard, Mixtral);
                           * or sigmoid scores, the gates the chosen ones over their sum, the
                           * balancing loss on the scores over their sum (DeepSeek-V3)          */
} moe_config;

typedef struct {
    int dim, n_layers, n_heads, n_kv_heads, ffn_dim, vocab_size, seq_len;
    float norm_eps, rope_theta;
    int vocab_multiple;   /* where the vocabulary is split over tp (02): pad it to a multiple of this
                           * (--vocab-multiple; 0: mesh.h's default rule). Not part of the model: the
                           * padding rows are zero, never read, and exports hold vocab_size rows. */
    const llama_layer *layer;   /* what a layer is, as blocks (layer.h); NULL: Llama's */
    int layer_every;      /* `layer` on the layers l with (l + 1) % layer_every == 0 and Llama's on
                           * the others (Llama 4's interleaved MoE, torchtitan's
                           * interleave_moe_layer_step: 09's --moe-every); 0 or 1: on every one */
    dtype precision;      /* the compute precision (--dtype): DTYPE_F32, or DTYPE_BF16: every linear's
                           * GEMMs take bf16 operands and accumulate in fp32 (linear.c). Parameters,
                           * gradients, AdamW state and every other kernel stay fp32. Not part of the
                           * model's shape: a checkpoint resumes under either. */
    moe_config moe;       /* the experts' sizes (zero: a dense model)                          */
} llama_config;

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float clip_grad_norm;   /* > 0: gradients scaled so that their global norm is at most this */
} adamw_config;

llama_config llama_config_default(void);   /* the tiny configuration every chapter defaults to */
adamw_config adamw_config_default(void);   /* lr 1e-3, betas (0.9, 0.95), eps 1e-8, wd 0.1    */
static inline int llama_head_dim(const llama_config *c) { return c->dim / c->n_heads; }
/* 0 when the configuration and a [B, T] batch make a valid model; otherwise -1 and one line in
 * err naming the values and the rule (n_heads divides dim, n_kv_heads divides n_heads, ...). */
int llama_config_check(const llama_config *c, int B, int T, char *err, size_t errlen);
/* The vocabulary rows the embedding and the output layer hold when split over tp (02): vocab_size
 * rounded up to the padding multiple (mesh.h's vocab_padded_size). */
int llama_padded_vocab(const llama_config *c, int tp);

/* ---- the parameter table: every tensor's name, kind, full shape and initialisation ----
 * Read off the layer's blocks (layer.h: Llama's has nine tensors) and the model's three ends
 * (llama.c). */
typedef enum {
    P_TOK_EMBEDDINGS = 0, P_ATTENTION_NORM, P_WQ, P_WK, P_WV, P_WO,
    P_FFN_NORM, P_W1, P_W2, P_W3, P_NORM, P_OUTPUT,
    /* a mixture-of-experts layer's (chapter 09): the router [E, D] and the experts' three weights,
     * each E experts' stacked along the rows: w1, w3 [E*F_e, D], w2 [E*D, F_e] */
    P_ROUTER, P_EXPERT_W1, P_EXPERT_W2, P_EXPERT_W3,
    P_NKINDS
} param_kind;
/* The rows each expert takes of one sequence's T tokens under a capacity factor c:
 * ceil(c T k / E), the product taken within 1e-6 of an integer as that integer (c is held in a
 * float: 0.1 is 0.100000001, whose ceil(0.1 x 10) would be 2). */
static inline int moe_capacity(const moe_config *m, int T) {
    double x = (double)m->capacity_factor * T * m->top_k / m->experts, n = (double)(long long)(x + 0.5);
    return (int)(n >= x * (1 - 1e-6) && n <= x * (1 + 1e-6) ? n : (double)(long long)x + 1);
}
/* The experts' weights: split expert by expert over expert parallelism (params.h). */
static inline bool param_kind_is_expert(param_kind k) { return k == P_EXPERT_W1 || k == P_EXPERT_W2 || k == P_EXPERT_W3; }

typedef struct {
    char name[64];
    param_kind kind;
    int layer;          /* -1 for tensors outside the layers */
    int rows, cols;     /* full shape; a vector is [1, D] here and [D] in the file */
    int is_vector;
    float init_std;     /* normal(0, init_std): 0.02 for embeddings and linears; 0: every element
                         * 1 (the norm weights) */
} param_spec;

/* Layer l's tensors (Llama's: attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3; each kind at
 * most once; layer_every: the layers may differ) and the ends' (tok_embeddings, norm, output): the
 * two kinds of unit (params.h). llama_layer_has: whether layer l has a tensor of `kind`. */
int llama_layer_tensors(const llama_config *c, int l);
bool llama_layer_has(const llama_config *c, int l, param_kind kind);
#define LLAMA_END_TENSORS 3
#define LLAMA_UNIT_MAX_TENSORS P_NKINDS   /* an array for any unit's */

/* Number of parameter tensors and their specs: tok_embeddings, the layers' in layer order, norm,
 * output. */
int llama_num_params(const llama_config *c);
param_spec llama_param_spec(const llama_config *c, int index);
/* The model's parameters (elements of every tensor), or those outside the embedding table (a
 * lookup, which costs no FLOPs: what MFU's 6N counts). */
double llama_parameter_count(const llama_config *c, bool with_embedding);
/* The parameters one token's forward multiplies by, outside the embedding lookup: every tensor,
 * but of a mixture of experts' only its k experts' share, k/E of the experts' weights (chapter
 * 09; a dense model: llama_parameter_count(c, false)). */
double llama_active_parameter_count(const llama_config *c);
/* Model FLOPs of one token's training step (forward and backward) at c->seq_len = T, the one
 * definition behind every MFU and GFLOP/s this project prints (chapter 08's metrics and --plan,
 * make bench-baseline): 6 per active parameter (2 forward, 4 backward:
 * Chowdhery et al. 2022, PaLM, appendix B), plus causal attention's 6 L T D: forward, the scores
 * q k^T and the weighted sum p v, each 2 D FLOPs per key over the T/2 keys a token sees on
 * average, 2 T D; backward twice that. PaLM's 12 L T D counts the whole T x T matrix; the causal
 * mask makes half of it zero, and a causal kernel skips it (common/kernels/attention.c does).
 * Recomputation is not counted, as MFU defines. */
double llama_flops_per_token(const llama_config *c);
/* Index of a name, -1 when absent. */
int llama_param_index(const llama_config *c, const char *name);
/* Index of the tensor of `kind` in `layer` (layer -1 for tok_embeddings, norm and output). */
int llama_param_index_of(const llama_config *c, param_kind kind, int layer);
/* The indices of unit u's tensors, in the order the unit stores them: layer u's for u < L, the
 * ends' (tok_embeddings, norm, output) for u == L. Returns how many. */
int llama_unit_tensors(const llama_config *c, int u, int idx[LLAMA_UNIT_MAX_TENSORS]);

C_END
