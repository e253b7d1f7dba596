/* parallelize.h: every technique of chapters 01-07 applied to the one model, on one 5-D mesh
 * (torchtitan's parallelize_llama, in C).
 *
 *   mesh  pp x dp_replicate x dp_shard x cp x tp = NP          (common/parallel/mesh.h)
 *
 *   tp            Megatron tensor parallelism (01), the vocabulary-parallel embedding, output
 *                 layer and loss (02), sequence parallelism of the norms and the residual
 *                 stream (03): every tp rank holds T / (cp tp) rows of each sequence outside
 *                 the tensor-parallel regions
 *   --ac          activation checkpointing (03): none, selective, full
 *   cp            context parallelism (06): each sequence split over the cp ranks (zigzag),
 *                 attention by ring (or all-gather, all-to-all); gradients summed over cp
 *   --fp8         float8 linears inside the layers (07), scales agreed over tp
 *   pp            a pipeline schedule (05) over the stages, M microbatches per step
 *   dp_replicate  HSDP's replicas (04): the gradient shards all-reduced over them
 *   dp_shard      FSDP (04): parameters, gradients and AdamW state sharded over dp_shard x cp
 *                 (torchtitan's; --no-fsdp-over-cp: dp_shard alone); a unit's weights
 *                 all-gathered before its forward and backward, its gradients reduce-scattered
 *
 * The order is the one each wrapper needs: the operators of the layer first (tp, loss, sp, ac,
 * cp, float8), then the pipeline that schedules the layers, then data parallelism, whose weight
 * access and gradient reduction wrap everything below it.
 *
 * FSDP shards over dp_shard x cp, as torchtitan does: the cp ranks hold the same parameters and
 * compute the gradients of other rows of the same sequences, so for the weights they are data
 * ranks (the batch is still split over dp_replicate x dp_shard only). The reduce-scatter over
 * dp_shard x cp then sums over cp too, and chapter 06's all-reduce over cp skips itself. With
 * --no-fsdp-over-cp the shards span dp_shard only and the cp ranks all-reduce their (identical)
 * shards' gradients: the same arithmetic, cp times the parameter, gradient and AdamW memory.
 */
#pragma once
#include <stdbool.h>
#include "llama.h"
#include "mesh.h"
#include "plan.h"
#include "../03_sequence_parallel/sequence_parallel.h"
#include "../05_pipeline/pipeline.h"
#include "../06_context_parallel/context_parallel.h"
#include "../07_float8/float8_linear.h"

typedef struct {
    int degree[MESH_NDIMS];    /* pp, dp_replicate, dp_shard, cp, tp (mesh.h's order)              */
    bool sp;                   /* sequence parallelism on tp (default on; tp 1: nothing to split)  */
    ac_mode ac;                /* activation checkpointing                                         */
    cp_options cp;             /* method, balance                                                  */
    pp_options pp;             /* schedule, microbatches, virtual stages                           */
    float8_options fp8;           /* float8 recipe (FLOAT8_OFF: fp32 linears)                           */
    bool async_tp;             /* chapter 03's --async-tp: SP's collectives decomposed over tp     */
    bool fsdp_over_cp;         /* FSDP's shards over dp_shard x cp (default), or dp_shard alone    */
    dtype reduce_type;         /* FSDP's gradient reductions: fp32 (default) or bf16 (--reduce-dtype) */
} parallel_options;

/* The ranks FSDP shards over (S of the formulas; --no-fsdp-over-cp changes it). */
static inline int parallel_shard_ranks(const parallel_options *o) {
    return o->degree[MESH_DP_SHARD] * (o->fsdp_over_cp ? o->degree[MESH_CP] : 1);
}
/* Is FSDP (or HSDP) applied: more than one shard, or replicas? */
static inline bool parallel_has_fsdp(const parallel_options *o) {
    return parallel_shard_ranks(o) * o->degree[MESH_DP_REPLICATE] > 1;
}

/* The degrees from the flags: a dp_shard of -1 takes what the others leave of NP (torchtitan's
 * rule). Refuses (exit 2, one line naming the value) a mesh whose product is not NP, a model or
 * batch the mesh cannot split (mesh_check, the rules the --plan calculator applies too: heads,
 * kv heads, ffn and vocabulary by tp, the sequence by cp x tp (x 2: the zigzag halves), the
 * layers by pp x virtual stages, the global batch by dp_replicate x dp_shard x microbatches),
 * and what a technique cannot take (a schedule, float8's shapes). */
void parallelize_validate(parallel_options *o, const llama_config *c, int batch);

/* What the mesh must divide: each technique's rules (mesh.h), in this order: the heads, kv heads,
 * ffn and vocabulary over tp (01, 02); the sequence over 2 cp (06) and, with sequence parallelism,
 * cp x tp (03); all-to-all attention's heads over cp (06); the layers over pp x virtual stages
 * (05); the global batch over dp_replicate x dp_shard (04), then microbatches (05). One list for
 * the trainer (parallel_mesh_requirements, from its options) and the --plan calculator (its names,
 * the ends' shorter chunks, microbatches of a given size); test_plan_calculator compares verdicts. */
typedef struct {
    bool sp, heads_over_cp;       /* sequence parallelism (03); all-to-all attention (06)          */
    int virtual_stages;           /* 05: 0 or 1 for one chunk a stage                               */
    bool short_end_chunks;        /* 05: the first and the last chunk one layer fewer (calculator)  */
    int microbatches;             /* 05: each data rank's batch in this many pieces (0: 1), or ...  */
    int microbatch_size;          /*   pieces of this many sequences (the calculator; 0: any)      */
    mesh_names names;             /* whose names a refusal uses: the run's flags or the calculator's */
} parallel_mesh_choices;
mesh_requirements parallel_mesh_rules(const llama_config *c, long long batch, parallel_mesh_choices choices);
mesh_requirements parallel_mesh_requirements(const parallel_options *o, const llama_config *c, long long batch);

/* The degrees as a mesh_shape (for mesh_create, after parallelize_validate resolved them). */
mesh_shape parallel_mesh_shape(const parallel_options *o);

/* Applies every technique whose degree is above 1 (and --ac, --fp8) to a plan for the mesh. */
llama_plan parallelize_llama(device_mesh *mesh, const llama_config *c, int batch, const parallel_options *o);

/* One line: "pp 2 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 2 (8 ranks)". */
const char *parallel_mesh_name(const parallel_options *o, char *buf, size_t len);
