/* async_tp.c: asynchronous tensor parallelism as a plan technique (async_tp.h).
 *
 * Notation: p tp ranks, r this rank, B sequences, T = p*Ts rows of each, C the channels of the
 * tensor that travels (D: the norm outputs, dy of wo/w2, the partial sums). Chunk c of a [B, T, C]
 * tensor is rows [c*Ts, (c+1)*Ts) of every sequence: B blocks of Ts rows; a chunk in flight is
 * those blocks packed, [B, Ts, C] (what rank c holds between blocks). Pointers are device pointers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "comm.h"
#include "device.h"
#include "kernels.h"
#include "files.h"
#include "log.h"
#include "model.h"
#include "async_tp.h"

/* A linear whose GEMMs wait for a ring: its arguments, as the model passed them. */
typedef struct {
    linear_site site;
    float *dst;              /* forward: y [N, n_out]; backward: dx [N, n_in] (NULL: none)      */
    dx_write how;
    float *dW;
    const float *src;        /* forward: x [N, n_in]; backward: dy [N, n_out]                   */
    const float *x;          /* backward: x [N, n_in]                                            */
    const float *W;
    int N, n_in, n_out;
} held_linear;

/* What the held linears wait for:
 *   GATHER_FWD  column-parallel forwards, on the input the pending gather brings (y = x W^T)
 *   GATHER_BWD  a row-parallel backward, on the dy the pending gather brings (dx, dW)
 *   RS_FWD      a row-parallel forward whose partial output the region's exit reduce-scatters
 *   RS_BWD      column-parallel backwards whose summed dx the region's entry reduce-scatters */
typedef enum { HOLD_NONE, HOLD_GATHER_FWD, HOLD_GATHER_BWD, HOLD_RS_FWD, HOLD_RS_BWD } hold_kind;

/* One ring step: the ring's number since the start, its kind, step k, and marks of the compute
 * stream (device.h: on the GPU the host's clock says when work was queued, not when it ran):
 * before a wait that precedes the GEMMs (a reduce-scatter's earlier send), when the GEMMs were
 * posted and computed, and when the waits after them were over. read_event turns them into
 * seconds (waiting for the device), adds them to the statistics and gives the marks back. */
typedef struct {
    long long ring;
    int step;
    const char *kind;
    device_mark pre, posted, computed, waited;
    bool read;
    double t_posted, t_computed, t_waited;   /* read: seconds on the host's clock          */
} ring_event;
#define MAX_EVENTS 4096             /* the last ones kept (a circular log) */
typedef struct {
    comm_group *tp;
    comm_links *links;
    int p, r, next, prev;
    region_ops below_region, below_vocab;
    linear_ops below_linear;
    float *buf[3];               /* [B, Ts, D] each: chunks in flight                          */
    size_t chunk_floats;
    /* a gather kept until its consumers come: enter's forward, or exit's backward */
    struct {
        bool on, backward;
        const region_ops *below;
        float *full;
        const float *local;
        int B, Ts, C;
    } gather;
    hold_kind hold;
    int n_held;
    held_linear held[3];
    int skip_step;               /* --fault async-tp-skip-chunk: the all-gathers' step to skip, -1 */
    async_tp_stats stats;
    long long n_events;
    ring_event events[MAX_EVENTS];
} atp_state;


int async_tp_chunk(int r, int p, int k, bool reduce_scatter) {
    /* BEGIN ASSIGNMENT: the chunk rank r of p computes at ring step k (all-gather: the one here, first its own; reduce-scatter: the one whose sum ends at r after p-1-k more hops) */
    int c = reduce_scatter ? r - k - 1 : r - k;
    return ((c % p) + p) % p;
    /* END ASSIGNMENT */
    return 0;
}

/* ---- the sites: which linears consume a gather, which feed a reduce-scatter ------------------- */
/* Column-parallel: their input is the region's gathered entry (forward), their dx goes to enter's
 * reduce-scatter (backward). The last of each group is the one after which the model reads the
 * outputs (rope after wv, swiglu after w3, the loss after output). */
