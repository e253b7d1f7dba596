/* ranks: 1 */
/* test_vocab_kernels.c: the local pieces of the vocabulary-parallel cross-entropy
 * (vocab_kernels.h) on tiny shapes, one process.
 *
 * The full logits [N, V] are cut into P column shards, P = 1, 2, 4 and 7 (V = 28 takes them
 * all). Each shard runs the kernels on its own contiguous [N, V/P] copy,
 * and this file plays the all-reduces on the host (max, then sum, then sum), exactly what the
 * chapter does with comm_all_reduce. Then:
 *   forward:   the loss against a naive double loop over the full rows, and against the plain
 *              cross_entropy_forward of llama_kernels.h;
 *   backward:  the gathered shard gradients against central finite differences of the mean
 *              loss, and against the plain cross_entropy_backward;
 *   and the properties: dlogits may alias logits, logits of 1e4 stay finite and correct,
 *   every target -100 gives loss 0 and zero gradients (over garbage), not NaN;
 *   a padded vocabulary (28 padded to 30 over P = 3 and 5, to 32 over P = 8: the last shard all
 *   padding), the padding columns holding the largest logits: the same loss and real gradients
 *   as unpadded, and exactly zero gradient on the padding.
 *
 * Every tensor goes through device_alloc, so the same test runs on the CUDA backend.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "llama_kernels.h"
#include "vocab_kernels.h"
#include "test_device.h"
#include "test_util.h"

/* The test's stream of numbers (test_util.h's xorshift64*). */
static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static float rand_uniform(float lo, float hi) { return tu_rand_uniform(&rng_state, lo, hi); }

enum { N = 6, V = 28, VALID = 4, MAX_SHARDS = 8, VP_MAX = 32 };
#define PADDING_LOGIT 100.0f   /* what a padding column holds: above every real logit */
/* targets in shards 0, 3 and the last for P = 4 (columns 0-6, 7-13, 14-20, 21-27) */
static const int targets_ref[N] = {2, IGNORE_INDEX, 27, 13, IGNORE_INDEX, 20};



/* ---- the shards and the host-side "all-reduces" ---------------------------------------------- */

typedef struct {
    int P, Vl, Vr[MAX_SHARDS];          /* Vr[p]: shard p's real columns, the rest padding */
    float *logits[MAX_SHARDS];          /* device [N, Vl]: columns [p Vl, (p+1) Vl) of the padded */
    float *row_max[MAX_SHARDS], *row_sumexp[MAX_SHARDS], *target_logit[MAX_SHARDS];  /* device [N] */
    int *targets;                       /* device [N], the same for every shard */
} shards;

/* The real logits full[N, V] padded to Vp columns (P divides Vp) and cut into P shards. */
static shards shards_create_padded(const float *full, const int *targets, int P, int Vp) {
    shards s = {.P = P, .Vl = Vp / P};
    float col[N * VP_MAX];
    for (int p = 0; p < P; p++) {
        int real = V - p * s.Vl;
        s.Vr[p] = real < 0 ? 0 : real > s.Vl ? s.Vl : real;
        for (int n = 0; n < N; n++)
            for (int j = 0; j < s.Vl; j++) col[n * s.Vl + j] = j < s.Vr[p] ? full[n * V + p * s.Vl + j] : PADDING_LOGIT;
        s.logits[p] = tu_upload(col, (size_t)N * s.Vl);
        s.row_max[p] = device_alloc_floats(N, MEM_BUFFERS);
        s.row_sumexp[p] = device_alloc_floats(N, MEM_BUFFERS);
        s.target_logit[p] = device_alloc_floats(N, MEM_BUFFERS);
    }
    s.targets = device_alloc_ints(N, MEM_BUFFERS);
    device_copy_to_device(s.targets, targets, N * sizeof(int));
    return s;
}

static shards shards_create(const float *full, const int *targets, int P) {
    return shards_create_padded(full, targets, P, V);
}

