/* ranks: 1 */
/* test_llama_kernels.c: every layer of llama_kernels.h on tiny shapes.
 *
 *   forwards:  against a naive loop in double precision written out here;
 *   backwards: against central finite differences of a random projection of the output,
 *              L = sum(out * r) accumulated in double, so dL/dout = r is what backward gets;
 *   plus the properties the model relies on: += versus = semantics, vocabulary shards, the
 *   inverse rotation of RoPE, causality, ignored targets, huge logits, two AdamW steps, and
 *   the embedding backward's fixed order of sums (bit-identical to an in-order float loop).
 *
 * Every tensor goes through device_alloc and device copies, so the same test runs on the CUDA
 * backend (make test BACKEND=cuda on a GPU machine).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "gemm.h"
#include "kernels.h"
#include "llama_kernels.h"
#include "test_device.h"
#include "test_util.h"

/* ---- helpers ------------------------------------------------------------------------------ */

/* The test's stream of numbers (test_util.h's xorshift64*). */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float rand_uniform(float lo, float hi) { return tu_rand_uniform(&rng_state, lo, hi); }
static void fill_uniform(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = rand_uniform(lo, hi);
}

static int *upload_ints(const int *host, size_t n) {
    int *d = device_alloc_ints(n, MEM_BUFFERS);
    device_copy_to_device(d, host, n * sizeof(int));
    return d;
}
static void download(float *host, const float *dev, size_t n) {
    device_copy_to_host(host, dev, n * sizeof(float));
}
static double *doubles(size_t n) { return calloc(n, sizeof(double)); }
static float *floats(size_t n) { return calloc(n, sizeof(float)); }

/* sum(out * r) in double, out read back from the device */
static double project(const float *out_dev, const float *r, size_t n) {
    float *out = floats(n);
    download(out, out_dev, n);
    double L = 0.0;
    for (size_t i = 0; i < n; i++) L += (double)out[i] * r[i];
    free(out);
    return L;
}

/* Forward values against a double reference: |got - want| <= 1e-6 + 1e-5 |want| (fp32). */
static void check_values(const char *what, const float *got, const double *want, size_t n,
                         double atol) {
    for (size_t i = 0; i < n; i++) CHECK_CLOSE(got[i], want[i], atol, 1e-5, what);
}



/* ---- embedding ------------------------------------------------------------------------------- */

enum { EMB_V = 7, EMB_D = 5, EMB_N = 8, SHARD_ROW0 = 2, SHARD_ROWS = 3 };
static const int emb_tokens[EMB_N] = {3, 0, 6, 3, 2, 5, 3, 4};   /* token 3 three times */

typedef struct { float *table; const float *r; const int *tokens_dev; } embedding_ctx;
static double embedding_loss(void *p) {
    embedding_ctx *c = p;
    float *table = tu_upload(c->table, SHARD_ROWS * EMB_D), *out = device_alloc_floats(EMB_N * EMB_D, MEM_BUFFERS);
    embedding_forward(out, c->tokens_dev, table, EMB_N, EMB_D, SHARD_ROW0, SHARD_ROWS);
    double L = project(out, c->r, EMB_N * EMB_D);
    device_free(table); device_free(out);
    return L;
}

static void test_embedding(void) {
    float table[EMB_V * EMB_D], out[EMB_N * EMB_D];
    double want[EMB_N * EMB_D];
    fill_uniform(table, EMB_V * EMB_D, -1, 1);
    int *tokens = upload_ints(emb_tokens, EMB_N);
    float *out_dev = device_alloc_floats(EMB_N * EMB_D, MEM_BUFFERS);

    /* the whole table: row n is table[token n] */
    float *table_dev = tu_upload(table, EMB_V * EMB_D);
    embedding_forward(out_dev, tokens, table_dev, EMB_N, EMB_D, 0, EMB_V);
    download(out, out_dev, EMB_N * EMB_D);
    for (int n = 0; n < EMB_N; n++)
        for (int d = 0; d < EMB_D; d++) want[n * EMB_D + d] = table[emb_tokens[n] * EMB_D + d];
    check_values("embedding forward", out, want, EMB_N * EMB_D, 0);

    /* a shard of rows [2, 5): tokens 0, 5, 6 belong to other shards and give zero rows */
    float *shard = table + SHARD_ROW0 * EMB_D;
    float *shard_dev = tu_upload(shard, SHARD_ROWS * EMB_D);
    embedding_forward(out_dev, tokens, shard_dev, EMB_N, EMB_D, SHARD_ROW0, SHARD_ROWS);
    download(out, out_dev, EMB_N * EMB_D);
    for (int n = 0; n < EMB_N; n++) {
        int in_shard = emb_tokens[n] >= SHARD_ROW0 && emb_tokens[n] < SHARD_ROW0 + SHARD_ROWS;
        for (int d = 0; d < EMB_D; d++) want[n * EMB_D + d] = in_shard ? table[emb_tokens[n] * EMB_D + d] : 0.0;
    }
    check_values("embedding forward (shard)", out, want, EMB_N * EMB_D, 0);

    /* backward of the shard: accumulates (+=) onto what dtable held */
    float r[EMB_N * EMB_D], dshard[SHARD_ROWS * EMB_D];
    fill_uniform(r, EMB_N * EMB_D, -1, 1);
    for (int i = 0; i < SHARD_ROWS * EMB_D; i++) dshard[i] = 0.5f;
    float *dshard_dev = tu_upload(dshard, SHARD_ROWS * EMB_D), *r_dev = tu_upload(r, EMB_N * EMB_D);
    embedding_backward(dshard_dev, r_dev, tokens, EMB_N, EMB_D, SHARD_ROW0, SHARD_ROWS);
    download(dshard, dshard_dev, SHARD_ROWS * EMB_D);
    for (int i = 0; i < SHARD_ROWS * EMB_D; i++) dshard[i] -= 0.5f;

    double numeric[SHARD_ROWS * EMB_D];
    float shard_copy[SHARD_ROWS * EMB_D];
    memcpy(shard_copy, shard, sizeof shard_copy);
    embedding_ctx ctx = {shard_copy, r, tokens};
    finite_differences(embedding_loss, &ctx, shard_copy, SHARD_ROWS * EMB_D, numeric);
    check_grad("embedding dtable (shard, +=)", dshard, numeric, SHARD_ROWS * EMB_D);

    device_free(tokens); device_free(out_dev); device_free(table_dev); device_free(shard_dev);
    device_free(dshard_dev); device_free(r_dev);
}

/* The backward's order (the determinism contract): every table row receives its tokens' dout
 * rows in increasing position order, so the result is BIT-identical to a float loop over the
 * positions in order, on both backends, and two calls give the same bits. Tokens repeat many
 * times; some belong to other shards (row0 > 0, a few rows) and some are -1. dout spans 2^-12
 * to 2^12, so float sums depend on their order: the test checks that the reversed order gives
 * other bits, i.e. that it would see a kernel summing in any other order.
 * Shapes: tokens [N] in -1 and [0, V), dout [N, D], dtable [nrows, D] = rows [row0, row0 + nrows). */
