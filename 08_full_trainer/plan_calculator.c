/* plan_calculator.c: see plan_calculator.h. Every count is a double: a 405B model's products
 * pass 2^31 long before they reach one GPU, and nothing here is allocated. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "comm.h"
#include "log.h"
#include "model.h"
#include "shard.h"
#include "../01_transformer_tp/tp.h"
#include "../02_loss_parallel/vocab_parallel.h"
#include "../06_context_parallel/context_parallel.h"
#include "parallelize.h"
#include "plan_calculator.h"

// ----------------------------------------------------------------------------------------------
// the models and the options

/* The presets. Llama 3 / 3.1 (Grattafiori et al. 2024, the paper's table of model sizes): head dim
 * 128 in all three, vocabulary 128256. Mixtral 8x7B (Jiang et al. 2024): Mistral 7B's layers with 8
 * SwiGLU experts of Mistral's feed-forward size in place of its feed-forward, top-2, vocabulary
 * 32000: 46.7 B parameters, 12.9 B active. DeepSeek-V3-like (DeepSeek-AI 2024, its section 4.2):
 * its 61 layers, dim 7168, 128 heads, 256 routed experts of 2048 and one shared of 2048, top-8,
 * vocabulary 129280, with this tutorial's layer: multi-head attention of 128 heads of dim 56 where
 * DeepSeek has MLA (128 heads of 128, and 64 for RoPE, over compressed keys and values), a
 * mixture on every layer where its first three are dense, and no multi-token-prediction module:
 * 705 B parameters where the paper counts 671 B (37.75 B active outside the embedding, 37 B). */
typedef struct {
    const char *name, *label;
    int dim, n_layers, n_heads, n_kv_heads, ffn_dim, vocab;
    int experts, top_k, expert_dim;   /* 0: a dense model */
    bool shared_expert;
} plan_model_preset;
static const plan_model_preset plan_presets[] = {
    [PLAN_LLAMA3_8B] = {"8b", "Llama 3 8B", 4096, 32, 32, 8, 14336, 128256},
    [PLAN_LLAMA3_70B] = {"70b", "Llama 3 70B", 8192, 80, 64, 8, 28672, 128256},
    [PLAN_LLAMA3_405B] = {"405b", "Llama 3 405B", 16384, 126, 128, 8, 53248, 128256},
    [PLAN_MIXTRAL_8X7B] = {"mixtral-8x7b", "Mixtral 8x7B", 4096, 32, 32, 8, 14336, 32000, 8, 2, 14336, false},
    [PLAN_DEEPSEEK_V3] = {"deepseek-v3", "DeepSeek-V3-like", 7168, 61, 128, 128, 2048, 129280, 256, 8, 2048, true},
};

/* H100 SXM peaks, TFLOP/s: fp32 without TF32 (what cublasSgemm runs in this tutorial), dense bf16,
 * dense fp8. */
static const double H100_FP32 = 67, H100_BF16 = 989, H100_FP8 = 1979;

void plan_calc_defaults(plan_calc_options *o) {
    memset(o, 0, sizeof *o);
    o->preset = 0;                       /* 8b on one node of 8 */
    o->seq_len = 8192;
    o->global_batch = 1LL << 20;         /* 1M tokens: 128 sequences of 8192 */
    o->microbatch = 1;
    o->gpus = 8;
    o->gpus_per_node = 8;
    o->gpu_mem_gib = 80;
    o->intra_gbs = 450;                  /* NVLink 4: 900 GB/s both ways, 450 each way        */
    o->inter_gbs = 50;                   /* 400 Gb/s per GPU, as Llama 3's clusters           */
    o->mesh[MESH_PP] = o->mesh[MESH_DP_REPLICATE] = o->mesh[MESH_CP] = o->mesh[MESH_TP] = 1;
    o->mesh[MESH_DP_SHARD] = -1;
    o->schedule = PP_1F1B;
    o->virtual_stages = 1;
    o->ac = AC_SELECTIVE;
    o->precision = PLAN_FP32;
    o->reduce = PLAN_FP32;
    o->shard_cp = true;
    o->top = 15;
}

const char plan_calculator_usage[] =
    "plan calculator (with --plan; no training, one rank is enough):\n"
    "  --plan-model M                 8b|70b|405b (Llama 3 / 3.1), or a mixture of experts (chapter 09's\n"
    "                                 binary plans those): mixtral-8x7b|deepseek-v3 (default 8b)\n"
    "  --plan-dim D --plan-layers L --plan-heads H --plan-kv-heads K --plan-ffn F --plan-vocab V\n"
    "                                 explicit dimensions over the preset's\n"
    "  --plan-experts E --plan-top-k K --plan-expert-ffn F_e --plan-shared-expert --plan-moe-every N\n"
    "                                 the sizes of a mixture of experts, over the preset's (09 --plan)\n"
    "  --plan-capacity-factor C       experts take at most C T k / E copies of a sequence (default:\n"
    "                                 dropless, the dispatch buffers sized for the worst case)\n"
    "  --plan-ep N                    the experts over N ranks of FSDP's shard group (default: every\n"
    "                                 N that divides it and E)\n"
    "  --plan-seq-len T               tokens of a sequence (default 8192)\n"
    "  --plan-global-batch N          TOKENS per optimizer step (default 1048576; a multiple of T)\n"
    "  --plan-microbatch B            sequences per forward of a dp rank (default 1)\n"
    "  --plan-gpus N                  GPUs (default 8)\n"
    "  --plan-gpu-mem G               GiB of each (default 80)\n"
    "  --plan-gpus-per-node N         (default 8)\n"
    "  --plan-intra-bw X              GB/s a GPU sends inside a node, NVLink (default 450)\n"
    "  --plan-inter-bw X              GB/s a GPU sends across nodes (default 50: 400 Gb/s)\n"
    "  --plan-tflops X                per GPU (default: H100 peak, 67 fp32, 989 bf16)\n"
    "  --plan-mesh pp,dpr,dps,cp,tp   evaluate this mesh (dp_shard -1: the rest), then the table\n"
    "  --plan-schedule S              gpipe|1f1b|interleaved|zb-h1 (default 1f1b)\n"
    "  --plan-virtual-stages V        chunks per pipeline rank (interleaved; default 1)\n"
    "  --plan-ac none|selective|full  activation checkpointing (default selective)\n"
    "  --plan-fp8                     float8 linears and FSDP all-gather (chapter 07)\n"
    "  --plan-precision fp32|bf16     activations and messages (default fp32, as this tutorial)\n"
    "  --plan-reduce-dtype fp32|bf16  the gradients' reductions (default fp32; bf16 needs bf16 precision)\n"
    "  --plan-no-shard-cp             FSDP over dp_shard only (--no-fsdp-over-cp), not dp_shard x cp\n"
    "  --plan-dp fsdp|zero1           the data ranks' sharing (chapter 04): FSDP (default), or ZeRO-1 (values\n"
    "                                 and gradients whole, the AdamW state sharded; DeepSeek-V3's)\n"
    "  --plan-top N                   lines of the candidates' table (default 15)\n";

/* --plan-mesh "pp,dp_replicate,dp_shard,cp,tp": five degrees, dp_shard may be -1. */
static void parse_mesh(plan_calc_options *o, const char *arg) {
    const char *p = arg;
    for (int d = 0; d < MESH_NDIMS; d++) {
        char *end;
        long v = strtol(p, &end, 10);
        bool ok = end != p && (d == MESH_NDIMS - 1 ? *end == '\0' : *end == ',') &&
                  (v >= 1 || (d == MESH_DP_SHARD && v == -1)) && v <= 1 << 20;
        if (!ok)
            comm_exit_usage("--plan-mesh '%s' is not valid: expected pp,dp_replicate,dp_shard,cp,tp, five degrees "
                            "of 1 or more (dp_shard -1: what the others leave of --plan-gpus), e.g. 16,1,128,1,8", arg);
        o->mesh[d] = (int)v;
        p = end + 1;
    }
    o->mesh_given = true;
}

