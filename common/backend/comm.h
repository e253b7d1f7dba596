/* comm.h: process groups and collectives.
 *
 * Which library moves the data is chosen at start by the environment variable COMM
 * (comm_backend.h, README "Running on GPUs"):
 *   COMM=mpi       MPI collectives; on the CUDA build the device buffers are staged through
 *                  host memory, so several ranks may share one GPU.
 *   COMM=nccl      NCCL on device buffers, one rank per GPU (CUDA build only); the NCCL unique
 *                  id travels over MPI, sub-groups come from ncclCommSplit with the same
 *                  colour/key rule as MPI_Comm_split.
 *   COMM=nccl-sim  the CPU build's MPI, with NCCL's ordering rules enforced (one queue per
 *                  group, rendezvous sends, groups that complete as one) and its lazy
 *                  connection (the first message to a peer blocks the host until the peer's
 *                  first message; a collective is a meeting of its group): an order of calls
 *                  that would deadlock under NCCL deadlocks here too, and the watchdog says so.
 *   unset          mpi on the CPU build; on the CUDA build nccl when every rank of the node has
 *                  a GPU of its own (by PCI bus id), else mpi.
 *
 * Semantics and buffer layouts are identical under every backend:
 *   all-gather:     recv = [rank 0's chunk | rank 1's chunk | ...], each `count` floats.
 *   reduce-scatter: send = [chunk for rank 0 | chunk for rank 1 | ...]; rank r receives the
 *                   element-wise sum of every rank's chunk r (`count` floats).
 *   all-to-all:     send = [chunk for rank 0 | chunk for rank 1 | ...], recv = [chunk from
 *                   rank 0 | chunk from rank 1 | ...]: a transpose of the ranks' chunks.
 *
 * Ordering, the rule that keeps a program correct under NCCL (checked by COMM=nccl-sim):
 * every rank of a group issues its calls on that group, blocking and non-blocking, in the same
 * order, and the calls of one group run one after another in that order. A receive issued early
 * therefore holds up everything issued after it on its group. Point-to-point streams of
 * messages (a pipeline's) go over links, one two-rank group per peer and direction
 * (comm_ring_links), so a receive waiting for one neighbour never holds up a send to another.
 *
 * Every call is counted per group and collective (calls, payload bytes, modelled wire bytes,
 * wall time) so chapters can print measured communication next to their formulas.
 *   payload bytes: size of the full logical tensor (all-reduce: count*4; all-gather: the
 *                  gathered output; reduce-scatter: the full input; send/recv: the message;
 *                  all-to-all: this rank's whole send buffer).
 *   wire bytes:    what one rank sends with a ring algorithm: all-reduce 2(p-1)/p * payload,
 *                  all-gather and reduce-scatter (p-1)/p * payload, broadcast and send: payload;
 *                  all-to-all: (p-1)/p * payload (its own chunk stays).
 *   seconds:       blocking calls: wall time of the call, after the device has finished the
 *                  work queued before it (so a kernel's time is never counted as communication).
 *                  Non-blocking calls (comm_i*): only the time the caller stayed blocked, in
 *                  comm_wait (the communication the overlapping work did not hide) and in
 *                  the issue itself where that blocks (NCCL's lazy connection: the first
 *                  message to a peer waits for the peer's first; comm_nccl_sim.c). Under
 *                  NCCL the host does not wait for a collective: both are the time the compute
 *                  stream stalled waiting for the transfer (CUDA events), added when the
 *                  statistics are read (comm_settle).
 *                  So comm_total_seconds() is the communication a step could not hide.
 * A non-blocking call is counted at issue exactly as its blocking twin (calls, payload, wire
 * bytes), so a chapter's measured bytes do not depend on whether it overlaps or not.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "cdefs.h"
#include "dtype.h"

C_BEGIN

typedef enum { COMM_SUM = 0, COMM_MAX } comm_op;

typedef enum {
    COLL_ALL_REDUCE = 0, COLL_ALL_GATHER, COLL_REDUCE_SCATTER, COLL_BROADCAST,
    COLL_SEND, COLL_RECV, COLL_ALL_TO_ALL, COLL_BARRIER, COLL_NKINDS
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
    void *backend;       /* the backend's state of the group: NCCL's communicator and stream,
                          * or the emulation's queue (comm_backend.h)                       */
    struct comm_group *counted_as;  /* a link's calls are counted as its parent's (NULL: own) */
    collective_stats stats[COLL_NKINDS];
    struct comm_timelog *timelog;  /* when each counted collective was issued and waited for
                                    * (comm_wait_split; comm.c)                              */
} comm_group;

