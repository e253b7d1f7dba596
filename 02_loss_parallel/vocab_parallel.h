/* vocab_parallel.h: the two ends of the model with the vocabulary split over the tp group
 * (Megatron-LM's VocabParallelEmbedding and vocab-parallel cross-entropy, Shoeybi et al., 2019;
 * torchtitan calls the output's layout Shard(-1) and the loss "loss parallel"), as a plan.
 *
 * Rank r of p owns the vocabulary entries [v0, v0 + Vl), Vl = Vp/p, v0 = r*Vl: those rows of
 * tok_embeddings [V, D] and of output [V, D], hence those columns of the logits [N, V]. Vp is V
 * padded so that p divides it (Megatron-LM's rule, mesh.h's vocab_padded_size: 1,000 over 3 ranks
 * is 1,152 rows, 384 a rank): entries [V, Vp), on the last ranks, are padding. Their rows are zero
 * and never updated; their logits are masked out of the loss (-inf: vocab_math.h).
 *
 *   embedding:  each rank looks up the tokens it owns (zero rows for the others); every token
 *               is owned by exactly one rank, so g, the sum over ranks, is the lookup.
 *                                                    forward: 1 all-reduce of N*D floats
 *   output:     logits_local[N, Vl] = xn[N, D] W_local^T     (column-parallel, behind f)
 *                                                    backward: 1 all-reduce of N*D floats
 *   loss:       M = max, S = sum of e^(x - M), x_t = target logit, each one all-reduce of
 *               N floats; loss_n = (M - x_t) + log S.    forward: 3 all-reduces of N floats
 *               backward: (e^(x - M)/S - onehot) on the local columns. No collective.
 *
 * The full logits [N, V] exist nowhere: each rank holds N*V/p of them, and the loss moves
 * 3N floats instead of gathering N*V. In the model (common/model/model.c) the embedding's g
 * and the output's f are the plan's vocab region: chapter 01's f and g, now at the two ends.
 *
 * N = B*T token rows. All pointers are device pointers.
 */
#pragma once
#include "comm.h"
#include "llama.h"
#include "mesh.h"
#include "plan.h"

/* tok_embeddings and output split over the vocabulary: rows [v0, v0 + V/tp) of each. */
void vocab_parallel_layouts(shard_layout layout[P_NKINDS]);

/* Of a rank's Vl vocabulary entries [v0, v0 + Vl), how many are real entries of the V (the
 * first ones; the others are padding). */
/* BEGIN SOLUTION 02 */
/* Vl, fewer on the rank that holds V, 0 past it. */
/* END SOLUTION */
int vocab_parallel_real_columns(int V, int Vl, int v0);

/* logits_local[N, Vl]; row_max, row_sumexp (saved for backward), target_logit: device [N].
 * Entries at V or beyond are padding, masked (-inf). Issues 3 all-reduces of N floats (max, sum,
 * sum). Returns the sum over valid rows of the token losses (host float), the same on every rank. */
float vocab_parallel_cross_entropy_forward(comm_group *tp, const float *logits_local,
                                           const int *targets, int N, int Vl, int v0, int V,
                                           float *row_max, float *row_sumexp, float *target_logit);

/* dlogits_local[N, Vl] (=, may alias logits_local) = (softmax - onehot) * grad_scale on the
 * local slice, zero rows for ignored targets, zero columns for padding. No collective. */
void vocab_parallel_cross_entropy_backward(float *dlogits_local, const float *logits_local,
                                           const int *targets, const float *row_max,
                                           const float *row_sumexp, int N, int Vl, int v0, int V,
                                           float grad_scale);

/* The loss operator of the plan: the two functions above, saving M and S (2 floats per row). */
extern const loss_ops vocab_parallel_loss;
extern const plan_technique loss_parallel_technique;

/* Adds loss parallelism to a plan with a tp group (chapter 01's megatron_plan): the vocabulary
 * layouts, chapter 01's f and g as the vocab region, the vocab-parallel loss. (The mesh was
 * checked first: tp divides the padded vocabulary, mesh_check.) */
void loss_parallel_apply(llama_plan *plan, const llama_config *c);

/* The vocabulary's rule for mesh_create (mesh.h): tp divides the vocabulary padded
 * (vocab_padded_size), which only a --vocab-multiple that is no multiple of tp can break. Sizes:
 * vocab_size, vocab_multiple (0: the default rule). */
mesh_rule vocab_mesh_rule(long long vocab_size, int vocab_multiple);

/* --vocab-multiple M, in the chapters that split the vocabulary (02, 03, 08): pad it to a
 * multiple of M instead of mesh.h's default (128 x tp, or tp for a toy vocabulary). */
#define VOCAB_MULTIPLE_USAGE                                                                               \
    "  --vocab-multiple M         pad the vocabulary split over tp to a multiple of M (default: 128 x tp\n" \
    "                             when the vocabulary has that many entries, else tp; tp must divide the\n" \
    "                             padded size)\n"
void vocab_multiple_flag(llama_config *c, const char *arg);
/* One line from rank 0 when the vocabulary is padded: its padded size and why (the multiple and
 * where it came from), and which ranks hold the padding rows. Nothing when tp divides it as is. */
void vocab_padding_describe(const llama_config *c, int tp);

/* The padding rows of tok_embeddings and output, in every block each rank stores (values,
 * gradients, AdamW's m and v; whole tp slices or FSDP shards): they start at zero, get exactly zero
 * gradient (no token looks them up, the mask zeroes their logits' gradient) and zero is a fixed
 * point of AdamW, weight decay included, so they must still be exactly zero. Rank 0 prints one
 * line and records a failure with the parity verdict (parity.h). Collective over the world.
 * Returns the number of mismatches (0 or 1). */
int vocab_padding_report(const llama_model *m);

/* The deliberate bugs of this chapter, for --fault. */
extern const plan_fault loss_parallel_faults[];