bool plan_calculator_flag(plan_calc_options *o, int code, const char *arg) {
    static const char *const models[] = {"8b", "70b", "405b", "mixtral-8x7b", "deepseek-v3", NULL};   /* plan_preset's order */
    static const char *const ac_modes[] = {"none", "selective", "full", NULL};          /* ac_mode's order */
    static const char *const precisions[] = {"fp32", "bf16", NULL};
    static const char *const dp_modes[] = {"fsdp", "zero1", NULL};                     /* plan_dp_mode's order */
    switch (code) {
    case PLAN_OPT_MODEL: o->preset = (plan_preset)cli_choice("--plan-model", arg, models); break;
    case PLAN_OPT_DIM: o->dim = cli_int("--plan-dim", arg, 2, 1 << 20); break;
    case PLAN_OPT_LAYERS: o->n_layers = cli_int("--plan-layers", arg, 1, 100000); break;
    case PLAN_OPT_HEADS: o->n_heads = cli_int("--plan-heads", arg, 1, 1 << 16); break;
    case PLAN_OPT_KV_HEADS: o->n_kv_heads = cli_int("--plan-kv-heads", arg, 1, 1 << 16); break;
    case PLAN_OPT_FFN: o->ffn_dim = cli_int("--plan-ffn", arg, 1, 1 << 22); break;
    case PLAN_OPT_VOCAB: o->vocab = cli_int("--plan-vocab", arg, 1, 1 << 24); break;
    case PLAN_OPT_SEQ: o->seq_len = cli_int("--plan-seq-len", arg, 2, 1 << 20); break;
    case PLAN_OPT_BATCH: {
        uint64_t v = cli_u64("--plan-global-batch", arg);
        if (v < 1 || v > (1ULL << 50))
            comm_exit_usage("--plan-global-batch '%s' is not valid: expected the tokens of a step, from 1 to 2^50", arg);
        o->global_batch = (long long)v;
        break;
    }
    case PLAN_OPT_MICRO: o->microbatch = cli_int("--plan-microbatch", arg, 1, 256); break;
    case PLAN_OPT_GPUS: o->gpus = cli_int("--plan-gpus", arg, 1, 1 << 20); break;
    case PLAN_OPT_MEM: o->gpu_mem_gib = cli_float("--plan-gpu-mem", arg, 0.001f, 1e6f); break;
    case PLAN_OPT_PER_NODE: o->gpus_per_node = cli_int("--plan-gpus-per-node", arg, 1, 1 << 16); break;
    case PLAN_OPT_INTRA: o->intra_gbs = cli_float("--plan-intra-bw", arg, 0.001f, 1e6f); break;
    case PLAN_OPT_INTER: o->inter_gbs = cli_float("--plan-inter-bw", arg, 0.001f, 1e6f); break;
    case PLAN_OPT_TFLOPS: o->tflops = cli_float("--plan-tflops", arg, 0.001f, 1e7f); break;
    case PLAN_OPT_MESH: parse_mesh(o, arg); break;
    case PLAN_OPT_SCHEDULE: {
        pp_schedule_kind k;
        if (pp_schedule_parse(arg, &k) != 0)
            comm_exit_usage("--plan-schedule '%s' is not valid: expected one of gpipe, 1f1b, interleaved, zb-h1", arg);
        o->schedule = k;
        break;
    }
    case PLAN_OPT_VIRTUAL: o->virtual_stages = cli_int("--plan-virtual-stages", arg, 1, 64); break;
    case PLAN_OPT_AC: o->ac = (ac_mode)cli_choice("--plan-ac", arg, ac_modes); break;
    case PLAN_OPT_FP8: o->fp8 = true; break;
    case PLAN_OPT_PRECISION: o->precision = (plan_precision)cli_choice("--plan-precision", arg, precisions); break;
    case PLAN_OPT_REDUCE: o->reduce = (plan_precision)cli_choice("--plan-reduce-dtype", arg, precisions); break;
    case PLAN_OPT_NO_SHARD_CP: o->shard_cp = false; break;
    case PLAN_OPT_TOP: o->top = cli_int("--plan-top", arg, 1, 1000); break;
    case PLAN_OPT_EXPERTS: o->experts = cli_int("--plan-experts", arg, 1, 1 << 16); break;
    case PLAN_OPT_TOP_K: o->top_k = cli_int("--plan-top-k", arg, 1, 1 << 16); break;
    case PLAN_OPT_EXPERT_FFN: o->expert_dim = cli_int("--plan-expert-ffn", arg, 1, 1 << 22); break;
    case PLAN_OPT_SHARED: o->shared_expert = true; break;
    case PLAN_OPT_MOE_EVERY: o->moe_every = cli_int("--plan-moe-every", arg, 1, 100000); break;
    case PLAN_OPT_CAPACITY: o->capacity_factor = cli_float("--plan-capacity-factor", arg, 0.01f, 64.0f); break;
    case PLAN_OPT_EP: o->ep = cli_int("--plan-ep", arg, 1, 1 << 16); break;
    case PLAN_OPT_DP: o->dp_mode = (plan_dp_mode)cli_choice("--plan-dp", arg, dp_modes); break;
    default: return false;
    }
    if (!o->flag_given) {   /* its name, for a run that would ignore it */
        static const struct option names[] = {PLAN_CALC_FLAGS};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (names[i].val == code) o->flag_given = names[i].name;
    }
    return true;
}

llama_config plan_calc_model(const plan_calc_options *o) {
    const plan_model_preset *p = &plan_presets[o->preset];
    llama_config c = llama_config_default();   /* norm eps and RoPE theta: not used here */
    c.dim = o->dim > 0 ? o->dim : p->dim;
    c.n_layers = o->n_layers > 0 ? o->n_layers : p->n_layers;
    c.n_heads = o->n_heads > 0 ? o->n_heads : p->n_heads;
    c.n_kv_heads = o->n_kv_heads > 0 ? o->n_kv_heads : p->n_kv_heads;
    c.ffn_dim = o->ffn_dim > 0 ? o->ffn_dim : p->ffn_dim;
    c.vocab_size = o->vocab > 0 ? o->vocab : p->vocab;
    c.vocab_multiple = o->vocab_multiple;
    c.seq_len = o->seq_len;
    /* a mixture of experts: the preset's, or one asked for over a dense preset (top-2, experts of
     * the feed-forward's size unless given) */
    c.moe.experts = o->experts > 0 ? o->experts : p->experts;
    if (c.moe.experts > 0) {
        c.moe.top_k = o->top_k > 0 ? o->top_k : p->top_k > 0 ? p->top_k : 2;
        c.moe.expert_dim = o->expert_dim > 0 ? o->expert_dim : p->expert_dim > 0 ? p->expert_dim : c.ffn_dim;
        c.moe.shared_expert = o->shared_expert || p->shared_expert;
        c.moe.capacity_factor = (float)o->capacity_factor;
        c.layer_every = o->moe_every > 0 ? o->moe_every : 1;
        c.layer = o->moe_chapter ? o->moe_chapter->layer_for(&c) : NULL;
    }
    return c;
}

/* Whether the options describe a mixture of experts. */
static bool is_moe(const llama_config *c) { return c->moe.experts > 0; }
/* Layer l's kind: LAYER_OWN, the model's own layer (a mixture's), or LAYER_LLAMA, Llama's in
 * between under layer_every (layer.h's llama_layer_at); every layer of a dense model is its own. */
enum { LAYER_LLAMA = 0, LAYER_OWN = 1 };
static int layer_kind(const llama_config *c, int l) {
    return llama_layer_at(c, l) == llama_layer_of(c) ? LAYER_OWN : LAYER_LLAMA;
}

/* The model's table (llama.h), summed: the count does not depend on how anyone wrote it down. */
// ----------------------------------------------------------------------------------------------
// pipeline stages

/* Layers of chunk `chunk` of n: L / n each, or (L + 2) / n with one fewer in the first and the
 * last chunk, which also hold the embedding and the output; -1 when neither is whole. */
static int chunk_layers(int L, int n, int chunk) {
    if (L % n == 0) return L / n;
    if (n >= 2 && (L + 2) % n == 0 && (L + 2) / n >= 2) return (L + 2) / n - (chunk == 0 || chunk == n - 1);
    return -1;
}

int plan_calc_rank_layers(int n_layers, int pp, int v, int rank, bool *holds) {
    int n = pp * v, first = 0, count = 0;
    if (pp < 1 || v < 1 || rank < 0 || rank >= pp || chunk_layers(n_layers, n, 0) < 1) return -1;
    if (holds) memset(holds, 0, (size_t)n_layers * sizeof *holds);
    for (int c = 0; c < n; c++) {   /* chunk c lives on rank c % pp (chapter 05's round robin) */
        int k = chunk_layers(n_layers, n, c);
        if (c % pp == rank) {
            count += k;
            for (int l = first; holds && l < first + k; l++) holds[l] = true;
        }
        first += k;
    }
    return count;
}

/* The activations of rank's largest (microbatch, chunk) set: its chunk's layers, each by its kind
 * (kind_act[LAYER_OWN], kind_act[LAYER_LLAMA]: a layer's bytes). */
static double rank_largest_set(const llama_config *c, int pp, int v, int rank, const double kind_act[2]) {
    int n = pp * v, first = 0;
    double most = 0;
    for (int ch = 0; ch < n; ch++) {
        int k = chunk_layers(c->n_layers, n, ch);
        double bytes = 0;
        for (int l = first; ch % pp == rank && l < first + k; l++) bytes += kind_act[layer_kind(c, l)];
        most = fmax(most, bytes);
        first += k;
    }
    return most;
}

/* The most layers one of rank's chunks holds: a (microbatch, chunk) activation set's size. */
static int rank_largest_chunk(int L, int pp, int v, int rank) {
    int most = 0;
    for (int c = rank; c < pp * v; c += pp) most = chunk_layers(L, pp * v, c) > most ? chunk_layers(L, pp * v, c) : most;
    return most;
}

// ----------------------------------------------------------------------------------------------
// what one GPU stores

/* One tensor on one GPU: its tp slice (01, 02; the vocabulary's padded, param_split_rows) as
 * [units, width] (rows, or a vector's elements), sharded over S ranks by FSDP (04). An expert's
 * weight (09) is first split over the ep ranks (E / ep experts' rows each), then sharded over the
 * S / ep ranks that hold the same experts. */
