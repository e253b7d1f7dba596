/* float8_all_gather.c: FSDP's float8 all-gather (float8_all_gather.h). */
#include <math.h>
#include <stdlib.h>
#include "comm.h"
#include "device.h"
#include "float8.h"
#include "float8_all_gather.h"
#include "float8_linear.h"
#include "llama_kernels.h"

typedef struct {
    comm_group *tp;
    dtype high;                     /* the high precision cast from: fp32, or bf16 (--dtype) */
    float *scalar;                  /* one device float, for the amax's all-reduces */
    double worst_sqnr;              /* the lowest SQNR of a shard's cast, in dB       */
} gather_state;

typedef struct {
    uint8_t *send, *recv;           /* this rank's shard as float8, every rank's    */
    float scale;
    size_t count;                   /* elements of the gathered (padded) tensor     */
} gather_pending;

bool float8_gathers(param_kind kind) {
    return kind == P_WQ || kind == P_WK || kind == P_WV || kind == P_WO || kind == P_W1 || kind == P_W2 ||
           kind == P_W3;
}

/* The cast's accuracy against the shard's high-precision values (fp32, or bf16 under --dtype bf16).
 * The gathered weight is what the float8 linear sees: in fp32 its own cast of it is exact (the
 * rounding happened here); under bf16 the linear first rounds the decoded values (codes over a
 * scale that is not a power of two) to bf16, moving each by at most half a bf16 ulp, 2^-4 of half
 * an E4M3 step, so its cast lands on the same codes (compared code for code with the baseline's)
 * and its "cast W" SQNR row shows that rounding instead of infinity. SQNR in dB, as float8_linear.c. */
static void note_sqnr(gather_state *s, const float *shard, const uint8_t *q, size_t count, float scale) {
    float *dev = device_alloc_floats(count, MEM_BUFFERS);
    float8_dequantize(dev, q, count, scale, FLOAT8_E4M3);
    double db = float8_sqnr_db(shard, dev, count);
    if (db < s->worst_sqnr) s->worst_sqnr = db;
    device_free(dev);
}

/* shard [count] -> the float8 bytes of every shard, in flight. Issues: 1 all-reduce (MAX) of
 * 1 float over dp_shard (and 1 over tp), 1 all-gather of S x count bytes over dp_shard. */
static comm_request start(void *ctx, comm_group *g, const param_tensor *x, const float *shard, float *full,
                          size_t count, void **pending) {
    gather_state *s = ctx;
    if (!float8_gathers(x->spec.kind)) {   /* fp32, as chapter 04 gathers it */
        *pending = NULL;
        return comm_iall_gather(g, shard, full, count);
    }
    /* under --dtype bf16 the high precision is bf16 (float8_linear.c): the shard's bf16 values are
     * cast, so the amax, the scale and the codes are the ones the float8 linear would find */
    float *rounded = s->high == DTYPE_BF16 ? bf16_values(shard, count) : NULL;
    if (rounded) shard = rounded;
    gather_pending *p = malloc(sizeof *p);
    p->scale = 1.0f;
    p->count = count * g->size;
    p->send = device_alloc(count, MEM_BUFFERS);                 /* this shard's bytes      */
    p->recv = device_alloc(p->count, MEM_BUFFERS);              /* every shard's, gathered */
    device_zero(p->send, count);
    comm_request req = {0};
    /* BEGIN ASSIGNMENT: p->scale, the whole tensor's scale (this shard's amax MAX-all-reduced over dp_shard g, then over s->tp when there is one: the float8 linear agrees its weight's amax over tp); p->send, this shard cast to E4M3 bytes with it; req, the byte all-gather of the S shards into p->recv (comm_iall_gather_bytes) */
    float amax = float8_amax(shard, count);
    device_copy_to_device(s->scalar, &amax, sizeof amax);
    comm_all_reduce(g, s->scalar, 1, COMM_MAX);
    if (s->tp) comm_all_reduce(s->tp, s->scalar, 1, COMM_MAX);
    device_copy_to_host(&amax, s->scalar, sizeof amax);
    p->scale = float8_scale_from_amax(amax, FLOAT8_E4M3, 0);
    float8_quantize(p->send, shard, count, p->scale, FLOAT8_E4M3);
    req = comm_iall_gather_bytes(g, p->send, p->recv, count);
    /* END ASSIGNMENT */
    *pending = p;
    note_sqnr(s, shard, p->send, count, p->scale);
    device_free(rounded);
    return req;
}

/* After the wait: full [S x count] (=) the decoded values. */
static void finish(void *ctx, const param_tensor *x, float *full, size_t count, void *pending) {
    gather_pending *p = pending;
    if (!p) return;
    float8_dequantize(full, p->recv, p->count, p->scale, FLOAT8_E4M3);
    device_free(p->send);
    device_free(p->recv);
    free(p);
}

dp_gather_ops float8_all_gather_ops(comm_group *tp, dtype high) {
    gather_state *s = calloc(1, sizeof *s);
    s->tp = tp && tp->size > 1 ? tp : NULL;
    s->high = high;
    s->scalar = device_alloc_floats(1, MEM_BUFFERS);
    s->worst_sqnr = INFINITY;
    return (dp_gather_ops){start, finish, s};
}

double float8_all_gather_worst_sqnr(const dp_gather_ops *ops) {
    const gather_state *s = ops->ctx;
    return s ? s->worst_sqnr : INFINITY;
}

void float8_all_gather_free(dp_gather_ops *ops) {
    gather_state *s = ops->ctx;
    if (!s) return;
    device_free(s->scalar);
    free(s);
    ops->ctx = NULL;
}
