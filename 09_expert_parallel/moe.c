/* moe.c: the mixture-of-experts feed-forward block (moe.h), forward and backward.
 *
 * Notation: N tokens (this rank's rows), D dim, E experts of hidden F_e, k per token; this rank
 * holds El experts from e0 (El = E on one device). A token's k copies are rows of a [N*k, D]
 * buffer in the dispatch's order: expert by expert (so rank by rank, the experts of a rank being
 * consecutive), the tokens in order within an expert. slot[t*k + j] is copy (t, j)'s row there.
 *
 * One layer's forward; the exchanges are the plan's (expert_exchange_ops: all-to-alls over the ep
 * group of P ranks under expert parallelism, copies on one device):
 *   router     logits [N, E] = m W_r^T; probs = softmax, or sigmoid       (the plan's linear)
 *   route      top-k, gates, slot and the counts per expert, on the host (moe_route)
 *   dispatch   send [N*k, D] = m[token of each row]                          (moe_gather_rows)
 *              counts: to every expert's rank                              (experts.counts)
 *              rows:   to the experts' ranks -> moe_x [rows, D]             (experts.rows)
 *   experts    the rows permuted into expert order (each expert's rows in one block), then
 *              for each local expert e:                                      (permute_rows)
 *              a = x w1_e^T, b = x w3_e^T, g = silu(a) * b, y = g w2_e^T     (the plan's linear)
 *   combine    y permuted back; rows back -> moe_y [N*k, D] in slot order  (experts.rows)
 *              h_out += sum_j gate * moe_y[slot]                             (moe_combine)
 * The backward runs the same steps in reverse: the combine's backward gives each copy's
 * gradient (gate * dh) and each gate's (dh . y); they travel to the experts, through the experts'
 * backward, and back; the copies' input gradients are summed per token; the gates' gradients
 * (plus the load-balancing loss's) go through the softmax (or the normalisations and the sigmoid)
 * and the router.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "device.h"
#include "expert_parallel.h"
#include "kernels.h"
#include "llama_kernels.h"
#include "moe.h"
#include "moe_kernels.h"

const char *moe_config_check(const llama_config *c, char *why, size_t len) {
    const moe_config *x = &c->moe;
    if (x->experts < 1) snprintf(why, len, "--experts %d: a mixture of experts needs at least 1 expert", x->experts);
    else if (x->top_k < 1 || x->top_k > x->experts)
        snprintf(why, len, "--top-k %d: each token goes to between 1 and --experts %d experts", x->top_k, x->experts);
    else if (x->expert_dim < 1) snprintf(why, len, "--expert-dim %d: an expert's hidden size must be positive", x->expert_dim);
    else if (!(x->aux_alpha >= 0)) snprintf(why, len, "--aux-alpha %g: the load-balancing loss's weight must be >= 0", x->aux_alpha);
    else if (!(x->capacity_factor >= 0)) snprintf(why, len, "--capacity-factor %g: must be positive (or 0: dropless)", x->capacity_factor);
    else if (c->layer_every < 1 || c->layer_every > c->n_layers)
        snprintf(why, len, "--moe-every %d: the mixture replaces every K-th layer's feed-forward, K from 1 to "
                 "--n-layers %d (above it no layer would be a mixture)", c->layer_every, c->n_layers);
    else if ((long long)x->experts * x->expert_dim > INT_MAX || (long long)x->experts * c->dim > INT_MAX)
        snprintf(why, len, "--experts %d x --expert-dim %d (and x --dim %d): the experts' stacked weights need fewer "
                 "than 2^31 rows", x->experts, x->expert_dim, c->dim);
    else return NULL;
    return why;
}

/* ---- routing, on the host --------------------------------------------------------------------- */

/* What one layer's routing decided: each copy's expert and row, each row's token, the counts. */
typedef struct {
    int *choice;          /* [N*k] the expert of copy (t, j)                                     */
    int *kept;            /* [N*k] 1: the copy goes to its expert; 0: dropped (a full expert)   */
    size_t dropped;       /* how many were dropped                                               */
    int *slot;            /* [N*k] its row in the dispatch's order (-1: dropped)                 */
    int *token;           /* [N*k] the token of each row of that order                           */
    size_t *per_expert;   /* [E] rows this rank sends to each expert                            */
    size_t *recv;         /* [P*El = E] rows this rank's experts get: from rank q, for its
                           * local expert e, at q*El + e                                        */
    int *slot_dev;        /* device copies of slot and token, for the kernels                    */
    int *token_dev;
} route;

