/* comm.h: process groups and collectives.
 *
 * CPU backend (comm_cpu.c):   MPI collectives on host buffers.
 * CUDA backend (comm_cuda.cu): NCCL on device buffers; the NCCL unique id travels over MPI,
 *                              sub-groups come from ncclCommSplit with the same colour/key
 *                              rule as MPI_Comm_split.
 *
 * Semantics and buffer layouts are identical on both backends:
 *   all-gather:     recv = [rank 0's chunk | rank 1's chunk | ...], each `count` floats.
 *   reduce-scatter: send = [chunk for rank 0 | chunk for rank 1 | ...]; rank r receives the
 *                   element-wise sum of every rank's chunk r (`count` floats).
 *
 * Every call is counted per group and collective (calls, payload bytes, modelled wire bytes,
 * wall time) so chapters can print measured communication next to their formulas.
 *   payload bytes: size of the full logical tensor (all-reduce: count*4; all-gather: the
 *                  gathered output; reduce-scatter: the full input; send/recv: the message).
 *   wire bytes:    what one rank sends with a ring algorithm: all-reduce 2(p-1)/p * payload,
 *                  all-gather and reduce-scatter (p-1)/p * payload, broadcast and send: payload.
 */
#pragma once
#include <stddef.h>
#include "cdefs.h"

C_BEGIN

typedef enum { COMM_SUM = 0, COMM_MAX } comm_op;

typedef enum {
    COLL_ALL_REDUCE = 0, COLL_ALL_GATHER, COLL_REDUCE_SCATTER, COLL_BROADCAST,
    COLL_SEND, COLL_RECV, COLL_BARRIER, COLL_NKINDS
} collective_kind;

typedef struct {
    long long calls;
    double payload_bytes;
    double wire_bytes;
    double seconds;
} collective_stats;

typedef struct comm_group {
    char name[32];
    int rank, size;
    void *mpi_comm;      /* points to an MPI_Comm (untyped so this header needs no mpi.h) */
    void *nccl_comm;     /* ncclComm_t on the CUDA backend, NULL on CPU              */
    collective_stats stats[COLL_NKINDS];
} comm_group;

/* MPI_Init, device binding (local rank), the world group. Call once at the top of main. */
comm_group *comm_init(int *argc, char ***argv);
void comm_finalize(void);
comm_group *comm_world(void);
int comm_local_rank(void);

/* New group of the ranks of `parent` with the same colour, ordered by key. Collective on parent. */
comm_group *comm_split(comm_group *parent, int color, int key, const char *name);

/* In place. Issues: one all-reduce of `count` floats. */
void comm_all_reduce(comm_group *g, float *buf, size_t count, comm_op op);
/* recv: [size * count]. Issues: one all-gather. */
void comm_all_gather(comm_group *g, const float *send, float *recv, size_t count);
/* send: [size * count], recv: [count]. Issues: one reduce-scatter (sum). */
void comm_reduce_scatter(comm_group *g, const float *send, float *recv, size_t count);
void comm_broadcast(comm_group *g, float *buf, size_t count, int root);
void comm_send(comm_group *g, const float *buf, size_t count, int peer);
void comm_recv(comm_group *g, float *buf, size_t count, int peer);
void comm_barrier(comm_group *g);

/* Host-side helpers that are not part of the lesson's traffic (not counted):
 * agreeing on a flag or a count, e.g. "did every rank parse its file?". */
double comm_host_sum(comm_group *g, double x);
double comm_host_max(comm_group *g, double x);
/* Gather `count` host floats from every rank to `root` (recv [size*count] on root). Not counted. */
void comm_host_gather(comm_group *g, const float *send, float *recv, size_t count, int root);

/* Statistics. */
void comm_reset_stats(comm_group *g);
const char *collective_name(collective_kind k);
/* Wall time spent inside collectives of every group created so far. */
double comm_total_seconds(void);
void comm_reset_all_stats(void);

/* Exit every rank with status 2 after rank 0 prints `msg` on one line (bad input).
 * Must be reached by every rank of the world (the decision is made identically everywhere). */
void comm_exit_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Same, when only some ranks know: every rank passes its verdict; if any rank has ok == 0 the
 * lowest such rank's message is printed by rank 0 and every rank exits with status 2. */
void comm_require_all(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

C_END
