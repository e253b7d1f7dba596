/* vector_math_cpu.h: glibc's vector exponential (libmvec) for the CPU kernels' loops.
 *
 * A loop that calls expf element by element stays scalar: the compiler knows no vector version
 * of expf unless the declaration says one exists. glibc ships them (libmvec: _ZGVbN4v_expf and
 * its AVX variants, linked through libm) and its <math.h> declares them only under -ffast-math,
 * which this project does not use (it would reorder sums and assume no infinities, and the
 * attention code relies on -inf). This header gives expf the same declaration, `simd`, and
 * nothing else: a loop of independent expf calls is then compiled to four at a time (eight where
 * the target has AVX2: -march=x86-64-v3 calls _ZGVdN8v_expf). With the
 * two-pass softmax of llama_kernels_cpu.c that made causal_softmax_forward and SwiGLU about 2.3x
 * faster at bench-baseline's size (see the root README, "The single-device step").
 *
 * libmvec's expf is accurate to within a few units in the last place, as the scalar one is, but
 * not bit-identical to it: a vectorised loop and a scalar one may differ in the last bit. Both
 * the baseline and the parallel runs use these kernels, so parity is unaffected.
 * Only GCC on x86-64 glibc 2.22 or later (libmvec's first release): elsewhere the declaration is
 * left out and the loops stay scalar. A static link needs -lmvec besides -lm.                   */
#ifndef VECTOR_MATH_CPU_H
#define VECTOR_MATH_CPU_H
#include <math.h>
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__)
#if __GLIBC_PREREQ(2, 22)
float expf(float) __attribute__((simd("notinbranch")));
#endif
#endif
#endif
