/* cp_report.c: chapter 06's measured figures beside their formulas (cp_report.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "files.h"
#include "gemm.h"
#include "llama_kernels.h"
#include "log.h"
#include "parity.h"
#include "report.h"
#include "cp_report.h"

/* Each rank's score elements per (sequence, head) in one layer's forward, beside the formula. */
int cp_report_attention_work(const llama_plan *plan, const cp_options *o, int T) {
    int C = plan->groups.cp->size, r = plan->groups.cp->rank;
    bool dense = o->method == CP_ALLTOALL;   /* whole sequences, H / C heads */
    float mine[2] = {(float)context_parallel_work(plan),
                     (float)(dense ? cp_alltoall_work_formula(C, T) : cp_work_formula(o->balance, r, C, T))};
    comm_group *w = comm_world();
    float *all = w->rank == 0 ? malloc(2 * sizeof(float) * w->size) : NULL;
    comm_host_gather(w, mine, all, 2, 0);
    int bad = 0;
    char blocks[96];
    int nb = causal_query_blocks(T);
    snprintf(blocks, sizeof blocks, "(T^2 + sum s_i^2) / 2C, %d causal query block%s s_i", nb, nb == 1 ? "" : "s");
    const char *formula = dense ? blocks : "pairs x Tc^2";
    /* BEGIN SOLUTION 06: the attention work */
    if (!dense) formula = o->balance == CP_ZIGZAG ? "(2C + 1) Tc^2" : "(4 r + 3) Tc^2";
    /* END SOLUTION */
    log0("attention work per rank, score elements per sequence and head in one layer's forward "
         "(measured | formula, Tc = T / 2C = %d):\n", T / (2 * C));
    for (int q = 0; all && q < w->size; q++) {
        bool ok = all[2 * q] == all[2 * q + 1];
        bad += !ok;
        int coord[MESH_NDIMS];
        mesh_coords_of(&plan->groups.mesh->shape, q, coord);
        log0("  rank %d (cp %d): %8.0f | %8.0f  %s %s\n", q, coord[MESH_CP], all[2 * q], all[2 * q + 1], formula,
             ok ? "" : "MISMATCH");
    }
    free(all);
    bad = (int)comm_host_sum(w, bad);
    if (bad) parity_fail("a rank's attention work differs from the formula (above)");
    return bad;
}

