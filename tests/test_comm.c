/* ranks: 1 2 4 */
/* test_comm.c: every collective against what it must compute, on the world and (on 4 ranks)
 * on the sub-groups of a 2x2 mesh (dp_shard=2 x tp=2), plus the byte accounting; then the
 * exchanges (sendrecv) and the non-blocking calls against host references and against their
 * blocking twins: same result bit for bit, same counted calls and bytes, time counted only
 * while blocked in comm_wait. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "comm.h"
#include "comm_backend.h"
#include "device.h"
#include "mesh.h"
#include "test_util.h"

/* Each rank's value for element i: distinct across ranks and elements. */
static float val(int rank, int i) { return 100.0f * rank + i; }

static void check_group(comm_group *g, const char *what) {
    int p = g->size, r = g->rank;
    const int n = 6;
    float host[64], *buf = device_alloc_floats(n * p, MEM_BUFFERS), *out = device_alloc_floats(n * p, MEM_BUFFERS);

    /* all-reduce sum and max */
    for (int i = 0; i < n; i++) host[i] = val(r, i);
    device_copy_to_device(buf, host, n * 4);
    comm_all_reduce(g, buf, n, COMM_SUM);
    device_copy_to_host(host, buf, n * 4);
    for (int i = 0; i < n; i++) {
        double want = 0;
        for (int q = 0; q < p; q++) want += val(q, i);
        CHECK_CLOSE(host[i], want, 0, 0, what);
    }
    for (int i = 0; i < n; i++) host[i] = (r == p - 1 && i == 2) ? 1e6f : val(r, i);
    device_copy_to_device(buf, host, n * 4);
    comm_all_reduce(g, buf, n, COMM_MAX);
    device_copy_to_host(host, buf, n * 4);
    CHECK_CLOSE(host[2], 1e6, 0, 0, what);
    CHECK_CLOSE(host[0], val(p - 1, 0), 0, 0, what);

    /* all-gather: rank-major chunks */
    for (int i = 0; i < n; i++) host[i] = val(r, i);
    device_copy_to_device(buf, host, n * 4);
    comm_all_gather(g, buf, out, n);
    device_copy_to_host(host, out, n * p * 4);
    for (int q = 0; q < p; q++)
        for (int i = 0; i < n; i++) CHECK_CLOSE(host[q * n + i], val(q, i), 0, 0, what);

    /* reduce-scatter: rank r gets the sum over ranks of chunk r */
    for (int j = 0; j < n * p; j++) host[j] = val(r, j);
    device_copy_to_device(buf, host, n * p * 4);
    comm_reduce_scatter(g, buf, out, n);
    device_copy_to_host(host, out, n * 4);
    for (int i = 0; i < n; i++) {
        double want = 0;
        for (int q = 0; q < p; q++) want += val(q, r * n + i);
        CHECK_CLOSE(host[i], want, 0, 0, what);
    }

    /* all-to-all: rank r's chunk q lands as rank q's chunk r */
    for (int j = 0; j < n * p; j++) host[j] = val(r, j);
    device_copy_to_device(buf, host, n * p * 4);
    comm_all_to_all(g, buf, out, n);
    device_copy_to_host(host, out, n * p * 4);
    for (int q = 0; q < p; q++)
        for (int i = 0; i < n; i++) CHECK_CLOSE(host[q * n + i], val(q, r * n + i), 0, 0, what);

    /* broadcast from the last rank */
    for (int i = 0; i < n; i++) host[i] = val(r, i);
    device_copy_to_device(buf, host, n * 4);
    comm_broadcast(g, buf, n, p - 1);
    device_copy_to_host(host, buf, n * 4);
    for (int i = 0; i < n; i++) CHECK_CLOSE(host[i], val(p - 1, i), 0, 0, what);

    /* send/recv around a ring: even ranks send first so nobody deadlocks on blocking MPI */
    if (p > 1) {
        int next = (r + 1) % p, prev = (r + p - 1) % p;
        for (int i = 0; i < n; i++) host[i] = val(r, i);
        device_copy_to_device(buf, host, n * 4);
        if (r % 2 == 0) { comm_send(g, buf, n, next); comm_recv(g, out, n, prev); }
        else { comm_recv(g, out, n, prev); comm_send(g, buf, n, next); }
        device_copy_to_host(host, out, n * 4);
        for (int i = 0; i < n; i++) CHECK_CLOSE(host[i], val(prev, i), 0, 0, what);
    }
    comm_barrier(g);
    device_free(buf);
    device_free(out);
}

/* ---- exchanges and non-blocking calls ---- */

/* Dyadic values (multiples of 1/64, small): any sum of a few is exact in float whatever the
 * order, so a result can be compared bit for bit with the host and between the two twins
 * (with arbitrary floats the twins may differ in the last bit: MPI may add in another order). */
static float dy(int rank, int i) { return (float)((rank * 37 + i * 11) % 509) / 64.0f - 3.0f; }

static float *dev_from(const float *host, size_t n) {
    float *d = device_alloc_floats(n, MEM_BUFFERS);
    device_copy_to_device(d, host, n * 4);
    return d;
}

static void fetch(float *host, const float *d, size_t n) { device_copy_to_host(host, d, n * 4); }

/* Same calls, payload and wire bytes under every collective (the seconds may differ). */
static void check_same_counts(const collective_stats *a, const collective_stats *b,
                              const char *what) {
    for (int k = 0; k < COLL_NKINDS; k++)
        CHECK(a[k].calls == b[k].calls && a[k].payload_bytes == b[k].payload_bytes &&
              a[k].wire_bytes == b[k].wire_bytes,
              "%s: %s counted %lld calls %g bytes %g wire, its twin %lld calls %g bytes %g wire",
              what, collective_name((collective_kind)k), a[k].calls, a[k].payload_bytes,
              a[k].wire_bytes, b[k].calls, b[k].payload_bytes, b[k].wire_bytes);
}

