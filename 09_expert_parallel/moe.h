/* moe.h: the mixture-of-experts feed-forward, a block of the model's layer (layer.h) that takes
 * the place of Llama's feed-forward (Shazeer et al. 2017; GShard; Switch Transformer).
 *
 *   m = ffn_xn [N, D]                                  the ffn_norm's output, as for Llama
 *   p = softmax(m W_r^T)          [N, E]               the router's probabilities
 *   top-k of each row of p        the experts e_{t,1..k} of token t and their gates g_{t,j} = p_{t,e}
 *   y_{t,j} = w2_e (silu(w1_e m_t) * w3_e m_t)         each copy through its expert, e = e_{t,j}
 *   h_out = h_mid + sum_j g_{t,j} y_{t,j}  (+ shared(m_t), a dense SwiGLU of ffn_dim, when on)
 *
 * Top-k: the largest probabilities first; equal ones in the order of the experts' indices (the
 * lower first), so every rank and the baseline route alike. The gates are the probabilities
 * themselves (not renormalised over the k, as Switch and GShard). Dropless by default: every copy
 * reaches its expert, however many an expert gets; with a capacity factor c each expert takes the
 * first ceil(c T k / E) copies of each sequence (token order, then j) and the others are dropped:
 * no output, no gradient (moe.c's route_capacity).
 *
 * The load-balancing loss (Switch's, alpha E sum_e f_e P_e), per sequence s of T tokens:
 *   f_{s,e} = (copies of s's tokens routed to e, dropped ones included) / (k T),
 *   P_{s,e} = mean over s's tokens of p_{t,e}
 *   aux = sum over the batch's sequences of T * alpha E sum_e f_{s,e} P_{s,e}, times the loss scale
 * (1 / the global count of valid targets, as the cross-entropy's), so it is the same however the
 * batch is split over data-parallel ranks; with every target valid it is the mean over sequences.
 * f is a count (no gradient). Under context parallelism a rank holds part of each sequence's
 * tokens: f's counts are summed over the cp ranks (the plan's experts.sequence_sum), and each rank
 * adds its own tokens' part of T P_{s,e}.
 *
 * DeepSeek-V3's router (--router sigmoid, its section 2.1.2): scores s = sigmoid(m W_r^T) expert by
 * expert in place of p; the top-k of s (the same tie rule); the gates the chosen scores over their
 * sum, g_{t,j} = s_{t,e} / sum_i s_{t,e_{t,i}}; and the balancing loss on each token's scores over
 * their sum over the E experts, P_{s,e} = mean over s's tokens of s_{t,e} / sum_f s_{t,f}. (Its
 * auxiliary-loss-free bias, a per-expert offset added for the top-k alone, is not built.)
 */
/* BEGIN SOLUTION 09: the balancing loss's gradient */
/* Its gradient: d aux / d p_{t,e} = loss scale * alpha E f_{s,e}, on every token t of sequence s. */
/* END SOLUTION */
/* With expert parallelism (expert_parallel.h) the copies travel to the rank that holds their
 * expert and back, with all-to-alls over the plan's ep group (moe.c says when and how many bytes).
 */
#pragma once
#include <stddef.h>
#include "layer.h"
#include "model.h"

C_BEGIN

/* The layers with the MoE feed-forward: without and with the shared expert. */
extern const llama_layer moe_layer, moe_layer_shared;
static inline const llama_layer *moe_layer_for(const llama_config *c) {
    return c->moe.shared_expert ? &moe_layer_shared : &moe_layer;
}

/* NULL when c->moe is a valid mixture of experts (E >= 1, 1 <= k <= E, F_e >= 1, alpha >= 0);
 * otherwise why, one line naming the flag and what is valid. */
const char *moe_config_check(const llama_config *c, char *why, size_t len);

C_END
