/* data_parallel.h: data parallelism, from DDP to ZeRO-3/FSDP (Rajbhandari et al., 2020, "ZeRO:
 * Memory Optimizations Toward Training Trillion Parameter Models"; PyTorch FSDP2's fully_shard),
 * as a plan for the one model (common/model/model.c).
 *
 * The R x S data-parallel ranks (dp_replicate x dp_shard of the mesh) split the global batch by
 * rows; each computes the gradient of its rows' share of the global mean loss, so the true
 * gradient is the SUM over the data ranks. What each mode keeps per rank, and what it moves:
 *
 *   mode    values   grads    AdamW m,v   per step, over the S ranks of dp_shard (x R: HSDP)
 *   ddp     whole    whole    whole       all-reduce the grads (4 Psi), in buckets during backward
 *   zero1   whole    whole*   shard       reduce-scatter the grads, update the own shard,
 *                                          all-gather the values
 *   zero2   whole    shard    shard       reduce-scatter each layer's grads right after its
 *                                          backward (only the shard is kept), all-gather values
 *   fsdp    shard    shard    shard       all-gather a layer's values before its forward, free
 *                                          them after, gather again before its backward,
 *                                          reduce-scatter its grads right after
 *   (* whole buffer, only the own shard is reduced)
 *
 * Each collective moves a whole unit (a layer's tensors, or the ends'), laid out by rank: one
 * all-gather or reduce-scatter per unit, as FSDP2 moves a module's parameters.
 *
 * One layer's life under fsdp (reshard after forward, prefetch on):
 *
 *   forward   [all-gather l+1] ............                      (issued while l computes)
 *             wait l ─ compute l ─ free l                        (the last layer is kept)
 *   backward  [all-gather l-1] ............
 *             wait l ─ compute l (grads full) ─ wait l+1's reduce-scatter ─ start l's
 *             [reduce-scatter l] ............                    (moves while l-1 computes)
 *
 * With prefetch the ends and the last layer stay gathered from forward to backward, which starts
 * with them (FSDP2's root module, torchtitan's last block).
 *
 * Shards follow FSDP2: every tensor's first dimension (a matrix's rows, a vector's elements) is
 * split in S chunks of ceil(units / S), the last padded with zeros (params.h). A unit is a
 * layer, or the model's ends (tok_embeddings, norm, output). Under HSDP (R > 1) the shard's
 * gradient is also all-reduced over the R replicas. Under FSDP x TP the tensors sharded are
 * chapter 01's tensor-parallel slices.
 *
 * Over dp_shard x cp (shard_over_cp, chapter 08): the cp ranks hold the same parameters and
 * each computes the gradient of its rows of the same sequences, so they can share the shards as
 * data ranks do: the batch is still split over dp_replicate x dp_shard only, but the shards, the
 * all-gathers and the reduce-scatters span dp_shard x cp, and the reduce-scatter's sum over cp
 * replaces chapter 06's all-reduce of the gradients over cp (which then skips itself).
 *
 * Notation: Psi the parameters this rank's tp slice holds (all of them without TP), S the
 * shard group's size (the dp_shard degree, times cp under shard_over_cp), R the dp_replicate
 * degree.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "comm.h"
#include "device.h"
#include "llama.h"
#include "mesh.h"
#include "params.h"
#include "plan.h"

typedef enum { DP_DDP = 0, DP_ZERO1, DP_ZERO2, DP_FSDP, DP_NMODES } dp_mode;
const char *dp_mode_name(dp_mode mode);            /* "ddp", "zero1", "zero2", "fsdp" */

/* How fsdp's all-gathers move a tensor, when a chapter moves it in another form than fp32
 * (chapter 07: float8 bytes). start issues the gather of tensor x: this rank's shard [count] ->
 * full [S * count] (padded), and may leave state in *pending; finish runs after the request's
 * wait, before the values are used, and must leave full [S * count] holding the values. */
typedef struct {
    comm_request (*start)(void *ctx, comm_group *shard_group, const param_tensor *x, const float *shard,
                          float *full, size_t count, void **pending);
    void (*finish)(void *ctx, const param_tensor *x, float *full, size_t count, void *pending);
    void *ctx;
} dp_gather_ops;

typedef struct {
    dp_mode mode;
    bool reshard_after_forward;   /* fsdp: free a layer's gathered values after its forward (with
                                   * prefetch, not the last layer's nor the ends': backward needs
                                   * them first)                                                  */
    bool prefetch;                /* fsdp: gather the next unit while this one computes (units in
                                   * order: no pipeline)                                          */
    size_t bucket_floats;         /* ddp: issue an all-reduce once a bucket holds this many floats */
    const dp_gather_ops *gather;  /* fsdp: NULL, one fp32 all-gather per unit (by rank, copied
                                   * out), or under --dtype bf16 fsdp.c's bf16 policy; else this
                                   * hook's, tensor by tensor                                     */
    bool shard_over_cp;           /* shard over dp_shard x cp (chapter 08, torchtitan's), not
                                   * dp_shard alone: needs context parallelism applied first      */
    bool shard_over_replicate;    /* shard over dp_replicate too, every data rank (x cp) one shard
                                   * group and no HSDP replicas (chapter 09's --full-shard, where
                                   * dp_replicate holds the ranks beside ep: torchtitan's
                                   * dp_shard = every data rank, ep carved out of it)               */
    dtype reduce_type;            /* the gradients' reductions (FSDP2's reduce_dtype): DTYPE_F32
                                   * (zero: the default), or DTYPE_BF16 (--reduce-dtype bf16): each
                                   * rank's fp32 gradients rounded to a bf16 copy that moves and is
                                   * summed (in fp32, rounded at each combining step), the sums
                                   * widened back into the fp32 gradients                          */
} dp_options;

