/* data.c: seeded synthetic token batches with padding (data.h).
 *
 * Every number here comes from a counter-based hash of (seed, step, b, t): there is no RNG
 * state, so every rank computes the same global batch, and the batch of step K is the same
 * whatever the parallel layout.
 *
 * The text follows a hidden rule a model can learn, so the loss curves go down: each token is
 * followed by its "successor" succ(x) = hash(seed, x) mod V three times out of four, and by a
 * random token otherwise (a noisy bigram language; the best achievable loss is about
 * -(3/4) ln(3/4) - (1/4) ln(1/(4V)) nats, well below the ln V of a random guess).
 *
 *   sequence b of step K is the T+1 tokens  s_0 = hash(seed, K, b, 0) mod V,
 *                                           s_t = succ(s_{t-1}) or hash(seed, K, b, t) mod V
 *   tokens[b, t]  = s_t          (t = 0..T-1)
 *   targets[b, t] = s_{t+1}      (next-token prediction; the last target is the fresh s_T)
 *
 * Padding: about half of the sequences (and always the last one when B >= 2, so the ignore
 * index is exercised on every step) end early at a length Lb in [T/2, T); their targets from
 * Lb on are IGNORE_INDEX and take no part in the loss. Their tokens stay as drawn: a padded
 * position still runs through the model, it just contributes nothing to the loss.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data.h"
#include "files.h"   /* read_file */
#include "llama_kernels.h"   /* IGNORE_INDEX */

/* splitmix64's finaliser: a bijective mix of 64 bits (Steele, Lea & Flood 2014). */
static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* One 64-bit value per (seed, step, b, t, what). `what` separates the independent streams
 * (token, padding decision, padded length) so they do not reuse each other's numbers. */
enum { STREAM_TOKEN = 0, STREAM_PAD_FLAG, STREAM_PAD_LEN, STREAM_FOLLOW, STREAM_SUCCESSOR, STREAM_WINDOW, STREAM_UNIFORM };

static uint64_t batch_hash(uint64_t seed, int step, int b, int t, int what) {
    uint64_t h = mix64(seed);
    h = mix64(h ^ (uint64_t)(uint32_t)step);
    h = mix64(h ^ (uint64_t)(uint32_t)b);
    h = mix64(h ^ (uint64_t)(uint32_t)t);
    return mix64(h ^ (uint64_t)what);
}

int synthetic_batch(int *tokens, int *targets, int B, int T, int V, uint64_t seed, int step) {
    int padded = 0;
    for (int b = 0; b < B; b++) {
        int *tok = tokens + (size_t)b * T;
        int *tgt = targets + (size_t)b * T;

        /* T+1 tokens: the inputs are the first T, the targets the last T */
        int s = (int)(batch_hash(seed, step, b, 0, STREAM_TOKEN) % (uint64_t)V);
        for (int t = 0; t < T; t++) {
            tok[t] = s;
            int follows = batch_hash(seed, step, b, t + 1, STREAM_FOLLOW) % 4 != 0;
            uint64_t next = follows ? batch_hash(seed, 0, 0, s, STREAM_SUCCESSOR)   /* succ(s) */
                                    : batch_hash(seed, step, b, t + 1, STREAM_TOKEN);
            s = (int)(next % (uint64_t)V);
            tgt[t] = s;
        }

        /* does sequence b end early, and where? */
        int pad = (batch_hash(seed, step, b, 0, STREAM_PAD_FLAG) & 1) || (B >= 2 && b == B - 1);
        if (pad) {
            int half = T / 2;
            int len = half + (int)(batch_hash(seed, step, b, 0, STREAM_PAD_LEN) %
                                   (uint64_t)(T - half));
            for (int t = len; t < T; t++) {
                tgt[t] = IGNORE_INDEX;
                padded++;
            }
        }
    }
    return padded;
}

int count_valid_targets(const int *targets, int n) {
    int valid = 0;
    for (int i = 0; i < n; i++)
        if (targets[i] != IGNORE_INDEX) valid++;
    return valid;
}

/* ---- a text corpus, byte-level ---- */