static void test_embedding_order(int N, int V, int row0, int nrows, int D) {
    int *tok = malloc(N * sizeof(int));
    size_t nd = (size_t)N * D, nt = (size_t)nrows * D;
    float *dout = floats(nd), *init = floats(nt), *want = floats(nt), *reversed = floats(nt);
    float *got1 = floats(nt), *got2 = floats(nt);
    for (int n = 0; n < N; n++) {
        float u = rand_uniform(0, 1);
        tok[n] = u < 0.1f ? -1 : (int)(rand_uniform(0, 1) * V) % V;   /* -1 for about 10% */
    }
    for (size_t i = 0; i < nd; i++) dout[i] = ldexpf(rand_uniform(-1, 1), (int)rand_uniform(-12, 13));
    fill_uniform(init, nt, -1, 1);                                    /* += onto what was there */

    /* the contract (n increasing), and the same sums in the opposite order (n decreasing) */
    memcpy(want, init, nt * sizeof(float));
    memcpy(reversed, init, nt * sizeof(float));
    int in_slice = 0;
    for (int step = 0; step < 2 * N; step++) {
        int n = step < N ? step : 2 * N - 1 - step, row = tok[n] - row0;
        if (tok[n] < 0 || row < 0 || row >= nrows) continue;
        float *dst = (step < N ? want : reversed) + (size_t)row * D;
        for (int d = 0; d < D; d++) dst[d] += dout[(size_t)n * D + d];
        in_slice += step < N;
    }
    CHECK(in_slice > 2 * nrows && in_slice < N,
          "N %d: %d positions in the slice: the tokens should repeat and some fall outside", N, in_slice);
    CHECK(memcmp(want, reversed, nt * sizeof(float)) != 0,
          "N %d: the order of the sums changes no bit: the test cannot see it", N);

    int *tokens = upload_ints(tok, N);
    float *dout_dev = tu_upload(dout, nd);
    float *got[2] = {got1, got2};
    for (int run = 0; run < 2; run++) {
        float *dtable = tu_upload(init, nt);
        embedding_backward(dtable, dout_dev, tokens, N, D, row0, nrows);
        download(got[run], dtable, nt);
        device_free(dtable);
    }
    size_t mismatches = 0, first = nt;
    for (size_t i = 0; i < nt; i++)
        if (memcmp(&got1[i], &want[i], sizeof(float)) != 0 && mismatches++ == 0) first = i;
    CHECK(mismatches == 0, "N %d rows [%d, %d): %zu of %zu elements are not the in-order float sum's "
          "bits (first %zu: got %.9g want %.9g)", N, row0, row0 + nrows, mismatches, nt, first,
          first < nt ? got1[first] : 0.0, first < nt ? want[first] : 0.0);
    CHECK(memcmp(got1, got2, nt * sizeof(float)) == 0, "N %d: two runs of embedding_backward differ", N);

    device_free(tokens); device_free(dout_dev);
    free(tok); free(dout); free(init); free(want); free(reversed); free(got1); free(got2);
}

/* ---- RMSNorm ---------------------------------------------------------------------------------- */

enum { RMS_N = 3, RMS_C = 8 };
#define RMS_EPS 1e-5f

typedef struct { float *x, *w; const float *r; } rmsnorm_ctx;
static double rmsnorm_loss(void *p) {
    rmsnorm_ctx *c = p;
    float *x = tu_upload(c->x, RMS_N * RMS_C), *w = tu_upload(c->w, RMS_C);
    float *out = device_alloc_floats(RMS_N * RMS_C, MEM_BUFFERS), *rstd = device_alloc_floats(RMS_N, MEM_BUFFERS);
    rmsnorm_forward(out, rstd, x, w, RMS_N, RMS_C, RMS_EPS);
    double L = project(out, c->r, RMS_N * RMS_C);
    device_free(x); device_free(w); device_free(out); device_free(rstd);
    return L;
}

static void test_rmsnorm(void) {
    float x[RMS_N * RMS_C], w[RMS_C], r[RMS_N * RMS_C], out[RMS_N * RMS_C], rstd[RMS_N];
    fill_uniform(x, RMS_N * RMS_C, -2, 2);
    fill_uniform(w, RMS_C, 0.5f, 1.5f);
    fill_uniform(r, RMS_N * RMS_C, -1, 1);
    float *x_dev = tu_upload(x, RMS_N * RMS_C), *w_dev = tu_upload(w, RMS_C), *r_dev = tu_upload(r, RMS_N * RMS_C);
    float *out_dev = device_alloc_floats(RMS_N * RMS_C, MEM_BUFFERS), *rstd_dev = device_alloc_floats(RMS_N, MEM_BUFFERS);

    rmsnorm_forward(out_dev, rstd_dev, x_dev, w_dev, RMS_N, RMS_C, RMS_EPS);
    download(out, out_dev, RMS_N * RMS_C);
    download(rstd, rstd_dev, RMS_N);
    double want[RMS_N * RMS_C], want_rstd[RMS_N];
    for (int n = 0; n < RMS_N; n++) {
        double ss = 0;
        for (int c = 0; c < RMS_C; c++) ss += (double)x[n * RMS_C + c] * x[n * RMS_C + c];
        want_rstd[n] = 1.0 / sqrt(ss / RMS_C + RMS_EPS);
        for (int c = 0; c < RMS_C; c++) want[n * RMS_C + c] = x[n * RMS_C + c] * want_rstd[n] * w[c];
    }
    check_values("rmsnorm forward", out, want, RMS_N * RMS_C, 1e-6);
    check_values("rmsnorm rstd", rstd, want_rstd, RMS_N, 1e-6);

    /* backward accumulates into dx and dw: start them at known values and subtract afterwards */
    float dx[RMS_N * RMS_C], dw[RMS_C];
    for (int i = 0; i < RMS_N * RMS_C; i++) dx[i] = 0.25f;
    for (int i = 0; i < RMS_C; i++) dw[i] = -0.5f;
    float *dx_dev = tu_upload(dx, RMS_N * RMS_C), *dw_dev = tu_upload(dw, RMS_C);
    rmsnorm_backward(dx_dev, dw_dev, r_dev, x_dev, w_dev, rstd_dev, RMS_N, RMS_C);
    download(dx, dx_dev, RMS_N * RMS_C);
    download(dw, dw_dev, RMS_C);
    for (int i = 0; i < RMS_N * RMS_C; i++) dx[i] -= 0.25f;
    for (int i = 0; i < RMS_C; i++) dw[i] += 0.5f;

    rmsnorm_ctx ctx = {x, w, r};
    double num_x[RMS_N * RMS_C], num_w[RMS_C];
    finite_differences(rmsnorm_loss, &ctx, x, RMS_N * RMS_C, num_x);
    finite_differences(rmsnorm_loss, &ctx, w, RMS_C, num_w);
    check_grad("rmsnorm dx (+=)", dx, num_x, RMS_N * RMS_C);
    check_grad("rmsnorm dw (+=)", dw, num_w, RMS_C);

    device_free(x_dev); device_free(w_dev); device_free(r_dev); device_free(out_dev);
    device_free(rstd_dev); device_free(dx_dev); device_free(dw_dev);
}

