/* llama.h: the single-device Llama baseline (fp32), the ground truth of every chapter.
 *
 * Names and shapes follow torchtitan's Llama so a dump loads into PyTorch as is
 * (linear weights [out_features, in_features], y = x W^T):
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
#include "cdefs.h"

C_BEGIN

typedef struct {
    int dim, n_layers, n_heads, n_kv_heads, ffn_dim, vocab_size, seq_len;
    float norm_eps, rope_theta;
} llama_config;

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
} adamw_config;

llama_config llama_config_default(void);   /* the tiny configuration every chapter defaults to */
adamw_config adamw_config_default(void);   /* lr 1e-3, betas (0.9, 0.95), eps 1e-8, wd 0.1    */
static inline int llama_head_dim(const llama_config *c) { return c->dim / c->n_heads; }
/* 0 when the configuration and a [B, T] batch make a valid model; otherwise -1 and one line in
 * err naming the values and the rule (n_heads divides dim, n_kv_heads divides n_heads, ...). */
int llama_config_check(const llama_config *c, int B, int T, char *err, size_t errlen);

/* ---- the parameter table: every tensor's name, kind and full shape ---- */
typedef enum {
    P_TOK_EMBEDDINGS = 0, P_ATTENTION_NORM, P_WQ, P_WK, P_WV, P_WO,
    P_FFN_NORM, P_W1, P_W2, P_W3, P_NORM, P_OUTPUT
} param_kind;

typedef struct {
    char name[64];
    param_kind kind;
    int layer;          /* -1 for tensors outside the layers */
    int rows, cols;     /* full shape; a vector is [1, D] here and [D] in the file */
    int is_vector;
    float init_std;     /* 0.02 for embeddings and linears; norms are initialised to 1 */
} param_spec;

/* Number of parameter tensors and their specs, in the order above (layer by layer). */
int llama_num_params(const llama_config *c);
param_spec llama_param_spec(const llama_config *c, int index);
/* Index of a name, -1 when absent. */
int llama_param_index(const llama_config *c, const char *name);

/* ---- the baseline model ---- */
typedef struct llama_model llama_model;

/* Allocates parameters (initialised from (seed, name, index)), gradients, AdamW state and the
 * activations of a [B, T] batch, all on the device. */
llama_model *llama_create(const llama_config *c, int B, int T, uint64_t seed);
void llama_free(llama_model *m);

/* tokens, targets: device ints [B*T]; positions: device ints [T] (0..T-1 for the baseline).
 * Returns the sum of token losses times loss_scale (loss_scale = 1 / global valid count). */
float llama_forward(llama_model *m, const int *tokens, const int *targets, const int *positions,
                    float loss_scale);
/* Gradients of the last forward's loss, accumulated into the gradient buffers. */
void llama_backward(llama_model *m);
void llama_zero_grad(llama_model *m);
void llama_adamw_step(llama_model *m, const adamw_config *opt, int step);

/* Device pointers to parameter / gradient `index` of the table (full tensors). */
float *llama_param(llama_model *m, int index);
float *llama_grad(llama_model *m, int index);
/* Gradient of the loss with respect to the embedding output h0 [B, T, D] (after backward). */
const float *llama_embedding_output_grad(llama_model *m);

C_END
