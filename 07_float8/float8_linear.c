/* float8_linear.c: the float8 linear operator (float8_linear.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "float8.h"
#include "gemm_fp8.h"
#include "kernels.h"
#include "llama_kernels.h"
#include "log.h"
#include "model.h"
#include "parity.h"
#include "shard.h"
#include "float8_linear.h"

typedef enum { OPERAND_X = 0, OPERAND_W, OPERAND_DY, NOPERANDS } operand;
typedef enum { ALONG_ROWS = 0, ALONG_COLS } scale_axis;   /* the contraction runs along rows / down columns */

#define CASTS 6   /* a site's casts in call order: fwd x, fwd W, bwd dy (rows), W, x, dy (columns) */

typedef struct float8_state_s {
    float8_options o;
    linear_ops below;               /* the GEMM on the dequantized operands: the plan's linear before */
    comm_group *tp;                 /* NULL: no tensor parallelism                                  */
    shard_layout layout[P_NKINDS];
    int sites;                      /* L * P_NKINDS: a site is layer * P_NKINDS + kind             */
    int groups;                     /* activations are scaled in this many row blocks (a baseline's
                                     * stand-ins for the dp ranks' rows; 1 otherwise)               */
    bool local_amax;                /* --fault local-amax                                          */
    int M;                          /* microbatches a pipeline keeps in flight (1: none)           */
    int mb;                         /* the microbatch of the call in progress (its site's run_when) */
    float *forward_scale;           /* [M][sites][groups + 1]: x's tensorwise scales (per row block)
                                     * and W's, from the forward, for the backward of the same
                                     * microbatch (a pipeline runs other forwards in between)      */
    float *dy_scale;                /* [groups]: dy's, between the backward's two GEMMs             */
    float *history;                 /* delayed: [M][sites][NOPERANDS][groups][H] amaxes, newest first */
    int *seen;                      /* delayed: [M][sites][NOPERANDS][groups] amaxes recorded (<= H) */
    float *scalar;                  /* one device float, for an amax's all-reduce                  */
    int pass;                       /* the model's forward pass of the call in progress (run_when) */
    int step;                       /* the training step it belongs to (0: an evaluation)          */
    float8_cast_observer observer;  /* who is shown each cast (chapter 07's probe), or none        */
    /* Step 1's casts, code by code (float8_compare_casts): the parallel run keeps each cast's
     * codes, gathered over tp, on its tp rank 0 (stash); the baseline's operator, on the same
     * process, compares its own casts with them (peer: the parallel run's state). */
    float **stash;                  /* [dp ranks][M][sites][CASTS] host codes (every data rank's and
                                     * microbatch's, on world rank 0), or NULL                     */
    float *stash_scale;             /* [dp ranks][M][sites][CASTS][tp ranks] each tp rank's tensorwise
                                     * scale                                                        */
    int stash_ranks;                /* tp ranks                                                     */
    comm_group *dp;                 /* the data ranks (plan->groups.batch): their codes gathered to data
                                     * rank 0 (NULL: none)                                          */
    int stash_dp;                   /* data ranks (1: none)                                         */
    int *stash_pass;                /* [slots] the forward pass whose codes the slot holds (0: none)  */
    comm_group *casts;              /* the world, for a pipeline's later stages to send their casts to
                                     * world rank 0 (comm_host_post; NULL: no comparison)           */
    struct float8_state_s *peer;
    const llama_plan *peer_plan;    /* the parallel run's plan (its pipeline stage's layers)        */
    float8_cast_tally cmp;
    long long rowwise_scaled_gemms; /* rowwise GEMMs run on the float8 GEMM with scale vectors      */
} float8_state;

/* Rowwise on the float8 GEMM: the backward casts' scales, kept for its GEMMs (device arrays; NULL
 * when the emulation runs). */
typedef struct { float *dy_rows, *w_cols, *x_cols, *dy_cols; } rowwise_kept;

static const char *recipe_names[FLOAT8_NRECIPES] = {"off", "tensorwise", "rowwise", "delayed"};
const char *float8_recipe_name(float8_recipe r) { return recipe_names[r]; }
static const char *role_names[FLOAT8_NROLES] = {"cast x", "cast W", "cast dy", "y = x W^T", "dx = dy W", "dW = dy^T x"};
const char *float8_role_name(int role) { return role_names[role]; }

/* torchao's formats: inputs and weights E4M3, the gradient E5M2 (its range, not its precision,
 * is what a gradient needs); rowwise keeps E4M3 for all (its per-row scales cover the range). */
float8_format float8_role_format(float8_recipe r, int role) {
    return role == FLOAT8_CAST_DY && r != FLOAT8_ROWWISE ? FLOAT8_E5M2 : FLOAT8_E4M3;
}

static void float8_free_state(void *state);
const plan_technique float8_technique = {"float8", float8_free_state};
static float8_state *state_of(const llama_plan *p) { return plan_state(p, &float8_technique); }
static int site_index(linear_site at) { return at.layer * P_NKINDS + at.kind; }

/* ---- accuracy ---------------------------------------------------------------------------------
 * SQNR = 20 log10(|ref| / |ref - got|) over the whole tensor (torchao's compute_error), in
 * double on the host; +inf when the two are equal. */
double float8_sqnr_db(const float *ref_dev, const float *got_dev, size_t n) {
    float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    device_copy_to_host(ref, ref_dev, n * sizeof(float));
    device_copy_to_host(got, got_dev, n * sizeof(float));
    double signal = 0, noise = 0;
    for (size_t i = 0; i < n; i++) {
        signal += (double)ref[i] * ref[i];
        noise += ((double)ref[i] - got[i]) * ((double)ref[i] - got[i]);
    }
    free(ref);
    free(got);
    return noise == 0 ? INFINITY : 10 * log10(signal / noise);
}

/* A cast of `hi` [n] to the float8 values `q` [n], shown to the observer (float8_observe_casts). */
static void observe(float8_state *s, int role, linear_site at, const float *hi, const float *q, size_t n) {
    if (s->observer.cast) s->observer.cast(s->observer.state, role, at, hi, q, n);
}

/* ---- step 1's casts, code by code ------------------------------------------------------------
 * Both runs cast the same tensors at step 1, but a tensor computed on several ranks (a partial
 * sum all-reduced, a GEMM of another shape) can differ from the single device's in its last bit,
 * and a value that lies on a rounding boundary then lands on the neighbouring code. So the codes
 * are compared: equal, the neighbouring code (a boundary case, the only difference the same
 * scales can produce), or anything else (a wrong scale or cast). */

/* The codes of one cast (q = the fake-quantized values, x its input) as floats 0..255, on the
 * host of tp rank 0, gathered over tp as `layout` cuts the [rows, cols] operand. */
static float *gather_codes(float8_state *s, const float *x, float scale, const float *scales, float8_scaling how,
                           int rows, int cols, shard_layout layout, float8_format fmt, int *full_rows, int *full_cols) {
    size_t n = (size_t)rows * cols;
    uint8_t *q = device_alloc(n, MEM_BUFFERS), *bytes = malloc(n);
    float8_quantize_scaled(q, x, n, cols, how, scale, scales, fmt);
    device_copy_to_host(bytes, q, n);
    float *codes = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) codes[i] = bytes[i];
    int p = s->tp ? s->tp->size : 1;
    *full_rows = layout == SHARD_ROWS ? rows * p : rows;
    *full_cols = layout == SHARD_COLS ? cols * p : cols;
    float *all = codes;
    if (s->tp && layout != SHARD_REPLICATED) {
        float *dev = device_alloc_floats(n, MEM_BUFFERS);
        device_copy_to_device(dev, codes, n * sizeof(float));
        all = s->tp->rank == 0 ? malloc((size_t)*full_rows * *full_cols * sizeof(float)) : NULL;
        shard_gather_to_host(s->tp, layout, dev, *full_rows, *full_cols, all);
        device_free(dev);
        free(codes);
    }
    device_free(q);
    free(bytes);
    return all;
}

