/* ranks: 1 */
/* test_moe_plan.c: chapter 08's --plan calculator with chapter 09's layer (09 --plan), against
 * the published sizes and the code that allocates, independently of the calculator's own sums.
 *
 *   - Mixtral 8x7B: 46.7 B parameters and 12.9 B active a token (Jiang et al. 2024), within 0.5%;
 *     the DeepSeek-V3-like preset's count against its sizes summed here by hand;
 *   - conservation: the experts split over ep and sharded over S / ep, every GPU of the shard group
 *     summed, hold each parameter once (no padding at these sizes), for every ep dividing S and E,
 *     with the mixture on every layer, every 2nd and every 3rd;
 *   - a mixture's activations (ep's dispatch buffers among them) equal what the model allocates
 *     for them (llama_layer_act_bytes_measured with 09's layer and the rank's dims), dropless and
 *     under a capacity;
 *   - the ep traffic: chapter 09's all-to-all formula (its exercise 4, judged by its runs) for the
 *     stage's mixtures and microbatches, a rank's share, (ep - 1) / ep of it sent; with bf16
 *     activations the rows at 2 bytes an element, the counts at 4;
 *   - FSDP's buffers: the experts held whole (ep = S) take none, gathered (ep < S) they do;
 *   - each tensor's shard group (params.h's param_shard_dims_of): an expert's the shard group less
 *     the dimensions ep spans (cp under --fsdp --cp 2, dp_replicate under --full-shard), none at
 *     ep = S (held whole), the dense tensors' at ep 1;
 *   - ZeRO-1 (--plan-dp zero1): whole values and gradients, the AdamW state sharded, one
 *     reduce-scatter and one all-gather a step whatever the microbatches, dense and with experts;
 *   - refusals: an ep that divides neither the shard group nor E, float8 with experts, full
 *     checkpointing of a mixture, a mixture without its layer (what 08's own binary has), ep on a
 *     dense model.
 * The calculator's state per GPU against the trainer's allocation on the meshes both run is judged
 * by chapter 09's runs themselves (ep_report_plan, every rank, in make check-09's FSDP layouts).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "model.h"
#include "test_util.h"
#include "../08_full_trainer/plan_calculator.h"
#include "../09_expert_parallel/ep_report.h"
#include "../09_expert_parallel/moe.h"

/* A small mixture: 8 experts of 48, top-2, a shared expert, every layer. */
static plan_calc_options small_moe(void) {
    plan_calc_options o;
    plan_calc_defaults(&o);
    o.dim = 64; o.n_layers = 4; o.n_heads = 4; o.n_kv_heads = 2; o.ffn_dim = 96; o.vocab = 256;
    o.seq_len = 32;
    o.global_batch = 16 * 32;
    o.experts = 8; o.top_k = 2; o.expert_dim = 48; o.shared_expert = true;
    o.moe_chapter = &ep_plan_moe_chapter;
    return o;
}

/* Every GPU of the shard group summed: each parameter held once (the mixture on every `every`-th
 * layer, Llama's between). */
static void check_conservation(int S, int ep, int every) {
    plan_calc_options o = small_moe();
    o.gpus = S;
    o.ep = ep;
    o.moe_every = every;
    const int mesh[MESH_NDIMS] = {1, 1, S, 1, 1};
    llama_config c = plan_calc_model(&o);
    plan_calc_result r;
    char why[256] = "";
    CHECK(plan_calc_mesh(&o, mesh, &r, why, sizeof why) == 0, "S %d, ep %d refused: %s", S, ep, why);
    double each = plan_calc_stage_floats(&o, mesh, 0);
    CHECK(S * each == llama_parameter_count(&c, true), "S %d, ep %d, the mixture every %d layers: %.0f floats a GPU, "
          "%.0f in the model", S, ep, every, each, llama_parameter_count(&c, true));
}

