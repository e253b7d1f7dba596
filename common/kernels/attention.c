/* attention.c: causal grouped-query attention, shared by both backends.
 *
 * Attention is two batched matrix products with a row softmax between them. The products go
 * through gemm.h (OpenBLAS or cuBLAS, same argument tuples); the softmax is a backend kernel
 * (causal_softmax_forward/backward in llama_kernels_cpu.c and llama_kernels_cuda.cu). Writing
 * the GEMM sequence once means the CPU tests check exactly the calls the GPU makes.
 *
 * Layout: q and out are [B, T, H, hd], k and v [B, T, Hkv, hd], probs [B, H, T, T]. For one
 * batch entry b and kv head g, the H/Hkv query heads that share g are `group` matrices [T, hd]
 * at a stride of hd inside rows of H*hd floats: one strided-batched GEMM covers them, with the
 * key operand at stride 0 (read by every entry of the batch).
 *
 * Causal blocks: query i sees keys j <= i only, so half of each [T, T] score matrix is masked.
 * Computing it and then zeroing it wastes half of the attention's GEMM work. The queries are cut
 * into nb blocks of rows [r0, r1) (causal_query_blocks); a block's products stop at key r1 (its
 * last row's last visible key), and in backward a key block's sums start at query r0 (the first
 * query that sees it). What is skipped is exactly the masked part: its probabilities and their
 * gradients are 0, the softmax kernels neither read nor keep what the GEMMs would have put there
 * (they write 0), and the terms left out of each sum are all zero: the sums are the whole-matrix
 * products' sums without their zero terms (equal up to the order in which the BLAS adds, which
 * can change with a product's shape: last-bit differences). With nb blocks the products do
 * (nb + 1) / (2 nb) of the work: 5/8 at T = 256 (nb = 4), against 1/2 for a perfect triangle.
 * Below T = 128 there is one block, the whole matrix, as before.
 */
#include <math.h>
#include "gemm.h"
#include "llama_kernels.h"
#include "llama_math.h"

/* Blocks of at least 64 queries (smaller GEMMs run at a fraction of the rate), at most 8. */
int causal_query_blocks(int T) {
    int nb = T / 64;
    return nb < 1 ? 1 : nb > 8 ? 8 : nb;
}
/* Rows [r0, r1) of query block r of nb over T: r0 = causal_block_row(r), r1 = causal_block_row(r + 1). */
int causal_block_row(int r, int nb, int T) { return (int)((long long)r * T / nb); }
/* The rows of the last block, ceil(T / nb): the floor in causal_block_row gives no block more. */
int causal_largest_block(int T) {
    int nb = causal_query_blocks(T);
    return T - causal_block_row(nb - 1, nb, T);
}

/* out[B, T, H, hd] = softmax(causal(q k^T / sqrt(hd))) v; probs[B, H, T, T] saved (fp32). In
 * bf16 (--dtype bf16) each product takes its operands rounded to bf16 (operand_in: q and k, then P
 * and v), as a bf16 attention kernel reads them, and accumulates in fp32; the softmax stays fp32. */
