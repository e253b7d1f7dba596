/* llama_kernels_cpu.c: the CPU backend of llama_kernels.h.
 *
 * Every function is a plain loop around the formulas of llama_math.h, and every matrix product
 * goes through gemm.h (OpenBLAS underneath). llama_kernels_cuda.cu is the same code with the
 * loops turned into CUDA threads and the same GEMM calls: read the two side by side.
 */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include "llama_kernels.h"
#include "llama_math.h"
#include "gemm.h"
#include "vector_math_cpu.h"

/* `#pragma omp simd` (-fopenmp-simd) lets the softmax's sums be vectorised; clang may decline a
 * loop and would warn (an error under -Werror) where gcc vectorises it: the loop stays correct. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* ---- token embedding ---------------------------------------------------------------------- */

/* out[N, D] = table[tokens[n] - row0], zero rows for tokens another shard owns. */
void embedding_forward(float *out, const int *tokens, const float *table,
                       int N, int D, int row0, int nrows) {
    for (int n = 0; n < N; n++) {
        int row = embedding_local_row(tokens[n], row0, nrows);
        float *out_n = out + (size_t)n * D;
        for (int d = 0; d < D; d++) out_n[d] = row >= 0 ? table[(size_t)row * D + d] : 0.0f;
    }
}

/* dtable[nrows, D] += dout[N, D] row n for every token n of this shard. The CUDA twin's
 * algorithm, so that both add a repeated token's rows in the same order (increasing n) and give
 * the same bits: a stable counting sort of the positions by their key (embedding_sort_key, one
 * bucket per row plus one for "not this shard"), then one ordered sum per run of equal keys
 * (embedding_backward_run). Scratch: keys[N], positions[N], starts[nrows + 1], host memory
 * from calloc, outside the allocator's count (so the memory the chapters print is the same as
 * with the plain loop this replaced; the CUDA twin counts its scratch under MEM_BUFFERS). */
void embedding_backward(float *dtable, const float *dout, const int *tokens,
                        int N, int D, int row0, int nrows) {
    if (N <= 0 || D <= 0 || nrows <= 0) return;
    int *keys = calloc((size_t)2 * N + nrows + 1, sizeof(int));
    if (!keys) {
        fprintf(stderr, "embedding_backward: out of memory (N %d, nrows %d)\n", N, nrows);
        exit(1);
    }
    int *positions = keys + N, *starts = positions + N;   /* starts: zeroed by calloc */
    for (int n = 0; n < N; n++) {                          /* bucket sizes, shifted by one */
        int key = embedding_sort_key(tokens[n], row0, nrows);
        if (key < nrows) starts[key + 1]++;
    }
    for (int r = 1; r <= nrows; r++) starts[r] += starts[r - 1];   /* each bucket's first slot */
    int tail = starts[nrows];             /* the "not this shard" bucket follows the rows */
    for (int n = 0; n < N; n++) {         /* in increasing n: stable */
        int key = embedding_sort_key(tokens[n], row0, nrows);
        int k = key < nrows ? starts[key]++ : tail++;
        keys[k] = key;
        positions[k] = n;
    }
    for (int k = 0; k < N; k++)
        for (int d = 0; d < D; d++) embedding_backward_run(dtable, dout, keys, positions, k, d, N, D, nrows);
    free(keys);
}

/* ---- RMSNorm ------------------------------------------------------------------------------- */

/* x[N, C], w[C] -> out[N, C] = x r w, rstd[N] = r (saved for backward). */
void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w,
                     int N, int C, float eps) {
    for (int n = 0; n < N; n++) {
        const float *x_n = x + (size_t)n * C;
        float *out_n = out + (size_t)n * C;
        float sum_sq = 0.0f;
        for (int c = 0; c < C; c++) sum_sq += x_n[c] * x_n[c];
        float r = rmsnorm_rstd(sum_sq, C, eps);
        rstd[n] = r;
        for (int c = 0; c < C; c++) out_n[c] = rmsnorm_value(x_n[c], r, w[c]);
    }
}