/* BEGIN SOLUTION 08: state per GPU */
/* (units cut in S chunks of ceil(units / S), the last ones padded, as params.c pads them) */
/* END SOLUTION */
typedef struct { double shard, gathered; } tensor_floats;
/* (*whole: the floats of the tp slice unsharded, what ZeRO-1 keeps of its values and gradients) */
static tensor_floats floats_of(const llama_config *c, param_kind kind, int layer, shard_layout layout, int tp, int S,
                               int ep, double *whole) {
    param_spec s = llama_param_spec(c, llama_param_index_of(c, kind, layer));
    int r0, nr, c0, nc;
    shard_slice(layout, param_split_rows(c, s, layout, tp), s.cols, 0, tp, &r0, &nr, &c0, &nc);
    long long units = s.is_vector ? nc : nr, width = s.is_vector ? 1 : nc;
    if (param_kind_is_expert(kind)) units /= ep, S /= ep;   /* (ep divides E and S: plan_calc_mesh_ep) */
    *whole = (double)(units * width);
    tensor_floats f = {0, 0};
    /* BEGIN ASSIGNMENT: the floats one GPU stores of this tensor, its tp slice's `units` rows of `width` sharded over S ranks (f.shard), and the floats an all-gather of them rebuilds (f.gathered) */
    long long shard_units = (units + S - 1) / S;
    f = (tensor_floats){(double)(shard_units * width), (double)(S * shard_units * width)};
    /* END ASSIGNMENT */
    return f;
}

/* One layer's figures: its shard floats, of which its linears' weights (what float8 gathers);
 * gathered, of which the experts' (over the S / ep ranks that share them); unsharded. */
typedef struct { double shard, blocks, gathered, experts_gathered, whole; } layer_floats;
/* The unit figures every stage is made of: a layer of each kind (the model's own, and Llama's
 * between a mixture's every moe_every-th; the same for a dense model), and each of the three ends. */
typedef struct {
    layer_floats kind[2];   /* [LAYER_OWN] the model's own layer, [LAYER_LLAMA] Llama's where
                             * layer_every puts it */
    tensor_floats embedding, norm, output;
    double ends_whole[3];   /* the embedding's, the norm's and the output's slices unsharded */
} unit_floats;
static unit_floats unit_floats_of(const llama_config *c, int tp, int S, int ep) {
    shard_layout layout[P_NKINDS];
    megatron_layouts(layout);           /* 01: column-parallel wq wk wv w1 w3, row-parallel wo w2   */
    if (tp > 1) vocab_parallel_layouts(layout);   /* 02: the embedding and the output split by
                                                   * vocabulary (padded), as the trainer does at tp > 1 */
    unit_floats u = {0};
    bool seen[2] = {false, false};
    for (int l = 0; l < c->n_layers && l < (c->layer_every > 1 ? c->layer_every : 1); l++) {   /* one of each kind */
        if (seen[layer_kind(c, l)]) continue;
        seen[layer_kind(c, l)] = true;
        layer_floats *x = &u.kind[layer_kind(c, l)];
        int idx[LLAMA_UNIT_MAX_TENSORS], n = llama_unit_tensors(c, l, idx);   /* its blocks' tensors */
        for (int k = 0; k < n; k++) {
            param_spec s = llama_param_spec(c, idx[k]);
            double whole;
            tensor_floats f = floats_of(c, s.kind, l, layout[s.kind], tp, S, ep, &whole);
            /* an expert held whole (ep = S: each rank's own experts) is never gathered, and its
             * gradient stays where the table stores it: no FSDP buffer, no FSDP traffic */
            bool expert = param_kind_is_expert(s.kind), moved = !expert || S / ep > 1;
            x->shard += f.shard;
            x->whole += whole;
            if (moved) x->gathered += f.gathered;
            if (expert && moved) x->experts_gathered += f.gathered;
            if (!expert && !s.is_vector) x->blocks += f.shard;   /* the linears' weights, not the norms' */
        }
    }
    const param_kind ends[3] = {P_TOK_EMBEDDINGS, P_NORM, P_OUTPUT};
    tensor_floats *end_floats[3] = {&u.embedding, &u.norm, &u.output};
    for (int e = 0; e < 3; e++) *end_floats[e] = floats_of(c, ends[e], -1, layout[ends[e]], tp, S, ep, &u.ends_whole[e]);
    return u;
}

/* A stage: its layers (n_own of them the model's own kind: a mixture's), and the ends it holds
 * (chunk 0's embedding on rank 0, the last chunk's norm and output on rank P - 1, as chapter 05
 * places them). */
typedef struct {
    int layers, n_own;
    bool first, last;
    double floats, block_floats, gathered, experts_gathered, ends_gathered;
    double whole;           /* its tensors unsharded (ZeRO-1's values and gradients) */
    double unit_max;        /* its largest unit gathered */
    double layer_max;       /* its largest layer gathered */
} stage_floats;
static stage_floats stage_floats_of(const llama_config *c, const unit_floats *u, int P, int V, int stage) {
    stage_floats s = {0};
    int L = c->n_layers;
    bool *holds = calloc((size_t)L, sizeof *holds);
    if (!holds) { fprintf(stderr, "plan: out of host memory\n"); exit(1); }
    s.layers = plan_calc_rank_layers(L, P, V, stage, holds);
    s.first = stage == 0;
    s.last = stage == P - 1;
    for (int l = 0; l < L; l++) {
        if (!holds[l]) continue;
        const layer_floats *x = &u->kind[layer_kind(c, l)];
        s.n_own += layer_kind(c, l);
        s.floats += x->shard;
        s.whole += x->whole;
        s.block_floats += x->blocks;
        s.gathered += x->gathered;
        s.experts_gathered += x->experts_gathered;
        s.layer_max = fmax(s.layer_max, x->gathered);
    }
    free(holds);
    if (s.first) {
        s.floats += u->embedding.shard;
        s.whole += u->ends_whole[0];
        s.ends_gathered += u->embedding.gathered;
    }
    if (s.last) {
        s.floats += u->norm.shard + u->output.shard;
        s.whole += u->ends_whole[1] + u->ends_whole[2];
        s.ends_gathered += u->norm.gathered + u->output.gathered;
    }
    s.gathered += s.ends_gathered;
    s.unit_max = fmax(s.layer_max, s.ends_gathered);
    return s;
}

/* The FSDP shard group's size under the mesh's degrees g and o->shard_cp (--plan-no-shard-cp, the
 * trainer's --no-fsdp-over-cp). */
static int shard_group(const plan_calc_options *o, const int g[MESH_NDIMS]) {
    int S = 1;
    /* BEGIN ASSIGNMENT: S, the ranks FSDP shards over, with and without o->shard_cp */
    S = g[MESH_DP_SHARD] * (o->shard_cp ? g[MESH_CP] : 1);
    /* END ASSIGNMENT */
    return S;
}

/* The degrees with a dp_shard of -1 replaced by what the others leave of the GPUs (torchtitan's
 * rule, mesh_check's MESH_REST); false, and why, when that is not whole or a degree is not valid.
 * A mesh without -1 is taken as it is (chapter 08's report of its state passes its own). */
static bool resolve_mesh(const plan_calc_options *o, const int mesh[MESH_NDIMS], int g[MESH_NDIMS], char *why,
                         size_t whylen) {
    mesh_shape s;
    memcpy(s.degree, mesh, sizeof s.degree);
    memcpy(g, mesh, sizeof s.degree);
    if (s.dp_shard != MESH_REST) return true;   /* (the degrees' product: plan_calc_mesh's mesh_check) */
    const mesh_requirements names = {.names = MESH_NAMES_PLAN};   /* no sizes: the degrees alone */
    char own[256];
    if (mesh_check(&s, o->gpus, &names, why ? why : own, why ? whylen : sizeof own)) return false;
    memcpy(g, s.degree, sizeof s.degree);
    return true;
}

double plan_calc_stage_floats(const plan_calc_options *o, const int mesh[MESH_NDIMS], int stage) {
    llama_config c = plan_calc_model(o);
    int g[MESH_NDIMS];
    if (!resolve_mesh(o, mesh, g, NULL, 0)) return -1;
    unit_floats u = unit_floats_of(&c, g[MESH_TP], shard_group(o, g), o->ep > 0 ? o->ep : 1);
    return stage_floats_of(&c, &u, g[MESH_PP], o->virtual_stages, stage).floats;
}

// ----------------------------------------------------------------------------------------------
// one mesh

/* Whether chapter 05's schedule admits (P, M, V): pp_schedule_build's own verdict and message.
 * The enumeration asks about the same few (P, M) many times, so the verdicts are kept. */
typedef struct { pp_schedule_kind k; int P, M, V; bool ok; char why[200]; } schedule_verdict;
static bool schedule_admits(pp_schedule_kind k, int P, int M, int V, char *why, size_t len) {
    static schedule_verdict seen[256];
    static int n_seen = 0;
    for (int i = 0; i < n_seen; i++)
        if (seen[i].k == k && seen[i].P == P && seen[i].M == M && seen[i].V == V) {
            snprintf(why, len, "%s", seen[i].why);
            return seen[i].ok;
        }
    schedule_verdict v = {k, P, M, V, false, ""};
    pp_schedule *s = pp_schedule_build(k, P, M, V, v.why, sizeof v.why);
    v.ok = s != NULL;
    pp_schedule_free(s);
    if (n_seen < 256) seen[n_seen++] = v;
    snprintf(why, len, "%s", v.why);
    return v.ok;
}

/* A ring of p ranks: an all-gather or reduce-scatter of n bytes sends (p-1)/p n per rank, an
 * all-reduce twice that (01's Communication). */
static double ring(int p) { return p > 1 ? (double)(p - 1) / p : 0.0; }

