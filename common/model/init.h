/* init.h: counter-based, shard-invariant parameter initialisation.
 *
 * A parameter element's value depends only on (seed, parameter name, global element index):
 *     u1, u2 = hash(seed, name, 2*index), hash(seed, name, 2*index + 1)   (uniform in (0,1))
 *     value  = mean + std * sqrt(-2 ln u1) cos(2 pi u2)                     (Box-Muller)
 * so a rank that owns rows [r0, r0+nr) and columns [c0, c0+nc) of a [rows, cols] tensor
 * computes exactly its slice of the full tensor, whatever the layout. This is what lets every
 * chapter compare its sharded model with the single-device baseline bit for bit at step 0.
 */
#pragma once
#include <stdint.h>
#include "cdefs.h"

C_BEGIN

uint64_t init_name_hash(const char *name);
/* One standard normal sample for (seed, name hash, global index). */
float init_normal_at(uint64_t seed, uint64_t name_hash, uint64_t index);

/* Host buffer out[nr, nc] := normal(0, std) of the slice rows [r0,r0+nr) x cols [c0,c0+nc)
 * of the full [rows, cols] tensor named `name`. */
void init_normal_slice(float *out, const char *name, uint64_t seed, float std,
                       int rows, int cols, int r0, int nr, int c0, int nc);
/* Same, written straight to device memory. */
void init_normal_slice_device(float *out_dev, const char *name, uint64_t seed, float std,
                              int rows, int cols, int r0, int nr, int c0, int nc);
/* Device buffer of n floats := value. */
void init_constant_device(float *out_dev, size_t n, float value);

C_END
