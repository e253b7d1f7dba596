/* run.c: see run.h. */
#include <math.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "cli.h"
#include "comm.h"
#include "data.h"
#include "device.h"
#include "dump.h"
#include "files.h"
#include "guard.h"
#include "llama_kernels.h"
#include "log.h"
#include "outputs.h"
#include "parity.h"
#include "run.h"
#include "params.h"

static char out_buf[256];
static size_t largest_param_numel(const llama_config *c, size_t at_least);

run_options run_options_default(const char *chapter, const plan_fault *faults) {
    run_options o = {0};
    o.faults = faults;
    o.model = llama_config_default();
    o.opt = adamw_config_default();
    o.batch = 4;
    o.steps = 5;
    o.seed = 1234;
    o.baseline_dtype = -1;   /* the baseline computes as the run does */
    snprintf(out_buf, sizeof out_buf, "out/%s", chapter);
    o.out_dir = out_buf;
    return o;
}

/* The defaults --help prints: the run_options as the chapter set them, before any flag was read
 * (run_parse takes this copy), so that each chapter's help shows what its run really uses. */
static run_options help_defaults;
static bool have_help_defaults;

/* A learning rate as a person writes it: 1e-3, 3e-3; 2.5e-4 as %g writes it (0.00025). */
static const char *fmt_lr(double x, char *buf, size_t len) {
    snprintf(buf, len, "%.0e", x);
    if (!(fabs(strtod(buf, NULL) - x) <= 1e-6 * x)) snprintf(buf, len, "%g", x);   /* (a float's lr) */
    else {   /* "1e-03" -> "1e-3" */
        char *e = strchr(buf, 'e');
        if (e && (e[1] == '-' || e[1] == '+') && e[2] == '0' && e[3]) memmove(e + 2, e + 3, strlen(e + 3) + 1);
    }
    return buf;
}

static void usage_common(const run_options *parsed) {
    const run_options *o = have_help_defaults ? &help_defaults : parsed;
    const llama_config *c = &o->model;
    char kv[16], lr[32], clip[32];
    snprintf(kv, sizeof kv, "%d", c->n_kv_heads);
    if (o->opt.clip_grad_norm > 0) snprintf(clip, sizeof clip, "%g", o->opt.clip_grad_norm);
    log0("model and training (shared by every Llama chapter; the defaults are this chapter's):\n"
         "  --dim N          model width (default %d)\n"
         "  --n-layers N     transformer layers (default %d)\n"
         "  --n-heads N      query heads (default %d)\n"
         "  --n-kv-heads N   key/value heads, divides n-heads (default %s)\n"
         "  --ffn-dim N      feed-forward hidden width (default %d)\n"
         "  --vocab N        vocabulary size (default %d)\n"
         "  --seq-len N      tokens per sequence (default %d)\n"
         "  --batch N        sequences per step (default %d)\n"
         "  --steps N        AdamW steps (default %d)\n"
         "  --lr X           learning rate (default %s)\n"
         "  --seed N         initialisation and data seed (default %llu)\n"
         "  --check          train the single-device baseline on rank 0 and compare every step\n"
         "  --verbose-grads  print every gradient's difference every step (default: step 1)\n"
         "  --dump DIR       export init/batches/grads/losses as safetensors (docs/dump-format.md)\n"
         "  --out DIR        where the CSV files go (default %s)\n"
         "  --clip-grad-norm X  scale the gradients so their global norm is at most X (default %s)\n"
         "  --dtype T        compute precision, fp32 or bf16: the linears' GEMMs on bf16 operands,\n"
         "                   accumulated in fp32; weights, gradients, AdamW state fp32 (default fp32)\n"
         "  --baseline-dtype T  with --check, the baseline's precision (default: --dtype's); another\n"
         "                   one compares the loss curves: the mean loss of the last 10 steps within\n"
         "                   1%% of the baseline's\n"
         "  --timeout S      end the job (exit 3) when a rank waits more than S seconds for the\n"
         "                   others: one stopped or died (default %.0f; 0: never)\n"
         "  --fault NAME     a deliberate bug, to see the parity check catch it:\n",
         c->dim, c->n_layers, c->n_heads, o->kv_heads_follow_heads && !o->kv_heads_given ? "n-heads: no grouping" : kv,
         c->ffn_dim, c->vocab_size, c->seq_len, o->batch, o->steps, fmt_lr(o->opt.lr, lr, sizeof lr),
         (unsigned long long)o->seed, o->out_dir, o->opt.clip_grad_norm > 0 ? clip : "off", guard_timeout());
    for (const plan_fault *f = o->faults; f && f->name; f++) log0("                     %-26s %s\n", f->name, f->what);
    if (!o->faults || !o->faults[0].name) log0("                     (this chapter has none)\n");
}

