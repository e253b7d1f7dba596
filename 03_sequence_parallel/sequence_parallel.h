/* sequence_parallel.h: sequence parallelism on the tensor-parallel group, with activation
 * checkpointing (Korthikanti et al., 2022, "Reducing Activation Recomputation in Large
 * Transformer Models").
 *
 * Chapter 01's tensor parallelism splits the GEMMs and attention over the p ranks of the tp
 * group, but the residual stream, the norms and the embedding output stay replicated: every rank
 * holds and saves [B, T, D] of them. They work token by token, so they can be split along the
 * sequence instead. Between blocks rank r holds tokens [r*T/p, (r+1)*T/p) of every sequence:
 *
 *     Shard(seq) [B, T/p, D]                 Replicate [B, T, D]                Partial [B, T, D]
 *   h ── rmsnorm ── xn ── all-gather(seq) ──> xn ── column-parallel ── ... ── row-parallel ──> y
 *                                                                                              │
 *   h + ... <──────────────────────────── reduce-scatter(seq) <───────────────────────────────┘
 *
 * Chapter 00's f (identity / all-reduce) and g (all-reduce / identity) become:
 *   all-gather along the sequence      forward: all-gather      backward: reduce-scatter
 *   reduce-scatter along the sequence  forward: reduce-scatter  backward: all-gather
 * An all-reduce is a reduce-scatter followed by an all-gather, and a ring sends the same bytes
 * for the pair as for the all-reduce: the same traffic, now split around the norms.
 *
 * The norm weights are replicated but each rank's norms see only its own tokens, so their
 * gradients are partial sums: sp_norm_grads_all_reduce() completes them (one all-reduce).
 *
 * Activation checkpointing (--ac) decides what a layer keeps for backward:
 *   none       everything the backward reads
 *   selective  the outputs of the GEMMs, of attention and of the collectives; the norms, the
 *              softmax probabilities and the SwiGLU product are recomputed in backward
 *   full       only the layer's input; the whole layer is recomputed in backward
 * What is not kept lives in one set of buffers shared by all layers (MEM_BUFFERS).
 *
 * The same code runs without sequence parallelism (sp = false, --no-sp): then the region
 * operators are chapter 00's f and g, the norms see the whole sequence, and the model is
 * chapter 01's (with chapter 02's vocabulary-parallel ends), for comparing memory and traffic.
 *
 * Notation: B batch, T sequence, Ts = T/p tokens of each sequence on a rank between blocks
 * (Ts = T without SP), N = B*T rows inside the tp region, Ns = B*Ts rows outside it, D dim,
 * hd head dim, Hl = H/p and Hkvl = Hkv/p local heads, Fl = F/p local ffn units, Vl = V/p local
 * vocabulary rows.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "../01_transformer_tp/tp.h"
#include "comm.h"

/* ---- the region operators: Shard(seq) <-> Replicate, Partial -> Shard(seq) --------------------
 * x_local/y_local/dx_local/dy_local: [B, Ts, C] on each rank, tokens [r*Ts, (r+1)*Ts).
 * x_full/y_partial/dx_full/dy_full:  [B, T, C], T = p*Ts.
 * chunks: scratch [p, B, Ts, C], the rank-major order of the collectives (seq_layout.h). */

/* Shard(seq) -> Replicate: every rank gets the whole sequence.      Issues: 1 all-gather of B*T*C. */
void sp_all_gather_seq_forward(comm_group *tp, float *x_full, const float *x_local, float *chunks,
                               int B, int Ts, int C);
/* Its backward: dx_full holds this rank's contribution to the gradient of every token; a token's
 * gradient is the sum over ranks, and each rank keeps its own tokens. Issues: 1 reduce-scatter. */
void sp_all_gather_seq_backward(comm_group *tp, float *dx_local, const float *dx_full, float *chunks,
                                int B, int Ts, int C);
/* Partial -> Shard(seq): sum the ranks' partial [B, T, C] and keep this rank's tokens.
 *                                                               Issues: 1 reduce-scatter of B*T*C. */
