/* comm.c: process groups, statistics and timing, shared by every backend.
 *
 * MPI is always there: it launches the ranks, gives each its rank and local rank, and splits
 * groups. The data of the lesson's collectives moves through the backend that COMM chose
 * (comm_backend.h: comm_mpi.c, comm_nccl.cu, comm_nccl_sim.c); every call passes through here
 * first to be counted and timed.
 */
#include <limits.h>
#include <mpi.h>
#include <sched.h>
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
static int local_rank = 0, node_ranks = 1;
static const comm_backend *be = &comm_mpi_backend;
/* comm_host_post's messages in flight (below) */
#define HOST_MESSAGE_TAG 7
typedef struct { MPI_Request req; void *copy; } posted_message;
static posted_message *posted;
static int n_posted, cap_posted;

static MPI_Comm mpi_of(comm_group *g) { return *(MPI_Comm *)g->mpi_comm; }

/* Where a call on g is counted: its own statistics, or its parent's for a link. */
static comm_group *counted(comm_group *g) { return g->counted_as ? g->counted_as : g; }

static comm_group *group_new(MPI_Comm c, const char *name) {
    if (c == MPI_COMM_NULL) return NULL;   /* this rank passed COMM_NO_COLOR */
    comm_group *g = calloc(1, sizeof *g);
    MPI_Comm *pc = malloc(sizeof *pc);
    *pc = c;
    g->mpi_comm = pc;
    MPI_Comm_rank(c, &g->rank);
    MPI_Comm_size(c, &g->size);
    snprintf(g->name, sizeof g->name, "%.31s", name);
    if (n_groups == MAX_GROUPS) { fprintf(stderr, "comm: more than %d groups\n", MAX_GROUPS); exit(1); }
    groups[n_groups++] = g;
    return g;
}

/* COMM picks the backend (comm_backend.h). Pure, so that test_comm tests every answer with
 * device names of its own making. NCCL needs one GPU per rank, told by the names (PCI bus ids):
 * counting the GPUs a rank sees would take a node whose launcher shows each rank only its own
 * GPU (device 0 everywhere) for one with a single GPU. */
const char *comm_choose(const char *want, bool nccl_built, const char *const *device_names, int node_ranks,
                        char *msg, size_t msg_size) {
    int a = -1, b = -1, distinct = 0;   /* two ranks of the node on one device, if any */
    for (int i = 0; i < node_ranks; i++) {
        int first = i;
        for (int j = 0; j < i && first == i; j++)
            if (strcmp(device_names[j], device_names[i]) == 0) first = j;
        if (first == i) distinct++;
        else if (a < 0) { a = first; b = i; }
    }
    bool fits = a < 0;   /* one GPU per rank: NCCL refuses two ranks on one */
    if (!want || !*want) return nccl_built && fits ? "nccl" : "mpi";
    if (strcmp(want, "mpi") == 0 || strcmp(want, "nccl-sim") == 0) return want;
    if (strcmp(want, "nccl") == 0 && !nccl_built)
        snprintf(msg, msg_size, "COMM=nccl needs the CUDA build (BACKEND=cuda); the CPU build has COMM=mpi "
                 "and COMM=nccl-sim (NCCL's ordering rules emulated over MPI)");
    else if (strcmp(want, "nccl") == 0 && !fits)
        snprintf(msg, msg_size, "COMM=nccl: ranks %d and %d of this node share the GPU %s (%d ranks on %d GPU%s); "
                 "NCCL needs one GPU per rank (two ranks on one GPU: \"Duplicate GPU detected\"): run at most %d "
                 "rank%s per node, or COMM=mpi to let ranks share a GPU", a, b, device_names[a], node_ranks,
                 distinct, distinct == 1 ? "" : "s", distinct, distinct == 1 ? "" : "s");
    else if (strcmp(want, "nccl") == 0) return want;
    else
        snprintf(msg, msg_size, "COMM=%s is not valid: use COMM=mpi, COMM=nccl (CUDA build) or COMM=nccl-sim "
                 "(CPU build)", want);
    return NULL;
}

/* The ranks of this node that share this rank's device (itself included): comm_init counts them. */
static int device_sharers = 1;
int comm_device_sharers(void) { return device_sharers; }
int comm_count_sharers(const char *const *device_names, int node_ranks, int me) {
    int n = 0;
    for (int i = 0; i < node_ranks; i++) n += strcmp(device_names[i], device_names[me]) == 0;
    return n;
}