/* Whether dimension d's groups stay inside one node: rank-major with tp innermost (mesh.h), a
 * group spans stride x degree consecutive ranks, stride the product of the inner degrees. */
static bool group_in_node(const int g[MESH_NDIMS], int d, int gpus_per_node) {
    long long span = 1;
    for (int e = d; e < MESH_NDIMS; e++) span *= g[e];
    return span <= gpus_per_node && gpus_per_node % span == 0;
}

#define REFUSE(...) do { snprintf(why, whylen, __VA_ARGS__); return -1; } while (0)

int plan_calc_mesh(const plan_calc_options *o, const int mesh[MESH_NDIMS], plan_calc_result *r, char *why,
                   size_t whylen) {
    return plan_calc_mesh_ep(o, mesh, o->ep > 0 ? o->ep : 1, r, why, whylen);
}

int plan_calc_mesh_ep(const plan_calc_options *o, const int mesh[MESH_NDIMS], int ep, plan_calc_result *r, char *why,
                      size_t whylen) {
    memset(r, 0, sizeof *r);
    llama_config c = plan_calc_model(o);
    int T = c.seq_len;
    if (is_moe(&c) && !c.layer)
        REFUSE("%s: a mixture of experts, whose layer is chapter 09's: plan it with 09 --plan (the same flags)",
               o->experts ? "--plan-experts" : plan_presets[o->preset].name);
    if (is_moe(&c) && o->fp8) REFUSE("--plan-fp8 with a mixture of experts: not planned (chapter 09's --fp8 casts the dense linears only and gathers nothing in float8)");
    if (is_moe(&c) && c.moe.capacity_factor > 0 && mesh[MESH_CP] > 1)   /* (chapter 09's rule) */
        REFUSE("a capacity factor with cp %d: a capacity takes a sequence's copies in token order, and cp splits "
               "each sequence over its ranks (chapter 09 refuses it too)", mesh[MESH_CP]);
    if (is_moe(&c) && o->ac == AC_FULL)
        REFUSE("--plan-ac full with a mixture of experts: not planned (recomputing a mixture repeats its "
               "all-to-alls, which chapter 09's formula does not count: it recomputes nothing)");
    if (!is_moe(&c) && ep != 1) REFUSE("--plan-ep %d: a dense model has no experts to split", ep);
    if (o->global_batch % T) REFUSE("the global batch of %lld tokens is not whole sequences of %d", o->global_batch, T);
    long long seqs = o->global_batch / T;
    /* the trainer's techniques' rules (mesh.h, parallel_mesh_requirements): whole heads, kv heads,
     * ffn units and vocabulary rows on each tp rank (01, 02); the sequence in 2 cp chunks and each
     * cp rank's rows over tp (06, 03: sequence parallelism planned); whole layers in every chunk,
     * the first and the last one fewer allowed (05); every dp rank the same number of whole
     * microbatches of o->microbatch sequences (04, 05) */
    mesh_requirements needs = parallel_mesh_rules(&c, seqs, (parallel_mesh_choices){
        .sp = true, .virtual_stages = o->virtual_stages, .short_end_chunks = true, .microbatch_size = o->microbatch,
        .names = MESH_NAMES_PLAN});
    int g[MESH_NDIMS];
    if (!resolve_mesh(o, mesh, g, why, whylen)) return -1;
    int P = g[MESH_PP], R = g[MESH_DP_REPLICATE], C = g[MESH_CP], t = g[MESH_TP], V = o->virtual_stages;
    mesh_shape shape;
    memcpy(shape.degree, g, sizeof shape.degree);
    if (mesh_check(&shape, o->gpus, &needs, why, whylen)) return -1;
    long long dp = (long long)R * g[MESH_DP_SHARD];
    long long M_long = seqs / (dp * o->microbatch);
    if (M_long > 1 << 20) REFUSE("%lld microbatches per dp rank: more than this calculator lists", M_long);
    int M = (int)M_long;
    char sched_why[200];
    if (!schedule_admits(o->schedule, P, M, V, sched_why, sizeof sched_why))
        REFUSE("%s schedule, pp %d, %d microbatches, %d virtual stages: %s", pp_schedule_name(o->schedule), P, M, V,
               sched_why);

    /* ---- sizes ---- */
    int S = shard_group(o, g), mb = o->microbatch, Tl = T / C, hd = llama_head_dim(&c), L = c.n_layers;
    /* 09: the experts split over ep ranks of FSDP's shard group, whole experts on each */
    if (is_moe(&c) && (S % ep || c.moe.experts % ep))
        REFUSE("ep %d does not divide both %s (%d) and the %d experts", ep, o->shard_cp ? "dp_shard x cp" : "dp_shard",
               S, c.moe.experts);
    r->ep = ep;
    bool zero1 = o->dp_mode == PLAN_DP_ZERO1;
    /* the vocabulary as the output GEMM sees it: padded where tp splits it (02) */
    double D = c.dim, H = c.n_heads, Hkv = c.n_kv_heads, F = c.ffn_dim, Vocab = t > 1 ? llama_padded_vocab(&c, t) : c.vocab_size;
    double e_act = o->precision == PLAN_BF16 ? 2 : 4;   /* activations, tp / cp / pp messages, gathers */
    /* the gradients' reductions: fp32 (torchtitan's default reduce dtype, this tutorial's), or bf16
     * (04's --reduce-dtype bf16: each rank's gradients rounded into bf16 copies beside the fp32 ones) */
    double e_grad = o->reduce == PLAN_BF16 ? 2 : 4;
    r->microbatches = M;
    r->shard_ranks = S;
    long bubble_num, bubble_den;
    pp_bubble_formula(o->schedule, P, M, V, &bubble_num, &bubble_den);
    r->bubble = (double)bubble_num / bubble_den;

    /* one layer's activations for one microbatch, this GPU's share (03; 06's rows) */
    llama_dims d = {0};
    d.B = mb; d.T = Tl; d.Ts = Tl / t; d.N = mb * Tl; d.Ns = mb * d.Ts;
    d.D = c.dim; d.hd = hd; d.Hl = c.n_heads / t; d.Hkvl = c.n_kv_heads / t; d.Fl = c.ffn_dim / t;
    d.Vl = (int)Vocab / t; d.v0 = 0;
    d.layer = llama_layer_of(&c);                        /* the blocks whose activations these are */
    /* a mixture's (09): E / ep experts here; the rows they may receive, R, by the trainer's rule
     * (model.c: dropless, every rank's tokens may choose them; or under a capacity) */
    d.E = c.moe.experts; d.k = c.moe.top_k; d.Fe = c.moe.expert_dim; d.ep = ep; d.El = is_moe(&c) ? d.E / ep : 0;
    d.capacity = is_moe(&c) && c.moe.capacity_factor > 0 ? moe_capacity(&c.moe, T) : 0;
    /* what 03's checkpointing mode keeps of the blocks' activations; without checkpointing the attention
     * saves, instead of the softmax B Hl T^2 of the single-device operator, 06's log-sum-exp (the
     * operator planned: blockwise, it never holds the whole softmax) */
    d.probs = (size_t)mb * d.Hl * Tl;                    /* 06: the log-sum-exp, B H Tl */
    double kind_act[2];                                  /* a layer of each kind (LAYER_OWN, LAYER_LLAMA) */
    for (int kind = LAYER_LLAMA; kind <= LAYER_OWN; kind++) {
        llama_dims dk = d;
        dk.layer = kind == LAYER_OWN ? llama_layer_of(&c) : &llama_layer_default;
        kind_act[kind] = llama_layer_act_bytes(&dk, ac_keep_mask(dk.layer, o->ac)) * e_act / 4;
    }
    r->act_layer_bytes = kind_act[LAYER_OWN];
    r->act_dense_layer_bytes = c.layer && c.layer_every > 1 ? kind_act[LAYER_LLAMA] : 0;
    r->expert_rows = is_moe(&c) ? llama_expert_rows(&d, d.N) : 0;
    llama_dims dropless = d;
    dropless.capacity = 0;
    r->expert_rows_capped = is_moe(&c) && r->expert_rows < llama_expert_rows(&dropless, d.N);
    r->act_head_bytes = llama_head_act_bytes(&d, 2) * e_act / 4;   /* 02's loss saves 2 floats a row */
    double attn_fwd, attn_bwd;                           /* 06: the ring's scratch, one layer at a time */
    cp_working_set_formula(CP_RING, C, mb, Tl, d.Hl, d.Hkvl, hd, &attn_fwd, &attn_bwd);
    r->attn_buffer_bytes = fmax(attn_fwd, attn_bwd) * e_act;

    /* ---- compute: FLOPs per token (fwd + bwd = 3 x fwd; causal attention sees T/2 keys on
     * average, 2 T H hd FLOPs a token forward; recomputation adds forwards) ---- */
    /* a layer's linears' parameters per GPU (what a token multiplies by): the attention's and the
     * feed-forward's over tp; a mixture's (09) router and k experts are not split by tp (the tp ranks
     * of a data rank all run its whole mixture), its shared expert is */
    double attn_params = (2 * D * H * hd + 2 * D * Hkv * hd) / t;
    double kind_linear[2] = {attn_params + 3 * D * F / t, attn_params + 3 * D * F / t};
    if (is_moe(&c))
        kind_linear[LAYER_OWN] = attn_params + D * c.moe.experts + c.moe.top_k * 3 * D * c.moe.expert_dim +
                         (c.moe.shared_expert ? 3 * D * F / t : 0);
    double attn_fwd_flops = 2.0 * T * H * hd;
    double linear_passes = o->ac == AC_FULL ? 8 : 6, attn_passes = o->ac == AC_NONE ? 3 : 4;
    double peak = o->tflops > 0 ? o->tflops : o->precision == PLAN_BF16 ? H100_BF16 : H100_FP32;
    double rate = peak * 1e12, rate_linear = o->fp8 ? (o->tflops > 0 ? 2 * o->tflops : H100_FP8) * 1e12 : rate;
    r->model_flops = (double)seqs * T * llama_flops_per_token(&c);   /* the trainer's MFU's, 6 N + 6 L T D */

    unit_floats u = unit_floats_of(&c, t, S, ep);
    double bw[MESH_NDIMS];
    for (int dim = 0; dim < MESH_NDIMS; dim++) {
        r->across_nodes[dim] = !group_in_node(g, dim, o->gpus_per_node);
        bw[dim] = 1e9 * (r->across_nodes[dim] ? o->inter_gbs : o->intra_gbs);
    }
    /* FSDP's group (dp_shard, or dp_shard x cp) lies within dp_shard's span, dp_shard x cp x tp
     * consecutive ranks; HSDP's replicas are further apart still */
    bool fsdp_across = r->across_nodes[MESH_DP_SHARD];
    double bw_fsdp = 1e9 * (fsdp_across ? o->inter_gbs : o->intra_gbs);
    /* 09's ep group: ep ranks of the shard group, cp's (then dp_shard's) first, each tp apart: ep x tp
     * consecutive ranks (ep x cp x tp when the shards span dp_shard alone) */
    long long ep_span = (long long)ep * t * (o->shard_cp ? 1 : C);
    bool ep_across = !(ep_span <= o->gpus_per_node && o->gpus_per_node % ep_span == 0);
    double bw_ep = 1e9 * (ep_across ? o->inter_gbs : o->intra_gbs);
    r->ep_across_nodes = ep_across;

    /* 05: the messages each pipeline rank sends in a step (an activation forward, a gradient back),
     * counted from the schedule's lists */
    long *stage_sends = P > 1 ? calloc((size_t)P, sizeof *stage_sends) : NULL;
    if (P > 1 && !stage_sends) { fprintf(stderr, "plan: out of host memory\n"); exit(1); }
    if (P > 1) {
        pp_schedule *ps = pp_schedule_build(o->schedule, P, M, V, sched_why, sizeof sched_why);
        for (int q = 0; ps && q < P; q++) stage_sends[q] = pp_count_rank_messages(ps, q);
        pp_schedule_free(ps);
    }

    r->layers_min = INT_MAX;
    r->total_bytes = -1;
    for (int s = 0; s < P; s++) {
        stage_floats st = stage_floats_of(&c, &u, P, V, s);
        r->layers_min = st.layers < r->layers_min ? st.layers : r->layers_min;
        r->layers_max = st.layers > r->layers_max ? st.layers : r->layers_max;

        /* memory: 04's 16 bytes a stored parameter; 05's sets in flight of 03's layers */
        int sets = pp_peak_in_flight_formula(o->schedule, P, M, V, s);
        int set_layers = rank_largest_chunk(L, P, V, s);
        double act = (double)sets * rank_largest_set(&c, P, V, s, kind_act);
        if (st.last) act += (V == 1 ? sets : (sets + V - 1) / V) * r->act_head_bytes;
        double fsdp = 0;
        /* what a rank keeps of the values and the gradients: shards (FSDP), or whole (ZeRO-1) */
        double held = zero1 ? st.whole : st.floats;
        if (S > 1) {
            /* 04: a unit by rank, and 1/S of it, in fp32; under a bf16 reduction their bf16 twins too */
            double staging = (4 + (o->reduce == PLAN_BF16 ? 2 : 0)) * st.unit_max * (S + 1) / S;
            if (zero1)    /* 04: the values are whole; only the collectives' staging */
                fsdp = 0;
            else if (P == 1)   /* 04: the gathered ends and three layers (computing, prefetched, sending its
                           * reduce-scatter), a unit's full gradients (fp32) */
                fsdp = e_act * (st.ends_gathered + 3 * st.layer_max) + 4 * (st.ends_gathered + st.layer_max);
            else          /* under a pipeline the stage stays gathered, its gradients whole, for the step */
                fsdp = (e_act + 4) * st.gathered;
            fsdp += staging;
        }
        double total = 8 * held + 8 * st.floats + act + fsdp + r->attn_buffer_bytes;
        if (total > r->total_bytes) {
            r->total_bytes = total;
            r->worst_stage = s;
            r->params_bytes = 4 * held;
            r->grads_bytes = 4 * held;
            r->optim_bytes = 8 * st.floats;
            r->act_bytes = act;
            r->act_sets = sets;
            r->act_set_layers = set_layers;
            r->fsdp_buffer_bytes = fsdp;
            r->buffer_bytes = fsdp + r->attn_buffer_bytes;
        }

        /* traffic per step: each of the M microbatches passes every layer of the stage */
        double tp = 0, cp = 0, pp = 0, dpb = 0, dpr = 0, epb = 0;
        if (t > 1) {   /* 03: per boundary an all-gather + a reduce-scatter of this cp rank's rows */
            double X = (double)mb * Tl * D * e_act;
            double boundaries = 4.0 * st.layers + st.first + st.last, regathers = 2.0 * st.layers + st.last;
            double recomputed = o->ac == AC_FULL ? st.layers : 0;   /* full AC repeats wo's reduce-scatter */
            tp = M * ((2 * boundaries + regathers + recomputed) * ring(t) * X +
                      (st.last ? 3 * 2 * ring(t) * mb * Tl * 4.0 : 0))     /* 02: the loss's M, S, target logit */
                 + 2 * ring(t) * (2.0 * st.layers + st.last) * D * 4.0;   /* 03: the norm gradients, once */
        }
        if (C > 1)     /* 06: the ring, L (3C - 2) K/V blocks of this rank's rows and kv heads */
            cp = (double)M * st.layers * (3.0 * C - 2) * 2.0 * mb * Tl * d.Hkvl * hd * e_act;
        if (C > 1 && !o->shard_cp)   /* 06: the cp ranks sum their gradients (shards, under FSDP), in
                                      * fp32 whatever the data ranks' reduce dtype (08's trainer) */
            cp += 2 * ring(C) * 4 * st.floats;
        if (P > 1)     /* 05: the stage's messages; with SP the residual stream is each tp rank's
                        * T / (cp tp) rows */
            pp = (double)stage_sends[s] * mb * d.Ts * D * e_act;
        if (S > 1) {   /* 04: FSDP; 07: the block weights gathered as float8 bytes */
            /* the dense tensors over the S ranks; 09's experts over the S / ep that share them */
            const layer_floats *last = &u.kind[layer_kind(&c, L - 1)];
            double dense = st.gathered - st.experts_gathered;
            double gather = e_act * dense - (o->fp8 ? (e_act - 1) * S * st.block_floats : 0);
            double scatter = e_grad * dense;
            /* without a pipeline the ends and the last layer are gathered once a pass, not twice */
            double kept = e_act * (st.ends_gathered + last->gathered - last->experts_gathered) -
                          (o->fp8 ? (e_act - 1) * S * last->blocks : 0);
            double expert_gather = e_act * st.experts_gathered, expert_scatter = e_grad * st.experts_gathered;
            double expert_kept = e_act * last->experts_gathered;
            dpb = (P == 1 ? M * (2 * gather - kept + scatter) : gather + scatter) * ring(S) +
                  (P == 1 ? M * (2 * expert_gather - expert_kept + expert_scatter) : expert_gather + expert_scatter) *
                      ring(S / ep);
            if (zero1)   /* 04: once a step, whatever M: the accumulated gradients reduce-scattered, the
                          * updated fp32 values all-gathered */
                dpb = (e_grad + 4) * (dense * ring(S) + st.experts_gathered * ring(S / ep));
        }
        if (ep > 1)    /* 09: its formula for the stage's mixtures, M passes each (the rows' D floats at
                        * e_act bytes: D e_act / 4 floats of 4), a rank's share of the group's bytes,
                        * (ep - 1) / ep of it sent (the copies routed evenly) */
            epb = ring(ep) * o->moe_chapter->alltoall_bytes((double)M * st.n_own, ep, (double)mb * Tl, c.moe.top_k,
                                                            D * e_act / 4, c.moe.experts) / ep;
        if (R > 1) dpr = 2 * ring(R) * e_grad * st.floats;   /* 04: HSDP's all-reduce of the shard */
        r->tp_bytes = fmax(r->tp_bytes, tp);
        r->cp_bytes = fmax(r->cp_bytes, cp);
        r->pp_bytes = fmax(r->pp_bytes, pp);
        r->dp_bytes = fmax(r->dp_bytes, dpb + dpr);
        r->tp_s = fmax(r->tp_s, tp / bw[MESH_TP]);
        r->cp_s = fmax(r->cp_s, cp / bw[MESH_CP]);
        r->pp_s = fmax(r->pp_s, pp / bw[MESH_PP]);
        r->dp_s = fmax(r->dp_s, dpb / bw_fsdp + dpr / bw[MESH_DP_REPLICATE]);
        r->ep_bytes = fmax(r->ep_bytes, epb);
        r->moe_layers_max = st.n_own > r->moe_layers_max && is_moe(&c) ? st.n_own : r->moe_layers_max;
        r->ep_s = fmax(r->ep_s, epb / bw_ep);

        /* compute: this cp rank's tokens, split over tp */
        double tokens = (double)M * mb * Tl;
        double lin = tokens * linear_passes *
                     ((st.layers - st.n_own) * kind_linear[LAYER_LLAMA] + st.n_own * kind_linear[LAYER_OWN]);
        double other = tokens * (st.layers * attn_passes * attn_fwd_flops + (st.last ? 6 * Vocab * D : 0)) / t;
        r->flops_per_gpu = fmax(r->flops_per_gpu, lin + other);
        r->compute_s = fmax(r->compute_s, lin / rate_linear + other / rate);
    }
    free(stage_sends);
    r->fits = r->total_bytes <= o->gpu_mem_gib * 1073741824.0;
    double busy = r->compute_s / (1 - r->bubble);
    r->step_s = busy + r->tp_s + r->cp_s + r->pp_s + r->dp_s + r->ep_s;
    /* with overlap the step is at least the compute and at least each link's traffic */
    double links[2] = {0, 0};   /* [0] inside nodes, [1] across */
    links[r->across_nodes[MESH_TP]] += r->tp_s;
    links[r->across_nodes[MESH_CP]] += r->cp_s;
    links[r->across_nodes[MESH_PP]] += r->pp_s;
    links[r->across_nodes[MESH_DP_REPLICATE]] += r->dp_s;
    links[ep_across] += r->ep_s;
    r->step_overlap_s = fmax(busy, fmax(links[0], links[1]));
    r->mfu = r->model_flops / (o->gpus * r->step_s * rate);
    return 0;
}