static bool column_parallel(param_kind k) {
    return k == P_WQ || k == P_WK || k == P_WV || k == P_W1 || k == P_W3 || k == P_OUTPUT;
}
static bool last_of_group(param_kind k) { return k == P_WV || k == P_W3 || k == P_OUTPUT; }
static bool row_parallel(param_kind k) { return k == P_WO || k == P_W2; }

/* ---- chunk moves between [B, T, C] and [B, Ts, C] ------------------------------------------- */
static void chunk_into_full(float *full, const float *chunk, int c, int p, int B, int Ts, int C) {
    size_t T = (size_t)p * Ts, rows = (size_t)Ts * C;
    for (int b = 0; b < B; b++) device_copy(full + ((size_t)b * T + (size_t)c * Ts) * C, chunk + b * rows, rows * sizeof(float));
}
/* Row offset of chunk c's block b in a [B, T, .] tensor. */
static size_t block_row(int b, int c, int p, int Ts) { return (size_t)b * p * Ts + (size_t)c * Ts; }

static void wait_counted(atp_state *s, comm_request *q) {
    if (q->pending) comm_wait(q);
}

/* A ring step's times: its GEMMs (posted to computed) and its waits (pre to posted, computed to
 * waited), added to the statistics once, when read; then its marks go back. */
static void read_event(atp_state *s, ring_event *e) {
    if (e->read) return;
    double pre = device_mark_seconds(&e->pre);
    e->t_posted = device_mark_seconds(&e->posted);
    e->t_computed = device_mark_seconds(&e->computed);
    e->t_waited = device_mark_seconds(&e->waited);
    s->stats.compute_seconds += e->t_computed - e->t_posted;
    s->stats.wait_seconds += (e->t_posted - pre) + (e->t_waited - e->t_computed);
    device_mark_release(&e->pre);
    device_mark_release(&e->posted);
    device_mark_release(&e->computed);
    device_mark_release(&e->waited);
    e->read = true;
}

/* The step's marks into the circular log; the entry it replaces is read first (a step 4096 steps
 * back: the device is long past it, so reading it does not wait). */
static void log_event(atp_state *s, const char *kind, int k, device_mark pre, device_mark posted,
                      device_mark computed, device_mark waited) {
    ring_event *e = &s->events[s->n_events++ % MAX_EVENTS];
    if (s->n_events > MAX_EVENTS) read_event(s, e);
    *e = (ring_event){s->stats.rings, k, kind, pre, posted, computed, waited, false, 0, 0, 0};
}

static void read_all_events(atp_state *s) {
    for (long long i = s->n_events > MAX_EVENTS ? s->n_events - MAX_EVENTS : 0; i < s->n_events; i++)
        read_event(s, &s->events[i % MAX_EVENTS]);
}

static void progress(comm_request **q, int nq) {
    for (int i = 0; i < nq; i++)
        if (q[i] && q[i]->pending) comm_progress(q[i]);
}

/* ---- the GEMMs of one chunk ------------------------------------------------------------------ */
/* The held linears on the rows of chunk c, one GEMM per sequence (B blocks of Ts rows), by the
 * linear operator below. A gather's consumers read and write the [B, T, .] tensors in place; a
 * reduce-scatter's producers write the chunk's partial, packed, into part [B, Ts, C]. Between the
 * GEMMs the transfers in flight are given a chance to move (comm_progress). */
static void chunk_gemms(atp_state *s, const llama_plan *p, int c, int B, int Ts, float *part,
                        comm_request **q, int nq) {
    const linear_ops *L = &s->below_linear;
    for (int i = 0; i < s->n_held; i++) {
        const held_linear *h = &s->held[i];
        for (int b = 0; b < B; b++) {
            size_t row = block_row(b, c, s->p, Ts), packed = (size_t)b * Ts;
            switch (s->hold) {
            case HOLD_GATHER_FWD:   /* y[rows] = x[rows] W^T */
                L->forward(L->state, p, h->site, h->dst + row * h->n_out, h->src + row * h->n_in, h->W, Ts, h->n_in, h->n_out);
                break;
            case HOLD_GATHER_BWD:   /* dx[rows] = dy[rows] W;  dW += dy[rows]^T x[rows] */
                L->backward(L->state, p, h->site, h->dst ? h->dst + row * h->n_in : NULL, h->how, h->dW,
                            h->src + row * h->n_out, h->x + row * h->n_in, h->W, Ts, h->n_in, h->n_out);
                break;
            case HOLD_RS_FWD:       /* part[b] = x[rows] W^T */
                L->forward(L->state, p, h->site, part + packed * h->n_out, h->src + row * h->n_in, h->W, Ts, h->n_in, h->n_out);
                break;
            case HOLD_RS_BWD:       /* part[b] (=, then +=) dy_i[rows] W_i;  dW_i += dy_i[rows]^T x[rows] */
                L->backward(L->state, p, h->site, part + packed * h->n_in, i == 0 ? DX_SET : DX_ADD, h->dW,
                            h->src + row * h->n_out, h->x + row * h->n_in, h->W, Ts, h->n_in, h->n_out);
                break;
            default: break;
            }
            progress(q, nq);
        }
    }
}

