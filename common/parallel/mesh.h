/* mesh.h: the 5-D device mesh  pp x dp_replicate x dp_shard x cp x tp = world size, and the one
 * function that checks its degrees against the model and the batch (mesh_check, running the
 * rules the techniques contribute).
 *
 * Ranks are laid out row-major with tp innermost (torchtitan's order), so the ranks of one
 * tensor-parallel group are neighbours (on one node, on the fastest links):
 *
 *   rank = (((pp_i * dp_replicate + dpr_i) * dp_shard + dps_i) * cp + cp_i) * tp + tp_i
 *
 * Each dimension has its group: the ranks whose other four coordinates are equal.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "cdefs.h"
#include "comm.h"

C_BEGIN

enum { MESH_PP = 0, MESH_DP_REPLICATE, MESH_DP_SHARD, MESH_CP, MESH_TP, MESH_NDIMS };

/* The degrees, by name or by index: (mesh_shape){.dp_shard = 2, .tp = 4}. A degree left 0 is 1;
 * one degree may be MESH_REST, what the others leave of the world (torchtitan's -1). mesh_check
 * replaces both by the degree they stand for. */
typedef union {
    struct { int pp, dp_replicate, dp_shard, cp, tp; };
    int degree[MESH_NDIMS];
} mesh_shape;
#define MESH_REST (-1)

typedef struct {
    mesh_shape shape;
    int coord[MESH_NDIMS];
    comm_group *group[MESH_NDIMS];   /* pp_group, dp_replicate_group, dp_shard_group, cp_group, tp_group */
} device_mesh;

/* Whose flags a refusal names: a run's (--tp 2, --n-heads 4, NP; a degree taken from the world
 * alone is "NP=4"), or chapter 08's --plan calculator's (tp 2, --plan-heads 4, --plan-gpus). */
typedef enum { MESH_NAMES_RUN = 0, MESH_NAMES_PLAN } mesh_names;

/* What a rule sees: the degrees resolved (no 0, no MESH_REST) and how to name them. */
typedef struct {
    mesh_shape s;
    int world;
    bool plan;                          /* MESH_NAMES_PLAN: the calculator's names              */
    char degree[MESH_NDIMS][32];        /* each degree as the user set it: "--tp 2", "NP=4" (taken
                                         * from the world), "tp 2" (the calculator's)           */
} mesh_view;

/* One divisibility rule of a technique, as data: its check and the sizes it reads (plain numbers:
 * parallel/ sits below model/). A technique contributes its rules (tp_mesh_rule in chapter 01,
 * pipeline_layers_rule and pipeline_microbatches_rule in 05, ...) and mesh_check runs them in the order they were added, so a new
 * technique brings its own rule without a field here (tests/test_mesh.c adds one). check returns
 * NULL when the degrees admit the sizes; otherwise `why`, filled with one line that names the
 * value, the rule and what is valid (mesh_refuse). */
typedef struct mesh_rule mesh_rule;
struct mesh_rule {
    const char *(*check)(const mesh_rule *rule, const mesh_view *v, char *why, size_t len);
    long long size[4];                  /* what the rule's constructor documents               */
    bool option;                        /*   and one switch                                     */
};

#define MESH_MAX_RULES 16
typedef struct {
    mesh_rule rule[MESH_MAX_RULES];
    int n;
    mesh_names names;
} mesh_requirements;

/* Appends a rule (a programming error, aborting, beyond MESH_MAX_RULES). */
void mesh_require(mesh_requirements *r, mesh_rule rule);

/* For rules: a size's name in a refusal (run: the flag, "--n-heads"; plan: the field, "n_heads"),
 * the refusal itself (printf into why; returns why), and "the nearest valid sizes are 254 and 256"
 * (the multiples of step on either side of value, into buf). */
const char *mesh_size_name(const mesh_view *v, const char *flag, const char *field);
const char *mesh_refuse(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *mesh_nearest(char *buf, size_t len, const char *what, long long value, long long step);
long long mesh_lcm(long long a, long long b);

/* Vocabulary padding (02; Megatron-LM's --make-vocab-size-divisible-by, times tp): the embedding
 * and the output layer, split by vocabulary rows over tp, hold the vocabulary rounded up to a
 * multiple of M, rows [vocab, padded) being padding that no token reaches and no logit of which the
 * loss lets through. M is `multiple` when given (> 0), else the default: 128 x tp when the
 * vocabulary has at least that many entries (each rank's rows a whole number of 128-row GEMM tiles,
 * Megatron's choice), else tp (a toy vocabulary: the fewest padded rows that split evenly).
 * Examples: 250 at tp 4 -> M 4, 252; 1,000 at tp 3 -> M 384, 1,152; 128,256 at tp 3 -> 128,256.
 * Returns M, or the padded size. */
int vocab_padding_multiple(int vocab, int multiple, int tp);
int vocab_padded_size(int vocab, int multiple, int tp);

const char *mesh_dim_name(int dim);   /* "pp", "dp_replicate", "dp_shard", "cp", "tp" */

/* The one check of a mesh, used by every chapter, chapter 08's trainer and its --plan calculator
 * alike, so they cannot disagree. Replaces the 0 and MESH_REST degrees of *s by what they stand
 * for on `world` ranks, then checks that the degrees multiply to `world` and runs r's rules in
 * their order (r NULL: only the world). Returns NULL when the mesh is valid; otherwise `why`, filled with one
 * line that names the value, the rule and what is valid. */
const char *mesh_check(mesh_shape *s, int world, const mesh_requirements *r, char *why, size_t len);

/* Coordinates of `rank` (pure function, used by mesh_create and the tests). */
void mesh_coords_of(const mesh_shape *s, int rank, int coord[MESH_NDIMS]);

/* mesh_check on the world (exit 2 with its line from rank 0 on a refusal), then one group per
 * dimension. Collective on the world. */
device_mesh *mesh_create(mesh_shape s, const mesh_requirements *r);

/* A group spanning several dimensions at once, e.g. {MESH_DP_SHARD, MESH_CP} for FSDP. Its ranks
 * are ordered row-major over `dims` (the last the fastest), whatever order `dims` lists them in. */
comm_group *mesh_group_over(device_mesh *m, const int *dims, int ndims, const char *name);

/* A set of dimensions as bits, e.g. MESH_BIT(MESH_DP_SHARD) | MESH_BIT(MESH_CP): FSDP's shard
 * group over dp_shard x cp (chapter 08), which the parameter table must know without a group. */
#define MESH_BIT(dim) (1u << (dim))
/* The size of the group over the dimensions `dims` (the product of their degrees) and a rank's
 * place in it (row-major over them, mesh_group_over's order): pure functions of the shape and the
 * rank's coordinates, so a table can be laid out for any rank without a communicator. */
int mesh_size_over(const mesh_shape *s, unsigned dims);
int mesh_rank_over(const mesh_shape *s, const int coord[MESH_NDIMS], unsigned dims);

C_END
