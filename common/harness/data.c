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
#include "data.h"
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
enum { STREAM_TOKEN = 0, STREAM_PAD_FLAG, STREAM_PAD_LEN, STREAM_FOLLOW, STREAM_SUCCESSOR };

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
