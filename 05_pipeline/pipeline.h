/* pipeline.h: pipeline parallelism as a plan for the one model (common/model/model.c).
 *
 * The layers are cut into P x V chunks of L / (P V) layers; chunk c runs on pipeline rank c % P
 * (V > 1: each rank holds V chunks, round-robin, "interleaved"). Chunk 0 also holds the
 * embedding, the last chunk the final norm, the output layer and the loss. Each rank stores only
 * its chunks' weights. A step splits the batch into M microbatches of B / M sequences and runs
 * the rank's list of actions that the schedule gives it (schedule.h):
 *
 *   F(mb, c)  forward of microbatch mb through chunk c: receive h [B/M, T, D] from chunk c-1's
 *             rank (or look up the embedding), run the layers, send h to chunk c+1's rank (or
 *             take the loss of the microbatch)
 *   B(mb, c)  backward: receive dh from chunk c+1's rank (or start from the loss), run the
 *             layers' backward, send dh to chunk c-1's rank (or into the embedding's gradient)
 *   I, W      zb-h1's halves of B: I the input gradients (what the previous rank waits for), W
 *             the weight gradients dW += dy^T x of every linear, deferred to fill idle time
 *
 *   rank 0   F0 F1 F2 F3 .  .  B0 .  F? ...          one generic executor runs any list:
 *   rank 1   .  F0 F1 F2 F3 .  .  B0 ...             messages posted one action ahead
 *
 * The microbatches' losses are each the sum of their token losses over the global count of
 * valid targets (DESIGN.md), so the gradients accumulated over the microbatches are exactly the
 * baseline's. A layer's auxiliary loss (chapter 09's load balance, a sum over sequences) is added
 * to the loss by the stage whose chunk computed it, scaled alike.
 *
 * A microbatch's activations for a chunk (a llama_saved set) exist from the start of its F until
 * the end of its B (or W): the allocator counts them, so the memory a schedule costs is measured.
 *
 * Messages (point-to-point, between chunks on the same rank the tensor is handed over in place):
 * per step 2 M (P V - 1), each B/M * T * D floats, over the pp group's links: one two-rank group
 * per neighbour and direction (comm_ring_links), so that under NCCL, which runs a group's calls
 * in issue order, a receive posted early never holds up a send (comm.h, "Ordering").
 */
#pragma once
#include <stdbool.h>
#include "llama.h"
#include "mesh.h"
#include "plan.h"
#include "schedule.h"

/* Which groups carry the pipeline's messages (--p2p), and when their connections are made. */
typedef enum {
    PP_P2P_LINKS = 0,             /* a link per neighbour and direction, connected when created     */
    PP_P2P_SHARED,                /* the one pp group for every message: deadlocks under NCCL's order */
    PP_P2P_LAZY,                  /* links connected at their first message, as NCCL does by itself:
                                   * deadlocks under NCCL's lazy connection when a receive is posted
                                   * one action early                                               */
} pp_p2p_kind;

typedef struct {
    pp_schedule_kind schedule;
    int microbatches;             /* M                                                             */
    int virtual_stages;           /* V: chunks per rank (interleaved)                              */
    pp_p2p_kind p2p;              /* --p2p: links (default); shared and lazy, correct under MPI
                                   * only, are kept for the lesson (README "Why links")           */
} pp_options;

/* One action of this rank's last step, for the Gantt chart and the bubble: when it computed
 * (after its input had arrived), in seconds since the step began. */
typedef struct { pp_action a; double t0, t1; } pp_event;

/* The measured figures of the last step on this rank. */
typedef struct {
    int peak_sets;                /* most (microbatch, chunk) activation sets held at once        */
    size_t peak_set_bytes;        /* the allocator's count of their layer activations at that peak */
    size_t set_bytes;             /* the last set's layer activations (every chunk has L / (P V)
                                   * layers; 09's --moe-every makes them differ: chunk_set_bytes) */
    const size_t *chunk_set_bytes; /* [P V] one set's of each chunk this rank ran (the layers of
                                   * chapter 09's --moe-every differ from chunk to chunk), 0 else */
    double step_seconds;          /* the step's wall time on this rank                             */
    double busy_seconds;          /* the sum of its actions' compute                               */
} pp_measured;

/* Refuses (exit 2, one line) a (P, M, V) that the schedule does not admit. The layers over P x V
 * chunks and the batch over M microbatches are this technique's mesh rules (pipeline_layers_rule,
 * pipeline_microbatches_rule below), which mesh_create runs. */
void pipeline_validate(int pp, const pp_options *o);

/* Adds pipeline parallelism over the mesh's pp dimension to `plan` (the single-device plan, or
 * chapter 01's tensor-parallel one within each stage): the layers this rank holds, the schedule
 * that runs the step, and (zb-h1) the linear operator that defers the weight gradients. */
void pipeline_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const pp_options *o);

/* The pipeline's rules for mesh_create (mesh.h).
 *   layers: whole layers in each of the pp x virtual_stages chunks (virtual_stages 0: 1), or, with
 *           short_end_chunks (chapter 08's calculator plans it, as the Llama 3 paper does),
 *           (n_layers + 2) / chunks with one layer fewer in the first and the last chunk.
 *   microbatches: each data rank's batch / (dp_replicate x dp_shard) sequences in `microbatches`
 *           equal pieces (0: 1), or, when microbatch_size > 0 (the calculator), pieces of that many
 *           sequences. After the data-parallel rule (dp_batch_rule), which asks for whole shares. */
mesh_rule pipeline_layers_rule(int n_layers, int virtual_stages, bool short_end_chunks);
mesh_rule pipeline_microbatches_rule(long long batch, int microbatches, int microbatch_size);
/* The technique as the plan's stack records it (plan_free frees its state). */
extern const plan_technique pipeline_technique;

const pp_schedule *pipeline_schedule(const llama_plan *plan);
/* The last step's actions on this rank, in order, and its measured figures. */
const pp_event *pipeline_events(const llama_plan *plan, int *n);
pp_measured pipeline_measured(const llama_plan *plan);

/* The deliberate bugs of this chapter, for --fault. */
extern const plan_fault pipeline_faults[];
