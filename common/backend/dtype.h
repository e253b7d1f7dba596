/* dtype.h: the element type a tensor carries, llm.c's floatX decided at run time.
 *
 * Every buffer a block declares (layer.h), every collective (comm.h) and the allocator's byte
 * counts name their element type, so a count of elements becomes bytes in one place. The model
 * computes in fp32 by default; bf16 is the type mixed precision adds (stored as the top 16 bits of
 * an fp32: 8 exponent bits, 7 mantissa bits, round to nearest even): with --dtype bf16 the linears'
 * GEMMs take bf16 operands (linear.c), and the collectives move and sum it (an MPI sum of bf16
 * accumulates in fp32 and rounds once: comm_mpi.c). The two conversions below are HD: the CPU
 * loops and the CUDA kernels round with the same code.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "cdefs.h"

C_BEGIN

typedef enum { DTYPE_F32 = 0, DTYPE_BF16, DTYPE_NTYPES } dtype;

static inline size_t dtype_size(dtype t) { return t == DTYPE_BF16 ? 2 : 4; }
static inline const char *dtype_name(dtype t) { return t == DTYPE_BF16 ? "bf16" : "fp32"; }

/* fp32 -> bf16, rounding to nearest, ties to even (a NaN stays a quiet NaN of its sign). Written
 * without a branch (both results computed, one selected), so that cast_to_bf16's CPU loop
 * vectorizes (#pragma omp simd). */
HD static inline uint16_t bf16_from_float(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet_nan = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
/* Element i of a buffer of type t (its address: base + i elements of t). */
static inline void *dtype_at(void *base, dtype t, size_t i) { return (char *)base + i * dtype_size(t); }
static inline const void *dtype_const_at(const void *base, dtype t, size_t i) {
    return (const char *)base + i * dtype_size(t);
}

HD static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

C_END
