/* comm_cuda.cu: the CUDA twin of comm_cpu.c (see comm_backend.h).
 *
 * MPI still launches the ranks and builds the groups (comm.c). NCCL moves the data between
 * GPUs: every comm_group gets an ncclComm_t next to its MPI communicator, with the same ranks
 * in the same order, and every blocking collective is issued on the rank's compute stream
 * (cuda_common.h), behind the kernels that produced its input and ahead of the kernels that
 * consume its output.
 *
 * The semantics and buffer layouts are those of comm_cpu.c (see comm.h): all-gather output and
 * reduce-scatter input are rank-major chunks of `count` floats. comm.c waits for the stream
 * after each call (to time it), so from the host's point of view a collective here is as
 * blocking as its MPI twin.
 *
 * The non-blocking calls (comm_i*) go onto a second stream, the communication stream, so that
 * the GPU runs them beside the kernels the host issues after them:
 *
 *   compute stream:  kernels ... [ready] kernels that overlap ........ [wait done] kernels ...
 *                                   |                                      ^
 *   comm stream:                 [wait ready] NCCL operation [done] -------+
 *
 * `ready` (recorded at issue) holds the transfer back until the kernels that produce its input
 * have run; `done` (recorded after it, one event per request) holds back the kernels after
 * comm_wait that consume its output. Besides these events only NCCL orders the two streams:
 * the calls on one communicator run in the order they were launched, whatever their stream
 * (a blocking collective on a group waits for a non-blocking one launched before it there).
 *
 * NCCL point-to-point has one more rule: a send finishes only when the peer's matching receive
 * runs, and separate NCCL calls of a rank run one after another. If every rank of a ring
 * launched "send right" and then "receive from the left" separately, every send would wait for
 * a receive queued behind the neighbour's send: a deadlock MPI does not have. So isend and irecv
 * are *posted* (kept in a list, with their `done` events already handed out) and launched
 * together in one ncclGroupStart/ncclGroupEnd at the next communication call of any kind,
 * where NCCL progresses them all at once.
 */
/* Only the C API of MPI is used; skip the (deprecated) C++ bindings nvcc would otherwise see. */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include "comm_backend.h"
#include "cuda_common.h"

static MPI_Comm mpi_of(comm_group *g) { return *(MPI_Comm *)g->mpi_comm; }
static ncclComm_t nccl_of(comm_group *g) { return (ncclComm_t)g->nccl_comm; }

/* Every NCCL communicator this rank created, destroyed by comm_backend_finalize. */
#define MAX_NCCL_COMMS 256
static ncclComm_t g_comms[MAX_NCCL_COMMS];
static int g_ncomms = 0;

static void remember(ncclComm_t c) {
    if (g_ncomms == MAX_NCCL_COMMS) {
        fprintf(stderr, "comm_cuda: more than %d NCCL communicators\n", MAX_NCCL_COMMS);
        exit(1);
    }
    g_comms[g_ncomms++] = c;
}

/* NCCL must agree with MPI about who is who, or chunk r of an all-gather would land at the
 * wrong place. Both split by the same (colour, key, parent rank) rule; this checks it. */
static void check_same_ranks(comm_group *g) {
    int nrank = -1, nsize = -1;
    NCCL_CHECK(ncclCommUserRank(nccl_of(g), &nrank));
    NCCL_CHECK(ncclCommCount(nccl_of(g), &nsize));
    if (nrank != g->rank || nsize != g->size) {
        fprintf(stderr, "comm_cuda: group %s: NCCL rank %d of %d, MPI rank %d of %d\n",
                g->name, nrank, nsize, g->rank, g->size);
        exit(1);
    }
}

/* ---- the communication stream and its events ---- */

static cudaStream_t g_comm_stream = NULL;
static cudaEvent_t g_ready = NULL;     /* compute stream at issue; no timing needed          */
static cudaEvent_t g_reached = NULL;   /* compute stream at comm_wait; timed against `done`  */

/* The completion events: every event ever created (to destroy them) and the free ones. An
 * event goes to a request at issue and comes back in backend_wait, so the pool only grows to
 * the number of requests in flight at once. Events keep timing enabled: the exposed time is
 * measured between `g_reached` and a request's `done`. */
