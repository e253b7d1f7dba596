/* vocab_parallel.c: the vocabulary-parallel ends of the model (vocab_parallel.h).
 *
 * The cross-entropy is a local kernel on this rank's slice of the vocabulary (vocab_kernels.h,
 * which knows nothing of ranks) plus the all-reduces that turn a per-shard answer into the
 * whole vocabulary's. Where the all-reduces are is the whole lesson.
 */
#include <stdio.h>
#include <stdlib.h>
#include "../01_transformer_tp/tp.h"
#include "cli.h"
#include "device.h"
#include "log.h"
#include "model.h"
#include "parity.h"
#include "vocab_kernels.h"
#include "vocab_parallel.h"

void vocab_parallel_layouts(shard_layout layout[P_NKINDS]) {
    /* BEGIN ASSIGNMENT: split the embedding table and the output layer over the vocabulary */
    layout[P_TOK_EMBEDDINGS] = SHARD_ROWS;   /* rows [v0, v0 + V/tp) of [V, D] */
    layout[P_OUTPUT] = SHARD_ROWS;           /* the same rows: column-parallel over the vocabulary */
    /* END ASSIGNMENT */
}

int vocab_parallel_real_columns(int V, int Vl, int v0) {
    int real = Vl;   /* as if every column were a token */
    /* BEGIN ASSIGNMENT: vocabulary padding: how many of this rank's Vl columns, from entry v0, are real entries of the V (the rest are padding) */
    real = V - v0;                    /* the entries left from v0 on ...                        */
    if (real > Vl) real = Vl;         /* ... at most the rank's Vl (no padding on this rank) ... */
    if (real < 0) real = 0;           /* ... and none on a rank that starts past V              */
    /* END ASSIGNMENT */
    return real;
}

float vocab_parallel_cross_entropy_forward(comm_group *tp, const float *logits_local,
                                           const int *targets, int N, int Vl, int v0, int V,
                                           float *row_max, float *row_sumexp, float *target_logit) {
    int Vr = vocab_parallel_real_columns(V, Vl, v0);   /* the rest of the Vl columns: padding, masked */
    /* BEGIN ASSIGNMENT: M, S and x_t of every row, each a local reduction and one all-reduce */
    /* M[N]: the row's maximum over the whole vocabulary */
    vocab_shard_row_max(row_max, logits_local, N, Vl, Vr);
    comm_all_reduce(tp, row_max, N, COMM_MAX);
    /* S[N] = sum_j e^(x_j - M): every rank's terms relative to the same, global, M */
    vocab_shard_row_sumexp(row_sumexp, logits_local, row_max, N, Vl, Vr);
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
                                           const float *row_sumexp, int N, int Vl, int v0, int V,
                                           float grad_scale) {
    int Vr = vocab_parallel_real_columns(V, Vl, v0);   /* the padding columns get exactly 0 */
    /* BEGIN ASSIGNMENT: (softmax - onehot) * grad_scale on the local columns, from the saved M and S */
    vocab_shard_cross_entropy_backward(dlogits_local, logits_local, targets, row_max, row_sumexp,
                                       N, Vl, Vr, v0, grad_scale);
    /* END ASSIGNMENT */
}

/* The plan's loss operator: M and S are the loss's saved statistics [2N], x_t its scratch. */
static float loss_forward(void *state, const llama_plan *p, const float *logits, const int *targets, int N, int Vl,
                          int v0, int V, float *stats, float *scratch) {
    return vocab_parallel_cross_entropy_forward(p->groups.tp, logits, targets, N, Vl, v0, V, stats, stats + N, scratch);
}
static void loss_backward(void *state, const llama_plan *p, float *dlogits, const float *logits, const int *targets,
                          const float *stats, int N, int Vl, int v0, int V, float grad_scale) {
    vocab_parallel_cross_entropy_backward(dlogits, logits, targets, stats, stats + N, N, Vl, v0, V, grad_scale);
}
const loss_ops vocab_parallel_loss = {NULL, 2, loss_forward, loss_backward};

const plan_technique loss_parallel_technique = {"loss parallel", NULL};

void loss_parallel_apply(llama_plan *plan, const llama_config *c) {
    /* (whole vocabulary rows per rank: the vocabulary padded to a multiple of tp, vocab_mesh_rule,
     * which mesh_create runs; the padding rows are the parameter table's, param_split_rows) */
    plan_push(plan, &loss_parallel_technique, NULL, 0);
    vocab_parallel_layouts(plan->layout);
    plan->vocab = megatron_region;   /* g after the embedding's lookup, f before the output layer */
    plan->loss = vocab_parallel_loss;
}