/* One cast's codes against the parallel run's. Until a cast has had a neighbour, every code must
 * be equal or a neighbour; the casts after it are computed from values that already moved by a
 * whole float8 step, so they are counted apart (differ_after), not judged. */
static int code_on_the_line(int code) { return code & 0x80 ? -(code & 0x7F) : code; }   /* +0, -0: one point */
static void compare_codes(float8_state *s, const float *mine, const float *theirs, size_t n) {
    long long equal = 0, neighbour = 0, other = 0;
    for (size_t i = 0; i < n; i++) {
        /* neighbours on the number line: the next code of the same sign, or across zero (a value
         * of a few ulps whose sign the last bits decided: -0 is +0, -min next to +0) */
        int d = abs(code_on_the_line((int)mine[i]) - code_on_the_line((int)theirs[i]));
        if (d == 0) equal++;
        else if (d == 1) neighbour++;
        else other++;
    }
    float8_cast_tally *k = &s->cmp;
    if (k->neighbour > 0) {   /* a whole float8 step has already happened upstream */
        k->equal_after += equal;
        k->differ_after += neighbour + other;
        return;
    }
    k->equal += equal;
    k->neighbour += neighbour;
    k->other += other;
}

/* Where the parallel run keeps the codes of data rank d's microbatch mb at one cast. */
static size_t stash_slot(const float8_state *s, int d, int mb, linear_site at, int cast) {
    return (((size_t)d * s->M + mb) * s->sites + site_index(at)) * CASTS + cast;
}

/* The parallel run keeps one cast's codes (gathered over tp on tp rank 0) and every tp rank's
 * scale, for every data rank and microbatch: each data rank's tp rank 0 sends them to data
 * rank 0 (the data ranks of one tp coordinate are all tp rank 0 or none), so world rank 0, where
 * the baseline runs, holds every row block's casts. Collective over tp, then over the data ranks. */
/* A slot's codes and scales into the stash, stamped with the pass that cast them. */
static void stash_put(float8_state *s, size_t slot, const float *codes, const float *scales, size_t n, int pass) {
    int T = s->stash_ranks;
    free(s->stash[slot]);
    s->stash[slot] = malloc(n * sizeof(float));
    memcpy(s->stash[slot], codes, n * sizeof(float));
    memcpy(s->stash_scale + slot * T, scales, (size_t)T * sizeof(float));
    s->stash_pass[slot] = pass;
}

/* A pipeline's later stage runs on other ranks than world rank 0, where the baseline compares:
 * its keeper (data rank 0, tp rank 0 of the stage) posts each slot to world rank 0 as one message
 * (slot, pass, n, T, codes, scales), which the baseline takes when it reaches that cast
 * (stash_fetch). The stage has posted all of a pass's casts before world rank 0 has finished the
 * pass (its last backward needs the stage's), so the baseline, which runs after it, never waits for
 * a cast still to come. */
typedef struct { uint64_t slot; int32_t pass, n, T, pad; } cast_header;
static void stash_post(float8_state *s, size_t slot, const float *codes, const float *scales, size_t n) {
    int T = s->stash_ranks;
    size_t bytes = sizeof(cast_header) + (n + (size_t)T) * sizeof(float);
    char *msg = malloc(bytes);
    *(cast_header *)msg = (cast_header){slot, s->pass, (int32_t)n, T, 0};
    memcpy(msg + sizeof(cast_header), codes, n * sizeof(float));
    memcpy(msg + sizeof(cast_header) + n * sizeof(float), scales, (size_t)T * sizeof(float));
    comm_host_post(s->casts, msg, bytes, 0);
    free(msg);
}
/* On world rank 0: the later stages' messages taken into the stash until `slot` holds `pass`'s. */
static void stash_fetch(float8_state *p, size_t slot, int pass) {
    while (p->stash_pass[slot] != pass) {
        size_t bytes = 0;
        char *msg = comm_host_take(p->casts, &bytes);
        cast_header h = *(const cast_header *)msg;
        const float *codes = (const float *)(msg + sizeof(cast_header));
        if (bytes != sizeof h + ((size_t)h.n + (size_t)h.T) * sizeof(float) || h.T != p->stash_ranks) {
            fprintf(stderr, "float8: a cast message of %zu bytes that does not match its header\n", bytes);
            exit(1);
        }
        stash_put(p, (size_t)h.slot, codes, codes + h.n, (size_t)h.n, h.pass);
        free(msg);
    }
}

static void keep_codes(float8_state *s, linear_site at, int cast, float *codes, float scale, size_t n) {
    int T = s->stash_ranks, D = s->stash_dp;
    float *scales = malloc((size_t)T * sizeof(float));
    if (s->tp) comm_host_gather(s->tp, &scale, scales, 1, 0);
    else scales[0] = scale;
    bool keeper = !s->tp || s->tp->rank == 0;
    if (keeper && s->dp) {
        bool root = s->dp->rank == 0;
        float *all = root ? malloc((size_t)D * n * sizeof(float)) : NULL;
        float *all_scales = root ? malloc((size_t)D * T * sizeof(float)) : NULL;
        comm_host_gather(s->dp, codes, all, n, 0);
        comm_host_gather(s->dp, scales, all_scales, (size_t)T, 0);
        free(codes);
        free(scales);
        codes = all;
        scales = all_scales;
        keeper = root;
    }
    bool here = comm_world()->rank == 0;   /* else a pipeline's later stage: to world rank 0 */
    for (int d = 0; keeper && d < D; d++) {
        size_t slot = stash_slot(s, d, s->mb, at, cast);
        if (here) stash_put(s, slot, codes + (size_t)d * n, scales + (size_t)d * T, n, s->pass);
        else stash_post(s, slot, codes + (size_t)d * n, scales + (size_t)d * T, n);
    }
    free(codes);
    free(scales);
}

/* After a cast at step 1: the parallel run keeps its codes, the baseline compares with them.
 * `group`: the row block of an activation (0 for a weight). The baseline's row block g is data
 * rank g / M's microbatch g % M of the parallel run (M: its pipeline's microbatches, 1 without),
 * so a value on a rounding tie is judged alike in every row block, whichever rank cast it. */
static void keep_or_compare(float8_state *s, linear_site at, int cast, int group, const float *x, float scale,
                            const float *scales, float8_scaling how, int rows, int cols, shard_layout layout,
                            float8_format fmt) {
    if (s->step != 1 || (!s->stash && !s->peer)) return;
    int R, Cn;
    float *codes = gather_codes(s, x, scale, scales, how, rows, cols, layout, fmt, &R, &Cn);
    if (s->stash) {
        keep_codes(s, at, cast, codes, scale, (size_t)R * Cn);
        return;
    }
    float8_state *p = s->peer;   /* (its stash takes the later stages' messages) */
    int d = group / p->M, mb = group % p->M;
    size_t slot = d < p->stash_dp ? stash_slot(p, d, mb, at, cast) : 0;
    /* a pipeline's later stage ran this layer on other ranks: its casts come as messages */
    if (p->stash && d < p->stash_dp && !plan_holds(s->peer_plan, at.layer + 1, at.kind, at.layer)) stash_fetch(p, slot, s->pass);
    float *theirs = p->stash && d < p->stash_dp && p->stash_pass[slot] == s->pass ? p->stash[slot] : NULL;
    /* A tensorwise scale comes from an amax, which a last-bit difference of the tensor moves by
     * a last bit at most: a scale further than 1e-5 away, on any tp rank, is a wrong scale,
     * whatever the codes show. */
    for (int q = 0; theirs && s->cmp.neighbour == 0 && how == FLOAT8_PER_TENSOR && q < p->stash_ranks; q++)
        if (fabs((double)scale - p->stash_scale[slot * p->stash_ranks + q]) > 1e-5 * fabs((double)scale)) {
            s->cmp.scale_differs++;
            break;
        }
    if (theirs) compare_codes(s, codes, theirs, (size_t)R * Cn);
    else s->cmp.missing++;
    free(codes);
}

