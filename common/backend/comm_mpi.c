/* comm_mpi.c: COMM=mpi, the collectives' data moved by MPI (see comm_backend.h).
 *
 * On the CPU build a buffer is host memory and goes to MPI as it is. On the CUDA build it is
 * device memory, which Debian's Open MPI cannot read: each operation is staged through host
 * memory (device -> host copy, MPI on the copy, host -> device copy of the result). That is slow,
 * but it lets several ranks share one GPU, which NCCL refuses: one GPU can then run every
 * chapter's layouts (make gpu-check).
 *
 * The CPU build takes the staged path too when the environment sets COMM_STAGE=1 (its "device"
 * memory is host memory, so the copies are memcpy): make test runs the collectives' tests and a
 * pipeline that way, so the CUDA build's staging is exercised without a GPU (tests/t_nccl_sim.sh).
 *
 * MPI matches the messages between two ranks in the order they were sent and progresses every
 * operation on its own, so it accepts orders of calls that NCCL would deadlock on; COMM=nccl-sim
 * (comm_nccl_sim.c) is the backend that checks those.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm_backend.h"
#include "comm_mpi_types.h"
#include "device.h"

static MPI_Comm mpi_of(comm_group *g) { return *(MPI_Comm *)g->mpi_comm; }
/* ---- element types and reductions (comm_mpi_types.h) ---- */

/* bf16 SUM and MAX, element by element: in[i] combined into inout[i], in fp32, rounded once. */
static void bf16_combine(void *in, void *inout, int *len, MPI_Datatype *type, bool max) {
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) {
        float x = bf16_to_float(a[i]), y = bf16_to_float(b[i]);
        b[i] = bf16_from_float(max ? (x > y ? x : y) : x + y);
    }
}
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type) { bf16_combine(in, inout, len, type, false); }
static void bf16_max(void *in, void *inout, int *len, MPI_Datatype *type) { bf16_combine(in, inout, len, type, true); }

MPI_Datatype comm_mpi_type(dtype t) { return t == DTYPE_BF16 ? MPI_UINT16_T : MPI_FLOAT; }
MPI_Op comm_mpi_op(comm_op op, dtype t) {
    static MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL;   /* created at the first bf16 reduction */
    if (t != DTYPE_BF16) return op == COMM_MAX ? MPI_MAX : MPI_SUM;
    if (sum == MPI_OP_NULL) {
        MPI_Op_create(bf16_sum, 1, &sum);
        MPI_Op_create(bf16_max, 1, &max);
    }
    return op == COMM_MAX ? max : sum;
}

/* ---- staging: device buffers seen by MPI through host copies (CUDA build only) ---- */

static bool g_staged;   /* mpi_init: the CUDA build, or COMM_STAGE=1 */
static bool staged(void) { return g_staged; }

/* One buffer of an operation as MPI sees it: the device buffer itself on the CPU build, else a
 * host copy (filled from the device when `fill`). */
typedef struct {
    void *dev, *host;
    size_t bytes;
} stage_buf;

static void *stage_in(stage_buf *s, const void *dev, size_t bytes, bool fill) {
    s->dev = (void *)dev;
    s->bytes = bytes;
    s->host = NULL;
    if (!staged()) return (void *)dev;
    s->host = malloc(bytes ? bytes : 1);
    if (!s->host) { fprintf(stderr, "comm_mpi: out of host memory for a %zu-byte staging buffer\n", bytes); exit(1); }
    if (fill && bytes) device_copy_to_host(s->host, dev, bytes);
    return s->host;
}

/* After MPI: the result back on the device (when `result`), the host copy released. */
static void stage_out(stage_buf *s, bool result) {
    if (!s->host) return;
    if (result && s->bytes) device_copy_to_device(s->dev, s->host, s->bytes);
    free(s->host);
    s->host = NULL;
}

/* ---- blocking ---- */

#define E dtype_size(t)   /* bytes of one element of the operation's type */

