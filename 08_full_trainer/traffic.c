/* traffic.c: see traffic.h. */
#include <stdio.h>
#include <string.h>
#include "../04_fsdp/data_parallel.h"
#include "comm.h"
#include "log.h"
#include "params.h"
#include "report.h"
#include "traffic.h"

/* Why the composed formulas below do not cover a run (NULL: they do). */
static const char *not_predicted(const parallel_options *o) {
    const int *g = o->degree;
    if (g[MESH_TP] > 1 && !o->sp) return "--no-sp (tensor parallelism without sequence parallelism)";
    if (o->ac == AC_FULL) return "--ac full (its recompute repeats the forward's collectives)";
    if (g[MESH_CP] > 1 && o->cp.method != CP_RING) return "--cp-method other than ring";
    if (o->fp8.recipe != FLOAT8_OFF && g[MESH_TP] > 1) return "--fp8 with tp (the amax all-reduces of each cast)";
    return NULL;
}

int report_traffic(const parallel_options *o, device_mesh *mesh, const llama_model *m, int steps, int accum) {
    const char *why = not_predicted(o);
    if (why) {
        log0("communication per step: not predicted for %s; chapters 03, 06 and 07 print those tables\n", why);
        return 0;
    }
    if (comm_world()->rank != 0) return 0;   /* the formulas are rank 0's (its stage, its groups) */
    const int *g = o->degree;
    const llama_dims *d = &m->d;
    const param_table *t = m->params;
    int P = g[MESH_PP], C = g[MESH_CP], tp = g[MESH_TP], R = g[MESH_DP_REPLICATE];
    int S = parallel_shard_ranks(o);   /* FSDP's shard group: dp_shard x cp, or dp_shard */
    bool shards_span_cp = C > 1 && (m->plan->groups.shard_dims & MESH_BIT(MESH_CP));
    int V = o->pp.virtual_stages, L = m->c.n_layers;
    double passes = (double)accum * (P > 1 ? o->pp.microbatches : 1);   /* forward+backward passes a step */

    /* what world rank 0 holds: its stage's layers, the embedding (chunk 0 is its own), the output
     * layer only without a pipeline */
    int Lr = 0;
    for (int l = 0; l < L; l++) Lr += plan_holds(m->plan, L, P_WQ, l);
    bool out = t->t[param_index(t, P_OUTPUT, -1)].here;
    double shard_floats = 0, norm_floats = 0;   /* its dp shard of every tensor it holds; of the norms */
    int units = Lr + 1;                         /* its layers and the ends (rank 0's stage holds the embedding):
                                                 * one FSDP collective moves a unit */
    double kept_floats = 0;   /* without a pipeline (prefetch on): the ends' and the last layer's
                               * shards, whose units stay gathered from forward to backward (04) */
    for (int i = 0; i < t->n; i++) {
        const param_tensor *x = &t->t[i];
        shard_floats += (double)x->shard_units * x->width;
        if (P == 1 && (x->spec.layer < 0 || x->spec.layer == L - 1)) kept_floats += (double)x->shard_units * x->width;
        param_kind k = x->spec.kind;
        if (k == P_ATTENTION_NORM || k == P_FFN_NORM || k == P_NORM) norm_floats += (double)param_stored_numel(t, t->grads, i);
    }
    double full = 4.0 * d->B * d->T * d->D;   /* a tp region's input or output: a microbatch's Tl rows */

    comm_expectation e[16];
    int n = 0;
    comm_group *groups[6];
    int ng = 0;
    if (tp > 1) {   /* chapter 03: each layer 2 + 2 + 2 gathers (forward, backward, the re-gathers of the
                     * norms' outputs) and 2 + 2 reduce-scatters; the vocabulary ends 1 (embedding) and 2
                     * (output) gathers, 1 and 1 reduce-scatters; chapter 02's loss, 3 all-reduces */
        comm_group *q = mesh->group[MESH_TP];
        double ag = 6.0 * Lr + 1 + (out ? 2 : 0), rs = 4.0 * Lr + 1 + (out ? 1 : 0);
        /* --async-tp: the layers' 4 gathers and 4 reduce-scatters around a GEMM and the output
         * layer's 1 and 1 are rings of tp-1 point-to-point steps of B Ts D x 4 each */
        double rings = o->async_tp ? 2 * (4.0 * Lr + (out ? 1 : 0)) : 0;
        if (o->async_tp) { ag -= rings / 2; rs -= rings / 2; }
        /* --dtype bf16: every gather a GEMM reads moves bf16, all but the embedding's dy (03's
         * sp_all_gather_seq_bf16: 2 bytes an element); so do the async-TP gather rings (below) */
        double bf16_ag = o->sp && m->c.precision == DTYPE_BF16 ? ag - 1 : 0;
        const char *f = o->async_tp ? (out ? "n (2L+2) x B Tl D x 4" : "n (2Lr+1) x B Tl D x 4")
                                    : out ? "n (6L+3) x B Tl D x 4" : "n (6Lr+1) x B Tl D x 4";
        if (bf16_ag > 0)
            f = o->async_tp ? (out ? "n ((2L+1) x 2 + 4) x B Tl D" : "n (2Lr x 2 + 4) x B Tl D")
                            : out ? "n ((6L+2) x 2 + 4) x B Tl D" : "n (6Lr x 2 + 4) x B Tl D";
        e[n++] = (comm_expectation){q, COLL_ALL_GATHER, passes * ag, passes * (ag - bf16_ag / 2) * full, f};
        e[n++] = (comm_expectation){q, COLL_REDUCE_SCATTER, passes * rs, passes * rs * full,
                                    o->async_tp ? "n x B Tl D x 4" : out ? "n (4L+2) x B Tl D x 4" : "n (4Lr+1) x B Tl D x 4"};
        if (o->async_tp) {   /* (--dtype bf16: the gather rings' half of the messages at 2 bytes an element) */
            double msgs = passes * (tp - 1) * rings, bytes = msgs * full / tp * (bf16_ag > 0 ? 0.75 : 1);
            const char *f = out ? "n (tp-1)(8L+2) x B Tl D x 4/tp" : "n (tp-1) 8Lr x B Tl D x 4/tp";
            if (bf16_ag > 0) f = out ? "n (tp-1)(4L+1)(2 + 4) x B Tl D/tp" : "n (tp-1) 4Lr (2 + 4) x B Tl D/tp";
            e[n++] = (comm_expectation){q, COLL_SEND, msgs, bytes, f};
            e[n++] = (comm_expectation){q, COLL_RECV, msgs, bytes, f};
        }
        double loss = out ? 3 * passes : 0;
        e[n++] = (comm_expectation){q, COLL_ALL_REDUCE, loss + 1, loss * 4.0 * d->B * d->T + 4 * norm_floats,
                                    out ? "3n x B Tl x 4 + norms' grads x 4" : "the norms' grads x 4"};
        groups[ng++] = q;
    }
    if (C > 1) {    /* chapter 06's ring on rank 0's layers, in every pass; then the gradient block
                     * all-reduced once a step, unless FSDP's shards span cp (its reduce-scatter has
                     * summed over cp) */
        comm_group *q = mesh->group[MESH_CP];
        double block = 4.0 * 2 * d->B * d->T * d->Hkvl * d->hd;
        double sends = 0;   /* rank 0's sends of one K/V block (or its gradient) per step; as many receives */
        /* BEGIN ASSIGNMENT: composed traffic: rank 0's ring sends per step, over its Lr layers and the n passes (and what selective recompute adds) */
        sends = passes * Lr * (3.0 * C - 2 + (o->ac == AC_SELECTIVE ? C - 1 : 0));
        /* END ASSIGNMENT */
        const char *f = "n Lr x (the ring's sends) x 2 B Tl Hkv hd x 4";
        /* BEGIN SOLUTION 08: composed traffic */
        f = o->ac == AC_SELECTIVE ? "n Lr (4C-3) x 2 B Tl Hkv hd x 4" : "n Lr (3C-2) x 2 B Tl Hkv hd x 4";
        /* END SOLUTION */
        /* under --dtype bf16 the K/V blocks travel as bf16 (06's kv_wire), their gradients (C of the
         * ring's sends per layer and pass) in fp32 */
        double bytes = sends * block;
        if (m->c.precision == DTYPE_BF16) {
            double grad_sends = passes * Lr * C;
            bytes = ((sends - grad_sends) / 2 + grad_sends) * block;
            f = "n Lr x (the ring's K/V sends x 2 + its gradient sends x 4) x 2 B Tl Hkv hd";
        }
        e[n++] = (comm_expectation){q, COLL_SEND, sends, bytes, f};
        e[n++] = (comm_expectation){q, COLL_RECV, sends, bytes, f};
        if (!shards_span_cp)
            e[n++] = (comm_expectation){q, COLL_ALL_REDUCE, 1, 4.0 * param_block_numel(t, t->grads),
                                        "the grads as stored x 4"};
        else   /* none: a row of 0 calls, so the table shows that it is gone */
            e[n++] = (comm_expectation){q, COLL_ALL_REDUCE, 0, 0, "none: in FSDP's reduce-scatter"};
        groups[ng++] = q;
    }
    if (P > 1) {    /* chapter 05: chunk c sends h to c+1 and dh to c-1; rank 0 holds chunks 0, P, .. */
        comm_group *q = mesh->group[MESH_PP];
        double msgs = 0, bytes = 4.0 * d->B * d->Ts * d->D;   /* rank 0's messages per step; one's bytes */
        /* BEGIN ASSIGNMENT: composed traffic: rank 0's pipeline messages per step, over the n passes, with its V chunks */
        msgs = passes * (2.0 * V - 1);
        /* END ASSIGNMENT */
        const char *f = "n x (rank 0's chunk messages) x B Ts D x 4";
        /* BEGIN SOLUTION 08: composed traffic */
        f = "n (2V-1) x B Ts D x 4";
        /* END SOLUTION */
        e[n++] = (comm_expectation){q, COLL_SEND, msgs, msgs * bytes, f};
        e[n++] = (comm_expectation){q, COLL_RECV, msgs, msgs * bytes, f};
        groups[ng++] = q;
    }
    if (R * S > 1) {   /* chapter 04: each unit gathered before its forward and backward, its
                        * gradients reduce-scattered after (and all-reduced over the replicas), over
                        * the shard group (dp_shard x cp, or dp_shard) */
        comm_group *q = m->plan->groups.shard;
        double kept_units = P == 1 ? 2 : 0, gathers = 2 * units - kept_units, bf16_elems = 0;
        if (m->c.precision == DTYPE_BF16)   /* 04's policy: by tensor, the linears' weights as bf16 */
            fsdp_gather_counts(t, L, true, P == 1, &gathers, &bf16_elems);
        const char *f = P == 1 ? "n x (2 S Psi_S - ends - last layer) x 4" : "n x 2 x S Psi_S x 4";
        if (bf16_elems > 0) f = P == 1 ? "n x ((2 S Psi_S - ends - last) x 4 - 2 x linears')" : "n x (2 S Psi_S x 4 - 2 x linears')";
        e[n++] = (comm_expectation){q, COLL_ALL_GATHER, passes * gathers,
                                    passes * (S * 4 * (2 * shard_floats - kept_floats) - 2 * bf16_elems), f};
        /* the gradients at 4 bytes an element, or 2 under --reduce-dtype bf16 (04's bf16 copies) */
        double e_grad = (double)dtype_size(o->reduce_type);
        bool bf16_grads = o->reduce_type == DTYPE_BF16;
        e[n++] = (comm_expectation){q, COLL_REDUCE_SCATTER, passes * units, passes * S * e_grad * shard_floats,
                                    bf16_grads ? "n x S Psi_S x 2 (bf16)" : "n x S Psi_S x 4"};
        groups[ng++] = q;
        if (R > 1) {
            comm_group *r = mesh->group[MESH_DP_REPLICATE];
            e[n++] = (comm_expectation){r, COLL_ALL_REDUCE, passes * units, passes * e_grad * shard_floats,
                                        bf16_grads ? "n x Psi_S x 2 (bf16)" : "n x Psi_S x 4"};
            groups[ng++] = r;
        }
    }
    /* the clipping: the squares of every held gradient, one float over the world */
    e[n++] = (comm_expectation){comm_world(), COLL_ALL_REDUCE, 1, 4, "1 float (the global norm)"};
    groups[ng++] = comm_world();
    log0("\nworld rank 0 (pipeline stage 0 of %d, %d of %d layers; n = %g forward-backward passes a step), "
         "evaluation and checkpoints left out:\n", P, Lr, L, passes);
    return report_communication(groups, ng, steps, e, n);
}
