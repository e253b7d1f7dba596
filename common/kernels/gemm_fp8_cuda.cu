/* gemm_fp8_cuda.cu: the CUDA twin of gemm_fp8_cpu.c (see gemm_fp8.h): one cublasLtMatmul on
 * the float8 codes themselves.
 *
 * Plain cuBLAS (cublasSgemm, cublasGemmEx) has no float8 GEMM; cuBLASLt, the library's
 * lower-level interface, does. A cuBLASLt call is described by descriptors instead of a long
 * argument list: a matmul descriptor (compute and scale types, transposes, the scale pointers),
 * one layout per matrix (element type, rows, columns, leading dimension, column-major), and an
 * algorithm that cublasLtMatmulAlgoGetHeuristic picks for them. It computes (cuBLAS
 * documentation, "Tensorwide Scaling For FP8 Data Types")
 *     D = scale_D (alpha scale_A scale_B op(A) op(B) + beta scale_C C)
 * where scale_A and scale_B DEQUANTIZE: they multiply the codes back to real values. Our cast
 * multiplied by a_scale (q = cast(x * a_scale)), so cuBLASLt's scale is 1 / a_scale, which is
 * also what torch._scaled_mm takes ("inverse scales"). scale_C and scale_D stay unset: the
 * documentation's note on scaling modes says a scale set on a non-float8 tensor is an error
 * (C's tensorwide scale excepted), and our C and D are fp32.
 *
 * The requirements for float8 (documentation, "cublasLtMatmul()"; checked once for both
 * backends by gemm_fp8_check in gemm_fp8.h):
 *   - compute type CUBLAS_COMPUTE_32F, scale type CUDA_R_32F (alpha, beta and the scales fp32);
 *   - "A must be transposed and B non-transposed (the TN format)" on Ada and Hopper;
 *   - dimensions and pointers as in "Tensor Core Usage" (16-byte alignment);
 *   - the FP8 type table: A, B in E4M3/E5M2 (not both E5M2), and with C = CUDA_R_32F the output
 *     D = CUDA_R_32F. That row is our case: fp32 C and D, no bias (the table's bias type for it
 *     is CUDA_R_16BF; we use no bias), beta = 0.
 *
 * The layout, row-major to cuBLASLt's column-major (gemm.h explains the general rule):
 * a row-major [r, c] buffer read column-major is the transposed matrix, [c, r], leading
 * dimension c. So our buffers are, to cuBLASLt,
 *     A[M, K] row-major  =  A^T, column-major [K, M], ld K
 *     B[N, K] row-major  =  B^T, column-major [K, N], ld K
 *     C[M, N] row-major  =  C^T, column-major [N, M], ld N
 * and C = A B^T is the same equation as C^T = B A^T. Column-major, that is
 *     D[N, M] = op(first)[N, K] op(second)[K, M]
 * with first = the buffer of B (B^T [K, N] to cuBLASLt; op = T makes it B [N, K]) and
 * second = the buffer of A (A^T [K, M]; op = N keeps it). cuBLASLt's m, n, k are N, M, K, its
 * A is our B and its B is our A: transa = T, transb = N, exactly the TN format float8 demands.
 * (TN in column-major terms means both operands have K contiguous in memory, which is what
 * row-major A[M, K] and B[N, K] are.) This is the tuple gemm_args_from_row_major(false, true,
 * ...) builds for every fp32 linear layer, so we take it from there: test_gemm checks it, and
 * the CPU twin's fp32 GEMM uses the same one.
 *
 * Accumulation: CUBLASLT_MATMUL_DESC_FAST_ACCUM is set to 0, cuBLASLt's documented default, and
 * set explicitly so that no library default decides it: Hopper's float8 tensor cores keep their
 * running sums in reduced precision, and without fast accumulation the kernel promotes those
 * sums to fp32 at intervals (cublasLt.h: fast accumulation skips that, "faster but at the cost
 * of lower accuracy"; torchao's default config turns it on for the forward output GEMM only).
 * Promotion is not the whole story: between promotions the tensor cores keep about 14 bits
 * (DeepSeek-V3 technical report, 3.3.2; an H100 showed 2e-4 of the largest output against an
 * fp32 sum, test_float8_linear). So a single-device parity baseline must cut a tensor-parallel
 * contraction into the ranks' slices, each a GEMM of one rank's shape, to add the same products in
 * the same accumulators as the ranks (docs/design.md, "Parity").
 *
 * Descriptors: a call is described by a matmul descriptor (the same for every call: fp32 compute,
 * TN, the two scale pointers), three layouts and an algorithm from cublasLtMatmulAlgoGetHeuristic.
 * Building them costs host time on every call, so they are made once per shape (M, N, K and the
 * two formats) and kept in a small table for the run; a training step meets a dozen shapes.
 *
 * State kept for the whole run, created on the first call: the cuBLASLt handle (cublasLtCreate
 * once, as cuBLAS's handle is created once in device_init), the descriptors above, and one device block from
 * device_alloc (MEM_BUFFERS) holding the two scales, each in its own 256-byte slot, and the
 * workspace after them (device_alloc returns 256-byte aligned blocks; cuBLASLt wants its workspace
 * 256-byte aligned, and refused a scale pointer 4 bytes from the other on an H100).
 * Everything is issued on the rank's one stream, cuda_stream(), so successive calls, and the
 * kernels around them, run in program order and can share the block.
 */
