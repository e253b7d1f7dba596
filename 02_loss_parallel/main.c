/* Chapter 02: loss parallelism. The vocabulary split over the tensor-parallel ranks.
 *
 * In a small model the largest activation of a training step is the logits tensor [B, T, V].
 * Chapter 01 kept the embedding, the output layer and the loss replicated, so every rank held
 * all of it. Here each rank owns V/tp rows of tok_embeddings and of output (vocab_parallel.h),
 * holds logits [B, T, V/tp], and computes the cross-entropy from its slice with three
 * all-reduces of B*T floats: the full logits never exist anywhere. The layers are chapter 01's.
 * Rank 0 trains the single-device baseline beside it (plain cross-entropy) and compares.
 *
 *   make run-02                      tp = 2 (NP=2), loss parallel, parity check on
 *   make run-02 NP=4 ARGS="--no-loss-parallel"     chapter 01's replicated logits, to compare
 *   make check-02                    tp = 1, 2, 4, a vocabulary with tokens in every shard, ...
 *   make plot-02                     logits memory per rank against tp, measured and formula
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "cli.h"
#include "comm.h"
#include "device.h"
#include "llama_kernels.h"
#include "log.h"
#include "mesh.h"
#include "parity.h"
#include "report.h"
#include "run.h"
#include "loss_check.h"
#include "vp_llama.h"

static const char *usage =
    "usage: 02 [flags]   (under mpirun: NP ranks = the tensor-parallel degree)\n"
    "  --tp N                     tensor-parallel degree (default: NP; must equal NP)\n"
    "  --loss-parallel            vocabulary-parallel embedding, output and loss (the default)\n"
    "  --no-loss-parallel         chapter 01's replicated embedding, output and [B, T, V] logits\n"
    "  --skip-output-allreduce    leave out f's backward all-reduce before output (a deliberate bug)\n";

enum { OPT_TP = 1, OPT_LOSS_PARALLEL, OPT_NO_LOSS_PARALLEL, OPT_SKIP };

/* run.h's hook: bring a full parameter or gradient of the tp model to rank 0. */
static void gather_tp(void *model, int index, bool grad, float *full) {
    tp_llama *m = model;
    if (grad) tp_gather_grad(m->w, index, full);
    else tp_gather_param(m->w, index, full);
}

/* The largest single activation or scratch buffer allocated since the last mem_reset_peaks(). */
static double largest_buffer(void) {
    size_t a = mem_largest_alloc(MEM_ACTIVATIONS), b = mem_largest_alloc(MEM_BUFFERS);
    return (double)(a > b ? a : b);
}

/* Appends "tp,loss_parallel,measured_bytes,formula_bytes" to DIR/logits_memory.csv (rank 0),
 * with the header when the file is new: make plot-02 collects one row per run. */
static void append_memory_csv(const char *dir, int tp, bool loss_parallel, double measured,
                              double formula) {
    if (comm_world()->rank != 0) return;
    char path[512];
    snprintf(path, sizeof path, "%s/logits_memory.csv", dir);
    bool is_new = make_dirs(dir) == 0 && access(path, F_OK) != 0;
    FILE *f = fopen(path, "a");
    if (!f) { log0("cannot append to %s\n", path); return; }
    if (is_new) fprintf(f, "tp,loss_parallel,measured_bytes,formula_bytes\n");
    fprintf(f, "%d,%d,%.0f,%.0f\n", tp, loss_parallel ? 1 : 0, measured, formula);
    fclose(f);
}

