/* sequence_parallel.c: sequence parallelism and activation checkpointing (sequence_parallel.h).
 * Read it beside chapter 01's tp.c: the layer is the same sequence of calls; what changes is
 * the operator at each boundary of the tensor-parallel region, the number of rows the norms and
 * residual additions see (Ns = B*T/p instead of N = B*T), and what is kept for backward.
 *
 * Notation: B batch, T sequence, Ts = T/p, N = B*T, Ns = B*Ts, D dim, hd head dim, Hl, Hkvl,
 * Fl local heads, kv heads and ffn units, Vl local vocabulary rows starting at v0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../00_naive_tp_mlp/tensor_parallel.h"
#include "../02_loss_parallel/vocab_parallel.h"
#include "../02_loss_parallel/vp_llama.h"
#include "device.h"
#include "kernels.h"
#include "llama_kernels.h"
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

/* ==============================================================================================
 * Entering and leaving the tensor-parallel region. With SP the boundaries are the sequence
 * collectives above; without SP (--no-sp) they are chapter 00's f and g, and the tensors on both
 * sides have the same [N, D] shape, so the callers pass one pointer for both (whole() below).
 * ============================================================================================== */

/* The [N, D] tensor inside the region: SP needs a buffer of its own; without SP the local tensor
 * already holds the whole sequence and is used in place. */
static float *whole(const sp_llama *m, float *sp_buffer, float *local) {
    return m->sp ? sp_buffer : local;
}

/* Before the column-parallel linears: x_local [Ns, D] -> x_full [N, D] (all-gather, or f). */
static void enter_region_forward(sp_llama *m, float *x_full, const float *x_local) {
    if (m->sp) sp_all_gather_seq_forward(m->tp, x_full, x_local, m->chunks, m->d.B, m->d.Ts, m->d.D);
    else tp_copy_to_region_forward(m->tp, x_full, (size_t)m->d.N * m->d.D);   /* f: identity */
}
/* dx_full [N, D], partial sums over this rank's heads or units -> dx_local [Ns, D]. */
static void enter_region_backward(sp_llama *m, float *dx_local, float *dx_full) {
    if (m->sp) sp_all_gather_seq_backward(m->tp, dx_local, dx_full, m->chunks, m->d.B, m->d.Ts, m->d.D);
    else tp_copy_to_region_backward(m->tp, dx_full, (size_t)m->d.N * m->d.D);  /* f: all-reduce */
}
/* After the row-parallel linears: y_partial [N, D] -> y_local [Ns, D] (reduce-scatter, or g). */
static void exit_region_forward(sp_llama *m, float *y_local, float *y_partial) {
    if (m->sp) sp_reduce_scatter_seq_forward(m->tp, y_local, y_partial, m->chunks, m->d.B, m->d.Ts, m->d.D);
    else tp_reduce_from_region_forward(m->tp, y_partial, (size_t)m->d.N * m->d.D);  /* g: all-reduce */
}
/* dy_local [Ns, D] -> dy_full [N, D], the gradient every rank's row-parallel shard needs. */
static void exit_region_backward(sp_llama *m, float *dy_full, const float *dy_local) {
    if (m->sp) sp_reduce_scatter_seq_backward(m->tp, dy_full, dy_local, m->chunks, m->d.B, m->d.Ts, m->d.D);
    else tp_reduce_from_region_backward(m->tp, dy_full, (size_t)m->d.N * m->d.D);  /* g: identity */
}

/* ==============================================================================================
 * What a layer keeps for backward.
 * ============================================================================================== */

const char *ac_mode_name(ac_mode ac) {
    static const char *names[AC_NMODES] = {"none", "selective", "full"};
    return ac >= 0 && ac < AC_NMODES ? names[ac] : "?";
}

sp_dims sp_dims_make(const llama_config *c, int B, int p, bool sp) {
    sp_dims d;
    d.p = p; d.sp = sp;
    d.B = B; d.T = c->seq_len; d.Ts = sp ? c->seq_len / p : c->seq_len;
    d.N = B * d.T; d.Ns = B * d.Ts;
    d.D = c->dim; d.hd = llama_head_dim(c);
    d.Hl = c->n_heads / p; d.Hkvl = c->n_kv_heads / p; d.Fl = c->ffn_dim / p;
    d.Vl = c->vocab_size / p;
    return d;
}

