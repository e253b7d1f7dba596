/* tensor_parallel.h: Megatron-LM's tensor-parallel building blocks (Shoeybi et al., 2019).
 *
 * A linear layer y = x W^T (W stored [out, in]) can be split across the p ranks of a
 * tensor-parallel group in two ways:
 *
 *   column-parallel: each rank owns out/p rows of W and computes out/p columns of y
 *                    from the full x. No communication: the output stays sharded.
 *   row-parallel:    each rank owns in/p columns of W, reads the matching in/p columns of x
 *                    (exactly what a column-parallel layer produced) and computes a partial
 *                    y of full width. The partials must be summed: one all-reduce.
 *
 * The communication sits in two conjugate operators around the pair:
 *   f  (copy to the tp region):     forward identity,   backward all-reduce of dx
 *   g  (reduce from the tp region): forward all-reduce,  backward identity
 *
 *          x ──f──> [column-parallel] ── local activation ──> [row-parallel] ──g──> y
 *
 * Chapter 00 uses them for a two-layer MLP; chapter 01 for attention and the feed-forward
 * block of a transformer; later chapters swap f and g for sequence-parallel versions.
 */
#pragma once
#include "comm.h"

/* f, forward: identity on x[n] (every rank already holds the full input).     No collective. */
void tp_copy_to_region_forward(comm_group *tp, float *x, size_t n);
/* f, backward: each rank's dx[n] only has the contribution of its own column shard; the true
 * gradient is their sum.                                 Issues: all-reduce(sum) of n floats. */
void tp_copy_to_region_backward(comm_group *tp, float *dx, size_t n);
/* g, forward: y[n] partial sums from each rank's row shard -> the full sum.
 *                                                        Issues: all-reduce(sum) of n floats. */
void tp_reduce_from_region_forward(comm_group *tp, float *y, size_t n);
/* g, backward: identity on dy[n] (the gradient of a sum reaches every term unchanged).
 *                                                                              No collective. */
void tp_reduce_from_region_backward(comm_group *tp, float *dy, size_t n);

/* Column-parallel linear. W_local: rows [r*out/p, (r+1)*out/p) of the full W[out, in].
 *   forward:  x[N, in] -> y_local[N, out/p]                                      No collective.
 *   backward: dy_local[N, out/p] -> dx_partial[N, in] (=, this rank's share; f sums them),
 *             dW_local[out/p, in] += dy_local^T x                                No collective. */
void column_parallel_linear_forward(float *y_local, const float *x, const float *W_local,
                                    int N, int in, int out_local);
void column_parallel_linear_backward(float *dx_partial, float *dW_local, const float *dy_local,
                                     const float *x, const float *W_local,
                                     int N, int in, int out_local);

/* Row-parallel linear. W_local: columns [r*in/p, (r+1)*in/p) of the full W[out, in], stored
 * as its own [out, in/p] matrix.
 *   forward:  x_local[N, in/p] -> y_partial[N, out] (=, g sums the partials)     No collective.
 *   backward: dy[N, out] (full, from g) -> dx_local[N, in/p] (=),
 *             dW_local[out, in/p] += dy^T x_local                                No collective. */
void row_parallel_linear_forward(float *y_partial, const float *x_local, const float *W_local,
                                 int N, int in_local, int out);
void row_parallel_linear_backward(float *dx_local, float *dW_local, const float *dy,
                                  const float *x_local, const float *W_local,
                                  int N, int in_local, int out);
