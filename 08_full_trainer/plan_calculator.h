/* plan_calculator.h: `08 --plan`, the paper planning of a large run (what the Llama 3 team and
 * torchtitan's users do before they book a cluster): for a model, a cluster and a global batch,
 * the memory each GPU needs and the bytes each mesh dimension moves per step, for one mesh or for
 * every mesh the cluster admits, sorted by an estimated step time.
 *
 * Nothing is allocated and nothing is sent: every figure is a formula, and each formula is the
 * one an earlier chapter prints beside its measurement (the README's "Planning a real run"):
 *
 *   parameters, gradients, AdamW m and v   04 (16 bytes a stored parameter, FSDP's shards)
 *                                          on 01/02's tp slices and 05's pipeline stages
 *   activations of a layer                 03 (Megatron + SP, the checkpointing mode's tensors of
 *                                          the layer's blocks: llama_layer_act_bytes), with 06's
 *                                          log-sum-exp in place of the softmax; the head's by
 *                                          llama_head_act_bytes
 *   microbatches in flight, bubble         05 (pp_peak_in_flight_formula, pp_bubble_formula)
 *   attention's working set                06 (cp_working_set_formula, the ring)
 *   tp traffic                             03: an all-gather and a reduce-scatter per boundary,
 *                                          4L + 2 boundaries, 2L + 1 re-gathers
 *   cp traffic                             06: L (3C - 2) K/V blocks per microbatch (the ring)
 *   pp traffic                             05: 2 M (P V - 1) messages of the residual stream
 *   dp traffic                             04: FSDP's all-gathers and reduce-scatter, HSDP's
 *                                          all-reduce over the replicas; 07's float8 all-gather
 *   ep traffic (a mixture of experts)      09: its all-to-all formula, (ep - 1) / ep of a rank's
 *                                          payload sent (the copies routed evenly)
 *
 * A mixture of experts (Mixtral, DeepSeek-V3) is planned when chapter 09's binary brings its layer
 * and its all-to-all formula (plan_moe_chapter); chapter 08's own binary plans dense models and
 * refuses a mixture with one line. The experts are split over ep ranks carved out of FSDP's shard
 * group (torchtitan's), each expert's weights FSDP-sharded over the S / ep ranks left (S = ep: held
 * whole, as 09's --fsdp holds them); they are not split by tp (09 has no expert tensor parallelism:
 * the tp ranks of a data rank all run its whole mixture).
 *
 * The recipe planned is torchtitan's (which the Llama 3 paper's FSDP resembles): FSDP shards over
 * dp_shard x cp, and under a pipeline the weights stay gathered for the whole step, gradients
 * reduce-scattered once after the last microbatch (torch.distributed.pipelining). Chapter 08's
 * trainer shards over dp_shard x cp too (its --no-fsdp-over-cp, over dp_shard only, is planned by
 * --plan-no-shard-cp); its state report compares what it allocates with plan_calc_stage_floats.
 */
#pragma once
#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include "llama.h"
#include "mesh.h"
#include "../03_sequence_parallel/sequence_parallel.h"   /* ac_mode            */
#include "../05_pipeline/schedule.h"                    /* pp_schedule_kind   */

typedef enum { PLAN_FP32 = 0, PLAN_BF16 } plan_precision;
/* How the data ranks share the state (chapter 04's modes): FSDP (ZeRO-3: values, gradients and
 * AdamW state sharded; the values gathered before use), or ZeRO-1 (values and gradients whole, the
 * AdamW state sharded; one reduce-scatter of the gradients and one all-gather of the updated
 * values a step, however many microbatches: DeepSeek-V3's data parallelism). */
typedef enum { PLAN_DP_FSDP = 0, PLAN_DP_ZERO1 } plan_dp_mode;
/* What the chapter that defines a mixture of experts (09) gives the calculator: its layer (the MoE
 * block's tensors and activations, from which the parameter table and the activation formulas
 * derive) and its all-to-all formula (09's exercise 4: the bytes its ep group's all-to-alls move
 * in the forward and backward passes of L mixture layers, summed over the group's P ranks, each
 * routing N tokens of k copies of D floats, E experts). */
typedef struct {
    const llama_layer *(*layer_for)(const llama_config *c);
    double (*alltoall_bytes)(double L, double P, double N, double k, double D, double E);
} plan_moe_chapter;
/* The presets: Llama 3 / 3.1's three sizes, and two mixtures of experts (plan_calculator.c's table). */
typedef enum { PLAN_LLAMA3_8B = 0, PLAN_LLAMA3_70B, PLAN_LLAMA3_405B, PLAN_MIXTRAL_8X7B, PLAN_DEEPSEEK_V3 } plan_preset;

