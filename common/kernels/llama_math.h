/* llama_math.h: the per-element and per-row formulas of the Llama layers.
 *
 * Each formula is defined here once. llama_kernels_cpu.c calls these functions in loops;
 * llama_kernels_cuda.cu calls them once per thread (and, for row reductions, merges the
 * threads' partial results with cub::BlockReduce). The CPU unit tests therefore test the math
 * the GPU runs. Everything is fp32, as in the baseline model.
 *
 * Functions that produce two numbers (a rotated pair, an AdamW update of p, m and v) write
 * through pointers; the rest return their value.
 */
#pragma once
#include <math.h>
#include "cdefs.h"
#include "dtype.h"

/* ---- token embedding ------------------------------------------------------------------------
 * A table shard holds rows [row0, row0 + nrows) of the full vocabulary. Returns the local row
 * of `token`, or -1 when another shard owns it (its output row is zero, it gets no gradient). */
HD static inline int embedding_local_row(int token, int row0, int nrows) {
    int row = token - row0;
    return (row >= 0 && row < nrows) ? row : -1;
}

/* The backward's gradient, in a fixed order: dtable[row] += dout[n] for the positions n of
 * `row` in increasing n, on both backends (no atomics), so runs and resumes on the GPU give the
 * same bits, which are the CPU's. Both twins first sort the positions by their sort key,
 * stably: keys[k] and positions[k], k < N, are the sorted pairs, one run of equal keys per
 * table row, its positions increasing. A position another shard owns (or token -1) gets the key
 * nrows, after every row, and adds nothing. */
HD static inline int embedding_sort_key(int token, int row0, int nrows) {
    int row = embedding_local_row(token, row0, nrows);
    return row >= 0 ? row : nrows;
}
/* Element d of the table row of run k: the run's first pair adds the run's dout rows [N, D] in
 * order onto dtable[nrows, D]; every other k does nothing (one writer per table element). */
HD static inline void embedding_backward_run(float *dtable, const float *dout, const int *keys,
                                             const int *positions, int k, int d, int N, int D,
                                             int nrows) {
    int row = keys[k];
    if (row == nrows || (k > 0 && keys[k - 1] == row)) return;
    float *dst = dtable + (size_t)row * D + d;
    float acc = *dst;
    for (int j = k; j < N && keys[j] == row; j++) acc += dout[(size_t)positions[j] * D + d];
    *dst = acc;
}

/* ---- SiLU and SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer") ----------------------
 *   sigmoid(x) = 1 / (1 + e^-x),  silu(x) = x sigmoid(x)
 * For very negative x, e^-x overflows to +inf and sigmoid correctly becomes 0.                   */
HD static inline float sigmoid_value(float x) { return 1.0f / (1.0f + expf(-x)); }
HD static inline float silu_value(float x) { return x * sigmoid_value(x); }
/* d silu / dx = s + x s (1 - s) = s (1 + x (1 - s)),  s = sigmoid(x)                           */
HD static inline float silu_derivative_from(float x, float s) { return s * (1.0f + x * (1.0f - s)); }
/* out = silu(a) * b, where a = x W1^T is the gate and b = x W3^T the value.                     */
HD static inline float swiglu_value(float a, float b) { return silu_value(a) * b; }
/* Backward, both inputs' gradients from one sigmoid (the exp and the division are most of the
 * cost of this element-wise pass):
 *   d out / d a = b silu'(a),   d out / d b = silu(a) = a s                                      */
HD static inline void swiglu_grads(float dout, float a, float b, float *da, float *db) {
    float s = sigmoid_value(a);
    *da = dout * b * silu_derivative_from(a, s);
    *db = dout * (a * s);
}

/* ---- RoPE (Su et al. 2021, "RoFormer") on interleaved pairs (2j, 2j+1) of a head ------------
 * Frequency of pair j: f_j = theta^(-2j/hd). Computed as torchtitan does, 1 / theta^(2j/hd) in
 * fp32, so the angles agree with PyTorch's to the last bit of the power.                        */
