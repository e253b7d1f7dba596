/* checkpoint.h: sharded checkpoints that load into any mesh, and the consolidated export.
 *
 * A checkpoint is a directory of plain safetensors files, one per rank that holds something,
 * plus an index that says which piece of which tensor lies where (README.md, "Checkpoints"):
 *
 *   DIR/latest                      "step_00000200": the newest complete checkpoint
 *   DIR/step_00000200/index.json    mesh, model, step, seed, the trainer's settings, every rank
 *                                   file's size and crc32, and for every tensor its global shape
 *                                   and its pieces
 *   DIR/step_00000200/rank_00003.safetensors   rank 3's pieces: "<tensor>/value", "/adam_m", "/adam_v";
 *                                   its metadata: the step, the settings' crc32, each piece's place
 *
 * Loading proves the checkpoint whole before it is used: every file it reads has the index's
 * size and crc32 and the index's step and settings; each piece lies where the index says; the
 * index's pieces tile every tensor exactly once; the index's step is the directory's; every value
 * is finite. Anything else is refused with one line naming the file and what is wrong.
 *
 * Each rank writes the slices it is the one to send (param_held_slice, params.h), so every
 * element of every tensor is stored exactly once, however the mesh replicates it. Loading reads
 * the index, not the writer's mesh: every rank takes from the pieces exactly the part it stores
 * in its own layout (another tp, dp_shard, pp, or one device), so a run can be resumed on a
 * different number of ranks ("resharding").
 *
 * A save is atomic: everything is written under DIR/step_N.tmp.<pid>.<random>, renamed to DIR/step_N once
 * every rank has finished, then DIR/latest is replaced (written aside and renamed). A run killed
 * at any point leaves the previous checkpoint as DIR/latest names it.
 *
 * Every function here is collective over the world and returns the same status on every rank;
 * on failure err holds one line (rank 0's names the first failing rank's reason).
 * The ranks must share the file system DIR lies on.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "model.h"

/* What a checkpoint records besides the tensors. trainer_json: the run's settings that must
 * match on resume (model dims, batch, lr schedule, data), written by the trainer, returned as
 * written (checkpoint.c does not read it). */
typedef struct {
    int step;                 /* the optimizer steps taken: the next step is step + 1 */
    uint64_t seed;
    char trainer_json[1024];
} checkpoint_meta;

/* Writes DIR/step_<NNNNNNNN>/ (NNNNNNNN = meta->step, 8 digits) with this model's parameters and
 * AdamW's m and v, then points DIR/latest at it. An existing step_N of the same step is replaced.
 * Leftovers of an interrupted save (DIR/step_*.tmp.*) are removed first. The test hook: when the
 * environment variable CKPT_TEST_CRASH_BEFORE_RENAME is set (on any rank), every rank exits with
 * status 3 once everything is written, before the rename. Returns 0; -2 when a value to save is
 * NaN or infinite (checked first: nothing on disk is touched; err names the tensor); -1 with one
 * line in err on any other failure. */
int checkpoint_save(const char *dir, const llama_model *m, const checkpoint_meta *meta, char *err, size_t errlen);

/* Reads the checkpoint DIR/latest names (or DIR itself when it is a step directory, one holding an
 * index.json), checks that it was written for m's model configuration (else -1, the line naming the
 * first value that differs) and that it is whole (above; an index of version 1, from before the
 * checksums, is refused), and loads the parameters and AdamW's m and v into m's own layout.
 * The gradients are left as they are. Fills *meta. Returns 0; 1 when DIR holds no checkpoint (it
 * does not exist, or holds neither latest nor index.json); -1 on error (a missing or corrupt file,
 * a piece that does not fit, ...), m then partly overwritten. */
int checkpoint_load(const char *dir, llama_model *m, checkpoint_meta *meta, char *err, size_t errlen);

/* Does DIR hold a checkpoint (DIR/latest, or DIR/index.json when DIR is a step directory)? Rank 0
 * looks and every rank gets its answer, so that a refusal built on it is the same everywhere.
 * Collective; checks nothing inside (checkpoint_load does). */
bool checkpoint_exists(const char *dir);

/* What would keep a run from using DIR as its --ckpt-dir, or NULL (rank 0 looks; collective:
 * every rank gets the one line, written into why[len]):
 *   - an entry the checkpoints own (latest, step_N, and the temporaries latest.tmp*,
 *     step_N.tmp.*) that is a symbolic link: the run writes, replaces and sweeps those names, and
 *     never does so through a link (its target may be another run's checkpoint or an archive);
 *   - with `will_save`, DIR being a checkpoint's own step folder (its name step_N, or holding an
 *     index.json): the saves would go inside it, and the next --resume would load it again.
 * DIR itself may be a link to a directory (a scratch folder): what lies inside it is checked. */
const char *checkpoint_dir_problem(const char *dir, bool will_save, char *why, size_t len);

/* zlib's crc32 of n bytes (any n): the checksum of the index, also the trainer's of its data file. */
uint32_t checkpoint_crc32(const void *data, size_t n);

/* Every parameter gathered to rank 0 and written there as one safetensors file with the
 * baseline's names and PyTorch's shapes (those of --dump's init.safetensors: loadable with
 * safetensors.torch.load_file into tests/reference_torch.py's model), the model configuration as
 * metadata. Written aside and renamed, so `path` is either the old file or the whole new one. */
int checkpoint_export(const char *path, const llama_model *m, char *err, size_t errlen);
