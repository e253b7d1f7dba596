/* float8_report.c: chapter 07's measured figures beside their formulas and thresholds (float8_report.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "comm.h"
#include "device.h"
#include "files.h"
#include "llama_kernels.h"
#include "log.h"
#include "parity.h"
#include "report.h"
#include "float8_all_gather.h"
#include "float8_probe.h"
#include "float8_report.h"

/* torchao's thresholds (its float8 tests): an E4M3 cast at least 25 dB, a linear's output 18 dB,
 * its weight gradient 17 dB. An E5M2 cast has one mantissa bit less, 6.02 dB less signal to
 * rounding noise: 25 - 6.02. The input gradient is held to the output's 18 dB. */
static double threshold_db(float8_recipe r, int role) {
    switch (role) {
    case FLOAT8_CAST_X: case FLOAT8_CAST_W: case FLOAT8_CAST_DY:
        return float8_role_format(r, role) == FLOAT8_E4M3 ? 25.0 : 25.0 - 20 * log10(2.0);
    case FLOAT8_OUT_DW: return 17.0;
    default: return 18.0;
    }
}

static const char *kind_name(param_kind k) {
    static const char *names[P_NKINDS] = {"tok_embeddings", "attention_norm", "wq", "wk", "wv", "wo",
                                          "ffn_norm", "w1", "w2", "w3", "norm", "output"};
    return names[k];
}

/* The worst SQNR of each cast and product in step 1 (judged, as torchao's single-step tests) and
 * over the whole run (shown: a delayed scale that lags a growing amax clips), over every rank. */
int float8_report_accuracy(const llama_plan *plan, float8_recipe r, const dp_gather_ops *gather, dtype high) {
    double first[FLOAT8_NROLES], worst[FLOAT8_NROLES];
    linear_site at[FLOAT8_NROLES];
    float8_worst_sqnr(plan, first, worst, at);
    int bad = 0;
    /* (under --dtype bf16 the casts start from bf16 values, and the products are measured against
     * the same GEMM on them: float8's error over bf16's) */
    const char *h = dtype_name(high);
    log0("float8 against %s: the lowest SQNR = 20 log10(|%s| / |%s - float8|) over every linear (this rank's "
         "part of each tensor), in step 1 (judged) and over the run (shown):\n", h, h, h);
    log0("  %-12s %-9s %9s  %-14s %9s  %s\n", "", "format", "step 1", "threshold", "the run", "where");
    for (int role = 0; role < FLOAT8_NROLES; role++) {
        double one = -comm_host_max(comm_world(), -first[role]);
        double mine = worst[role], all = -comm_host_max(comm_world(), -mine);
        bool ok = one >= threshold_db(r, role);
        bad += !ok;
        const char *fmt = role <= FLOAT8_CAST_DY ? (float8_role_format(r, role) == FLOAT8_E4M3 ? "E4M3" : "E5M2") : "fp32 acc.";
        char where[64] = "";
        if (role == FLOAT8_CAST_W && gather)
            snprintf(where, sizeof where, "(already float8: cast in the all-gather, below)");
        else if (mine == all && isfinite(mine))
            snprintf(where, sizeof where, "layers.%d.%s", at[role].layer, kind_name(at[role].kind));
        log0("  %-12s %-9s %6.2f dB  >= %5.2f dB %s %6.2f dB  %s\n", float8_role_name(role), fmt, one,
             threshold_db(r, role), ok ? "ok   " : "BELOW", all, where);
    }
    if (gather) {   /* the weights' cast, done on the shards before the all-gather */
        double db = -comm_host_max(comm_world(), -float8_all_gather_worst_sqnr(gather));
        bool ok = db >= threshold_db(r, FLOAT8_CAST_W);
        bad += !ok;
        log0("  %-12s %-9s %6.2f dB  >= %5.2f dB %s (each shard with the tensor's scale, over the run)\n",
             "cast W, gather", "E4M3", db, threshold_db(r, FLOAT8_CAST_W), ok ? "ok   " : "BELOW");
    }
    if (bad) parity_fail("a float8 cast or product is further from fp32 than torchao's threshold (above)");
    return bad;
}

/* The exact test: each tp shard's float8 bytes of every block weight against one device's cast. */
int float8_report_sharded_cast(const llama_plan *plan, llama_model *m) {
    long long compared = 0, bad = float8_sharded_cast_mismatches(plan, m, &compared);
    log0("sharded cast: the tp shards' float8 bytes of every block weight, gathered, against the cast of the "
         "whole weight on one device: %lld of %lld bytes differ  %s\n", bad, compared, bad ? "MISMATCH" : "(exact)");
    if (bad) parity_fail("a shard's float8 cast differs from the single-device cast (above)");
    return bad > 0;
}

