/* Chapter 06: context parallelism, attention over a sequence split across ranks.
 *
 * Every sequence is cut over C ranks for the whole model (context_parallel.h); all layers but
 * attention run on the rank's own rows with no communication, and attention brings the keys and
 * values to the queries: around a ring, block by block, merged by log-sum-exp, or all-gathered
 * at once. Rank 0 trains the single-device baseline beside it and compares every step; the run
 * ends with each rank's attention work (contiguous vs zigzag balance) and the traffic beside
 * their formulas.
 *
 *   make run-06                                             ring, zigzag, over 2 ranks
 *   make run-06 NP=4 ARGS="--cp-balance contiguous"         the unbalanced split, for comparison
 *   make run-06 NP=4 ARGS="--cp-method allgather"
 *   make run-06 NP=4 ARGS="--cp-method alltoall"            Ulysses: heads dealt out, whole sequences
 *   make run-06 NP=4 ARGS="--cp 2 --tp 2"                   CP x TP: heads by tp, rows by cp
 *   make check-06                                           the methods and balances at cp 1, 2, 4; the bug
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "comm.h"
#include "device.h"
#include "log.h"
#include "mesh.h"
#include "model.h"
#include "parity.h"
#include "report.h"
#include "run.h"
#include "../01_transformer_tp/tp.h"
#include "context_parallel.h"

static const char *usage =
    "usage: 06 [flags]   (under mpirun: NP = cp x tp ranks)\n"
    "  --cp-method ring|allgather|alltoall  how the keys and values reach the queries (default ring)\n"
    "  --cp-balance contiguous|zigzag       which rows each rank holds (default zigzag)\n"
    "  --cp C                               ranks each sequence is split over (default: NP / tp)\n"
    "  --tp T                               tensor parallelism inside each cp rank (default 1)\n"
    "  --ring-timeline                      write each rank's ring steps (compute, wait) of the last\n"
    "                                       forward to OUT/ring_timeline.csv (synchronises the device)\n"
    "  (defaults of this chapter: --seq-len 64)\n";

enum { OPT_METHOD = 1, OPT_BALANCE, OPT_CP, OPT_TP, OPT_TIMELINE };
typedef struct { cp_options cp; int C, tp; bool timeline; } chapter_options;
static void chapter_flag(int code, const char *arg, void *ctx) {
    static const char *const methods[] = {"ring", "allgather", "alltoall", NULL};
    static const char *const balances[] = {"contiguous", "zigzag", NULL};
    chapter_options *co = ctx;
    if (code == OPT_METHOD) co->cp.method = (cp_method)cli_choice("--cp-method", arg, methods);
    else if (code == OPT_BALANCE) co->cp.balance = (cp_balance)cli_choice("--cp-balance", arg, balances);
    else if (code == OPT_CP) co->C = cli_int("--cp", arg, 1, 4096);
    else if (code == OPT_TP) co->tp = cli_int("--tp", arg, 1, 4096);
    else co->timeline = true;
}

/* Each rank's score elements per (sequence, head) in one layer's forward, beside the formula. */
static int report_attention_work(const llama_plan *plan, const cp_options *o, int T) {
    int C = plan->cp->size, r = plan->cp->rank;
    bool dense = o->method == CP_ALLTOALL;   /* every score of H / C heads: T^2 / C per head */
    float mine[2] = {(float)context_parallel_work(plan), dense ? (float)((double)T * T / C) : (float)cp_work_formula(o->balance, r, C, T)};
    comm_group *w = comm_world();
    float *all = w->rank == 0 ? malloc(2 * sizeof(float) * w->size) : NULL;
    comm_host_gather(w, mine, all, 2, 0);
    int bad = 0;
    log0("attention work per rank, score elements per sequence and head in one layer's forward "
         "(measured | formula, Tc = T / 2C = %d):\n", T / (2 * C));
    for (int q = 0; all && q < w->size; q++) {
        bool ok = all[2 * q] == all[2 * q + 1];
        bad += !ok;
        int coord[MESH_NDIMS];
        mesh_coords_of(&plan->mesh->shape, q, coord);
        log0("  rank %d (cp %d): %8.0f | %8.0f  %s %s\n", q, coord[MESH_CP], all[2 * q], all[2 * q + 1],
             dense ? "T^2 / C (T x T for H / C heads)" : o->balance == CP_ZIGZAG ? "(2C + 1) Tc^2" : "(4 r + 3) Tc^2",
             ok ? "" : "MISMATCH");
    }
    free(all);
    bad = (int)comm_host_sum(w, bad);
    if (bad) parity_fail("a rank's attention work differs from the formula (above)");
    return bad;
}