int run_options_parse(run_options *o, int code, const char *arg, const char *chapter_usage) {
    llama_config *m = &o->model;
    switch (code) {
    case RUN_OPT_DIM: m->dim = cli_int("--dim", arg, 1, 1 << 16); break;
    case RUN_OPT_LAYERS: m->n_layers = cli_int("--n-layers", arg, 1, 1024); break;
    case RUN_OPT_HEADS: m->n_heads = cli_int("--n-heads", arg, 1, 4096); break;
    case RUN_OPT_KV_HEADS:
        m->n_kv_heads = cli_int("--n-kv-heads", arg, 1, 4096);
        o->kv_heads_given = true;
        break;
    case RUN_OPT_FFN: m->ffn_dim = cli_int("--ffn-dim", arg, 1, 1 << 20); break;
    case RUN_OPT_VOCAB: m->vocab_size = cli_int("--vocab", arg, 2, 1 << 24); break;
    case RUN_OPT_SEQ: m->seq_len = cli_int("--seq-len", arg, 2, 1 << 20); break;
    case RUN_OPT_BATCH: o->batch = cli_int("--batch", arg, 1, 1 << 20); break;
    case RUN_OPT_STEPS: o->steps = cli_int("--steps", arg, 1, 1000000); break;
    case RUN_OPT_LR: o->opt.lr = cli_float("--lr", arg, 0.0f, 10.0f); break;
    case RUN_OPT_SEED: o->seed = cli_u64("--seed", arg); break;
    case RUN_OPT_CHECK: o->check = true; break;
    case RUN_OPT_VERBOSE: o->verbose_grads = true; break;
    case RUN_OPT_DUMP: o->dump_dir = arg; break;
    case RUN_OPT_OUT: o->out_dir = arg; break;
    case RUN_OPT_FAULT: o->fault = arg; break;
    case RUN_OPT_TIMEOUT: guard_set_timeout(cli_float("--timeout", arg, 0.0f, 1e6f)); break;
    case RUN_OPT_CLIP: o->opt.clip_grad_norm = cli_float("--clip-grad-norm", arg, 1e-6f, 1e6f); break;
    case RUN_OPT_DTYPE: m->precision = cli_dtype("--dtype", arg), o->dtype_given = true; break;
    case RUN_OPT_BASELINE_DTYPE: o->baseline_dtype = (int)cli_dtype("--baseline-dtype", arg); break;
    case RUN_OPT_HELP:
        log0("%s", chapter_usage);
        usage_common(o);
        comm_finalize();
        exit(0);
    default: return 0;
    }
    return 1;
}

/* The chapter's fault named `name`, or NULL. */
static const plan_fault *find_fault(const run_options *o, const char *name) {
    for (const plan_fault *f = o->faults; f && f->name; f++)
        if (strcmp(f->name, name) == 0) return f;
    return NULL;
}

void run_options_validate(run_options *o) {
    if (o->kv_heads_follow_heads && !o->kv_heads_given) o->model.n_kv_heads = o->model.n_heads;
    if (o->baseline_dtype >= 0 && !o->check)
        comm_exit_usage("--baseline-dtype %s without --check: it is the precision of the --check baseline",
                        dtype_name((dtype)o->baseline_dtype));
    char err[512];
    if (llama_config_check(&o->model, o->batch, o->model.seq_len, err, sizeof err) != 0)
        comm_exit_usage("%s", err);
    if (o->fault && !find_fault(o, o->fault)) {
        char names[256] = "";
        for (const plan_fault *f = o->faults; f && f->name; f++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? ", " : "", f->name);
        comm_exit_usage("--fault '%s' is not valid: this chapter's faults are %s", o->fault,
                        names[0] ? names : "none");
    }
}

/* A dump write's verdict on rank 0, told to every rank: a failure removes the unfinished dump
 * (DIR keeps what it held before) and ends the run with one line and exit 2. */
static void dump_require(const run_options *o, int rc) {
    if (rc != 0) dump_abort();
    comm_require_all(rc == 0, "--dump %s: %s", o->dump_dir, dump_error());
}

const char *run_model_flag_given(const run_options *o, const run_options *defaults) {
    const llama_config *c = &o->model, *d = &defaults->model;
    return c->dim != d->dim ? "--dim" : c->n_layers != d->n_layers ? "--n-layers" : c->n_heads != d->n_heads ? "--n-heads"
         : c->n_kv_heads != d->n_kv_heads ? "--n-kv-heads" : c->ffn_dim != d->ffn_dim ? "--ffn-dim"
         : c->vocab_size != d->vocab_size ? "--vocab" : c->seq_len != d->seq_len ? "--seq-len"
         : o->batch != defaults->batch ? "--batch" : NULL;
}

void run_parse(run_options *o, int argc, char **argv, const struct option *flags,
               void (*chapter_flag)(int code, const char *arg, void *ctx), void *ctx,
               const char *chapter_usage) {
    static const struct option shared[] = {RUN_FLAGS};
    size_t n_shared = sizeof shared / sizeof *shared, n_own = 0;
    while (flags && flags[n_own].name) n_own++;
    struct option *all = calloc(n_shared + n_own + 1, sizeof *all);
    memcpy(all, shared, sizeof shared);
    if (n_own) memcpy(all + n_shared, flags, n_own * sizeof *flags);
    opterr = 0;
    help_defaults = *o;   /* --help shows the chapter's defaults, whatever flags come before it */
    have_help_defaults = true;
    for (int c; (c = getopt_long(argc, argv, "", all, NULL)) != -1;) {
        if (run_options_parse(o, c, optarg, chapter_usage)) continue;
        bool own = false;
        for (size_t i = 0; i < n_own; i++) own |= c == flags[i].val;
        if (!own) cli_unknown(argc, argv, optind);
        chapter_flag(c, optarg, ctx);
    }
    free(all);
    if (optind < argc) comm_exit_usage("unexpected argument '%s'; run with --help", argv[optind]);
    run_options_validate(o);
}

void run_apply_fault(const run_options *o, llama_plan *plan) {
    if (!o->fault) return;
    const plan_fault *f = find_fault(o, o->fault);
    const char *why = f->apply(plan);
    if (why) comm_exit_usage("--fault %s: %s", f->name, why);
    log0("deliberate bug (--fault %s): %s\n", f->name, f->what);
}

void run_dump_describe(const run_options *o, const char *json) {
    if (o->dump_dir && dump_set_run_options(json) != 0) comm_exit_usage("--dump %s: %s", o->dump_dir, dump_error());
}

