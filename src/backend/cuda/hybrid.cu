/* hybrid.cu — the ops of the hybrid Qwen families (Gated DeltaNet layers, gated attention, sparse
 * MoE): strided block copy, zero fill, sigmoid gate, row L2 norm, the causal depthwise conv with
 * its carried state, the decay/beta gates, the gated delta rule, and the MoE row gather / weighted
 * scatter-add. Semantics are those of the CPU references (cpu_ops.h, cpu_deltanet.h). The delta
 * rule here walks tokens one by one (decode, short calls); prefill calls go to gdn_chunked.cu. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#include <stdlib.h>
#include <string.h>

extern "C" void kcu_copy2d(kiln_backend *be, float *dst, int64_t dst_stride, const float *src,
                           int64_t src_stride, int64_t rows, int64_t cols) {
    kcu_state *st = kcu_st(be);
    if (rows <= 0 || cols <= 0) return;
    KCU_CHECK(st,
              cudaMemcpy2DAsync(dst, (size_t)dst_stride * sizeof(float), src,
                                (size_t)src_stride * sizeof(float), (size_t)cols * sizeof(float),
                                (size_t)rows, cudaMemcpyDeviceToDevice, st->stream));
}

/* one element per thread over n0 * n1 * cols (grid-stride) */
__global__ void k_copy3d(float *dst, int64_t d0, int64_t d1, const float *src, int64_t s0,
                         int64_t s1, int64_t n0, int64_t n1, int64_t cols) {
    KCU_PDL_ENTER();
    const int64_t total = n0 * n1 * cols;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = e % cols, ij = e / cols, j = ij % n1, i = ij / n1;
        dst[i * d0 + j * d1 + c] = src[i * s0 + j * s1 + c];
    }
}

extern "C" void kcu_copy3d(kiln_backend *be, float *dst, int64_t dst_s0, int64_t dst_s1,
                           const float *src, int64_t src_s0, int64_t src_s1, int64_t n0, int64_t n1,
                           int64_t cols) {
    kcu_state *st = kcu_st(be);
    if (n0 <= 0 || n1 <= 0 || cols <= 0) return;
    const int64_t total = n0 * n1 * cols;
    KCU_LAUNCH(st, k_copy3d, kcu_blocks(total, 256, 65536), 256, 0, dst, dst_s0, dst_s1, src,
               src_s0, src_s1, n0, n1, cols);
    KCU_LAUNCHED(st);
}

extern "C" void kcu_zero(kiln_backend *be, float *x, int64_t n) {
    kcu_state *st = kcu_st(be);
    if (n <= 0) return;
    KCU_CHECK(st, cudaMemsetAsync(x, 0, (size_t)n * sizeof(float), st->stream));
}

__global__ void k_sigmoid_mul(float *y, const float *x, const float *g, int64_t n) {
    KCU_PDL_ENTER();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = x[i] * (1.0f / (1.0f + expf(-g[i])));
}

extern "C" void kcu_sigmoid_mul(kiln_backend *be, float *y, const float *x, const float *gate,
                                int64_t n) {
    kcu_state *st = kcu_st(be);
    if (n <= 0) return;
    KCU_LAUNCH(st, k_sigmoid_mul, kcu_blocks(n, 256, 65536), 256, 0, y, x, gate, n);
    KCU_LAUNCHED(st);
}

/* one block (128 threads) per row */
__global__ void k_l2norm(float *x, int dim, float eps) {
    KCU_PDL_ENTER();
    __shared__ float part[33];
    float *xr = x + (int64_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = 1.0f / sqrtf(kcu_block_sum(ss, part) + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] *= inv;
}

extern "C" void kcu_l2norm(kiln_backend *be, float *x, int64_t rows, int dim, float eps) {
    kcu_state *st = kcu_st(be);
    if (rows <= 0 || dim <= 0) return;
    KCU_LAUNCH(st, k_l2norm, (unsigned)rows, 128, 0, x, dim, eps);
    KCU_LAUNCHED(st);
}

/* out[t, c] for every (t, c): the window of K inputs ending at t, rows before 0 from the state
 * [K-1, C] (oldest first); the state is updated afterwards by k_gdn_conv_state. */
__global__ void k_gdn_conv_out(float *out, const float *x, int64_t n, int C, const float *w, int K,
                               const float *state) {
    KCU_PDL_ENTER();
    const int P = K - 1;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * C;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / C;
        const int c = (int)(i % C);
        float acc = 0.0f;
        for (int j = 0; j < K; j++) {
            int64_t src = t - P + j;
            float xv = src >= 0 ? x[src * C + c] : state[(P + src) * C + c];
            acc += w[(int64_t)c * K + j] * xv;
        }
        out[i] = acc / (1.0f + expf(-acc));
    }
}

