/* ranks: 1 */
/* test_attention_block.c: the block attention of ring attention (llama_kernels.h):
 * attention_block_forward/backward with their offset causal mask, and attention_merge.
 *
 *   1. one block holding the whole sequence (Tq = Tk = T, equal offsets) is attention_forward /
 *      attention_backward;
 *   2. the sequence cut into Cq query blocks and Ck key blocks (1..4 each, uneven sizes):
 *      every query block against every key block, merged by attention_merge from (0, -inf),
 *      is full causal attention (fully masked blocks included, merged as -inf); the backward
 *      of every (query block, key block) pair with the final out and lse adds up to full
 *      attention's dq, dk, dv; and the same ring with a key offset off by one is far off;
 *   3. grouped-query heads (H = 4, Hkv = 2), multi-head and multi-query shapes, B = 2;
 *   4. central finite differences of the block backward: one block with an empty query row
 *      and a key no query sees, and a loss through the merge of two blocks;
 *   plus attention_merge on -inf and large lse values against double precision.
 *
 * "Relative" below is per tensor: max|got - want| / max|want| (as the parity check measures
 * gradients). Every tensor goes through device_alloc and device copies, so the same test runs
 * on the CUDA backend.
 */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "llama_kernels.h"
#include "test_device.h"
#include "test_util.h"

/* The test's stream of numbers (test_util.h's xorshift64*). */
static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static float rand_uniform(float lo, float hi) { return tu_rand_uniform(&rng_state, lo, hi); }

/* ---- helpers -------------------------------------------------------------------------------- */

static float *random_floats(size_t n, float lo, float hi) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = rand_uniform(lo, hi);
    return x;
}
static float *filled(size_t n, float value) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = value;
    return x;
}

/* max|got - want| / max|want|, and NaN-proof: a NaN anywhere makes it infinite. */
static double rel_error(const float *got, const float *want, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) return INFINITY;
        diff = fmax(diff, fabs((double)got[i] - want[i]));
        scale = fmax(scale, fabs((double)want[i]));
    }
    return scale > 0 ? diff / scale : diff;
}
static double worst_rel = 0;   /* the worst relative error of the exact comparisons, printed */
static void check_rel(const char *what, const float *got, const float *want, size_t n, double tol) {
    double e = rel_error(got, want, n);
    worst_rel = fmax(worst_rel, e);
    CHECK(e <= tol, "%s: relative error %.3g > %.1g", what, e, tol);
}

/* Rows [t0, t0 + Tb) of every sequence of x[B, T, W] -> a packed [B, Tb, W], and back (+=). */
static void slice_rows(float *dst, const float *src, int B, int T, int t0, int Tb, int W) {
    for (int b = 0; b < B; b++)
        memcpy(dst + (size_t)b * Tb * W, src + ((size_t)b * T + t0) * W, (size_t)Tb * W * sizeof(float));
}
static void unslice_rows(float *dst, const float *src, int B, int T, int t0, int Tb, int W) {
    for (int b = 0; b < B; b++)
        memcpy(dst + ((size_t)b * T + t0) * W, src + (size_t)b * Tb * W, (size_t)Tb * W * sizeof(float));
}
/* The same for lse[B, H, T]: positions [t0, t0 + Tb) of every (b, h). */
static void slice_lse(float *dst, const float *src, int BH, int T, int t0, int Tb) {
    for (int r = 0; r < BH; r++) memcpy(dst + (size_t)r * Tb, src + (size_t)r * T + t0, (size_t)Tb * sizeof(float));
}
static void unslice_lse(float *dst, const float *src, int BH, int T, int t0, int Tb) {
    for (int r = 0; r < BH; r++) memcpy(dst + (size_t)r * T + t0, src + (size_t)r * Tb, (size_t)Tb * sizeof(float));
}
/* Block c of C over T positions: [c T / C, (c + 1) T / C), uneven when C does not divide T. */
static int block_start(int c, int C, int T) { return (int)((long long)c * T / C); }

