/* mesh.c: the 5-D device mesh (see mesh.h for the rank layout) and the rules its degrees obey. */
#include <stdio.h>
#include <string.h>
#include "mesh.h"

static const char *dim_names[MESH_NDIMS] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};
static const char *dim_flags[MESH_NDIMS] = {"--pp", "--dp-replicate", "--dp-shard", "--cp", "--tp"};
const char *mesh_dim_name(int dim) { return dim_names[dim]; }

/* How a refusal names the sizes: a run's flags, or the model's fields (the calculator takes them
 * from a preset as often as from its --plan-* flags). */
typedef struct {
    const char *heads, *kv_heads, *ffn, *vocab, *vocab_multiple, *seq, *layers, *virtual_stages, *microbatches;
} size_names;
static const size_names run_names = {"--n-heads", "--n-kv-heads", "--ffn-dim", "--vocab", "--vocab-multiple",
                                     "--seq-len", "--n-layers", "--virtual-stages", "--microbatches"};
static const size_names plan_names = {"n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "vocab multiple", "seq_len",
                                      "n_layers", "virtual stages", "microbatches"};

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
static long long lcm(long long a, long long b) { return a / gcd(a, b) * b; }

/* "the nearest valid sizes are 254 and 256": the multiples of step on either side of value (only
 * the one above when none lies below). */
