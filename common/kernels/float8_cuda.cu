/* float8_cuda.cu: the CUDA twin of float8_cpu.c (see float8.h).
 *
 * Same argument lists, same formulas (float8_math.h). Only the loops change:
 *   - the casts are one thread per element (a grid-stride loop); the tensorwise, rowwise and
 *     columnwise variants share a kernel, float8_element_scale() picks the scale;
 *   - the amax of a whole tensor is cub::DeviceReduce::TransformReduce (transform |x|, reduce
 *     with the NaN-propagating max), whose one number is then copied to the host;
 *   - the amax of each row is one block of ROW_THREADS threads per row: thread t takes columns
 *     t, t + ROW_THREADS, ..., and cub::BlockReduce combines the threads' maxima; the amax of
 *     each column is one thread per column.
 * Max is exact, so both backends return the same bits whatever the order of the reduction.
 * Everything runs on the rank's one stream (cuda_common.h); only float8_amax, which returns a
 * host value, waits for the GPU.
 */
#include <cub/block/block_reduce.cuh>
#include <cub/device/device_reduce.cuh>
#include "float8.h"
#include "device.h"
#include "cuda_common.h"

#define ROW_THREADS 256
typedef cub::BlockReduce<float, ROW_THREADS> BlockReduceFloat;

/* cub takes the transform and the reduction as function objects. */
struct Float8Abs {
    __device__ float operator()(const float &x) const { return fabsf(x); }
};
struct Float8AmaxMerge {
    __device__ float operator()(const float &a, const float &b) const {
        return float8_amax_merge(a, b);
    }
};

/* ---- amax ---------------------------------------------------------------------------------- */

/* cub's device-wide reductions run in two phases (per-block partials, then one block over the
 * partials) and need scratch memory for the partials; a first call with no scratch asks how
 * much. The scratch comes from device_alloc (MEM_BUFFERS, counted) for the duration of the
 * call, with the result in its first bytes: device_alloc returns 256-byte aligned blocks, and cub's scratch
 * starts 256 bytes on, so it keeps that alignment. */
#define AMAX_RESULT_BYTES 256

float float8_amax(const float *x, size_t n) {
    if (n == 0) return 0.0f;
    size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceReduce::TransformReduce(NULL, temp_bytes, x, (float *)NULL, n,
                                                  Float8AmaxMerge(), Float8Abs(), 0.0f,
                                                  cuda_stream()));
    char *scratch = (char *)device_alloc(AMAX_RESULT_BYTES + temp_bytes, MEM_BUFFERS);
    float *result = (float *)scratch;
    CUDA_CHECK(cub::DeviceReduce::TransformReduce(scratch + AMAX_RESULT_BYTES, temp_bytes, x,
                                                  result, n, Float8AmaxMerge(), Float8Abs(),
                                                  0.0f, cuda_stream()));
    float amax = 0.0f;
    device_copy_to_host(&amax, result, sizeof amax);   /* waits for the stream */
    device_free(scratch);
    return amax;
}

/* One block per row: each thread's max over its columns, then the block's. */
static __global__ void amax_rows_kernel(float *amax, const float *x, int cols) {
    __shared__ BlockReduceFloat::TempStorage temp;
    const float *row = x + (size_t)blockIdx.x * cols;
    float m = 0.0f;
    for (int c = threadIdx.x; c < cols; c += ROW_THREADS) m = float8_amax_merge(m, fabsf(row[c]));
    m = BlockReduceFloat(temp).Reduce(m, Float8AmaxMerge());   /* valid in thread 0 only */
    if (threadIdx.x == 0) amax[blockIdx.x] = m;
}

void float8_amax_rows(float *amax, const float *x, int rows, int cols) {
    if (rows == 0) return;
    amax_rows_kernel<<<rows, ROW_THREADS, 0, cuda_stream()>>>(amax, x, cols);
    CUDA_CHECK_LAUNCH();
}

/* A column reduction (cuda_common.h): COL_REDUCE_ROWS threads down each of a block's 32
 * columns, their maxima combined by one thread per column (a max is exact in any order). */