/* The fused residual + norm gives, bit for bit, what add_inplace then rmsnorm_forward give. */
static void test_residual_rmsnorm(void) {
    enum { n = RMS_N * RMS_C };
    float h[n], res[n], w[RMS_C], got_h[n], got_out[n], got_rstd[RMS_N], want_h[n], want_out[n], want_rstd[RMS_N];
    fill_uniform(h, n, -2, 2);
    fill_uniform(res, n, -2, 2);
    fill_uniform(w, RMS_C, 0.5f, 1.5f);
    float *w_dev = tu_upload(w, RMS_C), *res_dev = tu_upload(res, n);
    float *out_dev = device_alloc_floats(n, MEM_BUFFERS), *rstd_dev = device_alloc_floats(RMS_N, MEM_BUFFERS);
    float *h_dev = tu_upload(h, n);
    add_inplace(h_dev, res_dev, n);
    rmsnorm_forward(out_dev, rstd_dev, h_dev, w_dev, RMS_N, RMS_C, RMS_EPS);
    download(want_h, h_dev, n); download(want_out, out_dev, n); download(want_rstd, rstd_dev, RMS_N);
    device_free(h_dev);
    h_dev = tu_upload(h, n);
    residual_rmsnorm_forward(h_dev, out_dev, rstd_dev, res_dev, w_dev, RMS_N, RMS_C, RMS_EPS);
    download(got_h, h_dev, n); download(got_out, out_dev, n); download(got_rstd, rstd_dev, RMS_N);
    for (int i = 0; i < n; i++) {
        CHECK(got_h[i] == want_h[i], "residual_rmsnorm h[%d] %.9g != add_inplace's %.9g", i, got_h[i], want_h[i]);
        CHECK(got_out[i] == want_out[i], "residual_rmsnorm out[%d] %.9g != rmsnorm's %.9g", i, got_out[i], want_out[i]);
    }
    for (int i = 0; i < RMS_N; i++)
        CHECK(got_rstd[i] == want_rstd[i], "residual_rmsnorm rstd[%d] %.9g != rmsnorm's %.9g", i, got_rstd[i], want_rstd[i]);
    device_free(w_dev); device_free(res_dev); device_free(out_dev); device_free(rstd_dev); device_free(h_dev);
}

/* ---- linear in bf16 (--dtype bf16) --------------------------------------------------------------
 * linear_forward_in / linear_backward_in with DTYPE_BF16: each GEMM's operands rounded to bf16,
 * the products accumulated in fp32, the outputs not rounded. Against double references of the
 * rounded operands, within fp32 accumulation's bound (2 K 2^-24 sum |a b|); and the test can fail:
 * the unrounded operands' reference lies outside that bound somewhere (a missing rounding is
 * seen), and some output is not a bf16 value (an extra rounding of the output would be seen). */
enum { LB_N = 16, LB_IN = 64, LB_OUT = 32 };

static float bf(float x) { return bf16_to_float(bf16_from_float(x)); }

/* C[M, N] = sum_k A(m, k) B(n, k) in double, A(m, k) = A[m * sa + k * ka], likewise B; with
 * `round` the operands rounded to bf16 first. bound[] = 2 K 2^-24 sum |a b| (fp32 accumulation). */
static void gemm_ref(double *C, double *bound, const float *A, int sa, int ka, const float *B, int sb, int kb,
                     int M, int N, int K, bool round) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double acc = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double a = A[m * sa + k * ka], b = B[n * sb + k * kb];
                if (round) a = bf((float)a), b = bf((float)b);
                acc += a * b;
                mag += fabs(a * b);
            }
            C[m * N + n] = acc;
            if (bound) bound[m * N + n] = 2.0 * K * ldexp(1.0, -24) * mag + 1e-30;
        }
}

/* how many of got[n] are within bound[n] of want[n] */
static int within(const float *got, const double *want, const double *bound, int n) {
    int ok = 0;
    for (int i = 0; i < n; i++) ok += fabs(got[i] - want[i]) <= bound[i];
    return ok;
}

static void test_linear_bf16(void) {
    enum { NX = LB_N * LB_IN, NW = LB_OUT * LB_IN, NY = LB_N * LB_OUT };
    static float x[NX], W[NW], dy[NY], y[NY], dx[NX], dW[NW];
    static double want[NX > NW ? NX : NW], bound[NX > NW ? NX : NW], plain[NX > NW ? NX : NW];
    fill_uniform(x, NX, -1, 1);
    fill_uniform(W, NW, -1, 1);
    fill_uniform(dy, NY, -1, 1);
    float *x_dev = tu_upload(x, NX), *W_dev = tu_upload(W, NW), *dy_dev = tu_upload(dy, NY);
    float *y_dev = device_alloc_floats(NY, MEM_BUFFERS);

    /* forward: y = bf16(x) bf16(W)^T */
    linear_forward_in(DTYPE_BF16, y_dev, x_dev, W_dev, LB_N, LB_IN, LB_OUT);
    download(y, y_dev, NY);
    gemm_ref(want, bound, x, LB_IN, 1, W, LB_IN, 1, LB_N, LB_OUT, LB_IN, true);
    gemm_ref(plain, NULL, x, LB_IN, 1, W, LB_IN, 1, LB_N, LB_OUT, LB_IN, false);
    CHECK(within(y, want, bound, NY) == NY, "bf16 linear forward: %d of %d outputs outside fp32 accumulation's "
          "bound of the bf16 operands' product", NY - within(y, want, bound, NY), NY);
    CHECK(within(y, plain, bound, NY) < NY, "bf16 linear forward: every output within the bound of the unrounded "
          "operands' product too: the test could not see a missing rounding");
    int bf16_valued = 0;
    for (int i = 0; i < NY; i++) bf16_valued += y[i] == bf(y[i]);
    CHECK(bf16_valued < NY, "bf16 linear forward: every output is a bf16 value: the output was rounded");

    /* backward: dx = bf16(dy) bf16(W) (set, then added: dx_beta 1), dW += bf16(dy)^T bf16(x) */
    for (int i = 0; i < NW; i++) dW[i] = 0.5f;
    float *dx_dev = device_alloc_floats(NX, MEM_BUFFERS), *dW_dev = tu_upload(dW, NW);
    linear_backward_in(DTYPE_BF16, dx_dev, 0.0f, dW_dev, dy_dev, x_dev, W_dev, LB_N, LB_IN, LB_OUT);
    download(dx, dx_dev, NX);
    download(dW, dW_dev, NW);
    gemm_ref(want, bound, dy, LB_OUT, 1, W, 1, LB_IN, LB_N, LB_IN, LB_OUT, true);   /* dx[n, i] = sum_o dy[n, o] W[o, i] */
    CHECK(within(dx, want, bound, NX) == NX, "bf16 linear dx: %d of %d outside the bound", NX - within(dx, want, bound, NX), NX);
    gemm_ref(want, bound, dy, 1, LB_OUT, x, 1, LB_IN, LB_OUT, LB_IN, LB_N, true);   /* dW[o, i] = sum_n dy[n, o] x[n, i] */
    for (int i = 0; i < NW; i++) want[i] += 0.5, bound[i] += ldexp(0.5, -23);      /* (+= onto 0.5: one rounding more) */
    CHECK(within(dW, want, bound, NW) == NW, "bf16 linear dW (+=): %d of %d outside the bound", NW - within(dW, want, bound, NW), NW);
    float dx1[NX];
    linear_backward_in(DTYPE_BF16, dx_dev, 1.0f, NULL, dy_dev, x_dev, W_dev, LB_N, LB_IN, LB_OUT);
    download(dx1, dx_dev, NX);
    for (int i = 0; i < NX; i++) CHECK_CLOSE(dx1[i], 2.0 * dx[i], 1e-6, 1e-6, "bf16 linear dx (dx_beta 1: added)");

    /* DTYPE_F32 is the fp32 linear, bit for bit */
    float y32[NY], yref[NY];
    linear_forward_in(DTYPE_F32, y_dev, x_dev, W_dev, LB_N, LB_IN, LB_OUT);
    download(y32, y_dev, NY);
    linear_forward(y_dev, x_dev, W_dev, LB_N, LB_IN, LB_OUT);
    download(yref, y_dev, NY);
    CHECK(memcmp(y32, yref, sizeof y32) == 0, "linear_forward_in(DTYPE_F32) differs from linear_forward");
    device_free(x_dev); device_free(W_dev); device_free(dy_dev); device_free(y_dev); device_free(dx_dev); device_free(dW_dev);
}

