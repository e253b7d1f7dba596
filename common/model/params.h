/* params.h: the model's parameters as this rank holds them, placed on the device mesh.
 *
 * Every tensor of llama.h's table has a name, a global shape and a placement: how it is split
 * over the tensor-parallel dimension of the mesh (shard.h: replicated, by rows, by columns).
 * Over dp_shard a block may be sharded (FSDP, chapter 04), or over dp_shard x cp (chapter 08, as
 * torchtitan: the cp ranks hold the same parameters); over pp each stage stores only its layers'
 * tensors (chapter 05); otherwise the context dimension holds copies. A rank stores its slice of
 * every tensor, one after the other, in four blocks: parameters, gradients and AdamW's m and v.
 *
 * Tensors are found by what they are, never by position:
 *     param_index(t, P_WQ, layer)           the index of layer `layer`'s wq
 *     param_index(t, P_OUTPUT, -1)          the output layer (tensors outside the layers: -1)
 *     param_unit(t, t->grads, l)            named pointers to layer l's gradients
 *
 * The single-device baseline is the table with no mesh: every slice is the whole tensor.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "cdefs.h"
#include "llama.h"
#include "mesh.h"
#include "shard.h"

C_BEGIN

/* The four blocks a rank stores, and how each is laid out. */
typedef enum { PARAM_VALUES = 0, PARAM_GRADS, PARAM_OPTIM, PARAM_NBLOCKS } param_block;   /* OPTIM: m and v */
typedef enum {
    STORE_WHOLE = 0,          /* every tensor's whole tp slice (replicated over the data ranks) */
    STORE_SHARD,              /* only this rank's dp shard of each tensor (ZeRO / FSDP), over the
                               * table's shard_dims                                              */
    STORE_WHOLE_SHARD_VALID   /* whole tp slices, of which only this rank's dp shard is up to
                               * date (ZeRO-1's gradients after their reduce-scatter)            */
} block_storage;

/* One tensor: what it is, where it is, and which part of it this rank holds.
 * Over tp it is split as tp_layout says; over the shard group (dp_shard, or dp_shard x cp: S ranks)
 * when a block is sharded, its first dimension in PyTorch's terms is split FSDP2-style: the rows of
 * a matrix, the elements of a vector, in S chunks of ceil(units / S), the last ones padded with
 * zeros. */
typedef struct {
    param_spec spec;          /* name, kind, layer, global [rows, cols] (llama.h)              */
    shard_layout tp_layout;   /* how it is split over the mesh's tp dimension                 */
    int r0, nr, c0, nc;       /* this rank's tp slice: rows [r0, r0+nr) x columns [c0, c0+nc) */
    int units, width;         /* the tp slice as stored, [units, width]: [nr, nc], or [nc, 1]
                               * (vector); the vocabulary's (02) has Vp/tp rows, of which the
                               * first nr are real and the rest padding (param_split_rows)     */
    int real_units;           /* the tp slice's units that hold the tensor: units but for the
                               * vocabulary's padding rows (zero, never updated)               */
    unsigned shard_dims;      /* the mesh dimensions a sharded block splits it over: the
                               * table's shard_dims, less those its rows are split over already
                               * (09's experts: param_shard_dims_of)                          */
    int shard_ranks, shard_rank;   /* its shard group's size (S, or S / ep for an expert) and
                               * this rank's place in it                                       */
    bool held_whole;          /* an expert whose shard group is this rank alone (S = ep): each
                               * rank of the table's shard group holds its own whole, a sharded
                               * block stores it whole, and FSDP neither gathers nor reduces it */
    int shard_units;          /* units per dp shard, ceil(units / shard_ranks) (units when held_whole) */
    int own_first, own_units; /* this rank's real units of the tp slice (own_units may be 0)   */
    size_t offset_whole;      /* where it starts in a whole block (floats)                     */
    size_t offset_shard;      /* where its shard starts in a shard block (floats)              */
    bool here;                /* stored on this rank: false for another pipeline stage's tensors
                               * (then it occupies nothing and its pointers are NULL)            */
} param_tensor;

