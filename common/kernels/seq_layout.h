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

/* x[B, p*Ts, C] (=) from chunks[p, B, Ts, C]. */
void seq_chunks_to_sequence(float *x, const float *chunks, int p, int B, int Ts, int C);
/* chunks[p, B, Ts, C] (=) from x[B, p*Ts, C]. */
void seq_sequence_to_chunks(float *chunks, const float *x, int p, int B, int Ts, int C);

C_END