/* Step 1: how the batch falls on the vocabulary shards, and its padding. */
static void describe_batch(const int *tokens_dev, const int *targets_dev, int B, int T, int V, int p) {
    int N = B * T, Vl = V / p;
    int *tok = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
    int *tok_in = calloc(p, sizeof(int)), *tgt_in = calloc(p, sizeof(int));
    device_copy_to_host(tok, tokens_dev, (size_t)N * sizeof(int));
    device_copy_to_host(tgt, targets_dev, (size_t)N * sizeof(int));
    int padded_seqs = 0, empty = 0;
    for (int b = 0; b < B; b++) {
        int padded = 0;
        for (int t = 0; t < T; t++) padded |= tgt[b * T + t] == IGNORE_INDEX;
        padded_seqs += padded;
    }
    for (int n = 0; n < N; n++) {
        tok_in[tok[n] / Vl]++;
        if (tgt[n] != IGNORE_INDEX) tgt_in[tgt[n] / Vl]++;
    }
    log0("step 1 batch: %d of %d sequences padded; tokens | targets per vocabulary shard:", padded_seqs, B);
    for (int r = 0; r < p; r++) {
        log0(" %d|%d", tok_in[r], tgt_in[r]);
        empty += tok_in[r] == 0 || tgt_in[r] == 0;
    }
    log0(empty ? "  (%d shard(s) without tokens or targets)\n" : "  (every shard has both)\n", empty);
    free(tok); free(tgt); free(tok_in); free(tgt_in);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    int world = comm_world()->size;

    /* ---- flags ---- */
    run_options o = run_options_default("02");
    o.kv_heads_follow_heads = true;   /* tp = 4 runs the default model as is */
    int tp_degree = world;
    bool loss_parallel = true, skip_allreduce = false;
    static const struct option flags[] = {
        RUN_FLAGS, {"tp", required_argument, 0, OPT_TP},
        {"loss-parallel", no_argument, 0, OPT_LOSS_PARALLEL},
        {"no-loss-parallel", no_argument, 0, OPT_NO_LOSS_PARALLEL},
        {"skip-output-allreduce", no_argument, 0, OPT_SKIP}, {0, 0, 0, 0}};
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, "", flags, NULL)) != -1;) {
        if (c == OPT_TP) tp_degree = cli_int("--tp", optarg, 1, 4096);
        else if (c == OPT_LOSS_PARALLEL) loss_parallel = true;
        else if (c == OPT_NO_LOSS_PARALLEL) loss_parallel = false;
        else if (c == OPT_SKIP) skip_allreduce = true;
        else if (!run_options_parse(&o, c, optarg, usage)) cli_unknown(argc, argv, optind);
    }
    if (optind < argc) comm_exit_usage("unexpected argument '%s'; run with --help", argv[optind]);
    if (skip_allreduce && !loss_parallel)
        comm_exit_usage("--skip-output-allreduce needs --loss-parallel: without it the output layer is replicated and has no all-reduce to skip");
    run_options_validate(&o);
    const llama_config *c = &o.model;
    int B = o.batch, T = c->seq_len, N = B * T, D = c->dim, V = c->vocab_size, L = c->n_layers;

    /* ---- mesh: one dimension, tp ---- */
    mesh_shape shape = {{1, 1, 1, 1, tp_degree}};
    device_mesh *mesh = mesh_create(shape);
    comm_group *tp = mesh->group[MESH_TP];
    int p = tp->size;

    /* ---- model: this rank's shard (the allocator watches what it allocates) ---- */
    mem_reset_peaks();
    vp_llama *vp = NULL;
    tp_llama *model;
    if (loss_parallel) {   /* validates that tp divides the vocabulary (exit 2 otherwise) */
        vp = vp_llama_create(c, tp, B, T, o.seed);
        vp->skip_output_allreduce = skip_allreduce;
        model = vp->m;
    } else {
        model = tp_llama_create(c, tp, megatron_layouts(), B, T, o.seed);
    }
    int Vl = model->w->Vl, v0 = model->w->v0;
    double param_bytes = mem_current(MEM_PARAMS), act_bytes = mem_current(MEM_ACTIVATIONS);
    double logits_bytes = mem_allocation_bytes(model->logits);
    double largest_model = largest_buffer();

    log0("chapter 02: loss parallelism, tp = %d, loss parallel %s, backend %s\n", p,
         loss_parallel ? "on" : "off (--no-loss-parallel: chapter 01's replicated logits)",
         device_backend_name());
    log0("model: dim %d, %d layers, %d heads (%d kv), ffn %d, vocab %d; batch %d x %d tokens\n",
         D, L, c->n_heads, c->n_kv_heads, c->ffn_dim, V, B, T);
    log0("per rank: vocabulary rows [%d, %d) of %d (rank 0; rank r owns [r*%d, (r+1)*%d)), logits [%d, %d, %d]\n",
         v0, v0 + Vl, V, Vl, Vl, B, T, Vl);
    if (skip_allreduce) log0("deliberate bug: f's backward all-reduce before the output layer is skipped\n");

    /* ---- --check: the loss on its own first (1e4 logits, every target ignored) ---- */
    if (o.check && loss_parallel) loss_check_run(tp, V);

    /* ---- the baseline on rank 0, then the step buffers ---- */
    llama_model *base = o.check && comm_world()->rank == 0 ? llama_create(c, B, T, o.seed) : NULL;
    mem_reset_peaks();   /* from here on the largest allocation is the run's own again */
    int *tokens = device_alloc_ints(N, MEM_BUFFERS), *targets = device_alloc_ints(N, MEM_BUFFERS);
    int *positions = run_positions(T);
    float *dh0 = o.check && comm_world()->rank == 0 ? malloc((size_t)N * D * sizeof(float)) : NULL;
    if (o.dump_dir) run_dump_params(&o, "init.safetensors", false, gather_tp, model);
    char label[32];
    snprintf(label, sizeof label, "tp=%d%s", p, loss_parallel ? " lp" : "");

    /* ---- train ---- */
    comm_reset_all_stats();
    if (vp) vp->loss_comm = (collective_stats){0};
    run_clock clock = {0};
    for (int step = 1; step <= o.steps; step++) {
        int n_pad, n_valid = run_batch(&o, step, tokens, targets, &n_pad);
        float scale = run_loss_scale(n_valid);   /* 1 / valid targets of the whole batch */
        if (step == 1) describe_batch(tokens, targets, B, T, V, loss_parallel ? p : 1);

        run_clock_start(&clock);
        tp_params_zero_grad(model->w);
        float loss;
        if (loss_parallel) {
            loss = vp_llama_forward(vp, tokens, targets, positions, scale);
            vp_llama_backward(vp);
        } else {
            loss = tp_llama_forward(model, tokens, targets, positions, scale);
            tp_llama_backward(model);
        }
        double t_fb = run_clock_stop(&clock);

        double base_loss = run_baseline_step(base, tokens, targets, positions, scale);
        if (dh0) device_copy_to_host(dh0, model->dh, (size_t)N * D * sizeof(float));   /* d loss / d h0, replicated */
        run_step_report(&o, step, label, NULL, loss, base_loss, n_pad, 1e3 * t_fb, base, gather_tp, model, dh0);

        run_clock_start(&clock);
        tp_params_adamw_step(model->w, &o.opt, step);
        run_clock_stop(&clock);
        if (base) llama_adamw_step(base, &o.opt, step);
    }

    /* ---- report: measured beside the README's formulas ---- */
    log0("\n");
    int mismatches = 0;
    double ND4 = 4.0 * N * D, N4 = 4.0 * N, NV4 = 4.0 * N * V;
    /* communication: chapter 01's 4 per layer, plus (loss parallel) the embedding's, f's before
     * the output layer, and the loss's three */
    comm_expectation expect = loss_parallel
        ? (comm_expectation){tp, COLL_ALL_REDUCE, 4.0 * L + 5, (4.0 * L + 2) * ND4 + 3 * N4, "(4L+2) x B*T*D*4 + 3 x B*T*4"}
        : (comm_expectation){tp, COLL_ALL_REDUCE, 4.0 * L, 4.0 * L * ND4, "4 x L x B*T*D*4"};
    mismatches += report_communication(&tp, 1, o.steps, &expect, 1);
    if (loss_parallel) {
        /* the loss's share, counted around vocab_parallel_cross_entropy_forward */
        double calls = (double)vp->loss_comm.calls / o.steps, bytes = vp->loss_comm.payload_bytes / o.steps;
        bool ok = calls == 3 && fabs(bytes - 3 * N4) < 0.5;
        mismatches += !ok;
        if (!ok) parity_fail("the loss's measured communication differs from 3 x B*T*4 (above)");
        log0("  the loss: %.2f all-reduces, %s per step | 3 x B*T*4 = %s (max, sum of exp, target logit)  %s\n",
             calls, fmt_bytes(bytes), fmt_bytes(3 * N4), ok ? "" : "MISMATCH");
        log0("  gathering the logits instead: an all-gather of B*T*V*4 = %s per step (%s sent per rank, ring), %.0fx the loss's\n",
             fmt_bytes(NV4), fmt_bytes(NV4 * (p - 1) / p), NV4 / (3 * N4));
    }

    /* memory: chapter 01's formulas with the vocabulary terms divided by tp (loss parallel) */
    int hd = model->hd, H = c->n_heads, Hkv = c->n_kv_heads, F = c->ffn_dim;
    double vocab_rows = loss_parallel ? (double)V / p : V;   /* Vl */
    double replicated = (2.0 * L + 1) * D;
    double sharded = 2.0 * vocab_rows * D + (double)L * (2.0 * H * hd * D + 2.0 * Hkv * hd * D + 3.0 * F * D) / p;
    double per_layer_acts = 4.0 * N * D + 2.0 * N + 2.0 * N * (H / p) * hd + 2.0 * N * (Hkv / p) * hd +
                            (double)B * (H / p) * T * T + 3.0 * N * (F / p);
    double acts = L * per_layer_acts + 2.0 * N * D + N + N * vocab_rows + (loss_parallel ? 2.0 * N : 0);
    /* the largest buffer of the run: the logits, or one of chapter 01's activations */
    double biggest[] = {N * vocab_rows, (double)N * D, (double)N * (F / p), (double)B * (H / p) * T * T};
    double largest_formula = 0, largest_other = 0;
    for (int i = 0; i < 4; i++) {
        if (biggest[i] > largest_formula) largest_formula = biggest[i];
        if (i > 0 && biggest[i] > largest_other) largest_other = biggest[i];
    }
    double largest_measured = comm_host_max(comm_world(), fmax(largest_model, largest_buffer()));
    memory_row mem[] = {
        {"parameters", param_bytes, 4 * (replicated + sharded),
         loss_parallel ? "4 (2VD/tp + (2L+1)D + L(2H hd D + 2Hkv hd D + 3FD)/tp)"
                       : "4 (2VD + (2L+1)D + L(2H hd D + 2Hkv hd D + 3FD)/tp)"},
        {"saved activations", act_bytes, 4 * acts,
         loss_parallel ? "4 (L(4ND + 2N + 2N hd (H+Hkv)/tp + B T^2 H/tp + 3NF/tp) + 2ND + N + NV/tp + 2N)"
                       : "4 (L(4ND + 2N + 2N hd (H+Hkv)/tp + B T^2 H/tp + 3NF/tp) + 2ND + N + NV)"},
        {"logits", logits_bytes, 4 * N * vocab_rows, loss_parallel ? "B*T*V/tp*4" : "B*T*V*4"},
        {"largest buffer, any rank", largest_measured, 4 * largest_formula,
         loss_parallel ? "4 max(BTV/tp, BTD, BTF/tp, B T^2 H/tp)" : "4 max(BTV, BTD, BTF/tp, B T^2 H/tp)"}};
    mismatches += report_memory("memory per rank", mem, 4);
    log0("  logits per rank: %s with loss parallel (B*T*V/tp*4), %s without (B*T*V*4)%s\n",
         fmt_bytes(NV4 / p), fmt_bytes(NV4),
         loss_parallel ? "; this run measured the first" : "; this run measured the second");
    if (loss_parallel && p > 1) {
        /* the lesson's claim, checked by the allocator: no rank ever held B*T*V floats */
        if (4 * largest_other >= NV4)
            log0("  full logits: not judged, another activation (%s) is as large as B*T*V*4 = %s\n",
                 fmt_bytes(4 * largest_other), fmt_bytes(NV4));
        else {
            bool ok = largest_measured < NV4;
            mismatches += !ok;
            if (!ok) parity_fail("a rank allocated a buffer of B*T*V floats (above)");
            log0("  full logits: the largest buffer on any rank is %s < B*T*V*4 = %s: %s\n",
                 fmt_bytes(largest_measured), fmt_bytes(NV4),
                 ok ? "no rank ever held the [B, T, V] logits" : "MISMATCH, a rank allocated a full-logits buffer");
        }
    }
    append_memory_csv(o.out_dir, p, loss_parallel, logits_bytes, 4 * N * vocab_rows);
    run_clock_report(&clock, o.steps);

    int status = 0;
    if (o.check) {
        if (mismatches) log0("%d measured figure(s) differ from the formulas\n", mismatches);
        status = parity_report() || mismatches;
    }
    free(dh0);
    if (base) llama_free(base);
    if (vp) vp_llama_free(vp);
    else tp_llama_free(model);
    device_free(tokens); device_free(targets); device_free(positions);
    comm_finalize();
    return status;
}