void sp_reduce_scatter_seq_forward(comm_group *tp, float *y_local, const float *y_partial,
                                   float *chunks, int B, int Ts, int C);
/* Its backward: the gradient of a sum reaches every term: each rank needs dy of every token.
 *                                                               Issues: 1 all-gather of B*T*C. */
void sp_reduce_scatter_seq_backward(comm_group *tp, float *dy_full, const float *dy_local,
                                    float *chunks, int B, int Ts, int C);

/* ---- activation checkpointing ---------------------------------------------------------------- */
typedef enum { AC_NONE = 0, AC_SELECTIVE, AC_FULL, AC_NMODES } ac_mode;
const char *ac_mode_name(ac_mode ac);             /* "none", "selective", "full" */

/* The shapes of one rank's tensors. */
typedef struct {
    int p;                   /* tp degree                                                        */
    bool sp;                 /* sequence parallel: the residual stream is [B, T/p, D]            */
    int B, T, Ts, N, Ns;     /* Ts = T/p with SP, T without; N = B*T, Ns = B*Ts                  */
    int D, hd, Hl, Hkvl, Fl, Vl;
} sp_dims;
sp_dims sp_dims_make(const llama_config *c, int B, int p, bool sp);

/* What one layer keeps for backward on this rank. Every pointer is valid; a tensor the AC mode
 * does not keep points into the model's shared recompute buffers (m->shared). */
typedef struct {
    float *h_in;        /* [Ns, D]          input of the layer (the residual stream)     input   */
    float *attn_xn;     /* [Ns, D]          rmsnorm(h_in) * attention_norm               cheap   */
    float *attn_rstd;   /* [Ns]                                                          cheap   */
    float *q;           /* [N, Hl*hd]       this rank's query heads, after RoPE          GEMM    */
    float *k, *v;       /* [N, Hkvl*hd]     this rank's kv heads (k after RoPE)          GEMM    */
    float *probs;       /* [B, Hl, T, T]    softmax of the scores                        cheap   */
    float *attn_out;    /* [N, Hl*hd]       attention output, input of wo                GEMM    */
    float *h_mid;       /* [Ns, D]          residual after attention (reduce-scatter + h_in) GEMM */
    float *ffn_xn;      /* [Ns, D]          rmsnorm(h_mid) * ffn_norm                    cheap   */
    float *ffn_rstd;    /* [Ns]                                                          cheap   */
    float *ffn_a, *ffn_b;   /* [N, Fl]      w1 m and w3 m                                GEMM    */
    float *ffn_g;       /* [N, Fl]          silu(a) * b, input of w2                     cheap   */
    float *owned[16];   /* the allocations this layer owns (MEM_ACTIVATIONS), for freeing        */
    int n_owned;
} sp_layer_acts;

/* The sequence-parallel model: chapter 01's parameters (with chapter 02's vocabulary-parallel
 * embedding and output) and this chapter's activations. */
typedef struct {
    tp_params *w;
    llama_config c;
    comm_group *tp;
    sp_dims d;
    bool sp;
    ac_mode ac;
    sp_layer_acts *acts;            /* [L]                                                     */
    sp_layer_acts shared;           /* what no layer keeps: recomputed in backward (MEM_BUFFERS)  */
    size_t *layer_act_bytes;        /* [L] bytes each layer saves, measured by the allocator   */
    float *h_final, *final_xn;      /* [Ns, D] residual after the last layer, its rmsnorm       */
    float *final_rstd;              /* [Ns]                                                    */
    float *logits;                  /* [N, Vl] this rank's vocabulary columns                  */
    float *row_max, *row_sumexp;    /* [N] the loss's max and sum of exponentials (ch. 02)     */
    float *target_logit;            /* [N] forward-only scratch of the loss                    */
    int *tokens, *targets;          /* [N]                                                     */
    int *positions;                 /* [T] RoPE positions of the rows of a gathered sequence   */
    float loss_scale;
    /* scratch (MEM_BUFFERS), reused by every layer */
    float *chunks;                  /* [N, D] rank-major chunks of a sequence collective       */
    float *attn_in, *ffn_in;        /* [N, D] gathered norm outputs: input of the column-parallel linears */
    float *y_partial;               /* [N, D] a row-parallel output before the reduce-scatter  */
    float *dy_full;                 /* [N, D] gathered gradient of the residual stream         */
    float *dxn_full, *dxn_part;     /* [N, D] gradient of a gathered norm output (partial sums) */
    float *dxn;                     /* [Ns, D] the same, reduced to this rank's tokens          */
    float *dh;                      /* [Ns, D] gradient of the residual stream                 */
    float *dattn_out, *dq, *dk, *dv, *dprobs, *dffn_g, *dffn_a, *dffn_b;
    float *attn_out_scratch;        /* [N, Hl*hd] selective AC: attention's output, recomputed and dropped */
    float *norm_grads;              /* [(2L+1) D] the norm gradients packed for one all-reduce  */
    /* deliberate bugs, for the tests that prove the parity check catches them */
    bool skip_norm_grad_allreduce;  /* leave the norm-weight gradients partial                 */
    bool rope_local_positions;      /* number each rank's tokens from 0 within its shard       */
} sp_llama;

