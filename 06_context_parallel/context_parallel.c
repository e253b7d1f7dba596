/* context_parallel.c: the context-parallel plan (context_parallel.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "device.h"
#include "dump.h"
#include "init.h"
#include "kernels.h"
#include "llama_kernels.h"
#include "log.h"
#include "model.h"
#include "seq_layout.h"
#include "context_parallel.h"

typedef struct {
    cp_options o;
    comm_group *cp;
    int C, r;
    int chunks[2];                  /* the 2 of 2C chunks this rank holds, in its row order      */
    grad_reduce_ops below_reduce;   /* the gradient reduction the plan owed before CP's          */
    double work;                    /* score elements of the last forward, per (sequence, head)  */
    size_t forward_set, backward_set; /* bytes of scratch the last forward / backward held at most */
    bool record;                    /* keep the ring's timeline (context_parallel_record_timeline) */
    int n_events;
    cp_event events[2 * CP_MAX_RANKS]; /* the last ring forward's steps                          */
    bool no_lse_rescale;            /* --fault no-lse-rescale                                   */
    dtype compute;                  /* the model's precision (--dtype), set by each call          */
} cp_state;

static void restart_timeline(cp_state *s);
static void context_parallel_free_state(void *state) {
    restart_timeline(state);   /* (the timeline's marks back) */
    free(state);
}
const plan_technique context_parallel_technique = {"context parallel", context_parallel_free_state};
static cp_state *state_of(const llama_plan *p) { return plan_state(p, &context_parallel_technique); }

static const char *method_names[CP_NMETHODS] = {"ring", "allgather", "alltoall"};
static const char *balance_names[CP_NBALANCES] = {"contiguous", "zigzag"};
const char *cp_method_name(cp_method m) { return method_names[m]; }
const char *cp_balance_name(cp_balance b) { return balance_names[b]; }

void cp_chunks_of(cp_balance balance, int r, int C, int chunks[2]) {
    for (int slot = 0; slot < 2; slot++) chunks[slot] = cp_chunk_of(balance == CP_ZIGZAG, r, slot, C);
}

double cp_work_formula(cp_balance balance, int r, int C, int T) {
    double Tc = (double)T / (2 * C), pairs = 0;   /* (query chunk, key chunk) pairs rank r computes */
    /* BEGIN ASSIGNMENT: the attention work: how many (query chunk, key chunk) pairs rank r of C computes under the causal mask, for each balance (the chunks it holds: cp_chunk_of) */
    pairs = balance == CP_ZIGZAG ? 2 * C + 1 : 4 * r + 3;
    /* END ASSIGNMENT */
    return pairs * Tc * Tc;
}

double cp_alltoall_work_formula(int C, int T) {
    int nb = causal_query_blocks(T);
    double squares = 0;   /* sum of s_i^2 over the query blocks of rows s_i */
    for (int i = 0; i < nb; i++) {
        double s = causal_block_row(i + 1, nb, T) - causal_block_row(i, nb, T);
        squares += s * s;
    }
    return ((double)T * T + squares) / (2.0 * C);
}

void cp_working_set_formula(cp_method method, int C, int B, int Tl, int H, int Hkv, int hd,
                            double *forward, double *backward) {
    double Tc = Tl / 2.0, T = (double)C * Tl, K = (double)B * Tl * Hkv * hd, Q = (double)B * Tl * H * hd;
    double pair = Tc * H * hd + H * Tc + H * Tc * Tc;     /* one chunk pair's out, lse and scores */
    switch (method) {
    case CP_RING: *forward = 4 * K + pair; *backward = 8 * K + 2 * H * Tc * Tc; break;
    case CP_ALLGATHER: *forward = 2 * K * (C + 1) + pair; *backward = 4 * K * (C + 1) + 2 * H * Tc * Tc; break;
    default: {   /* the largest causal query block's scores, [H/C, rows, T] */
        double scores = (double)(H / C) * causal_largest_block((int)T) * T;
        *forward = 2 * Q + 2 * K + fmax(2 * Q, scores);
        *backward = 4 * Q + 4 * K + fmax(2 * Q, 2 * scores);
    }
    }
}

/* One attention block call's bf16 operand copies at most, in elements (llama_kernels.h's
 * attention_block_forward_in / backward_in, one sequence of Tq queries of Hq heads against Tk keys
 * of Hk kv heads); c: 1 where the copies are bf16, 0 where P and dS are rounded in place. */
static double block_copies_forward(double Tq, double Tk, double Hq, double Hk, double hd, double c) {
    return Tk * Hk * hd + fmax(Tq * Hq * hd, c * Hq * Tq * Tk);
}
static double block_copies_backward(double Tq, double Tk, double Hq, double Hk, double hd, double c) {
    return 2 * Tq * Hq * hd + Tk * Hk * hd + fmax(Tk * Hk * hd, 2 * c * Hq * Tq * Tk);
}