/* MPI_Init, device binding (local rank), the world group. Call once at the top of main. */
comm_group *comm_init(int *argc, char ***argv);
void comm_finalize(void);
comm_group *comm_world(void);
/* How many ranks of this node use this rank's device, itself included (by device_identity: 1
 * on a node with a GPU per rank, 4 for 4 ranks sharing one GPU; every rank of the node on the
 * CPU build). The memory a rank may plan for is the device's divided by this. */
int comm_device_sharers(void);

/* New group of the ranks of `parent` with the same colour, ordered by key. Collective on parent:
 * every rank of it calls; a rank that passes COMM_NO_COLOR joins no group and gets NULL. */
#define COMM_NO_COLOR (-1)
comm_group *comm_split(comm_group *parent, int color, int key, const char *name);

/* The point-to-point links of a ring over g: for each rank r and each neighbour n = r +- 1
 * (mod size), one two-rank group that carries the messages r -> n only (so 2 * size links, or 2
 * for size 2, none for size 1). Why: under NCCL the calls of a group run in issue order, so a
 * pipeline stage whose receive from the previous stage and send to the next shared one group
 * would wait for the receive before sending; and a receive posted early (to overlap) would hold
 * up a send to the same neighbour. One group per peer and direction keeps each queue one
 * stream of messages in one order, which both sides issue identically. (PyTorch gives each pair
 * of ranks its own NCCL communicator for the same reason.) Collective over g.
 * Calls over a link are counted as g's, under send and recv. */
typedef struct comm_links comm_links;
comm_links *comm_ring_links(comm_group *g);
/* Each link is connected when it is created, in one order on every rank (comm_nccl_sim.c, rule
 * 5: NCCL connects a peer at the first message, and that blocks the host until the peer's first
 * message; a pipeline that posts a receive early would otherwise wait there for a peer that waits
 * for this rank's send). */
/* The first anti-pattern, kept for the lesson and its test: the same links, left to connect at
 * their first message as NCCL does by itself (chapter 05's --p2p lazy). Correct under MPI; under
 * NCCL's lazy connection (COMM=nccl-sim) a pipeline whose receive is posted one action early
 * deadlocks on it. Collective over g. */
comm_links *comm_lazy_ring_links(comm_group *g);
/* The second anti-pattern: every "link" is g itself, one queue for all of a rank's
 * point-to-point traffic (chapter 05's --p2p shared, the pipeline as it was). Correct under MPI;
 * under NCCL's rules (COMM=nccl-sim) a pipeline deadlocks on it. Not collective. */
comm_links *comm_shared_links(comm_group *g);
/* Releases the table of links (the groups themselves live until comm_finalize, like every group). */
void comm_links_free(comm_links *l);

/* In place. Issues: one all-reduce of `count` floats. */
void comm_all_reduce(comm_group *g, float *buf, size_t count, comm_op op);
/* recv: [size * count]. Issues: one all-gather. */
void comm_all_gather(comm_group *g, const float *send, float *recv, size_t count);
/* send: [size * count], recv: [count]. Issues: one reduce-scatter (sum). */
void comm_reduce_scatter(comm_group *g, const float *send, float *recv, size_t count);
void comm_broadcast(comm_group *g, float *buf, size_t count, int root);
/* send: [size * count], chunk j for rank j; recv: [size * count], chunk i from rank i (send and
 * recv distinct). Issues: one all-to-all (MPI_Alltoall; on NCCL one group of a ncclSend and a
 * ncclRecv per peer). DeepSpeed-Ulysses' switch between sequence and head sharding (chapter 06). */
