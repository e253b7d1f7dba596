/* kernels_cpu.c: the CPU loops around kernel_math.h (the CUDA twin is kernels_cuda.cu). */
#include "kernels.h"
#include "kernel_math.h"
#include "dtype.h"

void gelu_forward(float *out, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = gelu_value(x[i]);
}

void gelu_backward(float *dx, const float *dout, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) dx[i] = dout[i] * gelu_derivative(x[i]);
}

float mse_sum(const float *y, const float *target, size_t n) {
    double sum = 0.0;   /* double accumulation: the loss is compared to 1e-5 */
    for (size_t i = 0; i < n; i++) sum += mse_term(y[i], target[i]);
    return (float)sum;
}

void mse_backward(float *dy, const float *y, const float *target, size_t n, size_t n_total) {
    float inv_n = 1.0f / (float)n_total;
    for (size_t i = 0; i < n; i++) dy[i] = mse_grad(y[i], target[i], inv_n);
}

void sgd_step(float *p, const float *g, size_t n, float lr) {
    for (size_t i = 0; i < n; i++) p[i] = sgd_update(p[i], g[i], lr);
}

void add_inplace(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void scale_inplace(float *y, float a, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] *= a;
}

void cast_to_bf16(uint16_t *restrict out, const float *restrict x, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) out[i] = bf16_from_float(x[i]);
}

void cast_from_bf16(float *restrict out, const uint16_t *restrict x, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) out[i] = bf16_to_float(x[i]);
}

void round_to_bf16(float *out, const float *x, size_t n) {   /* (not restrict: out may be x) */
#pragma omp simd
    for (size_t i = 0; i < n; i++) out[i] = bf16_to_float(bf16_from_float(x[i]));
}