void cp_working_set_bytes(cp_method method, dtype compute, size_t copy_bytes, int C, int B, int Tl, int H, int Hkv,
                          int hd, double *forward, double *backward) {
    double f, b;
    cp_working_set_formula(method, C, B, Tl, H, Hkv, hd, &f, &b);
    *forward = 4 * f;
    *backward = 4 * b;
    if (compute != DTYPE_BF16) return;
    double Tc = Tl / 2.0, K = (double)B * Tl * Hkv * hd, Q = (double)B * Tl * H * hd, e = (double)copy_bytes;
    double c = copy_bytes == 2 ? 1 : 0;   /* P and dS copied (bf16), or rounded in place (fp32 copies) */
    switch (method) {
    case CP_RING:   /* the blocks at 2 bytes and the one in hand widened: the same bytes as fp32's */
        *forward += e * block_copies_forward(Tc, Tc, H, Hkv, hd, c);
        *backward += e * block_copies_backward(Tc, Tc, H, Hkv, hd, c);
        break;
    case CP_ALLGATHER:   /* the C + 1 blocks (this rank's, every rank's) at 2 bytes, not 4, and the
                          * one in hand widened (2K x 4); the gradients' buffers as fp32's */
        *forward += 8 * K - 4 * K * (C + 1) + e * block_copies_forward(Tc, Tc, H, Hkv, hd, c);
        *backward += 8 * K - 4 * K * (C + 1) + e * block_copies_backward(Tc, Tc, H, Hkv, hd, c);
        break;
    default: {   /* the largest causal block's scores and its copies, against the all-to-all's buffers */
        double T = (double)C * Tl, rows = causal_largest_block((int)T), Hg = H / C, Hkvg = Hkv / C;
        double scores = Hg * rows * T;
        *forward = 4 * (2 * Q + 2 * K) + fmax(8 * Q, 4 * scores + e * block_copies_forward(rows, T, Hg, Hkvg, hd, c));
        *backward = 4 * (4 * Q + 4 * K) + fmax(8 * Q, 8 * scores + e * block_copies_backward(rows, T, Hg, Hkvg, hd, c));
    }
    }
}

/* The RoPE positions of this rank's Tl = T / C rows: its two chunks' positions, in order. */
static void cp_positions(void *state, const llama_plan *p, int *positions, int Tl) {
    const cp_state *s = state;
    int Tc = Tl / 2;
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < Tc; t++) positions[i * Tc + t] = s->chunks[i] * Tc + t;
}

/* ---- one K/V block against this rank's queries -----------------------------------------------
 * A K/V block is one rank's rows of k and v, packed as kv [2][B][Tl][Hkv][hd] (k, then v); the
 * rank that owns it holds chunks `kchunks`. Each of the B sequences and each pair (query chunk i
 * of this rank, key chunk j of the block) is one call of the block kernels on [Tc] rows at their
 * global offsets (the causal mask needs them); a pair whose keys all come after its queries is
 * skipped. Query pieces: q[b, i*Tc .. (i+1)*Tc) of [B, Tl, H, hd]; their running lse in
 * lse[B][2][H][Tc]. */
typedef struct { int B, Tl, Tc, H, Hkv, hd; } cp_shape;

static size_t q_piece(const cp_shape *z, int b, int i) { return ((size_t)b * z->Tl + (size_t)i * z->Tc) * z->H * z->hd; }
static size_t k_piece(const cp_shape *z, int b, int j) { return ((size_t)b * z->Tl + (size_t)j * z->Tc) * z->Hkv * z->hd; }
static size_t lse_piece(const cp_shape *z, int b, int i) { return ((size_t)b * 2 + i) * z->H * z->Tc; }
static size_t kv_floats(const cp_shape *z) { return (size_t)z->B * z->Tl * z->Hkv * z->hd; }
static bool pair_visible(int qchunk, int kchunk) { return kchunk <= qchunk; }

/* Forward of this rank's queries against one block, merged into (out, lse). `exchange`: the ring's
 * transfer in flight (or NULL), given a chance to move between the pieces (comm_progress: an
 * MPI_Test, not counted as traffic; nothing on NCCL, whose stream moves it): on the CPU, Open MPI
 * moves a message's bytes only inside MPI calls (comm_progress), so without these calls the
 * transfer would wait for ring_wait, after the compute it was meant to hide behind. */
static void block_forward(cp_state *s, const cp_shape *z, float *out, float *lse, const float *q,
                          const float *kv, const int kchunks[2], comm_request *exchange) {
    const float *k = kv, *v = kv + kv_floats(z);
    float *out_b = device_alloc_floats((size_t)z->Tc * z->H * z->hd, MEM_BUFFERS);
    float *lse_b = device_alloc_floats((size_t)z->H * z->Tc, MEM_BUFFERS);
    for (int b = 0; b < z->B; b++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) {
                if (!pair_visible(s->chunks[i], kchunks[j])) continue;
                attention_block_forward_in(s->compute, out_b, lse_b, q + q_piece(z, b, i), k + k_piece(z, b, j),
                                           v + k_piece(z, b, j), 1, z->Tc, z->Tc, z->H, z->Hkv, z->hd,
                                           s->chunks[i] * z->Tc, kchunks[j] * z->Tc);
                if (s->no_lse_rescale) {   /* lse merged right, the outputs simply added */
                    size_t piece = (size_t)z->Tc * z->H * z->hd;
                    float *kept = device_alloc_floats(piece, MEM_BUFFERS);
                    device_copy(kept, out + q_piece(z, b, i), piece * sizeof(float));
                    /* BEGIN SOLUTION: the merge is exercise 1's answer (a student copy's fault leaves lse unmerged too) */
                    attention_merge(out + q_piece(z, b, i), lse + lse_piece(z, b, i), out_b, lse_b, 1, z->Tc, z->H, z->hd);
                    /* END SOLUTION */
                    device_copy(out + q_piece(z, b, i), kept, piece * sizeof(float));
                    add_inplace(out + q_piece(z, b, i), out_b, piece);
                    device_free(kept);
                } else {
                    /* BEGIN ASSIGNMENT: merge the block's (out_b, lse_b) into the running result of query piece (b, i) by log-sum-exp (attention_merge) */
                    attention_merge(out + q_piece(z, b, i), lse + lse_piece(z, b, i), out_b, lse_b, 1, z->Tc, z->H, z->hd);
                    /* END ASSIGNMENT */
                }
                if (b == 0) s->work += (double)z->Tc * z->Tc;
                if (exchange) comm_progress(exchange);
            }
    device_free(out_b);
    device_free(lse_b);
}

