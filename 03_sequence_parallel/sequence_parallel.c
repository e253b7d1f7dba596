/* sequence_parallel.c: sequence parallelism and activation checkpointing as a plan
 * (sequence_parallel.h). The layer is common/model/model.c; this file holds what changes: the
 * operators at the boundaries of the tensor-parallel region, what a layer keeps for backward and
 * how the rest comes back, and the one gradient reduction SP adds.
 *
 * Notation: B batch, T sequence, Ts = T/p, N = B*T, Ns = B*Ts, D dim, C the channels of a tensor.
 */
#include <stdio.h>
#include <stdlib.h>
#include "comm.h"
#include "device.h"
#include "kernels.h"
#include "llama_kernels.h"
#include "layer.h"
#include "model.h"
#include "seq_layout.h"
#include "sequence_parallel.h"

/* ==============================================================================================
 * The region operators. comm.h's collectives work on rank-major chunks [p][B][Ts][C]; the model's
 * tensors are [B][T][C]; seq_layout.h converts between the two.
 * ============================================================================================== */

void sp_all_gather_seq_forward(comm_group *tp, float *x_full, const float *x_local, float *chunks,
                               int B, int Ts, int C) {
    /* BEGIN ASSIGNMENT: gather every rank's [B, Ts, C] shard into the whole [B, T, C] sequence */
    comm_all_gather(tp, x_local, chunks, (size_t)B * Ts * C);        /* chunks[p][B][Ts][C] */
    seq_chunks_to_sequence(x_full, chunks, tp->size, B, Ts, C);      /* -> x_full[B][p*Ts][C] */
    /* END ASSIGNMENT */
}

void sp_reduce_scatter_seq_forward(comm_group *tp, float *y_local, const float *y_partial,
                                   float *chunks, int B, int Ts, int C) {
    /* BEGIN ASSIGNMENT: sum the ranks' partial [B, T, C] and keep this rank's tokens [B, Ts, C] */
    seq_sequence_to_chunks(chunks, y_partial, tp->size, B, Ts, C);   /* [B][p*Ts][C] -> [p][B][Ts][C] */
    comm_reduce_scatter(tp, chunks, y_local, (size_t)B * Ts * C);    /* rank r: sum of chunks r */
    /* END ASSIGNMENT */
}

/* Each operator's backward is the other one: that is why the pair costs what chapter 01's
 * all-reduces cost, however the forward and backward are interleaved. */
void sp_all_gather_seq_backward(comm_group *tp, float *dx_local, const float *dx_full, float *chunks,
                                int B, int Ts, int C) {
    /* BEGIN ASSIGNMENT: the backward of an all-gather along the sequence */
    sp_reduce_scatter_seq_forward(tp, dx_local, dx_full, chunks, B, Ts, C);
    /* END ASSIGNMENT */
}

void sp_reduce_scatter_seq_backward(comm_group *tp, float *dy_full, const float *dy_local,
                                    float *chunks, int B, int Ts, int C) {
    /* BEGIN ASSIGNMENT: the backward of a reduce-scatter along the sequence */
    sp_all_gather_seq_forward(tp, dy_full, dy_local, chunks, B, Ts, C);
    /* END ASSIGNMENT */
}

void sp_all_gather_seq_bf16(comm_group *tp, float *x_full, const float *x_local, float *chunks, int B, int Ts, int C) {
    int p = tp->size;
    size_t n = (size_t)B * Ts * C, all = (size_t)p * n;
    /* bf16 buffers inside the fp32 ones: the shard in x_full's bytes (written last), the gathered
     * chunks and their sequence order in the two halves of the scratch [p n floats] */
    uint16_t *shard = (uint16_t *)x_full, *by_rank = (uint16_t *)chunks, *by_token = by_rank + all;
    cast_to_bf16(shard, x_local, n);
    comm_all_gather_typed(tp, DTYPE_BF16, shard, by_rank, n);
    /* the layout kernel moves rows of C elements whatever they hold: a row of C bf16 is C/2
     * floats' bytes (C, the model's dim, is even: RoPE pairs the head's channels) */
    seq_chunks_to_sequence((float *)by_token, (const float *)by_rank, p, B, Ts, C / 2);
    cast_from_bf16(x_full, by_token, all);
}

/* The plan's region: the four operators above, with the state's chunk buffer; under --dtype bf16
 * the two gathers whose readers are GEMMs move bf16 (sp_all_gather_seq_bf16). */
