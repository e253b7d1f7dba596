/* ranks: 1 */
/* test_llama_model.c: the single-device Llama baseline (common/model/model.c under the single-device plan) checked as a whole.
 *
 *   - the parameter table: count, names, shapes, index lookup
 *   - the synthetic batches of common/data.c: next-token targets, padding, determinism
 *   - the loss at initialisation is close to ln(V) (std 0.02 weights give near-uniform logits)
 *   - every parameter tensor's gradient, and the gradient of the embedding output h0, against
 *     central finite differences of the whole model's loss
 *   - padded positions get exactly zero gradient (causal attention + ignore index)
 *   - gradients accumulate (+=) across backward passes; llama_zero_grad clears them
 *   - an all-padding batch gives loss 0 and zero gradients
 *   - llama_adamw_step updates every tensor as torch.optim.AdamW would at step 1
 *   - a training step after the first needs no new memory (everything allocated once)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "data.h"
#include "device.h"
#include "init.h"
#include "llama.h"
#include "model.h"
#include "llama_kernels.h"
#include "test_util.h"

/* The tiny model of the gradient check: small enough that a few hundred forward passes take
 * well under a second, big enough to exercise grouped-query attention (4 heads, 2 kv heads),
 * two layers and padding. */
#define B 2
#define T 8

static llama_config tiny_config(void) {
    llama_config c = llama_config_default();
    c.dim = 16;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.ffn_dim = 32;
    c.vocab_size = 32;
    c.seq_len = T;
    return c;
}

static size_t numel(const param_spec *s) { return (size_t)s->rows * (size_t)s->cols; }

/* ---- small host <-> device helpers (the test reads and writes device tensors by copy) ---- */
static float *to_host(const float *dev, size_t n) {
    float *h = malloc(n * sizeof(float));
    device_copy_to_host(h, dev, n * sizeof(float));
    return h;
}
static float get_elem(const float *dev, size_t i) {
    float x;
    device_copy_to_host(&x, dev + i, sizeof x);
    return x;
}
static void set_elem(float *dev, size_t i, float x) {
    device_copy_to_device(dev + i, &x, sizeof x);
}
static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)x[i]));
    return m;
}

/* A batch on the device: tokens, targets [B*T] (the model uses positions 0..T-1). */
typedef struct {
    int tokens[B * T], targets[B * T];
    int *d_tokens, *d_targets;
    int valid;
} batch;

static void batch_upload(batch *b) {
    b->d_tokens = device_alloc_ints(B * T, MEM_BUFFERS);
    b->d_targets = device_alloc_ints(B * T, MEM_BUFFERS);
    device_copy_to_device(b->d_tokens, b->tokens, sizeof b->tokens);
    device_copy_to_device(b->d_targets, b->targets, sizeof b->targets);
    b->valid = count_valid_targets(b->targets, B * T);
}
static void batch_free(batch *b) {
    device_free(b->d_tokens);
    device_free(b->d_targets);
}

/* The mean loss of the batch: sum of token losses / count of valid targets. An empty count
 * (all padding) uses scale 1 so that nothing divides by zero: the sum is 0 anyway. */
static float batch_loss(llama_model *m, const batch *b) {
    float scale = b->valid > 0 ? 1.0f / (float)b->valid : 1.0f;
    return llama_forward(m, b->d_tokens, b->d_targets, scale);
}

