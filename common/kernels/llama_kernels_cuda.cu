/* llama_kernels_cuda.cu: the CUDA twin of llama_kernels_cpu.c (see llama_kernels.h).
 *
 * Read it beside the CPU file: every function has the same argument list, the same GEMM calls
 * (gemm.h, cuBLAS underneath) and the same formulas from llama_math.h. Only the loops change:
 *   - element-wise loops become kernels with one thread per element (a grid-stride loop, so a
 *     bounded grid covers any n);
 *   - row loops (RMSNorm, softmax, cross-entropy) become one block of ROW_THREADS threads per
 *     row: thread x handles elements x, x + ROW_THREADS, ..., then cub::BlockReduce combines the
 *     threads' partial results (a sum, or a softmax state) and shared memory hands the row's
 *     total to every thread;
 *   - the embedding backward sorts the positions by table row (cub::DeviceRadixSort) and adds
 *     each row's gradients in position order, like the CPU loop, instead of with atomicAdd.
 * All pointers are device pointers and everything is launched on the rank's one stream
 * (cuda_common.h), so kernels and GEMMs run in the order they are issued; only
 * cross_entropy_forward, which returns a host value, waits for the GPU.
 */
#include <cub/block/block_reduce.cuh>
#include <cub/device/device_radix_sort.cuh>
#include "llama_kernels.h"
#include "llama_math.h"
#include "gemm.h"
#include "device.h"
#include "cuda_common.h"

/* The index of this thread's first element and the stride to its next one. */
/* ---- row reductions ----------------------------------------------------------------------------
 * Row kernels are launched with exactly ROW_THREADS threads per block (cub sizes its shared
 * scratch for that number). Each helper takes this thread's partial result and returns the
 * whole block's, in every thread. The trailing __syncthreads() lets a kernel call the helper
 * again (next row, or a second reduction) without overwriting shared memory still being read. */
#define ROW_THREADS 256
typedef cub::BlockReduce<float, ROW_THREADS> BlockReduceFloat;
typedef cub::BlockReduce<softmax_state, ROW_THREADS> BlockReduceSoftmax;

static __device__ float block_sum(float mine) {
    __shared__ BlockReduceFloat::TempStorage temp;
    __shared__ float total;
    float sum = BlockReduceFloat(temp).Sum(mine);    /* valid in thread 0 only */
    if (threadIdx.x == 0) total = sum;
    __syncthreads();
    float result = total;
    __syncthreads();
    return result;
}

/* cub needs the merge as a function object. */
struct SoftmaxStateMerge {
    __device__ softmax_state operator()(const softmax_state &a, const softmax_state &b) const {
        return softmax_state_merge(a, b);
    }
};

static __device__ softmax_state block_softmax_state(softmax_state mine) {
    __shared__ BlockReduceSoftmax::TempStorage temp;
    __shared__ softmax_state total;
    softmax_state st = BlockReduceSoftmax(temp).Reduce(mine, SoftmaxStateMerge());
    if (threadIdx.x == 0) total = st;
    __syncthreads();
    softmax_state result = total;
    __syncthreads();
    return result;
}

/* ---- token embedding ------------------------------------------------------------------------ */

/* One thread per output element i = n D + d. */
static __global__ void embedding_forward_kernel(float *out, const int *tokens, const float *table,
                                                int N, int D, int row0, int nrows) {
    GRID_STRIDE_LOOP(i, (size_t)N * D) {
        size_t n = i / D, d = i % D;
        int row = embedding_local_row(tokens[n], row0, nrows);
        out[i] = row >= 0 ? table[(size_t)row * D + d] : 0.0f;
    }
}

void embedding_forward(float *out, const int *tokens, const float *table,
                       int N, int D, int row0, int nrows) {
    size_t n = (size_t)N * D;
    if (n == 0) return;
    embedding_forward_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(
        out, tokens, table, N, D, row0, nrows);
    CUDA_CHECK_LAUNCH();
}