/* Every rank reads the same environment (mpirun passes it), so a refusal is reached by all. The
 * node's ranks tell each other the names of their devices first. */
static const comm_backend *comm_select(MPI_Comm node) {
    enum { NAME = 64 };
    char mine[NAME] = "", *all = calloc((size_t)node_ranks, NAME);
    const char **names = calloc((size_t)node_ranks, sizeof *names);
    if (!all || !names) { fprintf(stderr, "comm: out of host memory\n"); exit(1); }
    device_identity(mine, NAME);
    MPI_Allgather(mine, NAME, MPI_CHAR, all, NAME, MPI_CHAR, node);
    for (int i = 0; i < node_ranks; i++) names[i] = all + (size_t)i * NAME;   /* by node rank: local_rank's is ours */
    device_sharers = comm_count_sharers(names, node_ranks, local_rank);
    char msg[512];
    const char *name = comm_choose(getenv("COMM"), comm_nccl_backend() != NULL, names, node_ranks, msg, sizeof msg);
    free(names);
    free(all);
    if (!name) comm_exit_usage("%s", msg);
    if (strcmp(name, "nccl") == 0) return comm_nccl_backend();
    return strcmp(name, "nccl-sim") == 0 ? &comm_nccl_sim_backend : &comm_mpi_backend;
}

comm_group *comm_init(int *argc, char ***argv) {
    MPI_Init(argc, argv);
    guard_init(*argc, *argv);   /* same arguments on every rank; the watchdog (guard.h) */
    /* Ranks on the same node share memory; their order there is this rank's GPU index. */
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &node_ranks);
    world = group_new(MPI_COMM_WORLD, "world");
    log_set_rank(world->rank);
    device_init(local_rank);
    be = comm_select(node);
    MPI_Comm_free(&node);
    be->init(world, node_ranks);
    return world;
}

void comm_finalize(void) {
    for (int i = 0; i < n_posted; i++) {   /* what comm_host_post left: its receiver takes it */
        MPI_Wait(&posted[i].req, MPI_STATUS_IGNORE);
        free(posted[i].copy);
    }
    free(posted);
    posted = NULL;
    n_posted = cap_posted = 0;
    be->finalize();
    device_shutdown();
    MPI_Finalize();
}

comm_group *comm_world(void) { return world; }

comm_group *comm_split(comm_group *parent, int color, int key, const char *name) {
    MPI_Comm c;
    MPI_Comm_split(mpi_of(parent), color == COMM_NO_COLOR ? MPI_UNDEFINED : color, key, &c);
    comm_group *g = group_new(c, name);
    be->split(parent, g, color, key);
    return g;
}

/* ---- links: one two-rank group per ring neighbour and direction ---- */

struct comm_links {
    comm_group *parent;
    comm_group **to, **from;   /* [parent size]: the link this rank -> peer, peer -> this rank */
    bool shared;               /* comm_shared_links: every link is the parent itself        */
};

static comm_links *links_new(comm_group *g) {
    comm_links *l = calloc(1, sizeof *l);
    if (l) l->to = calloc((size_t)g->size, sizeof *l->to);
    if (l && l->to) l->from = calloc((size_t)g->size, sizeof *l->from);
    if (!l || !l->to || !l->from) { fprintf(stderr, "comm: out of host memory\n"); exit(1); }
    l->parent = g;
    return l;
}

void comm_links_free(comm_links *l) {
    if (!l) return;
    free(l->to);
    free(l->from);
    free(l);
}

comm_links *comm_shared_links(comm_group *g) {
    comm_links *l = links_new(g);
    l->shared = true;
    for (int peer = 0; peer < g->size; peer++) l->to[peer] = l->from[peer] = g;
    return l;
}

/* Every ordered pair (a, b) of ring neighbours once, in the same order on every rank; inside a
 * link the sender is rank 0 and the receiver rank 1. With `connect`, each link's connection is
 * made right after the link is created: comm_split is collective over g, so every rank of g is at
 * the same link then, and its two members connect it together (NCCL's first message on a link
 * blocks the host until the peer's first message: comm_nccl_sim.c, rule 5). Links taken one
 * after another in one order that every rank follows cannot wait on each other in a cycle. */
