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

/* Llama 3 / 3.1 (Grattafiori et al. 2024, the paper's table of model sizes): head dim 128 in all
 * three, vocabulary 128256. */
typedef struct { const char *name, *label; int dim, n_layers, n_heads, n_kv_heads, ffn_dim; } llama3_size;
static const llama3_size llama3_sizes[] = {
    {"8b", "Llama 3 8B", 4096, 32, 32, 8, 14336},
    {"70b", "Llama 3 70B", 8192, 80, 64, 8, 28672},
    {"405b", "Llama 3 405B", 16384, 126, 128, 8, 53248},
};
enum { LLAMA3_VOCAB = 128256 };

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
    "  --plan-model 8b|70b|405b       Llama 3 / 3.1 size (default 8b)\n"
    "  --plan-dim D --plan-layers L --plan-heads H --plan-kv-heads K --plan-ffn F --plan-vocab V\n"
    "                                 explicit dimensions over the preset's\n"
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
    static const char *const models[] = {"8b", "70b", "405b", NULL};
    static const char *const ac_modes[] = {"none", "selective", "full", NULL};          /* ac_mode's order */
    static const char *const precisions[] = {"fp32", "bf16", NULL};
    switch (code) {
    case PLAN_OPT_MODEL: o->preset = cli_choice("--plan-model", arg, models); break;
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
    default: return false;
    }
    return true;
}

