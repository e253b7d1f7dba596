/* data.h: seeded synthetic token batches with padding.
 *
 * Each sequence of a [B, T] batch has tokens drawn from the vocabulary by a counter-based RNG
 * keyed by (seed, step, b, t), and targets = the next token. Some sequences end early: their
 * tail targets are IGNORE_INDEX (-100), so the loss's ignore index is exercised every step.
 * The same (seed, step) gives the same global batch whatever the parallel layout.
 */
#pragma once
#include <stdint.h>
#include "cdefs.h"

C_BEGIN

/* tokens[B*T], targets[B*T] on the host. Returns the number of padded (ignored) targets. */
int synthetic_batch(int *tokens, int *targets, int B, int T, int V, uint64_t seed, int step);
/* Number of targets that are not IGNORE_INDEX. */
int count_valid_targets(const int *targets, int n);

C_END