/* Top-k of each row of probs [N, E] (host): choice and gates [N*k], the larger first, ties to the
 * lower index. */
static void top_k(int *choice, float *gates, const float *probs, int N, int E, int k) {
    for (int t = 0; t < N; t++) {
        const float *p = probs + (size_t)t * E;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++) taken |= choice[(size_t)t * k + i] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;   /* strict: ties keep the lower */
            }
            choice[(size_t)t * k + j] = best;
            gates[(size_t)t * k + j] = p[best];
        }
    }
}

/* Each row of x [rows, n] (host) divided by its sum, in place: DeepSeek-V3's sigmoid router gives
 * a token's chosen scores over their sum as its gates, and the balancing loss each token's scores
 * over their sum. */
static void normalise_rows(float *x, size_t rows, int n) {
    for (size_t r = 0; r < rows; r++) {
        float *v = x + r * n, sum = 0.0f;
        for (int i = 0; i < n; i++) sum += v[i];
        for (int i = 0; i < n; i++) v[i] /= sum;
    }
}

/* The backward of normalise_rows for one row of n, from the values before it, x [n]: with
 * y = x / sum(x), dx_i = (dy_i - sum_j dy_j y_j) / sum(x). dx [n] (=); dx may be dy. */
static void normalise_backward(float *dx, const float *dy, const float *x, int n) {
    float sum = 0.0f, dot = 0.0f;
    for (int i = 0; i < n; i++) sum += x[i];
    for (int i = 0; i < n; i++) dot += dy[i] * (x[i] / sum);
    for (int i = 0; i < n; i++) dx[i] = (dy[i] - dot) / sum;
}

/* Which copies their experts take. Dropless (d->capacity 0): all of them. Under a capacity, each
 * expert takes the first `capacity` copies of each sequence, in token order (a token's copies in
 * j order), and the others are dropped: a sequence is never split over ranks, so each rank
 * decides for its own sequences what the baseline decides for the whole batch. */
static void route_capacity(route *r, const llama_dims *d) {
    size_t n = (size_t)d->N * d->k;
    r->dropped = 0;
    for (size_t i = 0; i < n; i++) r->kept[i] = 1;
    if (!d->capacity) return;
    int *taken = malloc((size_t)d->E * sizeof *taken);
    for (int s = 0; s < d->B; s++) {
        memset(taken, 0, (size_t)d->E * sizeof *taken);
        for (size_t i = (size_t)s * d->T * d->k; i < (size_t)(s + 1) * d->T * d->k; i++)
            if (taken[r->choice[i]]++ >= d->capacity) r->kept[i] = 0, r->dropped++;
    }
    free(taken);
}

/* The dispatch's order from the choices: rows expert by expert, tokens in order within one. */
static void route_plan(route *r, const llama_dims *d) {
    int N = d->N, k = d->k, E = d->E;
    route_capacity(r, d);
    size_t *next = calloc((size_t)E + 1, sizeof *next);   /* (a scratch of E + 1 counters) */
    memset(r->per_expert, 0, (size_t)E * sizeof *r->per_expert);
    /* BEGIN ASSIGNMENT: the dispatch order: count each expert's kept copies (per_expert), then give every kept copy (t, j) of choice[t*k + j] its row slot[t*k + j] of the send buffer, rows expert by expert and in token order within an expert, and every row its token (token[row]); a dropped copy (kept[t*k + j] == 0) gets slot -1 and no row */
    for (size_t i = 0; i < (size_t)N * k; i++) r->per_expert[r->choice[i]] += (size_t)r->kept[i];
    for (int e = 0; e < E; e++) next[e + 1] = next[e] + r->per_expert[e];   /* each expert's first row */
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            size_t i = (size_t)t * k + j, row = next[r->choice[i]];
            if (!r->kept[i]) { r->slot[i] = -1; continue; }
            next[r->choice[i]]++;
            r->slot[i] = (int)row;
            r->token[row] = t;
        }
    /* END ASSIGNMENT */
    free(next);
    device_copy_to_device(r->slot_dev, r->slot, (size_t)N * k * sizeof(int));
    device_copy_to_device(r->token_dev, r->token, (size_t)N * k * sizeof(int));
}