static float *chunks_of(void *state) { return ((sp_state *)state)->chunks; }
/* (sp_all_gather_seq_bf16 lays bf16 rows out as floats: C even, as the model's dim always is) */
static bool gathers_bf16(void *state, int C) { return ((sp_state *)state)->gather_bf16 && C % 2 == 0; }
static void enter_forward(void *state, const llama_plan *p, float *x_full, const float *x_local, int B, int Ts, int C) {
    if (gathers_bf16(state, C)) sp_all_gather_seq_bf16(p->groups.tp, x_full, x_local, chunks_of(state), B, Ts, C);
    else sp_all_gather_seq_forward(p->groups.tp, x_full, x_local, chunks_of(state), B, Ts, C);
}
static void enter_backward(void *state, const llama_plan *p, float *dx_local, float *dx_full, int B, int Ts, int C) {
    sp_all_gather_seq_backward(p->groups.tp, dx_local, dx_full, chunks_of(state), B, Ts, C);
}
static void exit_forward(void *state, const llama_plan *p, float *y_local, float *y_partial, int B, int Ts, int C) {
    sp_reduce_scatter_seq_forward(p->groups.tp, y_local, y_partial, chunks_of(state), B, Ts, C);
}
static void exit_backward(void *state, const llama_plan *p, float *dy_full, const float *dy_local, int B, int Ts, int C) {
    if (gathers_bf16(state, C)) sp_all_gather_seq_bf16(p->groups.tp, dy_full, dy_local, chunks_of(state), B, Ts, C);
    else sp_reduce_scatter_seq_backward(p->groups.tp, dy_full, dy_local, chunks_of(state), B, Ts, C);
}
/* The vocabulary ends' exit is the embedding's: its dy is added into table rows, not read by a
 * GEMM, so it is gathered in fp32 whatever --dtype says. */
static void embedding_exit_backward(void *state, const llama_plan *p, float *dy_full, const float *dy_local, int B,
                                    int Ts, int C) {
    sp_reduce_scatter_seq_backward(p->groups.tp, dy_full, dy_local, chunks_of(state), B, Ts, C);
}
static region_ops sequence_parallel_region(sp_state *s) {
    return (region_ops){s, enter_forward, enter_backward, exit_forward, exit_backward};
}
static region_ops sequence_parallel_vocab_region(sp_state *s) {
    return (region_ops){s, enter_forward, enter_backward, exit_forward, embedding_exit_backward};
}

/* ==============================================================================================
 * The norm weights are replicated, but with SP each rank's norms saw only its own tokens.
 * ============================================================================================== */
void sp_norm_grads_all_reduce(void *state, const llama_plan *p, llama_model *m) {
    sp_state *s = state;
    if (s->below_reduce.reduce) s->below_reduce.reduce(s->below_reduce.state, p, m);   /* what the plan owed before */
    param_table *t = m->params;
    float *packed = s->norm_grads;
    /* (each norm's stored gradient: D floats, or under FSDP this rank's dp shard of them, the
     *  same shard on every tp rank; none for a pipeline stage that does not hold the norm) */
    /* BEGIN ASSIGNMENT: sum every norm weight's gradient over tp, packed into one all-reduce */
    size_t n = 0;
    for (int i = 0; i < t->n; i++) {
        param_kind k = t->t[i].spec.kind;
        if (k != P_ATTENTION_NORM && k != P_FFN_NORM && k != P_NORM) continue;
        size_t count = param_stored_numel(t, t->grads, i);
        device_copy(packed + n, param_in(t, t->grads, i), count * sizeof(float));
        n += count;
    }
    comm_all_reduce(p->groups.tp, packed, n, COMM_SUM);
    n = 0;
    for (int i = 0; i < t->n; i++) {
        param_kind k = t->t[i].spec.kind;
        if (k != P_ATTENTION_NORM && k != P_FFN_NORM && k != P_NORM) continue;
        size_t count = param_stored_numel(t, t->grads, i);
        device_copy(param_in(t, t->grads, i), packed + n, count * sizeof(float));
        n += count;
    }
    /* END ASSIGNMENT */
}

/* ==============================================================================================
 * Activation checkpointing: what a layer keeps for backward, and how the rest comes back.
 * ============================================================================================== */

const char *ac_mode_name(ac_mode ac) {
    static const char *names[AC_NMODES] = {"none", "selective", "full"};
    return ac >= 0 && ac < AC_NMODES ? names[ac] : "?";
}

