/* tp.h: Megatron tensor parallelism of the Llama transformer (Shoeybi et al., 2019).
 *
 * Every layer is split over the p ranks of the tp group, whole heads per rank:
 *
 *   attention:     wq, wk, wv  column-parallel   rank r owns heads [r*H/p, (r+1)*H/p) and
 *                                                kv heads [r*Hkv/p, (r+1)*Hkv/p)
 *                  wo          row-parallel      the matching H/p*hd input columns
 *   feed-forward:  w1, w3      column-parallel   rank r owns F/p hidden units
 *                  w2          row-parallel      the matching F/p input columns
 *   everything else (tok_embeddings, the norms, output) is replicated.
 *
 * Because a query head only ever looks at its own kv head (h -> h / (H/Hkv)), and both
 * splits give rank r the matching ranges, attention needs no communication at all: each rank
 * runs ordinary attention on its H/p heads. The only collectives are chapter 00's f and g:
 *
 *   h ─ rmsnorm ─ f ─ [wq wk wv] ─ rope ─ attention ─ [wo] ─ g ─ (+h) ─ rmsnorm ─ f ─ [w1 w3] ─ swiglu ─ [w2] ─ g ─ (+)
 *
 * forward: 2 all-reduces (the two g's) of B*T*D floats per layer; backward: 2 more (the f's).
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "comm.h"
#include "llama.h"
#include "shard.h"

#define TP_NUM_KINDS (P_OUTPUT + 1)

/* How each kind of parameter is split over the tp group. */
typedef struct { shard_layout of[TP_NUM_KINDS]; } tp_layouts;
/* Megatron's choice above: column-parallel q, k, v, w1, w3; row-parallel wo, w2; rest replicated. */
tp_layouts megatron_layouts(void);

/* The weights of one layer on this rank (pointers into a parameter or gradient block). */
typedef struct {
    float *attention_norm;   /* [D]              replicated      */
    float *wq;               /* [Hl*hd, D]       rows of [H*hd, D]   */
    float *wk, *wv;          /* [Hkvl*hd, D]     rows of [Hkv*hd, D] */
    float *wo;               /* [D, Hl*hd]       columns of [D, H*hd] */
    float *ffn_norm;         /* [D]              replicated      */
    float *w1, *w3;          /* [Fl, D]          rows of [F, D]  */
    float *w2;               /* [D, Fl]          columns of [D, F] */
} tp_layer_weights;

/* What one layer saves for backward on this rank (Hl = H/p, Hkvl = Hkv/p, Fl = F/p). */
typedef struct {
    float *h_in;        /* [B, T, D]        residual stream entering the layer (replicated)   */
    float *attn_xn;     /* [B, T, D]        rmsnorm(h_in) * attention_norm (replicated)       */
    float *attn_rstd;   /* [B, T]                                                              */
    float *q;           /* [B, T, Hl*hd]    this rank's query heads, after RoPE               */
    float *k, *v;       /* [B, T, Hkvl*hd]  this rank's kv heads (k after RoPE)               */
    float *probs;       /* [B, Hl, T, T]    softmax of this rank's heads' scores              */
    float *attn_out;    /* [B, T, Hl*hd]    input of the row-parallel wo                      */
    float *h_mid;       /* [B, T, D]        residual stream after attention (replicated)      */
    float *ffn_xn;      /* [B, T, D]        rmsnorm(h_mid) * ffn_norm (replicated)            */
    float *ffn_rstd;    /* [B, T]                                                              */
    float *ffn_a, *ffn_b, *ffn_g;  /* [B, T, Fl]  w1 m, w3 m, silu(a)*b: this rank's units    */
} tp_layer_acts;

/* This rank's slices of every parameter tensor, with their gradients and AdamW state.
 * Chapters that change the activations (sequence parallelism, ...) reuse this as it is. */
typedef struct {
    llama_config c;
    comm_group *tp;
    tp_layouts layouts;
    int Hl, Hkvl, Fl, hd;           /* local heads, kv heads, ffn units; head dim        */
    int Vl, v0;                     /* local vocabulary rows of output and their start   */
    int nparams;
    param_spec *specs;              /* the full shapes (llama.h's table)                 */
    int *r0, *nr, *c0, *nc;         /* [nparams] this rank's slice of each tensor        */
    size_t *offsets;                /* [nparams+1] offsets of the local slices            */
    size_t num_local;               /* floats of parameters held by this rank            */
    float *params, *grads, *adam_m, *adam_v;
} tp_params;

/* Validates that tp divides n_heads, n_kv_heads and ffn_dim (and the vocabulary when it is
 * split), exit 2 otherwise; then allocates and initialises this rank's slices: the same values
 * as the baseline's full tensors. */
tp_params *tp_params_create(const llama_config *c, comm_group *tp, tp_layouts layouts, uint64_t seed);
void tp_params_free(tp_params *w);
float *tp_param(tp_params *w, int index);
float *tp_grad(tp_params *w, int index);
tp_layer_weights tp_layer_view(const tp_params *w, float *block, int l);
void tp_params_zero_grad(tp_params *w);
/* AdamW is element-wise: each rank updates its own slices; replicated tensors receive identical
 * gradients on every rank, so their copies stay identical without communication. */
void tp_params_adamw_step(tp_params *w, const adamw_config *opt, int step);
/* Full tensor `index` (parameter or gradient) on rank 0 of the tp group (host). For checking. */
void tp_gather_param(tp_params *w, int index, float *full);
void tp_gather_grad(tp_params *w, int index, float *full);

/* The tensor-parallel model: parameters plus the activations of a [B, T] batch. */
typedef struct {
    tp_params *w;
    llama_config c;
    comm_group *tp;
    int B, T, N;                    /* N = B*T token rows                                */
    int Hl, Hkvl, Fl, hd, Vl;       /* copied from w for short expressions               */
    tp_layer_acts *acts;            /* [L]                                               */
    float *h_final, *final_xn, *final_rstd;   /* [N, D], [N, D], [N]                    */
    float *logits;                  /* [N, Vl]: the whole vocabulary unless output is split */
    int *tokens, *targets, *positions;
    float loss_scale;
    /* backward scratch */
    float *dh, *dxn, *dxn_part, *dattn_out, *dq, *dk, *dv, *dprobs, *dffn_g, *dffn_a, *dffn_b;
    bool skip_backward_allreduce;   /* a deliberate bug: leave out f's all-reduce        */
} tp_llama;

tp_llama *tp_llama_create(const llama_config *c, comm_group *tp, tp_layouts layouts, int B, int T,
                          uint64_t seed);
void tp_llama_free(tp_llama *m);

/* One transformer layer, h_out = layer(h_in), tensor parallel. h_in/h_out [B, T, D] replicated.
 * Issues: 2 all-reduces of B*T*D floats (g after wo, g after w2). */
void tp_layer_forward(tp_llama *m, int l, float *h_out);
/* dh [B, T, D]: d loss / d h_out in, d loss / d h_in out (in place).
 * Issues: 2 all-reduces of B*T*D floats (f before wq/wk/wv, f before w1/w3). */
void tp_layer_backward(tp_llama *m, int l, float *dh);

/* The whole model: tokens, targets [B*T], positions [T] on the device.
 * Returns sum of token losses * loss_scale (same value on every rank). */
float tp_llama_forward(tp_llama *m, const int *tokens, const int *targets, const int *positions,
                       float loss_scale);
void tp_llama_backward(tp_llama *m);