/* h[N, C] += res, then out = rmsnorm(h) w and rstd, row by row while the row is in cache. */
void residual_rmsnorm_forward(float *h, float *out, float *rstd, const float *res, const float *w,
                              int N, int C, float eps) {
    for (int n = 0; n < N; n++) {
        float *h_n = h + (size_t)n * C, *out_n = out + (size_t)n * C;
        const float *res_n = res + (size_t)n * C;
        float sum_sq = 0.0f;
        for (int c = 0; c < C; c++) {
            h_n[c] += res_n[c];
            sum_sq += h_n[c] * h_n[c];
        }
        float r = rmsnorm_rstd(sum_sq, C, eps);
        rstd[n] = r;
        for (int c = 0; c < C; c++) out_n[c] = rmsnorm_value(h_n[c], r, w[c]);
    }
}

/* dx[N, C] += dL/dx, dw[C] += dL/dw. Both accumulate: dx is the residual stream's gradient,
 * which already holds the gradient that skipped this layer; dw sums over the rows (and over
 * microbatches). */
void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                      const float *w, const float *rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *x_n = x + (size_t)n * C;
        const float *dout_n = dout + (size_t)n * C;
        float *dx_n = dx + (size_t)n * C;
        float dot = 0.0f;   /* sum_c dout w x: every dx_c of the row depends on it */
        for (int c = 0; c < C; c++) dot += rmsnorm_dot_term(dout_n[c], w[c], x_n[c]);
        for (int c = 0; c < C; c++) {
            dx_n[c] += rmsnorm_dx(dout_n[c], x_n[c], w[c], rstd[n], dot, C);
            dw[c] += rmsnorm_dw_term(dout_n[c], x_n[c], rstd[n]);
        }
    }
}

/* ---- RoPE ------------------------------------------------------------------------------------ */

/* cos_sin[T, hd/2, 2]: cos and sin of the angle of pair j at positions[t]. */
void rope_table(float *cos_sin, const int *positions, int T, int hd, float theta) {
    int half = hd / 2;
    for (size_t i = 0; i < (size_t)T * half; i++) {     /* i = t hd/2 + j */
        float angle = rope_angle(positions[i / half], (int)(i % half), hd, theta);
        cos_sin[2 * i] = cosf(angle);
        cos_sin[2 * i + 1] = sinf(angle);
    }
}

/* Rotates every pair (2j, 2j+1) of every head of x[B, T, H, hd] in place, forward or back.
 * The loops visit the index i = ((b T + t) H + h) hd/2 + j that the CUDA kernel gives its threads,
 * in order, without dividing i back into its parts for every pair. */
static void rope_apply(float *x, const float *cos_sin, int B, int T, int H, int hd, int inverse) {
    int half = hd / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *c = cos_sin + (size_t)t * hd;                   /* position t's [hd/2, 2] */
            for (int h = 0; h < H; h++) {
                float *head = x + (((size_t)b * T + t) * H + h) * hd;   /* row (b T + t) H + h */
                for (int j = 0; j < half; j++) {                        /* i = row hd/2 + j */
                    if (inverse) rope_rotate_inverse(&head[2 * j], &head[2 * j + 1], c[2 * j], c[2 * j + 1]);
                    else         rope_rotate(&head[2 * j], &head[2 * j + 1], c[2 * j], c[2 * j + 1]);
                }
            }
        }
}

void rope_forward(float *x, const float *cos_sin, int B, int T, int H, int hd) {
    rope_apply(x, cos_sin, B, T, H, hd, 0);
}

/* The gradient of a rotation is the inverse rotation of the gradient. */
void rope_backward(float *dx, const float *cos_sin, int B, int T, int H, int hd) {
    rope_apply(dx, cos_sin, B, T, H, hd, 1);
}

/* ---- causal attention with grouped-query heads ----------------------------------------------
 * Layouts: q and out are [B, T, H, hd], k and v are [B, T, Hkv, hd]; one head of one sequence is
 * a [T, hd] matrix whose rows are H*hd (or Hkv*hd) floats apart, and the next head starts hd
 * floats later. probs is [B, H, T, T], one packed [T, T] matrix per (b, h).
 * The `group` = H / Hkv query heads h = g*group .. g*group + group-1 share kv head g. For each
 * (b, g) they form one strided batch: query stride hd, key/value stride 0 (the same head is
 * read by every entry of the batch).                                                          */