/* log sum_{j <= i} e^(q_i . k_j / sqrt(hd)) in double, lse[B, H, T]: the reference lse. */
static void reference_lse(double *lse, const float *q, const float *k, int B, int T, int H,
                          int Hkv, int hd) {
    int group = H / Hkv;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                double mx = -INFINITY, sum = 0, s[64];
                for (int j = 0; j <= i; j++) {
                    double dot = 0;
                    for (int d = 0; d < hd; d++)
                        dot += (double)q[((size_t)(b * T + i) * H + h) * hd + d] *
                               k[((size_t)(b * T + j) * Hkv + h / group) * hd + d];
                    s[j] = dot / sqrt((double)hd);
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= i; j++) sum += exp(s[j] - mx);
                lse[((size_t)b * H + h) * T + i] = mx + log(sum);
            }
}
static void check_lse(const char *what, const float *got, const double *want, size_t n) {
    for (size_t i = 0; i < n; i++) CHECK_CLOSE(got[i], want[i], 1e-6, 1e-6, what);
}

/* Full causal attention of one problem through attention_forward / attention_backward: the
 * ground truth the blocks must reproduce. */
typedef struct {
    int B, T, H, Hkv, hd;
    float *q, *k, *v, *dout;          /* inputs (host) */
    float *out, *dq, *dk, *dv;        /* attention_forward / attention_backward (host) */
    double *lse;                      /* reference_lse */
} problem;
static size_t nq_of(const problem *p) { return (size_t)p->B * p->T * p->H * p->hd; }
static size_t nkv_of(const problem *p) { return (size_t)p->B * p->T * p->Hkv * p->hd; }