// ----------------------------------------------------------------------------------------------
// the report

typedef struct { int mesh[MESH_NDIMS], ep; plan_calc_result r; } candidate;

/* Meshes that fit first, the fastest (no overlap) first; then the ones that do not, smallest first. */
static int by_fit_then_time(const void *a, const void *b) {
    const plan_calc_result *x = &((const candidate *)a)->r, *y = &((const candidate *)b)->r;
    if (x->fits != y->fits) return x->fits ? -1 : 1;
    double kx = x->fits ? x->step_s : x->total_bytes, ky = y->fits ? y->step_s : y->total_bytes;
    return (kx > ky) - (kx < ky);
}

/* Every mesh the cluster admits: tp a power of two inside a node, cp a power of two, pp any
 * degree whose chunks are whole, dp_replicate x dp_shard the rest (every split); for a mixture of
 * experts each ep that divides the shard group and E (or --plan-ep alone). */
static candidate *enumerate(const plan_calc_options *o, int *n_out, int *n_fit) {
    llama_config c = plan_calc_model(o);
    int n = 0, cap = 1024, fit = 0;
    candidate *all = malloc(cap * sizeof *all);
    for (int tp = 1; tp <= o->gpus_per_node && tp <= o->gpus; tp *= 2) {
        for (int cp = 1; (long long)tp * cp <= o->gpus && cp <= c.seq_len / 2; cp *= 2) {
            for (int pp = 1; pp <= c.n_layers + 2 && (long long)tp * cp * pp <= o->gpus; pp++) {
                long long inner = (long long)tp * cp * pp;
                if (o->gpus % inner) continue;
                int dp = (int)(o->gpus / inner);
                for (int dps = 1; dps <= dp; dps++) {
                    if (dp % dps) continue;
                    int S = dps * (o->shard_cp ? cp : 1);
                    for (int ep = 1; ep <= S; ep++) {
                        if (is_moe(&c) ? S % ep || c.moe.experts % ep || (o->ep && ep != o->ep) : ep > 1) continue;
                        candidate k = {.mesh = {pp, dp / dps, dps, cp, tp}, .ep = ep};
                        char why[512];   /* a refusal quotes the schedule's own message (up to 199 bytes) */
                        if (plan_calc_mesh_ep(o, k.mesh, ep, &k.r, why, sizeof why) != 0) continue;
                        if (n == cap) all = realloc(all, (cap *= 2) * sizeof *all);
                        all[n++] = k;
                        fit += k.r.fits;
                    }
                }
            }
        }
    }
    qsort(all, n, sizeof *all, by_fit_then_time);
    *n_out = n;
    *n_fit = fit;
    return all;
}

