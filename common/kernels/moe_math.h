/* moe_math.h: the per-row formulas of moe_kernels.h, shared by the CPU loops and the CUDA
 * kernels (HD), like llama_math.h.
 *
 * The router's softmax over E experts: p_e = e^(x_e - m) / sum_f e^(x_f - m), m the row's
 * largest logit (so no exponential overflows). Its backward, from dp = d loss / d p:
 *   d loss / d x_e = p_e (dp_e - sum_f dp_f p_f)
 * (the Jacobian of the softmax, diag(p) - p p^T, applied to dp).
 * Or DeepSeek-V3's sigmoid, expert by expert: s_e = 1 / (1 + e^-x_e), whose backward is
 *   d loss / d x_e = ds_e s_e (1 - s_e).
 */
#pragma once
#include <math.h>
#include "cdefs.h"

/* One row: p[E] (=) from x[E]. */
HD static inline void moe_softmax_row(float *p, const float *x, int E) {
    float m = x[0], s = 0.0f;
    for (int e = 1; e < E; e++) m = x[e] > m ? x[e] : m;
    for (int e = 0; e < E; e++) s += (p[e] = expf(x[e] - m));
    for (int e = 0; e < E; e++) p[e] /= s;
}

/* One row: dx[E] (=) from dp[E] and p[E]. */
HD static inline void moe_softmax_backward_row(float *dx, const float *dp, const float *p, int E) {
    float dot = 0.0f;
    for (int e = 0; e < E; e++) dot += dp[e] * p[e];
    for (int e = 0; e < E; e++) dx[e] = p[e] * (dp[e] - dot);
}

/* One row of the router's scores: s[E] (=) from x[E], the softmax's or (sigmoid) each expert's own
 * sigmoid; and its backward, dx[E] (=) from ds[E] and s[E]. */
HD static inline void moe_scores_row(float *s, const float *x, int E, int sigmoid) {
    if (!sigmoid) { moe_softmax_row(s, x, E); return; }
    for (int e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-x[e]));
}
HD static inline void moe_scores_backward_row(float *dx, const float *ds, const float *s, int E, int sigmoid) {
    if (!sigmoid) { moe_softmax_backward_row(dx, ds, s, E); return; }
    for (int e = 0; e < E; e++) dx[e] = ds[e] * s[e] * (1.0f - s[e]);
}

/* Element c of token t's combined row: sum over its k copies, in order, of gate * y; a dropped
 * copy (slot -1: its expert was full) adds nothing. */
HD static inline float moe_combine_elem(const float *y, const int *slot, const float *gates, int t, int k, int D,
                                        int c) {
    float s = 0.0f;
    for (int j = 0; j < k; j++) {
        int row = slot[(size_t)t * k + j];
        if (row >= 0) s += (gates ? gates[(size_t)t * k + j] : 1.0f) * y[(size_t)row * D + c];
    }
    return s;
}