#include <cublasLt.h>
#include "gemm_fp8.h"
#include "device.h"
#include "gemm.h"
#include "cuda_common.h"

static cublasLtHandle_t g_lt = NULL;  /* the cuBLASLt handle                                  */
#define SCALE_SLOT 256              /* bytes: each scale at its own 256-byte boundary */
static float *g_scales = NULL;        /* device: cuBLASLt's scale_A, scale_B (dequantization) */
static void *g_workspace = NULL;      /* device: cuBLASLt's scratch for split-K and the like  */
static size_t g_workspace_bytes = 0;

static void compute_capability(int *dev, int *major, int *minor) {
    CUDA_CHECK(cudaGetDevice(dev));
    CUDA_CHECK(cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, *dev));
    CUDA_CHECK(cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, *dev));
}

/* Tensorwide float8 scaling needs compute capability 8.9 or later (the documentation's
 * "Scaling Mode Support Overview": 8.9+): Ada (8.9), Hopper (9.0), Blackwell (10.x, 12.x).
 * Ampere (8.0, 8.6) has no float8 tensor cores. */
bool gemm_fp8_supported(char *why, size_t len) {
    int dev = 0, major = 0, minor = 0;
    compute_capability(&dev, &major, &minor);
    bool ok = major > 8 || (major == 8 && minor >= 9);
    if (why && len) {
        if (ok) why[0] = '\0';
        else snprintf(why, len, "GPU %d has compute capability %d.%d; cuBLASLt's float8 GEMM "
                      "needs 8.9 (Ada) or 9.0 and later (Hopper, Blackwell)", dev, major, minor);
    }
    return ok;
}

/* The handle and the block, once. Workspace sizes are the documentation's recommendations
 * (cublasSetWorkspace()): 32 MiB on Hopper and Blackwell, 4 MiB on other GPUs. */
static void gemm_fp8_init(void) {
    if (g_lt) return;
    char why[192];
    if (!gemm_fp8_supported(why, sizeof why)) {
        fprintf(stderr, "gemm_fp8: %s (ask gemm_fp8_supported first)\n", why);
        abort();
    }
    int dev = 0, major = 0, minor = 0;
    compute_capability(&dev, &major, &minor);
    g_workspace_bytes = (size_t)(major >= 9 ? 32 : 4) << 20;
    /* [scale_first | scale_second | workspace], each at a 256-byte boundary: a device pointer
     * that cuBLASLt reads is given the alignment cudaMalloc's blocks have (two floats side by
     * side would leave the second 4-byte aligned). */
    char *block = (char *)device_alloc(2 * SCALE_SLOT + g_workspace_bytes, MEM_BUFFERS);
    g_scales = (float *)block;
    g_workspace = block + 2 * SCALE_SLOT;
    CUBLAS_CHECK(cublasLtCreate(&g_lt));
}

/* The two dequantization scales, written by the GPU in stream order. A kernel's arguments are
 * copied at launch, so unlike a host-to-device copy from a stack variable this needs no host
 * buffer to outlive the call, and the previous GEMM, earlier on the stream, has read the old
 * values before these land. */
static __global__ void set_scales_kernel(float *scales, float first, float second) {
    scales[0] = first;
    scales[SCALE_SLOT / sizeof(float)] = second;
}

static cudaDataType_t cuda_fp8_type(float8_format fmt) {
    return fmt == FLOAT8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

/* A cuBLASLt layout for an operand that enters as op(X) with op(X) [rows_op, cols_op]: stored
 * column-major it is [rows_op, cols_op] when not transposed, [cols_op, rows_op] when it is. */
static cublasLtMatrixLayout_t operand_layout(cudaDataType_t type, char trans, int rows_op,
                                             int cols_op, int ld) {
    cublasLtMatrixLayout_t layout = NULL;
    bool t = trans == 'T';
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, (uint64_t)(t ? cols_op : rows_op),
                                            (uint64_t)(t ? rows_op : cols_op), ld));
    return layout;
}

