/* dump.h: --dump DIR, the exports for outside checks (docs/dump-format.md):
 *   DIR/init.safetensors     full parameters before step 1; __metadata__ holds the
 *                            configuration and optimizer settings as strings
 *   DIR/batch_K.safetensors  "tokens" and "targets", I32 [B, T], for each step K (1-based)
 *   DIR/grads_1.safetensors  full gradients of step 1
 *   DIR/losses.txt           one "step loss" line per step, %.9g; "step loss lr" when the
 *                            learning rate is scheduled (the lr that step's update used)
 * and, when the chapter set one (dump_set_run_options), a "run_options" metadata string in
 * init.safetensors and grads_1.safetensors: a JSON object with the chapter's settings that change
 * the arithmetic a replay must reproduce (chapter 07: {"float8": {...}}, the float8 recipe).
 * Rank 0 writes from host buffers. Every function returns 0, or -1 with a one-line reason that
 * dump_error() returns (nothing is printed: the caller reports it, once, as the bad input or the
 * failure it is).
 *
 * Atomic dumps: between dump_begin(DIR) and dump_commit() every write to DIR goes to a fresh
 * sibling directory DIR.tmp.<pid>.<random>; dump_commit() puts it in DIR's place in one rename (an
 * earlier dump in DIR, with its batch_K files of a longer run, is replaced whole), and
 * dump_abort() removes it. So DIR holds a complete dump or what it held before, never half of
 * one, whatever fails (a full disk, a refused input, a killed run: a killed run leaves only the
 * DIR.tmp.<pid>.<random> sibling). Without dump_begin the functions write straight into DIR.
 *
 * The harness (rank 0 only; each step's comm_require_all tells every rank):
 *   dump_begin(dir)                   after the flags are checked, before step 1
 *   dump_params(dir, "init...", ...), then per step dump_batch / dump_params("grads_1...") /
 *   dump_loss(dir, ...)               as before, with the same dir
 *   dump_commit()                     after the last step
 *   dump_abort()                      on a failure or refusal after dump_begin
 */
#pragma once
#include "cdefs.h"
#include "llama.h"

C_BEGIN

/* Starts an atomic dump into dir. Refuses (returns -1) a dir that exists and is not a directory,
 * or that holds files a dump does not write (dump_commit replaces the whole directory; those
 * files would be lost), and a parent that cannot be created. */
int dump_begin(const char *dir);
/* Puts the finished dump in place of dir. 0, or -1 (the dump is then aborted). */
int dump_commit(void);
/* Removes the unfinished dump, if any; dir is left as it was. Safe to call at any time. */
void dump_abort(void);
/* The reason of the last failure, one line ("" if none). */
const char *dump_error(void);

/* A chapter's own settings for the replay: a JSON object of at most 255 bytes (a safetensors
 * metadata value here; dump_params fails on a longer one), copied and written as the metadata
 * key "run_options" by every later dump_params. NULL (the default) writes no such key. The C code
 * does not parse it: the chapter writes valid JSON, the reader (tests/reference_torch.py) checks
 * it. Returns 0, or -1 when it is not NULL and does not look like an object ({...}) or is longer. */
int dump_set_run_options(const char *json);
/* Context parallelism under bf16 (chapter 06's blocks): attention was computed in n blocks of
 * chunks of each sequence (docs/dump-format.md's attention_blocks), written as that metadata key by
 * every later dump_params of a bf16 model; 0 (the default): the whole sequence, no key. */
void dump_set_attention_blocks(int n);

/* params[i] is the full host tensor of llama_param_spec(c, i). */
int dump_params(const char *dir, const char *file, const llama_config *c, const adamw_config *o,
                float *const *params);
int dump_batch(const char *dir, int step, const int *tokens, const int *targets, int B, int T);
int dump_loss(const char *dir, int step, double loss, double lr);   /* lr NAN: no third column;
                                                                     * step 1 truncates the file */

C_END