/* Under NCCL (or its emulation), the communicators this rank holds and NCCL's buffers for them:
 * the bytes the memory check must count (those on the device: COMM=nccl, else 0), and with
 * `print`, rank 0's line beside the formula (comm.h) in the run's closing report. */
static double run_report_communicators(bool print) {
    bool held = false;
    comm_library_memory m = comm_library_memory_now(&held);
    if (!held) return 0;
    if (print) log0("NCCL communicators on rank 0: %d group%s of 2+ ranks and %d link%s; NCCL's buffers about %s = %d x %d "
         "channels x 18.4 MiB (ring and tree: LL 0.5 + LL128 4.69 + Simple 4 MiB) + %d point-to-point connections "
         "x %d channels x 4 MiB (NCCL 2.28's defaults; an estimate)%s\n", m.groups, m.groups == 1 ? "" : "s",
         m.links, m.links == 1 ? "" : "s", fmt_bytes(m.bytes), m.groups, m.channels, m.p2p_connections,
         m.p2p_channels, comm_library_on_device() ? "" : ": what NCCL would hold, not allocated here");
    return comm_library_on_device() ? m.bytes : 0;
}

llama_model *run_model(const run_options *o, const llama_plan *plan) { return run_model_paths(o, plan, NULL, 0); }

llama_model *run_model_paths(const run_options *o, const llama_plan *plan, const run_path *own_paths, int n_own) {
    const llama_config *c = &o->model;
    int B = o->batch / (plan->groups.batch ? plan->groups.batch->size : 1);   /* this data rank's sequences */
    int pieces = plan->schedule.microbatches > 1 ? plan->schedule.microbatches : 1;  /* a pipeline's microbatches */
    double state, acts, largest, base_largest;
    /* (a bound: as if every microbatch's activations were held at once) */
    double need = llama_model_bytes(c, plan, B, &state, &acts, &largest);
    llama_plan single = plan_single_device();
    double base = o->check ? llama_model_bytes(c, &single, o->batch, NULL, NULL, &base_largest) : 0;
    if (o->check) largest = fmax(largest, base_largest);
    if (largest >= 2147483648.0)
        comm_exit_usage("--batch %d, --seq-len %d, --dim %d, --vocab %d: one tensor would hold %.3g elements; "
                        "the kernels index with 32-bit ints, so at most 2147483647: make the batch, sequence, "
                        "width or vocabulary smaller", o->batch, c->seq_len, c->dim, c->vocab_size, largest);
    /* Beside the model: the buffers the plan's techniques allocate at first use (chapter 04's
     * gathered layers, full gradients and staging), and the training loop's: the step's batch on the
     * device and, on the host, its accum micro-batches (host memory is the device's on the CPU
     * backend); rank 0 gathers whole tensors for --check (two of the largest, or of dX) and for
     * --dump (every parameter at once). */
    bool shared_host = strcmp(device_backend_name(), "cpu") == 0, root = comm_world()->rank == 0;
    int accum = o->accum > 0 ? o->accum : 1;
    double N = (double)o->batch * c->seq_len, params = llama_parameter_count(c, true);
    double harness = 8 * N + (shared_host ? 8 * accum * N : 0);
    if (root && shared_host && o->check) harness += 8 * fmax((double)largest_param_numel(c, 0), N * c->dim);
    if (root && shared_host && o->dump_dir) harness += 4 * params;
    need += plan_buffer_bytes(plan) + harness;
    if (root) need += base;
    double nccl = run_report_communicators(false);   /* NCCL's own buffers, where they are on the device */
    need += nccl;
    double available = device_memory_available(comm_device_sharers());
    char sizes[160];
    snprintf(sizes, sizeof sizes, "--dim %d, --n-layers %d, --ffn-dim %d, --vocab %d, --batch %d x --seq-len %d%s",
             c->dim, c->n_layers, c->ffn_dim, c->vocab_size, o->batch, c->seq_len, accum > 1 ? " x --accum" : "");
    if (accum > 1) snprintf(sizes + strlen(sizes), sizeof sizes - strlen(sizes), " %d", accum);
    char parts[160] = "";
    if (plan_buffer_bytes(plan) > 0)
        snprintf(parts, sizeof parts, ", data-parallel buffers %s", fmt_bytes(plan_buffer_bytes(plan)));
    snprintf(parts + strlen(parts), sizeof parts - strlen(parts), ", batches%s %s", root && o->check ? " and checks" : "",
             fmt_bytes(harness));
    if (nccl > 0) snprintf(parts + strlen(parts), sizeof parts - strlen(parts), ", NCCL's buffers %s", fmt_bytes(nccl));
    comm_require_all(available <= 0 || need <= available,
                     "%s: the run needs about %s on rank %d (parameters, gradients and AdamW state %s, activations "
                     "and scratch %s%s%s) but %s is available to it: make the model or the batch smaller, or "
                     "use more ranks", sizes, fmt_bytes(need), comm_world()->rank, fmt_bytes(state), fmt_bytes(acts),
                     parts, root && o->check ? ", and the --check baseline" : "", fmt_bytes(available));
    /* Every path the run writes, checked together (outputs.h): usable, not an input, not each
     * other, nothing inside a directory the run owns whole. Nothing is created yet. */
    run_path paths[12] = {{"--out", o->out_dir, RUN_PATH_OUTPUT_DIR, NULL, true, true},
                          /* (made and locked now, so that no other run writes there while the dump is
                           * written aside: the commit replaces it whole) */
                          {"--dump", o->dump_dir, RUN_PATH_OUTPUT_DIR, "which the dump replaces whole when it ends",
                           true, true}};
    int n_paths = 2;
    for (int i = 0; i < n_own && n_paths < 12; i++) paths[n_paths++] = own_paths[i];
    run_paths_check(paths, n_paths);
    /* Every refusal of the paths themselves is behind us: only now may the run create its
     * outputs, each locked first (a folder another run writes is refused for that, before its
     * contents are looked at). Then the dump: written aside and, should anything end the run
     * before dump_commit, removed at exit; a refusal of its folder releases the locks too. */
    run_paths_create(paths, n_paths);   /* --out, --dump (and the chapter's directories), locked */
    if (o->dump_dir) {
        dump_require(o, comm_world()->rank == 0 ? dump_begin(o->dump_dir) : 0);
        comm_on_usage_exit(dump_abort);   /* a refusal: removed before any rank exits */
        atexit(dump_abort);               /* any other exit of this process */
    }
    comm_on_usage_exit(csv_abort_all);  /* a refusal from here on: no temporary CSV left */
    return llama_create(c, plan, B / pieces, o->seed);
}