/* Every tensor of a layer falls in one of three classes (the comments of sp_layer_acts):
 *   INPUT      the layer's input: everything else can be recomputed from it
 *   GEMM       outputs of matrix products, of attention and of collectives: expensive to redo
 *   CHEAP      outputs of the norms, of the softmax and of SwiGLU's product: element-wise or
 *              row-wise work, cheap to redo but as large as the GEMM outputs (probs: larger) */
typedef enum { ACT_INPUT, ACT_GEMM, ACT_CHEAP } act_class;

typedef struct { float **slot; size_t n; act_class cls; } act_tensor;

/* The tensors of one layer: where the pointer goes, how many floats, which class. */
static int layer_tensors(sp_layer_acts *a, const sp_dims *d, act_tensor *t) {
    size_t N = d->N, Ns = d->Ns, D = d->D, Fl = d->Fl;
    size_t q_dim = (size_t)d->Hl * d->hd, kv_dim = (size_t)d->Hkvl * d->hd;
    size_t probs = (size_t)d->B * d->Hl * d->T * d->T;
    int n = 0;
    t[n++] = (act_tensor){&a->h_in, Ns * D, ACT_INPUT};
    t[n++] = (act_tensor){&a->attn_xn, Ns * D, ACT_CHEAP};
    t[n++] = (act_tensor){&a->attn_rstd, Ns, ACT_CHEAP};
    t[n++] = (act_tensor){&a->q, N * q_dim, ACT_GEMM};
    t[n++] = (act_tensor){&a->k, N * kv_dim, ACT_GEMM};
    t[n++] = (act_tensor){&a->v, N * kv_dim, ACT_GEMM};
    t[n++] = (act_tensor){&a->probs, probs, ACT_CHEAP};
    t[n++] = (act_tensor){&a->attn_out, N * q_dim, ACT_GEMM};
    t[n++] = (act_tensor){&a->h_mid, Ns * D, ACT_GEMM};
    t[n++] = (act_tensor){&a->ffn_xn, Ns * D, ACT_CHEAP};
    t[n++] = (act_tensor){&a->ffn_rstd, Ns, ACT_CHEAP};
    t[n++] = (act_tensor){&a->ffn_a, N * Fl, ACT_GEMM};
    t[n++] = (act_tensor){&a->ffn_b, N * Fl, ACT_GEMM};
    t[n++] = (act_tensor){&a->ffn_g, N * Fl, ACT_CHEAP};
    return n;
}

/* Does AC mode `ac` keep the tensors of class `cls` for backward? */
static bool ac_keeps(ac_mode ac, act_class cls) {
    /* BEGIN ASSIGNMENT: none keeps everything, selective the input and the GEMM outputs, full only the input */
    switch (cls) {
    case ACT_INPUT: return true;
    case ACT_GEMM: return ac != AC_FULL;
    case ACT_CHEAP: return ac == AC_NONE;
    }
    /* END ASSIGNMENT */
    return true;
}

static float *own(sp_layer_acts *a, size_t n, mem_category cat) {
    float *p = device_alloc_floats(n, cat);
    a->owned[a->n_owned++] = p;
    return p;
}

/* A layer's activations: its own allocation (MEM_ACTIVATIONS) for each tensor the mode keeps,
 * the shared buffer for each tensor it does not. */
static void layer_acts_alloc(sp_layer_acts *a, const sp_dims *d, ac_mode ac, sp_layer_acts *shared) {
    act_tensor mine[16], theirs[16];
    memset(a, 0, sizeof *a);
    int n = layer_tensors(a, d, mine);
    layer_tensors(shared, d, theirs);
    for (int i = 0; i < n; i++)
        *mine[i].slot = ac_keeps(ac, mine[i].cls) ? own(a, mine[i].n, MEM_ACTIVATIONS) : *theirs[i].slot;
}

/* The shared set: one buffer (MEM_BUFFERS) for each tensor the mode does not keep. The forward
 * writes them layer after layer; the backward refills them for the layer at hand. */
