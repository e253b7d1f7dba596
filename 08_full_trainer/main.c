/* Chapter 08: the full trainer. Every technique of chapters 01-07 on one 5-D mesh, trained on
 * real text, with what a real run needs around the step: a learning-rate schedule, gradient
 * accumulation and clipping, evaluation, metrics, checkpoints that reshard, an export, a sample.
 *
 *   mesh     pp x dp_replicate x dp_shard x cp x tp = NP        (--dp-shard -1: the rest of NP)
 *   plan     parallelize_llama (parallelize.c): tp + sp + loss, ac, cp, fp8, pp, fsdp/hsdp
 *   data     Tiny Shakespeare, one token per byte (text_corpus, common/harness/data.h)
 *   loop     below: llm.c's train loop, the step of run.h and the trainer's pieces (trainer.c)
 *   state    checkpoint.c: sharded safetensors + index; --resume on any mesh; --export
 *
 *   make run-08                                           8 ranks: pp 2 x dp_shard 2 x tp 2
 *   make run-08 NP=8 ARGS="--dp-shard 2 --cp 2 --tp 2"
 *   make run-08 NP=1 ARGS="--plan --plan-model 405b --plan-gpus 16384"
 *   make check-08                                         every 4-D layout beside the baseline
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "checkpoint.h"
#include "comm.h"
#include "device.h"
#include "flags.h"
#include "files.h"
#include "log.h"
#include "mesh.h"
#include "outputs.h"
#include "model.h"
#include "parallelize.h"
#include "plan_calculator.h"
#include "run.h"
#include "sample.h"
#include "trainer.h"
#include "../02_loss_parallel/vocab_parallel.h"
#include "../04_fsdp/data_parallel.h"
#include "traffic.h"

/* The settings a resumed run must share with the run it continues (the mesh may differ). */
static void trainer_settings(const run_options *o, const trainer_options *co, const text_corpus *corpus,
                             const lr_schedule *lr, char *json, size_t len) {
    const llama_config *c = &o->model;
    snprintf(json, len, "{\"dim\": %d, \"n_layers\": %d, \"n_heads\": %d, \"n_kv_heads\": %d, \"ffn_dim\": %d, "
             "\"vocab\": %d, \"seq_len\": %d, \"batch\": %d, \"accum\": %d, \"steps\": %d, \"seed\": %llu, "
             "\"lr\": %.9g, \"lr_min\": %.9g, \"warmup\": %d, \"clip_grad_norm\": %.9g, \"fp8\": \"%s\", "
             "\"data\": \"%zu bytes, crc32 %08x\"}", c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim,
             c->vocab_size, c->seq_len, o->batch, co->accum, o->steps, (unsigned long long)o->seed, lr->lr, lr->lr_min,
             lr->warmup, o->opt.clip_grad_norm, float8_recipe_name(co->par.fp8.recipe), corpus->n,
             (unsigned)checkpoint_crc32(corpus->bytes, corpus->n));   /* the text itself, not only its size */
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);

    /* ---- flags (flags.c: the chapter's defaults, the mesh, the run, checkpoints, --plan) ---- */
    run_options o;
    trainer_options co;
    trainer_parse_flags(&o, &co, argc, argv);
    const llama_config *c = &o.model;

    /* ---- --plan: a calculator for a cluster, no training ---- */
    if (co.plan) {
        int status = plan_calculator_run(&co.calc);
        comm_finalize();
        return status;
    }

    /* ---- the run's settings, refused up front when they cannot work (flags.c) ---- */
    trainer_validate(&o, &co);
    text_corpus corpus;
    char err[1024];
    char val_what[160] = "";   /* evaluation's batches: the validation part must hold them */
    size_t val_need = co.eval_every ? (size_t)co.eval_batches * o.batch * c->seq_len + 1 : 0;
    snprintf(val_what, sizeof val_what, "--eval-batches %d x --batch %d x --seq-len %d + 1 bytes", co.eval_batches,
             o.batch, c->seq_len);
    if (text_corpus_load_for(&corpus, co.data, c->seq_len, val_need, co.eval_every ? val_what : NULL, err, sizeof err))
        comm_exit_usage("--data: %s", err);
    /* one token per byte: the vocabulary must hold every byte of the text (256 holds any; a smaller
     * one, padded over tp or not, one that covers this text's bytes) */
    int largest_byte = text_largest_byte(&corpus, co.sample ? co.prompt : NULL);
    if (largest_byte >= c->vocab_size)
        comm_exit_usage("--vocab %d is not valid for %s%s: the text is read one byte per token and holds byte %d; use "
                        "--vocab %d or more (256 holds every byte)", c->vocab_size, co.data, co.sample ? " and --prompt" : "",
                        largest_byte, largest_byte + 1);
    int val_batches = text_val_batches(&corpus, o.batch, c->seq_len);
    if (co.eval_every && co.eval_batches > val_batches)
        comm_exit_usage("--eval-batches %d is more than the %d batches of %d x %d bytes in %s's validation part",
                        co.eval_batches, val_batches, o.batch, c->seq_len, co.data);
    lr_schedule lr = {o.opt.lr, co.lr_min >= 0 ? co.lr_min : o.opt.lr / 10, co.warmup, o.steps};
    o.accum = co.accum;

    /* ---- mesh and plan ---- */
    device_mesh *mesh = mesh_create(parallel_mesh_shape(&co.par), NULL);   /* (checked by trainer_validate) */
    llama_plan plan = parallelize_llama(mesh, c, o.batch, &co.par);
    llama_plan baseline = plan_single_device();
    bool fp8 = co.par.fp8.recipe != FLOAT8_OFF;
    if (fp8) {   /* the baseline casts as the mesh does: each data rank's microbatch rows scaled
                  * apart (chapter 07), judged on step 1 only as there */
        float8_options one_device = co.par.fp8;
        one_device.activation_groups = co.par.degree[MESH_DP_REPLICATE] * co.par.degree[MESH_DP_SHARD] *
                                       co.par.pp.microbatches;   /* (per micro-batch of --accum) */
        float8_apply(&baseline, c, &one_device);
        if (o.check) float8_compare_casts(&plan, &baseline);   /* (the baseline runs with --check only) */
        /* --dump: the recipe and its row blocks per pass, as chapter 07 writes them */
        char float8_json[320];
        run_dump_describe(&o, float8_run_options_json(&co.par.fp8, one_device.activation_groups, co.accum, float8_json,
                                                      sizeof float8_json));
    }
    if (co.par.reduce_type != DTYPE_F32) {   /* --dump: the gradients summed in bf16 (04) */
        char reduce_json[96];
        int M = co.par.degree[MESH_PP] > 1 ? co.par.pp.microbatches : 1;
        run_dump_describe(&o, data_parallel_run_options_json(co.par.reduce_type, co.par.degree[MESH_DP_REPLICATE] *
                                                             co.par.degree[MESH_DP_SHARD], co.accum, M, reduce_json,
                                                             sizeof reduce_json));
    }
    run_apply_fault(&o, &plan);
    /* every path the run writes, checked with --out and --dump before anything is allocated
     * (outputs.h): the checkpoints' directory created and locked, the export and the metrics
     * never on the text read nor inside the checkpoints' directory */
    char metrics_path[512], curves_path[512];
    snprintf(metrics_path, sizeof metrics_path, "%s/metrics.csv", o.out_dir);
    /* --check against a baseline in another precision (--baseline-dtype): both loss curves */
    bool curves = o.check && o.baseline_dtype >= 0 && o.baseline_dtype != (int)c->precision;
    snprintf(curves_path, sizeof curves_path, "%s/loss_curves_%s_%s.csv", o.out_dir, dtype_name(c->precision),
             curves ? dtype_name((dtype)o.baseline_dtype) : "");
    run_path paths[] = {
        {"--data", co.data, RUN_PATH_INPUT, NULL, false, false},
        /* (a run that only resumes reads it: no writer's lock, so two such runs may share it) */
        {"--ckpt-dir", co.ckpt_dir, co.ckpt_every > 0 ? RUN_PATH_OUTPUT_DIR : RUN_PATH_INPUT,
         "whose files the checkpoints own (DIR/latest, DIR/step_N)", co.ckpt_every > 0, co.ckpt_every > 0},
        {"--out", o.check ? NULL : metrics_path, RUN_PATH_OUTPUT_FILE, NULL, false, false},
        {"--out", curves ? curves_path : NULL, RUN_PATH_OUTPUT_FILE, NULL, false, false},
        {"--export", co.export_path, RUN_PATH_OUTPUT_FILE, NULL, false, true}};   /* (locked: one writer) */
    llama_model *model = run_model_paths(&o, &plan, paths, (int)(sizeof paths / sizeof *paths));

    /* ---- where the run starts: step 1, or a checkpoint (saved on any mesh) ---- */
    trainer t = {.run = &o, .ckpt_dir = co.ckpt_dir, .last_val_loss = NAN, .unigram_loss = text_unigram_loss(&corpus)};
    trainer_settings(&o, &co, &corpus, &lr, t.trainer_json, sizeof t.trainer_json);
    int first_step = 1;
    if (co.resume) {
        checkpoint_meta meta = {0};
        int rc = checkpoint_load(co.ckpt_dir, model, &meta, err, sizeof err);
        comm_require_all(rc == 0, "--resume: %s", rc == 1 ? "the directory holds no checkpoint" : err);
        char diff[1024];
        if (trainer_settings_diff(meta.trainer_json, t.trainer_json, diff, sizeof diff) > 0)
            comm_exit_usage("--resume: the checkpoint in %s (step %d) was written with other settings: %s", co.ckpt_dir,
                            meta.step, diff);
        first_step = meta.step + 1;
        t.last_ckpt_step = meta.step;
        if (meta.step >= o.steps) {   /* (the final checkpoint: --steps is among the settings) */
            log0("--resume: the checkpoint in %s is of step %d of --steps %d: nothing left to do\n", co.ckpt_dir,
                 meta.step, o.steps);
            llama_free(model);
            plan_free(&plan);
            plan_free(&baseline);
            text_corpus_free(&corpus);
            comm_finalize();
            return 0;
        }
    }

    char mesh_name[128];
    log0("chapter 08: the full trainer on %s, backend %s\n", parallel_mesh_name(&co.par, mesh_name, sizeof mesh_name),
         device_backend_name());
    const int *g = co.par.degree;
    char cp_text[64] = "no cp", pp_text[96] = "no pipeline", dp_text[48] = "no dp";
    if (g[MESH_CP] > 1) snprintf(cp_text, sizeof cp_text, "cp %s (%s)", cp_method_name(co.par.cp.method),
                                 cp_balance_name(co.par.cp.balance));
    if (g[MESH_PP] > 1) snprintf(pp_text, sizeof pp_text, "%s pipeline (%d microbatches, %d virtual stages)",
                                 pp_schedule_name(co.par.pp.schedule), co.par.pp.microbatches, co.par.pp.virtual_stages);
    if (parallel_has_fsdp(&co.par))
        snprintf(dp_text, sizeof dp_text, "%s%s", g[MESH_DP_REPLICATE] > 1 ? "hsdp" : "fsdp",
                 co.par.fsdp_over_cp && g[MESH_CP] > 1 ? " over dp_shard x cp" : "");
    log0("plan: %s, ac %s, %s, %s, %s, float8 %s\n",
         g[MESH_TP] == 1 ? "no tp" : co.par.sp ? "tp + loss parallel + sp" : "tp + loss parallel", ac_mode_name(co.par.ac),
         cp_text, pp_text, dp_text, float8_recipe_name(co.par.fp8.recipe));
    plan_describe(&plan);   /* which technique installed which operator; the groups */
    log0("model: dim %d, %d layers, %d heads (%d kv), ffn %d, vocab %d (bytes), %.2f M parameters\n", c->dim, c->n_layers,
         c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab_size, llama_parameter_count(c, true) / 1e6);
    if (g[MESH_TP] > 1) vocab_padding_describe(c, g[MESH_TP]);   /* 02: split over tp, padded */
    size_t root_len = strlen(REPO_ROOT "/");   /* the shipped corpus: named from the repository */
    const char *data_name = strncmp(co.data, REPO_ROOT "/", root_len) == 0 ? co.data + root_len : co.data;
    log0("data: %s, %zu bytes (%zu train, %zu validation); batch %d x %d tokens x accum %d per step\n", data_name,
         corpus.n, corpus.n_train, corpus.n - corpus.n_train, o.batch, c->seq_len, co.accum);
    log0("schedule: lr %.2e, warmup %d steps, cosine to %.2e at step %d; AdamW, clip %g\n", lr.lr, lr.warmup, lr.lr_min,
         o.steps, o.opt.clip_grad_norm);
    if (first_step > 1) log0("resumed from %s at step %d\n", co.ckpt_dir, first_step);

    /* ---- train ---- */
    t.flops_per_token = llama_flops_per_token(c);   /* 6 N + 6 L T D (causal) */
    /* the peak: a device's (--peak-tflops, else its datasheet's for --dtype's operands) times the
     * devices the ranks use (ranks sharing one count it once); without either, a GEMM probe */
    char device_name[128];
    double sheet = device_peak_flops(c->precision, device_name, sizeof device_name);
    double per_device = co.peak_tflops > 0 ? co.peak_tflops * 1e12 : sheet;
    double devices = comm_host_sum(comm_world(), 1.0 / comm_device_sharers());
    t.peak_flops = per_device > 0 ? per_device * devices : probe_peak_flops(c->precision);
    if (per_device > 0)
        log0("MFU against %.2f TFLOP/s (%s: %.1f TFLOP/s %s x %.0f device(s)), %.2f MFLOP per token\n", t.peak_flops / 1e12,
             co.peak_tflops > 0 ? "--peak-tflops" : "the datasheet", per_device / 1e12,
             co.peak_tflops > 0 ? "a device" : c->precision == DTYPE_BF16 ? "dense bf16" : "fp32", devices,
             t.flops_per_token / 1e6);
    else
        log0("MFU against %.2f GFLOP/s (measured: a GEMM probe on every rank at once, summed%s), %.2f MFLOP per token\n",
             t.peak_flops / 1e9, c->precision == DTYPE_BF16 ? ", bf16 operands" : "", t.flops_per_token / 1e6);
    if (sheet > 0 && co.peak_tflops <= 0) log0("device: %s\n", device_name);
    char path[512];
    snprintf(path, sizeof path, "%s/metrics.csv", o.out_dir);
    if (comm_world()->rank == 0 && !o.check)
        t.csv = csv_open(path, "step,loss,val_loss,lr,grad_norm,tokens_per_s,step_ms,mfu,mem_bytes,unigram_loss");
    /* (under --dtype bf16 with cp, the baseline's attention in the cp ranks' blocks: 06's) */
    bool blocks = g[MESH_CP] > 1 && context_parallel_baseline(&baseline, run_baseline_precision(&o), &co.par.cp, g[MESH_CP]);
    run_loop loop = run_loop_begin(&o, model, run_baseline_create(&o, fp8 || blocks ? &baseline : NULL, fp8), "4-D",
                                    curves ? curves_path : NULL);
    loop.own_metrics = true;   /* the metrics line; the step line of run.h beside the baseline only */
    for (int step = first_step; step <= o.steps; step++) {
        trainer_batch(&loop, &corpus, step);                         /* accum micro-batches of text */
        run_step_result r = run_step(&loop, step, lr_at_step(&lr, step));   /* forward, backward */
        if (step == 1 && fp8) run_baseline_unjudged(loop.check, float8_casts_flipped(&baseline));
        run_step_check(&loop, &r);                                   /* --check, --dump */
        run_update(&loop, &r);                                       /* clipping, AdamW */
        trainer_stop_if_nonfinite(&t, &r);                           /* before anything is saved */
        comm_set_counting(false);   /* the traffic tables count the training steps only */
        bool eval_now = co.eval_every > 0 && (step % co.eval_every == 0 || step == o.steps);
        if (eval_now) t.last_val_loss = evaluate(model, &corpus, o.batch, co.eval_batches);
        trainer_log_step(&t, &r, eval_now, eval_now ? t.last_val_loss : NAN);
        if (co.ckpt_dir && co.ckpt_every > 0 && (step % co.ckpt_every == 0 || step == o.steps))
            trainer_checkpoint(&t, model, step);
        comm_set_counting(true);
    }
    run_clock clock = run_loop_end(&loop);
    csv_close(t.csv);   /* (a failed write: run_finish's line and exit 2; the old metrics.csv kept) */
    int steps_run = o.steps - (first_step - 1);
    run_clock_report(&clock, steps_run);

    /* ---- measured beside the formulas: traffic (rank 0), state (every rank), float8 casts ---- */
    int mismatches = report_traffic(&co.par, mesh, model, steps_run, co.accum);
    mismatches += report_state_memory(c, co.par.degree, co.par.fsdp_over_cp, mesh->coord[MESH_PP],
                                      co.par.pp.virtual_stages);
    mismatches += vocab_padding_report(model);   /* 02's padding rows: still exactly zero */
    if (o.check && fp8) mismatches += float8_report_casts(&baseline);   /* step 1's, code by code */

    /* ---- what the run leaves: an export, a sample ---- */
    if (co.export_path) {
        int rc = checkpoint_export(co.export_path, model, err, sizeof err);
        comm_require_all(rc == 0, "--export %s: %s", co.export_path, err);
        log0("exported %s (safetensors, the baseline's tensor names)\n", co.export_path);
    }
    if (!isnan(t.last_val_loss))
        log0("validation loss %.4f; the unigram baseline's (byte frequencies, no context) %.4f\n", t.last_val_loss,
             t.unigram_loss);
    if (co.sample) sample_text(model, co.prompt, co.sample, co.temperature, o.seed);

    llama_free(model);
    plan_free(&plan);
    plan_free(&baseline);
    text_corpus_free(&corpus);
    return run_finish(&o, mismatches);
}