void comm_all_to_all(comm_group *g, const float *send, float *recv, size_t count);
/* The all-to-all with counts (MPI's Alltoallv), for messages whose sizes differ by peer and by
 * step: chapter 09's token dispatch, where each rank sends every expert's tokens to the rank that
 * holds the expert. send: send_counts[0] elements for rank 0, then send_counts[1] for rank 1, ...;
 * recv: recv_counts[0] from rank 0, then recv_counts[1] from rank 1, ... (recv_counts[i] must be
 * rank i's send_counts[this rank]: exchange the counts first, with comm_all_to_all). Counted as an
 * all-to-all of this rank's whole send buffer, its wire bytes all but the chunk it keeps. Issues:
 * one all-to-all (MPI_Alltoallv; NCCL: one group of a ncclSend and a ncclRecv per peer, zero
 * counts included, since NCCL connects a peer at its first send or recv whatever the count). */
void comm_all_to_all_v(comm_group *g, const float *send, const size_t *send_counts, float *recv,
                       const size_t *recv_counts);
void comm_send(comm_group *g, const float *buf, size_t count, int peer);
void comm_recv(comm_group *g, float *buf, size_t count, int peer);
void comm_barrier(comm_group *g);

/* Blocking exchange: send sendbuf[send_count] to `dest` and receive recvbuf[recv_count] from
 * `source` at the same time, so a ring shift (dest = r+1, source = r-1, on every rank) cannot
 * deadlock the way a send-then-recv on every rank would. dest's recv_count must equal this
 * rank's send_count. Issues: one send and one recv (MPI_Sendrecv; NCCL send + recv fused in one
 * group). Counted as one send and one recv; the seconds go to the recv (the exchange is over
 * when the data has arrived). */
void comm_sendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                   float *recvbuf, size_t recv_count, int source);

/* ---- non-blocking communication ----
 *
 * A comm_i* call starts the operation and returns at once with a request; comm_wait(&req)
 * finishes it. Between the two the caller computes on *other* buffers (that is the point: the
 * transfer overlaps the computation); the operation's own buffers must not be read or written
 * until the wait returns, exactly as with MPI. After comm_wait the buffers hold the result and
 * may be used by the host and the device, like after the blocking twin.
 *
 * Every rank of a group must issue its calls on that group, blocking and non-blocking, in the
 * same order (as MPI and NCCL require); requests may be waited for in any order.
 *
 * MPI: MPI_Iallreduce, MPI_Isend, ... and MPI_Wait (staged through host memory on the CUDA
 *      build).
 * NCCL: each group has a CUDA stream of its own; the call waits there for the kernels issued
 *      before it (an event of the compute stream), and its completion is an event of its own,
 *      which the wait hands to the compute stream: the host does not wait, the kernels issued
 *      after comm_wait do. The calls of one group run in issue order on its stream (NCCL
 *      serialises a communicator anyway); calls on different groups run side by side.
 */

/* One operation in flight. Copy it freely, but wait on it once; a zeroed request (or a waited
 * one) is complete and waiting on it does nothing. */
typedef struct comm_request {
    comm_group *group;        /* where the waiting time is counted ...             */
    collective_kind kind;     /* ... and under which collective                    */
    void *pending;            /* the backend's handle; NULL when nothing is left   */
    int logged;               /* its entry in the group's timelog + 1; 0: none     */
} comm_request;

/* Non-blocking twin of comm_sendrecv (same shapes, same counting): the exchange of a ring step
 * (context parallelism). The send and the receive are one operation that completes as one
 * (one NCCL group), so every rank of a ring may issue it at once without deadlock. Streams of
 * single sends or receives go over links instead (comm_ring_links, comm_link_isend).
 * Issues: one send and one recv; the waiting time goes to the recv. */
comm_request comm_isendrecv(comm_group *g, const float *sendbuf, size_t send_count, int dest,
                            float *recvbuf, size_t recv_count, int source);
