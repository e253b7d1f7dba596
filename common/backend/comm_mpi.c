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
#include "device.h"

static MPI_Comm mpi_of(comm_group *g) { return *(MPI_Comm *)g->mpi_comm; }
static MPI_Op mpi_op(comm_op op) { return op == COMM_MAX ? MPI_MAX : MPI_SUM; }

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

static void mpi_all_reduce(comm_group *g, float *buf, size_t count, comm_op op) {
    stage_buf b;
    float *h = stage_in(&b, buf, count * 4, true);
    MPI_Allreduce(MPI_IN_PLACE, h, (int)count, MPI_FLOAT, mpi_op(op), mpi_of(g));
    stage_out(&b, true);
}
static void mpi_all_gather(comm_group *g, const float *send, float *recv, size_t count) {
    stage_buf s, r;
    float *hs = stage_in(&s, send, count * 4, true), *hr = stage_in(&r, recv, count * 4 * g->size, false);
    MPI_Allgather(hs, (int)count, MPI_FLOAT, hr, (int)count, MPI_FLOAT, mpi_of(g));
    stage_out(&s, false);
    stage_out(&r, true);
}
static void mpi_reduce_scatter(comm_group *g, const float *send, float *recv, size_t count) {
    stage_buf s, r;
    float *hs = stage_in(&s, send, count * 4 * g->size, true), *hr = stage_in(&r, recv, count * 4, false);
    MPI_Reduce_scatter_block(hs, hr, (int)count, MPI_FLOAT, MPI_SUM, mpi_of(g));
    stage_out(&s, false);
    stage_out(&r, true);
}
static void mpi_broadcast(comm_group *g, float *buf, size_t count, int root) {
    stage_buf b;
    float *h = stage_in(&b, buf, count * 4, g->rank == root);
    MPI_Bcast(h, (int)count, MPI_FLOAT, root, mpi_of(g));
    stage_out(&b, true);
}
static void mpi_all_to_all(comm_group *g, const float *send, float *recv, size_t count) {
    stage_buf s, r;
    size_t bytes = count * 4 * g->size;
    float *hs = stage_in(&s, send, bytes, true), *hr = stage_in(&r, recv, bytes, false);
    MPI_Alltoall(hs, (int)count, MPI_FLOAT, hr, (int)count, MPI_FLOAT, mpi_of(g));
    stage_out(&s, false);
    stage_out(&r, true);
}
static void mpi_send(comm_group *g, const float *buf, size_t count, int peer) {
    stage_buf s;
    MPI_Send(stage_in(&s, buf, count * 4, true), (int)count, MPI_FLOAT, peer, 0, mpi_of(g));
    stage_out(&s, false);
}
static void mpi_recv(comm_group *g, float *buf, size_t count, int peer) {
    stage_buf r;
    MPI_Recv(stage_in(&r, buf, count * 4, false), (int)count, MPI_FLOAT, peer, 0, mpi_of(g),
             MPI_STATUS_IGNORE);
    stage_out(&r, true);
}
/* Both at once, so a ring shift (everyone sends right and receives from the left) cannot
 * deadlock. Tag 0 like every message here: MPI matches them in the order they were sent. */
static void mpi_sendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                         float *recvbuf, size_t recv_count, int source) {
    stage_buf s, r;
    float *hs = stage_in(&s, sendbuf, send_count * 4, true), *hr = stage_in(&r, recvbuf, recv_count * 4, false);
    MPI_Sendrecv(hs, (int)send_count, MPI_FLOAT, dest, 0, hr, (int)recv_count, MPI_FLOAT, source, 0,
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

static void *mpi_isend(comm_group *g, const float *buf, size_t count, int peer) {
    mpi_request *r = new_request(1);
    MPI_Isend(stage_in(&r->send, buf, count * 4, true), (int)count, MPI_FLOAT, peer, 0, mpi_of(g), &r->req[0]);
    return r;
}
static void *mpi_irecv(comm_group *g, float *buf, size_t count, int peer) {
    mpi_request *r = new_request(1);
    r->has_result = true;
    MPI_Irecv(stage_in(&r->recv, buf, count * 4, false), (int)count, MPI_FLOAT, peer, 0, mpi_of(g), &r->req[0]);
    return r;
}
/* Receive posted first: the matching send of the peer can land straight in recvbuf. */
static void *mpi_isendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                           float *recvbuf, size_t recv_count, int source) {
    mpi_request *r = new_request(2);
    r->has_result = true;
    float *hr = stage_in(&r->recv, recvbuf, recv_count * 4, false);
    float *hs = stage_in(&r->send, sendbuf, send_count * 4, true);
    MPI_Irecv(hr, (int)recv_count, MPI_FLOAT, source, 0, mpi_of(g), &r->req[0]);
    MPI_Isend(hs, (int)send_count, MPI_FLOAT, dest, 0, mpi_of(g), &r->req[1]);
    return r;
}
static void *mpi_iall_reduce(comm_group *g, float *buf, size_t count, comm_op op) {
    mpi_request *r = new_request(1);
    r->has_result = true;
    MPI_Iallreduce(MPI_IN_PLACE, stage_in(&r->recv, buf, count * 4, true), (int)count, MPI_FLOAT,
                   mpi_op(op), mpi_of(g), &r->req[0]);
    return r;
}
static void *mpi_iall_gather(comm_group *g, const float *send, float *recv, size_t count) {
    mpi_request *r = new_request(1);
    r->has_result = true;
    float *hs = stage_in(&r->send, send, count * 4, true), *hr = stage_in(&r->recv, recv, count * 4 * g->size, false);
    MPI_Iallgather(hs, (int)count, MPI_FLOAT, hr, (int)count, MPI_FLOAT, mpi_of(g), &r->req[0]);
    return r;
}
static void *mpi_iall_gather_bytes(comm_group *g, const void *send, void *recv, size_t nbytes) {
    mpi_request *r = new_request(1);
    r->has_result = true;
    void *hs = stage_in(&r->send, send, nbytes, true), *hr = stage_in(&r->recv, recv, nbytes * g->size, false);
    MPI_Iallgather(hs, (int)nbytes, MPI_BYTE, hr, (int)nbytes, MPI_BYTE, mpi_of(g), &r->req[0]);
    return r;
}
static void *mpi_ireduce_scatter(comm_group *g, const float *send, float *recv, size_t count) {
    mpi_request *r = new_request(1);
    r->has_result = true;
    float *hs = stage_in(&r->send, send, count * 4 * g->size, true), *hr = stage_in(&r->recv, recv, count * 4, false);
    MPI_Ireduce_scatter_block(hs, hr, (int)count, MPI_FLOAT, MPI_SUM, mpi_of(g), &r->req[0]);
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
    .broadcast = mpi_broadcast, .all_to_all = mpi_all_to_all, .send = mpi_send, .recv = mpi_recv,
    .sendrecv = mpi_sendrecv,
    .isend = mpi_isend, .irecv = mpi_irecv, .isendrecv = mpi_isendrecv, .iall_reduce = mpi_iall_reduce,
    .iall_gather = mpi_iall_gather, .ireduce_scatter = mpi_ireduce_scatter,
    .iall_gather_bytes = mpi_iall_gather_bytes, .wait = mpi_wait, .progress = mpi_progress,
};
