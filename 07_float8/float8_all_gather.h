/* float8_all_gather.h: FSDP's all-gather of the block weights in float8 (torchao's float8
 * all-gather for FSDP2), for chapter 04's fully sharded plan.
 *
 * Under FSDP every layer's weights are all-gathered before its forward and again before its
 * backward. The float8 linear casts each weight to E4M3 right after, so the gather may as well
 * move the float8 bytes: each rank casts its shard with the scale of the WHOLE tensor (the shards'
 * amaxes MAX-all-reduced over dp_shard, and over tp where tp cuts the weight), the all-gather moves
 * 1 byte per element instead of 4, and each rank decodes the gathered bytes into the layer's
 * buffer. The float8 linear then casts those values again, with the scale it computes from them,
 * and gets back the same codes: the cast is done once, on the shards, before the traffic.
 *
 *   per gather of a block weight [rows, cols], S shards:  1 MAX all-reduce of 1 float (dp_shard,
 *   and tp), 1 all-gather of S x shard bytes instead of S x shard x 4
 *
 * The norms, the embedding and the output layer are gathered as before (fp32). Tensorwise
 * scaling only (a rowwise or delayed scale is not the one the gathered bytes were cast with).
 */
#pragma once
#include "../04_fsdp/data_parallel.h"
#include "plan.h"

/* The gather operations for dp_options.gather, over the plan's tp group (NULL: no tp), casting from
 * `high` (the model's precision: under bf16 each shard is rounded to bf16 first, as the float8
 * linear rounds its operands, so the codes are the linear's). */
dp_gather_ops float8_all_gather_ops(comm_group *tp, dtype high);
void float8_all_gather_free(dp_gather_ops *ops);
/* The lowest SQNR (dB) of a shard's cast against its high-precision values (fp32, or bf16 under
 * --dtype bf16), over the run, on this rank. */
double float8_all_gather_worst_sqnr(const dp_gather_ops *ops);

/* Is tensor kind `kind` gathered as float8 (a block weight: wq wk wv wo w1 w2 w3)? */
bool float8_gathers(param_kind kind);
