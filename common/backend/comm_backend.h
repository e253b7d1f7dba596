/* comm_backend.h: what a backend provides to comm.c (internal to common/).
 *
 * comm.c owns the groups (MPI communicators exist on both backends: MPI launches the ranks,
 * carries the NCCL unique id, and does host-side agreement), the statistics and the timing.
 * A backend moves the data:
 *   comm_cpu.c   MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, ... on host memory
 *   comm_cuda.cu ncclAllReduce, ncclAllGather, ncclReduceScatter, ... on device memory
 */
#pragma once
#include "comm.h"

C_BEGIN

void comm_backend_init(comm_group *world);                 /* after MPI_Init and device_init */
void comm_backend_split(comm_group *parent, comm_group *child, int color, int key);
void comm_backend_finalize(void);
/* Blocks until the collectives issued so far are complete (CUDA: stream sync). */
void comm_backend_wait(void);

void backend_all_reduce(comm_group *g, float *buf, size_t count, comm_op op);
void backend_all_gather(comm_group *g, const float *send, float *recv, size_t count);
void backend_reduce_scatter(comm_group *g, const float *send, float *recv, size_t count);
void backend_broadcast(comm_group *g, float *buf, size_t count, int root);
void backend_send(comm_group *g, const float *buf, size_t count, int peer);
void backend_recv(comm_group *g, float *buf, size_t count, int peer);

C_END