static comm_links *ring_links(comm_group *g, bool connect) {
    int p = g->size, r = g->rank;
    comm_links *l = links_new(g);
    for (int a = 0; a < p; a++)
        for (int step = 1; step >= -1; step -= 2) {
            int b = ((a + step) % p + p) % p;
            if (b == a || (p == 2 && step == -1)) continue;   /* size 2: a+1 and a-1 are one peer */
            char name[64];   /* "pp 0>1"; comm_group keeps the first 31 characters */
            snprintf(name, sizeof name, "%.20s %d>%d", g->name, a, b);
            bool member = r == a || r == b;
            comm_group *link = comm_split(g, member ? 0 : COMM_NO_COLOR, r == a ? 0 : 1, name);
            if (!member) continue;
            link->counted_as = g;
            if (r == a) l->to[b] = link;
            else l->from[a] = link;
            if (connect && be->connect) {
                guard_begin("connect", link->name);
                be->connect(link, r == a ? 1 : 0, r == a);
                guard_end();
            }
        }
    return l;
}
comm_links *comm_ring_links(comm_group *g) { return ring_links(g, true); }
comm_links *comm_lazy_ring_links(comm_group *g) { return ring_links(g, false); }

static comm_group *link_of(comm_group **links, comm_links *l, int peer, const char *dir) {
    if (peer < 0 || peer >= l->parent->size || !links[peer]) {
        fprintf(stderr, "comm: rank %d of %s has no link %s rank %d (only ring neighbours)\n",
                l->parent->rank, l->parent->name, dir, peer);
        exit(1);
    }
    return links[peer];
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
    double *issue, *issued, *wait0, *wait1;   /* when this rank issued it and when the issue returned
                                               * (a connection may block the host there: NCCL's
                                               * lazy connection); when it started and stopped
                                               * waiting for it                                     */
    collective_kind *kind;
    int n, cap;
};

/* A new entry for a collective issued at `issue` on g; returns its index + 1 (0: not logged). */
static int log_issue(comm_group *g, collective_kind k, double issue, double issue_end) {
    if (!logging_waits || !counting || g->size < 2) return 0;
    if (k == COLL_SEND || k == COLL_RECV) return 0;   /* p2p: no group-wide issue */
    struct comm_timelog *t = g->timelog;
    if (!t) t = g->timelog = calloc(1, sizeof *t);
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->issue = realloc(t->issue, t->cap * sizeof(double));
        t->issued = realloc(t->issued, t->cap * sizeof(double));
        t->wait0 = realloc(t->wait0, t->cap * sizeof(double));
        t->wait1 = realloc(t->wait1, t->cap * sizeof(double));
        t->kind = realloc(t->kind, t->cap * sizeof(collective_kind));
        if (!t->issue || !t->issued || !t->wait0 || !t->wait1 || !t->kind) { fprintf(stderr, "comm: out of host memory\n"); exit(1); }
    }
    t->issue[t->n] = issue;
    t->issued[t->n] = issue_end;
    t->kind[t->n] = k;
    t->wait0[t->n] = t->wait1[t->n] = issue_end;   /* not waited yet: nothing blocked */
    return ++t->n;
}
static void log_wait(comm_group *g, int logged, double wait0, double wait1) {
    if (logged > 0 && g->timelog && logged <= g->timelog->n) {
        g->timelog->wait0[logged - 1] = wait0;
        g->timelog->wait1[logged - 1] = wait1;
    }
}

/* The entry of the call the backend is inside (comm_backend.h), 0 when none is logged. */
static int current_log = 0;
int comm_current_log(void) { return current_log; }
void comm_device_times(comm_group *g, int logged, double issue, double wait0, double wait1) {
    if (logged > 0 && g->timelog && logged <= g->timelog->n) {
        g->timelog->issue[logged - 1] = g->timelog->issued[logged - 1] = issue;
        log_wait(g, logged, wait0, wait1);
    }
}

/* A call's bytes: its payload, and what this rank puts on the wire (wire < 0: the ring's share of
 * the payload, ring_factor; the all-to-all with counts knows its own exactly). */
static void count_wire(comm_group *g, collective_kind k, double payload_bytes, double wire_bytes, double seconds) {
    if (!counting) return;
    collective_stats *s = &counted(g)->stats[k];
    s->calls++;
    s->payload_bytes += payload_bytes;
    s->wire_bytes += wire_bytes >= 0 ? wire_bytes : ring_factor(k, g->size) * payload_bytes;
    s->seconds += seconds;
}
static void count(comm_group *g, collective_kind k, double payload_bytes, double seconds) {
    count_wire(g, k, payload_bytes, -1, seconds);
}

bool comm_is_counting(void) { return counting; }
void comm_add_seconds(comm_group *g, collective_kind k, double seconds) {
    counted(g)->stats[k].seconds += seconds;
}

