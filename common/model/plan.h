/* plan.h: a parallel plan, the operators a chapter applies to the one model (model/model.c).
 *
 * The Llama layer is written once. Where it may be parallelised it calls an operator of the
 * plan instead of doing the work itself, in the spirit of torchtitan's parallelize_llama and
 * Megatron-LM's region functions:
 *
 *   h ─ rmsnorm ─ ENTER ─ [wq wk wv] ─ rope ─ ATTENTION ─ [wo] ─ EXIT ─ (+h) ─ rmsnorm ─ ENTER ─
 *     ─ [w1 w3] ─ swiglu ─ [w2] ─ EXIT ─ (+)                         (every [..] is a LINEAR)
 *
 *   tokens ─ lookup of the rows held ─ EXIT(vocab) ─ h0 ... hL ─ rmsnorm ─ ENTER(vocab) ─ [output] ─ LOSS
 *
 * An ENTER with the linears behind it is a projection group proj_in (ENTER [wq wk wv], ENTER
 * [w1 w3], ENTER(vocab) [output]), a linear with the EXIT behind it a proj_out ([wo] EXIT, [w2]
 * EXIT): projection_ops below, which a technique may replace whole.
 *
 * ENTER and EXIT are the boundaries of the tensor-parallel region (region_ops below):
 *                       enter: forward / backward          exit: forward / backward
 *   single device       identity / identity                identity / identity
 *   Megatron TP (01)    f: identity / all-reduce           g: all-reduce / identity
 *   sequence par. (03)  all-gather(seq) / reduce-scatter   reduce-scatter(seq) / all-gather
 * The vocabulary ends have their own pair: identity while the embedding and the output layer
 * are replicated (chapter 01), the same f and g when they are split over the vocabulary (02).
 *
 * Buffers: outside the region a rank holds the residual stream for Ts = T / seq_shards tokens
 * of each sequence ("local", [B, Ts, C]); inside it, the whole sequence ("full", [B, T, C]).
 * When the plan does not split the sequence (seq_shards = 1) the model passes the same buffer
 * as local and full, so an operator that moves no data (identity, or an in-place all-reduce)
 * works in place.
 *
 * The single-device baseline is plan_single_device(): every operator identity or local.
 */
#pragma once
#include <stdbool.h>
#include "cdefs.h"
#include "comm.h"
#include "llama.h"
#include "mesh.h"
#include "params.h"
#include "shard.h"

C_BEGIN

typedef struct llama_plan llama_plan;
typedef struct llama_model llama_model;

/* Every operator below travels with its own state: the ops struct's `state` is what the technique
 * that installed it allocated (NULL for the single-device operators), and every call passes it as
 * the first argument, p->X.op(p->X.state, p, ...). A technique that wraps an operator keeps the
 * one it replaced (`below`) in its state and calls it with below's state (plan_wrap). */

/* The two boundaries of a tensor-parallel region, forward and backward.
 *   enter_forward   x_local [B, Ts, C] -> x_full [B, T, C]     before the column-parallel linears
 *   enter_backward  dx_full [B, T, C] (this rank's partial sums, may be overwritten)
 *                                      -> dx_local [B, Ts, C]  the input's gradient
 *   exit_forward    y_partial [B, T, C] (partial sums, may be overwritten)
 *                                      -> y_local [B, Ts, C]   after the row-parallel linears
 *   exit_backward   dy_local [B, Ts, C] -> dy_full [B, T, C]                                  */
typedef struct {
    void *state;
    void (*enter_forward)(void *state, const llama_plan *p, float *x_full, const float *x_local, int B, int Ts, int C);
    void (*enter_backward)(void *state, const llama_plan *p, float *dx_local, float *dx_full, int B, int Ts, int C);
    void (*exit_forward)(void *state, const llama_plan *p, float *y_local, float *y_partial, int B, int Ts, int C);
    void (*exit_backward)(void *state, const llama_plan *p, float *dy_full, const float *dy_local, int B, int Ts, int C);
} region_ops;

