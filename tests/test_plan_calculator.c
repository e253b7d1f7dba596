/* ranks: 1 */
/* test_plan_calculator.c: chapter 08's --plan calculator (08_full_trainer/plan_calculator.h)
 * against what the code of the earlier chapters actually allocates, and against the published
 * figures.
 *
 *   - the Llama 3 sizes: 8.03, 70.6 and 405.9 billion parameters (the paper's), within 0.5%;
 *   - the pipeline's cut: every layer on exactly one stage, 126 layers on 16 stages as 7, 8 x 14, 7;
 *   - the state per GPU: for a small model on many meshes (tp, FSDP shards with padding, pipeline
 *     stages, dp_shard x cp or dp_shard alone), every rank of the mesh builds its param_table
 *     (common/model/params.h) in this process, with its coordinates and groups of its size,
 *     and the allocator's bytes of values, gradients and AdamW state equal the calculator's;
 *   - a layer's activations equal what the model allocates for them (llama_layer_act_bytes_measured
 *     with chapter 03's keep mask), in each checkpointing mode;
 *   - the bubble is chapter 05's published fraction at P = 4, M = 8 for each schedule, and the sets
 *     in flight its closed form;
 *   - tp, cp, pp and dp bytes equal the chapters' formulas, restated here from their READMEs;
 *   - a mesh the model or the batch cannot take is refused, with a line that names why;
 *   - on every mesh of up to 8 GPUs and a few models, the calculator admits a mesh exactly when
 *     chapter 08's trainer does (both ask mesh_check), except the pipeline cuts with one layer
 *     fewer at the ends, which only the calculator plans.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "mesh.h"
#include "model.h"
#include "params.h"
#include "test_util.h"
#include "../01_transformer_tp/tp.h"
#include "../02_loss_parallel/vocab_parallel.h"
#include "../03_sequence_parallel/sequence_parallel.h"
#include "../08_full_trainer/parallelize.h"
#include "../08_full_trainer/plan_calculator.h"

/* The small model of the mesh checks: ffn 132 over tp 2 is 66 rows, which 4 or 3 dp shards pad. */
static plan_calc_options small_model(void) {
    plan_calc_options o;
    plan_calc_defaults(&o);
    o.dim = 64; o.n_layers = 6; o.n_heads = 4; o.n_kv_heads = 2; o.ffn_dim = 132; o.vocab = 256;
    o.seq_len = 32;
    o.global_batch = 48 * 32;   /* 48 sequences: whole for dp 1, 2, 3, 4, 6 */
    return o;
}

static int product(const int g[MESH_NDIMS]) {
    int p = 1;
    for (int d = 0; d < MESH_NDIMS; d++) p *= g[d];
    return p;
}

/* Every rank of `mesh` builds its parameter table as chapter 08 would (01's and 02's layouts over
 * its tp group, FSDP shards over dp_shard x cp or dp_shard, its stage's tensors only), and the
 * allocator's bytes must be the calculator's. The tp group is a stand-in of the right size and
 * rank: param_table_create reads nothing else of it (the shards' from the mesh's coordinates). */
