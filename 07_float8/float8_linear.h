/* float8_linear.h: float8 training of the transformer blocks' linears, as an operator of the plan
 * (Micikevicius et al. 2022, "FP8 Formats for Deep Learning"; torchao's float8 training; NVIDIA
 * Transformer Engine's delayed scaling).
 *
 * Every linear inside the blocks (wq, wk, wv, wo, w1, w2, w3) runs its three GEMMs on float8
 * operands with fp32 accumulation; the output layer stays fp32 (its logits feed the loss
 * directly; torchtitan's float8 converter lets a run exclude it the same way), and so do a
 * mixture's router and experts (chapter 09: float8_casts_site says why):
 *
 *   forward    y  = x  W^T      x, W: E4M3           contraction over in
 *   backward   dx = dy W        dy: E5M2, W: E4M3    contraction over out
 *              dW = dy^T x      dy: E5M2, x: E4M3    contraction over the N tokens
 *
 * A float8 number has 3 (E4M3) or 2 (E5M2) mantissa bits and a narrow range (448, 57344), so each
 * operand is multiplied by a scale before the cast and divided by it after: q = cast(x s),
 * x ~ q / s. The recipe says how s is chosen:
 *
 *   tensorwise  s = max_fp8 / amax(x), one per tensor, from this step's values (torchao's default)
 *   rowwise     one s per row of the operand along the GEMM's contraction dimension, rounded down
 *               to a power of two, every operand E4M3 (torchao's ROWWISE): an outlier spoils its
 *               row only
 *   delayed     s = max_fp8 / max(the last `history` amaxes of this tensor), known before the
 *               tensor is (Transformer Engine's DelayedScaling): the first step uses its own amax
 *
 * The GEMM itself. Tensorwise and delayed hand float8 bytes and their scales to gemm_fp8.h:
 * cuBLASLt's float8 GEMM on a GPU; on the CPU its twin decodes them into an fp32 GEMM, torchao's
 * emulation (q / s: exactly the products a float8 tensor core sums, in fp32). Rowwise, a scale per
 * row, hands the bytes and their scale vectors to gemm_fp8_rowwise where the backend multiplies
 * them itself (cuBLASLt's per-row scales on Hopper), and elsewhere (the CPU, older GPUs, a shape
 * the float8 GEMM refuses) runs the emulation through the linear operator it wraps (the plan's
 * before it). Either way
 * the operator composes with chapter 01's tensor parallelism and chapter 04's sharded data
 * parallelism (each operator carries its technique's state; this one's is float8_technique's).
 *
 * Across tensor-parallel shards: a shard's amax is not the tensor's, so before a tensor cut by tp
 * is cast, its amax is MAX-all-reduced over tp (for rowwise, the amaxes of the rows that the cut
 * splits along the contraction). Then every shard casts with the scale a single device would use,
 * and the sharded cast is byte for byte the single-device one. Which operands are cut:
 *
 *   column-parallel (wq wk wv w1 w3)  W by rows (out), dy by columns (out); x whole
 *   row-parallel    (wo w2)           W by columns (in), x by columns (in); dy whole
 */
/* BEGIN SOLUTION 07: the amax agreements */
/* Per step and layer that is 14 all-reduces over tp: tensorwise and delayed one float each
 * (W and the cut activation of each of the 7 linears), rowwise N + D floats per linear (the
 * rows of the cut activation, and W's D rows or columns). */
/* END SOLUTION */
#pragma once
#include <stdbool.h>
#include "float8_math.h"
#include "llama.h"
#include "plan.h"

typedef enum { FLOAT8_OFF = 0, FLOAT8_TENSORWISE, FLOAT8_ROWWISE, FLOAT8_DELAYED, FLOAT8_NRECIPES } float8_recipe;
const char *float8_recipe_name(float8_recipe r);   /* "off", "tensorwise", "rowwise", "delayed" */

/* Rowwise: where its GEMMs run. AUTO: on the float8 GEMM with per-row scales where the backend
 * has one (gemm_fp8_rowwise_native: CUDA on Hopper), else the emulation; EMULATED: always the
 * fp32 GEMM of dequantized operands; SCALED: always gemm_fp8_rowwise where its rules allow the
 * shapes (on the CPU its twin: how test_float8_linear checks the path the GPU takes). */
typedef enum { FLOAT8_ROWWISE_GEMM_AUTO = 0, FLOAT8_ROWWISE_GEMM_EMULATED, FLOAT8_ROWWISE_GEMM_SCALED } float8_rowwise_gemm;

typedef struct {
    float8_recipe recipe;
    int amax_history;     /* delayed: amaxes kept per tensor (Transformer Engine: 1024; here 16) */
    int activation_groups;/* scale the activations (x, dy) in this many row blocks, each apart: a
                           * single-device baseline standing in for that many data-parallel
                           * ranks, each of which scales only its own rows (0 or 1: whole)     */
    int microbatches;     /* a pipeline's microbatches in flight (chapter 08): each keeps its own
                           * forward scales (and delayed history) for its backward (0 or 1: one) */
    float8_rowwise_gemm rowwise_gemm;   /* rowwise: where its GEMMs run (AUTO unless a test says) */
} float8_options;

/* The roles an operand plays, for the accuracy report: the three casts and the three products. */
enum { FLOAT8_CAST_X = 0, FLOAT8_CAST_W, FLOAT8_CAST_DY, FLOAT8_OUT_Y, FLOAT8_OUT_DX, FLOAT8_OUT_DW, FLOAT8_NROLES };
const char *float8_role_name(int role);

/* Refuses (one line, exit 2) float8 with a --check baseline in another precision than the run's
 * (--baseline-dtype, -1: the run's): the float8 baseline checks the run's casts code for code,
 * which casts from other high-precision values cannot match. */
