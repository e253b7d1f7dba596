/* data.h: seeded synthetic token batches with padding, and a text corpus as byte-level tokens.
 *
 * Each sequence of a [B, T] batch has tokens drawn from the vocabulary by a counter-based RNG
 * keyed by (seed, step, b, t), and targets = the next token. Some sequences end early: their
 * tail targets are IGNORE_INDEX (-100), so the loss's ignore index is exercised every step.
 * The same (seed, step) gives the same global batch whatever the parallel layout.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "cdefs.h"

C_BEGIN

/* tokens[B*T], targets[B*T] on the host. Returns the number of padded (ignored) targets. */
int synthetic_batch(int *tokens, int *targets, int B, int T, int V, uint64_t seed, int step);
/* A text corpus as byte-level tokens (vocabulary 256: a token is a byte of the file). The file
 * is split once: the first 90% of its bytes train, the rest validate.
 *   training batch of (seed, step): row r of the step's global batch is the window of T+1
 *     bytes starting at hash(seed, step, r) mod (train bytes - T): shuffled windows, the same
 *     global batch whatever the mesh (each rank takes its rows of it)
 *   validation batch k: the windows of T+1 bytes at (k B + b) T of the validation part, in
 *     order, so every evaluation sees the same text
 * tokens are a window's first T bytes, targets its last T (no padding). */
typedef struct {
    unsigned char *bytes;
    size_t n, n_train;        /* the file's bytes; the first n_train train, the rest validate */
} text_corpus;

/* 0, or -1 with one line in err (the file cannot be read, or either part is shorter than a
 * window of T+1 bytes). */
int text_corpus_load(text_corpus *c, const char *path, int T, char *err, size_t errlen);
/* The same, when the validation part must hold val_bytes (at least T + 1): evaluation reads
 * eval_batches x B x T + 1 bytes of it. The refusal names that need (`val_what`, e.g. "--eval-batches
 * 4 x --batch 16 x --seq-len 64 + 1 bytes"; NULL: a window of T + 1 bytes) and the fewest bytes a file
 * must have, text_corpus_min_bytes(T, val_bytes). */
int text_corpus_load_for(text_corpus *c, const char *path, int T, size_t val_bytes, const char *val_what,
                         char *err, size_t errlen);
/* The smallest file whose training part (90%, n / 10 * 9 bytes) holds a window of T + 1 bytes and
 * whose validation part (the rest) holds val_bytes. */
size_t text_corpus_min_bytes(int T, size_t val_bytes);
void text_corpus_free(text_corpus *c);
/* Rows row0 .. row0+B-1 of the global training batch of (seed, step) into tokens, targets [B, T]. */
void text_train_batch(const text_corpus *c, int *tokens, int *targets, int B, int T, uint64_t seed,
                      int step, int row0);
/* How many validation batches [B, T] the validation part holds. */
int text_val_batches(const text_corpus *c, int B, int T);
/* Validation batch k (0 <= k < text_val_batches) into tokens, targets [B, T]. */
void text_val_batch(const text_corpus *c, int *tokens, int *targets, int B, int T, int k);

/* The loss of the unigram model: every validation target predicted by the byte frequencies of
 * the training part (add-one smoothed), in nats per byte. A model that learned nothing about
 * context does no better. */
double text_unigram_loss(const text_corpus *c);

/* The largest byte value in the corpus and in `also` (a prompt; NULL: none): the token a
 * vocabulary of one token per byte must hold (it needs largest + 1 entries). */
int text_largest_byte(const text_corpus *c, const char *also);

/* A uniform number in [0, 1) keyed by (seed, step, index), from the same counter-based hash
 * (for sampling text from a trained model: the same draw on every run). */
double data_uniform(uint64_t seed, int step, int index);

/* Number of targets that are not IGNORE_INDEX. */
int count_valid_targets(const int *targets, int n);

C_END
