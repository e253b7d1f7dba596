/* llama_kernels.h: the layers of the Llama baseline, one forward and one backward each.
 *
 * All pointers are device pointers, all tensors row-major and contiguous unless a leading
 * dimension says otherwise. N = B*T is the number of token rows. Backward functions say
 * whether they overwrite (=) or accumulate (+=) into their outputs: accumulation is used where
 * the residual stream or a shared weight receives gradient from several places.
 *
 * The per-element and per-row formulas live in llama_math.h (shared with the CUDA kernels);
 * llama_kernels_cpu.c and llama_kernels_cuda.cu are the two loops around them.
 * Parallel chapters call the same functions on their local shards (fewer heads, fewer FFN
 * columns, a slice of the vocabulary, a slice of the sequence).
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "cdefs.h"
#include "dtype.h"

C_BEGIN

/* ---- token embedding ------------------------------------------------------------------
 * The table holds rows [row0, row0 + nrows) of the full [V, D] table (the whole table on one
 * device; a vocabulary shard in chapter 02). Tokens outside that range give zero rows.
 *   forward:  out[N, D] = table[tokens[n] - row0]          (=)
 *   backward: dtable[nrows, D] += dout[n] for every n whose token is in range, each row's
 *             positions n added in increasing order on both backends (bit-identical runs;
 *             scratch for the duration of the call: CUDA MEM_BUFFERS, CPU host calloc)       */
void embedding_forward(float *out, const int *tokens, const float *table,
                       int N, int D, int row0, int nrows);
void embedding_backward(float *dtable, const float *dout, const int *tokens,
                        int N, int D, int row0, int nrows);

/* ---- RMSNorm: out = x / sqrt(mean(x^2) + eps) * w ------------------------------------
 *   forward:  x[N, C], w[C] -> out[N, C] (=), rstd[N] (=, saved for backward)
 *   backward: dx[N, C] += ..., dw[C] += ...                                               */
void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w,
                     int N, int C, float eps);
void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                      const float *w, const float *rstd, int N, int C);
/* The residual add fused with the norm that follows it, one pass over each row (the row is read
 * once from memory instead of twice; the numbers are those of add_inplace then rmsnorm_forward):
 *   h[N, C] += res (in place), out[N, C] = rmsnorm(h) w (=), rstd[N] (=)                   */
void residual_rmsnorm_forward(float *h, float *out, float *rstd, const float *res, const float *w,
                              int N, int C, float eps);

/* ---- linear, y = x W^T, W stored [out, in] ------------------------------------------------
 *   forward:  x[N, in], W[out, in] -> y[N, out] (=)
 *   backward: dx[N, in] = dy W (skipped when dx is NULL), dW[out, in] += dy^T x (skipped when
 *             NULL: a zero-bubble pipeline computes it later)
 *   backward_accumulate: the same with dx[N, in] += dy W. A tensor that feeds several linears
 *             (attn_in feeds wq, wk and wv) sums their input gradients in the GEMMs themselves
 *             (beta = 1), with no extra pass over dx. */
void linear_forward(float *y, const float *x, const float *W, int N, int in, int out);
void linear_backward(float *dx, float *dW, const float *dy, const float *x, const float *W,
                     int N, int in, int out);
void linear_backward_accumulate(float *dx, float *dW, const float *dy, const float *x, const float *W,
                                int N, int in, int out);
/* The same in a compute precision (--dtype): DTYPE_F32 is the three functions above; DTYPE_BF16
 * rounds the GEMMs' operands to bf16 (x and W forward; dy, W and x backward) and runs bf16 GEMMs
 * that accumulate in fp32 (gemm.h's matmul_typed): y, dx and dW stay fp32, so the master weights
 * and their gradients never lose bits, and a row-parallel output's partial sums are added in fp32
 * before anything rounds them. The rounded copies live for the call (MEM_BUFFERS), in the type
 * the backend's bf16 product reads (gemm.h's gemm_bf16_operand_type: bf16, or fp32 holding the
 * bf16 values on a CPU whose product is an fp32 sgemm anyway). dx_beta: 0 sets dx, 1 adds to it. */
void linear_forward_in(dtype compute, float *y, const float *x, const float *W, int N, int in, int out);
void linear_backward_in(dtype compute, float *dx, float dx_beta, float *dW, const float *dy, const float *x,
                        const float *W, int N, int in, int out);