/* Some device work on buffers of its own, to run between an issue and its wait. */
static void other_work(comm_group *g, float *scratch, float *scratch2, size_t n) {
    device_copy(scratch2, scratch, n * 4);
    comm_broadcast(g, scratch2, n, 0);          /* a blocking call while the others are in flight */
    device_zero(scratch, n * 4);
}

/* The four non-blocking collectives in flight at once, with other work (device copies and a
 * blocking broadcast) between issue and wait, waited for in a scrambled order; then compared
 * with the blocking twins on the same inputs and with the host. */
static void check_nonblocking_collectives(comm_group *g, const char *what) {
    enum { N = 5, MAXP = 4 };
    int p = g->size, r = g->rank;
    CHECK(p <= MAXP, "%s: run on at most %d ranks", what, MAXP);
    if (p > MAXP) return;
    float in_sum[N], in_max[N], in_ag[N], in_rs[N * MAXP], h[N * MAXP], h2[N * MAXP];
    for (int i = 0; i < N; i++) {
        in_sum[i] = dy(r, i);
        in_max[i] = dy(r, i + 7);
        in_ag[i] = dy(r, i + 3);
    }
    for (int j = 0; j < N * p; j++) in_rs[j] = dy(r, j);
    float scratch_h[N] = {1, 2, 3, 4, 5};

    /* twin[0]: blocking, twin[1]: non-blocking; each on buffers of its own */
    float *sum[2], *max[2], *ag_in[2], *ag_out[2], *rs_in[2], *rs_out[2];
    collective_stats counted[2][COLL_NKINDS];
    for (int t = 0; t < 2; t++) {
        sum[t] = dev_from(in_sum, N);
        max[t] = dev_from(in_max, N);
        ag_in[t] = dev_from(in_ag, N);
        ag_out[t] = device_alloc_floats(N * p, MEM_BUFFERS);
        rs_in[t] = dev_from(in_rs, N * p);
        rs_out[t] = device_alloc_floats(N, MEM_BUFFERS);
    }
    float *scratch = dev_from(scratch_h, N), *scratch2 = device_alloc_floats(N, MEM_BUFFERS);

    comm_reset_stats(g);
    comm_all_reduce(g, sum[0], N, COMM_SUM);
    comm_all_reduce(g, max[0], N, COMM_MAX);
    comm_all_gather(g, ag_in[0], ag_out[0], N);
    comm_reduce_scatter(g, rs_in[0], rs_out[0], N);
    other_work(g, scratch, scratch2, N);
    memcpy(counted[0], g->stats, sizeof g->stats);

    device_copy_to_device(scratch, scratch_h, N * 4);
    comm_reset_stats(g);
    comm_request req[4];
    req[0] = comm_iall_reduce(g, sum[1], N, COMM_SUM);
    req[1] = comm_iall_reduce(g, max[1], N, COMM_MAX);
    req[2] = comm_iall_gather(g, ag_in[1], ag_out[1], N);
    req[3] = comm_ireduce_scatter(g, rs_in[1], rs_out[1], N);
    /* counted at issue, as the blocking twin counts; timed only for as long as the issue blocked
     * (a connection under NCCL's lazy connection: none here, where every group is connected by
     * now), so next to nothing */
    for (int k = COLL_ALL_REDUCE; k <= COLL_REDUCE_SCATTER; k++) {
        CHECK(g->stats[k].calls == counted[0][k].calls &&
              g->stats[k].payload_bytes == counted[0][k].payload_bytes &&
              g->stats[k].wire_bytes == counted[0][k].wire_bytes,
              "%s: %s not counted at issue", what, collective_name((collective_kind)k));
        CHECK(g->stats[k].seconds < 0.01, "%s: %s timed at issue (%g s)", what,
              collective_name((collective_kind)k), g->stats[k].seconds);
    }
    other_work(g, scratch, scratch2, N);
    comm_wait(&req[3]);
    CHECK(req[3].pending == NULL, "%s: a waited request is complete", what);
    comm_wait(&req[1]);
    comm_wait(&req[3]);                     /* waiting again does nothing */
    comm_wait_all(req, 4);
    for (int i = 0; i < 4; i++) CHECK(req[i].pending == NULL, "%s: request %d complete", what, i);
    memcpy(counted[1], g->stats, sizeof g->stats);
    check_same_counts(counted[1], counted[0], what);
    for (int k = 0; k < COLL_NKINDS; k++)
        CHECK(counted[1][k].seconds >= 0, "%s: negative time", what);

    /* the other work was done alongside */
    fetch(h, scratch2, N);
    for (int i = 0; i < N; i++) CHECK_CLOSE(h[i], scratch_h[i], 0, 0, "work between issue and wait");
    fetch(h, scratch, N);
    for (int i = 0; i < N; i++) CHECK_CLOSE(h[i], 0, 0, 0, "work between issue and wait");

    /* bit for bit the blocking twin's result, and the host's */
    struct { const char *name; float **buf; int n; } res[4] = {
        {"iall_reduce sum", sum, N}, {"iall_reduce max", max, N},
        {"iall_gather", ag_out, N * p}, {"ireduce_scatter", rs_out, N}};
    for (int k = 0; k < 4; k++) {
        fetch(h, res[k].buf[0], res[k].n);
        fetch(h2, res[k].buf[1], res[k].n);
        CHECK(memcmp(h, h2, res[k].n * sizeof(float)) == 0, "%s: %s differs from its blocking twin",
              what, res[k].name);
    }
    fetch(h, sum[1], N);
    for (int i = 0; i < N; i++) {
        double want = 0;
        for (int q = 0; q < p; q++) want += dy(q, i);
        CHECK_CLOSE(h[i], want, 0, 0, "iall_reduce sum");
    }
    fetch(h, max[1], N);
    for (int i = 0; i < N; i++) {
        double want = -1e30;
        for (int q = 0; q < p; q++) want = fmax(want, dy(q, i + 7));
        CHECK_CLOSE(h[i], want, 0, 0, "iall_reduce max");
    }
    fetch(h, ag_out[1], N * p);
    for (int q = 0; q < p; q++)
        for (int i = 0; i < N; i++) CHECK_CLOSE(h[q * N + i], dy(q, i + 3), 0, 0, "iall_gather");
    fetch(h, rs_out[1], N);
    for (int i = 0; i < N; i++) {
        double want = 0;
        for (int q = 0; q < p; q++) want += dy(q, r * N + i);
        CHECK_CLOSE(h[i], want, 0, 0, "ireduce_scatter");
    }

    for (int t = 0; t < 2; t++) {
        device_free(sum[t]); device_free(max[t]); device_free(ag_in[t]); device_free(ag_out[t]);
        device_free(rs_in[t]); device_free(rs_out[t]);
    }
    device_free(scratch);
    device_free(scratch2);
}