/* A row p[0, T) of scores whose visible keys are the prefix [0, n) (causal masks leave a prefix
 * visible) := its softmax over that prefix, 0 beyond; returns (M, S) for the row's lse. Two passes
 * where the GPU's online softmax takes one: the maximum M first, then e^(x - M) written in place
 * and summed into S, then the division (softmax_prob). The exponentials then no longer wait on a
 * running maximum, so the compiler calls the vector expf four or eight at a time
 * (vector_math_cpu.h); (M, S) is the online state's up to rounding. n = 0: the empty state, a row
 * of zeros. */
static softmax_state softmax_prefix(float *p, int n, int T) {
    softmax_state st = softmax_state_empty();
    if (n > 0) {
        float max = p[0];
#pragma omp simd reduction(max : max)
        for (int j = 1; j < n; j++) max = p[j] > max ? p[j] : max;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < n; j++) {
            p[j] = softmax_exp(p[j], max);
            sum += p[j];
        }
        st.max = max;
        st.sum = sum;
        for (int j = 0; j < n; j++) p[j] /= sum;
    }
    if (n < T) memset(p + n, 0, (size_t)(T - n) * sizeof(float));
    return st;
}

/* dot = sum_j p_j dp_j over the visible prefix [0, n), then dS_j = p_j (dp_j - dot) there and 0
 * beyond (T columns in the row). */
static void softmax_prefix_backward(float *dp, const float *p, int n, int T) {
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j < n; j++) dot += softmax_dot_term(p[j], dp[j]);
    for (int j = 0; j < n; j++) dp[j] = softmax_grad(p[j], dp[j], dot);
    if (n < T) memset(dp + n, 0, (size_t)(T - n) * sizeof(float));
}

/* probs[rows, T]: row r is query i = r % T of its (b, h). Softmax over keys j <= i, 0 beyond. */
void causal_softmax_forward(float *probs, int rows, int T) {
    for (int r = 0; r < rows; r++) softmax_prefix(probs + (size_t)r * T, attention_visible_keys(r % T, T), T);
}

/* dprobs[rows, T] := dS = P * (dP - rowsum(P * dP)), zero above the causal diagonal. */
void causal_softmax_backward(float *dprobs, const float *probs, int rows, int T) {
    for (int r = 0; r < rows; r++)
        softmax_prefix_backward(dprobs + (size_t)r * T, probs + (size_t)r * T,
                                attention_visible_keys(r % T, T), T);
}

/* ---- a block of attention (ring attention) ---------------------------------------------------
 * scores[B, H, Tq, Tk]: row r = (b H + h) Tq + i is query i (global position q_offset + i)
 * against keys j (global k_offset + j). lse[B, H, Tq] has the same row order.                  */

/* scores := softmax over the visible keys of each row, 0 elsewhere; lse[r] = M + log S, or -inf
 * for a row that sees no key of the block (then the whole row of probabilities is 0). */
void attention_block_softmax_forward(float *scores, float *lse, int B, int H, int Tq, int Tk,
                                     int q_offset, int k_offset) {
    size_t rows = (size_t)B * H * Tq;
    for (size_t r = 0; r < rows; r++) {
        int n = attention_block_visible_keys(q_offset, (int)(r % Tq), k_offset, Tk);
        lse[r] = attention_lse(softmax_prefix(scores + r * Tk, n, Tk));
    }
}

/* scores := P = e^(score - lse) (the final lse: the full softmax's probabilities), 0 where
 * masked; dscores := dS = P (dP - D) with D = dout_i . out_i over the hd elements of the row's
 * output (out and dout are [B, Tq, H, hd]: row (b, h, i) is at ((b Tq + i) H + h) hd). */
void attention_block_softmax_backward(float *scores, float *dscores, const float *lse,
                                      const float *dout, const float *out, int B, int H, int Tq,
                                      int Tk, int hd, int q_offset, int k_offset, bool dout_bf16) {
    size_t rows = (size_t)B * H * Tq;
    for (size_t r = 0; r < rows; r++) {
        float *p = scores + r * Tk;
        float *dp = dscores + r * Tk;
        int i = (int)(r % Tq), h = (int)((r / Tq) % H);
        size_t b = r / ((size_t)H * Tq);
        size_t o = ((b * Tq + i) * H + h) * hd;
        float D = 0.0f;
        for (int d = 0; d < hd; d++) D += attention_delta_term(dout[o + d], out[o + d], dout_bf16);
        int n = attention_block_visible_keys(q_offset, i, k_offset, Tk);
        float row_lse = lse[r];
        for (int j = 0; j < n; j++) {
            p[j] = attention_block_prob(p[j], row_lse);
            dp[j] = softmax_grad(p[j], dp[j], D);
        }
        if (n < Tk) {
            memset(p + n, 0, (size_t)(Tk - n) * sizeof(float));
            memset(dp + n, 0, (size_t)(Tk - n) * sizeof(float));
        }
    }
}

