/* sequence_parallel.h: sequence parallelism on the tensor-parallel group, with activation
 * checkpointing (Korthikanti et al., 2022, "Reducing Activation Recomputation in Large
 * Transformer Models"), as a plan for the one model (common/model/model.c).
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
 * Chapter 00's f (identity / all-reduce) and g (all-reduce / identity) become the plan's region:
 *   enter: all-gather along the sequence      forward: all-gather      backward: reduce-scatter
 *   exit:  reduce-scatter along the sequence  forward: reduce-scatter  backward: all-gather
 * An all-reduce is a reduce-scatter followed by an all-gather, and a ring sends the same bytes
 * for the pair as for the all-reduce: the same traffic, now split around the norms. The
 * vocabulary ends (chapter 02) use the same pair.
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
 * Without sequence parallelism (sp = false, --no-sp) the region stays chapter 01's f and g and
 * only the checkpointing applies, for comparing memory and traffic.
 *
 * Notation: B batch, T sequence, Ts = T/p tokens of each sequence on a rank between blocks,
 * C the channels of a tensor. Pointers are device pointers.
 */
#pragma once
#include <stdbool.h>
#include "comm.h"
#include "llama.h"
#include "mesh.h"
#include "plan.h"

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
/* Mixed precision's all-gather (--dtype bf16): Shard(seq) -> Replicate as above, moving bf16, for
 * a tensor whose every reader is a GEMM that rounds its operands to bf16 anyway (the norm outputs
 * entering the column-parallel linears, the final norm's entering the output layer, and dy
 * entering the row-parallel linears' backward): the GEMMs see bit for bit what the fp32 gather
 * gives them, and half the bytes move: x_local rounded to bf16, gathered, laid out in sequence
 * order as bf16 (in the scratch `chunks`) and widened into x_full. C must be even. The embedding's
 * dy, which its backward adds into table rows (no GEMM), is gathered in fp32.
 *                                                       Issues: 1 all-gather of B*T*C bf16 elements. */
void sp_all_gather_seq_bf16(comm_group *tp, float *x_full, const float *x_local, float *chunks, int B, int Ts, int C);
/* The norm weights (attention_norm and ffn_norm of every layer, and norm) saw only this rank's
 * tokens: sum their gradients over tp, packed. The plan's reduce_grads, after the one it wraps.
 * Issues: 1 all-reduce of (2L+1)*D floats. */
void sp_norm_grads_all_reduce(void *state, const llama_plan *p, llama_model *m);

/* ---- activation checkpointing ---------------------------------------------------------------- */
typedef enum { AC_NONE = 0, AC_SELECTIVE, AC_FULL, AC_NMODES } ac_mode;
const char *ac_mode_name(ac_mode ac);             /* "none", "selective", "full" */
/* What a layer keeps in a mode: the plan's `keep` bits (ACT_*, plan.h), read off its blocks'
 * activations and their recompute costs (layer.h; NULL: Llama's layer). */
unsigned ac_keep_mask(const llama_layer *layer, ac_mode ac);

/* The plan's own state: the mode and its scratch (MEM_BUFFERS). */
typedef struct {
    ac_mode ac;
    float *chunks;             /* [p, B, Ts, D]: the re-layout of a sequence collective (SP)    */
    bool gather_bf16;          /* --dtype bf16: the gathers GEMMs read move as bf16 (SP)        */
    float *norm_grads;         /* [(2L+1) D]: the norm gradients packed for one all-reduce (SP) */
    float *attn_out_scratch;   /* [B*T, Hl*hd]: selective AC's recomputed attention output     */
    grad_reduce_ops below_reduce;   /* the gradient reduction the plan owed before SP's          */
} sp_state;
/* The technique as the plan's stack records it (plan_free frees the state above). */
extern const plan_technique sequence_parallel_technique;

/* Adds to a chapter 01/02 plan (tp group, vocabulary-parallel ends): the checkpointing mode and,
 * when `sp`, the sequence-parallel region at the layers and at the vocabulary ends and the
 * norm-gradient reduction. (That tp divides seq_len under SP is this technique's mesh rule,
 * sp_mesh_rule below, which mesh_create runs.) */
void sequence_parallel_apply(llama_plan *plan, const llama_config *c, int B, bool sp, ac_mode ac);

/* Sequence parallelism's rule for mesh_create (mesh.h): each tp rank takes seq_len / (cp x tp)
 * rows of every sequence (cp 1 without context parallelism); the lengths it offers also keep
 * chapter 06's 2 chunks a cp rank. Size: seq_len. */
mesh_rule sp_mesh_rule(int seq_len);

/* The deliberate bugs of this chapter, for --fault. */
extern const plan_fault sequence_parallel_faults[];
