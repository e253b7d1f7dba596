/* vocab_parallel.c: the vocabulary-parallel ends of the model (vocab_parallel.h).
 *
 * The cross-entropy is a local kernel on this rank's slice of the vocabulary (vocab_kernels.h,
 * which knows nothing of ranks) plus the all-reduces that turn a per-shard answer into the
 * whole vocabulary's. Where the all-reduces are is the whole lesson.
 */
#include "../01_transformer_tp/tp.h"
#include "vocab_kernels.h"
#include "vocab_parallel.h"

void vocab_parallel_layouts(shard_layout layout[P_NKINDS]) {
    /* BEGIN ASSIGNMENT: split the embedding table and the output layer over the vocabulary */
    layout[P_TOK_EMBEDDINGS] = SHARD_ROWS;   /* rows [v0, v0 + V/tp) of [V, D] */
    layout[P_OUTPUT] = SHARD_ROWS;           /* the same rows: column-parallel over the vocabulary */
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

/* The plan's loss operator: M and S are the loss's saved statistics [2N], x_t its scratch. */
static float loss_forward(void *state, const llama_plan *p, const float *logits, const int *targets, int N, int Vl,
                          int v0, float *stats, float *scratch) {
    return vocab_parallel_cross_entropy_forward(p->groups.tp, logits, targets, N, Vl, v0, stats, stats + N, scratch);
}
static void loss_backward(void *state, const llama_plan *p, float *dlogits, const float *logits, const int *targets,
                          const float *stats, int N, int Vl, int v0, float grad_scale) {
    vocab_parallel_cross_entropy_backward(dlogits, logits, targets, stats, stats + N, N, Vl, v0, grad_scale);
}
const loss_ops vocab_parallel_loss = {NULL, 2, loss_forward, loss_backward};

const plan_technique loss_parallel_technique = {"loss parallel", NULL};

void loss_parallel_apply(llama_plan *plan, const llama_config *c) {
    /* (whole vocabulary rows per rank: mesh_check, with the vocabulary among its requirements) */
    plan->name = "megatron tp + loss parallel";
    vocab_parallel_layouts(plan->layout);
    plan->vocab = megatron_region;   /* g after the embedding's lookup, f before the output layer */
    plan->loss = vocab_parallel_loss;
    plan_push(plan, &loss_parallel_technique, NULL, 0);
}

/* --fault skip-output-allreduce: the output layer's input gradient keeps only this rank's
 * vocabulary rows' share (f's backward all-reduce before the output layer is left out). */
static const char *skip_output_allreduce(llama_plan *p) {
    if (!plan_has(p, &loss_parallel_technique))
        return "needs --loss-parallel: without it the output layer is replicated and has no all-reduce to skip";
    p->vocab.enter_backward = region_identity.enter_backward;   /* no all-reduce: each rank keeps its share */
    return NULL;
}
const plan_fault loss_parallel_faults[] = {
    {"skip-output-allreduce", "f's backward all-reduce before the output layer is left out", skip_output_allreduce},
    {0}};