/* ---- linear ------------------------------------------------------------------------------------ */

enum { LIN_N = 3, LIN_IN = 5, LIN_OUT = 4 };

typedef struct { float *x, *W; const float *r; } linear_ctx;
static double linear_loss(void *p) {
    linear_ctx *c = p;
    float *x = tu_upload(c->x, LIN_N * LIN_IN), *W = tu_upload(c->W, LIN_OUT * LIN_IN);
    float *y = device_alloc_floats(LIN_N * LIN_OUT, MEM_BUFFERS);
    linear_forward(y, x, W, LIN_N, LIN_IN, LIN_OUT);
    double L = project(y, c->r, LIN_N * LIN_OUT);
    device_free(x); device_free(W); device_free(y);
    return L;
}

static void test_linear(void) {
    float x[LIN_N * LIN_IN], W[LIN_OUT * LIN_IN], r[LIN_N * LIN_OUT], y[LIN_N * LIN_OUT];
    fill_uniform(x, LIN_N * LIN_IN, -1, 1);
    fill_uniform(W, LIN_OUT * LIN_IN, -1, 1);
    fill_uniform(r, LIN_N * LIN_OUT, -1, 1);
    float *x_dev = tu_upload(x, LIN_N * LIN_IN), *W_dev = tu_upload(W, LIN_OUT * LIN_IN), *r_dev = tu_upload(r, LIN_N * LIN_OUT);
    float *y_dev = device_alloc_floats(LIN_N * LIN_OUT, MEM_BUFFERS);

    linear_forward(y_dev, x_dev, W_dev, LIN_N, LIN_IN, LIN_OUT);
    download(y, y_dev, LIN_N * LIN_OUT);
    double want[LIN_N * LIN_OUT];
    for (int n = 0; n < LIN_N; n++)
        for (int o = 0; o < LIN_OUT; o++) {
            double acc = 0;
            for (int i = 0; i < LIN_IN; i++) acc += (double)x[n * LIN_IN + i] * W[o * LIN_IN + i];
            want[n * LIN_OUT + o] = acc;
        }
    check_values("linear forward", y, want, LIN_N * LIN_OUT, 1e-6);

    /* dx overwrites (start it at garbage), dW accumulates (start it at 1) */
    float dx[LIN_N * LIN_IN], dW[LIN_OUT * LIN_IN];
    for (int i = 0; i < LIN_N * LIN_IN; i++) dx[i] = 123.0f;
    for (int i = 0; i < LIN_OUT * LIN_IN; i++) dW[i] = 1.0f;
    float *dx_dev = tu_upload(dx, LIN_N * LIN_IN), *dW_dev = tu_upload(dW, LIN_OUT * LIN_IN);
    linear_backward(dx_dev, dW_dev, r_dev, x_dev, W_dev, LIN_N, LIN_IN, LIN_OUT);
    download(dx, dx_dev, LIN_N * LIN_IN);
    download(dW, dW_dev, LIN_OUT * LIN_IN);
    for (int i = 0; i < LIN_OUT * LIN_IN; i++) dW[i] -= 1.0f;

    linear_ctx ctx = {x, W, r};
    double num_x[LIN_N * LIN_IN], num_W[LIN_OUT * LIN_IN];
    finite_differences(linear_loss, &ctx, x, LIN_N * LIN_IN, num_x);
    finite_differences(linear_loss, &ctx, W, LIN_OUT * LIN_IN, num_W);
    check_grad("linear dx (=)", dx, num_x, LIN_N * LIN_IN);
    check_grad("linear dW (+=)", dW, num_W, LIN_OUT * LIN_IN);

    /* dx = NULL skips dx and still accumulates dW: dW is now 1 + 2 * gradient */
    linear_backward(NULL, dW_dev, r_dev, x_dev, W_dev, LIN_N, LIN_IN, LIN_OUT);
    float dW2[LIN_OUT * LIN_IN];
    download(dW2, dW_dev, LIN_OUT * LIN_IN);
    for (int i = 0; i < LIN_OUT * LIN_IN; i++)
        CHECK_CLOSE(dW2[i], 1.0 + 2.0 * dW[i], 1e-5, 1e-5, "linear dW, second call with dx NULL");

    /* backward_accumulate adds dy W to what dx holds (the model sums wq's, wk's and wv's input
     * gradients so): dx_dev holds the gradient from above, so it ends at twice the gradient;
     * dW as before (now 1 + 3 * gradient) */
    linear_backward_accumulate(dx_dev, dW_dev, r_dev, x_dev, W_dev, LIN_N, LIN_IN, LIN_OUT);
    float dx2[LIN_N * LIN_IN];
    download(dx2, dx_dev, LIN_N * LIN_IN);
    download(dW2, dW_dev, LIN_OUT * LIN_IN);
    for (int i = 0; i < LIN_N * LIN_IN; i++)
        CHECK_CLOSE(dx2[i], 2.0 * dx[i], 1e-5, 1e-5, "linear dx (+=), backward_accumulate");
    for (int i = 0; i < LIN_OUT * LIN_IN; i++)
        CHECK_CLOSE(dW2[i], 1.0 + 3.0 * dW[i], 1e-5, 1e-5, "linear dW (+=), backward_accumulate");

    device_free(x_dev); device_free(W_dev); device_free(r_dev); device_free(y_dev);
    device_free(dx_dev); device_free(dW_dev);
}

/* ---- RoPE --------------------------------------------------------------------------------------- */