static void shards_free(shards *s) {
    for (int p = 0; p < s->P; p++) {
        device_free(s->logits[p]); device_free(s->row_max[p]);
        device_free(s->row_sumexp[p]); device_free(s->target_logit[p]);
    }
    device_free(s->targets);
}

/* The all-reduce played on the host: combine every shard's [N] vector, give the result back. */
static void host_all_reduce(float **bufs, int P, int is_max) {
    float acc[N], x[N];
    for (int p = 0; p < P; p++) {
        device_copy_to_host(x, bufs[p], sizeof x);
        for (int n = 0; n < N; n++) acc[n] = p == 0 ? x[n] : is_max ? fmaxf(acc[n], x[n]) : acc[n] + x[n];
    }
    for (int p = 0; p < P; p++) device_copy_to_device(bufs[p], acc, sizeof acc);
}

/* The chapter's forward: local max, all-reduce(max), local sum of exp, all-reduce(sum), local
 * target logit, all-reduce(sum), loss. Returns the loss sum of every shard (they must agree). */
static float sharded_forward(shards *s) {
    for (int p = 0; p < s->P; p++) vocab_shard_row_max(s->row_max[p], s->logits[p], N, s->Vl, s->Vr[p]);
    host_all_reduce(s->row_max, s->P, 1);
    for (int p = 0; p < s->P; p++)
        vocab_shard_row_sumexp(s->row_sumexp[p], s->logits[p], s->row_max[p], N, s->Vl, s->Vr[p]);
    host_all_reduce(s->row_sumexp, s->P, 0);
    for (int p = 0; p < s->P; p++)
        vocab_shard_target_logit(s->target_logit[p], s->logits[p], s->targets, N, s->Vl, p * s->Vl);
    host_all_reduce(s->target_logit, s->P, 0);
    float loss = 0.0f;
    for (int p = 0; p < s->P; p++) {
        float lp = vocab_shard_loss_sum(s->row_max[p], s->row_sumexp[p], s->target_logit[p], s->targets, N);
        if (p == 0) loss = lp;
        CHECK(lp == loss, "P=%d: shard %d's loss %.9g differs from shard 0's %.9g", s->P, p, lp, loss);
    }
    return loss;
}

/* The chapter's backward on every shard, gathered into full[N, V] (host), the padding columns'
 * into pad[N, Vp - V] when given. in_place: write the gradient over the shard's logits (dlogits
 * aliases logits). */
static void sharded_backward_padded(shards *s, float grad_scale, float *full, float *pad, int in_place) {
    float local[N * VP_MAX];
    int Vp = s->P * s->Vl;
    for (int p = 0; p < s->P; p++) {
        float *d = in_place ? s->logits[p] : device_alloc_floats((size_t)N * s->Vl, MEM_BUFFERS);
        if (!in_place) {   /* garbage first: ignored rows must be overwritten with zeros */
            for (int i = 0; i < N * s->Vl; i++) local[i] = 3.0f;
            device_copy_to_device(d, local, (size_t)N * s->Vl * sizeof(float));
        }
        vocab_shard_cross_entropy_backward(d, s->logits[p], s->targets, s->row_max[p],
                                           s->row_sumexp[p], N, s->Vl, s->Vr[p], p * s->Vl, grad_scale);
        device_copy_to_host(local, d, (size_t)N * s->Vl * sizeof(float));
        for (int n = 0; n < N; n++)
            for (int j = 0; j < s->Vl; j++) {
                int v = p * s->Vl + j;
                if (v < V) full[n * V + v] = local[n * s->Vl + j];
                else if (pad) pad[n * (Vp - V) + v - V] = local[n * s->Vl + j];
            }
        if (!in_place) device_free(d);
    }
}

static void sharded_backward(shards *s, float grad_scale, float *full, int in_place) {
    sharded_backward_padded(s, grad_scale, full, NULL, in_place);
}

/* ---- references ------------------------------------------------------------------------------- */

/* sum over valid rows of logsumexp(row) - row[target], in double over the full rows */
static double reference_loss(const float *logits, const int *targets) {
    return tu_cross_entropy_sum(logits, targets, N, V, IGNORE_INDEX);
}