static void shared_acts_alloc(sp_layer_acts *s, const sp_dims *d, ac_mode ac) {
    act_tensor t[16];
    memset(s, 0, sizeof *s);
    int n = layer_tensors(s, d, t);
    for (int i = 0; i < n; i++)
        *t[i].slot = ac_keeps(ac, t[i].cls) ? NULL : own(s, t[i].n, MEM_BUFFERS);
}

static void layer_acts_free(sp_layer_acts *a) {
    for (int i = 0; i < a->n_owned; i++) device_free(a->owned[i]);
    a->n_owned = 0;
}

size_t sp_layer_act_bytes_measured(const sp_dims *d, ac_mode ac) {
    sp_layer_acts shared, a;
    memset(&shared, 0, sizeof shared);       /* not allocated: only what a layer keeps is counted */
    size_t before = mem_current(MEM_ACTIVATIONS);
    layer_acts_alloc(&a, d, ac, &shared);
    size_t bytes = mem_current(MEM_ACTIVATIONS) - before;
    layer_acts_free(&a);
    return bytes;
}

/* README, "Activation memory": fp32, per layer, per rank. */
double sp_layer_act_bytes_formula(const sp_dims *d, ac_mode ac) {
    double B = d->B, T = d->T, N = d->N, Ns = d->Ns, D = d->D, hd = d->hd;
    double Hl = d->Hl, Hkvl = d->Hkvl, Fl = d->Fl;
    double input = Ns * D;                                          /* h_in                       */
    double gemm = 2 * N * Hl * hd                                   /* q, attn_out                */
                + 2 * N * Hkvl * hd                                 /* k, v                       */
                + Ns * D                                            /* h_mid                      */
                + 2 * N * Fl;                                       /* ffn_a, ffn_b               */
    double cheap = 2 * Ns * D + 2 * Ns                              /* the two norms' xn and rstd */
                 + B * Hl * T * T                                   /* probs                      */
                 + N * Fl;                                          /* ffn_g                      */
    switch (ac) {
    case AC_NONE: return 4 * (input + gemm + cheap);
    case AC_SELECTIVE: return 4 * (input + gemm);
    default: return 4 * input;
    }
}

double sp_outside_act_bytes_formula(const sp_dims *d) {
    double N = d->N, Ns = d->Ns, D = d->D, Vl = d->Vl;
    return 4 * (2 * Ns * D + Ns        /* h_final, final_xn, final_rstd */
                + N * Vl               /* logits                        */
                + 2 * N);              /* row_max, row_sumexp           */
}

/* ==============================================================================================
 * The model
 * ============================================================================================== */