/* Everything the calculator is told. plan_calc_defaults fills it; the flags change it. */
typedef struct plan_calc_options {
    plan_preset preset;            /* --plan-model: 8b, 70b, 405b (Llama 3 / 3.1), mixtral-8x7b,
                                    * deepseek-v3 (a DeepSeek-V3-like mixture)                      */
    int dim, n_layers, n_heads, n_kv_heads, ffn_dim, vocab;   /* --plan-dim ...: > 0 overrides the preset */
    int vocab_multiple;            /* the vocabulary's padding over tp (02; 0: mesh.h's default rule) */
    int seq_len;                   /* --plan-seq-len, tokens of one sequence                        */
    long long global_batch;        /* --plan-global-batch, TOKENS per optimizer step                */
    int microbatch;                /* --plan-microbatch, sequences in one forward of a dp rank      */
    int gpus, gpus_per_node;       /* --plan-gpus, --plan-gpus-per-node                             */
    double gpu_mem_gib;            /* --plan-gpu-mem, GiB of one GPU                                */
    double intra_gbs, inter_gbs;   /* --plan-intra-bw (NVLink), --plan-inter-bw (network), GB/s
                                    * sent per GPU                                                   */
    double tflops;                 /* --plan-tflops, per GPU; 0: the precision's H100 peak          */
    bool mesh_given;               /* --plan-mesh: evaluate only this mesh (then the table)         */
    int mesh[MESH_NDIMS];          /* pp, dp_replicate, dp_shard (-1: the rest), cp, tp             */
    pp_schedule_kind schedule;     /* --plan-schedule (1f1b)                                        */
    int virtual_stages;            /* --plan-virtual-stages (1; interleaved: 2 or more)             */
    ac_mode ac;                    /* --plan-ac (selective)                                         */
    bool fp8;                      /* --plan-fp8: 07's float8 linears and float8 all-gather         */
    plan_precision precision;      /* --plan-precision fp32 (this tutorial) | bf16                  */
    plan_precision reduce;         /* --plan-reduce-dtype: the gradients' reductions, fp32 (FSDP2's
                                    * default reduce_dtype, 08's) | bf16 (08's --reduce-dtype bf16) */
    plan_dp_mode dp_mode;          /* --plan-dp fsdp (default, 08's trainer) | zero1                 */
    bool shard_cp;                 /* FSDP over dp_shard x cp (torchtitan, 08); --plan-no-shard-cp:
                                    * over dp_shard only, the cp ranks all-reduce their shards (08's
                                    * --no-fsdp-over-cp)                                              */
    int top;                       /* --plan-top, lines of the candidates' table (15)               */
    /* a mixture of experts: --plan-experts E (> 0 over the preset's; 0 keeps it), --plan-top-k,
     * --plan-expert-ffn F_e, --plan-shared-expert, --plan-moe-every, --plan-capacity-factor (0:
     * dropless, whose dispatch buffers take the worst case, as chapter 09's trainer allocates) */
    int experts, top_k, expert_dim, moe_every;   /* 0: not given (the preset's, top-2, F, every layer) */
    bool shared_expert;
    double capacity_factor;
    int ep;                        /* --plan-ep: the experts' ranks (0: every degree that divides the
                                    * shard group and E)                                            */
    const plan_moe_chapter *moe_chapter;   /* chapter 09's, set by its binary; NULL (08's): a
                                    * mixture is refused                                            */
    const char *flag_given;        /* the first --plan-* flag given (a trainer refuses it without --plan) */
} plan_calc_options;

void plan_calc_defaults(plan_calc_options *o);

