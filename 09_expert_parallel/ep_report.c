/* ep_report.c: chapter 09's measurements beside their formulas (ep_report.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "ep_report.h"
#include "../04_fsdp/data_parallel.h"   /* fsdp_gathers_bf16: FSDP's bf16 gathers (--fsdp --dtype bf16) */
#include "expert_parallel.h"
#include "moe.h"
#include "files.h"
#include "log.h"
#include "parity.h"
#include "report.h"

/* The layers this rank holds (every one, or a pipeline stage's: chapter 05), all of them or only
 * the mixtures of experts (every layer, or with --moe-every K every K-th: the formulas' L counts
 * those); the passes a step makes through them (1, or the pipeline's M microbatches). */
static int layers_here(const llama_model *m, bool moe_only) {
    int n = 0;
    for (int l = 0; l < m->c.n_layers; l++)
        if (!moe_only || llama_layer_has(&m->c, l, P_ROUTER))
            n += m->params->t[param_index(m->params, P_WQ, l)].here;   /* (the stage's layers hold every tensor) */
    return n;
}
/* The model's mixtures of experts, on every rank or not. */
static int moe_layers(const llama_config *c) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += llama_layer_has(c, l, P_ROUTER);
    return n;
}
static int passes(const llama_plan *p) { return p->schedule.microbatches > 1 ? p->schedule.microbatches : 1; }

/* The last step's copies per expert load[E] and dropped, summed over the layers, the microbatches
 * and every rank (each rank's tally of what it sent: expert_parallel.h): the data ranks, the cp
 * ranks (other rows of the same sequences) and the pipeline's stages hold different copies, while
 * the tp ranks of a data rank route the same ones alike, so the world's sum counts each copy tp
 * times. Returns their total. */
static double last_load(const llama_plan *p, const llama_model *m, double *load, double *dropped) {
    double tp = p->groups.tp ? p->groups.tp->size : 1, total = 0;
    expert_parallel_last_load(p, load, dropped);
    for (int e = 0; e < m->d.E; e++) total += load[e] = comm_host_sum(comm_world(), load[e]) / tp;
    *dropped = comm_host_sum(comm_world(), *dropped) / tp;
    return total;
}

int ep_report_load(const llama_plan *p, llama_model *m) {
    const llama_dims *d = &m->d;
    int E = d->E, L = moe_layers(&m->c);
    double *load = calloc((size_t)E, sizeof *load), dropped, most = 0;
    double total = last_load(p, m, load, &dropped);
    comm_group *batch = p->groups.batch;
    for (int e = 0; e < E; e++) most = fmax(most, load[e]);
    double cp = p->groups.cp ? p->groups.cp->size : 1;
    double tokens = (double)d->N * passes(p) * (batch ? batch->size : 1) * cp;   /* N: the step's, every rank's */
    double mean = total / E, want = tokens * d->k * L;
    log0("expert load, last step: tokens per expert over %d layers (balanced: N k L / E = %.0f each)\n", L, want / E);
    for (int e = 0; e < E; e++)
        log0("  expert %3d  %8.0f  %5.2fx%s\n", e, load[e], load[e] / mean, load[e] == most ? "  (most)" : "");
    if (d->capacity)
        log0("  dropped %.0f copies (%.2f%%): each expert took at most %d of a sequence's (ceil(c T k / E))\n", dropped,
             100 * dropped / want, d->capacity);
    log0("  total %.0f%s = N k L = %.0f x %d x %d; imbalance max / mean = %.3f\n", total + dropped,
         d->capacity ? " with the dropped" : "", tokens, d->k, L, most / mean);
    if (d->ep > 1) {   /* what each ep rank's experts computed: the busiest sets the pace of the exchange */
        double busiest = 0;
        log0("  per ep rank (its %d experts' copies, summed over the data ranks' replicas):", d->El);
        for (int q = 0; q < d->ep; q++) {
            double rows = 0;
            for (int e = q * d->El; e < (q + 1) * d->El; e++) rows += load[e];
            busiest = fmax(busiest, rows);
            log0(" %.0f", rows);
        }
        log0("; max / mean = %.3f: the others wait for the busiest at the combine\n", busiest / (total / d->ep));
    }
    int bad = total + dropped != want;
    if (bad) {
        char what[128];
        snprintf(what, sizeof what, "expert load: %.0f copies routed and %.0f dropped, N k L = %.0f", total, dropped, want);
        parity_fail(what);
    }
    free(load);
    return bad;
}

struct ep_load_log {
    const llama_plan *p;
    llama_model *m;
    FILE *csv;          /* world rank 0's; NULL elsewhere */
    double *load;
    double a2a_seconds; /* the ep group's all-to-all seconds so far (its counters are cumulative) */
};

