/* vocab_parallel.h: the two ends of the model with the vocabulary split over the tp group
 * (Megatron-LM's VocabParallelEmbedding and vocab-parallel cross-entropy, Shoeybi et al., 2019;
 * torchtitan calls the output's layout Shard(-1) and the loss "loss parallel").
 *
 * Rank r of p owns the vocabulary entries [v0, v0 + Vl), Vl = V/p, v0 = r*Vl: those rows of
 * tok_embeddings [V, D] and of output [V, D], hence those columns of the logits [N, V].
 *
 *   embedding:  h0[N, D] = sum over ranks of (own rows looked up, zero rows elsewhere)
 *               every token is owned by exactly one rank, so the sum is the lookup.
 *                                                    forward: 1 all-reduce of N*D floats
 *   output:     logits_local[N, Vl] = xn[N, D] W_local^T     (column-parallel, behind f)
 *   loss:       M = max, S = sum of e^(x - M), x_t = target logit, each one all-reduce of
 *               N floats; loss_n = (M - x_t) + log S.    forward: 3 all-reduces of N floats
 *               backward: (e^(x - M)/S - onehot) on the local columns. No collective.
 *
 * The full logits [N, V] exist nowhere: each rank holds N*V/p of them, and the loss moves
 * 3N floats instead of gathering N*V.
 *
 * N = B*T token rows. All pointers are device pointers.
 */
#pragma once
#include "comm.h"

/* This rank's rows [v0, v0+Vl) of tok_embeddings. out[N,D]: lookup of in-range tokens, zero
 * rows elsewhere (common's embedding_forward with row0=v0, nrows=Vl), then one
 * all-reduce(sum) of N*D over tp. */
void vocab_parallel_embedding_forward(comm_group *tp, float *out, const int *tokens,
                                      const float *table_local, int N, int D, int v0, int Vl);

/* dtable_local[Vl, D] += rows of dout for tokens in range. No collective: dout[N, D] is the
 * same on every rank, and each rank keeps the rows of its own tokens. */
void vocab_parallel_embedding_backward(float *dtable_local, const float *dout, const int *tokens,
                                       int N, int D, int v0, int Vl);

/* logits_local[N, Vl]; row_max, row_sumexp, target_logit: device [N] scratch (saved for
 * backward). Issues 3 all-reduces of N floats (max, sum, sum). Returns the sum over valid rows
 * of the token losses (host float), same on every rank. */
float vocab_parallel_cross_entropy_forward(comm_group *tp, const float *logits_local,
                                           const int *targets, int N, int Vl, int v0,
                                           float *row_max, float *row_sumexp, float *target_logit);

/* dlogits_local[N, Vl] (=, may alias logits_local) = (softmax - onehot) * grad_scale on the
 * local slice, zero rows for ignored targets. No collective. */
void vocab_parallel_cross_entropy_backward(float *dlogits_local, const float *logits_local,
                                           const int *targets, const float *row_max,
                                           const float *row_sumexp, int N, int Vl, int v0,
                                           float grad_scale);