/* The cp group's traffic per step beside the method's formula. */
static int report_context_traffic(const run_options *o, const llama_plan *plan, const llama_model *m,
                                  const cp_options *cp) {
    int C = plan->cp->size, L = o->model.n_layers;
    double block = 4.0 * 2 * m->d.B * m->d.T * m->d.Hkvl * m->d.hd;   /* a K/V block: k and v, bytes */
    double rows = (double)m->d.B * m->d.T;                             /* this rank's rows, B Tl */
    comm_expectation e[5];
    int n = 0;
    if (C > 1 && cp->method == CP_RING) {
        double sends = L * (3.0 * C - 2);   /* forward C-1 blocks; backward C-1 blocks and C gradients */
        e[n++] = (comm_expectation){plan->cp, COLL_SEND, sends, sends * block, "L (3C-2) x 2 B Tl Hkv hd x 4"};
        e[n++] = (comm_expectation){plan->cp, COLL_RECV, sends, sends * block, "L (3C-2) x 2 B Tl Hkv hd x 4"};
    } else if (cp->method == CP_ALLGATHER) {   /* (on one rank too: a gather of one block) */
        e[n++] = (comm_expectation){plan->cp, COLL_ALL_GATHER, 2.0 * L, 2.0 * L * C * block, "2 L x C x 2 B Tl Hkv hd x 4"};
        e[n++] = (comm_expectation){plan->cp, COLL_REDUCE_SCATTER, L, (double)L * C * block, "L x C x 2 B Tl Hkv hd x 4"};
    } else if (cp->method == CP_ALLTOALL) {   /* forward q k v out, backward q k v out dout dq dk dv */
        double bytes = 4.0 * 6 * L * rows * (m->d.Hl + m->d.Hkvl) * m->d.hd;
        e[n++] = (comm_expectation){plan->cp, COLL_ALL_TO_ALL, 12.0 * L, bytes, "6 L x B Tl (H + Hkv) hd x 4"};
    }
    if (C > 1)
        e[n++] = (comm_expectation){plan->cp, COLL_ALL_REDUCE, 1, 4.0 * m->params->whole_numel, "Psi x 4 (the gradients)"};
    comm_group *groups[2] = {plan->cp, plan->tp};
    if (plan->tp)   /* CP x TP: chapter 01's f and g inside each cp rank, on this rank's rows */
        e[n++] = (comm_expectation){plan->tp, COLL_ALL_REDUCE, 4.0 * L, 4.0 * L * rows * m->d.D * 4, "4 L x B Tl D x 4"};
    return report_communication(groups, plan->tp ? 2 : 1, o->steps, e, n);
}

/* What attention keeps and uses per layer on this rank, measured by the allocator beside the
 * formulas; the single-device softmax for comparison. */
static int report_attention_memory(const llama_plan *plan, const llama_model *m, const cp_options *o) {
    const llama_dims *d = &m->d;
    int C = plan->cp->size, T = d->T * C;
    size_t forward, backward;
    context_parallel_working_sets(plan, &forward, &backward);
    double f_forward, f_backward;
    cp_working_set_formula(o->method, C, d->B, d->T, d->Hl, d->Hkvl, d->hd, &f_forward, &f_backward);
    double saved = (double)mem_allocation_bytes(m->saved->layers[0].probs);
    char title[160];
    snprintf(title, sizeof title, "attention memory per rank and layer, rank 0 (the single-device softmax is "
             "B H T^2 x 4 = %s)", fmt_bytes(4.0 * d->B * d->Hl * T * T));
    memory_row rows[] = {
        {"saved: log-sum-exp", saved, 4.0 * d->B * d->Hl * d->T, "B H Tl x 4"},
        {"forward scratch, at most", (double)forward, 4 * f_forward,
         o->method == CP_RING ? "(4K + Tc H hd + H Tc + H Tc^2) x 4"
         : o->method == CP_ALLGATHER ? "(2K (C+1) + Tc H hd + H Tc + H Tc^2) x 4" : "(2Q + 2K + max(2Q, B (H/C) T^2)) x 4"},
        {"backward scratch, at most", (double)backward, 4 * f_backward,
         o->method == CP_RING ? "(8K + 2 H Tc^2) x 4"
         : o->method == CP_ALLGATHER ? "(4K (C+1) + 2 H Tc^2) x 4" : "(4Q + 4K + max(2Q, 2 B (H/C) T^2)) x 4"}};
    int bad = report_memory(title, rows, 3);
    log0("  (K = B Tl Hkv hd, Q = B Tl H hd: this rank's k and q; Tl = %d rows, Tc = %d)\n", d->T, d->T / 2);
    return (int)comm_host_sum(comm_world(), bad);
}