/* A group of one rank moves nothing: an all-reduce leaves the buffer as it is, an all-gather,
 * reduce-scatter or all-to-all copies its one chunk (as the libraries would; NCCL then needs
 * no communicator at all: comm_nccl.cu creates none for one rank). */
static void *one_rank_copy(void *recv, const void *send, size_t bytes) {
    device_copy(recv, send, bytes);
    return NULL;
}
/* Time a collective end to end: on a host-timed backend with a GPU (COMM=mpi staging device
 * buffers) that means waiting for the stream first, so the time is the collective's and not the
 * kernels queued before it. Under NCCL the host does not wait: the backend times the call on the
 * device and comm_settle adds its seconds. */
#define TIMED_WIRE(g, kind, payload, wire, call) do {    \
    guard_begin(collective_name(kind), (g)->name);       \
    if (be->host_timed) be->sync();                      \
    double t0_ = wall_seconds();                         \
    current_log = log_issue((g), (kind), t0_, t0_);      \
    call;                                                \
    if (be->host_timed) be->sync();                      \
    double t1_ = be->host_timed ? wall_seconds() : t0_;  \
    count_wire((g), (kind), (payload), (wire), t1_ - t0_); \
    log_wait((g), current_log, t0_, t1_);                \
    current_log = 0;                                     \
    guard_end();                                         \
} while (0)
#define TIMED(g, kind, payload, call) TIMED_WIRE(g, kind, payload, -1, call)

/* Every data operation comes typed (t: the element type, dtype.h; counts in elements, bytes
 * counted as count x dtype_size(t)) and as its fp32 twin, the call of the typed one with
 * DTYPE_F32. */
void comm_all_reduce_typed(comm_group *g, dtype t, void *buf, size_t count_, comm_op op) {
    TIMED(g, COLL_ALL_REDUCE, count_ * (double)dtype_size(t), if (g->size > 1) be->all_reduce(g, t, buf, count_, op));
}
void comm_all_gather_typed(comm_group *g, dtype t, const void *send, void *recv, size_t count_) {
    size_t bytes = count_ * dtype_size(t);
    TIMED(g, COLL_ALL_GATHER, (double)bytes * g->size,
          if (g->size > 1) be->all_gather(g, t, send, recv, count_); else one_rank_copy(recv, send, bytes));
}
void comm_reduce_scatter_typed(comm_group *g, dtype t, const void *send, void *recv, size_t count_) {
    size_t bytes = count_ * dtype_size(t);
    TIMED(g, COLL_REDUCE_SCATTER, (double)bytes * g->size,
          if (g->size > 1) be->reduce_scatter(g, t, send, recv, count_); else one_rank_copy(recv, send, bytes));
}
void comm_broadcast_typed(comm_group *g, dtype t, void *buf, size_t count_, int root) {
    TIMED(g, COLL_BROADCAST, count_ * (double)dtype_size(t), if (g->size > 1) be->broadcast(g, t, buf, count_, root));
}
void comm_all_to_all_typed(comm_group *g, dtype t, const void *send, void *recv, size_t count_) {
    size_t bytes = count_ * dtype_size(t);
    TIMED(g, COLL_ALL_TO_ALL, (double)bytes * g->size,
          if (g->size > 1) be->all_to_all(g, t, send, recv, count_); else one_rank_copy(recv, send, bytes));
}
void comm_all_to_all_v_typed(comm_group *g, dtype t, const void *send, const size_t *send_counts, void *recv,
                             const size_t *recv_counts) {
    double sent = 0;
    for (int p = 0; p < g->size; p++) sent += (double)send_counts[p];
    size_t bytes = dtype_size(t), own = send_counts[g->rank] * bytes;
    TIMED_WIRE(g, COLL_ALL_TO_ALL, sent * bytes, sent * bytes - (double)own,
               if (g->size > 1) be->all_to_all_v(g, t, send, send_counts, recv, recv_counts);
               else one_rank_copy(recv, send, own));
}
void comm_send_typed(comm_group *g, dtype t, const void *buf, size_t count_, int peer) {
    TIMED(g, COLL_SEND, count_ * (double)dtype_size(t), be->send(g, t, buf, count_, peer));
}
void comm_recv_typed(comm_group *g, dtype t, void *buf, size_t count_, int peer) {
    TIMED(g, COLL_RECV, count_ * (double)dtype_size(t), be->recv(g, t, buf, count_, peer));
}
void comm_all_reduce(comm_group *g, float *buf, size_t count_, comm_op op) {
    comm_all_reduce_typed(g, DTYPE_F32, buf, count_, op);
}
void comm_all_gather(comm_group *g, const float *send, float *recv, size_t count_) {
    comm_all_gather_typed(g, DTYPE_F32, send, recv, count_);
}
void comm_reduce_scatter(comm_group *g, const float *send, float *recv, size_t count_) {
    comm_reduce_scatter_typed(g, DTYPE_F32, send, recv, count_);
}
void comm_broadcast(comm_group *g, float *buf, size_t count_, int root) {
    comm_broadcast_typed(g, DTYPE_F32, buf, count_, root);
}
void comm_all_to_all(comm_group *g, const float *send, float *recv, size_t count_) {
    comm_all_to_all_typed(g, DTYPE_F32, send, recv, count_);
}
void comm_all_to_all_v(comm_group *g, const float *send, const size_t *send_counts, float *recv,
                       const size_t *recv_counts) {
    comm_all_to_all_v_typed(g, DTYPE_F32, send, send_counts, recv, recv_counts);
}
void comm_send(comm_group *g, const float *buf, size_t count_, int peer) {
    comm_send_typed(g, DTYPE_F32, buf, count_, peer);
}
void comm_recv(comm_group *g, float *buf, size_t count_, int peer) {
    comm_recv_typed(g, DTYPE_F32, buf, count_, peer);
}
/* Host-side, on every backend (NCCL has no barrier). */
static void host_wait(MPI_Request *req);
void comm_barrier(comm_group *g) {
    MPI_Request req;
    TIMED(g, COLL_BARRIER, 0.0, MPI_Ibarrier(mpi_of(g), &req); host_wait(&req));
}
/* One send and one recv; the time is the recv's, the exchange ends when the data is in. */
void comm_sendrecv_typed(comm_group *g, dtype t, const void *sendbuf, size_t send_count, int dest,
                         void *recvbuf, size_t recv_count, int source) {
    TIMED(g, COLL_RECV, recv_count * (double)dtype_size(t),
          be->sendrecv(g, t, sendbuf, send_count, dest, recvbuf, recv_count, source));
    count(g, COLL_SEND, send_count * (double)dtype_size(t), 0.0);
}
void comm_sendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                   float *recvbuf, size_t recv_count, int source) {
    comm_sendrecv_typed(g, DTYPE_F32, sendbuf, send_count, dest, recvbuf, recv_count, source);
}