ep_load_log *ep_load_log_open(const llama_plan *p, llama_model *m, const char *path) {
    ep_load_log *log = calloc(1, sizeof *log);
    log->p = p;
    log->m = m;
    log->load = calloc((size_t)m->d.E, sizeof *log->load);
    /* a column per expert, every one of them: 24 characters a column bound ",expert_4095" and ",%.0f" */
    char *header = malloc(24 * (size_t)m->d.E + 128), *h = header + sprintf(header, "step");
    for (int e = 0; e < m->d.E; e++) h += sprintf(h, ",expert_%d", e);
    strcpy(h, ",dropped,imbalance,all_to_all_ms,step_ms");
    log->csv = csv_open(path, header);
    free(header);
    return log;
}

void ep_load_log_step(ep_load_log *log, const run_step_result *r) {
    double dropped, total = last_load(log->p, log->m, log->load, &dropped), most = 0;
    int E = log->m->d.E;
    for (int e = 0; e < E; e++) most = fmax(most, log->load[e]);
    comm_group *ep = log->p->groups.ep;
    comm_settle();   /* (under NCCL a call's seconds are added once the device has run it) */
    double a2a = ep ? ep->stats[COLL_ALL_TO_ALL].seconds : 0, spent = a2a - log->a2a_seconds;
    log->a2a_seconds = a2a;
    if (!log->csv) return;
    char *row = malloc(24 * (size_t)E + 128), *x = row;
    x += sprintf(x, "%d", r->step);
    for (int e = 0; e < E; e++) x += sprintf(x, ",%.0f", log->load[e]);
    sprintf(x, ",%.0f,%.4f,%.3f,%.3f", dropped, total > 0 ? most / (total / E) : 0, 1e3 * spent, 1e3 * r->fb_seconds);
    csv_row(log->csv, "%s", row);
    free(row);
}

void ep_load_log_close(ep_load_log *log) {
    if (log->csv) csv_close(log->csv);
    free(log->load);
    free(log);
}

/* The elements of the experts' weights and of everything else, in the whole model and as this
 * rank holds them under the plan (the experts split over ep, the tp-split tensors over tp, and
 * over pp only its stage's tensors); n_dense: the dense tensors held. Under chapter 04's FSDP
 * (groups.shard: S ranks) dense_shards is this rank's shards of them, Psi_S: each tensor's
 * first dimension (a matrix's rows, a vector's elements) in S chunks of ceil(units / S); and
 * experts_shards this rank's shards of its experts, Psi_E: each expert tensor's E/ep experts' rows
 * in S_e = S / ep chunks over the ranks that hold the same experts (S_e = 1: held whole). */
typedef struct { double experts, dense, experts_held, dense_held, dense_shards, experts_shards; int n_dense; } param_split;
static param_split split_counts(const llama_model *m, const llama_plan *p) {
    param_split x = {0};
    const param_table *t = m->params;
    double ep = p->groups.ep ? p->groups.ep->size : 1, tp = p->groups.tp ? p->groups.tp->size : 1;
    long long S = p->groups.shard ? p->groups.shard->size : 1;
    for (int i = 0; i < t->n; i++) {
        param_spec s = t->t[i].spec;
        double n = (double)s.rows * s.cols, here = t->t[i].here;
        if (param_kind_is_expert(s.kind)) {
            long long rows = s.rows / (long long)ep, Se = p->groups.shard ? S / (long long)ep : 1;   /* (ep divides S) */
            x.experts += n, x.experts_held += here * n / ep;
            x.experts_shards += here * (double)((rows + Se - 1) / Se * s.cols);
            continue;
        }
        bool split = p->layout[s.kind] != SHARD_REPLICATED;
        x.dense += n, x.dense_held += here * n / (split ? tp : 1), x.n_dense += here;
        /* the tp slice [units, width]: rows split by SHARD_ROWS, columns by SHARD_COLS */
        long long rows = split && p->layout[s.kind] == SHARD_ROWS
                             ? param_split_rows(&m->c, s, SHARD_ROWS, (int)tp) / (long long)tp   /* (02's padding) */
                             : s.rows;
        long long cols = split && p->layout[s.kind] == SHARD_COLS ? s.cols / (long long)tp : s.cols;
        long long units = s.is_vector ? cols : rows, width = s.is_vector ? 1 : cols;
        x.dense_shards += here * (double)((units + S - 1) / S * width);
    }
    return x;
}