/* ------------------------------------------------------------------------------------------ */
static void test_param_table(void) {
    llama_config c = tiny_config();
    int D = c.dim, F = c.ffn_dim, V = c.vocab_size, hd = llama_head_dim(&c);
    int n = llama_num_params(&c);
    CHECK(n == 1 + 9 * c.n_layers + 2, "llama_num_params = %d", n);

    /* the order of the table and torchtitan's names */
    static const char *layer_names[9] = {
        "attention_norm.weight", "attention.wq.weight", "attention.wk.weight",
        "attention.wv.weight", "attention.wo.weight", "ffn_norm.weight",
        "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight"};
    char want[64];
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(&c, i);
        total += numel(&s);
        if (i == 0) snprintf(want, sizeof want, "tok_embeddings.weight");
        else if (i == n - 2) snprintf(want, sizeof want, "norm.weight");
        else if (i == n - 1) snprintf(want, sizeof want, "output.weight");
        else snprintf(want, sizeof want, "layers.%d.%s", (i - 1) / 9, layer_names[(i - 1) % 9]);
        CHECK(strcmp(s.name, want) == 0, "param %d is named %s, want %s", i, s.name, want);
        CHECK(llama_param_index(&c, s.name) == i, "llama_param_index(%s) != %d", s.name, i);
        CHECK(s.is_vector == (s.rows == 1 && (s.kind == P_ATTENTION_NORM ||
                                              s.kind == P_FFN_NORM || s.kind == P_NORM)),
              "%s: is_vector %d", s.name, s.is_vector);
        CHECK(s.init_std == (s.is_vector ? 0.0f : 0.02f), "%s: init_std %g (norms 0: ones)", s.name, s.init_std);
        CHECK(llama_param_index_of(&c, s.kind, s.layer) == i, "llama_param_index_of(%s) != %d", s.name, i);
    }
    CHECK(llama_param_index(&c, "layers.9.attention.wq.weight") == -1, "unknown name found");

    /* the units: layer u's nine tensors for u < L, then the ends; every tensor in exactly one */
    int seen[64] = {0};
    for (int u = 0; u <= c.n_layers; u++) {
        int idx[LLAMA_UNIT_MAX_TENSORS], k = llama_unit_tensors(&c, u, idx);
        CHECK(k == (u < c.n_layers ? llama_layer_tensors(&c, u) : LLAMA_END_TENSORS), "unit %d has %d tensors", u, k);
        for (int j = 0; j < k; j++) {
            param_spec s = llama_param_spec(&c, idx[j]);
            CHECK(s.layer == (u < c.n_layers ? u : -1), "unit %d holds %s", u, s.name);
            seen[idx[j]]++;
        }
    }
    for (int i = 0; i < n; i++) CHECK(seen[i] == 1, "tensor %d is in %d units", i, seen[i]);

    /* a few shapes, [out, in] */
    param_spec wq = llama_param_spec(&c, 2), wk = llama_param_spec(&c, 3);
    param_spec wo = llama_param_spec(&c, 5), w2 = llama_param_spec(&c, 8);
    param_spec out = llama_param_spec(&c, n - 1);
    CHECK(wq.rows == c.n_heads * hd && wq.cols == D, "wq is [%d, %d]", wq.rows, wq.cols);
    CHECK(wk.rows == c.n_kv_heads * hd && wk.cols == D, "wk is [%d, %d]", wk.rows, wk.cols);
    CHECK(wo.rows == D && wo.cols == c.n_heads * hd, "wo is [%d, %d]", wo.rows, wo.cols);
    CHECK(w2.rows == D && w2.cols == F, "w2 is [%d, %d]", w2.rows, w2.cols);
    CHECK(out.rows == V && out.cols == D && out.layer == -1, "output is [%d, %d]", out.rows,
          out.cols);
    size_t per_layer = 2 * (size_t)D + (size_t)D * hd * (2 * c.n_heads + 2 * c.n_kv_heads) +
                       3 * (size_t)D * F;
    CHECK(total == 2 * (size_t)V * D + (size_t)D + c.n_layers * per_layer,
          "total parameter count %zu", total);
}