/* ---- non-blocking: counted at issue like the blocking twin, timed in comm_wait ---- */

/* A non-blocking call's issue: the backend's call is guarded (the watchdog names it) and timed,
 * for issuing may block the host too (NCCL's lazy connection: comm_nccl_sim.c, rules 5 and 6):
 * that time is counted as the call's seconds, like the time later blocked in comm_wait. */
#define ISSUE(g, kind, payload, call) do {                                   \
    guard_begin(collective_name(kind), (g)->name);                           \
    double i0_ = wall_seconds();                                             \
    void *h_ = (call);                                                       \
    double i1_ = be->host_timed && (g)->size > 1 ? wall_seconds() : i0_;     \
    guard_end();                                                             \
    return issued((g), (kind), (payload), h_, i0_, i1_);                     \
} while (0)

/* The requests in flight on this rank (their backend handles), which comm_progress_in_flight
 * moves along: a request joins when issued and leaves when waited for. */
static void **in_flight;
static int n_in_flight, cap_in_flight;
static void in_flight_add(void *h) {
    if (n_in_flight == cap_in_flight) {
        cap_in_flight = cap_in_flight ? 2 * cap_in_flight : 64;
        in_flight = realloc(in_flight, (size_t)cap_in_flight * sizeof *in_flight);
        if (!in_flight) { fprintf(stderr, "comm: out of host memory for the requests in flight\n"); exit(1); }
    }
    in_flight[n_in_flight++] = h;
}
static void in_flight_remove(void *h) {
    for (int i = n_in_flight - 1; i >= 0; i--)
        if (in_flight[i] == h) {
            in_flight[i] = in_flight[--n_in_flight];
            return;
        }
}
void comm_progress_in_flight(void) {
    if (!be || n_in_flight == 0) return;
    if (be->poll) be->poll();   /* the emulation: one poll moves every queue, whatever is in flight */
    else if (be->progress)
        for (int i = 0; i < n_in_flight; i++) be->progress(in_flight[i]);
}

