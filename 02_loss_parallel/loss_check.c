/* loss_check.c: see loss_check.h. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "device.h"
#include "llama_kernels.h"
#include "log.h"
#include "parity.h"
#include "vocab_parallel.h"
#include "loss_check.h"

/* A fixed pseudo-random number in [-1, 1) for logit (row, col) of the full [n, V] matrix, so
 * every rank can write its own columns without anyone holding the whole matrix. */
static float logit_value(int row, int col) {
    uint32_t h = (uint32_t)row * 2654435761u ^ (uint32_t)col * 2246822519u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    return (float)(h >> 8) / 8388608.0f - 1.0f;
}

/* One case: the vocab-parallel forward and backward on n rows of the vocabulary V padded to Vp,
 * the gradient gathered to rank 0: its real columns into dlogits_full[n, V], its padding columns
 * into dlogits_pad[n, Vp - V]. The padding columns' logits are set to 50 x scale, above every real
 * one: only the mask keeps them out. Returns the loss sum (the same on every rank). */
static float run_sharded(comm_group *tp, const int *targets_host, int n, int V, int Vp, float scale,
                         float grad_scale, float *dlogits_full, float *dlogits_pad) {
    int p = tp->size, Vl = Vp / p, v0 = tp->rank * Vl;
    float *local = malloc((size_t)n * Vl * sizeof(float));
    for (int r = 0; r < n; r++)
        for (int j = 0; j < Vl; j++) local[(size_t)r * Vl + j] = scale * (v0 + j < V ? logit_value(r, v0 + j) : 50.0f);
    float *logits = device_alloc_floats((size_t)n * Vl, MEM_BUFFERS);
    float *dlogits = device_alloc_floats((size_t)n * Vl, MEM_BUFFERS);
    float *row_max = device_alloc_floats(n, MEM_BUFFERS), *row_sumexp = device_alloc_floats(n, MEM_BUFFERS);
    float *target_logit = device_alloc_floats(n, MEM_BUFFERS);
    int *targets = device_alloc_ints(n, MEM_BUFFERS);
    device_copy_to_device(logits, local, (size_t)n * Vl * sizeof(float));
    device_copy_to_device(targets, targets_host, (size_t)n * sizeof(int));
    for (size_t i = 0; i < (size_t)n * Vl; i++) local[i] = 3.0f;   /* garbage the backward must overwrite */
    device_copy_to_device(dlogits, local, (size_t)n * Vl * sizeof(float));

    float loss = vocab_parallel_cross_entropy_forward(tp, logits, targets, n, Vl, v0, V, row_max,
                                                      row_sumexp, target_logit);
    vocab_parallel_cross_entropy_backward(dlogits, logits, targets, row_max, row_sumexp, n, Vl,
                                          v0, V, grad_scale);

    /* gather the shards: rank-major [p][n, Vl] -> column v of row r, real or padding */
    device_copy_to_host(local, dlogits, (size_t)n * Vl * sizeof(float));
    float *all = tp->rank == 0 ? malloc((size_t)n * Vp * sizeof(float)) : NULL;
    comm_host_gather(tp, local, all, (size_t)n * Vl, 0);
    if (tp->rank == 0)
        for (int q = 0; q < p; q++)
            for (int r = 0; r < n; r++)
                for (int j = 0; j < Vl; j++) {
                    int v = q * Vl + j;
                    float g = all[((size_t)q * n + r) * Vl + j];
                    if (v < V) dlogits_full[(size_t)r * V + v] = g;
                    else dlogits_pad[(size_t)r * (Vp - V) + (v - V)] = g;
                }
    free(all);
    free(local);
    device_free(logits); device_free(dlogits); device_free(row_max); device_free(row_sumexp);
    device_free(target_logit); device_free(targets);
    return loss;
}