llama_config plan_calc_model(const plan_calc_options *o) {
    const llama3_size *p = &llama3_sizes[o->preset];
    llama_config c = llama_config_default();   /* norm eps and RoPE theta: not used here */
    c.dim = o->dim > 0 ? o->dim : p->dim;
    c.n_layers = o->n_layers > 0 ? o->n_layers : p->n_layers;
    c.n_heads = o->n_heads > 0 ? o->n_heads : p->n_heads;
    c.n_kv_heads = o->n_kv_heads > 0 ? o->n_kv_heads : p->n_kv_heads;
    c.ffn_dim = o->ffn_dim > 0 ? o->ffn_dim : p->ffn_dim;
    c.vocab_size = o->vocab > 0 ? o->vocab : LLAMA3_VOCAB;
    c.vocab_multiple = o->vocab_multiple;
    c.seq_len = o->seq_len;
    return c;
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

/* The most layers one of rank's chunks holds: a (microbatch, chunk) activation set's size. */
static int rank_largest_chunk(int L, int pp, int v, int rank) {
    int most = 0;
    for (int c = rank; c < pp * v; c += pp) most = chunk_layers(L, pp * v, c) > most ? chunk_layers(L, pp * v, c) : most;
    return most;
}

// ----------------------------------------------------------------------------------------------
// what one GPU stores

/* One tensor on one GPU: its tp slice (01, 02; the vocabulary's padded, param_split_rows) as
 * [units, width] (rows, or a vector's elements), sharded over S ranks by FSDP (04). */
/* BEGIN SOLUTION 08: state per GPU */
/* (units cut in S chunks of ceil(units / S), the last ones padded, as params.c pads them) */
/* END SOLUTION */
typedef struct { double shard, gathered; } tensor_floats;
static tensor_floats floats_of(const llama_config *c, param_kind kind, shard_layout layout, int tp, int S) {
    param_spec s = llama_param_spec(c, llama_param_index_of(c, kind, kind == P_TOK_EMBEDDINGS || kind == P_NORM ||
                                                                         kind == P_OUTPUT ? -1 : 0));
    int r0, nr, c0, nc;
    shard_slice(layout, param_split_rows(c, s, layout, tp), s.cols, 0, tp, &r0, &nr, &c0, &nc);
    long long units = s.is_vector ? nc : nr, width = s.is_vector ? 1 : nc;
    tensor_floats f = {0, 0};
    /* BEGIN ASSIGNMENT: the floats one GPU stores of this tensor, its tp slice's `units` rows of `width` sharded over S ranks (f.shard), and the floats an all-gather of them rebuilds (f.gathered) */
    long long shard_units = (units + S - 1) / S;
    f = (tensor_floats){(double)(shard_units * width), (double)(S * shard_units * width)};
    /* END ASSIGNMENT */
    return f;
}

/* The unit figures every stage is made of: one layer, and each of the three ends. */
typedef struct {
    double layer, layer_blocks, layer_gathered;   /* a layer's shard floats, of which its seven block
                                                   * weights', and gathered                            */
    tensor_floats embedding, norm, output;
} unit_floats;
static unit_floats unit_floats_of(const llama_config *c, int tp, int S) {
    shard_layout layout[P_NKINDS];
    megatron_layouts(layout);           /* 01: column-parallel wq wk wv w1 w3, row-parallel wo w2   */
    if (tp > 1) vocab_parallel_layouts(layout);   /* 02: the embedding and the output split by
                                                   * vocabulary (padded), as the trainer does at tp > 1 */
    unit_floats u = {0};
    int idx[LLAMA_UNIT_MAX_TENSORS], n = llama_unit_tensors(c, 0, idx);   /* a layer's, as its blocks declare them */
    for (int k = 0; k < n; k++) {
        param_spec s = llama_param_spec(c, idx[k]);
        tensor_floats f = floats_of(c, s.kind, layout[s.kind], tp, S);
        u.layer += f.shard;
        u.layer_gathered += f.gathered;
        if (!s.is_vector) u.layer_blocks += f.shard;   /* the linears' weights, not the norms' */
    }
    u.embedding = floats_of(c, P_TOK_EMBEDDINGS, layout[P_TOK_EMBEDDINGS], tp, S);
    u.norm = floats_of(c, P_NORM, layout[P_NORM], tp, S);
    u.output = floats_of(c, P_OUTPUT, layout[P_OUTPUT], tp, S);
    return u;
}

/* A stage: its layers, and the ends it holds (chunk 0's embedding on rank 0, the last chunk's
 * norm and output on rank P - 1, as chapter 05 places them). */
typedef struct {
    int layers;
    bool first, last;
    double floats, block_floats, gathered, ends_gathered, unit_max;   /* unit_max: its largest unit gathered */
} stage_floats;
static stage_floats stage_floats_of(const unit_floats *u, int L, int P, int V, int stage) {
    stage_floats s = {0};
    s.layers = plan_calc_rank_layers(L, P, V, stage, NULL);
    s.first = stage == 0;
    s.last = stage == P - 1;
    s.floats = s.layers * u->layer;
    s.block_floats = s.layers * u->layer_blocks;
    if (s.first) {
        s.floats += u->embedding.shard;
        s.ends_gathered += u->embedding.gathered;
    }
    if (s.last) {
        s.floats += u->norm.shard + u->output.shard;
        s.ends_gathered += u->norm.gathered + u->output.gathered;
    }
    s.gathered = s.layers * u->layer_gathered + s.ends_gathered;
    s.unit_max = fmax(s.layers ? u->layer_gathered : 0, s.ends_gathered);
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
    unit_floats u = unit_floats_of(&c, g[MESH_TP], shard_group(o, g));
    return stage_floats_of(&u, c.n_layers, g[MESH_PP], o->virtual_stages, stage).floats;
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
    memset(r, 0, sizeof *r);
    llama_config c = plan_calc_model(o);
    int T = c.seq_len;
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
    /* what 03's checkpointing mode keeps of the blocks' activations; without checkpointing the attention
     * saves, instead of the softmax B Hl T^2 of the single-device operator, 06's log-sum-exp (the
     * operator planned: blockwise, it never holds the whole softmax) */
    d.probs = (size_t)mb * d.Hl * Tl;                    /* 06: the log-sum-exp, B H Tl */
    r->act_layer_bytes = llama_layer_act_bytes(&d, ac_keep_mask(d.layer, o->ac)) * e_act / 4;
    r->act_head_bytes = llama_head_act_bytes(&d, 2) * e_act / 4;   /* 02's loss saves 2 floats a row */
    double attn_fwd, attn_bwd;                           /* 06: the ring's scratch, one layer at a time */
    cp_working_set_formula(CP_RING, C, mb, Tl, d.Hl, d.Hkvl, hd, &attn_fwd, &attn_bwd);
    r->attn_buffer_bytes = fmax(attn_fwd, attn_bwd) * e_act;

    /* ---- compute: FLOPs per token (fwd + bwd = 3 x fwd; causal attention sees T/2 keys on
     * average, 2 T H hd FLOPs a token forward; recomputation adds forwards) ---- */
    double linear_params = 2 * D * H * hd + 2 * D * Hkv * hd + 3 * D * F;
    double attn_fwd_flops = 2.0 * T * H * hd;
    double linear_passes = o->ac == AC_FULL ? 8 : 6, attn_passes = o->ac == AC_NONE ? 3 : 4;
    double peak = o->tflops > 0 ? o->tflops : o->precision == PLAN_BF16 ? H100_BF16 : H100_FP32;
    double rate = peak * 1e12, rate_linear = o->fp8 ? (o->tflops > 0 ? 2 * o->tflops : H100_FP8) * 1e12 : rate;
    r->model_flops = (double)seqs * T * llama_flops_per_token(&c);   /* the trainer's MFU's, 6 N + 6 L T D */

    unit_floats u = unit_floats_of(&c, t, S);
    double bw[MESH_NDIMS];
    for (int dim = 0; dim < MESH_NDIMS; dim++) {
        r->across_nodes[dim] = !group_in_node(g, dim, o->gpus_per_node);
        bw[dim] = 1e9 * (r->across_nodes[dim] ? o->inter_gbs : o->intra_gbs);
    }
    /* FSDP's group (dp_shard, or dp_shard x cp) lies within dp_shard's span, dp_shard x cp x tp
     * consecutive ranks; HSDP's replicas are further apart still */
    bool fsdp_across = r->across_nodes[MESH_DP_SHARD];
    double bw_fsdp = 1e9 * (fsdp_across ? o->inter_gbs : o->intra_gbs);

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
        stage_floats st = stage_floats_of(&u, L, P, V, s);
        r->layers_min = st.layers < r->layers_min ? st.layers : r->layers_min;
        r->layers_max = st.layers > r->layers_max ? st.layers : r->layers_max;

        /* memory: 04's 16 bytes a stored parameter; 05's sets in flight of 03's layers */
        int sets = pp_peak_in_flight_formula(o->schedule, P, M, V, s);
        int set_layers = rank_largest_chunk(L, P, V, s);
        double act = (double)sets * set_layers * r->act_layer_bytes;
        if (st.last) act += (V == 1 ? sets : (sets + V - 1) / V) * r->act_head_bytes;
        double fsdp = 0;
        if (S > 1) {
            /* 04: a unit by rank, and 1/S of it, in fp32; under a bf16 reduction their bf16 twins too */
            double staging = (4 + (o->reduce == PLAN_BF16 ? 2 : 0)) * st.unit_max * (S + 1) / S;
            if (P == 1)   /* 04: the gathered ends and three layers (computing, prefetched, sending its
                           * reduce-scatter), a unit's full gradients (fp32) */
                fsdp = e_act * (st.ends_gathered + 3 * u.layer_gathered) + 4 * (st.ends_gathered + u.layer_gathered);
            else          /* under a pipeline the stage stays gathered, its gradients whole, for the step */
                fsdp = (e_act + 4) * st.gathered;
            fsdp += staging;
        }
        double total = 16 * st.floats + act + fsdp + r->attn_buffer_bytes;
        if (total > r->total_bytes) {
            r->total_bytes = total;
            r->worst_stage = s;
            r->params_bytes = 4 * st.floats;
            r->grads_bytes = 4 * st.floats;
            r->optim_bytes = 8 * st.floats;
            r->act_bytes = act;
            r->act_sets = sets;
            r->act_set_layers = set_layers;
            r->fsdp_buffer_bytes = fsdp;
            r->buffer_bytes = fsdp + r->attn_buffer_bytes;
        }

        /* traffic per step: each of the M microbatches passes every layer of the stage */
        double tp = 0, cp = 0, pp = 0, dpb = 0, dpr = 0;
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
            double gather = e_act * S * st.floats - (o->fp8 ? (e_act - 1) * S * st.block_floats : 0);
            double scatter = e_grad * S * st.floats;
            /* without a pipeline the ends and the last layer are gathered once a pass, not twice */
            double kept = e_act * (st.ends_gathered + u.layer_gathered) - (o->fp8 ? (e_act - 1) * S * u.layer_blocks : 0);
            dpb = (P == 1 ? M * (2 * gather - kept + scatter) : gather + scatter) * ring(S);
        }
        if (R > 1) dpr = 2 * ring(R) * e_grad * st.floats;   /* 04: HSDP's all-reduce of the shard */
        r->tp_bytes = fmax(r->tp_bytes, tp);
        r->cp_bytes = fmax(r->cp_bytes, cp);
        r->pp_bytes = fmax(r->pp_bytes, pp);
        r->dp_bytes = fmax(r->dp_bytes, dpb + dpr);
        r->tp_s = fmax(r->tp_s, tp / bw[MESH_TP]);
        r->cp_s = fmax(r->cp_s, cp / bw[MESH_CP]);
        r->pp_s = fmax(r->pp_s, pp / bw[MESH_PP]);
        r->dp_s = fmax(r->dp_s, dpb / bw_fsdp + dpr / bw[MESH_DP_REPLICATE]);

        /* compute: this cp rank's tokens, split over tp */
        double tokens = (double)M * mb * Tl;
        double lin = tokens * st.layers * linear_passes * linear_params / t;
        double other = tokens * (st.layers * attn_passes * attn_fwd_flops + (st.last ? 6 * Vocab * D : 0)) / t;
        r->flops_per_gpu = fmax(r->flops_per_gpu, lin + other);
        r->compute_s = fmax(r->compute_s, lin / rate_linear + other / rate);
    }
    free(stage_sends);
    r->fits = r->total_bytes <= o->gpu_mem_gib * 1073741824.0;
    double busy = r->compute_s / (1 - r->bubble);
    r->step_s = busy + r->tp_s + r->cp_s + r->pp_s + r->dp_s;
    /* with overlap the step is at least the compute and at least each link's traffic */
    double links[2] = {0, 0};   /* [0] inside nodes, [1] across */
    links[r->across_nodes[MESH_TP]] += r->tp_s;
    links[r->across_nodes[MESH_CP]] += r->cp_s;
    links[r->across_nodes[MESH_PP]] += r->pp_s;
    links[r->across_nodes[MESH_DP_REPLICATE]] += r->dp_s;
    r->step_overlap_s = fmax(busy, fmax(links[0], links[1]));
    r->mfu = r->model_flops / (o->gpus * r->step_s * rate);
    return 0;
}

