/* comm_nccl.cu: COMM=nccl, the collectives' data moved by NCCL between GPUs (comm_backend.h).
 *
 * MPI still launches the ranks and builds the groups (comm.c). Every comm_group gets an
 * ncclComm_t next to its MPI communicator, with the same ranks in the same order, and a CUDA
 * stream of its own on which all of its calls run, blocking and non-blocking alike:
 *
 *   compute stream  ---kernels---[ready]----------------------[wait done]---kernels--->
 *                                   \                             ^
 *   group's stream                   `--ncclAllReduce ...--[done]-'
 *
 * A call waits on its group's stream for the kernels issued before it (an event of the compute
 * stream), and ends with an event of its own (`done`). A blocking call makes the compute stream
 * wait for `done` at once, a non-blocking one at comm_wait; the host waits for neither (it waits
 * only where it reads a value: device_copy_to_host). So the kernels issued between a comm_i* call
 * and its wait run beside the transfer, which is the overlap chapters 04-06 teach.
 *
 * Why one stream per group, and links for point-to-point: NCCL runs a communicator's operations
 * one after another in issue order, and a send completes only when its receive runs. With one
 * stream for everything, a receive issued early (to overlap) would hold up every call after it,
 * on every group; a pipeline whose receives and sends shared one communicator would wait for a
 * receive whose sender waits for this rank's send: a deadlock MPI does not have (comm.h,
 * "Ordering"; COMM=nccl-sim reproduces it on the CPU). Each group's stream keeps its queue
 * apart, and comm_ring_links gives each pipeline peer and direction a group of its own.
 *
 * Timing without host waits: the seconds of a call are how long the compute stream stalled for
 * it, from an event where the compute stream reached the call (or the wait) to `done`. Both
 * events are kept and their time is read when the statistics are read (settle).
 *
 * The semantics and buffer layouts are those of comm_mpi.c (see comm.h): all-gather output and
 * reduce-scatter input are rank-major; sub-groups come from ncclCommSplit with the colour/key of
 * MPI_Comm_split (checked: NCCL and MPI must agree on who is rank r).
 */
/* Only the C API of MPI is used; skip the (deprecated) C++ bindings nvcc would otherwise see. */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include "comm_backend.h"
#include "cuda_common.h"

/* A group's NCCL side: its communicator and the stream its calls run on. */
typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
} nccl_group;

static MPI_Comm mpi_of(comm_group *g) { return *(MPI_Comm *)g->mpi_comm; }
/* A group of one rank has no communicator (comm.c moves nothing for it and never asks here). */
static nccl_group *ng(comm_group *g) {
    if (!g->backend) { fprintf(stderr, "comm_nccl: group %s (%d rank) has no NCCL communicator\n", g->name, g->size); exit(1); }
    return (nccl_group *)g->backend;
}

/* Every group's NCCL side, released by nccl_finalize (newest first). */
static nccl_group **g_groups;
static int g_ngroups, g_capgroups;

static void *grow(void *p, int *cap, size_t elem) {
    *cap = *cap ? 2 * *cap : 64;
    p = realloc(p, (size_t)*cap * elem);
    if (!p) { fprintf(stderr, "comm_nccl: out of host memory\n"); exit(1); }
    return p;
}

/* NCCL must agree with MPI about who is who, or chunk r of an all-gather would land at the
 * wrong place. Both split by the same (colour, key, parent rank) rule; this checks it. */
static void check_same_ranks(comm_group *g) {
    int nrank = -1, nsize = -1;
    NCCL_CHECK(ncclCommUserRank(ng(g)->comm, &nrank));
    NCCL_CHECK(ncclCommCount(ng(g)->comm, &nsize));
    if (nrank != g->rank || nsize != g->size) {
        fprintf(stderr, "comm_nccl: group %s: NCCL rank %d of %d, MPI rank %d of %d\n",
                g->name, nrank, nsize, g->rank, g->size);
        exit(1);
    }
}

/* The group's stream: non-blocking (only events order it, not the legacy default stream) and at
 * the highest priority, so that when the compute kernels fill the GPU the communication kernels
 * are still scheduled as soon as they can run. */
static void attach(comm_group *g, ncclComm_t c) {
    nccl_group *n = (nccl_group *)calloc(1, sizeof *n);
    if (!n) { fprintf(stderr, "comm_nccl: out of host memory\n"); exit(1); }
    n->comm = c;
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&n->stream, cudaStreamNonBlocking, greatest));
    g->backend = n;
    if (g_ngroups == g_capgroups) g_groups = (nccl_group **)grow(g_groups, &g_capgroups, sizeof *g_groups);
    g_groups[g_ngroups++] = n;
    check_same_ranks(g);
}

