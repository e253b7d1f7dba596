/* ranks: 1 2 4 */
/* test_seq_layout.c: the sequence re-layout of seq_layout.h, alone and around the collectives
 * the way chapter 03 uses it:
 *   - seq_chunks_to_sequence puts element (r, b, t, c) of [p][B][Ts][C] at (b, r*Ts + t, c);
 *     seq_sequence_to_chunks is its inverse (for several shapes, B = 1 included);
 *   - the all-gather and the reduce-scatter along the sequence, chapter 03's region operators
 *     (check_sequence_collectives);
 *   - chapter 06's chunk rule: cp_chunk_owner inverts cp_chunk_of, both balances, C = 1..8;
 *   - chapter 06's Ulysses all-to-all (C = p ranks), both balances: ulysses_heads_to_chunks, the
 *     all-to-all and ulysses_rank_rows_to_sequence give rank r every position of heads
 *     [r Hg, (r+1) Hg) in sequence order; the way back returns the original rows exactly. */
#include <stdio.h>
#include <stdlib.h>
#include "comm.h"
#include "device.h"
#include "seq_layout.h"
#include "test_util.h"

/* A value that names its element: batch b, global position t, channel c (exact in fp32). */
static float tag(int b, int t, int c) { return (float)(b * 10000 + t * 100 + c); }

static void check_relayout(int p, int B, int Ts, int C) {
    size_t n = (size_t)p * B * Ts * C;
    float *h = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
    /* chunks[r][b][t][c] holds the tag of (b, r*Ts + t, c) */
    for (int r = 0; r < p; r++)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < Ts; t++)
                for (int c = 0; c < C; c++)
                    h[(((size_t)r * B + b) * Ts + t) * C + c] = tag(b, r * Ts + t, c);
    float *chunks = device_alloc_floats(n, MEM_BUFFERS), *x = device_alloc_floats(n, MEM_BUFFERS);
    device_copy_to_device(chunks, h, n * sizeof(float));
    seq_chunks_to_sequence(x, chunks, p, B, Ts, C);
    device_copy_to_host(back, x, n * sizeof(float));
    int T = p * Ts, bad = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                bad += back[((size_t)b * T + t) * C + c] != tag(b, t, c);
    CHECK(bad == 0, "chunks -> sequence, p %d B %d Ts %d C %d: %d elements misplaced", p, B, Ts, C, bad);
    /* and back */
    device_zero(chunks, n * sizeof(float));
    seq_sequence_to_chunks(chunks, x, p, B, Ts, C);
    device_copy_to_host(back, chunks, n * sizeof(float));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += back[i] != h[i];
    CHECK(bad == 0, "sequence -> chunks, p %d B %d Ts %d C %d: %d elements misplaced", p, B, Ts, C, bad);
    device_free(chunks); device_free(x);
    free(h); free(back);
}

/* Element (b, position, head, d) of a [B, T, heads, hd] tensor, exact in fp32. */
static inline float tag4(int b, int pos, int h, int d) { return (float)(b * 1000000 + pos * 1000 + h * 10 + d); }

static void check_chunk_rule(void) {
    int bad = 0;
    for (int C = 1; C <= 8; C++)
        for (int z = 0; z < 2; z++)
            for (int r = 0; r < C; r++)
                for (int slot = 0; slot < 2; slot++) {
                    int owner, owner_slot;
                    cp_chunk_owner(z, cp_chunk_of(z, r, slot, C), C, &owner, &owner_slot);
                    bad += owner != r || owner_slot != slot;
                }
    CHECK(bad == 0, "cp_chunk_owner does not invert cp_chunk_of in %d cases", bad);
    CHECK(cp_chunk_of(true, 1, 1, 4) == 6 && cp_chunk_of(false, 1, 1, 4) == 3, "C = 4, rank 1's second chunk: zigzag 6, contiguous 3");
}

/* The body is chapter 06's exercise 3 (rows_to_heads) nearly word for word: a student copy of
 * chapter 06 leaves it out (tools/make_assignment.sh), and this check with it. Returns whether
 * it ran. */
