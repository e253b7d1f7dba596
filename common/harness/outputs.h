/* outputs.h: every path a run writes, checked before the first step, and one writer per output
 * directory. Written once for every chapter: run_model (run.h) calls it with --out and --dump
 * plus the chapter's own paths (run_model_paths: chapter 08's --data, --ckpt-dir, --export);
 * chapter 00 and cli_require_output_dir call it directly.
 *
 * run_paths_check (nothing is created; collective, rank 0 decides): each output path can be
 * created and written (not empty, at most CLI_MAX_DIR_PATH bytes, no name over NAME_MAX, no
 * control character; a directory where a directory is needed, a regular file or nothing where a
 * file is; its first existing ancestor a directory in which a file can be created: not /proc, not
 * a read-only place); no output is the same file as an input (st_dev/st_ino when both exist, the
 * resolved parent + name otherwise) nor the same path as another output; nothing lies inside a
 * directory the run owns whole (--dump, replaced at the end; --ckpt-dir, whose files the
 * checkpoints own: DIR/latest, DIR/step_N). A refusal: one line from rank 0 naming the flag, the
 * path and the reason, exit status 2 on every rank.
 *
 * run_paths_create: the directories marked `create` are made (mkdir -p) and probed, and those
 * marked `lock` are locked: rank 0 takes flock(DIR/.lock) (its pid and host written inside) and
 * holds it until the process ends (the file is removed then); a file marked `lock` (an export)
 * is locked the same way through DIR/.NAME.lock beside it. An output another run holds is
 * refused with one line naming it and the other run's pid, exit 2: one writer per output,
 * whatever the flags (--out, --dump, --ckpt-dir with saves, --export). On any refusal, and on any
 * later exit through comm_exit_usage, the directories this call created are removed again when
 * they are still empty, so a refused run leaves nothing behind. Collective.
 */
#pragma once
#include <stdbool.h>
#include "cdefs.h"

C_BEGIN

typedef enum {
    RUN_PATH_INPUT,        /* a file the run reads (--data): only compared with the outputs  */
    RUN_PATH_OUTPUT_DIR,   /* a directory the run writes into (--out, --dump, --ckpt-dir)     */
    RUN_PATH_OUTPUT_FILE   /* a file the run writes aside and renames into place (--export)  */
} run_path_kind;

typedef struct run_path_s {
    const char *flag;      /* "--out": how the message names it                              */
    const char *path;      /* NULL: not used this run (skipped)                               */
    run_path_kind kind;
    const char *owned;     /* a directory whose every file the run owns: why nothing else may
                            * lie inside it ("which the dump replaces whole"); NULL: none    */
    bool create, lock;     /* directories: made by run_paths_create; locked there            */
} run_path;

void run_paths_check(const run_path *paths, int n);
void run_paths_create(const run_path *paths, int n);

C_END