/* getopt_long codes of the calculator's flags (main's own codes stay below 2000). */
enum {
    PLAN_OPT_MODEL = 2000, PLAN_OPT_DIM, PLAN_OPT_LAYERS, PLAN_OPT_HEADS, PLAN_OPT_KV_HEADS, PLAN_OPT_FFN,
    PLAN_OPT_VOCAB, PLAN_OPT_SEQ, PLAN_OPT_BATCH, PLAN_OPT_MICRO, PLAN_OPT_GPUS, PLAN_OPT_MEM,
    PLAN_OPT_PER_NODE, PLAN_OPT_INTRA, PLAN_OPT_INTER, PLAN_OPT_TFLOPS, PLAN_OPT_MESH, PLAN_OPT_SCHEDULE,
    PLAN_OPT_VIRTUAL, PLAN_OPT_AC, PLAN_OPT_FP8, PLAN_OPT_PRECISION, PLAN_OPT_REDUCE, PLAN_OPT_NO_SHARD_CP, PLAN_OPT_TOP,
    PLAN_OPT_EXPERTS, PLAN_OPT_TOP_K, PLAN_OPT_EXPERT_FFN, PLAN_OPT_SHARED, PLAN_OPT_MOE_EVERY, PLAN_OPT_CAPACITY,
    PLAN_OPT_EP, PLAN_OPT_DP, PLAN_OPT_END
};
/* Entries to splice into main's struct option array (no trailing comma). */
#define PLAN_CALC_FLAGS                                                                                      \
    {"plan-model", required_argument, 0, PLAN_OPT_MODEL}, {"plan-dim", required_argument, 0, PLAN_OPT_DIM},    \
    {"plan-layers", required_argument, 0, PLAN_OPT_LAYERS}, {"plan-heads", required_argument, 0, PLAN_OPT_HEADS}, \
    {"plan-kv-heads", required_argument, 0, PLAN_OPT_KV_HEADS}, {"plan-ffn", required_argument, 0, PLAN_OPT_FFN}, \
    {"plan-vocab", required_argument, 0, PLAN_OPT_VOCAB}, {"plan-seq-len", required_argument, 0, PLAN_OPT_SEQ}, \
    {"plan-global-batch", required_argument, 0, PLAN_OPT_BATCH},                                           \
    {"plan-microbatch", required_argument, 0, PLAN_OPT_MICRO}, {"plan-gpus", required_argument, 0, PLAN_OPT_GPUS}, \
    {"plan-gpu-mem", required_argument, 0, PLAN_OPT_MEM},                                                  \
    {"plan-gpus-per-node", required_argument, 0, PLAN_OPT_PER_NODE},                                       \
    {"plan-intra-bw", required_argument, 0, PLAN_OPT_INTRA}, {"plan-inter-bw", required_argument, 0, PLAN_OPT_INTER}, \
    {"plan-tflops", required_argument, 0, PLAN_OPT_TFLOPS}, {"plan-mesh", required_argument, 0, PLAN_OPT_MESH}, \
    {"plan-schedule", required_argument, 0, PLAN_OPT_SCHEDULE},                                            \
    {"plan-virtual-stages", required_argument, 0, PLAN_OPT_VIRTUAL}, {"plan-ac", required_argument, 0, PLAN_OPT_AC}, \
    {"plan-fp8", no_argument, 0, PLAN_OPT_FP8}, {"plan-precision", required_argument, 0, PLAN_OPT_PRECISION}, \
    {"plan-reduce-dtype", required_argument, 0, PLAN_OPT_REDUCE},                                          \
    {"plan-no-shard-cp", no_argument, 0, PLAN_OPT_NO_SHARD_CP}, {"plan-top", required_argument, 0, PLAN_OPT_TOP}, \
    {"plan-experts", required_argument, 0, PLAN_OPT_EXPERTS}, {"plan-top-k", required_argument, 0, PLAN_OPT_TOP_K}, \
    {"plan-expert-ffn", required_argument, 0, PLAN_OPT_EXPERT_FFN},                                        \
    {"plan-shared-expert", no_argument, 0, PLAN_OPT_SHARED}, {"plan-moe-every", required_argument, 0, PLAN_OPT_MOE_EVERY}, \
    {"plan-capacity-factor", required_argument, 0, PLAN_OPT_CAPACITY}, {"plan-ep", required_argument, 0, PLAN_OPT_EP}, \
    {"plan-dp", required_argument, 0, PLAN_OPT_DP}

/* True when `code` is one of the calculator's flags (and applies it); a bad value ends every rank
 * with one line naming the flag, the value and what is valid, exit status 2. */
bool plan_calculator_flag(plan_calc_options *o, int code, const char *arg);
extern const char plan_calculator_usage[];   /* the flags' help lines */

/* Prints the report on rank 0 (log0): the model and the cluster, the figures of one mesh (the
 * --plan-mesh, else the fastest that fits), the table of candidate meshes. Returns 0; settings
 * no mesh can use (a sequence the batch does not divide, a bad model) exit 2 with one line. */
int plan_calculator_run(const plan_calc_options *o);

/* The figures of one mesh, per GPU. Memory is that of the pipeline stage that needs the most
 * (worst_stage); traffic and compute are the busiest stage's, per optimizer step. */
