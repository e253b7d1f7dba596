/* cdefs.h: two macros that let one header serve C (mpicc) and CUDA C++ (nvcc).
 *
 *   HD            marks a static inline function as callable from host and device code.
 *                 The per-element math lives once in such functions: the CPU backend calls
 *                 them in loops, the CUDA kernels call them once per thread.
 *   C_BEGIN/C_END wrap every common/ header so that nvcc (which compiles C++) links the same
 *                 symbols as mpicc.
 */
#pragma once

#ifdef __CUDACC__
#define HD __host__ __device__
#else
#define HD
#endif

#ifdef __cplusplus
#define C_BEGIN extern "C" {
#define C_END }
#else
#define C_BEGIN
#define C_END
#endif