/* The loss on this rank's logits [N, Vl] (vocabulary rows [v0, v0 + Vl); those at V or beyond
 * are the padding of a split vocabulary (02), no token, to be masked out). A loss may keep
 * `saved_per_row` floats per row for its backward (stats [N * saved_per_row], activations) and
 * use scratch [N]. forward returns the sum of the token losses over valid targets, the same on
 * every rank; backward writes dlogits (=, may alias logits) = (softmax - onehot) * grad_scale. */
typedef struct {
    void *state;
    int saved_per_row;
    float (*forward)(void *state, const llama_plan *p, const float *logits, const int *targets, int N, int Vl,
                     int v0, int V, float *stats, float *scratch);
    void (*backward)(void *state, const llama_plan *p, float *dlogits, const float *logits, const int *targets,
                     const float *stats, int N, int Vl, int v0, int V, float grad_scale);
} loss_ops;

/* Causal attention over the heads this rank holds (llama_kernels.h's shapes): q [B, T, H, hd],
 * k, v [B, T, Hkv, hd] -> out [B, T, H, hd], probs [saved_numel] saved for backward: the softmax
 * [B, H, T, T] for the local operator; an operator may keep less (ring attention keeps the
 * log-sum-exp of each row, [B, H, T]) and says how much with saved_numel (NULL: B H T T). The
 * backward gets the forward's out and a scratch dprobs of the same size. Under context
 * parallelism T is this rank's rows of each sequence. `compute` is the model's precision (--dtype:
 * attention_forward_in's, bf16 rounding each product's operands). */
typedef struct {
    void *state;
    void (*forward)(void *state, const llama_plan *p, dtype compute, float *out, float *probs, const float *q,
                    const float *k, const float *v, int B, int T, int H, int Hkv, int hd);
    void (*backward)(void *state, const llama_plan *p, dtype compute, float *dq, float *dk, float *dv, float *dprobs,
                     const float *dout, const float *out, const float *q, const float *k, const float *v,
                     const float *probs, int B, int T, int H, int Hkv, int hd);
    size_t (*saved_numel)(void *state, const llama_plan *p, int B, int T, int H);
} attention_ops;

/* When a call runs, for an operator that keeps state across calls (chapter 07's float8: step 1's
 * casts compared with the baseline's, a forward's scales kept for its backward): the training
 * step (from 1; 0 outside training, an evaluation), the model's forward pass (from 1, every
 * forward-backward of this model: the harness counts them), and the microbatch a pipeline is
 * running (0 without one: chapter 05 sets it per action). Declared by who knows it, so no
 * operator infers it from the order of its calls. */
typedef struct { int step, pass, microbatch; } run_when;

/* Which linear a call is, when, and in which precision: its weight's kind (P_WQ ... P_W3, or
 * P_OUTPUT), its layer (-1 for the output layer), the model's run_when, and the model's compute
 * type (llama_config.precision, --dtype: fp32, or bf16 operands with fp32 accumulation). An operator
 * may treat linears differently (chapter 07 keeps the output layer in fp32, keeps a scale history
 * per weight, and reads plan->layout[kind] to know which operands a tensor-parallel split has
 * cut). The model builds a site with llama_site (model.h). */
typedef struct { param_kind kind; int layer; run_when when; dtype compute; } linear_site;

/* How a linear's backward writes its input gradient: DX_SET dx = dy W; DX_ADD dx += dy W. A
 * tensor that feeds several linears (attn_in feeds wq, wk and wv; ffn_in feeds w1 and w3) gets
 * the sum of their input gradients: the first writes, the others add in the GEMM itself (beta = 1),
 * so no extra pass over dx sums them. */
typedef enum { DX_SET, DX_ADD } dx_write;

/* y = x W^T: forward x [N, in], W [out, in] -> y [N, out] (=); backward dx (as `how` says; NULL:
 * skipped), dW (+=, NULL: skipped). The GEMMs in the site's precision by default (linear_local);
 * a float8 chapter swaps in its own. */
