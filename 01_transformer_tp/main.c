/* Chapter 01: Megatron tensor parallelism of a Llama transformer.
 *
 * Every rank holds H/tp attention heads and ffn_dim/tp feed-forward units of every layer
 * (tp.c); the norms, the embedding and the output layer are replicated. Rank 0 also trains the
 * single-device baseline (common/llama.c) on the same batches and compares every step.
 *
 *   make run-01                      tp = 2 (NP=2), parity check on
 *   make run-01 NP=4 ARGS="--n-kv-heads 4 --steps 20"
 *   make check-01                    tp = 1, 2, 4, with and without grouped-query heads
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
#include "tp.h"

static const char *usage =
    "usage: 01 [flags]   (under mpirun: NP ranks = the tensor-parallel degree)\n"
    "  --tp N                       tensor-parallel degree (default: NP; must equal NP)\n"
    "  --skip-backward-allreduce    leave out f's backward all-reduce (a deliberate bug)\n";

enum { OPT_TP = 1, OPT_SKIP };

/* run.h's hook: bring a full parameter or gradient of the tp model to rank 0. */
static void gather_tp(void *model, int index, bool grad, float *full) {
    tp_llama *m = model;
    if (grad) tp_gather_grad(m->w, index, full);
    else tp_gather_param(m->w, index, full);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    int world = comm_world()->size;

    /* ---- flags ---- */
    run_options o = run_options_default("01");
    int tp_degree = world;
    bool skip_allreduce = false;
    static const struct option flags[] = {
        RUN_FLAGS, {"tp", required_argument, 0, OPT_TP},
        {"skip-backward-allreduce", no_argument, 0, OPT_SKIP}, {0, 0, 0, 0}};
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, "", flags, NULL)) != -1;) {
        if (c == OPT_TP) tp_degree = cli_int("--tp", optarg, 1, 4096);
        else if (c == OPT_SKIP) skip_allreduce = true;
        else if (!run_options_parse(&o, c, optarg, usage)) cli_unknown(argc, argv, optind);
    }
    if (optind < argc) comm_exit_usage("unexpected argument '%s'; run with --help", argv[optind]);
    run_options_validate(&o);
    const llama_config *c = &o.model;
    int B = o.batch, T = c->seq_len, N = B * T, D = c->dim, V = c->vocab_size, L = c->n_layers;

    /* ---- mesh: one dimension, tp ---- */
    mesh_shape shape = {{1, 1, 1, 1, tp_degree}};
    device_mesh *mesh = mesh_create(shape);
    comm_group *tp = mesh->group[MESH_TP];

    /* ---- model: this rank's shard; the baseline beside it on rank 0 ---- */
    tp_llama *model = tp_llama_create(c, tp, megatron_layouts(), B, T, o.seed);
    model->skip_backward_allreduce = skip_allreduce;
    double param_bytes = mem_current(MEM_PARAMS), act_bytes = mem_current(MEM_ACTIVATIONS);
    llama_model *base = o.check && comm_world()->rank == 0 ? llama_create(c, B, T, o.seed) : NULL;
    int *tokens = device_alloc_ints(N, MEM_BUFFERS), *targets = device_alloc_ints(N, MEM_BUFFERS);
    int *positions = run_positions(T);
    float *dh0 = o.check && comm_world()->rank == 0 ? malloc((size_t)N * D * sizeof(float)) : NULL;

    log0("chapter 01: Megatron tensor parallelism, tp = %d, backend %s\n", tp->size, device_backend_name());
    log0("model: dim %d, %d layers, %d heads (%d kv), head dim %d, ffn %d, vocab %d; batch %d x %d tokens\n",
         D, L, c->n_heads, c->n_kv_heads, model->hd, c->ffn_dim, V, B, T);
    log0("per rank: %d of %d heads, %d of %d kv heads, %d of %d ffn units\n", model->Hl, c->n_heads,
         model->Hkvl, c->n_kv_heads, model->Fl, c->ffn_dim);
    if (skip_allreduce) log0("deliberate bug: f's backward all-reduce is skipped\n");
    if (o.dump_dir) run_dump_params(&o, "init.safetensors", false, gather_tp, model);

    char path[512], label[32];
    snprintf(path, sizeof path, "%s/loss_tp%d.csv", o.out_dir, tp->size);
    snprintf(label, sizeof label, "tp=%d", tp->size);
    FILE *csv = csv_open(path, "step,baseline,tensor_parallel");

    /* ---- train ---- */
    comm_reset_all_stats();
    run_clock clock = {0};
    for (int step = 1; step <= o.steps; step++) {
        int n_pad, n_valid = run_batch(&o, step, tokens, targets, &n_pad);
        float scale = run_loss_scale(n_valid);

        run_clock_start(&clock);
        tp_params_zero_grad(model->w);
        float loss = tp_llama_forward(model, tokens, targets, positions, scale);
        tp_llama_backward(model);
        double t_fb = run_clock_stop(&clock);

        double base_loss = run_baseline_step(base, tokens, targets, positions, scale);
        if (dh0) device_copy_to_host(dh0, model->dh, (size_t)N * D * sizeof(float));   /* d loss / d h0, replicated */
        run_step_report(&o, step, label, csv, loss, base_loss, n_pad, 1e3 * t_fb, base, gather_tp, model, dh0);

        run_clock_start(&clock);
        tp_params_adamw_step(model->w, &o.opt, step);
        run_clock_stop(&clock);
        if (base) llama_adamw_step(base, &o.opt, step);
    }
    csv_close(csv);

    /* ---- report: measured beside the README's formulas ---- */
    log0("\n");
    double act = (double)N * D * 4;
    comm_expectation expect[] = {
        {tp, COLL_ALL_REDUCE, 4.0 * L, 4.0 * L * act, "4 x L x B*T*D*4"}};
    int mismatches = report_communication(&tp, 1, o.steps, expect, 1);

    int p = tp->size, hd = model->hd, H = c->n_heads, Hkv = c->n_kv_heads, F = c->ffn_dim;
    double replicated = 2.0 * V * D + (2.0 * L + 1) * D;
    double sharded = (double)L * (2.0 * H * hd * D + 2.0 * Hkv * hd * D + 3.0 * F * D) / p;
    double per_layer_acts = 4.0 * N * D + 2.0 * N + 2.0 * N * (H / p) * hd + 2.0 * N * (Hkv / p) * hd +
                            (double)B * (H / p) * T * T + 3.0 * N * (F / p);
    double acts = L * per_layer_acts + 2.0 * N * D + N + (double)N * V;
    memory_row mem[] = {
        {"parameters", param_bytes, 4 * (replicated + sharded), "4 (2VD + (2L+1)D + L(2H hd D + 2Hkv hd D + 3FD)/tp)"},
        {"saved activations", act_bytes, 4 * acts, "4 (L(4ND + 2N + 2N hd (H+Hkv)/tp + B T^2 H/tp + 3NF/tp) + 2ND + N + NV)"}};
    mismatches += report_memory("memory per rank", mem, 2);
    run_clock_report(&clock, o.steps);

    int status = 0;
    if (o.check) {
        if (mismatches) log0("%d measured figure(s) differ from the formulas\n", mismatches);
        status = parity_report() || mismatches;
    }
    free(dh0);
    if (base) llama_free(base);
    tp_llama_free(model);
    device_free(tokens); device_free(targets); device_free(positions);
    comm_finalize();
    return status;
}
