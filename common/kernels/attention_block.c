/* attention_block.c: one block of causal attention (queries against one block of keys), shared
 * by both backends; what ring attention (context parallelism) runs once per step of the ring.
 *
 * The GEMM sequence is attention.c's with rectangular [Tq, Tk] score matrices; between the
 * GEMMs run the backend kernels attention_block_softmax_forward/backward (llama_kernels_cpu.c
 * and llama_kernels_cuda.cu), which apply the offset causal mask and produce or consume lse.
 *
 * Layout: q, out, dq [B, Tq, H, hd]; k, v, dk, dv [B, Tk, Hkv, hd]; scores [B, H, Tq, Tk];
 * lse [B, H, Tq]. For one batch entry b and kv head g, the `group` = H/Hkv query heads of g are
 * `group` matrices [Tq, hd] at a stride of hd inside rows of H*hd floats: one strided-batched
 * GEMM covers them, with the key/value operand at stride 0.
 *
 * Where a block's result differs from attention.c's:
 *   - forward: the softmax is over this block's visible keys only, so it also returns lse, the
 *     log of its denominator; attention_merge combines blocks by it;
 *   - backward: P is not saved but recomputed from the scores and the FINAL lse of the row
 *     (e^(s - lse) is the full softmax's probability), and softmax's row sum D = sum_j P dP is
 *     taken as dout . out, which needs only the row's final output (llama_math.h). So every
 *     block's backward is independent of the others', and all three gradients accumulate.
 */
#include <stddef.h>
#include "device.h"
#include "gemm.h"
#include "llama_kernels.h"
#include "llama_math.h"

/* out[B, Tq, H, hd] (=) and lse[B, H, Tq] (=) of queries q against the key block k, v. In bf16
 * the products take their operands rounded (operand_in: q and k, then P and v), as attention.c. */
void attention_block_forward_in(dtype compute, float *out, float *lse, const float *q, const float *k, const float *v,
                                int B, int Tq, int Tk, int H, int Hkv, int hd, int q_offset, int k_offset) {
    if (B == 0 || Tq == 0 || H == 0) return;
    int group = H / Hkv;
    int ldq = H * hd, ldkv = Hkv * hd;     /* row strides of q/out and of k/v */
    long long TqTk = (long long)Tq * Tk;
    float scale = attention_scale(hd);
    size_t nq = (size_t)B * Tq * ldq, nk = (size_t)B * Tk * ldkv;
    float *scores = device_alloc_floats((size_t)B * H * TqTk, MEM_BUFFERS);
    dtype t;
    const void *qo = operand_in(compute, q, nq, &t), *ko = operand_in(compute, k, nk, &t);
    /* scores[b, h] = scale * q_h k_g^T : [Tq, Tk] (no GEMM for an empty key block: the kernel
     * then only writes lse = -inf, and out is zeroed below) */
    for (int b = 0; b < B && Tk > 0; b++)
        for (int g = 0; g < Hkv; g++) {
            const void *q_g = dtype_const_at(qo, t, (size_t)b * Tq * ldq + (size_t)g * group * hd);
            const void *k_g = dtype_const_at(ko, t, (size_t)b * Tk * ldkv + (size_t)g * hd);
            float *scores_g = scores + ((size_t)b * H + (size_t)g * group) * TqTk;
            matmul_strided_batched_typed(scores_g, q_g, k_g, t, Tq, Tk, hd, false, true, ldq, ldkv, Tk,
                                         hd, 0, TqTk, group, scale, 0.0f);
        }
    operand_release(q, qo);
    operand_release(k, ko);
    attention_block_softmax_forward(scores, lse, B, H, Tq, Tk, q_offset, k_offset);
    /* out_h = P_h v_g : [Tq, hd], written into the head's columns of out */
    if (Tk == 0) device_zero(out, (size_t)B * Tq * H * hd * sizeof(float));
    /* (scores, now P, is this call's scratch: rounded in place where the product reads fp32) */
    const void *po = operand_in_place(compute, scores, (size_t)B * H * TqTk, &t), *vo = operand_in(compute, v, nk, &t);
    for (int b = 0; b < B && Tk > 0; b++)
        for (int g = 0; g < Hkv; g++) {
            const void *p_g = dtype_const_at(po, t, ((size_t)b * H + (size_t)g * group) * TqTk);
            const void *v_g = dtype_const_at(vo, t, (size_t)b * Tk * ldkv + (size_t)g * hd);
            float *out_g = out + (size_t)b * Tq * ldq + (size_t)g * group * hd;
            matmul_strided_batched_typed(out_g, p_g, v_g, t, Tq, hd, Tk, false, false, Tk, ldkv, ldq,
                                         TqTk, 0, hd, group, 1.0f, 0.0f);
        }
    operand_release(scores, po);
    operand_release(v, vo);
    device_free(scores);
}
void attention_block_forward(float *out, float *lse, const float *q, const float *k,
                             const float *v, int B, int Tq, int Tk, int H, int Hkv, int hd,
                             int q_offset, int k_offset) {
    attention_block_forward_in(DTYPE_F32, out, lse, q, k, v, B, Tq, Tk, H, Hkv, hd, q_offset, k_offset);
}

