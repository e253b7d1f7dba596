/* comm_nccl_sim.c: COMM=nccl-sim, NCCL's ordering rules enforced on the CPU (comm_backend.h).
 *
 * MPI forgives orders of calls that NCCL does not: MPI progresses every operation on its own,
 * buffers small sends, and lets a receive posted early wait beside later operations. A program
 * that is correct only under those rules passes every CPU test and hangs on its first GPU run.
 * This backend moves the data with MPI but under NCCL's rules, so such a program hangs here, on
 * the CPU, in `make test`, where the watchdog ends it (exit 3) naming the call it waited in:
 *
 *   1. One queue per communicator. NCCL runs a communicator's operations one after another, in
 *      the order this rank issued them (whatever stream they were issued on). Here an
 *      operation's MPI calls start only when the operation before it on the same group has
 *      completed: a receive issued early blocks everything issued after it on its group.
 *   2. A send completes only when the peer's receive has started (MPI_Issend, a rendezvous):
 *      NCCL's send needs the receiver's buffer, so a send that its peer has queued behind
 *      something else blocks its own queue too. MPI would have buffered it.
 *   3. A group completes as one: an exchange (sendrecv) or an all-to-all is one entry of the
 *      queue, ended when all of its sends and receives are.
 *   4. The queues move by themselves, as a GPU's streams do while the host does something else:
 *      whenever this rank waits (comm_wait, a blocking call, a host-side agreement), every
 *      queue starts what it can. The host blocks in a blocking call until it completes.
 *
 * Only the CPU build: the buffers go to MPI as they are.
 */
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm_backend.h"
#include "device.h"

typedef enum {
    OP_ALL_REDUCE, OP_ALL_GATHER, OP_ALL_GATHER_BYTES, OP_REDUCE_SCATTER, OP_BROADCAST,
    OP_ALL_TO_ALL, OP_SEND, OP_RECV, OP_SENDRECV
} op_kind;

/* One entry of a group's queue: the operation's arguments, kept until its turn comes. */
typedef struct sim_op {
    op_kind kind;
    comm_group *g;
    const void *send;
    void *recv;
    size_t send_count, recv_count;  /* floats (bytes for OP_ALL_GATHER_BYTES)                  */
    int dest, source;               /* send/recv peers; the root of a broadcast is `source`    */
    comm_op op;
    MPI_Request req[2];
    int nreq;
    bool started, done;
    struct sim_op *next;
} sim_op;

/* A group's queue, on an MPI communicator of its own: duplicated from the group's, as NCCL's
 * communicator is separate from MPI's, so that an operation started late (rule 1) is never
 * matched with a host-side collective (comm_host_sum, comm_barrier) on the group's own. */
typedef struct {
    sim_op *head, *tail;
    MPI_Comm comm;
} sim_queue;

/* Every group's queue on this rank, for the polling of rule 4. */
static sim_queue **queues;
static int n_queues, cap_queues;

static MPI_Comm mpi_of(comm_group *g) { return *(MPI_Comm *)g->mpi_comm; }
static sim_queue *queue_of(comm_group *g) { return (sim_queue *)g->backend; }

static void add_queue(comm_group *g) {
    if (n_queues == cap_queues) {
        cap_queues = cap_queues ? 2 * cap_queues : 16;
        queues = realloc(queues, (size_t)cap_queues * sizeof *queues);
    }
    sim_queue *q = calloc(1, sizeof *q);
    if (!queues || !q) { fprintf(stderr, "comm_nccl_sim: out of host memory\n"); exit(1); }
    MPI_Comm_dup(mpi_of(g), &q->comm);   /* collective over g: every member adds its queue here */
    g->backend = q;
    queues[n_queues++] = q;
}