static void check_state(plan_calc_options *o, const int mesh[MESH_NDIMS]) {
    o->gpus = product(mesh);
    llama_config c = plan_calc_model(o);
    plan_calc_result r;
    char why[256] = "";
    int rc = plan_calc_mesh(o, mesh, &r, why, sizeof why);
    CHECK(rc == 0, "mesh %d,%d,%d,%d,%d refused: %s", mesh[0], mesh[1], mesh[2], mesh[3], mesh[4], why);
    if (rc) return;
    int P = mesh[MESH_PP], C = mesh[MESH_CP], S = mesh[MESH_DP_SHARD] * (o->shard_cp ? C : 1);
    CHECK(r.shard_ranks == S, "shard group %d, want %d", r.shard_ranks, S);
    shard_layout layout[P_NKINDS];
    megatron_layouts(layout);
    vocab_parallel_layouts(layout);
    const block_storage storage[PARAM_NBLOCKS] = {STORE_SHARD, STORE_SHARD, STORE_SHARD};
    int n = llama_num_params(&c);
    bool *here = calloc((size_t)n, sizeof *here), *holds = calloc((size_t)c.n_layers, sizeof *holds);
    mesh_shape shape;   /* (the calculator's meshes are int[MESH_NDIMS] in mesh.h's order) */
    memcpy(shape.degree, mesh, sizeof shape.degree);
    bool worst_seen = false;
    for (int w = 0; w < o->gpus; w++) {
        device_mesh m;
        memset(&m, 0, sizeof m);
        m.shape = shape;
        mesh_coords_of(&shape, w, m.coord);
        comm_group tp;
        memset(&tp, 0, sizeof tp);
        tp.size = mesh[MESH_TP];
        tp.rank = m.coord[MESH_TP];
        m.group[MESH_TP] = &tp;
        unsigned shard_dims = MESH_BIT(MESH_DP_SHARD) | (o->shard_cp ? MESH_BIT(MESH_CP) : 0);
        CHECK(mesh_size_over(&shape, shard_dims) == S &&
              mesh_rank_over(&shape, m.coord, shard_dims) ==
                  (o->shard_cp ? m.coord[MESH_DP_SHARD] * C + m.coord[MESH_CP] : m.coord[MESH_DP_SHARD]),
              "rank %d: shard group %d, place %d", w, mesh_size_over(&shape, shard_dims),
              mesh_rank_over(&shape, m.coord, shard_dims));
        int stage = m.coord[MESH_PP];
        CHECK(plan_calc_rank_layers(c.n_layers, P, 1, stage, holds) > 0, "stage %d of %d holds no layer", stage, P);
        for (int i = 0; i < n; i++) {
            param_spec s = llama_param_spec(&c, i);
            here[i] = s.layer >= 0 ? holds[s.layer] : s.kind == P_TOK_EMBEDDINGS ? stage == 0 : stage == P - 1;
        }
        size_t v0 = mem_current(MEM_PARAMS), g0 = mem_current(MEM_GRADS), a0 = mem_current(MEM_OPTIM);
        param_table *t = param_table_create(&c, &m, layout, storage, shard_dims, 0, here, 7);
        double values = (double)(mem_current(MEM_PARAMS) - v0), grads = (double)(mem_current(MEM_GRADS) - g0);
        double adam = (double)(mem_current(MEM_OPTIM) - a0);
        double want = 4 * plan_calc_stage_floats(o, mesh, stage);
        CHECK(values == want && grads == want && adam == 2 * want,
              "mesh %d,%d,%d,%d,%d%s rank %d (stage %d): allocated %.0f / %.0f / %.0f bytes, the calculator %.0f / %.0f "
              "/ %.0f", mesh[0], mesh[1], mesh[2], mesh[3], mesh[4], o->shard_cp ? "" : " (no shard over cp)", w,
              stage, values, grads, adam, want, want, 2 * want);
        if (stage == r.worst_stage) {
            worst_seen = true;
            CHECK(r.params_bytes == values && r.grads_bytes == grads && r.optim_bytes == adam,
                  "mesh %d,%d,%d,%d,%d: the report's %.0f / %.0f / %.0f, allocated %.0f / %.0f / %.0f", mesh[0], mesh[1],
                  mesh[2], mesh[3], mesh[4], r.params_bytes, r.grads_bytes, r.optim_bytes, values, grads, adam);
        }
        param_table_free(t);
    }
    CHECK(worst_seen, "worst stage %d is not a stage of pp %d", r.worst_stage, P);
    free(here);
    free(holds);
}

/* One layer's activations: the calculator's bytes against the model's allocation of them, with
 * the shapes of this GPU (B sequences, T / cp rows, split by tp) and 06's saved log-sum-exp. */
