/* memory.c: the allocator's bookkeeping, shared by both backends.
 *
 * device_alloc() (CPU or CUDA) calls mem_track_alloc() with the category the caller named;
 * device_free() calls mem_track_free(). We keep a small table of live allocations so a free
 * knows how many bytes and which category to give back. Chapters read current and peak bytes
 * per category to print measured memory next to their formulas.
 */
#include <stdio.h>
#include <stdlib.h>
#include "device.h"

typedef struct { const void *p; size_t bytes; mem_category cat; } live_alloc;

static live_alloc *live = NULL;
static size_t n_live = 0, cap_live = 0;
static size_t current[MEM_NCATEGORIES], peak[MEM_NCATEGORIES], largest[MEM_NCATEGORIES];
static size_t current_total = 0, peak_total = 0;
static size_t mark_peak[MEM_NCATEGORIES];   /* the highest current[] since mem_mark (mem_mark_peak) */

static const char *category_names[MEM_NCATEGORIES] = {
    "parameters", "gradients", "optimizer", "activations", "buffers"};

const char *mem_category_name(mem_category cat) { return category_names[cat]; }

void mem_track_alloc(const void *p, size_t bytes, mem_category cat) {
    if (n_live == cap_live) {
        cap_live = cap_live ? 2 * cap_live : 256;
        live = realloc(live, cap_live * sizeof *live);
        if (!live) { fprintf(stderr, "mem_track_alloc: out of host memory\n"); exit(1); }
    }
    live[n_live++] = (live_alloc){p, bytes, cat};
    current[cat] += bytes;
    current_total += bytes;
    if (current[cat] > peak[cat]) peak[cat] = current[cat];
    if (current[cat] > mark_peak[cat]) mark_peak[cat] = current[cat];
    if (current_total > peak_total) peak_total = current_total;
    if (bytes > largest[cat]) largest[cat] = bytes;
}

void mem_track_free(const void *p) {
    for (size_t i = n_live; i-- > 0;) {     /* newest first: frees usually mirror allocations */
        if (live[i].p == p) {
            current[live[i].cat] -= live[i].bytes;
            current_total -= live[i].bytes;
            live[i] = live[--n_live];
            return;
        }
    }
    fprintf(stderr, "mem_track_free: %p was not allocated by device_alloc\n", p);
    exit(1);
}

size_t mem_current(mem_category cat) { return current[cat]; }
size_t mem_peak(mem_category cat) { return peak[cat]; }
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
    for (int c = 0; c < MEM_NCATEGORIES; c++) { peak[c] = current[c]; largest[c] = 0; }
    peak_total = current_total;
}
