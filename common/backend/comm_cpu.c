/* comm_cpu.c: the CPU backend moves the collectives' data with MPI on host memory. */
#include <mpi.h>
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
void backend_send(comm_group *g, const float *buf, size_t count, int peer) {
    MPI_Send(buf, (int)count, MPI_FLOAT, peer, 0, mpi_of(g));
}
void backend_recv(comm_group *g, float *buf, size_t count, int peer) {
    MPI_Recv(buf, (int)count, MPI_FLOAT, peer, 0, mpi_of(g), MPI_STATUS_IGNORE);
}