/* Each rank's ring steps in the last forward (the last layer's), rank 0 writes them:
 * rank, step, owner of the block, compute|wait, start and end in ms from the earliest start. */
static void write_ring_timeline(const llama_plan *plan, const char *path) {
    const cp_event *ev;
    int n = context_parallel_timeline(plan, &ev);
    comm_group *cp = plan->cp;
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
        FILE *f = fopen(path, "w");
        if (!f) { log0("could not write %s\n", path); free(all); return; }
        fprintf(f, "rank,step,owner,what,start_ms,end_ms\n");
        for (int q = 0; q < cp->size; q++)
            for (int i = 0; i < MAX; i++) {
                const float *e = all + ((size_t)q * MAX + i) * F;
                if (e[0] < 0) continue;
                fprintf(f, "%d,%d,%d,%s,%.4f,%.4f\n", q, (int)e[0], (int)e[1], e[2] > 0 ? "wait" : "compute", e[3], e[4]);
            }
        fclose(f);
        log0("ring timeline of the last forward: %s\n", path);
        free(all);
    }
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* ---- flags ---- */
    run_options o = run_options_default("06", context_parallel_faults);
    o.model.seq_len = 64;     /* 2C chunks of at least 8 rows at cp 4 */
    o.kv_heads_follow_heads = true;
    chapter_options co = {{CP_RING, CP_ZIGZAG}, 0, 1, false};
    static const struct option flags[] = {
        {"cp-method", required_argument, 0, OPT_METHOD}, {"cp-balance", required_argument, 0, OPT_BALANCE},
        {"cp", required_argument, 0, OPT_CP}, {"tp", required_argument, 0, OPT_TP},
        {"ring-timeline", no_argument, 0, OPT_TIMELINE}, {0, 0, 0, 0}};
    run_parse(&o, argc, argv, flags, chapter_flag, &co, usage);
    const llama_config *c = &o.model;

    /* ---- mesh: cp x tp (cp inferred from NP when not given) ---- */
    int T = co.tp, world = comm_world()->size;
    int C = co.C ? co.C : (world % T == 0 ? world / T : 0);
    if (!C) comm_exit_usage("NP=%d is not divisible by --tp %d: the cp degree would not be whole", world, T);
    device_mesh *mesh = mesh_create((mesh_shape){{1, 1, 1, C, T}});
    context_parallel_validate(c, C, T, &co.cp);
    if (co.timeline && co.cp.method != CP_RING)
        comm_exit_usage("--ring-timeline records the ring's steps: it needs --cp-method ring, not %s",
                        cp_method_name(co.cp.method));

    /* ---- the plan: chapter 01's inside each cp rank (when tp > 1), context parallelism around it ---- */
    llama_plan plan = tensor_parallel_or_single(mesh, c);
    context_parallel_apply(&plan, mesh, c, &co.cp);
    context_parallel_record_timeline(&plan, co.timeline);
    run_apply_fault(&o, &plan);
    llama_model *model = run_model(&o, &plan);   /* refuses up front what cannot fit */

    log0("chapter 06: context parallelism, %s, %s, cp %d x tp %d, backend %s\n", cp_method_name(co.cp.method),
         cp_balance_name(co.cp.balance), C, T, device_backend_name());
    log0("model: dim %d, %d layers, %d heads (%d kv), ffn %d, vocab %d; batch %d x %d tokens, %d rows of each "
         "sequence per rank\n", c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab_size,
         o.batch, c->seq_len, model->d.T);

    /* ---- train, with the baseline beside it ---- */
    char path[512], label[64];
    snprintf(path, sizeof path, "%s/loss_%s_%s_c%d_t%d.csv", o.out_dir, cp_method_name(co.cp.method),
             cp_balance_name(co.cp.balance), C, T);
    snprintf(label, sizeof label, "%s %s %dx%d", cp_method_name(co.cp.method), cp_balance_name(co.cp.balance), C, T);
    run_clock clock = run_train(&o, model, label, path);

    /* ---- measured beside the formulas ---- */
    log0("\n");
    int mismatches = report_attention_work(&plan, &co.cp, c->seq_len);
    mismatches += report_attention_memory(&plan, model, &co.cp);
    mismatches += report_context_traffic(&o, &plan, model, &co.cp);
    if (co.timeline) {
        snprintf(path, sizeof path, "%s/ring_timeline.csv", o.out_dir);
        write_ring_timeline(&plan, path);
    }
    run_clock_report(&clock, o.steps);

    llama_free(model);
    context_parallel_free(&plan);
    return run_finish(&o, mismatches);
}
