/* tp.h: Megatron tensor parallelism of the Llama transformer (Shoeybi et al., 2019), as a plan
 * for the one model (common/model/model.c).
 *
 * Every layer is split over the p ranks of the tp group, whole heads per rank (the layouts are
 * chapter 01's first exercise, hence their own comment: a student copy leaves it out). */
/* BEGIN SOLUTION: exercise 1, the layouts of the weights */
/*   attention:     wq, wk, wv  column-parallel   rank r owns heads [r*H/p, (r+1)*H/p) and
 *                                                kv heads [r*Hkv/p, (r+1)*Hkv/p)
 *                  wo          row-parallel      the matching H/p*hd input columns
 *   feed-forward:  w1, w3      column-parallel   rank r owns F/p hidden units
 *                  w2          row-parallel      the matching F/p input columns
 *   everything else (tok_embeddings, the norms, output) is replicated. */
/* END SOLUTION */
/* Because a query head only ever looks at its own kv head (h -> h / (H/Hkv)), and both
 * splits give rank r the matching ranges, attention needs no communication at all: each rank
 * runs ordinary attention on its H/p heads. The only collectives are chapter 00's f and g, the
 * plan's region operators:
 *
 *   h ─ rmsnorm ─ f ─ [wq wk wv] ─ rope ─ attention ─ [wo] ─ g ─ (+h) ─ rmsnorm ─ f ─ [w1 w3] ─ swiglu ─ [w2] ─ g ─ (+)
 *
 * forward: 2 all-reduces (the two g's) of B*T*D floats per layer; backward: 2 more (the f's).
 */
#pragma once
#include "llama.h"
#include "mesh.h"
#include "plan.h"

/* Megatron's choice of each weight's layout (shard.h: SHARD_ROWS, SHARD_COLS or
 * SHARD_REPLICATED): layout[kind] for every param_kind. */
void megatron_layouts(shard_layout layout[P_NKINDS]);

/* f (enter: identity / all-reduce) and g (exit: all-reduce / identity) over the plan's tp group. */
extern const region_ops megatron_region;
/* The technique as the plan's stack records it (stateless: its operators move no data of their own). */
extern const plan_technique megatron_technique;

/* The plan: Megatron's layouts and region on the mesh's tp group, everything else local. The
 * mesh was checked (mesh_check) to split n_heads, n_kv_heads and ffn_dim into whole pieces. */
llama_plan megatron_plan(device_mesh *mesh, const llama_config *c);

/* tp's rule for mesh_create (mesh.h): whole query heads, key/value heads and ffn units on each
 * tp rank. Sizes: n_heads, n_kv_heads, ffn_dim. */
mesh_rule tp_mesh_rule(const llama_config *c);

/* What a later chapter's ranks run inside: megatron_plan when the mesh's tp degree (from --tp)
 * is above 1, else plan_single_device(). */
llama_plan tensor_parallel_or_single(device_mesh *mesh, const llama_config *c);

/* The deliberate bugs of this chapter, for --fault. */
extern const plan_fault megatron_faults[];