sp_llama *sp_llama_create(const llama_config *c, comm_group *tp, int B, bool sp, ac_mode ac,
                          uint64_t seed) {
    int p = tp->size, T = c->seq_len;
    sp_llama *m = calloc(1, sizeof *m);
    m->w = tp_params_create(c, tp, vp_layouts(), seed);   /* ch. 01 + 02: validates heads, ffn, vocab */
    if (sp && T % p) {   /* whole tokens per rank, the same count on every rank */
        int lo = T / p * p, hi = lo + p;
        if (lo > 0) comm_exit_usage("--seq-len %d is not divisible by tp %d: with sequence parallelism each rank holds seq_len/tp tokens of every sequence; the nearest valid lengths are %d and %d", T, p, lo, hi);
        comm_exit_usage("--seq-len %d is not divisible by tp %d: with sequence parallelism each rank holds seq_len/tp tokens of every sequence; the nearest valid length is %d", T, p, hi);
    }
    m->c = *c;
    m->tp = tp;
    m->sp = sp;
    m->ac = ac;
    m->d = sp_dims_make(c, B, p, sp);
    const sp_dims *d = &m->d;
    size_t N = d->N, Ns = d->Ns, D = d->D, L = c->n_layers;
    size_t q_dim = (size_t)d->Hl * d->hd, kv_dim = (size_t)d->Hkvl * d->hd, Fl = d->Fl;

    /* What the layers keep, measured layer by layer by the allocator. */
    shared_acts_alloc(&m->shared, d, ac);
    m->acts = calloc(L, sizeof *m->acts);
    m->layer_act_bytes = calloc(L, sizeof *m->layer_act_bytes);
    for (size_t l = 0; l < L; l++) {
        size_t before = mem_current(MEM_ACTIVATIONS);
        layer_acts_alloc(&m->acts[l], d, ac, &m->shared);
        m->layer_act_bytes[l] = mem_current(MEM_ACTIVATIONS) - before;
    }
    /* Outside the layers: kept in every mode. */
    m->h_final = device_alloc_floats(Ns * D, MEM_ACTIVATIONS);
    m->final_xn = device_alloc_floats(Ns * D, MEM_ACTIVATIONS);
    m->final_rstd = device_alloc_floats(Ns, MEM_ACTIVATIONS);
    m->logits = device_alloc_floats(N * d->Vl, MEM_ACTIVATIONS);
    m->row_max = device_alloc_floats(N, MEM_ACTIVATIONS);
    m->row_sumexp = device_alloc_floats(N, MEM_ACTIVATIONS);
    m->target_logit = device_alloc_floats(N, MEM_BUFFERS);
    m->tokens = device_alloc_ints(N, MEM_BUFFERS);
    m->targets = device_alloc_ints(N, MEM_BUFFERS);
    m->positions = device_alloc_ints(T, MEM_BUFFERS);

    /* Scratch. The [N, D] buffers of the region boundaries exist only with SP; without it the
     * boundary tensors are used in place (whole()). */
    if (sp) {
        m->chunks = device_alloc_floats(N * D, MEM_BUFFERS);
        m->attn_in = device_alloc_floats(N * D, MEM_BUFFERS);
        m->ffn_in = device_alloc_floats(N * D, MEM_BUFFERS);
        m->y_partial = device_alloc_floats(N * D, MEM_BUFFERS);
        m->dy_full = device_alloc_floats(N * D, MEM_BUFFERS);
        m->dxn = device_alloc_floats(Ns * D, MEM_BUFFERS);
    }
    m->dxn_full = device_alloc_floats(N * D, MEM_BUFFERS);
    m->dxn_part = device_alloc_floats(N * D, MEM_BUFFERS);
    m->dh = device_alloc_floats(Ns * D, MEM_BUFFERS);
    m->dattn_out = device_alloc_floats(N * q_dim, MEM_BUFFERS);
    m->dq = device_alloc_floats(N * q_dim, MEM_BUFFERS);
    m->dk = device_alloc_floats(N * kv_dim, MEM_BUFFERS);
    m->dv = device_alloc_floats(N * kv_dim, MEM_BUFFERS);
    m->dprobs = device_alloc_floats((size_t)B * d->Hl * T * T, MEM_BUFFERS);
    m->dffn_g = device_alloc_floats(N * Fl, MEM_BUFFERS);
    m->dffn_a = device_alloc_floats(N * Fl, MEM_BUFFERS);
    m->dffn_b = device_alloc_floats(N * Fl, MEM_BUFFERS);
    if (ac == AC_SELECTIVE) m->attn_out_scratch = device_alloc_floats(N * q_dim, MEM_BUFFERS);
    m->norm_grads = device_alloc_floats((2 * L + 1) * D, MEM_BUFFERS);
    return m;
}

void sp_llama_free(sp_llama *m) {
    for (int l = 0; l < m->c.n_layers; l++) layer_acts_free(&m->acts[l]);
    layer_acts_free(&m->shared);
    float *bufs[] = {m->h_final, m->final_xn, m->final_rstd, m->logits, m->row_max, m->row_sumexp,
                     m->target_logit, m->chunks, m->attn_in, m->ffn_in, m->y_partial, m->dy_full,
                     m->dxn, m->dxn_full, m->dxn_part, m->dh, m->dattn_out, m->dq, m->dk, m->dv,
                     m->dprobs, m->dffn_g, m->dffn_a, m->dffn_b, m->attn_out_scratch, m->norm_grads};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) device_free(bufs[i]);   /* NULL: no-op */
    device_free(m->tokens); device_free(m->targets); device_free(m->positions);
    tp_params_free(m->w);
    free(m->acts);
    free(m->layer_act_bytes);
    free(m);
}

/* ----------------------------------------------------------------------------------------------
 * One layer, forward: h_in [Ns, D] (this rank's tokens) -> h_out [Ns, D].
 * ---------------------------------------------------------------------------------------------- */
