/* mlp.c: the baseline MLP and its tensor-parallel twin, side by side.
 *
 * Read the two forwards next to each other: the tensor-parallel one is the baseline with the
 * first linear made column-parallel, the second row-parallel, and f and g around them.
 */
#include <stdlib.h>
#include "device.h"
#include "init.h"
#include "kernels.h"
#include "llama_kernels.h"
#include "mlp.h"
#include "tensor_parallel.h"

mlp *mlp_create(int N, int dim, int hidden, int tp_rank, int tp_size, uint64_t seed, float init_std) {
    mlp *m = calloc(1, sizeof *m);
    m->N = N;
    m->dim = dim;
    m->hidden = hidden;
    m->hidden_local = hidden / tp_size;
    m->hidden_offset = tp_rank * m->hidden_local;
    int Hl = m->hidden_local;
    m->fc1 = device_alloc_floats((size_t)Hl * dim, MEM_PARAMS);
    m->fc2 = device_alloc_floats((size_t)dim * Hl, MEM_PARAMS);
    m->dfc1 = device_alloc_floats((size_t)Hl * dim, MEM_GRADS);
    m->dfc2 = device_alloc_floats((size_t)dim * Hl, MEM_GRADS);
    m->h = device_alloc_floats((size_t)N * Hl, MEM_ACTIVATIONS);
    m->a = device_alloc_floats((size_t)N * Hl, MEM_ACTIVATIONS);
    m->y = device_alloc_floats((size_t)N * dim, MEM_ACTIVATIONS);
    m->dy = device_alloc_floats((size_t)N * dim, MEM_BUFFERS);
    m->da = device_alloc_floats((size_t)N * Hl, MEM_BUFFERS);
    m->dh = device_alloc_floats((size_t)N * Hl, MEM_BUFFERS);
    m->dx = device_alloc_floats((size_t)N * dim, MEM_BUFFERS);
    /* fc1: rows [offset, offset+Hl) of [hidden, dim]; fc2: columns [offset, offset+Hl) of [dim, hidden] */
    init_normal_slice_device(m->fc1, "fc1.weight", seed, init_std, hidden, dim, m->hidden_offset, Hl, 0, dim);
    init_normal_slice_device(m->fc2, "fc2.weight", seed, init_std, dim, hidden, 0, dim, m->hidden_offset, Hl);
    return m;
}

void mlp_free(mlp *m) {
    float *bufs[] = {m->fc1, m->fc2, m->dfc1, m->dfc2, m->h, m->a, m->y, m->dy, m->da, m->dh, m->dx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) device_free(bufs[i]);
    free(m);
}

/* ---------------------------------------------------------------- single device */

float mlp_forward(mlp *m, const float *x, const float *target) {
    int N = m->N, D = m->dim, H = m->hidden;
    linear_forward(m->h, x, m->fc1, N, D, H);             /* h[N, H] = x fc1^T      */
    gelu_forward(m->a, m->h, (size_t)N * H);              /* a[N, H] = gelu(h)      */
    linear_forward(m->y, m->a, m->fc2, N, H, D);          /* y[N, D] = a fc2^T      */
    return mse_sum(m->y, target, (size_t)N * D) / (float)(N * D);
}

void mlp_backward(mlp *m, const float *x, const float *target) {
    int N = m->N, D = m->dim, H = m->hidden;
    mse_backward(m->dy, m->y, target, (size_t)N * D, (size_t)N * D);   /* dy[N, D]          */
    linear_backward(m->da, m->dfc2, m->dy, m->a, m->fc2, N, H, D);     /* da[N, H], dfc2 += */
    gelu_backward(m->dh, m->da, m->h, (size_t)N * H);                  /* dh[N, H]          */
    linear_backward(m->dx, m->dfc1, m->dh, x, m->fc1, N, D, H);        /* dx[N, D], dfc1 += */
}

/* ---------------------------------------------------------------- tensor parallel */

float tp_mlp_forward(mlp *m, comm_group *tp, float *x, const float *target) {
    int N = m->N, D = m->dim, Hl = m->hidden_local;
    tp_copy_to_region_forward(tp, x, (size_t)N * D);                    /* f: identity          */
    column_parallel_linear_forward(m->h, x, m->fc1, N, D, Hl);         /* h[N, H/p] local cols */
    gelu_forward(m->a, m->h, (size_t)N * Hl);                          /* element-wise: local  */
    row_parallel_linear_forward(m->y, m->a, m->fc2, N, Hl, D);         /* y[N, D] partial sum  */
    tp_reduce_from_region_forward(tp, m->y, (size_t)N * D);            /* g: all-reduce        */
    return mse_sum(m->y, target, (size_t)N * D) / (float)(N * D);      /* same on every rank   */
}

void tp_mlp_backward(mlp *m, comm_group *tp, const float *x, const float *target,
                     bool skip_backward_allreduce) {
    int N = m->N, D = m->dim, Hl = m->hidden_local;
    mse_backward(m->dy, m->y, target, (size_t)N * D, (size_t)N * D);   /* dy[N, D], replicated */
    tp_reduce_from_region_backward(tp, m->dy, (size_t)N * D);          /* g backward: identity */
    row_parallel_linear_backward(m->da, m->dfc2, m->dy, m->a, m->fc2, N, Hl, D);
    gelu_backward(m->dh, m->da, m->h, (size_t)N * Hl);
    column_parallel_linear_backward(m->dx, m->dfc1, m->dh, x, m->fc1, N, D, Hl);
    /* dx now holds only this rank's share of the input gradient (from its H/p hidden units). */
    if (!skip_backward_allreduce)
        tp_copy_to_region_backward(tp, m->dx, (size_t)N * D);          /* f backward: all-reduce */
}

void mlp_zero_grad(mlp *m) {
    device_zero(m->dfc1, (size_t)m->hidden_local * m->dim * sizeof(float));
    device_zero(m->dfc2, (size_t)m->dim * m->hidden_local * sizeof(float));
}

void mlp_sgd_step(mlp *m, float lr) {
    sgd_step(m->fc1, m->dfc1, (size_t)m->hidden_local * m->dim, lr);
    sgd_step(m->fc2, m->dfc2, (size_t)m->dim * m->hidden_local, lr);
}