/* the plain (unsharded) kernels of llama_kernels.h on the full rows */
static float plain_forward(const float *logits, const int *targets, float grad_scale, float *dlogits) {
    float *x = tu_upload(logits, N * V);
    int *t = device_alloc_ints(N, MEM_BUFFERS);
    device_copy_to_device(t, targets, N * sizeof(int));
    float loss = cross_entropy_forward(x, t, N, V);
    cross_entropy_backward(x, x, t, N, V, grad_scale);
    device_copy_to_host(dlogits, x, N * V * sizeof(float));
    device_free(x); device_free(t);
    return loss;
}

/* the mean loss through the sharded kernels, for finite differences */
typedef struct { float *logits; int P; } fd_ctx;
static double sharded_mean_loss(fd_ctx *c) {
    shards s = shards_create(c->logits, targets_ref, c->P);
    double L = sharded_forward(&s) / (double)VALID;
    shards_free(&s);
    return L;
}

/* ---- the tests -------------------------------------------------------------------------------- */

static void test_shards(const float *logits, int P) {
    char what[96];
    float grad_scale = 1.0f / VALID;
    float got[N * V], alias[N * V], plain[N * V];

    /* forward: double reference and the plain kernel */
    shards s = shards_create(logits, targets_ref, P);
    float loss = sharded_forward(&s);
    snprintf(what, sizeof what, "P=%d loss vs double reference", P);
    CHECK_CLOSE(loss, reference_loss(logits, targets_ref), 1e-6, 1e-5, what);
    float plain_loss = plain_forward(logits, targets_ref, grad_scale, plain);
    snprintf(what, sizeof what, "P=%d loss vs plain cross_entropy_forward", P);
    CHECK_CLOSE(loss, plain_loss, 1e-6, 1e-6, what);

    /* backward: the plain kernel's gradient, rows of zeros where ignored, in place identical */
    sharded_backward(&s, grad_scale, got, 0);
    for (int i = 0; i < N * V; i++) {
        snprintf(what, sizeof what, "P=%d dlogits[%d] vs plain cross_entropy_backward", P, i);
        CHECK_CLOSE(got[i], plain[i], 1e-7, 1e-5, what);
    }
    for (int n = 0; n < N; n++)
        if (targets_ref[n] == IGNORE_INDEX)
            for (int j = 0; j < V; j++)
                CHECK(got[n * V + j] == 0.0f, "P=%d: ignored row %d has gradient %g", P, n, got[n * V + j]);
    sharded_backward(&s, grad_scale, alias, 1);
    CHECK(memcmp(alias, got, sizeof got) == 0, "P=%d: backward in place differs", P);
    shards_free(&s);

    /* backward against central finite differences of the sharded mean loss */
    float x[N * V];
    memcpy(x, logits, sizeof x);
    fd_ctx ctx = {x, P};
    double scale = 0.0;
    double numeric[N * V];
    for (int i = 0; i < N * V; i++) {
        float saved = x[i], up = saved + 1e-3f, down = saved - 1e-3f;
        x[i] = up;   double l_up = sharded_mean_loss(&ctx);
        x[i] = down; double l_down = sharded_mean_loss(&ctx);
        x[i] = saved;
        numeric[i] = (l_up - l_down) / ((double)up - (double)down);
        scale = fmax(scale, fabs(numeric[i]));
    }
    for (int i = 0; i < N * V; i++) {
        snprintf(what, sizeof what, "P=%d dlogits[%d] vs finite differences", P, i);
        CHECK_CLOSE(got[i], numeric[i], 2e-3 * scale + 1e-6, 1e-2, what);
    }
}

/* Logits of order 1e4: no inf, no NaN, the loss still right, each valid row of the gradient
 * sums to 0 (softmax sums to 1, minus the one-hot). */