/* ---- events: a free list that grows to the number in flight ---- */

static cudaEvent_t g_ready = NULL;      /* the compute stream at a call; no timing needed */
static cudaEvent_t *g_free;             /* timed events not in use                        */
static int g_nfree, g_capfree;

static cudaEvent_t event_take(void) {
    if (g_nfree > 0) return g_free[--g_nfree];
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    return e;
}
static void event_give_back(cudaEvent_t e) {
    if (g_nfree == g_capfree) g_free = (cudaEvent_t *)grow(g_free, &g_capfree, sizeof *g_free);
    g_free[g_nfree++] = e;
}

/* ---- timing: (started, reached, done) read at settle ---- */

typedef struct {
    comm_group *g;
    collective_kind kind;
    bool counted;               /* counting was on at the call                                  */
    int logged;                 /* its timelog entry (comm_wait_split), 0: none                 */
    cudaEvent_t started;        /* the group's stream got to the call: it could start there     */
    cudaEvent_t reached, done;  /* the compute stream got to the wait; the call ended           */
} pending_time;

static pending_time *g_pending;
static int g_npending, g_cappending;

/* The compute stream stalled from `reached` to `done` (if done came later): that is the call's
 * seconds; for comm_wait_split, the three moments on the host's clock, so that the stall can be
 * cut where the group's last rank could start the collective (its `started`). */
static void nccl_settle(void) {
    for (int i = 0; i < g_npending; i++) {
        pending_time *t = &g_pending[i];
        CUDA_CHECK(cudaEventSynchronize(t->done));
        CUDA_CHECK(cudaEventSynchronize(t->reached));
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, t->reached, t->done));
        /* negative: the transfer was over before the compute stream got there (fully hidden) */
        if (t->counted && ms > 0.0f) comm_add_seconds(t->g, t->kind, ms / 1000.0);
        if (t->logged) {
            double reached = cuda_event_host_seconds(t->reached);
            comm_device_times(t->g, t->logged, cuda_event_host_seconds(t->started), reached,
                              ms > 0.0f ? reached + ms / 1000.0 : reached);
        }
        event_give_back(t->started);
        event_give_back(t->reached);
        event_give_back(t->done);
    }
    g_npending = 0;
}

/* The compute stream waits for `done` from here on; the stall is timed from `reached`. A long
 * run that never reads its statistics settles every 4096 calls, so the list stays bounded. */
static void compute_waits(comm_group *g, collective_kind kind, cudaEvent_t started, cudaEvent_t reached,
                          cudaEvent_t done) {
    CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(), done, 0));
    if (g_npending == 4096) nccl_settle();
    if (g_npending == g_cappending) g_pending = (pending_time *)grow(g_pending, &g_cappending, sizeof *g_pending);
    pending_time *t = &g_pending[g_npending++];
    t->g = g;
    t->kind = kind;
    t->counted = comm_is_counting();
    t->logged = comm_current_log();
    t->started = started;
    t->reached = reached;
    t->done = done;
}

/* The start of every call: g's stream waits for the kernels issued so far (they write the
 * buffers about to be sent or reduced), then records *started (the call can start from here).
 * Returns the stream to issue on. `reached`, if given, is a timed event at that point of the
 * compute stream. */
static cudaStream_t begin(comm_group *g, cudaEvent_t *reached, cudaEvent_t *started) {
    cudaEvent_t at = g_ready;
    if (reached) at = *reached = event_take();
    CUDA_CHECK(cudaEventRecord(at, cuda_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(ng(g)->stream, at, 0));
    *started = event_take();
    CUDA_CHECK(cudaEventRecord(*started, ng(g)->stream));
    return ng(g)->stream;
}

/* The end of a blocking call: the compute stream waits for it (the host does not). */
static void end_blocking(comm_group *g, collective_kind kind, cudaEvent_t started, cudaEvent_t reached) {
    cudaEvent_t done = event_take();
    CUDA_CHECK(cudaEventRecord(done, ng(g)->stream));
    compute_waits(g, kind, started, reached, done);
}

/* NCCL's element type for t: bf16's sums run in NCCL's own bf16 reduction kernels. */
static ncclDataType_t nccl_type(dtype t) { return t == DTYPE_BF16 ? ncclBfloat16 : ncclFloat32; }

/* ---- blocking calls ---- */

static void nccl_all_reduce(comm_group *g, dtype t, void *buf, size_t count, comm_op op) {
    cudaEvent_t reached, started;
    cudaStream_t s = begin(g, &reached, &started);
    NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), op == COMM_MAX ? ncclMax : ncclSum, ng(g)->comm, s));
    end_blocking(g, COLL_ALL_REDUCE, started, reached);
}
/* send[count] from every rank -> recv[size * count], rank r's chunk at recv + r*count. */
static void nccl_all_gather(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    cudaEvent_t reached, started;
    cudaStream_t s = begin(g, &reached, &started);
    NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(t), ng(g)->comm, s));
    end_blocking(g, COLL_ALL_GATHER, started, reached);
}
/* send[size * count] -> recv[count] on rank r = sum over ranks of their chunk r. NCCL's count
 * is the per-rank (received) count, like MPI_Reduce_scatter_block's. */