typedef struct {
    void *state;
    void (*forward)(void *state, const llama_plan *p, linear_site site, float *y, const float *x, const float *W,
                    int N, int in, int out);
    void (*backward)(void *state, const llama_plan *p, linear_site site, float *dx, dx_write how, float *dW,
                     const float *dy, const float *x, const float *W, int N, int in, int out);
} linear_ops;

/* A projection group (Megatron's): the linears on one side of the tensor-parallel region, with
 * the region's boundary they sit behind. proj_in is the column-parallel group that reads the
 * region's entry (wq wk wv; w1 w3; the output layer behind the vocabulary's entry), proj_out the
 * row-parallel linear whose partial sums the region's exit reduces (wo; w2). A call passes the
 * region (&p->region, or &p->vocab for the output layer) and the group's linears; by default
 * (proj_local) the group is the region's operator and then each linear's, in order, and a
 * technique may replace the whole group (03's async TP: a ring whose chunk GEMMs overlap the
 * chunk transfers). The GEMMs inside are the plan's linear operator, whatever wraps it.
 *
 * Rows: the region's tensors are [B, T, C] (N = B*T rows, C the residual width D), the residual
 * stream's [B, Ts, C]. One linear of a group: */
typedef struct {
    linear_site site;
    const float *W;     /* [out, in]                                                              */
    float *dW;          /* backward: += dy^T x (NULL: skipped)                                    */
    float *y;           /* forward: [N, out] (=)                                                  */
    const float *dy;    /* backward: [N, out]                                                     */
    int width;          /* the side away from the region: proj_in's output width (its input is
                         * C), proj_out's input width (its output is C)                          */
} proj_linear;
typedef struct { int B, T, Ts, C; } proj_rows;
/*   in_forward    x_local [B, Ts, C] -> region enter -> x_full [N, C];  y_i = x_full W_i^T, i < n
 *   in_backward   dx_full [N, C] = sum_i dy_i W_i (the first sets, the others add: DX_SET, DX_ADD),
 *                 dW_i += dy_i^T x_full; then enter's backward: dx_full -> dx_local [B, Ts, C]
 *   out_forward   y_partial [N, C] = x W^T (x [N, lin.width]), then exit: -> y_local [B, Ts, C]
 *   out_backward  exit's backward: dy_local [B, Ts, C] -> dy_full [N, C]; dx [N, lin.width] = dy_full W
 *                 (NULL: skipped), dW += dy_full^T x                                              */
typedef struct {
    void *state;
    bool splits_rows;   /* the linears run on pieces of the rows (async TP's chunks): an operator
                         * that needs a GEMM's whole input (float8's scales) cannot sit inside  */
    void (*in_forward)(void *state, const llama_plan *p, const region_ops *region, float *x_full,
                       const float *x_local, const proj_linear *lin, int n, proj_rows r);
    void (*in_backward)(void *state, const llama_plan *p, const region_ops *region, float *dx_local,
                        float *dx_full, const float *x_full, const proj_linear *lin, int n, proj_rows r);
    void (*out_forward)(void *state, const llama_plan *p, const region_ops *region, float *y_local,
                        float *y_partial, const float *x, const proj_linear *lin, proj_rows r);
    void (*out_backward)(void *state, const llama_plan *p, const region_ops *region, float *dx, float *dy_full,
                         const float *dy_local, const float *x, const proj_linear *lin, proj_rows r);
} projection_ops;

/* A mixture-of-experts layer's token exchange (chapter 09): each rank routes its own tokens, and
 * every copy goes to the rank that holds its expert and comes back. The MoE block calls
 *   counts  recv[q*El + e] (=) = the copies rank q sends to this rank's expert e, from this rank's
 *           send[E] (its copies to each expert, in expert order); El = E / the ranks
 *   rows    send [rows, width], the rows for rank 0 first (send_rows[q] to rank q) -> recv, the
 *           rows from rank 0 first (recv_rows[q] from rank q); the block sends its tokens' copies
 *           to the experts, their outputs back, and the same two ways in the backward
 *   sequence_sum  x [n] (=) summed over the ranks that hold the other rows of this rank's
 *           sequences (chapter 06's cp group): the load-balancing loss's per-sequence counts,
 *           which need whole sequences
 * Single device (expert_exchange_local): the counts and the rows copied (every expert is here),
 * the sequence sums left as they are (every row of a sequence is here).
 * Host arrays of counts, device buffers of rows. */