int ep_report_parameters(const llama_plan *p, llama_model *m, double param_bytes) {
    const llama_dims *d = &m->d;
    const llama_config *c = &m->c;
    double L = moe_layers(c), E = d->E, k = d->k, D = d->D, Fe = d->Fe;
    param_split x = split_counts(m, p);
    double experts = x.experts, dense = x.dense, active = llama_active_parameter_count(c);
    if (L < c->n_layers)   /* --moe-every: the formulas' L counts the mixtures */
        log0("(--moe-every %d: L = %.0f of the %d layers are mixtures of experts, the others Llama's dense feed-forward; "
             "L below counts the mixtures)\n", c->layer_every, L, c->n_layers);
    log0("parameters: %.0f in all, %.0f of them the experts' (3 L E D F_e = %.0f); active per token %.0f "
         "(outside the embedding; k of E experts: 6 x active = %.3g FLOPs a token, attention aside)\n",
         dense + experts, experts, 3 * L * E * D * Fe, active, 6 * active);
    double R = d->R, N = d->N, per_layer = 4 * (R * (D + 3 * Fe) + N * k * D);
    /* what a layer keeps of the dispatch, as the allocator counts it: the rows received (x) and
     * their expert's a, b, g, and the outputs back (y) */
    unsigned dispatch = 1u << ACT_MOE_X | 1u << ACT_MOE_A | 1u << ACT_MOE_B | 1u << ACT_MOE_G | 1u << ACT_MOE_Y;
    bool staged = layers_here(m, false) < c->n_layers, fsdp = p->groups.shard != NULL;
    int Se = fsdp ? p->groups.shard->size / (p->groups.ep ? p->groups.ep->size : 1) : 1;   /* the experts' shards */
    const char *held[3][2] = {{"4 (dense whole, or / tp where tp splits it + 3 L E D F_e / ep)",
                               "4 (this stage's: dense whole, or / tp where tp splits it + 3 (L/pp) E D F_e / ep)"},
                              {"4 (Psi_S, the dense tensors' shards over S + 3 L E D F_e / ep)",
                               "4 (this stage's: Psi_S, the dense shards over S + 3 (L/pp) E D F_e / ep)"},
                              {"4 (Psi_S + Psi_E: the dense shards over S, the experts' over S / ep; S_e Psi_E = 3 L E D F_e / ep)",
                               "4 (this stage's: Psi_S + Psi_E, the dense shards over S, the experts' over S / ep)"}};
    memory_row rows[] = {
        {"parameters", param_bytes, 4 * (fsdp ? x.dense_shards + x.experts_shards : x.dense_held + x.experts_held),
         held[fsdp + (Se > 1)][staged]},
        {"dispatch, one layer", (double)llama_layer_act_bytes_measured(d, dispatch), per_layer,
         d->capacity ? "4 (R (D + 3 F_e) + N k D), R = min(ep N min(k, E/ep), ep (E/ep) B C) rows at most"
                     : "4 (R (D + 3 F_e) + N k D), R = ep N min(k, E/ep) rows at most (dropless)"}};
    if (fsdp && Se == 1)   /* chapter 04's: every dense tensor in S shards; the experts stay whole (params.h's held_whole) */
        log0("  (FSDP: the dense tensors' %.0f elements%s in S = %d shards of ceil(rows / S) rows each: Psi_S = %.0f; "
             "the experts' %.0f whole, split over the same ranks already)\n", x.dense_held,
             p->groups.tp ? " of the tp slice" : "", p->groups.shard->size, x.dense_shards, x.experts_held);
    else if (fsdp)   /* the experts sharded too, over the ranks that hold the same ones (params.h's param_shard_dims_of) */
        log0("  (FSDP: the dense tensors' %.0f elements%s in S = %d shards of ceil(rows / S) rows each: Psi_S = %.0f; "
             "this rank's E/ep experts' %.0f in S / ep = %d shards over the ranks that hold them: Psi_E = %.0f)\n",
             x.dense_held, p->groups.tp ? " of the tp slice" : "", p->groups.shard->size, x.dense_shards, x.experts_held,
             Se, x.experts_shards);
    if (d->capacity)
        log0("  (R = %.0f: every rank's %.0f tokens may choose this rank's experts, each of which takes at most C = %d "
             "copies of each of a rank's B = %d sequences)\n", R, N, d->capacity, d->B);
    else
        log0("  (R = %.0f: every rank's %.0f tokens may choose this rank's experts; on one device R = N k)\n", R, N);
    return report_memory("memory per rank", rows, 2);
}

/* The ep group's all-to-alls of one step: each rank's calls, the bytes summed over the group, and
 * their formulas as text. */