/* ---- amax and scales ---------------------------------------------------------------------------*/

/* MAX over tp of amax[k] (device), unless the fault keeps each shard's own. Issues: one all-reduce. */
static void agree_amax(float8_state *s, float *amax_dev, int k) {
    if (!s->local_amax) comm_all_reduce(s->tp, amax_dev, (size_t)k, COMM_MAX);
}

/* This step's amax of a whole tensor: max |x| over this rank's part, and over tp when tp cuts it. */
static float tensor_amax(float8_state *s, const float *x, size_t n, bool cut) {
    float amax = float8_amax(x, n);
    if (cut && s->tp) {
        device_copy_to_device(s->scalar, &amax, sizeof amax);
        agree_amax(s, s->scalar, 1);
        device_copy_to_host(&amax, s->scalar, sizeof amax);
    }
    return amax;
}

/* The tensorwise scale of one operand at one site: from this step's amax (tensorwise), or from the
 * amax history (delayed: the largest of the last H steps; the first step, its own), after which
 * this step's amax joins the history. */
static float tensor_scale(float8_state *s, linear_site at, operand which, int group, const float *x, size_t n,
                          bool cut, float8_format fmt) {
    float amax = tensor_amax(s, x, n, cut);
    if (s->o.recipe != FLOAT8_DELAYED) return float8_scale_from_amax(amax, fmt, 0);
    int H = s->o.amax_history, slot = ((s->mb * s->sites + site_index(at)) * NOPERANDS + which) * s->groups + group;
    float *hist = s->history + (size_t)slot * H;
    float known = amax;   /* the amax the scale is computed from */
    /* BEGIN ASSIGNMENT: delayed scaling: `known` = the largest amax of the history hist[0 .. seen[slot]) (the first step, with an empty history: this step's amax), then push this step's amax at the front of the history (newest first, at most H kept; seen[slot] counts them) */
    if (s->seen[slot] > 0) {
        known = hist[0];
        for (int i = 1; i < s->seen[slot]; i++) known = float8_amax_merge(known, hist[i]);
    }
    memmove(hist + 1, hist, (size_t)(H - 1) * sizeof(float));
    hist[0] = amax;
    if (s->seen[slot] < H) s->seen[slot]++;
    /* END ASSIGNMENT */
    return float8_scale_from_amax(known, fmt, 0);
}

/* Rowwise: one power-of-two scale per row (ALONG_ROWS) or per column (ALONG_COLS) of x [rows,
 * cols], from its amaxes, agreed over tp when tp cuts the contraction dimension (`cut_along`).
 * Returns the scales on the device (the caller frees them). Issues: that all-reduce, if any. */
static float *rowwise_scales(float8_state *s, const float *x, int rows, int cols, scale_axis axis, bool cut_along,
                             float8_format fmt) {
    int k = axis == ALONG_ROWS ? rows : cols;
    float *amax = device_alloc_floats((size_t)k, MEM_BUFFERS), *scales = device_alloc_floats((size_t)k, MEM_BUFFERS);
    if (axis == ALONG_ROWS) float8_amax_rows(amax, x, rows, cols);
    else float8_amax_cols(amax, x, rows, cols);
    if (cut_along && s->tp) agree_amax(s, amax, k);
    /* --fault local-amax: a power-of-two scale from a shard's own amax differs from the tensor's by
     * whole binades only, which changes the codes but (away from the subnormals) not the values
     * multiplied, so no replay could see the bug: the faulty shards also skip the rounding down,
     * and each scales its rows by max / its own amax, a grid that the single device never uses. */
    bool pow2 = !(s->local_amax && cut_along && s->tp);
    float8_scales_from_amax(scales, amax, k, fmt, pow2);
    device_free(amax);
    return scales;
}

/* q (=) x [rows, cols] cast to float8 and back (what the float8 GEMM multiplies).
 * Tensorwise and delayed: one scale per tensor, the recipe's, written to scale_io, or read from
 * it when `reuse` (the backward takes the forward's). Rowwise: one power-of-two scale per row
 * (ALONG_ROWS) or per column (ALONG_COLS), the amaxes agreed over tp when tp cuts the contraction
 * dimension (`cut_along`). `cut`: tp cuts the tensor at all (a tensorwise amax is agreed).
 * keep_scales (rowwise, may be NULL): the scales are copied there, group after group.
 * An activation (x, dy) is cast in s->groups row blocks, each with its own scales: the baseline
 * of a data-parallel run scales each dp rank's rows apart, as the ranks do (scale_io[group]). */
static void cast_operand(float8_state *s, linear_site at, operand which, int cast, shard_layout layout, float *q,
                         const float *x, int rows, int cols, scale_axis axis, bool cut, bool cut_along,
                         float8_format fmt, float *scale_io, bool reuse, float *keep_scales) {
    int G = which == OPERAND_W ? 1 : s->groups, rows_g = rows / G;
    size_t n = (size_t)rows_g * cols;
    for (int g = 0; g < G; g++) {
        const float *xg = x + (size_t)g * n;
        float *qg = q + (size_t)g * n;
        if (s->o.recipe != FLOAT8_ROWWISE) {
            float scale = reuse ? scale_io[g] : tensor_scale(s, at, which, g, xg, n, cut, fmt);
            if (!reuse) scale_io[g] = scale;
            float8_fake_quantize(qg, xg, n, scale, fmt);
            keep_or_compare(s, at, cast, g, xg, scale, NULL, FLOAT8_PER_TENSOR, rows_g, cols, layout, fmt);
            continue;
        }
        float *scales = rowwise_scales(s, xg, rows_g, cols, axis, cut_along, fmt);
        float8_scaling how = axis == ALONG_ROWS ? FLOAT8_PER_ROW : FLOAT8_PER_COL;
        float8_fake_quantize_scaled(qg, xg, n, cols, how, 0.0f, scales, fmt);
        keep_or_compare(s, at, cast, g, xg, 0, scales, how, rows_g, cols, layout, fmt);
        if (keep_scales) {   /* group g's scales after the earlier groups': [G][rows_g or cols] */
            int k = axis == ALONG_ROWS ? rows_g : cols;
            device_copy(keep_scales + (size_t)g * k, scales, (size_t)k * sizeof(float));
        }
        device_free(scales);
    }
}

/* Which operands tp cuts at this site (float8_linear.h's table). */
static bool column_parallel(const float8_state *s, linear_site at) { return s->tp && s->layout[at.kind] == SHARD_ROWS; }
static bool row_parallel(const float8_state *s, linear_site at) { return s->tp && s->layout[at.kind] == SHARD_COLS; }
/* The block linears float8 casts: not the output layer (its logits feed the loss directly), nor a
 * mixture's router (its scores choose the experts: a flipped choice is not a rounding error) and
 * experts (chapter 09: an expert's rows are the tokens of its ep group that chose it, unequal row
 * blocks of the single device's batch that change every step, which the equal activation groups
 * cannot describe; torchao gives grouped experts a recipe of their own). */
static bool in_blocks(linear_site at) {
    return at.kind != P_OUTPUT && at.kind != P_ROUTER && !param_kind_is_expert(at.kind);
}
bool float8_casts_site(linear_site at) { return in_blocks(at); }