/* Backward of this rank's queries against one block: dq (+=), and the block's dkv (+=); `exchange`
 * as in block_forward. */
static void block_backward(cp_state *s, const cp_shape *z, float *dq, float *dkv, const float *dout,
                           const float *out, const float *lse, const float *q, const float *kv,
                           const int kchunks[2], comm_request *exchange) {
    const float *k = kv, *v = kv + kv_floats(z);
    float *dk = dkv, *dv = dkv + kv_floats(z);
    for (int b = 0; b < z->B; b++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) {
                if (!pair_visible(s->chunks[i], kchunks[j])) continue;
                attention_block_backward_in(s->compute, dq + q_piece(z, b, i), dk + k_piece(z, b, j),
                                            dv + k_piece(z, b, j), dout + q_piece(z, b, i), out + q_piece(z, b, i),
                                            lse + lse_piece(z, b, i), q + q_piece(z, b, i), k + k_piece(z, b, j),
                                            v + k_piece(z, b, j), 1, z->Tc, z->Tc, z->H, z->Hkv, z->hd,
                                            s->chunks[i] * z->Tc, kchunks[j] * z->Tc);
                if (exchange) comm_progress(exchange);
            }
}

static void owner_chunks(const cp_state *s, int owner, int chunks[2]) { cp_chunks_of(s->o.balance, owner, s->C, chunks); }

/* The type K/V blocks travel in: bf16 under --dtype bf16, where every reader of k and v is a
 * product that rounds them to bf16 anyway (attention_block_forward_in): the same values, half the
 * bytes. Their gradients are sums and travel in fp32. */
static dtype kv_wire(const cp_state *s) { return s->compute == DTYPE_BF16 ? DTYPE_BF16 : DTYPE_F32; }

/* This rank's k and v packed into one block [2][B][Tl][Hkv][hd] of type t. */
static void *pack_kv(const cp_shape *z, const float *k, const float *v, dtype t) {
    size_t n = kv_floats(z);
    void *kv = device_alloc_elems(2 * n, t, MEM_BUFFERS);
    if (t == DTYPE_BF16) {
        cast_to_bf16(kv, k, n);
        cast_to_bf16(dtype_at(kv, t, n), v, n);
    } else {
        device_copy(kv, k, n * sizeof(float));
        device_copy(dtype_at(kv, t, n), v, n * sizeof(float));
    }
    return kv;
}
/* A block of type t as the fp32 the attention functions read: itself, or widened into `widened`
 * (exact: bf16 values in fp32). */
static const float *block_in_hand(const void *kv, dtype t, float *widened, size_t n) {
    if (t != DTYPE_BF16) return kv;
    cast_from_bf16(widened, kv, n);
    return widened;
}

/* ---- ring and all-gather: the K/V blocks come to the queries --------------------------------
 * q [B, Tl, H, hd], k, v [B, Tl, Hkv, hd] (this rank's rows) -> out [B, Tl, H, hd]; saved: the
 * final lse [B][2][H][Tc] (B H Tl floats). */

/* A moment of the ring's timeline: a mark of the compute stream (device.h), read when the
 * timeline is (on the GPU the host queues the ring's work without waiting for it). */
static device_mark stamp(const cp_state *s) {
    return s->record ? device_mark_now() : (device_mark){0, NULL};
}
static void record(cp_state *s, int step, bool wait, device_mark m0, device_mark m1) {
    if (s->record && s->n_events < 2 * CP_MAX_RANKS) {
        s->events[s->n_events++] = (cp_event){step, (s->r - step + s->C) % s->C, wait, 0, 0, m0, m1};
        return;
    }
    device_mark_release(&m0);
    device_mark_release(&m1);
}
/* A new ring forward's timeline: the last one's marks go back. */
static void restart_timeline(cp_state *s) {
    for (int i = 0; i < s->n_events; i++) {
        device_mark_release(&s->events[i].m0);
        device_mark_release(&s->events[i].m1);
    }
    s->n_events = 0;
}

/* Ring step t's compute: this rank's queries against the block in hand, which rank r - t owns,
 * moving the exchange in flight (`exchange`: the next block's; none at the last step) between
 * the pieces. */
static void ring_compute_step(cp_state *s, const cp_shape *z, float *out, float *lse, const float *q,
                              const float *kv, int t, comm_request *exchange) {
    int chunks[2];
    device_mark t0 = stamp(s);
    owner_chunks(s, (s->r - t + s->C) % s->C, chunks);
    block_forward(s, z, out, lse, q, kv, chunks, exchange);
    record(s, t, false, t0, stamp(s));
}
/* Ring step t's end: wait for the next block (what the compute did not hide). */
static void ring_wait(cp_state *s, comm_request *req, int t) {
    device_mark t0 = stamp(s);
    comm_wait(req);
    record(s, t, true, t0, stamp(s));
}

