/* ranks: 1 2 4 */
/* test_comm.c: every collective against what it must compute, on the world and (on 4 ranks)
 * on the sub-groups of a 2x2 mesh (dp_shard=2 x tp=2), plus the byte accounting. */
#include <stdlib.h>
#include "comm.h"
#include "device.h"
#include "mesh.h"
#include "test_util.h"

/* Each rank's value for element i: distinct across ranks and elements. */
static float val(int rank, int i) { return 100.0f * rank + i; }

static void check_group(comm_group *g, const char *what) {
    int p = g->size, r = g->rank;
    const int n = 6;
    float host[64], *buf = device_alloc_floats(n * p, MEM_BUFFERS), *out = device_alloc_floats(n * p, MEM_BUFFERS);

    /* all-reduce sum and max */
    for (int i = 0; i < n; i++) host[i] = val(r, i);
    device_copy_to_device(buf, host, n * 4);
    comm_all_reduce(g, buf, n, COMM_SUM);
    device_copy_to_host(host, buf, n * 4);
    for (int i = 0; i < n; i++) {
        double want = 0;
        for (int q = 0; q < p; q++) want += val(q, i);
        CHECK_CLOSE(host[i], want, 0, 0, what);
    }
    for (int i = 0; i < n; i++) host[i] = (r == p - 1 && i == 2) ? 1e6f : val(r, i);
    device_copy_to_device(buf, host, n * 4);
    comm_all_reduce(g, buf, n, COMM_MAX);
    device_copy_to_host(host, buf, n * 4);
    CHECK_CLOSE(host[2], 1e6, 0, 0, what);
    CHECK_CLOSE(host[0], val(p - 1, 0), 0, 0, what);

    /* all-gather: rank-major chunks */
    for (int i = 0; i < n; i++) host[i] = val(r, i);
    device_copy_to_device(buf, host, n * 4);
    comm_all_gather(g, buf, out, n);
    device_copy_to_host(host, out, n * p * 4);
    for (int q = 0; q < p; q++)
        for (int i = 0; i < n; i++) CHECK_CLOSE(host[q * n + i], val(q, i), 0, 0, what);

    /* reduce-scatter: rank r gets the sum over ranks of chunk r */
    for (int j = 0; j < n * p; j++) host[j] = val(r, j);
    device_copy_to_device(buf, host, n * p * 4);
    comm_reduce_scatter(g, buf, out, n);
    device_copy_to_host(host, out, n * 4);
    for (int i = 0; i < n; i++) {
        double want = 0;
        for (int q = 0; q < p; q++) want += val(q, r * n + i);
        CHECK_CLOSE(host[i], want, 0, 0, what);
    }

    /* broadcast from the last rank */
    for (int i = 0; i < n; i++) host[i] = val(r, i);
    device_copy_to_device(buf, host, n * 4);
    comm_broadcast(g, buf, n, p - 1);
    device_copy_to_host(host, buf, n * 4);
    for (int i = 0; i < n; i++) CHECK_CLOSE(host[i], val(p - 1, i), 0, 0, what);

    /* send/recv around a ring: even ranks send first so nobody deadlocks on blocking MPI */
    if (p > 1) {
        int next = (r + 1) % p, prev = (r + p - 1) % p;
        for (int i = 0; i < n; i++) host[i] = val(r, i);
        device_copy_to_device(buf, host, n * 4);
        if (r % 2 == 0) { comm_send(g, buf, n, next); comm_recv(g, out, n, prev); }
        else { comm_recv(g, out, n, prev); comm_send(g, buf, n, next); }
        device_copy_to_host(host, out, n * 4);
        for (int i = 0; i < n; i++) CHECK_CLOSE(host[i], val(prev, i), 0, 0, what);
    }
    comm_barrier(g);
    device_free(buf);
    device_free(out);
}

int main(int argc, char **argv) {
    comm_group *world = comm_init(&argc, &argv);
    check_group(world, "world");

    /* accounting: 2 all-reduces of 6 floats, 1 all-gather of 6*p, 1 reduce-scatter of 6*p */
    const collective_stats *ar = &world->stats[COLL_ALL_REDUCE], *ag = &world->stats[COLL_ALL_GATHER];
    CHECK(ar->calls == 2 && ar->payload_bytes == 2 * 6 * 4, "all-reduce counted %lld calls %g bytes", ar->calls, ar->payload_bytes);
    CHECK(ag->calls == 1 && ag->payload_bytes == 6 * 4 * world->size, "all-gather counted %lld calls %g bytes", ag->calls, ag->payload_bytes);
    double p = world->size;
    CHECK_CLOSE(ar->wire_bytes, 2 * (p - 1) / p * 48, 1e-9, 0, "all-reduce ring bytes");
    comm_reset_stats(world);
    CHECK(world->stats[COLL_ALL_REDUCE].calls == 0, "reset");

    if (world->size == 4) {
        /* 2x2 mesh: tp groups {0,1} {2,3}; dp_shard groups {0,2} {1,3} */
        mesh_shape s = {{1, 1, 2, 1, 2}};
        device_mesh *m = mesh_create(s);
        comm_group *tp = m->group[MESH_TP], *dp = m->group[MESH_DP_SHARD];
        CHECK(tp->size == 2 && dp->size == 2, "group sizes %d %d", tp->size, dp->size);
        CHECK(tp->rank == world->rank % 2 && dp->rank == world->rank / 2, "ranks in groups");
        check_group(tp, "tp group");
        check_group(dp, "dp_shard group");
        /* the tp group of rank r holds r and r^1: sum of world ranks tells which */
        float x = (float)world->rank, *d = device_alloc_floats(1, MEM_BUFFERS);
        device_copy_to_device(d, &x, 4);
        comm_all_reduce(tp, d, 1, COMM_SUM);
        device_copy_to_host(&x, d, 4);
        CHECK_CLOSE(x, world->rank < 2 ? 1 : 5, 0, 0, "tp group membership");
        x = (float)world->rank;
        device_copy_to_device(d, &x, 4);
        comm_all_reduce(dp, d, 1, COMM_SUM);
        device_copy_to_host(&x, d, 4);
        CHECK_CLOSE(x, world->rank % 2 == 0 ? 2 : 4, 0, 0, "dp_shard group membership");
        int dims[2] = {MESH_DP_SHARD, MESH_TP};
        comm_group *both = mesh_group_over(m, dims, 2, "dp_shard x tp");
        CHECK(both->size == 4 && both->rank == world->rank, "2-D group");
        device_free(d);
    }
    int bad = tu_finish("test_comm");
    bad = (int)comm_host_max(world, bad);   /* every rank exits alike */
    comm_finalize();
    return bad;
}
