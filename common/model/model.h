/* model.h: the Llama model, written once, run under a parallel plan (model/plan.h).
 *
 * The single-device baseline and every parallel chapter build this same model; they differ
 * only in the plan: how the parameters are split (params.h), which operators sit at the
 * boundaries of the tensor-parallel region, which attention, linear and loss operators run,
 * and what each layer keeps for backward.
 *
 *   h = tok_embeddings[tokens]
 *   per layer: h += wo(attention(rope(wq n), rope(wk n), wv n)),  n = rmsnorm(h) * attention_norm
 *              h += w2(silu(w1 m) * w3 m),                         m = rmsnorm(h) * ffn_norm
 *   logits = output(rmsnorm(h) * norm);  loss = sum of token losses / global count of valid targets
 *
 * Notation (the shapes this rank holds): B batch, T sequence, N = B*T rows inside the
 * tensor-parallel region, Ts = T / seq_shards tokens of each sequence outside it and Ns = B*Ts,
 * D dim, hd head dim, Hl and Hkvl the query and kv heads held, Fl the ffn units held, Vl the
 * vocabulary rows held (from v0). On one device Ts = T, Hl = H, Fl = F, Vl = V.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "cdefs.h"
#include "layer.h"
#include "llama.h"
#include "params.h"
#include "plan.h"

C_BEGIN

typedef struct {
    int B, T, Ts, N, Ns;
    int D, hd, Hl, Hkvl, Fl;
    int Vl, v0;
    size_t probs;                   /* floats attention saves per layer (the plan's saved_numel) */
    /* a mixture of experts (llama_config.moe; all 0 for a dense model): E experts of hidden F_e, k
     * per token; this rank holds El of them, from expert e0 (expert parallelism splits them over
     * `ep` ranks); R rows at most reach them in one layer: N*k on one device, and under expert
     * parallelism the dropless worst case ep * N * min(k, El) (every rank's tokens choosing this
     * rank's experts), or under a capacity, ep * El * (B sequences) * capacity when less */
    int E, k, Fe, El, e0, ep;
    int capacity;                   /* rows each expert takes of one sequence's copies (a capacity
                                     * factor c: ceil(c T k / E)); 0: dropless                     */
    size_t R;
    const llama_layer *layer;       /* the layer's blocks (layer.h), whose activations these shape
                                     * (NULL: Llama's)                                              */
    int layer_every;                /* `layer` every layer_every layers, Llama's in between (0, 1:
                                     * every layer is `layer`; llama_config.layer_every)            */
} llama_dims;

/* What one layer saves for backward, by name or by ACT_* index (plan.h). A tensor the plan's
 * checkpointing policy does not keep points into the model's shared buffers instead. */
typedef union {
    struct {
        float *h_in;        /* [Ns, D]          residual stream entering the layer          */
        float *attn_xn;     /* [Ns, D]          rmsnorm(h_in) * attention_norm               */
        float *attn_rstd;   /* [Ns]             1 / rms of each row of h_in                  */
        float *q;           /* [N, Hl*hd]       queries after RoPE                           */
        float *k, *v;       /* [N, Hkvl*hd]     keys after RoPE, values                      */
        float *probs;       /* [B, Hl, T, T]    softmax of the causal scores (or what the
                             *                  plan's attention saves instead, d.probs)      */
        float *attn_out;    /* [N, Hl*hd]       attention output: input of wo                */
        float *h_mid;       /* [Ns, D]          residual stream after the attention block    */
        float *ffn_xn;      /* [Ns, D]          rmsnorm(h_mid) * ffn_norm                    */
        float *ffn_rstd;    /* [Ns]                                                          */
        float *ffn_a, *ffn_b; /* [N, Fl]        w1 m (the gate), w3 m                        */
        float *ffn_g;       /* [N, Fl]          silu(ffn_a) * ffn_b: input of w2             */
        /* a mixture-of-experts layer's (chapter 09's block says what each holds) */
        float *router_probs;  /* [N, E]          softmax of the router's logits              */
        float *moe_choice;    /* [N, k]          the experts each token goes to (exact ints)  */
        float *moe_gates;     /* [N, k]          their weights in the combine                 */
        float *moe_counts;    /* [2E + 1]        the dispatch's counts (exact ints)       */
        float *moe_x;         /* [R, D]          the rows this rank's experts received        */
        float *moe_a, *moe_b; /* [R, F_e]        each row's expert's w1 x, w3 x               */
        float *moe_g;         /* [R, F_e]        silu(a) * b                                  */
        float *moe_y;         /* [N*k, D]        the experts' outputs, back on the token's rank */
    };
    float *t[ACT_NLAYER];
} llama_layer_acts;