void sp_layer_forward(sp_llama *m, int l, float *h_out) {
    const sp_dims *d = &m->d;
    tp_layer_weights w = tp_layer_view(m->w, m->w->params, l);
    sp_layer_acts *a = &m->acts[l];
    int B = d->B, T = d->T, N = d->N, Ns = d->Ns, D = d->D, hd = d->hd;
    int Hl = d->Hl, Hkvl = d->Hkvl, Fl = d->Fl;
    float eps = m->c.norm_eps, theta = m->c.rope_theta;
    float *attn_in = whole(m, m->attn_in, a->attn_xn);     /* [N, D] */
    float *ffn_in = whole(m, m->ffn_in, a->ffn_xn);        /* [N, D] */

    /* ---- attention block ---- */
    /* attn_xn[Ns, D] = rmsnorm(h_in): each rank normalises its own tokens only */
    rmsnorm_forward(a->attn_xn, a->attn_rstd, a->h_in, w.attention_norm, Ns, D, eps);
    /* Shard(seq) -> Replicate: attention needs every token of the sequence */
    enter_region_forward(m, attn_in, a->attn_xn);
    /* q[N, Hl*hd], k and v [N, Hkvl*hd]: this rank's heads over the whole sequence */
    column_parallel_linear_forward(a->q, attn_in, w.wq, N, D, Hl * hd);
    column_parallel_linear_forward(a->k, attn_in, w.wk, N, D, Hkvl * hd);
    column_parallel_linear_forward(a->v, attn_in, w.wv, N, D, Hkvl * hd);
    /* row t of the gathered sequence is token t: RoPE takes the global positions 0..T-1 */
    rope_forward(a->q, m->positions, B, T, Hl, hd, theta);
    rope_forward(a->k, m->positions, B, T, Hkvl, hd, theta);
    attention_forward(a->attn_out, a->probs, a->q, a->k, a->v, B, T, Hl, Hkvl, hd);
    /* partial[N, D] = attn_out wo_local^T: this rank's heads' share of every token */
    float *partial = whole(m, m->y_partial, a->h_mid);
    row_parallel_linear_forward(partial, a->attn_out, w.wo, N, Hl * hd, D);
    /* Partial -> Shard(seq): the sum over ranks, of this rank's tokens only */
    exit_region_forward(m, a->h_mid, partial);
    add_inplace(a->h_mid, a->h_in, (size_t)Ns * D);                  /* residual, [Ns, D] */

    /* ---- feed-forward block ---- */
    rmsnorm_forward(a->ffn_xn, a->ffn_rstd, a->h_mid, w.ffn_norm, Ns, D, eps);
    enter_region_forward(m, ffn_in, a->ffn_xn);
    column_parallel_linear_forward(a->ffn_a, ffn_in, w.w1, N, D, Fl);    /* [N, Fl] */
    column_parallel_linear_forward(a->ffn_b, ffn_in, w.w3, N, D, Fl);    /* [N, Fl] */
    swiglu_forward(a->ffn_g, a->ffn_a, a->ffn_b, (size_t)N * Fl);
    if (!h_out) return;     /* full AC's recomputation: backward needs w2's input, not its output */
    partial = whole(m, m->y_partial, h_out);
    row_parallel_linear_forward(partial, a->ffn_g, w.w2, N, Fl, D);      /* [N, D] partial */
    exit_region_forward(m, h_out, partial);
    add_inplace(h_out, a->h_mid, (size_t)Ns * D);                        /* residual */
}

/* ----------------------------------------------------------------------------------------------
 * Activation checkpointing: before layer l's backward, bring back what the forward did not keep,
 * and the whole-sequence inputs of the column-parallel linears (their weight gradients need
 * every token; SP kept only this rank's shard of them).
 * ---------------------------------------------------------------------------------------------- */
