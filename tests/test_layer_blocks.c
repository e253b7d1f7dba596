/* ranks: 1 2 */
/* test_layer_blocks.c: a layer with a block of its own, defined here and nowhere in common/.
 *
 * The model's layer is a table of blocks (common/model/layer.h). This test replaces Llama's
 * feed-forward block with one twice as wide (hidden 2F: its own w1, w3 [2F, D] and w2 [D, 2F], its
 * own activations [N, 2Fl] and its own forward and backward), keeps the other three blocks, and
 * checks what the table promises:
 *   - the parameter table follows it: the same names, w1/w2/w3 of the new shapes, the parameter
 *     count grown by 3 D F per layer, the activation formula by 3 N F floats per layer;
 *   - the single-device baseline and Megatron's tensor parallelism (chapter 01's plan, which
 *     splits w1 and w3 by rows and w2 by columns) on every rank of the world agree: the loss
 *     within 1e-5 and every gradient within 1e-4 of the largest (the chapters' tolerances), from
 *     the same initialisation and batch.
 * And the same with the wide block on every other layer (llama_config.layer_every 2, as chapter 09
 * interleaves its mixture): each layer's tensors and activations its own block's.
 * On 1 rank the plan is Megatron's at tp 1; on 2 ranks each rank holds half the 2F units.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../01_transformer_tp/tp.h"
#include "comm.h"
#include "data.h"
#include "device.h"
#include "kernels.h"
#include "layer.h"
#include "llama_kernels.h"
#include "model.h"
#include "test_util.h"

#define BATCH 2
#define SEED 1234

/* ---- the wide feed-forward: h_out = h_mid + w2(silu(w1 m) * w3 m), hidden 2F ----------------- */
static void wide_forward(const layer_pass *x) {
    llama_model *m = x->m;
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    llama_layer_acts *a = x->a;
    int width = 2 * d->Fl;   /* this rank's units of the 2F */
    proj_rows rows = {d->B, d->T, d->Ts, d->D};
    proj_linear w13[2] = {{.site = llama_site(m, P_W1, x->l), .W = x->w->w1, .y = a->ffn_a, .width = width},
                          {.site = llama_site(m, P_W3, x->l), .W = x->w->w3, .y = a->ffn_b, .width = width}};
    p->proj.in_forward(p->proj.state, p, &p->region, llama_whole(m, m->ffn_in, a->ffn_xn), a->ffn_xn, w13, 2, rows);
    swiglu_forward(a->ffn_g, a->ffn_a, a->ffn_b, (size_t)d->N * width);
    if (!x->h_out) return;
    proj_linear w2 = {.site = llama_site(m, P_W2, x->l), .W = x->w->w2, .width = width};
    p->proj.out_forward(p->proj.state, p, &p->region, x->h_out, llama_whole(m, m->y_partial, x->h_out), a->ffn_g, &w2,
                        rows);
    add_inplace(x->h_out, a->h_mid, (size_t)d->Ns * d->D);
}
static void wide_backward(const layer_pass *x) {
    llama_model *m = x->m;
    const llama_plan *p = m->plan;
    const llama_dims *d = &m->d;
    llama_layer_acts *a = x->a;
    int width = 2 * d->Fl;
    proj_rows rows = {d->B, d->T, d->Ts, d->D};
    proj_linear w2 = {.site = llama_site(m, P_W2, x->l), .W = x->w->w2, .dW = x->g->w2, .width = width};
    p->proj.out_backward(p->proj.state, p, &p->region, m->dffn_g, llama_whole(m, m->dy_full, x->dh), x->dh, a->ffn_g,
                         &w2, rows);
    swiglu_backward(m->dffn_a, m->dffn_b, m->dffn_g, a->ffn_a, a->ffn_b, (size_t)d->N * width);
    proj_linear w13[2] = {{.site = llama_site(m, P_W1, x->l), .W = x->w->w1, .dW = x->g->w1, .dy = m->dffn_a, .width = width},
                          {.site = llama_site(m, P_W3, x->l), .W = x->w->w3, .dW = x->g->w3, .dy = m->dffn_b, .width = width}};
    p->proj.in_backward(p->proj.state, p, &p->region, llama_whole(m, m->dxn, m->dxn_full), m->dxn_full,
                        llama_whole(m, m->ffn_in, a->ffn_xn), w13, 2, rows);
}
static const layer_block wide_feed_forward = {
    .name = "wide_feed_forward",
    .n_tensors = 3,
    .tensor = {{.kind = P_W1, .name = "feed_forward.w1.weight", .rows = DIM_F, .cols = DIM_D, .init_std = 0.02f,
                .rows_times = 2},
               {.kind = P_W2, .name = "feed_forward.w2.weight", .rows = DIM_D, .cols = DIM_F, .init_std = 0.02f,
                .cols_times = 2},
               {.kind = P_W3, .name = "feed_forward.w3.weight", .rows = DIM_F, .cols = DIM_D, .init_std = 0.02f,
                .rows_times = 2}},
    .n_acts = 3,
    .act = {{.act = ACT_FFN_A, .rows = ROWS_REGION, .cols = COLS_F, .times = 2, .cost = ACT_COST_GEMM},
            {.act = ACT_FFN_B, .rows = ROWS_REGION, .cols = COLS_F, .times = 2, .cost = ACT_COST_GEMM},
            {.act = ACT_FFN_G, .rows = ROWS_REGION, .cols = COLS_F, .times = 2, .cost = ACT_COST_CHEAP}},
    .forward = wide_forward, .backward = wide_backward};
