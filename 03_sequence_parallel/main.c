/* Chapter 03: sequence parallelism and activation checkpointing.
 *
 * Chapter 01 split the GEMMs and attention over the tp ranks but left the residual stream and
 * the norms replicated: every rank holds them for the whole [B, T, D] batch. Here they are split
 * along the sequence (rank r: tokens [r*T/tp, (r+1)*T/tp) of every sequence), and chapter 01's
 * all-reduces become all-gathers and reduce-scatters at the same places (sequence_parallel.h).
 * --ac chooses what each layer keeps for backward. Rank 0 trains the single-device baseline
 * beside it and compares every step; the run ends with the traffic and the activation memory,
 * measured beside the README's formulas.
 *
 *   make run-03                                   tp = 2, sequence parallel, no checkpointing
 *   make run-03 NP=4 ARGS="--ac selective"        tp = 4, selective recomputation
 *   make run-03 NP=4 ARGS="--no-sp"               chapter 01's replicated norms, for comparison
 *   make check-03                                 tp = 1, 2, 4 x none, selective, full; the bugs
 *   make plot-03                                  activation memory per layer, every mode and tp
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "cli.h"
#include "comm.h"
#include "device.h"
#include "log.h"
#include "mesh.h"
#include "parity.h"
#include "report.h"
#include "run.h"
#include "sequence_parallel.h"

static const char *usage =
    "usage: 03 [flags]   (under mpirun: NP ranks = the tensor-parallel degree)\n"
    "  --tp N                       tensor-parallel degree (default: NP; must equal NP)\n"
    "  --ac none|selective|full     activation checkpointing: what each layer keeps for backward\n"
    "                               (default none)\n"
    "  --no-sp                      no sequence parallelism: chapter 01's replicated norms and\n"
    "                               all-reduces, for comparing memory and traffic\n"
    "  --skip-norm-grad-allreduce   leave the norm weights' gradients partial (a deliberate bug)\n"
    "  --rope-local-positions       RoPE with each rank's positions within its shard (a deliberate bug)\n";

enum { OPT_TP = 1, OPT_AC, OPT_NO_SP, OPT_SKIP_NORM, OPT_ROPE_LOCAL };

/* run.h's hook: bring a full parameter or gradient of this rank's model to rank 0. */
static void gather_sp(void *model, int index, bool grad, float *full) {
    sp_llama *m = model;
    if (grad) tp_gather_grad(m->w, index, full);
    else tp_gather_param(m->w, index, full);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    int world = comm_world()->size;

    /* ---- flags ---- */
    run_options o = run_options_default("03");
    o.kv_heads_follow_heads = true;   /* tp = 4 runs the default model as is */
    int tp_degree = world;
    ac_mode ac = AC_NONE;
    bool sp = true, skip_norm_allreduce = false, rope_local = false;
    static const char *const ac_names[] = {"none", "selective", "full", NULL};
    static const struct option flags[] = {
        RUN_FLAGS, {"tp", required_argument, 0, OPT_TP}, {"ac", required_argument, 0, OPT_AC},
        {"no-sp", no_argument, 0, OPT_NO_SP},
        {"skip-norm-grad-allreduce", no_argument, 0, OPT_SKIP_NORM},
        {"rope-local-positions", no_argument, 0, OPT_ROPE_LOCAL}, {0, 0, 0, 0}};
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, "", flags, NULL)) != -1;) {
        if (c == OPT_TP) tp_degree = cli_int("--tp", optarg, 1, 4096);
        else if (c == OPT_AC) ac = (ac_mode)cli_choice("--ac", optarg, ac_names);
        else if (c == OPT_NO_SP) sp = false;
        else if (c == OPT_SKIP_NORM) skip_norm_allreduce = true;
        else if (c == OPT_ROPE_LOCAL) rope_local = true;
        else if (!run_options_parse(&o, c, optarg, usage)) cli_unknown(argc, argv, optind);
    }
    if (optind < argc) comm_exit_usage("unexpected argument '%s'; run with --help", argv[optind]);
    if (!sp && skip_norm_allreduce)
        comm_exit_usage("--skip-norm-grad-allreduce needs sequence parallelism: with --no-sp every rank's norms see every token and there is no all-reduce to skip");
    if (!sp && rope_local)
        comm_exit_usage("--rope-local-positions needs sequence parallelism: with --no-sp a rank's tokens are the whole sequence and local positions are the global ones");
    run_options_validate(&o);
    const llama_config *c = &o.model;
    int B = o.batch, T = c->seq_len, N = B * T, D = c->dim, V = c->vocab_size, L = c->n_layers;

    /* ---- mesh: one dimension, tp ---- */
    mesh_shape shape = {{1, 1, 1, 1, tp_degree}};
    device_mesh *mesh = mesh_create(shape);
    comm_group *tp = mesh->group[MESH_TP];
    int p = tp->size;

    /* ---- model: this rank's shard (validates tp against seq_len, heads, ffn, vocabulary) ---- */
    sp_llama *model = sp_llama_create(c, tp, B, sp, ac, o.seed);
    model->skip_norm_grad_allreduce = skip_norm_allreduce;
    model->rope_local_positions = rope_local;
    const sp_dims *d = &model->d;
    double param_bytes = mem_current(MEM_PARAMS), act_bytes = mem_current(MEM_ACTIVATIONS);
    llama_model *base = o.check && comm_world()->rank == 0 ? llama_create(c, B, T, o.seed) : NULL;
    int *tokens = device_alloc_ints(N, MEM_BUFFERS), *targets = device_alloc_ints(N, MEM_BUFFERS);
    int *positions = run_positions(T);
    float *dh0 = comm_world()->rank == 0 ? malloc((size_t)N * D * sizeof(float)) : NULL;

    const char *layout = sp ? "tp+sp" : "tp";
    log0("chapter 03: %s, tp = %d, activation checkpointing %s, backend %s\n",
         sp ? "sequence parallelism on the tensor-parallel group" : "tensor parallelism without sequence parallelism (--no-sp)",
         p, ac_mode_name(ac), device_backend_name());
    log0("model: dim %d, %d layers, %d heads (%d kv), head dim %d, ffn %d, vocab %d; batch %d x %d tokens\n",
         D, L, c->n_heads, c->n_kv_heads, d->hd, c->ffn_dim, V, B, T);
    log0("per rank: residual stream [%d, %d, %d] (tokens [r*%d, (r+1)*%d) of each sequence), "
         "%d of %d heads, %d of %d ffn units, %d of %d vocabulary rows\n",
         B, d->Ts, D, d->Ts, d->Ts, d->Hl, c->n_heads, d->Fl, c->ffn_dim, d->Vl, V);
    if (skip_norm_allreduce) log0("deliberate bug: the norm weights' gradients are not summed over tp\n");
    if (rope_local) log0("deliberate bug: RoPE numbers each rank's tokens from 0 within its shard\n");
    if (o.dump_dir) run_dump_params(&o, "init.safetensors", false, gather_sp, model);

    char path[512], label[48];
    snprintf(path, sizeof path, "%s/loss_%s_tp%d_%s.csv", o.out_dir, sp ? "sp" : "nosp", p, ac_mode_name(ac));
    snprintf(label, sizeof label, "%s=%d ac=%s", layout, p, ac_mode_name(ac));
    FILE *csv = csv_open(path, "step,baseline,parallel");

    /* ---- train ---- */
    comm_reset_all_stats();
    run_clock clock = {0};
    for (int step = 1; step <= o.steps; step++) {
        int n_pad, n_valid = run_batch(&o, step, tokens, targets, &n_pad);
        float scale = run_loss_scale(n_valid);

        run_clock_start(&clock);
        tp_params_zero_grad(model->w);
        float loss = sp_llama_forward(model, tokens, targets, positions, scale);
        sp_llama_backward(model);
        double t_fb = run_clock_stop(&clock);

        double base_loss = run_baseline_step(base, tokens, targets, positions, scale);
        if (o.check) {
            /* d loss / d h0: [B, T/tp, D] per rank, put together on rank 0 (not counted) */
            sp_gather_residual_to_host(model, model->dh, dh0);
        }
        run_step_report(&o, step, label, csv, loss, base_loss, n_pad, 1e3 * t_fb, base, gather_sp, model, dh0);

        run_clock_start(&clock);
        tp_params_adamw_step(model->w, &o.opt, step);
        run_clock_stop(&clock);
        if (base) llama_adamw_step(base, &o.opt, step);
    }
    csv_close(csv);

    /* ---- communication, measured beside the README's formulas ---- */
    log0("\n");
    int mismatches = 0;
    double X = 4.0 * N * D, N4 = 4.0 * N, ring = p > 1 ? (double)(p - 1) / p : 0.0;
    double boundaries = 4.0 * L + 2;                     /* chapter 01's f and g, plus ch. 02's two */
    double regathers = sp ? 2.0 * L + 1 : 0;             /* norm outputs SP kept only a shard of   */
    double recomputed = ac == AC_FULL ? L : 0;           /* full AC: wo's exit, once more          */
    double norm_ar = sp && !skip_norm_allreduce ? 1 : 0; /* sp_norm_grads_all_reduce               */
    if (sp) {
        comm_expectation expect[] = {
            {tp, COLL_ALL_GATHER, boundaries + regathers, (boundaries + regathers) * X,
             "(4L+2 + 2L+1 re-gathers) x BTD*4"},
            {tp, COLL_REDUCE_SCATTER, boundaries + recomputed, (boundaries + recomputed) * X,
             ac == AC_FULL ? "(4L+2 + L recomputed) x BTD*4" : "(4L+2) x BTD*4"},
            {tp, COLL_ALL_REDUCE, 3 + norm_ar, 3 * N4 + norm_ar * (2.0 * L + 1) * D * 4,
             norm_ar ? "3 x BT*4 (loss) + (2L+1)D*4 (norms)" : "3 x BT*4 (loss)"}};
        mismatches += report_communication(&tp, 1, o.steps, expect, 3);
    } else {
        comm_expectation expect[] = {
            {tp, COLL_ALL_REDUCE, boundaries + recomputed + 3, (boundaries + recomputed) * X + 3 * N4,
             ac == AC_FULL ? "(5L+2) x BTD*4 + 3 x BT*4" : "(4L+2) x BTD*4 + 3 x BT*4"}};
        mismatches += report_communication(&tp, 1, o.steps, expect, 1);
    }
    /* Beside chapter 01: the same boundaries, each an all-reduce there, a pair here. A ring
     * all-reduce of n bytes sends 2(p-1)/p n per rank; an all-gather or a reduce-scatter whose
     * whole tensor is n bytes sends (p-1)/p n. */
    double ch01_wire = boundaries * 2 * ring * X;
    log0("  beside chapter 01 (+ 02's ends), per rank per step, ring model:\n");
    log0("    chapter 01: %.0f all-reduces of B*T*D*4 = %s each: %s sent\n", boundaries, fmt_bytes(X),
         fmt_bytes(ch01_wire));
    if (sp) {
        double measured = (tp->stats[COLL_ALL_GATHER].wire_bytes + tp->stats[COLL_REDUCE_SCATTER].wire_bytes) / o.steps;
        double pairs = boundaries * 2 * ring * X, regather = regathers * ring * X, recompute = recomputed * ring * X;
        log0("    here:       the same %.0f boundaries, each an all-gather + a reduce-scatter: %s sent (the same bytes)\n",
             boundaries, fmt_bytes(pairs));
        log0("                + %.0f re-gathers of the norm outputs, of which each rank kept only its shard: %s\n",
             regathers, fmt_bytes(regather));
        if (ac == AC_FULL)
            log0("                + %.0f reduce-scatters of the forward recomputed by full AC: %s\n", recomputed,
                 fmt_bytes(recompute));
        bool ok = fabs(measured - (pairs + regather + recompute)) < 0.5;
        mismatches += !ok;
        if (!ok) parity_fail("the measured all-gather + reduce-scatter bytes differ from the formula (above)");
        log0("                measured all-gather + reduce-scatter: %s | formula %s %s\n", fmt_bytes(measured),
             fmt_bytes(pairs + regather + recompute), ok ? "" : "MISMATCH");
    } else {
        double measured = tp->stats[COLL_ALL_REDUCE].wire_bytes / o.steps;
        double formula = (boundaries + recomputed) * 2 * ring * X + 3 * 2 * ring * N4;
        bool ok = fabs(measured - formula) < 0.5;
        mismatches += !ok;
        if (!ok) parity_fail("the measured all-reduce bytes differ from the formula (above)");
        log0("    here:       the same all-reduces (--no-sp)%s, with the loss's 3 x B*T*4: %s sent | formula %s %s\n",
             ac == AC_FULL ? " + L of the forward recomputed by full AC" : "", fmt_bytes(measured),
             fmt_bytes(formula), ok ? "" : "MISMATCH");
    }

    /* ---- activation memory: every mode at this tp, measured by the allocator ---- */
    log0("\n");
    int hd = d->hd, H = c->n_heads, Hkv = c->n_kv_heads, F = c->ffn_dim;
    double replicated = (2.0 * L + 1) * D;
    double sharded = 2.0 * d->Vl * D + (double)L * (2.0 * H * hd * D + 2.0 * Hkv * hd * D + 3.0 * F * D) / p;
    memory_row params[] = {{"parameters", param_bytes, 4 * (replicated + sharded),
                            "4 (2VD/t + (2L+1)D + L(2H hd D + 2Hkv hd D + 3FD)/t)"}};
    mismatches += report_memory("memory per rank", params, 1);

    /* s = T, b = B, h = D, f = F, a = H, hkv = Hkv*hd, t = tp (the README's notation) */
    static const char *formula[2][AC_NMODES] = {
        {"4sb(4h+2 + (2h+2hkv+3f+as)/t)", "4sb(2h + (2h+2hkv+2f)/t)", "4sbh"},
        {"4sb(6h+2+2hkv+3f+as)/t", "4sb(4h+2hkv+2f)/t", "4sbh/t"}};
    char names[2][AC_NMODES][48];
    memory_row rows[2 * AC_NMODES];
    char csv_path[512];
    snprintf(csv_path, sizeof csv_path, "%s/activation_memory_tp%d.csv", o.out_dir, p);
    FILE *mem_csv = csv_open(csv_path, "mode,tp,measured_bytes,formula_bytes");
    for (int s = 0; s < 2; s++)
        for (int a = 0; a < AC_NMODES; a++) {
            sp_dims dm = sp_dims_make(c, B, p, s == 1);
            double measured = (double)sp_layer_act_bytes_measured(&dm, (ac_mode)a);
            double predicted = sp_layer_act_bytes_formula(&dm, (ac_mode)a);
            bool mine = (s == 1) == sp && (ac_mode)a == ac;
            snprintf(names[s][a], sizeof names[s][a], "%s %s%s", s ? "tp+sp" : "tp", ac_mode_name((ac_mode)a),
                     mine ? " (this run)" : "");
            rows[s * AC_NMODES + a] = (memory_row){names[s][a], measured, predicted, formula[s][a]};
            csv_row(mem_csv, "%s/%s,%d,%.0f,%.0f", s ? "tp+sp" : "tp", ac_mode_name((ac_mode)a), p,
                    measured, predicted);
        }
    csv_close(mem_csv);
    char title[96];
    snprintf(title, sizeof title, "activations saved for backward, per layer per rank, tp = %d", p);
    mismatches += report_memory(title, rows, 2 * AC_NMODES);

    /* this run: every layer must have saved exactly the formula's bytes */
    double layer_formula = sp_layer_act_bytes_formula(d, ac);
    int bad_layers = 0, shown = 0;
    double layers_measured = 0;
    for (int l = 0; l < L; l++) {
        layers_measured += (double)model->layer_act_bytes[l];
        if (fabs((double)model->layer_act_bytes[l] - layer_formula) >= 0.5 && bad_layers++ == 0) shown = l;
    }
    double outside = sp_outside_act_bytes_formula(d);
    char what[64];
    snprintf(what, sizeof what, "layers 0..%d, each", L - 1);
    memory_row run_rows[] = {
        {what, (double)model->layer_act_bytes[shown], layer_formula, formula[sp][ac]},
        {"outside the layers", act_bytes - layers_measured, outside, "4(2sbh/t' + sb/t' + sbV/t + 2sb)"},
        {"all saved activations", act_bytes, L * layer_formula + outside, "L x layer + outside"}};
    snprintf(title, sizeof title, "this run (%s, ac %s), per rank (t' = %d: the sequence split)", layout,
             ac_mode_name(ac), sp ? p : 1);
    mismatches += report_memory(title, run_rows, 3) + (bad_layers > 0);
    if (bad_layers) {
        log0("  %d layer(s) saved a different number of bytes: MISMATCH\n", bad_layers);
        parity_fail("a layer saved a different number of activation bytes (above)");
    }
    double none_bytes = sp_layer_act_bytes_formula(d, AC_NONE);
    if (ac != AC_NONE)
        log0("  ac %s keeps %s per layer instead of %s; what it drops lives once, in %s of buffers shared by the layers\n",
             ac_mode_name(ac), fmt_bytes(layer_formula), fmt_bytes(none_bytes), fmt_bytes(none_bytes - layer_formula));
    run_clock_report(&clock, o.steps);

    int status = 0;
    if (o.check) {
        if (mismatches) log0("%d measured figure(s) differ from the formulas\n", mismatches);
        status = parity_report() || mismatches;
    } else if (mismatches) {
        log0("%d measured figure(s) differ from the formulas\n", mismatches);
        status = 1;
    }
    free(dh0);
    if (base) llama_free(base);
    sp_llama_free(model);
    device_free(tokens); device_free(targets); device_free(positions);
    comm_finalize();
    return status;
}