/* What one batch's forward keeps for its backward: the layers' activations (layers[l], allocated
 * for layers [l0, l1) only) and, when the set reaches the last layer, the head's. The model owns
 * one set for its whole batch; a pipeline keeps one set per microbatch in flight and points
 * m->saved at the one an action works on (chapter 05). */
typedef struct {
    int l0, l1;                     /* the layers whose activations this set holds               */
    llama_layer_acts *layers;       /* [L]; layers outside [l0, l1) are all NULL                 */
    size_t layer_bytes;             /* bytes its layers keep, as the allocator counted them      */
    float *h_final, *final_xn;      /* [Ns, D] residual after the last layer, its rmsnorm        */
    float *final_rstd;              /* [Ns]                        (the head's: NULL unless l1 == L) */
    float *logits;                  /* [N, Vl], overwritten by dlogits in backward               */
    float *loss_stats;              /* [N * plan->loss.saved_per_row], NULL when 0               */
    int *tokens, *targets;          /* [N] the forward's inputs (embedding backward, loss)       */
    float loss_scale;
} llama_saved;

struct llama_model {
    llama_config c;
    const llama_plan *plan;
    param_table *params;
    llama_dims d;
    run_when when;                  /* the step, pass and microbatch running (plan.h): set by the
                                     * harness (llama_begin_pass) and a pipeline's schedule, passed
                                     * to the linears in their site                                */
    llama_saved *saved;             /* the set the layer and head functions read and write       */
    llama_saved own;                /* the model's own set (all its layers); unused, not allocated,
                                     * when the plan schedules microbatches itself                 */
    llama_layer_acts shared;        /* what no layer keeps, recomputed before each backward      */
    size_t *layer_act_bytes;        /* [L] bytes each layer keeps, as the allocator counted them */
    float *loss_scratch;            /* [N]                                                       */
    int *positions;                 /* [T] RoPE positions of a whole sequence's rows            */
    float *rope_cos_sin;            /* [T, hd/2, 2] their rotations' cos and sin (rope_table)   */
    int *cp_tokens, *cp_targets;    /* [B * microbatches, T] under context parallelism: this rank's
                                     * positions of its sequences' tokens and targets, which the
                                     * harness selects from the batch each pass; NULL otherwise   */
    /* scratch, reused by every layer (MEM_BUFFERS); the [N, D] "full" buffers exist only when the
     * plan splits the sequence, otherwise they are the local tensors themselves */
    float *attn_in, *ffn_in;        /* [N, D] the region's inputs (norm outputs, whole sequence) */
    float *y_partial;               /* [N, D] a row-parallel output before the region's exit     */
    float *dy_full;                 /* [N, D] gradient of the residual stream, whole sequence    */
    float *dxn_full;                /* [N, D] gradient of a norm output (this rank's partial sum) */
    float *dxn;                     /* [Ns, D] the same after the region's entry backward        */
    float *dh;                      /* [Ns, D] gradient of the residual stream, flowing back     */
    float *dattn_out, *dq;          /* [N, Hl*hd]                                                */
    float *dk, *dv;                 /* [N, Hkvl*hd]                                              */
    float *dprobs;                  /* [d.probs] the attention backward's scratch                */
    float *dffn_g, *dffn_a, *dffn_b; /* [N, Fl]                                                  */
    /* a mixture-of-experts layer's scratch (NULL for a dense model): the dispatch's buffers and
     * the gradients of its activations */
    float *dmoe_x;                  /* [R, D]   the experts' side of an exchange                  */
    float *moe_rows;                /* [R, D]   the same rows in the other order (the all-to-all's
                                     *          or the experts': chapter 09's permutation)        */
    float *dmoe_y;                  /* [N*k, D] the tokens' side                                 */
    float *dmoe_a, *dmoe_b, *dmoe_g; /* [R, F_e]                                                  */
    float *drouter_probs;           /* [N, E]                                                    */
    float *dmoe_gates;              /* [N, k]                                                    */
    float aux_loss;                 /* the forward's auxiliary losses (chapter 09's load balance),
                                     * times the loss scale: llama_forward adds it to the loss    */
    /* Gradient accumulation: true during every micro-batch's backward but the last, which skips
     * the plan's reduce_grads (an all-reduce in place, of chapters 03 and 06, would otherwise sum
     * the micro-batches already summed once more); the last one reduces their sum. */
    bool accumulating;
};

