/* params.h: the model's parameters as this rank holds them, placed on the device mesh.
 *
 * Every tensor of llama.h's table has a name, a global shape and a placement: how it is split
 * over the tensor-parallel dimension of the mesh (shard.h: replicated, by rows, by columns).
 * The other mesh dimensions (data, context, pipeline) hold copies for now; the chapters that
 * split over them add their placement here. A rank stores its slice of every tensor, one after
 * the other, in four blocks: parameters, gradients and AdamW's m and v.
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

/* One tensor: what it is, where it is, and which part of it this rank holds. */
typedef struct {
    param_spec spec;          /* name, kind, layer, global [rows, cols] (llama.h)              */
    shard_layout tp_layout;   /* how it is split over the mesh's tp dimension                 */
    int r0, nr, c0, nc;       /* this rank's slice: rows [r0, r0+nr) x columns [c0, c0+nc)    */
    size_t offset;            /* where the slice starts in each of the four blocks (floats)   */
} param_tensor;

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
    };
    float *of[P_NKINDS];
} unit_weights;

typedef struct {
    llama_config c;
    device_mesh *mesh;        /* NULL: a single device, every slice is the whole tensor       */
    comm_group *tp;           /* the mesh's tp group (NULL without a mesh)                    */
    int n;                    /* number of tensors: llama_num_params(c)                       */
    param_tensor *t;          /* [n], in llama.h's order                                      */
    int *layer_first;         /* [L] index of each layer's first tensor                       */
    size_t num_local;         /* floats this rank holds in each block                         */
    float *params, *grads, *adam_m, *adam_v;   /* MEM_PARAMS, MEM_GRADS, MEM_OPTIM, MEM_OPTIM */
} param_table;

/* Allocates this rank's slices (layout[kind] over the mesh's tp group; mesh NULL: whole
 * tensors) and initialises them from (seed, name, global index): exactly the baseline's values.
 * A layout that does not divide a tensor is a programming error here: a plan validates the
 * sizes it needs (with a message naming the flags) before it asks for the table. */
param_table *param_table_create(const llama_config *c, device_mesh *mesh,
                                const shard_layout layout[P_NKINDS], uint64_t seed);
void param_table_free(param_table *t);

/* The index of the tensor of `kind` in `layer` (-1 for the embedding, final norm and output). */
int param_index(const param_table *t, param_kind kind, int layer);
/* This rank's slice of tensor i inside a block (t->params, t->grads, ...). */
float *param_in(const param_table *t, float *block, int i);
/* The tensors of unit u inside a block: layer u for u < L, the ends for u == L. */
unit_weights param_unit(const param_table *t, float *block, int u);
/* Elements of this rank's slice of tensor i. */
size_t param_local_numel(const param_table *t, int i);

void param_zero_grads(param_table *t);
/* AdamW is element-wise: each rank updates the slices it holds. Replicated tensors receive
 * identical gradients on every rank that holds them, so their copies stay identical. */
void param_adamw_step(param_table *t, const adamw_config *opt, int step);

/* The sum of squares of the gradient slices this rank holds for gather (see param_gather): summed
 * over the world, every element of every full gradient counts exactly once. */
double param_grad_sq_held(const param_table *t);
/* grads *= coef, every slice this rank stores. */
void param_scale_grads(param_table *t, float coef);

/* Tensor i (its parameters, or its gradients when `grad`) as the full [rows, cols] host tensor
 * on world rank 0, whatever the mesh: one holder of each slice sends it (the rank whose
 * coordinates are 0 in every dimension the tensor is not split over). `full` may be NULL on
 * other ranks. Collective over the world; for checking and exporting, so not counted as traffic. */
void param_gather(const param_table *t, int i, bool grad, float *full);

C_END
