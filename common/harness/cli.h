/* cli.h: flag values checked the same way in every chapter. A bad value ends every rank with
 * one line from rank 0 naming the flag, the value and what is valid, and exit status 2. */
#pragma once
#include <stdint.h>
#include "cdefs.h"
#include "dtype.h"

C_BEGIN

/* An integer in [min, max]. */
int cli_int(const char *flag, const char *value, int min, int max);
/* A finite float in [min, max]. */
float cli_float(const char *flag, const char *value, float min, float max);
uint64_t cli_u64(const char *flag, const char *value);
/* One of the NULL-terminated `choices`; returns its index. */
int cli_choice(const char *flag, const char *value, const char *const *choices);
/* An element type by its name (dtype.h's dtype_name: fp32, bf16). */
dtype cli_dtype(const char *flag, const char *value);
/* The flag getopt_long could not parse (unknown, or missing its value): exit 2. */
void cli_unknown(int argc, char **argv, int optind_after) __attribute__((noreturn));

/* The longest path an output flag (--out, --dump, --ckpt-dir, --export) accepts: the run adds file names
 * (and --dump a ".tmp.<pid>.<random>" sibling) to it. */
#define CLI_MAX_DIR_PATH 400
/* An output directory, checked on world rank 0 and created there (mkdir -p). Collective over
 * the world: every rank calls it with the same flag. Refuses, with one line naming the flag and
 * the path and exit status 2 on every rank: an empty path, a path over CLI_MAX_DIR_PATH bytes or
 * with a control character, a path that exists and is not a directory, a directory that cannot
 * be created (e.g. /proc/x) or in which a file cannot be created. A refused path leaves no
 * directory behind. Call it after the other flags are checked, so that a run refused for
 * another reason creates nothing. (run_paths_check + run_paths_create of outputs.h, for one
 * directory and no lock; a run's outputs together go through run_model, run.h.) */
void cli_require_output_dir(const char *flag, const char *path);

C_END