/* The backward adds a repeated token's rows in a fixed order, not with atomicAdd (whose order
 * changes from run to run, and with it the last bits of the sum): the same algorithm as the CPU
 * twin, so the GPU gives the CPU's bits and two runs, or a run and its resume, agree exactly.
 *   1. one thread per position n: the pair (key, n), key = the local row (embedding_sort_key);
 *   2. cub::DeviceRadixSort::SortPairs by key: a radix sort is stable, so each row's positions
 *      stay in increasing order;
 *   3. one thread per (sorted pair k, column d): the first pair of each run of equal keys adds
 *      the run's dout rows in order onto its table element (embedding_backward_run).         */
static __global__ void embedding_sort_keys_kernel(int *keys, int *positions, const int *tokens,
                                                  int N, int row0, int nrows) {
    GRID_STRIDE_LOOP(n, N) {
        keys[n] = embedding_sort_key(tokens[n], row0, nrows);
        positions[n] = (int)n;
    }
}

/* One thread per (k, d); threads of one k read one dout row at a time, side by side. */
static __global__ void embedding_backward_runs_kernel(float *dtable, const float *dout,
                                                      const int *keys, const int *positions,
                                                      int N, int D, int nrows) {
    GRID_STRIDE_LOOP(i, (size_t)N * D) {
        embedding_backward_run(dtable, dout, keys, positions, (int)(i / D), (int)(i % D), N, D,
                               nrows);
    }
}

/* Scratch (device_alloc, MEM_BUFFERS, for the call): cub's temporary storage, then the keys and
 * positions before and after the sort, each part starting on a 256-byte boundary. */
static size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

void embedding_backward(float *dtable, const float *dout, const int *tokens,
                        int N, int D, int row0, int nrows) {
    if (N <= 0 || D <= 0 || nrows <= 0) return;
    int end_bit = 0;                      /* keys are 0..nrows: sort only the bits they use */
    while (end_bit < 31 && (1 << end_bit) <= nrows) end_bit++;
    size_t temp_bytes = 0, ints = align256((size_t)N * sizeof(int));
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, (const int *)NULL, (int *)NULL,
                                               (const int *)NULL, (int *)NULL, N, 0, end_bit,
                                               cuda_stream()));
    size_t temp_part = align256(temp_bytes);
    char *scratch = (char *)device_alloc(temp_part + 4 * ints, MEM_BUFFERS);
    int *keys_in = (int *)(scratch + temp_part), *positions_in = (int *)(scratch + temp_part + ints);
    int *keys = (int *)(scratch + temp_part + 2 * ints);
    int *positions = (int *)(scratch + temp_part + 3 * ints);

    embedding_sort_keys_kernel<<<cuda_blocks(N), CUDA_THREADS, 0, cuda_stream()>>>(
        keys_in, positions_in, tokens, N, row0, nrows);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch, temp_bytes, keys_in, keys, positions_in,
                                               positions, N, 0, end_bit, cuda_stream()));
    size_t n = (size_t)N * D;
    embedding_backward_runs_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(
        dtable, dout, keys, positions, N, D, nrows);
    CUDA_CHECK_LAUNCH();
    device_free(scratch);   /* a later device_alloc of it is ordered after this on the stream */
}

/* ---- RMSNorm -------------------------------------------------------------------------------- */

/* One block per row n: reduce sum x^2, then every thread writes its elements. */
static __global__ void rmsnorm_forward_kernel(float *out, float *rstd, const float *x,
                                              const float *w, int C, float eps) {
    size_t n = blockIdx.x;
    const float *x_n = x + n * C;
    float *out_n = out + n * C;
    float sum_sq = 0.0f;
    for (int c = threadIdx.x; c < C; c += ROW_THREADS) sum_sq += x_n[c] * x_n[c];
    float r = rmsnorm_rstd(block_sum(sum_sq), C, eps);
    if (threadIdx.x == 0) rstd[n] = r;
    for (int c = threadIdx.x; c < C; c += ROW_THREADS) out_n[c] = rmsnorm_value(x_n[c], r, w[c]);
}

void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w,
                     int N, int C, float eps) {
    if (N == 0) return;
    rmsnorm_forward_kernel<<<N, ROW_THREADS, 0, cuda_stream()>>>(out, rstd, x, w, C, eps);
    CUDA_CHECK_LAUNCH();
}

