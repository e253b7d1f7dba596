/* trainer.c: see trainer.h. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "checkpoint.h"
#include "comm.h"
#include "device.h"
#include "files.h"
#include "gemm.h"
#include "init.h"
#include "kernels.h"
#include "log.h"
#include "parity.h"
#include "plan_calculator.h"
#include "report.h"
#include "trainer.h"

double lr_at_step(const lr_schedule *s, int step) {
    /* BEGIN ASSIGNMENT: the learning rate of `step`: lr * step / warmup during the warmup, then half a cosine from lr (at the end of warmup) down to lr_min (at the last step, s->steps) */
    if (step <= s->warmup) return s->lr * step / s->warmup;
    if (s->steps <= s->warmup) return s->lr;
    double progress = (double)(step - s->warmup) / (s->steps - s->warmup);   /* 0 .. 1 */
    return s->lr_min + 0.5 * (s->lr - s->lr_min) * (1.0 + cos(M_PI * progress));
    /* END ASSIGNMENT */
}

void trainer_batch(run_loop *loop, const text_corpus *corpus, int step) {
    const run_options *o = loop->o;
    int B = o->batch, T = o->model.seq_len, accum = o->accum > 0 ? o->accum : 1;
    for (int micro = 0; micro < accum; micro++)   /* (windows of real text: no padded targets) */
        text_train_batch(corpus, loop->tokens + (size_t)micro * B * T, loop->targets + (size_t)micro * B * T, B, T,
                         o->seed, step, micro * B);
}

double probe_peak_flops(dtype compute) {
    /* long enough (a quarter of a second) that ranks sharing a core really run at the same time;
     * in the run's precision (--dtype): bf16 operands reach a higher peak where the hardware has
     * bf16 arithmetic (AVX512-BF16 and AMX here, tensor cores on a GPU), so MFU is against that;
     * the operands in the type the linears hand their GEMMs (gemm_bf16_operand_type: on a CPU
     * without AVX-512, fp32 holding bf16 values, an sgemm like fp32's) */
    enum { N = 384 };
    dtype operands = compute == DTYPE_BF16 ? gemm_bf16_operand_type() : compute;
    void *a = device_alloc_elems((size_t)N * N, operands, MEM_BUFFERS), *b = device_alloc_elems((size_t)N * N, operands, MEM_BUFFERS);
    float *c = device_alloc_floats((size_t)N * N, MEM_BUFFERS), *fill = device_alloc_floats((size_t)N * N, MEM_BUFFERS);
    init_constant_device(fill, (size_t)N * N, 0.5f);
    if (operands == DTYPE_BF16) cast_to_bf16(a, fill, (size_t)N * N), cast_to_bf16(b, fill, (size_t)N * N);
    else device_copy(a, fill, (size_t)N * N * sizeof(float)), device_copy(b, fill, (size_t)N * N * sizeof(float));
    matmul_typed(c, DTYPE_F32, a, b, operands, N, N, N, false, false, 1.0f, 0.0f);   /* warm up: threads, caches */
    comm_barrier(comm_world());                           /* every rank probes at the same time */
    device_synchronize();
    double t0 = wall_seconds(), seconds = 0;
    long reps = 0;
    while (seconds < 0.25) {
        matmul_typed(c, DTYPE_F32, a, b, operands, N, N, N, false, false, 1.0f, 0.0f);
        device_synchronize();
        reps++;
        seconds = wall_seconds() - t0;
    }
    double rate = 2.0 * N * N * N * reps / seconds;
    device_free(a); device_free(b); device_free(c); device_free(fill);
    return comm_host_sum(comm_world(), rate);
}

