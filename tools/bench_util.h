/* bench_util.h: what the measuring programs of tools/ (bench_*.c) share. */
#pragma once
#include <stdlib.h>
#include "device.h"

/* A device array of n floats holding small values (a fixed pattern of 13 values in [-0.06, 0.06]:
 * the GEMMs' time does not depend on them, and no denormal or overflow can slow one down). */
static inline float *bench_filled(size_t n) {
    float *h = malloc(n * sizeof(float)), *d = device_alloc_floats(n, MEM_BUFFERS);
    for (size_t i = 0; i < n; i++) h[i] = (float)((int)(i % 13) - 6) * 0.01f;
    device_copy_to_device(d, h, n * sizeof(float));
    free(h);
    return d;
}