/* ------------------------------------------------------------------------------------------ */
static void test_synthetic_batch(void) {
    enum { BB = 4, TT = 16, VV = 50 };
    int tok[BB * TT], tgt[BB * TT], tok2[BB * TT], tgt2[BB * TT];
    for (int step = 1; step <= 20; step++) {
        int padded = synthetic_batch(tok, tgt, BB, TT, VV, 42, step);
        int ignored = 0;
        for (int i = 0; i < BB * TT; i++) {
            ignored += tgt[i] == IGNORE_INDEX;
            CHECK(tok[i] >= 0 && tok[i] < VV, "token %d out of range", tok[i]);
            CHECK(tgt[i] == IGNORE_INDEX || (tgt[i] >= 0 && tgt[i] < VV), "target %d", tgt[i]);
        }
        CHECK(padded == ignored, "returned %d padded, counted %d", padded, ignored);
        CHECK(count_valid_targets(tgt, BB * TT) == BB * TT - ignored, "count_valid_targets");
        for (int b = 0; b < BB; b++) {
            const int *tk = tok + b * TT, *tg = tgt + b * TT;
            /* a sequence's targets are its next tokens, then (maybe) a padded tail */
            int len = TT;
            while (len > 0 && tg[len - 1] == IGNORE_INDEX) len--;
            for (int t = 0; t < len; t++) CHECK(tg[t] != IGNORE_INDEX, "padding not a tail");
            for (int t = 0; t + 1 < len; t++)
                CHECK(tg[t] == tk[t + 1], "step %d b %d t %d: target is not the next token",
                      step, b, t);
            CHECK(len == TT || (len >= TT / 2 && len < TT), "padded length %d", len);
            if (b == BB - 1) CHECK(len < TT, "the last sequence must be padded");
        }
        /* the same (seed, step) gives the same batch */
        synthetic_batch(tok2, tgt2, BB, TT, VV, 42, step);
        CHECK(memcmp(tok, tok2, sizeof tok) == 0 && memcmp(tgt, tgt2, sizeof tgt) == 0,
              "synthetic_batch is not deterministic");
    }
    synthetic_batch(tok2, tgt2, BB, TT, VV, 42, 21);
    CHECK(memcmp(tok, tok2, sizeof tok) != 0, "different steps give the same tokens");
}

/* ------------------------------------------------------------------------------------------ */
/* With std 0.02 weights the logits are nearly zero, so softmax is nearly uniform: the mean
 * cross-entropy starts at about ln(V). */
static void test_loss_at_init(void) {
    llama_config configs[2] = {tiny_config(), llama_config_default()};
    for (int k = 0; k < 2; k++) {
        llama_config c = configs[k];
        int Bk = 2, Tk = c.seq_len, N = Bk * Tk;
        int *tok = malloc(N * sizeof(int)), *tgt = malloc(N * sizeof(int));
        synthetic_batch(tok, tgt, Bk, Tk, c.vocab_size, 5, 1);
        int *d_tok = device_alloc_ints(N, MEM_BUFFERS), *d_tgt = device_alloc_ints(N, MEM_BUFFERS);
        device_copy_to_device(d_tok, tok, N * sizeof(int));
        device_copy_to_device(d_tgt, tgt, N * sizeof(int));

        llama_model *m = llama_create_baseline(&c, Bk, 1234);
        float loss = llama_forward(m, d_tok, d_tgt,
                                   1.0f / (float)count_valid_targets(tgt, N));
        CHECK_CLOSE(loss, log((double)c.vocab_size), 0.02, 0.0, "loss at init vs ln(V)");

        /* the norm weights start at exactly 1, the matrices at std 0.02 */
        float *w = to_host(param_in(m->params, m->params->params, 1), (size_t)c.dim);
        CHECK(w[0] == 1.0f && w[c.dim - 1] == 1.0f, "attention_norm init %g", w[0]);
        free(w);
        param_spec s = llama_param_spec(&c, 2);
        float *wq = to_host(param_in(m->params, m->params->params, 2), numel(&s));
        double sq = 0;
        for (size_t i = 0; i < numel(&s); i++) sq += (double)wq[i] * wq[i];
        CHECK_CLOSE(sqrt(sq / numel(&s)), 0.02, 0.0, 0.1, "wq init std");
        free(wq);

        llama_free(m);
        device_free(d_tok);
        device_free(d_tgt);
        free(tok);
        free(tgt);
    }
}