static void nccl_reduce_scatter(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    cudaEvent_t reached, started;
    cudaStream_t s = begin(g, &reached, &started);
    NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, ng(g)->comm, s));
    end_blocking(g, COLL_REDUCE_SCATTER, started, reached);
}
static void nccl_broadcast(comm_group *g, dtype t, void *buf, size_t count, int root) {
    cudaEvent_t reached, started;
    cudaStream_t s = begin(g, &reached, &started);
    NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(t), root, ng(g)->comm, s));
    end_blocking(g, COLL_BROADCAST, started, reached);
}
/* NCCL has no all-to-all call of its own: one ncclSend and one ncclRecv per peer (itself
 * included), in one group so that they run together and cannot deadlock. */
static void nccl_all_to_all(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    cudaEvent_t reached, started;
    cudaStream_t s = begin(g, &reached, &started);
    size_t chunk = count * dtype_size(t);   /* bytes to and from each peer */
    NCCL_CHECK(ncclGroupStart());
    for (int peer = 0; peer < g->size; peer++) {
        NCCL_CHECK(ncclSend((const char *)send + (size_t)peer * chunk, count, nccl_type(t), peer, ng(g)->comm, s));
        NCCL_CHECK(ncclRecv((char *)recv + (size_t)peer * chunk, count, nccl_type(t), peer, ng(g)->comm, s));
    }
    NCCL_CHECK(ncclGroupEnd());
    end_blocking(g, COLL_ALL_TO_ALL, started, reached);
}
/* The same group with each peer's own count (comm.h): a send and a receive per peer even where the
 * count is 0, so every rank makes the same calls in the same order whatever the routing was. */
static void nccl_all_to_all_v(comm_group *g, dtype t, const void *send, const size_t *send_counts, void *recv,
                              const size_t *recv_counts) {
    cudaEvent_t reached, started;
    cudaStream_t s = begin(g, &reached, &started);
    size_t e = dtype_size(t), sent = 0, got = 0;   /* bytes of an element; elements so far */
    NCCL_CHECK(ncclGroupStart());
    for (int peer = 0; peer < g->size; peer++) {
        NCCL_CHECK(ncclSend((const char *)send + sent * e, send_counts[peer], nccl_type(t), peer, ng(g)->comm, s));
        NCCL_CHECK(ncclRecv((char *)recv + got * e, recv_counts[peer], nccl_type(t), peer, ng(g)->comm, s));
        sent += send_counts[peer];
        got += recv_counts[peer];
    }
    NCCL_CHECK(ncclGroupEnd());
    end_blocking(g, COLL_ALL_TO_ALL, started, reached);
}
/* A send completes only when the peer's receive runs: the peers must pair them (comm.h). */
static void nccl_send(comm_group *g, dtype t, const void *buf, size_t count, int peer) {
    cudaEvent_t reached, started;
    cudaStream_t s = begin(g, &reached, &started);
    NCCL_CHECK(ncclSend(buf, count, nccl_type(t), peer, ng(g)->comm, s));
    end_blocking(g, COLL_SEND, started, reached);
}
static void nccl_recv(comm_group *g, dtype t, void *buf, size_t count, int peer) {
    cudaEvent_t reached, started;
    cudaStream_t s = begin(g, &reached, &started);
    NCCL_CHECK(ncclRecv(buf, count, nccl_type(t), peer, ng(g)->comm, s));
    end_blocking(g, COLL_RECV, started, reached);
}
/* Send and receive fused in one NCCL group, so they progress together: a ring shift where every
 * rank sends right and receives from the left. */