size_t text_corpus_min_bytes(int T, size_t val_bytes) {
    /* n = 10q + r (r < 10) splits into 9q training bytes and q + r validation bytes */
    size_t q_min = ((size_t)T + 1 + 8) / 9, best = 0;
    for (size_t q = val_bytes > 9 ? val_bytes - 9 : 0; q <= val_bytes; q++) {
        size_t qq = q > q_min ? q : q_min, r = val_bytes > qq ? val_bytes - qq : 0;
        if (r <= 9 && (best == 0 || 10 * qq + r < best)) best = 10 * qq + r;
    }
    return best;
}

int text_corpus_load_for(text_corpus *c, const char *path, int T, size_t val_bytes, const char *val_what,
                         char *err, size_t errlen) {
    *c = (text_corpus){0};
    char why[256], shown[400];
    path_for_message(path, shown, sizeof shown);
    if (read_file(path, &c->bytes, &c->n, why, sizeof why) != 0) {
        snprintf(err, errlen, "cannot read %s: %s", shown, why);
        return -1;
    }
    c->n_train = c->n / 10 * 9;
    if (val_bytes < (size_t)T + 1) val_bytes = (size_t)T + 1;
    if (c->n_train < (size_t)T + 1 || c->n - c->n_train < val_bytes) {
        char what[160];
        snprintf(what, sizeof what, "a window of --seq-len %d + 1 bytes", T);
        snprintf(err, errlen, "%s has %zu bytes: too few for a window of --seq-len %d + 1 bytes in its training part "
                 "(90%%) and %s in its validation part (10%%); use a file of at least %zu bytes", shown, c->n, T,
                 val_what ? val_what : what, text_corpus_min_bytes(T, val_bytes));
        text_corpus_free(c);
        return -1;
    }
    return 0;
}

int text_corpus_load(text_corpus *c, const char *path, int T, char *err, size_t errlen) {
    return text_corpus_load_for(c, path, T, (size_t)T + 1, NULL, err, errlen);
}

void text_corpus_free(text_corpus *c) {
    free(c->bytes);
    *c = (text_corpus){0};
}

/* tokens, targets [T] from the T+1 bytes at `window` */
static void take_window(const unsigned char *window, int *tokens, int *targets, int T) {
    for (int t = 0; t < T; t++) {
        tokens[t] = window[t];
        targets[t] = window[t + 1];
    }
}

void text_train_batch(const text_corpus *c, int *tokens, int *targets, int B, int T, uint64_t seed,
                      int step, int row0) {
    uint64_t starts = c->n_train - (size_t)T;   /* windows of T+1 bytes inside the training part */
    for (int b = 0; b < B; b++) {
        size_t start = batch_hash(seed, step, row0 + b, 0, STREAM_WINDOW) % starts;
        take_window(c->bytes + start, tokens + (size_t)b * T, targets + (size_t)b * T, T);
    }
}

int text_val_batches(const text_corpus *c, int B, int T) {
    size_t n_val = c->n - c->n_train;
    return (int)((n_val - 1) / ((size_t)B * T));
}

void text_val_batch(const text_corpus *c, int *tokens, int *targets, int B, int T, int k) {
    const unsigned char *val = c->bytes + c->n_train;
    for (int b = 0; b < B; b++)
        take_window(val + ((size_t)k * B + b) * T, tokens + (size_t)b * T, targets + (size_t)b * T, T);
}

double text_unigram_loss(const text_corpus *c) {
    double count[256] = {0}, loss = 0;
    for (size_t i = 0; i < c->n_train; i++) count[c->bytes[i]] += 1;
    for (int v = 0; v < 256; v++) count[v] = (count[v] + 1) / (c->n_train + 256.0);   /* add-one */
    for (size_t i = c->n_train + 1; i < c->n; i++) loss -= log(count[c->bytes[i]]);   /* every target */
    return loss / (double)(c->n - c->n_train - 1);
}

int text_largest_byte(const text_corpus *c, const char *also) {
    int largest = 0;
    for (size_t k = 0; k < c->n; k++)
        if (c->bytes[k] > largest) largest = c->bytes[k];
    for (const char *b = also ? also : ""; *b; b++)
        if ((unsigned char)*b > largest) largest = (unsigned char)*b;
    return largest;
}

double data_uniform(uint64_t seed, int step, int index) {
    return (double)(batch_hash(seed, step, index, 0, STREAM_UNIFORM) >> 11) * 0x1.0p-53;   /* 53 random bits */
}
