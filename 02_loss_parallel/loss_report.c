/* loss_report.c: see loss_report.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "comm.h"
#include "data.h"
#include "device.h"
#include "files.h"
#include "llama_kernels.h"
#include "log.h"
#include "parity.h"
#include "loss_report.h"

void describe_batch(const run_options *o, int p) {
    /* the shards of the padded vocabulary (a shard of padding only has neither) */
    int B = o->batch, T = o->model.seq_len, N = B * T, Vl = llama_padded_vocab(&o->model, p) / p;
    int *tok = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
    int *tok_in = calloc(p, sizeof(int)), *tgt_in = calloc(p, sizeof(int));
    synthetic_batch(tok, tgt, B, T, o->model.vocab_size, o->seed, 1);
    int padded_seqs = 0, empty = 0;
    for (int b = 0; b < B; b++) {
        int padded = 0;
        for (int t = 0; t < T; t++) padded |= tgt[b * T + t] == IGNORE_INDEX;
        padded_seqs += padded;
    }
    for (int n = 0; n < N; n++) {
        tok_in[tok[n] / Vl]++;
        if (tgt[n] != IGNORE_INDEX) tgt_in[tgt[n] / Vl]++;
    }
    log0("step 1 batch: %d of %d sequences padded; tokens | targets per vocabulary shard:", padded_seqs, B);
    for (int r = 0; r < p; r++) {
        log0(" %d|%d", tok_in[r], tgt_in[r]);
        empty += tok_in[r] == 0 || tgt_in[r] == 0;
    }
    log0(empty ? "  (%d shard(s) without tokens or targets)\n" : "  (every shard has both)\n", empty);
    free(tok); free(tgt); free(tok_in); free(tgt_in);
}

/* The loss's collectives, counted around the plan's loss operator: a wrapper with its own state
 * (the operator below and the count), as every technique wraps an operator. */
typedef struct {
    loss_ops below;
    collective_stats comm;
} loss_counter;
static loss_counter counter;
static float counting_forward(void *state, const llama_plan *p, const float *logits, const int *targets, int N,
                              int Vl, int v0, int V, float *stats, float *scratch) {
    loss_counter *c = state;
    collective_stats before = p->groups.tp->stats[COLL_ALL_REDUCE];
    float loss = c->below.forward(c->below.state, p, logits, targets, N, Vl, v0, V, stats, scratch);
    const collective_stats *now = &p->groups.tp->stats[COLL_ALL_REDUCE];
    c->comm.calls += now->calls - before.calls;
    c->comm.payload_bytes += now->payload_bytes - before.payload_bytes;
    return loss;
}
static void counting_backward(void *state, const llama_plan *p, float *dlogits, const float *logits,
                              const int *targets, const float *stats, int N, int Vl, int v0, int V,
                              float grad_scale) {
    loss_counter *c = state;
    c->below.backward(c->below.state, p, dlogits, logits, targets, stats, N, Vl, v0, V, grad_scale);
}
void count_loss_traffic(llama_plan *plan) {
    loss_ops counting = {&counter, plan->loss.saved_per_row, counting_forward, counting_backward};
    plan_wrap(plan->loss, counter.below, counting);
}

int report_loss_parallel(const run_options *o, comm_group *tp, double largest_measured,
                         double largest_other) {
    int p = tp->size, mismatches = 0;
    double N4 = 4.0 * o->batch * o->model.seq_len, NV4 = N4 * o->model.vocab_size;
    /* the loss's share: 3 all-reduces of B*T floats per training step */
    double calls = (double)counter.comm.calls / o->steps, bytes = counter.comm.payload_bytes / o->steps;
    bool ok = fabs(calls - 3) < 1e-9 && fabs(bytes - 3 * N4) < 0.5;
    mismatches += !ok;
    if (!ok) parity_fail("the loss's measured communication differs from 3 x B*T*4 (above)");
    log0("  the loss: %.2f all-reduces, %s per step | 3 x B*T*4 = %s (max, sum of exp, target logit)  %s\n",
         calls, fmt_bytes(bytes), fmt_bytes(3 * N4), ok ? "" : "MISMATCH");
    log0("  gathering the logits instead: an all-gather of B*T*V*4 = %s per step (%s sent per rank, ring), %.0fx the loss's\n",
         fmt_bytes(NV4), fmt_bytes(NV4 * (p - 1) / p), NV4 / (3 * N4));
    int V = o->model.vocab_size, Vp = llama_padded_vocab(&o->model, p);
    if (Vp > V)
        log0("  the padding (%d rows): the loss still moves 3 x B*T*4 (one float per row and statistic, whatever the "
             "vocabulary); the output GEMM and the logits are Vp/V = %.4f of the unpadded ones'\n", Vp - V, (double)Vp / V);
    if (p == 1) return mismatches;
    /* the lesson's claim, checked by the allocator: no rank ever held B*T*V floats */
    if (largest_other >= NV4) {
        log0("  full logits: not judged, another activation (%s) is as large as B*T*V*4 = %s\n",
             fmt_bytes(largest_other), fmt_bytes(NV4));
        return mismatches;
    }
    ok = largest_measured < NV4;
    mismatches += !ok;
    if (!ok) parity_fail("a rank allocated a buffer of B*T*V floats (above)");
    log0("  full logits: the largest buffer on any rank is %s < B*T*V*4 = %s: %s\n",
         fmt_bytes(largest_measured), fmt_bytes(NV4),
         ok ? "no rank ever held the [B, T, V] logits" : "MISMATCH, a rank allocated a full-logits buffer");
    return mismatches;
}

double largest_buffer(void) {
    size_t a = mem_largest_alloc(MEM_ACTIVATIONS), b = mem_largest_alloc(MEM_BUFFERS);
    return (double)(a > b ? a : b);
}

void append_memory_csv(const char *dir, int tp, bool loss_parallel, double measured, double formula) {
    if (comm_world()->rank != 0) return;
    char path[512];
    snprintf(path, sizeof path, "%s/logits_memory.csv", dir);
    FILE *f = out_open(path, "tp,loss_parallel,measured_bytes,formula_bytes", true);   /* (errors: run_finish) */
    csv_row(f, "%d,%d,%.0f,%.0f", tp, loss_parallel ? 1 : 0, measured, formula);
    csv_close(f);
}
