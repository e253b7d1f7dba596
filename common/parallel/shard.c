/* shard.c: see shard.h. */
#include <stdlib.h>
#include <string.h>
#include "device.h"
#include "shard.h"

void shard_slice(shard_layout layout, int rows, int cols, int rank, int size,
                 int *r0, int *nr, int *c0, int *nc) {
    *r0 = 0; *nr = rows; *c0 = 0; *nc = cols;
    if (layout == SHARD_ROWS) { *nr = rows / size; *r0 = rank * *nr; }
    if (layout == SHARD_COLS) { *nc = cols / size; *c0 = rank * *nc; }
}

void shard_gather_to_host(comm_group *g, shard_layout layout, const float *local_dev,
                          int rows, int cols, float *full) {
    int r0, nr, c0, nc;
    shard_slice(layout, rows, cols, g->rank, g->size, &r0, &nr, &c0, &nc);
    size_t n = (size_t)nr * nc;
    float *local = malloc(n * sizeof(float));
    device_copy_to_host(local, local_dev, n * sizeof(float));
    if (layout == SHARD_REPLICATED) {          /* every rank has it: rank 0's copy is the tensor */
        if (g->rank == 0) memcpy(full, local, n * sizeof(float));
        free(local);
        return;
    }
    float *all = g->rank == 0 ? malloc(n * g->size * sizeof(float)) : NULL;
    comm_host_gather(g, local, all, n, 0);
    if (g->rank == 0) {
        if (layout == SHARD_ROWS) {            /* rank-major row blocks: already the full layout */
            memcpy(full, all, n * g->size * sizeof(float));
        } else {                               /* column blocks: interleave row by row */
            for (int r = 0; r < g->size; r++)
                for (int i = 0; i < rows; i++)
                    memcpy(full + (size_t)i * cols + (size_t)r * nc, all + r * n + (size_t)i * nc,
                           nc * sizeof(float));
        }
    }
    free(all);
    free(local);
}