static void layer_rematerialize(sp_llama *m, int l) {
    const sp_dims *d = &m->d;
    tp_layer_weights w = tp_layer_view(m->w, m->w->params, l);
    sp_layer_acts *a = &m->acts[l];
    if (m->ac == AC_FULL) {
        /* everything from h_in: the forward again, with its gathers and its first reduce-scatter */
        sp_layer_forward(m, l, NULL);
        return;
    }
    if (m->ac == AC_SELECTIVE) {
        /* BEGIN ASSIGNMENT: recompute what selective AC dropped: both norms, the softmax probabilities, the SwiGLU product */
        rmsnorm_forward(a->attn_xn, a->attn_rstd, a->h_in, w.attention_norm, d->Ns, d->D, m->c.norm_eps);
        /* the probabilities from the kept q and k (one more q k^T); the output is thrown away */
        attention_forward(m->attn_out_scratch, a->probs, a->q, a->k, a->v, d->B, d->T, d->Hl, d->Hkvl, d->hd);
        rmsnorm_forward(a->ffn_xn, a->ffn_rstd, a->h_mid, w.ffn_norm, d->Ns, d->D, m->c.norm_eps);
        swiglu_forward(a->ffn_g, a->ffn_a, a->ffn_b, (size_t)d->N * d->Fl);
        /* END ASSIGNMENT */
    }
    /* none and selective: gather the norm outputs again (SP), f's identity without SP */
    enter_region_forward(m, whole(m, m->attn_in, a->attn_xn), a->attn_xn);
    enter_region_forward(m, whole(m, m->ffn_in, a->ffn_xn), a->ffn_xn);
}

/* ----------------------------------------------------------------------------------------------
 * One layer, backward. dh [Ns, D]: d/d h_out in, d/d h_in out.
 * ---------------------------------------------------------------------------------------------- */
void sp_layer_backward(sp_llama *m, int l, float *dh) {
    const sp_dims *d = &m->d;
    tp_layer_weights w = tp_layer_view(m->w, m->w->params, l);
    tp_layer_weights g = tp_layer_view(m->w, m->w->grads, l);
    sp_layer_acts *a = &m->acts[l];
    int B = d->B, T = d->T, N = d->N, Ns = d->Ns, D = d->D, hd = d->hd;
    int Hl = d->Hl, Hkvl = d->Hkvl, Fl = d->Fl;
    size_t ND = (size_t)N * D;
    float theta = m->c.rope_theta;

    layer_rematerialize(m, l);
    float *attn_in = whole(m, m->attn_in, a->attn_xn);     /* [N, D] */
    float *ffn_in = whole(m, m->ffn_in, a->ffn_xn);        /* [N, D] */
    float *dy = whole(m, m->dy_full, dh);                   /* [N, D] */
    float *dxn = whole(m, m->dxn, m->dxn_full);             /* [Ns, D] */

    /* ---- feed-forward block: h_out = h_mid + reduce-scatter(w2 ffn_g) ---- */
    exit_region_backward(m, dy, dh);                   /* every rank needs dy of every token */
    row_parallel_linear_backward(m->dffn_g, g.w2, dy, a->ffn_g, w.w2, N, Fl, D);
    swiglu_backward(m->dffn_a, m->dffn_b, m->dffn_g, a->ffn_a, a->ffn_b, (size_t)N * Fl);
    /* dxn_full[N, D]: this rank's units' share of d/d ffn_xn, for every token */
    column_parallel_linear_backward(m->dxn_full, g.w1, m->dffn_a, ffn_in, w.w1, N, D, Fl);
    column_parallel_linear_backward(m->dxn_part, g.w3, m->dffn_b, ffn_in, w.w3, N, D, Fl);
    add_inplace(m->dxn_full, m->dxn_part, ND);
    enter_region_backward(m, dxn, m->dxn_full);        /* summed over ranks, this rank's tokens */
    /* dh += d/d h_mid through ffn_norm; g.ffn_norm gets this rank's tokens' share */
    rmsnorm_backward(dh, g.ffn_norm, dxn, a->h_mid, w.ffn_norm, a->ffn_rstd, Ns, D);

    /* ---- attention block: h_mid = h_in + reduce-scatter(wo attn_out) ---- */
    exit_region_backward(m, dy, dh);
    row_parallel_linear_backward(m->dattn_out, g.wo, dy, a->attn_out, w.wo, N, Hl * hd, D);
    attention_backward(m->dq, m->dk, m->dv, m->dprobs, m->dattn_out, a->q, a->k, a->v, a->probs,
                       B, T, Hl, Hkvl, hd);
    rope_backward(m->dq, m->positions, B, T, Hl, hd, theta);
    rope_backward(m->dk, m->positions, B, T, Hkvl, hd, theta);
    column_parallel_linear_backward(m->dxn_full, g.wq, m->dq, attn_in, w.wq, N, D, Hl * hd);
    column_parallel_linear_backward(m->dxn_part, g.wk, m->dk, attn_in, w.wk, N, D, Hkvl * hd);
    add_inplace(m->dxn_full, m->dxn_part, ND);
    column_parallel_linear_backward(m->dxn_part, g.wv, m->dv, attn_in, w.wv, N, D, Hkvl * hd);
    add_inplace(m->dxn_full, m->dxn_part, ND);
    enter_region_backward(m, dxn, m->dxn_full);
    rmsnorm_backward(dh, g.attention_norm, dxn, a->h_in, w.attention_norm, a->attn_rstd, Ns, D);
}

