/* comm.c: process groups, statistics and timing, shared by both backends.
 *
 * MPI is always there: it launches the ranks, gives each its rank and local rank, and splits
 * groups. The data of the lesson's collectives moves through the backend (comm_cpu.c: MPI,
 * comm_cuda.cu: NCCL); every call passes through here first to be counted and timed.
 */
#include <mpi.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "comm_backend.h"
#include "device.h"
#include "guard.h"
#include "log.h"

#define MAX_GROUPS 64
static comm_group *groups[MAX_GROUPS];
static int n_groups = 0;
static comm_group *world = NULL;
static int local_rank = 0;

static MPI_Comm mpi_of(comm_group *g) { return *(MPI_Comm *)g->mpi_comm; }

static comm_group *group_new(MPI_Comm c, const char *name) {
    comm_group *g = calloc(1, sizeof *g);
    MPI_Comm *pc = malloc(sizeof *pc);
    *pc = c;
    g->mpi_comm = pc;
    MPI_Comm_rank(c, &g->rank);
    MPI_Comm_size(c, &g->size);
    snprintf(g->name, sizeof g->name, "%s", name);
    if (n_groups < MAX_GROUPS) groups[n_groups++] = g;
    return g;
}

comm_group *comm_init(int *argc, char ***argv) {
    MPI_Init(argc, argv);
    guard_init(*argc, *argv);   /* same arguments on every rank; the watchdog (guard.h) */
    /* Ranks on the same node share memory; their order there is this rank's GPU index. */
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_free(&node);
    world = group_new(MPI_COMM_WORLD, "world");
    log_set_rank(world->rank);
    device_init(local_rank);
    comm_backend_init(world);
    return world;
}

void comm_finalize(void) {
    comm_backend_finalize();
    device_shutdown();
    MPI_Finalize();
}

comm_group *comm_world(void) { return world; }
int comm_local_rank(void) { return local_rank; }

comm_group *comm_split(comm_group *parent, int color, int key, const char *name) {
    MPI_Comm c;
    MPI_Comm_split(mpi_of(parent), color, key, &c);
    comm_group *g = group_new(c, name);
    comm_backend_split(parent, g, color, key);
    return g;
}

/* ---- counting ---- */

static double ring_factor(collective_kind k, int p) {
    if (p <= 1) return 0.0;
    switch (k) {
    case COLL_ALL_REDUCE: return 2.0 * (p - 1) / p;
    case COLL_ALL_GATHER:
    case COLL_REDUCE_SCATTER:
    case COLL_ALL_TO_ALL: return (double)(p - 1) / p;
    case COLL_BROADCAST:
    case COLL_SEND: return 1.0;
    default: return 0.0;
    }
}

static bool counting = true;   /* comm_set_counting */
void comm_set_counting(bool on) { counting = on; }
static bool logging_waits = false;   /* comm_log_waits */
void comm_log_waits(bool on) { logging_waits = on; }

/* ---- the timelog of comm_wait_split: per group, one entry per counted collective ---- */

struct comm_timelog {
    double *issue, *wait0, *wait1;   /* when issued; when this rank started and stopped waiting */
    collective_kind *kind;
    int n, cap;
};

/* A new entry for a collective issued at `issue` on g; returns its index + 1 (0: not logged). */
static int log_issue(comm_group *g, collective_kind k, double issue) {
    if (!logging_waits || !counting || g->size < 2) return 0;
    if (k == COLL_SEND || k == COLL_RECV) return 0;   /* p2p: no group-wide issue */
    struct comm_timelog *t = g->timelog;
    if (!t) t = g->timelog = calloc(1, sizeof *t);
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->issue = realloc(t->issue, t->cap * sizeof(double));
        t->wait0 = realloc(t->wait0, t->cap * sizeof(double));
        t->wait1 = realloc(t->wait1, t->cap * sizeof(double));
        t->kind = realloc(t->kind, t->cap * sizeof(collective_kind));
        if (!t->issue || !t->wait0 || !t->wait1 || !t->kind) { fprintf(stderr, "comm: out of host memory\n"); exit(1); }
    }
    t->issue[t->n] = issue;
    t->kind[t->n] = k;
    t->wait0[t->n] = t->wait1[t->n] = issue;   /* not waited yet: nothing blocked */
    return ++t->n;
}
static void log_wait(comm_group *g, int logged, double wait0, double wait1) {
    if (logged > 0 && g->timelog && logged <= g->timelog->n) {
        g->timelog->wait0[logged - 1] = wait0;
        g->timelog->wait1[logged - 1] = wait1;
    }
}

static void count(comm_group *g, collective_kind k, double payload_bytes, double seconds) {
    if (!counting) return;
    collective_stats *s = &g->stats[k];
    s->calls++;
    s->payload_bytes += payload_bytes;
    s->wire_bytes += ring_factor(k, g->size) * payload_bytes;
    s->seconds += seconds;
}

/* Time a collective end to end: on the GPU that means waiting for the stream, so the time is
 * the collective's and not the kernels queued before it. */