static __global__ void amax_cols_kernel(float *amax, const float *x, int rows, int cols) {
    __shared__ float part[COL_REDUCE_ROWS][COL_REDUCE_COLS];
    int c = blockIdx.x * COL_REDUCE_COLS + threadIdx.x;
    float m = 0.0f;
    if (c < cols)
        for (int r = threadIdx.y; r < rows; r += COL_REDUCE_ROWS) m = float8_amax_merge(m, fabsf(x[(size_t)r * cols + c]));
    part[threadIdx.y][threadIdx.x] = m;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        for (int r = 1; r < COL_REDUCE_ROWS; r++) m = float8_amax_merge(m, part[r][threadIdx.x]);
        amax[c] = m;
    }
}

void float8_amax_cols(float *amax, const float *x, int rows, int cols) {
    if (cols == 0) return;
    amax_cols_kernel<<<col_reduce_grid(cols), col_reduce_block(), 0, cuda_stream()>>>(amax, x, rows, cols);
    CUDA_CHECK_LAUNCH();
}

/* One thread per row. */
static __global__ void scales_kernel(float *scales, const float *amax, int n, float8_format fmt,
                                     int round_pow2) {
    GRID_STRIDE_LOOP(i, n) scales[i] = float8_scale_from_amax(amax[i], fmt, round_pow2);
}

void float8_scales_from_amax(float *scales, const float *amax, int n, float8_format fmt,
                             int round_pow2) {
    if (n == 0) return;
    scales_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(scales, amax, n, fmt,
                                                                      round_pow2);
    CUDA_CHECK_LAUNCH();
}

/* ---- the casts: one thread per element, scaled by float8_element_scale ---------------------- */

static __global__ void quantize_kernel(uint8_t *q, const float *x, size_t n, int cols,
                                       float8_scaling how, float scale, const float *scales,
                                       float8_format fmt) {
    GRID_STRIDE_LOOP(i, n)
        q[i] = float8_quantize_value(x[i], float8_element_scale(i, how, scale, scales, cols), fmt);
}

static __global__ void dequantize_kernel(float *x, const uint8_t *q, size_t n, int cols,
                                         float8_scaling how, float scale, const float *scales,
                                         float8_format fmt) {
    GRID_STRIDE_LOOP(i, n)
        x[i] = float8_dequantize_value(q[i], float8_element_scale(i, how, scale, scales, cols), fmt);
}

/* y may alias x: each thread reads its element before writing it. */
static __global__ void fake_quantize_kernel(float *y, const float *x, size_t n, int cols,
                                            float8_scaling how, float scale, const float *scales,
                                            float8_format fmt) {
    GRID_STRIDE_LOOP(i, n)
        y[i] = float8_fake_quantize_value(x[i], float8_element_scale(i, how, scale, scales, cols),
                                          fmt);
}

void float8_quantize_scaled(uint8_t *q, const float *x, size_t n, int cols, float8_scaling how,
                            float scale, const float *scales, float8_format fmt) {
    if (n == 0) return;
    quantize_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(q, x, n, cols, how, scale,
                                                                        scales, fmt);
    CUDA_CHECK_LAUNCH();
}

void float8_dequantize_scaled(float *x, const uint8_t *q, size_t n, int cols, float8_scaling how,
                              float scale, const float *scales, float8_format fmt) {
    if (n == 0) return;
    dequantize_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(x, q, n, cols, how,
                                                                          scale, scales, fmt);
    CUDA_CHECK_LAUNCH();
}

void float8_fake_quantize_scaled(float *y, const float *x, size_t n, int cols, float8_scaling how,
                                 float scale, const float *scales, float8_format fmt) {
    if (n == 0) return;
    fake_quantize_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(
        y, x, n, cols, how, scale, scales, fmt);
    CUDA_CHECK_LAUNCH();
}

/* ---- transpose: one thread per element of dst (writes coalesce, reads stride) ---------------- */

static __global__ void transpose_kernel(uint8_t *dst, const uint8_t *src, int rows, int cols, size_t n) {
    GRID_STRIDE_LOOP(i, n) {
        size_t c = i / (size_t)rows, r = i % (size_t)rows;   /* dst[c][r] */
        dst[i] = src[r * (size_t)cols + c];
    }
}

void float8_transpose(uint8_t *dst, const uint8_t *src, int rows, int cols) {
    size_t n = (size_t)rows * cols;
    if (n == 0) return;
    transpose_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(dst, src, rows, cols, n);
    CUDA_CHECK_LAUNCH();
}