/* Message k of rank s around the ring: rightward (to s+1) and leftward (to s-1), each with a
 * length and contents of its own, so a message matched to the wrong receive shows. The length
 * depends on the sender, so a rank's send and receive counts differ. */
enum { RING_K = 3 };
static int right_len(int s, int k) { return 2 + k + s; }
static int left_len(int s, int k) { return 6 + 2 * k + s; }
static float right_val(int s, int k, int i) { return 1000.0f * k + 10.0f * s + i; }
static float left_val(int s, int k, int i) { return -(1000.0f * k + 10.0f * s + i) - 0.5f; }

static void check_ring_received(float *const *got, int from, bool right, const char *what) {
    float h[32];
    for (int k = 0; k < RING_K; k++) {
        int n = right ? right_len(from, k) : left_len(from, k);
        fetch(h, got[k], n);
        for (int i = 0; i < n; i++)
            CHECK_CLOSE(h[i], right ? right_val(from, k, i) : left_val(from, k, i), 0, 0, what);
    }
}

/* Around a ring in both directions, 4*RING_K requests outstanding at once (sends and receives
 * posted in mixed order), against the blocking sendrecv ring shift: same data, same counts.
 * Then one isendrecv with work between issue and wait. On 1 rank the ring is the rank itself. */
static void check_ring(comm_group *g, const char *what) {
    int p = g->size, r = g->rank, next = (r + 1) % p, prev = (r + p - 1) % p;
    float h[32];
    float *rsend[RING_K], *lsend[RING_K], *rgot[2][RING_K], *lgot[2][RING_K];
    int rs[RING_K], ls[RING_K], rr[RING_K], lr[RING_K];   /* send and receive lengths */
    for (int k = 0; k < RING_K; k++) {
        rs[k] = right_len(r, k), rr[k] = right_len(prev, k);
        ls[k] = left_len(r, k), lr[k] = left_len(next, k);
        for (int i = 0; i < rs[k]; i++) h[i] = right_val(r, k, i);
        rsend[k] = dev_from(h, rs[k]);
        for (int i = 0; i < ls[k]; i++) h[i] = left_val(r, k, i);
        lsend[k] = dev_from(h, ls[k]);
        for (int t = 0; t < 2; t++) {
            rgot[t][k] = device_alloc_floats(rr[k], MEM_BUFFERS);
            lgot[t][k] = device_alloc_floats(lr[k], MEM_BUFFERS);
        }
    }
    collective_stats counted[2][COLL_NKINDS];

    /* non-blocking: everything posted before anything is waited for, over the ring's links (a
     * group per neighbour and direction; on 2 ranks both directions go to the one peer, on one
     * link each way). One rank has no links: its ring is itself, for the blocking twin only. */
    comm_request req[4 * RING_K];
    int nreq = 0;
    if (p > 1) {
        comm_links *links = comm_ring_links(g);
        comm_reset_stats(g);
        for (int k = 0; k < RING_K; k++) {
            if (k % 2 == 0) {
                req[nreq++] = comm_link_irecv(links, rgot[1][k], rr[k], prev);
                req[nreq++] = comm_link_isend(links, rsend[k], rs[k], next);
            } else {
                req[nreq++] = comm_link_isend(links, rsend[k], rs[k], next);
                req[nreq++] = comm_link_irecv(links, rgot[1][k], rr[k], prev);
            }
        }
        for (int k = 0; k < RING_K; k++) {
            req[nreq++] = comm_link_isend(links, lsend[k], ls[k], prev);
            req[nreq++] = comm_link_irecv(links, lgot[1][k], lr[k], next);
        }
        comm_wait(&req[2]);                     /* one from the middle first, then all */
        comm_wait_all(req, nreq);
        for (int i = 0; i < nreq; i++) CHECK(req[i].pending == NULL, "%s: request %d complete", what, i);
        memcpy(counted[1], g->stats, sizeof g->stats);
        check_ring_received(rgot[1], prev, true, "isend/irecv ring over links, rightward");
        check_ring_received(lgot[1], next, false, "isend/irecv ring over links, leftward");
        comm_links_free(links);
    }

    /* blocking twin: the same messages as ring shifts, every rank at once */
    comm_reset_stats(g);
    for (int k = 0; k < RING_K; k++)
        comm_sendrecv(g, rsend[k], rs[k], next, rgot[0][k], rr[k], prev);
    for (int k = 0; k < RING_K; k++)
        comm_sendrecv(g, lsend[k], ls[k], prev, lgot[0][k], lr[k], next);
    memcpy(counted[0], g->stats, sizeof g->stats);
    check_ring_received(rgot[0], prev, true, "sendrecv ring shift, rightward");
    check_ring_received(lgot[0], next, false, "sendrecv ring shift, leftward");
    if (p > 1) check_same_counts(counted[1], counted[0], what);   /* links count as their group */
    double sent = 0, received = 0, wire = p > 1 ? 1.0 : 0.0;
    for (int k = 0; k < RING_K; k++) sent += 4.0 * (rs[k] + ls[k]), received += 4.0 * (rr[k] + lr[k]);
    const collective_stats *snd = &counted[0][COLL_SEND], *rcv = &counted[0][COLL_RECV];
    CHECK(snd->calls == 2 * RING_K && snd->payload_bytes == sent && snd->wire_bytes == wire * sent,
          "%s: sends counted %lld calls %g bytes %g wire", what, snd->calls, snd->payload_bytes,
          snd->wire_bytes);
    CHECK(rcv->calls == 2 * RING_K && rcv->payload_bytes == received && rcv->wire_bytes == 0,
          "%s: receives counted %lld calls %g bytes", what, rcv->calls, rcv->payload_bytes);

    /* isendrecv: one ring step with work between issue and wait (context parallelism's shape) */
    float scratch_h[4] = {7, 8, 9, 10};
    float *scratch = dev_from(scratch_h, 4), *scratch2 = device_alloc_floats(4, MEM_BUFFERS);
    comm_reset_stats(g);
    device_zero(lgot[1][2], lr[2] * 4);
    comm_request x = comm_isendrecv(g, lsend[2], ls[2], prev, lgot[1][2], lr[2], next);
    CHECK(g->stats[COLL_SEND].calls == 1 && g->stats[COLL_RECV].calls == 1 &&
          g->stats[COLL_SEND].payload_bytes == 4.0 * ls[2] &&
          g->stats[COLL_RECV].payload_bytes == 4.0 * lr[2],
          "%s: isendrecv counted at issue as one send and one recv", what);
    other_work(g, scratch, scratch2, 4);
    comm_wait(&x);
    fetch(h, lgot[1][2], lr[2]);
    for (int i = 0; i < lr[2]; i++) CHECK_CLOSE(h[i], left_val(next, 2, i), 0, 0, "isendrecv");
    fetch(h, scratch2, 4);
    for (int i = 0; i < 4; i++) CHECK_CLOSE(h[i], scratch_h[i], 0, 0, "work beside isendrecv");

    for (int k = 0; k < RING_K; k++) {
        device_free(rsend[k]); device_free(lsend[k]);
        for (int t = 0; t < 2; t++) { device_free(rgot[t][k]); device_free(lgot[t][k]); }
    }
    device_free(scratch);
    device_free(scratch2);
}