static const llama_layer wide_layer = {
    .name = "llama, wide feed-forward", .n = 4,
    .block = {&llama_attention_norm, &llama_attention, &llama_ffn_norm, &wide_feed_forward}};

/* ---- the table follows the block --------------------------------------------------------------- */
static void test_tables(const llama_config *wide) {
    llama_config plain = *wide;
    plain.layer = NULL;
    int D = wide->dim, F = wide->ffn_dim, L = wide->n_layers;
    CHECK(llama_num_params(wide) == llama_num_params(&plain), "%d tensors, Llama has %d", llama_num_params(wide),
          llama_num_params(&plain));
    for (int i = 0; i < llama_num_params(wide); i++) {
        param_spec s = llama_param_spec(wide, i), t = llama_param_spec(&plain, i);
        CHECK(strcmp(s.name, t.name) == 0, "tensor %d: %s, Llama's is %s", i, s.name, t.name);
        bool wider = s.kind == P_W1 || s.kind == P_W3, deeper = s.kind == P_W2;
        CHECK(s.rows == t.rows * (wider ? 2 : 1) && s.cols == t.cols * (deeper ? 2 : 1), "%s is [%d, %d]", s.name,
              s.rows, s.cols);
    }
    double grown = llama_parameter_count(wide, true) - llama_parameter_count(&plain, true);
    CHECK(grown == 3.0 * D * F * L, "the parameters grew by %.0f, not 3 D F L = %d", grown, 3 * D * F * L);
    llama_plan single = plan_single_device();
    llama_dims dw = llama_dims_make(wide, &single, BATCH), dp = llama_dims_make(&plain, &single, BATCH);
    double more = (llama_layer_act_bytes(&dw, ACT_KEEP_ALL) - llama_layer_act_bytes(&dp, ACT_KEEP_ALL)) / 4;
    CHECK(more == 3.0 * dw.N * F, "a layer saves %.0f more floats, not 3 N F = %d", more, 3 * dw.N * F);
}

/* ---- every other layer: layer_every 2 puts the wide block on layers 1, 3, ..., Llama's on the
 * others; the table follows each layer, and every index round-trips ------------------------------ */
static void test_interleaved(const llama_config *every2) {
    int F = every2->ffn_dim;
    for (int i = 0; i < llama_num_params(every2); i++) {
        param_spec s = llama_param_spec(every2, i);
        CHECK(llama_param_index_of(every2, s.kind, s.layer) == i, "llama_param_index_of(%s) != %d", s.name, i);
        if (s.kind != P_W1) continue;
        int want = (s.layer + 1) % every2->layer_every == 0 ? 2 * F : F;
        CHECK(s.rows == want, "%s has %d rows; layer %d's block has %d", s.name, s.rows, s.layer, want);
    }
    for (int u = 0; u <= every2->n_layers; u++) {   /* each unit's tensors: its own, in the table's order */
        int idx[LLAMA_UNIT_MAX_TENSORS], k = llama_unit_tensors(every2, u, idx);
        for (int j = 0; j < k; j++) {
            param_spec s = llama_param_spec(every2, idx[j]);
            CHECK(s.layer == (u < every2->n_layers ? u : -1), "unit %d holds %s", u, s.name);
        }
    }
}