/* ---- the float8 GEMMs of the per-tensor recipes ------------------------------------------------
 * Tensorwise and delayed scaling give each operand one scale (per row block of an activation in a
 * data-parallel baseline), which is what cuBLASLt's float8 GEMM takes: the operands go to it as
 * float8 bytes with their scales (gemm_fp8.h: cublasLtMatmul on the GPU; on the CPU its twin
 * decodes them and runs the fp32 GEMM, the emulation torchao uses). cuBLASLt wants the
 * contraction contiguous in both operands, C = A B^T with A [M, K], B [N, K]:
 *   y  = x W^T     A = x [N, in],         B = W [out, in]          as they are
 *   dx = dy W      A = dy [N, out],       B = W^T [in, out]        W transposed
 *   dW = dy^T x    A = dy^T [out, N],     B = x^T [in, N]          both transposed
 * Rowwise scaling (a scale per row of each operand) keeps the emulation on both backends. */

/* ---- a contraction cut as the parallel run cuts it ----------------------------------------------
 * On a tensor-parallel site the ranks split one GEMM's contraction: a row-parallel forward (y = x
 * W^T, over `in`) and a column-parallel backward (dx = dy W, over `out`). Each rank's float8 GEMM
 * adds its share of the products, and the all-reduce adds the shares in fp32. On the CPU every
 * sum is fp32, so one long sum on the baseline and tp short ones differ by fp32 rounding. Hopper's
 * float8 tensor cores keep about 14 bits in their accumulator (DeepSeek-V3 technical report, 3.3.2;
 * test_float8_linear measured 2e-4 of the largest output on an H100): there the two differ by
 * 2^-14 of the sums, casts downstream land on other codes, and a correct tp layout failed its parity
 * check on an H100 (make gpu-check, 2026-11-28: loss and gradients 2 to 8% apart, dp layouts
 * exact). So the baseline cuts that contraction as the parallel run does: tp slices, each a GEMM of
 * one rank's shape (the same kernel, the same products, the same accumulator), their results added
 * in rank order in fp32. The single device still computes the whole product; only the grouping of
 * its additions follows the layout, as its row blocks already follow the data ranks' scales. */
static int contraction_cuts(const float8_state *s, linear_site at, bool backward) {
    const float8_state *p = s->peer;   /* the parallel run's state, on the baseline (--check) */
    if (!p || !p->tp || p->tp->size < 2) return 1;
    return (backward ? column_parallel(p, at) : row_parallel(p, at)) ? p->tp->size : 1;
}

/* One float8 GEMM's operands besides their bytes: formats and scales, one per tensor (rowwise:
 * a vector per row of each operand, which a cut along the contraction leaves as they are). */
typedef struct {
    float8_format fa, fb;
    float a_scale, b_scale;              /* tensorwise, delayed                               */
    const float *a_rows, *b_rows;        /* rowwise: [M], [N] on the device; NULL otherwise   */
} fp8_gemm_args;

static bool gemm_fp8_one(float *C, const uint8_t *A, const uint8_t *B, int M, int N, int K, const fp8_gemm_args *g) {
    if (!g->a_rows) {
        gemm_fp8(C, A, g->fa, g->a_scale, B, g->fb, g->b_scale, M, N, K);
        return true;
    }
    return gemm_fp8_rowwise(C, A, g->fa, g->a_rows, B, g->fb, g->b_rows, M, N, K);
}

/* C [M, N] (=) A [M, K] B [N, K]^T as `cuts` GEMMs over consecutive K / cuts slices of the
 * contraction, added in order (cuts = 1: one GEMM). False where the float8 GEMM refused (rowwise
 * on a backend or shape without it): C is then unspecified and the caller emulates. */
static bool gemm_fp8_cut(float *C, const uint8_t *A, const uint8_t *B, int M, int N, int K, int cuts,
                         const fp8_gemm_args *g) {
    if (cuts == 1) return gemm_fp8_one(C, A, B, M, N, K, g);
    if (K % cuts) {   /* (a tp rank's share is whole: the mesh rules divide every cut dimension by tp) */
        fprintf(stderr, "gemm_fp8_cut: the contraction %d is not cut in %d equal slices\n", K, cuts);
        abort();
    }
    int Kc = K / cuts;
    if (g->a_rows && gemm_fp8_shape_error(M, N, Kc)) return false;
    uint8_t *Ac = device_alloc((size_t)M * Kc, MEM_BUFFERS), *Bc = device_alloc((size_t)N * Kc, MEM_BUFFERS);
    float *part = device_alloc_floats((size_t)M * N, MEM_BUFFERS);
    bool done = true;
    for (int r = 0; r < cuts && done; r++) {
        device_copy_2d(Ac, (size_t)Kc, A + (size_t)r * Kc, (size_t)K, (size_t)Kc, (size_t)M);
        device_copy_2d(Bc, (size_t)Kc, B + (size_t)r * Kc, (size_t)K, (size_t)Kc, (size_t)N);
        done = gemm_fp8_one(r == 0 ? C : part, Ac, Bc, M, N, Kc, g);
        if (done && r > 0) add_inplace(C, part, (size_t)M * N);
    }
    device_free(Ac); device_free(Bc); device_free(part);
    return done;
}

/* x [rows, cols] as float8 bytes, row block g (of G) with scale[g]. */
static uint8_t *to_bytes(const float *x, int rows, int cols, const float *scale, int G, float8_format fmt) {
    size_t n = (size_t)(rows / G) * cols;
    uint8_t *b = device_alloc((size_t)rows * cols, MEM_BUFFERS);
    for (int g = 0; g < G; g++) float8_quantize(b + g * n, x + g * n, n, scale[g], fmt);
    return b;
}

/* C [rows, N] (=) A [rows, K] B [N, K]^T in G row blocks, as each data rank multiplies its own rows
 * (a baseline's stand-ins for them; G = 1 otherwise), the contraction in `cuts` slices. Block g
 * takes a_block_scale[g] (tensorwise, delayed) or its rows of g->a_rows (rowwise); the rest of g
 * is the same for every block. False where a float8 GEMM refused (rowwise): the caller emulates. */
static bool gemm_blocks(float *C, const uint8_t *A, const uint8_t *B, int G, int rows, int N, int K, int cuts,
                        const fp8_gemm_args *g, const float *a_block_scale) {
    int rg = rows / G;
    bool done = true;
    for (int b = 0; b < G && done; b++) {
        fp8_gemm_args block = *g;
        if (g->a_rows) block.a_rows = g->a_rows + (size_t)b * rg;
        else block.a_scale = a_block_scale[b];
        done = gemm_fp8_cut(C + (size_t)b * rg * N, A + (size_t)b * rg * K, B, rg, N, K, cuts, &block);
    }
    return done;
}

static void float8_bytes_forward(float8_state *s, linear_site at, float *y, const float *x, const float *W, int N,
                                 int in, int out, const float *scale) {
    int G = s->groups;
    float8_format fx = float8_role_format(s->o.recipe, FLOAT8_CAST_X), fw = float8_role_format(s->o.recipe, FLOAT8_CAST_W);
    uint8_t *xb = to_bytes(x, N, in, scale, G, fx), *Wb = to_bytes(W, out, in, scale + G, 1, fw);
    fp8_gemm_args args = {fx, fw, 0.0f, scale[G], NULL, NULL};
    gemm_blocks(y, xb, Wb, G, N, out, in, contraction_cuts(s, at, false), &args, scale);
    device_free(xb);
    device_free(Wb);
}