static void mpi_all_reduce(comm_group *g, dtype t, void *buf, size_t count, comm_op op) {
    stage_buf b;
    void *h = stage_in(&b, buf, count * E, true);
    MPI_Allreduce(MPI_IN_PLACE, h, (int)count, comm_mpi_type(t), comm_mpi_op(op, t), mpi_of(g));
    stage_out(&b, true);
}
static void mpi_all_gather(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    stage_buf s, r;
    void *hs = stage_in(&s, send, count * E, true), *hr = stage_in(&r, recv, count * E * g->size, false);
    MPI_Allgather(hs, (int)count, comm_mpi_type(t), hr, (int)count, comm_mpi_type(t), mpi_of(g));
    stage_out(&s, false);
    stage_out(&r, true);
}
static void mpi_reduce_scatter(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    stage_buf s, r;
    void *hs = stage_in(&s, send, count * E * g->size, true), *hr = stage_in(&r, recv, count * E, false);
    MPI_Reduce_scatter_block(hs, hr, (int)count, comm_mpi_type(t), comm_mpi_op(COMM_SUM, t), mpi_of(g));
    stage_out(&s, false);
    stage_out(&r, true);
}
static void mpi_broadcast(comm_group *g, dtype t, void *buf, size_t count, int root) {
    stage_buf b;
    void *h = stage_in(&b, buf, count * E, g->rank == root);
    MPI_Bcast(h, (int)count, comm_mpi_type(t), root, mpi_of(g));
    stage_out(&b, true);
}
static void mpi_all_to_all(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    stage_buf s, r;
    size_t bytes = count * E * g->size;
    void *hs = stage_in(&s, send, bytes, true), *hr = stage_in(&r, recv, bytes, false);
    MPI_Alltoall(hs, (int)count, comm_mpi_type(t), hr, (int)count, comm_mpi_type(t), mpi_of(g));
    stage_out(&s, false);
    stage_out(&r, true);
}
static void mpi_all_to_all_v(comm_group *g, dtype t, const void *send, const size_t *send_counts, void *recv,
                             const size_t *recv_counts) {
    int n = g->size, sc[n], sd[n], rc[n], rd[n];
    size_t sent = comm_mpi_counts(send_counts, n, sc, sd), got = comm_mpi_counts(recv_counts, n, rc, rd);
    stage_buf s, r;
    void *hs = stage_in(&s, send, sent * E, true), *hr = stage_in(&r, recv, got * E, false);
    MPI_Alltoallv(hs, sc, sd, comm_mpi_type(t), hr, rc, rd, comm_mpi_type(t), mpi_of(g));
    stage_out(&s, false);
    stage_out(&r, true);
}
static void mpi_send(comm_group *g, dtype t, const void *buf, size_t count, int peer) {
    stage_buf s;
    MPI_Send(stage_in(&s, buf, count * E, true), (int)count, comm_mpi_type(t), peer, 0, mpi_of(g));
    stage_out(&s, false);
}
static void mpi_recv(comm_group *g, dtype t, void *buf, size_t count, int peer) {
    stage_buf r;
    MPI_Recv(stage_in(&r, buf, count * E, false), (int)count, comm_mpi_type(t), peer, 0, mpi_of(g),
             MPI_STATUS_IGNORE);
    stage_out(&r, true);
}
/* Both at once, so a ring shift (everyone sends right and receives from the left) cannot
 * deadlock. Tag 0 like every message here: MPI matches them in the order they were sent. */
static void mpi_sendrecv(comm_group *g, dtype t, const void *sendbuf, size_t send_count, int dest,
                         void *recvbuf, size_t recv_count, int source) {
    stage_buf s, r;
    void *hs = stage_in(&s, sendbuf, send_count * E, true), *hr = stage_in(&r, recvbuf, recv_count * E, false);
    MPI_Sendrecv(hs, (int)send_count, comm_mpi_type(t), dest, 0, hr, (int)recv_count, comm_mpi_type(t), source, 0,
                 mpi_of(g), MPI_STATUS_IGNORE);
    stage_out(&s, false);
    stage_out(&r, true);
}

/* ---- non-blocking: the handle holds the MPI request(s) of one operation and its staging ---- */

typedef struct {
    int n;                  /* 1, or 2 for a sendrecv */
    MPI_Request req[2];
    stage_buf send, recv;   /* recv.dev gets the result at the wait (staged builds)     */
    bool has_result;
} mpi_request;

static mpi_request *new_request(int n) {
    mpi_request *r = calloc(1, sizeof *r);
    if (!r) { fprintf(stderr, "comm_mpi: out of memory for a request\n"); exit(1); }
    r->n = n;
    return r;
}

