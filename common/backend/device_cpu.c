/* device_cpu.c: the CPU backend's "device" is the host. One BLAS thread per rank, and one OpenMP
 * thread for oneDNN (the bf16 GEMMs, gemm_cpu.c): the MPI ranks are the parallelism, and several
 * threads per rank would fight over the cores. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "device.h"

void device_init(int local_rank) {
    (void)local_rank;
    openblas_set_num_threads(1);
    omp_set_num_threads(1);
}
/* Release the blocks the allocator's cache kept (memory.c). */
void device_shutdown(void) {
    for (void *p = mem_cache_drain(); p != NULL; p = mem_cache_drain()) free(p);
}
const char *device_backend_name(void) { return "cpu"; }

double device_peak_flops(dtype t, char *name, size_t size) {
    (void)t;
    snprintf(name, size, "cpu");
    return 0;
}
void device_identity(char *name, size_t size) { snprintf(name, size, "host"); }

double device_memory_available(int ranks_sharing) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    double kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
    fclose(f);
    return kib * 1024.0 / (ranks_sharing > 0 ? ranks_sharing : 1);
}

/* `bytes` counted under `cat`: a block the cache kept, else a new one aligned to a cache line. */
void *device_alloc_overwritten(size_t bytes, mem_category cat) {
    void *p = mem_cache_take(bytes);
    size_t lines = bytes ? (bytes + 63) / 64 : 1;   /* aligned_alloc wants a multiple of 64 */
    if (!p) p = aligned_alloc(64, lines * 64);
    if (!p) mem_out_of_memory(bytes, cat);
    mem_track_alloc(p, bytes, cat);
    return p;
}
/* ... zeroed. The memset also touches every page now, at allocation: calloc would map the pages
 * lazily, and the first kernel to write them (inside a training step) would take the page faults. */
void *device_alloc(size_t bytes, mem_category cat) {
    void *p = device_alloc_overwritten(bytes, cat);
    memset(p, 0, bytes);
    return p;
}
float *device_alloc_floats(size_t n, mem_category cat) { return device_alloc(n * sizeof(float), cat); }
int *device_alloc_ints(size_t n, mem_category cat) { return device_alloc(n * sizeof(int), cat); }

/* Un-count p and keep it for the next allocation of its size (or release it: cache full). */
void device_free(void *p) {
    if (!p) return;
    size_t bytes = mem_track_free(p);
    if (!mem_cache_keep(p, bytes)) free(p);
}

void device_copy_to_device(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
void device_copy_to_host(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
void device_copy(void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }
void device_copy_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width, size_t rows) {
    for (size_t r = 0; r < rows; r++) memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
}
void device_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
void device_synchronize(void) {}

/* A mark is the host's clock: the work before it has run (device.h). */
device_mark device_mark_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (device_mark){ts.tv_sec + 1e-9 * ts.tv_nsec, NULL};
}
double device_mark_seconds(device_mark *m) { return m->host; }
void device_mark_release(device_mark *m) { (void)m; }