/* Per step. tp: chapter 01's 4 all-reduces of [N, D] per layer, and the float8 linears' amaxes.
 * dp_shard (FSDP, every tensor gathered before its forward and again before its backward, its
 * gradient reduce-scattered): with --fp8-all-gather the 7 L block weights move 1 byte per element
 * instead of 4, after one amax all-reduce each (over dp_shard, and over tp). */
int float8_report_traffic(const run_options *o, device_mesh *mesh, const llama_plan *plan, const llama_model *m,
                          float8_recipe r, bool float8_gather) {
    double L = o->model.n_layers, N = m->d.N, D = m->d.D;
    bool rowwise = r == FLOAT8_ROWWISE, fp8 = r != FLOAT8_OFF;
    comm_group *groups[2];
    comm_expectation e[4];
    int n_groups = 0, n = 0;
    comm_group *shard = mesh->group[MESH_DP_SHARD];
    if (shard->size > 1) {   /* the tensors' shards: S x ceil(units / S) x width, padded */
        const param_table *t = m->params;
        /* 04 gathers each unit before its forward and its backward, but for the ends and the last
         * layer, which stay gathered from forward to backward; the float8 all-gather moves tensor
         * by tensor, chapter 04's fp32 one unit by unit */
        double fp32 = 0, blocks = 0, kept_fp32 = 0, kept_blocks = 0, kept_tensors = 0;
        for (int i = 0; i < t->n; i++) {
            double elems = (double)shard->size * t->t[i].shard_units * t->t[i].width;
            bool kept = t->t[i].spec.layer < 0 || t->t[i].spec.layer == L - 1, block = float8_gathers(t->t[i].spec.kind);
            fp32 += 4 * elems;
            if (block) blocks += elems;
            if (kept) { kept_fp32 += 4 * elems; kept_tensors++; }
            if (kept && block) kept_blocks += elems;
        }
        double gathered = float8_gather ? fp32 - 3 * blocks : fp32;   /* a block weight: 1 byte, not 4 */
        double kept = float8_gather ? kept_fp32 - 3 * kept_blocks : kept_fp32;
        double calls = float8_gather ? 2.0 * t->n - kept_tensors : 2 * (L + 1) - 2;
        double bf16_elems = 0;   /* --dtype bf16: the linears' weights gathered as bf16, by tensor (04) */
        if (!float8_gather && o->model.precision == DTYPE_BF16)
            fsdp_gather_counts(t, (int)L, true, true, &calls, &bf16_elems);
        groups[n_groups++] = shard;
        e[n++] = (comm_expectation){shard, COLL_ALL_GATHER, calls, 2 * gathered - kept - 2 * bf16_elems,
                                    float8_gather ? "(2 S Psi_S - ends - last layer) x 4 - 3 x blocks'"
                                    : bf16_elems > 0 ? "(2 S Psi_S - ends - last layer) x 4 - 2 x linears'"
                                                     : "(2 S Psi_S - ends - last layer) x 4"};
        e[n++] = (comm_expectation){shard, COLL_REDUCE_SCATTER, L + 1, fp32, "S Psi_S x 4"};
        if (float8_gather) e[n++] = (comm_expectation){shard, COLL_ALL_REDUCE, 7 * (2 * L - 1), 7 * (2 * L - 1) * 4, "(2L - 1) x 7 amaxes of 4 bytes"};
        if (float8_gather)
            log0("float8 all-gather: the block weights (S Psi_blocks = %.0f elements with the padding) move %s per "
                 "gather instead of %s, a quarter\n", blocks, fmt_bytes(blocks), fmt_bytes(4 * blocks));
    }
    if (plan->groups.tp) {
        /* the float8 linears' amaxes agreed over tp in a step (fp32: none): how many MAX
         * all-reduces, and how many floats they carry in all (L layers, N tokens, D = dim) */
        double amax_calls = 0, amax_floats = 0;
        /* BEGIN ASSIGNMENT: the amax agreements: how many amax all-reduces over tp the 7 linears of the L layers issue per step, and how many floats in all, for the per-tensor recipes and for rowwise */
        if (fp8) {
            amax_calls = 14 * L;
            amax_floats = rowwise ? 7 * L * (N + D) : 14 * L;
        }
        /* END ASSIGNMENT */
        /* (--fp8-all-gather: 7 (2L - 1) more, one float each: each block weight's amax, agreed before
         * each of its gathers; the last layer's are gathered once, 04) */
        double gather_amaxes = float8_gather ? 7 * (2 * L - 1) : 0;
        double calls = 4 * L + amax_calls + gather_amaxes;
        double bytes = 4 * L * N * D * 4 + 4 * amax_floats + 4 * gather_amaxes;
        const char *formula = fp8 ? "4 L x N D x 4 + the amaxes" : "4 L x N D x 4";
        /* BEGIN SOLUTION 07: the amax agreements */
        formula = !fp8 ? "4 L x N D x 4"
                : rowwise ? "4 L x N D x 4 + 14 L amaxes: 7 L (N + D) x 4"
                : float8_gather ? "4 L x N D x 4 + (28 L - 7) amaxes of 4 bytes"
                             : "4 L x N D x 4 + 14 L amaxes of 4 bytes";
        /* END SOLUTION */
        groups[n_groups++] = plan->groups.tp;
        e[n++] = (comm_expectation){plan->groups.tp, COLL_ALL_REDUCE, calls, bytes, formula};
    }
    return n_groups ? report_communication(groups, n_groups, o->steps, e, n) : 0;
}