/* ------------------------------------------------------------------------------------------
 * Finite differences.
 *
 * The forward pass runs in fp32, so the loss carries rounding noise of a few 1e-7 relative.
 * A central difference (L(p+e) - L(p-e)) / 2e has truncation error ~ e^2 |L'''| / 6 and noise
 * error ~ 1e-7 |L| / e. Measured on this model, the worst error below (max over tensors) is
 *     e = 3e-2: 2.0e-3 (curvature)   e = 1e-2: 2.8e-4   e = 3e-3: 8.5e-4   e = 1e-3: 2.1e-3 (noise)
 * so e = 1e-2 sits at the bottom of the U, 35x under the tolerance of 1e-2. The differences
 * are taken in double, and e is replaced by the exact step the fp32 parameter moved.
 *
 * Weights at the default std 0.02 make attention nearly uniform and many gradients tiny (those
 * of wq and wk ~100x below those of output), leaving finite differences mostly noise. The
 * check therefore re-initialises the model with unit-variance activations: embeddings std 1,
 * linears std 1/sqrt(fan_in), norm weights 1 + 0.1 noise. The gradient code is the same.
 *
 * Per tensor, the elements checked are the 4 with the largest analytic gradient plus 4 chosen
 * at random; the error is max |fd - analytic| / max |analytic| over the tensor (the parity
 * metric of docs/design.md), with a tolerance of 1e-2.
 * ------------------------------------------------------------------------------------------ */
#define FD_EPS 1e-2
#define FD_TOL 1e-2
#define FD_TOP 4
#define FD_RANDOM 4

/* d loss / d x[i] by central differences; restores x[i]. */
static double finite_difference(llama_model *m, const batch *b, float *x_dev, size_t i) {
    float x0 = get_elem(x_dev, i);
    float xp = x0 + (float)FD_EPS, xm = x0 - (float)FD_EPS;
    set_elem(x_dev, i, xp);
    double lp = batch_loss(m, b);
    set_elem(x_dev, i, xm);
    double lm = batch_loss(m, b);
    set_elem(x_dev, i, x0);
    return (lp - lm) / ((double)xp - (double)xm);
}

/* Deterministic element picks for the test (xorshift64). */
static uint64_t rng_state = 0x2545f4914f6cdd1dULL;
static size_t rand_index(size_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (size_t)(rng_state % n);
}

static void set_test_weights(llama_model *m, const llama_config *c) {
    for (int i = 0; i < llama_num_params(c); i++) {
        param_spec s = llama_param_spec(c, i);
        size_t n = numel(&s);
        float *h = malloc(n * sizeof(float));
        if (s.is_vector) {
            init_normal_slice(h, s.name, 99, 0.1f, s.rows, s.cols, 0, s.rows, 0, s.cols);
            for (size_t j = 0; j < n; j++) h[j] += 1.0f;
        } else {
            float std = s.kind == P_TOK_EMBEDDINGS ? 1.0f : 1.0f / sqrtf((float)s.cols);
            init_normal_slice(h, s.name, 99, std, s.rows, s.cols, 0, s.rows, 0, s.cols);
        }
        device_copy_to_device(param_in(m->params, m->params->params, i), h, n * sizeof(float));
        free(h);
    }
}