/* What a layer block's forward and backward work on (layer.h): the model, the layer, the weights
 * the plan's weight access gave and the layer's saved activations. forward: h_out is the layer's
 * output [Ns, D] (NULL: a recomputation, which stops once w2's input exists); backward: dh [Ns, D]
 * holds d loss / d (the block's output) on entry and d loss / d (its input) on return, for the
 * norm blocks; attention and feed_forward leave the gradient of their input (the norm output) in
 * the model's dxn (the region's entry backward writes it). */
struct layer_pass {
    llama_model *m;
    int l;
    const unit_weights *w, *g;      /* values; gradients (backward, +=)                          */
    llama_layer_acts *a;            /* m->saved->layers[l]                                       */
    float *h_out;                   /* forward                                                   */
    float *dh;                      /* backward                                                  */
};
/* The buffer of the whole sequence when the plan splits it, else the local tensor itself. */
float *llama_whole(const llama_model *m, float *full_buffer, float *local);
/* The site of a linear the model runs now: its weight's kind, its layer (-1: the output layer),
 * the model's run_when and its compute precision (plan.h's linear_site). */
static inline linear_site llama_site(const llama_model *m, param_kind kind, int layer) {
    return (linear_site){kind, layer, m->when, m->c.precision};
}

/* The shapes a plan gives this rank for a [B, c->seq_len] batch. */
llama_dims llama_dims_make(const llama_config *c, const llama_plan *plan, int B);
/* The most rows this rank's experts may receive in one layer when it routes N tokens (d's R for
 * N = d->N; chapter 08's --plan sizes a mixture's dispatch buffers with it). */
double llama_expert_rows(const llama_dims *d, double N);
/* What a forward saves, described once in model.c (each tensor's shape in these dims), and the
 * formulas derived from it:
 * bytes one layer of the model's own blocks (d->layer; under layer_every Llama's layers in between
 * keep theirs) keeps with the policy `keep` (ACT_* bits): the sum of their sizes; */
double llama_layer_act_bytes(const llama_dims *d, unsigned keep);
/* fp32 bytes the head keeps in every mode: h_final and final_xn [Ns, D], final_rstd [Ns], the logits
 * [N, Vl] and the loss's `loss_saved_per_row` floats per row (its row max and sum of exponentials
 * under loss parallelism, chapter 02). */
double llama_head_act_bytes(const llama_dims *d, int loss_saved_per_row);
/* Bytes one layer of the model's own blocks (d->layer) keeps with the policy `keep` (ACT_* bits),
 * measured: allocated as the model does and counted by the allocator, then freed. */
size_t llama_layer_act_bytes_measured(const llama_dims *d, unsigned keep);

