/* context_parallel.h: context parallelism, the sequence of every batch split over C ranks for the
 * whole model (Liu et al. 2023, "Ring Attention with Blockwise Transformers"; torchtitan's and
 * PyTorch's context_parallel), as a plan for the one model (common/model/model.c).
 *
 * Every layer but attention works row by row, so a rank runs the model on its own rows of each
 * sequence (T / C of them) with no communication at all. Attention needs every earlier key: the
 * keys and values come to the queries, block by block, and each block's partial result is merged
 * into the running one by its log-sum-exp (attention_merge, llama_kernels.h):
 *
 *   ring        C - 1 rotations: each rank sends the K/V block in hand to the next rank while it
 *               computes on it (non-blocking sendrecv posted first), so after C steps every
 *               query has met every key. Backward: the blocks go round again, and the gradients
 *               dK, dV travel with their block and come home after C sends. dQ stays local.
 *   allgather   K and V all-gathered once per layer (and again in backward), dK and dV
 *               reduce-scattered back to their owners.
 *   alltoall    DeepSpeed-Ulysses (Jacobs et al. 2023): an all-to-all gives each rank every row
 *               of H / C heads, attention runs on whole sequences, a second all-to-all brings the
 *               outputs back to the rows (heads and kv heads divisible by C).
 *
 * Balance. Causal attention makes late queries see more keys. Cut the sequence into 2C chunks:
 *
 *   contiguous  rank r holds chunks 2r, 2r+1 (one piece): rank C-1 does the most, rank 0 the least
 *   zigzag      rank r holds chunks r and 2C-1-r: every rank the same work
 *
 *   C = 2, chunks 0 1 2 3:   contiguous  rank 0: 0 1   rank 1: 2 3
 *                            zigzag      rank 0: 0 3   rank 1: 1 2
 *
 * The tokens, the targets and the RoPE positions of a rank's rows follow the same order (the
 * plan's `positions`; the harness selects the tokens by them). The parameters are replicated over
 * cp, and each rank's gradient is its rows' share: one all-reduce over cp per step sums them. The
 * loss is each rank's sum of token losses over the global count of valid targets, summed over cp.
 */
#pragma once
#include <stdbool.h>
#include "device.h"
#include "llama.h"
#include "mesh.h"
#include "plan.h"

typedef enum { CP_RING = 0, CP_ALLGATHER, CP_ALLTOALL, CP_NMETHODS } cp_method;
typedef enum { CP_CONTIGUOUS = 0, CP_ZIGZAG, CP_NBALANCES } cp_balance;
const char *cp_method_name(cp_method m);      /* "ring", "allgather", "alltoall" */
const char *cp_balance_name(cp_balance b);    /* "contiguous", "zigzag"     */

typedef struct {
    cp_method method;
    cp_balance balance;
} cp_options;

/* The 2C chunks of T / (2C) rows that rank r of C holds, in its row order: chunks[0], chunks[1]. */
void cp_chunks_of(cp_balance balance, int r, int C, int chunks[2]);
/* Attention score elements one rank computes per (sequence, head) in a forward: each visible pair
 * (query chunk, key chunk) computed whole, Tc^2 with Tc = T / (2C); the closed forms the run
 * prints beside the count. */
/* BEGIN SOLUTION 06: the attention work */
/* contiguous (4r + 3) Tc^2 (its chunks 2r, 2r+1 see 2r+1 and 2r+2 chunks), zigzag (2C + 1) Tc^2
 * on every rank. */
/* END SOLUTION */
double cp_work_formula(cp_balance balance, int r, int C, int T);

/* Refuses (exit 2, one line) more cp ranks than a ring here holds (CP_MAX_RANKS). The sequence
 * in 2C chunks and, for alltoall, whole heads of a tp rank on each cp rank are this technique's
 * mesh rules (cp_sequence_rule, cp_heads_rule below), which mesh_create runs. */
void context_parallel_validate(int cp);

/* Adds context parallelism over the mesh's cp dimension to `plan` (the single-device plan, or
 * chapter 01's tensor-parallel one: heads split by tp, rows by cp): the rows and positions of
 * this rank, the attention operator of the method, the gradient all-reduce over cp. */
void context_parallel_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const cp_options *o);

/* The --check baseline's attention for a run whose plan has context parallelism over `cp` ranks
 * (one included: its two chunks), the baseline in `precision` (run_baseline_precision): under
 * bf16 installs into `baseline` (the single-device plan) attention computed in the ranks' blocks,
 * on one device (the method's chunks and block kernels; context_parallel.c says why) and returns
 * true; otherwise leaves it as it is (the whole-sequence kernel) and returns false. Give the
 * baseline plan to run_baseline_create. */
bool context_parallel_baseline(llama_plan *baseline, dtype precision, const cp_options *o, int cp);

/* Context parallelism's rules for mesh_create (mesh.h).
 *   sequence: each cp rank holds 2 chunks of seq_len / (2 x cp) rows (the zigzag's halves); with
 *           sequence_parallel (chapter 03 over it: a fact of another technique, given as data) the
 *           lengths it offers also split over cp x tp.
 *   heads:  all-to-all attention deals a tp rank's n_heads / tp heads and n_kv_heads / tp kv heads
 *           out whole to the cp ranks. */