/* A mixture's activations: the calculator's against the model's allocation of them. */
static void check_activations(int ep, int C, double capacity) {
    plan_calc_options o = small_moe();
    o.ac = AC_NONE;
    o.capacity_factor = capacity;
    o.gpus = 4 * C;
    o.ep = ep;
    const int mesh[MESH_NDIMS] = {1, 1, 4, C, 1};
    llama_config c = plan_calc_model(&o);
    plan_calc_result r;
    char why[256] = "";
    CHECK(plan_calc_mesh(&o, mesh, &r, why, sizeof why) == 0, "ep %d, cp %d refused: %s", ep, C, why);
    llama_dims d;
    memset(&d, 0, sizeof d);
    d.B = 1; d.T = c.seq_len / C; d.Ts = d.T; d.N = d.T; d.Ns = d.T;
    d.D = c.dim; d.hd = c.dim / c.n_heads; d.Hl = c.n_heads; d.Hkvl = c.n_kv_heads; d.Fl = c.ffn_dim; d.Vl = c.vocab_size;
    d.probs = (size_t)d.B * d.Hl * d.T;   /* 06's log-sum-exp, as the calculator plans the attention */
    d.layer = moe_layer_for(&c);
    d.E = 8; d.k = 2; d.Fe = 48; d.ep = ep; d.El = 8 / ep;
    d.capacity = capacity > 0 ? moe_capacity(&c.moe, c.seq_len) : 0;
    double measured = (double)llama_layer_act_bytes_measured(&d, ac_keep_mask(d.layer, AC_NONE));
    CHECK(r.act_layer_bytes == measured, "ep %d, cp %d, capacity %g: a mixture's activations %.0f bytes, the model "
          "allocates %.0f", ep, C, capacity, r.act_layer_bytes, measured);
    /* dropless: every rank's tokens may choose this rank's experts, min(k, E/ep) copies each */
    double R = capacity > 0 ? r.expert_rows : ep == 1 ? d.N * 2.0 : (double)ep * d.N * (2 < 8 / ep ? 2 : 8 / ep);
    CHECK(r.expert_rows == R, "ep %d: R = %.0f, want %.0f", ep, r.expert_rows, R);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* Mixtral 8x7B (Jiang et al. 2024): 46.7 B parameters, 12.9 B active a token (the embedding's
     * row included: llama_active_parameter_count leaves the lookup out) */
    plan_calc_options mx;
    plan_calc_defaults(&mx);
    mx.preset = PLAN_MIXTRAL_8X7B;
    mx.moe_chapter = &ep_plan_moe_chapter;
    llama_config c = plan_calc_model(&mx);
    CHECK_CLOSE(llama_parameter_count(&c, true), 46.7e9, 0, 5e-3, "Mixtral 8x7B parameters");
    CHECK_CLOSE(llama_active_parameter_count(&c) + (double)c.vocab_size * c.dim, 12.9e9, 0, 5e-3, "Mixtral active");

    /* DeepSeek-V3-like: 61 layers of MHA (4 D^2), two norms, a router E D, 256 experts and a shared
     * one of 3 D 2048 each; the embedding and the output V D each, the final norm */
    plan_calc_options ds;
    plan_calc_defaults(&ds);
    ds.preset = PLAN_DEEPSEEK_V3;
    ds.moe_chapter = &ep_plan_moe_chapter;
    c = plan_calc_model(&ds);
    double D = 7168, layer = 4 * D * D + 2 * D + 256 * D + 257 * 3 * D * 2048;
    CHECK_CLOSE(llama_parameter_count(&c, true), 61 * layer + 2 * 129280 * D + D, 0, 1e-12, "DeepSeek-V3-like");
    /* ... active a token: 8 of the 256 experts and the shared one, the output and the final norm, no
     * embedding (a lookup) */
    double active_layer = 4 * D * D + 2 * D + 256 * D + 9 * 3 * D * 2048;
    CHECK_CLOSE(llama_active_parameter_count(&c), 61 * active_layer + 129280 * D + D, 0, 1e-12, "DeepSeek-V3-like active");

    /* FSDP's buffers hold what it gathers. At ep = S the experts are each rank's own, never gathered:
     * their size changes nothing there (S = ep = 4 without a pipeline, S = ep = 2 in pp 2's stages);
     * at ep 2 of S 4 they are gathered over 2 ranks, and their buffers grow with them. */
    struct { int mesh[MESH_NDIMS], ep; bool whole; } fsdp_cases[] = {
        {{1, 1, 4, 1, 1}, 4, true}, {{2, 1, 2, 1, 1}, 2, true}, {{1, 1, 4, 1, 1}, 2, false}};
    for (size_t i = 0; i < sizeof fsdp_cases / sizeof fsdp_cases[0]; i++) {
        double buffers[2];
        for (int wide = 0; wide <= 1; wide++) {
            plan_calc_options o = small_moe();
            o.gpus = 4;
            o.ep = fsdp_cases[i].ep;
            o.expert_dim = wide ? 96 : 48;
            plan_calc_result r;
            char why[256] = "";
            CHECK(plan_calc_mesh(&o, fsdp_cases[i].mesh, &r, why, sizeof why) == 0, "refused: %s", why);
            buffers[wide] = r.fsdp_buffer_bytes;
        }
        CHECK(fsdp_cases[i].whole ? buffers[0] == buffers[1] : buffers[1] > buffers[0],
              "pp %d, S %d, ep %d: FSDP's buffers %.0f bytes with experts of 48, %.0f of 96", fsdp_cases[i].mesh[0],
              fsdp_cases[i].mesh[2], fsdp_cases[i].ep, buffers[0], buffers[1]);
    }

    for (int S = 1; S <= 8; S *= 2)
        for (int ep = 1; ep <= S; ep *= 2)
            for (int every = 1; every <= 3; every++) check_conservation(S, ep, every);

    check_activations(1, 1, 0);
    check_activations(2, 1, 0);
    check_activations(4, 1, 0);
    check_activations(4, 2, 0);
    check_activations(4, 1, 1.0);

    /* ep's traffic: M microbatches x L mixtures through 09's formula, a rank's share, (ep-1)/ep sent */
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        plan_calc_options o = small_moe();
        o.gpus = 8;
        o.ep = 4;
        o.precision = bf16 ? PLAN_BF16 : PLAN_FP32;
        const int mesh[MESH_NDIMS] = {1, 1, 8, 1, 1};
        plan_calc_result r;
        char why[256] = "";
        CHECK(plan_calc_mesh(&o, mesh, &r, why, sizeof why) == 0, "refused: %s", why);
        double M = 16 / 8, L = 4, N = 32, D = bf16 ? 32 : 64;   /* (bf16: half the bytes of a row) */
        CHECK_CLOSE(r.ep_bytes, 0.75 * ep_alltoall_bytes(M * L, 4, N, 2, D, 8) / 4, 0, 1e-12, "ep bytes, 09's formula");
        CHECK(r.ep == 4, "ep %d", r.ep);
        if (bf16) {   /* the counts stay int32: the rows' half and the counts' whole */
            double rows = ep_alltoall_bytes(M * L, 4, N, 2, 64, 8) - ep_alltoall_bytes(M * L, 4, N, 2, 0, 8);
            CHECK_CLOSE(r.ep_bytes, 0.75 * (rows / 2 + ep_alltoall_bytes(M * L, 4, N, 2, 0, 8)) / 4, 0, 1e-12,
                        "bf16 ep bytes: the rows halved");
        }
    }

    /* ZeRO-1 (--plan-dp zero1, chapter 04's): the values and the gradients whole (the experts E / ep
     * of them), the AdamW state sharded; a step moves one reduce-scatter of the gradients and one
     * all-gather of the updated values, the dense tensors over S, the experts over S / ep, however
     * many microbatches */
    for (int moe = 0; moe <= 1; moe++)
        for (int batch = 1; batch <= 2; batch++) {
            plan_calc_options o = small_moe();
            if (!moe) o.experts = 0, o.shared_expert = false;
            o.dp_mode = PLAN_DP_ZERO1;
            o.gpus = 8;
            o.ep = moe ? 4 : 0;
            o.global_batch *= batch;
            const int mesh[MESH_NDIMS] = {1, 1, 8, 1, 1};
            llama_config c = plan_calc_model(&o);
            plan_calc_result r;
            char why[256] = "";
            CHECK(plan_calc_mesh(&o, mesh, &r, why, sizeof why) == 0, "zero1 refused: %s", why);
            double n = llama_parameter_count(&c, true), X = moe ? 4.0 * 3 * 8 * 48 * 64 : 0;   /* the experts' */
            CHECK(r.params_bytes == 4 * (n - X + X / 4) && r.grads_bytes == r.params_bytes && r.optim_bytes == n,
                  "zero1%s: values %.0f, gradients %.0f, AdamW %.0f bytes", moe ? " with experts" : "", r.params_bytes,
                  r.grads_bytes, r.optim_bytes);
            CHECK_CLOSE(r.dp_bytes, 8 * ((n - X) * 7 / 8 + X / 4 / 2), 0, 1e-12, "zero1's bytes a step");
        }

    /* refusals, each with its reason */
    {
        plan_calc_options o = small_moe();
        o.gpus = 4;
        const int mesh[MESH_NDIMS] = {1, 1, 4, 1, 1};
        plan_calc_result r;
        char why[256] = "";
        o.ep = 8;
        CHECK(plan_calc_mesh(&o, mesh, &r, why, sizeof why) != 0 && strstr(why, "does not divide"), "ep 8 of S 4: %s", why);
        o.ep = 2;
        o.experts = 3;
        CHECK(plan_calc_mesh(&o, mesh, &r, why, sizeof why) != 0 && strstr(why, "3 experts"), "ep 2 of 3 experts: %s", why);
        o = small_moe();
        o.fp8 = true;
        CHECK(plan_calc_mesh(&o, mesh, &r, why, sizeof why) != 0 && strstr(why, "float8"), "float8 experts: %s", why);
        o = small_moe();
        o.ac = AC_FULL;
        CHECK(plan_calc_mesh(&o, mesh, &r, why, sizeof why) != 0 && strstr(why, "recomputes"), "full AC: %s", why);
        o = small_moe();
        o.moe_chapter = NULL;   /* chapter 08's binary */
        CHECK(plan_calc_mesh(&o, mesh, &r, why, sizeof why) != 0 && strstr(why, "09 --plan"), "no layer: %s", why);
        o = small_moe();
        o.experts = 0;
        o.ep = 2;
        CHECK(plan_calc_mesh(&o, mesh, &r, why, sizeof why) != 0 && strstr(why, "dense"), "ep of a dense model: %s", why);
    }

    /* each tensor's shard group in a sharded block (params.h), the trainer's placement that the
     * calculator's S / ep assumes: an expert's is the shard group less the dimensions ep spans */
    {
        const unsigned SHARD = MESH_BIT(MESH_DP_SHARD), CP = MESH_BIT(MESH_CP), REP = MESH_BIT(MESH_DP_REPLICATE);
        struct {
            mesh_shape shape;
            unsigned shard_dims, expert_dims, want;   /* want: the experts' dims */
            int size;                                 /* and their group's ranks */
            bool whole;
            const char *what;
        } cases[] = {
            {{.pp = 1, .dp_replicate = 2, .dp_shard = 2, .cp = 2, .tp = 1}, SHARD | CP, SHARD, CP, 2, false,
             "--fsdp --cp 2: ep = dp_shard, each expert over cp"},
            {{.pp = 1, .dp_replicate = 2, .dp_shard = 2, .cp = 2, .tp = 1}, SHARD | CP, SHARD | CP, 0, 1, true,
             "--ep-over-cp: ep = S, held whole"},
            {{.pp = 1, .dp_replicate = 2, .dp_shard = 2, .cp = 1, .tp = 1}, SHARD, SHARD, 0, 1, true,
             "--fsdp at ep = dp_shard: held whole"},
            {{.pp = 1, .dp_replicate = 2, .dp_shard = 2, .cp = 1, .tp = 1}, REP | SHARD, SHARD, REP, 2, false,
             "--full-shard: each expert over dp_replicate (dp_shard_mod_ep)"},
            {{.pp = 1, .dp_replicate = 2, .dp_shard = 2, .cp = 2, .tp = 1}, REP | SHARD | CP, SHARD, REP | CP, 4, false,
             "--full-shard --cp 2: over dp_replicate x cp"},
            {{.pp = 1, .dp_replicate = 4, .dp_shard = 1, .cp = 2, .tp = 1}, SHARD | CP, SHARD, SHARD | CP, 2, false,
             "ep 1: a dimension of one rank splits nothing (the dense tensors' group)"},
            {{.pp = 1, .dp_replicate = 1, .dp_shard = 4, .cp = 1, .tp = 1}, SHARD, 0, SHARD, 4, false,
             "no expert parallelism: sharded as a dense tensor"}};
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            unsigned got = param_shard_dims_of(&cases[i].shape, P_EXPERT_W1, cases[i].shard_dims, cases[i].expert_dims);
            bool whole = param_held_whole(&cases[i].shape, P_EXPERT_W2, cases[i].shard_dims, cases[i].expert_dims);
            CHECK(got == cases[i].want && mesh_size_over(&cases[i].shape, got) == cases[i].size &&
                      whole == cases[i].whole,
                  "%s: the experts' dims %#x over %d ranks, held whole %d; want %#x over %d, %d", cases[i].what, got,
                  mesh_size_over(&cases[i].shape, got), whole, cases[i].want, cases[i].size, cases[i].whole);
            CHECK(param_shard_dims_of(&cases[i].shape, P_WQ, cases[i].shard_dims, cases[i].expert_dims) ==
                          cases[i].shard_dims &&
                      !param_held_whole(&cases[i].shape, P_ROUTER, cases[i].shard_dims, cases[i].expert_dims),
                  "%s: a dense tensor's shard group is not the table's", cases[i].what);
        }
    }

    /* the whole report for a mixture, of a --plan-mesh without --plan-ep (the ep that fits and is
     * fastest on it, then the table with an ep column): it prints and returns 0 */
    plan_calc_options o = small_moe();
    const int given[MESH_NDIMS] = {1, 1, 8, 1, 1};
    memcpy(o.mesh, given, sizeof given);
    o.mesh_given = true;
    o.gpus = 8;
    o.gpus_per_node = 4;   /* (the ep group across nodes for ep 8) */
    o.top = 4;
    CHECK(plan_calculator_run(&o) == 0, "the report failed");

    int rc = tu_finish("test_moe_plan");
    comm_finalize();
    return rc;
}
