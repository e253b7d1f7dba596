/* cuda_common.h: what the CUDA twins in common/ share (internal to common/, .cu files only).
 *
 * One rank drives one GPU through one CUDA stream (the compute stream) and one cuBLAS handle, both
 * created by device_init() in device_cuda.cu. Every kernel launch, cuBLAS call, memset and copy of
 * the rank goes onto that one stream, so they run in the order the host issued them, exactly like
 * the CPU backend's straight-line code. The host waits only where it needs a value (a loss, a copy
 * to host).
 * The collectives under COMM=nccl (comm_nccl.cu) run on a stream per process group, tied to this
 * one by events: each waits for the kernels issued before it, and the compute stream waits for
 * its result where the program uses it (at once for a blocking call, at comm_wait otherwise), so a
 * transfer can run beside the kernels issued in between.
 *
 * The stream is created as a *blocking* stream: it also synchronises with the legacy default
 * stream, so a stray launch on stream 0 still runs in program order instead of racing.
 *
 * Error handling: every CUDA, cuBLAS and NCCL call is wrapped in a CHECK macro that prints
 * file:line and the library's error string and exits with status 1. Kernel launches return no
 * status, so CUDA_CHECK_LAUNCH() asks for the launch error right after each one.
 */
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <nccl.h>

#define CUDA_CHECK(call) do {                                                           \
    cudaError_t err_ = (call);                                                          \
    if (err_ != cudaSuccess) {                                                          \
        fprintf(stderr, "%s:%d: CUDA error %s: %s\n", __FILE__, __LINE__,               \
                cudaGetErrorName(err_), cudaGetErrorString(err_));                      \
        exit(1);                                                                        \
    }                                                                                   \
} while (0)

#define CUBLAS_CHECK(call) do {                                                         \
    cublasStatus_t st_ = (call);                                                        \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                 \
        fprintf(stderr, "%s:%d: cuBLAS error %s: %s\n", __FILE__, __LINE__,             \
                cublasGetStatusName(st_), cublasGetStatusString(st_));                  \
        exit(1);                                                                        \
    }                                                                                   \
} while (0)

#define NCCL_CHECK(call) do {                                                           \
    ncclResult_t r_ = (call);                                                           \
    if (r_ != ncclSuccess) {                                                            \
        fprintf(stderr, "%s:%d: NCCL error %d: %s\n", __FILE__, __LINE__,               \
                (int)r_, ncclGetErrorString(r_));                                       \
        exit(1);                                                                        \
    }                                                                                   \
} while (0)

/* After every <<<...>>> launch: a bad grid or block size is reported here, at its line. */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

/* The rank's stream and cuBLAS handle (device_cuda.cu). Valid after device_init(). */
cudaStream_t cuda_stream(void);
cublasHandle_t cuda_cublas(void);
/* A timing event's moment on the host's clock (CLOCK_MONOTONIC), once the GPU has reached it
 * (waits for it): device_cuda.cu's reference event plus the GPU's time since (device.h, marks). */
double cuda_event_host_seconds(cudaEvent_t e);

/* Launch geometry for element-wise kernels: CUDA_THREADS threads per block and enough blocks
 * to give every element its own thread, capped so the grid stays within limits; kernels use a
 * grid-stride loop, so a capped grid still covers all n elements. Call only with n > 0
 * (a grid of zero blocks is a launch error, so callers return early on n == 0). */
#define CUDA_THREADS 256
static inline unsigned cuda_blocks(size_t n) {
    size_t blocks = (n + CUDA_THREADS - 1) / CUDA_THREADS;
    const size_t max_blocks = 65535u * 8u;   /* plenty to fill any GPU; the loop does the rest */
    return (unsigned)(blocks < max_blocks ? blocks : max_blocks);
}

/* The loop of every element-wise kernel: thread t of the grid takes elements t, t + the grid's
 * size, ... (a grid from cuda_blocks may be smaller than n). */
#define GRID_STRIDE_LOOP(i, n)                                                   \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)(n); \
         i += (size_t)gridDim.x * blockDim.x)

/* Column reductions of a row-major [rows, cols] matrix (a norm weight's gradient, an amax per
 * column): one block per 32 columns, COL_REDUCE_ROWS threads down each column, each walking
 * every COL_REDUCE_ROWS-th row, then one thread per column combines the COL_REDUCE_ROWS partial
 * results from shared memory in a fixed order. A warp reads 32 neighbouring columns of one row
 * (coalesced), the block keeps 512 threads busy where one thread per column would leave most of
 * the GPU idle (4096 columns: 16 blocks of 256), and the order of the additions is the same on
 * every run (no atomics). cub::BlockReduce reduces a whole block to one value: here each of the
 * 32 columns needs its own. */
#define COL_REDUCE_COLS 32
#define COL_REDUCE_ROWS 16
static inline dim3 col_reduce_grid(int cols) { return dim3((unsigned)((cols + COL_REDUCE_COLS - 1) / COL_REDUCE_COLS)); }
static inline dim3 col_reduce_block(void) { return dim3(COL_REDUCE_COLS, COL_REDUCE_ROWS); }