static comm_request issued(comm_group *g, collective_kind k, double payload, void *pending, double i0, double i1) {
    if (pending) in_flight_add(pending);
    count(g, k, payload, i1 - i0);
    comm_request r = {g, k, pending, pending ? log_issue(g, k, i0, i1) : 0};
    return r;
}

/* Inside a link the sender is rank 0 and the receiver rank 1; on shared links, the peer's own. */
comm_request comm_link_isend_typed(comm_links *l, dtype t, const void *buf, size_t count_, int peer) {
    comm_group *link = link_of(l->to, l, peer, "to");
    ISSUE(link, COLL_SEND, count_ * (double)dtype_size(t), be->isend(link, t, buf, count_, l->shared ? peer : 1));
}
comm_request comm_link_irecv_typed(comm_links *l, dtype t, void *buf, size_t count_, int peer) {
    comm_group *link = link_of(l->from, l, peer, "from");
    ISSUE(link, COLL_RECV, count_ * (double)dtype_size(t), be->irecv(link, t, buf, count_, l->shared ? peer : 0));
}
comm_request comm_isendrecv_typed(comm_group *g, dtype t, const void *sendbuf, size_t send_count, int dest,
                                  void *recvbuf, size_t recv_count, int source) {
    count(g, COLL_SEND, send_count * (double)dtype_size(t), 0.0);
    ISSUE(g, COLL_RECV, recv_count * (double)dtype_size(t),
          be->isendrecv(g, t, sendbuf, send_count, dest, recvbuf, recv_count, source));
}
comm_request comm_iall_reduce_typed(comm_group *g, dtype t, void *buf, size_t count_, comm_op op) {
    ISSUE(g, COLL_ALL_REDUCE, count_ * (double)dtype_size(t),
          g->size > 1 ? be->iall_reduce(g, t, buf, count_, op) : NULL);
}
comm_request comm_iall_gather_typed(comm_group *g, dtype t, const void *send, void *recv, size_t count_) {
    size_t bytes = count_ * dtype_size(t);
    ISSUE(g, COLL_ALL_GATHER, (double)bytes * g->size,
          g->size > 1 ? be->iall_gather(g, t, send, recv, count_) : one_rank_copy(recv, send, bytes));
}
comm_request comm_ireduce_scatter_typed(comm_group *g, dtype t, const void *send, void *recv, size_t count_) {
    size_t bytes = count_ * dtype_size(t);
    ISSUE(g, COLL_REDUCE_SCATTER, (double)bytes * g->size,
          g->size > 1 ? be->ireduce_scatter(g, t, send, recv, count_) : one_rank_copy(recv, send, bytes));
}
comm_request comm_link_isend(comm_links *l, const float *buf, size_t count_, int peer) {
    return comm_link_isend_typed(l, DTYPE_F32, buf, count_, peer);
}
comm_request comm_link_irecv(comm_links *l, float *buf, size_t count_, int peer) {
    return comm_link_irecv_typed(l, DTYPE_F32, buf, count_, peer);
}
comm_request comm_isendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                            float *recvbuf, size_t recv_count, int source) {
    return comm_isendrecv_typed(g, DTYPE_F32, sendbuf, send_count, dest, recvbuf, recv_count, source);
}
comm_request comm_iall_reduce(comm_group *g, float *buf, size_t count_, comm_op op) {
    return comm_iall_reduce_typed(g, DTYPE_F32, buf, count_, op);
}
comm_request comm_iall_gather(comm_group *g, const float *send, float *recv, size_t count_) {
    return comm_iall_gather_typed(g, DTYPE_F32, send, recv, count_);
}
comm_request comm_ireduce_scatter(comm_group *g, const float *send, float *recv, size_t count_) {
    return comm_ireduce_scatter_typed(g, DTYPE_F32, send, recv, count_);
}
comm_request comm_iall_gather_bytes(comm_group *g, const void *send, void *recv, size_t nbytes) {
    ISSUE(g, COLL_ALL_GATHER, (double)nbytes * g->size,
          g->size > 1 ? be->iall_gather_bytes(g, send, recv, nbytes) : one_rank_copy(recv, send, nbytes));
}

void comm_wait(comm_request *req) {
    if (!req->pending) return;
    guard_begin(collective_name(req->kind), req->group->name);
    double w0 = wall_seconds();
    current_log = req->logged;
    in_flight_remove(req->pending);
    double waited = be->wait(req->pending);
    current_log = 0;
    if (counting) counted(req->group)->stats[req->kind].seconds += waited;
    log_wait(req->group, req->logged, w0, w0 + waited);
    guard_end();
    req->pending = NULL;
}
void comm_progress(comm_request *req) {
    if (req->pending) be->progress(req->pending);
}
void comm_wait_all(comm_request *reqs, int n) {
    for (int i = 0; i < n; i++) comm_wait(&reqs[i]);
}