typedef struct {
    void *state;
    void (*counts)(void *state, const llama_plan *p, size_t *recv, const size_t *send, int E);
    void (*rows)(void *state, const llama_plan *p, float *recv, const size_t *recv_rows, const float *send,
                 const size_t *send_rows, int width);
    void (*sequence_sum)(void *state, const llama_plan *p, float *x, size_t n);
} expert_exchange_ops;

/* Weight access. Before a unit's forward (backward = false) or backward, acquire gives the
 * tensors' values (w) and where their gradients accumulate (g); release follows the unit's pass.
 * A unit is layer u for u < L, or the ends (tok_embeddings, norm, output) for u == L, acquired
 * for the whole forward or backward around the layers. Resident: views of the parameter table
 * and nothing to release (a sharded-data-parallel chapter gathers and frees here). */
typedef struct {
    void *state;
    void (*acquire)(void *state, const llama_plan *p, llama_model *m, int unit, bool backward, unit_weights *w,
                    unit_weights *g);
    void (*release)(void *state, const llama_plan *p, llama_model *m, int unit, bool backward);
} weight_ops;

/* The activations one layer may save for backward (model.h: llama_layer_acts names them). */
enum {
    ACT_H_IN = 0, ACT_ATTN_XN, ACT_ATTN_RSTD, ACT_Q, ACT_K, ACT_V, ACT_PROBS, ACT_ATTN_OUT,
    ACT_H_MID, ACT_FFN_XN, ACT_FFN_RSTD, ACT_FFN_A, ACT_FFN_B, ACT_FFN_G,
    /* a mixture-of-experts layer's (chapter 09; none of Llama's blocks declares them, so a dense
     * layer allocates nothing for them) */
    ACT_ROUTER_PROBS, ACT_MOE_CHOICE, ACT_MOE_GATES, ACT_MOE_COUNTS, ACT_MOE_X, ACT_MOE_A, ACT_MOE_B,
    ACT_MOE_G, ACT_MOE_Y, ACT_NLAYER
};
#define ACT_KEEP_ALL ((1u << ACT_NLAYER) - 1)

/* Activation checkpointing: the bits ACT_* of what each layer keeps for backward (the rest lives
 * once, in buffers shared by the layers), and what brings it back before a layer's backward, from
 * the weights `w` acquired for it. recompute returns true when it has also re-entered the region
 * (a full forward again), so the model need not gather the region's inputs once more. NULL: keeps
 * all. */
typedef struct {
    void *state;
    unsigned keep;
    bool (*recompute)(void *state, llama_model *m, int layer, const unit_weights *w);
} checkpoint_ops;

/* After the backward pass: the gradient reductions the plan owes (chapter 03's norm weights,
 * which saw only this rank's tokens; 04's data-parallel sums; 06's sum over cp). Each technique
 * that owes one wraps the operator below and calls it, so they chain. NULL: none. */
typedef struct {
    void *state;
    void (*reduce)(void *state, const llama_plan *p, llama_model *m);
} grad_reduce_ops;

/* The optimizer step on what this rank holds (NULL: AdamW on every slice of the table). */
typedef struct {
    void *state;
    void (*step)(void *state, const llama_plan *p, llama_model *m, const adamw_config *opt, int step);
} optimizer_ops;

/* How a sequence is split over ranks. shards: the residual stream holds T / shards tokens of each
 * sequence (chapter 03's sequence parallelism). positions: the RoPE positions[T] of the rows of a
 * whole sequence as the attention sees them (chapter 06's order; NULL: 0..T-1). */
typedef struct {
    void *state;
    int shards;
    void (*positions)(void *state, const llama_plan *p, int *positions_host, int T);
} sequence_ops;