/* ---- the rings ------------------------------------------------------------------------------- */
/* The pending gather, decomposed: p steps; at step k the GEMMs of the chunk here run while the
 * next chunk arrives from r - 1 and the one just received goes on to r + 1 (p - 1 transfers of
 * B*Ts*C floats: the bytes a ring all-gather sends). */
static void ring_all_gather(atp_state *s, const llama_plan *p, const char *kind) {
    int P = s->p, r = s->r, B = s->gather.B, Ts = s->gather.Ts, C = s->gather.C;
    size_t n = (size_t)B * Ts * C;
    float *full = s->gather.full;
    s->gather.on = false;
    chunk_into_full(full, s->gather.local, r, P, B, Ts, C);      /* this rank's own rows */
    const float *send = s->gather.local;
    for (int k = 0; k < P; k++) {
        comm_request recvd = {0}, sent = {0};
        float *recv = s->buf[k % 2];
        device_mark pre = device_mark_now(), posted = device_mark_now();
        if (k < P - 1 && k != s->skip_step) {                       /* the next chunk travels ... */
            recvd = comm_link_irecv(s->links, recv, n, s->prev);
            sent = comm_link_isend(s->links, send, n, s->next);
        }
        comm_request *q[] = {&recvd, &sent};
        chunk_gemms(s, p, async_tp_chunk(r, P, k, false), B, Ts, NULL, q, 2);   /* ... while this one computes */
        device_mark computed = device_mark_now();
        wait_counted(s, &sent);
        wait_counted(s, &recvd);
        log_event(s, kind, k, pre, posted, computed, device_mark_now());
        if (k < P - 1) {
            chunk_into_full(full, recv, async_tp_chunk(r, P, k + 1, false), P, B, Ts, C);
            send = recv;
        }
        s->stats.steps++;
    }
    s->stats.rings++;
    s->n_held = 0;
    s->hold = HOLD_NONE;
}

/* The held producers' reduce-scatter, decomposed: at step k the partial of chunk
 * async_tp_chunk(r, p, k, true) is computed, the accumulator of the same chunk from r - 1 added,
 * and the sum sent on to r + 1 while the next partial is computed; at step p - 1 the chunk is
 * r's own and its sum lands in `local` [B, Ts, C] (p - 1 transfers of B*Ts*C floats: the bytes a
 * ring reduce-scatter sends). */
static void ring_reduce_scatter(atp_state *s, const llama_plan *p, float *local, int B, int Ts, int C,
                                const char *kind) {
    int P = s->p, r = s->r;
    size_t n = (size_t)B * Ts * C;
    comm_request sent[2] = {{0}}, recvd = {0};
    float *acc = s->buf[2];
    for (int k = 0; k < P; k++) {
        float *part = k == P - 1 ? local : s->buf[k % 2];
        device_mark pre = device_mark_now();
        wait_counted(s, &sent[k % 2]);                 /* step k-2's send has left this buffer */
        device_mark posted = device_mark_now();
        comm_request *q[] = {&recvd, &sent[(k + 1) % 2]};
        chunk_gemms(s, p, async_tp_chunk(r, P, k, true), B, Ts, part, q, 2);
        device_mark computed = device_mark_now();
        if (k > 0) wait_counted(s, &recvd);            /* what r - 1 summed of this chunk ...  */
        device_mark waited = device_mark_now();
        if (k > 0) add_inplace(part, acc, n);          /* ... added                            */
        if (k < P - 1) {
            sent[k % 2] = comm_link_isend(s->links, part, n, s->next);
            recvd = comm_link_irecv(s->links, acc, n, s->prev);
        }
        log_event(s, kind, k, pre, posted, computed, waited);
        s->stats.steps++;
    }
    wait_counted(s, &sent[0]);
    wait_counted(s, &sent[1]);
    s->stats.rings++;
    s->n_held = 0;
    s->hold = HOLD_NONE;
}