/* One block per row n, as rmsnorm_forward_kernel: each thread adds the residual to its elements
 * and sums their squares, then writes its normalised elements. */
static __global__ void residual_rmsnorm_forward_kernel(float *h, float *out, float *rstd,
                                                       const float *res, const float *w, int C,
                                                       float eps) {
    size_t n = blockIdx.x;
    float *h_n = h + n * C, *out_n = out + n * C;
    const float *res_n = res + n * C;
    float sum_sq = 0.0f;
    for (int c = threadIdx.x; c < C; c += ROW_THREADS) {
        h_n[c] += res_n[c];
        sum_sq += h_n[c] * h_n[c];
    }
    float r = rmsnorm_rstd(block_sum(sum_sq), C, eps);
    if (threadIdx.x == 0) rstd[n] = r;
    for (int c = threadIdx.x; c < C; c += ROW_THREADS) out_n[c] = rmsnorm_value(h_n[c], r, w[c]);
}

void residual_rmsnorm_forward(float *h, float *out, float *rstd, const float *res, const float *w,
                              int N, int C, float eps) {
    if (N == 0) return;
    residual_rmsnorm_forward_kernel<<<N, ROW_THREADS, 0, cuda_stream()>>>(h, out, rstd, res, w, C, eps);
    CUDA_CHECK_LAUNCH();
}

/* dx: one block per row n, reduce dot = sum dout w x, then dx_c += ... per element. */
static __global__ void rmsnorm_backward_dx_kernel(float *dx, const float *dout, const float *x,
                                                  const float *w, const float *rstd, int C) {
    size_t n = blockIdx.x;
    const float *x_n = x + n * C;
    const float *dout_n = dout + n * C;
    float *dx_n = dx + n * C;
    float dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += ROW_THREADS)
        dot += rmsnorm_dot_term(dout_n[c], w[c], x_n[c]);
    dot = block_sum(dot);
    for (int c = threadIdx.x; c < C; c += ROW_THREADS)
        dx_n[c] += rmsnorm_dx(dout_n[c], x_n[c], w[c], rstd[n], dot, C);
}

/* dw: a sum over rows, as a column reduction (cuda_common.h): thread (tx, ty) of block b sums
 * rows ty, ty + 16, ... of column 32 b + tx, and thread (tx, 0) adds the 16 partial sums in
 * order. The CPU loop adds row after row; the order differs, the terms do not. */
static __global__ void rmsnorm_backward_dw_kernel(float *dw, const float *dout, const float *x,
                                                  const float *rstd, int N, int C) {
    __shared__ float part[COL_REDUCE_ROWS][COL_REDUCE_COLS];
    int c = blockIdx.x * COL_REDUCE_COLS + threadIdx.x;
    float acc = 0.0f;
    if (c < C)
        for (int n = threadIdx.y; n < N; n += COL_REDUCE_ROWS)
            acc += rmsnorm_dw_term(dout[(size_t)n * C + c], x[(size_t)n * C + c], rstd[n]);
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float sum = 0.0f;
        for (int r = 0; r < COL_REDUCE_ROWS; r++) sum += part[r][threadIdx.x];
        dw[c] += sum;
    }
}

void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                      const float *w, const float *rstd, int N, int C) {
    if (N == 0 || C == 0) return;
    rmsnorm_backward_dx_kernel<<<N, ROW_THREADS, 0, cuda_stream()>>>(dx, dout, x, w, rstd, C);
    CUDA_CHECK_LAUNCH();
    rmsnorm_backward_dw_kernel<<<col_reduce_grid(C), col_reduce_block(), 0, cuda_stream()>>>(
        dw, dout, x, rstd, N, C);
    CUDA_CHECK_LAUNCH();
}

/* ---- RoPE ----------------------------------------------------------------------------------- */