#define TIMED(g, kind, payload, call) do {               \
    guard_begin(collective_name(kind), (g)->name);       \
    comm_backend_wait();                                 \
    double t0_ = wall_seconds();                         \
    call;                                                \
    comm_backend_wait();                                 \
    double t1_ = wall_seconds();                         \
    count((g), (kind), (payload), t1_ - t0_);            \
    log_wait((g), log_issue((g), (kind), t0_), t0_, t1_); \
    guard_end();                                         \
} while (0)

void comm_all_reduce(comm_group *g, float *buf, size_t count_, comm_op op) {
    TIMED(g, COLL_ALL_REDUCE, count_ * 4.0, if (g->size > 1) backend_all_reduce(g, buf, count_, op));
}
void comm_all_gather(comm_group *g, const float *send, float *recv, size_t count_) {
    TIMED(g, COLL_ALL_GATHER, count_ * 4.0 * g->size, backend_all_gather(g, send, recv, count_));
}
void comm_reduce_scatter(comm_group *g, const float *send, float *recv, size_t count_) {
    TIMED(g, COLL_REDUCE_SCATTER, count_ * 4.0 * g->size, backend_reduce_scatter(g, send, recv, count_));
}
void comm_broadcast(comm_group *g, float *buf, size_t count_, int root) {
    TIMED(g, COLL_BROADCAST, count_ * 4.0, if (g->size > 1) backend_broadcast(g, buf, count_, root));
}
void comm_all_to_all(comm_group *g, const float *send, float *recv, size_t count_) {
    TIMED(g, COLL_ALL_TO_ALL, count_ * 4.0 * g->size, backend_all_to_all(g, send, recv, count_));
}
void comm_send(comm_group *g, const float *buf, size_t count_, int peer) {
    TIMED(g, COLL_SEND, count_ * 4.0, backend_send(g, buf, count_, peer));
}
void comm_recv(comm_group *g, float *buf, size_t count_, int peer) {
    TIMED(g, COLL_RECV, count_ * 4.0, backend_recv(g, buf, count_, peer));
}
void comm_barrier(comm_group *g) {
    TIMED(g, COLL_BARRIER, 0.0, MPI_Barrier(mpi_of(g)));
}
/* One send and one recv; the time is the recv's, the exchange ends when the data is in. */
void comm_sendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                   float *recvbuf, size_t recv_count, int source) {
    TIMED(g, COLL_RECV, recv_count * 4.0,
          backend_sendrecv(g, sendbuf, send_count, dest, recvbuf, recv_count, source));
    count(g, COLL_SEND, send_count * 4.0, 0.0);
}

/* ---- non-blocking: counted at issue like the blocking twin, timed in comm_wait ---- */

static comm_request issued(comm_group *g, collective_kind k, double payload, void *pending) {
    count(g, k, payload, 0.0);
    comm_request r = {g, k, pending, pending ? log_issue(g, k, wall_seconds()) : 0};
    return r;
}

comm_request comm_isend(comm_group *g, const float *buf, size_t count_, int peer) {
    return issued(g, COLL_SEND, count_ * 4.0, backend_isend(g, buf, count_, peer));
}
comm_request comm_irecv(comm_group *g, float *buf, size_t count_, int peer) {
    return issued(g, COLL_RECV, count_ * 4.0, backend_irecv(g, buf, count_, peer));
}
comm_request comm_isendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                            float *recvbuf, size_t recv_count, int source) {
    count(g, COLL_SEND, send_count * 4.0, 0.0);
    return issued(g, COLL_RECV, recv_count * 4.0,
                  backend_isendrecv(g, sendbuf, send_count, dest, recvbuf, recv_count, source));
}
comm_request comm_iall_reduce(comm_group *g, float *buf, size_t count_, comm_op op) {
    return issued(g, COLL_ALL_REDUCE, count_ * 4.0,
                  g->size > 1 ? backend_iall_reduce(g, buf, count_, op) : NULL);
}
comm_request comm_iall_gather(comm_group *g, const float *send, float *recv, size_t count_) {
    return issued(g, COLL_ALL_GATHER, count_ * 4.0 * g->size,
                  backend_iall_gather(g, send, recv, count_));
}
comm_request comm_iall_gather_bytes(comm_group *g, const void *send, void *recv, size_t nbytes) {
    return issued(g, COLL_ALL_GATHER, (double)nbytes * g->size, backend_iall_gather_bytes(g, send, recv, nbytes));
}
comm_request comm_ireduce_scatter(comm_group *g, const float *send, float *recv, size_t count_) {
    return issued(g, COLL_REDUCE_SCATTER, count_ * 4.0 * g->size,
                  backend_ireduce_scatter(g, send, recv, count_));
}

void comm_wait(comm_request *req) {
    if (!req->pending) return;
    guard_begin(collective_name(req->kind), req->group->name);
    double w0 = wall_seconds();
    double waited = backend_wait(req->pending);
    if (counting) req->group->stats[req->kind].seconds += waited;
    log_wait(req->group, req->logged, w0, w0 + waited);
    guard_end();
    req->pending = NULL;
}
void comm_progress(comm_request *req) {
    if (req->pending) backend_progress(req->pending);
}
void comm_wait_all(comm_request *reqs, int n) {
    for (int i = 0; i < n; i++) comm_wait(&reqs[i]);
}

