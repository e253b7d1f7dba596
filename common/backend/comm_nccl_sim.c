/* comm_nccl_sim.c: COMM=nccl-sim, NCCL's ordering rules enforced on the CPU (comm_backend.h).
 *
 * MPI forgives orders of calls that NCCL does not: MPI progresses every operation on its own,
 * buffers small sends, lets a receive posted early wait beside later operations, and has its
 * connections ready before the first message. A program that is correct only under those rules
 * passes every CPU test and hangs on its first GPU run. This backend moves the data with MPI but
 * under NCCL's rules, so such a program hangs here, on the CPU, in `make test`, where the
 * watchdog ends it (exit 3) naming the call it waited in and what that call waited for:
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
 *      whenever this rank waits (comm_wait, a blocking call, a host-side agreement, a connection
 *      below), every queue starts what it can. The host blocks in a blocking call until it
 *      completes.
 *   5. Point-to-point connections are made lazily, and making one blocks the host. NCCL 2.28
 *      connects a (communicator, peer, direction) at the first ncclSend or ncclRecv that uses it:
 *      ncclGroupEnd runs the pre-connect job and waits for it (src/enqueue.cc p2pTaskAppend,
 *      src/group.cc, src/transport.cc ncclTransportP2pSetup), which exchanges the connection's
 *      details with the peer over the bootstrap network and blocks in bootstrapRecv until the
 *      peer's host makes its own first call on that connection. Here the same exchange runs at
 *      the issue of the operation, before it joins its queue, in NCCL's order: for i = 1 .. n-1,
 *      the peers r+i (this rank sends to it) and r-i (receives from it); a message to each, then
 *      a blocking receive from each; then a closing round in the same order. Where r+i and r-i
 *      are one peer (a group of two) NCCL sends one message holding both directions, and fails
 *      its set-up when the two sides disagree on what they connect: so does this backend.
 *   6. Collectives connect lazily too. With NCCL_RUNTIME_CONNECT=1 (NCCL's default since 2.22) a
 *      communicator connects an algorithm's channels (ring, tree, ...) at the first collective that
 *      uses it, in a host-blocking exchange among its ranks (src/enqueue.cc, src/group.cc
 *      ncclCollPreconnect). Which algorithm NCCL picks depends on the collective and its size, so
 *      any collective may be such a first one: here every collective on a group of two or more
 *      ranks begins with a rendezvous of the group's ranks (the host blocks until each has issued
 *      it), a stricter rule that holds whenever NCCL's does.
 *
 * Rules 5 and 6 are on by default. The connection messages travel on a communicator of their own
 * (NCCL's bootstrap network), never matched with the data's.
 *
 * Only the CPU build: the buffers go to MPI as they are.
 */
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm_backend.h"
#include "comm_mpi_types.h"
#include "device.h"
#include "guard.h"

typedef enum {
    OP_ALL_REDUCE, OP_ALL_GATHER, OP_ALL_GATHER_BYTES, OP_REDUCE_SCATTER, OP_BROADCAST,
    OP_ALL_TO_ALL, OP_ALL_TO_ALL_V, OP_SEND, OP_RECV, OP_SENDRECV
} op_kind;

/* One entry of a group's queue: the operation's arguments, kept until its turn comes. */
typedef struct sim_op {
    op_kind kind;
    comm_group *g;
    const void *send;
    void *recv;
    size_t send_count, recv_count;  /* elements of `type` (bytes for OP_ALL_GATHER_BYTES)       */
    dtype type;
    int dest, source;               /* send/recv peers; the root of a broadcast is `source`    */
    comm_op op;
    MPI_Request req[2];
    int nreq;
    int *v;                         /* OP_ALL_TO_ALL_V: send counts, displacements, recv counts,
                                     * displacements, [4 x the group's size] (owned)            */
    bool started, done;
    struct sim_op *next;
} sim_op;

/* The point-to-point connections of rule 5, per peer: this rank -> peer, peer -> this rank. */
enum { CONN_SEND = 1, CONN_RECV = 2 };

