/* comm_backend.h: what a backend of the collectives provides to comm.c (internal to common/).
 *
 * comm.c owns the groups (MPI communicators exist under every backend: MPI launches the ranks,
 * carries the NCCL unique id and does the host-side agreement), the statistics and the timing.
 * A backend moves the data of the lesson's collectives. Three exist, chosen at start by the
 * environment variable COMM (comm.c's comm_select):
 *
 *   mpi       comm_mpi.c        MPI_Allreduce, MPI_Allgather, ... (and MPI_I* twins). On the CPU
 *                               build the buffers are host memory; on the CUDA build they are
 *                               staged through host memory, so several ranks may share a GPU.
 *   nccl      comm_nccl.cu      ncclAllReduce, ... on device memory, one CUDA stream per group
 *                               (CUDA build only; comm_nccl_cpu.c says it is absent).
 *   nccl-sim  comm_nccl_sim.c   MPI underneath, with NCCL's ordering rules enforced, so code
 *                               that would deadlock under NCCL deadlocks on the CPU too (and
 *                               the watchdog ends it): see that file.
 *
 * Every operation has the shapes of its comm.h twin. A non-blocking one returns the backend's
 * handle, which comm.c hands back to `wait` exactly once.
 */
#pragma once
#include <stdbool.h>
#include "comm.h"
#include "dtype.h"

C_BEGIN

typedef struct comm_backend {
    const char *name;                                      /* what COMM names it            */
    /* true: a blocking call's seconds are its wall time on the host, between two `sync`s (the
     * call blocks the host); false: the backend times its calls on the device and adds the
     * seconds itself when `settle` runs (NCCL: the host does not wait for a collective). */
    bool host_timed;
    /* true: the backend is NCCL or emulates it, and its communicators hold NCCL's buffers
     * (comm_library_memory_now); `on_device`: those buffers take the rank's device memory. */
    bool nccl_buffers, on_device;
    /* After MPI_Init, device_init and comm_choose, on every rank. `node_ranks`: the ranks of
     * this node. May refuse (comm_exit_usage): the emulation on the CUDA build. */
    void (*init)(comm_group *world, int node_ranks);
    /* The backend's twin of comm.c's MPI_Comm_split, collective over parent; child is NULL on
     * the ranks that passed COMM_NO_COLOR. */
    void (*split)(comm_group *parent, comm_group *child, int color, int key);
    /* Makes the point-to-point connection this rank -> peer (send) or peer -> this rank (recv)
     * of g now, blocking the host until the peer makes its side: NCCL connects lazily, at the
     * first ncclSend/ncclRecv, and that connection blocks the host (comm_nccl_sim.c, rule 5), so
     * comm_ring_links connects each link when it creates it. NULL: nothing to connect (MPI). */
    void (*connect)(comm_group *g, int peer, bool send);
    void (*finalize)(void);
    /* Blocks until the work issued on the compute stream so far is done (CUDA: stream sync). */
    void (*sync)(void);
    /* Adds the seconds of the device-timed calls that have completed by now (waiting for those
     * still running) to their groups' statistics. NULL: nothing is timed on the device. */
    void (*settle)(void);
    /* Moves every queued operation of this rank along without blocking (the emulation's queues
     * start their next operation here). Called while the host waits in any MPI call. NULL: the
     * library progresses by itself. */
    void (*poll)(void);

    /* The data operations: `count` elements of type t (dtype.h) per buffer, as comm.h's. */
    void (*all_reduce)(comm_group *g, dtype t, void *buf, size_t count, comm_op op);
    void (*all_gather)(comm_group *g, dtype t, const void *send, void *recv, size_t count);
    void (*reduce_scatter)(comm_group *g, dtype t, const void *send, void *recv, size_t count);
    void (*broadcast)(comm_group *g, dtype t, void *buf, size_t count, int root);
    void (*all_to_all)(comm_group *g, dtype t, const void *send, void *recv, size_t count);
    void (*all_to_all_v)(comm_group *g, dtype t, const void *send, const size_t *send_counts, void *recv,
                         const size_t *recv_counts);
    void (*send)(comm_group *g, dtype t, const void *buf, size_t count, int peer);
    void (*recv)(comm_group *g, dtype t, void *buf, size_t count, int peer);
    void (*sendrecv)(comm_group *g, dtype t, const void *sendbuf, size_t send_count, int dest,
                     void *recvbuf, size_t recv_count, int source);

    void *(*isend)(comm_group *g, dtype t, const void *buf, size_t count, int peer);
    void *(*irecv)(comm_group *g, dtype t, void *buf, size_t count, int peer);
    void *(*isendrecv)(comm_group *g, dtype t, const void *sendbuf, size_t send_count, int dest,
                       void *recvbuf, size_t recv_count, int source);
    void *(*iall_reduce)(comm_group *g, dtype t, void *buf, size_t count, comm_op op);
    void *(*iall_gather)(comm_group *g, dtype t, const void *send, void *recv, size_t count);
    void *(*ireduce_scatter)(comm_group *g, dtype t, const void *send, void *recv, size_t count);
    void *(*iall_gather_bytes)(comm_group *g, const void *send, void *recv, size_t nbytes);
    /* Completes the operation of `handle` and releases it. Returns the seconds the caller was
     * kept waiting (host-timed backends), or 0 when `settle` will count them (NCCL). */
    double (*wait)(void *handle);
    /* Moves the operation along if the library needs calls for that; never blocks. */
    void (*progress)(void *handle);
} comm_backend;

extern const comm_backend comm_mpi_backend;        /* comm_mpi.c                          */
extern const comm_backend comm_nccl_sim_backend;   /* comm_nccl_sim.c                     */
/* comm_nccl.cu on the CUDA build; NULL on the CPU build (comm_nccl_cpu.c). */
const comm_backend *comm_nccl_backend(void);

/* The backend that COMM (`want`, NULL or "" when unset) names: "mpi", "nccl" or "nccl-sim";
 * unset: "nccl" where this build has NCCL and the node's ranks have a GPU each, else "mpi".
 * `device_names[node_ranks]`: each rank of this node's device (device_identity: the PCI bus
 * id), equal where ranks share a GPU. NULL when refused, with the one-line reason in msg
 * (COMM=nccl on the CPU build, or with two ranks of the node on one GPU; an unknown name).
 * Pure (comm.c; tested by test_comm with made-up bus ids). */
const char *comm_choose(const char *want, bool nccl_built, const char *const *device_names, int node_ranks,
                        char *msg, size_t msg_size);
/* How many of the node's ranks use the device of rank `me` of the node (itself included): the
 * ranks its memory is divided among (comm_device_sharers). Pure, tested like comm_choose. */
int comm_count_sharers(const char *const *device_names, int node_ranks, int me);

/* For a backend that times on the device (comm.c): whether calls are being counted now
 * (comm_set_counting; remember it at the call), and the seconds of a call settled later, added
 * to g's statistics of `kind` (its parent's for a link). */
bool comm_is_counting(void);
void comm_add_seconds(comm_group *g, collective_kind kind, double seconds);
/* For a backend that times on the device: the timelog entry (comm_wait_split) of the call it is
 * inside now, a blocking call or a request's wait (0: none is logged); and, once the device has
 * run it, the entry's times on the host's clock (device_mark_seconds' scale): when its
 * collective could start on the device, and when the compute stream began and ended waiting
 * for it. */
int comm_current_log(void);
void comm_device_times(comm_group *g, int logged, double issue, double wait0, double wait1);

C_END
