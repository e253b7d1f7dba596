/* bench_expert_gemm.c: a rank's experts as a loop of GEMMs over the received chunks, one product
 * per expert, or one padded batch? (chapter 09; issue 38: "each rank's local experts as a grouped
 * GEMM (or a loop of GEMMs: measure)")
 *
 * After the dispatch's all-to-all a rank holds R rows for its El experts, laid down by source
 * rank: the rows of rank 0 for experts 0 .. El-1, then those of rank 1, and so on (moe.c). Each
 * expert is a SwiGLU of hidden size F: forward a = x w1^T, b = x w3^T, y = g w2^T (g = silu(a) b,
 * an element-wise pass the same in every variant, left out), backward dg = dy w2, dw2 += dy^T g,
 * dx = da w1 + db w3, dw1 += da^T x, dw3 += db^T x: nine products, 18 n D F FLOPs on n rows.
 * Three ways to run them, through gemm.h (OpenBLAS on the cpu build, cuBLAS on the cuda build):
 *   chunks      one product per (source rank, expert) chunk, on the rows where they lie (up to
 *               El x ep calls per weight: what moe.c did first)
 *   per expert  x and dy first copied into expert order, y and dx copied back (the permutation
 *               torchtitan makes before its grouped GEMM), one product per expert (El calls):
 *               what moe.c does
 *   padded      the same copies, every expert's rows padded to the busiest one's, and one
 *               strided-batched call per weight (cublasSgemmStridedBatched; a loop on the CPU):
 *               a batched GEMM without groups, the padding's FLOPs included
 * A grouped GEMM proper (cuBLAS's cublasGemmGroupedBatchedEx) has no CPU library in Debian 12; on
 * the CPU, "per expert" is what it would amount to. The counts: R rows over the El experts in
 * proportion 1 + s e / (El - 1), s set by IMBALANCE (the busiest expert's rows over the mean, 1:
 * balanced, below 2), each expert's rows split evenly over the ep source ranks. Best of REPS runs
 * of each, interleaved, after one round that warms up.
 *
 *   bench_expert_gemm R D F El EP [REPS] [IMBALANCE]     (make bench runs 2048 256 1024 4 2 REPS 1.5)
 * A benchmark, never a test: it judges nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "gemm.h"
#include "log.h"
#include "bench_util.h"

typedef struct {
    int R, D, F, El, ep, most;         /* most: the busiest expert's rows                        */
    int *rows;                         /* [ep * El] the rows of source q for expert e, q-major   */
    float *x, *dy, *y, *dx;            /* [R, D] as received (q-major)                           */
    float *xs, *dys, *ys, *dxs;        /* [El * most, D] in expert order (padded: most apart)    */
    float *a, *b, *g, *da, *db, *dg;   /* [El * most, F]                                         */
    float *w1, *w3, *w2, *dw1, *dw3, *dw2;   /* El of [F, D] (w1, w3) and [D, F] (w2)        */
} experts;

/* The nine products of `batch` experts from expert e, n rows each, each expert's rows `stride`
 * rows after the previous one's (batch 1: one expert; the buffers' first rows are the rows). */