/* The mesh dimensions a sharded block splits a tensor of `kind` over, on a mesh of `shape`: the
 * shard group's (shard_dims: dp_shard, or dp_shard x cp), less the dimensions the experts' rows
 * are split over already (expert_dims, 09; those of one rank split nothing): the ranks there hold
 * different experts, so an expert's weight is shared only with the rest of the shard group, the
 * ranks that hold the same experts (torchtitan's dp_shard_mod_ep). None left (ep takes the whole
 * shard group): each rank holds its experts whole (param_tensor.held_whole). Every other tensor:
 * shard_dims. */
unsigned param_shard_dims_of(const mesh_shape *shape, param_kind kind, unsigned shard_dims, unsigned expert_dims);
/* Whether a tensor of `kind` is held whole in a sharded block on a mesh of `shape`: an expert's
 * weight whose shard group (param_shard_dims_of) has one rank. */
bool param_held_whole(const mesh_shape *shape, param_kind kind, unsigned shard_dims, unsigned expert_dims);
/* Whether FSDP's collectives move tensor x on this rank: stored here (this pipeline stage's) and
 * split over its shard group (not held whole). Chapter 04's units and its counts, and chapter 09's
 * traffic formulas, all ask this. */
static inline bool param_sharded_here(const param_tensor *x) { return x->here && !x->held_whole; }

/* Pointers to the tensors of one unit inside one of the blocks (params, grads, adam_m, adam_v),
 * by name or by param_kind. A unit is a layer (its nine tensors; the others NULL) or the model's
 * ends (tok_embeddings, norm and output). */
typedef union {
    struct {
        float *tok_embeddings;    /* [Vl, D]      the ends                                      */
        float *attention_norm;    /* [D]          a layer                                       */
        float *wq;                /* [Hl*hd, D]   (Hl = H on one device, H/tp under Megatron TP) */
        float *wk, *wv;           /* [Hkvl*hd, D]                                               */
        float *wo;                /* [D, Hl*hd]                                                 */
        float *ffn_norm;          /* [D]                                                        */
        float *w1;                /* [Fl, D]                                                    */
        float *w2;                /* [D, Fl]                                                    */
        float *w3;                /* [Fl, D]                                                    */
        float *norm;              /* [D]          the ends                                      */
        float *output;            /* [Vl, D]      the ends                                      */
        float *router;            /* [E, D]       a mixture-of-experts layer (chapter 09)        */
        float *expert_w1;         /* [El*F_e, D]  this rank's El experts, one after the other    */
        float *expert_w2;         /* [El*D, F_e]                                                */
        float *expert_w3;         /* [El*F_e, D]                                                */
    };
    float *of[P_NKINDS];
} unit_weights;

typedef struct {
    llama_config c;
    device_mesh *mesh;        /* NULL: a single device, every slice is the whole tensor       */
    comm_group *tp;           /* the mesh's tp group (NULL without a mesh)                    */
    unsigned shard_dims;      /* the mesh dimensions a sharded block is split over (MESH_BIT):
                               * dp_shard (04), or dp_shard and cp (08)                        */
    unsigned expert_dims;     /* the mesh dimensions the experts' weights are split over by rows,
                               * whole experts to each rank (09's expert parallelism; 0: none) */
    int n;                    /* number of tensors: llama_num_params(c)                       */
    param_tensor *t;          /* [n], in llama.h's order                                      */
    block_storage storage[PARAM_NBLOCKS];
    size_t whole_numel, shard_numel;   /* floats of a whole block, of a shard block           */
    /* In the blocks the tensors lie unit by unit (layer 0, ..., layer L-1, then the ends:
     * tok_embeddings, norm, output), so a unit's tensors are one contiguous range; in a shard
     * block those split over the table's shard group first, then 09's experts, split over their
     * own shard group (param_shard_dims_of) or held whole (held_whole), so that each part a unit's
     * collectives move is one contiguous range too (dp_units.h's unit_part). */
    float *params, *grads, *adam_m, *adam_v;   /* MEM_PARAMS, MEM_GRADS, MEM_OPTIM, MEM_OPTIM */
} param_table;