/* x[n] rounded to bf16 and widened back: a new fp32 buffer (MEM_BUFFERS; the caller frees it)
 * holding the values a bf16 tensor would hold. For code that takes bf16 as its high precision
 * but works on fp32 buffers (chapter 07's float8 casts under --dtype bf16). The linear_ form is a
 * linear's operand, counted with the GEMMs' operand copies below; bf16_values is not counted
 * (FSDP's float8 all-gather of a weight shard). */
float *bf16_values(const float *x, size_t n);
float *linear_bf16_values(const float *x, size_t n);
/* x[n] as a GEMM's operand in the compute precision: fp32, x itself (*t = DTYPE_F32); bf16, a copy
 * of its values rounded to bf16 (MEM_BUFFERS), in the type the backend's bf16 product reads (*t:
 * gemm_bf16_operand_type). operand_release(x, operand) frees a copy, not x. Not counted below (the
 * linears' count): attention's products round their operands this way. */
const void *operand_in(dtype compute, const float *x, size_t n, dtype *t);
/* ... of a scratch x that nothing reads afterwards (attention's dS): where the product reads fp32
 * holding bf16 values, x itself rounded in place (no copy); else operand_in's. */
const void *operand_in_place(dtype compute, float *x, size_t n, dtype *t);
void operand_release(const float *x, const void *operand);
/* The elements the functions above have rounded to bf16 on this rank, since the start (every
 * operand copy counts its elements); uncount takes back n of them (the --check baseline's, which
 * are not this rank's run). */
size_t linear_bf16_rounded(void);
void linear_bf16_uncount(size_t n);

/* ---- RoPE on interleaved pairs (2j, 2j+1) of each head, theta^(-2j/hd) ------------------
 * rope_table: cos_sin[T, hd/2, 2] = cos and sin of pair j's angle at positions[t] (device ints:
 * the global positions of the T local rows of every sequence). A model computes it once, when
 * it is created: the angles depend only on the positions, not on the step.
 * x[B, T, H, hd] rotated in place with that table:
 *   forward:  (a, b) -> (a cos - b sin, a sin + b cos)
 *   backward: the inverse rotation applied to the gradient, in place                       */
void rope_table(float *cos_sin, const int *positions, int T, int hd, float theta);
void rope_forward(float *x, const float *cos_sin, int B, int T, int H, int hd);
void rope_backward(float *dx, const float *cos_sin, int B, int T, int H, int hd);

/* ---- causal attention with grouped-query heads -------------------------------------------
 * q[B, T, H, hd], k and v [B, T, Hkv, hd], Hkv divides H; query head h reads kv head
 * h / (H / Hkv). scores = q k^T / sqrt(hd), causal mask, softmax in fp32.
 *   forward:  out[B, T, H, hd] (=), probs[B, H, T, T] (=, saved for backward)
 *   backward: dq (=), dk (=), dv (=); dprobs[B, H, T, T] is scratch                         */
void attention_forward(float *out, float *probs, const float *q, const float *k, const float *v,
                       int B, int T, int H, int Hkv, int hd);
void attention_backward(float *dq, float *dk, float *dv, float *dprobs,
                        const float *dout, const float *q, const float *k, const float *v,
                        const float *probs, int B, int T, int H, int Hkv, int hd);
/* The same in a compute precision (--dtype): DTYPE_BF16 rounds each product's operands to bf16
 * (forward: q, k, then P and v; backward: P, dout and v, then dS, q and k) and accumulates in
 * fp32, as a bf16 attention kernel (cuDNN's, FlashAttention's) reads bf16 q, k, v and P; the
 * softmax and its backward, probs and every output stay fp32. DTYPE_F32 is the two above. */
void attention_forward_in(dtype compute, float *out, float *probs, const float *q, const float *k, const float *v,
                          int B, int T, int H, int Hkv, int hd);
void attention_backward_in(dtype compute, float *dq, float *dk, float *dv, float *dprobs, const float *dout,
                           const float *q, const float *k, const float *v, const float *probs, int B, int T, int H,
                           int Hkv, int hd);
/* The causal query blocks both attentions compute (attention.c): nb = causal_query_blocks(T)
 * blocks of at least 64 rows (at most 8; below T = 128 one block, the whole T), block r holding the queries
 * [causal_block_row(r, nb, T), causal_block_row(r + 1, nb, T)), which see the keys [0, r1). */