static void products(experts *s, int e, int batch, int n, size_t stride, const float *x, float *y, const float *dy,
                     float *dx, float *a, float *b, float *g, float *da, float *db, float *dg) {
    if (n == 0) return;
    int D = s->D, F = s->F;
    long long sD = (long long)stride * D, sF = (long long)stride * F, FD = (long long)F * D;
    const float *w1 = s->w1 + e * FD, *w3 = s->w3 + e * FD, *w2 = s->w2 + e * FD;
    float *dw1 = s->dw1 + e * FD, *dw3 = s->dw3 + e * FD, *dw2 = s->dw2 + e * FD;
    matmul_strided_batched(a, x, w1, n, F, D, false, true, D, D, F, sD, FD, sF, batch, 1.0f, 0.0f);      /* a = x w1^T    */
    matmul_strided_batched(b, x, w3, n, F, D, false, true, D, D, F, sD, FD, sF, batch, 1.0f, 0.0f);      /* b = x w3^T    */
    matmul_strided_batched(y, g, w2, n, D, F, false, true, F, F, D, sF, FD, sD, batch, 1.0f, 0.0f);      /* y = g w2^T    */
    matmul_strided_batched(dg, dy, w2, n, F, D, false, false, D, F, F, sD, FD, sF, batch, 1.0f, 0.0f);   /* dg = dy w2    */
    matmul_strided_batched(dw2, dy, g, D, F, n, true, false, D, F, F, sD, sF, FD, batch, 1.0f, 1.0f);    /* dw2 += dy^T g */
    matmul_strided_batched(dx, da, w1, n, D, F, false, false, F, D, D, sF, FD, sD, batch, 1.0f, 0.0f);   /* dx = da w1    */
    matmul_strided_batched(dx, db, w3, n, D, F, false, false, F, D, D, sF, FD, sD, batch, 1.0f, 1.0f);   /*    + db w3    */
    matmul_strided_batched(dw1, da, x, F, D, n, true, false, F, D, D, sF, sD, FD, batch, 1.0f, 1.0f);    /* dw1 += da^T x */
    matmul_strided_batched(dw3, db, x, F, D, n, true, false, F, D, D, sF, sD, FD, batch, 1.0f, 1.0f);    /* dw3 += db^T x */
}

static void by_chunks(experts *s) {
    size_t off = 0, D = s->D, F = s->F;
    for (int q = 0; q < s->ep; q++)
        for (int e = 0; e < s->El; e++) {
            int n = s->rows[q * s->El + e];
            products(s, e, 1, n, 0, s->x + off * D, s->y + off * D, s->dy + off * D, s->dx + off * D, s->a + off * F,
                     s->b + off * F, s->g + off * F, s->da + off * F, s->db + off * F, s->dg + off * F);
            off += (size_t)n;
        }
}

static int expert_rows(const experts *s, int e) {
    int n = 0;
    for (int q = 0; q < s->ep; q++) n += s->rows[q * s->El + e];
    return n;
}

/* Between the received order (q-major) and expert order, expert e's rows from start[e]: x and dy
 * into expert order (to_experts), or y and dx back. */
static void permute(experts *s, const size_t *start, bool to_experts) {
    size_t off = 0, D = s->D, at[s->El];
    memcpy(at, start, sizeof at);
    for (int q = 0; q < s->ep; q++)
        for (int e = 0; e < s->El; e++) {
            size_t n = (size_t)s->rows[q * s->El + e], bytes = n * D * sizeof(float);
            if (to_experts) {
                device_copy(s->xs + at[e] * D, s->x + off * D, bytes);
                device_copy(s->dys + at[e] * D, s->dy + off * D, bytes);
            } else {
                device_copy(s->y + off * D, s->ys + at[e] * D, bytes);
                device_copy(s->dx + off * D, s->dxs + at[e] * D, bytes);
            }
            at[e] += n, off += n;
        }
}

static void in_expert_order(experts *s, bool padded) {
    size_t start[s->El], first = 0, D = s->D, F = s->F;
    for (int e = 0; e < s->El; e++) start[e] = padded ? (size_t)e * s->most : first, first += (size_t)expert_rows(s, e);
    permute(s, start, true);
    if (padded)
        products(s, 0, s->El, s->most, s->most, s->xs, s->ys, s->dys, s->dxs, s->a, s->b, s->g, s->da, s->db, s->dg);
    else
        for (int e = 0; e < s->El; e++) {
            size_t r = start[e];
            products(s, e, 1, expert_rows(s, e), 0, s->xs + r * D, s->ys + r * D, s->dys + r * D, s->dxs + r * D,
                     s->a + r * F, s->b + r * F, s->g + r * F, s->da + r * F, s->db + r * F, s->dg + r * F);
        }
    permute(s, start, false);
}