int report_state_memory(const llama_config *c, const int mesh[MESH_NDIMS], bool shard_cp, int pp_rank,
                        int virtual_stages) {
    plan_calc_options o;
    plan_calc_defaults(&o);
    o.dim = c->dim; o.n_layers = c->n_layers; o.n_heads = c->n_heads; o.n_kv_heads = c->n_kv_heads;
    o.ffn_dim = c->ffn_dim; o.vocab = c->vocab_size; o.vocab_multiple = c->vocab_multiple; o.seq_len = c->seq_len;
    o.virtual_stages = virtual_stages;
    o.shard_cp = shard_cp;   /* FSDP over dp_shard x cp, or (--no-fsdp-over-cp) dp_shard alone */
    double floats = plan_calc_stage_floats(&o, mesh, pp_rank);
    char what[96] = "4 Psi_S: the floats of the stage this rank stores (exercise 4)";
    /* BEGIN SOLUTION 08: state per GPU */
    const char *how = "the stage's tp slices / S, padded";   /* (a literal of its own: the copy's README drops it) */
    int S = mesh[MESH_DP_SHARD] * (shard_cp ? mesh[MESH_CP] : 1);
    snprintf(what, sizeof what, "4 Psi_S: %s; S = dp_shard%s = %d", how, shard_cp && mesh[MESH_CP] > 1 ? " x cp" : "", S);
    /* END SOLUTION */
    memory_row rows[3] = {
        {"parameters (fp32)", (double)mem_current(MEM_PARAMS), 4 * floats, what},
        {"gradients (fp32)", (double)mem_current(MEM_GRADS), 4 * floats, "4 Psi_S"},
        {"AdamW m, v (fp32)", (double)mem_current(MEM_OPTIM), 8 * floats, "8 Psi_S"}};
    bool root = comm_world()->rank == 0;
    int bad = 0;
    for (int k = 0; k < 3; k++) bad |= rows[k].measured_bytes != rows[k].formula_bytes;
    /* rank 0's rows are printed, and a mismatch among them recorded, by report_memory; the other
     * ranks' are counted here and recorded once more only if one of them differs */
    if (root) report_memory("state of world rank 0 (pipeline stage 0) beside --plan's formula", rows, 3);
    int ranks_bad = (int)comm_host_sum(comm_world(), bad);
    int others_bad = (int)comm_host_sum(comm_world(), root ? 0 : bad);
    log0("state on every rank: %s (%d of %d ranks differ from --plan's formula for their stage)\n",
         ranks_bad ? "MISMATCH" : "ok", ranks_bad, comm_world()->size);
    if (others_bad) parity_fail("another rank's parameter, gradient or optimizer bytes differ from --plan's formula");
    return ranks_bad;
}

double evaluate(llama_model *m, const text_corpus *corpus, int rows, int n_batches) {
    int T = m->c.seq_len;
    size_t n = (size_t)rows * T;
    int *tokens = malloc(n * sizeof(int)), *targets = malloc(n * sizeof(int));
    int *tokens_dev = device_alloc_ints(n, MEM_BUFFERS), *targets_dev = device_alloc_ints(n, MEM_BUFFERS);
    double sum = 0;
    for (int k = 0; k < n_batches; k++) {
        text_val_batch(corpus, tokens, targets, rows, T, k);
        device_copy_to_device(tokens_dev, tokens, n * sizeof(int));
        device_copy_to_device(targets_dev, targets, n * sizeof(int));
        /* (a pipeline runs its backward too: the gradients it leaves are zeroed by the next step) */
        llama_begin_pass(m, 0);   /* no training step */
        sum += run_forward_backward(m, tokens_dev, targets_dev, 1.0f / (float)n, false, NULL);
    }
    free(tokens); free(targets);
    device_free(tokens_dev); device_free(targets_dev);
    return sum / n_batches;
}

/* A setting as the mismatch line shows it: a number with the fewest digits that give the same
 * float back (0.003, not 0.00300000003), anything else as JSON. Free with cJSON_free. */
static char *setting_text(const cJSON *x) {
    if (!cJSON_IsNumber(x)) return cJSON_PrintUnformatted(x);
    char buf[40];
    double v = x->valuedouble;
    if (v == (double)(long long)v && fabs(v) < 1e15) snprintf(buf, sizeof buf, "%lld", (long long)v);   /* 60, not 6e+01 */
    else for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, x->valuedouble);
        if ((float)strtod(buf, NULL) == (float)x->valuedouble) break;
    }
    char *text = cJSON_malloc(strlen(buf) + 1);
    if (text) strcpy(text, buf);
    return text;
}

