/* async_tp.h: asynchronous tensor parallelism (Wang et al., "Overlap communication with dependent
 * computation via decomposition in large deep learning models", ASPLOS 2023; torchtitan's
 * "async TP"), applied on top of sequence parallelism (sequence_parallel.h).
 *
 * With sequence parallelism every column-parallel linear (wq wk wv, w1 w3, the output layer)
 * starts with an all-gather of the sequence, and every row-parallel linear (wo, w2) ends with a
 * reduce-scatter; the GEMM waits for the whole collective. Decomposed over the tp ring, each of
 * them becomes p - 1 point-to-point steps over comm_ring_links, and the GEMM of the chunk already
 * here runs while the next chunk travels:
 *
 *   all-gather + matmul (rank r, step k = 0 .. p-1): compute on the chunk here (first r's own)
 *       while the next arrives from r - 1 and the chunk just used goes on to r + 1.
 *   matmul + reduce-scatter (step k): compute the partial product of one chunk, add the
 *       accumulator of that chunk received from r - 1, send it to r + 1 while computing the
 *       next; at step p - 1 the chunk is r's own, and the sum is complete.
 * (async_tp_chunk, chapter 03's exercise 8, says which chunk.)
 *
 * All four are decomposed: the forward's all-gather + matmul (column-parallel) and matmul +
 * reduce-scatter (row-parallel), and their backwards: the row-parallel linear's backward is an
 * all-gather of dy + matmul (dx = dy W, dW += dy^T x, both per chunk), the column-parallel
 * linear's backward a matmul + reduce-scatter of dx. What stays a blocking collective: the
 * embedding's exit (a lookup, no GEMM), and the re-gathers of the norm outputs before a layer's
 * backward (the weight gradient's input; with --ac full these are the recomputed forward's
 * gathers, which are decomposed).
 *
 * How it sits on the plan: it replaces the projection groups (projection_ops, plan.h) whole. A
 * proj_in group (the region's entry, then wq wk wv; w1 w3; the output layer) runs the entry's
 * all-gather as a ring with the group's GEMMs on each chunk as it arrives; its backward computes
 * each chunk's summed dx and reduce-scatters it on the ring. A proj_out group (wo; w2, then the
 * exit) computes each chunk's partial product and reduce-scatters it on the ring; its backward
 * all-gathers dy on the ring with dx and dW on each chunk. The GEMMs are the plan's linear
 * operator, per sequence of the batch and chunk (B blocks of Ts rows: the sequence is dimension 1
 * of [B, T, C]). A group whose chunk would not fit the ring's buffers runs the plain way (the
 * groups below). The regions stay sequence parallelism's: the embedding's exit and the re-gathers
 * before a layer's backward are its blocking collectives. The groups declare splits_rows, on
 * which float8 (which scales a GEMM's whole input) refuses.
 */
#pragma once
#include <stdbool.h>
#include "comm.h"
#include "llama.h"
#include "plan.h"

/* The chunk of the sequence rank r of p works on at ring step k (0 .. p-1): in an all-gather the
 * chunk whose GEMM runs while the next one travels; in a reduce-scatter the chunk whose partial
 * product is computed, added to what came from r - 1 and sent on to r + 1. */
int async_tp_chunk(int r, int p, int k, bool reduce_scatter);

/* What the rings waited for, since the start: the seconds the compute stream waited for the
 * chunk transfers (comm_wait), and the seconds of the chunk GEMMs (with the copies), both read
 * off marks of the compute stream (device.h), so on the GPU they are the device's times and not
 * the host's time to queue the work. Reading them waits for the device. */
typedef struct {
    double wait_seconds, compute_seconds;
    long long rings, steps;
} async_tp_stats;
async_tp_stats async_tp_get_stats(const llama_plan *plan);

/* After training (rank 0 prints): the rings a step, the seconds of their GEMMs and of their
 * waits per step; and OUT_DIR/async_tp_timeline.csv, the ring steps of the first layer's forward
 * of the last training step on this rank: ring,kind,step,posted_ms,computed_ms,waited_ms (host
 * times from the first ring's start: transfer posted and GEMMs started, GEMMs done, transfer
 * waited for), which plot.sh draws. Returns 0, or 1 when the file could not be written. */
int async_tp_report(const llama_plan *plan, const char *out_dir, int steps);

/* The technique (plan_free frees its state). */
extern const plan_technique async_tp_technique;

/* Wraps a sequence-parallel plan (sequence_parallel_apply with sp, tp > 1): the region's entry
 * and the output layer's entry, and the linear operator. B: the sequences of one forward. Refuses
 * (one line, exit 2) a plan without the sequence split. */
void async_tp_apply(llama_plan *plan, const llama_config *c, int B);

/* --fault async-tp-skip-chunk: every rank skips the transfer of one chunk (the last step of each
 * all-gather), so the GEMM of that step reads the chunk buffer's stale contents. */
extern const plan_fault async_tp_fault;