/* ---- host-side agreement, not part of the lesson's traffic ---- */

double comm_host_sum(comm_group *g, double x) {
    double y;
    guard_begin("host_sum", g->name);
    MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, mpi_of(g));
    guard_end();
    return y;
}
double comm_host_max(comm_group *g, double x) {
    double y;
    guard_begin("host_max", g->name);
    MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_MAX, mpi_of(g));
    guard_end();
    return y;
}
void comm_host_gather(comm_group *g, const float *send, float *recv, size_t count_, int root) {
    guard_begin("host_gather", g->name);
    MPI_Gather(send, (int)count_, MPI_FLOAT, recv, (int)count_, MPI_FLOAT, root, mpi_of(g));
    guard_end();
}

/* ---- statistics ---- */

static const char *kind_names[COLL_NKINDS] = {
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv", "all_to_all", "barrier"};
const char *collective_name(collective_kind k) { return kind_names[k]; }

void comm_reset_stats(comm_group *g) {
    memset(g->stats, 0, sizeof g->stats);
    if (g->timelog) g->timelog->n = 0;
}
void comm_reset_all_stats(void) { for (int i = 0; i < n_groups; i++) comm_reset_stats(groups[i]); }

void comm_wait_split(int kind, double *data_seconds, double *peer_seconds) {
    double data = 0, peer = 0;
    for (int i = 0; i < n_groups; i++) {   /* the same groups in the same order on every rank */
        comm_group *g = groups[i];
        if (g->size < 2) continue;
        int n = g->timelog ? g->timelog->n : 0, mine[2] = {n, -n}, most[2];   /* max n, -(min n) */
        MPI_Allreduce(mine, most, 2, MPI_INT, MPI_MAX, mpi_of(g));
        if (n == 0) continue;
        const struct comm_timelog *t = g->timelog;
        if (most[0] != -most[1]) {   /* the ranks did not log the same collectives: no common moment */
            for (int k = 0; k < n; k++)
                if (kind < 0 || t->kind[k] == (collective_kind)kind) data += t->wait1[k] - t->wait0[k];
            continue;
        }
        double *all = malloc((size_t)n * g->size * sizeof(double));
        MPI_Allgather(t->issue, n, MPI_DOUBLE, all, n, MPI_DOUBLE, mpi_of(g));
        for (int k = 0; k < n; k++) {
            if (kind >= 0 && t->kind[k] != (collective_kind)kind) continue;
            double last = all[k];   /* when the group's last rank issued collective k */
            for (int r = 1; r < g->size; r++) last = fmax(last, all[(size_t)r * n + k]);
            double blocked = t->wait1[k] - t->wait0[k];
            double after = fmax(0.0, t->wait1[k] - fmax(t->wait0[k], last));
            data += fmin(after, blocked);
            peer += blocked - fmin(after, blocked);
        }
        free(all);
    }
    *data_seconds = data;
    *peer_seconds = peer;
}

double comm_total_seconds(void) {
    double t = 0;
    for (int i = 0; i < n_groups; i++)
        for (int k = 0; k < COLL_NKINDS; k++) t += groups[i]->stats[k].seconds;
    return t;
}

/* ---- bad input: one line from rank 0, status 2 everywhere, nobody left waiting ---- */

static void (*usage_cleanups[8])(void);
static int n_usage_cleanups;

void comm_on_usage_exit(void (*cleanup)(void)) {
    if (n_usage_cleanups == 8) { fprintf(stderr, "comm_on_usage_exit: more than 8 clean-ups\n"); abort(); }
    usage_cleanups[n_usage_cleanups++] = cleanup;
}

void comm_exit_usage(const char *fmt, ...) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int i = n_usage_cleanups - 1; i >= 0; i--) usage_cleanups[i]();   /* before anyone may exit */
    if (rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        fputs("error: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
        fflush(stderr);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    exit(2);
}

void comm_require_all(int ok, const char *fmt, ...) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    /* The lowest failing rank tells rank 0 its message. */
    int mine = ok ? size : rank, first_bad;
    MPI_Allreduce(&mine, &first_bad, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first_bad == size) return;
    /* The message is sized to fit (a long path stays whole): its length first, then the text.
     * (static: still reachable when the process exits inside comm_exit_usage) */
    static char *msg;
    int len = 0;
    if (rank == first_bad) {
        va_list ap;
        va_start(ap, fmt);
        len = vasprintf(&msg, fmt, ap);
        va_end(ap);
    }
    MPI_Bcast(&len, 1, MPI_INT, first_bad, MPI_COMM_WORLD);
    if (rank != first_bad && len >= 0) msg = malloc((size_t)len + 1);
    if (len < 0 || !msg) MPI_Abort(MPI_COMM_WORLD, 2);   /* out of memory for a message */
    MPI_Bcast(msg, len + 1, MPI_CHAR, first_bad, MPI_COMM_WORLD);
    comm_exit_usage("%s", msg);
}
