/* moe_kernels_cpu.c: the CPU backend of moe_kernels.h, loops around moe_math.h. */
#include <string.h>
#include "moe_kernels.h"
#include "moe_math.h"

void moe_router_scores(float *scores, const float *logits, int N, int E, int sigmoid) {
    for (int n = 0; n < N; n++) moe_scores_row(scores + (size_t)n * E, logits + (size_t)n * E, E, sigmoid);
}

void moe_router_scores_backward(float *dlogits, const float *dscores, const float *scores, int N, int E, int sigmoid) {
    for (int n = 0; n < N; n++)
        moe_scores_backward_row(dlogits + (size_t)n * E, dscores + (size_t)n * E, scores + (size_t)n * E, E, sigmoid);
}

void moe_gather_rows(float *dst, const float *src, const int *index, int n, int D) {
    for (int i = 0; i < n; i++) memcpy(dst + (size_t)i * D, src + (size_t)index[i] * D, (size_t)D * sizeof(float));
}

void moe_combine(float *h, const float *y, const int *slot, const float *gates, int N, int k, int D) {
    for (int t = 0; t < N; t++)
        for (int c = 0; c < D; c++) h[(size_t)t * D + c] += moe_combine_elem(y, slot, gates, t, k, D, c);
}

void moe_combine_backward(float *dy, float *dgates, const float *dh, const float *y, const int *slot,
                          const float *gates, int N, int k, int D) {
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            size_t i = (size_t)t * k + j, row = (size_t)slot[i] * D;
            const float *g = dh + (size_t)t * D;
            if (slot[i] < 0) { dgates[i] = 0.0f; continue; }   /* dropped: no row, no gradient */
            float dot = 0.0f;
            for (int c = 0; c < D; c++) {
                dy[row + c] = gates[i] * g[c];
                dot += g[c] * y[row + c];
            }
            dgates[i] = dot;
        }
}