static void test_gradients(void) {
    llama_config c = tiny_config();
    int D = c.dim, n = llama_num_params(&c);
    llama_model *m = llama_create_baseline(&c, B, 1234);
    set_test_weights(m, &c);

    batch b;
    synthetic_batch(b.tokens, b.targets, B, T, c.vocab_size, 7, 1);
    batch_upload(&b);
    CHECK(b.valid < B * T, "the batch should contain padding");

    /* analytic gradients */
    llama_zero_grad(m);
    float loss = batch_loss(m, &b);
    llama_backward(m);
    float **grads = malloc(n * sizeof(float *));
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(&c, i);
        grads[i] = to_host(param_in(m->params, m->params->grads, i), numel(&s));
    }
    float *dh0 = to_host(m->dh, (size_t)B * T * D);
    CHECK(isfinite(loss) && loss > 0, "loss %g", loss);

    printf("  finite differences (eps %g), error = max|fd - grad| / max|grad| per tensor\n",
           FD_EPS);
    printf("  %-36s %12s %12s\n", "tensor", "max|grad|", "error");
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(&c, i);
        size_t ne = numel(&s);
        const float *g = grads[i];
        double gmax = max_abs(g, ne);

        /* which elements: the FD_TOP largest |grad| (where the relative error means most),
         * then FD_RANDOM random ones */
        size_t pick[FD_TOP + FD_RANDOM];
        int npick = 0;
        for (int k = 0; k < FD_TOP && k < (int)ne; k++) {
            size_t best = 0;
            double bestv = -1;
            for (size_t j = 0; j < ne; j++) {
                int taken = 0;
                for (int q = 0; q < npick; q++) taken |= pick[q] == j;
                if (!taken && fabs(g[j]) > bestv) { bestv = fabs(g[j]); best = j; }
            }
            pick[npick++] = best;
        }
        for (int k = 0; k < FD_RANDOM; k++) pick[npick++] = rand_index(ne);

        double err = 0;
        for (int k = 0; k < npick; k++) {
            double fd = finite_difference(m, &b, param_in(m->params, m->params->params, i), pick[k]);
            err = fmax(err, fabs(fd - g[pick[k]]));
        }
        err /= gmax > 0 ? gmax : 1.0;
        printf("  %-36s %12.4e %12.4e\n", s.name, gmax, err);
        CHECK(gmax > 0, "%s: zero gradient", s.name);
        CHECK(err <= FD_TOL, "%s: finite-difference error %.3e", s.name, err);
    }

    /* d loss / d h0. A token that occurs once in the batch owns its embedding row alone, so
     * d loss / d tok_embeddings[tok, :] is exactly d loss / d h0[b, t, :]: perturbing that row
     * perturbs h0 at (b, t) only. */
    int once = -1;
    for (int i = 0; i < B * T && once < 0; i++) {
        int count = 0;
        for (int j = 0; j < B * T; j++) count += b.tokens[j] == b.tokens[i];
        if (count == 1 && b.targets[i] != IGNORE_INDEX) once = i;
    }
    CHECK(once >= 0, "no token occurs exactly once in the batch");
    if (once >= 0) {
        int tok = b.tokens[once];
        const float *g0 = dh0 + (size_t)once * D;
        double gmax = max_abs(g0, D), err = 0;
        for (int d = 0; d < D; d++) {
            double fd = finite_difference(m, &b, param_in(m->params, m->params->params, 0), (size_t)tok * D + d);
            err = fmax(err, fabs(fd - g0[d]));
        }
        err /= gmax > 0 ? gmax : 1.0;
        printf("  %-36s %12.4e %12.4e\n", "h0 (embedding output)", gmax, err);
        CHECK(gmax > 0, "d loss / d h0 is zero at a valid position");
        CHECK(err <= FD_TOL, "h0: finite-difference error %.3e", err);
    }

    /* The embedding gradient is the sum of the h0 gradient rows of each token. */
    double *sum = calloc((size_t)c.vocab_size * D, sizeof(double));
    for (int i = 0; i < B * T; i++)
        for (int d = 0; d < D; d++) sum[(size_t)b.tokens[i] * D + d] += dh0[(size_t)i * D + d];
    double worst = 0;
    for (size_t j = 0; j < (size_t)c.vocab_size * D; j++)
        worst = fmax(worst, fabs(sum[j] - grads[0][j]));
    CHECK(worst <= 1e-6 * max_abs(grads[0], (size_t)c.vocab_size * D),
          "tok_embeddings grad != sum of h0 grad rows (%.3e)", worst);
    free(sum);

    /* A padded position (target ignored) only influences later positions, whose targets are
     * ignored too: causal attention must give it exactly zero gradient. */
    int padded_rows = 0;
    for (int bb = 0; bb < B; bb++) {
        int len = T;
        while (len > 0 && b.targets[bb * T + len - 1] == IGNORE_INDEX) len--;
        for (int t = len; t < T; t++, padded_rows++)
            CHECK(max_abs(dh0 + ((size_t)bb * T + t) * D, D) == 0.0,
                  "d loss / d h0 at padded position (b %d, t %d) is not zero", bb, t);
    }
    CHECK(padded_rows > 0, "no padded position to check");

    for (int i = 0; i < n; i++) free(grads[i]);
    free(grads);
    free(dh0);
    batch_free(&b);
    llama_free(m);
}