/* The cp group's traffic per step beside the method's formula. */
int cp_report_traffic(const run_options *o, const llama_plan *plan, const llama_model *m,
                                  const cp_options *cp) {
    int C = plan->groups.cp->size, L = o->model.n_layers;
    double block = 4.0 * 2 * m->d.B * m->d.T * m->d.Hkvl * m->d.hd;   /* a K/V block: k and v, bytes */
    double rows = (double)m->d.B * m->d.T;                             /* this rank's rows, B Tl */
    comm_expectation e[5];
    int n = 0;
    /* under --dtype bf16 the K/V blocks, and Ulysses' q, k and v, travel as bf16 (half a float):
     * their every reader is an attention product that rounds them anyway */
    bool bf16 = m->c.precision == DTYPE_BF16;
    double kv = bf16 ? 0.5 : 1;
    if (C > 1 && cp->method == CP_RING) {
        double sends = L * (3.0 * C - 2);   /* forward C-1 blocks; backward C-1 blocks and C gradients */
        double bytes = L * (2.0 * (C - 1) * kv + C) * block;
        const char *f = bf16 ? "L (2(C-1) x 2 + C x 4) x 2 B Tl Hkv hd" : "L (3C-2) x 2 B Tl Hkv hd x 4";
        e[n++] = (comm_expectation){plan->groups.cp, COLL_SEND, sends, bytes, f};
        e[n++] = (comm_expectation){plan->groups.cp, COLL_RECV, sends, bytes, f};
    } else if (cp->method == CP_ALLGATHER) {   /* (on one rank too: a gather of one block) */
        e[n++] = (comm_expectation){plan->groups.cp, COLL_ALL_GATHER, 2.0 * L, 2.0 * L * C * block * kv,
                                    bf16 ? "2 L x C x 2 B Tl Hkv hd x 2" : "2 L x C x 2 B Tl Hkv hd x 4"};
        e[n++] = (comm_expectation){plan->groups.cp, COLL_REDUCE_SCATTER, L, (double)L * C * block, "L x C x 2 B Tl Hkv hd x 4"};
    } else if (cp->method == CP_ALLTOALL) {   /* forward q k v out, backward q k v out dout dq dk dv */
        double H = m->d.Hl, Hkv = m->d.Hkvl, bytes = 4.0 * 6 * L * rows * (H + Hkv) * m->d.hd;
        if (bf16) bytes = L * rows * m->d.hd * ((2 * H + 4 * Hkv) * 2 + (4 * H + 2 * Hkv) * 4);
        e[n++] = (comm_expectation){plan->groups.cp, COLL_ALL_TO_ALL, 12.0 * L, bytes,
                                    bf16 ? "L x B Tl hd ((2H + 4Hkv) x 2 + (4H + 2Hkv) x 4)" : "6 L x B Tl (H + Hkv) hd x 4"};
    }
    if (C > 1)
        e[n++] = (comm_expectation){plan->groups.cp, COLL_ALL_REDUCE, 1, 4.0 * m->params->whole_numel, "Psi x 4 (the gradients)"};
    comm_group *groups[2] = {plan->groups.cp, plan->groups.tp};
    if (plan->groups.tp)   /* CP x TP: chapter 01's f and g inside each cp rank, on this rank's rows */
        e[n++] = (comm_expectation){plan->groups.tp, COLL_ALL_REDUCE, 4.0 * L, 4.0 * L * rows * m->d.D * 4, "4 L x B Tl D x 4"};
    return report_communication(groups, plan->groups.tp ? 2 : 1, o->steps, e, n);
}

/* What attention keeps and uses per layer on this rank, measured by the allocator beside the
 * formulas; the single-device softmax for comparison. */