/* Non-blocking send of buf[count] to `peer` (a neighbour on g's ring) over the link this rank ->
 * peer; the peer issues a comm_link_irecv of the same count from this rank. Messages of one
 * link are matched in the order issued. Issues: one send (MPI_Isend; ncclSend on the link's
 * stream). */
comm_request comm_link_isend(comm_links *l, const float *buf, size_t count, int peer);
/* Non-blocking receive of buf[count] from `peer` over the link peer -> this rank. Issues: one
 * recv (MPI_Irecv; ncclRecv on the link's stream). */
comm_request comm_link_irecv(comm_links *l, float *buf, size_t count, int peer);

/* Non-blocking twins of comm_all_reduce, comm_all_gather and comm_reduce_scatter: same shapes
 * (rank-major chunks), same counting, and the same sums up to the order of the additions.
 * The library may reduce in another order for the non-blocking twin (Open MPI 4.1's
 * MPI_Ireduce_scatter_block does, on 3 ranks or more), so the results agree to the last bit
 * only where the sums are exact; NCCL gets the same call on the group's stream. For the
 * prefetching of FSDP
 * (gather the next layer's parameters while this one computes) and the bucketed gradient
 * reduction of data parallelism (reduce a bucket while the backward pass goes on).
 * Issue: one all-reduce (MPI_Iallreduce; ncclAllReduce on the group's stream), one
 * all-gather (MPI_Iallgather; ncclAllGather), one reduce-scatter, sum
 * (MPI_Ireduce_scatter_block; ncclReduceScatter). */
comm_request comm_iall_reduce(comm_group *g, float *buf, size_t count, comm_op op);
comm_request comm_iall_gather(comm_group *g, const float *send, float *recv, size_t count);
comm_request comm_ireduce_scatter(comm_group *g, const float *send, float *recv, size_t count);

/* The same operations for any element type t (dtype.h): the buffers hold `count` elements of t,
 * and the bytes counted are count x dtype_size(t). The fp32 calls above are these with DTYPE_F32.
 * A bf16 sum or max is computed in fp32 and rounded once per combining step (MPI: a
 * user-defined operation, comm_mpi_types.h; NCCL: ncclBfloat16). */
void comm_all_reduce_typed(comm_group *g, dtype t, void *buf, size_t count, comm_op op);
void comm_all_gather_typed(comm_group *g, dtype t, const void *send, void *recv, size_t count);
void comm_reduce_scatter_typed(comm_group *g, dtype t, const void *send, void *recv, size_t count);
void comm_broadcast_typed(comm_group *g, dtype t, void *buf, size_t count, int root);
void comm_all_to_all_typed(comm_group *g, dtype t, const void *send, void *recv, size_t count);
void comm_all_to_all_v_typed(comm_group *g, dtype t, const void *send, const size_t *send_counts, void *recv,
                             const size_t *recv_counts);
void comm_send_typed(comm_group *g, dtype t, const void *buf, size_t count, int peer);
void comm_recv_typed(comm_group *g, dtype t, void *buf, size_t count, int peer);
void comm_sendrecv_typed(comm_group *g, dtype t, const void *sendbuf, size_t send_count, int dest,
                         void *recvbuf, size_t recv_count, int source);
comm_request comm_isendrecv_typed(comm_group *g, dtype t, const void *sendbuf, size_t send_count, int dest,
                                  void *recvbuf, size_t recv_count, int source);
comm_request comm_link_isend_typed(comm_links *l, dtype t, const void *buf, size_t count, int peer);
comm_request comm_link_irecv_typed(comm_links *l, dtype t, void *buf, size_t count, int peer);
comm_request comm_iall_reduce_typed(comm_group *g, dtype t, void *buf, size_t count, comm_op op);
comm_request comm_iall_gather_typed(comm_group *g, dtype t, const void *send, void *recv, size_t count);
comm_request comm_ireduce_scatter_typed(comm_group *g, dtype t, const void *send, void *recv, size_t count);
/* The all-gather of bytes instead of floats: send [nbytes], recv [size * nbytes], rank-major as
 * above, counted as an all-gather of size * nbytes bytes (chapter 07's float8 weights move one
 * byte per element). Issues: one all-gather (MPI_Iallgather of MPI_BYTE; ncclAllGather of
 * ncclUint8 on the group's stream). */
