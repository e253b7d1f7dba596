/* device_cuda.cu: the CUDA twin of device_cpu.c (see device.h).
 *
 * "Device memory" is GPU memory from the device's stream-ordered pool (cudaMallocAsync). The rank owns one GPU, one CUDA stream and one
 * cuBLAS handle (cuda_common.h explains why one stream is enough). Allocations are reported to
 * the same host-side bookkeeping as on CPU (memory.c), so the memory tables a chapter prints
 * mean the same thing on both backends.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
/* Only the C API of MPI is used; skip the (deprecated) C++ bindings nvcc would otherwise see. */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include "device.h"
#include "cuda_common.h"

static cudaStream_t g_stream = NULL;      /* the one stream everything goes onto  */
static cudaEvent_t g_origin = NULL;       /* device marks' reference (device_mark_seconds)  */
static double g_origin_host = 0;          /* ... and its moment on the host's clock          */
static cudaEvent_t *g_free_marks = NULL;  /* marks' events given back, for the next marks    */
static int g_nfree_marks = 0, g_capfree_marks = 0;
static cublasHandle_t g_cublas = NULL;    /* the one cuBLAS handle, bound to it   */

cudaStream_t cuda_stream(void) { return g_stream; }
cublasHandle_t cuda_cublas(void) { return g_cublas; }

/* The oldest Linux driver that runs a CUDA runtime of this major version (NVIDIA's CUDA
 * compatibility table; 0 where this file does not know it). Within a major version a newer
 * runtime runs on the major's first driver (minor version compatibility), so the major is what
 * must match. */
static int min_driver_for(int cuda_major) {
    switch (cuda_major) {
    case 13: return 580;
    case 12: return 525;
    case 11: return 450;
    default: return 0;
    }
}

/* Can this rank run CUDA at all? Without the check, a missing or too old driver shows up as
 * "CUDA driver version is insufficient for CUDA runtime version" from the first CUDA call, which
 * names neither version nor what to install. A machine that cannot run this build is refused
 * like a bad flag: one line, and every rank exits with status 2. Each rank checks its own node
 * (its driver, the GPUs it may see) and the ranks agree, so that all exit together: a rank whose
 * node is fine would otherwise wait for the others in NCCL's set-up until the watchdog fired.
 * The lowest failing rank prints the line. Returns the number of GPUs this rank sees. */
static int check_cuda_usable(void) {
    char why[320] = "";
    int driver = 0, runtime = 0, ndev = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;    /* 0 also means "no driver" */
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
    int need_major = runtime / 1000, need_driver = min_driver_for(need_major);
    char need[64];
    if (need_driver > 0) snprintf(need, sizeof need, "driver >= %d", need_driver);
    else snprintf(need, sizeof need, "a driver for CUDA %d", need_major);
    if (driver == 0) {
        snprintf(why, sizeof why, "no NVIDIA driver found (this build needs CUDA %d.0: %s); "
                 "build with BACKEND=cpu to run on the CPU", need_major, need);
    } else if (driver / 1000 < need_major) {
        snprintf(why, sizeof why, "the NVIDIA driver supports CUDA %d.%d, this build needs %d.0: "
                 "install %s or build with BACKEND=cpu", driver / 1000, driver % 1000 / 10,
                 need_major, need);
    } else {
        cudaError_t err = cudaGetDeviceCount(&ndev);
        if (err != cudaSuccess || ndev <= 0)   /* a driver but no GPU this process may use */
            snprintf(why, sizeof why, "the NVIDIA driver (CUDA %d.%d) found no usable GPU (%s); "
                     "build with BACKEND=cpu to run on the CPU", driver / 1000, driver % 1000 / 10,
                     err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    }
    int rank = 0, mine = INT_MAX, first = INT_MAX;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (why[0]) mine = rank;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == INT_MAX) return ndev;
    if (rank == first) {
        fprintf(stderr, "error: %s\n", why);
        fflush(stderr);
    }
    MPI_Finalize();
    exit(2);
}

