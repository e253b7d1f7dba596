/* test_device.h: what the kernel tests do around the device: host arrays up and down, and the
 * full causal attention of a whole sequence, the ground truth of the block and ring tests.
 * Every tensor goes through device_alloc and device copies, so a test runs on both backends. */
#pragma once
#include <stdlib.h>
#include "device.h"
#include "llama_kernels.h"

/* host[n] -> a new device array */
static inline float *tu_upload(const float *host, size_t n) {
    float *d = device_alloc_floats(n, MEM_BUFFERS);
    device_copy_to_device(d, host, n * sizeof(float));
    return d;
}
/* device[n] -> a new host array (malloc) */
static inline float *tu_download_new(const float *dev, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    device_copy_to_host(h, dev, n * sizeof(float));
    return h;
}

/* attention_forward then attention_backward on host q [B, T, H, hd], k, v [B, T, Hkv, hd] and
 * dout [B, T, H, hd]: new host arrays *out, *dq [B, T, H, hd] and *dk, *dv [B, T, Hkv, hd]. */
static inline void tu_full_attention(const float *q_h, const float *k_h, const float *v_h, const float *dout_h,
                                     int B, int T, int H, int Hkv, int hd, float **out_h, float **dq_h,
                                     float **dk_h, float **dv_h) {
    size_t nq = (size_t)B * T * H * hd, nkv = (size_t)B * T * Hkv * hd, np = (size_t)B * H * T * T;
    float *q = tu_upload(q_h, nq), *k = tu_upload(k_h, nkv), *v = tu_upload(v_h, nkv), *dout = tu_upload(dout_h, nq);
    float *out = device_alloc_floats(nq, MEM_BUFFERS), *probs = device_alloc_floats(np, MEM_BUFFERS);
    float *dprobs = device_alloc_floats(np, MEM_BUFFERS);
    float *dq = device_alloc_floats(nq, MEM_BUFFERS), *dk = device_alloc_floats(nkv, MEM_BUFFERS);
    float *dv = device_alloc_floats(nkv, MEM_BUFFERS);
    attention_forward(out, probs, q, k, v, B, T, H, Hkv, hd);
    attention_backward(dq, dk, dv, dprobs, dout, q, k, v, probs, B, T, H, Hkv, hd);
    *out_h = tu_download_new(out, nq);
    *dq_h = tu_download_new(dq, nq);
    *dk_h = tu_download_new(dk, nkv);
    *dv_h = tu_download_new(dv, nkv);
    device_free(q); device_free(k); device_free(v); device_free(dout); device_free(out);
    device_free(probs); device_free(dprobs); device_free(dq); device_free(dk); device_free(dv);
}
