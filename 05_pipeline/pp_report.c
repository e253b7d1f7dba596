/* pp_report.c: see pp_report.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "comm.h"
#include "files.h"
#include "log.h"
#include "mesh.h"
#include "parity.h"
#include "report.h"
#include "pp_report.h"

/* Every rank's `n` floats on world rank 0 (all[world * n]; NULL elsewhere). */
static float *gather_floats(const float *mine, int n) {
    comm_group *w = comm_world();
    float *all = w->rank == 0 ? malloc((size_t)n * w->size * sizeof(float)) : NULL;
    comm_host_gather(w, mine, all, (size_t)n, 0);
    return all;
}

static int pp_coord(const llama_plan *plan, int world_rank) {
    int coord[MESH_NDIMS];
    mesh_coords_of(&plan->groups.mesh->shape, world_rank, coord);
    return coord[MESH_PP];
}

/* The bytes rank r holds when its count of sets first reaches its peak, from its list of actions
 * (F allocates its set; B, or zb-h1's W, frees it) and the bytes of one set of each chunk: the
 * formula's sets times one set's bytes when every chunk's set is alike, and the sum of the
 * chunks' own otherwise (chapter 09's --moe-every: a chunk of mixtures holds more). */
static double peak_bytes_of(const pp_schedule *s, int r, const size_t *chunk_bytes) {
    double live = 0, at_peak = 0;
    int sets = 0, peak = 0;
    for (int k = 0; k < s->n[r]; k++) {
        const pp_action *a = &s->a[r][k];
        if (a->op == PP_F) {
            live += (double)chunk_bytes[a->chunk];
            if (++sets > peak) peak = sets, at_peak = live;
        } else if (a->op == PP_B || a->op == PP_W) {
            live -= (double)chunk_bytes[a->chunk];
            sets--;
        }
    }
    return at_peak;
}

int report_pipeline_memory(const llama_plan *plan) {
    const pp_schedule *s = pipeline_schedule(plan);
    pp_measured me = pipeline_measured(plan);
    int r = plan->groups.mesh->coord[MESH_PP];
    int formula = pp_peak_in_flight_formula(s->kind, s->P, s->M, s->V, r);
    double expect_bytes = peak_bytes_of(s, r, me.chunk_set_bytes);
    /* What the 1F1B family is for, judged apart from any formula: with at least 2P microbatches a
     * rank runs a backward before its last forward, so it never holds all M V sets (every forward
     * first is GPipe's order, whose memory 1F1B exists to avoid). */
    bool bounded = s->kind == PP_GPIPE || s->P == 1 || s->M < 2 * s->P || me.peak_sets < s->M * s->V;
    int bad = me.peak_sets != formula || (double)me.peak_set_bytes != expect_bytes || !bounded;
    int unbounded = (int)comm_host_sum(comm_world(), !bounded);
    float mine[4] = {(float)me.peak_sets, (float)formula, (float)me.peak_set_bytes, (float)expect_bytes};
    float *all = gather_floats(mine, 4);
    int mismatches = (int)comm_host_sum(comm_world(), bad);
    log0("activations held at the peak, per rank (allocator | formula; one set = a microbatch's "
         "activations of one chunk, %s%s):\n", fmt_bytes((double)me.set_bytes),
         expect_bytes != (double)formula * me.set_bytes ? " for rank 0's last chunk: the chunks differ" : "");
    const char *rule = s->kind == PP_GPIPE ? "M" : s->kind == PP_1F1B ? "min(M, P - r)" :
                       s->kind == PP_INTERLEAVED ? "warmup + 1" : "min(M, P)";
    /* BEGIN SOLUTION 05: the interleaved peak */
    if (s->kind == PP_INTERLEAVED) rule = "min((V-1)P + 2(P-1-r) + 1, MV)";
    /* END SOLUTION */
    if (all)
        for (int q = 0; q < comm_world()->size; q++) {
            const float *x = all + 4 * q;
            bool ok = x[0] == x[1] && x[2] == x[3];
            log0("  rank %d (stage %d): %3.0f set(s) %12s | %3.0f set(s) %12s   %s%s\n", q, pp_coord(plan, q), x[0],
                 fmt_bytes(x[2]), x[1], fmt_bytes(x[3]), rule, ok ? "" : "  MISMATCH");
        }
    if (unbounded)
        log0("  %d rank(s) held all M V = %d sets: with M >= 2P a 1F1B schedule runs a backward before its last "
             "forward; every forward first is GPipe's order  MISMATCH\n", unbounded, s->M * s->V);
    if (mismatches) parity_fail("the activations a rank held differ from the schedule's formula, or reach all M V "
                                "sets (above)");
    free(all);
    return mismatches;
}