/* Who runs what and when (chapter 05's pipeline). holds_layer: the layers this rank runs; it
 * stores only their weights, and the embedding when it holds layer 0, the final norm and the
 * output layer when it holds layer L-1 (NULL: every layer). A plan that schedules the step itself
 * runs this rank's rows of the batch as `microbatches` pieces (the model is built for one piece's
 * rows). forward_backward: tokens, targets [microbatches * B, T] (device) -> the loss share of
 * those rows, the same on every rank that runs them; gradients accumulated (+=); *dh0 receives
 * d loss / d h0 of the rows, [microbatches * B, Ts, D], on the ranks that hold layer 0 (for the
 * check). NULL: one piece, llama_forward then llama_backward (dh0 = m->dh). The schedule sets
 * m->when.microbatch to the microbatch of each action it runs (run_when). */
typedef struct {
    void *state;
    int microbatches;
    bool (*holds_layer)(void *state, const llama_plan *p, int layer);
    float (*forward_backward)(void *state, const llama_plan *p, llama_model *m, const int *tokens,
                              const int *targets, float loss_scale, const float **dh0);
} schedule_ops;

/* The groups the operators talk over (NULL: none, a single device). */
typedef struct {
    device_mesh *mesh;
    comm_group *tp;                /* tensor parallelism: the operators of 01, 02, 03, 07           */
    comm_group *cp;                /* context parallelism (06): every sequence is split over these
                                    * ranks for the whole model; this rank holds the rows at the
                                    * sequence's positions                                          */
    comm_group *batch;             /* the data-parallel ranks that split the global batch by rows   */
    comm_group *ep;                /* expert parallelism (09): the ranks the experts are split over,
                                    * which exchange tokens with all-to-alls (NULL: every expert
                                    * here)                                                         */
    unsigned expert_dims;          /* the mesh dimensions of `ep` (MESH_BIT), over which the experts'
                                    * weights are split expert by expert (params.h); 0: none        */
    comm_group *shard;             /* the ranks a sharded block (storage) is split over: 04's
                                    * dp_shard, or dp_shard x cp (08: the cp ranks hold the same
                                    * parameters, so they can hold different shards of them)       */
    unsigned shard_dims;           /* the mesh dimensions of `shard` (MESH_BIT); 0: dp_shard        */
    unsigned grads_summed_dims;    /* the mesh dimensions over which a technique's gradient
                                    * reduction already sums every gradient (MESH_BIT), declared by
                                    * that technique: 04's over dp_replicate x dp_shard, and cp too
                                    * when it reduce-scatters over dp_shard x cp (08). Another
                                    * technique's sum over one of them is then done (06's over cp) */
} plan_groups;

/* A technique, as the plan's stack records it: its name and what frees its state. */
typedef struct {
    const char *name;
    void (*free_state)(void *state);
} plan_technique;

/* The techniques applied to a plan, in the order they were applied, each with its state and the
 * bytes of the buffers it allocates on this rank at their first use, beyond the model's own
 * (chapter 04's gathered layers, full gradients and staging): run_model counts them in its memory
 * check before anything is allocated. plan_free frees them in reverse order. Each layer also
 * keeps a fingerprint of the plan's operators and placements as they were when it was pushed, so
 * plan_describe can say which technique installed what (a technique pushes itself first, then
 * installs: design.md). */
#define PLAN_MAX_TECHNIQUES 8
#define PLAN_NSLOTS 15   /* layout, storage and the thirteen operators (plan.c's slot table) */
typedef struct {
    int n;
    struct {
        const plan_technique *technique;
        void *state;
        double buffer_bytes;
        unsigned long long slots_before[PLAN_NSLOTS];
    } layer[PLAN_MAX_TECHNIQUES];
} plan_stack;

/* A plan is the single device's operators with techniques stacked on them: each technique's
 * apply function installs its operators (with its own state), wrapping the ones it replaces, and
 * pushes itself on `applied`. */