/* dq (+=), dk (+=), dv (+=) of this block, from dout and the final out and lse of the rows.
 *   S_h = scale Q_h K_g^T (recomputed)      dP_h = dOut_h V_g^T
 *   P_h, dS_h = the backend kernel (P = e^(S - lse), dS = P (dP - dout . out))
 *   dV_g += sum_h P_h^T dOut_h      dQ_h += scale dS_h K_g      dK_g += scale sum_h dS_h^T Q_h
 * dV_g and dK_g sum over the heads of the group one head after the other (a single batched call
 * would have its entries write the same dV_g at once, a race on the GPU); every call has
 * beta = 1, so all three outputs accumulate onto what the caller holds. In bf16 the products'
 * operands are rounded (q, k, dout, v; then P and dS); the kernel reads fp32 S, dP, dout, out.
 * The copies held at most: q, dout and k, with v or with P and dS (these two rounded in place
 * where the product reads fp32: they are this call's scratch). */
void attention_block_backward_in(dtype compute, float *dq, float *dk, float *dv, const float *dout, const float *out,
                                 const float *lse, const float *q, const float *k, const float *v, int B, int Tq,
                                 int Tk, int H, int Hkv, int hd, int q_offset, int k_offset) {
    if (B == 0 || Tq == 0 || Tk == 0 || H == 0) return;   /* nothing to add */
    int group = H / Hkv;
    int ldq = H * hd, ldkv = Hkv * hd;
    long long TqTk = (long long)Tq * Tk;
    float scale = attention_scale(hd);
    size_t nscores = (size_t)B * H * TqTk, nq = (size_t)B * Tq * ldq, nk = (size_t)B * Tk * ldkv;
    float *probs = device_alloc_floats(nscores, MEM_BUFFERS);
    float *dprobs = device_alloc_floats(nscores, MEM_BUFFERS);
    dtype t;
    const void *qo = operand_in(compute, q, nq, &t), *douto = operand_in(compute, dout, nq, &t),
               *ko = operand_in(compute, k, nk, &t), *vo = operand_in(compute, v, nk, &t);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < Hkv; g++) {
            size_t q_g = (size_t)b * Tq * ldq + (size_t)g * group * hd, k_g = (size_t)b * Tk * ldkv + (size_t)g * hd;
            float *s_g = probs + ((size_t)b * H + (size_t)g * group) * TqTk;
            float *dp_g = dprobs + ((size_t)b * H + (size_t)g * group) * TqTk;
            /* S_h = scale Q_h K_g^T : [Tq, Tk], as in the forward */
            matmul_strided_batched_typed(s_g, dtype_const_at(qo, t, q_g), dtype_const_at(ko, t, k_g), t, Tq, Tk, hd,
                                         false, true, ldq, ldkv, Tk, hd, 0, TqTk, group, scale, 0.0f);
            /* dP_h = dOut_h V_g^T : [Tq, Tk] */
            matmul_strided_batched_typed(dp_g, dtype_const_at(douto, t, q_g), dtype_const_at(vo, t, k_g), t, Tq, Tk,
                                         hd, false, true, ldq, ldkv, Tk, hd, 0, TqTk, group, 1.0f, 0.0f);
        }
    operand_release(v, vo);
    /* (D = dout . out with dout rounded as dP's GEMM read it: llama_math.h) */
    attention_block_softmax_backward(probs, dprobs, lse, dout, out, B, H, Tq, Tk, hd, q_offset, k_offset,
                                     compute == DTYPE_BF16);
    /* (both are this call's scratch: rounded in place where the product reads fp32) */
    const void *po = operand_in_place(compute, probs, nscores, &t);
    const void *dso = operand_in_place(compute, dprobs, nscores, &t);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < Hkv; g++) {
            size_t q_g = (size_t)b * Tq * ldq + (size_t)g * group * hd, k_g = (size_t)b * Tk * ldkv + (size_t)g * hd;
            size_t p_g = ((size_t)b * H + (size_t)g * group) * TqTk;
            float *dq_g = dq + q_g, *dk_g = dk + k_g, *dv_g = dv + k_g;
            /* dV_g += sum_h P_h^T dOut_h : [Tk, hd] */
            for (int i = 0; i < group; i++)
                matmul_strided_batched_typed(dv_g, dtype_const_at(po, t, p_g + i * TqTk),
                                             dtype_const_at(douto, t, q_g + i * hd), t, Tk, hd, Tq, true, false, Tk,
                                             ldq, ldkv, 0, 0, 0, 1, 1.0f, 1.0f);
            /* dQ_h += scale dS_h K_g : [Tq, hd], one per head, so one batched call */
            matmul_strided_batched_typed(dq_g, dtype_const_at(dso, t, p_g), dtype_const_at(ko, t, k_g), t, Tq, hd, Tk,
                                         false, false, Tk, ldkv, ldq, TqTk, 0, hd, group, scale, 1.0f);
            /* dK_g += scale sum_h dS_h^T Q_h : [Tk, hd] */
            for (int i = 0; i < group; i++)
                matmul_strided_batched_typed(dk_g, dtype_const_at(dso, t, p_g + i * TqTk),
                                             dtype_const_at(qo, t, q_g + i * hd), t, Tk, hd, Tq, true, false, Tk, ldq,
                                             ldkv, 0, 0, 0, 1, scale, 1.0f);
        }
    operand_release(probs, po);
    operand_release(dprobs, dso);
    operand_release(q, qo);
    operand_release(dout, douto);
    operand_release(k, ko);
    device_free(probs);
    device_free(dprobs);
}
void attention_block_backward(float *dq, float *dk, float *dv, const float *dout,
                              const float *out, const float *lse, const float *q, const float *k,
                              const float *v, int B, int Tq, int Tk, int H, int Hkv, int hd,
                              int q_offset, int k_offset) {
    attention_block_backward_in(DTYPE_F32, dq, dk, dv, dout, out, lse, q, k, v, B, Tq, Tk, H, Hkv, hd, q_offset,
                                k_offset);
}