static cublasOperation_t to_op(char t) { return t == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N; }

/* One shape's descriptors and algorithm, made at its first call and kept (see the top). */
typedef struct {
    int M, N, K;
    float8_format fa, fb;
    bool rowwise;                      /* per-row scale vectors (gemm_fp8_rowwise)              */
    bool found;                        /* cuBLASLt offered an algorithm (rowwise may have none) */
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} fp8_plan;
static fp8_plan *g_plans = NULL;
static int g_nplans = 0, g_capplans = 0;
/* The matmul descriptors: fp32, TN; tensorwise, its two scale pointers set once (g_scales);
 * rowwise, per-row scale vectors (OUTER_VEC), their pointers set at each call. */
static cublasLtMatmulDesc_t g_desc = NULL, g_desc_rowwise = NULL;

static cublasLtMatmulDesc_t make_desc(bool rowwise) {
    cublasLtMatmulDesc_t d = NULL;
    gemm_args g = gemm_args_from_row_major(false, true, 1, 16, 16, 0, 0, 0);   /* transposes only */
    cublasOperation_t opa = to_op(g.transa), opb = to_op(g.transb);
    int8_t fast_accum = 0;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum));
    if (rowwise) {
        int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
    } else {
        const float *scale_first = g_scales, *scale_second = g_scales + SCALE_SLOT / sizeof(float);
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                    &scale_first, sizeof scale_first));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                    &scale_second, sizeof scale_second));
    }
    return d;
}

/* The descriptors and algorithm of C[M, N] = A[M, K] B[N, K]^T: from the table, or made now.
 * A shape cuBLASLt offers no algorithm for: tensorwise, one line and exit (the rules checked
 * before promise one); rowwise, remembered as such (found = false), and the caller emulates. */
static const fp8_plan *plan_for(int M, int N, int K, float8_format fa, float8_format fb, bool rowwise) {
    for (int i = 0; i < g_nplans; i++) {
        const fp8_plan *p = &g_plans[i];
        if (p->M == M && p->N == N && p->K == K && p->fa == fa && p->fb == fb && p->rowwise == rowwise) return p;
    }
    if (!g_desc) g_desc = make_desc(false);
    if (!g_desc_rowwise) g_desc_rowwise = make_desc(true);
    if (g_nplans == g_capplans) {
        g_capplans = g_capplans ? 2 * g_capplans : 16;
        g_plans = (fp8_plan *)realloc(g_plans, (size_t)g_capplans * sizeof *g_plans);
        if (!g_plans) { fprintf(stderr, "gemm_fp8: out of host memory\n"); exit(1); }
    }
    fp8_plan *p = &g_plans[g_nplans];
    *p = (fp8_plan){M, N, K, fa, fb, rowwise, true, NULL, NULL, NULL, {}};
    /* C = A B^T, row-major -> (first = B, 'T'; second = A, 'N'; m = N, n = M, k = K).
     * cuBLASLt's A: op(A) [m, k]; its B: op(B) [k, n]; C and D: [m, n], the same layout. */
    gemm_args g = gemm_args_from_row_major(false, true, M, N, K, 0, 0, 0);
    p->la = operand_layout(cuda_fp8_type(fb), g.transa, g.m, g.k, g.lda);
    p->lb = operand_layout(cuda_fp8_type(fa), g.transb, g.k, g.n, g.ldb);
    p->lc = operand_layout(CUDA_R_32F, 'N', g.m, g.n, g.ldc);

    cublasLtMatmulPreference_t pref = NULL;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t max_workspace = g_workspace_bytes;   /* the attribute is a uint64_t */
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &max_workspace, sizeof max_workspace));
    cublasLtMatmulHeuristicResult_t heuristic = {};
    int found = 0;
    /* No algorithm comes back either as a status (NOT_SUPPORTED) or as found = 0; either way
     * the line names the call, as CUBLAS_CHECK would not. */
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g_lt, rowwise ? g_desc_rowwise : g_desc, p->la, p->lb, p->lc,
                                                       p->lc, pref, 1, &heuristic, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if ((st != CUBLAS_STATUS_SUCCESS || found == 0) && rowwise) {
        p->found = false;
        g_nplans++;
        return p;
    }
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
        fprintf(stderr, "gemm_fp8: cuBLASLt offers no float8 algorithm for M = %d, N = %d, K = %d "
                "(%s x %s): %s\n", M, N, K, fa == FLOAT8_E4M3 ? "E4M3" : "E5M2",
                fb == FLOAT8_E4M3 ? "E4M3" : "E5M2",
                st != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(st) : "none found");
        exit(1);
    }
    p->algo = heuristic.algo;
    g_nplans++;
    return p;
}

