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

/* One ring's GEMMs: a projection group's linears (projection_ops, plan.h) on the rows of one chunk.
 *   GATHER_FWD  proj_in's forward: y_i = x W_i^T on the input the ring gathers
 *   GATHER_BWD  proj_out's backward: dx = dy W, dW += dy^T x on the dy the ring gathers
 *   RS_FWD      proj_out's forward: the partial x W^T that the ring reduce-scatters
 *   RS_BWD      proj_in's backward: the partial sum_i dy_i W_i that the ring reduce-scatters (and
 *               dW_i += dy_i^T x) */
typedef enum { RING_GATHER_FWD, RING_GATHER_BWD, RING_RS_FWD, RING_RS_BWD } ring_kind;
typedef struct {
    ring_kind kind;
    const proj_linear *lin;
    int n;
    const float *x;          /* the linears' input: proj_in's x_full [N, C], proj_out's x [N, width] */
    float *dx;               /* GATHER_BWD: dx [N, width] (NULL: none)                             */
    const float *dy;         /* GATHER_BWD: dy_full [N, C], filled by the ring                     */
    int C;
} ring_gemms;

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
    projection_ops below;        /* the groups done the plain way, for a chunk too large       */
    float *buf[3];               /* [B, Ts, D] each: chunks in flight                          */
    size_t chunk_floats;
    bool gather_bf16;            /* --dtype bf16: the gather rings move bf16 (their readers are
                                  * GEMMs that round to bf16 anyway, as sp_all_gather_seq_bf16's) */
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
/* The group's linears on the rows of chunk c, one GEMM per sequence (B blocks of Ts rows), by the
 * plan's linear operator. A gather's consumers read and write the [B, T, .] tensors in place; a
 * reduce-scatter's producers write the chunk's partial, packed, into part [B, Ts, C]. Between the
 * GEMMs the transfers in flight are given a chance to move (comm_progress). */
static void chunk_gemms(atp_state *s, const llama_plan *p, const ring_gemms *g, int c, int B, int Ts, float *part,
                        comm_request **q, int nq) {
    const linear_ops *L = &p->linear;
    int C = g->C;
    for (int i = 0; i < g->n; i++) {
        const proj_linear *h = &g->lin[i];
        int w = h->width;
        for (int b = 0; b < B; b++) {
            size_t row = block_row(b, c, s->p, Ts), packed = (size_t)b * Ts;
            switch (g->kind) {
            case RING_GATHER_FWD:   /* y_i[rows] = x[rows] W_i^T */
                L->forward(L->state, p, h->site, h->y + row * w, g->x + row * C, h->W, Ts, C, w);
                break;
            case RING_GATHER_BWD:   /* dx[rows] = dy[rows] W;  dW += dy[rows]^T x[rows] */
                L->backward(L->state, p, h->site, g->dx ? g->dx + row * w : NULL, DX_SET, h->dW, g->dy + row * C,
                            g->x + row * w, h->W, Ts, w, C);
                break;
            case RING_RS_FWD:       /* part[b] = x[rows] W^T */
                L->forward(L->state, p, h->site, part + packed * C, g->x + row * w, h->W, Ts, w, C);
                break;
            case RING_RS_BWD:       /* part[b] (=, then +=) dy_i[rows] W_i;  dW_i += dy_i[rows]^T x[rows] */
                L->backward(L->state, p, h->site, part + packed * C, i == 0 ? DX_SET : DX_ADD, h->dW, h->dy + row * w,
                            g->x + row * C, h->W, Ts, C, w);
                break;
            }
            progress(q, nq);
        }
    }
}

/* ---- the rings ------------------------------------------------------------------------------- */
/* The region's gather, local [B, Ts, C] -> full [B, T, C], decomposed: p steps; at step k the
 * GEMMs of the chunk here run while the next chunk arrives from r - 1 and the one just received
 * goes on to r + 1 (p - 1 transfers of B*Ts*C elements: the bytes a ring all-gather sends). Under
 * --dtype bf16 the chunks travel as bf16 (this rank's rounded once, into the upper half of
 * buf[1]; each arrival widened into buf[2] before it joins `full`). */
static void ring_all_gather(atp_state *s, const llama_plan *p, const ring_gemms *g, float *full, const float *local,
                            int B, int Ts, int C, const char *kind) {
    int P = s->p, r = s->r;
    size_t n = (size_t)B * Ts * C;
    dtype t = s->gather_bf16 ? DTYPE_BF16 : DTYPE_F32;
    chunk_into_full(full, local, r, P, B, Ts, C);      /* this rank's own rows */
    const void *send = local;
    if (t == DTYPE_BF16) {
        uint16_t *own = (uint16_t *)s->buf[1] + n;     /* (buf[1]'s lower half receives at step 1) */
        cast_to_bf16(own, local, n);
        send = own;
    }
    for (int k = 0; k < P; k++) {
        comm_request recvd = {0}, sent = {0};
        void *recv = s->buf[k % 2];
        device_mark pre = device_mark_now(), posted = device_mark_now();
        if (k < P - 1 && k != s->skip_step) {                       /* the next chunk travels ... */
            recvd = comm_link_irecv_typed(s->links, t, recv, n, s->prev);
            sent = comm_link_isend_typed(s->links, t, send, n, s->next);
        }
        comm_request *q[] = {&recvd, &sent};
        chunk_gemms(s, p, g, async_tp_chunk(r, P, k, false), B, Ts, NULL, q, 2);   /* ... while this one computes */
        device_mark computed = device_mark_now();
        wait_counted(s, &sent);
        wait_counted(s, &recvd);
        log_event(s, kind, k, pre, posted, computed, device_mark_now());
        if (k < P - 1) {
            const float *arrived = recv;
            if (t == DTYPE_BF16) cast_from_bf16(s->buf[2], recv, n), arrived = s->buf[2];
            chunk_into_full(full, arrived, async_tp_chunk(r, P, k + 1, false), P, B, Ts, C);
            send = recv;
        }
        s->stats.steps++;
    }
    s->stats.rings++;
}