#define MAX_EVENTS 1024
#define INITIAL_EVENTS 16
static cudaEvent_t g_events[MAX_EVENTS], g_free_events[MAX_EVENTS];
static int g_nevents = 0, g_nfree = 0;

static void event_create(void) {
    if (g_nevents == MAX_EVENTS) {
        fprintf(stderr, "comm_cuda: more than %d requests in flight (a comm_wait missing?)\n",
                MAX_EVENTS);
        exit(1);
    }
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    g_events[g_nevents++] = e;
    g_free_events[g_nfree++] = e;
}

static cudaEvent_t event_take(void) {
    if (g_nfree == 0) event_create();
    return g_free_events[--g_nfree];
}

static void event_give_back(cudaEvent_t e) { g_free_events[g_nfree++] = e; }

/* Make the communication stream wait for what the compute stream has been given so far:
 * the kernels that write the buffers about to be sent or reduced. */
static void comm_stream_follow_compute(void) {
    CUDA_CHECK(cudaEventRecord(g_ready, cuda_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(g_comm_stream, g_ready, 0));
}

/* A request's `done`: recorded on the communication stream right after its operation. */
static cudaEvent_t record_done(void) {
    cudaEvent_t e = event_take();
    CUDA_CHECK(cudaEventRecord(e, g_comm_stream));
    return e;
}

/* ---- posted point-to-point operations (see the top of the file) ---- */

typedef struct {
    bool is_send;
    float *buf;
    size_t count;
    int peer;
    cudaEvent_t done;       /* handed to the request at post, recorded at launch */
} posted_p2p;

#define MAX_POSTED 256
static posted_p2p g_posted[MAX_POSTED];
static int g_nposted = 0;
static comm_group *g_posted_group = NULL;   /* one NCCL group launch is on one communicator */

/* Launch everything posted as one NCCL group on the communication stream, behind the compute
 * stream as it was at the last post, then record each request's `done`. */
static void launch_posted(void) {
    if (g_nposted == 0) return;
    CUDA_CHECK(cudaStreamWaitEvent(g_comm_stream, g_ready, 0));
    ncclComm_t c = nccl_of(g_posted_group);
    NCCL_CHECK(ncclGroupStart());
    for (int i = 0; i < g_nposted; i++) {
        const posted_p2p *p = &g_posted[i];
        if (p->is_send) NCCL_CHECK(ncclSend(p->buf, p->count, ncclFloat, p->peer, c, g_comm_stream));
        else NCCL_CHECK(ncclRecv(p->buf, p->count, ncclFloat, p->peer, c, g_comm_stream));
    }
    NCCL_CHECK(ncclGroupEnd());
    for (int i = 0; i < g_nposted; i++) CUDA_CHECK(cudaEventRecord(g_posted[i].done, g_comm_stream));
    g_nposted = 0;
    g_posted_group = NULL;
}

/* Add one send or receive to the list. Posts on another group first launch the list: one NCCL
 * group launch serves one communicator. `ready` is re-recorded at every post, so the launch
 * waits for the compute stream as it was at the last one (which includes every earlier one). */
static void *post(comm_group *g, bool is_send, const float *buf, size_t count, int peer) {
    if (g_nposted > 0 && g_posted_group != g) launch_posted();
    if (g_nposted == MAX_POSTED) {
        fprintf(stderr, "comm_cuda: more than %d isend/irecv posted without a wait\n", MAX_POSTED);
        exit(1);
    }
    CUDA_CHECK(cudaEventRecord(g_ready, cuda_stream()));
    posted_p2p *p = &g_posted[g_nposted++];
    p->is_send = is_send;
    p->buf = (float *)buf;    /* ncclSend takes a const pointer; one field serves both */
    p->count = count;
    p->peer = peer;
    p->done = event_take();
    g_posted_group = g;
    return p->done;
}

/* The world communicator: rank 0 asks NCCL for a unique id (an address other ranks can reach),
 * MPI broadcasts those bytes, and every rank joins with its world rank. Needs device_init()
 * first, because the communicator binds to the current GPU. */
void comm_backend_init(comm_group *world) {
    ncclUniqueId id;
    if (world->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, mpi_of(world));
    ncclComm_t c;
    NCCL_CHECK(ncclCommInitRank(&c, world->size, id, world->rank));
    world->nccl_comm = c;
    remember(c);
    check_same_ranks(world);

    /* The communication stream: non-blocking (only the events above order it, not the legacy
     * default stream) and at the highest priority, so that when the compute kernels fill the
     * GPU the communication kernels are still scheduled as soon as they can run. */
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&g_comm_stream, cudaStreamNonBlocking, greatest));
    CUDA_CHECK(cudaEventCreateWithFlags(&g_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreate(&g_reached));
    for (int i = 0; i < INITIAL_EVENTS; i++) event_create();
}

