/* Chapter 05: pipeline parallelism, stages, microbatches and schedules.
 *
 * The layers are cut into stages on P ranks (pipeline.h); the batch into M microbatches that flow
 * through them; a schedule (schedule.h: GPipe, 1F1B, interleaved, ZB-H1) orders each rank's
 * forwards and backwards, and decides both the idle time (the bubble) and how many microbatches'
 * activations a rank holds. Rank 0 trains the single-device baseline beside it and compares every
 * step; the run ends with the activations held per rank and the messages beside their formulas,
 * and the bubble measured beside the theory.
 *
 *   make run-05                                               1F1B over 2 ranks, 4 microbatches
 *   make run-05 NP=4 ARGS="--schedule gpipe --microbatches 8"
 *   make run-05 NP=2 ARGS="--schedule interleaved --virtual-stages 2 --print-schedule"
 *   make run-05 NP=4 ARGS="--pp 2 --tp 2"                     PP x TP: each stage tensor-parallel
 *   make check-05                                             every schedule at pp 1, 2, 4; the bug
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
#include "pipeline.h"
#include "pp_report.h"
#include "schedule.h"

static const char *usage =
    "usage: 05 [flags]   (under mpirun: NP = pp x tp ranks)\n"
    "  --schedule gpipe|1f1b|interleaved|zb-h1   the order of each rank's actions (default 1f1b)\n"
    "  --microbatches M                          the batch is run as M pieces (default 4)\n"
    "  --pp P                                    pipeline stages (default: NP / tp)\n"
    "  --virtual-stages V                        interleaved: chunks per rank (default 2 there, else 1)\n"
    "  --tp T                                    tensor parallelism inside each stage (default 1)\n"
    "  --print-schedule                          print each rank's actions as a rank x time table\n"
    "  --p2p links|shared|lazy                   the messages' groups: one per neighbour and direction,\n"
    "                                            connected at start (default); the one pp group, which\n"
    "                                            deadlocks under NCCL's ordering; or links connected at\n"
    "                                            their first message, which deadlock under NCCL's lazy\n"
    "                                            connection (try both with COMM=nccl-sim)\n"
    "  (defaults of this chapter: --n-layers 8 --batch 8)\n";

enum { OPT_SCHEDULE = 1, OPT_MICRO, OPT_PP, OPT_VIRTUAL, OPT_TP, OPT_PRINT, OPT_P2P };
typedef struct { pp_options pp; int stages, tp; bool print, p2p_given; } chapter_options;
static void chapter_flag(int code, const char *arg, void *ctx) {
    static const char *const schedules[] = {"gpipe", "1f1b", "interleaved", "zb-h1", NULL};
    static const char *const p2p[] = {"links", "shared", "lazy", NULL};
    chapter_options *co = ctx;
    if (code == OPT_SCHEDULE) co->pp.schedule = (pp_schedule_kind)cli_choice("--schedule", arg, schedules);
    else if (code == OPT_MICRO) co->pp.microbatches = cli_int("--microbatches", arg, 1, 4096);
    else if (code == OPT_PP) co->stages = cli_int("--pp", arg, 1, 4096);
    else if (code == OPT_VIRTUAL) co->pp.virtual_stages = cli_int("--virtual-stages", arg, 1, 64);
    else if (code == OPT_TP) co->tp = cli_int("--tp", arg, 1, 4096);
    else if (code == OPT_P2P) { co->pp.p2p = (pp_p2p_kind)cli_choice("--p2p", arg, p2p); co->p2p_given = true; }
    else co->print = true;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* ---- flags ---- */
    run_options o = run_options_default("05", pipeline_faults);
    o.model.n_layers = 8;     /* enough layers for 4 stages of 2 chunks */
    o.batch = 8;              /* enough sequences for 8 microbatches */
    o.kv_heads_follow_heads = true;
    chapter_options co = {.pp = {.schedule = PP_1F1B, .microbatches = 4, .p2p = PP_P2P_LINKS}, .tp = 1};
    static const struct option flags[] = {
        {"schedule", required_argument, 0, OPT_SCHEDULE}, {"microbatches", required_argument, 0, OPT_MICRO},
        {"pp", required_argument, 0, OPT_PP}, {"virtual-stages", required_argument, 0, OPT_VIRTUAL},
        {"tp", required_argument, 0, OPT_TP}, {"print-schedule", no_argument, 0, OPT_PRINT},
        {"p2p", required_argument, 0, OPT_P2P}, {0, 0, 0, 0}};
    run_parse(&o, argc, argv, flags, chapter_flag, &co, usage);
    const llama_config *c = &o.model;
    if (!co.pp.virtual_stages) co.pp.virtual_stages = co.pp.schedule == PP_INTERLEAVED ? 2 : 1;

    /* ---- mesh: pp x tp (pp: the rest of NP when not given) ---- */
    mesh_requirements needs = {0};
    mesh_require(&needs, tp_mesh_rule(c));
    mesh_require(&needs, pipeline_layers_rule(c->n_layers, co.pp.virtual_stages, false));
    mesh_require(&needs, pipeline_microbatches_rule(o.batch, co.pp.microbatches, 0));
    device_mesh *mesh = mesh_create((mesh_shape){.pp = co.stages ? co.stages : MESH_REST, .tp = co.tp}, &needs);
    int P = mesh->shape.pp, T = mesh->shape.tp;
    if (P == 1 && co.p2p_given)   /* one stage sends nothing: the flag would change nothing */
        comm_exit_usage("--p2p %s: with one pipeline stage (pp 1) there are no messages between stages; "
                        "use --pp 2 or more", (const char *[]){"links", "shared", "lazy"}[co.pp.p2p]);
    pipeline_validate(P, &co.pp);

    /* ---- the plan: chapter 01's inside each stage (when tp > 1), the pipeline around it ---- */
    llama_plan plan = tensor_parallel_or_single(mesh, c);
    pipeline_apply(&plan, mesh, c, &co.pp);
    run_apply_fault(&o, &plan);
    llama_model *model = run_model(&o, &plan);   /* refuses up front what cannot fit */

    const pp_schedule *sched = pipeline_schedule(&plan);
    log0("chapter 05: pipeline parallelism, %s, pp %d x tp %d, %d microbatches, %d chunk%s per rank, backend %s\n",
         pp_schedule_name(sched->kind), P, T, sched->M, sched->V, sched->V > 1 ? "s" : "", device_backend_name());
    plan_describe(&plan);   /* which technique installed which operator; the groups */
    log0("model: dim %d, %d layers (%d per chunk), %d heads (%d kv), ffn %d, vocab %d; batch %d x %d tokens, "
         "microbatches of %d\n", c->dim, c->n_layers, c->n_layers / (P * sched->V), c->n_heads, c->n_kv_heads,
         c->ffn_dim, c->vocab_size, o.batch, c->seq_len, model->d.B);
    if (co.print && comm_world()->rank == 0) {   /* the lists, simulated at unit costs */
        pp_sim sim;
        char why[256];
        if (pp_simulate(sched, pp_unit_costs(sched->kind), &sim, why, sizeof why) == 0) {
            pp_schedule_print(sched, &sim, stdout);
            pp_sim_free(&sim);
        }
    }

    /* ---- train, with the baseline beside it ---- */
    char path[512], label[64];
    snprintf(path, sizeof path, "%s/loss_%s_p%d_m%d_v%d_t%d.csv", o.out_dir, pp_schedule_name(sched->kind), P,
             sched->M, sched->V, T);
    snprintf(label, sizeof label, "%s %dx%d", pp_schedule_name(sched->kind), P, T);
    run_clock clock = run_train(&o, model, NULL, label, path);

    /* ---- measured beside the formulas ---- */
    log0("\n");
    int mismatches = report_pipeline_memory(&plan);
    mismatches += report_pipeline_messages(&o, &plan, model);
    report_pipeline_bubble(&o, &plan);
    run_clock_report(&clock, o.steps);

    llama_free(model);
    plan_free(&plan);
    return run_finish(&o, mismatches);
}