static void issue_sendrecv(comm_group *g, dtype t, cudaStream_t s, const void *sendbuf, size_t send_count,
                           int dest, void *recvbuf, size_t recv_count, int source) {
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclSend(sendbuf, send_count, nccl_type(t), dest, ng(g)->comm, s));
    NCCL_CHECK(ncclRecv(recvbuf, recv_count, nccl_type(t), source, ng(g)->comm, s));
    NCCL_CHECK(ncclGroupEnd());
}
static void nccl_sendrecv(comm_group *g, dtype t, const void *sendbuf, size_t send_count, int dest,
                          void *recvbuf, size_t recv_count, int source) {
    cudaEvent_t reached, started;
    cudaStream_t s = begin(g, &reached, &started);
    issue_sendrecv(g, t, s, sendbuf, send_count, dest, recvbuf, recv_count, source);
    end_blocking(g, COLL_RECV, started, reached);
}

/* ---- non-blocking calls: the handle is the call's `done` event, its group and kind ---- */

typedef struct {
    comm_group *g;
    collective_kind kind;
    cudaEvent_t started, done;
} nccl_request;

/* The call just issued by begin_request's stream: its request. */
static cudaEvent_t g_started_now;
static cudaStream_t begin_request(comm_group *g) { return begin(g, NULL, &g_started_now); }
static void *issued(comm_group *g, collective_kind kind) {
    nccl_request *r = (nccl_request *)malloc(sizeof *r);
    if (!r) { fprintf(stderr, "comm_nccl: out of host memory\n"); exit(1); }
    r->g = g;
    r->kind = kind;
    r->started = g_started_now;
    r->done = event_take();
    CUDA_CHECK(cudaEventRecord(r->done, ng(g)->stream));
    return r;
}

/* Started at once on the group's stream: a link carries one direction, so a send never waits
 * behind a receive of the same queue (comm.h, "Ordering"). */
static void *nccl_isend(comm_group *g, dtype t, const void *buf, size_t count, int peer) {
    NCCL_CHECK(ncclSend(buf, count, nccl_type(t), peer, ng(g)->comm, begin_request(g)));
    return issued(g, COLL_SEND);
}
static void *nccl_irecv(comm_group *g, dtype t, void *buf, size_t count, int peer) {
    NCCL_CHECK(ncclRecv(buf, count, nccl_type(t), peer, ng(g)->comm, begin_request(g)));
    return issued(g, COLL_RECV);
}
static void *nccl_isendrecv(comm_group *g, dtype t, const void *sendbuf, size_t send_count, int dest,
                            void *recvbuf, size_t recv_count, int source) {
    issue_sendrecv(g, t, begin_request(g), sendbuf, send_count, dest, recvbuf, recv_count, source);
    return issued(g, COLL_RECV);
}
static void *nccl_iall_reduce(comm_group *g, dtype t, void *buf, size_t count, comm_op op) {
    NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), op == COMM_MAX ? ncclMax : ncclSum, ng(g)->comm,
                             begin_request(g)));
    return issued(g, COLL_ALL_REDUCE);
}
static void *nccl_iall_gather(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(t), ng(g)->comm, begin_request(g)));
    return issued(g, COLL_ALL_GATHER);
}
static void *nccl_iall_gather_bytes(comm_group *g, const void *send, void *recv, size_t nbytes) {
    NCCL_CHECK(ncclAllGather(send, recv, nbytes, ncclUint8, ng(g)->comm, begin_request(g)));
    return issued(g, COLL_ALL_GATHER);
}
static void *nccl_ireduce_scatter(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, ng(g)->comm, begin_request(g)));
    return issued(g, COLL_REDUCE_SCATTER);
}

/* The end of a request: the compute stream waits for `done` (the kernels issued after this
 * call see the transfer's output); the host does not. The stall is settled later (0 now). */
static double nccl_wait(void *handle) {
    nccl_request *r = (nccl_request *)handle;
    cudaEvent_t reached = event_take();
    CUDA_CHECK(cudaEventRecord(reached, cuda_stream()));
    compute_waits(r->g, r->kind, r->started, reached, r->done);
    free(r);
    return 0.0;
}

/* NCCL moves the data on the group's stream by itself: nothing to do. */
static void nccl_progress(void *handle) { (void)handle; }

/* The host waits for the compute stream (what the host-side code reads next). */
static void nccl_sync(void) { CUDA_CHECK(cudaStreamSynchronize(cuda_stream())); }

/* ---- groups ---- */

/* One byte of device memory for the connections' first messages (nccl_connect): NCCL's own,
 * like its buffers, so not in the memory tables. */
static unsigned char *g_connect_byte = NULL;