comm_request comm_iall_gather_bytes(comm_group *g, const void *send, void *recv, size_t nbytes);

/* Block until the request's operation is complete; its buffers are then the caller's again.
 * The time blocked here is what the operation's collective counts as seconds (see above).
 * On the GPU, the compute stream is also made to wait for the transfer, and the host waits for
 * the compute stream, as after a blocking call. */
void comm_wait(comm_request *req);
/* Lets the library move the operation's data now, without waiting (MPI_Test). Open MPI moves a
 * non-blocking collective's data only inside MPI calls, so on the CPU a computation that makes
 * none (a layer's GEMMs) hides nothing unless it calls this now and then; NCCL runs on its own
 * stream and needs no help. Not counted; the request stays to be waited on. */
void comm_progress(comm_request *req);
/* Every request in flight on this rank moved along, without blocking (comm_progress on each; the
 * emulation's one poll, which moves all of its queues at once).
 * Open MPI moves a message's bytes, beyond its eager size, and a non-blocking collective's only
 * inside MPI calls of the ranks involved; so every GEMM calls this (gemm.c's matmul), and the
 * transfers a technique has in flight (FSDP's prefetch and reduce-scatters, DDP's buckets, a
 * pipeline's sends and early receives) move while the layers compute, with no technique having to
 * wrap the linear operator for it. NCCL moves them on its own streams: a no-op there. */
void comm_progress_in_flight(void);
/* comm_wait on reqs[0..n) in order; each request's blocked time is counted under its own
 * collective (the time waiting for reqs[i] after reqs[0..i) were done). */
void comm_wait_all(comm_request *reqs, int n);

/* Host-side helpers that are not part of the lesson's traffic (not counted):
 * agreeing on a flag or a count, e.g. "did every rank parse its file?". */
double comm_host_sum(comm_group *g, double x);
double comm_host_max(comm_group *g, double x);
/* Gather `count` host floats from every rank to `root` (recv [size*count] on root). Not counted. */
void comm_host_gather(comm_group *g, const float *send, float *recv, size_t count, int root);
/* Host-side messages between two ranks of g, not counted: an instrument's data sent to the rank
 * that reads it (chapter 07: the casts of a pipeline's later stages, to the rank that compares
 * them with the baseline's). comm_host_post copies buf[bytes] and returns at once; the copy
 * leaves while the ranks go on (any later MPI call moves it; comm_finalize waits for what is
 * left, so every posted message must be taken). comm_host_take blocks for the next message from
 * any rank of g and returns it (malloc'd: the caller frees it) with its size; messages from one
 * rank arrive in the order they were posted. */
void comm_host_post(comm_group *g, const void *buf, size_t bytes, int dest);
void *comm_host_take(comm_group *g, size_t *bytes);

/* ---- what the collectives' library itself holds ----
 *
 * NCCL keeps buffers on the GPU for every connection of every communicator; a model that fits
 * without them fails inside NCCL at step 1. Their size is set by NCCL's defaults (NCCL 2.28,
 * src/init.cc computeBuffSizes, src/include/device.h): a connection of a collective's ring or
 * tree holds one buffer per protocol, LL 8 x 512 x 8 x 16 B = 512 KiB, LL128 120 x 640 x 8 x 8 B
 * = 4.69 MiB and Simple 4 MiB (18.4 MiB for the two: ring and tree); a point-to-point connection
 * holds 8 steps x 512 KiB (the NVLink chunk) per channel. The channel counts depend on the
 * machine; the estimate takes 32 channels for the collectives and 2 per point-to-point peer, and
 * NCCL_MAX_NCHANNELS, when set, in their place: an estimate, not a measurement.
 *   bytes = groups x channels x 18.4 MiB + p2p connections x p2p channels x 4 MiB
 * groups: this rank's communicators of 2+ ranks that are not links; p2p connections: one per
 * link, and 2 (n - 1) per group of n ranks (a ring exchange or an all-to-all may connect every
 * peer both ways), a bound. */
