/* mlp.h: the chapter's model, y = gelu(x W1^T) W2^T, as a single-device baseline and as its
 * tensor-parallel twin. Both use the same struct; the tensor-parallel one holds only this
 * rank's shard (hidden_local = hidden / tp of the hidden units).
 *
 *   fc1.weight [hidden, dim]   column-parallel: rank r owns rows    [r*Hl, (r+1)*Hl)
 *   fc2.weight [dim, hidden]   row-parallel:    rank r owns columns [r*Hl, (r+1)*Hl)
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "comm.h"

typedef struct {
    int N, dim, hidden, hidden_local;  /* batch rows, input/output width, hidden width (full, local) */
    int hidden_offset;                 /* first hidden unit this rank owns                        */
    float *fc1, *fc2;                  /* [hidden_local, dim], [dim, hidden_local]                */
    float *dfc1, *dfc2;                /* gradients, same shapes                                  */
    float *h, *a;                      /* saved for backward: h = x fc1^T, a = gelu(h)  [N, Hl]   */
    float *y;                          /* output [N, dim]                                         */
    float *dy, *da, *dh, *dx;          /* backward scratch: [N, dim], [N, Hl], [N, Hl], [N, dim]  */
} mlp;

/* Allocates and initialises the shard of rank `tp_rank` of `tp_size` (the baseline: 0 of 1).
 * Weights come from the shard-invariant initialiser, so every layout starts from the same model. */
mlp *mlp_create(int N, int dim, int hidden, int tp_rank, int tp_size, uint64_t seed, float init_std);
void mlp_free(mlp *m);

/* Single device. x[N, dim], target[N, dim]; returns the MSE loss. */
float mlp_forward(mlp *m, const float *x, const float *target);
void mlp_backward(mlp *m, const float *x, const float *target);

/* Tensor parallel over `tp`. Same shapes, same loss on every rank.
 * forward issues one all-reduce of N*dim floats (g); backward one more (f), unless
 * skip_backward_allreduce is set to show what breaks without it. */
float tp_mlp_forward(mlp *m, comm_group *tp, float *x, const float *target);
void tp_mlp_backward(mlp *m, comm_group *tp, const float *x, const float *target,
                     bool skip_backward_allreduce);

void mlp_zero_grad(mlp *m);
void mlp_sgd_step(mlp *m, float lr);