int cp_report_attention_memory(const llama_plan *plan, const llama_model *m, const cp_options *o) {
    const llama_dims *d = &m->d;
    int C = plan->groups.cp->size, T = d->T * C;
    size_t forward, backward;
    context_parallel_working_sets(plan, &forward, &backward);
    double f_forward, f_backward;
    bool bf16 = m->c.precision == DTYPE_BF16;
    size_t e = dtype_size(gemm_bf16_operand_type());   /* a bf16 operand copy's element */
    cp_working_set_bytes(o->method, m->c.precision, e, C, d->B, d->T, d->Hl, d->Hkvl, d->hd, &f_forward, &f_backward);
    double saved = (double)mem_allocation_bytes(m->saved->layers[0].probs);
    char title[160];
    snprintf(title, sizeof title, "attention memory per rank and layer, rank 0 (the single-device softmax is "
             "B H T^2 x 4 = %s)", fmt_bytes(4.0 * d->B * d->Hl * T * T));
    memory_row rows[] = {
        {"saved: log-sum-exp", saved, 4.0 * d->B * d->Hl * d->T, "B H Tl x 4"},
        {"forward scratch, at most", (double)forward, f_forward,
         bf16 ? (o->method == CP_RING ? "(4K + Tc H hd + H Tc + H Tc^2) x 4 + copies"
                 : o->method == CP_ALLGATHER ? "2K (C+1) x 2 + (2K + Tc H hd + H Tc + H Tc^2) x 4 + copies"
                                             : "(2Q + 2K) x 4 + max(2Q x 4, (H/C) s T x 4 + copies)")
         : o->method == CP_RING ? "(4K + Tc H hd + H Tc + H Tc^2) x 4"
         : o->method == CP_ALLGATHER ? "(2K (C+1) + Tc H hd + H Tc + H Tc^2) x 4" : "(2Q + 2K + max(2Q, (H/C) s T)) x 4"},
        {"backward scratch, at most", (double)backward, f_backward,
         bf16 ? (o->method == CP_RING ? "(8K + 2 H Tc^2) x 4 + copies"
                 : o->method == CP_ALLGATHER ? "2K (C+1) x 2 + (4K (C+1) + 2K + 2 H Tc^2) x 4 + copies"
                                             : "(4Q + 4K) x 4 + max(2Q x 4, 2 (H/C) s T x 4 + copies)")
         : o->method == CP_RING ? "(8K + 2 H Tc^2) x 4"
         : o->method == CP_ALLGATHER ? "(4K (C+1) + 2 H Tc^2) x 4" : "(4Q + 4K + max(2Q, 2 (H/C) s T)) x 4"}};
    int bad = report_memory(title, rows, 3);
    if (bf16)
        log0("  (--dtype bf16: K/V blocks travel as bf16, the one in hand widened to fp32; copies: an attention call's\n"
             "   operands rounded to bf16, at most (context_parallel.h) forward Tq Hkv hd + max(Tq H hd, c H Tq Tk),\n"
             "   backward 2 Tq H hd + Tk Hkv hd + max(Tk Hkv hd, 2 c H Tq Tk) elements, for a block of Tq = Tk = Tc rows,\n"
             "   or Tq = s rows against T keys of H/C heads)\n"
             "  (a copy's element here: %zu bytes, %s)\n", e,
             e == 2 ? "bf16, c = 1"
                    : "fp32 holding bf16 values, this CPU's bf16 product being an fp32 sgemm (gemm.h); c = 0: the block's "
                      "P and dS, scratch, rounded in place");
    log0("  (K = B Tl Hkv hd, Q = B Tl H hd: this rank's k and q; Tl = %d rows, Tc = %d", d->T, d->T / 2);
    if (o->method == CP_ALLTOALL) {
        int nb = causal_query_blocks(T);
        log0("; s = %d rows, the last of %d causal query block%s: one sequence and block at a time",
             causal_largest_block(T), nb, nb == 1 ? "" : "s");
    }
    log0(")\n");
    return (int)comm_host_sum(comm_world(), bad);
}

/* Each rank's ring steps in the last forward (the last layer's), rank 0 writes them:
 * rank, step, owner of the block, compute|wait, start and end in ms from the earliest start. */
void cp_write_ring_timeline(const llama_plan *plan, const char *path) {
    const cp_event *ev;
    int n = context_parallel_timeline(plan, &ev);
    comm_group *cp = plan->groups.cp;
    enum { F = 5, MAX = 2 * CP_MAX_RANKS };
    float mine[MAX * F] = {0}, *all = cp->rank == 0 ? calloc((size_t)cp->size * MAX * F, sizeof(float)) : NULL;
    double first = comm_host_max(cp, -(n ? ev[0].t0 : 1e300));   /* -(earliest start) */
    for (int i = 0; i < n; i++) {
        float row[F] = {(float)ev[i].step, (float)ev[i].owner, ev[i].wait ? 1.0f : 0.0f,
                        (float)((ev[i].t0 + first) * 1e3), (float)((ev[i].t1 + first) * 1e3)};
        memcpy(mine + i * F, row, sizeof row);
    }
    for (int i = n; i < MAX; i++) mine[i * F] = -1;    /* no event */
    comm_host_gather(cp, mine, all, MAX * F, 0);
    if (all) {
        FILE *f = out_open(path, "rank,step,owner,what,start_ms,end_ms", false);   /* (write errors: run_finish) */
        for (int q = 0; q < cp->size; q++)
            for (int i = 0; i < MAX; i++) {
                const float *e = all + ((size_t)q * MAX + i) * F;
                if (e[0] < 0) continue;
                csv_row(f, "%d,%d,%d,%s,%.4f,%.4f", q, (int)e[0], (int)e[1], e[2] > 0 ? "wait" : "compute", e[3], e[4]);
            }
        csv_close(f);
        log0("ring timeline of the last forward: %s\n", path);
        free(all);
    }
}