int causal_query_blocks(int T);
int causal_block_row(int r, int nb, int T);
int causal_largest_block(int T);   /* the most rows of any block: the last one's, ceil(T / nb) */
/* The two backend kernels between attention's GEMMs (attention.c, shared by both backends,
 * does the GEMMs). probs holds `rows` rows of T scores; row r is query i = r % T.
 *   forward:  probs := softmax over keys j <= i of each row, 0 for j > i   (in place)
 *   backward: dprobs := P * (dP - rowsum(P * dP)), 0 for j > i             (in place on dP)  */
void causal_softmax_forward(float *probs, int rows, int T);
void causal_softmax_backward(float *dprobs, const float *probs, int rows, int T);

/* ---- a block of causal attention, for ring attention (context parallelism) ------------------
 * Queries q[B, Tq, H, hd] are the rows at global positions q_offset + i of their sequences,
 * keys and values k, v [B, Tk, Hkv, hd] the rows at k_offset + j; grouped-query heads as above.
 * Key j is visible to query i iff k_offset + j <= q_offset + i (with Tq == Tk and equal offsets
 * this is attention_forward's causal mask). scores = q k^T / sqrt(hd), softmax in fp32.
 * Both functions allocate their [B, H, Tq, Tk] score scratch (forward one, backward two) under
 * MEM_BUFFERS for the duration of the call (attention_block.c does the GEMMs, for both backends).
 *   forward:  out[B, Tq, H, hd] (=) = softmax over the block's visible keys, times v;
 *             lse[B, H, Tq] (=) = log sum over the block's visible keys of e^score.
 *             A row with no visible key in the block gets lse = -inf and out = 0 (no NaN).
 *   backward: given dout[B, Tq, H, hd] and the FINAL out[B, Tq, H, hd] and lse[B, H, Tq] of the
 *             query rows (merged over every key block with attention_merge), the gradients of
 *             this block's share, as FlashAttention's backward: P = e^(S - lse) on visible
 *             entries, D = rowsum(dout * out), dS = P * (dP - D):
 *             dq[B, Tq, H, hd] += dS k / sqrt(hd),  dk[B, Tk, Hkv, hd] += dS^T q / sqrt(hd),
 *             dv[B, Tk, Hkv, hd] += P^T dout  (all three accumulate: dq sums over the key blocks
 *             of the ring, dk and dv over the query blocks that see them; the H/Hkv query heads
 *             of a group add into their kv head). Zero them before the first call.            */
void attention_block_forward(float *out, float *lse, const float *q, const float *k,
                             const float *v, int B, int Tq, int Tk, int H, int Hkv, int hd,
                             int q_offset, int k_offset);
void attention_block_backward(float *dq, float *dk, float *dv, const float *dout,
                              const float *out, const float *lse, const float *q, const float *k,
                              const float *v, int B, int Tq, int Tk, int H, int Hkv, int hd,
                              int q_offset, int k_offset);
/* The same in a compute precision, as attention_forward_in: in bf16 each product's operands rounded
 * (forward: q and k, then P and v; backward: q, k, dout and v, then P and dS), fp32 accumulation,
 * the softmax kernels, lse, out and the gradients fp32. The rounded copies (operand_in's, elements
 * of its type) held at most: forward Tk Hkv hd + max(Tq H hd, c H Tq Tk), backward
 * 2 Tq H hd + Tk Hkv hd + max(Tk Hkv hd, 2 c H Tq Tk), per sequence of the call (B = 1); c = 1
 * where the copies are bf16, 0 where the product reads fp32 (P and dS are then rounded in place:
 * operand_in_place). */
void attention_block_forward_in(dtype compute, float *out, float *lse, const float *q, const float *k, const float *v,
                                int B, int Tq, int Tk, int H, int Hkv, int hd, int q_offset, int k_offset);
void attention_block_backward_in(dtype compute, float *dq, float *dk, float *dv, const float *dout, const float *out,
                                 const float *lse, const float *q, const float *k, const float *v, int B, int Tq,
                                 int Tk, int H, int Hkv, int hd, int q_offset, int k_offset);