/* An upper bound of what the model under `plan` allocates on this rank for [B, c->seq_len]
 * batches, computed in double from the configuration before anything is allocated (so no 32-bit
 * product can overflow on the way): *state_bytes receives parameters, gradients and AdamW state
 * (exact), *act_bytes activations and scratch (as if every activation were kept),
 * *largest_numel the element count of the largest single tensor (the kernels index with int, so
 * it must stay below 2^31). Returns their sum in bytes. */
double llama_model_bytes(const llama_config *c, const llama_plan *plan, int B, double *state_bytes,
                         double *act_bytes, double *largest_numel);

/* The model under `plan` for [B, c->seq_len] batches: this rank's parameters (initialised from
 * `seed`), activations and scratch. The plan must outlive the model. */
llama_model *llama_create(const llama_config *c, const llama_plan *plan, int B, uint64_t seed);
/* The single-device baseline (plan_single_device()). */
llama_model *llama_create_baseline(const llama_config *c, int B, uint64_t seed);
void llama_free(llama_model *m);

/* tokens, targets: device ints [B*T], the global batch. Returns the sum of the token losses
 * times loss_scale (1 / the global count of valid targets gives the mean), the same on every
 * rank. Issues what the plan's operators issue. */
float llama_forward(llama_model *m, const int *tokens, const int *targets, float loss_scale);
/* Gradients of the last forward's loss, accumulated (+=) into m->params->grads; then the plan's
 * gradient reductions. m->dh ends as d loss / d h0, [Ns, D]. */
void llama_backward(llama_model *m);
void llama_zero_grad(llama_model *m);
/* A forward-backward pass of training step `step` (0: outside training, an evaluation) begins:
 * m->when.step = step, m->when.pass counts it (run_when, plan.h). */
void llama_begin_pass(llama_model *m, int step);
void llama_adamw_step(llama_model *m, const adamw_config *opt, int step);

/* A saved set for layers [l0, l1) (and the head when l1 == L) of one [B, T] batch (MEM_ACTIVATIONS
 * for what the plan's policy keeps); and its release. */
void llama_saved_alloc(llama_model *m, llama_saved *s, int l0, int l1);
void llama_saved_free(llama_model *m, llama_saved *s);

/* The model's pass in pieces, for a plan that runs parts of it (a pipeline stage). Each piece
 * acquires and releases the weights it needs; llama_forward and llama_backward are
 *   embed_forward, layers 0..L-1, head_forward      and      head_backward, layers L-1..0, embed_backward.
 * embed_forward: tokens [N] (device) -> m->saved->layers[0].h_in [Ns, D].
 * head_forward:  h_final = m->saved->h_final [Ns, D], targets [N] -> the loss share (as llama_forward).
 * head_backward: -> dh [Ns, D] = d loss / d h_final (=).
 * embed_backward: dh [Ns, D] = d loss / d h0 -> d tok_embeddings (+=). */
void llama_embed_forward(llama_model *m, const int *tokens);
float llama_head_forward(llama_model *m, const int *targets, float loss_scale);
void llama_head_backward(llama_model *m, float *dh);
void llama_embed_backward(llama_model *m, const float *dh);

/* One layer. h_in = m->saved->layers[l].h_in [Ns, D] -> h_out [Ns, D], with the weights the plan's
 * weight access gives (acquired before, released after). */
void llama_layer_forward(llama_model *m, int l, float *h_out);
/* Layer l's forward again before its backward, from the weights `w` its backward acquired,
 * stopping once w2's input exists (a full recomputation, chapter 03's full checkpointing). */
void llama_layer_recompute(llama_model *m, int l, const unit_weights *w);
/* dh [Ns, D]: d loss / d h_out in, d loss / d h_in out (in place). */
void llama_layer_backward(llama_model *m, int l, float *dh);

/* A [B, Ts, D] residual-stream tensor (e.g. m->dh, B = m->d.B) as the whole global [B_global, T, D] on world
 * rank 0 (host; NULL elsewhere): the sequence's shards over tp, then the batch's rows over the
 * data-parallel ranks. For checking: not counted as traffic. Collective over the world. */
void llama_gather_residual(llama_model *m, const float *x_local, int B, float *full);

C_END