static problem make_problem(int B, int T, int H, int Hkv, int hd) {
    problem p = {B, T, H, Hkv, hd, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t nq = nq_of(&p), nkv = nkv_of(&p);
    p.q = random_floats(nq, -1, 1);
    p.k = random_floats(nkv, -1, 1);
    p.v = random_floats(nkv, -1, 1);
    p.dout = random_floats(nq, -1, 1);
    tu_full_attention(p.q, p.k, p.v, p.dout, B, T, H, Hkv, hd, &p.out, &p.dq, &p.dk, &p.dv);
    p.lse = malloc((size_t)B * H * T * sizeof(double));
    reference_lse(p.lse, p.q, p.k, B, T, H, Hkv, hd);
    return p;
}
static void free_problem(problem *p) {
    free(p->q); free(p->k); free(p->v); free(p->dout);
    free(p->out); free(p->dq); free(p->dk); free(p->dv); free(p->lse);
}

/* ---- 1. one block = the whole sequence ---------------------------------------------------------- */

static void test_whole_sequence(int B, int T, int H, int Hkv, int hd, int offset) {
    char what[128];
    problem p = make_problem(B, T, H, Hkv, hd);
    size_t nq = nq_of(&p), nkv = nkv_of(&p), nl = (size_t)B * H * T;
    float *q = tu_upload(p.q, nq), *k = tu_upload(p.k, nkv), *v = tu_upload(p.v, nkv), *dout = tu_upload(p.dout, nq);
    float *init = filled(nq, 9.0f);   /* out and lse are overwritten (=) */
    float *out = tu_upload(init, nq), *lse = tu_upload(init, nl);
    attention_block_forward(out, lse, q, k, v, B, T, T, H, Hkv, hd, offset, offset);
    float *out_h = tu_download_new(out, nq), *lse_h = tu_download_new(lse, nl);
    snprintf(what, sizeof what, "block = whole sequence, out, B=%d T=%d H=%d Hkv=%d hd=%d offset %d", B, T, H, Hkv, hd, offset);
    check_rel(what, out_h, p.out, nq, 1e-6);
    snprintf(what, sizeof what, "block = whole sequence, lse, B=%d T=%d H=%d Hkv=%d hd=%d offset %d", B, T, H, Hkv, hd, offset);
    check_lse(what, lse_h, p.lse, nl);

    /* backward from zero gradients, then a second call on the same buffers: it accumulates
     * (+=), so they then hold twice the gradient */
    float *dq = device_alloc_floats(nq, MEM_BUFFERS), *dk = device_alloc_floats(nkv, MEM_BUFFERS);
    float *dv = device_alloc_floats(nkv, MEM_BUFFERS);
    for (int call = 1; call <= 2; call++) {
        attention_block_backward(dq, dk, dv, dout, out, lse, q, k, v, B, T, T, H, Hkv, hd, offset, offset);
        float *dq_h = tu_download_new(dq, nq), *dk_h = tu_download_new(dk, nkv), *dv_h = tu_download_new(dv, nkv);
        for (size_t i = 0; i < nq; i++) dq_h[i] /= (float)call;
        for (size_t i = 0; i < nkv; i++) { dk_h[i] /= (float)call; dv_h[i] /= (float)call; }
        snprintf(what, sizeof what, "block = whole sequence, dq / %d calls, H=%d Hkv=%d offset %d", call, H, Hkv, offset);
        check_rel(what, dq_h, p.dq, nq, 1e-6);
        snprintf(what, sizeof what, "block = whole sequence, dk / %d calls, H=%d Hkv=%d offset %d", call, H, Hkv, offset);
        check_rel(what, dk_h, p.dk, nkv, 1e-6);
        snprintf(what, sizeof what, "block = whole sequence, dv / %d calls, H=%d Hkv=%d offset %d", call, H, Hkv, offset);
        check_rel(what, dv_h, p.dv, nkv, 1e-6);
        free(dq_h); free(dk_h); free(dv_h);
    }

    device_free(q); device_free(k); device_free(v); device_free(dout); device_free(out); device_free(lse);
    device_free(dq); device_free(dk); device_free(dv);
    free(init); free(out_h); free(lse_h);
    free_problem(&p);
}

/* ---- 2. the ring: Cq query blocks x Ck key blocks ---------------------------------------------- */

/* The merged forward of every query block over every key block, into full out[B, T, H, hd] and
 * lse[B, H, T] (host). key_shift is added to every key offset: 0 is right, 1 is the bug the
 * test must catch. Key blocks are visited from the one after the query block's index, wrapping
 * around, so the first merges of early query blocks are fully masked blocks onto the empty
 * (0, -inf) start: -inf on both sides, then on one side. */
static void ring_forward(const problem *p, int Cq, int Ck, int key_shift, float *out_full,
                         float *lse_full) {
    int B = p->B, T = p->T, H = p->H, Hkv = p->Hkv, hd = p->hd;
    for (int qb = 0; qb < Cq; qb++) {
        int q0 = block_start(qb, Cq, T), Tq = block_start(qb + 1, Cq, T) - q0;
        size_t nq = (size_t)B * Tq * H * hd, nl = (size_t)B * H * Tq;
        float *h = malloc((nq ? nq : 1) * sizeof(float));
        slice_rows(h, p->q, B, T, q0, Tq, H * hd);
        float *q = tu_upload(h, nq);
        float *zeros = filled(nq, 0.0f), *minus_inf = filled(nl, -INFINITY);
        float *out = tu_upload(zeros, nq), *lse = tu_upload(minus_inf, nl);
        float *out_b = device_alloc_floats(nq, MEM_BUFFERS), *lse_b = device_alloc_floats(nl, MEM_BUFFERS);
        for (int s = 0; s < Ck; s++) {
            int kb = (qb + 1 + s) % Ck;
            int k0 = block_start(kb, Ck, T), Tk = block_start(kb + 1, Ck, T) - k0;
            size_t nkv = (size_t)B * Tk * Hkv * hd;
            float *hk = malloc((nkv ? nkv : 1) * sizeof(float)), *hv = malloc((nkv ? nkv : 1) * sizeof(float));
            slice_rows(hk, p->k, B, T, k0, Tk, Hkv * hd);
            slice_rows(hv, p->v, B, T, k0, Tk, Hkv * hd);
            float *k = tu_upload(hk, nkv), *v = tu_upload(hv, nkv);
            attention_block_forward(out_b, lse_b, q, k, v, B, Tq, Tk, H, Hkv, hd, q0, k0 + key_shift);
            if (key_shift == 0 && Tq > 0 && k0 > q0 + Tq - 1) {
                /* a fully masked block: exactly zero output and -inf lse, no NaN */
                float *ob = tu_download_new(out_b, nq), *lb = tu_download_new(lse_b, nl);
                int bad = 0;
                for (size_t i = 0; i < nq; i++) bad += ob[i] != 0.0f;
                for (size_t i = 0; i < nl; i++) bad += !(isinf(lb[i]) && lb[i] < 0);
                CHECK(bad == 0, "fully masked block (q %d+%d, k %d+%d): %d values not 0 / -inf", q0, Tq, k0, Tk, bad);
                free(ob); free(lb);
            }
            attention_merge(out, lse, out_b, lse_b, B, Tq, H, hd);
            device_free(k); device_free(v);
            free(hk); free(hv);
        }
        float *out_h = tu_download_new(out, nq), *lse_h = tu_download_new(lse, nl);
        unslice_rows(out_full, out_h, B, T, q0, Tq, H * hd);
        unslice_lse(lse_full, lse_h, B * H, T, q0, Tq);
        device_free(q); device_free(out); device_free(lse); device_free(out_b); device_free(lse_b);
        free(h); free(zeros); free(minus_inf); free(out_h); free(lse_h);
    }
}

/* The backward of every (query block, key block) pair with the final out and lse; dq of a
 * query block accumulates over the key blocks, dk and dv of a key block over the query blocks
 * (both start at zero, as the += contract asks). */
static void ring_backward(const problem *p, int Cq, int Ck, const float *out_full,
                          const float *lse_full, float *dq_full, float *dk_full, float *dv_full) {
    int B = p->B, T = p->T, H = p->H, Hkv = p->Hkv, hd = p->hd;
    float **dk = calloc(Ck, sizeof(float *)), **dv = calloc(Ck, sizeof(float *));
    for (int kb = 0; kb < Ck; kb++) {
        size_t nkv = (size_t)B * (block_start(kb + 1, Ck, T) - block_start(kb, Ck, T)) * Hkv * hd;
        dk[kb] = device_alloc_floats(nkv, MEM_BUFFERS);   /* zeroed by device_alloc */
        dv[kb] = device_alloc_floats(nkv, MEM_BUFFERS);
    }
    for (int qb = 0; qb < Cq; qb++) {
        int q0 = block_start(qb, Cq, T), Tq = block_start(qb + 1, Cq, T) - q0;
        size_t nq = (size_t)B * Tq * H * hd, nl = (size_t)B * H * Tq;
        float *h = malloc((nq ? nq : 1) * sizeof(float)), *hl = malloc((nl ? nl : 1) * sizeof(float));
        slice_rows(h, p->q, B, T, q0, Tq, H * hd);
        float *q = tu_upload(h, nq);
        slice_rows(h, p->dout, B, T, q0, Tq, H * hd);
        float *dout = tu_upload(h, nq);
        slice_rows(h, out_full, B, T, q0, Tq, H * hd);
        float *out = tu_upload(h, nq);
        slice_lse(hl, lse_full, B * H, T, q0, Tq);
        float *lse = tu_upload(hl, nl);
        float *dq = device_alloc_floats(nq, MEM_BUFFERS);
        for (int kb = 0; kb < Ck; kb++) {
            int k0 = block_start(kb, Ck, T), Tk = block_start(kb + 1, Ck, T) - k0;
            size_t nkv = (size_t)B * Tk * Hkv * hd;
            float *hk = malloc((nkv ? nkv : 1) * sizeof(float)), *hv = malloc((nkv ? nkv : 1) * sizeof(float));
            slice_rows(hk, p->k, B, T, k0, Tk, Hkv * hd);
            slice_rows(hv, p->v, B, T, k0, Tk, Hkv * hd);
            float *k = tu_upload(hk, nkv), *v = tu_upload(hv, nkv);
            attention_block_backward(dq, dk[kb], dv[kb], dout, out, lse, q, k, v, B, Tq, Tk, H, Hkv, hd, q0, k0);
            device_free(k); device_free(v);
            free(hk); free(hv);
        }
        float *dq_h = tu_download_new(dq, nq);
        unslice_rows(dq_full, dq_h, B, T, q0, Tq, H * hd);
        device_free(q); device_free(dout); device_free(out); device_free(lse); device_free(dq);
        free(h); free(hl); free(dq_h);
    }
    for (int kb = 0; kb < Ck; kb++) {
        int k0 = block_start(kb, Ck, T), Tk = block_start(kb + 1, Ck, T) - k0;
        size_t nkv = (size_t)B * Tk * Hkv * hd;
        float *hk = tu_download_new(dk[kb], nkv), *hv = tu_download_new(dv[kb], nkv);
        unslice_rows(dk_full, hk, B, T, k0, Tk, Hkv * hd);
        unslice_rows(dv_full, hv, B, T, k0, Tk, Hkv * hd);
        device_free(dk[kb]); device_free(dv[kb]);
        free(hk); free(hv);
    }
    free(dk); free(dv);
}

static void test_ring(int B, int T, int H, int Hkv, int hd) {
    char what[128];
    problem p = make_problem(B, T, H, Hkv, hd);
    size_t nq = nq_of(&p), nkv = nkv_of(&p), nl = (size_t)B * H * T;
    float *out = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float));
    float *dq = malloc(nq * sizeof(float)), *dk = malloc(nkv * sizeof(float)), *dv = malloc(nkv * sizeof(float));
    for (int Cq = 1; Cq <= 4; Cq++)
        for (int Ck = 1; Ck <= 4; Ck++) {
            ring_forward(&p, Cq, Ck, 0, out, lse);
            snprintf(what, sizeof what, "ring %dx%d blocks, merged out, B=%d T=%d H=%d Hkv=%d hd=%d", Cq, Ck, B, T, H, Hkv, hd);
            check_rel(what, out, p.out, nq, 1e-6);
            snprintf(what, sizeof what, "ring %dx%d blocks, merged lse, H=%d Hkv=%d", Cq, Ck, H, Hkv);
            check_lse(what, lse, p.lse, nl);
            ring_backward(&p, Cq, Ck, out, lse, dq, dk, dv);
            snprintf(what, sizeof what, "ring %dx%d blocks, dq, B=%d T=%d H=%d Hkv=%d hd=%d", Cq, Ck, B, T, H, Hkv, hd);
            check_rel(what, dq, p.dq, nq, 1e-6);
            snprintf(what, sizeof what, "ring %dx%d blocks, dk, B=%d T=%d H=%d Hkv=%d hd=%d", Cq, Ck, B, T, H, Hkv, hd);
            check_rel(what, dk, p.dk, nkv, 1e-6);
            snprintf(what, sizeof what, "ring %dx%d blocks, dv, B=%d T=%d H=%d Hkv=%d hd=%d", Cq, Ck, B, T, H, Hkv, hd);
            check_rel(what, dv, p.dv, nkv, 1e-6);
        }
    /* the comparison sees a key offset that is off by one (the mask moves by one position) */
    ring_forward(&p, 2, 3, 1, out, lse);
    double e = rel_error(out, p.out, nq);
    CHECK(e > 1e-2, "ring with key offsets off by one: relative error only %.3g, the test is blind", e);
    free(out); free(lse); free(dq); free(dk); free(dv);
    free_problem(&p);
}