enum { ROPE_B = 2, ROPE_T = 3, ROPE_H = 2, ROPE_HD = 8, ROPE_SIZE = ROPE_B * ROPE_T * ROPE_H * ROPE_HD };
#define ROPE_THETA 10000.0f
/* global positions of the local rows, as in a context-parallel shard: neither 0.. nor sorted */
static const int rope_positions[ROPE_T] = {17, 3, 130};

typedef struct { float *x; const float *r; const float *table; } rope_ctx;
static double rope_loss(void *p) {
    rope_ctx *c = p;
    float *x = tu_upload(c->x, ROPE_SIZE);
    rope_forward(x, c->table, ROPE_B, ROPE_T, ROPE_H, ROPE_HD);
    double L = project(x, c->r, ROPE_SIZE);
    device_free(x);
    return L;
}

static void test_rope(void) {
    float x[ROPE_SIZE], r[ROPE_SIZE], y[ROPE_SIZE];
    fill_uniform(x, ROPE_SIZE, -1, 1);
    fill_uniform(r, ROPE_SIZE, -1, 1);
    int *pos_dev = upload_ints(rope_positions, ROPE_T);
    float *table = device_alloc_floats(ROPE_T * ROPE_HD, MEM_BUFFERS);   /* [T, hd/2, 2] */
    rope_table(table, pos_dev, ROPE_T, ROPE_HD, ROPE_THETA);
    float *x_dev = tu_upload(x, ROPE_SIZE);

    rope_forward(x_dev, table, ROPE_B, ROPE_T, ROPE_H, ROPE_HD);
    download(y, x_dev, ROPE_SIZE);
    double want[ROPE_SIZE];
    for (int b = 0; b < ROPE_B; b++)
        for (int t = 0; t < ROPE_T; t++)
            for (int h = 0; h < ROPE_H; h++)
                for (int j = 0; j < ROPE_HD / 2; j++) {
                    int i = ((b * ROPE_T + t) * ROPE_H + h) * ROPE_HD + 2 * j;
                    double angle = rope_positions[t] * pow((double)ROPE_THETA, -2.0 * j / ROPE_HD);
                    want[i] = x[i] * cos(angle) - x[i + 1] * sin(angle);
                    want[i + 1] = x[i] * sin(angle) + x[i + 1] * cos(angle);
                }
    /* atol 1e-5: the fp32 angle pos * f_j is off by up to ~1e-5 rad at pos 130 */
    check_values("rope forward", y, want, ROPE_SIZE, 1e-5);

    /* backward is the inverse rotation: it undoes the forward */
    rope_backward(x_dev, table, ROPE_B, ROPE_T, ROPE_H, ROPE_HD);
    download(y, x_dev, ROPE_SIZE);
    for (int i = 0; i < ROPE_SIZE; i++) CHECK_CLOSE(y[i], x[i], 1e-6, 0, "rope_backward(rope_forward(x)) == x");

    /* and it is the gradient */
    float *g_dev = tu_upload(r, ROPE_SIZE), g[ROPE_SIZE];
    rope_backward(g_dev, table, ROPE_B, ROPE_T, ROPE_H, ROPE_HD);
    download(g, g_dev, ROPE_SIZE);
    rope_ctx ctx = {x, r, table};
    double numeric[ROPE_SIZE];
    finite_differences(rope_loss, &ctx, x, ROPE_SIZE, numeric);
    check_grad("rope backward", g, numeric, ROPE_SIZE);

    device_free(pos_dev); device_free(table); device_free(x_dev); device_free(g_dev);
}

/* ---- attention ---------------------------------------------------------------------------------- */

typedef struct {
    int B, T, H, Hkv, hd;
    float *q, *k, *v;     /* host inputs [B, T, H or Hkv, hd] */
    const float *r;       /* projection of the output */
} attention_ctx;
static size_t q_size(const attention_ctx *c) { return (size_t)c->B * c->T * c->H * c->hd; }
static size_t kv_size(const attention_ctx *c) { return (size_t)c->B * c->T * c->Hkv * c->hd; }
static size_t probs_size(const attention_ctx *c) { return (size_t)c->B * c->H * c->T * c->T; }

/* forward on the context's inputs; out and probs copied to the host if asked for */
static void attention_run(attention_ctx *c, float *out_host, float *probs_host) {
    float *q = tu_upload(c->q, q_size(c)), *k = tu_upload(c->k, kv_size(c)), *v = tu_upload(c->v, kv_size(c));
    float *out = device_alloc_floats(q_size(c), MEM_BUFFERS), *probs = device_alloc_floats(probs_size(c), MEM_BUFFERS);
    attention_forward(out, probs, q, k, v, c->B, c->T, c->H, c->Hkv, c->hd);
    if (out_host) download(out_host, out, q_size(c));
    if (probs_host) download(probs_host, probs, probs_size(c));
    device_free(q); device_free(k); device_free(v); device_free(out); device_free(probs);
}
static double attention_loss(void *p) {
    attention_ctx *c = p;
    float *out = floats(q_size(c));
    attention_run(c, out, NULL);
    double L = 0;
    for (size_t i = 0; i < q_size(c); i++) L += (double)out[i] * c->r[i];
    free(out);
    return L;
}

/* The textbook forward in double: per (b, h, i), softmax over j <= i of q.k / sqrt(hd), then
 * out = P v. want[B, T, H, hd], want_p[B, H, T, T]. */
static void attention_reference(const attention_ctx *c, double *want, double *want_p) {
    int B = c->B, T = c->T, H = c->H, Hkv = c->Hkv, hd = c->hd, group = H / Hkv;
    double *s = doubles(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                int g = h / group;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    double dot = 0;
                    for (int d = 0; d < hd; d++)
                        dot += (double)c->q[((size_t)(b * T + i) * H + h) * hd + d] *
                               c->k[((size_t)(b * T + j) * Hkv + g) * hd + d];
                    s[j] = dot / sqrt((double)hd);
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= i; j++) sum += exp(s[j] - mx);
                double *p_row = want_p + (((size_t)b * H + h) * T + i) * T;
                for (int j = 0; j < T; j++) p_row[j] = j <= i ? exp(s[j] - mx) / sum : 0.0;
                for (int d = 0; d < hd; d++) {
                    double acc = 0;
                    for (int j = 0; j <= i; j++) acc += p_row[j] * c->v[((size_t)(b * T + j) * Hkv + g) * hd + d];
                    want[((size_t)(b * T + i) * H + h) * hd + d] = acc;
                }
            }
    free(s);
}

/* Random q, k, v and a random projection r of the output, in [-1, 1]. */
static attention_ctx attention_inputs(int B, int T, int H, int Hkv, int hd, float **r) {
    attention_ctx c = {B, T, H, Hkv, hd, NULL, NULL, NULL, NULL};
    size_t nq = q_size(&c), nkv = kv_size(&c);
    c.q = floats(nq); c.k = floats(nkv); c.v = floats(nkv);
    *r = floats(nq);
    fill_uniform(c.q, nq, -1, 1); fill_uniform(c.k, nkv, -1, 1); fill_uniform(c.v, nkv, -1, 1);
    fill_uniform(*r, nq, -1, 1);
    c.r = *r;
    return c;
}