static void check_activations(plan_calc_options *o, const int mesh[MESH_NDIMS]) {
    o->gpus = product(mesh);
    llama_config c = plan_calc_model(o);
    int C = mesh[MESH_CP], t = mesh[MESH_TP];
    llama_dims d;
    memset(&d, 0, sizeof d);
    d.B = o->microbatch; d.T = c.seq_len / C; d.Ts = d.T / t; d.N = d.B * d.T; d.Ns = d.B * d.Ts;
    d.D = c.dim; d.hd = c.dim / c.n_heads; d.Hl = c.n_heads / t; d.Hkvl = c.n_kv_heads / t; d.Fl = c.ffn_dim / t;
    d.Vl = c.vocab_size / t;
    d.probs = (size_t)d.B * d.Hl * d.T;
    for (int ac = AC_NONE; ac < AC_NMODES; ac++) {
        o->ac = (ac_mode)ac;
        plan_calc_result r;
        char why[256] = "";
        CHECK(plan_calc_mesh(o, mesh, &r, why, sizeof why) == 0, "refused: %s", why);
        double measured = (double)llama_layer_act_bytes_measured(&d, ac_keep_mask(d.layer, (ac_mode)ac));
        CHECK(r.act_layer_bytes == measured, "mesh %d,%d,%d,%d,%d, ac %s: a layer's activations %.0f bytes, the "
              "model allocates %.0f", mesh[0], mesh[1], mesh[2], mesh[3], mesh[4], ac_mode_name((ac_mode)ac),
              r.act_layer_bytes, measured);
    }
    o->ac = AC_SELECTIVE;
}

/* Chapter 05's figures at P = 4, M = 8 (../shared/ALGORITHMS.md): bubble 3/11 for gpipe and 1f1b,
 * 3/19 interleaved with V = 2, 3/27 zb-h1; rank 0's sets in flight 8, 4, 11, 4. */
static void check_pipeline(void) {
    plan_calc_options o = small_model();
    o.n_layers = 8;
    o.gpus = 4;
    o.global_batch = 8 * 32;   /* 8 sequences, one dp rank: M = 8 */
    const int mesh[MESH_NDIMS] = {4, 1, 1, 1, 1};
    struct { pp_schedule_kind k; int V; long num, den; int rank0_sets, layers_per_set; } want[] = {
        {PP_GPIPE, 1, 3, 11, 8, 2}, {PP_1F1B, 1, 3, 11, 4, 2}, {PP_INTERLEAVED, 2, 3, 19, 11, 1},
        {PP_ZB_H1, 1, 3, 27, 4, 2}};
    for (int i = 0; i < 4; i++) {
        o.schedule = want[i].k;
        o.virtual_stages = want[i].V;
        plan_calc_result r;
        char why[256] = "";
        int rc = plan_calc_mesh(&o, mesh, &r, why, sizeof why);
        CHECK(rc == 0, "%s refused: %s", pp_schedule_name(want[i].k), why);
        if (rc) continue;
        CHECK_CLOSE(r.bubble, (double)want[i].num / want[i].den, 1e-15, 0, pp_schedule_name(want[i].k));
        CHECK(r.microbatches == 8, "%s: M = %d", pp_schedule_name(want[i].k), r.microbatches);
        if (r.worst_stage == 0) {
            CHECK(r.act_sets == want[i].rank0_sets && r.act_set_layers == want[i].layers_per_set,
                  "%s: %d sets of %d layers in flight on rank 0, want %d of %d", pp_schedule_name(want[i].k),
                  r.act_sets, r.act_set_layers, want[i].rank0_sets, want[i].layers_per_set);
            CHECK(r.act_bytes == (double)want[i].rank0_sets * want[i].layers_per_set * r.act_layer_bytes,
                  "%s: rank 0's activations %.0f bytes", pp_schedule_name(want[i].k), r.act_bytes);
        } else {   /* gpipe and zb-h1 hold as many sets on every rank, and the last adds the head's */
            bool uniform = want[i].k == PP_GPIPE || want[i].k == PP_ZB_H1;
            CHECK(uniform && r.worst_stage == 3 && r.act_sets == want[i].rank0_sets &&
                  r.act_bytes == r.act_sets * (want[i].layers_per_set * r.act_layer_bytes + r.act_head_bytes),
                  "%s: the fullest stage is %d (%d sets, %.0f bytes)", pp_schedule_name(want[i].k), r.worst_stage,
                  r.act_sets, r.act_bytes);
        }
    }
}

