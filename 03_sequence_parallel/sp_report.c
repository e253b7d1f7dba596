/* sp_report.c: see sp_report.h. */
#include <math.h>
#include <stdio.h>
#include "files.h"
#include "log.h"
#include "parity.h"
#include "report.h"
#include "sp_report.h"

/* README, "Activation memory": the bytes one layer keeps in a mode are those of the tensors the
 * mode keeps (ac_keep_mask), each of the size model.c's table gives it with this rank's shapes:
 * whole sequence (N = sb) inside the region, Ns = sb/t' outside it. */
static double layer_act_bytes(const llama_dims *d, ac_mode ac) {
    return llama_layer_act_bytes(d, ac_keep_mask(d->layer, ac));
}

/* Beside chapter 01: the same boundaries, each an all-reduce there, a pair here. A ring
 * all-reduce of n bytes sends 2(p-1)/p n per rank; an all-gather or a reduce-scatter whose
 * whole tensor is n bytes sends (p-1)/p n. */
int report_traffic_beside_chapter_01(const run_options *o, comm_group *tp, bool sp, ac_mode ac,
                                     double boundaries, double regathers, double recomputed, double bf16_gathers) {
    int p = tp->size;
    double X = 4.0 * o->batch * o->model.seq_len * o->model.dim, N4 = 4.0 * o->batch * o->model.seq_len;
    double ring = p > 1 ? (double)(p - 1) / p : 0.0, measured, formula;
    log0("  beside chapter 01 (+ 02's ends), per rank per step, ring model:\n");
    log0("    chapter 01: %.0f all-reduces of B*T*D*4 = %s each: %s sent\n", boundaries, fmt_bytes(X),
         fmt_bytes(boundaries * 2 * ring * X));
    if (sp) {
        /* (--async-tp: the decomposed ones are the ring's point-to-point sends, counted on tp) */
        double ring_sent = tp->stats[COLL_SEND].wire_bytes / o->steps;
        measured = (tp->stats[COLL_ALL_GATHER].wire_bytes + tp->stats[COLL_REDUCE_SCATTER].wire_bytes) / o->steps + ring_sent;
        double pairs = boundaries * 2 * ring * X, regather = regathers * ring * X, recompute = recomputed * ring * X;
        double halved = bf16_gathers * ring * X / 2;   /* --dtype bf16: those gathers at 2 bytes an element */
        formula = pairs + regather + recompute - halved;
        log0("    here:       the same %.0f boundaries, each an all-gather + a reduce-scatter: %s sent (the same bytes)\n",
             boundaries, fmt_bytes(pairs));
        log0("                + %.0f re-gathers of the norm outputs, of which each rank kept only its shard: %s\n",
             regathers, fmt_bytes(regather));
        if (ac == AC_FULL)
            log0("                + %.0f reduce-scatters of the forward recomputed by full AC: %s\n", recomputed,
                 fmt_bytes(recompute));
        if (halved > 0)
            log0("                - %.0f all-gathers (or gather rings) of values a GEMM rounds to bf16 anyway, moved as bf16: -%s\n",
                 bf16_gathers, fmt_bytes(halved));
        if (ring_sent > 0)
            log0("                of which sent point to point by the async-TP rings: %s\n", fmt_bytes(ring_sent));
        log0("                measured all-gather + reduce-scatter%s: %s | formula %s %s\n",
             ring_sent > 0 ? " + ring sends" : "", fmt_bytes(measured), fmt_bytes(formula),
             fabs(measured - formula) < 0.5 ? "" : "MISMATCH");
    } else {
        measured = tp->stats[COLL_ALL_REDUCE].wire_bytes / o->steps;
        formula = (boundaries + recomputed) * 2 * ring * X + 3 * 2 * ring * N4;
        log0("    here:       the same all-reduces (--no-sp)%s, with the loss's 3 x B*T*4: %s sent | formula %s %s\n",
             ac == AC_FULL ? " + L of the forward recomputed by full AC" : "", fmt_bytes(measured),
             fmt_bytes(formula), fabs(measured - formula) < 0.5 ? "" : "MISMATCH");
    }
    if (fabs(measured - formula) < 0.5) return 0;
    parity_fail("the measured wire bytes differ from the formula (above)");
    return 1;
}

