/* bench_projections.c: should a layer's projections of one input be one GEMM? (make bench-baseline)
 *
 * Production code often stores wq, wk and wv as one [Dq + 2 Dkv, D] matrix (and w1, w3 as one
 * [2F, D]) so that the three (two) projections of the same normed input are one GEMM. This
 * program measures what that would give this project's single-device step, through gemm.h (so
 * OpenBLAS on the cpu build, cuBLAS on the cuda build): for each group, a layer's forward, input
 * gradient and weight gradient
 *     separate:  y_i = x W_i^T;  dx = sum_i dy_i W_i (beta 0 then 1);  dW_i += dy_i^T x
 *     one GEMM:  y = x [W_1; W_2; ...]^T, then the same two products on the stacked operands
 * and, on the cpu build, the one-GEMM variant plus the copies that split y into the separate
 * tensors RoPE and attention read (and join their gradients back): the model keeps q, k, v (and
 * the gate and up projections) as separate tensors, so fusing the GEMMs without changing those
 * layouts costs these copies. Best of REPS runs of each, interleaved.
 *
 *   bench_projections N D Dq Dkv F [REPS]      (bench-baseline: 2048 512 512 512 1408)
 * A benchmark, never a test: it judges nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "gemm.h"
#include "log.h"
#include "bench_util.h"

/* One group of `n` projections x[N, D] -> y_i[N, out_i], forward and backward. */
typedef struct {
    int n, N, D, out[3], total;
    float *x, *W, *dW, *y, *dx, *part[3];   /* W, dW [total, D] stacked; y [N, total]; part_i [N, out_i] */
} group;

static void separate(group *g) {
    size_t off = 0;
    for (int i = 0; i < g->n; i++) {
        int o = g->out[i];
        const float *W = g->W + off * g->D;
        matmul(g->part[i], g->x, W, g->N, o, g->D, false, true, 1.0f, 0.0f);                  /* y_i = x W_i^T   */
        matmul(g->dx, g->part[i], W, g->N, g->D, o, false, false, 1.0f, i ? 1.0f : 0.0f);    /* dx (+)= dy_i W_i */
        matmul(g->dW + off * g->D, g->part[i], g->x, o, g->D, g->N, true, false, 1.0f, 1.0f); /* dW_i += dy_i^T x */
        off += (size_t)o;
    }
}

/* split: y's columns into the separate tensors; join: back (cpu build: device memory is host memory) */
static void copies(group *g, int join) {
    for (int r = 0; r < g->N; r++) {
        size_t off = 0;
        for (int i = 0; i < g->n; i++) {
            float *fused = g->y + (size_t)r * g->total + off, *own = g->part[i] + (size_t)r * g->out[i];
            memcpy(join ? fused : own, join ? own : fused, (size_t)g->out[i] * sizeof(float));
            off += (size_t)g->out[i];
        }
    }
}

static void one_gemm(group *g, int with_copies) {
    matmul(g->y, g->x, g->W, g->N, g->total, g->D, false, true, 1.0f, 0.0f);
    if (with_copies) copies(g, 0), copies(g, 1);
    matmul(g->dx, g->y, g->W, g->N, g->D, g->total, false, false, 1.0f, 0.0f);
    matmul(g->dW, g->y, g->x, g->total, g->D, g->N, true, false, 1.0f, 1.0f);
}

static double timed(void (*f)(group *, int), group *g, int arg) {
    device_synchronize();
    double t = wall_seconds();
    f(g, arg);
    device_synchronize();
    return wall_seconds() - t;
}
static void separate_arg(group *g, int unused) { (void)unused; separate(g); }

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    int N = argc > 5 ? atoi(argv[1]) : 0, D = argc > 5 ? atoi(argv[2]) : 0, Dq = argc > 5 ? atoi(argv[3]) : 0;
    int Dkv = argc > 5 ? atoi(argv[4]) : 0, F = argc > 5 ? atoi(argv[5]) : 0;
    int reps = argc > 6 ? atoi(argv[6]) : 5;
    if (N < 1 || D < 1 || Dq < 1 || Dkv < 1 || F < 1 || reps < 1)
        comm_exit_usage("usage: bench_projections N D Dq Dkv F [REPS], every size and REPS at least 1");
    int cpu = strcmp(device_backend_name(), "cpu") == 0;
    group groups[2] = {{.n = 3, .out = {Dq, Dkv, Dkv}}, {.n = 2, .out = {F, F}}};
    const char *names[2] = {"wq, wk, wv", "w1, w3"};
    printf("a layer's projections of one input, forward + input gradient + weight gradient, N = %d rows, "
           "D = %d, best of %d (gemm.h on the %s build):\n", N, D, reps, device_backend_name());
    for (int k = 0; k < 2; k++) {
        group *g = &groups[k];
        g->N = N;
        g->D = D;
        g->total = 0;
        for (int i = 0; i < g->n; i++) g->total += g->out[i];
        g->x = bench_filled((size_t)N * D);
        g->W = bench_filled((size_t)g->total * D);
        g->dW = bench_filled((size_t)g->total * D);
        g->y = bench_filled((size_t)N * g->total);
        g->dx = bench_filled((size_t)N * D);
        for (int i = 0; i < g->n; i++) g->part[i] = bench_filled((size_t)N * g->out[i]);
        double best[3] = {1e30, 1e30, 1e30};
        for (int r = 0; r < reps + 1; r++) {   /* the first round warms up */
            double t[3] = {timed(separate_arg, g, 0), timed(one_gemm, g, 0), cpu ? timed(one_gemm, g, 1) : 0};
            for (int v = 0; v < 3 && r > 0; v++) best[v] = t[v] < best[v] ? t[v] : best[v];
        }
        char shape[64];
        int at = snprintf(shape, sizeof shape, "%s -> %d", names[k], g->out[0]);
        for (int i = 1; i < g->n; i++) at += snprintf(shape + at, sizeof shape - at, " + %d", g->out[i]);
        at += snprintf(shape + at, sizeof shape - at, ":");
        printf("  %-29s separate %7.1f ms   one GEMM %7.1f ms (%.3fx)", shape, 1e3 * best[0], 1e3 * best[1], best[0] / best[1]);
        if (cpu) printf("   one GEMM + split/join copies %7.1f ms (%.3fx)", 1e3 * best[2], best[0] / best[2]);
        printf("\n");
        device_free(g->x), device_free(g->W), device_free(g->dW), device_free(g->y), device_free(g->dx);
        for (int i = 0; i < g->n; i++) device_free(g->part[i]);
    }
    comm_finalize();
    return 0;
}
