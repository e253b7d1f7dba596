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
 */
#include <math.h>
#include "gemm.h"
#include "llama_kernels.h"
#include "llama_math.h"

/* out[B, T, H, hd] = softmax(causal(q k^T / sqrt(hd))) v; probs[B, H, T, T] saved. */
void attention_forward(float *out, float *probs, const float *q, const float *k, const float *v,
                       int B, int T, int H, int Hkv, int hd) {
    int group = H / Hkv;
    int ldq = H * hd, ldkv = Hkv * hd;     /* row strides of q/out and of k/v */
    long long TT = (long long)T * T;
    float scale = attention_scale(hd);
    /* scores[b, h] = scale * q_h k_g^T : [T, T] */
    for (int b = 0; b < B; b++)
        for (int g = 0; g < Hkv; g++) {
            const float *q_g = q + (size_t)b * T * ldq + (size_t)g * group * hd;
            const float *k_g = k + (size_t)b * T * ldkv + (size_t)g * hd;
            float *scores_g = probs + ((size_t)b * H + (size_t)g * group) * TT;
            matmul_strided_batched(scores_g, q_g, k_g, T, T, hd, false, true, ldq, ldkv, T,
                                   hd, 0, TT, group, scale, 0.0f);
        }
    causal_softmax_forward(probs, B * H * T, T);
    /* out_h = P_h v_g : [T, hd], written into the head's columns of out */
    for (int b = 0; b < B; b++)
        for (int g = 0; g < Hkv; g++) {
            const float *p_g = probs + ((size_t)b * H + (size_t)g * group) * TT;
            const float *v_g = v + (size_t)b * T * ldkv + (size_t)g * hd;
            float *out_g = out + (size_t)b * T * ldq + (size_t)g * group * hd;
            matmul_strided_batched(out_g, p_g, v_g, T, hd, T, false, false, T, ldkv, ldq,
                                   TT, 0, hd, group, 1.0f, 0.0f);
        }
}

/* dq (=), dk (=), dv (=) from dout[B, T, H, hd]; dprobs[B, H, T, T] is scratch.
 *   dV_g = sum_h P_h^T dOut_h          dP_h = dOut_h V_g^T       dS_h = softmax backward
 *   dQ_h = scale dS_h K_g              dK_g = scale sum_h dS_h^T Q_h
 * dV_g and dK_g sum over the heads of the group. A single batched call would have all its
 * entries write the same dV_g at once, a race on the GPU; instead the heads go one after the
 * other, the first with beta = 0 (overwrite), the rest with beta = 1 (accumulate). */
void attention_backward(float *dq, float *dk, float *dv, float *dprobs,
                        const float *dout, const float *q, const float *k, const float *v,
                        const float *probs, int B, int T, int H, int Hkv, int hd) {
    int group = H / Hkv;
    int ldq = H * hd, ldkv = Hkv * hd;
    long long TT = (long long)T * T;
    float scale = attention_scale(hd);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < Hkv; g++) {
            const float *dout_g = dout + (size_t)b * T * ldq + (size_t)g * group * hd;
            const float *v_g = v + (size_t)b * T * ldkv + (size_t)g * hd;
            const float *p_g = probs + ((size_t)b * H + (size_t)g * group) * TT;
            float *dp_g = dprobs + ((size_t)b * H + (size_t)g * group) * TT;
            float *dv_g = dv + (size_t)b * T * ldkv + (size_t)g * hd;
            /* dV_g = sum_h P_h^T dOut_h : [T, hd] */
            for (int i = 0; i < group; i++)
                matmul_strided_batched(dv_g, p_g + i * TT, dout_g + i * hd, T, hd, T, true, false,
                                       T, ldq, ldkv, 0, 0, 0, 1, 1.0f, i == 0 ? 0.0f : 1.0f);
            /* dP_h = dOut_h V_g^T : [T, T], one per head, so one batched call */
            matmul_strided_batched(dp_g, dout_g, v_g, T, T, hd, false, true, ldq, ldkv, T,
                                   hd, 0, TT, group, 1.0f, 0.0f);
        }
    causal_softmax_backward(dprobs, probs, B * H * T, T);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < Hkv; g++) {
            const float *q_g = q + (size_t)b * T * ldq + (size_t)g * group * hd;
            const float *k_g = k + (size_t)b * T * ldkv + (size_t)g * hd;
            const float *ds_g = dprobs + ((size_t)b * H + (size_t)g * group) * TT;
            float *dq_g = dq + (size_t)b * T * ldq + (size_t)g * group * hd;
            float *dk_g = dk + (size_t)b * T * ldkv + (size_t)g * hd;
            /* dQ_h = scale dS_h K_g : [T, hd], one per head */
            matmul_strided_batched(dq_g, ds_g, k_g, T, hd, T, false, false, T, ldkv, ldq,
                                   TT, 0, hd, group, scale, 0.0f);
            /* dK_g = scale sum_h dS_h^T Q_h : [T, hd] */
            for (int i = 0; i < group; i++)
                matmul_strided_batched(dk_g, ds_g + i * TT, q_g + i * hd, T, hd, T, true, false,
                                       T, ldq, ldkv, 0, 0, 0, 1, scale, i == 0 ? 0.0f : 1.0f);
        }
}