float run_loss_scale(int n_valid) { return n_valid > 0 ? 1.0f / (float)n_valid : 0.0f; }

void run_clock_start(run_clock *k) {
    device_synchronize();
    k->t0 = wall_seconds();
    k->c0 = comm_total_seconds();
}

double run_clock_stop(run_clock *k) {
    device_synchronize();
    double dt = wall_seconds() - k->t0;
    k->seconds += dt;
    k->comm_seconds += comm_total_seconds() - k->c0;
    return dt;
}

void run_clock_report(const run_clock *k, int steps) {
    log0("time per step: %.1f ms (compute %.1f ms, communication %.1f ms, %.0f%%)\n",
         1e3 * k->seconds / steps, 1e3 * (k->seconds - k->comm_seconds) / steps,
         1e3 * k->comm_seconds / steps, k->seconds > 0 ? 100.0 * k->comm_seconds / k->seconds : 0.0);
    run_report_communicators(true);
    if (k->beside_baseline)
        log0("  (timings beside --check's baseline are not the technique's: rank 0 trains the baseline between "
             "steps while the others wait in their next collective; make bench-NN measures without it)\n");
}

/* ---- the comparison with the baseline ---- */

static void print_step(int step, const char *label, double loss, double base_loss, int n_pad, double step_ms) {
    if (isnan(base_loss))
        log0("step %3d | loss %s %.9f | padded targets %d | %.1f ms\n", step, label, loss, n_pad, step_ms);
    else
        log0("step %3d | loss %s %.9f  baseline %.9f  |diff| %.1e | padded targets %d | %.1f ms\n",
             step, label, loss, base_loss, fabs(loss - base_loss), n_pad, step_ms);
}

/* Floats of the largest parameter tensor of the model, at least `at_least`. */
static size_t largest_param_numel(const llama_config *c, size_t at_least) {
    size_t biggest = at_least;
    for (int i = 0; i < llama_num_params(c); i++) {
        param_spec s = llama_param_spec(c, i);
        if ((size_t)s.rows * s.cols > biggest) biggest = (size_t)s.rows * s.cols;
    }
    return biggest;
}

/* The share of g[n]'s elements within bf16's gradient tolerance of zero, |g| <= 4u max|g|: the
 * elements whose sign a bf16 rounding difference may flip, and whose AdamW update may then differ
 * by up to 2 lr (compare_params). */
static double share_near_zero(const float *g, size_t n) {
    double gmax = 0;
    for (size_t k = 0; k < n; k++) gmax = fmax(gmax, fabs(g[k]));
    size_t near = 0;
    for (size_t k = 0; k < n; k++) near += fabs(g[k]) <= 4 * PARITY_BF16_U * gmax;
    return n ? (double)near / n : 0;
}

/* The --check baseline (run.h): the single-device model, on world rank 0 only. */
struct baseline_check {
    llama_model *base;       /* rank 0; NULL elsewhere                                        */
    bool first_step_only;    /* judge step 1 only (chapter 07's float8 casts)                 */
    const char *unjudged;    /* step 1's gradients shown, not judged, because of this; or NULL */
    double *near_zero;       /* bf16, rank 0: per tensor, the share of step 1's baseline gradient
                              * elements within the gradient tolerance of zero (compare_params)  */
    bool curve;              /* --baseline-dtype another than --dtype: the loss curves compared  */
    int curve_steps;         /* the last this many steps' mean losses are compared              */
    double curve_loss, curve_base_loss;   /* their sums                                         */
};

/* --baseline-dtype: a run in one precision beside a baseline in another does not compute the same
 * numbers (bf16 against fp32: every GEMM operand rounded), so it is judged as training is: the mean
 * loss of the last CURVE_STEPS steps within CURVE_RTOL of the baseline's (issue 37's goal). */
#define CURVE_STEPS 10
#define CURVE_RTOL 0.01

dtype run_baseline_precision(const run_options *o) {
    return o->baseline_dtype >= 0 ? (dtype)o->baseline_dtype : o->model.precision;
}

baseline_check *run_baseline_create(const run_options *o, const llama_plan *plan, bool first_step_only) {
    if (!o->check) return NULL;
    baseline_check *b = calloc(1, sizeof *b);
    b->first_step_only = first_step_only;
    b->near_zero = calloc((size_t)llama_num_params(&o->model), sizeof *b->near_zero);
    llama_config c = o->model;
    c.precision = run_baseline_precision(o);
    b->curve = c.precision != o->model.precision;
    b->curve_steps = o->steps < CURVE_STEPS ? o->steps : CURVE_STEPS;
    if (b->curve) parity_set_curves(CURVE_RTOL);
    else parity_set_precision(c.precision, (double)o->batch * o->model.seq_len * (o->accum > 0 ? o->accum : 1));
    if (b->curve)
        log0("--check against a %s baseline: the loss curves compared (the mean of the last %d steps within %.0f%%), "
             "the gradients shown, not judged\n", dtype_name(c.precision), b->curve_steps, 100 * CURVE_RTOL);
    if (comm_world()->rank == 0)
        b->base = plan ? llama_create(&c, plan, o->batch, o->seed) : llama_create_baseline(&c, o->batch, o->seed);
    return b;
}