static void alltoall_formulas(double L, double P, double N, double k, double D, double E, double *calls,
                              double *bytes, const char **calls_text, const char **bytes_text) {
    *calls = *bytes = 0;
    *calls_text = *bytes_text = "?";
    /* BEGIN ASSIGNMENT: the ep group's all-to-alls of one step (L layers of P ranks, N tokens a rank, k copies each, width D, E experts): the calls each rank makes and the bytes summed over the group, with their formulas as text */
    *calls = 5 * L, *calls_text = "5 L";
    *bytes = L * (P * E * 4 + 4 * P * N * k * D * 4), *bytes_text = "L (P E 4 + 4 P N k D 4)";
    /* END ASSIGNMENT */
}

double ep_alltoall_bytes(double L, double P, double N, double k, double D, double E) {
    double calls, bytes;
    const char *calls_text, *bytes_text;
    alltoall_formulas(L, P, N, k, D, E, &calls, &bytes, &calls_text, &bytes_text);
    return bytes;
}
const plan_moe_chapter ep_plan_moe_chapter = {moe_layer_for, ep_alltoall_bytes};

/* Whether chapter 04's FSDP shards over dp_replicate too (--full-shard): no HSDP replicas then. */
static bool shards_span_replicas(const llama_plan *p) {
    return p->groups.shard && (p->groups.shard_dims & MESH_BIT(MESH_DP_REPLICATE));
}

/* Chapter 04's FSDP collectives of one pass (a step, or a microbatch under a pipeline: piped) on
 * this rank, from the tensors it moves, by part (dp_units.h): [0] the dense tensors over the shard
 * group, [1] the experts over their own (ep < S; held whole: moved by none). A layer's unit is
 * gathered before its forward and its backward, and reduce-scattered after its backward, one
 * collective a part; without a pipeline prefetch keeps the ends and the last layer gathered from
 * forward to backward (one gather each); under chapter 05's pipeline every unit is gathered per
 * use, and a stage holding both the embedding and the head acquires the ends unit for each
 * (ends_twice). Under --dtype bf16 the gathers go tensor by tensor, the linears' at 2 bytes an
 * element (04's policy: fsdp_gathers_bf16). gathered_bytes is per shard rank (times S_q for the
 * bytes a gather moves); reduced: the units whose sums HSDP all-reduces (both parts in one). */
typedef struct {
    bool ends_twice, bf16;
    double gathers[2], gathered_bytes[2], scatters[2], scattered_floats[2], reduced, reduced_floats;
} fsdp_traffic;
static fsdp_traffic fsdp_traffic_of(const llama_model *m, bool piped) {
    const param_table *t = m->params;
    fsdp_traffic f = {.bf16 = m->c.precision == DTYPE_BF16};
    int L = m->c.n_layers;
    bool embedding = t->t[param_index(t, P_TOK_EMBEDDINGS, -1)].here, head = t->t[param_index(t, P_OUTPUT, -1)].here;
    f.ends_twice = piped && embedding && head;
    for (int u = 0; u <= L; u++) {
        int idx[PARAM_UNIT_MAX], k = param_unit_tensors(t, u, idx);
        double uses = u < L ? 1 : f.ends_twice ? 2 : 1;   /* acquisitions per forward (and per backward) */
        double gathers = 2 * uses - (!piped && (u == L || u == L - 1) ? 1 : 0), moved[2] = {0, 0};
        for (int j = 0; j < k; j++) {
            const param_tensor *x = &t->t[idx[j]];
            if (!param_sharded_here(x)) continue;   /* another stage's, or held whole */
            int q = param_shard_part(t, x);   /* the experts' own shard group: part 1 */
            double floats = (double)x->shard_units * x->width;
            bool half = f.bf16 && fsdp_gathers_bf16(x->spec.kind);
            f.gathered_bytes[q] += gathers * floats * (half ? 2 : 4);
            if (f.bf16) f.gathers[q] += gathers;   /* tensor by tensor */
            f.scattered_floats[q] += uses * floats;
            moved[q] += floats;
        }
        for (int q = 0; q < 2; q++) {
            if (moved[q] > 0 && !f.bf16) f.gathers[q] += gathers;   /* the part in one */
            if (moved[q] > 0) f.scatters[q] += uses;
        }
        if (moved[0] + moved[1] > 0) f.reduced += uses, f.reduced_floats += uses * (moved[0] + moved[1]);
    }
    return f;
}

