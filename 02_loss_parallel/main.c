/* Chapter 02: loss parallelism. The vocabulary split over the tensor-parallel ranks.
 *
 * In a small model the largest activation of a training step is the logits tensor [B, T, V].
 * Chapter 01 kept the embedding, the output layer and the loss replicated, so every rank held
 * all of it. Here each rank owns V/tp rows of tok_embeddings and of output (vocab_parallel.h),
 * holds logits [B, T, V/tp], and computes the cross-entropy from its slice with three
 * all-reduces of B*T floats: the full logits never exist anywhere. The layers are chapter 01's
 * plan. Rank 0 trains the single-device baseline beside it (plain cross-entropy) and compares.
 *
 *   make run-02                      tp = 2 (NP=2), loss parallel, parity check on
 *   make run-02 NP=4 ARGS="--no-loss-parallel"     chapter 01's replicated logits, to compare
 *   make check-02                    tp = 1, 2, 4, a vocabulary with tokens in every shard, ...
 *   make plot-02                     logits memory per rank against tp, measured and formula
 */
#include <math.h>
#include <stdio.h>
#include "cli.h"
#include "comm.h"
#include "device.h"
#include "gemm.h"
#include "log.h"
#include "mesh.h"
#include "model.h"
#include "report.h"
#include "run.h"
#include "../01_transformer_tp/tp.h"
#include "loss_check.h"
#include "loss_report.h"
#include "vocab_parallel.h"

static const char *usage =
    "usage: 02 [flags]   (under mpirun: NP ranks = the tensor-parallel degree)\n"
    "  --tp N                     tensor-parallel degree (default: NP; must equal NP)\n"
    "  --loss-parallel            vocabulary-parallel embedding, output and loss (the default)\n"
    "  --no-loss-parallel         chapter 01's replicated embedding, output and [B, T, V] logits\n"
    VOCAB_MULTIPLE_USAGE;

