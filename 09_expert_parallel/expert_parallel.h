/* expert_parallel.h: expert parallelism, the experts of every MoE layer split over ranks that
 * exchange the tokens with all-to-alls (GShard; torchtitan's ExpertParallel; Megatron's alltoall
 * token dispatcher).
 *
 * The mesh is data-parallel, dp_replicate x dp_shard ranks, each with its share of the batch
 * (B / (dp_replicate dp_shard) sequences), times tp when chapter 01's tensor parallelism splits the
 * dense parts (attention, the shared expert) inside each data rank. The experts are split over
 * dp_shard, the ep group (as torchtitan carves ep out of the data-parallel ranks): rank r of it
 * holds experts [r E/ep, (r+1) E/ep) of every layer and is sent every copy of a token, from any
 * rank of its group, routed to one of them. Over dp_replicate the experts are replicated.
 *
 *   tensors        held                              gradient reduced after backward
 *   experts' w     E/ep experts of each, by rows     all-reduce over dp_replicate (every token of
 *                                                    the ep group already reached them)
 *   everything     whole (replicated)                all-reduce over dp_replicate x dp_shard
 *   else
 *
 * With --ep-over-cp the ep group is dp_shard x cp instead: the experts' gradients are still summed
 * over dp_replicate alone, the dense tensors' over dp_replicate x dp_shard x cp (and chapter 06's
 * own sum over cp skips itself). Without it the experts are replicated over cp too, and 06 sums
 * every gradient over cp before this reduction runs.
 *
 * Collectives per MoE layer and step, on the ep group (moe.c): forward an all-to-all of the
 * counts and two all-to-alls with counts (dispatch, combine), backward two more; then the
 * gradient all-reduces above.
 *
 * Inside chapter 05's pipeline (applied before this, over the mesh's pp dimension) each stage has
 * its own ep group, the ranks of the same pipeline coordinate: a MoE layer exchanges its tokens
 * with the ranks that hold the same layers, once per microbatch, and each rank reduces the
 * gradients of the tensors its stage holds. Under chapter 06's context parallelism (applied
 * before this) each cp coordinate has its own ep group, the experts are replicated over cp (06's
 * all-reduce sums their gradients), and the balancing loss's per-sequence counts are summed over
 * cp (experts.sequence_sum: one all-reduce of B E floats per MoE layer, forward and backward). A
 * capacity is refused there: it counts a sequence's copies in token order.
 */
#pragma once
#include "mesh.h"
#include "plan.h"

C_BEGIN

extern const plan_technique expert_parallel_technique;

/* The mesh's rule: ep (dp_shard, or dp_shard x cp when over_cp) divides --experts, and the data
 * ranks divide --batch (ep_given: --ep was on the command line, else ep is the data ranks, and the
 * refusal names it so); the rule's sizes are {experts, batch, over_cp (1: ep spans cp)}.
 * ep_data_ranks_text: how the data ranks are counted, "NP / tp", or with the pipeline's stages and
 * cp ranks aside, "NP / (tp pp cp)". ep_shard_degree: the dp_shard degree of a run on `world` ranks
 * (ep 0: --ep not given, every data rank; under over_cp --ep counts dp_shard x cp), or one line and
 * exit 2 when the degrees do not divide. */
mesh_rule ep_mesh_rule(const llama_config *c, long long batch, bool ep_given, bool over_cp);
const char *ep_data_ranks_text(int pp, int cp);
int ep_shard_degree(int world, int tp, int pp, int cp, int ep, bool over_cp);

/* Splits the experts over the mesh's dp_shard group (over_cp, with cp > 1: over dp_shard x cp, as
 * torchtitan carves ep out of them; then the dense tensors' gradients are summed over the data and
 * cp ranks here, and the plan declares it: groups.grads_summed_dims, so chapter 06's own sum over
 * cp skips itself) and the batch over the data ranks; installs the gradient reduction above,
 * after any the plan already has. The plan is the single device's
 * or chapter 01's (megatron_plan: the experts and the router stay whole on every tp rank), with
 * chapter 06's context parallelism and chapter 05's pipeline applied or not (in that order, as
 * chapter 08 applies them). Refuses (one line, exit 2) a capacity under cp > 1. */
void expert_parallel_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, bool over_cp);
/* The group a dense tensor's gradient is summed over: the data ranks, or the data and cp ranks
 * (over_cp). */
comm_group *expert_parallel_dense_group(const llama_plan *p);
/* Whether the ep group spans cp (--ep-over-cp applied with cp > 1). */
bool expert_parallel_over_cp(const llama_plan *p);

/* The deliberate bugs (--fault), for the checks that prove the parity check catches them. Those of
 * the exchange wrap the plan's operator; the MoE block asks which of its own are on (a plan
 * without expert parallelism, the baseline's, has none). */
extern const plan_fault expert_parallel_faults[];
enum {
    EP_FAULT_NO_GATES = 1,          /* the combine adds the copies with weight 1, not their gates       */
    EP_FAULT_SKIP_AUX_GRAD = 2,     /* the load-balancing loss's gradient is left out                   */
};
unsigned expert_parallel_faults_on(const llama_plan *p);

/* The experts' load, tallied on each rank: every MoE layer's forward adds the copies this rank
 * sent to each expert (per_expert [E]) and the copies it dropped; the gradients' reduction closes
 * the step. last_load gives the last step's tally (summed over this rank's layers and
 * microbatches; load [E]); count_load does nothing on a plan without expert parallelism (the
 * baseline's). */
void expert_parallel_count_load(const llama_plan *p, const size_t *per_expert, size_t dropped);
void expert_parallel_last_load(const llama_plan *p, double *load, double *dropped);

C_END