/* The seconds of a non-blocking call are the time blocked in comm_wait: counted when a late
 * rank keeps the others waiting, not counted when the wait comes after the work that hid it. */
static void check_wait_time(comm_group *g) {
    const double nap = 0.2;                      /* seconds */
    float one = 1.0f, *d = dev_from(&one, 1);
    const collective_stats *s = &g->stats[COLL_ALL_REDUCE];

    /* hidden: every rank issues, works (sleeps) for `nap`, then waits */
    comm_barrier(g);
    comm_reset_stats(g);
    double total0 = comm_total_seconds();
    comm_request q = comm_iall_reduce(g, d, 1, COMM_SUM);
    usleep((useconds_t)(nap * 1e6));
    comm_wait(&q);
    CHECK(s->seconds < nap / 2, "hidden all-reduce counted %.3f s exposed", s->seconds);
    CHECK(fabs(comm_total_seconds() - total0 - s->seconds) < 1e-9, "comm_total_seconds sums it");

    /* exposed: rank 0 is late by `nap`, the others wait for it */
    comm_barrier(g);
    comm_reset_stats(g);
    if (g->rank == 0) usleep((useconds_t)(nap * 1e6));
    q = comm_iall_reduce(g, d, 1, COMM_SUM);
    comm_wait(&q);
    if (g->size > 1 && g->rank != 0)
        CHECK(s->seconds > nap / 2, "waiting for a late rank counted only %.3f s", s->seconds);
    /* comm_wait_split: that wait was for the late rank, not for the data */
    double data, peer;
    comm_wait_split(-1, &data, &peer);
    if (g->size > 1 && g->rank != 0)
        CHECK(peer > nap / 2 && data < nap / 2, "waiting for a late rank split as %.3f s data + %.3f s peer", data, peer);
    CHECK(fabs(data + peer - s->seconds) < 1e-6, "the split (%.6f + %.6f s) is not the time waited (%.6f s)",
          data, peer, s->seconds);
    double data_ag, peer_ag;
    comm_wait_split(COLL_ALL_GATHER, &data_ag, &peer_ag);   /* no all-gather was logged */
    CHECK(data_ag == 0 && peer_ag == 0, "the all-gathers' split is %g + %g s, want 0", data_ag, peer_ag);
    /* the same with a blocking collective */
    comm_barrier(g);
    comm_reset_stats(g);
    if (g->rank == 0) usleep((useconds_t)(nap * 1e6));
    comm_all_reduce(g, d, 1, COMM_SUM);
    comm_wait_split(-1, &data, &peer);
    if (g->size > 1 && g->rank != 0)
        CHECK(peer > nap / 2 && data < nap / 2, "a blocking call's wait for a late rank split as %.3f s data + %.3f s peer",
              data, peer);
    if (g->size == 1) CHECK(data == 0 && peer == 0, "one rank: nothing to split, got %g + %g s", data, peer);
    float got;
    fetch(&got, d, 1);
    CHECK_CLOSE(got, (double)g->size * g->size * g->size, 0, 0, "three all-reduces of ones");
    device_free(d);

    comm_request none = {0};                     /* a zeroed request is complete */
    comm_wait(&none);
    comm_reset_stats(g);
}