/* new state = the last K-1 rows of (state ++ x); each thread owns one channel, and for n < K-1
 * reads row i + n before it writes row i (ascending i), so no row is overwritten before use */
__global__ void k_gdn_conv_state(const float *x, int64_t n, int C, int P, float *state) {
    KCU_PDL_ENTER();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    if (n >= P) {
        for (int i = 0; i < P; i++) state[(int64_t)i * C + c] = x[(n - P + i) * C + c];
    } else {
        for (int i = 0; i < P; i++)
            state[(int64_t)i * C + c] =
                i < P - n ? state[(i + n) * C + c] : x[(i - (P - n)) * C + c];
    }
}

extern "C" void kcu_gdn_conv(kiln_backend *be, float *out, const float *x, int64_t n, int channels,
                             const float *w, int kernel, float *state) {
    kcu_state *st = kcu_st(be);
    if (n <= 0 || channels <= 0 || kernel <= 0) return;
    KCU_LAUNCH(st, k_gdn_conv_out, kcu_blocks(n * channels, 256, 65536), 256, 0, out, x, n,
               channels, w, kernel, state);
    KCU_LAUNCHED(st);
    if (kernel > 1) {
        KCU_LAUNCH(st, k_gdn_conv_state, (unsigned)((channels + 255) / 256), 256, 0, x, n, channels,
                   kernel - 1, state);
        KCU_LAUNCHED(st);
    }
}

__global__ void k_gdn_gates(float *g, float *beta, const float *a, const float *b, int64_t n,
                            int nv, const float *neg_a, const float *dt_bias) {
    KCU_PDL_ENTER();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * nv;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int h = (int)(i % nv);
        float xa = a[i] + dt_bias[h];
        float sp = xa > 20.0f ? xa : log1pf(expf(xa));
        g[i] = neg_a[h] * sp;
        beta[i] = 1.0f / (1.0f + expf(-b[i]));
    }
}

extern "C" void kcu_gdn_gates(kiln_backend *be, float *g, float *beta, const float *a,
                              const float *b, int64_t n, int n_v_heads, const float *neg_a,
                              const float *dt_bias) {
    kcu_state *st = kcu_st(be);
    if (n <= 0 || n_v_heads <= 0) return;
    KCU_LAUNCH(st, k_gdn_gates, kcu_blocks(n * n_v_heads, 256, 65536), 256, 0, g, beta, a, b, n,
               n_v_heads, neg_a, dt_bias);
    KCU_LAUNCHED(st);
}

#define GDN_THREADS 32

/* Gated delta rule: block (h, column tile) of one warp; thread c owns column c of the head's
 * state S [dk, dv] (so no thread touches another's column) and walks the n tokens in order.
 * q_t / k_t of the head's key head are staged in shared memory ([2, dk] floats). */