static const char *nearest(char *buf, size_t len, const char *what, long long value, long long step) {
    long long below = value / step * step, above = below + step;
    if (below > 0) snprintf(buf, len, "the nearest valid %ss are %lld and %lld", what, below, above);
    else snprintf(buf, len, "the nearest valid %s is %lld", what, above);
    return buf;
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
    char name[MESH_NDIMS][32];
    for (int d = 0; d < MESH_NDIMS; d++) {
        if (plan) snprintf(name[d], sizeof name[d], "%s %d", dim_names[d], s->degree[d]);
        else if (d == rest && s->degree[d] == world) snprintf(name[d], sizeof name[d], "NP=%d", world);
        else snprintf(name[d], sizeof name[d], "%s %d", dim_flags[d], s->degree[d]);
    }
    const size_names *n = plan ? &plan_names : &run_names;
    const char *tp = name[MESH_TP], *cp = name[MESH_CP], *pp = name[MESH_PP];
    char valid[96];

    /* tp (01, 02): whole heads, key/value heads, ffn units and vocabulary rows on each tp rank */
    if (r->n_heads % T)
        REFUSE("%s does not divide %s %d: each tp rank computes whole query heads; use a tp that divides %d", tp,
               n->heads, r->n_heads, r->n_heads);
    if (r->n_kv_heads % T)
        REFUSE("%s does not divide %s %d: each tp rank holds whole key/value heads; use a tp that divides %d", tp,
               n->kv_heads, r->n_kv_heads, r->n_kv_heads);
    if (r->ffn_dim % T)
        REFUSE("%s does not divide %s %d: w1 and w3 are split by rows, w2 by columns; %s", tp, n->ffn, r->ffn_dim,
               nearest(valid, sizeof valid, "size", r->ffn_dim, T));
    /* the vocabulary padded first (vocab_padded_size): only a --vocab-multiple that tp does not
     * divide can leave it unsplittable; the default rule's multiple is a multiple of tp */
    int Vp = r->vocab_size ? vocab_padded_size(r->vocab_size, r->vocab_multiple, T) : 0;
    if (Vp % T)
        REFUSE("%s does not divide %s %d padded to a multiple of %s %d (%d rows): the embedding and the output "
               "layer are split by vocabulary rows; use a %s that is a multiple of %d", tp, n->vocab, r->vocab_size,
               n->vocab_multiple, r->vocab_multiple, Vp, n->vocab_multiple, T);

    /* the sequence: 2 cp chunks (06's zigzag), each cp rank's rows split over tp (03); the
     * nearest lengths offered satisfy both */
    long long seq_step = lcm(C > 1 ? 2 * C : 1, r->sequence_parallel ? (long long)C * T : 1);
    if (C > 1 && r->seq_len % (2 * C))
        REFUSE("%s %d cannot be split over %s: each cp rank holds 2 chunks of seq_len / (2 x cp) rows; %s", n->seq,
               r->seq_len, cp, nearest(valid, sizeof valid, "length", r->seq_len, seq_step));
    if (r->sequence_parallel && r->seq_len % ((long long)C * T)) {
        const char *no_sp = plan ? "" : " (or --no-sp)";
        if (C > 1)
            REFUSE("%s %d cannot be split over %s x %s: each cp rank holds seq_len / cp rows and sequence "
                   "parallelism splits them over tp; %s%s", n->seq, r->seq_len, cp, tp,
                   nearest(valid, sizeof valid, "length", r->seq_len, seq_step), no_sp);
        REFUSE("%s %d cannot be split over %s: sequence parallelism gives each tp rank seq_len / tp tokens of every "
               "sequence; %s%s", n->seq, r->seq_len, tp, nearest(valid, sizeof valid, "length", r->seq_len, seq_step),
               no_sp);
    }

    /* cp (06's all-to-all): the heads of a tp rank dealt out whole to the cp ranks */
    if (r->heads_over_cp && ((r->n_heads / T) % C || (r->n_kv_heads / T) % C))
        REFUSE("%s deals whole heads out to the %s ranks, but a tp rank holds %d heads and %d kv heads (%s %d, %s %d "
               "over %s): both must divide by %d", plan ? "all-to-all attention" : "--cp-method alltoall", cp,
               r->n_heads / T, r->n_kv_heads / T, n->heads, r->n_heads, n->kv_heads, r->n_kv_heads, tp, C);

    /* pp (05): whole layers in each of the pp x virtual_stages chunks */
    int V = r->virtual_stages > 0 ? r->virtual_stages : 1, chunks = P * V, L = r->n_layers;
    bool even = L % chunks == 0;
    bool short_ends = r->short_end_chunks && chunks >= 2 && (L + 2) % chunks == 0 && (L + 2) / chunks >= 2;
    if (!even && !short_ends && r->short_end_chunks)
        REFUSE("%d layers cannot be cut into pp %d x %d virtual stages: neither %d nor %d (one layer fewer in the "
               "first and the last chunk) is a multiple of %d", L, P, V, L, L + 2, chunks);
    if (!even && !short_ends)
        REFUSE("%s %d cannot be split evenly into %s x %s %d = %d chunks: use a multiple of %d layers", n->layers, L,
               pp, n->virtual_stages, V, chunks, chunks);

    /* the batch (04, 05): the same number of sequences on every data rank, in equal microbatches */
    int dp = R * S, M = r->microbatches > 0 ? r->microbatches : 1;
    if (r->batch % dp) {
        if (plan)
            REFUSE("the global batch of %lld sequences is not divisible by dp_replicate %d x dp_shard %d = %d: each "
                   "data rank takes an equal share", r->batch, R, S, dp);
        REFUSE("--batch %lld is not divisible by the data-parallel degree dp_replicate %d x dp_shard %d = %d: each "
               "data rank takes batch / %d sequences", r->batch, R, S, dp, dp);
    }
    long long per_rank = r->batch / dp;
    if (per_rank % M) {
        if (dp == 1)
            REFUSE("--batch %lld is not divisible by %s %d: each microbatch takes batch / %d sequences", r->batch,
                   n->microbatches, M, M);
        REFUSE("--batch %lld over dp_replicate %d x dp_shard %d leaves %lld sequences a data rank, not divisible by "
               "%s %d: each microbatch takes an equal share", r->batch, R, S, per_rank, n->microbatches, M);
    }
    if (r->microbatch_size > 0 && per_rank % r->microbatch_size)
        REFUSE("the global batch of %lld sequences over dp_replicate %d x dp_shard %d leaves %lld a data rank: not "
               "whole microbatches of %d sequences", r->batch, R, S, per_rank, r->microbatch_size);
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