void run_baseline_unjudged(baseline_check *b, const char *why) {
    if (b) b->unjudged = why;
}

/* Compares the losses (judged every step, or step 1 only), then every gradient, gathered to world
 * rank 0, and the gradient of the embedding output h0 (dX: dh0, this rank's `rows` sequences)
 * with the baseline's (rank 0 only). */
static void compare_step(const run_options *o, int step, double loss, double base_loss,
                         llama_model *model, const float *dh0, int rows, baseline_check *check) {
    const llama_config *c = &o->model;
    llama_model *base = check->base;
    bool root = comm_world()->rank == 0;
    bool table = step == 1 || o->verbose_grads;
    if (check->curve && step > o->steps - check->curve_steps) {   /* the curves: judged at the end */
        check->curve_loss += loss;
        check->curve_base_loss += base_loss;
    }
    if (root && !check->curve && (step == 1 || !check->first_step_only)) parity_loss(step, loss, base_loss);
    /* Gradients are judged on step 1, where both models hold the same parameters. After that
     * the two runs have taken AdamW steps from gradients that differ in their last bits, and
     * AdamW's normalisation (m / sqrt(v)) turns a rounding-level difference in a near-zero
     * gradient element into a parameter difference of up to lr: later gradients then differ
     * by an amount proportional to lr, not to rounding. They are shown, not judged; the loss,
     * judged on every step, covers the whole trajectory. */
    const char *unjudged = root && step == 1 ? check->curve ? "the baseline computes in another precision" : check->unjudged : NULL;
    if (unjudged) log0("  step 1's gradients: shown, not judged: %s\n", unjudged);
    parity_set_grads_enforced(step == 1 && !unjudged);
    parity_set_verbose(table);
    if (table) parity_print_header("  gradients, parallel (gathered) vs baseline:");
    size_t biggest = largest_param_numel(c, (size_t)o->batch * c->seq_len * c->dim);   /* or dX */
    float *full = root ? malloc(biggest * sizeof(float)) : NULL;
    float *ref = root ? malloc(biggest * sizeof(float)) : NULL;
    for (int i = 0; i < llama_num_params(c); i++) {
        param_spec s = llama_param_spec(c, i);
        param_gather(model->params, i, true, full);
        if (!root) continue;
        param_gather(base->params, i, true, ref);
        parity_tensor(s.name, full, ref, (size_t)s.rows * s.cols);
        if (step == 1 && c->precision == DTYPE_BF16) check->near_zero[i] = share_near_zero(ref, (size_t)s.rows * s.cols);
    }
    llama_gather_residual(model, dh0, rows, full);
    if (root) {
        size_t n = (size_t)o->batch * c->seq_len * c->dim;
        device_copy_to_host(ref, base->dh, n * sizeof(float));
        parity_tensor("h0 = tok_embeddings[tokens] (dX)", full, ref, n);
        const char *name;
        double w = parity_worst(&name);
        if (!table) log0("  gradients: worst relative difference %.3e (%s)%s\n", w, name,
                         step > 1 ? ", after AdamW steps: shown, not judged" : "");
    }
    parity_set_verbose(true);
    parity_set_grads_enforced(true);
    free(full);
    free(ref);
}

/* After the last step: every parameter, gathered to world rank 0, beside the baseline's. A
 * sharded optimizer is only proven by the weights it wrote. The judgement cannot be the
 * gradients' 1e-4: AdamW divides by sqrt(v), so a rounding-level difference of a near-zero
 * gradient becomes an update difference of a fraction of lr (seen: up to 0.05 lr). A wrong or
 * missing update moves every element of a shard by about lr. So each tensor is judged by the
 * share of its elements that moved more than lr/10 away from the baseline: at most 1%. */
#define PARAM_FAR (0.1)      /* x lr                                   */
#define PARAM_FAR_SHARE 0.01 /* of a tensor's elements                 */
static void compare_params(const run_options *o, llama_model *model, const baseline_check *check) {
    llama_model *base = check->base;
    const llama_config *c = &o->model;
    bool root = comm_world()->rank == 0;
    size_t biggest = largest_param_numel(c, 0);
    float *full = root ? malloc(biggest * sizeof(float)) : NULL, *ref = root ? malloc(biggest * sizeof(float)) : NULL;
    double worst_share = 0;
    char worst[64] = "";
    int bad = 0;
    for (int i = 0; i < llama_num_params(c); i++) {
        param_spec s = llama_param_spec(c, i);
        param_gather(model->params, i, false, full);
        if (!root) continue;
        param_gather(base->params, i, false, ref);
        size_t n = (size_t)s.rows * s.cols, far = 0;
        for (size_t k = 0; k < n; k++) far += fabs((double)full[k] - ref[k]) > PARAM_FAR * o->opt.lr;
        double share = (double)far / n, allowed = PARAM_FAR_SHARE + check->near_zero[i];
        if (share > allowed) {
            bad++;
            char why[48] = "";   /* (bf16: the allowed share is the tensor's own) */
            if (c->precision == DTYPE_BF16) snprintf(why, sizeof why, " (allowed %.1f%%)", 100 * allowed);
            log0("  %s: %.1f%% of its elements are more than %g lr from the baseline's after %d steps%s  FAIL\n",
                 s.name, 100 * share, PARAM_FAR, o->steps, why);
        }
        if (share >= worst_share) { worst_share = share; snprintf(worst, sizeof worst, "%s", s.name); }
    }
    if (root) {
        log0("  parameters after %d AdamW steps: %s (elements more than %g lr from the baseline's: at most "
             "%.2f%% of a tensor, %s; allowed %.0f%%%s)\n", o->steps, bad ? "FAIL" : "ok", PARAM_FAR,
             100 * worst_share, worst, 100 * PARAM_FAR_SHARE,
             c->precision == DTYPE_BF16 ? " + the tensor's share of step-1 gradients within bf16's tolerance of 0" : "");
        if (bad) parity_fail("parameters after the AdamW steps differ from the baseline's (above)");
    }
    free(full);
    free(ref);
}