/* ---- whole sequences in causal query blocks (llama_kernels.h) ----
 * Query block r of sequence b is a block of its own: rows [r0, r1) at offset r0, against keys
 * [0, r1) at offset 0. It sees every key it will ever see, so its (out, lse) are final: nothing to
 * merge. One call per (sequence, block), B = 1: a block's rows of q are not at one stride from
 * sequence to sequence. lse of (b, r) starts at (b T + r0) H. */
double attention_lse_forward(dtype compute, float *out, float *lse, const float *q, const float *k, const float *v,
                             int B, int T, int H, int Hkv, int hd) {
    int nb = causal_query_blocks(T);
    size_t ldq = (size_t)H * hd, ldkv = (size_t)Hkv * hd;
    double scores = 0;
    for (int b = 0; b < B; b++)
        for (int r = 0; r < nb; r++) {
            int r0 = causal_block_row(r, nb, T), r1 = causal_block_row(r + 1, nb, T);
            size_t rows = (size_t)b * T + r0, keys = (size_t)b * T;
            attention_block_forward_in(compute, out + rows * ldq, lse + rows * H, q + rows * ldq, k + keys * ldkv,
                                    v + keys * ldkv, 1, r1 - r0, r1, H, Hkv, hd, r0, 0);
            if (b == 0) scores += (double)(r1 - r0) * r1;
        }
    return scores;
}

void attention_lse_backward(dtype compute, float *dq, float *dk, float *dv, const float *dout, const float *out,
                            const float *lse, const float *q, const float *k, const float *v,
                            int B, int T, int H, int Hkv, int hd) {
    int nb = causal_query_blocks(T);
    size_t ldq = (size_t)H * hd, ldkv = (size_t)Hkv * hd;
    for (int b = 0; b < B; b++)
        for (int r = 0; r < nb; r++) {
            int r0 = causal_block_row(r, nb, T), r1 = causal_block_row(r + 1, nb, T);
            size_t rows = (size_t)b * T + r0, keys = (size_t)b * T;
            attention_block_backward_in(compute, dq + rows * ldq, dk + keys * ldkv, dv + keys * ldkv, dout + rows * ldq,
                                     out + rows * ldq, lse + rows * H, q + rows * ldq, k + keys * ldkv,
                                     v + keys * ldkv, 1, r1 - r0, r1, H, Hkv, hd, r0, 0);
        }
}