/* ---- whole sequences in causal query blocks, saving lse (chapter 06's all-to-all) ----------
 * attention_forward's result without its [B, H, T, T] probabilities: each query block of
 * causal_query_blocks against the keys it sees, [0, r1), with attention_block_forward (queries
 * at offset r0, keys at 0), so the masked part beyond the blocks' diagonal is never computed and
 * only lse is kept for backward. q, out, dq [B, T, H, hd]; k, v, dk, dv [B, T, Hkv, hd]; lse:
 * B H T floats, for each sequence its query blocks in order, each [H, r1 - r0] as
 * attention_block_forward writes it. Scratch: one block's scores, [H, r1 - r0, r1] (forward),
 * twice that (backward), under MEM_BUFFERS.
 * In a compute precision as attention_block_forward_in (--dtype).
 *   forward:  out (=), lse (=); returns the score elements computed per (sequence, head):
 *             the sum over the blocks of (r1 - r0) r1
 *   backward: dq, dk, dv (+=: zero them first) from dout and the forward's out and lse       */
double attention_lse_forward(dtype compute, float *out, float *lse, const float *q, const float *k, const float *v,
                             int B, int T, int H, int Hkv, int hd);
void attention_lse_backward(dtype compute, float *dq, float *dk, float *dv, const float *dout, const float *out,
                            const float *lse, const float *q, const float *k, const float *v,
                            int B, int T, int H, int Hkv, int hd);
/* The backend kernels between the block's GEMMs. scores holds B*H*Tq rows of Tk scores; row
 * r = (b H + h) Tq + i is query i of (b, h), the same order as lse[B, H, Tq].
 *   forward:  scores := softmax over the visible keys of each row, 0 elsewhere (in place);
 *             lse[B*H*Tq] (=) = log sum over visible keys of e^score, -inf for an empty row
 *   backward: scores := P = e^(score - lse), 0 where masked (in place);
 *             dscores := dS = P * (dP - D), D = rowsum(dout * out) over the row's hd elements of
 *             dout and out [B, Tq, H, hd] (in place on dP); dout_bf16: dout's elements rounded
 *             to bf16 in D, as the bf16 GEMM of dP read them (attention_block_backward_in)     */
void attention_block_softmax_forward(float *scores, float *lse, int B, int H, int Tq, int Tk,
                                     int q_offset, int k_offset);
void attention_block_softmax_backward(float *scores, float *dscores, const float *lse,
                                      const float *dout, const float *out, int B, int H, int Tq,
                                      int Tk, int hd, int q_offset, int k_offset, bool dout_bf16);

/* ---- merge two partial attention results by log-sum-exp -------------------------------------
 * (out, lse) and (out_b, lse_b) are two blocks' results for the same query rows, out [B, T, H, hd]
 * and lse [B, H, T] as attention_block_forward writes them. In place into (out, lse):
 *   lse := log(e^lse + e^lse_b)   (stable; -inf on either side or both is handled)
 *   out := out e^(lse_old - lse) + out_b e^(lse_b - lse)     (a row empty on both sides stays 0)
 * Starting from out = 0, lse = -inf and merging every key block gives full attention.        */
void attention_merge(float *out, float *lse, const float *out_b, const float *lse_b,
                     int B, int T, int H, int hd);

/* ---- SwiGLU: out = silu(a) * b, a = x W1^T, b = x W3^T ------------------------------------
 *   forward:  out[n] (=);  backward: da[n] (=), db[n] (=)                                  */
void swiglu_forward(float *out, const float *a, const float *b, size_t n);
void swiglu_backward(float *da, float *db, const float *dout, const float *a, const float *b,
                     size_t n);

/* ---- cross-entropy with ignore index -100 -------------------------------------------------
 * logits[N, V], targets[N].
 *   forward:  returns sum over rows with target != -100 of -log softmax(logits)[target]
 *             (a host value; the caller divides by the global count of valid targets)
 *   backward: dlogits[N, V] (=) = (softmax - onehot(target)) * grad_scale, zero rows for
 *             ignored targets. dlogits may alias logits.                                    */
#define IGNORE_INDEX (-100)
float cross_entropy_forward(const float *logits, const int *targets, int N, int V);
void cross_entropy_backward(float *dlogits, const float *logits, const int *targets,
                            int N, int V, float grad_scale);

/* ---- AdamW, as torch.optim.AdamW ----------------------------------------------------------
 *   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)        t = 1, 2, ...              */
void adamw_step(float *p, const float *g, float *m, float *v, size_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int t);

C_END