void vocab_multiple_flag(llama_config *c, const char *arg) { c->vocab_multiple = cli_int("--vocab-multiple", arg, 1, 1 << 20); }

void vocab_padding_describe(const llama_config *c, int tp) {
    int V = c->vocab_size, Vp = llama_padded_vocab(c, tp), Vl = Vp / tp;
    int m = vocab_padding_multiple(V, c->vocab_multiple, tp);
    const char *why = c->vocab_multiple ? "--vocab-multiple" : m == tp ? "tp: fewer than 128 x tp entries" : "128 x tp";
    if (Vp == V) return;   /* tp divides the vocabulary as it is: nothing to say */
    log0("vocabulary %d padded to %d (a multiple of %d, %s): %d rows per rank", V, Vp, m, why, Vl);
    int first = V / Vl;   /* the first rank that holds padding */
    log0("; padding rows [%d, %d) (%.1f%% of the output GEMM): rank %d holds %d real rows and %d of padding%s\n", V,
         Vp, 100.0 * (Vp - V) / Vp, first, vocab_parallel_real_columns(V, Vl, first * Vl),
         Vl - vocab_parallel_real_columns(V, Vl, first * Vl), first < tp - 1 ? ", the ranks after it only padding" : "");
}

/* The stored units of tensor i in `block` that are padding: the vocabulary's past real_units
 * (a dp shard's units from own_first, so an FSDP shard's own padding counts too). Returns the
 * count of non-zero elements among them. */
static long padding_nonzeros(const param_table *t, float *block, int i) {
    const param_tensor *x = &t->t[i];
    size_t stored = param_stored_numel(t, block, i);
    if (!x->here || stored == 0) return 0;
    int first = param_storage_of(t, block) == STORE_SHARD ? x->own_first : 0;
    float *host = malloc(stored * sizeof(float));
    device_copy_to_host(host, param_in(t, block, i), stored * sizeof(float));
    long nonzero = 0;
    for (size_t e = 0; e < stored; e++) nonzero += first + (int)(e / x->width) >= x->real_units && host[e] != 0.0f;
    free(host);
    return nonzero;
}

int vocab_padding_report(const llama_model *m) {
    const param_table *t = m->params;
    float *blocks[4] = {t->params, t->grads, t->adam_m, t->adam_v};
    long nonzero = 0, padding = 0;
    for (int k = 0; k < 2; k++) {
        int i = param_index(t, k ? P_OUTPUT : P_TOK_EMBEDDINGS, -1);
        padding += (long)(t->t[i].units - t->t[i].real_units) * t->t[i].width;
        for (int b = 0; b < 4; b++) nonzero += padding_nonzeros(t, blocks[b], i);
    }
    comm_group *w = comm_world();
    double all_nonzero = comm_host_sum(w, (double)nonzero), all_padding = comm_host_sum(w, (double)padding);
    if (all_padding == 0) return 0;
    bool ok = all_nonzero == 0;
    log0("  vocabulary padding rows after the last step (tok_embeddings, output; values, gradients, AdamW m and v, "
         "every rank): %.0f non-zero elements | 0  %s\n", all_nonzero, ok ? "" : "MISMATCH");
    if (!ok) parity_fail("a padding row of the vocabulary was updated (above)");
    return !ok;
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

/* ---- the mesh's rule (vocab_parallel.h) ---- */

static const char *tp_divides_padded_vocab(const mesh_rule *r, const mesh_view *v, char *why, size_t len) {
    int vocab = (int)r->size[0], multiple = (int)r->size[1], T = v->s.tp;
    int padded = vocab ? vocab_padded_size(vocab, multiple, T) : 0;
    const char *multiple_name = mesh_size_name(v, "--vocab-multiple", "vocab multiple");
    if (padded % T)
        return mesh_refuse(why, len, "%s does not divide %s %d padded to a multiple of %s %d (%d rows): the embedding "
                           "and the output layer are split by vocabulary rows; use a %s that is a multiple of %d",
                           v->degree[MESH_TP], mesh_size_name(v, "--vocab", "vocab_size"), vocab, multiple_name,
                           multiple, padded, multiple_name, T);
    return NULL;
}

mesh_rule vocab_mesh_rule(long long vocab_size, int vocab_multiple) {
    return (mesh_rule){.check = tp_divides_padded_vocab, .size = {vocab_size, vocab_multiple}};
}