/* One thread per (t, j), i = t hd/2 + j: the CPU loop's index. */
static __global__ void rope_table_kernel(float *cos_sin, const int *positions, int T, int hd,
                                         float theta) {
    int half = hd / 2;
    GRID_STRIDE_LOOP(i, (size_t)T * half) {
        float angle = rope_angle(positions[i / half], (int)(i % half), hd, theta);
        cos_sin[2 * i] = cosf(angle);
        cos_sin[2 * i + 1] = sinf(angle);
    }
}

void rope_table(float *cos_sin, const int *positions, int T, int hd, float theta) {
    size_t n = (size_t)T * (hd / 2);
    if (n == 0) return;
    rope_table_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(cos_sin, positions, T, hd, theta);
    CUDA_CHECK_LAUNCH();
}

/* One thread per pair i = ((b T + t) H + h) hd/2 + j, the CPU loop's index. */
static __global__ void rope_kernel(float *x, const float *cos_sin, int B, int T, int H, int hd,
                                   int inverse) {
    int half = hd / 2;
    GRID_STRIDE_LOOP(i, (size_t)B * T * H * half) {
        int j = (int)(i % half);
        size_t row = i / half;
        int t = (int)((row / H) % T);
        const float *c = cos_sin + 2 * ((size_t)t * half + j);
        float *pair = x + row * hd + 2 * j;
        if (inverse) rope_rotate_inverse(&pair[0], &pair[1], c[0], c[1]);
        else         rope_rotate(&pair[0], &pair[1], c[0], c[1]);
    }
}

static void rope_apply(float *x, const float *cos_sin, int B, int T, int H, int hd, int inverse) {
    size_t npairs = (size_t)B * T * H * (hd / 2);
    if (npairs == 0) return;
    rope_kernel<<<cuda_blocks(npairs), CUDA_THREADS, 0, cuda_stream()>>>(
        x, cos_sin, B, T, H, hd, inverse);
    CUDA_CHECK_LAUNCH();
}

void rope_forward(float *x, const float *cos_sin, int B, int T, int H, int hd) {
    rope_apply(x, cos_sin, B, T, H, hd, 0);
}

void rope_backward(float *dx, const float *cos_sin, int B, int T, int H, int hd) {
    rope_apply(dx, cos_sin, B, T, H, hd, 1);
}

/* ---- causal attention with grouped-query heads -----------------------------------------------
 * The GEMMs are the CPU twin's, call for call (see the layout comment there). Between them, the
 * causal softmax and its backward run one block per row of probs[B, H, T, T].                  */

/* Row r is query i = r % T of its (b, h): softmax over keys j <= i, 0 beyond. */
static __global__ void causal_softmax_kernel(float *probs, int T) {
    size_t r = blockIdx.x;
    float *p = probs + r * T;
    int i = (int)(r % T);
    softmax_state st = softmax_state_empty();
    for (int j = threadIdx.x; j < T; j += ROW_THREADS)
        if (attention_visible(i, j)) st = softmax_state_add(st, p[j]);
    st = block_softmax_state(st);
    for (int j = threadIdx.x; j < T; j += ROW_THREADS)
        p[j] = attention_visible(i, j) ? softmax_prob(p[j], st) : 0.0f;
}

void causal_softmax_forward(float *probs, int rows, int T) {
    if (rows == 0 || T == 0) return;
    causal_softmax_kernel<<<rows, ROW_THREADS, 0, cuda_stream()>>>(probs, T);
    CUDA_CHECK_LAUNCH();
}

static __global__ void causal_softmax_backward_kernel(float *dprobs, const float *probs, int T) {
    size_t r = blockIdx.x;
    const float *p = probs + r * T;
    float *dp = dprobs + r * T;
    int i = (int)(r % T);
    float dot = 0.0f;
    for (int j = threadIdx.x; j < T; j += ROW_THREADS)
        if (attention_visible(i, j)) dot += softmax_dot_term(p[j], dp[j]);
    dot = block_sum(dot);
    for (int j = threadIdx.x; j < T; j += ROW_THREADS)
        dp[j] = attention_visible(i, j) ? softmax_grad(p[j], dp[j], dot) : 0.0f;
}

/* dV_g and dK_g sum over the heads of the group: one batched call would let its entries write
 * the same dV_g concurrently (a race), so the heads go one after the other, the first with
 * beta = 0 (overwrite), the rest with beta = 1 (accumulate), all on one stream. */