static double host_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Settings of the CUDA driver that must be made before its first call, unless the user made them:
 *   CUDA_MODULE_LOADING=EAGER: every kernel is loaded when the context is created. CUDA's default
 *     (LAZY) loads a kernel at its first launch, which waits for the GPU to be idle: inside a step,
 *     with a collective's kernel waiting for a peer, that first launch could wait for it. Not under
 *     COMM=mpi, where no kernel ever waits for a peer (the collectives are staged through the
 *     host): loading every kernel, cuBLAS's included, costs each process 2.4 to 2.8 s at start
 *     (an H100, 2026-11-28: a small --check run on 1 rank 4.19 s EAGER, 1.75 s LAZY; one on 2
 *     ranks 5.62 s and 2.85 s; the root README's "Measured on a GPU").
 *   CUDA_DEVICE_MAX_CONNECTIONS=32: the hardware queues streams are spread over (8 by default).
 *     A rank has the compute stream and one per NCCL communicator (up to a dozen here); with
 *     fewer queues than streams two streams share one, and a collective's kernel waiting for its
 *     peer holds up the other stream's work queued behind it: the links' separate queues
 *     (comm.h, "Ordering") would be coupled again in hardware. */
static void set_default(const char *name, const char *value) {
    const char *v = getenv(name);
    if (!v || !*v) setenv(name, value, 1);
}

/* Bind this rank to GPU (local_rank % number of GPUs it sees): with 8 ranks on a node of 8 GPUs
 * each rank gets its own; with a launcher that shows each rank only its GPU, that GPU (device 0);
 * with more ranks than GPUs they share round-robin (slow, but it runs: COMM=mpi).
 * Then create the stream and the cuBLAS handle that every other .cu file uses, and make the
 * device's memory pool keep what is freed (see device_alloc). */
void device_init(int local_rank) {
    const char *comm = getenv("COMM");
    if (!comm || strcmp(comm, "mpi") != 0) set_default("CUDA_MODULE_LOADING", "EAGER");
    set_default("CUDA_DEVICE_MAX_CONNECTIONS", "32");
    int ndev = check_cuda_usable();   /* exits 2 on every rank if some rank cannot run CUDA */
    int dev = local_rank % ndev;
    CUDA_CHECK(cudaSetDevice(dev));
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t keep_all = UINT64_MAX;   /* never give freed memory back to the driver before exit */
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
    CUDA_CHECK(cudaStreamCreate(&g_stream));
    /* The marks' reference: an event the GPU reaches at once (nothing is queued yet), and the
     * host's clock read right after it has. */
    CUDA_CHECK(cudaEventCreate(&g_origin));
    CUDA_CHECK(cudaEventRecord(g_origin, g_stream));
    CUDA_CHECK(cudaEventSynchronize(g_origin));
    g_origin_host = host_seconds();
    CUBLAS_CHECK(cublasCreate(&g_cublas));
    CUBLAS_CHECK(cublasSetStream(g_cublas, g_stream));
    /* Plain fp32 GEMMs: no TF32 tensor-core shortcut, so a GEMM agrees with OpenBLAS to fp32
     * rounding and the parity tolerances (1e-5 on the loss) hold on both backends. */
    CUBLAS_CHECK(cublasSetMathMode(g_cublas, CUBLAS_DEFAULT_MATH));
}

/* Release the kept blocks, the handle and the stream after the queued work has finished. */
void device_shutdown(void) {
    for (void *p = mem_cache_drain(); p != NULL; p = mem_cache_drain()) CUDA_CHECK(cudaFreeAsync(p, g_stream));
    if (g_stream) CUDA_CHECK(cudaStreamSynchronize(g_stream));
    while (g_nfree_marks > 0) CUDA_CHECK(cudaEventDestroy(g_free_marks[--g_nfree_marks]));
    if (g_origin) CUDA_CHECK(cudaEventDestroy(g_origin));
    g_origin = NULL;
    if (g_cublas) CUBLAS_CHECK(cublasDestroy(g_cublas));
    if (g_stream) CUDA_CHECK(cudaStreamDestroy(g_stream));
    g_cublas = NULL;
    g_stream = NULL;
}

const char *device_backend_name(void) { return "cuda"; }

/* Dense peaks from NVIDIA's datasheets, TFLOP/s: bf16 tensor cores and fp32 CUDA cores (SXM
 * parts; the PCIe ones are lower: pass --peak-tflops there). */
double device_peak_flops(dtype t, char *name, size_t size) {
    static const struct { const char *model; double bf16, fp32; } sheet[] = {
        {"H200", 989.4, 66.9}, {"H100", 989.4, 66.9}, {"A100", 312.0, 19.5}};
    int dev = 0;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    snprintf(name, size, "%s", prop.name);
    for (size_t i = 0; i < sizeof sheet / sizeof sheet[0]; i++)
        if (strstr(prop.name, sheet[i].model)) return 1e12 * (t == DTYPE_BF16 ? sheet[i].bf16 : sheet[i].fp32);
    return 0;
}

/* The PCI bus id names a GPU whatever each rank may see of the node: with per-rank
 * CUDA_VISIBLE_DEVICES (SLURM, some launchers) every rank's GPU is its device 0, yet the ids of
 * two ranks on different GPUs differ. */
void device_identity(char *name, size_t size) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetPCIBusId(name, (int)size, dev));
}