/* A sub-group: the ranks of `parent` with the same colour, ordered by key (ties by parent
 * rank), exactly like the MPI_Comm_split comm.c just did. Collective over the parent.
 * A NULL config makes the child inherit the parent's settings. */
void comm_backend_split(comm_group *parent, comm_group *child, int color, int key) {
    ncclComm_t c;
    NCCL_CHECK(ncclCommSplit(nccl_of(parent), color, key, &c, NULL));
    child->nccl_comm = c;
    remember(c);
    check_same_ranks(child);
}

/* Wait for the last collectives on both streams (a request never waited for still has to
 * finish, or its peers would hang), then release the communicators, newest first, the events
 * and the communication stream. */
void comm_backend_finalize(void) {
    launch_posted();
    CUDA_CHECK(cudaStreamSynchronize(g_comm_stream));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    while (g_ncomms > 0) NCCL_CHECK(ncclCommDestroy(g_comms[--g_ncomms]));
    while (g_nevents > 0) CUDA_CHECK(cudaEventDestroy(g_events[--g_nevents]));
    g_nfree = 0;
    CUDA_CHECK(cudaEventDestroy(g_reached));
    CUDA_CHECK(cudaEventDestroy(g_ready));
    CUDA_CHECK(cudaStreamDestroy(g_comm_stream));
    g_comm_stream = NULL;
}

/* Before and after every blocking call: start what is posted (so NCCL sees the calls in
 * program order), then wait for the compute stream, where the blocking collectives run.
 * Non-blocking operations in flight on the communication stream are not waited for. */
void comm_backend_wait(void) {
    launch_posted();
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

/* buf[count] := element-wise sum (or max) of every rank's buf[count], in place. */
void backend_all_reduce(comm_group *g, float *buf, size_t count, comm_op op) {
    ncclRedOp_t nop = op == COMM_MAX ? ncclMax : ncclSum;
    NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat, nop, nccl_of(g), cuda_stream()));
}

/* send[count] from every rank -> recv[size * count], rank r's chunk at recv + r*count. */
void backend_all_gather(comm_group *g, const float *send, float *recv, size_t count) {
    NCCL_CHECK(ncclAllGather(send, recv, count, ncclFloat, nccl_of(g), cuda_stream()));
}

/* send[size * count] on every rank -> recv[count] on rank r = sum over ranks of their chunk r.
 * NCCL's count argument is the per-rank (received) count, like MPI_Reduce_scatter_block's. */
void backend_reduce_scatter(comm_group *g, const float *send, float *recv, size_t count) {
    NCCL_CHECK(ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, nccl_of(g),
                                 cuda_stream()));
}

/* buf[count] := root's buf[count], in place (root is a rank of g). */
void backend_broadcast(comm_group *g, float *buf, size_t count, int root) {
    NCCL_CHECK(ncclBroadcast(buf, buf, count, ncclFloat, root, nccl_of(g), cuda_stream()));
}

/* Point to point, for pipeline stages. `peer` is a rank of g. The matching call on the peer
 * must be its backend_recv (resp. backend_send) with the same count. */
/* NCCL has no all-to-all call of its own: one ncclSend and one ncclRecv per peer (itself
 * included), grouped so that they run together and cannot deadlock. */
void backend_all_to_all(comm_group *g, const float *send, float *recv, size_t count) {
    NCCL_CHECK(ncclGroupStart());
    for (int peer = 0; peer < g->size; peer++) {
        NCCL_CHECK(ncclSend(send + (size_t)peer * count, count, ncclFloat, peer, nccl_of(g), cuda_stream()));
        NCCL_CHECK(ncclRecv(recv + (size_t)peer * count, count, ncclFloat, peer, nccl_of(g), cuda_stream()));
    }
    NCCL_CHECK(ncclGroupEnd());
}
void backend_send(comm_group *g, const float *buf, size_t count, int peer) {
    NCCL_CHECK(ncclSend(buf, count, ncclFloat, peer, nccl_of(g), cuda_stream()));
}