/* Which part of its unit a sharded block stores tensor x in, and FSDP moves it in (dp_units.h's
 * unit_part): 0, split over the table's shard group; 1, over a narrower one (09's experts), or
 * held whole. */
static inline int param_shard_part(const param_table *t, const param_tensor *x) { return x->shard_dims != t->shard_dims; }

/* The rows tensor `s` has when split over tp ranks under `layout`: its own, except the
 * vocabulary's two tensors split by rows (02), which hold the padded vocabulary
 * (llama_padded_vocab), rows [vocab_size, padded) being zero padding on the last ranks. */
int param_split_rows(const llama_config *c, param_spec s, shard_layout layout, int tp);

/* This rank's slice of tensor s before any data-parallel sharding, rows [r0, r0+nr) x columns
 * [c0, c0+nc) as shard_slice gives it (the vocabulary's padding rows included): an expert's weight
 * in whole experts over the mesh dimensions expert_dims (09), any other tensor over the mesh's tp
 * group as tp_layout says (mesh NULL: whole). Returns the ranks it is split over; *even is false
 * when they do not divide it (a programming error for the caller to report). */
int param_rank_slice(const llama_config *c, const device_mesh *mesh, unsigned expert_dims, shard_layout tp_layout,
                     param_spec s, int *r0, int *nr, int *c0, int *nc, bool *even);

/* The mesh dimensions a sharded block is split over, from a plan's shard_dims: those (MESH_BIT),
 * or dp_shard alone when 0 (a plan that does not say: chapter 04's FSDP). */
static inline unsigned param_shard_dims(unsigned dims) { return dims ? dims : MESH_BIT(MESH_DP_SHARD); }

/* Allocates this rank's slices (layout[kind] over the mesh's tp group; mesh NULL: whole
 * tensors; storage[block] whole or sharded, NULL: all whole; a sharded block split over the mesh
 * dimensions shard_dims, MESH_BIT(MESH_DP_SHARD) | MESH_BIT(MESH_CP) for FSDP over dp_shard x cp,
 * 0: dp_shard alone; the experts' weights split by rows over the dimensions expert_dims instead
 * of tp, 0: not split; here[i]: tensor i is stored on this rank, NULL: all are) and initialises them
 * from
 * (seed, name, global index): exactly the baseline's values. A layout that does not divide a
 * tensor is a programming error here: a plan validates the sizes it needs (with a message naming
 * the flags) before it asks for the table. */
param_table *param_table_create(const llama_config *c, device_mesh *mesh,
                                const shard_layout layout[P_NKINDS],
                                const block_storage storage[PARAM_NBLOCKS], unsigned shard_dims,
                                unsigned expert_dims, const bool *here, uint64_t seed);
void param_table_free(param_table *t);

/* The index of the tensor of `kind` in `layer` (-1 for the embedding, final norm and output). */
int param_index(const param_table *t, param_kind kind, int layer);
/* Tensor i inside a block (t->params, t->grads, t->adam_m or t->adam_v): its whole tp slice, or
 * its shard when that block is sharded. */
float *param_in(const param_table *t, float *block, int i);
/* Which of the four blocks `block` is, and how it is stored. */
block_storage param_storage_of(const param_table *t, const float *block);
/* The tensors of unit u (layer u, or the ends for u == L) in the blocks' order; returns how many
 * (llama_unit_tensors), at most PARAM_UNIT_MAX. */