/* The traffic of each dimension against the chapters' formulas (ring model, bytes sent per GPU). */
static void check_traffic(void) {
    plan_calc_options o = small_model();
    llama_config c = plan_calc_model(&o);
    double B = 1, T = c.seq_len, D = c.dim, L = c.n_layers, hd = c.dim / c.n_heads;
    char why[256] = "";
    plan_calc_result r;

    /* tp 2 x dp_shard 2, no pipeline: 03's (4L+2) all-gather + reduce-scatter pairs and 2L+1
     * re-gathers of B T D x 4 per microbatch, the loss's 3 all-reduces of B T x 4, the norm
     * gradients' (2L+1) D x 4 once; 04's FSDP per microbatch: 2 gathers (1 of the ends and the last
     * layer) + 1 reduce-scatter of the padded S Psi_S x 4, each sending (S-1)/S of it. */
    const int fsdp_tp[MESH_NDIMS] = {1, 1, 2, 1, 2};
    o.gpus = 4;
    CHECK(plan_calc_mesh(&o, fsdp_tp, &r, why, sizeof why) == 0, "refused: %s", why);
    double M = 48 / 2, X = B * T * D * 4;
    double tp = M * ((2 * (4 * L + 2) + 2 * L + 1) * 0.5 * X + 3 * 2 * 0.5 * B * T * 4) + 2 * 0.5 * (2 * L + 1) * D * 4;
    CHECK_CLOSE(r.tp_bytes, tp, 0, 1e-12, "tp bytes, 03's formula");
    double S_psi_S = 2 * plan_calc_stage_floats(&o, fsdp_tp, 0);
    /* (the ends and the last layer are gathered once a microbatch, not twice: their floats are
     * the stage's of the same model with one layer) */
    plan_calc_options one = o;
    one.n_layers = 1;
    double S_kept = 2 * plan_calc_stage_floats(&one, fsdp_tp, 0);
    CHECK_CLOSE(r.dp_bytes, M * (3 * S_psi_S - S_kept) * 0.5 * 4, 0, 1e-12, "dp bytes, 04's FSDP formula");
    CHECK(r.cp_bytes == 0 && r.pp_bytes == 0, "no cp or pp traffic without cp or pp");
    /* --plan-reduce-dtype bf16 (08's --reduce-dtype bf16): the reduce-scatter moves 2 bytes an
     * element, the gathers as before (bf16 precision: the linears' weights and the rest in 2), and
     * FSDP's staging gains its bf16 twins, (S Psi_unit + Psi_unit) x 2 */
    plan_calc_result f32 = r, b16;
    o.precision = PLAN_BF16;
    CHECK(plan_calc_mesh(&o, fsdp_tp, &f32, why, sizeof why) == 0, "bf16 refused: %s", why);
    o.reduce = PLAN_BF16;
    CHECK(plan_calc_mesh(&o, fsdp_tp, &b16, why, sizeof why) == 0, "bf16 reduce refused: %s", why);
    CHECK_CLOSE(b16.dp_bytes, M * (3 * S_psi_S - S_kept) * 0.5 * 2, 0, 1e-12, "dp bytes, bf16 gathers and reduce-scatters");
    CHECK_CLOSE(f32.dp_bytes - b16.dp_bytes, M * S_psi_S * 0.5 * 2, 0, 1e-12, "the reduce-scatters' bytes halve");
    CHECK(b16.fsdp_buffer_bytes > f32.fsdp_buffer_bytes && b16.tp_bytes == f32.tp_bytes,
          "the bf16 twins of the staging (%.0f > %.0f bytes); tp unchanged", b16.fsdp_buffer_bytes, f32.fsdp_buffer_bytes);
    o.precision = PLAN_FP32;
    o.reduce = PLAN_FP32;

    /* cp 2 x tp 2: 06's ring, L (3C-2) blocks of 2 B Tl Hkv/tp hd x 4 per microbatch; with FSDP over
     * dp_shard only, the cp ranks' all-reduce of their gradients, 2 (C-1)/C x 4 Psi */
    const int cp_tp[MESH_NDIMS] = {1, 1, 1, 2, 2};
    o.gpus = 4;
    CHECK(plan_calc_mesh(&o, cp_tp, &r, why, sizeof why) == 0, "refused: %s", why);
    double Tl = T / 2, block = 2 * B * Tl * (c.n_kv_heads / 2) * hd * 4;
    CHECK_CLOSE(r.cp_bytes, 48 * L * (3 * 2 - 2) * block, 0, 1e-12, "cp bytes, 06's ring");
    o.shard_cp = false;
    CHECK(plan_calc_mesh(&o, cp_tp, &r, why, sizeof why) == 0, "refused: %s", why);
    double psi = plan_calc_stage_floats(&o, cp_tp, 0);
    CHECK_CLOSE(r.cp_bytes, 48 * L * 4 * block + 2 * 0.5 * 4 * psi, 0, 1e-12, "cp bytes with the gradient all-reduce");
    CHECK(r.dp_bytes == 0, "no dp traffic: dp 1 and FSDP not over cp (%.0f)", r.dp_bytes);
    o.shard_cp = true;

    /* pp 2 x tp 2: 05's 2 M (P V - 1) messages, each tp rank sending its T / tp rows of B x D x 4:
     * one per microbatch per stage at P = 2 */
    const int pp_tp[MESH_NDIMS] = {2, 1, 1, 1, 2};
    CHECK(plan_calc_mesh(&o, pp_tp, &r, why, sizeof why) == 0, "refused: %s", why);
    CHECK_CLOSE(r.pp_bytes, 48 * B * (T / 2) * D * 4, 0, 1e-12, "pp bytes, 05's messages");
    CHECK(r.across_nodes[MESH_PP] == false && r.across_nodes[MESH_TP] == false, "4 GPUs, one node of 8");
    o.gpus_per_node = 2;   /* now the pipeline's two stages are on two nodes; tp stays in each */
    CHECK(plan_calc_mesh(&o, pp_tp, &r, why, sizeof why) == 0, "refused: %s", why);
    CHECK(r.across_nodes[MESH_PP] && !r.across_nodes[MESH_TP], "pp across nodes, tp inside a node of 2");
    CHECK_CLOSE(r.pp_s, r.pp_bytes / (o.inter_gbs * 1e9), 0, 1e-12, "pp time at the network's bandwidth");
    CHECK_CLOSE(r.tp_s, r.tp_bytes / (o.intra_gbs * 1e9), 0, 1e-12, "tp time at NVLink's bandwidth");
}

