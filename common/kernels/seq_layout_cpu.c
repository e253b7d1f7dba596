/* seq_layout_cpu.c: the CPU loops of seq_layout.h (the CUDA twin is seq_layout_cuda.cu). */
#include "seq_layout.h"

void seq_chunks_to_sequence(float *x, const float *chunks, int p, int B, int Ts, int C) {
    size_t n = (size_t)p * B * Ts * C;
    for (size_t i = 0; i < n; i++) x[i] = chunks[seq_chunk_index(i, p, B, Ts, C)];
}

void seq_sequence_to_chunks(float *chunks, const float *x, int p, int B, int Ts, int C) {
    size_t n = (size_t)p * B * Ts * C;
    for (size_t i = 0; i < n; i++) chunks[seq_chunk_index(i, p, B, Ts, C)] = x[i];
}