/* Whatever is pending, done the plain way (the operators below): a call came that is not the
 * one it waited for. */
static void flush(atp_state *s, const llama_plan *p) {
    if (s->gather.on) {
        const region_ops *g = s->gather.below;
        if (s->gather.backward) g->exit_backward(g->state, p, s->gather.full, s->gather.local, s->gather.B, s->gather.Ts, s->gather.C);
        else g->enter_forward(g->state, p, s->gather.full, s->gather.local, s->gather.B, s->gather.Ts, s->gather.C);
        s->gather.on = false;
    }
    const linear_ops *L = &s->below_linear;
    for (int i = 0; i < s->n_held; i++) {
        const held_linear *h = &s->held[i];
        if (s->hold == HOLD_GATHER_FWD || s->hold == HOLD_RS_FWD)
            L->forward(L->state, p, h->site, h->dst, h->src, h->W, h->N, h->n_in, h->n_out);
        else
            L->backward(L->state, p, h->site, h->dst, h->how, h->dW, h->src, h->x, h->W, h->N, h->n_in, h->n_out);
    }
    s->n_held = 0;
    s->hold = HOLD_NONE;
}

/* ---- the plan's operators ---------------------------------------------------------------------- */
static bool fits(const atp_state *s, int B, int Ts, int C) { return (size_t)B * Ts * C <= s->chunk_floats; }

static void hold_gather(atp_state *s, const llama_plan *p, const region_ops *below, bool backward, float *full,
                        const float *local, int B, int Ts, int C) {
    flush(s, p);
    s->gather.on = true;
    s->gather.backward = backward;
    s->gather.below = below;
    s->gather.full = full;
    s->gather.local = local;
    s->gather.B = B; s->gather.Ts = Ts; s->gather.C = C;
    if (!fits(s, B, Ts, C)) flush(s, p);
}

/* The layers' region. */
static void enter_forward(void *state, const llama_plan *p, float *x_full, const float *x_local, int B, int Ts, int C) {
    atp_state *s = state;
    hold_gather(s, p, &s->below_region, false, x_full, x_local, B, Ts, C);
}
static void exit_backward(void *state, const llama_plan *p, float *dy_full, const float *dy_local, int B, int Ts, int C) {
    atp_state *s = state;
    hold_gather(s, p, &s->below_region, true, dy_full, dy_local, B, Ts, C);
}
static void reduce_scatter_or_below(atp_state *s, const llama_plan *p, hold_kind kind, float *local, float *full,
                                    int B, int Ts, int C, const char *name,
                                    void (*below)(void *, const llama_plan *, float *, float *, int, int, int),
                                    void *below_state) {
    if (s->hold == kind && s->n_held > 0 && s->held[0].dst == full && !s->gather.on && fits(s, B, Ts, C)) {
        ring_reduce_scatter(s, p, local, B, Ts, C, name);
        return;
    }
    flush(s, p);
    below(below_state, p, local, full, B, Ts, C);
}
static void exit_forward(void *state, const llama_plan *p, float *y_local, float *y_partial, int B, int Ts, int C) {
    atp_state *s = state;
    reduce_scatter_or_below(s, p, HOLD_RS_FWD, y_local, y_partial, B, Ts, C, "rs-fwd", s->below_region.exit_forward,
                            s->below_region.state);
}
static void enter_backward(void *state, const llama_plan *p, float *dx_local, float *dx_full, int B, int Ts, int C) {
    atp_state *s = state;
    reduce_scatter_or_below(s, p, HOLD_RS_BWD, dx_local, dx_full, B, Ts, C, "rs-bwd", s->below_region.enter_backward,
                            s->below_region.state);
}

