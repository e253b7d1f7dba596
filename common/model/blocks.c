/* blocks.c: Llama's layer as four blocks (layer.h), the single-device code of each moved here
 * from the layer function it used to be: attention_norm, attention, ffn_norm, feed_forward.
 * Each block's table row says what it owns (its tensors and the activations it saves, each with
 * its shape); its forward and backward are the llm.c-style code, calling the plan's operators
 * where a technique may act: the projection groups (proj), RoPE's positions and the attention.
 *
 * Notation (model.h): B batch, T sequence, N = B*T rows inside the tensor-parallel region, Ns
 * outside it; D dim, hd head dim, Hl and Hkvl the heads this rank holds, Fl its ffn units.
 * A linear's backward writes its input gradient (the first of a group) or adds to it (the
 * others); rmsnorm backward and every weight gradient accumulate (+=).
 */
#include <stddef.h>
#include "kernels.h"
#include "llama_kernels.h"
#include "model.h"

#define NORMAL_STD 0.02f   /* the linears: normal(0, 0.02) */
#define ONES 0.0f          /* the norm weights: every element 1 */
/* The tables' rows: a tensor (kind, name, shape, initialisation), an activation (slot, shape,
 * recompute cost: INPUT, GEMM or CHEAP, layer.h). */
#define TENSOR(k, n, r, c, std) {.kind = k, .name = n, .rows = r, .cols = c, .init_std = std}
#define ACT(a, r, c, cost_) {.act = a, .rows = r, .cols = c, .cost = ACT_COST_##cost_}

/* ---- attention_norm: attn_xn [Ns, D] = rmsnorm(h_in) * attention_norm -------------------------- */
static void attention_norm_forward(const layer_pass *x) {
    llama_model *m = x->m;
    llama_layer_acts *a = x->a;
    rmsnorm_forward(a->attn_xn, a->attn_rstd, a->h_in, x->w->attention_norm, m->d.Ns, m->d.D, m->c.norm_eps);
}
/* dh += d/d h_in through attention_norm, from dxn = d loss / d attn_xn: dh now holds d/d h_in */
static void attention_norm_backward(const layer_pass *x) {
    llama_model *m = x->m;
    llama_layer_acts *a = x->a;
    float *dxn = llama_whole(m, m->dxn, m->dxn_full);   /* [Ns, D] */
    rmsnorm_backward(x->dh, x->g->attention_norm, dxn, a->h_in, x->w->attention_norm, a->attn_rstd, m->d.Ns, m->d.D);
}
const layer_block llama_attention_norm = {
    .name = "attention_norm",
    .n_tensors = 1,
    .tensor = {TENSOR(P_ATTENTION_NORM, "attention_norm.weight", DIM_1, DIM_D, ONES)},
    .n_acts = 3,
    .act = {ACT(ACT_H_IN, ROWS_STREAM, COLS_D, INPUT),        /* [Ns, D] the layer's input                     */
            ACT(ACT_ATTN_XN, ROWS_STREAM, COLS_D, CHEAP),     /* [Ns, D]                                       */
            ACT(ACT_ATTN_RSTD, ROWS_STREAM, COLS_1, CHEAP)},  /* [Ns]    1 / rms of each row of h_in           */
    .forward = attention_norm_forward, .backward = attention_norm_backward};