static bool check_ulysses(comm_group *world, bool zigzag) {
    /* BEGIN SOLUTION 06: chapter 06's exercise 3, the Ulysses all-to-all; this check is skipped */
    int C = world->size, r = world->rank, B = 2, Tc = 3, Tl = 2 * Tc, T = C * Tl, Hg = 2, hd = 3;
    ulysses_shape u = {C, B, Tl, Hg, hd, zigzag};
    size_t n = (size_t)B * Tl * C * Hg * hd;
    float *h = malloc(n * sizeof(float));
    for (int b = 0; b < B; b++)            /* x [B, Tl, C Hg, hd]: this rank's rows, every head */
        for (int t = 0; t < Tl; t++)
            for (int head = 0; head < C * Hg; head++)
                for (int d = 0; d < hd; d++)
                    h[(((size_t)b * Tl + t) * C * Hg + head) * hd + d] = tag4(b, cp_chunk_of(zigzag, r, t / Tc, C) * Tc + t % Tc, head, d);
    float *x = device_alloc_floats(n, MEM_BUFFERS), *send = device_alloc_floats(n, MEM_BUFFERS);
    float *recv = device_alloc_floats(n, MEM_BUFFERS), *y = device_alloc_floats(n, MEM_BUFFERS);
    device_copy_to_device(x, h, n * sizeof(float));
    ulysses_heads_to_chunks(send, x, u);
    comm_all_to_all(world, send, recv, n / C);
    ulysses_rank_rows_to_sequence(y, recv, u);
    float *got = malloc(n * sizeof(float));
    device_copy_to_host(got, y, n * sizeof(float));
    int bad = 0;
    for (int b = 0; b < B; b++)            /* y [B, T, Hg, hd]: every position, this rank's heads */
        for (int pos = 0; pos < T; pos++)
            for (int head = 0; head < Hg; head++)
                for (int d = 0; d < hd; d++)
                    bad += got[(((size_t)b * T + pos) * Hg + head) * hd + d] != tag4(b, pos, r * Hg + head, d);
    CHECK(bad == 0, "ulysses %s, rank %d of %d: %d elements of the head-sharded sequence wrong", zigzag ? "zigzag" : "contiguous", r, C, bad);
    /* and back */
    device_zero(x, n * sizeof(float));
    ulysses_sequence_to_rank_rows(send, y, u);
    comm_all_to_all(world, send, recv, n / C);
    ulysses_chunks_to_heads(x, recv, u);
    device_copy_to_host(got, x, n * sizeof(float));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != h[i];
    CHECK(bad == 0, "ulysses %s, rank %d of %d: %d elements differ after the way back", zigzag ? "zigzag" : "contiguous", r, C, bad);
    device_free(x); device_free(send); device_free(recv); device_free(y);
    free(h); free(got);
    return true;
    /* END SOLUTION */
    return false;
}

/* Around the collectives, the way chapter 03's region operators use the re-layout (B sequences
 * of T = p*Ts tokens, C channels): the all-gather along the sequence gives every rank the whole
 * [B, T, C] tensor from the [B, T/p, C] shards, and the reduce-scatter gives rank r the sum over
 * the ranks of its rows [r*T/p, (r+1)*T/p) of every sequence. The body is chapter 03's exercises
 * 1 and 2 word for word: a student copy of chapter 03 leaves it out (tools/make_assignment.sh),
 * and this check with it. Returns whether it ran. */
static bool check_sequence_collectives(comm_group *world) {
    /* BEGIN SOLUTION 03: chapter 03's exercises 1 and 2, the all-gather and the reduce-scatter along the sequence; this check is skipped */
    int p = world->size, r = world->rank;
    const int B = 3, Ts = 2, C = 4, T = p * Ts;
    size_t n_local = (size_t)B * Ts * C, n_full = (size_t)B * T * C;
    float *h = malloc(n_full * sizeof(float));
    float *local = device_alloc_floats(n_local, MEM_BUFFERS);
    float *full = device_alloc_floats(n_full, MEM_BUFFERS);
    float *chunks = device_alloc_floats(n_full, MEM_BUFFERS);

    /* all-gather along the sequence: rank r's shard holds positions [r*Ts, (r+1)*Ts) */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Ts; t++)
            for (int c = 0; c < C; c++) h[((size_t)b * Ts + t) * C + c] = tag(b, r * Ts + t, c);
    device_copy_to_device(local, h, n_local * sizeof(float));
    comm_all_gather(world, local, chunks, n_local);
    seq_chunks_to_sequence(full, chunks, p, B, Ts, C);
    device_copy_to_host(h, full, n_full * sizeof(float));
    int bad = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) bad += h[((size_t)b * T + t) * C + c] != tag(b, t, c);
    CHECK(bad == 0, "all-gather along the sequence: %d elements wrong on rank %d", bad, r);

    /* reduce-scatter along the sequence: rank q contributes (q + 1) * tag to every element */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) h[((size_t)b * T + t) * C + c] = (float)(r + 1) * tag(b, t, c);
    device_copy_to_device(full, h, n_full * sizeof(float));
    seq_sequence_to_chunks(chunks, full, p, B, Ts, C);
    comm_reduce_scatter(world, chunks, local, n_local);
    device_copy_to_host(h, local, n_local * sizeof(float));
    bad = 0;
    float ranks_sum = (float)p * (p + 1) / 2;   /* sum over q of (q + 1) */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Ts; t++)
            for (int c = 0; c < C; c++)
                bad += h[((size_t)b * Ts + t) * C + c] != ranks_sum * tag(b, r * Ts + t, c);
    CHECK(bad == 0, "reduce-scatter along the sequence: %d elements wrong on rank %d", bad, r);

    device_free(local); device_free(full); device_free(chunks);
    free(h);
    return true;
    /* END SOLUTION */
    return false;
}

int main(int argc, char **argv) {
    comm_group *world = comm_init(&argc, &argv);

    check_chunk_rule();
    bool ulysses = check_ulysses(world, false);
    check_ulysses(world, true);

    check_relayout(1, 3, 5, 4);
    check_relayout(4, 1, 3, 2);     /* B = 1: the two orders coincide */
    check_relayout(4, 3, 2, 5);
    check_relayout(2, 2, 1, 3);     /* one token per rank */

    bool collectives = check_sequence_collectives(world);
    if (world->rank == 0 && !ulysses)
        printf("test_seq_layout: skipped the Ulysses all-to-all (a student copy of chapter 06: it is exercise 3)\n");
    if (world->rank == 0 && !collectives)
        printf("test_seq_layout: skipped the collectives along the sequence (a student copy of chapter 03: they are exercises 1 and 2)\n");

    int bad_any = tu_finish("test_seq_layout");
    bad_any = (int)comm_host_max(world, bad_any);   /* every rank exits alike */
    comm_finalize();
    return bad_any;
}
