/* moe_kernels.h: the row movements and the router's softmax of a mixture-of-experts layer
 * (chapter 09).
 *
 * A token t of the N rows goes to k experts; its j-th copy (t, j) is row slot[t*k + j] of a
 * [N*k, D] buffer laid out expert by expert (the order the dispatch sends them in: moe.c). The
 * kernels move rows between the tokens' [N, D] and that buffer; the routing itself (top-k, the
 * slots, the counts) is decided on the host, which the all-to-all needs the counts on anyway.
 *
 *   moe_router_scores             scores[N, E] (=) = softmax of each row of logits[N, E], or
 *                                 (sigmoid) the sigmoid of each element (DeepSeek-V3's router)
 *   moe_router_scores_backward    dlogits[N, E] (=) = p * (dp - sum_e dp p), row by row; or
 *                                 (sigmoid) ds * s * (1 - s)
 *   moe_gather_rows               dst[i] (=) = src[index[i]], i < n: the dispatch's copies
 *   moe_combine                   h[t] += sum_j gate(t, j) y[slot[t*k+j]]: the weighted combine
 *                                 (gates NULL: every weight 1, which sums a token's copies'
 *                                 gradients in the backward)
 *   moe_combine_backward          dy[slot[t*k+j]] (=) = gate(t, j) dh[t];
 *                                 dgates[t*k+j] (=) = dh[t] . y[slot[t*k+j]]
 * A copy whose slot is -1 was dropped (its expert's capacity was full): it has no row, adds
 * nothing to the combine and gets a zero gate gradient.
 *
 * Each output row is written by one thread (CUDA) or one loop (CPU), its copies added in the
 * order j = 0 .. k-1: no atomics, the same bits on every run. The formulas are in moe_math.h;
 * moe_kernels_cpu.c and moe_kernels_cuda.cu are the two loops around them.
 */
#pragma once
#include "cdefs.h"

C_BEGIN

void moe_router_scores(float *scores, const float *logits, int N, int E, int sigmoid);
void moe_router_scores_backward(float *dlogits, const float *dscores, const float *scores, int N, int E, int sigmoid);
void moe_gather_rows(float *dst, const float *src, const int *index, int n, int D);
void moe_combine(float *h, const float *y, const int *slot, const float *gates, int N, int k, int D);
void moe_combine_backward(float *dy, float *dgates, const float *dh, const float *y, const int *slot,
                          const float *gates, int N, int k, int D);

C_END
