/* ep_report.c: chapter 09's measurements beside their formulas (ep_report.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "comm.h"
#include "device.h"
#include "ep_report.h"
#include "log.h"
#include "parity.h"

int ep_report_load(const llama_plan *p, llama_model *m) {
    const llama_dims *d = &m->d;
    int E = d->E, L = m->c.n_layers;
    double *load = calloc((size_t)E, sizeof *load);
    float *counts = malloc(2 * (size_t)E * sizeof(float));
    for (int l = 0; l < L; l++) {   /* the saved counts of the last forward: what this rank sent */
        device_copy_to_host(counts, m->saved->layers[l].moe_counts, 2 * (size_t)E * sizeof(float));
        for (int e = 0; e < E; e++) load[e] += counts[e];
    }
    comm_group *batch = p->groups.batch;
    double total = 0, most = 0;
    for (int e = 0; e < E; e++) {
        if (batch) load[e] = comm_host_sum(batch, load[e]);
        total += load[e];
        most = fmax(most, load[e]);
    }
    double mean = total / E, want = (double)d->N * (batch ? batch->size : 1) * d->k * L;
    log0("expert load, last step: tokens per expert over %d layers (balanced: N k L / E = %.0f each)\n", L, want / E);
    for (int e = 0; e < E; e++)
        log0("  expert %3d  %8.0f  %5.2fx%s\n", e, load[e], load[e] / mean, load[e] == most ? "  (most)" : "");
    log0("  total %.0f = N k L = %.0f x %d x %d; imbalance max / mean = %.3f\n", total,
         (double)d->N * (batch ? batch->size : 1), d->k, L, most / mean);
    int bad = total != want;
    if (bad) {
        char what[128];
        snprintf(what, sizeof what, "expert load: %.0f copies routed, N k L = %.0f", total, want);
        parity_fail(what);
    }
    free(load);
    free(counts);
    return bad;
}

int ep_report_traffic(const run_options *o, const llama_plan *p, llama_model *m) {
    comm_group *ep = p->groups.ep;
    if (!ep || ep->size == 1) {
        log0("traffic: one ep rank, every expert here: no all-to-all\n");
        return 0;
    }
    const llama_dims *d = &m->d;
    const collective_stats *s = &ep->stats[COLL_ALL_TO_ALL];
    /* summed over the ep group: what one rank sends the others receive, so the variable loads
     * cancel: per layer, forward the counts (E floats a rank) and the copies there and back, backward
     * the copies' gradients there and back: 4 exchanges of the group's N k rows of D floats */
    double P = ep->size, L = m->c.n_layers, steps = o->steps, N = d->N, k = d->k, D = d->D, E = d->E;
    double calls = comm_host_sum(ep, (double)s->calls) / P / steps;
    double bytes = comm_host_sum(ep, s->payload_bytes) / steps;
    double want_calls = 5 * L, want_bytes = L * (P * E * 4 + 4 * P * N * k * D * 4);
    log0("traffic on the ep group (%d ranks), per step, summed over its ranks:\n", ep->size);
    log0("  all_to_all   calls %6.0f per rank  (formula 5 L = %.0f: counts, dispatch, combine; their backward)\n",
         calls, want_calls);
    log0("  all_to_all   bytes %10.0f  (formula L (P E 4 + 4 P N k D 4) = %.0f)\n", bytes, want_bytes);
    int bad = (calls != want_calls) + (bytes != want_bytes);
    if (bad) {
        char what[160];
        snprintf(what, sizeof what, "ep traffic: %.0f calls and %.0f bytes a step, the formulas %.0f and %.0f", calls,
                 bytes, want_calls, want_bytes);
        parity_fail(what);
    }
    return bad;
}