mesh_rule cp_sequence_rule(int seq_len, bool sequence_parallel);
mesh_rule cp_heads_rule(const llama_config *c);
/* The technique as the plan's stack records it (plan_free frees its state). */
extern const plan_technique context_parallel_technique;

/* Score elements this rank computed in its last attention forward (one layer), per (sequence,
 * head): what the balance is about. alltoall computes its H / C heads of whole sequences as one
 * device would, in causal query blocks: cp_alltoall_work_formula. */
double context_parallel_work(const llama_plan *plan);
/* The all-to-all's work per (sequence, head) on every rank: the whole sequence's T queries in the
 * causal query blocks of rows s_1 .. s_nb (llama_kernels.h), block i against the keys it sees
 * (s_1 + ... + s_i), for 1 / C of the heads: sum_i s_i (s_1 + ... + s_i) / C = (T^2 + sum_i
 * s_i^2) / 2C, T^2 (nb + 1) / (2 nb C) when nb divides T. Every score of the T x T matrix would
 * be T^2 / C. */
double cp_alltoall_work_formula(int C, int T);

/* The attention's scratch by formula, in floats, for one forward and one backward of a layer on a
 * rank holding Tl rows (Tc = Tl / 2) of B sequences, H heads and Hkv kv heads of hd, C ranks;
 * K = B Tl Hkv hd (this rank's k, or v), Q = B Tl H hd, T = C Tl:
 *   ring       forward 4K + Tc H hd + H Tc + H Tc^2   (block in hand and incoming; one pair's out,
 *                                                      lse and scores)
 *              backward 8K + 2 H Tc^2                 (block, gradient, both incoming; P and dS)
 *   allgather  forward 2K (C + 1) + Tc H hd + H Tc + H Tc^2     backward 4K (C + 1) + 2 H Tc^2
 *   alltoall   forward 2Q + 2K + max(2Q, (H/C) s T)             (q, k, v, out by heads; the
 *                                                      all-to-all's send and receive, or the
 *                                                      scores of one sequence's last and largest
 *                                                      causal query block, s rows by T keys)
 *              backward 4Q + 4K + max(2Q, 2 (H/C) s T)
 * Against the single-device operator, whose softmax alone is B H T^2 per layer, saved.        */
void cp_working_set_formula(cp_method method, int C, int B, int Tl, int H, int Hkv, int hd,
                            double *forward, double *backward);
/* The same in bytes for a run in precision `compute` (--dtype): fp32, 4 x the floats above; bf16,
 * where the K/V blocks travel as bf16 (context_parallel.c's kv_wire) and every attention call holds
 * its operands' bf16 copies (copy_bytes e each: gemm_bf16_operand_type's size; with e = 4 the
 * block's P and dS are rounded in place, c = 0, else c = 1), at most:
 *   ring       the same blocks' bytes (two at 2 bytes, the one in hand widened to fp32), plus
 *              forward  e (Tc Hkv hd + max(Tc H hd, c H Tc^2))
 *              backward e (2 Tc H hd + Tc Hkv hd + max(Tc Hkv hd, 2 c H Tc^2))
 *   allgather  forward  2K (C + 1) x 2 + 2K x 4 + (Tc H hd + H Tc + H Tc^2) x 4 + the ring's copies
 *              backward 2K (C + 1) x 2 + 2K (C + 1) x 4 + 2K x 4 + 2 H Tc^2 x 4 + the ring's copies
 *   alltoall   forward  (2Q + 2K) x 4 + max(2Q x 4, (H/C) s T x 4 + e (T Hkv/C hd + max(s H/C hd, c H/C s T)))
 *              backward (4Q + 4K) x 4 + max(2Q x 4, 2 (H/C) s T x 4 + e (2 s H/C hd + T Hkv/C hd
 *                                                 + max(T Hkv/C hd, 2 c H/C s T)))           */
void cp_working_set_bytes(cp_method method, dtype compute, size_t copy_bytes, int C, int B, int Tl, int H, int Hkv,
                          int hd, double *forward, double *backward);

/* The most scratch (MEM_BUFFERS bytes, the allocator's count) the last attention forward and
 * backward held on this rank, above what was allocated before the call. */
void context_parallel_working_sets(const llama_plan *plan, size_t *forward, size_t *backward);

/* The ring's timeline: with recording on, each ring forward keeps its steps' compute and wait
 * intervals as marks of the compute stream (device.h); the last one's are read back with
 * context_parallel_timeline (which waits for the device), in seconds on wall_seconds()'s clock. */
#define CP_MAX_RANKS 64
typedef struct {
    int step, owner;    /* ring step t, and the rank whose K/V block was in hand (r - t)         */
    bool wait;          /* false: computing on the block; true: waiting for the next one         */
    double t0, t1;      /* read by context_parallel_timeline                                     */
    device_mark m0, m1;
} cp_event;
void context_parallel_record_timeline(llama_plan *plan, bool on);
int context_parallel_timeline(const llama_plan *plan, const cp_event **events);

/* The deliberate bugs of this chapter, for --fault. */
extern const plan_fault context_parallel_faults[];
