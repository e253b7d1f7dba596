/* vocab_parallel.c: the vocabulary-parallel embedding and cross-entropy (vocab_parallel.h).
 *
 * Each function is a local kernel on this rank's slice of the vocabulary (llama_kernels.h and
 * vocab_kernels.h, which know nothing of ranks) plus the all-reduces that turn a per-shard
 * answer into the whole vocabulary's. Where the all-reduces are is the whole lesson.
 */
#include "llama_kernels.h"
#include "vocab_kernels.h"
#include "vocab_parallel.h"

void vocab_parallel_embedding_forward(comm_group *tp, float *out, const int *tokens,
                                      const float *table_local, int N, int D, int v0, int Vl) {
    /* BEGIN ASSIGNMENT: look up the tokens this rank owns (zero rows for the rest), then sum over tp */
    embedding_forward(out, tokens, table_local, N, D, v0, Vl);   /* out[N, D], one owner per row */
    comm_all_reduce(tp, out, (size_t)N * D, COMM_SUM);            /* + zeros from the others      */
    /* END ASSIGNMENT */
}

void vocab_parallel_embedding_backward(float *dtable_local, const float *dout, const int *tokens,
                                       int N, int D, int v0, int Vl) {
    /* BEGIN ASSIGNMENT: add each row of dout into the local table row of its token, if owned */
    embedding_backward(dtable_local, dout, tokens, N, D, v0, Vl);
    /* END ASSIGNMENT */
}

float vocab_parallel_cross_entropy_forward(comm_group *tp, const float *logits_local,
                                           const int *targets, int N, int Vl, int v0,
                                           float *row_max, float *row_sumexp, float *target_logit) {
    /* BEGIN ASSIGNMENT: M, S and x_t of every row, each a local reduction and one all-reduce */
    /* M[N]: the row's maximum over the whole vocabulary */
    vocab_shard_row_max(row_max, logits_local, N, Vl);
    comm_all_reduce(tp, row_max, N, COMM_MAX);
    /* S[N] = sum_j e^(x_j - M): every rank's terms relative to the same, global, M */
    vocab_shard_row_sumexp(row_sumexp, logits_local, row_max, N, Vl);
    comm_all_reduce(tp, row_sumexp, N, COMM_SUM);
    /* x_t[N]: the owner of the target contributes its logit, the others 0 */
    vocab_shard_target_logit(target_logit, logits_local, targets, N, Vl, v0);
    comm_all_reduce(tp, target_logit, N, COMM_SUM);
    /* END ASSIGNMENT */
    /* every rank holds the same (M, S, x_t) now: sum over valid rows of (M - x_t) + log S */
    return vocab_shard_loss_sum(row_max, row_sumexp, target_logit, targets, N);
}

void vocab_parallel_cross_entropy_backward(float *dlogits_local, const float *logits_local,
                                           const int *targets, const float *row_max,
                                           const float *row_sumexp, int N, int Vl, int v0,
                                           float grad_scale) {
    /* BEGIN ASSIGNMENT: (softmax - onehot) * grad_scale on the local columns, from the saved M and S */
    vocab_shard_cross_entropy_backward(dlogits_local, logits_local, targets, row_max, row_sumexp,
                                       N, Vl, v0, grad_scale);
    /* END ASSIGNMENT */
}