/* ---- attention: h_mid [Ns, D] = wo(attention(rope(wq n), rope(wk n), wv n)), n = attn_xn -------- */
static void attention_forward_block(const layer_pass *x) {
    llama_model *m = x->m;
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    const unit_weights *w = x->w;
    llama_layer_acts *a = x->a;
    int l = x->l, B = d->B, T = d->T, D = d->D, hd = d->hd, Hl = d->Hl, Hkvl = d->Hkvl;
    proj_rows rows = {B, T, d->Ts, D};
    /* the region's entry, attn_in[N, D] (every token of the sequence), then q[N, Hl*hd], k and v
     * [N, Hkvl*hd]: three projections of the same normed input (one proj_in group) */
    proj_linear qkv[3] = {{.site = llama_site(m, P_WQ, l), .W = w->wq, .y = a->q, .width = Hl * hd},
                          {.site = llama_site(m, P_WK, l), .W = w->wk, .y = a->k, .width = Hkvl * hd},
                          {.site = llama_site(m, P_WV, l), .W = w->wv, .y = a->v, .width = Hkvl * hd}};
    p->proj.in_forward(p->proj.state, p, &p->region, llama_whole(m, m->attn_in, a->attn_xn), a->attn_xn, qkv, 3, rows);
    /* positions enter through RoPE only: rotate q and k (not v) in place */
    rope_forward(a->q, m->rope_cos_sin, B, T, Hl, hd);
    rope_forward(a->k, m->rope_cos_sin, B, T, Hkvl, hd);
    /* attn_out[N, Hl*hd] = softmax(q k^T / sqrt(hd), causal) v; probs[B, Hl, T, T] saved */
    p->attention.forward(p->attention.state, p, m->c.precision, a->attn_out, a->probs, a->q, a->k, a->v, B, T, Hl, Hkvl, hd);
    /* partial[N, D] = attn_out wo^T (this rank's heads' share), then the region's exit: h_mid [Ns, D] */
    proj_linear wo = {.site = llama_site(m, P_WO, l), .W = w->wo, .width = Hl * hd};
    float *partial = llama_whole(m, m->y_partial, a->h_mid);
    p->proj.out_forward(p->proj.state, p, &p->region, a->h_mid, partial, a->attn_out, &wo, rows);
}
/* dh [Ns, D] = d loss / d h_mid in; out: dxn = d loss / d attn_xn (the region's entry backward) */
static void attention_backward_block(const layer_pass *x) {
    llama_model *m = x->m;
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    const unit_weights *w = x->w, *g = x->g;
    llama_layer_acts *a = x->a;
    int l = x->l, B = d->B, T = d->T, D = d->D, hd = d->hd, Hl = d->Hl, Hkvl = d->Hkvl;
    proj_rows rows = {B, T, d->Ts, D};
    /* dy[N, D] through the exit; dattn_out[N, Hl*hd] = dy wo;  d wo += dy^T attn_out */
    proj_linear wo = {.site = llama_site(m, P_WO, l), .W = w->wo, .dW = g->wo, .width = Hl * hd};
    p->proj.out_backward(p->proj.state, p, &p->region, m->dattn_out, llama_whole(m, m->dy_full, x->dh), x->dh,
                         a->attn_out, &wo, rows);
    /* dq, dk, dv: gradients of the rotated q and k and of v */
    p->attention.backward(p->attention.state, p, m->c.precision, m->dq, m->dk, m->dv, m->dprobs, m->dattn_out, a->attn_out, a->q, a->k,
                          a->v, a->probs, B, T, Hl, Hkvl, hd);
    /* undo RoPE's rotation on the gradients: now d/d (wq n) and d/d (wk n) */
    rope_backward(m->dq, m->rope_cos_sin, B, T, Hl, hd);
    rope_backward(m->dk, m->rope_cos_sin, B, T, Hkvl, hd);
    /* dxn_full[N, D] = dq wq + dk wk + dv wv: attn_in feeds three projections (summed in the
     * GEMMs); then the region's entry backward, dxn[Ns, D] */
    proj_linear qkv[3] = {{.site = llama_site(m, P_WQ, l), .W = w->wq, .dW = g->wq, .dy = m->dq, .width = Hl * hd},
                          {.site = llama_site(m, P_WK, l), .W = w->wk, .dW = g->wk, .dy = m->dk, .width = Hkvl * hd},
                          {.site = llama_site(m, P_WV, l), .W = w->wv, .dW = g->wv, .dy = m->dv, .width = Hkvl * hd}};
    p->proj.in_backward(p->proj.state, p, &p->region, llama_whole(m, m->dxn, m->dxn_full), m->dxn_full,
                        llama_whole(m, m->attn_in, a->attn_xn), qkv, 3, rows);
}
const layer_block llama_attention = {
    .name = "attention",
    .n_tensors = 4,
    .tensor = {TENSOR(P_WQ, "attention.wq.weight", DIM_Q, DIM_D, NORMAL_STD),
               TENSOR(P_WK, "attention.wk.weight", DIM_KV, DIM_D, NORMAL_STD),
               TENSOR(P_WV, "attention.wv.weight", DIM_KV, DIM_D, NORMAL_STD),
               TENSOR(P_WO, "attention.wo.weight", DIM_D, DIM_Q, NORMAL_STD)},
    .n_acts = 6,
    .act = {ACT(ACT_Q, ROWS_REGION, COLS_Q, GEMM),           /* [N, Hl*hd]   queries after RoPE                */
            ACT(ACT_K, ROWS_REGION, COLS_KV, GEMM),          /* [N, Hkvl*hd] keys after RoPE                   */
            ACT(ACT_V, ROWS_REGION, COLS_KV, GEMM),          /* [N, Hkvl*hd]                                   */
            ACT(ACT_PROBS, ROWS_1, COLS_PROBS, CHEAP),        /* the attention's: [B, Hl, T, T] locally          */
            ACT(ACT_ATTN_OUT, ROWS_REGION, COLS_Q, GEMM),    /* [N, Hl*hd]   input of wo                       */
            ACT(ACT_H_MID, ROWS_STREAM, COLS_D, GEMM)},      /* [Ns, D]      after the exit (+ h_in: ffn_norm) */
    .forward = attention_forward_block, .backward = attention_backward_block};