/* The GPU's free memory, shared by the ranks on it (comm_device_sharers counted them by bus id:
 * 8 ranks on 8 GPUs have a whole GPU each, 4 ranks on 1 GPU a quarter). */
double device_memory_available(int ranks_sharing) {
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return 0;
    return (double)free_bytes / (ranks_sharing > 0 ? ranks_sharing : 1);
}

/* `bytes` of GPU memory, counted under `cat`: a block the cache kept (memory.c), else a
 * new one, stream-ordered from the device's pool (cudaMallocAsync). cudaMalloc and cudaFree may
 * synchronise the whole device, and a synchronisation while a collective's kernel waits for a
 * peer that waits for this rank's next kernel never ends (the reason PyTorch has a caching
 * allocator); the pool's allocations are ordered on the stream instead, and with its release
 * threshold at the maximum (device_init) what is freed stays in the pool for the next
 * allocation. */
void *device_alloc_overwritten(size_t bytes, mem_category cat) {
    void *p = mem_cache_take(bytes);
    if (!p) {
        cudaError_t err = cudaMallocAsync(&p, bytes > 0 ? bytes : 1, g_stream);   /* like calloc: valid for 0 */
        if (err == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();   /* clear it */
            mem_out_of_memory(bytes, cat);
        }
        CUDA_CHECK(err);
        /* cuBLASLt's workspace and the kernels' scratch layouts (float8_cuda.cu, gemm_fp8_cuda.cu)
         * take a block's start to be 256-byte aligned, as cudaMalloc's is */
        if ((uintptr_t)p % 256 != 0) {
            fprintf(stderr, "device_alloc: the memory pool returned %p, not 256-byte aligned\n", p);
            exit(1);
        }
    }
    mem_track_alloc(p, bytes, cat);
    return p;
}
/* ... zeroed: the memset is queued on the stream, so any kernel issued afterwards sees zeros. */
void *device_alloc(size_t bytes, mem_category cat) {
    void *p = device_alloc_overwritten(bytes, cat);
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, g_stream));
    return p;
}

float *device_alloc_floats(size_t n, mem_category cat) {
    return (float *)device_alloc(n * sizeof(float), cat);
}

int *device_alloc_ints(size_t n, mem_category cat) {
    return (int *)device_alloc(n * sizeof(int), cat);
}