/* ---- attention_merge on its own ------------------------------------------------------------------ */

static void test_merge(void) {
    /* B = 1, T = 6, H = 1, hd = 2: one row per case (lse_a, lse_b) */
    enum { MT = 6, MHD = 2 };
    const float la[MT] = {-INFINITY, 0.3f, -INFINITY, 1000.0f, -1000.0f, 2.0f};
    const float lb[MT] = {-INFINITY, -INFINITY, -0.7f, 1000.5f, -999.0f, 2.0f};
    float oa[MT * MHD], ob[MT * MHD];
    for (int i = 0; i < MT * MHD; i++) { oa[i] = rand_uniform(-1, 1); ob[i] = rand_uniform(-1, 1); }
    for (int d = 0; d < MHD; d++) oa[d] = ob[d] = 0.0f;            /* row 0: both empty */
    for (int d = 0; d < MHD; d++) ob[1 * MHD + d] = 0.0f;           /* row 1: b empty */
    for (int d = 0; d < MHD; d++) oa[2 * MHD + d] = 0.0f;           /* row 2: a empty */
    float *out = tu_upload(oa, MT * MHD), *lse = tu_upload(la, MT), *out_b = tu_upload(ob, MT * MHD), *lse_b = tu_upload(lb, MT);
    attention_merge(out, lse, out_b, lse_b, 1, MT, 1, MHD);
    float *got = tu_download_new(out, MT * MHD), *got_l = tu_download_new(lse, MT);
    for (int t = 0; t < MT; t++) {
        double A = la[t], Bv = lb[t];
        double m = fmax(A, Bv), want_l = m == -INFINITY ? -INFINITY : m + log(exp(A - m) + exp(Bv - m));
        if (want_l == -INFINITY) CHECK(isinf(got_l[t]) && got_l[t] < 0, "merge row %d: lse %g, want -inf", t, got_l[t]);
        else CHECK_CLOSE(got_l[t], want_l, 1e-6, 1e-6, "merge lse");
        /* an lse of 1000 is held to fp32's 6e-5; e^(lse - lse') turns that absolute error into a
         * relative one of the output, so the tolerance grows with |lse| */
        double rtol = 1e-5 + FLT_EPSILON * (want_l == -INFINITY ? 0.0 : fabs(want_l));
        for (int d = 0; d < MHD; d++) {
            double want = want_l == -INFINITY ? 0.0
                        : oa[t * MHD + d] * exp(A - want_l) + ob[t * MHD + d] * exp(Bv - want_l);
            CHECK_CLOSE(got[t * MHD + d], want, 1e-6, rtol, "merge out");
        }
    }
    device_free(out); device_free(lse); device_free(out_b); device_free(lse_b);
    free(got); free(got_l);
}