/* The --plan-mesh's figures: with its --plan-ep, or for a mixture without one the ep that fits
 * and is fastest (as the table orders them); 0, or -1 and why. */
static int given_mesh(const plan_calc_options *o, const llama_config *c, plan_calc_result *r, char *why, size_t len) {
    if (!is_moe(c) || o->ep) return plan_calc_mesh(o, o->mesh, r, why, len);
    int g[MESH_NDIMS];
    if (!resolve_mesh(o, o->mesh, g, why, len)) return -1;
    int S = shard_group(o, g), found = 0;
    for (int ep = 1; ep <= S; ep++) {
        candidate k = {.ep = ep};
        if (S % ep || c->moe.experts % ep || plan_calc_mesh_ep(o, o->mesh, ep, &k.r, why, len) != 0) continue;
        if (!found++ || by_fit_then_time(&k, &(candidate){.r = *r}) < 0) *r = k.r;
    }
    if (!found && !why[0]) snprintf(why, len, "no ep divides both the shard group (%d) and the %d experts", S, c->moe.experts);
    return found ? 0 : -1;
}

static const char *seconds(double s) {
    static char bufs[8][24];
    static int next = 0;
    char *b = bufs[next++ % 8];
    if (s == 0) snprintf(b, 24, "-");
    else if (s < 1e-3) snprintf(b, 24, "%.0f us", s * 1e6);
    else if (s < 1) snprintf(b, 24, "%.1f ms", s * 1e3);
    else snprintf(b, 24, "%.2f s", s);
    return b;
}

static const char *mesh_text(const int g[MESH_NDIMS], char *buf, size_t len) {
    snprintf(buf, len, "pp %d x dp_replicate %d x dp_shard %d x cp %d x tp %d", g[MESH_PP], g[MESH_DP_REPLICATE],
             g[MESH_DP_SHARD], g[MESH_CP], g[MESH_TP]);
    return buf;
}

/* One dimension's traffic line: its group's size, link, bytes, time, and the formula. */
static void traffic_line(const char *name, const char *group, bool across, double bytes, double secs,
                         const char *formula) {
    if (bytes == 0) {
        log0("    %-3s %7s                          -\n", name, group);
        return;
    }
    log0("    %-3s %7s %-13s %12s  %9s   %s\n", name, group, across ? "across nodes" : "in a node", fmt_bytes(bytes),
         seconds(secs), formula);
}
static const char *degree_text(int degree) {
    static char bufs[4][16];
    static int next = 0;
    char *b = bufs[next++ % 4];
    snprintf(b, 16, "%d", degree);
    return b;
}