void gemm_fp8(float *C, const uint8_t *A, float8_format fa, float a_scale, const uint8_t *B,
              float8_format fb, float b_scale, int M, int N, int K) {
    gemm_fp8_check(C, A, fa, B, fb, M, N, K);
    gemm_fp8_init();
    cudaStream_t stream = cuda_stream();
    const fp8_plan *p = plan_for(M, N, K, fa, fb, false);

    /* cuBLASLt's first operand is our B, its second our A (see the top): their dequantization
     * scales in that order. */
    set_scales_kernel<<<1, 1, 0, stream>>>(g_scales, 1.0f / b_scale, 1.0f / a_scale);
    CUDA_CHECK_LAUNCH();

    /* D = alpha scale_A scale_B op(A) op(B) with beta = 0; D is C, in place (C == D with one
     * layout, the form the documentation allows), so C is simply overwritten. */
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(g_lt, g_desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc,
                                &p->algo, g_workspace, g_workspace_bytes, stream));
}

/* ---- rowwise: per-row scale vectors (gemm_fp8.h) ---- */

/* cuBLASLt's per-row scales on Hopper and later with cuBLAS 12.9 or newer (the version that
 * brought CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F). */
bool gemm_fp8_rowwise_native(void) {
    int dev = 0, major = 0, minor = 0;
    compute_capability(&dev, &major, &minor);
    return major >= 9 && cublasLtGetVersion() >= 120900;
}

/* 1 / s of each scale: cuBLASLt's vectors dequantize (they multiply), ours were multiplied in.
 * The rowwise recipe's scales are powers of two, whose reciprocals are exact. */
static __global__ void reciprocals_kernel(float *inv, const float *s, int n) {
    GRID_STRIDE_LOOP(i, n) inv[i] = 1.0f / s[i];
}

bool gemm_fp8_rowwise(float *C, const uint8_t *A, float8_format fa, const float *a_scales, const uint8_t *B,
                      float8_format fb, const float *b_scales, int M, int N, int K) {
    gemm_fp8_check(C, A, fa, B, fb, M, N, K);
    if (!gemm_fp8_rowwise_native()) return false;
    gemm_fp8_init();
    if (!g_desc_rowwise) g_desc_rowwise = make_desc(true);
    cudaStream_t stream = cuda_stream();
    /* cuBLASLt's first operand is our B (its m = N rows: b's scales), its second our A (n = M);
     * the two vectors in one block, the second at a 256-byte boundary. */
    size_t second_at = ((size_t)N * sizeof(float) + SCALE_SLOT - 1) / SCALE_SLOT * SCALE_SLOT;
    char *inv = (char *)device_alloc(second_at + (size_t)M * sizeof(float), MEM_BUFFERS);
    float *inv_first = (float *)inv, *inv_second = (float *)(inv + second_at);
    /* The pointers go into the descriptor BEFORE plan_for asks for an algorithm: cuBLASLt's
     * heuristic refuses a vector scale mode whose pointers are unset (NOT_SUPPORTED), which
     * on an H100 sent every rowwise GEMM to the emulation (make gpu-check, 2026-11-28). */
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g_desc_rowwise, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                &inv_first, sizeof inv_first));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g_desc_rowwise, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                &inv_second, sizeof inv_second));
    const fp8_plan *p = plan_for(M, N, K, fa, fb, true);
    if (!p->found) { device_free(inv); return false; }
    reciprocals_kernel<<<cuda_blocks(N), CUDA_THREADS, 0, stream>>>(inv_first, b_scales, N);
    CUDA_CHECK_LAUNCH();
    reciprocals_kernel<<<cuda_blocks(M), CUDA_THREADS, 0, stream>>>(inv_second, a_scales, M);
    CUDA_CHECK_LAUNCH();
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(g_lt, g_desc_rowwise, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc,
                                &p->algo, g_workspace, g_workspace_bytes, stream));
    device_free(inv);   /* (stream-ordered: the GEMM has read it before a later kernel reuses it) */
    return true;
}