int trainer_settings_diff(const char *saved, const char *now, char *out, size_t len) {
    cJSON *a = cJSON_Parse(saved), *b = cJSON_Parse(now);
    int n = 0;
    size_t used = 0;
    if (len) out[0] = 0;
    for (const cJSON *x = b ? b->child : NULL; x; x = x->next) {   /* (both written by trainer_settings) */
        const cJSON *y = a ? cJSON_GetObjectItemCaseSensitive(a, x->string) : NULL;
        char *now_text = cJSON_PrintUnformatted(x), *then_text = y ? cJSON_PrintUnformatted(y) : NULL;
        if (!then_text || strcmp(then_text, now_text) != 0) {
            cJSON_free(now_text);
            cJSON_free(then_text);
            now_text = setting_text(x);
            then_text = y ? setting_text(y) : NULL;
            char flag[64];   /* the setting's flag: "n_kv_heads" -> "--n-kv-heads" */
            snprintf(flag, sizeof flag, "--%s", x->string);
            for (char *c = flag; *c; c++) if (*c == '_') *c = '-';
            if (used < len)
                used += (size_t)snprintf(out + used, len - used, "%s%s: checkpoint %s, this run %s", n ? "; " : "",
                                         flag, then_text ? then_text : "(not recorded)", now_text);
            n++;
        }
        cJSON_free(now_text);
        cJSON_free(then_text);
    }
    if (!a || !b) {   /* (not JSON: the two texts differ, say so) */
        if (len) snprintf(out, len, "the checkpoint's settings are not readable: %.200s", saved);
        n = 1;
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
    return n;
}

/* Training cannot go on from a non-finite state: one line (rank 0), every rank exits with
 * TRAINER_EXIT_NONFINITE. The checkpoints on disk are as the last good save left them. */
static void stop_nonfinite(const trainer *t, const char *what) {
    csv_close(t->csv);   /* metrics.csv up to this step, renamed into place (log.h) */
    if (comm_world()->rank == 0) {
        char last[600] = "no checkpoint was saved";
        if (t->ckpt_dir && t->last_ckpt_step > 0)
            snprintf(last, sizeof last, "the last good checkpoint is %s/step_%08d", t->ckpt_dir, t->last_ckpt_step);
        fprintf(stderr, "error: %s: training stopped (exit status %d); %s\n", what, TRAINER_EXIT_NONFINITE, last);
        fflush(stderr);
    }
    fflush(stdout);
    comm_barrier(comm_world());
    comm_finalize();
    exit(TRAINER_EXIT_NONFINITE);
}

void trainer_stop_if_nonfinite(const trainer *t, const run_step_result *r) {
    bool bad_loss = !isfinite(r->loss), bad_norm = !isfinite(r->grad_norm);
    bool root = comm_world()->rank == 0;
    if (comm_host_max(comm_world(), root && (bad_loss || bad_norm) ? 1.0 : 0.0) == 0) return;
    char what[160];
    if (bad_loss && bad_norm) snprintf(what, sizeof what, "step %d: the loss is %g and the gradient norm %g", r->step, r->loss, r->grad_norm);
    else if (bad_loss) snprintf(what, sizeof what, "step %d: the loss is %g (gradient norm %g)", r->step, r->loss, r->grad_norm);
    else snprintf(what, sizeof what, "step %d: the gradient norm is %g (loss %g)", r->step, r->grad_norm, r->loss);
    stop_nonfinite(t, what);
}

void trainer_log_step(trainer *t, const run_step_result *r, bool evaluated, double val_loss) {
    double tokens_per_s = r->tokens / r->seconds;
    double mfu = t->flops_per_token * r->tokens / r->seconds / t->peak_flops;
    double mem = comm_host_max(comm_world(), (double)mem_peak_total());   /* the fullest rank */
    char val_text[32] = "";
    if (evaluated) snprintf(val_text, sizeof val_text, " | val %.4f", val_loss);
    log0("step %4d | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | %.1f ms | MFU %.1f%% | mem %.2f MiB%s\n",
         r->step, r->loss, r->lr, r->grad_norm, tokens_per_s, 1e3 * r->seconds, 100 * mfu, mem / (1 << 20), val_text);
    csv_row(t->csv, "%d,%.9g,%.9g,%.6g,%.6g,%.6g,%.6g,%.6g,%.0f,%.6g", r->step, r->loss, val_loss, r->lr,
            r->grad_norm, tokens_per_s, 1e3 * r->seconds, mfu, mem, t->unigram_loss);
    if (t->csv) fflush(t->csv);
}

void trainer_checkpoint(trainer *t, llama_model *m, int step) {
    checkpoint_meta meta = {step, t->run->seed, ""};
    snprintf(meta.trainer_json, sizeof meta.trainer_json, "%s", t->trainer_json);
    char err[512] = "";
    double t0 = wall_seconds();
    int rc = checkpoint_save(t->ckpt_dir, m, &meta, err, sizeof err);
    if (rc == -2) {   /* a finite loss and norm, yet a value overflowed: saved nowhere */
        char what[600];
        snprintf(what, sizeof what, "step %d: %s", step, err);
        stop_nonfinite(t, what);
    }
    comm_require_all(rc == 0, "--ckpt-dir %s: %s", t->ckpt_dir, err);
    t->last_ckpt_step = step;
    log0("           checkpoint of step %d saved in %s (%.0f ms)\n", step, t->ckpt_dir, 1e3 * (wall_seconds() - t0));
}
