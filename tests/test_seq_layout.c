/* ranks: 1 2 4 */
/* test_seq_layout.c: the sequence re-layout of seq_layout.h, alone and around the collectives
 * the way chapter 03 uses it:
 *   - seq_chunks_to_sequence puts element (r, b, t, c) of [p][B][Ts][C] at (b, r*Ts + t, c);
 *     seq_sequence_to_chunks is its inverse (for several shapes, B = 1 included);
 *   - all-gather, then seq_chunks_to_sequence, gives every rank the whole [B, T, C] tensor from
 *     the [B, T/p, C] shards;
 *   - seq_sequence_to_chunks, then reduce-scatter, gives rank r the sum over ranks of its rows
 *     [r*T/p, (r+1)*T/p) of every sequence. */
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

int main(int argc, char **argv) {
    comm_group *world = comm_init(&argc, &argv);
    int p = world->size, r = world->rank;

    check_relayout(1, 3, 5, 4);
    check_relayout(4, 1, 3, 2);     /* B = 1: the two orders coincide */
    check_relayout(4, 3, 2, 5);
    check_relayout(2, 2, 1, 3);     /* one token per rank */

    /* Around the collectives: B sequences of T = p*Ts tokens, C channels. */
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
    int bad_any = tu_finish("test_seq_layout");
    bad_any = (int)comm_host_max(world, bad_any);   /* every rank exits alike */
    comm_finalize();
    return bad_any;
}