static void kv_forward(cp_state *s, const cp_shape *z, float *out, float *lse, const float *q,
                       const float *k, const float *v) {
    dtype w = kv_wire(s);
    void *kv = pack_kv(z, k, v, w);
    size_t n = 2 * kv_floats(z);
    int next = (s->r + 1) % s->C, prev = (s->r + s->C - 1) % s->C, chunks[2];
    /* (bf16: the block in hand widened to fp32 for the attention functions) */
    float *widened = w == DTYPE_BF16 ? device_alloc_floats(n, MEM_BUFFERS) : NULL;
    if (s->o.method == CP_RING) {
        /* step t: the block of rank r - t is in hand; send it on while computing on it */
        void *incoming = device_alloc_elems(n, w, MEM_BUFFERS);
        restart_timeline(s);
        for (int t = 0; t < s->C; t++) {
            /* BEGIN ASSIGNMENT: ring step t: post the exchange in the blocks' type w (kv to next, incoming from prev) unless this is the last step, compute on the block in hand as fp32 (ring_compute_step on block_in_hand, which moves the exchange along), then wait (ring_wait) and swap kv and incoming */
            comm_request req = {0};
            if (t < s->C - 1) req = comm_isendrecv_typed(s->cp, w, kv, n, next, incoming, n, prev);
            ring_compute_step(s, z, out, lse, q, block_in_hand(kv, w, widened, n), t, &req);
            if (t < s->C - 1) {
                ring_wait(s, &req, t);
                void *x = kv; kv = incoming; incoming = x;
            }
            /* END ASSIGNMENT */
        }
        device_free(incoming);
    } else {
        /* every rank's block at once: [C][2][B][Tl][Hkv][hd] */
        void *all = device_alloc_elems(n * s->C, w, MEM_BUFFERS);
        comm_all_gather_typed(s->cp, w, kv, all, n);
        for (int j = 0; j < s->C; j++) {
            owner_chunks(s, j, chunks);
            block_forward(s, z, out, lse, q, block_in_hand(dtype_at(all, w, (size_t)j * n), w, widened, n), chunks,
                          NULL);
        }
        device_free(all);
    }
    if (widened) device_free(widened);
    device_free(kv);
}

/* dout [B, Tl, H, hd] -> dq [B, Tl, H, hd], dk, dv [B, Tl, Hkv, hd] (=), from the saved lse. */
static void kv_backward(cp_state *s, const cp_shape *z, float *dq, float *dk, float *dv, const float *dout,
                        const float *out, const float *q, const float *k, const float *v, const float *lse) {
    size_t n = 2 * kv_floats(z);
    device_zero(dq, (size_t)z->B * z->Tl * z->H * z->hd * sizeof(float));
    dtype w = kv_wire(s);
    void *kv = pack_kv(z, k, v, w);
    float *dkv = device_alloc_floats(n, MEM_BUFFERS);
    device_zero(dkv, n * sizeof(float));
    float *widened = w == DTYPE_BF16 ? device_alloc_floats(n, MEM_BUFFERS) : NULL;
    int next = (s->r + 1) % s->C, prev = (s->r + s->C - 1) % s->C, chunks[2];
    if (s->o.method == CP_RING) {
        /* BEGIN ASSIGNMENT: exercise 2b, the ring's backward: C steps; at step t the block of rank r - t is in hand; dq stays home, the block's gradient dkv travels with it and ends at its owner (README: Backward) */
        /* step t: the block of rank r - t and its gradient so far are in hand; the block moves on
         * while this rank adds its share, then the gradient follows it. After C steps the last
         * send brings every block's whole gradient home. */
        void *incoming = device_alloc(n * dtype_size(w), MEM_BUFFERS);   /* the next block, as kv */
        float *dkv_in = device_alloc_floats(n, MEM_BUFFERS);
        for (int t = 0; t < s->C; t++) {
            comm_request req = {0};
            if (t < s->C - 1) req = comm_isendrecv_typed(s->cp, w, kv, n, next, incoming, n, prev);
            owner_chunks(s, (s->r - t + s->C) % s->C, chunks);
            block_backward(s, z, dq, dkv, dout, out, lse, q, block_in_hand(kv, w, widened, n), chunks, &req);
            if (s->C > 1) {   /* (on one rank the block and its gradient never leave) */
                comm_sendrecv(s->cp, dkv, n, next, dkv_in, n, prev);
                float *x = dkv; dkv = dkv_in; dkv_in = x;
            }
            if (t < s->C - 1) {
                comm_wait(&req);
                void *x = kv; kv = incoming; incoming = x;
            }
        }
        device_free(incoming);
        device_free(dkv_in);
        /* END ASSIGNMENT */
    } else {
        void *all = device_alloc_elems(n * s->C, w, MEM_BUFFERS);
        float *dall = device_alloc_floats(n * s->C, MEM_BUFFERS);
        comm_all_gather_typed(s->cp, w, kv, all, n);
        device_zero(dall, n * s->C * sizeof(float));
        for (int j = 0; j < s->C; j++) {
            owner_chunks(s, j, chunks);
            block_backward(s, z, dq, dall + (size_t)j * n, dout, out, lse, q,
                           block_in_hand(dtype_at(all, w, (size_t)j * n), w, widened, n), chunks, NULL);
        }
        comm_reduce_scatter(s->cp, dall, dkv, n);   /* every rank's share of my block's gradient */
        device_free(all);
        device_free(dall);
    }
    device_copy(dk, dkv, kv_floats(z) * sizeof(float));
    device_copy(dv, dkv + kv_floats(z), kv_floats(z) * sizeof(float));
    if (widened) device_free(widened);
    device_free(kv);
    device_free(dkv);
}

/* ---- all-to-all (DeepSpeed-Ulysses): the heads go to the rows ---------------------------------
 * Two all-to-alls turn this rank's rows of every head into every row of H / C heads (and back):
 * then attention is the ordinary causal attention of whole sequences, on fewer heads. The heads
 * (and the kv heads) must divide by C; a query head's kv head stays on the same rank, since rank
 * j gets query heads [j H/C, (j+1) H/C) and kv heads [j Hkv/C, (j+1) Hkv/C). */
static ulysses_shape ulysses_of(const cp_state *s, int B, int Tl, int heads, int hd) {
    return (ulysses_shape){s->C, B, Tl, heads / s->C, hd, s->o.balance == CP_ZIGZAG};
}

/* x [B, Tl, heads, hd] (this rank's rows, every head) -> y [B, T, heads / C, hd] (every row in
 * sequence order, this rank's heads). Issues: one all-to-all of B Tl heads hd floats. */