/* attention_forward on c's inputs against attention_reference (within 1e-6): the output and the
 * probabilities, both returned (host, the caller frees them), and the reference probabilities. */
static void check_attention_forward(attention_ctx *c, const char *label, float **out, float **probs,
                                    double **want_p) {
    char what[128];
    size_t nq = q_size(c), np = probs_size(c);
    *out = floats(nq); *probs = floats(np); *want_p = doubles(np);
    double *want = doubles(nq);
    attention_run(c, *out, *probs);
    attention_reference(c, want, *want_p);
    snprintf(what, sizeof what, "%s forward", label);
    check_values(what, *out, want, nq, 1e-6);
    snprintf(what, sizeof what, "%s probs", label);
    check_values(what, *probs, *want_p, np, 1e-6);
    free(want);
}

static void test_attention(int B, int T, int H, int Hkv, int hd) {
    char what[96];
    float *r;
    attention_ctx c = attention_inputs(B, T, H, Hkv, hd, &r);
    size_t nq = q_size(&c), nkv = kv_size(&c), np = probs_size(&c);

    /* forward against the textbook loop: per (b, h, i), softmax over j <= i of q.k / sqrt(hd) */
    float *out, *probs;
    double *want_p;
    snprintf(what, sizeof what, "attention H=%d Hkv=%d", H, Hkv);
    check_attention_forward(&c, what, &out, &probs, &want_p);

    /* backward: dq, dk, dv overwrite (start them at garbage) */
    float *dq = floats(nq), *dk = floats(nkv), *dv = floats(nkv);
    for (size_t i = 0; i < nq; i++) dq[i] = 7.0f;
    for (size_t i = 0; i < nkv; i++) dk[i] = dv[i] = 7.0f;
    float *q_dev = tu_upload(c.q, nq), *k_dev = tu_upload(c.k, nkv), *v_dev = tu_upload(c.v, nkv);
    float *p_dev = tu_upload(probs, np), *r_dev = tu_upload(r, nq);
    float *dq_dev = tu_upload(dq, nq), *dk_dev = tu_upload(dk, nkv), *dv_dev = tu_upload(dv, nkv);
    float *dprobs = device_alloc_floats(np, MEM_BUFFERS);
    attention_backward(dq_dev, dk_dev, dv_dev, dprobs, r_dev, q_dev, k_dev, v_dev, p_dev, B, T, H, Hkv, hd);
    download(dq, dq_dev, nq); download(dk, dk_dev, nkv); download(dv, dv_dev, nkv);

    double *numeric = doubles(nq);
    finite_differences(attention_loss, &c, c.q, nq, numeric);
    snprintf(what, sizeof what, "attention dq H=%d Hkv=%d", H, Hkv);
    check_grad(what, dq, numeric, nq);
    finite_differences(attention_loss, &c, c.k, nkv, numeric);
    snprintf(what, sizeof what, "attention dk H=%d Hkv=%d", H, Hkv);
    check_grad(what, dk, numeric, nkv);
    finite_differences(attention_loss, &c, c.v, nkv, numeric);
    snprintf(what, sizeof what, "attention dv H=%d Hkv=%d", H, Hkv);
    check_grad(what, dv, numeric, nkv);

    /* causality: new keys and values at the last position change only the last position */
    float *out2 = floats(nq);
    for (int b = 0; b < B; b++)
        for (size_t e = 0; e < (size_t)Hkv * hd; e++) {
            size_t i = (size_t)(b * T + T - 1) * Hkv * hd + e;
            c.k[i] += 0.5f;
            c.v[i] -= 0.5f;
        }
    attention_run(&c, out2, NULL);
    int earlier_same = 1, last_changed = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (size_t e = 0; e < (size_t)H * hd; e++) {
                size_t i = (size_t)(b * T + t) * H * hd + e;
                if (t < T - 1 && out2[i] != out[i]) earlier_same = 0;
                if (t == T - 1 && out2[i] != out[i]) last_changed = 1;
            }
    CHECK(earlier_same, "attention H=%d Hkv=%d: a future key/value changed an earlier output", H, Hkv);
    CHECK(last_changed, "attention H=%d Hkv=%d: the last output ignored its own key/value", H, Hkv);

    device_free(q_dev); device_free(k_dev); device_free(v_dev); device_free(p_dev); device_free(r_dev);
    device_free(dq_dev); device_free(dk_dev); device_free(dv_dev); device_free(dprobs);
    free(c.q); free(c.k); free(c.v); free(r); free(out); free(out2); free(probs);
    free(want_p); free(dq); free(dk); free(dv); free(numeric);
}

/* Long sequences, where attention_forward/backward cut the queries into causal blocks (T = 200:
 * 3 uneven blocks; T = 256: 4): forward and backward against the textbook formulas in double
 * (finite differences would take too long at this size). dout = r. */
static void test_attention_blocks(int B, int T, int H, int Hkv, int hd) {
    char what[96];
    float *r;
    attention_ctx c = attention_inputs(B, T, H, Hkv, hd, &r);
    size_t nq = q_size(&c), nkv = kv_size(&c), np = probs_size(&c);
    float *out, *probs;
    double *want_p;
    snprintf(what, sizeof what, "blocked attention T=%d", T);
    check_attention_forward(&c, what, &out, &probs, &want_p);

    /* dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(P dP)), dQ = s dS K, dK = s dS^T Q */
    int group = H / Hkv;
    double scale = 1.0 / sqrt((double)hd), *ds = doubles((size_t)T);
    double *wq = doubles(nq), *wk = doubles(nkv), *wv = doubles(nkv);
#define QI(b, t, h) (((size_t)((b) * T + (t)) * H + (h)) * hd)
#define KI(b, t, g) (((size_t)((b) * T + (t)) * Hkv + (g)) * hd)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                int g = h / group;
                const double *p_row = want_p + (((size_t)b * H + h) * T + i) * T;
                double dot = 0;
                for (int j = 0; j <= i; j++) {
                    double dp = 0;
                    for (int d = 0; d < hd; d++) dp += (double)r[QI(b, i, h) + d] * c.v[KI(b, j, g) + d];
                    ds[j] = dp;
                    dot += p_row[j] * dp;
                }
                for (int j = 0; j <= i; j++) {
                    ds[j] = p_row[j] * (ds[j] - dot);
                    for (int d = 0; d < hd; d++) {
                        wq[QI(b, i, h) + d] += scale * ds[j] * c.k[KI(b, j, g) + d];
                        wk[KI(b, j, g) + d] += scale * ds[j] * c.q[QI(b, i, h) + d];
                        wv[KI(b, j, g) + d] += p_row[j] * r[QI(b, i, h) + d];
                    }
                }
            }