static void print_mesh(const plan_calc_options *o, const int mesh[MESH_NDIMS], const plan_calc_result *r) {
    int g[MESH_NDIMS];
    resolve_mesh(o, mesh, g, NULL, 0);   /* plan_calc_mesh accepted it */
    char name[128], formula[160];
    int P = g[MESH_PP], V = o->virtual_stages, M = r->microbatches;
    llama_config c = plan_calc_model(o);
    bool zero1 = o->dp_mode == PLAN_DP_ZERO1;
    log0("\nmesh %s = %d GPUs; %s over %s = %d", mesh_text(g, name, sizeof name), o->gpus,
         zero1 ? "ZeRO-1 shards the AdamW state" : "FSDP shards", o->shard_cp ? "dp_shard x cp" : "dp_shard",
         r->shard_ranks);
    if (is_moe(&c))
        log0("; the experts over ep %d of them (%d each%s), each expert's %s over the S/ep = %d left", r->ep,
             c.moe.experts / r->ep, o->ep ? "" : ": the ep that fits and is fastest, no --plan-ep given",
             zero1 ? "AdamW state" : "weights", r->shard_ranks / r->ep);
    log0("\n");
    if (r->layers_min == r->layers_max)
        log0("  pipeline: %d stage%s of %d layers", P, P > 1 ? "s" : "", r->layers_max);
    else
        log0("  pipeline: %d stages of %d to %d layers (the first and the last one fewer)", P, r->layers_min,
             r->layers_max);
    log0("%s; %d microbatch%s of %d sequence%s per dp rank and step; %s bubble %.1f%%\n",
         V > 1 ? ", interleaved" : "", M, M > 1 ? "es" : "", o->microbatch, o->microbatch > 1 ? "s" : "",
         pp_schedule_name(o->schedule), 100 * r->bubble);
    log0("  memory per GPU (stage %d, the fullest):\n", r->worst_stage);
    log0("    parameters (fp32)      %12s   4 %s   (04, on 01/02's tp slices and 05's stage%s)\n",
         fmt_bytes(r->params_bytes), zero1 ? "Psi  " : "Psi_S",
         !is_moe(&c) ? "" : zero1 ? "; 09's experts: E/ep each" : "; 09's experts: E/ep each, over S/ep");
    log0("    gradients (fp32)       %12s   4 %s   (04)\n", fmt_bytes(r->grads_bytes), zero1 ? "Psi  " : "Psi_S");
    log0("    AdamW m, v (fp32)      %12s   8 Psi_S   (04)\n", fmt_bytes(r->optim_bytes));
    if (!is_moe(&c))
        log0("    activations            %12s   %d set%s in flight (05) of %d layer%s x %s (03, --plan-ac %s)%s\n",
             fmt_bytes(r->act_bytes), r->act_sets, r->act_sets > 1 ? "s" : "", r->act_set_layers,
             r->act_set_layers > 1 ? "s" : "", fmt_bytes(r->act_layer_bytes), ac_mode_name(o->ac),
             r->worst_stage == P - 1 ? " + the head's" : "");
    else {   /* a mixture's layer keeps its dispatch buffers: R rows at most reach a GPU's experts */
        char dense[64] = "";
        if (r->act_dense_layer_bytes > 0) snprintf(dense, sizeof dense, ", a dense one %s", fmt_bytes(r->act_dense_layer_bytes));
        log0("    activations            %12s   %d set%s in flight (05) of %d layer%s: a mixture's %s (03, 09: R = %.0f "
             "rows %s)%s, --plan-ac %s%s\n", fmt_bytes(r->act_bytes), r->act_sets, r->act_sets > 1 ? "s" : "",
             r->act_set_layers, r->act_set_layers > 1 ? "s" : "", fmt_bytes(r->act_layer_bytes), r->expert_rows,
             r->expert_rows_capped ? "under the capacity: ep (E/ep) B C" : "at most, dropless: ep N min(k, E/ep)", dense,
             ac_mode_name(o->ac), r->worst_stage == P - 1 ? "; + the head's" : "");
    }
    if (r->shard_ranks > 1 && zero1)
        log0("    ZeRO-1 staging         %12s   %s(S+1)/S largest unit (04)\n", fmt_bytes(r->fsdp_buffer_bytes),
             o->reduce == PLAN_BF16 ? "(4+2)" : "4");
    else if (r->shard_ranks > 1)
        log0("    FSDP buffers           %12s   %s + %s(S+1)/S largest unit (04)\n", fmt_bytes(r->fsdp_buffer_bytes),
             P == 1 ? "gathered ends + 3 layers, full grads of ends + 1 layer"
                    : "the stage gathered and its full gradients, kept for the step",
             o->reduce == PLAN_BF16 ? "(4+2)" : "4");
    log0("    attention working set  %12s   the ring's scratch, one layer (06)\n", fmt_bytes(r->attn_buffer_bytes));
    log0("    total                  %12s   of %.0f GiB: %s\n", fmt_bytes(r->total_bytes), o->gpu_mem_gib,
         r->fits ? "fits" : "DOES NOT FIT");
    log0("  communication per GPU per step (bytes sent, ring model; the busiest stage):\n");
    log0("    dim   group link                  bytes       time   formula\n");
    snprintf(formula, sizeof formula, "M x (2(4L+2) + 2L+1%s) x (t-1)/t x B Tl D (03)",
             o->ac == AC_FULL ? " + L" : "");
    traffic_line("tp", degree_text(g[MESH_TP]), r->across_nodes[MESH_TP], r->tp_bytes, r->tp_s, formula);
    snprintf(formula, sizeof formula, "M x L (3C-2) x 2 B Tl Hkv hd (06, ring)%s",
             o->shard_cp ? "" : " + 2 (C-1)/C x 4 Psi_S");
    traffic_line("cp", degree_text(g[MESH_CP]), r->across_nodes[MESH_CP], r->cp_bytes, r->cp_s, formula);
    traffic_line("pp", degree_text(g[MESH_PP]), r->across_nodes[MESH_PP], r->pp_bytes, r->pp_s,
                 "the stage's sends in 05's schedule x B Tl/t D, of 2 M (PV-1) messages (05)");
    snprintf(formula, sizeof formula, "%s x (S-1)/S x S Psi_S%s%s (04)%s",
             zero1 ? "(1 reduce-scatter + 1 gather of the updated values)"
             : P == 1 ? "M x (2 gathers + 1 reduce-scatter)" : "(1 gather + 1 reduce-scatter)",
             is_moe(&c) ? ", the experts' over S/ep" : "", g[MESH_DP_REPLICATE] > 1 ? " + 2 (R-1)/R x 4 Psi_S" : "",
             o->fp8 ? " float8 gathers (07)" : "");
    char dp_group[32];   /* HSDP's replicas x FSDP's shard group */
    snprintf(dp_group, sizeof dp_group, "%dx%d", g[MESH_DP_REPLICATE], r->shard_ranks);
    traffic_line("dp", dp_group, r->across_nodes[MESH_DP_REPLICATE], r->dp_bytes, r->dp_s, formula);
    if (is_moe(&c)) {
        snprintf(formula, sizeof formula, "(ep-1)/ep x a rank's share of 09's formula (exercise 4), M L = %d x %d "
                 "mixtures, N = B Tl", r->microbatches, r->moe_layers_max);
        traffic_line("ep", degree_text(r->ep), r->ep_across_nodes, r->ep_bytes, r->ep_s, formula);
    }
    double peak = o->tflops > 0 ? o->tflops : o->precision == PLAN_BF16 ? H100_BF16 : H100_FP32;
    log0("  compute: %.1f TFLOP per GPU per step (recomputation included) at %.0f TFLOP/s%s: %s; / (1 - bubble): %s\n",
         r->flops_per_gpu / 1e12, peak, o->fp8 ? " (float8 linears twice as fast)" : "", seconds(r->compute_s),
         seconds(r->compute_s / (1 - r->bubble)));
    log0("  step: %s with no overlap, %s if every transfer hid behind compute; MFU %.1f%% "
         "(6 N + attention FLOPs / (GPUs x step x %.0f TFLOP/s))\n",
         seconds(r->step_s), seconds(r->step_overlap_s), 100 * r->mfu, peak);
}