/* ----------------------------------------------------------------------------------------------
 * The whole model. The embedding joins the scheme as one more Partial -> Shard(seq): the
 * vocabulary-parallel lookup (chapter 02) gives each rank a partial [N, D] with the rows of the
 * tokens it owns; the reduce-scatter sums them and hands each rank its tokens. The final norm runs
 * on the shard; the output layer and the loss (chapter 02) need the whole sequence.
 * ---------------------------------------------------------------------------------------------- */

/* The deliberate bug --rope-local-positions: each rank numbers the tokens 0..Ts-1 within its
 * own shard, as if positions came from the [B, Ts, D] tensor it holds between blocks. */
static void upload_local_positions(int *positions_dev, int T, int Ts) {
    int *host = malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++) host[t] = t % Ts;
    device_copy_to_device(positions_dev, host, (size_t)T * sizeof(int));
    free(host);
}

float sp_llama_forward(sp_llama *m, const int *tokens, const int *targets, const int *positions,
                       float loss_scale) {
    const sp_dims *d = &m->d;
    int N = d->N, Ns = d->Ns, D = d->D, Vl = d->Vl, v0 = m->w->v0, L = m->c.n_layers;
    int i_emb = 0, i_norm = m->w->nparams - 2, i_out = m->w->nparams - 1;
    device_copy(m->tokens, tokens, (size_t)N * sizeof(int));
    device_copy(m->targets, targets, (size_t)N * sizeof(int));
    if (m->rope_local_positions) upload_local_positions(m->positions, d->T, d->Ts);
    else device_copy(m->positions, positions, (size_t)d->T * sizeof(int));
    m->loss_scale = loss_scale;

    /* h0 [Ns, D]: this rank's tokens of the embedding */
    float *h0 = m->acts[0].h_in;
    if (m->sp) {
        embedding_forward(m->y_partial, m->tokens, tp_param(m->w, i_emb), N, D, v0, Vl);  /* [N, D] */
        sp_reduce_scatter_seq_forward(m->tp, h0, m->y_partial, m->chunks, d->B, d->Ts, D);
    } else {
        vocab_parallel_embedding_forward(m->tp, h0, m->tokens, tp_param(m->w, i_emb), N, D, v0, Vl);
    }
    for (int l = 0; l < L; l++) sp_layer_forward(m, l, l + 1 < L ? m->acts[l + 1].h_in : m->h_final);

    /* final_xn [Ns, D] on the shard; gathered for the vocabulary-parallel output layer */
    rmsnorm_forward(m->final_xn, m->final_rstd, m->h_final, tp_param(m->w, i_norm), Ns, D, m->c.norm_eps);
    float *xn = whole(m, m->attn_in, m->final_xn);      /* [N, D] (attn_in is free here) */
    enter_region_forward(m, xn, m->final_xn);
    column_parallel_linear_forward(m->logits, xn, tp_param(m->w, i_out), N, D, Vl);   /* [N, Vl] */
    float loss_sum = vocab_parallel_cross_entropy_forward(m->tp, m->logits, m->targets, N, Vl, v0,
                                                          m->row_max, m->row_sumexp, m->target_logit);
    return loss_sum * loss_scale;
}

