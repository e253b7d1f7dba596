/* ranks: 1 2 4 */
/* test_ring_attention.c: chapter 06's attention operator (06_context_parallel/context_parallel.h)
 * on its own, against full causal attention of the whole sequence.
 *
 * On the mesh cp = world size (C ranks), for each method (ring, allgather, and alltoall where the
 * heads and kv heads divide by C) and each balance
 * (contiguous, zigzag), the single-device plan with context_parallel_apply is given random global
 * q [B, T, H, hd], k, v [B, T, Hkv, hd] and dout (the same on every rank: one fixed seed). Each rank
 * takes its rows at the plan's positions, runs plan.attention.forward and .backward on them, and
 * compares
 *   - its rows of out with attention_forward on the whole sequence,
 *   - its rows of dq, dk, dv with attention_backward on the whole sequence,
 * per tensor as max|got - want| / max|want| over this rank's rows (the parity check's measure for
 * gradients), within 1e-6: the blocks sum the same products in another order and merge them by
 * log-sum-exp, which moves the results by a few fp32 roundings (about 1e-7 of the tensor's scale),
 * while a wrong block, mask or merge moves them by 1e-2 or more. Shapes: grouped-query heads (H = 4
 * with Hkv = 2 and Hkv = 1, and H = 8 with Hkv = 4 for alltoall at C = 4) and plain multi-head;
 * T = 24 gives chunks of 3 rows at C = 4, T = 200 uneven causal query blocks (66, 67, 67).
 *
 * In bf16 (--dtype bf16: each attention product's operands rounded, the K/V blocks on the wire as
 * bf16; one rank included, whose two chunks are two blocks) the reference is the --check baseline's attention for the method (context_parallel_baseline:
 * the same blocks on one device, over the whole sequence), within the same 1e-6: the blocks are
 * the same calls on the same values, merged in another order; and bf16 is not blind: the result is
 * at least 1e-4 from the fp32 one.
 *
 * Also: the positions of the ranks are the documented chunks (cp_chunks_of) and together cover
 * every position once; out, dq, dk, dv are written (=) over whatever the buffers held; the work
 * counter equals cp_work_formula on every rank (alltoall: cp_alltoall_work_formula); and
 * the comparison is not blind: the chapter's deliberate bug (--fault no-lse-rescale) is far off,
 * at every C, for the methods that merge blocks (alltoall, which merges none, refuses it).
 * Every tensor goes through device_alloc and device copies, so the same test runs on CUDA.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "llama_kernels.h"
#include "mesh.h"
#include "plan.h"
#include "test_device.h"
#include "test_util.h"
#include "../06_context_parallel/context_parallel.h"

/* ---- helpers -------------------------------------------------------------------------------- */

static float *random_floats(uint64_t *state, size_t n) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = tu_rand_uniform(state, -1, 1);
    return x;
}
static void fill_device(float *dev, size_t n, float value) {
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = value;
    device_copy_to_device(dev, h, n * sizeof(float));
    free(h);
}
/* The rows at pos[0 .. Tl) of every sequence of x [B, T, W] -> [B, Tl, W]. */
static void take_rows(float *dst, const float *src, const int *pos, int B, int T, int Tl, int W) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl; t++)
            memcpy(dst + ((size_t)b * Tl + t) * W, src + ((size_t)b * T + pos[t]) * W, (size_t)W * sizeof(float));
}
/* max|got - want| / max|want|; a NaN makes it infinite. */
static double rel_error(const float *got, const float *want, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) return INFINITY;
        diff = fmax(diff, fabs((double)got[i] - want[i]));
        scale = fmax(scale, fabs((double)want[i]));
    }
    return scale > 0 ? diff / scale : diff;
}
static double worst_rel = 0;   /* over every exact comparison, printed at the end */
static void check_rel(const char *what, const float *got, const float *want, size_t n) {
    double e = rel_error(got, want, n);
    worst_rel = fmax(worst_rel, e);
    CHECK(e <= 1e-6, "%s: relative error %.3g > 1e-6", what, e);
}

/* ---- the whole-sequence reference ----------------------------------------------------------- */

typedef struct {
    int B, T, H, Hkv, hd;
    float *q, *k, *v, *dout;          /* global inputs (host) */
    float *out, *dq, *dk, *dv;        /* attention_forward / attention_backward (host) */
} problem;

