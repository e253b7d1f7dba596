/* init.c: counter-based initialisation (see init.h). The hash is splitmix64's finaliser, a
 * well-mixed 64-bit bijection: good enough to make independent-looking normals, and cheap. */
#include <math.h>
#include <stdlib.h>
#include "device.h"
#include "init.h"

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t init_name_hash(const char *name) {   /* FNV-1a, then mixed */
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ULL;
    return mix64(h);
}

/* Uniform in (0, 1): the top 24 bits, offset by half a step so that 0 never occurs (log(0)). */
static double uniform_at(uint64_t seed, uint64_t name_hash, uint64_t counter) {
    uint64_t r = mix64(mix64(seed ^ name_hash) + counter);
    return ((double)(r >> 40) + 0.5) / 16777216.0;
}

float init_normal_at(uint64_t seed, uint64_t name_hash, uint64_t index) {
    double u1 = uniform_at(seed, name_hash, 2 * index);
    double u2 = uniform_at(seed, name_hash, 2 * index + 1);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void init_normal_slice(float *out, const char *name, uint64_t seed, float std,
                       int rows, int cols, int r0, int nr, int c0, int nc) {
    (void)rows;
    uint64_t h = init_name_hash(name);
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nc; j++) {
            uint64_t global = (uint64_t)(r0 + i) * (uint64_t)cols + (uint64_t)(c0 + j);
            out[(size_t)i * nc + j] = std * init_normal_at(seed, h, global);
        }
}

void init_normal_slice_device(float *out_dev, const char *name, uint64_t seed, float std,
                              int rows, int cols, int r0, int nr, int c0, int nc) {
    float *host = malloc((size_t)nr * nc * sizeof(float));
    init_normal_slice(host, name, seed, std, rows, cols, r0, nr, c0, nc);
    device_copy_to_device(out_dev, host, (size_t)nr * nc * sizeof(float));
    free(host);
}

void init_constant_device(float *out_dev, size_t n, float value) {
    float *host = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) host[i] = value;
    device_copy_to_device(out_dev, host, n * sizeof(float));
    free(host);
}