/* comm_progress between issue and wait (what chapter 04 calls after every GEMM): the result
 * is the same, the counts are the all-gather's once, and a finished request may be progressed
 * again and waited on. */
static void check_progress(comm_group *g) {
    enum { n = 1000 };
    float *mine = malloc(n * sizeof(float)), *all = malloc((size_t)n * g->size * sizeof(float));
    for (int i = 0; i < n; i++) mine[i] = val(g->rank, i);
    float *d_mine = dev_from(mine, n), *d_all = device_alloc_floats((size_t)n * g->size, MEM_BUFFERS);
    collective_stats before = g->stats[COLL_ALL_GATHER];
    comm_request r = comm_iall_gather(g, d_mine, d_all, n);
    for (int k = 0; k < 50; k++) comm_progress(&r);
    comm_wait(&r);
    comm_progress(&r);   /* a waited request: nothing left, nothing happens */
    fetch(all, d_all, (size_t)n * g->size);
    int wrong = 0;
    for (int q = 0; q < g->size; q++)
        for (int i = 0; i < n; i++) wrong += all[(size_t)q * n + i] != val(q, i);
    CHECK(wrong == 0, "progressed all-gather: %d wrong elements", wrong);
    const collective_stats *after = &g->stats[COLL_ALL_GATHER];
    CHECK(after->calls == before.calls + 1 && after->payload_bytes == before.payload_bytes + 4.0 * n * g->size,
          "progressed all-gather counted once: %lld calls", after->calls - before.calls);
    device_free(d_mine); device_free(d_all);
    free(mine); free(all);
}

/* Host-side agreement while collectives are still in flight on the same group: the emulation
 * (COMM=nccl-sim) starts a queued collective late, and its MPI calls must not meet the host's
 * (it runs them on a communicator of its own, as NCCL does). Rank 0 dawdles so the ranks differ. */
static void check_host_beside_queued(comm_group *g) {
    float a_h[3] = {1, 2, 3}, b_h[3] = {10, 20, 30}, got[3];
    float *a = dev_from(a_h, 3), *b = dev_from(b_h, 3);
    comm_request q[2] = {comm_iall_reduce(g, a, 3, COMM_SUM), comm_iall_reduce(g, b, 3, COMM_SUM)};
    if (g->rank == 0) usleep(20000);
    double s = comm_host_sum(g, g->rank + 1.0);
    comm_wait_all(q, 2);
    CHECK(s == g->size * (g->size + 1) / 2.0, "host sum beside queued collectives: %g", s);
    fetch(got, a, 3);
    for (int i = 0; i < 3; i++) CHECK_CLOSE(got[i], a_h[i] * g->size, 0, 0, "first queued all-reduce");
    fetch(got, b, 3);
    for (int i = 0; i < 3; i++) CHECK_CLOSE(got[i], b_h[i] * g->size, 0, 0, "second queued all-reduce");
    device_free(a); device_free(b);
}

/* The byte all-gather: rank-major bytes, counted as an all-gather of size * nbytes bytes. */
static void check_byte_gather(comm_group *g) {
    enum { n = 13 };   /* an odd count: bytes, not floats */
    unsigned char mine[n], *all = malloc((size_t)n * g->size);
    for (int i = 0; i < n; i++) mine[i] = (unsigned char)(g->rank * 31 + i);
    unsigned char *d_mine = device_alloc(n, MEM_BUFFERS), *d_all = device_alloc((size_t)n * g->size, MEM_BUFFERS);
    device_copy_to_device(d_mine, mine, n);
    collective_stats before = g->stats[COLL_ALL_GATHER];
    comm_request r = comm_iall_gather_bytes(g, d_mine, d_all, n);
    comm_wait(&r);
    device_copy_to_host(all, d_all, (size_t)n * g->size);
    int wrong = 0;
    for (int q = 0; q < g->size; q++)
        for (int i = 0; i < n; i++) wrong += all[(size_t)q * n + i] != (unsigned char)(q * 31 + i);
    CHECK(wrong == 0, "byte all-gather: %d wrong bytes", wrong);
    const collective_stats *after = &g->stats[COLL_ALL_GATHER];
    CHECK(after->calls == before.calls + 1 && after->payload_bytes == before.payload_bytes + (double)n * g->size,
          "byte all-gather counted as %g bytes, want %d", after->payload_bytes - before.payload_bytes, n * g->size);
    device_free(d_mine); device_free(d_all);
    free(all);
}

/* COMM's answers (comm_choose): the default per build and node, and every refusal, one line
 * naming the value and what is valid. The node's devices are given by name, as device_identity
 * gives them (PCI bus ids on the CUDA build, "host" on the CPU build): four ranks on four GPUs
 * that each see only their own (per-rank CUDA_VISIBLE_DEVICES) are four names, not one GPU. */
