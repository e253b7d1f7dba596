/* ranks: 1 */
/* test_trainer.c: chapter 08's trainer pieces that parity with the baseline cannot see (the
 * baseline follows the same schedule and reads the same text):
 *   - the learning rate of each step: linear warmup, then a cosine from lr to lr_min, against
 *     the closed form at the points where it is known exactly (grades the lr exercise)
 *   - the training FLOPs per token against a count by hand of the model's matrices
 *   - the text batches: the same global batch whatever the accumulation split, windows of the
 *     training part only, the validation batches consecutive windows of the validation part
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "data.h"
#include "test_util.h"
#include "../08_full_trainer/trainer.h"

static void test_schedule(void) {
    lr_schedule s = {1e-3, 1e-4, 10, 110};
    CHECK_CLOSE(lr_at_step(&s, 1), 1e-4, 0, 1e-12, "warmup step 1: lr / 10");
    CHECK_CLOSE(lr_at_step(&s, 5), 5e-4, 0, 1e-12, "warmup step 5: lr / 2");
    CHECK_CLOSE(lr_at_step(&s, 10), 1e-3, 0, 1e-12, "the end of warmup: lr");
    CHECK_CLOSE(lr_at_step(&s, 60), 5.5e-4, 0, 1e-12, "half way down the cosine: (lr + lr_min) / 2");
    CHECK_CLOSE(lr_at_step(&s, 110), 1e-4, 0, 1e-12, "the last step: lr_min");
    CHECK_CLOSE(lr_at_step(&s, 35), 1e-4 + 0.5 * 9e-4 * (1 + cos(M_PI / 4)), 0, 1e-12, "a quarter down the cosine");
    for (int k = 11; k < 110; k++)   /* decreasing after warmup */
        CHECK(lr_at_step(&s, k + 1) < lr_at_step(&s, k), "lr rises from step %d to %d", k, k + 1);
    lr_schedule none = {2e-3, 2e-4, 0, 50};
    CHECK_CLOSE(lr_at_step(&none, 1), 2e-4 + 0.5 * 1.8e-3 * (1 + cos(M_PI / 50)), 0, 1e-12, "no warmup: cosine from step 1");
}

static void test_flops(void) {
    llama_config c = llama_config_default();
    double D = c.dim, F = c.ffn_dim, V = c.vocab_size, hd = llama_head_dim(&c);
    double layer = D * c.n_heads * hd * 2 + D * c.n_kv_heads * hd * 2 + 3 * D * F + 2 * D;   /* wq wo, wk wv, w1 w2 w3, norms */
    double params = c.n_layers * layer + D + V * D;   /* + final norm + output (the embedding: a lookup) */
    CHECK_CLOSE(llama_parameter_count(&c, false), params, 0, 1e-12, "parameters without the embedding");
    CHECK_CLOSE(llama_parameter_count(&c, true), params + V * D, 0, 1e-12, "parameters with the embedding");
    /* 6 per parameter, and causal attention: forward 2 D FLOPs for each of the scores and the
     * weighted sum over T/2 keys on average, backward twice that */
    CHECK_CLOSE(llama_flops_per_token(&c), 6 * params + 3 * c.n_layers * 2 * (2 * D * c.seq_len / 2.0), 0, 1e-12,
                "FLOPs per token");
}

static void test_text(void) {
    char path[] = "/tmp/test_trainer_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    size_t n = 10000;
    unsigned char *bytes = malloc(n);
    /* training bytes count up modulo 127, validation bytes lie at 128 and above */
    for (size_t i = 0; i < n; i++) bytes[i] = (unsigned char)(i < 9000 ? i % 127 : 128 + i % 127);
    FILE *f = fdopen(fd, "wb");
    fwrite(bytes, 1, n, f);
    fclose(f);
    text_corpus corpus;
    char err[256];
    int T = 16, B = 4;
    CHECK(text_corpus_load(&corpus, path, T, err, sizeof err) == 0, "load: %s", err);
    CHECK(corpus.n == n && corpus.n_train == 9000, "split %zu / %zu", corpus.n_train, corpus.n);
    int whole_tok[8 * 16], whole_tgt[8 * 16], part_tok[8 * 16], part_tgt[8 * 16];
    text_train_batch(&corpus, whole_tok, whole_tgt, 2 * B, T, 42, 3, 0);
    text_train_batch(&corpus, part_tok, part_tgt, B, T, 42, 3, 0);                  /* micro-batch 0 */
    text_train_batch(&corpus, part_tok + B * T, part_tgt + B * T, B, T, 42, 3, B);   /* micro-batch 1 */
    CHECK(memcmp(whole_tok, part_tok, sizeof whole_tok) == 0 && memcmp(whole_tgt, part_tgt, sizeof whole_tgt) == 0,
          "accumulation changes the global batch");
    int outside = 0, broken = 0, distinct = 0;
    for (int r = 0; r < 2 * B; r++) {
        const int *tok = whole_tok + r * T, *tgt = whole_tgt + r * T;
        for (int t = 0; t < T; t++) {
            outside += tok[t] >= 128 || tgt[t] >= 128;
            broken += tgt[t] != (tok[t] + 1) % 127 || (t + 1 < T && tok[t + 1] != tgt[t]);
        }
        distinct += r > 0 && tok[0] != whole_tok[(r - 1) * T];
    }
    CHECK(outside == 0, "%d training tokens from the validation part", outside);
    CHECK(broken == 0, "%d targets that are not the next byte of the window", broken);
    CHECK(distinct >= B, "the windows hardly move: %d of %d rows start elsewhere than the last", distinct, 2 * B - 1);
    int vtok[4 * 16], vtgt[4 * 16];
    CHECK(text_val_batches(&corpus, B, T) == (int)((n - 9000 - 1) / (B * T)), "validation batches");
    text_val_batch(&corpus, vtok, vtgt, B, T, 1);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t at = 9000 + (size_t)(1 * B + b) * T + t;
            CHECK(vtok[b * T + t] == bytes[at] && vtgt[b * T + t] == bytes[at + 1], "validation batch 1 row %d t %d", b, t);
        }
    text_corpus_free(&corpus);
    remove(path);
    free(bytes);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    test_schedule();
    test_flops();
    test_text();
    int rc = tu_finish("test_trainer");
    comm_finalize();
    return rc;
}