/* ---- host-side agreement, not part of the lesson's traffic ---- */

/* Waits for a host-side MPI request. Under the NCCL emulation the device's queues keep moving
 * meanwhile, as a GPU's streams would while the host waits here (comm_nccl_sim.c, rule 4). */
static void host_wait(MPI_Request *req) {
    if (!be->poll) { MPI_Wait(req, MPI_STATUS_IGNORE); return; }
    int done = 0;
    for (MPI_Test(req, &done, MPI_STATUS_IGNORE); !done; MPI_Test(req, &done, MPI_STATUS_IGNORE)) {
        be->poll();
        sched_yield();
    }
}

static double host_reduce(comm_group *g, double x, MPI_Op op, const char *what) {
    double y;
    guard_begin(what, g->name);
    if (!be->poll) MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, op, mpi_of(g));
    else {
        MPI_Request req;
        MPI_Iallreduce(&x, &y, 1, MPI_DOUBLE, op, mpi_of(g), &req);
        host_wait(&req);
    }
    guard_end();
    return y;
}
double comm_host_sum(comm_group *g, double x) { return host_reduce(g, x, MPI_SUM, "host_sum"); }
double comm_host_max(comm_group *g, double x) { return host_reduce(g, x, MPI_MAX, "host_max"); }
void comm_host_gather(comm_group *g, const float *send, float *recv, size_t count_, int root) {
    guard_begin("host_gather", g->name);
    MPI_Request req;
    MPI_Igather(send, (int)count_, MPI_FLOAT, recv, (int)count_, MPI_FLOAT, root, mpi_of(g), &req);
    host_wait(&req);
    guard_end();
}

/* ---- what NCCL holds (comm.h) ---- */

#define NCCL_LL_BYTES (8.0 * 512 * 8 * 16)       /* lines per thread x threads x steps x line */
#define NCCL_LL128_BYTES (120.0 * 640 * 8 * 8)   /* elements per thread x threads x steps x 8  */
#define NCCL_SIMPLE_BYTES (4.0 * 1024 * 1024)
#define NCCL_P2P_STEP_BYTES (8.0 * 512 * 1024)   /* NCCL_STEPS x the NVLink p2p chunk         */

double comm_nccl_memory_formula(int groups, int p2p_connections, int channels, int p2p_channels) {
    double per_channel = 2 * (NCCL_LL_BYTES + NCCL_LL128_BYTES + NCCL_SIMPLE_BYTES);   /* ring and tree */
    return groups * channels * per_channel + (double)p2p_connections * p2p_channels * NCCL_P2P_STEP_BYTES;
}

comm_library_memory comm_library_memory_now(bool *held) {
    comm_library_memory m = {0, 0, 0, COMM_NCCL_COLL_CHANNELS, COMM_NCCL_P2P_CHANNELS, 0};
    const char *cap = getenv("NCCL_MAX_NCHANNELS");   /* NCCL's own cap on its channels */
    if (cap && atoi(cap) > 0) {
        if (atoi(cap) < m.channels) m.channels = atoi(cap);
        if (atoi(cap) < m.p2p_channels) m.p2p_channels = atoi(cap);
    }
    for (int i = 0; i < n_groups; i++) {
        const comm_group *g = groups[i];
        if (g->size < 2) continue;   /* no communicator: comm_nccl.cu creates none for one rank */
        if (g->counted_as) { m.links++; m.p2p_connections++; continue; }
        m.groups++;
        m.p2p_connections += 2 * (g->size - 1);
    }
    m.bytes = comm_nccl_memory_formula(m.groups, m.p2p_connections, m.channels, m.p2p_channels);
    if (held) *held = be->nccl_buffers;
    return m;
}

bool comm_library_on_device(void) { return be->nccl_buffers && be->on_device; }

/* ---- host-side messages (comm_host_post / comm_host_take) ---- */


/* The posted messages that have left, released (MPI_Test: a completed request ends). */
static void release_posted(void) {
    for (int i = 0; i < n_posted;) {
        int done = 0;
        MPI_Test(&posted[i].req, &done, MPI_STATUS_IGNORE);
        if (!done) { i++; continue; }
        free(posted[i].copy);
        posted[i] = posted[--n_posted];
    }
}

