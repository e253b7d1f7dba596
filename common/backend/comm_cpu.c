/* comm_cpu.c: the CPU backend moves the collectives' data with MPI on host memory. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include "comm_backend.h"

static MPI_Comm mpi_of(comm_group *g) { return *(MPI_Comm *)g->mpi_comm; }

void comm_backend_init(comm_group *world) { (void)world; }
void comm_backend_split(comm_group *parent, comm_group *child, int color, int key) {}
void comm_backend_finalize(void) {}
void comm_backend_wait(void) {}

void backend_all_reduce(comm_group *g, float *buf, size_t count, comm_op op) {
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, op == COMM_MAX ? MPI_MAX : MPI_SUM,
                  mpi_of(g));
}
void backend_all_gather(comm_group *g, const float *send, float *recv, size_t count) {
    MPI_Allgather(send, (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, mpi_of(g));
}
void backend_reduce_scatter(comm_group *g, const float *send, float *recv, size_t count) {
    MPI_Reduce_scatter_block(send, recv, (int)count, MPI_FLOAT, MPI_SUM, mpi_of(g));
}
void backend_broadcast(comm_group *g, float *buf, size_t count, int root) {
    MPI_Bcast(buf, (int)count, MPI_FLOAT, root, mpi_of(g));
}
void backend_all_to_all(comm_group *g, const float *send, float *recv, size_t count) {
    MPI_Alltoall(send, (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, mpi_of(g));
}
void backend_send(comm_group *g, const float *buf, size_t count, int peer) {
    MPI_Send(buf, (int)count, MPI_FLOAT, peer, 0, mpi_of(g));
}
void backend_recv(comm_group *g, float *buf, size_t count, int peer) {
    MPI_Recv(buf, (int)count, MPI_FLOAT, peer, 0, mpi_of(g), MPI_STATUS_IGNORE);
}
/* Both at once, so a ring shift (everyone sends right and receives from the left) cannot
 * deadlock. Tag 0 like every message here: MPI matches them in the order they were sent. */
void backend_sendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                      float *recvbuf, size_t recv_count, int source) {
    MPI_Sendrecv(sendbuf, (int)send_count, MPI_FLOAT, dest, 0,
                 recvbuf, (int)recv_count, MPI_FLOAT, source, 0, mpi_of(g), MPI_STATUS_IGNORE);
}

/* ---- non-blocking: the handle is the MPI request(s) of one operation ---- */

typedef struct {
    int n;                  /* 1, or 2 for a sendrecv */
    MPI_Request req[2];
} cpu_request;

static cpu_request *new_request(int n) {
    cpu_request *r = malloc(sizeof *r);
    if (!r) { fprintf(stderr, "comm_cpu: out of memory for a request\n"); exit(1); }
    r->n = n;
    return r;
}

void *backend_isend(comm_group *g, const float *buf, size_t count, int peer) {
    cpu_request *r = new_request(1);
    MPI_Isend(buf, (int)count, MPI_FLOAT, peer, 0, mpi_of(g), &r->req[0]);
    return r;
}
void *backend_irecv(comm_group *g, float *buf, size_t count, int peer) {
    cpu_request *r = new_request(1);
    MPI_Irecv(buf, (int)count, MPI_FLOAT, peer, 0, mpi_of(g), &r->req[0]);
    return r;
}
/* Receive posted first: the matching send of the peer can land straight in recvbuf. */
void *backend_isendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                        float *recvbuf, size_t recv_count, int source) {
    cpu_request *r = new_request(2);
    MPI_Irecv(recvbuf, (int)recv_count, MPI_FLOAT, source, 0, mpi_of(g), &r->req[0]);
    MPI_Isend(sendbuf, (int)send_count, MPI_FLOAT, dest, 0, mpi_of(g), &r->req[1]);
    return r;
}
void *backend_iall_reduce(comm_group *g, float *buf, size_t count, comm_op op) {
    cpu_request *r = new_request(1);
    MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, op == COMM_MAX ? MPI_MAX : MPI_SUM,
                   mpi_of(g), &r->req[0]);
    return r;
}
void *backend_iall_gather(comm_group *g, const float *send, float *recv, size_t count) {
    cpu_request *r = new_request(1);
    MPI_Iallgather(send, (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, mpi_of(g),
                   &r->req[0]);
    return r;
}
void *backend_iall_gather_bytes(comm_group *g, const void *send, void *recv, size_t nbytes) {
    cpu_request *r = new_request(1);
    MPI_Iallgather(send, (int)nbytes, MPI_BYTE, recv, (int)nbytes, MPI_BYTE, mpi_of(g), &r->req[0]);
    return r;
}
void *backend_ireduce_scatter(comm_group *g, const float *send, float *recv, size_t count) {
    cpu_request *r = new_request(1);
    MPI_Ireduce_scatter_block(send, recv, (int)count, MPI_FLOAT, MPI_SUM, mpi_of(g), &r->req[0]);
    return r;
}

/* The time spent here is the exposed communication: MPI progresses the operation (mostly)
 * inside MPI calls, and whatever is left is done while the caller waits. */
double backend_wait(void *handle) {
    cpu_request *r = handle;
    double t0 = MPI_Wtime();
    MPI_Waitall(r->n, r->req, MPI_STATUSES_IGNORE);
    double dt = MPI_Wtime() - t0;
    free(r);
    return dt;
}

/* MPI_Testall: a completed request becomes MPI_REQUEST_NULL, which the later MPI_Waitall skips. */
void backend_progress(void *handle) {
    cpu_request *r = handle;
    int done = 0;
    MPI_Testall(r->n, r->req, &done, MPI_STATUSES_IGNORE);
}