static route route_alloc(const llama_dims *d) {
    size_t n = (size_t)d->N * d->k;
    route r = {.choice = calloc(n + 1, sizeof(int)), .kept = calloc(n + 1, sizeof(int)), .slot = calloc(n + 1, sizeof(int)),
               .token = calloc(n + 1, sizeof(int)), .per_expert = calloc((size_t)d->E, sizeof(size_t)),
               .recv = calloc((size_t)d->E, sizeof(size_t)), .slot_dev = device_alloc_ints(n, MEM_BUFFERS),
               .token_dev = device_alloc_ints(n, MEM_BUFFERS)};
    return r;
}
static void route_free(route *r) {
    free(r->choice); free(r->kept); free(r->slot); free(r->token); free(r->per_expert); free(r->recv);
    device_free(r->slot_dev);
    device_free(r->token_dev);
}

/* The choices and counts as the layer saves them (exact small integers in floats): choice [N*k]
 * into moe_choice; per_expert, recv and the dropped count, [2E + 1], into moe_counts. */
static void route_save(const route *r, const llama_dims *d, llama_layer_acts *a) {
    size_t n = (size_t)d->N * d->k;
    float *f = malloc((n > 2 * (size_t)d->E + 1 ? n : 2 * (size_t)d->E + 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = (float)r->choice[i];
    device_copy_to_device(a->moe_choice, f, n * sizeof(float));
    for (int e = 0; e < d->E; e++) f[e] = (float)r->per_expert[e], f[d->E + e] = (float)r->recv[e];
    f[2 * d->E] = (float)r->dropped;
    device_copy_to_device(a->moe_counts, f, (2 * (size_t)d->E + 1) * sizeof(float));
    free(f);
}
/* ... and back, before the backward. */
static void route_load(route *r, const llama_dims *d, const llama_layer_acts *a) {
    size_t n = (size_t)d->N * d->k;
    float *f = malloc((n > 2 * (size_t)d->E + 1 ? n : 2 * (size_t)d->E + 1) * sizeof(float));
    device_copy_to_host(f, a->moe_choice, n * sizeof(float));
    for (size_t i = 0; i < n; i++) r->choice[i] = (int)f[i];
    route_plan(r, d);
    device_copy_to_host(f, a->moe_counts, 2 * (size_t)d->E * sizeof(float));
    for (int e = 0; e < d->E; e++) r->recv[e] = (size_t)f[d->E + e];
    free(f);
}

/* ---- the exchanges with the experts' ranks (the plan's expert_exchange_ops) ------------------ */

/* Rows per peer rank of the ep group: to[q] = sum of counts[q*El .. q*El + El) (an expert-major
 * [P][El] table: the sends' per_expert, the receives' recv). */
static void rows_per_rank(size_t *to, const size_t *counts, const llama_dims *d) {
    for (int q = 0; q < d->ep; q++) {
        to[q] = 0;
        for (int e = 0; e < d->El; e++) to[q] += counts[(size_t)q * d->El + e];
    }
}

/* The counts: r->recv[q*El + e] = what rank q sends to this rank's expert e. */
static void exchange_counts(const llama_plan *p, route *r, const llama_dims *d) {
    p->experts.counts(p->experts.state, p, r->recv, r->per_expert, d->E);
}

/* Rows between the tokens' side (tokens_side [kept copies, D], dispatch order) and the experts'
 * side (experts_side [rows received, D], [q][e] order): to the experts (the forward's dispatch,
 * the backward of the combine) or back (the combine, the dispatch's backward). */
static void exchange_rows(const llama_plan *p, const route *r, const llama_dims *d, float *tokens_side,
                          float *experts_side, bool to_experts) {
    size_t sent[d->ep], got[d->ep];
    rows_per_rank(sent, r->per_expert, d);
    rows_per_rank(got, r->recv, d);
    if (to_experts) p->experts.rows(p->experts.state, p, experts_side, got, tokens_side, sent, d->D);
    else p->experts.rows(p->experts.state, p, tokens_side, sent, experts_side, got, d->D);
}

/* ---- the experts, one expert at a time ------------------------------------------------------- */

/* The all-to-all lays the received rows down by source rank, [q][e]: rank 0's rows for local
 * experts 0 .. El-1, then rank 1's, and so on. The experts run in expert order instead, [e][q]:
 * each expert's rows in one block, the source ranks in order within it (so in the batch's order,
 * as the single device has them). One GEMM per expert and weight, not one per (q, e) chunk: with
 * many ranks and few rows a chunk's weight gradient (dW += dy^T x, the whole [F_e, D] read and
 * written for a few rows) made the chunk loop three times slower (APPENDIX.md, measured with
 * tools/bench_expert_gemm.c), and this is the permutation torchtitan makes before its grouped
 * GEMM. The price: the rows copied into expert order and back, and one more [R, D] buffer. */

/* Each local expert's block of rows in expert order (empty experts left out). */
typedef struct { int e; size_t off, n; } expert_block;
static int expert_blocks(expert_block *c, const route *r, const llama_dims *d) {
    int n = 0;
    size_t off = 0;
    for (int e = 0; e < d->El; e++) {
        size_t rows = 0;
        for (int q = 0; q < d->ep; q++) rows += r->recv[(size_t)q * d->El + e];
        if (rows) c[n++] = (expert_block){e, off, rows};
        off += rows;
    }
    return n;
}

/* Rows [rows received, D] between the all-to-all's order [q][e] and expert order [e][q]:
 * to_experts copies src ([q][e]) into dst ([e][q]), else back. One copy per (q, e) chunk. */
static void permute_rows(const route *r, const llama_dims *d, float *dst, const float *src, bool to_experts) {
    size_t at[d->El], off = 0, first = 0, D = (size_t)d->D;   /* at[e]: the next row of expert e's block */
    for (int e = 0; e < d->El; e++) {
        at[e] = first;
        for (int q = 0; q < d->ep; q++) first += r->recv[(size_t)q * d->El + e];
    }
    for (int q = 0; q < d->ep; q++)
        for (int e = 0; e < d->El; e++) {
            size_t n = r->recv[(size_t)q * d->El + e], bytes = n * D * sizeof(float);
            if (to_experts) device_copy(dst + at[e] * D, src + off * D, bytes);
            else device_copy(dst + off * D, src + at[e] * D, bytes);
            at[e] += n, off += n;
        }
}

static size_t rows_received(const route *r, const llama_dims *d) {
    size_t n = 0;
    for (int e = 0; e < d->E; e++) n += r->recv[e];
    return n;
}

/* y [rows, D] (=) = w2_e (silu(x w1_e^T) * (x w3_e^T)) for each expert's block; a, b, g saved. */
static void experts_forward(const layer_pass *x, const route *r, float *y) {
    llama_model *m = x->m;
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    llama_layer_acts *a = x->a;
    size_t D = d->D, F = d->Fe;
    expert_block c[d->El];
    int nc = expert_blocks(c, r, d);
    for (int i = 0; i < nc; i++) {
        size_t e = c[i].e, off = c[i].off, n = c[i].n;
        const float *w1 = x->w->expert_w1 + e * F * D, *w3 = x->w->expert_w3 + e * F * D;
        p->linear.forward(p->linear.state, p, llama_site(m, P_EXPERT_W1, x->l), a->moe_a + off * F, a->moe_x + off * D,
                          w1, (int)n, (int)D, (int)F);
        p->linear.forward(p->linear.state, p, llama_site(m, P_EXPERT_W3, x->l), a->moe_b + off * F, a->moe_x + off * D,
                          w3, (int)n, (int)D, (int)F);
    }
    size_t rows = rows_received(r, d);
    swiglu_forward(a->moe_g, a->moe_a, a->moe_b, rows * F);
    for (int i = 0; i < nc; i++) {
        size_t e = c[i].e, off = c[i].off, n = c[i].n;
        const float *w2 = x->w->expert_w2 + e * D * F;
        p->linear.forward(p->linear.state, p, llama_site(m, P_EXPERT_W2, x->l), y + off * D, a->moe_g + off * F, w2,
                          (int)n, (int)F, (int)D);
    }
}

/* dy [rows, D] = d loss / d y in; out, in its place: dx [rows, D] = d loss / d x. Weight
 * gradients accumulate (+=). */
static void experts_backward(const layer_pass *x, const route *r, float *dy) {
    llama_model *m = x->m;
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    const llama_layer_acts *a = x->a;
    size_t D = d->D, F = d->Fe;
    expert_block c[d->El];
    int nc = expert_blocks(c, r, d);
    /* every block's dg = dy w2_e and d w2_e += dy^T g, before any dx overwrites dy */
    for (int i = 0; i < nc; i++) {
        size_t e = c[i].e, off = c[i].off, n = c[i].n;
        p->linear.backward(p->linear.state, p, llama_site(m, P_EXPERT_W2, x->l), m->dmoe_g + off * F, DX_SET,
                           x->g->expert_w2 + e * D * F, dy + off * D, a->moe_g + off * F, x->w->expert_w2 + e * D * F,
                           (int)n, (int)F, (int)D);
    }
    swiglu_backward(m->dmoe_a, m->dmoe_b, m->dmoe_g, a->moe_a, a->moe_b, rows_received(r, d) * F);
    /* dx = da w1_e + db w3_e (the second adds in its GEMM); d w1_e += da^T x, d w3_e += db^T x */
    for (int i = 0; i < nc; i++) {
        size_t e = c[i].e, off = c[i].off, n = c[i].n;
        p->linear.backward(p->linear.state, p, llama_site(m, P_EXPERT_W1, x->l), dy + off * D, DX_SET,
                           x->g->expert_w1 + e * F * D, m->dmoe_a + off * F, a->moe_x + off * D,
                           x->w->expert_w1 + e * F * D, (int)n, (int)D, (int)F);
        p->linear.backward(p->linear.state, p, llama_site(m, P_EXPERT_W3, x->l), dy + off * D, DX_ADD,
                           x->g->expert_w3 + e * F * D, m->dmoe_b + off * F, a->moe_x + off * D,
                           x->w->expert_w3 + e * F * D, (int)n, (int)D, (int)F);
    }
}

/* ---- the load-balancing loss ------------------------------------------------------------------ */

/* f[B, E] of each sequence: the share of its tokens' copies sent to each expert. Under context
 * parallelism (chapter 06) this rank holds T of each sequence's seq_len rows: the copies are
 * counted here and summed over the ranks holding the others (the plan's sequence_sum). */
static void sequence_shares(double *f, const route *r, const llama_plan *p, const llama_dims *d, int seq_len) {
    int B = d->B, T = d->T, k = d->k, E = d->E;
    float *copies = calloc((size_t)B * E, sizeof *copies);   /* exact integers */
    for (int t = 0; t < B * T; t++)
        for (int j = 0; j < k; j++) copies[(size_t)(t / T) * E + r->choice[(size_t)t * k + j]] += 1;
    p->experts.sequence_sum(p->experts.state, p, copies, (size_t)B * E);
    for (size_t i = 0; i < (size_t)B * E; i++) f[i] = copies[i] / ((double)k * seq_len);
    free(copies);
}

/* aux = loss scale * sum over sequences of T alpha E sum_e f_e P_e (moe.h), from probs [N, E] on
 * the host. P_e is a mean over the sequence's tokens: under context parallelism this rank adds its
 * rows' part of T P_e (the loss is summed over the cp ranks), f being the whole sequence's. */
static double aux_loss(const double *f, const float *probs, const llama_dims *d, const moe_config *c, float scale) {
    int B = d->B, T = d->T, E = d->E;
    double total = 0;
    for (int s = 0; s < B; s++)
        for (int e = 0; e < E; e++) {
            double P = 0;
            for (int t = s * T; t < (s + 1) * T; t++) P += probs[(size_t)t * E + e];
            total += T * c->aux_alpha * E * f[(size_t)s * E + e] * (P / T);
        }
    return scale * total;
}

/* dprobs [N, E] (=): the balancing loss's gradient d aux / d p_{t,e} (moe.h's aux), from the
 * shares f [B, E] of each sequence's copies and the loss scale. */
static void aux_gradient(float *dprobs, const double *f, const llama_dims *d, const moe_config *c, float scale) {
    int N = d->N, E = d->E;
    for (size_t i = 0; i < (size_t)N * E; i++) dprobs[i] = 0;
    /* BEGIN ASSIGNMENT: the balancing loss's gradient: dprobs[t*E + e] = d aux / d p_{t,e} for every token t (of sequence s = t / T, T = d->T) and expert e, derived from aux's definition (moe.h), with f[s*E + e] = f_{s,e}, alpha = c->aux_alpha and the loss scale `scale` */
    for (int t = 0; t < N; t++)
        for (int e = 0; e < E; e++)
            dprobs[(size_t)t * E + e] = (float)((double)scale * c->aux_alpha * E * f[(size_t)(t / d->T) * E + e]);
    /* END ASSIGNMENT */
}

/* ---- the block ------------------------------------------------------------------------------- */

static void moe_forward(const layer_pass *x) {
    llama_model *m = x->m;
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    llama_layer_acts *a = x->a;
    int N = d->N, D = d->D, E = d->E, k = d->k;
    if (!x->h_out || p->checkpoint.keep != ACT_KEEP_ALL) {   /* (a programming error: expert_parallel_apply refuses) */
        fprintf(stderr, "moe: the MoE block keeps every activation; activation checkpointing is not supported\n");
        exit(1);
    }
    /* h_out = h_mid + the shared expert's output (llama_feed_forward's block, ffn_dim wide), or h_mid */
    if (m->c.moe.shared_expert) llama_feed_forward.forward(x);
    else device_copy(x->h_out, a->h_mid, (size_t)d->Ns * D * sizeof(float));

    /* router: logits [N, E] (in drouter_probs, free now) = m W_r^T; probs = softmax (or the
     * scores, each logit's sigmoid: --router sigmoid) */
    bool sigmoid = m->c.moe.router == MOE_SIGMOID;
    p->linear.forward(p->linear.state, p, llama_site(m, P_ROUTER, x->l), m->drouter_probs, a->ffn_xn, x->w->router, N,
                      D, E);
    moe_router_scores(a->router_probs, m->drouter_probs, N, E, sigmoid);

    /* route, on the host: top-k, gates (the chosen probabilities, or scores over their sum), the
     * dispatch's order, the counts */
    route r = route_alloc(d);
    float *probs = malloc((size_t)N * E * sizeof(float)), *gates = malloc((size_t)N * k * sizeof(float));
    device_copy_to_host(probs, a->router_probs, (size_t)N * E * sizeof(float));
    top_k(r.choice, gates, probs, N, E, k);
    if (sigmoid) normalise_rows(gates, (size_t)N, k);
    device_copy_to_device(a->moe_gates, gates, (size_t)N * k * sizeof(float));
    route_plan(&r, d);
    expert_parallel_count_load(p, r.per_expert, r.dropped);   /* (the step's load, for the report) */
    exchange_counts(p, &r, d);
    route_save(&r, d, a);

    /* dispatch: the copies in order (dmoe_y), then to their experts' ranks (moe_x) */
    moe_gather_rows(m->dmoe_y, a->ffn_xn, r.token_dev, (int)((size_t)N * k - r.dropped), D);
    if (rows_received(&r, d) > d->R) {   /* the counts promise at most R rows (model.h): else a bug */
        fprintf(stderr, "moe: layer %d receives %zu rows, more than the %zu its buffers hold\n", x->l,
                rows_received(&r, d), d->R);
        exit(1);
    }
    exchange_rows(p, &r, d, m->dmoe_y, m->dmoe_x, true);
    permute_rows(&r, d, a->moe_x, m->dmoe_x, true);   /* into expert order: the saved x */
    unsigned fault = expert_parallel_faults_on(p);
    /* the experts, into dmoe_x (expert order); their outputs back in the all-to-all's order
     * (moe_rows) to their tokens' ranks (moe_y, slot order); the weighted combine */
    experts_forward(x, &r, m->dmoe_x);
    permute_rows(&r, d, m->moe_rows, m->dmoe_x, false);
    exchange_rows(p, &r, d, a->moe_y, m->moe_rows, false);
    moe_combine(x->h_out, a->moe_y, r.slot_dev, fault & EP_FAULT_NO_GATES ? NULL : a->moe_gates, N, k, D);

    /* the load-balancing loss, added to the model's (P from the probabilities, or from each
     * token's scores over their sum) */
    double *f = malloc((size_t)d->B * E * sizeof *f);
    sequence_shares(f, &r, p, d, m->c.seq_len);
    if (sigmoid) normalise_rows(probs, (size_t)N, E);
    m->aux_loss += (float)aux_loss(f, probs, d, &m->c.moe, m->saved->loss_scale);
    free(f);
    free(probs);
    free(gates);
    route_free(&r);
}

/* dh [N, D] = d loss / d h_out in; out: dxn = d loss / d ffn_xn (the shared expert's, then the
 * routed copies' and the router's added). */
static void moe_backward(const layer_pass *x) {
    llama_model *m = x->m;
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    const llama_layer_acts *a = x->a;
    int N = d->N, D = d->D, E = d->E, k = d->k;
    float *dxn = llama_whole(m, m->dxn, m->dxn_full);   /* [N, D] */
    if (m->c.moe.shared_expert) llama_feed_forward.backward(x);   /* dxn = the shared expert's share */
    else device_zero(dxn, (size_t)N * D * sizeof(float));

    route r = route_alloc(d);
    route_load(&r, d, a);
    /* the combine's backward: each copy's gradient gate * dh (dmoe_y, dispatch order) and each
     * gate's, dh . y; the copies' gradients to the experts (dmoe_x), through them, and back */
    moe_combine_backward(m->dmoe_y, m->dmoe_gates, x->dh, a->moe_y, r.slot_dev, a->moe_gates, N, k, D);
    exchange_rows(p, &r, d, m->dmoe_y, m->dmoe_x, true);
    permute_rows(&r, d, m->moe_rows, m->dmoe_x, true);   /* into expert order */
    experts_backward(x, &r, m->moe_rows);
    permute_rows(&r, d, m->dmoe_x, m->moe_rows, false);
    exchange_rows(p, &r, d, m->dmoe_y, m->dmoe_x, false);
    /* every token's copies' input gradients, summed into dxn (weight 1 each) */
    moe_combine(dxn, m->dmoe_y, r.slot_dev, NULL, N, k, D);

    /* the router: d probs [N, E] = the balancing loss's gradient, plus each gate's gradient at its
     * expert; then through the softmax (in place). Under --router sigmoid both reach the scores s
     * through a normalisation: the loss's P through each token's s over its sum over the E
     * experts, the gates through the chosen s over their sum (normalise_backward); then the
     * sigmoid's backward. */
    bool sigmoid = m->c.moe.router == MOE_SIGMOID;
    float *dprobs = calloc((size_t)N * E, sizeof(float)), *dgates = malloc((size_t)N * k * sizeof(float));
    float *scores = sigmoid ? malloc((size_t)N * E * sizeof(float)) : NULL;
    device_copy_to_host(dgates, m->dmoe_gates, (size_t)N * k * sizeof(float));
    double *f = malloc((size_t)d->B * E * sizeof *f);
    sequence_shares(f, &r, p, d, m->c.seq_len);
    if (!(expert_parallel_faults_on(p) & EP_FAULT_SKIP_AUX_GRAD))   /* (the deliberate bug leaves it out) */
        aux_gradient(dprobs, f, d, &m->c.moe, m->saved->loss_scale);
    if (sigmoid) {
        device_copy_to_host(scores, a->router_probs, (size_t)N * E * sizeof(float));
        float *picked = malloc((size_t)k * sizeof(float)), *dpicked = malloc((size_t)k * sizeof(float));
        for (int t = 0; t < N; t++) {
            const float *s = scores + (size_t)t * E;
            const int *c = r.choice + (size_t)t * k;
            /* the balancing loss's s' = s / sum over E, then the gates' chosen s over their sum */
            normalise_backward(dprobs + (size_t)t * E, dprobs + (size_t)t * E, s, E);
            for (int j = 0; j < k; j++) picked[j] = s[c[j]];
            normalise_backward(dpicked, dgates + (size_t)t * k, picked, k);
            for (int j = 0; j < k; j++) dprobs[(size_t)t * E + c[j]] += dpicked[j];
        }
        free(picked);
        free(dpicked);
    } else
        for (int t = 0; t < N; t++)
            for (int j = 0; j < k; j++) dprobs[(size_t)t * E + r.choice[(size_t)t * k + j]] += dgates[(size_t)t * k + j];
    device_copy_to_device(m->drouter_probs, dprobs, (size_t)N * E * sizeof(float));
    moe_router_scores_backward(m->drouter_probs, m->drouter_probs, a->router_probs, N, E, sigmoid);
    /* dxn += dlogits W_r;  d W_r += dlogits^T m */
    p->linear.backward(p->linear.state, p, llama_site(m, P_ROUTER, x->l), dxn, DX_ADD, x->g->router, m->drouter_probs,
                       a->ffn_xn, x->w->router, N, D, E);
    free(f);
    free(dprobs);
    free(dgates);
    free(scores);
    route_free(&r);
}

/* ---- the tables ------------------------------------------------------------------------------ */

#define TENSOR(k, n, r, c, std) {.kind = k, .name = n, .rows = r, .cols = c, .init_std = std}
#define ACT(a, r, c, cost_) {.act = a, .rows = r, .cols = c, .cost = ACT_COST_##cost_}
#define MOE_TENSORS                                                                          \
    TENSOR(P_ROUTER, "moe.router.gate.weight", DIM_E, DIM_D, 0.02f),        /* [E, D]     */ \
    TENSOR(P_EXPERT_W1, "moe.experts.w1", DIM_EF, DIM_D, 0.02f),            /* [E*F_e, D] */ \
    TENSOR(P_EXPERT_W2, "moe.experts.w2", DIM_ED, DIM_FE, 0.02f),           /* [E*D, F_e] */ \
    TENSOR(P_EXPERT_W3, "moe.experts.w3", DIM_EF, DIM_D, 0.02f)             /* [E*F_e, D] */
#define MOE_ACTS                                                                             \
    ACT(ACT_ROUTER_PROBS, ROWS_REGION, COLS_E, CHEAP),    /* [N, E]  softmax (sigmoid) of logits */ \
    ACT(ACT_MOE_CHOICE, ROWS_REGION, COLS_K, CHEAP),      /* [N, k]       experts chosen   */ \
    ACT(ACT_MOE_GATES, ROWS_REGION, COLS_K, CHEAP),       /* [N, k]       their weights    */ \
    ACT(ACT_MOE_COUNTS, ROWS_1, COLS_COUNTS, CHEAP),      /* [2E + 1]     the counts       */ \
    ACT(ACT_MOE_X, ROWS_EXPERT, COLS_D, GEMM),            /* [R, D]       rows received    */ \
    ACT(ACT_MOE_A, ROWS_EXPERT, COLS_FE, GEMM),           /* [R, F_e]     x w1_e^T         */ \
    ACT(ACT_MOE_B, ROWS_EXPERT, COLS_FE, GEMM),           /* [R, F_e]     x w3_e^T         */ \
    ACT(ACT_MOE_G, ROWS_EXPERT, COLS_FE, CHEAP),          /* [R, F_e]     silu(a) * b      */ \
    ACT(ACT_MOE_Y, ROWS_ROUTED, COLS_D, GEMM)             /* [N*k, D]     outputs, back    */

static const layer_block moe_block = {
    .name = "moe", .n_tensors = 4, .tensor = {MOE_TENSORS}, .n_acts = 9, .act = {MOE_ACTS},
    .forward = moe_forward, .backward = moe_backward};
/* ... with the shared expert: Llama's feed-forward's tensors and activations under its names */
static const layer_block moe_block_shared = {
    .name = "moe + shared expert", .n_tensors = 7,
    .tensor = {MOE_TENSORS, TENSOR(P_W1, "moe.shared_expert.w1.weight", DIM_F, DIM_D, 0.02f),
               TENSOR(P_W2, "moe.shared_expert.w2.weight", DIM_D, DIM_F, 0.02f),
               TENSOR(P_W3, "moe.shared_expert.w3.weight", DIM_F, DIM_D, 0.02f)},
    .n_acts = 12,
    .act = {MOE_ACTS, ACT(ACT_FFN_A, ROWS_REGION, COLS_F, GEMM), ACT(ACT_FFN_B, ROWS_REGION, COLS_F, GEMM),
            ACT(ACT_FFN_G, ROWS_REGION, COLS_F, CHEAP)},
    .forward = moe_forward, .backward = moe_backward};

const llama_layer moe_layer = {
    .name = "llama, mixture of experts", .n = 4,
    .block = {&llama_attention_norm, &llama_attention, &llama_ffn_norm, &moe_block}};
const llama_layer moe_layer_shared = {
    .name = "llama, mixture of experts with a shared expert", .n = 4,
    .block = {&llama_attention_norm, &llama_attention, &llama_ffn_norm, &moe_block_shared}};