void causal_softmax_backward(float *dprobs, const float *probs, int rows, int T) {
    if (rows == 0 || T == 0) return;
    causal_softmax_backward_kernel<<<rows, ROW_THREADS, 0, cuda_stream()>>>(dprobs, probs, T);
    CUDA_CHECK_LAUNCH();
}

/* ---- a block of attention (ring attention) ---------------------------------------------------
 * The GEMMs are in attention_block.c, shared with the CPU. These kernels run one block of
 * ROW_THREADS threads per row r = (b H + h) Tq + i of scores[B, H, Tq, Tk], like the causal
 * softmax above, with the mask on global positions (q_offset + i, k_offset + j).             */

/* Softmax over the row's visible keys (cub merges the threads' softmax states), then thread 0
 * writes the row's lse: -inf when no key is visible, and then every probability is 0. */
static __global__ void attention_block_softmax_kernel(float *scores, float *lse, int Tq, int Tk,
                                                      int q_offset, int k_offset) {
    size_t r = blockIdx.x;
    float *p = scores + r * Tk;
    int i = (int)(r % Tq);
    softmax_state st = softmax_state_empty();
    for (int j = threadIdx.x; j < Tk; j += ROW_THREADS)
        if (attention_block_visible(q_offset, i, k_offset, j)) st = softmax_state_add(st, p[j]);
    st = block_softmax_state(st);
    for (int j = threadIdx.x; j < Tk; j += ROW_THREADS)
        p[j] = attention_block_visible(q_offset, i, k_offset, j) ? softmax_prob(p[j], st) : 0.0f;
    if (threadIdx.x == 0) lse[r] = attention_lse(st);
}

void attention_block_softmax_forward(float *scores, float *lse, int B, int H, int Tq, int Tk,
                                     int q_offset, int k_offset) {
    size_t rows = (size_t)B * H * Tq;
    if (rows == 0) return;
    attention_block_softmax_kernel<<<(unsigned)rows, ROW_THREADS, 0, cuda_stream()>>>(
        scores, lse, Tq, Tk, q_offset, k_offset);
    CUDA_CHECK_LAUNCH();
}

/* D = dout . out over the row's hd output elements (a block_sum), then per key: P from the
 * score and the final lse, dS = P (dP - D); both written in place. */
static __global__ void attention_block_softmax_backward_kernel(float *scores, float *dscores,
                                                               const float *lse,
                                                               const float *dout,
                                                               const float *out, int H, int Tq,
                                                               int Tk, int hd, int q_offset,
                                                               int k_offset, int dout_bf16) {
    size_t r = blockIdx.x;
    float *p = scores + r * Tk;
    float *dp = dscores + r * Tk;
    int i = (int)(r % Tq), h = (int)((r / Tq) % H);
    size_t b = r / ((size_t)H * Tq);
    size_t o = ((b * Tq + i) * H + h) * hd;   /* the row's output in out/dout [B, Tq, H, hd] */
    float D = 0.0f;
    for (int d = threadIdx.x; d < hd; d += ROW_THREADS)
        D += attention_delta_term(dout[o + d], out[o + d], dout_bf16);
    D = block_sum(D);
    float row_lse = lse[r];
    for (int j = threadIdx.x; j < Tk; j += ROW_THREADS) {
        int visible = attention_block_visible(q_offset, i, k_offset, j);
        float prob = visible ? attention_block_prob(p[j], row_lse) : 0.0f;
        dp[j] = visible ? softmax_grad(prob, dp[j], D) : 0.0f;
        p[j] = prob;
    }
}

void attention_block_softmax_backward(float *scores, float *dscores, const float *lse,
                                      const float *dout, const float *out, int B, int H, int Tq,
                                      int Tk, int hd, int q_offset, int k_offset, bool dout_bf16) {
    size_t rows = (size_t)B * H * Tq;
    if (rows == 0 || Tk == 0) return;
    attention_block_softmax_backward_kernel<<<(unsigned)rows, ROW_THREADS, 0, cuda_stream()>>>(
        scores, dscores, lse, dout, out, H, Tq, Tk, hd, q_offset, k_offset, dout_bf16);
    CUDA_CHECK_LAUNCH();
}