HD static inline float rope_frequency(int j, int hd, float theta) {
    return 1.0f / powf(theta, (float)(2 * j) / (float)hd);
}
/* The angle of pair j at global position pos (the position in the whole sequence, not in a
 * local shard of it: that is what makes context-parallel shards agree with the baseline).     */
HD static inline float rope_angle(int pos, int j, int hd, float theta) {
    return (float)pos * rope_frequency(j, hd, theta);
}
/* Rotation by the angle: (a, b) -> (a cos - b sin, a sin + b cos). This is the complex product
 * (a + ib) e^(i angle), which is how torchtitan writes it.                                     */
HD static inline void rope_rotate(float *a, float *b, float cos_t, float sin_t) {
    float a0 = *a, b0 = *b;
    *a = a0 * cos_t - b0 * sin_t;
    *b = a0 * sin_t + b0 * cos_t;
}
/* The inverse rotation (by -angle). A rotation R is orthogonal, so the gradient of y = R x is
 * dx = R^T dy = R^-1 dy: RoPE's backward is this function applied to the incoming gradient.    */
HD static inline void rope_rotate_inverse(float *a, float *b, float cos_t, float sin_t) {
    float a0 = *a, b0 = *b;
    *a = a0 * cos_t + b0 * sin_t;
    *b = -a0 * sin_t + b0 * cos_t;
}

/* ---- RMSNorm (Zhang & Sennrich 2019): y_c = x_c r w_c,  r = 1 / sqrt(mean(x^2) + eps) -------
 * The row kernels first reduce sum_c x_c^2, then call these per element.                       */
HD static inline float rmsnorm_rstd(float sum_sq, int C, float eps) {
    /* 1/sqrtf rather than rsqrtf: rsqrtf is an approximation on the GPU, and the two backends
     * must compute the same number. */
    return 1.0f / sqrtf(sum_sq / (float)C + eps);
}
/* (x r) w: the normalised value first, then the weight, in PyTorch's order of rounding.        */
HD static inline float rmsnorm_value(float x, float rstd, float w) { return (x * rstd) * w; }
/* Backward. With g = dL/dy and dr/dx_c = -r^3 x_c / C:
 *   dL/dx_c = r w_c g_c - (r^3 x_c / C) * dot,   dot = sum_i g_i w_i x_i   (a row reduction)
 *   dL/dw_c = g_c x_c r                          (summed over rows)                         */
HD static inline float rmsnorm_dot_term(float dout, float w, float x) { return dout * w * x; }
HD static inline float rmsnorm_dx(float dout, float x, float w, float rstd, float dot, int C) {
    return rstd * (dout * w - x * (rstd * rstd * dot / (float)C));
}
HD static inline float rmsnorm_dw_term(float dout, float x, float rstd) { return dout * x * rstd; }

/* ---- softmax, numerically stable and "online" (Milakov & Gimelshein 2018) --------------------
 * softmax(x)_j = e^(x_j - M) / S with M = max_i x_i and S = sum_i e^(x_i - M). Subtracting the
 * maximum keeps every exponent <= 0, so logits of 1e4 do not overflow.
 * The pair (M, S) can be built one element at a time, rescaling S whenever the maximum grows,
 * and two pairs built over different parts of a row can be merged. That is what lets every GPU
 * thread summarise its own slice of a row in one pass and cub::BlockReduce combine the slices
 * (and what lets a context-parallel ring combine attention over chunks of keys).
 * An empty state is (M = -inf, S = 0).                                                          */
typedef struct {
    float max;   /* M: the largest element seen so far      */
    float sum;   /* S: sum of e^(x - M) over those elements */
} softmax_state;

HD static inline softmax_state softmax_state_empty(void) {
    softmax_state st;
    st.max = -INFINITY;
    st.sum = 0.0f;
    return st;
}
/* Add element x. When x is a new maximum, the old sum was relative to the old maximum:
 * rescale it by e^(old M - x) (and e^(x - x) = 1 for x itself). One exp per element.          */
HD static inline softmax_state softmax_state_add(softmax_state st, float x) {
    if (x > st.max) {
        st.sum = st.sum * expf(st.max - x) + 1.0f;   /* the first x: 0 * e^-inf + 1 = 1 */
        st.max = x;
    } else {
        st.sum += expf(x - st.max);
    }
    return st;
}
/* Combine two states: bring both sums to the larger maximum. Associative and commutative up to
 * rounding, so any reduction tree gives the same answer to fp32 accuracy.                     */