#undef QI
#undef KI
    float *q_dev = tu_upload(c.q, nq), *k_dev = tu_upload(c.k, nkv), *v_dev = tu_upload(c.v, nkv);
    float *p_dev = tu_upload(probs, np), *r_dev = tu_upload(r, nq);
    float *dq_dev = device_alloc_floats(nq, MEM_BUFFERS), *dk_dev = device_alloc_floats(nkv, MEM_BUFFERS);
    float *dv_dev = device_alloc_floats(nkv, MEM_BUFFERS), *dprobs = device_alloc_floats(np, MEM_BUFFERS);
    attention_backward(dq_dev, dk_dev, dv_dev, dprobs, r_dev, q_dev, k_dev, v_dev, p_dev, B, T, H, Hkv, hd);
    float *dq = floats(nq), *dk = floats(nkv), *dv = floats(nkv);
    download(dq, dq_dev, nq); download(dk, dk_dev, nkv); download(dv, dv_dev, nkv);
    snprintf(what, sizeof what, "blocked attention dq T=%d", T);
    check_values(what, dq, wq, nq, 1e-5);
    snprintf(what, sizeof what, "blocked attention dk T=%d", T);
    check_values(what, dk, wk, nkv, 1e-5);
    snprintf(what, sizeof what, "blocked attention dv T=%d", T);
    check_values(what, dv, wv, nkv, 1e-5);
    device_free(q_dev); device_free(k_dev); device_free(v_dev); device_free(p_dev); device_free(r_dev);
    device_free(dq_dev); device_free(dk_dev); device_free(dv_dev); device_free(dprobs);
    free(c.q); free(c.k); free(c.v); free(r); free(out); free(probs); free(want_p);
    free(ds); free(wq); free(wk); free(wv); free(dq); free(dk); free(dv);
}

/* ---- SwiGLU ------------------------------------------------------------------------------------- */

enum { SWIGLU_N = 12 };

typedef struct { float *a, *b; const float *r; } swiglu_ctx;
static double swiglu_loss(void *p) {
    swiglu_ctx *c = p;
    float *a = tu_upload(c->a, SWIGLU_N), *b = tu_upload(c->b, SWIGLU_N), *out = device_alloc_floats(SWIGLU_N, MEM_BUFFERS);
    swiglu_forward(out, a, b, SWIGLU_N);
    double L = project(out, c->r, SWIGLU_N);
    device_free(a); device_free(b); device_free(out);
    return L;
}

static void test_swiglu(void) {
    float a[SWIGLU_N], b[SWIGLU_N], r[SWIGLU_N], out[SWIGLU_N], da[SWIGLU_N], db[SWIGLU_N];
    fill_uniform(a, SWIGLU_N, -4, 4);
    fill_uniform(b, SWIGLU_N, -2, 2);
    fill_uniform(r, SWIGLU_N, -1, 1);
    float *a_dev = tu_upload(a, SWIGLU_N), *b_dev = tu_upload(b, SWIGLU_N), *r_dev = tu_upload(r, SWIGLU_N);
    float *out_dev = device_alloc_floats(SWIGLU_N, MEM_BUFFERS);
    float *da_dev = device_alloc_floats(SWIGLU_N, MEM_BUFFERS), *db_dev = device_alloc_floats(SWIGLU_N, MEM_BUFFERS);

    swiglu_forward(out_dev, a_dev, b_dev, SWIGLU_N);
    download(out, out_dev, SWIGLU_N);
    double want[SWIGLU_N];
    for (int i = 0; i < SWIGLU_N; i++) want[i] = a[i] / (1.0 + exp(-(double)a[i])) * b[i];
    check_values("swiglu forward", out, want, SWIGLU_N, 1e-6);

    swiglu_backward(da_dev, db_dev, r_dev, a_dev, b_dev, SWIGLU_N);
    download(da, da_dev, SWIGLU_N);
    download(db, db_dev, SWIGLU_N);
    swiglu_ctx ctx = {a, b, r};
    double num_a[SWIGLU_N], num_b[SWIGLU_N];
    finite_differences(swiglu_loss, &ctx, a, SWIGLU_N, num_a);
    finite_differences(swiglu_loss, &ctx, b, SWIGLU_N, num_b);
    check_grad("swiglu da", da, num_a, SWIGLU_N);
    check_grad("swiglu db", db, num_b, SWIGLU_N);

    device_free(a_dev); device_free(b_dev); device_free(r_dev); device_free(out_dev);
    device_free(da_dev); device_free(db_dev);
}

/* ---- cross-entropy -------------------------------------------------------------------------------- */

enum { CE_N = 6, CE_V = 7, CE_VALID = 4 };
static const int ce_targets[CE_N] = {2, IGNORE_INDEX, 0, 6, IGNORE_INDEX, 3};

/* sum over valid rows of logsumexp(row) - row[target], in double (test_util.h) */
static double cross_entropy_reference(const float *logits, const int *targets) {
    return tu_cross_entropy_sum(logits, targets, CE_N, CE_V, IGNORE_INDEX);
}

typedef struct { float *logits; const int *targets_dev; } ce_ctx;
/* the loss the model back-propagates: the sum over valid rows divided by their count */
static double cross_entropy_mean_loss(void *p) {
    ce_ctx *c = p;
    float *logits = tu_upload(c->logits, CE_N * CE_V);
    double L = cross_entropy_forward(logits, c->targets_dev, CE_N, CE_V) / (double)CE_VALID;
    device_free(logits);
    return L;
}