/* The shapes of this run's rank with or without the sequence split. */
static llama_dims with_split(const llama_dims *d, int p, bool sp) {
    llama_dims e = *d;
    e.Ts = sp ? d->T / p : d->T;
    e.Ns = d->B * e.Ts;
    return e;
}

int report_activation_memory(const run_options *o, const llama_model *m, int p, bool sp, ac_mode ac,
                             double act_bytes) {
    const llama_dims *d = &m->d;
    int L = o->model.n_layers, mismatches = 0;
    /* s = T, b = B, h = D, f = F, a = H, hkv = Hkv*hd, t = tp (the README's notation) */
    static const char *formula[2][AC_NMODES] = {
        {"4sb(4h+2 + (2h+2hkv+3f+as)/t)", "4sb(2h + (2h+2hkv+2f)/t)", "4sbh"},
        {"4sb(6h+2+2hkv+3f+as)/t", "4sb(4h+2hkv+2f)/t", "4sbh/t"}};
    char names[2][AC_NMODES][48], path[512], title[128];
    memory_row rows[2 * AC_NMODES];
    snprintf(path, sizeof path, "%s/activation_memory_tp%d.csv", o->out_dir, p);
    FILE *csv = csv_open(path, "mode,tp,measured_bytes,formula_bytes");
    for (int s = 0; s < 2; s++)
        for (int a = 0; a < AC_NMODES; a++) {
            llama_dims dm = with_split(d, p, s == 1);
            double measured = (double)llama_layer_act_bytes_measured(&dm, ac_keep_mask(dm.layer, (ac_mode)a));
            double predicted = layer_act_bytes(&dm, (ac_mode)a);
            bool mine = (s == 1) == sp && (ac_mode)a == ac;
            snprintf(names[s][a], sizeof names[s][a], "%s %s%s", s ? "tp+sp" : "tp", ac_mode_name((ac_mode)a),
                     mine ? " (this run)" : "");
            rows[s * AC_NMODES + a] = (memory_row){names[s][a], measured, predicted, formula[s][a]};
            csv_row(csv, "%s/%s,%d,%.0f,%.0f", s ? "tp+sp" : "tp", ac_mode_name((ac_mode)a), p, measured, predicted);
        }
    csv_close(csv);
    snprintf(title, sizeof title, "activations saved for backward, per layer per rank, tp = %d", p);
    mismatches += report_memory(title, rows, 2 * AC_NMODES);

    /* this run: every layer must have saved exactly the formula's bytes */
    double layer_formula = layer_act_bytes(d, ac), layers_measured = 0;
    int bad_layers = 0, shown = 0;
    for (int l = 0; l < L; l++) {
        layers_measured += (double)m->layer_act_bytes[l];
        if (fabs((double)m->layer_act_bytes[l] - layer_formula) >= 0.5 && bad_layers++ == 0) shown = l;
    }
    double outside = llama_head_act_bytes(d, 2);   /* final norm, logits, the loss's row max and sum */
    char what[64];
    snprintf(what, sizeof what, "layers 0..%d, each", L - 1);
    memory_row run_rows[] = {
        {what, (double)m->layer_act_bytes[shown], layer_formula, formula[sp][ac]},
        {"outside the layers", act_bytes - layers_measured, outside, "4(2sbh/t' + sb/t' + sb Vp/t + 2sb)"},
        {"all saved activations", act_bytes, L * layer_formula + outside, "L x layer + outside"}};
    snprintf(title, sizeof title, "this run (%s, ac %s), per rank (t' = %d: the sequence split)",
             sp ? "tp+sp" : "tp", ac_mode_name(ac), sp ? p : 1);
    mismatches += report_memory(title, run_rows, 3) + (bad_layers > 0);
    if (bad_layers) {
        log0("  %d layer(s) saved a different number of bytes: MISMATCH\n", bad_layers);
        parity_fail("a layer saved a different number of activation bytes (above)");
    }
    double none_bytes = layer_act_bytes(d, AC_NONE);
    if (ac != AC_NONE)
        log0("  ac %s keeps %s per layer instead of %s; what it drops lives once, in %s of buffers shared by the layers\n",
             ac_mode_name(ac), fmt_bytes(layer_formula), fmt_bytes(none_bytes), fmt_bytes(none_bytes - layer_formula));
    return mismatches;
}