/* Validates the layout (exit 2: tp must divide seq_len with SP, and heads, ffn and vocabulary as
 * in chapters 01 and 02), then allocates this rank's parameters and activations. */
sp_llama *sp_llama_create(const llama_config *c, comm_group *tp, int B, bool sp, ac_mode ac,
                          uint64_t seed);
void sp_llama_free(sp_llama *m);

/* One layer. h_in = m->acts[l].h_in [Ns, D] -> h_out [Ns, D]. h_out == NULL is the recomputation
 * of full AC: the forward stops once w2's input exists.
 * Issues (SP): 2 all-gathers and 2 reduce-scatters of N*D floats (1 fewer reduce-scatter when
 * h_out == NULL). Without SP: 2 all-reduces (g). */
void sp_layer_forward(sp_llama *m, int l, float *h_out);
/* dh [Ns, D]: d loss / d h_out in, d loss / d h_in out (in place). First brings back what the AC
 * mode did not keep (and gathers the norm outputs again: SP keeps only their shards).
 * Issues (SP): the re-gathers, 2 all-gathers (+ 1 reduce-scatter for full AC's recomputed
 * forward), then 2 reduce-scatters and 2 all-gathers. Without SP: 2 all-reduces (f) (+ 1, full). */
void sp_layer_backward(sp_llama *m, int l, float *dh);

/* tokens, targets [B*T], positions [T] (0..T-1) on the device. Returns the sum of token losses
 * times loss_scale, the same on every rank. */
float sp_llama_forward(sp_llama *m, const int *tokens, const int *targets, const int *positions,
                       float loss_scale);
/* Gradients of the last forward's loss into m->w->grads; m->dh ends as d loss / d h0 [Ns, D]. */
void sp_llama_backward(sp_llama *m);

/* The norm weights (attention_norm and ffn_norm of every layer, and norm) are replicated, but
 * with SP each rank's norms saw only its own tokens: sum their gradients over tp.
 * Issues: 1 all-reduce of (2L+1)*D floats. */
void sp_norm_grads_all_reduce(sp_llama *m);

/* A [Ns, D] device tensor of the residual stream (e.g. m->dh) as the whole [B, T, D] on rank 0
 * of tp (host; NULL elsewhere). For checking: not counted as traffic. Collective on tp. */
void sp_gather_residual_to_host(sp_llama *m, const float *x_local, float *full);

/* ---- activation memory ------------------------------------------------------------------------ */
/* Bytes one layer saves for backward in a mode, measured: allocate the layer's activations the
 * way sp_llama_create does and read the allocator's MEM_ACTIVATIONS count, then free them. */
size_t sp_layer_act_bytes_measured(const sp_dims *d, ac_mode ac);
/* The same from the README's formula, term by term. */
double sp_layer_act_bytes_formula(const sp_dims *d, ac_mode ac);
/* Bytes saved outside the layers (final norm, logits, the loss's M and S), formula. */
double sp_outside_act_bytes_formula(const sp_dims *d);