/* --baseline-dtype: the mean loss of the last steps against the baseline's (rank 0). */
static void compare_curves(const run_options *o, const baseline_check *check) {
    if (comm_world()->rank != 0) return;
    int k = check->curve_steps;
    double got = check->curve_loss / k, ref = check->curve_base_loss / k, rel = fabs(got - ref) / fabs(ref);
    bool ok = parity_curve(got, ref);
    log0("  loss curves: the mean of the last %d steps %.6f (%s), the baseline's %.6f (%s): %.3f%% apart, "
         "allowed %.0f%%  %s\n", k, got, dtype_name(o->model.precision), ref, dtype_name((dtype)o->baseline_dtype),
         100 * rel, 100 * CURVE_RTOL, ok ? "ok" : "FAIL");
}

/* --dump: every full tensor (parameters, or gradients), gathered to rank 0 and written. */
static void dump_tensors(const run_options *o, const char *file, bool grads, llama_model *model) {
    const llama_config *c = &o->model;
    int n = llama_num_params(c);
    bool root = comm_world()->rank == 0;
    float **full = calloc(n, sizeof *full);
    for (int i = 0; i < n; i++) {
        param_spec s = llama_param_spec(c, i);
        if (root) full[i] = malloc((size_t)s.rows * s.cols * sizeof(float));
        param_gather(model->params, i, grads, full[i]);
    }
    int rc = root ? dump_params(o->dump_dir, file, c, &o->opt, full) : 0;
    for (int i = 0; i < n; i++) free(full[i]);
    free(full);
    dump_require(o, rc);
}

/* Clipping by the global norm, as torch.nn.utils.clip_grad_norm_: the norm of every gradient
 * element of the whole model, whatever the layout (each rank sums the squares of the slices it
 * holds for gather; one all-reduce of one float over the world), then every gradient times
 * min(1, max_norm / (norm + 1e-6)). Returns the norm before clipping. Collective over `world`
 * (NULL: the baseline, alone on its rank). */
static double clip_grad_norm(llama_model *m, comm_group *world, float max_norm, float *dev_scalar) {   /* max_norm 0: the norm only */
    float sq = (float)param_grad_sq_held(m->params);
    if (world) {
        device_copy_to_device(dev_scalar, &sq, sizeof sq);
        comm_all_reduce(world, dev_scalar, 1, COMM_SUM);
        device_copy_to_host(&sq, dev_scalar, sizeof sq);
    }
    double norm = sqrt((double)sq), coef = max_norm / (norm + 1e-6);
    if (max_norm > 0 && coef < 1.0) param_scale_grads(m->params, (float)coef);
    return norm;
}

/* Context parallelism: each sequence's rows at this rank's positions (model->positions, [Tl]),
 * from the [rows, T] tokens (or targets) `src` into [rows, Tl] `dst`, both on the device. */
static void take_context_rows(const llama_model *model, int *dst, const int *src, int rows, int T) {
    int Tl = model->d.T;
    int *pos = malloc((size_t)Tl * sizeof(int)), *all = malloc((size_t)rows * T * sizeof(int));
    int *mine = malloc((size_t)rows * Tl * sizeof(int));
    device_copy_to_host(pos, model->positions, (size_t)Tl * sizeof(int));
    device_copy_to_host(all, src, (size_t)rows * T * sizeof(int));
    for (int b = 0; b < rows; b++)
        for (int t = 0; t < Tl; t++) mine[(size_t)b * Tl + t] = all[(size_t)b * T + pos[t]];
    device_copy_to_device(dst, mine, (size_t)rows * Tl * sizeof(int));
    free(pos); free(all); free(mine);
}

/* This rank's sequences of the global batch: its data-parallel coordinate's share. */
static int rank_rows(const llama_model *model) {
    return model->d.B * (model->plan->schedule.microbatches > 1 ? model->plan->schedule.microbatches : 1);
}

float run_forward_backward(llama_model *model, const int *tokens, const int *targets, float loss_scale,
                           bool backward, const float **dh0) {
    const llama_plan *plan = model->plan;
    int T = model->c.seq_len, rows = rank_rows(model);
    size_t offset = (size_t)(plan->groups.batch ? plan->groups.batch->rank : 0) * rows * T;
    const int *my_tokens = tokens + offset, *my_targets = targets + offset;
    if (plan->groups.cp) {   /* under context parallelism, only this rank's positions of each of its rows */
        take_context_rows(model, model->cp_tokens, my_tokens, rows, T);
        take_context_rows(model, model->cp_targets, my_targets, rows, T);
        my_tokens = model->cp_tokens;
        my_targets = model->cp_targets;
    }
    float loss;
    if (dh0) *dh0 = model->dh;
    const schedule_ops *schedule = &plan->schedule;
    if (schedule->forward_backward) {   /* the plan runs its own schedule (a pipeline): always both */
        const float *unused;
        loss = schedule->forward_backward(schedule->state, plan, model, my_tokens, my_targets, loss_scale, dh0 ? dh0 : &unused);
    } else {
        loss = llama_forward(model, my_tokens, my_targets, loss_scale);
        if (backward) llama_backward(model);
    }
    if (plan->groups.cp) loss = (float)comm_host_sum(plan->groups.cp, loss);        /* the sequences' rows: every share */
    if (plan->groups.batch) loss = (float)comm_host_sum(plan->groups.batch, loss);  /* the global mean: every rank's share */
    return loss;
}