/* ---- merge of two partial attention results ---------------------------------------------------
 * out, out_b [B, T, H, hd]; lse, lse_b [B, H, T]. Row by row: the merged lse, the two weights,
 * the hd outputs, and last the lse itself (it is read for the weights first). */
void attention_merge(float *out, float *lse, const float *out_b, const float *lse_b,
                     int B, int T, int H, int hd) {
    size_t rows = (size_t)B * T * H;
    for (size_t row = 0; row < rows; row++) {     /* row = (b T + t) H + h of out */
        int h = (int)(row % H), t = (int)((row / H) % T);
        size_t b = row / ((size_t)T * H);
        size_t l = (b * H + h) * T + t;           /* the same row in lse [B, H, T] */
        float merged = attention_merge_lse(lse[l], lse_b[l]);
        float wa = attention_merge_weight(lse[l], merged);
        float wb = attention_merge_weight(lse_b[l], merged);
        float *o = out + row * hd;
        const float *ob = out_b + row * hd;
        for (int d = 0; d < hd; d++) o[d] = attention_merge_value(o[d], wa, ob[d], wb);
        lse[l] = merged;
    }
}

/* ---- SwiGLU --------------------------------------------------------------------------------- */

/* out[n] = silu(a) * b */
void swiglu_forward(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = swiglu_value(a[i], b[i]);
}

/* da[n] = dout b silu'(a), db[n] = dout silu(a) */
void swiglu_backward(float *da, float *db, const float *dout, const float *a, const float *b,
                     size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = dout[i], a_i = a[i], b_i = b[i];   /* read first: da/db may alias the inputs */
        swiglu_grads(g, a_i, b_i, &da[i], &db[i]);
    }
}

/* ---- cross-entropy -------------------------------------------------------------------------- */

/* Sum over rows whose target is not IGNORE_INDEX of -log softmax(logits[n])[target]. */
float cross_entropy_forward(const float *logits, const int *targets, int N, int V) {
    double total = 0.0;   /* double: the sum of many row losses is compared to 1e-5 */
    for (int n = 0; n < N; n++) {
        if (targets[n] == IGNORE_INDEX) continue;
        const float *row = logits + (size_t)n * V;
        softmax_state st = softmax_state_empty();
        for (int j = 0; j < V; j++) st = softmax_state_add(st, row[j]);
        total += cross_entropy_loss(row[targets[n]], st);
    }
    return (float)total;
}

/* dlogits[N, V] = (softmax - onehot(target)) * grad_scale; zero rows for ignored targets.
 * dlogits may alias logits: a row's softmax state is complete before the row is overwritten,
 * and each element is read before it is written. */
void cross_entropy_backward(float *dlogits, const float *logits, const int *targets,
                            int N, int V, float grad_scale) {
    for (int n = 0; n < N; n++) {
        const float *row = logits + (size_t)n * V;
        float *drow = dlogits + (size_t)n * V;
        if (targets[n] == IGNORE_INDEX) {
            for (int j = 0; j < V; j++) drow[j] = 0.0f;
            continue;
        }
        softmax_state st = softmax_state_empty();
        for (int j = 0; j < V; j++) st = softmax_state_add(st, row[j]);
        for (int j = 0; j < V; j++)
            drow[j] = cross_entropy_grad(row[j], j == targets[n], st, grad_scale);
    }
}

/* ---- AdamW ---------------------------------------------------------------------------------- */

/* One step t (1, 2, ...) on n elements: p, m, v updated in place from gradient g. */
void adamw_step(float *p, const float *g, float *m, float *v, size_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int t) {
    float bias_correction1 = adamw_bias_correction(beta1, t);
    float bias_correction2 = adamw_bias_correction(beta2, t);
    for (size_t i = 0; i < n; i++)
        adamw_update(&p[i], &m[i], &v[i], g[i], lr, beta1, beta2, eps, weight_decay,
                     bias_correction1, bias_correction2);
}