static void rows_to_heads(cp_state *s, float *y, const float *x, ulysses_shape u) {
    size_t n = (size_t)u.C * u.B * u.Tl * u.Hg * u.hd;
    float *send = device_alloc_floats(n, MEM_BUFFERS), *recv = device_alloc_floats(n, MEM_BUFFERS);
    /* BEGIN ASSIGNMENT: Ulysses' first all-to-all: x's heads into rank-major chunks (ulysses_heads_to_chunks), one all-to-all over cp, then the received rows into sequence order in y (ulysses_rank_rows_to_sequence) */
    ulysses_heads_to_chunks(send, x, u);
    comm_all_to_all(s->cp, send, recv, n / u.C);
    ulysses_rank_rows_to_sequence(y, recv, u);
    /* END ASSIGNMENT */
    device_free(send);
    device_free(recv);
}
/* The way back: y [B, T, heads / C, hd] -> x [B, Tl, heads, hd]. Issues: one all-to-all. */
static void heads_to_rows(cp_state *s, float *x, const float *y, ulysses_shape u) {
    size_t n = (size_t)u.C * u.B * u.Tl * u.Hg * u.hd;
    float *send = device_alloc_floats(n, MEM_BUFFERS), *recv = device_alloc_floats(n, MEM_BUFFERS);
    /* BEGIN ASSIGNMENT: exercise 3b, the way back: y's rows into rank-major chunks (ulysses_sequence_to_rank_rows), one all-to-all over cp, then the chunks back into x's heads (ulysses_chunks_to_heads) */
    ulysses_sequence_to_rank_rows(send, y, u);
    comm_all_to_all(s->cp, send, recv, n / u.C);
    ulysses_chunks_to_heads(x, recv, u);
    /* END ASSIGNMENT */
    device_free(send);
    device_free(recv);
}

/* rows_to_heads for a tensor whose every reader on the heads' side is a product that rounds it to
 * bf16 (q, k and v under --dtype bf16: attention_lse_forward/backward's compute): the chunks
 * travel as bf16, the same values at half the bytes; the scratch is rows_to_heads' own (the bf16
 * chunks in the two buffers' first halves). */
static void rows_to_heads_bf16(cp_state *s, float *y, const float *x, ulysses_shape u) {
    size_t n = (size_t)u.C * u.B * u.Tl * u.Hg * u.hd;
    float *chunks = device_alloc_floats(n, MEM_BUFFERS), *received = device_alloc_floats(n, MEM_BUFFERS);
    uint16_t *send = (uint16_t *)received, *recv = (uint16_t *)chunks;
    ulysses_heads_to_chunks(chunks, x, u);
    cast_to_bf16(send, chunks, n);
    comm_all_to_all_typed(s->cp, DTYPE_BF16, send, recv, n / u.C);
    cast_from_bf16(received, recv, n);
    ulysses_rank_rows_to_sequence(y, received, u);
    device_free(chunks);
    device_free(received);
}
/* q, k or v to the heads: in bf16 where the attention rounds them anyway */
static void operand_to_heads(cp_state *s, float *y, const float *x, ulysses_shape u) {
    if (s->compute == DTYPE_BF16) rows_to_heads_bf16(s, y, x, u);
    else rows_to_heads(s, y, x, u);
}

/* Forward: q, k, v to heads (3 all-to-alls), attention over whole sequences, out back (1);
 * saved: lse, B (H/C) T floats (B H Tl, the same count as the ring's), in attention_lse_forward's
 * layout. The whole sequence is here, so the attention is the single device's, causal query
 * blocks included: each block of queries against the keys it sees, the masked part beyond the
 * blocks' diagonal never computed: each rank computes 1 / C of what one device computes alone,
 * (T^2 + T^2 / nb) / 2C scores per head (cp_alltoall_work_formula), where every score of the
 * T x T matrix would be T^2 / C. */
static void ulysses_forward(cp_state *s, const cp_shape *z, float *out, float *lse, const float *q,
                            const float *k, const float *v) {
    int T = z->Tl * s->C;
    ulysses_shape uq = ulysses_of(s, z->B, z->Tl, z->H, z->hd), ukv = ulysses_of(s, z->B, z->Tl, z->Hkv, z->hd);
    size_t nq = (size_t)z->B * z->Tl * z->H * z->hd, nkv = kv_floats(z);
    float *qh = device_alloc_floats(nq, MEM_BUFFERS), *kh = device_alloc_floats(nkv, MEM_BUFFERS);
    float *vh = device_alloc_floats(nkv, MEM_BUFFERS), *outh = device_alloc_floats(nq, MEM_BUFFERS);
    operand_to_heads(s, qh, q, uq);
    operand_to_heads(s, kh, k, ukv);
    operand_to_heads(s, vh, v, ukv);
    double scores = attention_lse_forward(s->compute, outh, lse, qh, kh, vh, z->B, T, uq.Hg, ukv.Hg, z->hd);
    s->work += scores * uq.Hg / z->H;   /* the scores of Hg of the H heads, per (sequence, head) */
    heads_to_rows(s, out, outh, uq);
    device_free(qh); device_free(kh); device_free(vh); device_free(outh);
}

/* Backward: q, k, v, out and dout to heads (5 all-to-alls: the model saved them by rows),
 * the attention backward of whole sequences, dq, dk, dv back (3). */
