/* kernel_math.h: per-element math shared by the CPU loops and the CUDA kernels.
 *
 * Each function here is the single definition of its formula. kernels_cpu.c calls it in a
 * loop; kernels_cuda.cu calls it once per thread. The CPU unit tests therefore test the math
 * the GPU runs.
 */
#pragma once
#include <math.h>
#include "cdefs.h"

/* GELU, tanh approximation (Hendrycks & Gimpel 2016; as in GPT-2):
 *   gelu(x) = 0.5 x (1 + tanh(s (x + 0.044715 x^3))),  s = sqrt(2/pi)                      */
#define GELU_SCALE 0.7978845608028654f
HD static inline float gelu_value(float x) {
    float inner = GELU_SCALE * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}
/* d gelu / dx = 0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 * 0.044715 x^2),  t = tanh(inner)     */
HD static inline float gelu_derivative(float x) {
    float inner = GELU_SCALE * (x + 0.044715f * x * x * x);
    float t = tanhf(inner);
    float dinner = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner;
}

/* Mean squared error over n elements: L = (1/n) sum (y - t)^2, dL/dy = 2 (y - t) / n.        */
HD static inline float mse_term(float y, float t) { float d = y - t; return d * d; }
HD static inline float mse_grad(float y, float t, float inv_n) { return 2.0f * (y - t) * inv_n; }

/* Plain SGD: p -= lr * g.                                                                   */
HD static inline float sgd_update(float p, float g, float lr) { return p - lr * g; }