void attention_forward_in(dtype compute, float *out, float *probs, const float *q, const float *k, const float *v,
                          int B, int T, int H, int Hkv, int hd) {
    int group = H / Hkv, nb = causal_query_blocks(T);
    int ldq = H * hd, ldkv = Hkv * hd;     /* row strides of q/out and of k/v */
    long long TT = (long long)T * T;
    float scale = attention_scale(hd);
    size_t nq = (size_t)B * T * ldq, nk = (size_t)B * T * ldkv, np = (size_t)B * H * TT;
    dtype t;
    const void *qo = operand_in(compute, q, nq, &t), *ko = operand_in(compute, k, nk, &t);
    /* scores[b, h] = scale * q_h k_g^T : [T, T], each query block against keys [0, r1) */
    for (int b = 0; b < B; b++)
        for (int g = 0; g < Hkv; g++)
            for (int r = 0; r < nb; r++) {
                int r0 = causal_block_row(r, nb, T), r1 = causal_block_row(r + 1, nb, T);
                const void *q_g = dtype_const_at(qo, t, ((size_t)b * T + r0) * ldq + (size_t)g * group * hd);
                const void *k_g = dtype_const_at(ko, t, (size_t)b * T * ldkv + (size_t)g * hd);
                float *scores_g = probs + ((size_t)b * H + (size_t)g * group) * TT + (size_t)r0 * T;
                matmul_strided_batched_typed(scores_g, q_g, k_g, t, r1 - r0, r1, hd, false, true, ldq, ldkv, T,
                                             hd, 0, TT, group, scale, 0.0f);
            }
    operand_release(q, qo);
    operand_release(k, ko);
    causal_softmax_forward(probs, B * H * T, T);
    const void *po = operand_in(compute, probs, np, &t), *vo = operand_in(compute, v, nk, &t);
    /* out_h = P_h v_g : [T, hd], written into the head's columns of out; block r sums keys [0, r1) */
    for (int b = 0; b < B; b++)
        for (int g = 0; g < Hkv; g++)
            for (int r = 0; r < nb; r++) {
                int r0 = causal_block_row(r, nb, T), r1 = causal_block_row(r + 1, nb, T);
                const void *p_g = dtype_const_at(po, t, ((size_t)b * H + (size_t)g * group) * TT + (size_t)r0 * T);
                const void *v_g = dtype_const_at(vo, t, (size_t)b * T * ldkv + (size_t)g * hd);
                float *out_g = out + ((size_t)b * T + r0) * ldq + (size_t)g * group * hd;
                matmul_strided_batched_typed(out_g, p_g, v_g, t, r1 - r0, hd, r1, false, false, T, ldkv, ldq,
                                             TT, 0, hd, group, 1.0f, 0.0f);
            }
    operand_release(probs, po);
    operand_release(v, vo);
}
void attention_forward(float *out, float *probs, const float *q, const float *k, const float *v,
                       int B, int T, int H, int Hkv, int hd) {
    attention_forward_in(DTYPE_F32, out, probs, q, k, v, B, T, H, Hkv, hd);
}

/* dq (=), dk (=), dv (=) from dout[B, T, H, hd]; dprobs[B, H, T, T] is scratch.
 *   dV_g = sum_h P_h^T dOut_h          dP_h = dOut_h V_g^T       dS_h = softmax backward
 *   dQ_h = scale dS_h K_g              dK_g = scale sum_h dS_h^T Q_h
 * dV_g and dK_g sum over the heads of the group. A single batched call would have all its
 * entries write the same dV_g at once, a race on the GPU; instead the heads go one after the
 * other, the first with beta = 0 (overwrite), the rest with beta = 1 (accumulate).
 * Blocks: dP and dQ as the forward's products (query block r, keys [0, r1)); dV and dK by key
 * block c = [c0, c1), summing over the queries [c0, T) that see it.
 * In bf16 every product's operands are rounded (P and dOut, dOut and V, then dS with K and Q);
 * the softmax backward reads the fp32 P and dP. */