/* The plain cross-entropy of the full rows (rank 0): the baseline's loss kernels. */
static float run_plain(const int *targets_host, int n, int V, float scale, float grad_scale,
                       float *dlogits_full) {
    for (int r = 0; r < n; r++)
        for (int j = 0; j < V; j++) dlogits_full[(size_t)r * V + j] = scale * logit_value(r, j);
    float *logits = device_alloc_floats((size_t)n * V, MEM_BUFFERS);
    int *targets = device_alloc_ints(n, MEM_BUFFERS);
    device_copy_to_device(logits, dlogits_full, (size_t)n * V * sizeof(float));
    device_copy_to_device(targets, targets_host, (size_t)n * sizeof(int));
    float loss = cross_entropy_forward(logits, targets, n, V);
    cross_entropy_backward(logits, logits, targets, n, V, grad_scale);
    device_copy_to_host(dlogits_full, logits, (size_t)n * V * sizeof(float));
    device_free(logits); device_free(targets);
    return loss;
}

void loss_check_run(comm_group *tp, int V, int Vp) {
    int p = tp->size, Vl = Vp / p, n = p + 2, valid = 0;
    bool root = tp->rank == 0;
    /* row r < p: a target in shard r, at a column that moves with r (a shard that forgot its
     * offset v0 would pick the wrong one), ignored where shard r is all padding; the last two
     * rows: ignored */
    int *targets = malloc((size_t)n * sizeof(int)), *ignored = malloc((size_t)n * sizeof(int));
    for (int r = 0; r < n; r++) {
        int real = r < p ? vocab_parallel_real_columns(V, Vl, r * Vl) : 0;
        targets[r] = real > 0 ? r * Vl + (1 + 3 * r) % real : IGNORE_INDEX;
        ignored[r] = IGNORE_INDEX;
        valid += real > 0;
    }
    size_t n_pad = (size_t)n * (Vp - V);
    float *got = root ? malloc((size_t)n * V * sizeof(float)) : NULL;
    float *want = root ? malloc((size_t)n * V * sizeof(float)) : NULL;
    float *got_pad = root ? malloc(n_pad * sizeof(float) + 1) : NULL, *zeros = root ? calloc(n_pad + 1, sizeof(float)) : NULL;
    float grad_scale = 1.0f / valid;   /* 1 / the count of valid targets */

    char padded[48] = "";
    if (Vp > V) snprintf(padded, sizeof padded, " padded to %d", Vp);
    log0("loss-layer check: %d rows, vocabulary %d%s in %d shard(s) of %d, a target in every shard%s, 2 targets -100\n",
         n, V, padded, p, Vl, Vp > V ? " that has real entries" : "");
    parity_print_header("  vocab-parallel cross-entropy vs the plain one on the full rows:");
    /* 1. ordinary logits, then logits of order 1e4 (finite only if the max is subtracted) */
    const float scales[2] = {1.0f, 1e4f};
    for (int k = 0; k < 2; k++) {
        float loss = run_sharded(tp, targets, n, V, Vp, scales[k], grad_scale, got, got_pad);
        if (!root) continue;
        char name[64];
        float plain = run_plain(targets, n, V, scales[k], grad_scale, want);
        double diff = fabs((double)loss - plain) / fmax(1.0, fabs(plain));
        snprintf(name, sizeof name, "loss, logits x %g (%.7g)", scales[k], plain);
        log0("  %-44s %12.3e  %s\n", name, diff, diff <= PARITY_LOSS_RTOL ? "ok" : "FAIL");
        parity_loss(0, loss, plain);   /* records the verdict (the loss tolerance, 1e-5) */
        snprintf(name, sizeof name, "dlogits, logits x %g", scales[k]);
        parity_tensor(name, got, want, (size_t)n * V);
        if (Vp == V) continue;
        snprintf(name, sizeof name, "dlogits of the %d padding columns (exactly 0)", Vp - V);
        parity_tensor(name, got_pad, zeros, n_pad);
    }
    /* 2. every target ignored: 0 and zeros, exactly */
    float loss = run_sharded(tp, ignored, n, V, Vp, 1.0f, 0.0f, got, got_pad);
    if (root) {
        float zero = 0.0f;
        memset(want, 0, (size_t)n * V * sizeof(float));
        parity_tensor("loss, every target -100 (exactly 0)", &loss, &zero, 1);
        parity_tensor("dlogits, every target -100 (exactly 0)", got, want, (size_t)n * V);
    }
    free(targets); free(ignored); free(got); free(want); free(got_pad); free(zeros);
}