int report_pipeline_messages(const run_options *o, const llama_plan *plan, const llama_model *m) {
    const pp_schedule *s = pipeline_schedule(plan);
    comm_group *pp = plan->groups.mesh->group[MESH_PP];
    bool counted = true;   /* one pipeline: every tp rank (and data rank, chapter 09's) runs its own */
    for (int dim = 0; dim < MESH_NDIMS; dim++) counted &= dim == MESH_PP || plan->groups.mesh->coord[dim] == 0;
    double sends = counted ? (double)pp->stats[COLL_SEND].calls / o->steps : 0;
    double bytes = counted ? pp->stats[COLL_SEND].payload_bytes / o->steps : 0;
    sends = comm_host_sum(comm_world(), sends);
    bytes = comm_host_sum(comm_world(), bytes);
    double msg_bytes = 4.0 * m->d.B * m->d.Ts * m->d.D;   /* B/M sequences x T (/ tp under SP) x D */
    double expect = s->P > 1 ? (double)pp_messages_per_step(s->P, s->M, s->V) : 0;
    bool ok = fabs(sends - expect) < 1e-9 && fabs(bytes - expect * msg_bytes) < 0.5;
    log0("point-to-point messages per step, one pipeline (measured | formula):\n");
    log0("  %8.0f messages %12s | %8.0f messages %12s  2 M (P V - 1) x B/M*T*D*4 = 2 x %d x (%d x %d - 1) x %s%s\n",
         sends, fmt_bytes(bytes), expect, fmt_bytes(expect * msg_bytes), s->M, s->P, s->V,
         fmt_bytes(msg_bytes), ok ? "" : "  MISMATCH");
    if (!ok) parity_fail("the pipeline's messages differ from the formula (above)");
    return ok ? 0 : 1;
}

void report_pipeline_bubble(const run_options *o, const llama_plan *plan) {
    const pp_schedule *s = pipeline_schedule(plan);
    int n;
    const pp_event *e = pipeline_events(plan, &n);
    pp_measured me = pipeline_measured(plan);
    comm_group *w = comm_world();
    /* every rank's events as rows of 6 floats: pp rank, op, mb, chunk, t0, t1 (ms) */
    int most = (int)comm_host_max(w, n);
    float *mine = calloc((size_t)6 * most + 2, sizeof(float));
    mine[0] = (float)n;
    /* idle share of the step: of the longest rank's step, as the formula counts it (a rank that
     * finishes early idles until the step ends) */
    double step = comm_host_max(w, me.step_seconds);
    mine[1] = (float)(1 - me.busy_seconds / step);
    for (int i = 0; i < n; i++) {
        float *row = mine + 2 + 6 * i;
        row[0] = (float)plan->groups.mesh->coord[MESH_PP];
        row[1] = (float)e[i].a.op; row[2] = (float)e[i].a.mb; row[3] = (float)e[i].a.chunk;
        row[4] = (float)(1e3 * e[i].t0); row[5] = (float)(1e3 * e[i].t1);
    }
    float *all = gather_floats(mine, 6 * most + 2);
    long num, den;
    pp_bubble_formula(s->kind, s->P, s->M, s->V, &num, &den);
    if (all) {
        char path[512];
        snprintf(path, sizeof path, "%s/pipeline_%s_p%d_m%d_v%d.csv", o->out_dir, pp_schedule_name(s->kind),
                 s->P, s->M, s->V);
        FILE *f = csv_open(path, "rank,action,microbatch,chunk,start_ms,end_ms");
        static const char ops[] = "FBIW";
        double idle = 0;
        int ranks = 0;
        for (int q = 0; q < w->size; q++) {
            const float *x = all + (size_t)(6 * most + 2) * q;
            int qcoord[MESH_NDIMS];
            mesh_coords_of(&plan->groups.mesh->shape, q, qcoord);
            if (qcoord[MESH_TP] != 0) continue;           /* one pipeline */
            idle += x[1];
            ranks++;
            for (int i = 0; i < (int)x[0]; i++) {
                const float *row = x + 2 + 6 * i;
                csv_row(f, "%d,%c,%d,%d,%.3f,%.3f", (int)row[0], ops[(int)row[1]], (int)row[2], (int)row[3], row[4], row[5]);
            }
        }
        csv_close(f);
        log0("bubble of the last step, one pipeline: measured idle share %.1f%% (mean over its %d ranks) | "
             "theory %.1f%% = %s   (timing: judged by make bench-05; timeline in %s)\n",
             100 * idle / (ranks ? ranks : 1), ranks, 100.0 * num / den,
             s->kind == PP_INTERLEAVED ? "(P-1)/(V M + P-1)" : s->kind == PP_ZB_H1 ? "(P-1)/(3M + P-1)" : "(P-1)/(M + P-1)",
             path);
    }
    free(all);
    free(mine);
}
