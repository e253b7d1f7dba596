/* vocab_kernels.h: the local pieces of a vocabulary-parallel cross-entropy (chapter 02).
 *
 * Each rank of the tp group holds logits_local[N, Vl], columns [v0, v0 + Vl) of the full
 * [N, V] logits. These kernels compute what a rank can compute alone; the chapter puts one
 * all-reduce after each of the first three (vocab_math.h explains why that is exact):
 *
 *   vocab_shard_row_max        row_max[N]      = max_j x[n, j]                  then all-reduce(max)
 *   vocab_shard_row_sumexp     row_sumexp[N]   = sum_j e^(x[n, j] - row_max[n]) then all-reduce(sum)
 *   vocab_shard_target_logit   target_logit[N] = x[n, t_n - v0] or 0            then all-reduce(sum)
 *   vocab_shard_loss_sum       sum over valid rows of the row losses (a host number)
 *   vocab_shard_cross_entropy_backward   (softmax - onehot) * scale on the local columns
 *
 * All pointers are device pointers; N rows, Vl local columns, of which the first Vr are real
 * vocabulary entries and the rest padding (a padded vocabulary: masked, vocab_math.h; Vr = Vl when
 * there is none). Targets are real entries, never padding. Targets equal to IGNORE_INDEX
 * (-100, llama_kernels.h) take no part in the loss and get zero gradient rows.
 * The formulas are in vocab_math.h; vocab_kernels_cpu.c and vocab_kernels_cuda.cu are the two
 * loops around them.
 */
#pragma once
#include "cdefs.h"

C_BEGIN

/* row_max[N] (=): the largest of the Vr real local logits of each row (-inf when Vr = 0). */
void vocab_shard_row_max(float *row_max, const float *logits_local, int N, int Vl, int Vr);

/* row_sumexp[N] (=): sum over the real local columns of e^(x - row_max[n]), where row_max is the
 * row's global maximum (after the all-reduce). */
void vocab_shard_row_sumexp(float *row_sumexp, const float *logits_local, const float *row_max,
                            int N, int Vl, int Vr);

/* target_logit[N] (=): x[n, targets[n] - v0] when this shard owns the target, else 0 (also 0
 * for ignored rows), so that a sum over the shards gives the target's logit. */
void vocab_shard_target_logit(float *target_logit, const float *logits_local, const int *targets,
                              int N, int Vl, int v0);

/* Sum over rows with targets[n] != IGNORE_INDEX of (row_max - target_logit) + log(row_sumexp),
 * from the all-reduced [N] vectors (the same on every rank, so is the result). Returns a host
 * value, summed in double in a fixed order; 0 when every target is ignored. */
float vocab_shard_loss_sum(const float *row_max, const float *row_sumexp,
                           const float *target_logit, const int *targets, int N);

/* dlogits_local[N, Vl] (=) = (e^(x - row_max) / row_sumexp - [v0 + j == target]) * grad_scale;
 * zero rows for ignored targets, exactly zero columns for padding (j >= Vr). dlogits_local may
 * alias logits_local. */
void vocab_shard_cross_entropy_backward(float *dlogits_local, const float *logits_local,
                                        const int *targets, const float *row_max,
                                        const float *row_sumexp, int N, int Vl, int Vr, int v0,
                                        float grad_scale);

C_END
