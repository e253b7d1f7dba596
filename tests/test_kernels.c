/* ranks: 1 */
/* test_kernels.c: chapter 00's element-wise kernels. Forwards against naive double loops,
 * backwards against central finite differences. */
#include <stdbool.h>
#include <stdlib.h>
#include "comm.h"
#include "device.h"
#include "init.h"
#include "kernels.h"
#include "test_device.h"
#include "test_util.h"

#define N 37


static double gelu_ref(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    float x[N], t[N], out[N], g[N];
    init_normal_slice(x, "x", 3, 2.0f, 1, N, 0, 1, 0, N);
    init_normal_slice(t, "t", 3, 1.0f, 1, N, 0, 1, 0, N);
    float *dx = tu_upload(x, N), *dt = tu_upload(t, N), *dout = device_alloc_floats(N, MEM_BUFFERS);

    /* gelu forward vs the formula in double */
    gelu_forward(dout, dx, N);
    device_copy_to_host(out, dout, sizeof out);
    for (int i = 0; i < N; i++) CHECK_CLOSE(out[i], gelu_ref(x[i]), 1e-6, 1e-5, "gelu");

    /* gelu backward vs central differences of the double formula */
    float ones[N];
    for (int i = 0; i < N; i++) ones[i] = 1.0f;
    float *dones = tu_upload(ones, N);
    gelu_backward(dout, dones, dx, N);
    device_copy_to_host(g, dout, sizeof g);
    for (int i = 0; i < N; i++) {
        double h = 1e-4, fd = (gelu_ref(x[i] + h) - gelu_ref(x[i] - h)) / (2 * h);
        CHECK_CLOSE(g[i], fd, 1e-5, 1e-4, "gelu'");
    }

    /* mse: sum and gradient (of the mean over N) vs finite differences of the mean */
    double want = 0;
    for (int i = 0; i < N; i++) want += (x[i] - t[i]) * (double)(x[i] - t[i]);
    CHECK_CLOSE(mse_sum(dx, dt, N), want, 1e-4, 1e-6, "mse sum");
    mse_backward(dout, dx, dt, N, N);
    device_copy_to_host(g, dout, sizeof g);
    for (int i = 0; i < N; i++) {
        double h = 1e-3, up = want - (x[i] - t[i]) * (double)(x[i] - t[i]);
        double lo = up + (x[i] + h - t[i]) * (x[i] + h - t[i]), hi = up + (x[i] - h - t[i]) * (x[i] - h - t[i]);
        CHECK_CLOSE(g[i], (lo - hi) / (2 * h) / N, 1e-6, 1e-4, "mse grad");
    }

    /* sgd, add, scale */
    sgd_step(dx, dones, N, 0.25f);
    device_copy_to_host(out, dx, sizeof out);
    for (int i = 0; i < N; i++) CHECK_CLOSE(out[i], x[i] - 0.25f, 0, 1e-6, "sgd");
    add_inplace(dx, dones, N);
    scale_inplace(dx, 2.0f, N);
    device_copy_to_host(out, dx, sizeof out);
    for (int i = 0; i < N; i++) CHECK_CLOSE(out[i], 2 * (x[i] + 0.75f), 0, 1e-6, "add+scale");

    device_free(dx); device_free(dt); device_free(dout); device_free(dones);
    CHECK(mem_current_total() == 0, "allocator still counts %zu bytes after freeing everything", mem_current_total());

    /* the allocator's cache (memory.c): a freed block comes back, zeroed, for the next allocation
     * of its size, without new memory; the accounting counts it as live again. Under
     * AddressSanitizer nothing is kept (mem_cache_bytes stays 0) and only the zeros are checked. */
    float *a = device_alloc_floats(1000, MEM_BUFFERS);
    device_copy_to_device(a, x, sizeof x);
    size_t kept_before = mem_cache_bytes();   /* the blocks freed above are kept too */
    device_free(a);
    bool kept = mem_cache_bytes() == kept_before + 1000 * sizeof(float);
    size_t misses = mem_cache_misses();
    float *b = device_alloc_floats(1000, MEM_BUFFERS), head[N];
    if (kept) {
        CHECK(b == a, "a freed block of the same size was not reused");
        CHECK(mem_cache_misses() == misses, "the reused block counted as new memory");
        CHECK(mem_cache_bytes() == kept_before, "the reused block is still counted as kept");
    }
    CHECK(mem_current(MEM_BUFFERS) == 1000 * sizeof(float), "the reused block is not counted as live");
    device_copy_to_host(head, b, sizeof head);
    for (int i = 0; i < N; i++) CHECK(head[i] == 0.0f, "a reused block is not zeroed (element %d is %g)", i, head[i]);
    float *c = device_alloc_floats(999, MEM_BUFFERS);   /* another size: new memory */
    CHECK(mem_cache_misses() == misses + 1 + !kept, "an allocation of a new size did not count as new memory");
    device_free(b); device_free(c);
    int rc = tu_finish("test_kernels");
    comm_finalize();
    return rc;
}