// ----------------------------------------------------------------------------------------------
// the report

typedef struct { int mesh[MESH_NDIMS]; plan_calc_result r; } candidate;

/* Meshes that fit first, the fastest (no overlap) first; then the ones that do not, smallest first. */
static int by_fit_then_time(const void *a, const void *b) {
    const plan_calc_result *x = &((const candidate *)a)->r, *y = &((const candidate *)b)->r;
    if (x->fits != y->fits) return x->fits ? -1 : 1;
    double kx = x->fits ? x->step_s : x->total_bytes, ky = y->fits ? y->step_s : y->total_bytes;
    return (kx > ky) - (kx < ky);
}

/* Every mesh the cluster admits: tp a power of two inside a node, cp a power of two, pp any
 * degree whose chunks are whole, dp_replicate x dp_shard the rest (every split). */
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
                    candidate k = {.mesh = {pp, dp / dps, dps, cp, tp}};
                    char why[512];   /* a refusal quotes the schedule's own message (up to 199 bytes) */
                    if (plan_calc_mesh(o, k.mesh, &k.r, why, sizeof why) != 0) continue;
                    if (n == cap) all = realloc(all, (cap *= 2) * sizeof *all);
                    all[n++] = k;
                    fit += k.r.fits;
                }
            }
        }
    }
    qsort(all, n, sizeof *all, by_fit_then_time);
    *n_out = n;
    *n_fit = fit;
    return all;
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
    log0("\nmesh %s = %d GPUs; FSDP shards over %s = %d\n", mesh_text(g, name, sizeof name), o->gpus,
         o->shard_cp ? "dp_shard x cp" : "dp_shard", r->shard_ranks);
    if (r->layers_min == r->layers_max)
        log0("  pipeline: %d stage%s of %d layers", P, P > 1 ? "s" : "", r->layers_max);
    else
        log0("  pipeline: %d stages of %d to %d layers (the first and the last one fewer)", P, r->layers_min,
             r->layers_max);
    log0("%s; %d microbatch%s of %d sequence%s per dp rank and step; %s bubble %.1f%%\n",
         V > 1 ? ", interleaved" : "", M, M > 1 ? "es" : "", o->microbatch, o->microbatch > 1 ? "s" : "",
         pp_schedule_name(o->schedule), 100 * r->bubble);
    log0("  memory per GPU (stage %d, the fullest):\n", r->worst_stage);
    log0("    parameters (fp32)      %12s   4 Psi_S   (04, on 01/02's tp slices and 05's stage)\n",
         fmt_bytes(r->params_bytes));
    log0("    gradients (fp32)       %12s   4 Psi_S   (04)\n", fmt_bytes(r->grads_bytes));
    log0("    AdamW m, v (fp32)      %12s   8 Psi_S   (04)\n", fmt_bytes(r->optim_bytes));
    log0("    activations            %12s   %d set%s in flight (05) of %d layer%s x %s (03, --plan-ac %s)%s\n",
         fmt_bytes(r->act_bytes), r->act_sets, r->act_sets > 1 ? "s" : "", r->act_set_layers,
         r->act_set_layers > 1 ? "s" : "", fmt_bytes(r->act_layer_bytes), ac_mode_name(o->ac),
         r->worst_stage == P - 1 ? " + the head's" : "");
    if (r->shard_ranks > 1)
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
    snprintf(formula, sizeof formula, "%s x (S-1)/S x S Psi_S%s (04)%s",
             P == 1 ? "M x (2 gathers + 1 reduce-scatter)" : "(1 gather + 1 reduce-scatter)",
             g[MESH_DP_REPLICATE] > 1 ? " + 2 (R-1)/R x 4 Psi_S" : "", o->fp8 ? " float8 gathers (07)" : "");
    char dp_group[32];   /* HSDP's replicas x FSDP's shard group */
    snprintf(dp_group, sizeof dp_group, "%dx%d", g[MESH_DP_REPLICATE], r->shard_ranks);
    traffic_line("dp", dp_group, r->across_nodes[MESH_DP_REPLICATE], r->dp_bytes, r->dp_s, formula);
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
    if (o->reduce == PLAN_BF16 && o->precision != PLAN_BF16)   /* (the trainer's rule, data_parallel.h) */
        comm_exit_usage("--plan-reduce-dtype bf16 needs --plan-precision bf16: gradients are summed in bf16 only in a "
                        "bf16 mixed-precision run");
    /* the asked-for mesh is refused before anything is printed: one line, exit 2 */
    char why[512];
    plan_calc_result given;
    if (o->mesh_given && plan_calc_mesh(o, o->mesh, &given, why, sizeof why) != 0)
        comm_exit_usage("--plan-mesh %d,%d,%d,%d,%d: %s", o->mesh[0], o->mesh[1], o->mesh[2], o->mesh[3], o->mesh[4],
                        why);
    bool custom = o->dim || o->n_layers || o->n_heads || o->n_kv_heads || o->ffn_dim || o->vocab;
    double n_params = llama_parameter_count(&c, true);
    long long seqs = o->global_batch / c.seq_len;
    double peak = o->tflops > 0 ? o->tflops : o->precision == PLAN_BF16 ? H100_BF16 : H100_FP32;
    int nodes = (o->gpus + o->gpus_per_node - 1) / o->gpus_per_node;

    char count[32];
    if (n_params >= 1e9) snprintf(count, sizeof count, "%.2f B", n_params / 1e9);
    else snprintf(count, sizeof count, "%.3f M", n_params / 1e6);
    log0("plan: %s%s: dim %d, %d layers, %d heads (%d kv, head dim %d), ffn %d, vocab %d: %s parameters\n",
         custom ? "explicit dimensions over " : "", llama3_sizes[o->preset].label, c.dim, c.n_layers, c.n_heads,
         c.n_kv_heads, llama_head_dim(&c), c.ffn_dim, c.vocab_size, count);
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
    log0("  recipe: Megatron TP + SP (01-03), ring CP with zigzag (06), FSDP over %s (04; weights gathered once a "
         "step under a pipeline), HSDP replicas over dp_replicate\n", o->shard_cp ? "dp_shard x cp" : "dp_shard");

    int n = 0, fit = 0;
    candidate *all = enumerate(o, &n, &fit);
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
         fit ? "the fastest (estimated step, no overlap), the best dp split of each (pp, cp, tp); busy = compute / "
               "(1 - bubble):" : "none fits; the smallest:");
    log0("   pp  dp_r  dp_s   cp  tp     M  bubble   memory/GPU       tp       cp       pp       dp     busy"
         "     step   MFU\n");
    int shown = 0;
    for (int i = 0; i < n && shown < o->top; i++) {
        const candidate *k = &all[i];
        if (fit && !k->r.fits) break;
        bool seen = false;   /* the best dp_replicate x dp_shard of each (pp, cp, tp) only */
        for (int j = 0; j < i && !seen; j++)
            seen = all[j].mesh[MESH_PP] == k->mesh[MESH_PP] && all[j].mesh[MESH_CP] == k->mesh[MESH_CP] &&
                   all[j].mesh[MESH_TP] == k->mesh[MESH_TP];
        if (seen) continue;
        const plan_calc_result *r = &k->r;
        log0("  %3d %5d %5d %4d %3d %5d  %5.1f%%  %11s %8s %8s %8s %8s %8s %8s %4.1f%%\n", k->mesh[0], k->mesh[1],
             k->mesh[2], k->mesh[3], k->mesh[4], r->microbatches, 100 * r->bubble, fmt_bytes(r->total_bytes),
             seconds(r->tp_s), seconds(r->cp_s), seconds(r->pp_s), seconds(r->dp_s),
             seconds(r->compute_s / (1 - r->bubble)), seconds(r->step_s), 100 * r->mfu);
        shown++;
    }
    if (o->mesh_given) {   /* where the asked-for mesh stands among all the candidates */
        int g[MESH_NDIMS];
        resolve_mesh(o, o->mesh, g, NULL, 0);
        for (int i = 0; i < n; i++)
            if (memcmp(all[i].mesh, g, sizeof g) == 0) {
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