/* ------------------------------------------------------------------------------------------ */
/* Two backward passes add up; llama_zero_grad clears; an all-padding batch gives nothing. */
static void test_accumulate_zero_and_padding(void) {
    llama_config c = tiny_config();
    int n = llama_num_params(&c);
    llama_model *m = llama_create_baseline(&c, B, 1234);
    batch b;
    synthetic_batch(b.tokens, b.targets, B, T, c.vocab_size, 7, 2);
    batch_upload(&b);

    llama_zero_grad(m);
    batch_loss(m, &b);
    llama_backward(m);
    float **once = malloc(n * sizeof(float *));
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(&c, i);
        once[i] = to_host(param_in(m->params, m->params->grads, i), numel(&s));
    }
    /* the backward pass overwrites the logits with their gradient: run forward again */
    batch_loss(m, &b);
    llama_backward(m);
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(&c, i);
        float *twice = to_host(param_in(m->params, m->params->grads, i), numel(&s));
        double worst = 0;
        for (size_t j = 0; j < numel(&s); j++)
            worst = fmax(worst, fabs((double)twice[j] - 2.0 * once[i][j]));
        CHECK(worst <= 1e-6 * max_abs(twice, numel(&s)), "%s: two backwards != 2x one (%.3e)",
              s.name, worst);
        free(twice);
    }

    llama_zero_grad(m);
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(&c, i);
        float *g = to_host(param_in(m->params, m->params->grads, i), numel(&s));
        CHECK(max_abs(g, numel(&s)) == 0.0, "%s: not zero after llama_zero_grad", s.name);
        free(g);
    }

    /* every target ignored: the loss is an empty sum, and nothing receives gradient */
    for (int i = 0; i < B * T; i++) b.targets[i] = IGNORE_INDEX;
    device_copy_to_device(b.d_targets, b.targets, sizeof b.targets);
    b.valid = count_valid_targets(b.targets, B * T);
    CHECK(b.valid == 0, "valid count %d", b.valid);
    float loss = batch_loss(m, &b);
    llama_backward(m);
    CHECK(loss == 0.0f, "all-padding loss %g", loss);
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(&c, i);
        float *g = to_host(param_in(m->params, m->params->grads, i), numel(&s));
        CHECK(max_abs(g, numel(&s)) == 0.0, "%s: all-padding gradient not zero", s.name);
        free(g);
    }
    float *dh0 = to_host(m->dh, (size_t)B * T * c.dim);
    CHECK(max_abs(dh0, (size_t)B * T * c.dim) == 0.0, "all-padding d loss / d h0 not zero");
    free(dh0);

    for (int i = 0; i < n; i++) free(once[i]);
    free(once);
    batch_free(&b);
    llama_free(m);
}

/* ------------------------------------------------------------------------------------------ */
/* At step 1 the bias-corrected moments are m = g and v = g^2, so AdamW moves every element by
 * p (1 - lr wd) - lr g / (|g| + eps): a check that every tensor of the table is stepped, with
 * its own gradient. */
static void test_adamw_step(void) {
    llama_config c = tiny_config();
    adamw_config o = adamw_config_default();
    int n = llama_num_params(&c);
    llama_model *m = llama_create_baseline(&c, B, 1234);
    batch b;
    synthetic_batch(b.tokens, b.targets, B, T, c.vocab_size, 7, 3);
    batch_upload(&b);

    llama_zero_grad(m);
    batch_loss(m, &b);
    llama_backward(m);
    float **p0 = malloc(n * sizeof(float *)), **g = malloc(n * sizeof(float *));
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(&c, i);
        p0[i] = to_host(param_in(m->params, m->params->params, i), numel(&s));
        g[i] = to_host(param_in(m->params, m->params->grads, i), numel(&s));
    }
    llama_adamw_step(m, &o, 1);
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(&c, i);
        float *p1 = to_host(param_in(m->params, m->params->params, i), numel(&s));
        double worst = 0;
        for (size_t j = 0; j < numel(&s); j++) {
            double gj = g[i][j];
            double want = p0[i][j] * (1.0 - (double)o.lr * o.weight_decay) -
                          o.lr * gj / (fabs(gj) + o.eps);
            worst = fmax(worst, fabs(p1[j] - want));
        }
        CHECK(worst <= 1e-3 * o.lr, "%s: AdamW step 1 off by %.3e", s.name, worst);
        free(p1);
        free(p0[i]);
        free(g[i]);
    }
    free(p0);
    free(g);
    batch_free(&b);
    llama_free(m);
}