typedef struct {
    double params_bytes, grads_bytes, optim_bytes;   /* 4, 4 and 8 bytes a stored parameter        */
    double act_bytes;                 /* activations of the microbatches in flight                 */
    double buffer_bytes;              /* FSDP's gathered weights and full gradients + attention's  */
    double fsdp_buffer_bytes, attn_buffer_bytes;     /*   working set, the two parts of it         */
    double total_bytes;
    int worst_stage;
    double act_layer_bytes;           /* one layer, one microbatch (03's formula)                  */
    double act_head_bytes;            /* the head's (final norm, logits, loss), one microbatch     */
    int act_sets;                     /* (microbatch, chunk) sets in flight on the worst stage     */
    int act_set_layers;               /* layers of one set there (its largest chunk)               */
    double tp_bytes, cp_bytes, pp_bytes, dp_bytes;   /* sent per GPU per step (ring model)         */
    bool expert_rows_capped;          /* R is the capacity's bound, below the dropless one          */
    double tp_s, cp_s, pp_s, dp_s;    /* each at its link's bandwidth                             */
    int ep;                           /* a mixture of experts: the experts' ranks (1: dense)       */
    double ep_bytes, ep_s;            /* the all-to-alls' bytes sent per GPU per step, their time  */
    bool ep_across_nodes;             /* the ep group spans nodes                                  */
    double act_dense_layer_bytes;     /* a dense layer's activations when the layers differ        */
    double expert_rows;               /* R: the most rows a GPU's experts may receive in a layer   */
    int moe_layers_max;               /* mixtures on the busiest stage                             */
    bool across_nodes[MESH_NDIMS];    /* the dimension's groups span nodes (network bandwidth)     */
    double bubble;                    /* the schedule's idle fraction (05)                         */
    int microbatches;                 /* M per dp rank and step                                    */
    int shard_ranks;                  /* S: FSDP's shard group (dp_shard x cp, or dp_shard)        */
    int layers_min, layers_max;       /* layers of the lightest and the heaviest stage             */
    double flops_per_gpu;             /* computed per step, recomputation included                 */
    double model_flops;               /* the whole step's model FLOPs (llama_flops_per_token), no
                                       * recomputation: what MFU counts                           */
    double compute_s;                 /* flops_per_gpu at --plan-tflops                            */
    double step_s;                    /* compute / (1 - bubble) + every transfer: no overlap       */
    double step_overlap_s;            /* the same if transfers hid behind compute and each other   */
    double mfu;                       /* model_flops / (GPUs x step_s x --plan-tflops)              */
    bool fits;                        /* total_bytes <= --plan-gpu-mem                             */
} plan_calc_result;

/* 0 and r filled, or -1 with one line in why when the model or the batch cannot be split by the
 * mesh (pp, dp_replicate, dp_shard, cp, tp; a dp_shard of -1 takes the rest of the GPUs) and ep
 * (1 for a dense model; for a mixture a divisor of the shard group and of E). */
int plan_calc_mesh_ep(const plan_calc_options *o, const int mesh[MESH_NDIMS], int ep, plan_calc_result *r, char *why,
                      size_t whylen);
/* ... with o->ep, or 1 when it is 0 */
int plan_calc_mesh(const plan_calc_options *o, const int mesh[MESH_NDIMS], plan_calc_result *r, char *why,
                   size_t whylen);

/* ---- the pieces, for the test ---- */

/* The model the options describe: the preset with the explicit dimensions over it. */
llama_config plan_calc_model(const plan_calc_options *o);
/* Layers pipeline rank `rank` of `pp` holds with `v` chunks each; holds[l] (when not NULL, [L])
 * marks them. The layers are cut into pp x v chunks in order: L / (pp v) each, or, when that is
 * not whole but (L + 2) / (pp v) is, that many with one fewer in the first and the last chunk (the
 * Llama 3 paper's balance for the embedding and the output). -1 when neither divides. */
int plan_calc_rank_layers(int n_layers, int pp, int v, int rank, bool *holds);
/* Floats of one block (values, or gradients; AdamW holds two) that a GPU of pipeline stage
 * `stage` stores under the mesh: its share of each of its tensors under tp and FSDP (a dp_shard of
 * -1 takes the rest of the GPUs; -1 when that is not whole), the experts split over ep (o->ep, or
 * 1 when 0) and sharded over the S / ep ranks left. */
double plan_calc_stage_floats(const plan_calc_options *o, const int mesh[MESH_NDIMS], int stage);