/* ---- merge of two partial attention results ---------------------------------------------------
 * Two element-wise kernels on the one stream: first every element of out (one thread each)
 * computes its row's merged lse and the two weights from the old lse values and updates
 * itself; only then does the second kernel overwrite lse (one thread per row). Updating lse in
 * the first kernel would let one thread change a value that another thread of the same row
 * still has to read. The CPU twin does the same per row, lse last.                            */
static __global__ void attention_merge_out_kernel(float *out, const float *lse,
                                                  const float *out_b, const float *lse_b, int B,
                                                  int T, int H, int hd) {
    GRID_STRIDE_LOOP(e, (size_t)B * T * H * hd) {
        size_t row = e / hd;                       /* (b T + t) H + h of out */
        int h = (int)(row % H), t = (int)((row / H) % T);
        size_t b = row / ((size_t)T * H);
        size_t l = (b * H + h) * T + t;            /* the same row in lse [B, H, T] */
        float merged = attention_merge_lse(lse[l], lse_b[l]);
        float wa = attention_merge_weight(lse[l], merged);
        float wb = attention_merge_weight(lse_b[l], merged);
        out[e] = attention_merge_value(out[e], wa, out_b[e], wb);
    }
}

static __global__ void attention_merge_lse_kernel(float *lse, const float *lse_b, size_t n) {
    GRID_STRIDE_LOOP(l, n) lse[l] = attention_merge_lse(lse[l], lse_b[l]);
}

void attention_merge(float *out, float *lse, const float *out_b, const float *lse_b,
                     int B, int T, int H, int hd) {
    size_t nrows = (size_t)B * H * T, n = nrows * hd;
    if (nrows == 0) return;
    if (n > 0) {
        attention_merge_out_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(
            out, lse, out_b, lse_b, B, T, H, hd);
        CUDA_CHECK_LAUNCH();
    }
    attention_merge_lse_kernel<<<cuda_blocks(nrows), CUDA_THREADS, 0, cuda_stream()>>>(
        lse, lse_b, nrows);
    CUDA_CHECK_LAUNCH();
}

/* ---- SwiGLU --------------------------------------------------------------------------------- */

static __global__ void swiglu_forward_kernel(float *out, const float *a, const float *b, size_t n) {
    GRID_STRIDE_LOOP(i, n) out[i] = swiglu_value(a[i], b[i]);
}

void swiglu_forward(float *out, const float *a, const float *b, size_t n) {
    if (n == 0) return;
    swiglu_forward_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(out, a, b, n);
    CUDA_CHECK_LAUNCH();
}

static __global__ void swiglu_backward_kernel(float *da, float *db, const float *dout,
                                              const float *a, const float *b, size_t n) {
    GRID_STRIDE_LOOP(i, n) {
        float g = dout[i], a_i = a[i], b_i = b[i];   /* read first: da/db may alias the inputs */
        swiglu_grads(g, a_i, b_i, &da[i], &db[i]);
    }
}

void swiglu_backward(float *da, float *db, const float *dout, const float *a, const float *b,
                     size_t n) {
    if (n == 0) return;
    swiglu_backward_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(da, db, dout, a, b,
                                                                              n);
    CUDA_CHECK_LAUNCH();
}

/* ---- cross-entropy ---------------------------------------------------------------------------
 * The forward returns one host number, summed in a fixed order so that it is the same on every
 * run: CE_BLOCKS blocks (or fewer) each take rows blockIdx.x, + gridDim.x, ... and add their
 * row losses in double into g_ce_partial[block]; then one block adds the partials (cub, double)
 * into g_ce_total, which the host copies back. The two device globals need no allocation, so
 * the memory tables are unaffected. */
#define CE_BLOCKS 1024
static __device__ double g_ce_partial[CE_BLOCKS];
static __device__ double g_ce_total;

