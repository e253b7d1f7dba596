/* gemm_fp8_cpu.c: the float8 GEMM emulated in fp32, as torchao emulates it (see gemm_fp8.h).
 *
 * A CPU has no float8 arithmetic, but a float8 code is just a small fp32 number: decode every
 * code, divide by its tensor's scale (float8_dequantize, exactly the fp32 values torchao's
 * to_original_precision gives), and multiply the two fp32 matrices with the ordinary GEMM.
 * The fp32 GEMM is the same call, with the same column-major tuple, as an unquantized linear
 * layer's: C = A B^T is matmul(..., trans_a = false, trans_b = true), which gemm.c turns into
 * cuBLAS's (T, N, m = N, n = M, k = K), the very layout cuBLASLt requires for float8 on the GPU
 * (gemm_fp8_cuda.cu).
 */
#include "gemm_fp8.h"
#include "device.h"
#include "float8.h"
#include "gemm.h"

bool gemm_fp8_supported(char *why, size_t len) {
    if (why && len) why[0] = '\0';
    return true;
}

void gemm_fp8(float *C, const uint8_t *A, float8_format fa, float a_scale, const uint8_t *B,
              float8_format fb, float b_scale, int M, int N, int K) {
    gemm_fp8_check(C, A, fa, B, fb, M, N, K);
    size_t na = (size_t)M * K, nb = (size_t)N * K;
    float *a = device_alloc_floats(na, MEM_BUFFERS), *b = device_alloc_floats(nb, MEM_BUFFERS);
    float8_dequantize(a, A, na, a_scale, fa);
    float8_dequantize(b, B, nb, b_scale, fb);
    matmul(C, a, b, M, N, K, false, true, 1.0f, 0.0f);
    device_free(a);
    device_free(b);
}

/* Rowwise: each row divided by its own scale (float8_dequantize_scaled, FLOAT8_PER_ROW), then the
 * same fp32 GEMM. The CPU has no float8 GEMM to hand the scales to: the path exists here so the
 * call, its shapes and which scale goes with which operand are tested on the CPU. */
bool gemm_fp8_rowwise(float *C, const uint8_t *A, float8_format fa, const float *a_scales, const uint8_t *B,
                      float8_format fb, const float *b_scales, int M, int N, int K) {
    gemm_fp8_check(C, A, fa, B, fb, M, N, K);
    size_t na = (size_t)M * K, nb = (size_t)N * K;
    float *a = device_alloc_floats(na, MEM_BUFFERS), *b = device_alloc_floats(nb, MEM_BUFFERS);
    float8_dequantize_scaled(a, A, na, K, FLOAT8_PER_ROW, 0.0f, a_scales, fa);
    float8_dequantize_scaled(b, B, nb, K, FLOAT8_PER_ROW, 0.0f, b_scales, fb);
    matmul(C, a, b, M, N, K, false, true, 1.0f, 0.0f);
    device_free(a);
    device_free(b);
    return true;
}
bool gemm_fp8_rowwise_native(void) { return false; }
