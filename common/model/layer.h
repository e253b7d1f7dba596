/* layer.h: a Llama layer as a table of blocks, the one place that says what a layer is.
 *
 * A layer is a short list of blocks (llama_layer), run in order forward and in reverse backward:
 *
 *   attention_norm   h_in [Ns, D] -> attn_xn = rmsnorm(h_in) * attention_norm
 *   attention        attn_xn -> h_mid = wo(attention(rope(wq n), rope(wk n), wv n))   (no residual yet)
 *   ffn_norm         h_mid += h_in;  ffn_xn = rmsnorm(h_mid) * ffn_norm
 *   feed_forward     ffn_xn -> h_out = w2(silu(w1 m) * w3 m) + h_mid
 *
 * Each block declares what it owns: its tensors (name, shape in the configuration's dimensions,
 * initialisation), the activations it saves for its backward (llama_layer_acts' ACT_* slots, each
 * with its shape), and its forward and backward. Everything else is derived from the table: the
 * parameter table (llama.c: names, shapes, units, hence checkpoints, dumps and exports), the
 * activation memory and its formulas (model.c), the scratch the backward needs (each activation's
 * gradient buffer has its activation's shape). Inside attention and feed_forward, the linears
 * come in Megatron's projection groups (plan.h's projection_ops): proj_in (wq wk wv; w1 w3)
 * behind the region's entry, proj_out (wo; w2) before its exit, which is where the plan's
 * techniques act. How a tensor is split over tp stays the technique's choice (01's layouts, by
 * tensor kind), as in torchtitan, where the parallelize plan, not the model, names each module's
 * style.
 *
 * A model with another layer (a wider feed-forward, later mixture-of-experts) gives its own table
 * in llama_config.layer; NULL is llama_layer_default. tests/test_layer_blocks.c replaces the
 * feed-forward block this way, from the test file alone.
 */
#pragma once
#include "cdefs.h"
#include "dtype.h"
#include "llama.h"

C_BEGIN

/* The configuration's dimensions that shapes are written in. */
typedef enum { DIM_1, DIM_D, DIM_Q, DIM_KV, DIM_F, DIM_V, DIM_E, DIM_EF, DIM_ED, DIM_FE } model_dim;
/* 1, D, H*hd, Hkv*hd, F, V; and the experts' (llama.h's moe_config): E, E*F_e, E*D, F_e */
int model_dim_size(const llama_config *c, model_dim x);

/* One tensor a block owns: [rows_times x rows, cols_times x cols] in the configuration's
 * dimensions (a factor left 0 is 1). */
typedef struct {
    param_kind kind;
    const char *name;          /* torchtitan's, after "layers.{l}."                            */
    model_dim rows, cols;      /* a vector [D] is [1, D]                                        */
    float init_std;            /* normal(0, init_std); 0: every element 1 (init.h)              */
    int rows_times, cols_times;
    dtype type;                /* its element type (dtype.h; 0: fp32, the only one used yet)    */
} block_tensor;

/* The rows and columns an activation's shape is written in, for the shapes this rank holds
 * (model.h's llama_dims): Ns = B*Ts the residual stream's rows, N = B*T the region's. */
/* A mixture of experts adds two row counts: ROWS_ROUTED, this rank's tokens' copies (N*k, one per
 * expert a token is sent to), and ROWS_EXPERT, the most rows this rank's experts may receive
 * (llama_dims' R: N*k on one device; the dropless worst case under expert parallelism). */
typedef enum { ROWS_STREAM, ROWS_REGION, ROWS_1, ROWS_ROUTED, ROWS_EXPERT, N_ROWS } act_rows;   /* Ns, N, 1, N*k, R */
/* ... and columns: COLS_E (E experts), COLS_K (k), COLS_FE (F_e), COLS_COUNTS (2E + 1 counts). */
typedef enum { COLS_D, COLS_1, COLS_Q, COLS_KV, COLS_F, COLS_V, COLS_PROBS, COLS_LOSS,
               COLS_E, COLS_K, COLS_FE, COLS_COUNTS, N_COLS } act_cols;
/* What bringing an activation back would cost, for activation checkpointing (chapter 03 says which
 * costs each mode keeps): the output of a GEMM, of the attention or of a collective (expensive to
 * redo), the layer's input (everything else is recomputed from it), or the output of element-wise
 * or row-wise work (a norm, the softmax, SwiGLU's product: cheap to redo, and as large as a GEMM's
 * output or larger). Every activation declares one: 0, ACT_COST_UNSET, is refused. */
typedef enum { ACT_COST_UNSET = 0, ACT_COST_GEMM, ACT_COST_INPUT, ACT_COST_CHEAP } act_cost;
/* One activation a block saves: slot `act` (plan.h's ACT_*) of [rows, times x cols] (times 0: 1),
 * elements of `type` (0: fp32), whose size its bytes are counted in, and its recompute cost. */
typedef struct { int act; act_rows rows; act_cols cols; int times; dtype type; act_cost cost; } block_act;

/* What a block's forward and backward work on (model.h). */
typedef struct layer_pass layer_pass;

#define BLOCK_MAX_TENSORS 8
#define BLOCK_MAX_ACTS 12
typedef struct {
    const char *name;
    int n_tensors;
    block_tensor tensor[BLOCK_MAX_TENSORS];
    int n_acts;
    block_act act[BLOCK_MAX_ACTS];
    void (*forward)(const layer_pass *x);
    void (*backward)(const layer_pass *x);
} layer_block;

#define LAYER_MAX_BLOCKS 6
struct llama_layer {
    const char *name;
    int n;
    const layer_block *block[LAYER_MAX_BLOCKS];
};

/* Llama's layer (blocks.c), and its blocks for a layer that keeps some of them. */
extern const llama_layer llama_layer_default;
extern const layer_block llama_attention_norm, llama_attention, llama_ffn_norm, llama_feed_forward;
/* The model's own layer (llama_config.layer, or Llama's), and layer l's: the own one, or under
 * layer_every Llama's on the layers in between (llama_layer_in: the rule, for a layer `own` (NULL:
 * Llama's) used every `every` layers). */
static inline const llama_layer *llama_layer_of(const llama_config *c) {
    return c->layer ? c->layer : &llama_layer_default;
}
static inline const llama_layer *llama_layer_in(const llama_layer *own, int every, int l) {
    if (!own) own = &llama_layer_default;
    return every <= 1 || (l + 1) % every == 0 ? own : &llama_layer_default;
}
static inline const llama_layer *llama_layer_at(const llama_config *c, int l) {
    return llama_layer_in(c->layer, c->layer_every, l);
}

C_END