void float8_refuse_baseline_dtype(float8_recipe r, int baseline_dtype, dtype run);

/* Wraps plan->linear with the float8 linear (does nothing for FLOAT8_OFF). The plan's tp group and
 * layouts must be final (apply it after chapter 01's plan). */
void float8_apply(llama_plan *plan, const llama_config *c, const float8_options *o);
/* The technique as the plan's stack records it (plan_free frees its state). */
extern const plan_technique float8_technique;

/* NULL, or why the recipe cannot run this model (one line): tensorwise and delayed multiply
 * float8 bytes with cuBLASLt's float8 GEMM (gemm_fp8.h), which needs a GPU of compute capability
 * 8.9 or 9.0+ and every width and the tokens per rank (`rows`) a multiple of 16; the CPU's twin
 * keeps the same rule so that a run that works here works on a GPU. */
const char *float8_shape_error(const llama_config *c, int tp, int rows, float8_recipe r);

/* SQNR = 20 log10(|ref| / |ref - got|) of two device tensors of n floats, in dB, computed in
 * double on the host (torchao's compute_error); +inf when they are equal. */
double float8_sqnr_db(const float *ref_dev, const float *got_dev, size_t n);

/* Who is shown each cast float8 makes (chapter 07's probe, float8_probe.h): cast(state, role, at,
 * hi, q, n) with role FLOAT8_CAST_X, _W or _DY, the operand hi [n] and its float8 values q [n]
 * (fake-quantized, as fp32; device), during the call at site `at`. None by default: a trainer
 * pays only for the casts and the GEMMs. */
typedef struct {
    void *state;
    void (*cast)(void *state, int role, linear_site at, const float *hi, const float *q, size_t n);
} float8_cast_observer;
void float8_observe_casts(llama_plan *plan, float8_cast_observer observer);
/* Does float8 cast this linear's operands? Every linear of the blocks; the output layer, a
 * mixture's router and its experts stay in the run's precision. */
bool float8_casts_site(linear_site at);

/* Step 1's casts of the two runs, code by code: the parallel run's plan keeps each cast's codes
 * (gathered over tp to its tp rank 0, then over the data ranks, plan->groups.batch, to world rank 0; every
 * pipeline microbatch apart), the baseline's operator (on world rank 0) compares its own with them,
 * its row block g with data rank g / M's microbatch g % M, in the order the baseline casts. Counts,
 * on world rank 0, up to and including the first cast with a neighbour, and after it: */
typedef struct {
    long long equal;      /* the same code                                                    */
    long long neighbour;  /* the next code up or down: a value on a rounding boundary, whose
                           * input differed in its last bits (a sum in another order)          */
    long long other;      /* anything else: a different scale or a wrong cast                 */
    long long missing;    /* casts the parallel run did not keep (a programming error)        */
    long long scale_differs; /* tensorwise casts whose scale is more than 1e-5 from the other
                           * run's (a wrong amax), up to the first neighbour                   */
    long long equal_after, differ_after;   /* the casts after the first neighbour, whose inputs
                           * already carry a whole float8 step's difference: not judged       */
} float8_cast_tally;
/* Call it only when the baseline runs (--check): a later pipeline stage's casts are sent to
 * world rank 0 for the baseline to take, and messages nobody takes would keep the ranks from
 * ending (comm_host_post). Collective over the world. */
void float8_compare_casts(llama_plan *parallel, llama_plan *baseline);
float8_cast_tally float8_cast_comparison(const llama_plan *baseline);
/* After step 1's forward and backward, for run_baseline_unjudged: why step 1's gradients are not
 * judged (a cast landed on the neighbouring code, and nothing else differs), or NULL. */
const char *float8_casts_flipped(const llama_plan *baseline);
/* Step 1's casts against the baseline's, code by code: one line on rank 0, and a parity failure
 * (returns 1) for a code neither equal nor the neighbour, a cast not kept or a scale apart. */
int float8_report_casts(const llama_plan *baseline);
/* The format each role is cast to under the recipe (FLOAT8_CAST_*), for the report. */
float8_format float8_role_format(float8_recipe r, int role);

/* The exact test: every block weight of this rank cast as the recipe casts it in forward (the
 * global scale, or the rows' scales), gathered over tp on rank 0 of tp and compared byte for byte
 * with the cast of the whole gathered weight. Returns the number of bytes that differ (the same on
 * every rank), and the number compared in *compared. Collective over tp (and the world). */
long long float8_sharded_cast_mismatches(const llama_plan *plan, llama_model *m, long long *compared);

/* Rowwise: how many of its GEMMs (a forward's, a backward's dx or dW) ran on the float8 GEMM with
 * per-row scale vectors (gemm_fp8_rowwise) since float8_apply; the rest ran the emulation. */
long long float8_rowwise_scaled_gemms(const llama_plan *plan);
/* Which float8 GEMM the recipe runs on this backend, in words, for the run's first line. */
const char *float8_gemm_name(float8_recipe r);
/* The recipe as the JSON object a --dump carries in its "run_options" metadata, for an outside
 * replay (tests/reference_torch.py; docs/dump-format.md): written to buf[len], returned.
 * groups: the row blocks each activation of one forward pass is scaled in (every data rank its
 * own rows; chapter 08: each data rank's pipeline microbatches apart, dp x microbatches);
 * passes: the forward-backward passes of a step (chapter 08's --accum; "passes" is written only
 * when above 1), each over its share of the step's batch, in order. */
const char *float8_run_options_json(const float8_options *o, int groups, int passes, char *buf, size_t len);

/* The deliberate bugs of this chapter, for --fault. */
extern const plan_fault float8_faults[];