/* Step 2 of training (zero_grad, forward, backward, AdamW) allocates nothing that the first step
 * or the model's creation did not: every allocation is served by the allocator's cache. */
static void test_step_allocates_nothing(void) {
    llama_config c = tiny_config();
    adamw_config o = adamw_config_default();
    llama_model *m = llama_create_baseline(&c, B, 1234);
    batch b;
    synthetic_batch(b.tokens, b.targets, B, T, c.vocab_size, 7, 3);
    batch_upload(&b);
    size_t misses = 0;
    for (int step = 1; step <= 3; step++) {
        if (step == 2) misses = mem_cache_misses();
        llama_zero_grad(m);
        batch_loss(m, &b);
        llama_backward(m);
        llama_adamw_step(m, &o, step);
    }
    CHECK(mem_cache_misses() == misses, "steps 2 and 3 allocated new memory %zu times",
          mem_cache_misses() - misses);
    batch_free(&b);
    llama_free(m);
}

/* plan_describe: each technique's line names what it installed, "over" the earlier one on the same
 * operator; what none touched stays the single device's; the groups are world rank 0's. */
static void test_plan_describe(void) {
    static const plan_technique first = {"first", NULL}, second = {"second", NULL}, third = {"third", NULL};
    static int a_state, b_state;
    char text[2048];
    llama_plan p = plan_single_device();
    plan_describe_text(&p, text, sizeof text);
    CHECK(strstr(text, "techniques: none"), "single device: %s", text);
    plan_push(&p, &first, NULL, 0);
    p.linear.state = &a_state;                      /* installs linear */
    p.layout[P_WQ] = SHARD_ROWS;                    /* and a placement */
    plan_push(&p, &second, NULL, 0);
    p.linear.state = &b_state;                      /* over first's */
    p.checkpoint.keep = 0;
    plan_push(&p, &third, NULL, 0);                 /* installs nothing */
    device_mesh mesh = {.shape = {.pp = 1, .dp_replicate = 1, .dp_shard = 2, .cp = 2, .tp = 2}};
    p.groups.mesh = &mesh;
    plan_describe_text(&p, text, sizeof text);
    CHECK(strstr(text, "techniques: 3,"), "the count: %s", text);
    CHECK(strstr(text, "  first              layout linear\n"), "first's line: %s", text);
    CHECK(strstr(text, "  second             linear (over first) checkpoint\n"), "second's line: %s", text);
    CHECK(strstr(text, "  third              (state only)\n"), "third's line: %s", text);
    CHECK(strstr(text, "  single device      storage sequence region vocab loss attention proj weights reduce_grads "
                       "optimizer schedule\n"), "the rest: %s", text);
    CHECK(strstr(text, "groups of world rank 0: tp {0,1} cp {0,2} batch {0,4}\n"), "the groups: %s", text);
    /* what a technique asks before it applies itself (chapter 05: nothing owns the weights yet) */
    CHECK(plan_slot_installed(&p, "linear") && plan_slot_installed(&p, "checkpoint") &&
          plan_slot_installed(&p, "layout"), "installed slots not seen");
    CHECK(!plan_slot_installed(&p, "weights") && !plan_slot_installed(&p, "optimizer"), "a slot no one installed");
    p.applied.n = 0;                                 /* (nothing to free: no state was allocated) */
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    test_param_table();
    test_synthetic_batch();
    test_loss_at_init();
    test_gradients();
    test_accumulate_zero_and_padding();
    test_adamw_step();
    test_step_allocates_nothing();
    test_plan_describe();
    comm_finalize();
    return tu_finish("test_llama_model");
}