/* A group's queue, on an MPI communicator of its own: duplicated from the group's, as NCCL's
 * communicator is separate from MPI's, so that an operation started late (rule 1) is never
 * matched with a host-side collective (comm_host_sum, comm_barrier) on the group's own. A second
 * duplicate carries the connection handshakes of rules 5 and 6 (NCCL's bootstrap network). */
typedef struct {
    sim_op *head, *tail;
    MPI_Comm comm, bootstrap;
    comm_group *g;
    unsigned char *connected;   /* [g->size]: CONN_SEND | CONN_RECV made so far (rule 5)   */
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
    if (q) q->connected = calloc((size_t)g->size, 1);
    if (!queues || !q || !q->connected) { fprintf(stderr, "comm_nccl_sim: out of host memory\n"); exit(1); }
    MPI_Comm_dup(mpi_of(g), &q->comm);   /* collective over g: every member adds its queue here */
    MPI_Comm_dup(mpi_of(g), &q->bootstrap);
    q->g = g;
    g->backend = q;
    queues[n_queues++] = q;
}

/* The operation's MPI calls, now that it is at the head of its queue. */
static void start(sim_op *o) {
    MPI_Comm c = queue_of(o->g)->comm;
    int sc = (int)o->send_count, rc = (int)o->recv_count;
    MPI_Datatype t = comm_mpi_type(o->type);   /* (comm_mpi_types.h: bf16's SUM widens to fp32) */
    o->nreq = 1;
    switch (o->kind) {
    case OP_ALL_REDUCE: MPI_Iallreduce(MPI_IN_PLACE, o->recv, rc, t, comm_mpi_op(o->op, o->type), c, &o->req[0]); break;
    case OP_ALL_GATHER: MPI_Iallgather(o->send, sc, t, o->recv, sc, t, c, &o->req[0]); break;
    case OP_ALL_GATHER_BYTES: MPI_Iallgather(o->send, sc, MPI_BYTE, o->recv, sc, MPI_BYTE, c, &o->req[0]); break;
    case OP_REDUCE_SCATTER:
        MPI_Ireduce_scatter_block(o->send, o->recv, rc, t, comm_mpi_op(COMM_SUM, o->type), c, &o->req[0]);
        break;
    case OP_BROADCAST: MPI_Ibcast(o->recv, rc, t, o->source, c, &o->req[0]); break;
    case OP_ALL_TO_ALL: MPI_Ialltoall(o->send, sc, t, o->recv, sc, t, c, &o->req[0]); break;
    case OP_ALL_TO_ALL_V: {
        int n = o->g->size, *v = o->v;
        MPI_Ialltoallv(o->send, v, v + n, t, o->recv, v + 2 * n, v + 3 * n, t, c, &o->req[0]);
        break;
    }
    case OP_SEND: MPI_Issend(o->send, sc, t, o->dest, 0, c, &o->req[0]); break;
    case OP_RECV: MPI_Irecv(o->recv, rc, t, o->source, 0, c, &o->req[0]); break;
    case OP_SENDRECV:
        o->nreq = 2;
        MPI_Irecv(o->recv, rc, t, o->source, 0, c, &o->req[0]);
        MPI_Issend(o->send, sc, t, o->dest, 0, c, &o->req[1]);
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

/* The handshake messages of rules 5 and 6 in flight (sent without waiting, as NCCL's bootstrap
 * sends are): each completed and released by a later poll. */
typedef struct { MPI_Request req; int what; } hello;
static hello **hellos;
static int n_hellos, cap_hellos;

static bool finish_hellos(void) {
    bool moved = false;
    for (int i = 0; i < n_hellos;) {
        int done = 0;
        MPI_Test(&hellos[i]->req, &done, MPI_STATUS_IGNORE);
        if (!done) { i++; continue; }
        free(hellos[i]);
        hellos[i] = hellos[--n_hellos];
        moved = true;
    }
    return moved;
}

/* Rule 4: every queue of this rank moves (one pass). */
static bool poll_all(void) {
    bool moved = finish_hellos();
    for (int i = 0; i < n_queues; i++) moved |= advance(queues[i]);
    return moved;
}
static void sim_poll(void) { poll_all(); }


/* An operation in words, for the watchdog's line: "recv from rank 0", "all_reduce". */
static const char *op_name(const sim_op *o) {
    static char name[48];
    static const char *names[] = {"all_reduce", "all_gather", "all_gather", "reduce_scatter", "broadcast",
                                  "all_to_all", "all_to_all", "send", "recv", "sendrecv"};
    if (o->kind == OP_SEND) snprintf(name, sizeof name, "send to rank %d", o->dest);
    else if (o->kind == OP_RECV) snprintf(name, sizeof name, "recv from rank %d", o->source);
    else snprintf(name, sizeof name, "%s", names[o->kind]);
    return name;
}

/* ---- rules 5 and 6: connections made at the first use, blocking the host ---- */

/* Blocks until req completes, the queues moving meanwhile (rule 4: the GPU runs what was queued
 * while the host waits in NCCL's set-up). */
static void host_blocks_on(MPI_Request *req) {
    int done = 0;
    for (MPI_Test(req, &done, MPI_STATUS_IGNORE); !done; MPI_Test(req, &done, MPI_STATUS_IGNORE))
        if (!poll_all()) sched_yield();
}

static void hello_send(sim_queue *q, int peer, int tag, int what) {
    if (n_hellos == cap_hellos) {
        cap_hellos = cap_hellos ? 2 * cap_hellos : 16;
        hellos = realloc(hellos, (size_t)cap_hellos * sizeof *hellos);
    }
    hello *h = malloc(sizeof *h);
    if (!hellos || !h) { fprintf(stderr, "comm_nccl_sim: out of host memory\n"); exit(1); }
    h->what = what;
    MPI_Isend(&h->what, 1, MPI_INT, peer, tag, q->bootstrap, &h->req);
    hellos[n_hellos++] = h;
}

static const char *dir_name(int what) {
    return what == (CONN_SEND | CONN_RECV) ? "send and recv" : what == CONN_SEND ? "send" : what == CONN_RECV ? "recv" : "nothing";
}

/* What the peer tells us it connects with us at this distance; the watchdog's line says whom the
 * host waits for, and for which of its first calls. */
static int hello_recv(sim_queue *q, int peer, int tag, int mine) {
    char note[160], who[64];
    if (q->g->counted_as) snprintf(who, sizeof who, "the link's other rank");   /* a link: a two-rank group */
    else snprintf(who, sizeof who, "rank %d of group %s", peer, q->g->name);
    snprintf(note, sizeof note, "NCCL's lazy connection: waiting for %s to make its first %s %s this rank", who,
             mine == CONN_SEND ? "recv" : mine == CONN_RECV ? "send" : "send/recv",
             mine == CONN_SEND ? "from" : mine == CONN_RECV ? "to" : "with");
    guard_note(note);
    int what = 0;
    MPI_Request req;
    MPI_Irecv(&what, 1, MPI_INT, peer, tag, q->bootstrap, &req);
    host_blocks_on(&req);
    guard_note(NULL);
    return what;
}

/* In a group of two, NCCL sends one message holding both directions' details, sized by what this
 * side connects, and the peer receives into a buffer sized by what it connects: they must agree
 * (this rank's send is the peer's recv and the other way round), else NCCL's set-up fails
 * ("Message truncated") or reads garbage. The program is wrong: say so and end the job. */
static void check_pairing(sim_queue *q, int peer, int mine, int theirs) {
    int want = ((mine & CONN_SEND) ? CONN_RECV : 0) | ((mine & CONN_RECV) ? CONN_SEND : 0);
    if (theirs == want) return;
    if (guard_claim_line())
        fprintf(stderr, "error: group %s: this rank's first point-to-point call with rank %d connects %s, the peer's "
                "connects %s at the same time: NCCL's connection set-up fails on that (\"Message truncated\"); make "
                "the first calls of the two ranks pair up (comm_nccl_sim.c, rule 5)\n", q->g->name, peer,
                dir_name(mine), dir_name(theirs));
    MPI_Abort(MPI_COMM_WORLD, GUARD_EXIT_STALLED);
}

/* Rule 5: the connections `want` ([size]: CONN_SEND to a peer, CONN_RECV from it) that this rank
 * has not made yet on q's group, made now as ncclTransportP2pSetup makes them. */
static void connect_p2p(sim_queue *q, const unsigned char *want) {
    int n = q->g->size, r = q->g->rank;
    unsigned char need[n];
    bool any = false;
    for (int p = 0; p < n; p++) {
        need[p] = p == r ? 0 : (unsigned char)(want[p] & ~q->connected[p]);
        any |= need[p] != 0;
    }
    if (!any) return;
    for (int round = 0; round < 2; round++)   /* the exchange, then the closing round */
        for (int i = 1; i < n; i++) {
            int tag = i + round * 4096, sp = (r + i) % n, rp = (r - i + n) % n;
            int ns = need[sp] & CONN_SEND, nr = need[rp] & CONN_RECV;
            if (!ns && !nr) continue;
            if (sp == rp) {
                hello_send(q, sp, tag, ns | nr);
                int theirs = hello_recv(q, sp, tag, ns | nr);
                if (round == 0) check_pairing(q, sp, ns | nr, theirs);
                continue;
            }
            if (nr) hello_send(q, rp, tag, CONN_RECV);
            if (ns) hello_send(q, sp, tag, CONN_SEND);
            if (ns) hello_recv(q, sp, tag, CONN_SEND);
            if (nr) hello_recv(q, rp, tag, CONN_RECV);
        }
    for (int p = 0; p < n; p++) q->connected[p] |= need[p];
}

/* Rule 6: a collective's connection, a rendezvous of the group's ranks. */
static void connect_collective(sim_queue *q, const char *what) {
    if (q->g->size < 2) return;
    char note[160];
    snprintf(note, sizeof note, "NCCL's lazy connection of the %s: waiting for every rank of this group to issue it", what);
    guard_note(note);
    MPI_Request req;
    MPI_Ibarrier(q->bootstrap, &req);
    host_blocks_on(&req);
    guard_note(NULL);
}

/* What an operation connects before it joins its queue (rules 5 and 6). */
static void connect_for(sim_queue *q, op_kind kind, int dest, int source) {
    int n = q->g->size;
    unsigned char want[n];
    memset(want, 0, (size_t)n);
    switch (kind) {
    case OP_SEND: want[dest] |= CONN_SEND; break;
    case OP_RECV: want[source] |= CONN_RECV; break;
    case OP_SENDRECV: want[dest] |= CONN_SEND; want[source] |= CONN_RECV; break;
    case OP_ALL_TO_ALL: case OP_ALL_TO_ALL_V: memset(want, CONN_SEND | CONN_RECV, (size_t)n); break;
    case OP_ALL_REDUCE: connect_collective(q, "all_reduce"); return;
    case OP_ALL_GATHER: case OP_ALL_GATHER_BYTES: connect_collective(q, "all_gather"); return;
    case OP_REDUCE_SCATTER: connect_collective(q, "reduce_scatter"); return;
    case OP_BROADCAST: connect_collective(q, "broadcast"); return;
    }
    connect_p2p(q, want);
}

/* Appends an operation to its group's queue, started at once if the queue was empty; first, what
 * it connects (rules 5 and 6), as ncclGroupEnd does before the operation reaches the stream. */
static sim_op *push(sim_op *o) {
    sim_queue *q = queue_of(o->g);
    connect_for(q, o->kind, o->dest, o->source);
    if (q->tail) q->tail->next = o;
    else q->head = o;
    q->tail = o;
    advance(q);
    return o;
}
static sim_op *new_op(void) {
    sim_op *o = calloc(1, sizeof *o);
    if (!o) { fprintf(stderr, "comm_nccl_sim: out of host memory\n"); exit(1); }
    return o;
}
static sim_op *enqueue(comm_group *g, op_kind kind, dtype t, const void *send, size_t send_count, int dest,
                       void *recv, size_t recv_count, int source, comm_op op) {
    sim_op *o = new_op();
    *o = (sim_op){.kind = kind, .g = g, .send = send, .recv = recv, .send_count = send_count,
                  .recv_count = recv_count, .type = t, .dest = dest, .source = source, .op = op};
    return push(o);
}

/* The all-to-all with counts: its counts and displacements `v` (owned by the entry from now on)
 * are in place before the entry can start. */
static sim_op *enqueue_v(comm_group *g, dtype t, const void *send, size_t sent, void *recv, size_t got, int *v) {
    sim_op *o = new_op();
    *o = (sim_op){.kind = OP_ALL_TO_ALL_V, .g = g, .send = send, .recv = recv, .send_count = sent,
                  .recv_count = got, .type = t, .dest = -1, .source = -1, .op = COMM_SUM, .v = v};
    return push(o);
}

/* Blocks until the operation has completed, every queue moving meanwhile (rule 4); returns the
 * seconds waited. Yields the core when nothing moved: the ranks may outnumber the cores. */
static double sim_wait(void *handle) {
    sim_op *o = handle;
    double t0 = MPI_Wtime();
    const sim_op *behind = NULL;   /* the entry at the head of o's queue, named for the watchdog */
    while (!o->done) {
        const sim_op *head = queue_of(o->g)->head;
        if (head != o && head != behind && head) {
            char note[160];
            snprintf(note, sizeof note, "queued behind the %s this rank issued earlier on the group", op_name(head));
            guard_note(note);
        }
        behind = head;
        if (!poll_all()) sched_yield();
    }
    guard_note(NULL);
    free(o->v);
    free(o);
    return MPI_Wtime() - t0;
}
static void sim_progress(void *handle) { (void)handle; poll_all(); }

/* ---- the operations: non-blocking ones are queue entries, blocking ones wait for theirs ---- */

static void *sim_iall_reduce(comm_group *g, dtype t, void *buf, size_t count, comm_op op) {
    return enqueue(g, OP_ALL_REDUCE, t, NULL, 0, -1, buf, count, -1, op);
}
static void *sim_iall_gather(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    return enqueue(g, OP_ALL_GATHER, t, send, count, -1, recv, count * g->size, -1, COMM_SUM);
}
static void *sim_iall_gather_bytes(comm_group *g, const void *send, void *recv, size_t nbytes) {
    return enqueue(g, OP_ALL_GATHER_BYTES, DTYPE_F32, send, nbytes, -1, recv, nbytes * g->size, -1, COMM_SUM);
}
static void *sim_ireduce_scatter(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    return enqueue(g, OP_REDUCE_SCATTER, t, send, count * g->size, -1, recv, count, -1, COMM_SUM);
}
static void *sim_isend(comm_group *g, dtype t, const void *buf, size_t count, int peer) {
    return enqueue(g, OP_SEND, t, buf, count, peer, NULL, 0, -1, COMM_SUM);
}
static void *sim_irecv(comm_group *g, dtype t, void *buf, size_t count, int peer) {
    return enqueue(g, OP_RECV, t, NULL, 0, -1, buf, count, peer, COMM_SUM);
}
static void *sim_isendrecv(comm_group *g, dtype t, const void *sendbuf, size_t send_count, int dest,
                           void *recvbuf, size_t recv_count, int source) {
    return enqueue(g, OP_SENDRECV, t, sendbuf, send_count, dest, recvbuf, recv_count, source, COMM_SUM);
}

static void sim_all_reduce(comm_group *g, dtype t, void *buf, size_t count, comm_op op) {
    sim_wait(sim_iall_reduce(g, t, buf, count, op));
}
static void sim_all_gather(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    sim_wait(sim_iall_gather(g, t, send, recv, count));
}
static void sim_reduce_scatter(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    sim_wait(sim_ireduce_scatter(g, t, send, recv, count));
}
static void sim_broadcast(comm_group *g, dtype t, void *buf, size_t count, int root) {
    sim_wait(enqueue(g, OP_BROADCAST, t, NULL, 0, -1, buf, count, root, COMM_SUM));
}
static void sim_all_to_all(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    sim_wait(enqueue(g, OP_ALL_TO_ALL, t, send, count, -1, recv, count * g->size, -1, COMM_SUM));
}
/* Every peer is connected both ways, even where a count is 0: NCCL 2.28 marks a peer for
 * connection at any ncclSend/ncclRecv, whatever its count (src/enqueue.cc, p2pTaskAppend), and
 * comm_nccl.cu issues one of each per peer. */
static void sim_all_to_all_v(comm_group *g, dtype t, const void *send, const size_t *send_counts, void *recv,
                             const size_t *recv_counts) {
    int n = g->size, *v = malloc(4 * (size_t)n * sizeof *v);
    if (!v) { fprintf(stderr, "comm_nccl_sim: out of host memory\n"); exit(1); }
    size_t sent = comm_mpi_counts(send_counts, n, v, v + n), got = comm_mpi_counts(recv_counts, n, v + 2 * n, v + 3 * n);
    sim_op *o = enqueue_v(g, t, send, sent, recv, got, v);
    sim_wait(o);
}
static void sim_send(comm_group *g, dtype t, const void *buf, size_t count, int peer) {
    sim_wait(sim_isend(g, t, buf, count, peer));
}
static void sim_recv(comm_group *g, dtype t, void *buf, size_t count, int peer) {
    sim_wait(sim_irecv(g, t, buf, count, peer));
}
static void sim_sendrecv(comm_group *g, dtype t, const void *sendbuf, size_t send_count, int dest,
                         void *recvbuf, size_t recv_count, int source) {
    sim_wait(sim_isendrecv(g, t, sendbuf, send_count, dest, recvbuf, recv_count, source));
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
/* The connection alone, as comm_ring_links makes each link's when it creates it (rule 5). */
static void sim_connect(comm_group *g, int peer, bool send) {
    unsigned char want[g->size];
    memset(want, 0, sizeof want);
    want[peer] = send ? CONN_SEND : CONN_RECV;
    connect_p2p(queue_of(g), want);
}
/* What is still queued has to finish before MPI_Finalize, or the peers would wait for it. */
static void sim_finalize(void) {
    for (int i = 0; i < n_queues; i++) {
        while (queues[i]->head)
            if (!advance(queues[i])) { poll_all(); sched_yield(); }
    }
    while (n_hellos > 0)
        if (!finish_hellos()) sched_yield();
    free(hellos);
    hellos = NULL;
    cap_hellos = 0;
    for (int i = 0; i < n_queues; i++) {
        MPI_Comm_free(&queues[i]->comm);
        MPI_Comm_free(&queues[i]->bootstrap);
        free(queues[i]->connected);
        free(queues[i]);
    }
    free(queues);
    queues = NULL;
    n_queues = cap_queues = 0;
}
static void sim_sync(void) {}

const comm_backend comm_nccl_sim_backend = {
    .name = "nccl-sim", .host_timed = true, .nccl_buffers = true, .on_device = false,
    .init = sim_init, .split = sim_split, .connect = sim_connect, .finalize = sim_finalize, .sync = sim_sync,
    .settle = NULL, .poll = sim_poll,
    .all_reduce = sim_all_reduce, .all_gather = sim_all_gather, .reduce_scatter = sim_reduce_scatter,
    .broadcast = sim_broadcast, .all_to_all = sim_all_to_all, .all_to_all_v = sim_all_to_all_v, .send = sim_send, .recv = sim_recv,
    .sendrecv = sim_sendrecv,
    .isend = sim_isend, .irecv = sim_irecv, .isendrecv = sim_isendrecv, .iall_reduce = sim_iall_reduce,
    .iall_gather = sim_iall_gather, .ireduce_scatter = sim_ireduce_scatter,
    .iall_gather_bytes = sim_iall_gather_bytes, .wait = sim_wait, .progress = sim_progress,
};