/* One timeline event of this rank, for the Gantt chart: a unit's compute, or a collective from
 * its issue to the end of its wait. */
typedef struct {
    const char *lane;             /* "compute" or "comm"                                          */
    char what[32];                /* "fwd 3", "bwd ends", "all_gather 4", ...                     */
    double t0, t1;                /* seconds since the step began (dp_timeline reads the marks)   */
    device_mark m0, m1;           /* the compute stream at its start and end (device.h)           */
} dp_event;

/* The plan's state (dp_units.h: the part every mode shares, with which each mode's state in ddp.c,
 * zero.c and fsdp.c begins; data_parallel.c dispatches to the mode). */
typedef struct dp_state dp_state;


/* Adds data parallelism to `plan` (the single-device plan, or chapter 01's tensor-parallel one):
 * the batch split over dp_replicate x dp_shard, the mode's storage (sharded over dp_shard, or
 * dp_shard x cp: plan->groups.shard), weight access, gradient reduction and optimizer. Under
 * shard_over_cp with cp > 1, refuses (one line, exit 2) a plan without context parallelism:
 * without it the cp ranks compute the same gradient, and the sum over them would count it cp
 * times. Allocates nothing on the device: the transient buffers' bytes
 * (gathered layers, full gradients, staging) are the technique's buffer bytes (plan.h), which run_model
 * checks with the model's before anything is allocated, and the buffers (MEM_BUFFERS) are
 * allocated at the plan's first use. */
void data_parallel_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const dp_options *o);

/* --reduce-dtype bf16 without --dtype bf16, refused (one line, exit 2): mixed precision reduces in
 * bf16 what it computes in bf16; an fp32 run keeps its gradients fp32 end to end. */
void data_parallel_refuse_reduce_type(dtype reduce_type, dtype precision);

/* --dump's record of the gradients' reduction, for a replay (tests/reference_torch.py): NULL under
 * fp32 (a replay sums in full precision anyway); under bf16 {"reduce": {"dtype": "bf16",
 * "data_ranks": N}} in buf, the N data ranks (dp_replicate x dp_shard) whose gradients of an
 * equal block of the batch's rows were each rounded to bf16 and summed; "passes" when a step
 * made several forward-backward passes (chapter 08's --accum: the rows in that many equal blocks
 * in order, each split over the data ranks alike), and "microbatches" when each data rank's rows
 * went through a pipeline in that many equal blocks: each (pass, microbatch) is reduced apart. */
const char *data_parallel_run_options_json(dtype reduce_type, int data_ranks, int passes, int microbatches, char *buf,
                                           size_t len);

/* Data parallelism's rule for mesh_create (mesh.h): the global batch of `batch` sequences in equal
 * shares over dp_replicate x dp_shard. */
mesh_rule dp_batch_rule(long long batch);
/* The bytes the transient buffers added to MEM_BUFFERS when they were allocated (0 before). */
double data_parallel_buffer_bytes(const llama_plan *plan);
/* The group the plan's data parallelism moves the shards of tensor x (of the model's table t) over:
 * the shard group, or for a tensor sharded over a narrower one (09's experts, ep < S) that group,
 * "expert shard"; NULL when nothing moves it (held whole, another stage's, or no data parallelism
 * on the plan). */
comm_group *data_parallel_group_of(const llama_plan *plan, const param_table *t, const param_tensor *x);
/* The technique as the plan's stack records it (plan_free frees its state and buffers). */
extern const plan_technique data_parallel_technique;

/* FSDP's mixed-precision policy: with --dtype bf16 the linears' weights (wq .. w3, output; 09's router) are
 * all-gathered as bf16 (2 bytes an element), each tensor in its own all-gather; true for those
 * kinds. fsdp_gather_counts (exercise 6): a bf16 step's all-gathers of values over the shard group,
 * tensor by tensor (`twice`: reshard_after_forward; `keep_last`: prefetch), and the elements of
 * those gathers that move as bf16, for the traffic formulas of chapters 04, 07 and 08. */
bool fsdp_gathers_bf16(param_kind kind);
void fsdp_gather_counts(const param_table *t, int L, bool twice, bool keep_last, double *calls, double *bf16_elems);

/* The last step's timeline. */
const dp_event *dp_timeline(const llama_plan *plan, int *n);

/* The deliberate bugs of this chapter, for --fault. */
extern const plan_fault data_parallel_faults[];
