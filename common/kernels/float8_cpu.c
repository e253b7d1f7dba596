/* float8_cpu.c: the CPU backend of float8.h.
 *
 * Plain loops around float8_math.h. float8_cuda.cu is the same code with one thread per element
 * (and one block per row, or cub::DeviceReduce, for the amax reductions): read them side by side.
 * The tensorwise, rowwise and columnwise casts share one loop each: float8_element_scale()
 * picks the tensor's scale, the row's or the column's.
 */
#include <math.h>
#include "float8.h"

/* ---- amax ---------------------------------------------------------------------------------- */

static float amax_of(const float *x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = float8_amax_merge(m, fabsf(x[i]));
    return m;
}

float float8_amax(const float *x, size_t n) { return amax_of(x, n); }

void float8_amax_rows(float *amax, const float *x, int rows, int cols) {
    for (int r = 0; r < rows; r++) amax[r] = amax_of(x + (size_t)r * cols, (size_t)cols);
}

/* Column by column would stride through memory; row by row, each row updates every column's
 * running max, reading x in order. */
void float8_amax_cols(float *amax, const float *x, int rows, int cols) {
    for (int c = 0; c < cols; c++) amax[c] = 0.0f;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            amax[c] = float8_amax_merge(amax[c], fabsf(x[(size_t)r * cols + c]));
}

void float8_scales_from_amax(float *scales, const float *amax, int n, float8_format fmt,
                             int round_pow2) {
    for (int i = 0; i < n; i++) scales[i] = float8_scale_from_amax(amax[i], fmt, round_pow2);
}

/* ---- the casts: element i scaled by float8_element_scale (the tensor's, its row's or its column's) */

void float8_quantize_scaled(uint8_t *q, const float *x, size_t n, int cols, float8_scaling how,
                            float scale, const float *scales, float8_format fmt) {
    for (size_t i = 0; i < n; i++)
        q[i] = float8_quantize_value(x[i], float8_element_scale(i, how, scale, scales, cols), fmt);
}

void float8_dequantize_scaled(float *x, const uint8_t *q, size_t n, int cols, float8_scaling how,
                              float scale, const float *scales, float8_format fmt) {
    for (size_t i = 0; i < n; i++)
        x[i] = float8_dequantize_value(q[i], float8_element_scale(i, how, scale, scales, cols), fmt);
}

/* y may alias x: element i is read before it is written. */
void float8_fake_quantize_scaled(float *y, const float *x, size_t n, int cols, float8_scaling how,
                                 float scale, const float *scales, float8_format fmt) {
    for (size_t i = 0; i < n; i++)
        y[i] = float8_fake_quantize_value(x[i], float8_element_scale(i, how, scale, scales, cols),
                                          fmt);
}

void float8_transpose(uint8_t *dst, const uint8_t *src, int rows, int cols) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[(size_t)c * rows + r] = src[(size_t)r * cols + c];
}