/* ---- the training loop ---- */

run_loop run_loop_begin(const run_options *o, llama_model *model, baseline_check *check, const char *label,
                        const char *csv_path) {
    const llama_config *c = &o->model;
    int N = o->batch * c->seq_len, accum = o->accum > 0 ? o->accum : 1;
    run_loop l = {.o = o, .model = model, .check = check, .label = label};
    l.clock.beside_baseline = o->check;
    mem_reset_peaks();   /* the largest allocation seen from here on is the parallel run's own */
    l.dev_tokens = device_alloc_ints(N, MEM_BUFFERS);
    l.dev_targets = device_alloc_ints(N, MEM_BUFFERS);
    l.tokens = malloc((size_t)accum * N * sizeof(int));
    l.targets = malloc((size_t)accum * N * sizeof(int));
    l.dev_scalar = device_alloc_floats(1, MEM_BUFFERS);
    if (o->dump_dir) dump_tensors(o, "init.safetensors", false, model);
    l.csv = csv_path ? csv_open(csv_path, "step,baseline,parallel") : NULL;
    comm_reset_all_stats();
    return l;
}

void run_synthetic_batch(run_loop *l, int step) {
    const run_options *o = l->o;
    int B = o->batch, T = o->model.seq_len, accum = o->accum > 0 ? o->accum : 1;
    size_t N = (size_t)B * T;
    for (int micro = 0; micro < accum; micro++)   /* (one micro-batch: the step's own seed) */
        synthetic_batch(l->tokens + micro * N, l->targets + micro * N, B, T, o->model.vocab_size, o->seed,
                        accum > 1 ? step * accum + micro : step);
}

run_step_result run_step(run_loop *l, int step, double lr) {
    const run_options *o = l->o;
    llama_model *model = l->model, *base = l->check ? l->check->base : NULL;
    int N = o->batch * o->model.seq_len, accum = o->accum > 0 ? o->accum : 1;
    char beat[32];
    snprintf(beat, sizeof beat, "step %d", step);
    guard_progress(beat);   /* the watchdog's heartbeat (guard.h) */
    if (o->dump_dir)
        dump_require(o, log_rank() == 0 ? dump_batch(o->dump_dir, step, l->tokens, l->targets, accum * o->batch,
                                                     o->model.seq_len) : 0);
    int n_valid = count_valid_targets(l->targets, accum * N);
    float scale = run_loss_scale(n_valid);   /* 1 / valid targets of the step's whole batch */
    /* (the rate as the update uses it: an fp32 value) */
    run_step_result r = {step, 0, base ? 0 : NAN, isnan(lr) ? NAN : (float)lr, NAN, 0, 0, (long long)accum * N,
                         accum * N - n_valid, model->dh};

    if (base) llama_zero_grad(base);
    for (int micro = 0; micro < accum; micro++) {   /* gradients accumulate over the micro-batches */
        size_t at = (size_t)micro * N;
        device_copy_to_device(l->dev_tokens, l->tokens + at, (size_t)N * sizeof(int));
        device_copy_to_device(l->dev_targets, l->targets + at, (size_t)N * sizeof(int));
        run_clock_start(&l->clock);
        if (micro == 0) llama_zero_grad(model);
        model->accumulating = micro < accum - 1;   /* the plan's reductions once, after the last */
        llama_begin_pass(model, step);
        r.loss += run_forward_backward(model, l->dev_tokens, l->dev_targets, scale, true, &r.dh0);
        r.fb_seconds += run_clock_stop(&l->clock);
        if (base) {   /* the baseline's half, on the same global batch; its buffers and its bf16
                       * roundings are not this rank's */
            mem_peaks own = mem_peaks_save();
            size_t rounded = linear_bf16_rounded();
            llama_begin_pass(base, step);
            r.base_loss += llama_forward(base, l->dev_tokens, l->dev_targets, scale);
            llama_backward(base);   /* (one device: no reductions to defer) */
            mem_peaks_restore(&own);
            linear_bf16_uncount(linear_bf16_rounded() - rounded);
        }
    }
    r.seconds = r.fb_seconds;
    if (!l->own_metrics || base) print_step(step, l->label, r.loss, r.base_loss, r.n_pad, 1e3 * r.fb_seconds);
    csv_row(l->csv, "%d,%.9g,%.9g", step, r.base_loss, r.loss);
    run_require_written();   /* a full disk ends the run now, not after it */
    return r;
}

void run_step_check(run_loop *l, const run_step_result *r) {
    const run_options *o = l->o;
    /* (with accumulation the gradients are compared; dX is the last micro-batch's) */
    if (l->check) compare_step(o, r->step, r->loss, r->base_loss, l->model, r->dh0, rank_rows(l->model), l->check);
    if (o->dump_dir) {
        if (r->step == 1) dump_tensors(o, "grads_1.safetensors", true, l->model);
        dump_require(o, comm_world()->rank == 0 ? dump_loss(o->dump_dir, r->step, r->loss, r->lr) : 0);
    }
}