/* Every activation a layer saves declares what recomputing it costs (its block's table,
 * common/model/layer.h's act_cost):
 *   ACT_COST_INPUT   the layer's input: everything else can be recomputed from it
 *   ACT_COST_GEMM    outputs of matrix products, of attention and of collectives: expensive to redo
 *   ACT_COST_CHEAP   outputs of the norms, of the softmax and of SwiGLU's product: element-wise or
 *                    row-wise work, cheap to redo but as large as the GEMM outputs (probs: larger)
 * The mode decides which costs to keep; a block of another layer (a wider feed-forward, mixture
 * of experts) is checkpointed by what it declares. */

/* Does AC mode `ac` keep the activations of recompute cost `cost` for backward? */
static bool ac_keeps(ac_mode ac, act_cost cost) {
    /* BEGIN ASSIGNMENT: which recompute classes each --ac mode keeps (none, selective, full) */
    if (cost == ACT_COST_INPUT) return true;
    if (cost == ACT_COST_GEMM) return ac != AC_FULL;
    if (cost == ACT_COST_CHEAP) return ac == AC_NONE;
    /* END ASSIGNMENT */
    return true;
}

unsigned ac_keep_mask(const llama_layer *layer, ac_mode ac) {
    if (!layer) layer = &llama_layer_default;
    unsigned keep = 0;
    for (int b = 0; b < layer->n; b++)
        for (int i = 0; i < layer->block[b]->n_acts; i++) {
            const block_act *a = &layer->block[b]->act[i];
            if (a->cost == ACT_COST_UNSET) {   /* a programming error of the block's table */
                fprintf(stderr, "ac_keep_mask: block %s's activation %d declares no recompute cost (layer.h)\n",
                        layer->block[b]->name, a->act);
                abort();
            }
            if (ac_keeps(ac, a->cost)) keep |= 1u << a->act;
        }
    return keep;
}

/* Before layer l's backward: bring back what the mode did not keep. */
static bool recompute(void *state, llama_model *m, int l, const unit_weights *w) {
    const llama_plan *p = m->plan;
    sp_state *s = state;
    const llama_dims *d = &m->d;
    llama_layer_acts *a = &m->saved->layers[l];
    if (s->ac == AC_FULL) {
        /* everything from h_in: the forward again, with its gathers and its first exit */
        llama_layer_recompute(m, l, w);
        return true;
    }
    if (s->ac == AC_SELECTIVE) {
        /* BEGIN ASSIGNMENT: recompute what selective AC dropped: both norms, the softmax probabilities, the SwiGLU product */
        rmsnorm_forward(a->attn_xn, a->attn_rstd, a->h_in, w->attention_norm, d->Ns, d->D, m->c.norm_eps);
        /* the probabilities from the kept q and k (one more q k^T); the output is thrown away */
        p->attention.forward(p->attention.state, p, m->c.precision, s->attn_out_scratch, a->probs, a->q, a->k, a->v, d->B,
                             d->T, d->Hl, d->Hkvl, d->hd);
        rmsnorm_forward(a->ffn_xn, a->ffn_rstd, a->h_mid, w->ffn_norm, d->Ns, d->D, m->c.norm_eps);
        swiglu_forward(a->ffn_g, a->ffn_a, a->ffn_b, (size_t)d->N * d->Fl);
        /* END ASSIGNMENT */
    }
    return false;   /* the model gathers the norm outputs again: SP kept only their shards */
}

/* ==============================================================================================
 * The plan
 * ============================================================================================== */

static void sequence_parallel_free_state(void *state) {
    sp_state *s = state;
    device_free(s->chunks); device_free(s->norm_grads); device_free(s->attn_out_scratch);
    free(s);
}
const plan_technique sequence_parallel_technique = {"sequence parallel", sequence_parallel_free_state};

