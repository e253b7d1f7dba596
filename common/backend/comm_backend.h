/* comm_backend.h: what a backend provides to comm.c (internal to common/).
 *
 * comm.c owns the groups (MPI communicators exist on both backends: MPI launches the ranks,
 * carries the NCCL unique id, and does host-side agreement), the statistics and the timing.
 * A backend moves the data:
 *   comm_cpu.c   MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, ... on host memory
 *   comm_cuda.cu ncclAllReduce, ncclAllGather, ncclReduceScatter, ... on device memory
 * and the non-blocking twins (MPI_I*; NCCL on a second CUDA stream).
 */
#pragma once
#include "comm.h"

C_BEGIN

void comm_backend_init(comm_group *world);                 /* after MPI_Init and device_init */
void comm_backend_split(comm_group *parent, comm_group *child, int color, int key);
void comm_backend_finalize(void);
/* Called before and after every blocking call: blocks until the work issued so far on the
 * compute stream (kernels and blocking collectives) is complete (CUDA: stream sync), and starts
 * the posted isend/irecv (CUDA), so every call is started in the order the program made it.
 * Non-blocking operations already started keep running; comm_wait is their end. */
void comm_backend_wait(void);

void backend_all_reduce(comm_group *g, float *buf, size_t count, comm_op op);
void backend_all_gather(comm_group *g, const float *send, float *recv, size_t count);
void backend_reduce_scatter(comm_group *g, const float *send, float *recv, size_t count);
void backend_broadcast(comm_group *g, float *buf, size_t count, int root);
void backend_all_to_all(comm_group *g, const float *send, float *recv, size_t count);
void backend_send(comm_group *g, const float *buf, size_t count, int peer);
void backend_recv(comm_group *g, float *buf, size_t count, int peer);
void backend_sendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                      float *recvbuf, size_t recv_count, int source);

/* Non-blocking: start (or post) the operation and return the backend's handle for
 * backend_wait (CPU: MPI requests, CUDA: a completion event). Same shapes as the blocking ones.
 * comm.c does the counting and never looks inside the handle. */
void *backend_isend(comm_group *g, const float *buf, size_t count, int peer);
void *backend_irecv(comm_group *g, float *buf, size_t count, int peer);
void *backend_isendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                        float *recvbuf, size_t recv_count, int source);
void *backend_iall_reduce(comm_group *g, float *buf, size_t count, comm_op op);
void *backend_iall_gather(comm_group *g, const float *send, float *recv, size_t count);
void *backend_ireduce_scatter(comm_group *g, const float *send, float *recv, size_t count);
void *backend_iall_gather_bytes(comm_group *g, const void *send, void *recv, size_t nbytes);
/* Completes the operation of `handle` and releases it. Returns the exposed seconds: how long
 * the caller was kept waiting (CPU: wall time in MPI_Wait; CUDA: how long the compute stream
 * stalled on the transfer, from events). */
double backend_wait(void *handle);
/* Moves the operation along if the library needs calls for that; never blocks. */
void backend_progress(void *handle);

C_END