/* Meshes a model or a batch cannot take: -1, and one line that says why. */
static void check_refusals(void) {
    plan_calc_options o = small_model();
    struct { int gpus, mesh[MESH_NDIMS]; const char *says; } bad[] = {
        {4, {1, 1, 2, 1, 1}, "not the 4"},            /* 2 GPUs of the 4                       */
        {4, {1, 1, 1, 1, 4}, "n_kv_heads 2"},         /* tp 4 over 2 kv heads (01)             */
        {5, {5, 1, 1, 1, 1}, "layers"},               /* 6 layers: neither 6 nor 8 over 5      */
        {7, {7, 1, 1, 1, 1}, "layers"},
        {32, {1, 1, 1, 32, 1}, "2 chunks"},           /* 32 tokens in 64 chunks (06)           */
        {5, {1, 1, 5, 1, 1}, "global batch"},         /* 48 sequences over 5 dp ranks          */
        {8, {1, 1, 1, 1, 8}, "heads"},                /* 4 heads over tp 8                     */
        {6, {1, 1, -1, 4, 1}, "would not be whole"},  /* dp_shard -1: 6 / 4                    */
        {4, {1, 1, -2, 4, 1}, ">= 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o.gpus = bad[i].gpus;
        plan_calc_result r;
        char why[256] = "";
        int rc = plan_calc_mesh(&o, bad[i].mesh, &r, why, sizeof why);
        CHECK(rc == -1 && strstr(why, bad[i].says) && !strchr(why, '\n'), "mesh %d,%d,%d,%d,%d on %d GPUs: rc %d, "
              "\"%s\" (want a line with \"%s\")", bad[i].mesh[0], bad[i].mesh[1], bad[i].mesh[2], bad[i].mesh[3],
              bad[i].mesh[4], bad[i].gpus, rc, why, bad[i].says);
    }
    /* the interleaved schedule's groups of P (05): M = 48 / 2 = 24 is no multiple of pp 3 x ... */
    o.gpus = 6;
    o.schedule = PP_INTERLEAVED;
    o.virtual_stages = 2;
    o.n_layers = 12;
    o.global_batch = 4 * 32;   /* 4 sequences on dp 2: M = 2 < P = 3 */
    const int interleaved[MESH_NDIMS] = {3, 1, 2, 1, 1};
    plan_calc_result r;
    char why[256] = "";
    CHECK(plan_calc_mesh(&o, interleaved, &r, why, sizeof why) == -1 && strstr(why, "interleaved"),
          "interleaved with M = 2, P = 3 admitted: \"%s\"", why);
    /* dp_shard -1 takes the rest: the same figures as the explicit degree */
    o = small_model();
    o.gpus = 8;
    const int inferred[MESH_NDIMS] = {2, 1, -1, 1, 2}, explicit_[MESH_NDIMS] = {2, 1, 2, 1, 2};
    plan_calc_result a, b;
    CHECK(plan_calc_mesh(&o, inferred, &a, why, sizeof why) == 0 && plan_calc_mesh(&o, explicit_, &b, why, sizeof why) == 0
          && a.total_bytes == b.total_bytes && a.dp_bytes == b.dp_bytes &&
          plan_calc_stage_floats(&o, inferred, 1) == plan_calc_stage_floats(&o, explicit_, 1),
          "dp_shard -1 differs from dp_shard 2");
}

/* The trainer's verdict (parallelize_validate's mesh_check, with its options' requirements) and
 * the calculator's (plan_calc_mesh) on every mesh of 1 to 8 GPUs, for models and batches that
 * each rule refuses somewhere. Microbatches of one sequence on both sides (the trainer's M is
 * then the calculator's), gpipe (which admits every M). */
static void check_trainer_agrees(void) {
    struct { int dim, n_layers, n_heads, n_kv_heads, ffn, vocab, seq, seqs; } models[] = {
        {64, 6, 4, 2, 132, 256, 32, 48},   /* 6 layers: 3 stages even, 4 only with short ends */
        {96, 4, 6, 3, 96, 250, 24, 12},    /* tp 3 and 6; vocab 250 over tp 2 but not 4 */
        {64, 5, 8, 8, 100, 255, 36, 18},   /* odd vocabulary: tp 1 only */
        {128, 8, 8, 4, 128, 256, 16, 8},   /* short sequence: cp 8 refused (16 rows in 16 chunks) */
    };
    int agreed = 0, admitted = 0, short_ends = 0;
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        plan_calc_options o;
        plan_calc_defaults(&o);
        o.dim = models[k].dim; o.n_layers = models[k].n_layers; o.n_heads = models[k].n_heads;
        o.n_kv_heads = models[k].n_kv_heads; o.ffn_dim = models[k].ffn; o.vocab = models[k].vocab;
        o.seq_len = models[k].seq; o.global_batch = (long long)models[k].seqs * models[k].seq;
        o.microbatch = 1;
        o.schedule = PP_GPIPE;
        llama_config c = plan_calc_model(&o);
        for (int gpus = 1; gpus <= 8; gpus++) {
            o.gpus = gpus;
            for (int g0 = 1; g0 <= gpus; g0++) for (int g1 = 1; g1 <= gpus; g1++) for (int g2 = 1; g2 <= gpus; g2++)
            for (int g3 = 1; g3 <= gpus; g3++) for (int g4 = 1; g4 <= gpus; g4++) {
                const int mesh[MESH_NDIMS] = {g0, g1, g2, g3, g4};
                if (product(mesh) != gpus) continue;
                parallel_options par = {.sp = true};
                memcpy(par.degree, mesh, sizeof par.degree);
                par.cp.method = CP_RING;
                /* one sequence a microbatch under a pipeline (the trainer's M is pp's without one) */
                par.pp.microbatches = g0 > 1 && models[k].seqs % (g1 * g2) == 0 ? models[k].seqs / (g1 * g2) : 1;
                par.pp.virtual_stages = 1;
                mesh_requirements needs = parallel_mesh_requirements(&par, &c, models[k].seqs);
                mesh_shape shape;
                memcpy(shape.degree, mesh, sizeof shape.degree);
                char trainer_why[512] = "", calc_why[512] = "";
                bool trainer = mesh_check(&shape, gpus, &needs, trainer_why, sizeof trainer_why) == NULL;
                plan_calc_result r;
                bool calc = plan_calc_mesh(&o, mesh, &r, calc_why, sizeof calc_why) == 0;
                /* the one planned difference: layers cut unevenly, the ends one fewer */
                bool uneven = calc && !trainer && r.layers_min < r.layers_max && strstr(trainer_why, "split evenly");
                short_ends += uneven;
                CHECK(calc == trainer || uneven, "model %zu, mesh %d,%d,%d,%d,%d: the trainer %s (%s), the calculator "
                      "%s (%s)", k, g0, g1, g2, g3, g4, trainer ? "admits" : "refuses", trainer_why,
                      calc ? "admits" : "refuses", calc_why);
                agreed += calc == trainer;
                admitted += trainer;
            }
        }
    }
    CHECK(admitted > 20 && agreed - admitted > 20 && short_ends > 0, "the table is too small to tell: %d agreed, %d "
          "admitted, %d uneven pipelines", agreed, admitted, short_ends);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* the Llama 3 sizes: the paper's parameter counts */
    const double published[3] = {8.03e9, 70.6e9, 405.9e9};
    for (int p = 0; p < 3; p++) {
        plan_calc_options o;
        plan_calc_defaults(&o);
        o.preset = p;
        llama_config c = plan_calc_model(&o);
        CHECK_CLOSE(llama_parameter_count(&c, true), published[p], 0, 5e-3, "Llama 3 parameters");
        CHECK(c.vocab_size == 128256 && c.dim / c.n_heads == 128 && c.n_kv_heads == 8, "preset %d: vocab %d, head dim %d",
              p, c.vocab_size, c.dim / c.n_heads);
    }

    /* the pipeline's cut: 126 layers on 16 stages (the paper's 405B) */
    bool holds[126];
    int counted[126] = {0}, sum = 0;
    for (int s = 0; s < 16; s++) {
        int k = plan_calc_rank_layers(126, 16, 1, s, holds);
        CHECK(k == (s == 0 || s == 15 ? 7 : 8), "stage %d of 16 holds %d of 126 layers", s, k);
        for (int l = 0; l < 126; l++) counted[l] += holds[l];
        sum += k;
    }
    for (int l = 0; l < 126; l++) CHECK(counted[l] == 1, "layer %d is on %d stages", l, counted[l]);
    CHECK(sum == 126, "the stages hold %d layers", sum);
    CHECK(plan_calc_rank_layers(32, 4, 1, 2, NULL) == 8 && plan_calc_rank_layers(32, 4, 2, 0, NULL) == 8 &&
          plan_calc_rank_layers(126, 5, 1, 0, NULL) == -1 && plan_calc_rank_layers(10, 3, 1, 1, NULL) == 4,
          "even cuts, chunks of 4 on 2 virtual stages, refusals");

    /* the state per GPU against param_table_create, on meshes of every kind */
    const int meshes[][MESH_NDIMS] = {
        {1, 1, 1, 1, 1}, {1, 1, 4, 1, 1}, {1, 1, 4, 1, 2}, {2, 1, 2, 1, 2}, {4, 1, 1, 1, 1}, {3, 2, 1, 2, 1},
        {2, 2, 2, 2, 1}, {1, 1, 3, 2, 2}, {4, 1, 3, 1, 2}, {1, 2, 1, 2, 2},
    };
    for (size_t i = 0; i < sizeof meshes / sizeof meshes[0]; i++) {
        for (int shard_cp = 1; shard_cp >= 0; shard_cp--) {
            plan_calc_options o = small_model();
            o.shard_cp = shard_cp;
            check_state(&o, meshes[i]);
        }
        plan_calc_options o = small_model();
        check_activations(&o, meshes[i]);
    }
    plan_calc_options mb2 = small_model();
    mb2.microbatch = 2;
    check_activations(&mb2, meshes[7]);

    check_pipeline();
    check_traffic();
    check_refusals();
    check_trainer_agrees();

    /* the whole report on a small cluster: it prints and returns 0 */
    plan_calc_options o = small_model();
    o.gpus = 16;
    o.gpus_per_node = 4;
    o.top = 3;
    CHECK(plan_calculator_run(&o) == 0, "the report failed");

    int rc = tu_finish("test_plan_calculator");
    comm_finalize();
    return rc;
}