/* ---- 4. finite differences ------------------------------------------------------------------------- */


/* Queries q[1, Tq, H, hd] at q_offset against `nblocks` key blocks (k, v [1, Tk, Hkv, hd] each,
 * the blocks one after another in the host arrays) at offsets k_offsets[]; out is the merge of
 * the blocks (one block: its own forward). L = sum(out * r). */
enum { FD_TQ = 3, FD_TK = 3, FD_H = 2, FD_HKV = 1, FD_HD = 2, FD_MAXBLOCKS = 2 };
typedef struct {
    int nblocks, q_offset, k_offsets[FD_MAXBLOCKS];
    float q[FD_TQ * FD_H * FD_HD], r[FD_TQ * FD_H * FD_HD];
    float k[FD_MAXBLOCKS * FD_TK * FD_HKV * FD_HD], v[FD_MAXBLOCKS * FD_TK * FD_HKV * FD_HD];
} fd_ctx;
#define FD_NQ (FD_TQ * FD_H * FD_HD)
#define FD_NKV (FD_TK * FD_HKV * FD_HD)
#define FD_NL (FD_H * FD_TQ)

/* The forward of the context: device out and lse (caller frees). */
static void fd_forward(const fd_ctx *c, float **out_dev, float **lse_dev) {
    float *q = tu_upload(c->q, FD_NQ);
    float *zeros = filled(FD_NQ, 0.0f), *minus_inf = filled(FD_NL, -INFINITY);
    float *out = tu_upload(zeros, FD_NQ), *lse = tu_upload(minus_inf, FD_NL);
    float *out_b = device_alloc_floats(FD_NQ, MEM_BUFFERS), *lse_b = device_alloc_floats(FD_NL, MEM_BUFFERS);
    for (int blk = 0; blk < c->nblocks; blk++) {
        float *k = tu_upload(c->k + blk * FD_NKV, FD_NKV), *v = tu_upload(c->v + blk * FD_NKV, FD_NKV);
        attention_block_forward(out_b, lse_b, q, k, v, 1, FD_TQ, FD_TK, FD_H, FD_HKV, FD_HD,
                                c->q_offset, c->k_offsets[blk]);
        attention_merge(out, lse, out_b, lse_b, 1, FD_TQ, FD_H, FD_HD);
        device_free(k); device_free(v);
    }
    device_free(q); device_free(out_b); device_free(lse_b);
    free(zeros); free(minus_inf);
    *out_dev = out;
    *lse_dev = lse;
}
static double fd_loss(void *p) {
    fd_ctx *c = p;
    float *out, *lse;
    fd_forward(c, &out, &lse);
    float *h = tu_download_new(out, FD_NQ);
    double L = 0;
    for (int i = 0; i < FD_NQ; i++) L += (double)h[i] * c->r[i];
    device_free(out); device_free(lse); free(h);
    return L;
}

