/* vocab_parallel.h: the two ends of the model with the vocabulary split over the tp group
 * (Megatron-LM's VocabParallelEmbedding and vocab-parallel cross-entropy, Shoeybi et al., 2019;
 * torchtitan calls the output's layout Shard(-1) and the loss "loss parallel"), as a plan.
 *
 * Rank r of p owns the vocabulary entries [v0, v0 + Vl), Vl = V/p, v0 = r*Vl: those rows of
 * tok_embeddings [V, D] and of output [V, D], hence those columns of the logits [N, V].
 *
 *   embedding:  each rank looks up the tokens it owns (zero rows for the others); every token
 *               is owned by exactly one rank, so g, the sum over ranks, is the lookup.
 *                                                    forward: 1 all-reduce of N*D floats
 *   output:     logits_local[N, Vl] = xn[N, D] W_local^T     (column-parallel, behind f)
 *                                                    backward: 1 all-reduce of N*D floats
 *   loss:       M = max, S = sum of e^(x - M), x_t = target logit, each one all-reduce of
 *               N floats; loss_n = (M - x_t) + log S.    forward: 3 all-reduces of N floats
 *               backward: (e^(x - M)/S - onehot) on the local columns. No collective.
 *
 * The full logits [N, V] exist nowhere: each rank holds N*V/p of them, and the loss moves
 * 3N floats instead of gathering N*V. In the model (common/model/model.c) the embedding's g
 * and the output's f are the plan's vocab region: chapter 01's f and g, now at the two ends.
 *
 * N = B*T token rows. All pointers are device pointers.
 */
#pragma once
#include "comm.h"
#include "llama.h"
#include "plan.h"

/* tok_embeddings and output split over the vocabulary: rows [v0, v0 + V/tp) of each. */
void vocab_parallel_layouts(shard_layout layout[P_NKINDS]);

/* logits_local[N, Vl]; row_max, row_sumexp (saved for backward), target_logit: device [N].
 * Issues 3 all-reduces of N floats (max, sum, sum). Returns the sum over valid rows of the token
 * losses (host float), the same on every rank. */
float vocab_parallel_cross_entropy_forward(comm_group *tp, const float *logits_local,
                                           const int *targets, int N, int Vl, int v0,
                                           float *row_max, float *row_sumexp, float *target_logit);

/* dlogits_local[N, Vl] (=, may alias logits_local) = (softmax - onehot) * grad_scale on the
 * local slice, zero rows for ignored targets. No collective. */
void vocab_parallel_cross_entropy_backward(float *dlogits_local, const float *logits_local,
                                           const int *targets, const float *row_max,
                                           const float *row_sumexp, int N, int Vl, int v0,
                                           float grad_scale);

/* The loss operator of the plan: the two functions above, saving M and S (2 floats per row). */
extern const loss_ops vocab_parallel_loss;
extern const plan_technique loss_parallel_technique;

/* Adds loss parallelism to a plan with a tp group (chapter 01's megatron_plan): the vocabulary
 * layouts, chapter 01's f and g as the vocab region, the vocab-parallel loss. Validates that tp
 * divides the vocabulary (one line naming the nearest valid sizes and exit 2 otherwise). */
void loss_parallel_apply(llama_plan *plan, const llama_config *c);

/* The deliberate bugs of this chapter, for --fault. */
extern const plan_fault loss_parallel_faults[];