void backend_recv(comm_group *g, float *buf, size_t count, int peer) {
    NCCL_CHECK(ncclRecv(buf, count, ncclFloat, peer, nccl_of(g), cuda_stream()));
}

/* Both at once, fused in one NCCL group so that they progress together: a ring shift where
 * every rank sends right and receives from the left. On the compute stream, like the other
 * blocking calls (comm.c's wait before it has started anything posted). */
void backend_sendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                      float *recvbuf, size_t recv_count, int source) {
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclSend(sendbuf, send_count, ncclFloat, dest, nccl_of(g), cuda_stream()));
    NCCL_CHECK(ncclRecv(recvbuf, recv_count, ncclFloat, source, nccl_of(g), cuda_stream()));
    NCCL_CHECK(ncclGroupEnd());
}

/* ---- non-blocking: the handle is the request's `done` event ---- */

void *backend_isend(comm_group *g, const float *buf, size_t count, int peer) {
    return post(g, true, buf, count, peer);
}

void *backend_irecv(comm_group *g, float *buf, size_t count, int peer) {
    return post(g, false, buf, count, peer);
}

/* Started at once (after what is posted): its send and receive are one NCCL group already. */
void *backend_isendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                        float *recvbuf, size_t recv_count, int source) {
    launch_posted();
    comm_stream_follow_compute();
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclSend(sendbuf, send_count, ncclFloat, dest, nccl_of(g), g_comm_stream));
    NCCL_CHECK(ncclRecv(recvbuf, recv_count, ncclFloat, source, nccl_of(g), g_comm_stream));
    NCCL_CHECK(ncclGroupEnd());
    return record_done();
}

/* The collectives: the same NCCL calls as the blocking twins, on the communication stream. */
void *backend_iall_reduce(comm_group *g, float *buf, size_t count, comm_op op) {
    launch_posted();
    comm_stream_follow_compute();
    ncclRedOp_t nop = op == COMM_MAX ? ncclMax : ncclSum;
    NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat, nop, nccl_of(g), g_comm_stream));
    return record_done();
}

void *backend_iall_gather(comm_group *g, const float *send, float *recv, size_t count) {
    launch_posted();
    comm_stream_follow_compute();
    NCCL_CHECK(ncclAllGather(send, recv, count, ncclFloat, nccl_of(g), g_comm_stream));
    return record_done();
}

void *backend_iall_gather_bytes(comm_group *g, const void *send, void *recv, size_t nbytes) {
    launch_posted();
    comm_stream_follow_compute();
    NCCL_CHECK(ncclAllGather(send, recv, nbytes, ncclUint8, nccl_of(g), g_comm_stream));
    return record_done();
}

void *backend_ireduce_scatter(comm_group *g, const float *send, float *recv, size_t count) {
    launch_posted();
    comm_stream_follow_compute();
    NCCL_CHECK(ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, nccl_of(g),
                                 g_comm_stream));
    return record_done();
}

/* The end of a request:
 *   1. start what is posted (the request may be one of them);
 *   2. mark where the compute stream has got to (`reached`) and make it wait for `done`, so the
 *      kernels issued after this call see the transfer's output;
 *   3. wait for the compute stream on the host, as after a blocking call, so the caller may use
 *      the buffers right away (and `reached` and `done` have both happened);
 *   4. the exposed time is how long the compute stream stalled: done - reached, or nothing if
 *      the transfer had finished before the compute stream got there (fully hidden). */
double backend_wait(void *handle) {
    cudaEvent_t done = (cudaEvent_t)handle;
    launch_posted();
    CUDA_CHECK(cudaEventRecord(g_reached, cuda_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(), done, 0));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, g_reached, done));
    event_give_back(done);
    return ms > 0.0f ? ms / 1000.0 : 0.0;
}

/* NCCL moves the data on the communication stream by itself: nothing to do. */
void backend_progress(void *handle) { (void)handle; }