static void test_finite_differences(int nblocks, int q_offset, const int *k_offsets, const char *name) {
    char what[128];
    fd_ctx c;
    c.nblocks = nblocks;
    c.q_offset = q_offset;
    for (int blk = 0; blk < nblocks; blk++) c.k_offsets[blk] = k_offsets[blk];
    for (int i = 0; i < FD_NQ; i++) { c.q[i] = rand_uniform(-1.5f, 1.5f); c.r[i] = rand_uniform(-1, 1); }
    for (int i = 0; i < nblocks * FD_NKV; i++) { c.k[i] = rand_uniform(-1.5f, 1.5f); c.v[i] = rand_uniform(-1, 1); }

    /* analytic: the final out and lse, then every block's backward (all += from zero) */
    float *out, *lse;
    fd_forward(&c, &out, &lse);
    float *q = tu_upload(c.q, FD_NQ), *r = tu_upload(c.r, FD_NQ), *dq = device_alloc_floats(FD_NQ, MEM_BUFFERS);
    float dq_h[FD_NQ], dk_h[FD_MAXBLOCKS * FD_NKV], dv_h[FD_MAXBLOCKS * FD_NKV];
    for (int blk = 0; blk < nblocks; blk++) {
        float *k = tu_upload(c.k + blk * FD_NKV, FD_NKV), *v = tu_upload(c.v + blk * FD_NKV, FD_NKV);
        float *dk = device_alloc_floats(FD_NKV, MEM_BUFFERS), *dv = device_alloc_floats(FD_NKV, MEM_BUFFERS);
        attention_block_backward(dq, dk, dv, r, out, lse, q, k, v, 1, FD_TQ, FD_TK, FD_H, FD_HKV,
                                 FD_HD, q_offset, k_offsets[blk]);
        device_copy_to_host(dk_h + blk * FD_NKV, dk, sizeof(float) * FD_NKV);
        device_copy_to_host(dv_h + blk * FD_NKV, dv, sizeof(float) * FD_NKV);
        device_free(k); device_free(v); device_free(dk); device_free(dv);
    }
    device_copy_to_host(dq_h, dq, sizeof dq_h);

    double num_q[FD_NQ], num_kv[FD_MAXBLOCKS * FD_NKV];
    finite_differences(fd_loss, &c, c.q, FD_NQ, num_q);
    snprintf(what, sizeof what, "FD %s: dq", name);
    check_grad(what, dq_h, num_q, FD_NQ);
    finite_differences(fd_loss, &c, c.k, (size_t)nblocks * FD_NKV, num_kv);
    snprintf(what, sizeof what, "FD %s: dk", name);
    check_grad(what, dk_h, num_kv, (size_t)nblocks * FD_NKV);
    finite_differences(fd_loss, &c, c.v, (size_t)nblocks * FD_NKV, num_kv);
    snprintf(what, sizeof what, "FD %s: dv", name);
    check_grad(what, dv_h, num_kv, (size_t)nblocks * FD_NKV);

    if (nblocks == 1 && q_offset == 1 && k_offsets[0] == 2) {
        /* query 0 (position 1) sees no key (positions 2..4): out 0, lse -inf, dq 0;
         * key 2 (position 4) is seen by no query (positions 1..3): dk = dv = 0 */
        float *out_h = tu_download_new(out, FD_NQ), *lse_h = tu_download_new(lse, FD_NL);
        int bad = 0;
        for (int h = 0; h < FD_H; h++) {
            bad += !(isinf(lse_h[h * FD_TQ]) && lse_h[h * FD_TQ] < 0);
            for (int d = 0; d < FD_HD; d++) bad += out_h[h * FD_HD + d] != 0.0f || dq_h[h * FD_HD + d] != 0.0f;
        }
        for (int e = 0; e < FD_HKV * FD_HD; e++) bad += dk_h[2 * FD_HKV * FD_HD + e] != 0.0f || dv_h[2 * FD_HKV * FD_HD + e] != 0.0f;
        for (int i = 0; i < FD_NQ; i++) bad += isnan(out_h[i]) || isnan(dq_h[i]);
        CHECK(bad == 0, "FD %s: %d values of the empty query row / unseen key are not 0 (or -inf)", name, bad);
        free(out_h); free(lse_h);
    }
    device_free(out); device_free(lse); device_free(q); device_free(r); device_free(dq);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    /* 1. Tq = Tk = T: attention_forward / attention_backward (offsets 0, and equal non-zero) */
    test_whole_sequence(2, 7, 4, 2, 4, 0);   /* grouped-query: two query heads per kv head */
    test_whole_sequence(1, 5, 2, 2, 8, 0);   /* plain multi-head */
    test_whole_sequence(1, 6, 3, 1, 2, 0);   /* multi-query */
    test_whole_sequence(2, 5, 4, 2, 4, 11);  /* the mask depends on offsets only through their difference */
    /* 2 and 3. the ring, Cq x Ck in 1..4 x 1..4 (T = 7: uneven blocks, T = 3: empty blocks) */
    test_ring(2, 7, 4, 2, 4);
    test_ring(1, 8, 2, 2, 8);
    test_ring(1, 6, 3, 1, 2);
    test_ring(1, 3, 4, 2, 2);
    test_merge();
    /* 4. finite differences: one block with an empty row and an unseen key; two merged blocks
     * (the first cut by the diagonal, the second fully visible) */
    const int one[1] = {2}, two[2] = {3, 0};
    test_finite_differences(1, 1, one, "one block, q at 1, k at 2");
    test_finite_differences(2, 2, two, "two merged blocks, q at 2, k at 3 and 0");
    printf("test_attention_block: worst relative error against attention_forward/backward %.3g\n", worst_rel);
    CHECK(mem_current_total() == 0, "allocator still counts %zu bytes after freeing everything", mem_current_total());
    int rc = tu_finish("test_attention_block");
    comm_finalize();
    return rc;
}