static problem make_problem(int B, int T, int H, int Hkv, int hd, uint64_t seed) {
    problem p = {B, T, H, Hkv, hd, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t nq = (size_t)B * T * H * hd, nkv = (size_t)B * T * Hkv * hd;
    uint64_t state = seed;   /* the same numbers on every rank */
    p.q = random_floats(&state, nq);
    p.k = random_floats(&state, nkv);
    p.v = random_floats(&state, nkv);
    p.dout = random_floats(&state, nq);
    tu_full_attention(p.q, p.k, p.v, p.dout, B, T, H, Hkv, hd, &p.out, &p.dq, &p.dk, &p.dv);
    return p;
}
/* The --check baseline's attention in bf16 for `method` over C ranks (context_parallel_baseline),
 * on this rank's one device, over the whole sequence: out, dq, dk, dv (host). */
static void bf16_reference(const problem *p, cp_method method, int C, float **out_h, float **dq_h, float **dk_h,
                           float **dv_h) {
    int B = p->B, T = p->T, H = p->H, Hkv = p->Hkv, hd = p->hd;
    size_t nq = (size_t)B * T * H * hd, nkv = (size_t)B * T * Hkv * hd;
    llama_plan base = plan_single_device();
    cp_options o = {.method = method, .balance = CP_ZIGZAG};
    CHECK(context_parallel_baseline(&base, DTYPE_BF16, &o, C), "context_parallel_baseline installed nothing at C = %d", C);
    float *q = tu_upload(p->q, nq), *k = tu_upload(p->k, nkv), *v = tu_upload(p->v, nkv), *dout = tu_upload(p->dout, nq);
    float *out = device_alloc_floats(nq, MEM_BUFFERS), *lse = device_alloc_floats((size_t)B * H * T, MEM_BUFFERS);
    float *dq = device_alloc_floats(nq, MEM_BUFFERS), *dk = device_alloc_floats(nkv, MEM_BUFFERS);
    float *dv = device_alloc_floats(nkv, MEM_BUFFERS);
    base.attention.forward(base.attention.state, &base, DTYPE_BF16, out, lse, q, k, v, B, T, H, Hkv, hd);
    base.attention.backward(base.attention.state, &base, DTYPE_BF16, dq, dk, dv, NULL, dout, out, q, k, v, lse, B, T, H,
                            Hkv, hd);
    *out_h = tu_download_new(out, nq);
    *dq_h = tu_download_new(dq, nq);
    *dk_h = tu_download_new(dk, nkv);
    *dv_h = tu_download_new(dv, nkv);
    float *bufs[] = {q, k, v, dout, out, lse, dq, dk, dv};
    for (int i = 0; i < 9; i++) device_free(bufs[i]);
    plan_free(&base);
}

static void free_problem(problem *p) {
    free(p->q); free(p->k); free(p->v); free(p->dout);
    free(p->out); free(p->dq); free(p->dk); free(p->dv);
}

/* ---- one (method, balance, shape) ---------------------------------------------------------- */

/* This rank's rows through the plan's attention: out, dq, dk, dv (host, [B, Tl, ...]). With
 * `fault`, the chapter's deliberate bug is applied to the plan first. Returns the relative error
 * of out (for the blindness check). */
static double run_case(device_mesh *mesh, const problem *p, cp_method method, cp_balance balance, bool fault,
                       dtype compute) {
    char what[160];
    int C = mesh->group[MESH_CP]->size, r = mesh->group[MESH_CP]->rank;
    int B = p->B, T = p->T, H = p->H, Hkv = p->Hkv, hd = p->hd, Tl = T / C, Tc = Tl / 2;
    llama_config cfg = llama_config_default();
    cfg.seq_len = T;
    cfg.n_heads = H;
    cfg.n_kv_heads = Hkv;
    cp_options o = {.method = method, .balance = balance};
    llama_plan plan = plan_single_device();
    context_parallel_apply(&plan, mesh, &cfg, &o);
    if (fault) CHECK(context_parallel_faults[0].apply(&plan) == NULL, "the fault %s does not apply", context_parallel_faults[0].name);
    char name[32];
    snprintf(name, sizeof name, "%s%s", cp_method_name(method), compute == DTYPE_BF16 ? " bf16" : "");
    const char *bal = cp_balance_name(balance);

    /* the positions: chunks[0], then chunks[1], each Tc consecutive positions */
    int *pos = malloc((size_t)Tl * sizeof(int)), chunks[2];
    CHECK(plan.sequence.positions != NULL && plan.groups.cp == mesh->group[MESH_CP], "%s %s: the plan has no positions or no cp group", name, bal);
    plan.sequence.positions(plan.sequence.state, &plan, pos, Tl);
    cp_chunks_of(balance, r, C, chunks);
    int bad = 0;
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < Tc; t++) bad += pos[i * Tc + t] != chunks[i] * Tc + t;
    CHECK(bad == 0, "%s %s C=%d rank %d: %d positions are not those of chunks %d, %d", name, bal, C, r, bad, chunks[0], chunks[1]);
    /* every position of the sequence is held by exactly one rank */
    float *held_h = calloc((size_t)T, sizeof(float));
    for (int t = 0; t < Tl; t++) held_h[pos[t]] += 1;
    float *held = tu_upload(held_h, T);
    comm_all_reduce(plan.groups.cp, held, T, COMM_SUM);
    device_copy_to_host(held_h, held, T * sizeof(float));
    bad = 0;
    for (int t = 0; t < T; t++) bad += held_h[t] != 1.0f;
    CHECK(bad == 0, "%s %s C=%d: %d positions are not held by exactly one rank", name, bal, C, bad);
    device_free(held);
    free(held_h);

    /* this rank's rows of the inputs and of the reference */
    size_t nq = (size_t)B * Tl * H * hd, nkv = (size_t)B * Tl * Hkv * hd;
    float *h = malloc(nq * sizeof(float));
    take_rows(h, p->q, pos, B, T, Tl, H * hd);
    float *q = tu_upload(h, nq);
    take_rows(h, p->dout, pos, B, T, Tl, H * hd);
    float *dout = tu_upload(h, nq);
    take_rows(h, p->k, pos, B, T, Tl, Hkv * hd);
    float *k = tu_upload(h, nkv);
    take_rows(h, p->v, pos, B, T, Tl, Hkv * hd);
    float *v = tu_upload(h, nkv);
    float *want_out = malloc(nq * sizeof(float)), *want_dq = malloc(nq * sizeof(float));
    float *want_dk = malloc(nkv * sizeof(float)), *want_dv = malloc(nkv * sizeof(float));
    float *ref[4] = {p->out, p->dq, p->dk, p->dv};
    if (compute == DTYPE_BF16) bf16_reference(p, method, C, &ref[0], &ref[1], &ref[2], &ref[3]);
    take_rows(want_out, ref[0], pos, B, T, Tl, H * hd);
    take_rows(want_dq, ref[1], pos, B, T, Tl, H * hd);
    take_rows(want_dk, ref[2], pos, B, T, Tl, Hkv * hd);
    take_rows(want_dv, ref[3], pos, B, T, Tl, Hkv * hd);
    if (compute == DTYPE_BF16) {   /* not blind: bf16 is far from fp32 (p's own reference) */
        float *fp32_out = malloc(nq * sizeof(float));
        take_rows(fp32_out, p->out, pos, B, T, Tl, H * hd);
        double e = rel_error(want_out, fp32_out, nq);
        CHECK(e > 1e-4, "%s C=%d rank %d: bf16 attention within %.3g of fp32's, the rounding did not happen", name, C, r, e);
        free(fp32_out);
        for (int i = 0; i < 4; i++) free(ref[i]);
    }

    /* forward: out and the saved buffer start as garbage (out is =, the lse is the operator's) */
    size_t nsaved = (size_t)B * H * Tl * Tl;
    float *out = device_alloc_floats(nq, MEM_BUFFERS), *saved = device_alloc_floats(nsaved, MEM_BUFFERS);
    fill_device(out, nq, 9.0f);
    fill_device(saved, nsaved, 9.0f);
    plan.attention.forward(plan.attention.state, &plan, compute, out, saved, q, k, v, B, Tl, H, Hkv, hd);
    float *got = tu_download_new(out, nq);
    double e_out = rel_error(got, want_out, nq);
    snprintf(what, sizeof what, "%s %s C=%d rank %d, out, B=%d T=%d H=%d Hkv=%d hd=%d", name, bal, C, r, B, T, H, Hkv, hd);
    if (!fault) check_rel(what, got, want_out, nq);
    free(got);

    /* the work of this forward, per (sequence, head), beside the closed form */
    double work = context_parallel_work(&plan);
    double formula = method == CP_ALLTOALL ? cp_alltoall_work_formula(C, T) : cp_work_formula(balance, r, C, T);
    CHECK(work == formula, "%s %s C=%d rank %d T=%d: work %.0f, formula %.0f", name, bal, C, r, T, work, formula);

    if (!fault) {
        /* backward: dq, dk, dv start as garbage (all three are =); dprobs is not used (NULL) */
        float *dq = device_alloc_floats(nq, MEM_BUFFERS), *dk = device_alloc_floats(nkv, MEM_BUFFERS);
        float *dv = device_alloc_floats(nkv, MEM_BUFFERS);
        fill_device(dq, nq, 9.0f);
        fill_device(dk, nkv, 9.0f);
        fill_device(dv, nkv, 9.0f);
        plan.attention.backward(plan.attention.state, &plan, compute, dq, dk, dv, NULL, dout, out, q, k, v, saved, B, Tl, H, Hkv, hd);
        float *g = tu_download_new(dq, nq);
        snprintf(what, sizeof what, "%s %s C=%d rank %d, dq, B=%d T=%d H=%d Hkv=%d hd=%d", name, bal, C, r, B, T, H, Hkv, hd);
        check_rel(what, g, want_dq, nq);
        free(g);
        g = tu_download_new(dk, nkv);
        snprintf(what, sizeof what, "%s %s C=%d rank %d, dk, B=%d T=%d H=%d Hkv=%d hd=%d", name, bal, C, r, B, T, H, Hkv, hd);
        check_rel(what, g, want_dk, nkv);
        free(g);
        g = tu_download_new(dv, nkv);
        snprintf(what, sizeof what, "%s %s C=%d rank %d, dv, B=%d T=%d H=%d Hkv=%d hd=%d", name, bal, C, r, B, T, H, Hkv, hd);
        check_rel(what, g, want_dv, nkv);
        free(g);
        device_free(dq); device_free(dk); device_free(dv);
    }

    device_free(q); device_free(k); device_free(v); device_free(dout); device_free(out); device_free(saved);
    free(h); free(pos); free(want_out); free(want_dq); free(want_dk); free(want_dv);
    plan_free(&plan);
    return e_out;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    int C = comm_world()->size;
    device_mesh *mesh = mesh_create((mesh_shape){.cp = C}, NULL);
    /* B, T, H, Hkv, hd: T divisible by 2C for C = 1, 2, 4 (T = 24: chunks of 3 rows at C = 4).
     * T = 200: three causal query blocks of 66, 67 and 67 rows in the all-to-all's attention of
     * whole sequences (below T = 128 it is one block) */
    const int shapes[][5] = {{2, 32, 4, 2, 8}, {1, 24, 4, 1, 4}, {2, 16, 2, 2, 16}, {2, 16, 8, 4, 4}, {2, 200, 8, 4, 4}};
    uint64_t seed = 0x2545F4914F6CDD1Dull;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int *z = shapes[s];
        problem p = make_problem(z[0], z[1], z[2], z[3], z[4], seed + s);
        bool heads_divide = z[2] % C == 0 && z[3] % C == 0;   /* what alltoall needs */
        for (int m = 0; m < CP_NMETHODS; m++)
            for (int b = 0; b < CP_NBALANCES; b++)
                if (m != CP_ALLTOALL || heads_divide) run_case(mesh, &p, (cp_method)m, (cp_balance)b, false, DTYPE_F32);
        /* bf16 against the --check baseline's blocks (one balance: the blocks are the same) */
        for (int m = 0; m < CP_NMETHODS; m++)
            if (m != CP_ALLTOALL || heads_divide) run_case(mesh, &p, (cp_method)m, CP_ZIGZAG, false, DTYPE_BF16);
        /* not blind: the deliberate bug adds the blocks' partial results without rescaling them.
         * Every rank holds a query chunk that sees two key chunks (even at C = 1), so every rank's
         * out is far off. */
        for (int m = 0; m < CP_NMETHODS; m++) {
            if (m == CP_ALLTOALL) continue;
            double e = run_case(mesh, &p, (cp_method)m, CP_ZIGZAG, true, DTYPE_F32);
            CHECK(e > 1e-2, "%s with --fault no-lse-rescale, shape %zu: relative error only %.3g, the test is blind",
                  cp_method_name((cp_method)m), s, e);
        }
        free_problem(&p);
    }
    /* alltoall refuses the fault: it has no merge to break */
    llama_config cfg = llama_config_default();
    cp_options all_to_all = {.method = CP_ALLTOALL, .balance = CP_ZIGZAG};
    llama_plan plan = plan_single_device();
    context_parallel_apply(&plan, mesh, &cfg, &all_to_all);
    CHECK(context_parallel_faults[0].apply(&plan) != NULL, "alltoall accepted --fault %s", context_parallel_faults[0].name);
    plan_free(&plan);

    /* the documented chunks: C = 2, contiguous 0 1 | 2 3, zigzag 0 3 | 1 2 */
    int ch[2];
    cp_chunks_of(CP_CONTIGUOUS, 1, 2, ch);
    CHECK(ch[0] == 2 && ch[1] == 3, "contiguous rank 1 of 2: chunks %d %d, want 2 3", ch[0], ch[1]);
    cp_chunks_of(CP_ZIGZAG, 0, 2, ch);
    CHECK(ch[0] == 0 && ch[1] == 3, "zigzag rank 0 of 2: chunks %d %d, want 0 3", ch[0], ch[1]);
    cp_chunks_of(CP_ZIGZAG, 1, 2, ch);
    CHECK(ch[0] == 1 && ch[1] == 2, "zigzag rank 1 of 2: chunks %d %d, want 1 2", ch[0], ch[1]);

    if (comm_world()->rank == 0)
        printf("test_ring_attention: C = %d, worst relative error against attention_forward/backward %.3g\n", C, worst_rel);
    CHECK(mem_current_total() == 0, "allocator still counts %zu bytes after freeing everything", mem_current_total());
    int rc = tu_finish("test_ring_attention");
    rc = (int)comm_host_max(comm_world(), rc);   /* every rank exits alike */
    comm_finalize();
    return rc;
}