void attention_backward_in(dtype compute, float *dq, float *dk, float *dv, float *dprobs, const float *dout,
                           const float *q, const float *k, const float *v, const float *probs, int B, int T, int H,
                           int Hkv, int hd) {
    int group = H / Hkv, nb = causal_query_blocks(T);
    int ldq = H * hd, ldkv = Hkv * hd;
    long long TT = (long long)T * T;
    float scale = attention_scale(hd);
    size_t nq = (size_t)B * T * ldq, nk = (size_t)B * T * ldkv, np = (size_t)B * H * TT;
    dtype t;
    const void *douto = operand_in(compute, dout, nq, &t), *vo = operand_in(compute, v, nk, &t);
    const void *po = operand_in(compute, probs, np, &t);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < Hkv; g++)
            for (int r = 0; r < nb; r++) {
                int r0 = causal_block_row(r, nb, T), r1 = causal_block_row(r + 1, nb, T);
                size_t dout_g = (size_t)b * T * ldq + (size_t)g * group * hd;
                size_t p_g = ((size_t)b * H + (size_t)g * group) * TT;
                const void *v_g = dtype_const_at(vo, t, (size_t)b * T * ldkv + (size_t)g * hd);
                float *dp_g = dprobs + p_g;
                float *dv_g = dv + ((size_t)b * T + r0) * ldkv + (size_t)g * hd;
                /* dV_g rows [r0, r1) = sum_h P_h[r0:T, r0:r1]^T dOut_h[r0:T] : [r1 - r0, hd] */
                for (int i = 0; i < group; i++)
                    matmul_strided_batched_typed(dv_g, dtype_const_at(po, t, p_g + i * TT + (size_t)r0 * T + r0),
                                                 dtype_const_at(douto, t, dout_g + (size_t)r0 * ldq + i * hd), t,
                                                 r1 - r0, hd, T - r0, true, false, T, ldq, ldkv, 0, 0, 0, 1, 1.0f,
                                                 i == 0 ? 0.0f : 1.0f);
                /* dP_h rows [r0, r1) = dOut_h[r0:r1] V_g[0:r1]^T, one per head, so one batched call */
                matmul_strided_batched_typed(dp_g + (size_t)r0 * T, dtype_const_at(douto, t, dout_g + (size_t)r0 * ldq),
                                             v_g, t, r1 - r0, r1, hd, false, true, ldq, ldkv, T, hd, 0, TT, group,
                                             1.0f, 0.0f);
            }
    operand_release(dout, douto);
    operand_release(v, vo);
    operand_release(probs, po);
    causal_softmax_backward(dprobs, probs, B * H * T, T);
    const void *dso = operand_in_place(compute, dprobs, np, &t);   /* (dprobs: this call's scratch) */
    const void *qo = operand_in(compute, q, nq, &t), *ko = operand_in(compute, k, nk, &t);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < Hkv; g++)
            for (int r = 0; r < nb; r++) {
                int r0 = causal_block_row(r, nb, T), r1 = causal_block_row(r + 1, nb, T);
                size_t q_g = (size_t)b * T * ldq + (size_t)g * group * hd;
                size_t ds_g = ((size_t)b * H + (size_t)g * group) * TT;
                const void *k_g = dtype_const_at(ko, t, (size_t)b * T * ldkv + (size_t)g * hd);
                float *dq_g = dq + ((size_t)b * T + r0) * ldq + (size_t)g * group * hd;
                float *dk_g = dk + ((size_t)b * T + r0) * ldkv + (size_t)g * hd;
                /* dQ_h rows [r0, r1) = scale dS_h[r0:r1, 0:r1] K_g[0:r1], one per head */
                matmul_strided_batched_typed(dq_g, dtype_const_at(dso, t, ds_g + (size_t)r0 * T), k_g, t, r1 - r0, hd,
                                             r1, false, false, T, ldkv, ldq, TT, 0, hd, group, scale, 0.0f);
                /* dK_g rows [r0, r1) = scale sum_h dS_h[r0:T, r0:r1]^T Q_h[r0:T] */
                for (int i = 0; i < group; i++)
                    matmul_strided_batched_typed(dk_g, dtype_const_at(dso, t, ds_g + i * TT + (size_t)r0 * T + r0),
                                                 dtype_const_at(qo, t, q_g + (size_t)r0 * ldq + i * hd), t, r1 - r0,
                                                 hd, T - r0, true, false, T, ldq, ldkv, 0, 0, 0, 1, scale,
                                                 i == 0 ? 0.0f : 1.0f);
            }
    operand_release(dprobs, dso);
    operand_release(q, qo);
    operand_release(k, ko);
}
void attention_backward(float *dq, float *dk, float *dv, float *dprobs,
                        const float *dout, const float *q, const float *k, const float *v,
                        const float *probs, int B, int T, int H, int Hkv, int hd) {
    attention_backward_in(DTYPE_F32, dq, dk, dv, dprobs, dout, q, k, v, probs, B, T, H, Hkv, hd);
}
