/* ranks: 1 */
/* test_init.c: the initialiser is shard-invariant (a row shard and a column shard equal the
 * matching slice of the full tensor, bit for bit), depends on seed and name, and is normal. */
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "init.h"
#include "test_util.h"

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    const int R = 24, C = 40;
    float *full = malloc(R * C * sizeof(float)), *part = malloc(R * C * sizeof(float));
    init_normal_slice(full, "layers.0.attention.wq.weight", 42, 0.02f, R, C, 0, R, 0, C);

    /* row shards: 4 ranks of 6 rows */
    for (int r = 0; r < 4; r++) {
        init_normal_slice(part, "layers.0.attention.wq.weight", 42, 0.02f, R, C, r * 6, 6, 0, C);
        CHECK(memcmp(part, full + r * 6 * C, 6 * C * sizeof(float)) == 0, "row shard %d differs", r);
    }
    /* column shards: 4 ranks of 10 columns */
    for (int r = 0; r < 4; r++) {
        init_normal_slice(part, "layers.0.attention.wq.weight", 42, 0.02f, R, C, 0, R, r * 10, 10);
        int same = 1;
        for (int i = 0; i < R; i++)
            for (int j = 0; j < 10; j++) same &= part[i * 10 + j] == full[i * C + r * 10 + j];
        CHECK(same, "column shard %d differs", r);
    }
    /* another seed or name gives other values */
    init_normal_slice(part, "layers.0.attention.wq.weight", 43, 0.02f, R, C, 0, R, 0, C);
    CHECK(memcmp(part, full, R * C * sizeof(float)) != 0, "seed ignored");
    init_normal_slice(part, "layers.0.attention.wk.weight", 42, 0.02f, R, C, 0, R, 0, C);
    CHECK(memcmp(part, full, R * C * sizeof(float)) != 0, "name ignored");
    /* roughly N(0, 0.02^2) over 100k samples */
    const int n = 100000;
    float *big = malloc(n * sizeof(float));
    init_normal_slice(big, "stats", 1, 0.02f, 1, n, 0, 1, 0, n);
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++) mean += big[i];
    mean /= n;
    for (int i = 0; i < n; i++) var += (big[i] - mean) * (big[i] - mean);
    var /= n;
    CHECK(fabs(mean) < 0.02 * 0.02, "mean %g", mean);
    CHECK(fabs(sqrt(var) - 0.02) < 0.02 * 0.02, "std %g", sqrt(var));
    free(full); free(part); free(big);
    int rc = tu_finish("test_init");
    comm_finalize();
    return rc;
}
