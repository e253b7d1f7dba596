/* seq_layout.h: moving a sequence-sharded tensor between the order collectives use and the
 * order the model uses (chapter 03, sequence parallelism).
 *
 * Between transformer blocks a sequence-parallel rank r of p holds tokens [r*Ts, (r+1)*Ts) of
 * every sequence, Ts = T/p: a [B, Ts, C] tensor. The collectives of comm.h work on rank-major
 * chunks: an all-gather returns [p][B][Ts][C] (rank 0's whole shard, then rank 1's, ...), and a
 * reduce-scatter expects its input in that order. The model wants [B][T][C], row (b, t) at
 * b*T + t, with t = r*Ts + t_local. The two orders are the same numbers with the first two axes
 * swapped ([p][B] <-> [B][p]); when B = 1 they coincide.
 *
 *   seq_chunks_to_sequence:  chunks[p][B][Ts][C] -> x[B][p*Ts][C]    (after an all-gather)
 *   seq_sequence_to_chunks:  x[B][p*Ts][C] -> chunks[p][B][Ts][C]    (before a reduce-scatter)
 *
 * Megatron-LM avoids the copy by keeping activations sequence-first, [T, B, C], where a rank's
 * shard is already a contiguous block; this tutorial keeps the baseline's [B, T, C] everywhere
 * and pays one copy per collective instead (see 03_sequence_parallel/README.md).
 *
 * seq_layout_cpu.c and seq_layout_cuda.cu are the two loops around seq_chunk_index().
 * All pointers are device pointers; the two buffers must not overlap.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "cdefs.h"

C_BEGIN

/* Element i of x[B][p*Ts][C] lives at the returned index of chunks[p][B][Ts][C]. */
HD static inline size_t seq_chunk_index(size_t i, int p, int B, int Ts, int C) {
    size_t c = i % (size_t)C;
    size_t row = i / (size_t)C;                   /* b*T + t, T = p*Ts */
    size_t T = (size_t)p * (size_t)Ts;
    size_t b = row / T, t = row % T;
    size_t r = t / (size_t)Ts, t_local = t % (size_t)Ts;   /* the rank that holds token t */
    return ((r * (size_t)B + b) * (size_t)Ts + t_local) * (size_t)C + c;
}

/* ---- context parallelism (chapter 06) ------------------------------------------------------
 * Every sequence is cut into 2C chunks of Tc rows; rank r of C holds two of them, in its row
 * order slot 0 then slot 1 (Tl = 2 Tc rows):
 *   contiguous  chunks 2r and 2r+1 (one piece)       zigzag  chunks r and 2C-1-r
 * The rule is here once, for the context-parallel plan and for the Ulysses kernels below.      */
HD static inline int cp_chunk_of(bool zigzag, int r, int slot, int C) {
    return zigzag ? (slot == 0 ? r : 2 * C - 1 - r) : 2 * r + slot;
}
/* Which rank holds `chunk`, and in which slot: the inverse of cp_chunk_of. */
HD static inline void cp_chunk_owner(bool zigzag, int chunk, int C, int *r, int *slot) {
    if (!zigzag) { *r = chunk / 2; *slot = chunk % 2; }
    else if (chunk < C) { *r = chunk; *slot = 0; }
    else { *r = 2 * C - 1 - chunk; *slot = 1; }
}

/* DeepSpeed-Ulysses' all-to-all (Jacobs et al. 2023; chapter 06's --cp-method alltoall) turns a
 * tensor sharded by rows into one sharded by heads. With C ranks and Hg = heads / C:
 *   x [B, Tl, C*Hg, hd]          this rank's Tl rows of every sequence, all heads
 *   chunks [C][B][Tl][Hg][hd]    the all-to-all's send buffer: chunk j, rank j's heads
 *                                [j Hg, (j+1) Hg) of these rows
 *   recv [C][B][Tl][Hg][hd]      what arrives: chunk i, rank i's rows of this rank's heads
 *   y [B, T, Hg, hd]             the same in sequence order, T = C Tl: rank i's local row t is
 *                                position cp_chunk_of(i, t / Tc) Tc + t % Tc
 * and back again the same way after attention. Two index maps, each used both ways:        */
typedef struct { int C, B, Tl, Hg, hd; bool zigzag; } ulysses_shape;

/* Element o of chunks[C][B][Tl][Hg][hd] is element ulysses_head_index(o) of x[B][Tl][C*Hg][hd]. */
HD static inline size_t ulysses_head_index(size_t o, ulysses_shape s) {
    size_t d = o % s.hd, rest = o / s.hd;
    size_t h = rest % s.Hg; rest /= s.Hg;
    size_t t = rest % s.Tl; rest /= s.Tl;
    size_t b = rest % s.B, j = rest / s.B;
    return (((b * s.Tl + t) * s.C + j) * s.Hg + h) * s.hd + d;
}
/* Element o of y[B][T][Hg][hd] is element ulysses_rank_row_index(o) of recv[C][B][Tl][Hg][hd]. */
HD static inline size_t ulysses_rank_row_index(size_t o, ulysses_shape s) {
    size_t T = (size_t)s.C * s.Tl, Tc = s.Tl / 2, row_size = (size_t)s.Hg * s.hd;
    size_t within = o % row_size, row = o / row_size;
    size_t b = row / T, pos = row % T;
    int i, slot;
    cp_chunk_owner(s.zigzag, (int)(pos / Tc), s.C, &i, &slot);
    size_t t = (size_t)slot * Tc + pos % Tc;
    return (((size_t)i * s.B + b) * s.Tl + t) * row_size + within;
}

/* chunks (=) from x, before the all-to-all; x (=) from chunks, after the one back. */
void ulysses_heads_to_chunks(float *chunks, const float *x, ulysses_shape s);
void ulysses_chunks_to_heads(float *x, const float *chunks, ulysses_shape s);
/* y (=) from recv, after the all-to-all; recv (=) from y, before the one back. */
void ulysses_rank_rows_to_sequence(float *y, const float *recv, ulysses_shape s);
void ulysses_sequence_to_rank_rows(float *recv, const float *y, ulysses_shape s);

/* x[B, p*Ts, C] (=) from chunks[p, B, Ts, C]. */
void seq_chunks_to_sequence(float *x, const float *chunks, int p, int B, int Ts, int C);
/* chunks[p, B, Ts, C] (=) from x[B, p*Ts, C]. */
void seq_sequence_to_chunks(float *chunks, const float *x, int p, int B, int Ts, int C);

C_END
