/* mesh.c: the 5-D device mesh (see mesh.h for the rank layout). */
#include <stdio.h>
#include <string.h>
#include "mesh.h"

static const char *dim_names[MESH_NDIMS] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};
const char *mesh_dim_name(int dim) { return dim_names[dim]; }

int mesh_validate(const mesh_shape *s, int world_size, char *err, size_t errlen) {
    long product = 1;
    for (int d = 0; d < MESH_NDIMS; d++) {
        if (s->degree[d] < 1) {
            snprintf(err, errlen, "mesh degree %s=%d is not valid: every degree must be >= 1",
                     dim_names[d], s->degree[d]);
            return -1;
        }
        product *= s->degree[d];
    }
    if (product != world_size) {
        snprintf(err, errlen,
                 "mesh pp=%d x dp_replicate=%d x dp_shard=%d x cp=%d x tp=%d = %ld ranks, but "
                 "the world has %d: the product of the degrees must equal the number of ranks",
                 s->degree[0], s->degree[1], s->degree[2], s->degree[3], s->degree[4], product,
                 world_size);
        return -1;
    }
    return 0;
}

/* rank = (((pp*DPR + dpr)*DPS + dps)*CP + cp)*TP + tp: peel the innermost (tp) first. */
void mesh_coords_of(const mesh_shape *s, int rank, int coord[MESH_NDIMS]) {
    for (int d = MESH_NDIMS - 1; d >= 0; d--) {
        coord[d] = rank % s->degree[d];
        rank /= s->degree[d];
    }
}

comm_group *mesh_group_over(device_mesh *m, const int *dims, int ndims, const char *name) {
    /* Ranks that agree on every coordinate outside `dims` form one group (the colour);
     * inside it they are ordered row-major over `dims` (the key). */
    int in_group[MESH_NDIMS] = {0};
    for (int i = 0; i < ndims; i++) in_group[dims[i]] = 1;
    int color = 0, key = 0;
    for (int d = 0; d < MESH_NDIMS; d++) {
        if (in_group[d]) key = key * m->shape.degree[d] + m->coord[d];
        else color = color * m->shape.degree[d] + m->coord[d];
    }
    return comm_split(comm_world(), color, key, name);
}

device_mesh *mesh_create(mesh_shape s) {
    static device_mesh mesh;
    comm_group *w = comm_world();
    char err[256];
    if (mesh_validate(&s, w->size, err, sizeof err) != 0) comm_exit_usage("%s", err);
    memset(&mesh, 0, sizeof mesh);
    mesh.shape = s;
    mesh_coords_of(&s, w->rank, mesh.coord);
    for (int d = 0; d < MESH_NDIMS; d++) {
        char name[32];
        snprintf(name, sizeof name, "%s", dim_names[d]);
        mesh.group[d] = mesh_group_over(&mesh, &d, 1, name);
    }
    return &mesh;
}