static void ulysses_backward(cp_state *s, const cp_shape *z, float *dq, float *dk, float *dv, const float *dout,
                             const float *out, const float *q, const float *k, const float *v, const float *lse) {
    int T = z->Tl * s->C;
    ulysses_shape uq = ulysses_of(s, z->B, z->Tl, z->H, z->hd), ukv = ulysses_of(s, z->B, z->Tl, z->Hkv, z->hd);
    size_t nq = (size_t)z->B * z->Tl * z->H * z->hd, nkv = kv_floats(z);
    float *qh = device_alloc_floats(nq, MEM_BUFFERS), *outh = device_alloc_floats(nq, MEM_BUFFERS);
    float *douth = device_alloc_floats(nq, MEM_BUFFERS), *dqh = device_alloc_floats(nq, MEM_BUFFERS);
    float *kh = device_alloc_floats(nkv, MEM_BUFFERS), *vh = device_alloc_floats(nkv, MEM_BUFFERS);
    float *dkh = device_alloc_floats(nkv, MEM_BUFFERS), *dvh = device_alloc_floats(nkv, MEM_BUFFERS);
    operand_to_heads(s, qh, q, uq);
    operand_to_heads(s, kh, k, ukv);
    operand_to_heads(s, vh, v, ukv);
    rows_to_heads(s, outh, out, uq);   /* out and dout in fp32: D = dout . out reads them unrounded */
    rows_to_heads(s, douth, dout, uq);
    device_zero(dqh, nq * sizeof(float));
    device_zero(dkh, nkv * sizeof(float));
    device_zero(dvh, nkv * sizeof(float));
    attention_lse_backward(s->compute, dqh, dkh, dvh, douth, outh, lse, qh, kh, vh, z->B, T, uq.Hg, ukv.Hg, z->hd);
    heads_to_rows(s, dq, dqh, uq);
    heads_to_rows(s, dk, dkh, ukv);
    heads_to_rows(s, dv, dvh, ukv);
    float *bufs[] = {qh, outh, douth, dqh, kh, vh, dkh, dvh};
    for (int i = 0; i < 8; i++) device_free(bufs[i]);
}

/* ---- the attention operator: the method's, with its scratch measured ------------------------- */
static void cp_attention_forward(void *state, const llama_plan *p, dtype compute, float *out, float *probs,
                                 const float *q, const float *k, const float *v, int B, int Tl, int H, int Hkv,
                                 int hd) {
    cp_state *s = state;
    s->compute = compute;
    cp_shape z = {B, Tl, Tl / 2, H, Hkv, hd};
    size_t base = mem_mark(MEM_BUFFERS);
    s->work = 0;
    if (s->o.method == CP_ALLTOALL) {
        ulysses_forward(s, &z, out, probs, q, k, v);
    } else {
        device_zero(out, (size_t)B * Tl * H * hd * sizeof(float));
        init_constant_device(probs, (size_t)B * H * Tl, -INFINITY);   /* lse: no key seen yet */
        kv_forward(s, &z, out, probs, q, k, v);
    }
    s->forward_set = mem_mark_peak(MEM_BUFFERS) - base;
}

static void cp_attention_backward(void *state, const llama_plan *p, dtype compute, float *dq, float *dk, float *dv,
                                  float *dprobs, const float *dout, const float *out, const float *q, const float *k,
                                  const float *v, const float *probs, int B, int Tl, int H, int Hkv, int hd) {
    cp_state *s = state;
    s->compute = compute;
    cp_shape z = {B, Tl, Tl / 2, H, Hkv, hd};
    size_t base = mem_mark(MEM_BUFFERS);
    if (s->o.method == CP_ALLTOALL) ulysses_backward(s, &z, dq, dk, dv, dout, out, q, k, v, probs);
    else kv_backward(s, &z, dq, dk, dv, dout, out, q, k, v, probs);
    s->backward_set = mem_mark_peak(MEM_BUFFERS) - base;
}

/* Saved per layer: the log-sum-exp of every (sequence, head, row), B H Tl floats, whatever the
 * method (the single-device operator keeps the softmax, B H T^2). */
static size_t cp_saved_numel(void *state, const llama_plan *p, int B, int Tl, int H) { return (size_t)B * H * Tl; }

/* The parameters are replicated over cp and each rank's gradient is its rows' share: their sum,
 * one all-reduce of the gradient block over cp (the whole tensors, or under FSDP the dp shard
 * this rank keeps, the same shard on every cp rank), after what the inner plan owes. Unless a
 * technique applied later declares that its reduction already sums over cp
 * (groups.grads_summed_dims: chapter 08's FSDP over dp_shard x cp, whose reduce-scatter left
 * each cp rank a different shard, summed). */
static void cp_reduce_grads(void *state, const llama_plan *p, llama_model *m) {
    cp_state *s = state;
    if (s->below_reduce.reduce) s->below_reduce.reduce(s->below_reduce.state, p, m);
    if (s->C > 1 && !(p->groups.grads_summed_dims & MESH_BIT(MESH_CP)))
        comm_all_reduce(s->cp, m->params->grads, param_block_numel(m->params, m->params->grads), COMM_SUM);
}

/* ---- the --check baseline's attention under --dtype bf16 -------------------------------------
 * In bf16 the blocks round what the whole-sequence kernel does not: each block's own softmax P
 * (normalised over the keys it holds) before P v, and D = dout . out in the backward
 * (docs/design.md, "Parity in bf16"). Those are differences of a bf16 ulp, which a router's top-k
 * turns into whole choices (chapter 09). So under bf16 the baseline computes attention as the
 * ranks do, on one device: ring and all-gather, every sequence in the same 2C chunks, query chunk
 * a against key chunks b <= a, each pair one block call, merged by lse; all-to-all, the causal
 * query blocks of attention_lse; each query chunk's blocks merged in its rank's order, so that
 * lse, from which the backward recomputes P, is the ranks' bit for bit. Only the grouping follows
 * the layout, as chapter 07's baseline cuts its contractions (docs/design.md, "Parity"); in fp32
 * the two differ by reordering alone and the baseline keeps the whole-sequence kernel. Saved:
 * lse, B H T floats. */
