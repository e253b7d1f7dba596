/* bench_gemm_bf16.c: what a linear's GEMMs cost in fp32 and with bf16 operands (make bench-baseline).
 *
 * A linear x [N, in] -> y [N, out] runs three GEMMs a step (y = x W^T; dx = dy W; dW += dy^T x).
 * Timed through gemm.h on the build's backend, best of REPS, one thread:
 *   fp32          matmul (OpenBLAS's sgemm; cuBLAS's without TF32)
 *   bf16          matmul_typed on bf16 operands, fp32 accumulation and outputs (oneDNN's matmul on
 *                 the CPU: AVX512-BF16 or AMX where the CPU has them; cublasGemmEx on the GPU)
 *   widen + fp32  the CPU's other option: the bf16 operands widened to fp32 (exact), then sgemm
 * The measurement behind gemm_cpu.c's choice of oneDNN (issue 37: "measure before choosing").
 *
 *   bench_gemm_bf16 N IN OUT [REPS]       (bench-baseline: 2048 512 1408)
 * A benchmark, never a test: it judges nothing. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "gemm.h"
#include "log.h"

typedef struct {
    int N, in, out;
    float *x, *W, *dy, *y, *dx, *dW;           /* fp32 [N,in] [out,in] [N,out] [N,out] [N,in] [out,in] */
    void *xb, *Wb, *dyb;                       /* the same values in bf16                               */
    float *xw, *Ww, *dyw;                      /* widened back to fp32 (widen + fp32)                   */
} linear;

/* n device elements of type t, small values (exact in bf16). */
static void *filled(size_t n, dtype t) {
    void *d = device_alloc(n * dtype_size(t), MEM_BUFFERS), *h = malloc(n * dtype_size(t));
    for (size_t i = 0; i < n; i++) {
        float v = (float)((int)(i % 13) - 6) * 0.0078125f;
        if (t == DTYPE_BF16) ((uint16_t *)h)[i] = bf16_from_float(v);
        else ((float *)h)[i] = v;
    }
    device_copy_to_device(d, h, n * dtype_size(t));
    free(h);
    return d;
}

static void fp32_gemms(linear *l, const float *x, const float *W, const float *dy) {
    matmul(l->y, x, W, l->N, l->out, l->in, false, true, 1.0f, 0.0f);
    matmul(l->dx, dy, W, l->N, l->in, l->out, false, false, 1.0f, 0.0f);
    matmul(l->dW, dy, x, l->out, l->in, l->N, true, false, 1.0f, 1.0f);
}
static void bf16_gemms(linear *l) {
    matmul_typed(l->y, DTYPE_F32, l->xb, l->Wb, DTYPE_BF16, l->N, l->out, l->in, false, true, 1.0f, 0.0f);
    matmul_typed(l->dx, DTYPE_F32, l->dyb, l->Wb, DTYPE_BF16, l->N, l->in, l->out, false, false, 1.0f, 0.0f);
    matmul_typed(l->dW, DTYPE_F32, l->dyb, l->xb, DTYPE_BF16, l->out, l->in, l->N, true, false, 1.0f, 1.0f);
}
/* bf16 -> fp32 on the host (the CPU build's device is the host) */
static void widen(float *to, const void *from, size_t n) {
    for (size_t i = 0; i < n; i++) to[i] = bf16_to_float(((const uint16_t *)from)[i]);
}

static double timed(linear *l, int variant) {
    device_synchronize();
    double t = wall_seconds();
    if (variant == 0) fp32_gemms(l, l->x, l->W, l->dy);
    else if (variant == 1) bf16_gemms(l);
    else {
        widen(l->xw, l->xb, (size_t)l->N * l->in);
        widen(l->Ww, l->Wb, (size_t)l->out * l->in);
        widen(l->dyw, l->dyb, (size_t)l->N * l->out);
        fp32_gemms(l, l->xw, l->Ww, l->dyw);
    }
    device_synchronize();
    return wall_seconds() - t;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    int N = argc > 3 ? atoi(argv[1]) : 0, in = argc > 3 ? atoi(argv[2]) : 0, out = argc > 3 ? atoi(argv[3]) : 0;
    int reps = argc > 4 ? atoi(argv[4]) : 5;
    if (N < 1 || in < 1 || out < 1 || reps < 1)
        comm_exit_usage("usage: bench_gemm_bf16 N IN OUT [REPS], every size and REPS at least 1");
    int cpu = strcmp(device_backend_name(), "cpu") == 0;
    linear l = {.N = N, .in = in, .out = out};
    size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    l.x = filled(nx, DTYPE_F32), l.W = filled(nw, DTYPE_F32), l.dy = filled(ny, DTYPE_F32);
    l.y = filled(ny, DTYPE_F32), l.dx = filled(nx, DTYPE_F32), l.dW = filled(nw, DTYPE_F32);
    l.xb = filled(nx, DTYPE_BF16), l.Wb = filled(nw, DTYPE_BF16), l.dyb = filled(ny, DTYPE_BF16);
    l.xw = filled(nx, DTYPE_F32), l.Ww = filled(nw, DTYPE_F32), l.dyw = filled(ny, DTYPE_F32);
    double best[3] = {1e30, 1e30, 1e30}, flops = 6.0 * N * in * out;
    for (int r = 0; r < reps + 1; r++)   /* the first round warms up (oneDNN builds its kernels) */
        for (int v = 0; v < (cpu ? 3 : 2); v++) {
            double t = timed(&l, v);
            if (r > 0 && t < best[v]) best[v] = t;
        }
    printf("a linear's three GEMMs (y = x W^T, dx = dy W, dW += dy^T x), N = %d, in = %d, out = %d, best of %d, "
           "one thread (gemm.h on the %s build), 6 N in out = %.2f GFLOP:\n", N, in, out, reps, device_backend_name(),
           flops / 1e9);
    const char *names[3] = {"fp32 (matmul)", "bf16 operands (matmul_typed)", "widen to fp32, then fp32"};
    for (int v = 0; v < (cpu ? 3 : 2); v++)
        printf("  %-30s %8.2f ms  %7.1f GFLOP/s  %.2fx the fp32 time\n", names[v], 1e3 * best[v],
               flops / best[v] / 1e9, best[v] / best[0]);
    comm_finalize();
    return 0;
}
