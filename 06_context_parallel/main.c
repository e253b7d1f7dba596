/* Chapter 06: context parallelism, attention over a sequence split across ranks.
 *
 * Every sequence is cut over C ranks for the whole model (context_parallel.h); all layers but
 * attention run on the rank's own rows with no communication, and attention brings the keys and
 * values to the queries: around a ring, block by block, merged by log-sum-exp, or all-gathered
 * at once. Rank 0 trains the single-device baseline beside it and compares every step; the run
 * ends with each rank's attention work (contiguous vs zigzag balance) and the traffic beside
 * their formulas.
 *
 *   make run-06                                             ring, zigzag, over 2 ranks
 *   make run-06 NP=4 ARGS="--cp-balance contiguous"         the unbalanced split, for comparison
 *   make run-06 NP=4 ARGS="--cp-method allgather"
 *   make run-06 NP=4 ARGS="--cp-method alltoall"            Ulysses: heads dealt out, whole sequences
 *   make run-06 NP=4 ARGS="--cp 2 --tp 2"                   CP x TP: heads by tp, rows by cp
 *   make check-06                                           the methods and balances at cp 1, 2, 4; the bug
 */
#include <stdio.h>
#include "cli.h"
#include "comm.h"
#include "device.h"
#include "log.h"
#include "mesh.h"
#include "model.h"
#include "run.h"
#include "../01_transformer_tp/tp.h"
#include "context_parallel.h"
#include "cp_report.h"

static const char *usage =
    "usage: 06 [flags]   (under mpirun: NP = cp x tp ranks)\n"
    "  --cp-method ring|allgather|alltoall  how the keys and values reach the queries (default ring)\n"
    "  --cp-balance contiguous|zigzag       which rows each rank holds (default zigzag)\n"
    "  --cp C                               ranks each sequence is split over (default: NP / tp)\n"
    "  --tp T                               tensor parallelism inside each cp rank (default 1)\n"
    "  --ring-timeline                      write each rank's ring steps (compute, wait) of the last\n"
    "                                       forward to OUT/ring_timeline.csv\n"
    "  (defaults of this chapter: --seq-len 64)\n";

enum { OPT_METHOD = 1, OPT_BALANCE, OPT_CP, OPT_TP, OPT_TIMELINE };
typedef struct { cp_options cp; int C, tp; bool timeline; } chapter_options;
static void chapter_flag(int code, const char *arg, void *ctx) {
    static const char *const methods[] = {"ring", "allgather", "alltoall", NULL};
    static const char *const balances[] = {"contiguous", "zigzag", NULL};
    chapter_options *co = ctx;
    if (code == OPT_METHOD) co->cp.method = (cp_method)cli_choice("--cp-method", arg, methods);
    else if (code == OPT_BALANCE) co->cp.balance = (cp_balance)cli_choice("--cp-balance", arg, balances);
    else if (code == OPT_CP) co->C = cli_int("--cp", arg, 1, 4096);
    else if (code == OPT_TP) co->tp = cli_int("--tp", arg, 1, 4096);
    else co->timeline = true;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* ---- flags ---- */
    run_options o = run_options_default("06", context_parallel_faults);
    o.model.seq_len = 64;     /* 2C chunks of at least 8 rows at cp 4 */
    o.kv_heads_follow_heads = true;
    chapter_options co = {.cp = {.method = CP_RING, .balance = CP_ZIGZAG}, .C = 0, .tp = 1, .timeline = false};
    static const struct option flags[] = {
        {"cp-method", required_argument, 0, OPT_METHOD}, {"cp-balance", required_argument, 0, OPT_BALANCE},
        {"cp", required_argument, 0, OPT_CP}, {"tp", required_argument, 0, OPT_TP},
        {"ring-timeline", no_argument, 0, OPT_TIMELINE}, {0, 0, 0, 0}};
    run_parse(&o, argc, argv, flags, chapter_flag, &co, usage);
    const llama_config *c = &o.model;

    /* ---- mesh: cp x tp (cp: the rest of NP when not given) ---- */
    mesh_requirements needs = {0};
    mesh_require(&needs, tp_mesh_rule(c));
    mesh_require(&needs, cp_sequence_rule(c->seq_len, false));
    if (co.cp.method == CP_ALLTOALL) mesh_require(&needs, cp_heads_rule(c));
    device_mesh *mesh = mesh_create((mesh_shape){.cp = co.C ? co.C : MESH_REST, .tp = co.tp}, &needs);
    int C = mesh->shape.cp, T = mesh->shape.tp;
    context_parallel_validate(C);
    if (co.timeline && co.cp.method != CP_RING)
        comm_exit_usage("--ring-timeline records the ring's steps: it needs --cp-method ring, not %s",
                        cp_method_name(co.cp.method));

    /* ---- the plan: chapter 01's inside each cp rank (when tp > 1), context parallelism around it ---- */
    llama_plan plan = tensor_parallel_or_single(mesh, c);
    context_parallel_apply(&plan, mesh, c, &co.cp);
    context_parallel_record_timeline(&plan, co.timeline);
    run_apply_fault(&o, &plan);
    llama_model *model = run_model(&o, &plan);   /* refuses up front what cannot fit */

    log0("chapter 06: context parallelism, %s, %s, cp %d x tp %d, backend %s\n", cp_method_name(co.cp.method),
         cp_balance_name(co.cp.balance), C, T, device_backend_name());
    plan_describe(&plan);   /* which technique installed which operator; the groups */
    log0("model: dim %d, %d layers, %d heads (%d kv), ffn %d, vocab %d; batch %d x %d tokens, %d rows of each "
         "sequence per rank\n", c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab_size,
         o.batch, c->seq_len, model->d.T);

    /* ---- train, with the baseline beside it ---- */
    char path[512], label[64];
    snprintf(path, sizeof path, "%s/loss_%s_%s_c%d_t%d.csv", o.out_dir, cp_method_name(co.cp.method),
             cp_balance_name(co.cp.balance), C, T);
    snprintf(label, sizeof label, "%s %s %dx%d", cp_method_name(co.cp.method), cp_balance_name(co.cp.balance), C, T);
    /* (under --dtype bf16 the baseline computes attention in the ranks' blocks: context_parallel.h) */
    llama_plan baseline = plan_single_device();
    context_parallel_baseline(&baseline, run_baseline_precision(&o), &co.cp, C);
    run_clock clock = run_train(&o, model, &baseline, label, path);
    plan_free(&baseline);

    /* ---- measured beside the formulas ---- */
    log0("\n");
    int mismatches = cp_report_attention_work(&plan, &co.cp, c->seq_len);
    mismatches += cp_report_attention_memory(&plan, model, &co.cp);
    mismatches += cp_report_traffic(&o, &plan, model, &co.cp);
    if (co.timeline) {
        snprintf(path, sizeof path, "%s/ring_timeline.csv", o.out_dir);
        cp_write_ring_timeline(&plan, path);
    }
    run_clock_report(&clock, o.steps);

    llama_free(model);
    plan_free(&plan);
    return run_finish(&o, mismatches);
}
