/* mesh.h: the 5-D device mesh  pp x dp_replicate x dp_shard x cp x tp = world size.
 *
 * Ranks are laid out row-major with tp innermost (torchtitan's order), so the ranks of one
 * tensor-parallel group are neighbours (on one node, on the fastest links):
 *
 *   rank = (((pp_i * dp_replicate + dpr_i) * dp_shard + dps_i) * cp + cp_i) * tp + tp_i
 *
 * Each dimension has its group: the ranks whose other four coordinates are equal.
 */
#pragma once
#include "cdefs.h"
#include "comm.h"

C_BEGIN

enum { MESH_PP = 0, MESH_DP_REPLICATE, MESH_DP_SHARD, MESH_CP, MESH_TP, MESH_NDIMS };

typedef struct { int degree[MESH_NDIMS]; } mesh_shape;

typedef struct {
    mesh_shape shape;
    int coord[MESH_NDIMS];
    comm_group *group[MESH_NDIMS];   /* pp_group, dp_replicate_group, dp_shard_group, cp_group, tp_group */
} device_mesh;

const char *mesh_dim_name(int dim);   /* "pp", "dp_replicate", "dp_shard", "cp", "tp" */

/* 0 when the shape is valid for world_size; otherwise writes one line to err and returns -1. */
int mesh_validate(const mesh_shape *s, int world_size, char *err, size_t errlen);

/* Coordinates of `rank` (pure function, used by mesh_create and the tests). */
void mesh_coords_of(const mesh_shape *s, int rank, int coord[MESH_NDIMS]);

/* Validates (exit 2 with one line from rank 0 on failure), then builds one group per dimension.
 * Collective on the world. */
device_mesh *mesh_create(mesh_shape s);

/* A group spanning several dimensions at once, e.g. {MESH_DP_SHARD, MESH_CP} for FSDP. */
comm_group *mesh_group_over(device_mesh *m, const int *dims, int ndims, const char *name);

C_END