/* ---- the baseline and tensor parallelism agree ------------------------------------------------- */
static void test_parity(const llama_config *c) {
    bool root = comm_world()->rank == 0;
    int T = c->seq_len, n = BATCH * T;
    int *tokens = malloc(n * sizeof(int)), *targets = malloc(n * sizeof(int));
    synthetic_batch(tokens, targets, BATCH, T, c->vocab_size, SEED, 1);
    int valid = count_valid_targets(targets, n);
    int *d_tokens = device_alloc_ints(n, MEM_BUFFERS), *d_targets = device_alloc_ints(n, MEM_BUFFERS);
    device_copy_to_device(d_tokens, tokens, n * sizeof(int));
    device_copy_to_device(d_targets, targets, n * sizeof(int));

    mesh_requirements needs = {0};
    mesh_require(&needs, tp_mesh_rule(c));
    device_mesh *mesh = mesh_create((mesh_shape){.tp = MESH_REST}, &needs);
    llama_plan plan = megatron_plan(mesh, c);
    llama_model *tp = llama_create(c, &plan, BATCH, SEED), *base = llama_create_baseline(c, BATCH, SEED);
    float loss_tp = llama_forward(tp, d_tokens, d_targets, 1.0f / valid);
    llama_backward(tp);
    float loss_base = llama_forward(base, d_tokens, d_targets, 1.0f / valid);
    llama_backward(base);
    CHECK(fabsf(loss_tp - loss_base) <= 1e-5f * fmaxf(1.0f, fabsf(loss_base)), "loss: tp %d %.9f, baseline %.9f",
          mesh->shape.tp, loss_tp, loss_base);

    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < llama_num_params(c); i++) {
        param_spec s = llama_param_spec(c, i);
        size_t numel = (size_t)s.rows * s.cols;
        float *full = root ? malloc(numel * sizeof(float)) : NULL, *mine = malloc(numel * sizeof(float));
        param_gather(tp->params, i, true, full);   /* collective */
        if (root) {
            device_copy_to_host(mine, base->params->grads + base->params->t[i].offset_whole, numel * sizeof(float));
            double diff = 0, scale = 0;
            for (size_t j = 0; j < numel; j++) {
                diff = fmax(diff, fabs((double)full[j] - mine[j]));
                scale = fmax(scale, fabs((double)mine[j]));
            }
            double rel = scale > 0 ? diff / scale : diff;
            CHECK(rel <= 1e-4 && scale > 0, "%s: gradient %.3g of its largest %.3g apart", s.name, rel, scale);
            if (rel > worst) worst = rel, worst_name = s.name;
            if (s.kind == P_W1) {   /* the second F units are used: their rows have gradients */
                double upper = 0;
                for (size_t j = numel / 2; j < numel; j++) upper = fmax(upper, fabs((double)mine[j]));
                CHECK(upper > 0, "%s: rows [F, 2F) have no gradient: the block does not use them", s.name);
            }
        }
        free(full);
        free(mine);
    }
    if (root)
        printf("  wide feed-forward, tp %d against the baseline: loss %.9f vs %.9f, worst gradient %.2e (%s)\n",
               mesh->shape.tp, loss_tp, loss_base, worst, worst_name);
    llama_free(tp);
    llama_free(base);
    plan_free(&plan);
    device_free(d_tokens);
    device_free(d_targets);
    free(tokens);
    free(targets);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    llama_config c = llama_config_default();
    c.layer = &wide_layer;
    test_tables(&c);
    test_parity(&c);
    /* the wide block on every other layer of four: the layers' activations and the shared scratch
     * (sized by the wider block) follow each layer's own blocks */
    c.layer_every = 2;
    c.n_layers = 4;
    test_interleaved(&c);
    test_parity(&c);
    comm_finalize();
    return tu_finish("test_layer_blocks");
}