__global__ void k_gdn_delta(int64_t n, int nk, int nv, int dk, int dv, const float *q,
                            const float *k, const float *v, const float *g, const float *beta,
                            float *S, float *out) {
    KCU_PDL_ENTER();
    extern __shared__ float qk[]; /* [2, dk] */
    float *sq = qk, *sk = qk + dk;
    const int h = blockIdx.x, r = nv / nk, kh = h / r;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    float *Sh = S + (int64_t)h * dk * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    for (int64_t t = 0; t < n; t++) {
        __syncthreads(); /* the previous token's reads of sq / sk are done */
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            sq[i] = q[(t * nk + kh) * dk + i];
            sk[i] = k[(t * nk + kh) * dk + i];
        }
        __syncthreads();
        if (c >= dv) continue;
        const float decay = expf(g[t * nv + h]), bt = beta[t * nv + h];
        float kS = 0.0f;
        for (int i = 0; i < dk; i++) kS += sk[i] * Sh[(int64_t)i * dv + c];
        const float delta = bt * (v[(t * nv + h) * dv + c] - decay * kS);
        float o = 0.0f;
        for (int i = 0; i < dk; i++) {
            float s = decay * Sh[(int64_t)i * dv + c] + sk[i] * delta;
            Sh[(int64_t)i * dv + c] = s;
            o += sq[i] * s;
        }
        out[(t * nv + h) * dv + c] = o * scale;
    }
}

/* Register-resident form for dk = 4 * R (R <= 32): a block of 128 threads covers 32 value
 * columns; the 4 lanes 4c'..4c'+3 of a warp share column c and hold rows j*R .. j*R+R-1 of it
 * (j = lane & 3) in registers for all n tokens, so S is read and written once per call. The two
 * dot products over dk are per-lane partial sums added across the 4 lanes by shuffles; every lane
 * runs the shuffles (columns past dv compute on zeros and store nothing). */
template <int R>
__global__ void __launch_bounds__(128)
    k_gdn_delta_reg(int64_t n, int nk, int nv, int dk, int dv, const float *q, const float *k,
                    const float *v, const float *g, const float *beta, float *S, float *out) {
    KCU_PDL_ENTER();
    extern __shared__ float qk[]; /* [2, dk] */
    float *sq = qk, *sk = qk + dk;
    const int h = blockIdx.x, r = nv / nk, kh = h / r;
    const int j = threadIdx.x & 3, c = blockIdx.y * 32 + (threadIdx.x >> 2);
    const bool live = c < dv;
    float *Sh = S + (int64_t)h * dk * dv;
    float s[R];
#pragma unroll
    for (int i = 0; i < R; i++) s[i] = live ? Sh[(int64_t)(j * R + i) * dv + c] : 0.0f;
    const float scale = 1.0f / sqrtf((float)dk);
    for (int64_t t = 0; t < n; t++) {
        __syncthreads(); /* the previous token's reads of sq / sk are done */
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            sq[i] = q[(t * nk + kh) * dk + i];
            sk[i] = k[(t * nk + kh) * dk + i];
        }
        __syncthreads();
        const float decay = expf(g[t * nv + h]), bt = beta[t * nv + h];
        const float *kk = sk + j * R, *qq = sq + j * R;
        float kS = 0.0f;
#pragma unroll
        for (int i = 0; i < R; i++) kS += kk[i] * s[i];
        kS += __shfl_xor_sync(0xffffffffu, kS, 1);
        kS += __shfl_xor_sync(0xffffffffu, kS, 2);
        const float vc = live ? v[(t * nv + h) * dv + c] : 0.0f;
        const float delta = bt * (vc - decay * kS);
        float o = 0.0f;
#pragma unroll
        for (int i = 0; i < R; i++) {
            s[i] = decay * s[i] + kk[i] * delta;
            o += qq[i] * s[i];
        }
        o += __shfl_xor_sync(0xffffffffu, o, 1);
        o += __shfl_xor_sync(0xffffffffu, o, 2);
        if (live && j == 0) out[(t * nv + h) * dv + c] = o * scale;
    }
    if (live) {
#pragma unroll
        for (int i = 0; i < R; i++) Sh[(int64_t)(j * R + i) * dv + c] = s[i];
    }
}

template <int R>
static void launch_delta_reg(kcu_state *st, const kiln_gdn_dims *d, int64_t n, const float *q,
                             const float *k, const float *v, const float *g, const float *beta,
                             float *state, float *out) {
    dim3 grid((unsigned)d->n_v_heads, (unsigned)((d->dv + 31) / 32));
    KCU_LAUNCH(st, (k_gdn_delta_reg<R>), grid, 128, (size_t)2 * d->dk * sizeof(float), n,
               d->n_k_heads, d->n_v_heads, d->dk, d->dv, q, k, v, g, beta, state, out);
}

