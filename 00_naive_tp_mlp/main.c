/* Chapter 00: a two-layer MLP split across ranks with tensor parallelism.
 *
 *   y = gelu(x W1^T) W2^T,  loss = mean((y - target)^2),  plain SGD
 *
 * W1 (fc1) is split by rows (column-parallel), W2 (fc2) by columns (row-parallel): one
 * all-reduce in forward (g), one in backward (f). Rank 0 also trains the same MLP on its own
 * (the baseline) and checks, every step, that the losses and every gradient agree.
 *
 *   make run-00            two ranks         make run-00 NP=4     four ranks
 *   make run-00 ARGS="--skip-backward-allreduce"   what breaks without f's all-reduce
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "comm.h"
#include "device.h"
#include "files.h"
#include "init.h"
#include "log.h"
#include "mesh.h"
#include "mlp.h"
#include "outputs.h"
#include "parity.h"
#include "report.h"
#include "shard.h"

typedef struct {
    int dim, hidden, batch, steps;
    float lr, init_std;
    uint64_t seed;
    bool check, skip_backward_allreduce;
    const char *out_dir;
} options;

static void usage(void) {
    log0("usage: 00 [flags]   (run under mpirun; every rank is one tensor-parallel shard)\n"
         "  --dim N                    input and output width (default 128)\n"
         "  --hidden N                 hidden width, split across the ranks (default 128)\n"
         "  --batch N                  rows of the fixed random batch (default 16)\n"
         "  --steps N                  SGD steps (default 10)\n"
         "  --lr X                     learning rate (default 0.5)\n"
         "  --seed N                   initialisation seed (default 1234)\n"
         "  --check                    train the single-device baseline beside it and compare\n"
         "  --skip-backward-allreduce  leave out f's backward all-reduce (a deliberate bug)\n"
         "  --out DIR                  where loss.csv goes (default out/00)\n");
}

static options parse_options(int argc, char **argv) {
    options o = {.dim = 128, .hidden = 128, .batch = 16, .steps = 10, .lr = 0.5f,
                 .init_std = 0.1f, .seed = 1234, .out_dir = "out/00"};
    static const struct option flags[] = {
        {"dim", required_argument, 0, 'd'},   {"hidden", required_argument, 0, 'H'},
        {"batch", required_argument, 0, 'b'}, {"steps", required_argument, 0, 's'},
        {"lr", required_argument, 0, 'l'},    {"seed", required_argument, 0, 'S'},
        {"check", no_argument, 0, 'c'},       {"skip-backward-allreduce", no_argument, 0, 'k'},
        {"out", required_argument, 0, 'o'},   {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    opterr = 0;   /* we report bad flags ourselves, once, from rank 0 */
    int c;
    while ((c = getopt_long(argc, argv, "", flags, NULL)) != -1) {
        switch (c) {
        case 'd': o.dim = cli_int("--dim", optarg, 1, 1 << 16); break;
        case 'H': o.hidden = cli_int("--hidden", optarg, 1, 1 << 16); break;
        case 'b': o.batch = cli_int("--batch", optarg, 1, 1 << 16); break;
        case 's': o.steps = cli_int("--steps", optarg, 1, 1000000); break;
        case 'l': o.lr = cli_float("--lr", optarg, 0.0f, 100.0f); break;
        case 'S': o.seed = cli_u64("--seed", optarg); break;
        case 'c': o.check = true; break;
        case 'k': o.skip_backward_allreduce = true; break;
        case 'o': o.out_dir = optarg; break;
        case 'h': usage(); comm_finalize(); exit(0);
        default: cli_unknown(argc, argv, optind);
        }
    }
    if (optind < argc) comm_exit_usage("unexpected argument '%s'; run with --help", argv[optind]);
    return o;
}

/* Bring the sharded gradients to rank 0 as full tensors (host memory). For checking only:
 * this traffic is not counted. fc1 is split by rows, fc2 by columns (see shard.h). */
static void gather_grads(const mlp *m, comm_group *tp, float *fc1_full, float *fc2_full) {
    shard_gather_to_host(tp, SHARD_ROWS, m->dfc1, m->hidden, m->dim, fc1_full);
    shard_gather_to_host(tp, SHARD_COLS, m->dfc2, m->dim, m->hidden, fc2_full);
}