int ep_report_traffic(const run_options *o, const llama_plan *p, llama_model *m, float8_recipe fp8) {
    comm_group *ep = p->groups.ep;
    /* the gradients: the dense tensors' summed over every data rank, the experts' over the ranks
     * that hold the same ones (dp_replicate), one all-reduce a tensor */
    /* under a pipeline (chapter 05) this rank runs its stage's L/pp layers, M times a step */
    double L = layers_here(m, true), all = layers_here(m, false), M = passes(p);   /* the mixtures, every layer */
    bool piped = p->schedule.forward_backward != NULL;   /* chapter 05's pipeline (one stage or more) */
    param_split x = split_counts(m, p);
    comm_group *dense = expert_parallel_dense_group(p), *replicate = p->groups.mesh->group[MESH_DP_REPLICATE];
    comm_group *tp = p->groups.tp, *cp = p->groups.cp;
    bool over_cp = expert_parallel_over_cp(p);   /* the ep group spans cp: so does the dense sum */
    comm_expectation expect[8];
    comm_group *groups[4];
    int n = 0, ng = 0;
    double hsdp_calls = 0, hsdp_floats = 0;   /* FSDP under HSDP: each unit's sums of both parts, over dp_replicate */
    double float8_linears = 0;                /* --fp8 over tp: the linears whose amaxes tp agrees (F8) */
    comm_group *shard = p->groups.shard, *experts_group = NULL;   /* chapter 04's FSDP, or NULL */
    for (int i = 0; shard && i < m->params->n && !experts_group; i++)   /* the group FSDP moves them over */
        if (param_kind_is_expert(m->params->t[i].spec.kind)) experts_group = data_parallel_group_of(p, m->params, &m->params->t[i]);
    /* their own group (ep < S), or none: held whole (ep = S), or moved with the dense tensors (ep 1) */
    comm_group *experts_shard = experts_group != shard ? experts_group : NULL;
    bool full_shard = shards_span_replicas(p);   /* then dp_replicate holds no replicas (no HSDP) */
    if (shard) {
        fsdp_traffic f = fsdp_traffic_of(m, piped);
        double S = shard->size;
        if (!full_shard) hsdp_calls = M * f.reduced, hsdp_floats = M * f.reduced_floats;
        /* (the shard group is the ep group, or as large: its all-to-alls are below, so it is not
         * among the groups whose every collective is predicted; the expert-parallel plan's own
         * dense group is, and must carry nothing: FSDP reduced the dense tensors) */
        groups[ng++] = dense;
        const char *gathered[2][3] = {{"(2 S Psi_S - ends - last layer) x 4", "M x 2 x S Psi_S x 4 (fwd + bwd)",
                                       "M x 2 x (S Psi_S + ends) x 4 (the ends twice)"},
                                      {"(2 S Psi_S - ends - last) x 4 - 2 x linears'", "M x (2 S Psi_S x 4 - 2 x linears')",
                                       "M x (2 (S Psi_S + ends) x 4 - 2 x linears')"}};
        const char *scattered[3] = {"S Psi_S x 4 (grads)", "M x S Psi_S x 4 (grads)", "M x (S Psi_S + ends) x 4"};
        int how = !piped ? 0 : f.ends_twice ? 2 : 1;
        if (S > 1) {
            expect[n++] = (comm_expectation){shard, COLL_ALL_GATHER, M * f.gathers[0], M * S * f.gathered_bytes[0],
                                             gathered[f.bf16][how]};
            expect[n++] = (comm_expectation){shard, COLL_REDUCE_SCATTER, M * f.scatters[0],
                                             M * S * 4 * f.scattered_floats[0], scattered[how]};
        }
        if (experts_shard) {   /* the experts' shards, over the S / ep ranks that hold the same experts */
            double Se = experts_shard->size;
            const char *gathered_e[2][2] = {{"(2 S_e Psi_E - last layer's) x 4", "M x 2 x S_e Psi_E x 4 (fwd + bwd)"},
                                            {"(2 S_e Psi_E - last layer's) x 2 (bf16)", "M x 2 x S_e Psi_E x 2 (bf16)"}};
            const char *scattered_e[2] = {"S_e Psi_E x 4 (grads)", "M x S_e Psi_E x 4 (grads)"};
            groups[ng++] = experts_shard;
            expect[n++] = (comm_expectation){experts_shard, COLL_ALL_GATHER, M * f.gathers[1],
                                             M * Se * f.gathered_bytes[1], gathered_e[f.bf16][piped]};
            expect[n++] = (comm_expectation){experts_shard, COLL_REDUCE_SCATTER, M * f.scatters[1],
                                             M * Se * 4 * f.scattered_floats[1], scattered_e[piped]};
        }
    } else if (dense->size > 1) {   /* the data ranks (and the cp ranks, when the ep group spans them) */
        groups[ng++] = dense;
        expect[n++] = (comm_expectation){dense, COLL_ALL_REDUCE, x.n_dense, 4 * x.dense_held,
                                         "every dense tensor's slice: 4 x its elements"};
    }
    if (replicate->size > 1 && full_shard) {   /* (every data rank shards: nothing may move over dp_replicate) */
        groups[ng++] = replicate;
    } else if (replicate->size > 1) {   /* the experts held whole (and under FSDP, HSDP's sum of each unit's shards) */
        const char *text[3][2] = {{"3 L experts' tensors: 4 x 3 L E D F_e / ep",
                                   "3 L/pp experts' tensors: 4 x 3 (L/pp) E D F_e / ep"},
                                  {"4 x (3 L E D F_e / ep + Psi_S): experts, HSDP",
                                   "4 x (3 (L/pp) E D F_e / ep + the RS's floats): experts, HSDP"},
                                  {"4 x (Psi_S + Psi_E): HSDP's sums of the shards",
                                   "4 x the RS's floats: HSDP's sums of the shards"}};
        double whole = experts_group ? 0 : 1;   /* the experts' all-reduces, 09's own when they are held whole */
        groups[ng++] = replicate;
        expect[n++] = (comm_expectation){replicate, COLL_ALL_REDUCE, whole * 3 * L + hsdp_calls,
                                         4 * (whole * x.experts_held + hsdp_floats),
                                         text[shard == NULL ? 0 : experts_group ? 2 : 1][piped]};
    }
    if (tp && tp->size > 1) {   /* chapter 01's f and g: attention's region in every layer, the shared
                                 * expert's in a mixture, the dense feed-forward's in the others */
        bool shared = m->c.moe.shared_expert, mixed = all > L;   /* (mixed: --moe-every) */
        double regions = all + (shared ? L : 0) + (all - L), N = m->d.N, D = m->d.D;
        groups[ng++] = tp;
        const char *text[2][2][2] = {{{"2 L x N D 4 (attention's f and g)", "4 L x N D 4 (attention, shared expert)"},
                                      {"2 (L/pp) M x N D 4 (attention's f and g)",
                                       "4 (L/pp) M x N D 4 (attention, shared expert)"}},
                                     {{"2 (L + 2 L_d) x N D 4 (attention; L_d dense FFNs)",
                                       "4 (L + L_d) x N D 4 (attention; shared expert or FFN)"},
                                      {"2 (L + 2 L_d) M x N D 4 (a stage's; L_d dense FFNs)",
                                       "4 (L + L_d) M x N D 4 (a stage's; shared expert or FFN)"}}};
        /* --fp8 (chapter 07): each float8 linear agrees two amaxes over tp a pass (its weight's and the
         * cut activation's): one float each, or rowwise the activation's N rows and the weight's D;
         * the float8 linears are attention's 4 and the shared expert's or Llama's feed-forward's 3 */
        double f8 = fp8 != FLOAT8_OFF ? 4 * all + 3 * ((shared ? L : 0) + (all - L)) : 0;
        double amax_floats = fp8 == FLOAT8_ROWWISE ? f8 * (N + D) : 2 * f8;
        static char with_amaxes[192];
        snprintf(with_amaxes, sizeof with_amaxes, "%s + %s", text[mixed][piped][shared],
                 fp8 == FLOAT8_ROWWISE ? (piped ? "F8 (N + D) M x 4 (07's amaxes)" : "F8 (N + D) x 4 (07's amaxes)")
                                       : (piped ? "2 F8 M x 4 (07's amaxes)" : "2 F8 x 4 (07's amaxes)"));
        expect[n++] = (comm_expectation){tp, COLL_ALL_REDUCE, 2 * regions * M + 2 * f8 * M,
                                         2 * regions * M * N * D * 4 + 4 * amax_floats * M,
                                         f8 > 0 ? with_amaxes : text[mixed][piped][shared]};
        float8_linears = f8;
    }
    if (cp && cp->size > 1) {   /* chapter 06's sum of the gradients (unless the sum over dp x cp above
                                 * made it), and the balancing loss's counts per sequence (moe.c); the
                                 * attention's own traffic is 06's (its README): so the cp group is
                                 * not in groups[], whose every collective must be predicted here */
        /* (under FSDP the shards span cp: its reduce-scatters sum over cp, and 06's skips itself) */
        double B = m->d.B, E = m->d.E, sums = over_cp || shard ? 0 : 1;
        const char *text[2][2] = {{"Psi x 4 (06's gradients) + 2 L x B E 4 (the sequences' counts)",
                                   "2 L x B E 4 (the sequences' counts)"},
                                  {"Psi x 4 (06's gradients) + 2 (L/pp) M x B E 4 (the sequences' counts)",
                                   "2 (L/pp) M x B E 4 (the sequences' counts)"}};
        expect[n++] = (comm_expectation){cp, COLL_ALL_REDUCE, sums + 2 * L * M,
                                         sums * 4.0 * (double)m->params->whole_numel + 2 * L * M * B * E * 4,
                                         text[piped][sums == 0]};
    }
    int bad = n ? report_communication(groups, ng, o->steps, expect, n) : 0;
    if (float8_linears > 0)
        log0("  (F8 = %.0f float8 linears on this rank: 4 a layer's attention, 3 its shared expert's or "
             "feed-forward's)\n", float8_linears);
    if (!ep || ep->size == 1) {
        log0("traffic: one ep rank, every expert here: no all-to-all\n");
        return bad;
    }
    const llama_dims *d = &m->d;
    const collective_stats *s = &ep->stats[COLL_ALL_TO_ALL];
    /* summed over the ep group: what one rank sends the others receive, so the loads, which vary
     * from rank to rank and step to step, cancel */
    double P = ep->size, steps = o->steps;
    double calls = comm_host_sum(ep, (double)s->calls) / P / steps;
    double bytes = comm_host_sum(ep, s->payload_bytes) / steps;
    double want_calls, want_bytes;
    const char *calls_formula, *bytes_formula;
    alltoall_formulas(L * M, P, d->N, d->k, d->D, d->E, &want_calls, &want_bytes, &calls_formula, &bytes_formula);
    /* under a capacity the dropped copies travel nowhere: the formula, every copy sent, is then a
     * bound (the rows exchanged are the kept ones, which the router decides step by step) */
    bool capped = d->capacity > 0;
    log0("traffic on the ep group (%d ranks), per step, summed over its ranks:\n", ep->size);
    if (piped)   /* (under --moe-every a stage's mixtures need not be L/pp) */
        log0("  (a pipeline stage's ep group: L = %s x M = %.0f x %.0f layer passes a step, N = %d a microbatch's "
             "tokens)\n", m->c.layer_every > 1 ? "the stage's mixtures" : "L/pp", L, M, d->N);
    log0("  all_to_all   calls %6.0f per rank  (formula %s = %.0f)\n", calls, calls_formula, want_calls);
    log0("  all_to_all   bytes %10.0f  (formula %s = %.0f%s)\n", bytes, bytes_formula, want_bytes,
         capped ? ", with nothing dropped: a bound" : "");
    comm_settle();   /* (under NCCL a call's seconds are added once the device has run it) */
    log0("  all_to_all   time  %8.1f ms per step on rank 0 (waiting for the others included)\n", 1e3 * s->seconds / steps);
    int wrong = (calls != want_calls) + (capped ? bytes > want_bytes : bytes != want_bytes);
    bad += wrong;
    if (wrong) {
        char what[160];
        snprintf(what, sizeof what, "ep traffic: %.0f calls and %.0f bytes a step, the formulas %.0f and %.0f", calls,
                 bytes, want_calls, want_bytes);
        parity_fail(what);
    }
    return bad;
}