/* The vocabulary's ends: the output layer's entry is decomposed like a layer's (its consumer is
 * the output linear); the embedding's exit has no GEMM to overlap and stays the one below. */
static void vocab_enter_forward(void *state, const llama_plan *p, float *x_full, const float *x_local, int B, int Ts, int C) {
    atp_state *s = state;
    hold_gather(s, p, &s->below_vocab, false, x_full, x_local, B, Ts, C);
}
static void vocab_enter_backward(void *state, const llama_plan *p, float *dx_local, float *dx_full, int B, int Ts, int C) {
    atp_state *s = state;
    reduce_scatter_or_below(s, p, HOLD_RS_BWD, dx_local, dx_full, B, Ts, C, "rs-bwd", s->below_vocab.enter_backward,
                            s->below_vocab.state);
}
static void vocab_exit_forward(void *state, const llama_plan *p, float *y_local, float *y_partial, int B, int Ts, int C) {
    atp_state *s = state;
    flush(s, p);
    s->below_vocab.exit_forward(s->below_vocab.state, p, y_local, y_partial, B, Ts, C);
}
static void vocab_exit_backward(void *state, const llama_plan *p, float *dy_full, const float *dy_local, int B, int Ts, int C) {
    atp_state *s = state;
    flush(s, p);
    s->below_vocab.exit_backward(s->below_vocab.state, p, dy_full, dy_local, B, Ts, C);
}

/* The linears. */
static void atp_linear_forward(void *state, const llama_plan *p, linear_site site, float *y, const float *x,
                               const float *W, int N, int in, int out) {
    atp_state *s = state;
    held_linear h = {site, y, DX_SET, NULL, x, NULL, W, N, in, out};
    if (s->gather.on && !s->gather.backward && x == s->gather.full && column_parallel(site.kind) &&
        (s->hold == HOLD_NONE || s->hold == HOLD_GATHER_FWD) && s->n_held < 3) {
        s->hold = HOLD_GATHER_FWD;                     /* wq, wk: wait for wv, then one ring for the three */
        s->held[s->n_held++] = h;
        if (last_of_group(site.kind)) ring_all_gather(s, p, "ag-fwd");
        return;
    }
    flush(s, p);
    if (row_parallel(site.kind)) {                     /* wo, w2: wait for the region's exit */
        s->hold = HOLD_RS_FWD;
        s->held[s->n_held++] = h;
        return;
    }
    s->below_linear.forward(s->below_linear.state, p, site, y, x, W, N, in, out);
}

static void atp_linear_backward(void *state, const llama_plan *p, linear_site site, float *dx, dx_write how,
                                float *dW, const float *dy, const float *x, const float *W, int N, int in, int out) {
    atp_state *s = state;
    held_linear h = {site, dx, how, dW, dy, x, W, N, in, out};
    if (s->gather.on && s->gather.backward && dy == s->gather.full && row_parallel(site.kind) && s->hold == HOLD_NONE) {
        s->hold = HOLD_GATHER_BWD;                     /* wo, w2 on the gathered dy */
        s->held[s->n_held++] = h;
        ring_all_gather(s, p, "ag-bwd");
        return;
    }
    if (s->hold == HOLD_RS_BWD && !s->gather.on && column_parallel(site.kind) && dx == s->held[0].dst &&
        how == DX_ADD && s->n_held < 3) {
        s->held[s->n_held++] = h;                      /* wk, wv after wq; w3 after w1 */
        return;
    }
    flush(s, p);                                       /* (the re-gather of x, if pending) */
    if (column_parallel(site.kind) && dx && how == DX_SET) {   /* wait for the region's entry */
        s->hold = HOLD_RS_BWD;
        s->held[s->n_held++] = h;
        return;
    }
    s->below_linear.backward(s->below_linear.state, p, site, dx, how, dW, dy, x, W, N, in, out);
}

/* ---- the technique ----------------------------------------------------------------------------- */
static void async_tp_free_state(void *state) {
    atp_state *s = state;
    for (long long i = s->n_events > MAX_EVENTS ? s->n_events - MAX_EVENTS : 0; i < s->n_events; i++) {
        ring_event *e = &s->events[i % MAX_EVENTS];
        device_mark_release(&e->pre); device_mark_release(&e->posted);
        device_mark_release(&e->computed); device_mark_release(&e->waited);
    }
    for (int i = 0; i < 3; i++) device_free(s->buf[i]);
    comm_links_free(s->links);
    free(s);
}
const plan_technique async_tp_technique = {"async tp", async_tp_free_state};