typedef struct { cp_options o; int C; } cp_baseline_state;
static void cp_baseline_free_state(void *state) { free(state); }
static const plan_technique cp_baseline_technique = {"context parallel's blocks", cp_baseline_free_state};

/* Every (query chunk, key chunk) pair the ranks compute, in each rank's order: rank r's query
 * chunks against the key chunks of owner r - t at step t (ring) or of owner t (all-gather), so that
 * each query chunk's blocks are merged in its rank's order (the same lse, bit for bit, from which
 * the backward recomputes P). visit(state, sequence b, query chunk a, key chunk c). */
typedef void (*chunk_pair_fn)(void *arg, int b, int a, int c);
static void for_each_chunk_pair(const cp_baseline_state *s, int B, chunk_pair_fn visit, void *arg) {
    for (int r = 0; r < s->C; r++) {
        int mine[2], theirs[2];
        cp_chunks_of(s->o.balance, r, s->C, mine);
        for (int t = 0; t < s->C; t++) {
            cp_chunks_of(s->o.balance, s->o.method == CP_RING ? (r - t + s->C) % s->C : t, s->C, theirs);
            for (int b = 0; b < B; b++)
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < 2; j++)
                        if (pair_visible(mine[i], theirs[j])) visit(arg, b, mine[i], theirs[j]);
        }
    }
}

/* One pair's call, forward or backward, on the whole sequence's tensors */
typedef struct {
    dtype compute;
    int T, Tc, n, H, Hkv, hd;
    float *out, *lse, *out_b, *lse_b;           /* forward: written (=, merged) */
    float *dq, *dk, *dv;                        /* backward: accumulated (+=)   */
    const float *q, *k, *v, *dout, *out_read, *lse_read;   /* backward: the forward's out and lse */
} chunk_pass;
/* Pair (b, a, c)'s offsets: query chunk a's rows in q, out [B, T, H, hd], key chunk c's in k, v
 * [B, T, Hkv, hd], and query chunk a's lse in [B][2C chunks][H][Tc]. */
typedef struct { size_t q, k, lse; } pair_at;
static pair_at pair_offsets(const chunk_pass *x, int b, int a, int c) {
    return (pair_at){((size_t)b * x->T + (size_t)a * x->Tc) * x->H * x->hd,
                     ((size_t)b * x->T + (size_t)c * x->Tc) * x->Hkv * x->hd, ((size_t)b * x->n + a) * x->H * x->Tc};
}
static void pair_forward(void *arg, int b, int a, int c) {
    chunk_pass *x = arg;
    pair_at o = pair_offsets(x, b, a, c);
    attention_block_forward_in(x->compute, x->out_b, x->lse_b, x->q + o.q, x->k + o.k, x->v + o.k, 1, x->Tc, x->Tc,
                               x->H, x->Hkv, x->hd, a * x->Tc, c * x->Tc);
    attention_merge(x->out + o.q, x->lse + o.lse, x->out_b, x->lse_b, 1, x->Tc, x->H, x->hd);
}
static void pair_backward(void *arg, int b, int a, int c) {
    chunk_pass *x = arg;
    pair_at o = pair_offsets(x, b, a, c);
    attention_block_backward_in(x->compute, x->dq + o.q, x->dk + o.k, x->dv + o.k, x->dout + o.q, x->out_read + o.q,
                                x->lse_read + o.lse, x->q + o.q, x->k + o.k, x->v + o.k, 1, x->Tc, x->Tc, x->H, x->Hkv,
                                x->hd, a * x->Tc, c * x->Tc);
}

static void baseline_forward(void *state, const llama_plan *p, dtype compute, float *out, float *lse,
                             const float *q, const float *k, const float *v, int B, int T, int H, int Hkv, int hd) {
    const cp_baseline_state *s = state;
    if (s->o.method == CP_ALLTOALL) {
        attention_lse_forward(compute, out, lse, q, k, v, B, T, H, Hkv, hd);
        return;
    }
    int n = 2 * s->C, Tc = T / n;
    device_zero(out, (size_t)B * T * H * hd * sizeof(float));
    init_constant_device(lse, (size_t)B * H * T, -INFINITY);
    chunk_pass x = {.compute = compute, .T = T, .Tc = Tc, .n = n, .H = H, .Hkv = Hkv, .hd = hd, .out = out, .lse = lse,
                    .out_b = device_alloc_floats((size_t)Tc * H * hd, MEM_BUFFERS),
                    .lse_b = device_alloc_floats((size_t)H * Tc, MEM_BUFFERS), .q = q, .k = k, .v = v};
    for_each_chunk_pair(s, B, pair_forward, &x);
    device_free(x.out_b);
    device_free(x.lse_b);
}
static void baseline_backward(void *state, const llama_plan *p, dtype compute, float *dq, float *dk, float *dv,
                              float *dprobs, const float *dout, const float *out, const float *q, const float *k,
                              const float *v, const float *lse, int B, int T, int H, int Hkv, int hd) {
    const cp_baseline_state *s = state;
    device_zero(dq, (size_t)B * T * H * hd * sizeof(float));
    device_zero(dk, (size_t)B * T * Hkv * hd * sizeof(float));
    device_zero(dv, (size_t)B * T * Hkv * hd * sizeof(float));
    if (s->o.method == CP_ALLTOALL) {
        attention_lse_backward(compute, dq, dk, dv, dout, out, lse, q, k, v, B, T, H, Hkv, hd);
        return;
    }
    int n = 2 * s->C;
    chunk_pass x = {.compute = compute, .T = T, .Tc = T / n, .n = n, .H = H, .Hkv = Hkv, .hd = hd, .dq = dq, .dk = dk,
                    .dv = dv, .q = q, .k = k, .v = v, .dout = dout, .out_read = out, .lse_read = lse};
    for_each_chunk_pair(s, B, pair_backward, &x);
}
static size_t baseline_saved_numel(void *state, const llama_plan *p, int B, int T, int H) { return (size_t)B * H * T; }