/* ---- ffn_norm: h_mid [Ns, D] += h_in (the residual), ffn_xn = rmsnorm(h_mid) * ffn_norm --------- */
static void ffn_norm_forward(const layer_pass *x) {
    llama_model *m = x->m;
    llama_layer_acts *a = x->a;
    /* in one pass over each row */
    residual_rmsnorm_forward(a->h_mid, a->ffn_xn, a->ffn_rstd, a->h_in, x->w->ffn_norm, m->d.Ns, m->d.D, m->c.norm_eps);
}
/* dh += d/d h_mid through ffn_norm, from dxn = d loss / d ffn_xn: dh then holds d loss / d h_mid
 * (the residual path passes dh through unchanged) */
static void ffn_norm_backward(const layer_pass *x) {
    llama_model *m = x->m;
    llama_layer_acts *a = x->a;
    float *dxn = llama_whole(m, m->dxn, m->dxn_full);   /* [Ns, D] */
    rmsnorm_backward(x->dh, x->g->ffn_norm, dxn, a->h_mid, x->w->ffn_norm, a->ffn_rstd, m->d.Ns, m->d.D);
}
const layer_block llama_ffn_norm = {
    .name = "ffn_norm",
    .n_tensors = 1,
    .tensor = {TENSOR(P_FFN_NORM, "ffn_norm.weight", DIM_1, DIM_D, ONES)},
    .n_acts = 2,
    .act = {ACT(ACT_FFN_XN, ROWS_STREAM, COLS_D, CHEAP),      /* [Ns, D]                                       */
            ACT(ACT_FFN_RSTD, ROWS_STREAM, COLS_1, CHEAP)},   /* [Ns]                                          */
    .forward = ffn_norm_forward, .backward = ffn_norm_backward};

