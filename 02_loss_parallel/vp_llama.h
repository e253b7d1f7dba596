/* vp_llama.h: chapter 01's tensor-parallel Llama with vocabulary-parallel ends.
 *
 * The transformer layers are chapter 01's (tp_layer_forward / tp_layer_backward, unchanged).
 * What changes is the first and the last step of the model:
 *
 *   tokens ─ [tok_embeddings, V/tp rows] ─ all-reduce ─ h0 ─ layers (ch. 01) ─ rmsnorm ─ f ─
 *          ─ [output, V/tp rows] ─ logits [N, V/tp] ─ vocab-parallel cross-entropy ─ loss
 *
 * Parameters: chapter 01's tp_params with tok_embeddings and output split by rows
 * (vp_layouts), so tp_params already holds Vl = V/tp rows of each, starting at v0, and chapter
 * 01's model allocates logits of [N, Vl].
 */
#pragma once
#include <stdbool.h>
#include "../01_transformer_tp/tp.h"

/* Megatron's layer layouts (chapter 01) plus tok_embeddings and output split over the
 * vocabulary: each rank owns V/tp rows of both. */
tp_layouts vp_layouts(void);

typedef struct {
    tp_llama *m;                      /* chapter 01's model: weights, layer activations, logits [N, Vl] */
    float *row_max, *row_sumexp;      /* [N] the loss's M and S, saved for backward (activations)    */
    float *target_logit;              /* [N] x_t, forward only (buffer)                              */
    collective_stats loss_comm;       /* the loss's all-reduces, counted apart from the rest         */
    bool skip_output_allreduce;       /* a deliberate bug: leave out f's all-reduce before output    */
} vp_llama;

/* Validates tp against heads, ffn and vocabulary (exit 2), then allocates this rank's shard. */
vp_llama *vp_llama_create(const llama_config *c, comm_group *tp, int B, int T, uint64_t seed);
void vp_llama_free(vp_llama *v);

/* tokens, targets [B*T], positions [T] on the device. Returns the sum of token losses times
 * loss_scale (the same on every rank).
 * Issues: 1 all-reduce of N*D (embedding), 2 per layer of N*D (ch. 01), 3 of N (loss). */
float vp_llama_forward(vp_llama *v, const int *tokens, const int *targets, const int *positions,
                       float loss_scale);
/* Issues: 1 all-reduce of N*D (f before output), 2 per layer of N*D (ch. 01). */
void vp_llama_backward(vp_llama *v);