/* The operation's MPI calls, now that it is at the head of its queue. */
static void start(sim_op *o) {
    MPI_Comm c = queue_of(o->g)->comm;
    int sc = (int)o->send_count, rc = (int)o->recv_count;
    o->nreq = 1;
    switch (o->kind) {
    case OP_ALL_REDUCE:
        MPI_Iallreduce(MPI_IN_PLACE, o->recv, rc, MPI_FLOAT, o->op == COMM_MAX ? MPI_MAX : MPI_SUM, c, &o->req[0]);
        break;
    case OP_ALL_GATHER: MPI_Iallgather(o->send, sc, MPI_FLOAT, o->recv, sc, MPI_FLOAT, c, &o->req[0]); break;
    case OP_ALL_GATHER_BYTES: MPI_Iallgather(o->send, sc, MPI_BYTE, o->recv, sc, MPI_BYTE, c, &o->req[0]); break;
    case OP_REDUCE_SCATTER: MPI_Ireduce_scatter_block(o->send, o->recv, rc, MPI_FLOAT, MPI_SUM, c, &o->req[0]); break;
    case OP_BROADCAST: MPI_Ibcast(o->recv, rc, MPI_FLOAT, o->source, c, &o->req[0]); break;
    case OP_ALL_TO_ALL: MPI_Ialltoall(o->send, sc, MPI_FLOAT, o->recv, sc, MPI_FLOAT, c, &o->req[0]); break;
    case OP_SEND: MPI_Issend(o->send, sc, MPI_FLOAT, o->dest, 0, c, &o->req[0]); break;
    case OP_RECV: MPI_Irecv(o->recv, rc, MPI_FLOAT, o->source, 0, c, &o->req[0]); break;
    case OP_SENDRECV:
        o->nreq = 2;
        MPI_Irecv(o->recv, rc, MPI_FLOAT, o->source, 0, c, &o->req[0]);
        MPI_Issend(o->send, sc, MPI_FLOAT, o->dest, 0, c, &o->req[1]);
        break;
    }
    o->started = true;
}

/* Rule 1: the head runs; when it completes it leaves the queue and the next one starts.
 * Returns whether anything moved. A completed entry is freed by its waiter. */
static bool advance(sim_queue *q) {
    bool moved = false;
    while (q->head) {
        sim_op *o = q->head;
        if (!o->started) { start(o); moved = true; }
        int complete = 0;
        MPI_Testall(o->nreq, o->req, &complete, MPI_STATUSES_IGNORE);
        if (!complete) break;
        o->done = true;
        q->head = o->next;
        if (!q->head) q->tail = NULL;
        moved = true;
    }
    return moved;
}

/* Rule 4: every queue of this rank moves (one pass). */
static bool poll_all(void) {
    bool moved = false;
    for (int i = 0; i < n_queues; i++) moved |= advance(queues[i]);
    return moved;
}
static void sim_poll(void) { poll_all(); }

/* Appends an operation to its group's queue, started at once if the queue was empty. */
static sim_op *enqueue(comm_group *g, op_kind kind, const void *send, size_t send_count, int dest,
                       void *recv, size_t recv_count, int source, comm_op op) {
    sim_op *o = calloc(1, sizeof *o);
    if (!o) { fprintf(stderr, "comm_nccl_sim: out of host memory\n"); exit(1); }
    *o = (sim_op){.kind = kind, .g = g, .send = send, .recv = recv, .send_count = send_count,
                  .recv_count = recv_count, .dest = dest, .source = source, .op = op};
    sim_queue *q = queue_of(g);
    if (q->tail) q->tail->next = o;
    else q->head = o;
    q->tail = o;
    advance(q);
    return o;
}

/* Blocks until the operation has completed, every queue moving meanwhile (rule 4); returns the
 * seconds waited. Yields the core when nothing moved: the ranks may outnumber the cores. */
static double sim_wait(void *handle) {
    sim_op *o = handle;
    double t0 = MPI_Wtime();
    while (!o->done)
        if (!poll_all()) sched_yield();
    free(o);
    return MPI_Wtime() - t0;
}
static void sim_progress(void *handle) { (void)handle; poll_all(); }

/* ---- the operations: non-blocking ones are queue entries, blocking ones wait for theirs ---- */

