/* ranks: 1 */
/* test_mesh.c: coordinates (tp innermost, row-major) and validation messages. The exit-2
 * behaviour of a bad mesh under mpirun is tested by tests/t_bad_input.sh. */
#include <string.h>
#include "comm.h"
#include "mesh.h"
#include "test_util.h"

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    mesh_shape s = {{2, 1, 2, 1, 4}};   /* pp=2, dp_shard=2, tp=4: 16 ranks */
    char err[256];
    CHECK(mesh_validate(&s, 16, err, sizeof err) == 0, "valid mesh rejected: %s", err);
    int c[MESH_NDIMS];
    mesh_coords_of(&s, 0, c);
    CHECK(c[0] == 0 && c[2] == 0 && c[4] == 0, "rank 0");
    mesh_coords_of(&s, 5, c);    /* 5 = (0*2 + 1)*4 + 1 */
    CHECK(c[MESH_PP] == 0 && c[MESH_DP_SHARD] == 1 && c[MESH_TP] == 1, "rank 5 -> pp %d dps %d tp %d", c[0], c[2], c[4]);
    mesh_coords_of(&s, 14, c);   /* 14 = (1*2 + 1)*4 + 2 */
    CHECK(c[MESH_PP] == 1 && c[MESH_DP_SHARD] == 1 && c[MESH_TP] == 2, "rank 14");
    /* every rank maps back to itself */
    for (int r = 0; r < 16; r++) {
        mesh_coords_of(&s, r, c);
        int back = 0;
        for (int d = 0; d < MESH_NDIMS; d++) back = back * s.degree[d] + c[d];
        CHECK(back == r, "rank %d round trip gives %d", r, back);
    }
    CHECK(mesh_validate(&s, 8, err, sizeof err) != 0 && strstr(err, "16") && strstr(err, "8"),
          "product mismatch message: %s", err);
    mesh_shape zero = {{1, 1, 0, 1, 2}};
    CHECK(mesh_validate(&zero, 2, err, sizeof err) != 0 && strstr(err, "dp_shard=0"), "zero degree message: %s", err);
    int rc = tu_finish("test_mesh");
    comm_finalize();
    return rc;
}