static void *mpi_isend(comm_group *g, dtype t, const void *buf, size_t count, int peer) {
    mpi_request *r = new_request(1);
    MPI_Isend(stage_in(&r->send, buf, count * E, true), (int)count, comm_mpi_type(t), peer, 0, mpi_of(g), &r->req[0]);
    return r;
}
static void *mpi_irecv(comm_group *g, dtype t, void *buf, size_t count, int peer) {
    mpi_request *r = new_request(1);
    r->has_result = true;
    MPI_Irecv(stage_in(&r->recv, buf, count * E, false), (int)count, comm_mpi_type(t), peer, 0, mpi_of(g), &r->req[0]);
    return r;
}
/* Receive posted first: the matching send of the peer can land straight in recvbuf. */
static void *mpi_isendrecv(comm_group *g, dtype t, const void *sendbuf, size_t send_count, int dest,
                           void *recvbuf, size_t recv_count, int source) {
    mpi_request *r = new_request(2);
    r->has_result = true;
    void *hr = stage_in(&r->recv, recvbuf, recv_count * E, false);
    void *hs = stage_in(&r->send, sendbuf, send_count * E, true);
    MPI_Irecv(hr, (int)recv_count, comm_mpi_type(t), source, 0, mpi_of(g), &r->req[0]);
    MPI_Isend(hs, (int)send_count, comm_mpi_type(t), dest, 0, mpi_of(g), &r->req[1]);
    return r;
}
static void *mpi_iall_reduce(comm_group *g, dtype t, void *buf, size_t count, comm_op op) {
    mpi_request *r = new_request(1);
    r->has_result = true;
    MPI_Iallreduce(MPI_IN_PLACE, stage_in(&r->recv, buf, count * E, true), (int)count, comm_mpi_type(t),
                   comm_mpi_op(op, t), mpi_of(g), &r->req[0]);
    return r;
}
static void *mpi_iall_gather(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    mpi_request *r = new_request(1);
    r->has_result = true;
    void *hs = stage_in(&r->send, send, count * E, true), *hr = stage_in(&r->recv, recv, count * E * g->size, false);
    MPI_Iallgather(hs, (int)count, comm_mpi_type(t), hr, (int)count, comm_mpi_type(t), mpi_of(g), &r->req[0]);
    return r;
}
static void *mpi_iall_gather_bytes(comm_group *g, const void *send, void *recv, size_t nbytes) {
    mpi_request *r = new_request(1);
    r->has_result = true;
    void *hs = stage_in(&r->send, send, nbytes, true), *hr = stage_in(&r->recv, recv, nbytes * g->size, false);
    MPI_Iallgather(hs, (int)nbytes, MPI_BYTE, hr, (int)nbytes, MPI_BYTE, mpi_of(g), &r->req[0]);
    return r;
}
static void *mpi_ireduce_scatter(comm_group *g, dtype t, const void *send, void *recv, size_t count) {
    mpi_request *r = new_request(1);
    r->has_result = true;
    void *hs = stage_in(&r->send, send, count * E * g->size, true), *hr = stage_in(&r->recv, recv, count * E, false);
    MPI_Ireduce_scatter_block(hs, hr, (int)count, comm_mpi_type(t), comm_mpi_op(COMM_SUM, t), mpi_of(g), &r->req[0]);
    return r;
}

/* The time spent here is the exposed communication: MPI progresses the operation (mostly)
 * inside MPI calls, and whatever is left is done while the caller waits. */
static double mpi_wait(void *handle) {
    mpi_request *r = handle;
    double t0 = MPI_Wtime();
    MPI_Waitall(r->n, r->req, MPI_STATUSES_IGNORE);
    double dt = MPI_Wtime() - t0;
    stage_out(&r->send, false);
    stage_out(&r->recv, r->has_result);
    free(r);
    return dt;
}

/* MPI_Testall: a completed request becomes MPI_REQUEST_NULL, which the later MPI_Waitall skips. */
static void mpi_progress(void *handle) {
    mpi_request *r = handle;
    int done = 0;
    MPI_Testall(r->n, r->req, &done, MPI_STATUSES_IGNORE);
}

#undef E

static void mpi_init(comm_group *world, int node_ranks) {
    (void)world; (void)node_ranks;
    const char *force = getenv("COMM_STAGE");
    g_staged = strcmp(device_backend_name(), "cpu") != 0 || (force && strcmp(force, "1") == 0);
}
static void mpi_split(comm_group *parent, comm_group *child, int color, int key) {}
static void mpi_finalize(void) {}
/* The host-side copies of the staged build wait for the compute stream; MPI itself is host-side. */
static void mpi_sync(void) { device_synchronize(); }

const comm_backend comm_mpi_backend = {
    .name = "mpi", .host_timed = true,
    .init = mpi_init, .split = mpi_split, .finalize = mpi_finalize, .sync = mpi_sync,
    .settle = NULL, .poll = NULL,
    .all_reduce = mpi_all_reduce, .all_gather = mpi_all_gather, .reduce_scatter = mpi_reduce_scatter,
    .broadcast = mpi_broadcast, .all_to_all = mpi_all_to_all, .all_to_all_v = mpi_all_to_all_v, .send = mpi_send, .recv = mpi_recv,
    .sendrecv = mpi_sendrecv,
    .isend = mpi_isend, .irecv = mpi_irecv, .isendrecv = mpi_isendrecv, .iall_reduce = mpi_iall_reduce,
    .iall_gather = mpi_iall_gather, .ireduce_scatter = mpi_ireduce_scatter,
    .iall_gather_bytes = mpi_iall_gather_bytes, .wait = mpi_wait, .progress = mpi_progress,
};