void comm_host_post(comm_group *g, const void *buf, size_t bytes, int dest) {
    release_posted();
    if (n_posted == cap_posted) {
        cap_posted = cap_posted ? 2 * cap_posted : 16;
        posted = realloc(posted, (size_t)cap_posted * sizeof *posted);
    }
    void *copy = malloc(bytes ? bytes : 1);
    if (!posted || !copy || bytes > (size_t)INT_MAX) { fprintf(stderr, "comm_host_post: %zu bytes: out of host memory or too large\n", bytes); exit(1); }
    memcpy(copy, buf, bytes);
    posted[n_posted].copy = copy;
    MPI_Isend(copy, (int)bytes, MPI_BYTE, dest, HOST_MESSAGE_TAG, mpi_of(g), &posted[n_posted].req);
    n_posted++;
}

void *comm_host_take(comm_group *g, size_t *bytes) {
    guard_begin("host_take", g->name);
    MPI_Status st;
    int found = 0;
    for (MPI_Iprobe(MPI_ANY_SOURCE, HOST_MESSAGE_TAG, mpi_of(g), &found, &st); !found;
         MPI_Iprobe(MPI_ANY_SOURCE, HOST_MESSAGE_TAG, mpi_of(g), &found, &st)) {
        if (be->poll) be->poll();   /* (the emulation's queues move meanwhile, as a GPU's would) */
        sched_yield();
    }
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    void *buf = malloc(count ? (size_t)count : 1);
    if (!buf) { fprintf(stderr, "comm_host_take: out of host memory for %d bytes\n", count); exit(1); }
    MPI_Recv(buf, count, MPI_BYTE, st.MPI_SOURCE, HOST_MESSAGE_TAG, mpi_of(g), MPI_STATUS_IGNORE);
    guard_end();
    *bytes = (size_t)count;
    return buf;
}

/* ---- statistics ---- */

static const char *kind_names[COLL_NKINDS] = {
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv", "all_to_all", "barrier"};
const char *collective_name(collective_kind k) { return kind_names[k]; }

void comm_settle(void) { if (be->settle) be->settle(); }

void comm_reset_stats(comm_group *g) {
    comm_settle();
    memset(g->stats, 0, sizeof g->stats);
    if (g->timelog) g->timelog->n = 0;
}
void comm_reset_all_stats(void) { for (int i = 0; i < n_groups; i++) comm_reset_stats(groups[i]); }

void comm_wait_split(int kind, double *data_seconds, double *peer_seconds) {
    comm_settle();
    double data = 0, peer = 0;
    for (int i = 0; i < n_groups; i++) {   /* the same groups in the same order on every rank */
        comm_group *g = groups[i];
        if (g->size < 2 || g->counted_as) continue;   /* links carry send/recv only: never logged */
        int n = g->timelog ? g->timelog->n : 0, mine[2] = {n, -n}, most[2];   /* max n, -(min n) */
        MPI_Allreduce(mine, most, 2, MPI_INT, MPI_MAX, mpi_of(g));
        if (n == 0) continue;
        const struct comm_timelog *t = g->timelog;
        if (most[0] != -most[1]) {   /* the ranks did not log the same collectives: no common moment */
            for (int k = 0; k < n; k++)
                if (kind < 0 || t->kind[k] == (collective_kind)kind)
                    data += t->wait1[k] - t->wait0[k] + t->issued[k] - t->issue[k];
            continue;
        }
        double *all = malloc((size_t)n * g->size * sizeof(double));
        MPI_Allgather(t->issue, n, MPI_DOUBLE, all, n, MPI_DOUBLE, mpi_of(g));
        for (int k = 0; k < n; k++) {
            if (kind >= 0 && t->kind[k] != (collective_kind)kind) continue;
            double last = all[k];   /* when the group's last rank issued collective k */
            for (int r = 1; r < g->size; r++) last = fmax(last, all[(size_t)r * n + k]);
            double blocked = t->wait1[k] - t->wait0[k] + t->issued[k] - t->issue[k];
            double after = fmax(0.0, t->wait1[k] - fmax(t->wait0[k], last))
                         + fmax(0.0, t->issued[k] - fmax(t->issue[k], last));
            data += fmin(after, blocked);
            peer += blocked - fmin(after, blocked);
        }
        free(all);
    }
    *data_seconds = data;
    *peer_seconds = peer;
}

double comm_total_seconds(void) {
    comm_settle();
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