bool context_parallel_baseline(llama_plan *baseline, dtype precision, const cp_options *o, int cp) {
    if (cp < 1 || precision != DTYPE_BF16) return false;
    cp_baseline_state *s = plan_push(baseline, &cp_baseline_technique, calloc(1, sizeof(cp_baseline_state)), 0);
    s->o = *o;
    s->C = cp;
    baseline->attention = (attention_ops){s, baseline_forward, baseline_backward, baseline_saved_numel};
    return true;
}

/* ---- validation and set-up ------------------------------------------------------------------- */

void context_parallel_validate(int cp) {
    /* (the sequence in 2 cp chunks, and all-to-all's whole heads: mesh_check's rules) */
    if (cp > CP_MAX_RANKS)
        comm_exit_usage("--cp %d is more than this chapter's %d ranks per ring", cp, CP_MAX_RANKS);
}

void context_parallel_apply(llama_plan *plan, device_mesh *mesh, const llama_config *c, const cp_options *o) {
    cp_state *s = plan_push(plan, &context_parallel_technique, calloc(1, sizeof(cp_state)), 0);
    s->o = *o;
    s->cp = mesh->group[MESH_CP];
    s->C = s->cp->size;
    s->r = s->cp->rank;
    cp_chunks_of(o->balance, s->r, s->C, s->chunks);
    plan->groups.mesh = mesh;
    plan->groups.cp = s->cp;
    plan->sequence.state = s;
    plan->sequence.positions = cp_positions;
    plan->attention = (attention_ops){s, cp_attention_forward, cp_attention_backward, cp_saved_numel};
    plan_wrap(plan->reduce_grads, s->below_reduce, ((grad_reduce_ops){s, cp_reduce_grads}));
    /* --dump: under bf16 the blocks' roundings are the run's (docs/dump-format.md): ring and
     * all-gather 2C chunk blocks (two on one rank); all-to-all one (FlashAttention's backward) */
    if (c->precision == DTYPE_BF16) dump_set_attention_blocks(o->method == CP_ALLTOALL ? 1 : 2 * s->C);
}

double context_parallel_work(const llama_plan *plan) { return state_of(plan)->work; }

void context_parallel_working_sets(const llama_plan *plan, size_t *forward, size_t *backward) {
    *forward = state_of(plan)->forward_set;
    *backward = state_of(plan)->backward_set;
}

void context_parallel_record_timeline(llama_plan *plan, bool on) { state_of(plan)->record = on; }
int context_parallel_timeline(const llama_plan *plan, const cp_event **events) {
    cp_state *s = state_of(plan);
    for (int i = 0; i < s->n_events; i++) {
        s->events[i].t0 = device_mark_seconds(&s->events[i].m0);
        s->events[i].t1 = device_mark_seconds(&s->events[i].m1);
    }
    *events = s->events;
    return s->n_events;
}

/* ---- the deliberate bug ---------------------------------------------------------------------- */

static const char *no_lse_rescale(llama_plan *p) {
    if (state_of(p)->o.method == CP_ALLTOALL)
        return "it breaks the merge of key blocks, and --cp-method alltoall merges none (it "
               "attends to whole sequences): use --cp-method ring or allgather";
    state_of(p)->no_lse_rescale = true;
    return NULL;
}

const plan_fault context_parallel_faults[] = {
    {"no-lse-rescale", "each key block's partial attention is added to the running output as it is, "
     "without rescaling both by their log-sum-exp (the log-sum-exp itself is merged right)", no_lse_rescale},
    {NULL, NULL, NULL}};

/* ---- the mesh's rules (context_parallel.h) ---- */

static const char *cp_divides_sequence(const mesh_rule *r, const mesh_view *v, char *why, size_t len) {
    long long seq = r->size[0];
    int C = v->s.cp, T = v->s.tp;
    if (C == 1 || seq % (2 * C) == 0) return NULL;
    long long step = mesh_lcm(2 * C, r->option ? (long long)C * T : 1);
    char valid[96];
    return mesh_refuse(why, len, "%s %lld cannot be split over %s: each cp rank holds 2 chunks of seq_len / (2 x cp) "
                       "rows; %s", mesh_size_name(v, "--seq-len", "seq_len"), seq, v->degree[MESH_CP],
                       mesh_nearest(valid, sizeof valid, "length", seq, step));
}

static const char *cp_divides_heads(const mesh_rule *r, const mesh_view *v, char *why, size_t len) {
    long long heads = r->size[0], kv_heads = r->size[1];
    int C = v->s.cp, T = v->s.tp;
    if ((heads / T) % C == 0 && (kv_heads / T) % C == 0) return NULL;
    return mesh_refuse(why, len, "%s deals whole heads out to the %s ranks, but a tp rank holds %lld heads and %lld kv "
                       "heads (%s %lld, %s %lld over %s): both must divide by %d",
                       v->plan ? "all-to-all attention" : "--cp-method alltoall", v->degree[MESH_CP], heads / T,
                       kv_heads / T, mesh_size_name(v, "--n-heads", "n_heads"), heads,
                       mesh_size_name(v, "--n-kv-heads", "n_kv_heads"), kv_heads, v->degree[MESH_TP], C);
}

mesh_rule cp_sequence_rule(int seq_len, bool sequence_parallel) {
    return (mesh_rule){.check = cp_divides_sequence, .size = {seq_len}, .option = sequence_parallel};
}

mesh_rule cp_heads_rule(const llama_config *c) {
    return (mesh_rule){.check = cp_divides_heads, .size = {c->n_heads, c->n_kv_heads}};
}