int plan_calculator_run(const plan_calc_options *o) {
    llama_config c = plan_calc_model(o);
    char err[512];
    if (llama_config_check(&c, o->microbatch, c.seq_len, err, sizeof err) != 0)
        comm_exit_usage("--plan-model / --plan-dim ...: %s", err);
    if (o->global_batch % c.seq_len)
        comm_exit_usage("--plan-global-batch %lld is not a whole number of --plan-seq-len %d sequences: use a multiple "
                        "of %d", o->global_batch, c.seq_len, c.seq_len);
    if (is_moe(&c) && !c.layer)   /* 08's binary: the MoE layer is a later chapter's */
        comm_exit_usage("%s: a mixture of experts, whose layer is chapter 09's: plan it with 09 --plan (the same flags)",
                        o->experts ? "--plan-experts" : plan_presets[o->preset].name);
    if (is_moe(&c) && c.moe.top_k > c.moe.experts)
        comm_exit_usage("top-k %d (%s) is more than the %d experts: a token chooses k of E distinct experts",
                        c.moe.top_k, o->top_k ? "--plan-top-k" : "the preset's, or 2", c.moe.experts);
    if (is_moe(&c) && c.layer_every > c.n_layers)
        comm_exit_usage("--plan-moe-every %d is more than the %d layers: no layer would be a mixture", c.layer_every,
                        c.n_layers);
    if (is_moe(&c) && o->fp8)
        comm_exit_usage("--plan-fp8 with a mixture of experts: not planned (chapter 09's --fp8 casts the dense linears only and gathers nothing in float8)");
    if (is_moe(&c) && o->ac == AC_FULL)
        comm_exit_usage("--plan-ac full with a mixture of experts: not planned (recomputing a mixture repeats its "
                        "all-to-alls, which chapter 09's formula does not count: it recomputes nothing); use selective "
                        "or none");
    if (is_moe(&c) && o->ep && c.moe.experts % o->ep)
        comm_exit_usage("--plan-ep %d does not divide the %d experts: each rank holds E / ep whole experts", o->ep,
                        c.moe.experts);
    if (is_moe(&c) && (double)c.moe.experts * fmax(c.moe.expert_dim, c.dim) > INT_MAX)   /* (a tensor's rows) */
        comm_exit_usage("%d experts of hidden %d at dim %d: the experts' stacked weights have %.0f rows, more than a "
                        "tensor's 2^31 - 1", c.moe.experts, c.moe.expert_dim, c.dim,
                        (double)c.moe.experts * fmax(c.moe.expert_dim, c.dim));
    if (is_moe(&c) && c.moe.capacity_factor > 0 && o->mesh_given && o->mesh[MESH_CP] > 1)   /* (09's rule) */
        comm_exit_usage("--plan-capacity-factor with cp %d: a capacity takes a sequence's copies in token order, and "
                        "cp splits each sequence over its ranks (chapter 09 refuses it too)", o->mesh[MESH_CP]);
    if (!is_moe(&c) && (o->top_k || o->expert_dim || o->shared_expert || o->moe_every || o->capacity_factor || o->ep))
        comm_exit_usage("--plan-top-k, --plan-expert-ffn, --plan-shared-expert, --plan-moe-every, --plan-capacity-factor "
                        "and --plan-ep need a mixture of experts (--plan-model mixtral-8x7b|deepseek-v3 or --plan-experts)");
    if (o->ep && o->mesh_given && o->mesh[MESH_DP_SHARD] > 0 &&
        (o->mesh[MESH_DP_SHARD] * (o->shard_cp ? o->mesh[MESH_CP] : 1)) % o->ep)
        comm_exit_usage("--plan-ep %d does not divide the --plan-mesh's shard group %s (%d)", o->ep,
                        o->shard_cp ? "dp_shard x cp" : "dp_shard", o->mesh[MESH_DP_SHARD] * (o->shard_cp ? o->mesh[MESH_CP] : 1));
    if (o->reduce == PLAN_BF16 && o->precision != PLAN_BF16)   /* (the trainer's rule, data_parallel.h) */
        comm_exit_usage("--plan-reduce-dtype bf16 needs --plan-precision bf16: gradients are summed in bf16 only in a "
                        "bf16 mixed-precision run");
    /* the asked-for mesh is refused before anything is printed: one line, exit 2 */
    char why[512] = "";
    plan_calc_result given;
    if (o->mesh_given && given_mesh(o, &c, &given, why, sizeof why) != 0)
        comm_exit_usage("--plan-mesh %d,%d,%d,%d,%d%s: %s", o->mesh[0], o->mesh[1], o->mesh[2], o->mesh[3], o->mesh[4],
                        o->ep ? " with --plan-ep" : "", why);
    int n = 0, fit = 0;
    candidate *all = enumerate(o, &n, &fit);
    if (n == 0 && o->ep)   /* (without --plan-ep every ep is tried: then "no mesh" below is the model's) */
        comm_exit_usage("--plan-ep %d: no mesh of the %d GPUs admits it with this model and batch (ep must divide the "
                        "shard group %s and the %d experts); leave --plan-ep out to try every ep", o->ep, o->gpus,
                        o->shard_cp ? "dp_shard x cp" : "dp_shard", c.moe.experts);
    bool custom = o->dim || o->n_layers || o->n_heads || o->n_kv_heads || o->ffn_dim || o->vocab;
    double n_params = llama_parameter_count(&c, true);
    long long seqs = o->global_batch / c.seq_len;
    double peak = o->tflops > 0 ? o->tflops : o->precision == PLAN_BF16 ? H100_BF16 : H100_FP32;
    int nodes = (o->gpus + o->gpus_per_node - 1) / o->gpus_per_node;

    char count[32];
    if (n_params >= 1e9) snprintf(count, sizeof count, "%.2f B", n_params / 1e9);
    else snprintf(count, sizeof count, "%.3f M", n_params / 1e6);
    log0("plan: %s%s: dim %d, %d layers, %d heads (%d kv, head dim %d), ffn %d, vocab %d: %s parameters\n",
         custom || o->experts ? "explicit dimensions over " : "", plan_presets[o->preset].label, c.dim, c.n_layers,
         c.n_heads, c.n_kv_heads, llama_head_dim(&c), c.ffn_dim, c.vocab_size, count);
    if (is_moe(&c)) {   /* 09: k of the E experts a token, on every moe_every-th layer */
        int mixtures = c.n_layers / (c.layer_every > 1 ? c.layer_every : 1);
        double active = llama_active_parameter_count(&c);
        char active_text[32];
        if (active >= 1e9) snprintf(active_text, sizeof active_text, "%.2f B", active / 1e9);
        else snprintf(active_text, sizeof active_text, "%.3f M", active / 1e6);
        log0("  mixture of experts (09): %d routed experts of hidden %d, top-%d%s, on %d of the %d layers%s; %s "
             "active a token outside the embedding (6 x that + attention: the FLOPs MFU counts); dispatch %s\n",
             c.moe.experts, c.moe.expert_dim, c.moe.top_k, c.moe.shared_expert ? ", a shared expert of the ffn's size" : "",
             mixtures, c.n_layers, c.layer_every > 1 ? " (Llama's feed-forward between)" : "", active_text,
             c.moe.capacity_factor > 0 ? "under a capacity factor" : "dropless (buffers for the worst case)");
    }
    log0("  state: 16 bytes a parameter, %.2f TB (%s) in all: fp32 values 4 + gradients 4 + AdamW m, v 8 (this "
         "tutorial); bf16 mixed precision keeps 16 too (ZeRO's 2 + 2 + 12 with an fp32 master copy)\n",
         16 * n_params / 1e12, fmt_bytes(16 * n_params));
    log0("  cluster: %d GPUs of %.0f GiB, %d per node (%d node%s); %.0f GB/s inside a node, %.0f GB/s across, per GPU; "
         "%.0f TFLOP/s per GPU%s\n", o->gpus, o->gpu_mem_gib, o->gpus_per_node, nodes, nodes > 1 ? "s" : "",
         o->intra_gbs, o->inter_gbs, peak, o->tflops > 0 ? "" : o->precision == PLAN_BF16 ? " (H100 dense bf16)" : " (H100 fp32, no TF32)");
    log0("  batch: %lld tokens a step = %lld sequences of %d; microbatches of %d; %s schedule%s; AC %s; %s activations "
         "and messages%s%s\n", o->global_batch, seqs, c.seq_len, o->microbatch, pp_schedule_name(o->schedule),
         o->virtual_stages > 1 ? " with virtual stages" : "", ac_mode_name(o->ac),
         o->precision == PLAN_BF16 ? "bf16" : "fp32", o->fp8 ? "; float8 linears and all-gathers" : "",
         o->reduce == PLAN_BF16 ? "; gradients reduced in bf16" : "");
    if (o->dp_mode == PLAN_DP_ZERO1)
        log0("  recipe: Megatron TP + SP (01-03), ring CP with zigzag (06), ZeRO-1 over %s (04: the values and the "
             "gradients whole, the AdamW state sharded; one reduce-scatter and one all-gather a step), HSDP replicas "
             "over dp_replicate\n", o->shard_cp ? "dp_shard x cp" : "dp_shard");
    else
        log0("  recipe: Megatron TP + SP (01-03), ring CP with zigzag (06), FSDP over %s (04; weights gathered once a "
             "step under a pipeline), HSDP replicas over dp_replicate\n", o->shard_cp ? "dp_shard x cp" : "dp_shard");

    if (o->mesh_given) {
        print_mesh(o, o->mesh, &given);
    } else if (n > 0) {
        log0("\n%s", fit ? "the fastest mesh that fits (the table's first line):" :
                           "no mesh fits; the one that needs the least memory:");
        print_mesh(o, all[0].mesh, &all[0].r);
    }

    if (n == 0) {
        log0("\nno mesh splits this model and batch over %d GPUs (tp a power of two up to %d per node)\n", o->gpus,
             o->gpus_per_node);
        free(all);
        return 0;
    }
    log0("\ncandidate meshes: %d that split the model and the batch, %d fit in %.0f GiB; %s\n", n, fit, o->gpu_mem_gib,
         !fit ? "none fits; the smallest:" : is_moe(&c) ? "the fastest (estimated step, no overlap), the best dp split of each "
               "(pp, cp, tp, ep); busy = compute / (1 - bubble):" : "the fastest (estimated step, no overlap), the best dp "
               "split of each (pp, cp, tp); busy = compute / (1 - bubble):");
    bool moe = is_moe(&c);
    log0("   pp  dp_r  dp_s   cp  tp%s     M  bubble   memory/GPU       tp       cp       pp       dp%s     busy"
         "     step   MFU\n", moe ? "   ep" : "", moe ? "       ep" : "");
    int shown = 0;
    for (int i = 0; i < n && shown < o->top; i++) {
        const candidate *k = &all[i];
        if (fit && !k->r.fits) break;
        bool seen = false;   /* the best dp_replicate x dp_shard of each (pp, cp, tp) (and ep) only */
        for (int j = 0; j < i && !seen; j++)
            seen = all[j].mesh[MESH_PP] == k->mesh[MESH_PP] && all[j].mesh[MESH_CP] == k->mesh[MESH_CP] &&
                   all[j].mesh[MESH_TP] == k->mesh[MESH_TP] && all[j].ep == k->ep;
        if (seen) continue;
        const plan_calc_result *r = &k->r;
        char ep_col[16] = "", ep_time[16] = "";
        if (moe) snprintf(ep_col, sizeof ep_col, " %4d", k->ep), snprintf(ep_time, sizeof ep_time, " %8s", seconds(r->ep_s));
        log0("  %3d %5d %5d %4d %3d%s %5d  %5.1f%%  %11s %8s %8s %8s %8s%s %8s %8s %4.1f%%\n", k->mesh[0], k->mesh[1],
             k->mesh[2], k->mesh[3], k->mesh[4], ep_col, r->microbatches, 100 * r->bubble, fmt_bytes(r->total_bytes),
             seconds(r->tp_s), seconds(r->cp_s), seconds(r->pp_s), seconds(r->dp_s), ep_time,
             seconds(r->compute_s / (1 - r->bubble)), seconds(r->step_s), 100 * r->mfu);
        shown++;
    }
    if (o->mesh_given) {   /* where the asked-for mesh stands among all the candidates */
        int g[MESH_NDIMS];
        resolve_mesh(o, o->mesh, g, NULL, 0);
        for (int i = 0; i < n; i++)
            if (memcmp(all[i].mesh, g, sizeof g) == 0 && all[i].ep == given.ep) {
                if (all[i].r.fits)
                    log0("the --plan-mesh is number %d of the %d meshes that fit (every dp split counted): %s a step "
                         "against the first's %s\n", i + 1, fit, seconds(all[i].r.step_s), seconds(all[0].r.step_s));
                else
                    log0("the --plan-mesh does not fit in %.0f GiB\n", o->gpu_mem_gib);
                break;
            }
    }
    free(all);
    return 0;
}