static void *sim_iall_reduce(comm_group *g, float *buf, size_t count, comm_op op) {
    return enqueue(g, OP_ALL_REDUCE, NULL, 0, -1, buf, count, -1, op);
}
static void *sim_iall_gather(comm_group *g, const float *send, float *recv, size_t count) {
    return enqueue(g, OP_ALL_GATHER, send, count, -1, recv, count * g->size, -1, COMM_SUM);
}
static void *sim_iall_gather_bytes(comm_group *g, const void *send, void *recv, size_t nbytes) {
    return enqueue(g, OP_ALL_GATHER_BYTES, send, nbytes, -1, recv, nbytes * g->size, -1, COMM_SUM);
}
static void *sim_ireduce_scatter(comm_group *g, const float *send, float *recv, size_t count) {
    return enqueue(g, OP_REDUCE_SCATTER, send, count * g->size, -1, recv, count, -1, COMM_SUM);
}
static void *sim_isend(comm_group *g, const float *buf, size_t count, int peer) {
    return enqueue(g, OP_SEND, buf, count, peer, NULL, 0, -1, COMM_SUM);
}
static void *sim_irecv(comm_group *g, float *buf, size_t count, int peer) {
    return enqueue(g, OP_RECV, NULL, 0, -1, buf, count, peer, COMM_SUM);
}
static void *sim_isendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                           float *recvbuf, size_t recv_count, int source) {
    return enqueue(g, OP_SENDRECV, sendbuf, send_count, dest, recvbuf, recv_count, source, COMM_SUM);
}

static void sim_all_reduce(comm_group *g, float *buf, size_t count, comm_op op) {
    sim_wait(sim_iall_reduce(g, buf, count, op));
}
static void sim_all_gather(comm_group *g, const float *send, float *recv, size_t count) {
    sim_wait(sim_iall_gather(g, send, recv, count));
}
static void sim_reduce_scatter(comm_group *g, const float *send, float *recv, size_t count) {
    sim_wait(sim_ireduce_scatter(g, send, recv, count));
}
static void sim_broadcast(comm_group *g, float *buf, size_t count, int root) {
    sim_wait(enqueue(g, OP_BROADCAST, NULL, 0, -1, buf, count, root, COMM_SUM));
}
static void sim_all_to_all(comm_group *g, const float *send, float *recv, size_t count) {
    sim_wait(enqueue(g, OP_ALL_TO_ALL, send, count, -1, recv, count * g->size, -1, COMM_SUM));
}
static void sim_send(comm_group *g, const float *buf, size_t count, int peer) { sim_wait(sim_isend(g, buf, count, peer)); }
static void sim_recv(comm_group *g, float *buf, size_t count, int peer) { sim_wait(sim_irecv(g, buf, count, peer)); }
static void sim_sendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                         float *recvbuf, size_t recv_count, int source) {
    sim_wait(sim_isendrecv(g, sendbuf, send_count, dest, recvbuf, recv_count, source));
}

/* ---- groups ---- */

static void sim_init(comm_group *world, int node_ranks) {
    (void)node_ranks;
    if (strcmp(device_backend_name(), "cpu") != 0)
        comm_exit_usage("COMM=nccl-sim emulates NCCL on the CPU build (BACKEND=cpu); with "
                        "BACKEND=cuda use COMM=nccl (one rank per GPU) or COMM=mpi");
    add_queue(world);
}
static void sim_split(comm_group *parent, comm_group *child, int color, int key) {
    if (child) add_queue(child);
}
/* What is still queued has to finish before MPI_Finalize, or the peers would wait for it. */
static void sim_finalize(void) {
    for (int i = 0; i < n_queues; i++) {
        while (queues[i]->head)
            if (!advance(queues[i])) { poll_all(); sched_yield(); }
    }
    for (int i = 0; i < n_queues; i++) {
        MPI_Comm_free(&queues[i]->comm);
        free(queues[i]);
    }
    free(queues);
    queues = NULL;
    n_queues = cap_queues = 0;
}
static void sim_sync(void) {}

const comm_backend comm_nccl_sim_backend = {
    .name = "nccl-sim", .host_timed = true,
    .init = sim_init, .split = sim_split, .finalize = sim_finalize, .sync = sim_sync,
    .settle = NULL, .poll = sim_poll,
    .all_reduce = sim_all_reduce, .all_gather = sim_all_gather, .reduce_scatter = sim_reduce_scatter,
    .broadcast = sim_broadcast, .all_to_all = sim_all_to_all, .send = sim_send, .recv = sim_recv,
    .sendrecv = sim_sendrecv,
    .isend = sim_isend, .irecv = sim_irecv, .isendrecv = sim_isendrecv, .iall_reduce = sim_iall_reduce,
    .iall_gather = sim_iall_gather, .ireduce_scatter = sim_ireduce_scatter,
    .iall_gather_bytes = sim_iall_gather_bytes, .wait = sim_wait, .progress = sim_progress,
};