static atp_state *state_of(const llama_plan *plan) { return plan_state(plan, &async_tp_technique); }

async_tp_stats async_tp_get_stats(const llama_plan *plan) {
    atp_state *s = state_of(plan);
    if (s) read_all_events(s);
    return s ? s->stats : (async_tp_stats){0};
}
int async_tp_report(const llama_plan *plan, const char *out_dir, int steps) {
    atp_state *s = state_of(plan);
    if (!s || steps < 1) return 0;
    read_all_events(s);
    const async_tp_stats *t = &s->stats;
    log0("async TP (rank 0): %lld rings a step of %d steps each; their GEMMs %.2f ms, waited for transfers %.2f ms, per step\n",
         t->rings / steps, s->p, 1e3 * t->compute_seconds / steps, 1e3 * t->wait_seconds / steps);
    /* the last step's first four rings: layer 0's forward (wq wk wv, wo, w1 w3, w2) */
    long long first = t->rings - t->rings / steps;
    char path[1024];
    snprintf(path, sizeof path, "%s/async_tp_timeline.csv", out_dir);
    FILE *f = csv_open(path, "ring,kind,step,posted_ms,computed_ms,waited_ms");
    double t0 = -1;
    for (long long i = s->n_events > MAX_EVENTS ? s->n_events - MAX_EVENTS : 0; i < s->n_events; i++) {
        const ring_event *e = &s->events[i % MAX_EVENTS];
        if (e->ring < first || e->ring >= first + 4) continue;
        if (t0 < 0) t0 = e->t_posted;
        csv_row(f, "%lld,%s,%d,%.4f,%.4f,%.4f", e->ring - first, e->kind, e->step, 1e3 * (e->t_posted - t0),
                1e3 * (e->t_computed - t0), 1e3 * (e->t_waited - t0));
    }
    return f && csv_close(f) ? 1 : 0;
}

void async_tp_apply(llama_plan *plan, const llama_config *c, int B) {
    comm_group *tp = plan->groups.tp;
    if (!tp || tp->size < 2 || plan->sequence.shards < 2)
        comm_exit_usage("--async-tp decomposes sequence parallelism's all-gathers and reduce-scatters over the tp ring: "
                        "it needs tp > 1 with sequence parallelism (not --no-sp)");
    atp_state *s = plan_push(plan, &async_tp_technique, calloc(1, sizeof(atp_state)), 0);
    s->tp = tp;
    s->p = tp->size;
    s->r = tp->rank;
    s->next = (s->r + 1) % s->p;
    s->prev = (s->r + s->p - 1) % s->p;
    s->links = comm_ring_links(tp);
    int T = c->seq_len / (plan->groups.cp ? plan->groups.cp->size : 1);
    s->chunk_floats = (size_t)B * (T / s->p) * c->dim;
    for (int i = 0; i < 3; i++) s->buf[i] = device_alloc_floats(s->chunk_floats, MEM_BUFFERS);
    s->skip_step = -1;
    plan_wrap(plan->region, s->below_region, ((region_ops){s, enter_forward, enter_backward, exit_forward, exit_backward}));
    plan_wrap(plan->vocab, s->below_vocab,
              ((region_ops){s, vocab_enter_forward, vocab_enter_backward, vocab_exit_forward, vocab_exit_backward}));
    plan_wrap(plan->linear, s->below_linear, ((linear_ops){s, atp_linear_forward, atp_linear_backward}));
}

/* --fault async-tp-skip-chunk */
static const char *skip_chunk(llama_plan *p) {
    atp_state *s = state_of(p);
    if (!s) return "needs --async-tp: without it there is no ring step to skip";
    s->skip_step = s->p - 2;     /* the last transfer of every all-gather */
    return NULL;
}
const plan_fault async_tp_fault = {"async-tp-skip-chunk",
                                   "every all-gather ring skips its last chunk transfer (the GEMM reads a stale chunk)",
                                   skip_chunk};
