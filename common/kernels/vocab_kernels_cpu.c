/* vocab_kernels_cpu.c: the CPU backend of vocab_kernels.h, plain loops around vocab_math.h.
 * vocab_kernels_cuda.cu is the same with a block per row (max, sum) or a thread per element. */
#include <math.h>
#include "llama_kernels.h"   /* IGNORE_INDEX */
#include "vocab_kernels.h"
#include "vocab_math.h"

void vocab_shard_row_max(float *row_max, const float *logits_local, int N, int Vl, int Vr) {
    for (int n = 0; n < N; n++) {
        const float *x = logits_local + (size_t)n * Vl;
        float m = -INFINITY;
        for (int j = 0; j < Vl; j++) m = vocab_max(m, vocab_masked_logit(x[j], j, Vr));
        row_max[n] = m;
    }
}

void vocab_shard_row_sumexp(float *row_sumexp, const float *logits_local, const float *row_max,
                            int N, int Vl, int Vr) {
    for (int n = 0; n < N; n++) {
        const float *x = logits_local + (size_t)n * Vl;
        float s = 0.0f;
        for (int j = 0; j < Vl; j++) s += vocab_sumexp_term(vocab_masked_logit(x[j], j, Vr), row_max[n]);
        row_sumexp[n] = s;
    }
}

void vocab_shard_target_logit(float *target_logit, const float *logits_local, const int *targets,
                              int N, int Vl, int v0) {
    for (int n = 0; n < N; n++) {
        int j = vocab_shard_column(targets[n], v0, Vl);
        target_logit[n] = j >= 0 ? logits_local[(size_t)n * Vl + j] : 0.0f;
    }
}

float vocab_shard_loss_sum(const float *row_max, const float *row_sumexp,
                           const float *target_logit, const int *targets, int N) {
    double total = 0.0;   /* double: many row losses, compared to 1e-5 */
    for (int n = 0; n < N; n++)
        if (targets[n] != IGNORE_INDEX)
            total += vocab_row_loss(row_max[n], row_sumexp[n], target_logit[n]);
    return (float)total;
}

/* Element by element: each is read before it is written, so dlogits may alias logits. */
void vocab_shard_cross_entropy_backward(float *dlogits_local, const float *logits_local,
                                        const int *targets, const float *row_max,
                                        const float *row_sumexp, int N, int Vl, int Vr, int v0,
                                        float grad_scale) {
    for (int n = 0; n < N; n++) {
        const float *x = logits_local + (size_t)n * Vl;
        float *dx = dlogits_local + (size_t)n * Vl;
        int ignored = targets[n] == IGNORE_INDEX;
        int t = vocab_shard_column(targets[n], v0, Vl);   /* -1: the target is elsewhere */
        for (int j = 0; j < Vl; j++)
            dx[j] = ignored ? 0.0f : vocab_grad(vocab_masked_logit(x[j], j, Vr), j == t, row_max[n], row_sumexp[n],
                                                grad_scale);
    }
}
