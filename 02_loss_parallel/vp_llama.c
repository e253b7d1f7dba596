/* vp_llama.c: the model of vp_llama.h. Read it beside tp_llama_forward/backward in
 * 01_transformer_tp/tp.c: the layer loop is the same call, the two ends are vocab-parallel.
 *
 * Notation: N = B*T rows, D dim, V vocabulary, Vl = V/tp local vocabulary rows from v0.
 */
#include <stdlib.h>
#include "../00_naive_tp_mlp/tensor_parallel.h"
#include "device.h"
#include "llama_kernels.h"
#include "vocab_parallel.h"
#include "vp_llama.h"

tp_layouts vp_layouts(void) {
    tp_layouts t = megatron_layouts();
    /* BEGIN ASSIGNMENT: split the embedding table and the output layer over the vocabulary */
    t.of[P_TOK_EMBEDDINGS] = SHARD_ROWS;   /* rows [v0, v0 + V/tp) of [V, D] */
    t.of[P_OUTPUT] = SHARD_ROWS;           /* the same rows: column-parallel over the vocabulary */
    /* END ASSIGNMENT */
    return t;
}

vp_llama *vp_llama_create(const llama_config *c, comm_group *tp, int B, int T, uint64_t seed) {
    vp_llama *v = calloc(1, sizeof *v);
    v->m = tp_llama_create(c, tp, vp_layouts(), B, T, seed);   /* logits [N, Vl] */
    int N = B * T;
    v->row_max = device_alloc_floats(N, MEM_ACTIVATIONS);
    v->row_sumexp = device_alloc_floats(N, MEM_ACTIVATIONS);
    v->target_logit = device_alloc_floats(N, MEM_BUFFERS);
    return v;
}

void vp_llama_free(vp_llama *v) {
    device_free(v->row_max); device_free(v->row_sumexp); device_free(v->target_logit);
    tp_llama_free(v->m);
    free(v);
}

/* Adds the tp group's all-reduce counters accumulated since `before` to `into`. */
static void count_since(collective_stats *into, const collective_stats *before, comm_group *tp) {
    const collective_stats *now = &tp->stats[COLL_ALL_REDUCE];
    into->calls += now->calls - before->calls;
    into->payload_bytes += now->payload_bytes - before->payload_bytes;
    into->wire_bytes += now->wire_bytes - before->wire_bytes;
    into->seconds += now->seconds - before->seconds;
}

float vp_llama_forward(vp_llama *v, const int *tokens, const int *targets, const int *positions,
                       float loss_scale) {
    tp_llama *m = v->m;
    const llama_config *c = &m->c;
    int N = m->N, D = c->dim, L = c->n_layers, Vl = m->w->Vl, v0 = m->w->v0;
    int i_norm = m->w->nparams - 2, i_out = m->w->nparams - 1;
    device_copy(m->tokens, tokens, (size_t)N * sizeof(int));
    device_copy(m->targets, targets, (size_t)N * sizeof(int));
    device_copy(m->positions, positions, (size_t)m->T * sizeof(int));
    m->loss_scale = loss_scale;

    /* h0[N, D]: each rank looks up the tokens of its V/tp rows, one all-reduce completes it */
    vocab_parallel_embedding_forward(m->tp, m->acts[0].h_in, m->tokens, tp_param(m->w, 0),
                                     N, D, v0, Vl);
    /* the layers: chapter 01, unchanged */
    for (int l = 0; l < L; l++)
        tp_layer_forward(m, l, l + 1 < L ? m->acts[l + 1].h_in : m->h_final);
    /* xn[N, D] = rmsnorm(h): replicated, like every layer's norm */
    rmsnorm_forward(m->final_xn, m->final_rstd, m->h_final, tp_param(m->w, i_norm), N, D,
                    c->norm_eps);
    /* logits_local[N, Vl] = xn W_out_local^T: column-parallel over the vocabulary */
    tp_copy_to_region_forward(m->tp, m->final_xn, (size_t)N * D);                 /* f: identity */
    column_parallel_linear_forward(m->logits, m->final_xn, tp_param(m->w, i_out), N, D, Vl);
    /* the loss from the sharded logits: 3 all-reduces of N floats, counted apart */
    collective_stats before = m->tp->stats[COLL_ALL_REDUCE];
    float loss_sum = vocab_parallel_cross_entropy_forward(m->tp, m->logits, m->targets, N, Vl, v0,
                                                          v->row_max, v->row_sumexp,
                                                          v->target_logit);
    count_since(&v->loss_comm, &before, m->tp);
    return loss_sum * loss_scale;
}

void vp_llama_backward(vp_llama *v) {
    tp_llama *m = v->m;
    const llama_config *c = &m->c;
    int N = m->N, D = c->dim, Vl = m->w->Vl, v0 = m->w->v0;
    int i_norm = m->w->nparams - 2, i_out = m->w->nparams - 1;

    /* dlogits_local[N, Vl] = (softmax - onehot) / count, written over the logits: no collective */
    vocab_parallel_cross_entropy_backward(m->logits, m->logits, m->targets, v->row_max,
                                          v->row_sumexp, N, Vl, v0, m->loss_scale);
    /* dxn[N, D] = dlogits_local W_out_local: this rank's V/tp entries only; dW_out_local */
    column_parallel_linear_backward(m->dxn, tp_grad(m->w, i_out), m->logits, m->final_xn,
                                    tp_param(m->w, i_out), N, D, Vl);
    /* BEGIN ASSIGNMENT: complete dxn, to which every rank's vocabulary slice contributes */
    if (!v->skip_output_allreduce)
        tp_copy_to_region_backward(m->tp, m->dxn, (size_t)N * D);                /* f: all-reduce */
    /* END ASSIGNMENT */
    device_zero(m->dh, (size_t)N * D * sizeof(float));
    rmsnorm_backward(m->dh, tp_grad(m->w, i_norm), m->dxn, m->h_final, tp_param(m->w, i_norm),
                     m->final_rstd, N, D);
    /* the layers: chapter 01, unchanged */
    for (int l = c->n_layers - 1; l >= 0; l--) tp_layer_backward(m, l, m->dh);
    /* dh is d loss / d h0, the same on every rank: each keeps the rows of its own tokens */
    vocab_parallel_embedding_backward(tp_grad(m->w, 0), m->dh, m->tokens, N, D, v0, Vl);
}