HD static inline softmax_state softmax_state_merge(softmax_state a, softmax_state b) {
    if (b.max > a.max) { softmax_state t = a; a = b; b = t; }  /* now a.max >= b.max */
    if (b.sum == 0.0f) return a;             /* b is empty: avoids e^(-inf - -inf) = NaN */
    a.sum += b.sum * expf(b.max - a.max);
    return a;
}
/* e^(x - M): one element's unnormalised weight, and the probability it becomes. */
HD static inline float softmax_exp(float x, float max) { return expf(x - max); }
HD static inline float softmax_prob(float x, softmax_state st) { return softmax_exp(x, st.max) / st.sum; }
/* log sum_i e^(x_i) = M + log S */
HD static inline float softmax_logsumexp(softmax_state st) { return st.max + logf(st.sum); }
/* Softmax backward. With p = softmax(s) and dp = dL/dp:
 *   dL/ds_j = p_j (dp_j - dot),  dot = sum_i p_i dp_i   (a row reduction)                      */
HD static inline float softmax_dot_term(float p, float dp) { return p * dp; }
HD static inline float softmax_grad(float p, float dp, float dot) { return p * (dp - dot); }

/* ---- attention -------------------------------------------------------------------------------
 * scores = q k^T / sqrt(hd): the scale keeps the scores' variance near 1 whatever the head size
 * (Vaswani et al. 2017). Causal: query i sees keys j <= i (local positions of one sequence).   */
HD static inline float attention_scale(int hd) { return 1.0f / sqrtf((float)hd); }
HD static inline int attention_visible(int query, int key) { return key <= query; }
/* The keys query i sees among T form a prefix: j = 0 .. i. */
HD static inline int attention_visible_keys(int query, int T) {
    return query < 0 ? 0 : query + 1 < T ? query + 1 : T;
}

/* ---- a block of attention, and the merge of two blocks (ring attention) ----------------------
 * Context parallelism splits the sequence: a rank holds a block of Tq queries at global
 * positions q_offset + i and sees, one after another, blocks of Tk keys at k_offset + j. The
 * causal rule is the one above, on global positions. A block can be fully visible (keys all
 * earlier), cut by the diagonal, or fully masked (keys all later).                             */
HD static inline int attention_block_visible(int q_offset, int i, int k_offset, int j) {
    return attention_visible(q_offset + i, k_offset + j);
}
/* The keys of a block that query i sees form a prefix too: the j with k_offset + j <= q_offset +
 * i, none when the block starts after the query (a fully masked block). */
HD static inline int attention_block_visible_keys(int q_offset, int i, int k_offset, int Tk) {
    int n = q_offset + i - k_offset + 1;
    return n < 0 ? 0 : n < Tk ? n : Tk;
}
/* What a block of keys gives a query row: its normalised output and the log of its softmax
 * denominator, lse = log sum_{visible j} e^(s_j) = M + log S (the online state above). A row
 * that sees no key of the block has the empty state; lse is then -inf (e^lse = 0: the block
 * contributes nothing), written explicitly rather than as -inf + log 0.                       */
HD static inline float attention_lse(softmax_state st) {
    return st.sum > 0.0f ? st.max + logf(st.sum) : -INFINITY;
}
/* Merge of two blocks' results for one query row (the online softmax merge, done on (out, lse)
 * instead of (M, S)): with A = e^lse_a and B = e^lse_b the two denominators,
 *   lse' = log(A + B) = hi + log(1 + e^(lo - hi)),   hi = max(lse_a, lse_b), lo = the other,
 * which never exponentiates a positive number. Both sides -inf (neither block sees a key):
 * lse' = -inf, and the e^(-inf - -inf) = NaN of the formula is never evaluated.              */