#define COMM_NCCL_COLL_CHANNELS 32
#define COMM_NCCL_P2P_CHANNELS 2
double comm_nccl_memory_formula(int groups, int p2p_connections, int channels, int p2p_channels);
typedef struct {
    int groups, links, p2p_connections;  /* this rank's communicators and connections      */
    int channels, p2p_channels;          /* as the estimate takes them                      */
    double bytes;                        /* comm_nccl_memory_formula of the above            */
} comm_library_memory;
/* This rank's communicators now, and NCCL's buffers for them. `held` is true where the
 * collectives' library is NCCL (COMM=nccl) or emulates it (COMM=nccl-sim: what NCCL would
 * hold); false under COMM=mpi, whose library holds nothing on the device. */
comm_library_memory comm_library_memory_now(bool *held);
/* Whether the bytes above are on this rank's device (COMM=nccl): the memory check counts them. */
bool comm_library_on_device(void);

/* Statistics. */
/* Under NCCL the seconds of a call are known only once the device has run it: this waits for
 * the calls still in flight and adds their seconds. comm_total_seconds, comm_reset_* and
 * comm_wait_split call it; call it yourself before reading a group's stats[].seconds. */
void comm_settle(void);
void comm_reset_stats(comm_group *g);
const char *collective_name(collective_kind k);
/* Seconds counted by every group created so far: blocking calls' wall time plus the exposed
 * (waited-for) time of the non-blocking ones. */
double comm_total_seconds(void);
void comm_reset_all_stats(void);
/* Off: the collectives that follow are not counted (calls, bytes, seconds) until it is on again;
 * a trainer's evaluation and checkpoints, which the per-step tables leave out. On by default. */
void comm_set_counting(bool on);
/* Where the time blocked in collectives went, since comm_reset_all_stats. A rank that reaches a
 * collective before the others waits for two things: for the last rank of the group to issue it
 * (the ranks' skew: load imbalance, unequal cores, another rank's extra work), then for the data
 * to move. Only the second is communication that the overlapping work failed to hide. For every
 * counted collective (not send/recv) of every group of more than one rank, this rank's blocked
 * time (a blocking call's duration, a request's wait) is cut at the moment the group's last rank
 * issued it (only the collectives of `kind`, a collective_kind; -1: all of them):
 *   *data_seconds: after that moment: the transfer left to wait for
 *   *peer_seconds: before it: waiting for a late rank
 * The moments are host clocks (CLOCK_MONOTONIC), comparable between the processes of one machine;
 * on the GPU a collective's issue is when it was queued. Host-side collective over the world
 * (one MPI_Allgather per group): every rank calls it, each gets its own sums. Only the
 * collectives issued while comm_log_waits was on are split. */
void comm_wait_split(int kind, double *data_seconds, double *peer_seconds);
/* On: from now on each counted collective's issue and wait times are logged for comm_wait_split
 * (a few doubles per collective, kept until comm_reset_all_stats). Off by default, so a long
 * training run does not grow a log nobody reads. */
void comm_log_waits(bool on);

/* Exit every rank with status 2 after rank 0 prints `msg` on one line (bad input).
 * Must be reached by every rank of the world (the decision is made identically everywhere). */
void comm_exit_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Same, when only some ranks know: every rank passes its verdict; if any rank has ok == 0 the
 * lowest such rank's message is printed by rank 0 and every rank exits with status 2. */
void comm_require_all(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Register a clean-up (for example removing an unfinished dump) that comm_exit_usage runs on this
 * rank before the closing barrier. Not atexit: once the first rank has exited with status 2,
 * mpirun may kill the others before their exit handlers run. At most 8. */
void comm_on_usage_exit(void (*cleanup)(void));

C_END