static double timed(experts *s, int variant) {
    device_synchronize();
    double t = wall_seconds();
    if (variant == 0) by_chunks(s);
    else in_expert_order(s, variant == 2);
    device_synchronize();
    return wall_seconds() - t;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    experts s = {0};
    if (argc > 5) s.R = atoi(argv[1]), s.D = atoi(argv[2]), s.F = atoi(argv[3]), s.El = atoi(argv[4]), s.ep = atoi(argv[5]);
    int reps = argc > 6 ? atoi(argv[6]) : 3;
    double imbalance = argc > 7 ? atof(argv[7]) : 1.0;
    if (s.R < 1 || s.D < 1 || s.F < 1 || s.El < 1 || s.ep < 1 || reps < 1 || !(imbalance >= 1.0 && imbalance < 2.0))
        comm_exit_usage("usage: bench_expert_gemm R D F El EP [REPS] [IMBALANCE]: sizes and REPS at least 1, "
                        "IMBALANCE (the busiest expert's rows over the mean) in [1, 2)");
    /* each expert's rows in proportion to 1 + slope e / (El - 1): max / mean = imbalance */
    double slope = s.El > 1 ? (imbalance - 1.0) / (1.0 - imbalance / 2.0) : 0.0, sum = 0;
    for (int e = 0; e < s.El; e++) sum += 1.0 + (s.El > 1 ? slope * e / (s.El - 1) : 0.0);
    s.rows = calloc((size_t)s.ep * s.El, sizeof(int));
    int given = 0;
    for (int e = 0; e < s.El; e++) {
        int n = e == s.El - 1 ? s.R - given : (int)(s.R * (1.0 + slope * e / (s.El > 1 ? s.El - 1 : 1)) / sum);
        given += n;
        for (int q = 0; q < s.ep; q++) s.rows[q * s.El + e] = n / s.ep + (q < n % s.ep);
        if (n > s.most) s.most = n;
    }
    size_t padded = (size_t)s.El * s.most, D = s.D, F = s.F;
    s.x = bench_filled(s.R * D), s.dy = bench_filled(s.R * D), s.y = bench_filled(s.R * D), s.dx = bench_filled(s.R * D);
    s.xs = bench_filled(padded * D), s.dys = bench_filled(padded * D), s.ys = bench_filled(padded * D), s.dxs = bench_filled(padded * D);
    s.a = bench_filled(padded * F), s.b = bench_filled(padded * F), s.g = bench_filled(padded * F);
    s.da = bench_filled(padded * F), s.db = bench_filled(padded * F), s.dg = bench_filled(padded * F);
    size_t W = (size_t)s.El * F * D;
    s.w1 = bench_filled(W), s.w3 = bench_filled(W), s.w2 = bench_filled(W), s.dw1 = bench_filled(W), s.dw3 = bench_filled(W), s.dw2 = bench_filled(W);
    double best[3] = {1e30, 1e30, 1e30};
    for (int r = 0; r < reps + 1; r++)   /* the first round warms up */
        for (int v = 0; v < 3; v++) {
            double t = timed(&s, v);
            if (r > 0 && t < best[v]) best[v] = t;
        }
    double flops = 18.0 * s.R * D * F, padded_flops = 18.0 * padded * D * F;
    printf("a rank's experts, forward and backward (9 GEMMs an expert), R = %d rows for %d experts from %d ranks "
           "(the busiest expert %d rows, %.2fx the mean), D = %d, F = %d, best of %d (gemm.h on the %s build):\n",
           s.R, s.El, s.ep, s.most, (double)s.most * s.El / s.R, s.D, s.F, reps, device_backend_name());
    const char *names[3] = {"chunks (per source rank and expert)", "per expert (rows permuted first: moe.c)",
                            "padded batch (rows permuted, padded)"};
    int calls[3] = {0, s.El, 1};
    for (int i = 0; i < s.ep * s.El; i++) calls[0] += s.rows[i] > 0;
    for (int v = 0; v < 3; v++)
        printf("  %-44s %8.2f ms  %6.1f GFLOP/s  %3d calls a weight  %.3fx the chunks' time\n", names[v], 1e3 * best[v],
               (v == 2 ? padded_flops : flops) / best[v] / 1e9, calls[v], best[v] / best[0]);
    printf("  (18 R D F = %.2f GFLOP; the padded batch computes 18 El most D F = %.2f GFLOP, of which %.0f%% padding)\n",
           flops / 1e9, padded_flops / 1e9, 100.0 * (padded_flops - flops) / padded_flops);
    comm_finalize();
    return 0;
}
