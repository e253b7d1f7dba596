/* Chapter 01: Megatron tensor parallelism of a Llama transformer.
 *
 * Every rank holds H/tp attention heads and ffn_dim/tp feed-forward units of every layer
 * (tp.c: the plan); the norms, the embedding and the output layer are replicated. The model is
 * common/model/model.c, the same code as the single-device baseline, which rank 0 trains
 * beside it on the same batches (--check) and compares every step.
 *
 *   make run-01                      tp = 2 (NP=2), parity check on
 *   make run-01 NP=4 ARGS="--n-kv-heads 4 --steps 20"
 *   make check-01                    tp = 1, 2, 4, with and without grouped-query heads
 */
#include <stdio.h>
#include "cli.h"
#include "comm.h"
#include "device.h"
#include "log.h"
#include "mesh.h"
#include "model.h"
#include "report.h"
#include "run.h"
#include "tp.h"

static const char *usage =
    "usage: 01 [flags]   (under mpirun: NP ranks = the tensor-parallel degree)\n"
    "  --tp N                       tensor-parallel degree (default: NP; must equal NP)\n";

enum { OPT_TP = 1 };
static void chapter_flag(int code, const char *arg, void *tp_degree) {
    *(int *)tp_degree = cli_int("--tp", arg, 1, 4096);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* ---- flags ---- */
    run_options o = run_options_default("01", megatron_faults);
    int tp_degree = 0;                       /* 0: --tp not given, the world's size */
    static const struct option flags[] = {{"tp", required_argument, 0, OPT_TP}, {0, 0, 0, 0}};
    run_parse(&o, argc, argv, flags, chapter_flag, &tp_degree, usage);
    const llama_config *c = &o.model;

    /* ---- mesh: one dimension, tp (the world unless --tp), which must split whole heads ---- */
    mesh_requirements needs = {0};
    mesh_require(&needs, tp_mesh_rule(c));
    device_mesh *mesh = mesh_create((mesh_shape){.tp = tp_degree ? tp_degree : MESH_REST}, &needs);
    tp_degree = mesh->shape.tp;

    /* ---- the plan: Megatron's layouts and its f and g; then the model under it ---- */
    llama_plan plan = megatron_plan(mesh, c);
    run_apply_fault(&o, &plan);
    llama_model *model = run_model(&o, &plan);   /* refuses up front what cannot fit */
    const llama_dims *d = &model->d;
    double param_bytes = mem_current(MEM_PARAMS), act_bytes = mem_current(MEM_ACTIVATIONS);

    log0("chapter 01: Megatron tensor parallelism, tp = %d, backend %s\n", tp_degree, device_backend_name());
    plan_describe(&plan);   /* which technique installed which operator; the groups */
    log0("model: dim %d, %d layers, %d heads (%d kv), head dim %d, ffn %d, vocab %d; batch %d x %d tokens\n",
         d->D, c->n_layers, c->n_heads, c->n_kv_heads, d->hd, c->ffn_dim, c->vocab_size, d->B, d->T);
    log0("per rank: %d of %d heads, %d of %d kv heads, %d of %d ffn units\n", d->Hl, c->n_heads,
         d->Hkvl, c->n_kv_heads, d->Fl, c->ffn_dim);

    /* ---- train, with the baseline beside it ---- */
    char path[512], label[32];
    snprintf(path, sizeof path, "%s/loss_tp%d.csv", o.out_dir, tp_degree);
    snprintf(label, sizeof label, "tp=%d", tp_degree);
    run_clock clock = run_train(&o, model, NULL, label, path);

    /* ---- measured beside the README's formulas ---- */
    log0("\n");
    double N = d->N, D = d->D, L = c->n_layers, V = c->vocab_size, p = tp_degree;
    double hd = d->hd, H = c->n_heads, Hkv = c->n_kv_heads, F = c->ffn_dim;
    comm_expectation expect[] = {
        {mesh->group[MESH_TP], COLL_ALL_REDUCE, 4 * L, 4 * L * N * D * 4, "4 x L x B*T*D*4"}};
    double replicated = 2 * V * D + (2 * L + 1) * D;
    double sharded = L * (2 * H * hd * D + 2 * Hkv * hd * D + 3 * F * D) / p;
    /* a layer keeps every activation (its blocks' table); the head its norm and the logits */
    double saved = L * llama_layer_act_bytes(d, ACT_KEEP_ALL) + llama_head_act_bytes(d, 0);
    memory_row mem[] = {
        {"parameters", param_bytes, 4 * (replicated + sharded), "4 (2VD + (2L+1)D + L(2H hd D + 2Hkv hd D + 3FD)/tp)"},
        {"saved activations", act_bytes, saved,
         "4 (L(4ND + 2N + 2N hd (H+Hkv)/tp + B T^2 H/tp + 3NF/tp) + 2ND + N + NV)"}};
    int mismatches = report_communication(&mesh->group[MESH_TP], 1, o.steps, expect, 1);
    mismatches += report_memory("memory per rank", mem, 2);
    run_clock_report(&clock, o.steps);

    llama_free(model);
    return run_finish(&o, mismatches);
}