enum { OPT_TP = 1, OPT_LOSS_PARALLEL, OPT_NO_LOSS_PARALLEL, OPT_VOCAB_MULTIPLE };
typedef struct { int tp; bool loss_parallel; llama_config *model; } chapter_options;
static void chapter_flag(int code, const char *arg, void *ctx) {
    chapter_options *co = ctx;
    if (code == OPT_TP) co->tp = cli_int("--tp", arg, 1, 4096);
    else if (code == OPT_VOCAB_MULTIPLE) vocab_multiple_flag(co->model, arg);
    else co->loss_parallel = code == OPT_LOSS_PARALLEL;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* ---- flags ---- */
    run_options o = run_options_default("02", loss_parallel_faults);
    o.kv_heads_follow_heads = true;   /* tp = 4 runs the default model as is */
    chapter_options co = {.tp = 0, .loss_parallel = true, .model = &o.model};
    static const struct option flags[] = {
        {"tp", required_argument, 0, OPT_TP}, {"loss-parallel", no_argument, 0, OPT_LOSS_PARALLEL},
        {"no-loss-parallel", no_argument, 0, OPT_NO_LOSS_PARALLEL},
        {"vocab-multiple", required_argument, 0, OPT_VOCAB_MULTIPLE}, {0, 0, 0, 0}};
    run_parse(&o, argc, argv, flags, chapter_flag, &co, usage);
    const llama_config *c = &o.model;

    if (c->vocab_multiple && !co.loss_parallel)
        comm_exit_usage("--vocab-multiple %d pads the vocabulary split over tp: it needs --loss-parallel (chapter 01's "
                        "replicated vocabulary is not padded)", c->vocab_multiple);

    /* ---- mesh: one dimension, tp (the world unless --tp): whole heads, and the padded
     * vocabulary's rows (mesh_check) ---- */
    mesh_requirements needs = {0};
    mesh_require(&needs, tp_mesh_rule(c));
    if (co.loss_parallel) mesh_require(&needs, vocab_mesh_rule(c->vocab_size, c->vocab_multiple));
    device_mesh *mesh = mesh_create((mesh_shape){.tp = co.tp ? co.tp : MESH_REST}, &needs);
    comm_group *tp = mesh->group[MESH_TP];
    int p = tp->size;

    /* ---- the plan: chapter 01's, with the vocabulary split at both ends ---- */
    llama_plan plan = megatron_plan(mesh, c);
    if (co.loss_parallel) loss_parallel_apply(&plan, c);
    run_apply_fault(&o, &plan);
    count_loss_traffic(&plan);
    mem_reset_peaks();   /* the allocator watches what the model allocates */
    llama_model *model = run_model(&o, &plan);   /* refuses up front what cannot fit */
    const llama_dims *d = &model->d;
    double param_bytes = mem_current(MEM_PARAMS), act_bytes = mem_current(MEM_ACTIVATIONS);
    double logits_bytes = mem_allocation_bytes(model->saved->logits), largest_model = largest_buffer();

    log0("chapter 02: loss parallelism, tp = %d, loss parallel %s, backend %s\n", p,
         co.loss_parallel ? "on" : "off (--no-loss-parallel: chapter 01's replicated logits)", device_backend_name());
    plan_describe(&plan);   /* which technique installed which operator; the groups */
    log0("model: dim %d, %d layers, %d heads (%d kv), ffn %d, vocab %d; batch %d x %d tokens\n",
         d->D, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab_size, d->B, d->T);
    int Vp = co.loss_parallel ? llama_padded_vocab(c, p) : c->vocab_size;   /* the rows the split holds */
    if (co.loss_parallel) vocab_padding_describe(c, p);
    log0("per rank: vocabulary rows [%d, %d) of %d (rank 0; rank r owns [r*%d, (r+1)*%d)), logits [%d, %d, %d]\n",
         d->v0, d->v0 + d->Vl, Vp, d->Vl, d->Vl, d->B, d->T, d->Vl);
    /* --check: the loss on its own first (1e4 logits, every target ignored) */
    if (o.check && co.loss_parallel) loss_check_run(tp, c->vocab_size, Vp);
    describe_batch(&o, co.loss_parallel ? p : 1);

    /* ---- train, with the baseline beside it ---- */
    char label[32];
    snprintf(label, sizeof label, "tp=%d%s", p, co.loss_parallel ? " lp" : "");
    run_clock clock = run_train(&o, model, NULL, label, NULL);

    /* ---- measured beside the README's formulas: chapter 01's, the vocabulary terms over tp (Vp:
     * the padded vocabulary, V itself without padding or without loss parallelism) ---- */
    log0("\n");
    double B = d->B, T = d->T, N = d->N, D = d->D, L = c->n_layers, V = c->vocab_size, Vl = d->Vl;
    double hd = d->hd, H = c->n_heads, Hkv = c->n_kv_heads, F = c->ffn_dim, lp = co.loss_parallel;
    comm_expectation expect[] = {lp
        ? (comm_expectation){tp, COLL_ALL_REDUCE, 4 * L + 5, (4 * L + 2) * N * D * 4 + 3 * N * 4, "(4L+2) x B*T*D*4 + 3 x B*T*4"}
        : (comm_expectation){tp, COLL_ALL_REDUCE, 4 * L, 4 * L * N * D * 4, "4 x L x B*T*D*4"}};
    int mismatches = report_communication(&tp, 1, o.steps, expect, 1);
    /* a layer keeps every activation (its blocks' table); the head its norm, the logits and, under
     * loss parallelism, the loss's row max and sum of exponentials */
    double saved = L * llama_layer_act_bytes(d, ACT_KEEP_ALL) + llama_head_act_bytes(d, 2 * (int)lp);
    /* under --dtype bf16 a linear's rounded copy of its weight lives for its call too (linear.c), in
     * the type its GEMM reads (gemm_bf16_operand_type: s = 2 or 4 bytes): the output layer's
     * [Vl, D], wq's and wo's [H hd/tp, D] (transposed), w1's, w2's and w3's [F/tp, D]; beside the
     * activations only when D is above about B*T */
    double s = c->precision == DTYPE_BF16 ? (double)dtype_size(gemm_bf16_operand_type()) : 0;
    double others[] = {N * D, N * (F / p), B * (H / p) * T * T, s / 4 * Vl * D, s / 4 * (F / p) * D, s / 4 * (H * hd / p) * D};
    double largest_other = 0;
    for (int i = 0; i < 6; i++) largest_other = fmax(largest_other, others[i]);
    const char *largest_formula =
        lp ? (s ? "max(4 BT Vp/tp, 4 BTD, 4 BTF/tp, 4 B T^2 H/tp, s D max(Vp, F, H hd)/tp)" : "4 max(BT Vp/tp, BTD, BTF/tp, B T^2 H/tp)")
           : (s ? "max(4 BTV, 4 BTD, 4 BTF/tp, 4 B T^2 H/tp, s D max(V, F/tp, H hd/tp))" : "4 max(BTV, BTD, BTF/tp, B T^2 H/tp)");
    double largest_measured = comm_host_max(comm_world(), fmax(largest_model, largest_buffer()));
    memory_row mem[] = {
        {"parameters", param_bytes, 4 * (2 * Vl * D + (2 * L + 1) * D + L * (2 * H * hd * D + 2 * Hkv * hd * D + 3 * F * D) / p),
         lp ? "4 (2 Vp D/tp + (2L+1)D + L(2H hd D + 2Hkv hd D + 3FD)/tp)" : "4 (2VD + (2L+1)D + L(2H hd D + 2Hkv hd D + 3FD)/tp)"},
        {"saved activations", act_bytes, saved,
         lp ? "4 (L(4ND + 2N + 2N hd (H+Hkv)/tp + B T^2 H/tp + 3NF/tp) + 2ND + N + N Vp/tp + 2N)"
            : "4 (L(4ND + 2N + 2N hd (H+Hkv)/tp + B T^2 H/tp + 3NF/tp) + 2ND + N + NV)"},
        {"logits", logits_bytes, 4 * N * Vl, lp ? "B*T*Vp/tp*4" : "B*T*V*4"},
        {"largest buffer, any rank", largest_measured, 4 * fmax(N * Vl, largest_other), largest_formula}};
    mismatches += report_memory("memory per rank", mem, 4);
    log0("  logits per rank: %s with loss parallel (B*T*Vp/tp*4, Vp = %d), %s without (B*T*V*4); this run measured the "
         "%s\n", fmt_bytes(4 * N * Vp / p), Vp, fmt_bytes(4 * N * V), lp ? "first" : "second");
    if (lp) mismatches += report_loss_parallel(&o, tp, largest_measured, 4 * largest_other);
    if (lp) mismatches += vocab_padding_report(model);   /* the padding rows: still exactly zero */
    append_memory_csv(o.out_dir, p, lp, logits_bytes, 4 * N * Vl);
    run_clock_report(&clock, o.steps);

    llama_free(model);
    return run_finish(&o, mismatches);
}