struct llama_plan {
    plan_groups groups;
    shard_layout layout[P_NKINDS]; /* how each kind of tensor is split over tp (params.h)         */
    block_storage storage[PARAM_NBLOCKS]; /* values, gradients, optimizer state: whole, or this
                                    * rank's shard of each tensor over groups.shard (params.h)   */
    sequence_ops sequence;
    region_ops region;             /* the layers' tensor-parallel region                          */
    region_ops vocab;              /* the embedding's exit and the output layer's entry            */
    loss_ops loss;
    attention_ops attention;
    linear_ops linear;
    projection_ops proj;           /* the projection groups: the region's boundary and its linears */
    expert_exchange_ops experts;   /* a mixture of experts' token exchange (09)                   */
    weight_ops weights;
    checkpoint_ops checkpoint;
    grad_reduce_ops reduce_grads;
    optimizer_ops optimizer;
    schedule_ops schedule;
    plan_stack applied;
};

/* Pushes a technique on the plan's stack with its state (and the buffer bytes it will allocate).
 * Exits with a message if the stack is full. Returns state. */
void *plan_push(llama_plan *p, const plan_technique *technique, void *state, double buffer_bytes);
/* The state of `technique` on this plan, or NULL when it was not applied. */
void *plan_state(const llama_plan *p, const plan_technique *technique);
/* Was `technique` applied to this plan? */
bool plan_has(const llama_plan *p, const plan_technique *technique);
/* Has a technique applied to this plan installed an operator or a placement into `slot` (a
 * member's name: "weights", "optimizer", ...)? Read off the stack's fingerprints, so a technique
 * can state an order ("apply me before whatever owns the weights") without knowing who. */
bool plan_slot_installed(const llama_plan *p, const char *slot);
/* Adds to the buffer bytes `technique` declared (it knows them only once its buffers are sized). */
void plan_add_buffer_bytes(llama_plan *p, const plan_technique *technique, double bytes);
/* The buffer bytes of every technique applied. */
double plan_buffer_bytes(const llama_plan *p);
/* Frees every technique's state, the last applied first; the plan is the single device's after. */
void plan_free(llama_plan *p);
/* The composition, printed by world rank 0 (the C counterpart of torchtitan's print(model)): the
 * techniques in the order applied, each with the operators and placements it installed (and,
 * where it sits over an earlier technique's on the same operator, which); the operators still the
 * single device's; and the ranks of world rank 0's groups. Every chapter prints it at the start
 * of its run. */
void plan_describe(const llama_plan *p);
/* The same text, into out[len] (truncated to fit): for the tests. */
void plan_describe_text(const llama_plan *p, char *out, size_t len);

/* plan_wrap(slot, below, replacement): the one way a technique replaces an operator that it
 * then calls: the operator in the plan's `slot` is kept in the technique's `below`, and
 * `replacement` (its own operator, state = the technique's) takes its place. E.g.
 *     plan_wrap(plan->linear, s->below_linear, ((linear_ops){s, my_forward, my_backward}));  */
#define plan_wrap(slot, below, replacement) ((below) = (slot), (slot) = (replacement))

/* Does the plan's rank hold the tensor of `kind` in `layer` (-1: outside the layers)? */
bool plan_holds(const llama_plan *p, int n_layers, param_kind kind, int layer);

/* The baseline: no mesh, every operator identity or local, every activation kept. */
llama_plan plan_single_device(void);

/* The local operators, for plans to reuse. */
extern const region_ops region_identity;
extern const loss_ops loss_local;           /* cross_entropy_forward / backward (llama_kernels.h) */
extern const attention_ops attention_local; /* attention_forward_in / backward_in                   */
extern const linear_ops linear_local;       /* linear_forward_in / backward_in, the site's precision */
extern const projection_ops proj_local;     /* the region's operator, then the plan's linears        */
extern const expert_exchange_ops expert_exchange_local;   /* every expert here: copies              */
extern const weight_ops weights_resident;   /* views of the parameter table                          */

/* One deliberate bug, for the checks that prove the parity check catches it: --fault NAME
 * applies it to the plan before the model is built. apply returns NULL, or why the fault does
 * not fit this plan (one line, printed by rank 0 with exit status 2). */
typedef struct {
    const char *name;
    const char *what;
    const char *(*apply)(llama_plan *p);
} plan_fault;

C_END
