/* float8_probe.c: SQNR of float8's casts and products against the high precision, fp32 or bf16
 * (float8_probe.h). */
#include <math.h>
#include <stdlib.h>
#include "comm.h"
#include "device.h"
#include "kernels.h"
#include "llama_kernels.h"
#include "float8_probe.h"

typedef struct {
    linear_ops below;                                    /* float8's linear                         */
    double worst[FLOAT8_NROLES], first[FLOAT8_NROLES];   /* lowest SQNR: over the run, in step 1    */
    linear_site worst_at[FLOAT8_NROLES];
} probe_state;

static void probe_free_state(void *state) { free(state); }
const plan_technique float8_probe_technique = {"float8 probe", probe_free_state};

/* One comparison of `got` [n] with its fp32 reference `ref` [n] (device), at site `at`. */
static void note(probe_state *s, int role, linear_site at, const float *ref, const float *got, size_t n) {
    double db = float8_sqnr_db(ref, got, n);
    if (db < s->worst[role]) {
        s->worst[role] = db;
        s->worst_at[role] = at;
    }
    if (at.when.step == 1 && db < s->first[role]) s->first[role] = db;
}

/* float8's cast of `hi` [n] to the float8 values `q` [n] (fake-quantized, as fp32). */
static void observe_cast(void *state, int role, linear_site at, const float *hi, const float *q, size_t n) {
    note(state, role, at, hi, q, n);
}

/* An operand of the reference product as float8 casts it from: x [n] itself in fp32, or (--dtype
 * bf16, the high precision bf16) a copy of its bf16 values, which the caller frees. Not counted
 * among the linears' roundings: the probe is not the run. */
typedef struct { const float *v; float *copy; } high_operand;
static high_operand high_values(linear_site at, const float *x, size_t n) {
    if (at.compute != DTYPE_BF16) return (high_operand){x, NULL};
    float *copy = bf16_values(x, n);
    return (high_operand){copy, copy};
}

/* y [N, out] = float8's product, beside the high precision's x [N, in] W [out, in]^T (an fp32
 * GEMM). No collective. */
static void probe_forward(void *state, const llama_plan *p, linear_site at, float *y, const float *x, const float *W,
                          int N, int in, int out) {
    probe_state *s = state;
    s->below.forward(s->below.state, p, at, y, x, W, N, in, out);
    if (!float8_casts_site(at)) return;
    float *ref = device_alloc_floats((size_t)N * out, MEM_BUFFERS);
    high_operand xh = high_values(at, x, (size_t)N * in), Wh = high_values(at, W, (size_t)out * in);
    linear_forward(ref, xh.v, Wh.v, N, in, out);
    note(s, FLOAT8_OUT_Y, at, ref, y, (size_t)N * out);
    device_free(ref); device_free(xh.copy); device_free(Wh.copy);
}

/* dx [N, in] (as `how` says) and dW [out, in] (+=): float8's products, each measured alone (before
 * it is added where `how` and the accumulation ask) beside the high precision's dy W and dy^T x.
 * No collective. */
static void probe_backward(void *state, const llama_plan *p, linear_site at, float *dx, dx_write how, float *dW,
                           const float *dy, const float *x, const float *W, int N, int in, int out) {
    probe_state *s = state;
    if (!float8_casts_site(at)) {
        s->below.backward(s->below.state, p, at, dx, how, dW, dy, x, W, N, in, out);
        return;
    }
    size_t n_x = (size_t)N * in, n_w = (size_t)out * in;
    float *dx_alone = dx && how == DX_ADD ? device_alloc_floats(n_x, MEM_BUFFERS) : dx;
    float *dW_alone = dW ? device_alloc_floats(n_w, MEM_BUFFERS) : NULL;
    if (dW_alone) device_zero(dW_alone, n_w * sizeof(float));
    s->below.backward(s->below.state, p, at, dx_alone, DX_SET, dW_alone, dy, x, W, N, in, out);
    high_operand dyh = high_values(at, dy, (size_t)N * out), xh = high_values(at, x, n_x), Wh = high_values(at, W, n_w);
    if (dx) {
        float *ref = device_alloc_floats(n_x, MEM_BUFFERS);
        linear_backward(ref, NULL, dyh.v, xh.v, Wh.v, N, in, out);
        note(s, FLOAT8_OUT_DX, at, ref, dx_alone, n_x);
        device_free(ref);
        if (dx_alone != dx) {
            add_inplace(dx, dx_alone, n_x);
            device_free(dx_alone);
        }
    }
    if (dW) {
        float *ref = device_alloc_floats(n_w, MEM_BUFFERS);
        device_zero(ref, n_w * sizeof(float));
        linear_backward(NULL, ref, dyh.v, xh.v, Wh.v, N, in, out);
        note(s, FLOAT8_OUT_DW, at, ref, dW_alone, n_w);
        device_free(ref);
        add_inplace(dW, dW_alone, n_w);
        device_free(dW_alone);
    }
    device_free(dyh.copy); device_free(xh.copy); device_free(Wh.copy);
}

void float8_probe_apply(llama_plan *plan) {
    if (!plan_has(plan, &float8_technique))
        comm_exit_usage("float8_probe_apply: apply float8 first (the probe measures float8's casts and products)");
    probe_state *s = plan_push(plan, &float8_probe_technique, calloc(1, sizeof(probe_state)), 0);
    for (int r = 0; r < FLOAT8_NROLES; r++) s->worst[r] = s->first[r] = INFINITY;
    float8_observe_casts(plan, (float8_cast_observer){s, observe_cast});
    plan_wrap(plan->linear, s->below, ((linear_ops){s, probe_forward, probe_backward}));
}

void float8_worst_sqnr(const llama_plan *plan, double first[FLOAT8_NROLES], double worst[FLOAT8_NROLES],
                       linear_site where[FLOAT8_NROLES]) {
    const probe_state *s = plan_state(plan, &float8_probe_technique);
    for (int r = 0; r < FLOAT8_NROLES; r++) {
        first[r] = s ? s->first[r] : INFINITY;
        worst[r] = s ? s->worst[r] : INFINITY;
        where[r] = s ? s->worst_at[r] : (linear_site){.kind = P_WQ, .layer = 0};
    }
}
