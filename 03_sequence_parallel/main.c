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
#include <stdio.h>
#include "cli.h"
#include "comm.h"
#include "device.h"
#include "log.h"
#include "mesh.h"
#include "model.h"
#include "report.h"
#include "run.h"
#include "../01_transformer_tp/tp.h"
#include "../02_loss_parallel/vocab_parallel.h"
#include "async_tp.h"
#include "sequence_parallel.h"
#include "sp_report.h"

static const char *usage =
    "usage: 03 [flags]   (under mpirun: NP ranks = the tensor-parallel degree)\n"
    "  --tp N                       tensor-parallel degree (default: NP; must equal NP)\n"
    "  --ac none|selective|full     activation checkpointing: what each layer keeps for backward\n"
    "                               (default none)\n"
    "  --no-sp                      no sequence parallelism: chapter 01's replicated norms and\n"
    "                               all-reduces, for comparing memory and traffic\n"
    "  --async-tp                   decompose the sequence all-gathers and reduce-scatters over the\n"
    "                               tp ring, each chunk's GEMM overlapping the next chunk's transfer\n"
    VOCAB_MULTIPLE_USAGE;

enum { OPT_TP = 1, OPT_AC, OPT_NO_SP, OPT_ASYNC_TP, OPT_VOCAB_MULTIPLE };
typedef struct { int tp; ac_mode ac; bool sp, async_tp; llama_config *model; } chapter_options;
static void chapter_flag(int code, const char *arg, void *ctx) {
    static const char *const ac_names[] = {"none", "selective", "full", NULL};
    chapter_options *co = ctx;
    if (code == OPT_TP) co->tp = cli_int("--tp", arg, 1, 4096);
    else if (code == OPT_AC) co->ac = (ac_mode)cli_choice("--ac", arg, ac_names);
    else if (code == OPT_ASYNC_TP) co->async_tp = true;
    else if (code == OPT_VOCAB_MULTIPLE) vocab_multiple_flag(co->model, arg);
    else co->sp = false;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* ---- flags ---- */
    static plan_fault faults[8];   /* sequence parallelism's, then async TP's */
    int nf = 0;
    while (sequence_parallel_faults[nf].name) { faults[nf] = sequence_parallel_faults[nf]; nf++; }
    faults[nf] = async_tp_fault;
    run_options o = run_options_default("03", faults);
    o.kv_heads_follow_heads = true;   /* tp = 4 runs the default model as is */
    chapter_options co = {.tp = 0, .ac = AC_NONE, .sp = true, .async_tp = false, .model = &o.model};
    static const struct option flags[] = {
        {"tp", required_argument, 0, OPT_TP}, {"ac", required_argument, 0, OPT_AC},
        {"no-sp", no_argument, 0, OPT_NO_SP}, {"async-tp", no_argument, 0, OPT_ASYNC_TP},
        {"vocab-multiple", required_argument, 0, OPT_VOCAB_MULTIPLE}, {0, 0, 0, 0}};
    run_parse(&o, argc, argv, flags, chapter_flag, &co, usage);
    const llama_config *c = &o.model;

    /* ---- mesh: one dimension, tp (the world unless --tp): whole heads, the padded vocabulary's
     * rows (02) and tokens ---- */
    mesh_requirements needs = {0};
    mesh_require(&needs, tp_mesh_rule(c));
    mesh_require(&needs, vocab_mesh_rule(c->vocab_size, c->vocab_multiple));
    if (co.sp) mesh_require(&needs, sp_mesh_rule(c->seq_len));
    device_mesh *mesh = mesh_create((mesh_shape){.tp = co.tp ? co.tp : MESH_REST}, &needs);
    comm_group *tp = mesh->group[MESH_TP];
    int p = tp->size;

    /* ---- the plan: chapter 02's, then the sequence split and the checkpointing mode ---- */
    llama_plan plan = megatron_plan(mesh, c);
    loss_parallel_apply(&plan, c);
    sequence_parallel_apply(&plan, c, o.batch, co.sp, co.ac);
    if (co.async_tp) async_tp_apply(&plan, c, o.batch);
    run_apply_fault(&o, &plan);
    llama_model *model = run_model(&o, &plan);   /* refuses up front what cannot fit */
    const llama_dims *d = &model->d;
    double param_bytes = mem_current(MEM_PARAMS), act_bytes = mem_current(MEM_ACTIVATIONS);

    log0("chapter 03: %s, tp = %d, activation checkpointing %s, backend %s\n",
         co.sp ? "sequence parallelism on the tensor-parallel group" : "tensor parallelism without sequence parallelism (--no-sp)",
         p, ac_mode_name(co.ac), device_backend_name());
    plan_describe(&plan);   /* which technique installed which operator; the groups */
    log0("model: dim %d, %d layers, %d heads (%d kv), head dim %d, ffn %d, vocab %d; batch %d x %d tokens\n",
         d->D, c->n_layers, c->n_heads, c->n_kv_heads, d->hd, c->ffn_dim, c->vocab_size, d->B, d->T);
    log0("per rank: residual stream [%d, %d, %d] (tokens [r*%d, (r+1)*%d) of each sequence), "
         "%d of %d heads, %d of %d ffn units, %d of %d vocabulary rows\n",
         d->B, d->Ts, d->D, d->Ts, d->Ts, d->Hl, c->n_heads, d->Fl, c->ffn_dim, d->Vl, p * d->Vl);
    vocab_padding_describe(c, p);

    /* ---- train, with the baseline beside it ---- */
    char path[512], label[48];
    snprintf(path, sizeof path, "%s/loss_%s_tp%d_%s.csv", o.out_dir, co.sp ? "sp" : "nosp", p, ac_mode_name(co.ac));
    snprintf(label, sizeof label, "%s=%d ac=%s", co.sp ? "tp+sp" : "tp", p, ac_mode_name(co.ac));
    run_clock clock = run_train(&o, model, NULL, label, path);

    /* ---- communication, measured beside the README's formulas ---- */
    log0("\n");
    double N = d->N, D = d->D, L = c->n_layers, X = 4 * N * D, N4 = 4 * N;
    double boundaries = 4 * L + 2;                          /* chapter 01's f and g, plus ch. 02's two */
    double regathers = co.sp ? 2 * L + 1 : 0;               /* norm outputs SP kept only a shard of   */
    double recomputed = co.ac == AC_FULL ? L : 0;           /* full AC: wo's exit, once more          */
    double norm_ar = plan.reduce_grads.reduce ? 1 : 0;             /* sp_norm_grads_all_reduce               */
    /* --async-tp: the gathers and reduce-scatters around a GEMM become p-1 ring steps each
     * (async_tp.h): 4L+1 of each (+2L gathers and +L reduce-scatters recomputed by full AC) */
    double ag_ring = co.async_tp ? 4 * L + 1 + (co.ac == AC_FULL ? 2 * L : 0) : 0;
    double rs_ring = co.async_tp ? 4 * L + 1 + (co.ac == AC_FULL ? L : 0) : 0;
    double ring_msgs = (p - 1) * (ag_ring + rs_ring);
    /* --dtype bf16: the gathers whose readers are GEMMs move bf16, 2 bytes an element, every one but
     * the embedding's dy (sp_all_gather_seq_bf16), and so do the async-TP gather rings' chunks (the
     * reduce-scatter rings sum partial results: fp32) */
    bool bf16 = co.sp && c->precision == DTYPE_BF16;
    double gathers = boundaries + regathers - ag_ring, bf16_gathers = bf16 ? gathers - 1 : 0;
    double ring_bytes = (p - 1) * (ag_ring * (bf16 ? X / 2 : X) + rs_ring * X) / p;
    const char *ring_formula = co.ac == AC_FULL ? "(p-1)(11L+2) x BTD*4/p" : "(p-1)(8L+2) x BTD*4/p";
    if (bf16) ring_formula = co.ac == AC_FULL ? "(p-1)((6L+1) x 2 + (5L+1) x 4) x BTD/p" : "(p-1)(4L+1)(2 + 4) x BTD/p";
    const char *gather_formula = co.async_tp ? (co.ac == AC_FULL ? "2 x BTD*4 (embedding, head)" : "(2 + 2L re-gathers) x BTD*4")
                                             : "(4L+2 + 2L+1 re-gathers) x BTD*4";
    if (bf16_gathers > 0)
        gather_formula = co.async_tp ? (co.ac == AC_FULL ? "BTD*2 (head) + BTD*4 (embedding)" : "(1 + 2L) x BTD*2 + BTD*4 (embedding)")
                                     : "(6L+2) x BTD*2 + BTD*4 (embedding's dy)";
    comm_expectation with_sp[] = {
        {tp, COLL_ALL_GATHER, gathers, (gathers - bf16_gathers) * X + bf16_gathers * X / 2, gather_formula},
        {tp, COLL_REDUCE_SCATTER, boundaries + recomputed - rs_ring, (boundaries + recomputed - rs_ring) * X,
         co.async_tp ? "1 x BTD*4 (embedding)" : co.ac == AC_FULL ? "(4L+2 + L recomputed) x BTD*4" : "(4L+2) x BTD*4"},
        {tp, COLL_ALL_REDUCE, 3 + norm_ar, 3 * N4 + norm_ar * (2 * L + 1) * D * 4,
         norm_ar ? "3 x BT*4 (loss) + (2L+1)D*4 (norms)" : "3 x BT*4 (loss)"},
        {tp, COLL_SEND, ring_msgs, ring_bytes, ring_formula},
        {tp, COLL_RECV, ring_msgs, ring_bytes, ring_formula}};
    comm_expectation without_sp[] = {
        {tp, COLL_ALL_REDUCE, boundaries + recomputed + 3, (boundaries + recomputed) * X + 3 * N4,
         co.ac == AC_FULL ? "(5L+2) x BTD*4 + 3 x BT*4" : "(4L+2) x BTD*4 + 3 x BT*4"}};
    int mismatches = co.sp ? report_communication(&tp, 1, o.steps, with_sp, co.async_tp ? 5 : 3)
                           : report_communication(&tp, 1, o.steps, without_sp, 1);
    mismatches += report_traffic_beside_chapter_01(&o, tp, co.sp, co.ac, boundaries, regathers, recomputed,
                                                   bf16_gathers + (bf16 ? ag_ring : 0));
    if (co.async_tp) mismatches += async_tp_report(&plan, o.out_dir, o.steps);

    /* ---- memory per rank ---- */
    log0("\n");
    double hd = d->hd, H = c->n_heads, Hkv = c->n_kv_heads, F = c->ffn_dim;
    memory_row params[] = {{"parameters", param_bytes,
                            4 * ((2 * L + 1) * D + 2 * d->Vl * D + L * (2 * H * hd * D + 2 * Hkv * hd * D + 3 * F * D) / p),
                            "4 (2 Vp D/t + (2L+1)D + L(2H hd D + 2Hkv hd D + 3FD)/t)"}};   /* Vp: 02's padding */
    mismatches += report_memory("memory per rank", params, 1);
    mismatches += vocab_padding_report(model);
    mismatches += report_activation_memory(&o, model, p, co.sp, co.ac, act_bytes);
    run_clock_report(&clock, o.steps);

    llama_free(model);
    plan_free(&plan);
    return run_finish(&o, mismatches);
}