/* The column-per-thread kernel is the default: it is the one that passed on the H200. The
 * register-resident kernel (KILN_CUDA_GDN=2) has test_cuda_ops cases against the CPU reference
 * but has not run on a GPU yet, so it stays opt-in until it has. */
static int gdn_force_simple = -1;

extern "C" void kiln_cuda_set_gdn_simple(int on) {
    gdn_force_simple = on;
}

extern "C" void kcu_gdn_delta(kiln_backend *be, const kiln_gdn_dims *d, int64_t n, const float *q,
                              const float *k, const float *v, const float *g, const float *beta,
                              float *state, float *out) {
    kcu_state *st = kcu_st(be);
    if (n <= 0) return;
    if (d->n_k_heads <= 0 || d->n_v_heads % d->n_k_heads || d->dk <= 0 || d->dv <= 0 ||
        d->dk > 4096) {
        kcu_report(st, "gdn_delta", "bad head geometry", __FILE__, __LINE__);
        return;
    }
    /* prefill: the chunked WY form (gdn_chunked.cu) parallelises over the tokens of a chunk */
    if (kcu_gdn_delta_chunked(be, d, n, q, k, v, g, beta, state, out)) return;
    if (gdn_force_simple < 0) {
        const char *e = getenv("KILN_CUDA_GDN");
        gdn_force_simple = !(e && strcmp(e, "2") == 0);
    }
    const int R = d->dk % 4 == 0 ? d->dk / 4 : 0;
    if (!gdn_force_simple && (R == 4 || R == 8 || R == 16 || R == 32)) {
        if (R == 4) launch_delta_reg<4>(st, d, n, q, k, v, g, beta, state, out);
        if (R == 8) launch_delta_reg<8>(st, d, n, q, k, v, g, beta, state, out);
        if (R == 16) launch_delta_reg<16>(st, d, n, q, k, v, g, beta, state, out);
        if (R == 32) launch_delta_reg<32>(st, d, n, q, k, v, g, beta, state, out);
        KCU_LAUNCHED(st);
        return;
    }
    dim3 grid((unsigned)d->n_v_heads, (unsigned)((d->dv + GDN_THREADS - 1) / GDN_THREADS));
    KCU_LAUNCH(st, k_gdn_delta, grid, GDN_THREADS, (size_t)2 * d->dk * sizeof(float), n,
               d->n_k_heads, d->n_v_heads, d->dk, d->dv, q, k, v, g, beta, state, out);
    KCU_LAUNCHED(st);
}

__global__ void k_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t n,
                              int64_t width) {
    KCU_PDL_ENTER();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * width;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / width, c = i % width;
        dst[i] = src[(int64_t)rows[r] * width + c];
    }
}

extern "C" void kcu_gather_rows(kiln_backend *be, float *dst, const float *src, const int32_t *rows,
                                int64_t n, int64_t width) {
    kcu_state *st = kcu_st(be);
    if (n <= 0 || width <= 0) return;
    KCU_LAUNCH(st, k_gather_rows, kcu_blocks(n * width, 256, 65536), 256, 0, dst, src, rows, n,
               width);
    KCU_LAUNCHED(st);
}

/* rows are distinct within one call, so every output element has one writer */
__global__ void k_scatter_add_rows(float *y, const float *src, const int32_t *rows,
                                   const float *weights, int64_t n, int64_t width) {
    KCU_PDL_ENTER();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * width;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / width, c = i % width;
        y[(int64_t)rows[r] * width + c] += weights[r] * src[i];
    }
}

extern "C" void kcu_scatter_add_rows(kiln_backend *be, float *y, const float *src,
                                     const int32_t *rows, const float *weights, int64_t n,
                                     int64_t width) {
    kcu_state *st = kcu_st(be);
    if (n <= 0 || width <= 0) return;
    KCU_LAUNCH(st, k_scatter_add_rows, kcu_blocks(n * width, 256, 65536), 256, 0, y, src, rows,
               weights, n, width);
    KCU_LAUNCHED(st);
}