void sp_llama_backward(sp_llama *m) {
    const sp_dims *d = &m->d;
    int N = d->N, Ns = d->Ns, D = d->D, Vl = d->Vl, v0 = m->w->v0;
    int i_emb = 0, i_norm = m->w->nparams - 2, i_out = m->w->nparams - 1;

    /* dlogits [N, Vl], written over the logits: no collective (chapter 02) */
    vocab_parallel_cross_entropy_backward(m->logits, m->logits, m->targets, m->row_max,
                                          m->row_sumexp, N, Vl, v0, m->loss_scale);
    /* the output layer's input again: SP kept only this rank's shard of final_xn */
    float *xn = whole(m, m->attn_in, m->final_xn);
    enter_region_forward(m, xn, m->final_xn);
    column_parallel_linear_backward(m->dxn_full, tp_grad(m->w, i_out), m->logits, xn,
                                    tp_param(m->w, i_out), N, D, Vl);
    float *dxn = whole(m, m->dxn, m->dxn_full);
    enter_region_backward(m, dxn, m->dxn_full);
    device_zero(m->dh, (size_t)Ns * D * sizeof(float));
    rmsnorm_backward(m->dh, tp_grad(m->w, i_norm), dxn, m->h_final, tp_param(m->w, i_norm),
                     m->final_rstd, Ns, D);

    for (int l = m->c.n_layers - 1; l >= 0; l--) sp_layer_backward(m, l, m->dh);

    /* m->dh = d loss / d h0 [Ns, D]. A rank's table rows may be looked up by tokens anywhere in
     * the sequence: the reduce-scatter's backward, an all-gather, gives it every token's row. */
    float *dh0 = whole(m, m->dy_full, m->dh);
    if (m->sp) sp_reduce_scatter_seq_backward(m->tp, dh0, m->dh, m->chunks, d->B, d->Ts, D);
    vocab_parallel_embedding_backward(tp_grad(m->w, i_emb), dh0, m->tokens, N, D, v0, Vl);

    /* the replicated norm weights saw only this rank's tokens */
    if (m->sp && !m->skip_norm_grad_allreduce) sp_norm_grads_all_reduce(m);
}

void sp_norm_grads_all_reduce(sp_llama *m) {
    size_t D = m->d.D;
    /* BEGIN ASSIGNMENT: sum every norm weight's gradient over tp, packed into one all-reduce */
    size_t n = 0;
    for (int i = 0; i < m->w->nparams; i++) {
        param_kind k = m->w->specs[i].kind;
        if (k != P_ATTENTION_NORM && k != P_FFN_NORM && k != P_NORM) continue;
        device_copy(m->norm_grads + n * D, tp_grad(m->w, i), D * sizeof(float));
        n++;
    }
    comm_all_reduce(m->tp, m->norm_grads, n * D, COMM_SUM);
    n = 0;
    for (int i = 0; i < m->w->nparams; i++) {
        param_kind k = m->w->specs[i].kind;
        if (k != P_ATTENTION_NORM && k != P_FFN_NORM && k != P_NORM) continue;
        device_copy(tp_grad(m->w, i), m->norm_grads + n * D, D * sizeof(float));
        n++;
    }
    /* END ASSIGNMENT */
}

void sp_gather_residual_to_host(sp_llama *m, const float *x_local, float *full) {
    const sp_dims *d = &m->d;
    size_t n = (size_t)d->Ns * d->D;
    float *mine = malloc(n * sizeof(float));
    device_copy_to_host(mine, x_local, n * sizeof(float));
    if (!m->sp) {                                   /* replicated: rank 0's copy is the tensor */
        if (m->tp->rank == 0) memcpy(full, mine, n * sizeof(float));
        free(mine);
        return;
    }
    float *chunks = m->tp->rank == 0 ? malloc(n * d->p * sizeof(float)) : NULL;
    comm_host_gather(m->tp, mine, chunks, n, 0);    /* [p][B][Ts][D] on rank 0 */
    if (m->tp->rank == 0)
        for (size_t i = 0; i < n * d->p; i++) full[i] = chunks[seq_chunk_index(i, d->p, d->B, d->Ts, d->D)];
    free(chunks);
    free(mine);
}