static void print_corner(const char *label, const float *g, int cols) {
    log0("    %-9s", label);
    for (int i = 0; i < 3; i++) log0(" [% .6f % .6f % .6f]", g[i * cols], g[i * cols + 1], g[i * cols + 2]);
    log0("\n");
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    options o = parse_options(argc, argv);

    /* ---- mesh: every rank is one tensor-parallel shard ---- */
    int world = comm_world()->size;
    if (o.hidden % world != 0) {
        char valid[128] = "";
        for (int p = 1, n = 0; p <= o.hidden && n < 6; p++)
            if (o.hidden % p == 0) n++, snprintf(valid + strlen(valid), sizeof valid - strlen(valid), "%s%d", n > 1 ? ", " : "", p);
        comm_exit_usage("NP=%d does not divide --hidden %d: each rank must own hidden/NP units; "
                        "use NP = %s, ...", world, o.hidden, valid);
    }
    device_mesh *mesh = mesh_create((mesh_shape){.tp = world}, NULL);
    comm_group *tp = mesh->group[MESH_TP];
    /* the last refusal: only now is out/ created, and locked (one run per directory; outputs.h) */
    run_path out = {"--out", o.out_dir, RUN_PATH_OUTPUT_DIR, NULL, true, true};
    run_paths_check(&out, 1);
    run_paths_create(&out, 1);
    log0("chapter 00: tensor-parallel MLP  dim %d -> hidden %d -> dim %d, batch %d, tp = %d, backend %s\n",
         o.dim, o.hidden, o.dim, o.batch, tp->size, device_backend_name());
    if (o.skip_backward_allreduce) log0("deliberate bug: f's backward all-reduce is skipped\n");

    /* ---- data: one fixed random batch and target, identical on every rank ---- */
    int N = o.batch, D = o.dim, H = o.hidden;
    float *x = device_alloc_floats((size_t)N * D, MEM_BUFFERS);
    float *target = device_alloc_floats((size_t)N * D, MEM_BUFFERS);
    init_normal_slice_device(x, "input", o.seed, 1.0f, N, D, 0, N, 0, D);
    init_normal_slice_device(target, "target", o.seed, 1.0f, N, D, 0, N, 0, D);

    /* ---- model: this rank's shard; rank 0 also builds the whole model (the baseline) ---- */
    mlp *model = mlp_create(N, D, H, tp->rank, tp->size, o.seed, o.init_std);
    double param_bytes = mem_current(MEM_PARAMS), grad_bytes = mem_current(MEM_GRADS);
    bool baseline_here = o.check && comm_world()->rank == 0;
    mlp *base = baseline_here ? mlp_create(N, D, H, 0, 1, o.seed, o.init_std) : NULL;

    float *fc1_full = malloc((size_t)H * D * sizeof(float)), *fc2_full = malloc((size_t)D * H * sizeof(float));
    float *ref = malloc((size_t)H * D * sizeof(float)), *dx_host = malloc((size_t)N * D * sizeof(float));
    char csv_path[512];
    snprintf(csv_path, sizeof csv_path, "%s/loss.csv", o.out_dir);
    FILE *csv = csv_open(csv_path, "step,baseline,tensor_parallel");

    /* ---- train: both models take the same steps ---- */
    comm_reset_all_stats();
    for (int step = 1; step <= o.steps; step++) {
        mlp_zero_grad(model);
        float loss = tp_mlp_forward(model, tp, x, target);
        tp_mlp_backward(model, tp, x, target, o.skip_backward_allreduce);

        if (!o.check) {
            log0("step %3d | loss tp=%d %.9f\n", step, tp->size, loss);
            csv_row(csv, "%d,,%.9g", step, loss);
            mlp_sgd_step(model, o.lr);
            continue;
        }
        gather_grads(model, tp, fc1_full, fc2_full);
        if (baseline_here) {
            mlp_zero_grad(base);
            float base_loss = mlp_forward(base, x, target);
            mlp_backward(base, x, target);
            log0("step %3d | loss tp=%d %.9f  baseline %.9f  |diff| %.2e\n", step, tp->size, loss,
                 base_loss, (double)(loss > base_loss ? loss - base_loss : base_loss - loss));
            csv_row(csv, "%d,%.9g,%.9g", step, base_loss, loss);
            parity_loss(step, loss, base_loss);
            device_copy_to_host(ref, base->dfc1, (size_t)H * D * sizeof(float));
            log0("  fc1.weight grad, rows 0-2, cols 0-2:\n");
            print_corner("tp", fc1_full, D);
            print_corner("baseline", ref, D);
            log0("  worst relative difference, parallel vs baseline:\n");
            parity_tensor("fc1.weight (grad)", fc1_full, ref, (size_t)H * D);
            device_copy_to_host(ref, base->dfc2, (size_t)D * H * sizeof(float));
            parity_tensor("fc2.weight (grad)", fc2_full, ref, (size_t)D * H);
            device_copy_to_host(dx_host, model->dx, (size_t)N * D * sizeof(float));
            device_copy_to_host(ref, base->dx, (size_t)N * D * sizeof(float));
            parity_tensor("input (dX)", dx_host, ref, (size_t)N * D);
            mlp_sgd_step(base, o.lr);
        }
        mlp_sgd_step(model, o.lr);
    }
    csv_close(csv);
    const char *write_error = file_write_error();   /* a full disk: one line, exit 2, the old loss.csv kept */
    comm_require_all(write_error == NULL, "%s; the previous file is left as it was", write_error ? write_error : "");

    /* ---- report: communication and memory, measured beside the README's formulas ---- */
    double act = (double)N * D * 4;
    comm_expectation expect[] = {
        {tp, COLL_ALL_REDUCE, 2, 2 * act, "2 x B*dim*4 (g fwd, f bwd)"}};
    int mismatches = report_communication(&tp, 1, o.steps, expect, 1);
    double shard = (double)H / tp->size * D * 4 * 2;
    memory_row mem[] = {
        {"parameters per rank", param_bytes, shard, "2 * dim * hidden/tp * 4"},
        {"gradients per rank", grad_bytes, shard, "2 * dim * hidden/tp * 4"}};
    mismatches += report_memory("memory per rank", mem, 2);

    int status = 0;
    if (o.check) {
        if (mismatches) log0("%d measured figure(s) differ from the formulas\n", mismatches);
        status = parity_report() || mismatches;
    }
    free(fc1_full); free(fc2_full); free(ref); free(dx_host);
    mlp_free(model);
    if (base) mlp_free(base);
    device_free(x);
    device_free(target);
    comm_finalize();
    return status;
}