void sequence_parallel_apply(llama_plan *plan, const llama_config *c, int B, bool sp, ac_mode ac) {
    int p = plan->groups.tp ? plan->groups.tp->size : 1, T = c->seq_len;   /* (tp 1: checkpointing only) */
    /* (whole tokens per rank, the same count on every rank: sp_mesh_rule, which mesh_create runs) */
    sp_state *s = plan_push(plan, &sequence_parallel_technique, calloc(1, sizeof(sp_state)), 0);
    s->ac = ac;
    plan->checkpoint = (checkpoint_ops){s, ac_keep_mask(llama_layer_of(c), ac), recompute};
    if (ac == AC_SELECTIVE)
        s->attn_out_scratch = device_alloc_floats((size_t)B * T * (c->n_heads / p) * llama_head_dim(c), MEM_BUFFERS);
    if (!sp) return;
    plan->sequence.shards = p;
    plan->region = sequence_parallel_region(s);
    plan->vocab = sequence_parallel_vocab_region(s);   /* the embedding's exit and the output's entry too */
    s->gather_bf16 = c->precision == DTYPE_BF16;
    plan_wrap(plan->reduce_grads, s->below_reduce, ((grad_reduce_ops){s, sp_norm_grads_all_reduce}));
    s->chunks = device_alloc_floats((size_t)B * T * c->dim, MEM_BUFFERS);
    s->norm_grads = device_alloc_floats((2 * (size_t)c->n_layers + 1) * c->dim, MEM_BUFFERS);
}

/* --fault skip-norm-grad-allreduce: the norm weights keep the gradient of this rank's tokens only. */
static const char *skip_norm_grad_allreduce(llama_plan *p) {
    if (p->sequence.shards == 1) return "needs the sequence split over ranks (tp > 1, without --no-sp): otherwise every rank's norms see every token and there is no all-reduce to skip";
    p->reduce_grads = ((sp_state *)plan_state(p, &sequence_parallel_technique))->below_reduce;   /* what was owed before, without the norms' sum */
    return NULL;
}
/* --fault rope-local-positions: each rank numbers the tokens 0..Ts-1 within its own shard, as if
 * positions came from the [B, Ts, D] tensor it holds between blocks. */
static void local_positions(void *state, const llama_plan *p, int *positions, int T) {
    for (int t = 0; t < T; t++) positions[t] = t % (T / p->sequence.shards);
}
static const char *rope_local_positions(llama_plan *p) {
    if (p->sequence.shards == 1) return "needs the sequence split over ranks (tp > 1, without --no-sp): otherwise a rank's tokens are the whole sequence and local positions are the global ones";
    p->sequence.positions = local_positions;
    return NULL;
}
/* --fault embedding-dy-bf16: the embedding's dy gathered in bf16 too, though its backward adds it
 * into table rows (no GEMM rounds it): one rounding the baseline does not make, of the size the
 * bf16 tolerance lets through; the all-gathers' bytes (the embedding's at 4 bytes an element)
 * catch it. */
static const char *embedding_dy_bf16(llama_plan *p) {
    sp_state *s = plan_state(p, &sequence_parallel_technique);
    if (p->sequence.shards == 1 || !s->gather_bf16)
        return "needs the bf16 gathers of sequence parallelism: --dtype bf16 with tp > 1, without --no-sp";
    p->vocab.exit_backward = exit_backward;
    return NULL;
}
const plan_fault sequence_parallel_faults[] = {
    {"skip-norm-grad-allreduce", "the norm weights' gradients are not summed over tp", skip_norm_grad_allreduce},
    {"rope-local-positions", "RoPE numbers each rank's tokens from 0 within its shard", rope_local_positions},
    {"embedding-dy-bf16", "the embedding's dy is gathered in bf16, though no GEMM reads it", embedding_dy_bf16},
    {0}};

/* ---- the mesh's rule (sequence_parallel.h) ---- */

static const char *cp_tp_divides_sequence(const mesh_rule *r, const mesh_view *v, char *why, size_t len) {
    long long seq = r->size[0];
    int C = v->s.cp, T = v->s.tp;
    if (seq % ((long long)C * T) == 0) return NULL;
    long long step = mesh_lcm(C > 1 ? 2 * C : 1, (long long)C * T);
    const char *name = mesh_size_name(v, "--seq-len", "seq_len"), *no_sp = v->plan ? "" : " (or --no-sp)";
    char valid[96];
    mesh_nearest(valid, sizeof valid, "length", seq, step);
    if (C > 1)
        return mesh_refuse(why, len, "%s %lld cannot be split over %s x %s: each cp rank holds seq_len / cp rows and "
                           "sequence parallelism splits them over tp; %s%s", name, seq, v->degree[MESH_CP],
                           v->degree[MESH_TP], valid, no_sp);
    return mesh_refuse(why, len, "%s %lld cannot be split over %s: sequence parallelism gives each tp rank seq_len / "
                       "tp tokens of every sequence; %s%s", name, seq, v->degree[MESH_TP], valid, no_sp);
}

mesh_rule sp_mesh_rule(int seq_len) { return (mesh_rule){.check = cp_tp_divides_sequence, .size = {seq_len}}; }