/* The world communicator: rank 0 asks NCCL for a unique id (an address other ranks can reach),
 * MPI broadcasts those bytes, and every rank joins with its world rank. device_init() has bound
 * the rank to its GPU (one each: comm_choose compared the node's bus ids). One rank alone needs
 * no communicator. NCCL_RUNTIME_CONNECT is left at NCCL's default (1): a communicator connects
 * only what it uses, at first use (a link: one point-to-point direction), which the ordering of
 * this program makes safe (comm_nccl_sim.c, rules 5 and 6, checked in make test). */
static void nccl_init(comm_group *world, int node_ranks) {
    (void)node_ranks;
    CUDA_CHECK(cudaEventCreateWithFlags(&g_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc(&g_connect_byte, 1));
    if (world->size < 2) return;
    ncclUniqueId id;
    if (world->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, mpi_of(world));
    ncclComm_t c;
    NCCL_CHECK(ncclCommInitRank(&c, world->size, id, world->rank));
    attach(world, c);
}

/* A sub-group: the ranks of `parent` with the same colour, ordered by key (ties by parent
 * rank), exactly like the MPI_Comm_split comm.c just did. Collective over the parent; a rank
 * with no colour joins none, and neither does a rank whose group has one rank (no communicator:
 * NCCL would hold buffers for it all the same). A NULL config makes the child inherit the
 * parent's settings. A parent of one rank has no communicator, and its child is itself alone. */
static void nccl_split(comm_group *parent, comm_group *child, int color, int key) {
    if (parent->size < 2) return;
    bool alone = !child || child->size < 2;
    ncclComm_t c = NULL;
    NCCL_CHECK(ncclCommSplit(ng(parent)->comm, alone ? NCCL_SPLIT_NOCOLOR : color, key, &c, NULL));
    if (!alone) attach(child, c);
}

/* The connection this rank -> peer (send) or peer -> this rank (recv) of g, made now with a
 * one-byte message: NCCL connects at a peer's first ncclSend/ncclRecv, and that blocks the host
 * in ncclGroupEnd until the peer makes its first call (comm_nccl_sim.c, rule 5). comm_ring_links
 * calls it for each link as it creates it, so no step ever meets a connection. */
static void nccl_connect(comm_group *g, int peer, bool send) {
    cudaStream_t s = ng(g)->stream;
    if (send) NCCL_CHECK(ncclSend(g_connect_byte, 1, ncclUint8, peer, ng(g)->comm, s));
    else NCCL_CHECK(ncclRecv(g_connect_byte, 1, ncclUint8, peer, ng(g)->comm, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
}

/* Wait for every group's last calls (a request never waited for still has to finish, or its
 * peers would hang), then release the communicators, newest first, their streams and the events. */
static void nccl_finalize(void) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    for (int i = 0; i < g_ngroups; i++) CUDA_CHECK(cudaStreamSynchronize(g_groups[i]->stream));
    nccl_settle();
    while (g_ngroups > 0) {
        nccl_group *n = g_groups[--g_ngroups];
        NCCL_CHECK(ncclCommDestroy(n->comm));
        CUDA_CHECK(cudaStreamDestroy(n->stream));
        free(n);
    }
    while (g_nfree > 0) CUDA_CHECK(cudaEventDestroy(g_free[--g_nfree]));
    CUDA_CHECK(cudaEventDestroy(g_ready));
    CUDA_CHECK(cudaFree(g_connect_byte));
}

static const comm_backend nccl_backend = {
    .name = "nccl", .host_timed = false, .nccl_buffers = true, .on_device = true,
    .init = nccl_init, .split = nccl_split, .connect = nccl_connect, .finalize = nccl_finalize,
    .sync = nccl_sync, .settle = nccl_settle, .poll = NULL,
    .all_reduce = nccl_all_reduce, .all_gather = nccl_all_gather, .reduce_scatter = nccl_reduce_scatter,
    .broadcast = nccl_broadcast, .all_to_all = nccl_all_to_all, .all_to_all_v = nccl_all_to_all_v, .send = nccl_send, .recv = nccl_recv,
    .sendrecv = nccl_sendrecv,
    .isend = nccl_isend, .irecv = nccl_irecv, .isendrecv = nccl_isendrecv, .iall_reduce = nccl_iall_reduce,
    .iall_gather = nccl_iall_gather, .ireduce_scatter = nccl_ireduce_scatter,
    .iall_gather_bytes = nccl_iall_gather_bytes, .wait = nccl_wait, .progress = nccl_progress,
};

const comm_backend *comm_nccl_backend(void) { return &nccl_backend; }
