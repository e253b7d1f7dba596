/* dump.h: --dump DIR, the exports for outside checks (DESIGN.md):
 *   DIR/init.safetensors     full parameters before step 1; __metadata__ holds the
 *                            configuration and optimizer settings as strings
 *   DIR/batch_K.safetensors  "tokens" and "targets", I32 [B, T], for each step K (1-based)
 *   DIR/grads_1.safetensors  full gradients of step 1
 *   DIR/losses.txt           one "step loss" line per step, %.9g
 * Rank 0 writes from host buffers; any failure prints one line and returns -1.
 */
#pragma once
#include "cdefs.h"
#include "llama.h"

C_BEGIN

/* params[i] is the full host tensor of llama_param_spec(c, i). */
int dump_params(const char *dir, const char *file, const llama_config *c, const adamw_config *o,
                float *const *params);
int dump_batch(const char *dir, int step, const int *tokens, const int *targets, int B, int T);
int dump_loss(const char *dir, int step, double loss);   /* step 1 truncates the file */

C_END