/* ---- feed_forward: h_out [Ns, D] = h_mid + w2(silu(w1 m) * w3 m), m = ffn_xn --------------------- */
static void feed_forward_forward(const layer_pass *x) {
    llama_model *m = x->m;
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    const unit_weights *w = x->w;
    llama_layer_acts *a = x->a;
    int l = x->l, Fl = d->Fl;
    proj_rows rows = {d->B, d->T, d->Ts, d->D};
    /* the region's entry, ffn_in [N, D], then ffn_a, ffn_b [N, Fl]: the gate and the up projection */
    proj_linear w13[2] = {{.site = llama_site(m, P_W1, l), .W = w->w1, .y = a->ffn_a, .width = Fl},
                          {.site = llama_site(m, P_W3, l), .W = w->w3, .y = a->ffn_b, .width = Fl}};
    p->proj.in_forward(p->proj.state, p, &p->region, llama_whole(m, m->ffn_in, a->ffn_xn), a->ffn_xn, w13, 2, rows);
    /* ffn_g[N, Fl] = silu(ffn_a) * ffn_b, element-wise */
    swiglu_forward(a->ffn_g, a->ffn_a, a->ffn_b, (size_t)d->N * Fl);
    if (!x->h_out) return;     /* a recomputation: backward needs w2's input, not its output */
    /* partial [N, D] = ffn_g w2^T, then the region's exit: h_out [Ns, D]; then the residual */
    proj_linear w2 = {.site = llama_site(m, P_W2, l), .W = w->w2, .width = Fl};
    p->proj.out_forward(p->proj.state, p, &p->region, x->h_out, llama_whole(m, m->y_partial, x->h_out), a->ffn_g, &w2,
                        rows);
    add_inplace(x->h_out, a->h_mid, (size_t)d->Ns * d->D);
}
/* dh [Ns, D] = d loss / d h_out in (the residual path passes it through unchanged, the branch's
 * part comes through ffn_norm); out: dxn = d loss / d ffn_xn */
static void feed_forward_backward(const layer_pass *x) {
    llama_model *m = x->m;
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    const unit_weights *w = x->w, *g = x->g;
    llama_layer_acts *a = x->a;
    int l = x->l, Fl = d->Fl;
    proj_rows rows = {d->B, d->T, d->Ts, d->D};
    /* the region's exit backward, dy[N, D] = d/d (w2's output); then dffn_g[N, Fl] = dy w2 and
     * d w2 += dy^T ffn_g */
    proj_linear w2 = {.site = llama_site(m, P_W2, l), .W = w->w2, .dW = g->w2, .width = Fl};
    p->proj.out_backward(p->proj.state, p, &p->region, m->dffn_g, llama_whole(m, m->dy_full, x->dh), x->dh, a->ffn_g,
                         &w2, rows);
    /* dffn_a, dffn_b [N, Fl] through silu(a) * b */
    swiglu_backward(m->dffn_a, m->dffn_b, m->dffn_g, a->ffn_a, a->ffn_b, (size_t)d->N * Fl);
    /* dxn_full[N, D] = dffn_a w1 + dffn_b w3 (this rank's units' share): ffn_in feeds both, so
     * the second GEMM adds onto the first's output; then the region's entry backward, dxn[Ns, D]
     * summed over ranks */
    proj_linear w13[2] = {{.site = llama_site(m, P_W1, l), .W = w->w1, .dW = g->w1, .dy = m->dffn_a, .width = Fl},
                          {.site = llama_site(m, P_W3, l), .W = w->w3, .dW = g->w3, .dy = m->dffn_b, .width = Fl}};
    p->proj.in_backward(p->proj.state, p, &p->region, llama_whole(m, m->dxn, m->dxn_full), m->dxn_full,
                        llama_whole(m, m->ffn_in, a->ffn_xn), w13, 2, rows);
}
const layer_block llama_feed_forward = {
    .name = "feed_forward",
    .n_tensors = 3,
    .tensor = {TENSOR(P_W1, "feed_forward.w1.weight", DIM_F, DIM_D, NORMAL_STD),
               TENSOR(P_W2, "feed_forward.w2.weight", DIM_D, DIM_F, NORMAL_STD),
               TENSOR(P_W3, "feed_forward.w3.weight", DIM_F, DIM_D, NORMAL_STD)},
    .n_acts = 3,
    .act = {ACT(ACT_FFN_A, ROWS_REGION, COLS_F, GEMM),       /* [N, Fl] w1 m (the gate)                      */
            ACT(ACT_FFN_B, ROWS_REGION, COLS_F, GEMM),       /* [N, Fl] w3 m                                 */
            ACT(ACT_FFN_G, ROWS_REGION, COLS_F, CHEAP)},      /* [N, Fl] silu(ffn_a) * ffn_b: input of w2     */
    .forward = feed_forward_forward, .backward = feed_forward_backward};

const llama_layer llama_layer_default = {
    .name = "llama", .n = 4, .block = {&llama_attention_norm, &llama_attention, &llama_ffn_norm, &llama_feed_forward}};