/* dx (=) and dW_here (=); each NULL: skipped. */
static void float8_bytes_backward(float8_state *s, linear_site at, float *dx, float *dW_here, const float *dy,
                                  const float *x, const float *W, int N, int in, int out, const float *scale,
                                  const float *dy_scale) {
    int G = s->groups, rg = N / G;
    float8_format fx = float8_role_format(s->o.recipe, FLOAT8_CAST_X), fw = float8_role_format(s->o.recipe, FLOAT8_CAST_W);
    float8_format fdy = float8_role_format(s->o.recipe, FLOAT8_CAST_DY);
    uint8_t *dyb = to_bytes(dy, N, out, dy_scale, G, fdy);
    if (dx) {
        uint8_t *Wb = to_bytes(W, out, in, scale + G, 1, fw), *Wt = device_alloc((size_t)out * in, MEM_BUFFERS);
        float8_transpose(Wt, Wb, out, in);                                    /* [in, out] */
        fp8_gemm_args args = {fdy, fw, 0.0f, scale[G], NULL, NULL};
        gemm_blocks(dx, dyb, Wt, G, N, in, out, contraction_cuts(s, at, true), &args, dy_scale);
        device_free(Wb);
        device_free(Wt);
    }
    if (dW_here) {   /* summed over the row blocks: each block's tokens have their own scales */
        uint8_t *xb = to_bytes(x, N, in, scale, G, fx);
        uint8_t *dyt = device_alloc((size_t)out * rg, MEM_BUFFERS), *xt = device_alloc((size_t)in * rg, MEM_BUFFERS);
        float *part = G > 1 ? device_alloc_floats((size_t)out * in, MEM_BUFFERS) : dW_here;
        device_zero(dW_here, (size_t)out * in * sizeof(float));
        for (int g = 0; g < G; g++) {
            float8_transpose(dyt, dyb + (size_t)g * rg * out, rg, out);      /* [out, rg] */
            float8_transpose(xt, xb + (size_t)g * rg * in, rg, in);          /* [in, rg]  */
            gemm_fp8(part, dyt, fdy, dy_scale[g], xt, fx, scale[g], out, in, rg);
            if (G > 1) add_inplace(dW_here, part, (size_t)out * in);
        }
        if (G > 1) device_free(part);
        device_free(xb); device_free(dyt); device_free(xt);
    }
    device_free(dyb);
}

/* ---- the float8 GEMMs of rowwise scaling ---------------------------------------------------------
 * The same three GEMMs with a scale per row of each operand as gemm_fp8_rowwise takes them
 * (cuBLASLt's per-row scale vectors on Hopper): the operands are cast with the scales the casts
 * above computed (kept by cast_operand), along each GEMM's contraction, and laid out as above:
 *   y  = x W^T     x's rows' scales [N],             W's rows' scales [out]
 *   dx = dy W      dy's rows' scales [N],            W^T's rows = W's columns' scales [in]
 *   dW = dy^T x    dy^T's rows = dy's columns' [out] and x^T's rows = x's columns' [in], per row
 *                  block g of an activation (its own scales), the blocks' products summed
 * Where the backend has no such GEMM, or its rules refuse a shape (K, N multiples of 16: dW's
 * contraction is a block's tokens), the call returns false and the emulation runs instead. */
static bool rowwise_scaled(const float8_state *s) {
    return s->o.recipe == FLOAT8_ROWWISE && (s->o.rowwise_gemm == FLOAT8_ROWWISE_GEMM_SCALED ||
                                            (s->o.rowwise_gemm == FLOAT8_ROWWISE_GEMM_AUTO && gemm_fp8_rowwise_native()));
}

/* x [rows, cols] cast along `how` with scales[], as float8 bytes; transposed to [cols, rows] when
 * `transpose` (the GEMM's contraction is along x's rows). */
static uint8_t *scaled_bytes(const float *x, int rows, int cols, float8_scaling how, const float *scales,
                             float8_format fmt, bool transpose) {
    size_t n = (size_t)rows * cols;
    uint8_t *b = device_alloc(n, MEM_BUFFERS);
    float8_quantize_scaled(b, x, n, cols, how, 0.0f, scales, fmt);
    if (!transpose) return b;
    uint8_t *t = device_alloc(n, MEM_BUFFERS);
    float8_transpose(t, b, rows, cols);
    device_free(b);
    return t;
}

static bool rowwise_bytes_forward(float8_state *s, linear_site at, float *y, const float *x, const float *x_rows,
                                  const float *W, const float *w_rows, int N, int in, int out) {
    if (gemm_fp8_shape_error(N, out, in)) return false;
    float8_format fx = float8_role_format(s->o.recipe, FLOAT8_CAST_X), fw = float8_role_format(s->o.recipe, FLOAT8_CAST_W);
    uint8_t *xb = scaled_bytes(x, N, in, FLOAT8_PER_ROW, x_rows, fx, false);
    uint8_t *Wb = scaled_bytes(W, out, in, FLOAT8_PER_ROW, w_rows, fw, false);
    fp8_gemm_args args = {fx, fw, 0.0f, 0.0f, x_rows, w_rows};
    bool done = gemm_blocks(y, xb, Wb, s->groups, N, out, in, contraction_cuts(s, at, false), &args, NULL);
    device_free(xb);
    device_free(Wb);
    s->rowwise_scaled_gemms += done;
    return done;
}

/* dx (=) and dW_here (=) where their GEMMs ran (*dx_done, *dW_done); each NULL: skipped. */
static void rowwise_bytes_backward(float8_state *s, linear_site at, const rowwise_kept *k, float *dx, float *dW_here,
                                   const float *dy, const float *x, const float *W, int N, int in, int out,
                                   bool *dx_done, bool *dW_done) {
    int G = s->groups, rg = N / G;
    float8_format fx = float8_role_format(s->o.recipe, FLOAT8_CAST_X), fw = float8_role_format(s->o.recipe, FLOAT8_CAST_W);
    float8_format fdy = float8_role_format(s->o.recipe, FLOAT8_CAST_DY);
    if (dx && !gemm_fp8_shape_error(N, in, out)) {
        uint8_t *dyb = scaled_bytes(dy, N, out, FLOAT8_PER_ROW, k->dy_rows, fdy, false);
        uint8_t *Wt = scaled_bytes(W, out, in, FLOAT8_PER_COL, k->w_cols, fw, true);   /* [in, out] */
        fp8_gemm_args args = {fdy, fw, 0.0f, 0.0f, k->dy_rows, k->w_cols};
        *dx_done = gemm_blocks(dx, dyb, Wt, G, N, in, out, contraction_cuts(s, at, true), &args, NULL);
        s->rowwise_scaled_gemms += *dx_done;
        device_free(dyb);
        device_free(Wt);
    }
    if (dW_here && !gemm_fp8_shape_error(out, in, rg)) {
        float *part = G > 1 ? device_alloc_floats((size_t)out * in, MEM_BUFFERS) : dW_here;
        bool done = true;
        for (int g = 0; g < G && done; g++) {
            uint8_t *dyt = scaled_bytes(dy + (size_t)g * rg * out, rg, out, FLOAT8_PER_COL, k->dy_cols + (size_t)g * out,
                                        fdy, true);   /* [out, rg] */
            uint8_t *xt = scaled_bytes(x + (size_t)g * rg * in, rg, in, FLOAT8_PER_COL, k->x_cols + (size_t)g * in,
                                       fx, true);     /* [in, rg]  */
            done = gemm_fp8_rowwise(part, dyt, fdy, k->dy_cols + (size_t)g * out, xt, fx, k->x_cols + (size_t)g * in,
                                    out, in, rg);
            if (done && G > 1) {
                if (g == 0) device_copy(dW_here, part, (size_t)out * in * sizeof(float));
                else add_inplace(dW_here, part, (size_t)out * in);
            }
            device_free(dyt);
            device_free(xt);
        }
        if (G > 1) device_free(part);
        *dW_done = done;
        s->rowwise_scaled_gemms += done;
    }
}

/* ---- the operator -----------------------------------------------------------------------------*/

/* When this call runs (the site's run_when, declared by the harness and a pipeline): the
 * microbatch whose scales it uses, the pass whose casts it stashes, the step it belongs to. */
static void clock_in(float8_state *s, linear_site at) {
    s->mb = at.when.microbatch;
    s->pass = at.when.pass;
    s->step = at.when.step;
}
/* The forward's scales of site `at` in the current microbatch, kept for its backward. */
static float *forward_scales(float8_state *s, linear_site at) {
    return s->forward_scale + ((size_t)s->mb * s->sites + site_index(at)) * (s->groups + 1);
}