#define PARAM_UNIT_MAX LLAMA_UNIT_MAX_TENSORS
int param_unit_tensors(const param_table *t, int u, int idx[PARAM_UNIT_MAX]);
/* The floats of unit u (its tensors one after the other) in a block: offset and count (in a
 * shard block the tensors split over the shard group first: they are the range's first
 * floats). */
void param_unit_range(const param_table *t, const float *block, int u, size_t *offset, size_t *count);
/* The tensors of unit u inside a block: layer u for u < L, the ends for u == L. */
unit_weights param_unit(const param_table *t, float *block, int u);
/* Floats tensor i occupies in a block (its tp slice, or its padded shard). */
size_t param_stored_numel(const param_table *t, const float *block, int i);

/* The floats a block holds on this rank (its shard of every tensor, or every tensor whole). */
size_t param_block_numel(const param_table *t, const float *block);
void param_zero_grads(param_table *t);
/* AdamW is element-wise: each rank updates the slices it holds. Replicated tensors receive
 * identical gradients on every rank that holds them, so their copies stay identical. For a
 * table whose blocks are stored alike (all whole, or all sharded). */
void param_adamw_step(param_table *t, const adamw_config *opt, int step);

/* The sum of squares of the gradient slices this rank holds for gather (see param_gather): summed
 * over the world, every element of every full gradient counts exactly once. */
double param_grad_sq_held(const param_table *t);
/* grads *= coef, every slice this rank stores. */
void param_scale_grads(param_table *t, float coef);

/* Tensor i (its parameters, or its gradients when `grad`) as the full [rows, cols] host tensor
 * on world rank 0, whatever the mesh and storage: one holder of each slice sends it (a rank
 * that stores it, whose coordinates are 0 in every dimension the block does not split the tensor
 * over; the pipeline dimension splits the layers, so each stage sends its own).
 * `full` may be NULL on other ranks. Collective over the world; for checking and exporting, so
 * not counted as traffic. */
void param_gather(const param_table *t, int i, bool grad, float *full);
/* The same for any of the four blocks (t->params, t->grads, t->adam_m, t->adam_v). */
void param_gather_block(const param_table *t, const float *block, int i, float *full);

/* The slice of tensor i that this rank is the one to send from `block` (param_gather) or to write
 * (a checkpoint, chapter 08): the slice it stores, in the global tensor's coordinates (rows
 * [r0, r0+nr) x columns [c0, c0+nc); a sharded block's: its dp shard's real rows, or elements of
 * a vector), and where its data starts in the block (*offset, floats; row-major [nr, nc]).
 * False when another rank is that one: every element of every tensor is held by exactly one rank
 * of the world (a rank whose coordinates are 0 in every dimension of the mesh that does not split
 * the tensor in this block), or when the tensor is another pipeline stage's. */
bool param_held_slice(const param_table *t, const float *block, int i, int *r0, int *nr, int *c0, int *nc,
                      size_t *offset);
/* The part of tensor i this rank stores in `block`, whether or not it is the one to send it (every
 * copy: over dp_replicate, cp unless the shards span it, and dp_shard for a block stored whole):
 * its tp slice, or its dp
 * shard's real rows (elements) when the block is sharded; same coordinates and offset as above.
 * The padding of a shard follows the slice. False for another pipeline stage's tensor. */
bool param_stored_slice(const param_table *t, const float *block, int i, int *r0, int *nr, int *c0, int *nc,
                        size_t *offset);
/* The inverse: writes this rank's stored part of tensor i in `block` (param_stored_slice; the
 * padding of a shard zeroed; nothing for another stage's tensor) from host memory holding a window
 * of the full [rows, cols] tensor that covers it: src is element (src_r0, src_c0) of the full
 * tensor, its rows src_ld floats apart. The full tensor itself: (full, 0, 0, cols). */
void param_scatter(param_table *t, float *block, int i, const float *src, int src_r0, int src_c0, size_t src_ld);

C_END