static void check_choose(void) {
    char msg[512];
    static const char *const host4[] = {"host", "host", "host", "host"};
    static const char *const own4[] = {"0000:1B:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0"};
    static const char *const one2[] = {"0000:1B:00.0", "0000:1B:00.0"};
    static const char *const pairs4[] = {"0000:1B:00.0", "0000:43:00.0", "0000:1B:00.0", "0000:43:00.0"};
    struct { const char *want; bool nccl; const char *const *names; int ranks; const char *got, *says; } cases[] = {
        {NULL, false, host4, 2, "mpi", NULL},            /* CPU build: MPI                             */
        {"", false, host4, 4, "mpi", NULL},
        {NULL, true, own4, 4, "nccl", NULL},             /* a GPU per rank, by bus id: NCCL            */
        {NULL, true, own4, 1, "nccl", NULL},
        {NULL, true, one2, 2, "mpi", NULL},              /* one GPU, two ranks: MPI, not a failure     */
        {NULL, true, pairs4, 4, "mpi", NULL},            /* 4 ranks on 2 GPUs                          */
        {"nccl-sim", false, host4, 4, "nccl-sim", NULL},
        {"mpi", true, one2, 2, "mpi", NULL},             /* ranks share the one GPU                    */
        {"nccl", true, own4, 4, "nccl", NULL},
        {"nccl", true, one2, 2, NULL, "COMM=nccl: ranks 0 and 1 of this node share the GPU 0000:1B:00.0 (2 ranks "
                                      "on 1 GPU); NCCL needs one GPU per rank"},
        {"nccl", true, pairs4, 4, NULL, "COMM=nccl: ranks 0 and 2 of this node share the GPU 0000:1B:00.0 (4 "
                                        "ranks on 2 GPUs); NCCL needs one GPU per rank"},
        {"nccl", false, host4, 1, NULL, "COMM=nccl needs the CUDA build (BACKEND=cuda)"},
        {"gloo", true, own4, 1, NULL, "COMM=gloo is not valid: use COMM=mpi, COMM=nccl (CUDA build) or COMM=nccl-sim"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        msg[0] = '\0';
        const char *got = comm_choose(cases[i].want, cases[i].nccl, cases[i].names, cases[i].ranks, msg, sizeof msg);
        CHECK(got == cases[i].got || (got && cases[i].got && strcmp(got, cases[i].got) == 0),
              "COMM=%s, nccl %d, %d ranks (case %zu): chose %s, want %s", cases[i].want ? cases[i].want : "(unset)",
              cases[i].nccl, cases[i].ranks, i, got ? got : "(refused)", cases[i].got ? cases[i].got : "(refused)");
        if (cases[i].says)
            CHECK(strncmp(msg, cases[i].says, strlen(cases[i].says)) == 0 && !strchr(msg, '\n'),
                  "refusal says \"%s\"", msg);
        if (!cases[i].says) CHECK(got != NULL, "refused: %s", msg);
    }
    CHECK(strstr((comm_choose("nccl", true, one2, 2, msg, sizeof msg), msg), "COMM=mpi") != NULL,
          "the shared-GPU refusal suggests COMM=mpi: %s", msg);
    /* the memory per device: each rank's share is its device's memory over the ranks on it */
    CHECK(comm_count_sharers(own4, 4, 2) == 1, "4 ranks on 4 GPUs: %d on rank 2's", comm_count_sharers(own4, 4, 2));
    CHECK(comm_count_sharers(one2, 2, 1) == 2, "2 ranks on 1 GPU: %d", comm_count_sharers(one2, 2, 1));
    CHECK(comm_count_sharers(pairs4, 4, 3) == 2, "4 ranks on 2 GPUs: %d on rank 3's", comm_count_sharers(pairs4, 4, 3));
    CHECK(comm_count_sharers(host4, 4, 0) == 4, "the CPU build: the host, shared by all 4: %d", comm_count_sharers(host4, 4, 0));
    /* this run's own count: every rank of a CPU build's node shares the host */
    CHECK(comm_device_sharers() >= 1 && comm_device_sharers() <= comm_world()->size,
          "comm_device_sharers %d on %d ranks", comm_device_sharers(), comm_world()->size);
}

/* NCCL's buffers (comm.h): the formula against NCCL 2.28's default sizes worked out by hand, and
 * the count of this rank's communicators against the groups this test made. */
static void check_library_memory(comm_group *world) {
    double ll = 8.0 * 512 * 8 * 16, ll128 = 120.0 * 640 * 8 * 8, simple = 4194304;
    CHECK_CLOSE(ll, 524288, 0, 0, "LL buffer 512 KiB");
    CHECK_CLOSE(comm_nccl_memory_formula(1, 0, 32, 2), 32 * 2 * (ll + ll128 + simple), 0, 0, "one group, 32 channels");
    CHECK_CLOSE(comm_nccl_memory_formula(1, 0, 32, 2), 616562688.0, 0, 0, "one group: 588 MiB");
    CHECK_CLOSE(comm_nccl_memory_formula(0, 3, 32, 2), 3 * 2 * 8 * 524288.0, 0, 0, "3 p2p connections, 2 channels");
    CHECK_CLOSE(comm_nccl_memory_formula(2, 5, 8, 1), 2 * 8 * 2 * (ll + ll128 + simple) + 5 * 4194304.0, 0, 0,
                "2 groups x 8 channels + 5 connections x 1 channel");
    bool held = true;
    comm_library_memory m = comm_library_memory_now(&held);
    const char *c = getenv("COMM");
    CHECK(held == (c && strcmp(c, "nccl-sim") == 0), "NCCL's buffers held under COMM=%s: %d", c ? c : "(unset)", held);
    /* so far: the world (and, on 4 ranks, the 2x2 mesh's groups and the rings' links) */
    int p = world->size;
    CHECK(m.groups >= (p > 1) && m.p2p_connections >= 2 * (p - 1) * (p > 1), "%d groups, %d p2p connections on %d ranks",
          m.groups, m.p2p_connections, p);
    CHECK_CLOSE(m.bytes, comm_nccl_memory_formula(m.groups, m.p2p_connections, m.channels, m.p2p_channels), 0, 0,
                "the count's bytes are the formula's");
    comm_group *pair = comm_split(world, world->rank / 2, world->rank, "pairs");
    comm_links *links = comm_ring_links(pair);
    comm_library_memory after = comm_library_memory_now(NULL);
    int pair_links = pair->size == 2 ? 1 + 1 : 0;   /* a pair's ring: a link each way, one each of ours */
    CHECK(after.groups == m.groups + (pair->size > 1) && after.links == m.links + pair_links &&
          after.p2p_connections == m.p2p_connections + pair_links + 2 * (pair->size - 1),
          "after a pair and its links: %d groups %d links %d connections (before %d %d %d)", after.groups, after.links,
          after.p2p_connections, m.groups, m.links, m.p2p_connections);
    comm_links_free(links);
}

/* bf16 (dtype.h): the rounding to nearest even, and the typed collectives on 16-bit elements: a
 * sum and a max (MPI: fp32-accumulating user-defined operations), an all-gather, a
 * reduce-scatter, a non-blocking all-gather and the ring's link transfers, each checked
 * element by element, and the bytes counted at 2 an element. The values are small integers, whose
 * partial sums bf16 holds exactly, so the result does not depend on the order of the additions. */
static void check_bf16(comm_group *g, const char *what) {
    CHECK(bf16_from_float(1.0f + 0x1p-8f) == bf16_from_float(1.0f), "1 + 2^-8 (half an ulp, a tie) rounds to 1");
    CHECK(bf16_to_float(bf16_from_float(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f, "1 + 3 2^-8 ties to the even 1 + 2^-6");
    CHECK(bf16_to_float(bf16_from_float(-2.5f)) == -2.5f, "-2.5 is exact");
    int p = g->size, r = g->rank;
    enum { N = 5 };
    uint16_t host[N * 8], *buf = device_alloc(N * 8 * 2, MEM_BUFFERS), *out = device_alloc(N * 8 * 2, MEM_BUFFERS);
    comm_reset_stats(g);
    for (int i = 0; i < N; i++) host[i] = bf16_from_float((float)(r + i));
    device_copy_to_device(buf, host, N * 2);
    comm_all_reduce_typed(g, DTYPE_BF16, buf, N, COMM_SUM);
    device_copy_to_host(host, buf, N * 2);
    for (int i = 0; i < N; i++)
        CHECK(bf16_to_float(host[i]) == (float)(p * (p - 1) / 2 + p * i), "%s: bf16 sum [%d] = %g", what, i,
              bf16_to_float(host[i]));
    for (int i = 0; i < N; i++) host[i] = bf16_from_float((float)(r * i));
    device_copy_to_device(buf, host, N * 2);
    comm_all_reduce_typed(g, DTYPE_BF16, buf, N, COMM_MAX);
    device_copy_to_host(host, buf, N * 2);
    for (int i = 0; i < N; i++)
        CHECK(bf16_to_float(host[i]) == (float)((p - 1) * i), "%s: bf16 max [%d] = %g", what, i, bf16_to_float(host[i]));
    for (int i = 0; i < N; i++) host[i] = bf16_from_float((float)(10 * r + i));
    device_copy_to_device(buf, host, N * 2);
    comm_all_gather_typed(g, DTYPE_BF16, buf, out, N);
    device_copy_to_host(host, out, (size_t)N * p * 2);
    for (int q = 0; q < p; q++)
        for (int i = 0; i < N; i++)
            CHECK(bf16_to_float(host[q * N + i]) == (float)(10 * q + i), "%s: bf16 all-gather [%d][%d]", what, q, i);
    comm_request req = comm_iall_gather_typed(g, DTYPE_BF16, buf, out, N);
    comm_wait(&req);
    device_copy_to_host(host, out, (size_t)N * p * 2);
    CHECK(bf16_to_float(host[(p - 1) * N]) == (float)(10 * (p - 1)), "%s: bf16 non-blocking all-gather", what);
    for (int q = 0; q < p; q++)
        for (int i = 0; i < N; i++) host[q * N + i] = bf16_from_float((float)(q + r));
    device_copy_to_device(buf, host, (size_t)N * p * 2);
    comm_reduce_scatter_typed(g, DTYPE_BF16, buf, out, N);
    device_copy_to_host(host, out, N * 2);
    for (int i = 0; i < N; i++)
        CHECK(bf16_to_float(host[i]) == (float)(p * r + p * (p - 1) / 2), "%s: bf16 reduce-scatter [%d]", what, i);
    const collective_stats *st = g->stats;
    CHECK(st[COLL_ALL_REDUCE].payload_bytes == 2.0 * 2 * N, "%s: bf16 all-reduce bytes %g, not 2 per element", what,
          st[COLL_ALL_REDUCE].payload_bytes);
    CHECK(st[COLL_ALL_GATHER].payload_bytes == 2.0 * 2 * N * p && st[COLL_REDUCE_SCATTER].payload_bytes == 2.0 * N * p,
          "%s: bf16 gather / scatter bytes %g / %g", what, st[COLL_ALL_GATHER].payload_bytes,
          st[COLL_REDUCE_SCATTER].payload_bytes);
    if (p > 1) {   /* one step of a ring over links: send to r + 1, receive from r - 1 */
        comm_links *links = comm_ring_links(g);
        for (int i = 0; i < N; i++) host[i] = bf16_from_float((float)(r * 3 + i));
        device_copy_to_device(buf, host, N * 2);
        comm_request rq = comm_link_irecv_typed(links, DTYPE_BF16, out, N, (r + p - 1) % p);
        comm_request sq = comm_link_isend_typed(links, DTYPE_BF16, buf, N, (r + 1) % p);
        comm_wait(&sq);
        comm_wait(&rq);
        device_copy_to_host(host, out, N * 2);
        for (int i = 0; i < N; i++)
            CHECK(bf16_to_float(host[i]) == (float)(((r + p - 1) % p) * 3 + i), "%s: bf16 link transfer [%d]", what, i);
        comm_links_free(links);
    }
    comm_reset_stats(g);
    device_free(buf);
    device_free(out);
}

/* The all-to-all with counts: rank q sends (q + j) % 3 elements to rank j (so some chunks are
 * empty, and the sizes differ both ways), element i of it worth val(q, 10 j + i). Each rank's
 * receive lands from rank 0, 1, ... in order; bytes counted as its whole send buffer, the wire
 * all but the chunk it keeps. */
static size_t v_count(int from, int to) { return (size_t)((from + to) % 3); }
static void check_all_to_all_v(comm_group *g, const char *what) {
    int p = g->size, r = g->rank;
    size_t sc[p], rc[p], sent = 0, got = 0;
    for (int j = 0; j < p; j++) {
        sc[j] = v_count(r, j), rc[j] = v_count(j, r);
        sent += sc[j], got += rc[j];
    }
    float host[64];
    size_t k = 0;
    for (int j = 0; j < p; j++)
        for (size_t i = 0; i < sc[j]; i++) host[k++] = val(r, 10 * j + (int)i);
    float *send = device_alloc_floats(sent + 1, MEM_BUFFERS), *recv = device_alloc_floats(got + 1, MEM_BUFFERS);
    device_copy_to_device(send, host, sent * 4);
    comm_reset_stats(g);
    comm_all_to_all_v(g, send, sc, recv, rc);
    device_copy_to_host(host, recv, got * 4);
    k = 0;
    for (int q = 0; q < p; q++)
        for (size_t i = 0; i < rc[q]; i++, k++) CHECK_CLOSE(host[k], val(q, 10 * r + (int)i), 0, 0, what);
    const collective_stats *aa = &g->stats[COLL_ALL_TO_ALL];
    CHECK(aa->calls == 1 && aa->payload_bytes == 4.0 * sent && aa->wire_bytes == 4.0 * (sent - sc[r]),
          "%s: all-to-all with counts counted %lld calls, %g bytes, %g on the wire; want 1, %zu, %zu", what, aa->calls,
          aa->payload_bytes, aa->wire_bytes, 4 * sent, 4 * (sent - sc[r]));
    comm_reset_stats(g);
    device_free(send);
    device_free(recv);
}

int main(int argc, char **argv) {
    comm_group *world = comm_init(&argc, &argv);
    check_choose();
    comm_log_waits(true);   /* for check_wait_time's comm_wait_split */
    check_group(world, "world");

    /* accounting: 2 all-reduces of 6 floats, 1 all-gather of 6*p, 1 reduce-scatter of 6*p */
    const collective_stats *ar = &world->stats[COLL_ALL_REDUCE], *ag = &world->stats[COLL_ALL_GATHER];
    CHECK(ar->calls == 2 && ar->payload_bytes == 2 * 6 * 4, "all-reduce counted %lld calls %g bytes", ar->calls, ar->payload_bytes);
    CHECK(ag->calls == 1 && ag->payload_bytes == 6 * 4 * world->size, "all-gather counted %lld calls %g bytes", ag->calls, ag->payload_bytes);
    double p = world->size;
    CHECK_CLOSE(ar->wire_bytes, 2 * (p - 1) / p * 48, 1e-9, 0, "all-reduce ring bytes");
    const collective_stats *aa = &world->stats[COLL_ALL_TO_ALL];
    CHECK(aa->calls == 1 && aa->payload_bytes == 6 * 4 * p, "all-to-all counted %lld calls %g bytes", aa->calls, aa->payload_bytes);
    CHECK_CLOSE(aa->wire_bytes, (p - 1) / p * 6 * 4 * p, 1e-9, 0, "all-to-all bytes on the wire: all but its own chunk");
    comm_reset_stats(world);
    CHECK(world->stats[COLL_ALL_REDUCE].calls == 0, "reset");

    check_nonblocking_collectives(world, "world, non-blocking");
    check_ring(world, "world ring");
    check_wait_time(world);
    check_progress(world);
    check_byte_gather(world);
    check_host_beside_queued(world);
    check_library_memory(world);
    check_bf16(world, "world");
    check_all_to_all_v(world, "world, all-to-all with counts");

    if (world->size == 4) {
        /* 2x2 mesh: tp groups {0,1} {2,3}; dp_shard groups {0,2} {1,3} */
        device_mesh *m = mesh_create((mesh_shape){.dp_shard = 2, .tp = 2}, NULL);
        comm_group *tp = m->group[MESH_TP], *dp = m->group[MESH_DP_SHARD];
        CHECK(tp->size == 2 && dp->size == 2, "group sizes %d %d", tp->size, dp->size);
        CHECK(tp->rank == world->rank % 2 && dp->rank == world->rank / 2, "ranks in groups");
        check_group(tp, "tp group");
        check_group(dp, "dp_shard group");
        check_nonblocking_collectives(tp, "tp group, non-blocking");
        check_nonblocking_collectives(dp, "dp_shard group, non-blocking");
        check_ring(tp, "tp ring");
        check_ring(dp, "dp_shard ring");
        check_all_to_all_v(dp, "dp_shard group, all-to-all with counts");
        /* the tp group of rank r holds r and r^1: sum of world ranks tells which */
        float x = (float)world->rank, *d = device_alloc_floats(1, MEM_BUFFERS);
        device_copy_to_device(d, &x, 4);
        comm_all_reduce(tp, d, 1, COMM_SUM);
        device_copy_to_host(&x, d, 4);
        CHECK_CLOSE(x, world->rank < 2 ? 1 : 5, 0, 0, "tp group membership");
        x = (float)world->rank;
        device_copy_to_device(d, &x, 4);
        comm_all_reduce(dp, d, 1, COMM_SUM);
        device_copy_to_host(&x, d, 4);
        CHECK_CLOSE(x, world->rank % 2 == 0 ? 2 : 4, 0, 0, "dp_shard group membership");
        int dims[2] = {MESH_DP_SHARD, MESH_TP};
        comm_group *both = mesh_group_over(m, dims, 2, "dp_shard x tp");
        CHECK(both->size == 4 && both->rank == world->rank, "2-D group");
        device_free(d);
    }
    int bad = tu_finish("test_comm");
    bad = (int)comm_host_max(world, bad);   /* every rank exits alike */
    comm_finalize();
    return bad;
}