/* y [N, out] (=) = x [N, in] W [out, in]^T on E4M3 operands. Issues: tensorwise/delayed one
 * all-reduce (MAX, 1 float) for W when tp cuts it and one for x when tp cuts x (row-parallel);
 * rowwise, on a row-parallel site, one of N floats for x's rows and one of out for W's rows. */
static void forward_from(float8_state *s, const llama_plan *p, linear_site at, float *y, const float *x,
                         const float *W, int N, int in, int out) {
    clock_in(s, at);
    bool col = column_parallel(s, at), row = row_parallel(s, at);
    float *xq = device_alloc_floats((size_t)N * in, MEM_BUFFERS), *Wq = device_alloc_floats((size_t)out * in, MEM_BUFFERS);
    float *scale = forward_scales(s, at);   /* x's per group, then W's */
    shard_layout x_cut = row ? SHARD_COLS : SHARD_REPLICATED, w_cut = s->tp ? s->layout[at.kind] : SHARD_REPLICATED;
    bool scaled = rowwise_scaled(s);   /* rowwise on the float8 GEMM: the casts' scales kept */
    float *x_rows = scaled ? device_alloc_floats((size_t)N, MEM_BUFFERS) : NULL;
    float *w_rows = scaled ? device_alloc_floats((size_t)out, MEM_BUFFERS) : NULL;
    cast_operand(s, at, OPERAND_X, 0, x_cut, xq, x, N, in, ALONG_ROWS, row, row, float8_role_format(s->o.recipe, FLOAT8_CAST_X),
                 scale, false, x_rows);
    cast_operand(s, at, OPERAND_W, 1, w_cut, Wq, W, out, in, ALONG_ROWS, row || col, row,
                 float8_role_format(s->o.recipe, FLOAT8_CAST_W), scale + s->groups, false, w_rows);
    if (s->o.recipe != FLOAT8_ROWWISE) float8_bytes_forward(s, at, y, x, W, N, in, out, scale);
    else if (!scaled || !rowwise_bytes_forward(s, at, y, x, x_rows, W, w_rows, N, in, out))
        s->below.forward(s->below.state, p, at, y, xq, Wq, N, in, out);
    device_free(x_rows);
    device_free(w_rows);
    observe(s, FLOAT8_CAST_X, at, x, xq, (size_t)N * in);
    observe(s, FLOAT8_CAST_W, at, W, Wq, (size_t)out * in);
    device_free(xq);
    device_free(Wq);
}

/* dx [N, in] (= or +=, as `how` says) dy [N, out] W and dW [out, in] (+=) dy^T x, on float8
 * operands: dy E5M2 (rowwise E4M3), W and x as in forward. Tensorwise/delayed: x and W with the forward's scales, dy cast once
 * (its amax agreed over tp on a column-parallel site). Rowwise: each GEMM casts its operands along
 * its own contraction: dx's over out (dy's rows, W's columns; agreed over tp on a column-parallel
 * site), dW's over the tokens (dy's and x's columns; never cut). */
static void backward_from(float8_state *s, const llama_plan *p, linear_site at, float *dx, dx_write how, float *dW,
                          const float *dy, const float *x, const float *W, int N, int in, int out) {
    clock_in(s, at);
    bool col = column_parallel(s, at);
    bool rowwise = s->o.recipe == FLOAT8_ROWWISE;
    float *scale = forward_scales(s, at);
    float *dy_scale = s->dy_scale;
    float8_format fx = float8_role_format(s->o.recipe, FLOAT8_CAST_X), fw = float8_role_format(s->o.recipe, FLOAT8_CAST_W);
    float8_format fdy = float8_role_format(s->o.recipe, FLOAT8_CAST_DY);
    size_t n_dy = (size_t)N * out, n_x = (size_t)N * in, n_w = (size_t)out * in;
    float *dyq = device_alloc_floats(n_dy, MEM_BUFFERS), *Wq = device_alloc_floats(n_w, MEM_BUFFERS);
    float *xq = device_alloc_floats(n_x, MEM_BUFFERS);
    float *dy_cols = rowwise ? device_alloc_floats(n_dy, MEM_BUFFERS) : dyq;
    float *dW_here = dW ? device_alloc_floats(n_w, MEM_BUFFERS) : NULL;
    /* the product alone (the GEMMs write it), then added where `how` asks */
    float *dx_here = dx && how == DX_ADD ? device_alloc_floats(n_x, MEM_BUFFERS) : dx;

    /* the operands */
    shard_layout dy_cut = col ? SHARD_COLS : SHARD_REPLICATED, w_cut = s->tp ? s->layout[at.kind] : SHARD_REPLICATED;
    shard_layout x_cut = row_parallel(s, at) ? SHARD_COLS : SHARD_REPLICATED;
    rowwise_kept k = {NULL, NULL, NULL, NULL};   /* rowwise on the float8 GEMM: the casts' scales */
    if (rowwise && rowwise_scaled(s)) {
        int G = s->groups;
        k.dy_rows = device_alloc_floats((size_t)N, MEM_BUFFERS);
        k.w_cols = device_alloc_floats((size_t)in, MEM_BUFFERS);
        k.x_cols = device_alloc_floats((size_t)G * in, MEM_BUFFERS);
        k.dy_cols = device_alloc_floats((size_t)G * out, MEM_BUFFERS);
    }
    cast_operand(s, at, OPERAND_DY, 2, dy_cut, dyq, dy, N, out, ALONG_ROWS, col, col, fdy, dy_scale, false, k.dy_rows);
    cast_operand(s, at, OPERAND_W, 3, w_cut, Wq, W, out, in, ALONG_COLS, false, col, fw, scale + s->groups, true, k.w_cols);
    cast_operand(s, at, OPERAND_X, 4, x_cut, xq, x, N, in, ALONG_COLS, false, false, fx, scale, true, k.x_cols);
    if (rowwise)
        cast_operand(s, at, OPERAND_DY, 5, dy_cut, dy_cols, dy, N, out, ALONG_COLS, false, false, fdy, dy_scale, false,
                     k.dy_cols);

    /* the two GEMMs: rowwise on the float8 GEMM with its scale vectors where the backend has one
     * (rowwise_bytes_backward), else with the operator below (the plan's before float8) on the
     * dequantized operands; the per-tensor recipes on float8 bytes */
    if (rowwise) {
        bool dx_done = false, dW_done = false;
        if (k.dy_rows)
            rowwise_bytes_backward(s, at, &k, dx ? dx_here : NULL, dW_here, dy, x, W, N, in, out, &dx_done, &dW_done);
        if (dx && !dx_done) s->below.backward(s->below.state, p, at, dx_here, DX_SET, NULL, dyq, xq, Wq, N, in, out);
        if (dW && !dW_done) {
            device_zero(dW_here, n_w * sizeof(float));
            s->below.backward(s->below.state, p, at, NULL, DX_SET, dW_here, dy_cols, xq, Wq, N, in, out);
        }
        device_free(k.dy_rows); device_free(k.w_cols); device_free(k.x_cols); device_free(k.dy_cols);
    } else {
        float8_bytes_backward(s, at, dx_here, dW_here, dy, x, W, N, in, out, scale, dy_scale);
    }

    observe(s, FLOAT8_CAST_DY, at, dy, dyq, n_dy);
    if (dx_here != dx) {
        add_inplace(dx, dx_here, n_x);
        device_free(dx_here);
    }
    if (dW) add_inplace(dW, dW_here, n_w);
    device_free(dyq); device_free(Wq); device_free(xq); device_free(dW_here);
    if (rowwise) device_free(dy_cols);
}

/* The operator. The output layer goes below (the plan's linear before float8: fp32, or bf16
 * operands under --dtype bf16). A block linear's operands are cast from the high precision: fp32,
 * or under --dtype bf16, bf16 as torchao has it when the model computes in bf16: each operand is
 * rounded to bf16 first (x and W forward; dy, W and x backward, as linear_local rounds them), and
 * its amax, scale and cast see those values. What then goes below (rowwise's emulation: operands
 * decoded with power-of-two scales, bf16 values already) runs as fp32, rounded nowhere twice. */