/* The group's reduce-scatter, decomposed: at step k the partial of chunk
 * async_tp_chunk(r, p, k, true) is computed, the accumulator of the same chunk from r - 1 added,
 * and the sum sent on to r + 1 while the next partial is computed; at step p - 1 the chunk is
 * r's own and its sum lands in `local` [B, Ts, C] (p - 1 transfers of B*Ts*C floats: the bytes a
 * ring reduce-scatter sends). */
static void ring_reduce_scatter(atp_state *s, const llama_plan *p, const ring_gemms *g, float *local, int B, int Ts,
                                int C, const char *kind) {
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
        chunk_gemms(s, p, g, async_tp_chunk(r, P, k, true), B, Ts, part, q, 2);
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
}

/* ---- the plan's projection groups ------------------------------------------------------------ */
/* A group whose chunk does not fit the ring's buffers (sized for the layers' [B, Ts, D]) runs the
 * plain way, by the operators below. */
static bool fits(const atp_state *s, proj_rows r) { return (size_t)r.B * r.Ts * r.C <= s->chunk_floats; }

/* proj_in forward: the entry's all-gather, each chunk's GEMMs of the group as it arrives. */
static void atp_in_forward(void *state, const llama_plan *p, const region_ops *region, float *x_full,
                           const float *x_local, const proj_linear *lin, int n, proj_rows r) {
    atp_state *s = state;
    if (!fits(s, r)) {
        s->below.in_forward(s->below.state, p, region, x_full, x_local, lin, n, r);
        return;
    }
    ring_gemms g = {.kind = RING_GATHER_FWD, .lin = lin, .n = n, .x = x_full, .C = r.C};
    ring_all_gather(s, p, &g, x_full, x_local, r.B, r.Ts, r.C, "ag-fwd");
}
/* proj_in backward: each chunk's dx summed over the group, reduce-scattered as computed. */
static void atp_in_backward(void *state, const llama_plan *p, const region_ops *region, float *dx_local,
                            float *dx_full, const float *x_full, const proj_linear *lin, int n, proj_rows r) {
    atp_state *s = state;
    if (!fits(s, r)) {
        s->below.in_backward(s->below.state, p, region, dx_local, dx_full, x_full, lin, n, r);
        return;
    }
    ring_gemms g = {.kind = RING_RS_BWD, .lin = lin, .n = n, .x = x_full, .C = r.C};
    ring_reduce_scatter(s, p, &g, dx_local, r.B, r.Ts, r.C, "rs-bwd");
}
/* proj_out forward: each chunk's partial product, reduce-scattered as computed. */
static void atp_out_forward(void *state, const llama_plan *p, const region_ops *region, float *y_local,
                            float *y_partial, const float *x, const proj_linear *lin, proj_rows r) {
    atp_state *s = state;
    if (!fits(s, r)) {
        s->below.out_forward(s->below.state, p, region, y_local, y_partial, x, lin, r);
        return;
    }
    ring_gemms g = {.kind = RING_RS_FWD, .lin = lin, .n = 1, .x = x, .C = r.C};
    ring_reduce_scatter(s, p, &g, y_local, r.B, r.Ts, r.C, "rs-fwd");
}
/* proj_out backward: the exit's all-gather of dy, each chunk's dx and dW as it arrives. */
static void atp_out_backward(void *state, const llama_plan *p, const region_ops *region, float *dx, float *dy_full,
                             const float *dy_local, const float *x, const proj_linear *lin, proj_rows r) {
    atp_state *s = state;
    if (!fits(s, r)) {
        s->below.out_backward(s->below.state, p, region, dx, dy_full, dy_local, x, lin, r);
        return;
    }
    ring_gemms g = {.kind = RING_GATHER_BWD, .lin = lin, .n = 1, .x = x, .dx = dx, .dy = dy_full, .C = r.C};
    ring_all_gather(s, p, &g, dy_full, dy_local, r.B, r.Ts, r.C, "ag-bwd");
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
    s->gather_bf16 = c->precision == DTYPE_BF16;
    /* the projection groups replaced whole: the regions stay sequence parallelism's (the
     * embedding's exit, and the re-gathers before a layer's backward, run them as they are) */
    plan_wrap(plan->proj, s->below, ((projection_ops){.state = s, .splits_rows = true, .in_forward = atp_in_forward,
                                                      .in_backward = atp_in_backward, .out_forward = atp_out_forward,
                                                      .out_backward = atp_out_backward}));
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
