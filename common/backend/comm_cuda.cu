/* comm_cuda.cu: the CUDA twin of comm_cpu.c (see comm_backend.h).
 *
 * MPI still launches the ranks and builds the groups (comm.c). NCCL moves the data between
 * GPUs: every comm_group gets an ncclComm_t next to its MPI communicator, with the same ranks
 * in the same order, and every collective is issued on the rank's one CUDA stream
 * (cuda_common.h), behind the kernels that produced its input and ahead of the kernels that
 * consume its output.
 *
 * The semantics and buffer layouts are those of comm_cpu.c (see comm.h): all-gather output and
 * reduce-scatter input are rank-major chunks of `count` floats. comm.c waits for the stream
 * after each call (to time it), so from the host's point of view a collective here is as
 * blocking as its MPI twin.
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

/* Wait for the last collectives, then release the communicators, newest first. */
void comm_backend_finalize(void) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    while (g_ncomms > 0) NCCL_CHECK(ncclCommDestroy(g_comms[--g_ncomms]));
}

/* Blocks until every collective issued so far has completed on the GPU. */
void comm_backend_wait(void) {
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
void backend_send(comm_group *g, const float *buf, size_t count, int peer) {
    NCCL_CHECK(ncclSend(buf, count, ncclFloat, peer, nccl_of(g), cuda_stream()));
}

void backend_recv(comm_group *g, float *buf, size_t count, int peer) {
    NCCL_CHECK(ncclRecv(buf, count, ncclFloat, peer, nccl_of(g), cuda_stream()));
}