static void float8_linear_forward(void *state, const llama_plan *p, linear_site at, float *y, const float *x,
                                  const float *W, int N, int in, int out) {
    float8_state *s = state;
    if (!in_blocks(at)) {
        s->below.forward(s->below.state, p, at, y, x, W, N, in, out);
    } else if (at.compute != DTYPE_BF16) {
        forward_from(s, p, at, y, x, W, N, in, out);
    } else {
        float *xb = linear_bf16_values(x, (size_t)N * in), *Wb = linear_bf16_values(W, (size_t)out * in);
        at.compute = DTYPE_F32;
        forward_from(s, p, at, y, xb, Wb, N, in, out);
        device_free(xb);
        device_free(Wb);
    }
}
static void float8_linear_backward(void *state, const llama_plan *p, linear_site at, float *dx, dx_write how,
                                   float *dW, const float *dy, const float *x, const float *W, int N, int in, int out) {
    float8_state *s = state;
    if (!in_blocks(at)) {
        s->below.backward(s->below.state, p, at, dx, how, dW, dy, x, W, N, in, out);
    } else if (at.compute != DTYPE_BF16) {
        backward_from(s, p, at, dx, how, dW, dy, x, W, N, in, out);
    } else {
        /* (counted as linear_local counts them: W for dx, x for dW; a split backward, ZB-H1's, asks
         * for one at a time, and the casts of both still start from bf16 values) */
        float *dyb = linear_bf16_values(dy, (size_t)N * out);
        float *Wb = dx ? linear_bf16_values(W, (size_t)out * in) : bf16_values(W, (size_t)out * in);
        float *xb = dW ? linear_bf16_values(x, (size_t)N * in) : bf16_values(x, (size_t)N * in);
        at.compute = DTYPE_F32;
        backward_from(s, p, at, dx, how, dW, dyb, xb, Wb, N, in, out);
        device_free(dyb);
        device_free(Wb);
        device_free(xb);
    }
}

/* ---- set-up -----------------------------------------------------------------------------------*/

void float8_refuse_baseline_dtype(float8_recipe r, int baseline_dtype, dtype run) {
    if (r != FLOAT8_OFF && baseline_dtype >= 0 && baseline_dtype != (int)run)
        comm_exit_usage("--baseline-dtype %s with --fp8 and --dtype %s: the float8 baseline checks the run's casts code "
                        "for code, so it computes in the run's precision (leave --baseline-dtype out)",
                        dtype_name((dtype)baseline_dtype), dtype_name(run));
}

void float8_apply(llama_plan *plan, const llama_config *c, const float8_options *o) {
    (void)c;
    if (o->recipe == FLOAT8_OFF) return;
    /* float8 scales each linear's whole input (agreed over tp): a projection group that runs its
     * linears on pieces of the rows (async TP's ring, proj.splits_rows) would scale piece by piece */
    if (plan->proj.splits_rows)
        comm_exit_usage("--async-tp with --fp8: not supported (float8 scales each linear's whole input, agreed over tp; "
                        "the ring's per-chunk GEMMs would scale chunk by chunk)");
    float8_state *s = plan_push(plan, &float8_technique, calloc(1, sizeof(float8_state)), 0);
    s->o = *o;
    s->tp = plan->groups.tp && plan->groups.tp->size > 1 ? plan->groups.tp : NULL;
    memcpy(s->layout, plan->layout, sizeof s->layout);
    s->sites = c->n_layers * P_NKINDS;
    s->groups = o->activation_groups > 1 ? o->activation_groups : 1;
    s->M = o->microbatches > 1 ? o->microbatches : 1;
    s->forward_scale = calloc((size_t)s->M * s->sites * (s->groups + 1), sizeof(float));
    s->dy_scale = calloc((size_t)s->groups, sizeof(float));
    if (o->recipe == FLOAT8_DELAYED) {
        s->history = calloc((size_t)s->M * s->sites * NOPERANDS * s->groups * o->amax_history, sizeof(float));
        s->seen = calloc((size_t)s->M * s->sites * NOPERANDS * s->groups, sizeof(int));
    }
    s->scalar = device_alloc_floats(1, MEM_BUFFERS);
    plan_wrap(plan->linear, s->below, ((linear_ops){s, float8_linear_forward, float8_linear_backward}));
}

const char *float8_shape_error(const llama_config *c, int tp, int rows, float8_recipe r) {
    static char why[320];
    if (r == FLOAT8_OFF || r == FLOAT8_ROWWISE) return NULL;   /* (rowwise: the emulation on both backends) */
    char unsupported[200];
    if (!gemm_fp8_supported(unsupported, sizeof unsupported)) {
        snprintf(why, sizeof why, "--fp8 %s needs the float8 GEMM: %s", float8_recipe_name(r), unsupported);
        return why;
    }
    int hd = c->dim / c->n_heads;
    struct { const char *what; int n; } dims[] = {
        {"--dim", c->dim}, {"the heads per tp rank x head dim", c->n_heads / tp * hd},
        {"the kv heads per tp rank x head dim", c->n_kv_heads / tp * hd}, {"--ffn-dim / tp", c->ffn_dim / tp},
        {"the tokens per rank (batch / dp x seq-len)", rows}};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
        if (dims[i].n % 16) {
            snprintf(why, sizeof why, "--fp8 %s at tp %d: %s is %d, not a multiple of 16: cuBLASLt's float8 GEMM "
                     "contracts over and produces widths that are multiples of 16 (the CPU keeps the same rule)",
                     float8_recipe_name(r), tp, dims[i].what, dims[i].n);
            return why;
        }
    return NULL;
}

static void float8_free_state(void *state) {
    float8_state *s = state;
    free(s->forward_scale);
    free(s->dy_scale);
    free(s->history);
    free(s->seen);
    if (s->stash)
        for (size_t i = 0; i < (size_t)s->stash_dp * s->M * s->sites * CASTS; i++) free(s->stash[i]);
    free(s->stash);
    free(s->stash_scale);
    free(s->stash_pass);
    device_free(s->scalar);
    free(s);
}

void float8_observe_casts(llama_plan *plan, float8_cast_observer observer) { state_of(plan)->observer = observer; }

void float8_compare_casts(llama_plan *parallel, llama_plan *baseline) {
    float8_state *p = state_of(parallel), *b = state_of(baseline);
    if (!p || !b) return;
    p->dp = parallel->groups.batch && parallel->groups.batch->size > 1 ? parallel->groups.batch : NULL;
    p->stash_dp = p->dp ? p->dp->size : 1;
    size_t slots = (size_t)p->stash_dp * p->M * p->sites * CASTS;
    p->stash = calloc(slots, sizeof *p->stash);
    p->stash_ranks = p->tp ? p->tp->size : 1;
    p->stash_scale = calloc(slots * p->stash_ranks, sizeof *p->stash_scale);
    p->stash_pass = calloc(slots, sizeof *p->stash_pass);
    p->casts = comm_split(comm_world(), 0, comm_world()->rank, "float8 casts");   /* (collective) */
    b->peer = p;
    b->peer_plan = parallel;
}

float8_cast_tally float8_cast_comparison(const llama_plan *baseline) {
    const float8_state *s = state_of(baseline);
    return s ? s->cmp : (float8_cast_tally){0, 0, 0, 0, 0, 0, 0};
}

/* Step 1's casts judged against the baseline's, here beside the comparison because chapters 07 and
 * 08 both judge them. Whether step 1's gradients can be held to fp32 tolerances: not when a cast
 * landed on the neighbouring code and nothing else differs. */