static void test_cross_entropy(void) {
    float logits[CE_N * CE_V], dlogits[CE_N * CE_V], alias[CE_N * CE_V];
    fill_uniform(logits, CE_N * CE_V, -3, 3);
    int *targets = upload_ints(ce_targets, CE_N);
    float *logits_dev = tu_upload(logits, CE_N * CE_V), *dlogits_dev = device_alloc_floats(CE_N * CE_V, MEM_BUFFERS);

    float loss = cross_entropy_forward(logits_dev, targets, CE_N, CE_V);
    CHECK_CLOSE(loss, cross_entropy_reference(logits, ce_targets), 1e-6, 1e-5, "cross-entropy forward");

    /* backward of the mean loss (grad_scale = 1 / valid count) against finite differences;
     * dlogits starts at garbage to see that ignored rows are overwritten with zeros */
    float grad_scale = 1.0f / CE_VALID;
    for (int i = 0; i < CE_N * CE_V; i++) dlogits[i] = 3.0f;
    device_copy_to_device(dlogits_dev, dlogits, sizeof dlogits);
    cross_entropy_backward(dlogits_dev, logits_dev, targets, CE_N, CE_V, grad_scale);
    download(dlogits, dlogits_dev, CE_N * CE_V);
    ce_ctx ctx = {logits, targets};
    double numeric[CE_N * CE_V];
    finite_differences(cross_entropy_mean_loss, &ctx, logits, CE_N * CE_V, numeric);
    check_grad("cross-entropy dlogits", dlogits, numeric, CE_N * CE_V);
    for (int n = 0; n < CE_N; n++)
        if (ce_targets[n] == IGNORE_INDEX)
            for (int j = 0; j < CE_V; j++)
                CHECK(dlogits[n * CE_V + j] == 0.0f, "ignored row %d has gradient %g", n, dlogits[n * CE_V + j]);

    /* dlogits may alias logits: the same numbers, written over the logits */
    float *inplace_dev = tu_upload(logits, CE_N * CE_V);
    cross_entropy_backward(inplace_dev, inplace_dev, targets, CE_N, CE_V, grad_scale);
    download(alias, inplace_dev, CE_N * CE_V);
    CHECK(memcmp(alias, dlogits, sizeof alias) == 0, "cross-entropy backward in place differs");

    /* logits of order 1e4 stay finite (the max is subtracted before exp) and still correct */
    float big[CE_N * CE_V];
    for (int i = 0; i < CE_N * CE_V; i++) big[i] = logits[i] * 1e4f;
    float *big_dev = tu_upload(big, CE_N * CE_V);
    float big_loss = cross_entropy_forward(big_dev, targets, CE_N, CE_V);
    CHECK(isfinite(big_loss), "cross-entropy of 1e4 logits is %g", big_loss);
    CHECK_CLOSE(big_loss, cross_entropy_reference(big, ce_targets), 1e-2, 1e-5, "cross-entropy forward, 1e4 logits");
    cross_entropy_backward(dlogits_dev, big_dev, targets, CE_N, CE_V, 1.0f);
    download(dlogits, dlogits_dev, CE_N * CE_V);
    for (int n = 0; n < CE_N; n++) {
        double row_sum = 0;   /* softmax - onehot sums to 0 on a valid row */
        for (int j = 0; j < CE_V; j++) {
            CHECK(isfinite(dlogits[n * CE_V + j]), "1e4 logits: gradient [%d,%d] is %g", n, j, dlogits[n * CE_V + j]);
            row_sum += dlogits[n * CE_V + j];
        }
        CHECK_CLOSE(row_sum, 0.0, 1e-5, 0, "cross-entropy 1e4 logits: row of gradients sums to 0");
    }

    /* every target ignored: zero loss, zero gradient (overwriting what was there) */
    int none[CE_N];
    for (int n = 0; n < CE_N; n++) none[n] = IGNORE_INDEX;
    int *none_dev = upload_ints(none, CE_N);
    CHECK(cross_entropy_forward(logits_dev, none_dev, CE_N, CE_V) == 0.0f, "all-ignored loss is not 0");
    for (int i = 0; i < CE_N * CE_V; i++) dlogits[i] = 3.0f;
    device_copy_to_device(dlogits_dev, dlogits, sizeof dlogits);
    cross_entropy_backward(dlogits_dev, logits_dev, none_dev, CE_N, CE_V, grad_scale);
    download(dlogits, dlogits_dev, CE_N * CE_V);
    int all_zero = 1;
    for (int i = 0; i < CE_N * CE_V; i++) all_zero &= dlogits[i] == 0.0f;
    CHECK(all_zero, "all-ignored gradient is not zero");

    device_free(targets); device_free(logits_dev); device_free(dlogits_dev); device_free(inplace_dev);
    device_free(big_dev); device_free(none_dev);
}

/* ---- AdamW ------------------------------------------------------------------------------------------ */

enum { ADAM_N = 7 };

static void test_adamw(void) {
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float p[ADAM_N], g1[ADAM_N], g2[ADAM_N], zeros[ADAM_N] = {0};
    fill_uniform(p, ADAM_N, -1, 1);
    fill_uniform(g1, ADAM_N, -1, 1);
    fill_uniform(g2, ADAM_N, -1, 1);
    g2[0] = 0.0f;   /* a zero gradient still moves p through momentum and decay */
    float *p_dev = tu_upload(p, ADAM_N), *m_dev = tu_upload(zeros, ADAM_N), *v_dev = tu_upload(zeros, ADAM_N);
    float *g1_dev = tu_upload(g1, ADAM_N), *g2_dev = tu_upload(g2, ADAM_N);
    adamw_step(p_dev, g1_dev, m_dev, v_dev, ADAM_N, lr, beta1, beta2, eps, wd, 1);
    adamw_step(p_dev, g2_dev, m_dev, v_dev, ADAM_N, lr, beta1, beta2, eps, wd, 2);
    float got_p[ADAM_N], got_m[ADAM_N], got_v[ADAM_N];
    download(got_p, p_dev, ADAM_N); download(got_m, m_dev, ADAM_N); download(got_v, v_dev, ADAM_N);

    /* torch.optim.AdamW, two steps, in double */
    double want_p[ADAM_N], want_m[ADAM_N], want_v[ADAM_N];
    for (int i = 0; i < ADAM_N; i++) {
        double pp = p[i], m = 0, v = 0;
        const float *grads[2] = {g1, g2};
        for (int t = 1; t <= 2; t++) {
            double g = grads[t - 1][i];
            pp *= 1.0 - (double)lr * wd;
            m = beta1 * m + (1.0 - beta1) * g;
            v = beta2 * v + (1.0 - beta2) * g * g;
            double m_hat = m / (1.0 - pow(beta1, t)), v_hat = v / (1.0 - pow(beta2, t));
            pp -= lr * m_hat / (sqrt(v_hat) + eps);
        }
        want_p[i] = pp; want_m[i] = m; want_v[i] = v;
    }
    check_values("adamw p", got_p, want_p, ADAM_N, 1e-6);
    check_values("adamw m", got_m, want_m, ADAM_N, 1e-7);
    check_values("adamw v", got_v, want_v, ADAM_N, 1e-7);

    device_free(p_dev); device_free(m_dev); device_free(v_dev); device_free(g1_dev); device_free(g2_dev);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    test_embedding();
    test_embedding_order(64, 12, 4, 5, 6);      /* about 10 positions per row */
    test_embedding_order(4000, 300, 37, 100, 9); /* many rows, more than one sort tile */
    test_embedding_order(40, 6, 2, 1, 3);        /* one row: a one-bit key */
    test_rmsnorm();
    test_residual_rmsnorm();
    test_linear();
    test_linear_bf16();   /* in the operand type this backend's bf16 products read, and in both forced: */
    gemm_bf16_force_widen(true);   /* fp32 holding bf16 values (a CPU without AVX-512's) */
    test_linear_bf16();
    gemm_bf16_force_widen(false);
    gemm_bf16_force_bf16_operands(true);   /* bf16 copies (oneDNN's or cuBLAS's; widened where neither) */
    test_linear_bf16();
    gemm_bf16_force_bf16_operands(false);
    test_rope();
    test_attention(2, 5, 4, 2, 4);   /* grouped-query: two query heads per kv head */
    test_attention(1, 4, 2, 2, 8);   /* plain multi-head */
    test_attention(1, 3, 3, 1, 2);   /* multi-query: every query head shares one kv head */
    test_attention_blocks(1, 200, 4, 2, 8);   /* 3 causal blocks of 66, 67, 67 queries */
    test_attention_blocks(2, 256, 2, 1, 4);   /* 4 blocks of 64 */
    test_swiglu();
    test_cross_entropy();
    test_adamw();
    CHECK(mem_current_total() == 0, "allocator still counts %zu bytes after freeing everything", mem_current_total());
    int rc = tu_finish("test_llama_kernels");
    comm_finalize();
    return rc;
}
