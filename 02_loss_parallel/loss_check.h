/* loss_check.h: the vocabulary-parallel cross-entropy on its own, on the cases a training
 * batch does not reach (part of the chapter's --check).
 *
 *   1. logits scaled to 1e4, a target in every rank's shard, two targets of -100:
 *      the loss and the gathered gradient against the plain cross-entropy of the full rows
 *      (llama_kernels.h, the baseline's loss) on rank 0;
 *   2. every target -100: loss exactly 0 and every gradient exactly 0 (not NaN).
 *   With a padded vocabulary (Vp > V), the padding columns hold the largest logits of each row,
 *   so only the mask keeps the loss right, and their gradient must be exactly 0.
 *
 * Collective over tp; rank 0 records the comparisons in parity.h, so they count in the run's
 * verdict. Everything it allocates is freed before it returns.
 */
#pragma once
#include "comm.h"

/* V the vocabulary, Vp its padded size (tp divides it). */
void loss_check_run(comm_group *tp, int V, int Vp);
