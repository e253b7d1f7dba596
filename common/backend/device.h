/* device.h: device memory, copies and the allocator's accounting.
 *
 * Every chapter allocates through device_alloc() with a category, so that the
 * memory table a chapter prints (parameters, gradients, optimizer state,
 * activations, buffers) is measured, not estimated.
 *
 * CPU backend (device_cpu.c):   "device" memory is host memory (aligned_alloc + memset).
 * CUDA backend (device_cuda.cu): cudaMalloc / cudaMemcpy on the rank's GPU.
 * Both report to the same host-side bookkeeping (memory.c) and reuse freed blocks through its
 * cache, so a training step after the first allocates nothing new.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "cdefs.h"
#include "dtype.h"

C_BEGIN

typedef enum {
    MEM_PARAMS = 0,      /* model weights (the rank's shard of them)            */
    MEM_GRADS,           /* their gradients                                      */
    MEM_OPTIM,           /* optimizer state (AdamW m and v)                      */
    MEM_ACTIVATIONS,     /* tensors saved in forward for use in backward         */
    MEM_BUFFERS,         /* scratch: communication buffers, temporaries          */
    MEM_NCATEGORIES
} mem_category;

/* Bind this rank to its device. CPU: one BLAS thread per rank. CUDA: cudaSetDevice(local_rank % ndev). */
void device_init(int local_rank);
void device_shutdown(void);
const char *device_backend_name(void);          /* "cpu" or "cuda" */
/* The name of this rank's device, the same for the ranks of a node that share it and different
 * for those that do not: CUDA, its PCI bus id ("0000:1B:00.0", cudaDeviceGetPCIBusId); CPU,
 * "host" (every rank of a node shares the host's memory). comm_init compares the names of a
 * node's ranks to choose the collectives and to know how many ranks share this device. */
void device_identity(char *name, size_t size);
/* The device's datasheet peak in FLOP/s for GEMMs of `t` operands (dense, no sparsity; fp32
 * without TF32, as cublasSgemm runs here), and its name in `name`: CUDA, for the GPUs whose
 * datasheets the table in device_cuda.cu holds (H100, H200, A100), else 0; CPU, 0 (no datasheet:
 * chapter 08 measures a GEMM probe instead). */
double device_peak_flops(dtype t, char *name, size_t size);
/* Bytes this rank can still allocate: the device's free memory (CPU: the host's MemAvailable;
 * CUDA: cudaMemGetInfo) divided among the `ranks_sharing` ranks that use the same device
 * (comm_device_sharers). 0 when unknown. */
double device_memory_available(int ranks_sharing);

/* Zero-initialised allocation counted under `cat`; device_free() un-counts it. */
void *device_alloc(size_t bytes, mem_category cat);
float *device_alloc_floats(size_t n, mem_category cat);
/* n elements of type t (dtype.h): n x dtype_size(t) bytes. */
static inline void *device_alloc_elems(size_t n, dtype t, mem_category cat) { return device_alloc(n * dtype_size(t), cat); }
int *device_alloc_ints(size_t n, mem_category cat);
/* The same without the zeroing, for a buffer the caller writes whole before anything reads it
 * (a GEMM operand's rounded copy: linear.c's and attention's operand_in). Its bytes are whatever
 * the block held. */
void *device_alloc_overwritten(size_t bytes, mem_category cat);
void device_free(void *p);

void device_copy_to_device(void *dst, const void *src_host, size_t bytes);
void device_copy_to_host(void *dst_host, const void *src, size_t bytes);
void device_copy(void *dst, const void *src, size_t bytes);  /* device to device; may overlap */
/* `rows` rows of `width` bytes, device to device: row r from src + r * src_pitch to
 * dst + r * dst_pitch (pitches >= width; the two regions must not overlap). One strided copy
 * where a loop would issue `rows` (cudaMemcpy2DAsync on the compute stream): FSDP's copy of a
 * unit between the layout its collective moves and the one its tensors are used in (04). */
void device_copy_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width, size_t rows);
void device_zero(void *p, size_t bytes);
void device_synchronize(void);

/* ---- timing what the device does ----
 * On the GPU the host does not wait for the work it queues, so the host's clock tells when work
 * was queued, not when it ran (a pipeline action's kernels may run long after the host moved on).
 * A mark is a moment of the compute stream: the point where everything queued before it has run.
 *   CPU:  the host's clock when device_mark_now() is called (a CPU kernel has run when its call
 *         returns), so marks cost nothing and read exactly as wall_seconds() would.
 *   CUDA: a timing event recorded on the compute stream; no wait.
 * device_mark_seconds() gives the mark's moment on the host's clock (CLOCK_MONOTONIC, the clock of
 * wall_seconds(): marks of the ranks of one node compare), waiting for the GPU to get there
 * (CUDA: the event's time after a reference event whose host time was read at a
 * synchronisation). device_mark_release() gives a mark's event back for later marks. */
typedef struct { double host; void *event; } device_mark;
device_mark device_mark_now(void);
double device_mark_seconds(device_mark *m);
void device_mark_release(device_mark *m);

/* ---- accounting (memory.c, shared by both backends) ---- */
void mem_track_alloc(const void *p, size_t bytes, mem_category cat);
size_t mem_track_free(const void *p);         /* returns the bytes p had */
/* The cache of freed blocks (memory.c): device_free keeps a block, device_alloc of exactly its
 * size takes it back; device_shutdown releases what is kept. */
void *mem_cache_take(size_t bytes);           /* a kept block of exactly `bytes`, or NULL      */
bool mem_cache_keep(void *p, size_t bytes);   /* false: the cache is full, release p yourself  */
void *mem_cache_drain(void);                  /* one kept block taken out, NULL when none left */
size_t mem_cache_bytes(void);                 /* bytes kept, not live                          */
size_t mem_cache_misses(void);                /* allocations no kept block served: new memory  */
size_t mem_current(mem_category cat);
size_t mem_current_total(void);
size_t mem_peak_total(void);
size_t mem_largest_alloc(mem_category cat);   /* the largest single live-or-past allocation */
size_t mem_allocation_bytes(const void *p);  /* bytes of the live allocation p (0 if unknown) */
void mem_reset_peaks(void);                  /* peak total := current total; largest allocations forgotten */
/* The peaks above and the marks' peaks, saved and put back around work that is not this rank's
 * own: the --check baseline's step on rank 0, whose transient buffers (mixed precision's bf16
 * copies) would otherwise count as the parallel run's largest allocation and peak. */
typedef struct { size_t largest[MEM_NCATEGORIES], mark_peak[MEM_NCATEGORIES], peak_total; } mem_peaks;
mem_peaks mem_peaks_save(void);
void mem_peaks_restore(const mem_peaks *saved);
/* A second high-water mark, for measuring one operation's working set without disturbing the
 * peaks above: mem_mark returns the category's current bytes and restarts the mark there;
 * mem_mark_peak is the most the category held since. Working set = mem_mark_peak - mem_mark. */
size_t mem_mark(mem_category cat);
size_t mem_mark_peak(mem_category cat);
/* An allocation of `bytes` under `cat` failed although the memory check before step 1 passed
 * (run.h): another process took memory (on a GPU, another rank sharing it), or a limit (ulimit -v)
 * is below what the device reports. The sizes are the user's: one line, exit status 2. Both
 * backends' device_alloc call it. */
void mem_out_of_memory(size_t bytes, mem_category cat) __attribute__((noreturn));

C_END