static __global__ void cross_entropy_forward_kernel(const float *logits, const int *targets,
                                                    int N, int V) {
    double block_total = 0.0;   /* meaningful in thread 0 */
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        if (targets[n] == IGNORE_INDEX) continue;   /* the whole block skips the row together */
        const float *row = logits + (size_t)n * V;
        softmax_state st = softmax_state_empty();
        for (int j = threadIdx.x; j < V; j += ROW_THREADS) st = softmax_state_add(st, row[j]);
        st = block_softmax_state(st);
        if (threadIdx.x == 0) block_total += cross_entropy_loss(row[targets[n]], st);
    }
    if (threadIdx.x == 0) g_ce_partial[blockIdx.x] = block_total;
}

static __global__ void cross_entropy_total_kernel(int nblocks) {
    typedef cub::BlockReduce<double, ROW_THREADS> BlockReduceDouble;
    __shared__ BlockReduceDouble::TempStorage temp;
    double acc = 0.0;
    for (int i = threadIdx.x; i < nblocks; i += ROW_THREADS) acc += g_ce_partial[i];
    double total = BlockReduceDouble(temp).Sum(acc);   /* valid in thread 0 only */
    if (threadIdx.x == 0) g_ce_total = total;
}

float cross_entropy_forward(const float *logits, const int *targets, int N, int V) {
    if (N == 0) return 0.0f;
    int nblocks = N < CE_BLOCKS ? N : CE_BLOCKS;
    cross_entropy_forward_kernel<<<nblocks, ROW_THREADS, 0, cuda_stream()>>>(logits, targets, N, V);
    CUDA_CHECK_LAUNCH();
    cross_entropy_total_kernel<<<1, ROW_THREADS, 0, cuda_stream()>>>(nblocks);
    CUDA_CHECK_LAUNCH();
    double total = 0.0;
    CUDA_CHECK(cudaMemcpyFromSymbolAsync(&total, g_ce_total, sizeof total, 0,
                                         cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));   /* the host reads `total` next */
    return (float)total;
}

/* One block per row. dlogits may alias logits: the row's softmax state is complete (and shared
 * by all threads) before any thread overwrites an element, and each thread reads its element
 * before writing it. */
static __global__ void cross_entropy_backward_kernel(float *dlogits, const float *logits,
                                                     const int *targets, int V, float grad_scale) {
    size_t n = blockIdx.x;
    const float *row = logits + n * V;
    float *drow = dlogits + n * V;
    int target = targets[n];
    if (target == IGNORE_INDEX) {   /* the whole block takes this branch */
        for (int j = threadIdx.x; j < V; j += ROW_THREADS) drow[j] = 0.0f;
        return;
    }
    softmax_state st = softmax_state_empty();
    for (int j = threadIdx.x; j < V; j += ROW_THREADS) st = softmax_state_add(st, row[j]);
    st = block_softmax_state(st);
    for (int j = threadIdx.x; j < V; j += ROW_THREADS)
        drow[j] = cross_entropy_grad(row[j], j == target, st, grad_scale);
}

void cross_entropy_backward(float *dlogits, const float *logits, const int *targets,
                            int N, int V, float grad_scale) {
    if (N == 0) return;
    cross_entropy_backward_kernel<<<N, ROW_THREADS, 0, cuda_stream()>>>(dlogits, logits, targets,
                                                                         V, grad_scale);
    CUDA_CHECK_LAUNCH();
}

/* ---- AdamW ---------------------------------------------------------------------------------- */

static __global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n,
                                    float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float bias_correction1,
                                    float bias_correction2) {
    GRID_STRIDE_LOOP(i, n)
        adamw_update(&p[i], &m[i], &v[i], g[i], lr, beta1, beta2, eps, weight_decay,
                     bias_correction1, bias_correction2);
}

/* The bias corrections are per step, not per element: computed once here, on the host, with
 * the same function the CPU twin uses. */
void adamw_step(float *p, const float *g, float *m, float *v, size_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int t) {
    if (n == 0) return;
    float bias_correction1 = adamw_bias_correction(beta1, t);
    float bias_correction2 = adamw_bias_correction(beta2, t);
    adamw_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(
        p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2);
    CUDA_CHECK_LAUNCH();
}
