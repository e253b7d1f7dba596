/* mesh.c: the 5-D device mesh (see mesh.h for the rank layout) and the rules its degrees obey. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mesh.h"

static const char *dim_names[MESH_NDIMS] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};
static const char *dim_flags[MESH_NDIMS] = {"--pp", "--dp-replicate", "--dp-shard", "--cp", "--tp"};
const char *mesh_dim_name(int dim) { return dim_names[dim]; }

/* The tile Megatron pads each rank's vocabulary rows to (make_vocab_size_divisible_by). */
#define VOCAB_TILE 128

int vocab_padding_multiple(int vocab, int multiple, int tp) {
    if (multiple > 0) return multiple;
    return vocab >= VOCAB_TILE * tp ? VOCAB_TILE * tp : tp;
}

int vocab_padded_size(int vocab, int multiple, int tp) {
    int m = vocab_padding_multiple(vocab, multiple, tp);
    return (vocab + m - 1) / m * m;
}

static long long gcd(long long a, long long b) { return b ? gcd(b, a % b) : a; }
long long mesh_lcm(long long a, long long b) { return a / gcd(a, b) * b; }

const char *mesh_nearest(char *buf, size_t len, const char *what, long long value, long long step) {
    long long below = value / step * step, above = below + step;
    if (below > 0) snprintf(buf, len, "the nearest valid %ss are %lld and %lld", what, below, above);
    else snprintf(buf, len, "the nearest valid %s is %lld", what, above);
    return buf;
}

const char *mesh_size_name(const mesh_view *v, const char *flag, const char *field) { return v->plan ? field : flag; }

const char *mesh_refuse(char *why, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return why;
}

void mesh_require(mesh_requirements *r, mesh_rule rule) {
    if (r->n == MESH_MAX_RULES) {
        fprintf(stderr, "mesh_require: more than MESH_MAX_RULES (%d) rules\n", MESH_MAX_RULES);
        abort();
    }
    r->rule[r->n++] = rule;
}

/* 0 -> 1, and the one MESH_REST degree -> what the others leave of world. */
static const char *resolve(mesh_shape *s, int world, const mesh_requirements *r, int *rest, char *why, size_t len) {
    bool plan = r && r->names == MESH_NAMES_PLAN;
    *rest = -1;
    long long others = 1;
    for (int d = 0; d < MESH_NDIMS; d++) {
        if (s->degree[d] == 0) s->degree[d] = 1;
        if (s->degree[d] == MESH_REST && *rest < 0) {
            *rest = d;
            continue;
        }
        if (s->degree[d] < 1) {
            snprintf(why, len, "mesh degree %s=%d is not valid: every degree must be >= 1 (or -1 in one dimension: "
                     "what the others leave of the %s)", dim_names[d], s->degree[d], plan ? "GPUs" : "ranks");
            return why;
        }
        others *= s->degree[d];
    }
    if (*rest < 0) return NULL;
    if (world % others) {
        char list[160] = "";   /* the degrees above 1: "--pp 3 x --tp 2" */
        int n = 0;
        for (int d = 0; d < MESH_NDIMS; d++)
            if (d != *rest && s->degree[d] > 1)
                n += snprintf(list + n, sizeof list - (size_t)n, "%s%s %d", n ? " x " : "", plan ? dim_names[d] :
                              dim_flags[d], s->degree[d]);
        snprintf(why, len, "%s%d is not divisible by %s: %s would not be whole; use %s a multiple of %lld",
                 plan ? "--plan-gpus " : "NP=", world, list, dim_names[*rest], plan ? "--plan-gpus" : "NP", others);
        return why;
    }
    s->degree[*rest] = (int)(world / others);
    return NULL;
}

#define REFUSE(...) return (snprintf(why, len, __VA_ARGS__), why)

const char *mesh_check(mesh_shape *s, int world, const mesh_requirements *r, char *why, size_t len) {
    int rest;
    if (resolve(s, world, r, &rest, why, len)) return why;
    bool plan = r && r->names == MESH_NAMES_PLAN;
    long long product = 1;
    for (int d = 0; d < MESH_NDIMS; d++) product *= s->degree[d];
    int P = s->pp, R = s->dp_replicate, S = s->dp_shard, C = s->cp, T = s->tp;
    if (product != world && plan)
        REFUSE("pp %d x dp_replicate %d x dp_shard %d x cp %d x tp %d = %lld GPUs, not the %d of --plan-gpus", P, R, S,
               C, T, product, world);
    if (product != world)
        REFUSE("mesh pp=%d x dp_replicate=%d x dp_shard=%d x cp=%d x tp=%d = %lld ranks, but the world has %d: the "
               "product of the degrees must equal the number of ranks", P, R, S, C, T, product, world);
    if (!r) return NULL;

    /* Each degree as the user set it: "--tp 2", "NP=4" (the world, by default), "tp 2" (--plan-mesh). */
    mesh_view v = {.s = *s, .world = world, .plan = plan};
    for (int d = 0; d < MESH_NDIMS; d++) {
        if (plan) snprintf(v.degree[d], sizeof v.degree[d], "%s %d", dim_names[d], s->degree[d]);
        else if (d == rest && s->degree[d] == world) snprintf(v.degree[d], sizeof v.degree[d], "NP=%d", world);
        else snprintf(v.degree[d], sizeof v.degree[d], "%s %d", dim_flags[d], s->degree[d]);
    }
    for (int i = 0; i < r->n; i++)
        if (r->rule[i].check(&r->rule[i], &v, why, len)) return why;
    return NULL;
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
    unsigned in_group = 0, every = MESH_BIT(MESH_NDIMS) - 1;
    for (int i = 0; i < ndims; i++) in_group |= MESH_BIT(dims[i]);
    int color = mesh_rank_over(&m->shape, m->coord, every & ~in_group);
    int key = mesh_rank_over(&m->shape, m->coord, in_group);
    return comm_split(comm_world(), color, key, name);
}

int mesh_size_over(const mesh_shape *s, unsigned dims) {
    int size = 1;
    for (int d = 0; d < MESH_NDIMS; d++)
        if (dims & MESH_BIT(d)) size *= s->degree[d];
    return size;
}

int mesh_rank_over(const mesh_shape *s, const int coord[MESH_NDIMS], unsigned dims) {
    int rank = 0;   /* the key of mesh_group_over */
    for (int d = 0; d < MESH_NDIMS; d++)
        if (dims & MESH_BIT(d)) rank = rank * s->degree[d] + coord[d];
    return rank;
}

device_mesh *mesh_create(mesh_shape s, const mesh_requirements *r) {
    static device_mesh mesh;
    comm_group *w = comm_world();
    char why[512];
    if (mesh_check(&s, w->size, r, why, sizeof why)) comm_exit_usage("%s", why);
    memset(&mesh, 0, sizeof mesh);
    mesh.shape = s;
    mesh_coords_of(&s, w->rank, mesh.coord);
    for (int d = 0; d < MESH_NDIMS; d++) mesh.group[d] = mesh_group_over(&mesh, &d, 1, dim_names[d]);
    return &mesh;
}