static void test_huge_logits(const float *logits, int P) {
    float big[N * V], got[N * V];
    for (int i = 0; i < N * V; i++) big[i] = logits[i] * 1e4f;
    shards s = shards_create(big, targets_ref, P);
    float loss = sharded_forward(&s);
    CHECK(isfinite(loss), "P=%d: loss of 1e4 logits is %g", P, loss);
    CHECK_CLOSE(loss, reference_loss(big, targets_ref), 1e-2, 1e-5, "1e4 logits: loss vs double reference");
    sharded_backward(&s, 1.0f, got, 0);
    for (int n = 0; n < N; n++) {
        double row_sum = 0;
        for (int j = 0; j < V; j++) {
            CHECK(isfinite(got[n * V + j]), "P=%d 1e4 logits: gradient [%d,%d] is %g", P, n, j, got[n * V + j]);
            row_sum += got[n * V + j];
        }
        CHECK_CLOSE(row_sum, 0.0, 1e-5, 0, "1e4 logits: a row of gradients sums to 0");
    }
    shards_free(&s);
}

/* Every target -100: loss 0 (not NaN) and gradients of exactly zero over garbage. */
static void test_all_ignored(const float *logits, int P) {
    int none[N];
    float got[N * V];
    for (int n = 0; n < N; n++) none[n] = IGNORE_INDEX;
    shards s = shards_create(logits, none, P);
    float loss = sharded_forward(&s);
    CHECK(loss == 0.0f, "P=%d: all-ignored loss is %g, not 0", P, loss);
    sharded_backward(&s, 0.0f, got, 0);   /* run_loss_scale(0) = 0 */
    int all_zero = 1;
    for (int i = 0; i < N * V; i++) all_zero &= got[i] == 0.0f;
    CHECK(all_zero, "P=%d: all-ignored gradient is not zero", P);
    shards_free(&s);
}

/* A padded vocabulary: V = 28 padded to Vp over P shards, the padding columns holding the
 * largest logit of every row. Only the mask keeps them out: the loss and the real columns'
 * gradients must be the unpadded ones, and the padding's gradient exactly 0. */
static void test_padded(const float *logits, int P, int Vp) {
    char what[96];
    float grad_scale = 1.0f / VALID, got[N * V], plain[N * V], pad[N * VP_MAX];
    shards s = shards_create_padded(logits, targets_ref, P, Vp);
    float loss = sharded_forward(&s);
    float plain_loss = plain_forward(logits, targets_ref, grad_scale, plain);
    snprintf(what, sizeof what, "P=%d, V %d padded to %d: loss vs plain unpadded", P, V, Vp);
    CHECK_CLOSE(loss, plain_loss, 1e-6, 1e-6, what);
    sharded_backward_padded(&s, grad_scale, got, pad, 0);
    for (int i = 0; i < N * V; i++) {
        snprintf(what, sizeof what, "P=%d Vp=%d dlogits[%d] vs plain unpadded", P, Vp, i);
        CHECK_CLOSE(got[i], plain[i], 1e-7, 1e-5, what);
    }
    for (int i = 0; i < N * (Vp - V); i++)
        CHECK(pad[i] == 0.0f, "P=%d Vp=%d: padding gradient [%d, %d] is %g, not exactly 0", P, Vp, i / (Vp - V),
              V + i % (Vp - V), pad[i]);
    shards_free(&s);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    float logits[N * V];
    for (int i = 0; i < N * V; i++) logits[i] = rand_uniform(-3, 3);
    const int shard_counts[] = {1, 2, 4, 7};
    for (size_t k = 0; k < sizeof shard_counts / sizeof *shard_counts; k++) {
        int P = shard_counts[k];
        test_shards(logits, P);
        test_huge_logits(logits, P);
        test_all_ignored(logits, P);
    }
    test_padded(logits, 1, 30);   /* 2 padding columns on the only shard */
    test_padded(logits, 3, 30);   /* shard 2: 8 real, 2 padding */
    test_padded(logits, 5, 30);   /* shard 4: 4 real, 2 padding */
    test_padded(logits, 8, 32);   /* shard 7: all 4 padding */
    CHECK(mem_current_total() == 0, "allocator still counts %zu bytes after freeing everything", mem_current_total());
    int rc = tu_finish("test_vocab_kernels");
    comm_finalize();
    return rc;
}