int ep_report_plan(const run_options *o, const llama_plan *p, llama_model *m, const pp_options *pipe, double param_bytes) {
    const llama_config *c = &m->c;
    const device_mesh *mesh = p->groups.mesh;
    comm_group *ep = p->groups.ep;
    /* (its parameters are fp32 under either --dtype, and this trainer's all-to-alls move fp32 copies:
     * the calculator plans --plan-precision fp32, its default) */
    const char *why_not = p->groups.tp ? "tp > 1 (it plans 02's and 03's splits of the dense parts)"
                        : !p->groups.shard && ep && ep->size > 1 ? "the dense tensors replicated (it plans FSDP: --fsdp)"
                        : NULL;
    if (why_not) {
        log0("08's --plan calculator (09 --plan) is not compared on this run: %s\n", why_not);
        return 0;
    }
    /* the calculator's options: this model, batch and mesh (FSDP over dp_shard, x cp when cp > 1,
     * x dp_replicate under --full-shard) */
    plan_calc_options q;
    plan_calc_defaults(&q);
    q.dim = c->dim; q.n_layers = c->n_layers; q.n_heads = c->n_heads; q.n_kv_heads = c->n_kv_heads;
    q.ffn_dim = c->ffn_dim; q.vocab = c->vocab_size; q.seq_len = c->seq_len;
    q.experts = c->moe.experts; q.top_k = c->moe.top_k; q.expert_dim = c->moe.expert_dim;
    q.capacity_factor = c->moe.capacity_factor;
    q.shared_expert = c->moe.shared_expert; q.moe_every = c->layer_every > 1 ? c->layer_every : 1;
    q.moe_chapter = &ep_plan_moe_chapter;
    q.ep = ep ? ep->size : 1;
    q.shard_cp = p->groups.shard ? (p->groups.shard_dims & MESH_BIT(MESH_CP)) != 0 : expert_parallel_over_cp(p);
    q.global_batch = (long long)o->batch * c->seq_len;
    q.microbatch = m->d.B;   /* the sequences of one forward (a microbatch under a pipeline) */
    q.virtual_stages = pipe->virtual_stages > 0 ? pipe->virtual_stages : 1;
    q.ac = AC_NONE;          /* this chapter keeps every activation */
    q.schedule = pipe->schedule;
    q.gpus = comm_world()->size;
    int g[MESH_NDIMS];
    memcpy(g, mesh->shape.degree, sizeof g);
    if (shards_span_replicas(p))   /* --full-shard: one dp_shard */
        g[MESH_DP_SHARD] *= g[MESH_DP_REPLICATE], g[MESH_DP_REPLICATE] = 1;
    char why[512] = "", cmd[640];
    plan_calc_result r;
    /* the command that plans this run (its figures above the table) */
    char every[32] = "", pipeline[64] = "";
    char capacity[48] = "";
    if (q.moe_every > 1) snprintf(every, sizeof every, " --plan-moe-every %d", q.moe_every);
    if (q.capacity_factor > 0) snprintf(capacity, sizeof capacity, " --plan-capacity-factor %g", q.capacity_factor);
    if (g[MESH_PP] > 1)
        snprintf(pipeline, sizeof pipeline, " --plan-schedule %s --plan-virtual-stages %d", pp_schedule_name(q.schedule),
                 q.virtual_stages);
    snprintf(cmd, sizeof cmd, "09 --plan --plan-dim %d --plan-layers %d --plan-heads %d --plan-kv-heads %d --plan-ffn %d "
             "--plan-vocab %d --plan-seq-len %d --plan-global-batch %lld --plan-microbatch %d --plan-experts %d "
             "--plan-top-k %d --plan-expert-ffn %d%s%s%s --plan-gpus %d --plan-mesh %d,%d,%d,%d,%d --plan-ep %d%s%s --plan-ac none",
             q.dim, q.n_layers, q.n_heads, q.n_kv_heads, q.ffn_dim, q.vocab, q.seq_len, q.global_batch, q.microbatch,
             q.experts, q.top_k, q.expert_dim, q.shared_expert ? " --plan-shared-expert" : "", every, capacity, q.gpus, g[0], g[1],
             g[2], g[3], g[4], q.ep, q.shard_cp || g[MESH_CP] == 1 ? "" : " --plan-no-shard-cp", pipeline);
    if (plan_calc_mesh(&q, g, &r, why, sizeof why) != 0) {
        log0("08's --plan calculator (%s) refuses this mesh: %s\n", cmd, why);
        return 1;
    }
    int stage = mesh->coord[MESH_PP];
    double floats = plan_calc_stage_floats(&q, g, stage);
    /* the all-to-alls: what the wire model counts is the chunks that leave the rank, which the
     * router decides; the calculator assumes them even, (ep - 1) / ep of the copies (its busiest
     * stage's: every stage's when the stages hold as many mixtures) */
    double sent = ep ? ep->stats[COLL_ALL_TO_ALL].wire_bytes / o->steps : 0;
    memory_row rows[1] = {{"parameters", param_bytes, 4 * floats, "4 Psi_S of 08's calculator, this rank's stage"}};
    bool root = comm_world()->rank == 0;
    int bad = param_bytes != 4 * floats || (double)m->d.R != r.expert_rows;
    log0("08's --plan calculator on this mesh (%s):\n", cmd);
    if (root) report_memory("  per rank, beside the run's allocation", rows, 1);
    int ranks_bad = (int)comm_host_sum(comm_world(), bad);
    log0("  the rows a layer's dispatch may bring this rank's experts: R = %zu, the calculator's %.0f (its activations' "
         "R)\n", m->d.R, r.expert_rows);
    log0("  parameters and R on every rank: %s (%d of %d ranks differ from the calculator)\n", ranks_bad ? "MISMATCH" : "ok",
         ranks_bad, comm_world()->size);
    if (ranks_bad) parity_fail("a rank's parameters or dispatch rows differ from 08's --plan");
    if (ep && ep->size > 1 && r.ep_bytes > 0)
        log0("  all-to-all bytes sent per rank and step: measured %.0f (rank 0: the chunks that left it) | plan %.0f (its "
             "ep line: the copies routed evenly, (ep-1)/ep of them leave): %.3f x the plan, as the router sent them\n",
             sent, r.ep_bytes, sent / r.ep_bytes);
    return ranks_bad > 0;
}