/* Of this step's updates of the values this rank holds (`before`: the values before it, host), those
 * a bf16 master copy would lose: held in bf16, w = bf16(before), the update delta = after - before
 * gives bf16(w + delta) = w when delta is below half an ulp of w (between 2^-9 |w| and 2^-8 |w|,
 * by where w sits in its binade). Printed in all and for the norm weights, which sit at 1, where
 * half an ulp above 1 is 2^-8 = 3.9e-3, more than AdamW's update of about lr. */
static void report_lost_updates(param_table *t, const float *before, int step) {
    size_t n = param_block_numel(t, t->params);
    float *after = malloc(n * sizeof(float));
    device_copy_to_host(after, t->params, n * sizeof(float));
    size_t moved[2] = {0, 0}, lost[2] = {0, 0};   /* [0] every value, [1] the norm weights */
    for (int i = 0; i < t->n; i++) {
        const param_tensor *p = &t->t[i];
        if (!p->here) continue;
        bool norm = p->spec.kind == P_ATTENTION_NORM || p->spec.kind == P_FFN_NORM || p->spec.kind == P_NORM;
        /* (its padding, of a shard or of the vocabulary, is zero and never moves: skipped below) */
        size_t first = (size_t)(param_in(t, t->params, i) - t->params), count = param_stored_numel(t, t->params, i);
        for (size_t k = first; k < first + count; k++) {
            if (after[k] == before[k]) continue;
            float w = bf16_to_float(bf16_from_float(before[k]));   /* the bf16 master's value */
            bool gone = bf16_from_float(w + (after[k] - before[k])) == bf16_from_float(w);
            for (int g = 0; g <= (int)norm; g++) moved[g]++, lost[g] += gone;
        }
    }
    log0("  bf16 master weights would lose %zu of world rank 0's %zu updates at step %d (%.1f%%; the norm "
         "weights %zu of %zu): an update below half a bf16 ulp of its weight rounds back to it. "
         "This run keeps fp32 master weights.\n", lost[0], moved[0], step, moved[0] ? 100.0 * lost[0] / moved[0] : 0.0,
         lost[1], moved[1]);
    free(after);
}

void run_update(run_loop *l, run_step_result *r) {
    const run_options *o = l->o;
    llama_model *base = l->check ? l->check->base : NULL;
    adamw_config opt = o->opt;
    if (!isnan(r->lr)) opt.lr = (float)r->lr;
    /* with bf16 compute, the last step shows why the master weights stay fp32 (world rank 0's):
     * the values before the update, copied out before the step's clock runs */
    param_table *t = l->model->params;
    bool show_lost = o->model.precision == DTYPE_BF16 && r->step == o->steps && comm_world()->rank == 0;
    size_t n = param_block_numel(t, t->params);
    float *before = show_lost ? malloc(n * sizeof(float)) : NULL;
    if (show_lost) device_copy_to_host(before, t->params, n * sizeof(float));
    run_clock_start(&l->clock);
    if (o->opt.clip_grad_norm > 0) {
        r->grad_norm = clip_grad_norm(l->model, comm_world(), o->opt.clip_grad_norm, l->dev_scalar);
        double base_norm = base ? clip_grad_norm(base, NULL, o->opt.clip_grad_norm, NULL) : NAN;
        if (!l->own_metrics)
            log0("         grad norm %.6g (baseline %.6g), clipped to %g\n", r->grad_norm, base_norm, o->opt.clip_grad_norm);
    }
    llama_adamw_step(l->model, &opt, r->step);
    r->seconds += run_clock_stop(&l->clock);
    if (show_lost) report_lost_updates(t, before, r->step);
    free(before);
    if (base) llama_adamw_step(base, &opt, r->step);
    if (isnan(r->lr)) r->lr = opt.lr;
}

run_clock run_loop_end(run_loop *l) {
    const run_options *o = l->o;
    baseline_check *check = l->check;
    csv_close(l->csv);
    run_require_written();
    if (check && check->curve) compare_curves(o, check);
    else if (check && !check->first_step_only) compare_params(o, l->model, check);
    else if (check && o->steps > 1)
        log0("  losses after step 1 and the parameters after the last step: shown, not judged (see above)\n");
    if (o->dump_dir) dump_require(o, comm_world()->rank == 0 ? dump_commit() : 0);   /* the finished dump, in one rename */
    if (check) {
        llama_free(check->base);
        free(check->near_zero);
    }
    free(check);
    device_free(l->dev_tokens);
    device_free(l->dev_targets);
    device_free(l->dev_scalar);
    free(l->tokens);
    free(l->targets);
    return l->clock;
}

run_clock run_train(const run_options *o, llama_model *model, const llama_plan *baseline, const char *label,
                    const char *csv_path) {
    run_loop loop = run_loop_begin(o, model, run_baseline_create(o, baseline, false), label, csv_path);
    for (int step = 1; step <= o->steps; step++) {
        run_synthetic_batch(&loop, step);
        run_step_result r = run_step(&loop, step, NAN);
        run_step_check(&loop, &r);
        run_update(&loop, &r);
    }
    return run_loop_end(&loop);
}

void run_require_written(void) {
    const char *err = file_write_error();
    comm_require_all(err == NULL, "%s; the previous file is left as it was", err ? err : "");
}

int run_finish(const run_options *o, int mismatches) {
    run_require_written();   /* the reports' files too: a verdict only for a run whose files are whole */
    if (mismatches) log0("%d measured figure(s) differ from the formulas\n", mismatches);
    int status = o->check ? parity_report() : mismatches > 0;
    comm_finalize();
    return status;
}
