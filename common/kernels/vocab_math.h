/* vocab_math.h: the per-row and per-element formulas of a cross-entropy whose vocabulary is
 * split over the ranks of a tensor-parallel group (chapter 02). Shared by vocab_kernels_cpu.c
 * (loops) and vocab_kernels_cuda.cu (one thread per element or row), like llama_math.h.
 *
 * A rank holds the columns [v0, v0 + Vl) of every row x of logits. Softmax needs two numbers
 * of the whole row, M = max_j x_j and S = sum_j e^(x_j - M), and the loss one more, x_t.
 * Each is a reduction over the vocabulary, so each splits into a local part and one
 * all-reduce over the shards:
 *
 *   M   = max over ranks of (max over the rank's columns of x_j)        all-reduce(max)
 *   S   = sum over ranks of (sum over the rank's columns of e^(x_j - M)) all-reduce(sum)
 *   x_t = sum over ranks of (x_t if the rank owns column t, else 0)      all-reduce(sum)
 *
 * The local sum of exponentials must use the global M, not the rank's own maximum: the terms
 * of different ranks are only addable when they are relative to the same number. After the
 * all-reduces, (M, S) is exactly the softmax_state the single-device kernel builds over the
 * whole row, so the loss and the gradient are llama_math.h's formulas, unchanged.
 *
 * A padded vocabulary (Megatron's: V rounded up so that tp divides it) adds columns that are no
 * token: a shard's first Vr columns are real, the rest padding. A padding column enters every
 * reduction as -inf (vocab_masked_logit): it never wins the max, adds e^-inf = 0 to S, and its
 * gradient e^-inf / S - 0 is exactly 0, so the loss and the real columns' gradients are those of
 * the unpadded vocabulary, bit for bit.
 */
#pragma once
#include "llama_math.h"

/* The column of this shard that holds vocabulary entry `token`, or -1 when another shard owns
 * it. The ignore index -100 is owned by no shard (v0 >= 0). The same rule as
 * embedding_local_row: the embedding and the output layer split the vocabulary alike.      */
HD static inline int vocab_shard_column(int token, int v0, int Vl) {
    return embedding_local_row(token, v0, Vl);
}

/* Column j of a shard whose first Vr columns are real: its logit, or -inf for padding.       */
HD static inline float vocab_masked_logit(float logit, int j, int Vr) { return j < Vr ? logit : -INFINITY; }

/* The max reduction, local and across threads. fmaxf ignores a NaN operand; logits are
 * finite here, and the start value -inf loses to every finite number.                      */
HD static inline float vocab_max(float a, float b) { return fmaxf(a, b); }

/* One term of the local sum: e^(x - M), M the global maximum, so every exponent is <= 0 and
 * logits of 1e4 cannot overflow.                                                            */
HD static inline float vocab_sumexp_term(float x, float global_max) { return expf(x - global_max); }

/* The all-reduced pair as the state of the whole row's softmax.                              */
HD static inline softmax_state vocab_row_state(float global_max, float global_sumexp) {
    softmax_state st;
    st.max = global_max;
    st.sum = global_sumexp;
    return st;
}

/* loss of a row = (M - x_t) + log S (llama_math.h's cross_entropy_loss).                    */
HD static inline float vocab_row_loss(float global_max, float global_sumexp, float target_logit) {
    return cross_entropy_loss(target_logit, vocab_row_state(global_max, global_sumexp));
}

/* d loss / d x_j = (e^(x_j - M) / S - [j == t]) * grad_scale: only the row's (M, S), which
 * every rank already has, and whether this column is the target. No communication.          */
HD static inline float vocab_grad(float logit, int is_target, float global_max,
                                  float global_sumexp, float grad_scale) {
    return cross_entropy_grad(logit, is_target, vocab_row_state(global_max, global_sumexp),
                              grad_scale);
}
