/* memory.c: the allocator's bookkeeping and its cache of freed blocks, shared by both backends.
 *
 * device_alloc() (CPU or CUDA) calls mem_track_alloc() with the category the caller named;
 * device_free() calls mem_track_free(). We keep a small table of live allocations so a free
 * knows how many bytes and which category to give back. Chapters read the current bytes per
 * category to print measured memory next to their formulas.
 *
 * The cache: device_free() hands a block to mem_cache_keep() instead of releasing it, and the
 * next device_alloc() of exactly that size takes it back (mem_cache_take). A training step
 * allocates the same sizes every time (a pipeline stage's activation sets, one per microbatch in
 * flight), so from step 2 on no allocation reaches the C library or the driver: no cudaMalloc /
 * cudaFree (which synchronises the GPU) and, on the CPU, no fresh pages faulted in while a
 * kernel first writes them. PyTorch's CUDA caching allocator does the same. The accounting above
 * is not affected: it counts live allocations, and a kept block is not live. Under
 * AddressSanitizer (make sanitize) nothing is kept, so a use after free is still caught.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include "device.h"
#include "guard.h"

typedef struct { const void *p; size_t bytes; mem_category cat; } live_alloc;

static live_alloc *live = NULL;
static size_t n_live = 0, cap_live = 0;
static size_t current[MEM_NCATEGORIES], largest[MEM_NCATEGORIES];
static size_t current_total = 0, peak_total = 0;
static size_t mark_peak[MEM_NCATEGORIES];   /* the highest current[] since mem_mark (mem_mark_peak) */

static const char *category_names[MEM_NCATEGORIES] = {
    "parameters", "gradients", "optimizer", "activations", "buffers"};

void mem_track_alloc(const void *p, size_t bytes, mem_category cat) {
    if (n_live == cap_live) {
        cap_live = cap_live ? 2 * cap_live : 256;
        live = realloc(live, cap_live * sizeof *live);
        if (!live) { fprintf(stderr, "mem_track_alloc: out of host memory\n"); exit(1); }
    }
    live[n_live++] = (live_alloc){p, bytes, cat};
    current[cat] += bytes;
    current_total += bytes;
    if (current[cat] > mark_peak[cat]) mark_peak[cat] = current[cat];
    if (current_total > peak_total) peak_total = current_total;
    if (bytes > largest[cat]) largest[cat] = bytes;
}

size_t mem_track_free(const void *p) {
    for (size_t i = n_live; i-- > 0;) {     /* newest first: frees usually mirror allocations */
        if (live[i].p == p) {
            size_t bytes = live[i].bytes;
            current[live[i].cat] -= bytes;
            current_total -= bytes;
            live[i] = live[--n_live];
            return bytes;
        }
    }
    fprintf(stderr, "mem_track_free: %p was not allocated by device_alloc\n", p);
    exit(1);
}

size_t mem_current(mem_category cat) { return current[cat]; }
size_t mem_current_total(void) { return current_total; }
size_t mem_peak_total(void) { return peak_total; }
size_t mem_largest_alloc(mem_category cat) { return largest[cat]; }

size_t mem_allocation_bytes(const void *p) {
    for (size_t i = 0; i < n_live; i++)
        if (live[i].p == p) return live[i].bytes;
    return 0;
}

size_t mem_mark(mem_category cat) { return mark_peak[cat] = current[cat]; }
size_t mem_mark_peak(mem_category cat) { return mark_peak[cat]; }

void mem_reset_peaks(void) {
    for (int c = 0; c < MEM_NCATEGORIES; c++) largest[c] = 0;
    peak_total = current_total;
}

mem_peaks mem_peaks_save(void) {
    mem_peaks m = {.peak_total = peak_total};
    memcpy(m.largest, largest, sizeof largest);
    memcpy(m.mark_peak, mark_peak, sizeof mark_peak);
    return m;
}

void mem_peaks_restore(const mem_peaks *saved) {
    memcpy(largest, saved->largest, sizeof largest);
    memcpy(mark_peak, saved->mark_peak, sizeof mark_peak);
    peak_total = saved->peak_total;
}

/* ---- the cache of freed blocks ---------------------------------------------------------------- */

#if defined(__SANITIZE_ADDRESS__)
#define MEM_CACHE_LIMIT 0                        /* ASan: release everything, catch use after free */
#else
#define MEM_CACHE_LIMIT ((size_t)1 << 30)        /* at most 1 GiB kept per rank                    */
#endif

typedef struct { void *p; size_t bytes; } kept_block;
static kept_block *kept = NULL;
static size_t n_kept = 0, cap_kept = 0, kept_bytes = 0, misses = 0;

void *mem_cache_take(size_t bytes) {
    for (size_t i = n_kept; i-- > 0;) {      /* the most recently kept first: its pages are warm */
        if (kept[i].bytes == bytes) {
            void *p = kept[i].p;
            kept_bytes -= bytes;
            kept[i] = kept[--n_kept];
            return p;
        }
    }
    misses++;
    return NULL;
}

bool mem_cache_keep(void *p, size_t bytes) {
    if (MEM_CACHE_LIMIT == 0 || kept_bytes + bytes > MEM_CACHE_LIMIT) return false;
    if (n_kept == cap_kept) {
        size_t cap = cap_kept ? 2 * cap_kept : 64;
        kept_block *k = realloc(kept, cap * sizeof *k);
        if (!k) return false;
        kept = k;
        cap_kept = cap;
    }
    kept[n_kept++] = (kept_block){p, bytes};
    kept_bytes += bytes;
    return true;
}

void *mem_cache_drain(void) {
    if (n_kept == 0) return NULL;
    kept_bytes -= kept[n_kept - 1].bytes;
    return kept[--n_kept].p;
}

size_t mem_cache_bytes(void) { return kept_bytes; }
size_t mem_cache_misses(void) { return misses; }

void mem_out_of_memory(size_t bytes, mem_category cat) {
    if (guard_claim_line())   /* one line for the job: the first rank that failed says it */
        fprintf(stderr, "error: device_alloc: out of memory allocating %zu bytes (%s) although the memory check "
            "before step 1 passed: another process took memory, or a limit (ulimit -v) is below what the "
            "device reports; make the model or the batch smaller\n", bytes, category_names[cat]);
    exit(2);
}