const char *float8_casts_flipped(const llama_plan *baseline) {
    float8_cast_tally k = float8_cast_comparison(baseline);
    static char why[200];
    if (k.neighbour == 0 || k.other || k.missing || k.scale_differs) return NULL;   /* judge at fp32 tolerances */
    snprintf(why, sizeof why, "%lld cast value(s) landed on the neighbouring code (on a rounding boundary, the "
             "input different in its last bits): a whole float8 step, see the cast comparison", k.neighbour);
    return why;
}

/* One line on rank 0; a parity failure for anything but an equal or a neighbouring code. */
int float8_report_casts(const llama_plan *baseline) {
    float8_cast_tally k = float8_cast_comparison(baseline);
    int bad = k.other > 0 || k.missing > 0 || k.scale_differs > 0;
    log0("step 1's casts against the baseline's, code by code: %lld equal, %lld the neighbouring code (a rounding "
         "boundary), %lld other, %lld not kept; %lld scales more than 1e-5 apart  %s\n", k.equal, k.neighbour, k.other,
         k.missing, k.scale_differs, bad ? "MISMATCH" : "ok");
    if (k.neighbour)
        log0("  after the first cast with a neighbour, computed from values a float8 step apart (not judged): %lld "
             "equal, %lld different\n", k.equal_after, k.differ_after);
    if (bad) parity_fail("step 1's casts differ from the baseline's: a code neither equal nor the neighbour, or a "
                         "scale more than 1e-5 apart (above)");
    return bad;
}

/* ---- the exact test: sharded cast = single-device cast ----------------------------------------*/

/* W [rows, cols] cast as the forward casts a weight (tensorwise and delayed: the scale of this
 * step's amax, agreed over tp when `cut`; rowwise: its rows' scales, agreed when `cut_along`),
 * its codes gathered over tp as `layout` cuts it (gather_codes): on tp rank 0, NULL elsewhere. */
static float *weight_codes(float8_state *s, const float *W, int rows, int cols, shard_layout layout, bool cut,
                           bool cut_along, float8_format fmt) {
    int R, C;
    if (s->o.recipe != FLOAT8_ROWWISE) {
        float scale = float8_scale_from_amax(tensor_amax(s, W, (size_t)rows * cols, cut), fmt, 0);
        return gather_codes(s, W, scale, NULL, FLOAT8_PER_TENSOR, rows, cols, layout, fmt, &R, &C);
    }
    float *scales = rowwise_scales(s, W, rows, cols, ALONG_ROWS, cut_along, fmt);
    float *codes = gather_codes(s, W, 0, scales, FLOAT8_PER_ROW, rows, cols, layout, fmt, &R, &C);
    device_free(scales);
    return codes;
}

long long float8_sharded_cast_mismatches(const llama_plan *plan, llama_model *m, long long *compared) {
    float8_state *s = state_of(plan);
    const param_table *t = m->params;
    comm_group *tp = s->tp;
    bool root = !tp || tp->rank == 0;
    float8_state single = *s;            /* the single-device cast: no tp, so no agreement */
    single.tp = NULL;
    long long bad = 0, n_all = 0;
    float8_format fmt = float8_role_format(s->o.recipe, FLOAT8_CAST_W);
    for (int i = 0; i < t->n; i++) {
        const param_tensor *x = &t->t[i];
        param_kind k = x->spec.kind;
        if (x->spec.layer < 0 || !x->here || x->spec.cols == 1 || k == P_ATTENTION_NORM || k == P_FFN_NORM) continue;
        linear_site at = {.kind = k, .layer = x->spec.layer};
        if (!float8_casts_site(at)) continue;   /* (a mixture's router and experts: not cast) */
        bool col = column_parallel(s, at), row = row_parallel(s, at);
        int R = x->spec.rows, Cn = x->spec.cols;
        const float *W = param_in(t, t->params, i);
        shard_layout layout = tp ? x->tp_layout : SHARD_REPLICATED;
        float *gathered = weight_codes(s, W, x->nr, x->nc, layout, row || col, row, fmt);   /* the shards' */
        float *whole = root ? malloc((size_t)R * Cn * sizeof(float)) : NULL;
        if (tp) shard_gather_to_host(tp, layout, W, R, Cn, whole);
        else device_copy_to_host(whole, W, (size_t)R * Cn * sizeof(float));
        if (root) {   /* the whole weight, cast on one device */
            float *w_dev = device_alloc_floats((size_t)R * Cn, MEM_BUFFERS);
            device_copy_to_device(w_dev, whole, (size_t)R * Cn * sizeof(float));
            float *ref = weight_codes(&single, w_dev, R, Cn, SHARD_REPLICATED, false, false, fmt);
            for (size_t e = 0; e < (size_t)R * Cn; e++) bad += gathered[e] != ref[e];
            n_all += (long long)R * Cn;
            device_free(w_dev);
            free(ref);
        }
        free(gathered); free(whole);
    }
    *compared = (long long)comm_host_max(comm_world(), (double)n_all);
    return (long long)comm_host_max(comm_world(), (double)bad);
}

/* ---- what a run says of itself -----------------------------------------------------------------*/

long long float8_rowwise_scaled_gemms(const llama_plan *plan) {
    const float8_state *s = plan_state(plan, &float8_technique);
    return s ? s->rowwise_scaled_gemms : 0;
}

const char *float8_gemm_name(float8_recipe r) {
    bool on_gpu = strcmp(device_backend_name(), "cuda") == 0;
    if (r == FLOAT8_OFF) return "none, fp32";
    if (r == FLOAT8_ROWWISE && gemm_fp8_rowwise_native())
        return "cuBLASLt on float8 bytes with per-row scales (the emulation where it refuses a shape)";
    if (r == FLOAT8_ROWWISE) return "emulated, an fp32 GEMM of the dequantized operands";
    return on_gpu ? "cuBLASLt on float8 bytes" : "float8 bytes decoded into an fp32 GEMM, cuBLASLt's CPU twin";
}

const char *float8_run_options_json(const float8_options *o, int groups, int passes, char *buf, size_t len) {
    static const char *const scale_rule[FLOAT8_NRECIPES] = {
        "", "fp32(max/max(amax,1e-12)) per tensor", "pow2_floor(fp32(max/max(amax,1e-12))) per row",
        "fp32(max/max(max(amax history),1e-12)) per tensor"};
    static const char *const format_name[2] = {"e4m3fn", "e5m2"};
    char passes_key[32] = "";   /* (only when a step makes several passes) */
    if (passes > 1) snprintf(passes_key, sizeof passes_key, "\"passes\":%d,", passes);
    snprintf(buf, len, "{\"float8\":{\"recipe\":\"%s\",\"amax_history\":%d,\"float8_linears\":"
             "[\"wq\",\"wk\",\"wv\",\"wo\",\"w1\",\"w2\",\"w3\"],\"formats\":{\"x\":\"%s\",\"w\":\"%s\",\"dy\":\"%s\"},"
             "\"activation_groups\":%d,%s\"scale_rule\":\"%s\"}}", float8_recipe_name(o->recipe), o->amax_history,
             format_name[float8_role_format(o->recipe, FLOAT8_CAST_X)], format_name[float8_role_format(o->recipe, FLOAT8_CAST_W)],
             format_name[float8_role_format(o->recipe, FLOAT8_CAST_DY)], groups, passes_key, scale_rule[o->recipe]);
    return buf;
}

/* ---- the deliberate bug -----------------------------------------------------------------------*/

static const char *local_amax(llama_plan *p) {
    float8_state *s = state_of(p);
    if (!s) return "it changes the float8 casts, and --fp8 off casts nothing: use --fp8 tensorwise, rowwise or delayed";
    s->local_amax = true;
    return NULL;
}

const plan_fault float8_faults[] = {
    {"local-amax", "each tensor-parallel shard scales by its own amax instead of the tensor's (no MAX all-reduce over tp; "
     "rowwise: its rows' scales max / its own amax, not rounded down to a power of two)",
     local_amax},
    {NULL, NULL, NULL}};