/* Un-count p and keep it for the next allocation of its size; when the cache is full, given back
 * to the pool, ordered on the stream (cudaFreeAsync: no synchronisation; the pool keeps it).
 * Reuse is safe without a wait because everything that touches device memory is ordered on
 * g_stream: kernels and copies run on it, and a collective on NCCL's stream is joined into it by
 * comm_wait, which every request gets before its buffers are freed (comm.h). */
void device_free(void *p) {
    if (!p) return;
    size_t bytes = mem_track_free(p);
    if (!mem_cache_keep(p, bytes)) CUDA_CHECK(cudaFreeAsync(p, g_stream));
}

/* Host -> GPU. Synchronous from the caller's point of view: when it returns, the host buffer
 * may be reused or freed (the CPU twin's memcpy has the same contract). */
void device_copy_to_device(void *dst, const void *src_host, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, g_stream));
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
}

/* GPU -> host. Waits for the kernels that produce `src` (they are earlier on the stream) and
 * for the copy itself, because the caller reads dst_host right after. */
void device_copy_to_host(void *dst_host, const void *src, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, g_stream));
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
}

/* GPU -> GPU. No wait: the host never looks at either buffer, and later work on the stream
 * runs after the copy.
 * The CPU twin is memmove, which allows dst and src to overlap; cudaMemcpy does not. So an
 * overlapping copy goes through a temporary buffer (stream-ordered malloc/free: it exists only
 * between the two copies and is not counted in the memory tables). */
void device_copy(void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    const char *d = (const char *)dst, *s = (const char *)src;
    bool overlap = d < s + bytes && s < d + bytes;
    if (!overlap) {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_stream));
        return;
    }
    void *tmp = NULL;
    CUDA_CHECK(cudaMallocAsync(&tmp, bytes, g_stream));
    CUDA_CHECK(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, g_stream));
    CUDA_CHECK(cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, g_stream));
    CUDA_CHECK(cudaFreeAsync(tmp, g_stream));
}

/* GPU -> GPU, `rows` rows of `width` bytes at their pitches, in one strided copy on the stream
 * (no wait, as device_copy). The regions must not overlap (device.h), so no temporary. */
void device_copy_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width, size_t rows) {
    if (width == 0 || rows == 0) return;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice, g_stream));
}

void device_zero(void *p, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, g_stream));
}

/* Wait for everything queued so far (used before reading clocks and at the end of a step). */
void device_synchronize(void) {
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
}

/* ---- marks: timing events on the stream, kept on a free list (device.h) ---- */


device_mark device_mark_now(void) {
    cudaEvent_t e;
    if (g_nfree_marks > 0) e = g_free_marks[--g_nfree_marks];
    else CUDA_CHECK(cudaEventCreate(&e));
    CUDA_CHECK(cudaEventRecord(e, g_stream));
    return (device_mark){-1.0, (void *)e};
}

/* The event's moment: the reference's host time plus the GPU's time from the reference to it.
 * (Read once, then kept in the mark.) */
double cuda_event_host_seconds(cudaEvent_t e) {
    float ms = 0.0f;
    CUDA_CHECK(cudaEventSynchronize(e));
    CUDA_CHECK(cudaEventElapsedTime(&ms, g_origin, e));
    return g_origin_host + ms / 1000.0;
}

double device_mark_seconds(device_mark *m) {
    if (m->event && m->host < 0) m->host = cuda_event_host_seconds((cudaEvent_t)m->event);
    return m->host;
}

void device_mark_release(device_mark *m) {
    if (!m->event) return;
    if (g_nfree_marks == g_capfree_marks) {
        g_capfree_marks = g_capfree_marks ? 2 * g_capfree_marks : 64;
        g_free_marks = (cudaEvent_t *)realloc(g_free_marks, (size_t)g_capfree_marks * sizeof *g_free_marks);
        if (!g_free_marks) { fprintf(stderr, "device: out of host memory\n"); exit(1); }
    }
    g_free_marks[g_nfree_marks++] = (cudaEvent_t)m->event;
    m->event = NULL;
}