int bf16_report_roundings(const run_options *o, const llama_model *m) {
    const llama_config *c = &o->model;
    const llama_dims *d = &m->d;
    /* this rank's tokens N, the model's widths, the tp slices of the heads and the ffn units */
    double L = c->n_layers, N = d->N, D = d->D, V = c->vocab_size, hd = d->hd;
    double Hl = d->Hl, Hkvl = d->Hkvl, Fl = d->Fl;
    double per_step = 0;   /* elements rounded to bf16 in one training step, on this rank */
    const char *formula = "the operands of every GEMM of the linears";
    /* BEGIN ASSIGNMENT: the bf16 roundings: how many elements this rank's linears round to bf16 in one training step (forward and backward), in L, N, D, V, hd, Hl, Hkvl and Fl */
    /* a linear [N, in] -> [N, out]: x and W forward; dy, W and x backward */
#define ROUNDED(in, out) (2 * N * (in) + 2 * (out) * (in) + N * (out))
    per_step = L * (ROUNDED(D, Hl * hd) + 2 * ROUNDED(D, Hkvl * hd) + ROUNDED(Hl * hd, D)
                    + 2 * ROUNDED(D, Fl) + ROUNDED(Fl, D)) + ROUNDED(D, V);
#undef ROUNDED
    /* END ASSIGNMENT */
    /* BEGIN SOLUTION 07: the bf16 roundings */
    formula = "(2 N in + 2 out in + N out) over the 7 L linears and the output layer";
    /* END SOLUTION */
    double measured = (double)linear_bf16_rounded() / o->steps;
    bool ok = fabs(measured - per_step) < 0.5;
    int wrong = (int)comm_host_sum(comm_world(), ok ? 0 : 1);   /* every rank's own count */
    log0("bf16 roundings per step on world rank 0: %.0f elements | %.0f  %s%s\n", measured, per_step, formula,
         ok ? "" : " MISMATCH");
    if (wrong) parity_fail("a rank rounded another number of elements to bf16 than the formula (above)");
    return wrong ? 1 : 0;
}

/* Layer 0's w1, gathered to rank 0, scaled tensorwise into E4M3 (s = 448 / amax): each element's
 * x, x s and its cast's value decode(q) in the scaled domain, for make plot-07's histogram. */
void float8_write_cast_sample(llama_model *m, const char *path) {
    const param_table *t = m->params;
    int i = param_index(t, P_W1, 0);
    param_spec spec = t->t[i].spec;
    size_t n = (size_t)spec.rows * spec.cols;
    float *w = comm_world()->rank == 0 ? malloc(n * sizeof(float)) : NULL;
    param_gather(t, i, false, w);
    if (!w) return;
    float amax = 0;
    for (size_t k = 0; k < n; k++) amax = float8_amax_merge(amax, fabsf(w[k]));
    float s = float8_scale_from_amax(amax, FLOAT8_E4M3, 0);
    FILE *f = out_open(path, "x,x_scaled,cast_scaled", false);   /* (write errors: run_finish) */
    if (f) {
        for (size_t k = 0; k < n; k++)
            csv_row(f, "%.9g,%.9g,%.9g", w[k], w[k] * s, float8_decode(float8_encode(w[k] * s, FLOAT8_E4M3), FLOAT8_E4M3));
        csv_close(f);
        log0("cast sample: %s (%zu elements of %s, amax %.6g, scale %.6g)\n", path, n, spec.name, amax, s);
    }
    free(w);
}