HD static inline float attention_merge_lse(float lse_a, float lse_b) {
    float hi = fmaxf(lse_a, lse_b), lo = fminf(lse_a, lse_b);
    if (hi == -INFINITY) return -INFINITY;
    return hi + log1pf(expf(lo - hi));
}
/* out' = out_a A / (A + B) + out_b B / (A + B): each side is weighted by e^(lse_side - lse').
 * An empty side (-inf) gets weight e^-inf = 0; when both are empty lse' is -inf too and the
 * weight is 0 (the merged row stays 0), not e^(-inf + inf) = NaN.                             */
HD static inline float attention_merge_weight(float lse_side, float lse_merged) {
    return lse_merged == -INFINITY ? 0.0f : expf(lse_side - lse_merged);
}
HD static inline float attention_merge_value(float out_a, float weight_a, float out_b,
                                             float weight_b) {
    return out_a * weight_a + out_b * weight_b;
}
/* Block backward (FlashAttention-2, Dao 2023). The block does not see the other blocks' keys,
 * so it cannot normalise its own scores; the final lse of the row (merged over all blocks)
 * does it: P_ij = e^(s_ij - lse_i) is exactly the full softmax's probability of key j.
 * A row with lse = -inf sees no key anywhere and has P = 0.                                    */
HD static inline float attention_block_prob(float score, float lse) {
    return lse == -INFINITY ? 0.0f : expf(score - lse);
}
/* The softmax backward needs D_i = sum_j P_ij dP_ij over ALL keys of the row, which one block
 * does not have. But out = P V and dP = dOut V^T, so
 *   D_i = sum_j P_ij (dOut_i . V_j) = dOut_i . (sum_j P_ij V_j) = dOut_i . out_i,
 * a dot product over the hd elements of the final output row. This is its term; the gradient
 * of a score is then softmax_grad(P_ij, dP_ij, D_i) = P_ij (dP_ij - D_i).
 * In bf16 dP was computed from dOut rounded to bf16, so D takes the same rounded dOut
 * (dout_bf16): else D would carry dOut's rounding error, which dP - D, a difference of nearly
 * equal numbers where a row's dP is flat, turns into a large relative error of dS.             */
HD static inline float attention_delta_term(float dout, float out, int dout_bf16) {
    return (dout_bf16 ? bf16_to_float(bf16_from_float(dout)) : dout) * out;
}

/* ---- cross-entropy of one row of logits --------------------------------------------------------
 *   loss = -log softmax(x)[t] = logsumexp(x) - x_t = (M - x_t) + log S
 * written with (M - x_t) first: both are large for logits of 1e4 and their difference is exact,
 * while M + log S would round away log S.                                                       */
HD static inline float cross_entropy_loss(float logit_target, softmax_state st) {
    return (st.max - logit_target) + logf(st.sum);
}
/* d loss / d x_j = softmax(x)_j - [j == t], times the caller's scale (1 / global valid count). */
HD static inline float cross_entropy_grad(float logit, int is_target, softmax_state st,
                                          float grad_scale) {
    return (softmax_prob(logit, st) - (is_target ? 1.0f : 0.0f)) * grad_scale;
}

/* ---- AdamW (Loshchilov & Hutter 2019), in torch.optim.AdamW's order ---------------------------
 * Bias correction of step t = 1, 2, ...: 1 - beta^t (computed once per tensor by the caller).   */
HD static inline float adamw_bias_correction(float beta, int t) {
    return 1.0f - powf(beta, (float)t);
}
/* One element:
 *   p *= 1 - lr wd                      decoupled weight decay, before the Adam step (as PyTorch)
 *   m  = beta1 m + (1 - beta1) g        first moment
 *   v  = beta2 v + (1 - beta2) g^2      second moment
 *   p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)                                            */
HD static inline void adamw_update(float *p, float *m, float *v, float g, float lr, float beta1,
                                   float beta2, float eps, float weight_decay,
                                   float bias_correction1, float bias_correction2) {
    *p *= 1.0f - lr * weight_decay;
    *m = beta1 * *m + (1.0f - beta1) * g;
    *v = beta2 * *v + (1.0f - beta2) * g * g;
    float denom = sqrtf(*v) / sqrtf(bias_correction2) + eps;
    *p -= (lr / bias_correction1) * (*m / denom);
}
