/* hybrid.cu — the ops of the hybrid Qwen families (Gated DeltaNet layers, gated attention, sparse
 * MoE): strided block copy, zero fill, sigmoid gate, row L2 norm, the causal depthwise conv with
 * its carried state, the decay/beta gates, the gated delta rule, and the MoE row gather / weighted
 * scatter-add. Semantics are those of the CPU references (cpu_ops.h, cpu_deltanet.h). The conv
 * and the delta rule take a batch of sequences, one launch per op for up to GDN_MAX_SEQ of them
 * (kernels in gdn_recurrent.cuh); the delta rule walks tokens one by one (decode, short calls),
 * and sequences with a prefill's worth of tokens go to gdn_chunked.cu. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/gdn_recurrent.cuh"

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

/* One block per token: its warps take the 2*nk q and k heads in turn (sum of squares by warp,
 * each head scaled by 1/sqrt(ss + eps) as k_l2norm), then all threads copy v. */
__global__ void k_gdn_split_qkv(float *q, float *k, float *v, const float *conv, int64_t C, int nk,
                                int dk, int64_t vd, float eps) {
    KCU_PDL_ENTER();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int64_t KD = (int64_t)nk * dk, t = blockIdx.x;
    const float *src = conv + t * C;
    for (int h = warp; h < 2 * nk; h += nw) {
        const float *x = src + (int64_t)h * dk; /* q heads, then k heads */
        float *y = (h < nk ? q : k) + t * KD + (int64_t)(h % nk) * dk;
        float ss = 0.0f;
        for (int i = lane; i < dk; i += 32) ss += x[i] * x[i];
        const float inv = 1.0f / sqrtf(kcu_warp_sum(ss) + eps);
        for (int i = lane; i < dk; i += 32) y[i] = x[i] * inv;
    }
    for (int64_t i = threadIdx.x; i < vd; i += blockDim.x) v[t * vd + i] = src[2 * KD + i];
}

extern "C" void kcu_gdn_split_qkv(kiln_backend *be, float *q, float *k, float *v, const float *conv,
                                  int64_t n, int64_t C, int nk, int dk, int64_t vd, float eps) {
    kcu_state *st = kcu_st(be);
    if (n <= 0 || nk <= 0 || dk <= 0) return;
    KCU_LAUNCH(st, k_gdn_split_qkv, (unsigned)n, 256, 0, q, k, v, conv, C, nk, dk, vd, eps);
    KCU_LAUNCHED(st);
}

/* One block (128 threads) per row: y = x * rsqrt(mean x^2 + eps) * w, then * silu(z) (k_rmsnorm
 * and k_silu_mul's arithmetic). */
__global__ void k_gated_rmsnorm(float *y, const float *x, const float *z, const float *w, int dim,
                                float eps) {
    KCU_PDL_ENTER();
    __shared__ float part[33];
    const int64_t r = blockIdx.x;
    const float *xr = x + r * dim, *zr = z + r * dim;
    float *yr = y + r * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(kcu_block_sum(ss, part) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float n = xr[i] * inv * (w ? w[i] : 1.0f), g = zr[i];
        yr[i] = g / (1.0f + __expf(-g)) * n;
    }
}

extern "C" void kcu_gated_rmsnorm(kiln_backend *be, float *y, const float *x, const float *z,
                                  const float *w, int64_t rows, int dim, float eps) {
    kcu_state *st = kcu_st(be);
    if (rows <= 0 || dim <= 0) return;
    KCU_LAUNCH(st, k_gated_rmsnorm, (unsigned)rows, 128, 0, y, x, z, w, dim, eps);
    KCU_LAUNCHED(st);
}

/* One launch of each conv kernel (gdn_recurrent.cuh) per GDN_MAX_SEQ sequences: the outputs of
 * every row, then each sequence's state roll (after the outputs have read the old state). */
extern "C" void kcu_gdn_conv(kiln_backend *be, float *out, const float *x, int n_seqs,
                             const int *n_tokens, int channels, const float *w, int kernel,
                             float *const *states) {
    kcu_state *st = kcu_st(be);
    if (n_seqs <= 0 || channels <= 0 || kernel <= 0) return;
    gdn_conv_launch L;
    memset(&L, 0, sizeof L);
    L.out = out;
    L.x = x;
    L.w = w;
    L.C = channels;
    L.K = kernel;
    auto all = [](int, int64_t) { return true; };
    gdn_for_groups(L.s, n_seqs, n_tokens, states, all, [&](int count) {
        L.n_seq = count;
        L.t_begin = L.s[0].t0;
        L.t_end = L.s[count - 1].t0 + L.s[count - 1].n;
        KCU_LAUNCH(st, k_gdn_conv_out, kcu_blocks((L.t_end - L.t_begin) * channels, 256, 65536),
                   256, 0, L);
        KCU_LAUNCHED(st);
        if (kernel > 1) {
            KCU_LAUNCH(st, k_gdn_conv_state,
                       dim3((unsigned)((channels + 255) / 256), (unsigned)count), 256, 0, L);
            KCU_LAUNCHED(st);
        }
    });
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

/* The register-resident kernel is the default where dk allows it (16/32/64/128): on the H200 it
 * passed the hybrid parity test and took Qwen3.5-4B-shape bf16 decode from 281.6 to 306.6 tok/s
 * at batch 1 (1497 to 1656 at batch 8). KILN_CUDA_GDN=1 forces the column-per-thread kernel. */
static int gdn_force_simple = -1;

extern "C" void kiln_cuda_set_gdn_simple(int on) {
    gdn_force_simple = on;
}

/* Sequences with enough tokens for the chunked form (gdn_chunked.cu, one sequence per call)
 * take it; the others run the recurrence, one launch per GDN_MAX_SEQ of them (grid.z =
 * sequence). */
extern "C" void kcu_gdn_delta(kiln_backend *be, const kiln_gdn_dims *d, int n_seqs,
                              const int *n_tokens, const float *q, const float *k, const float *v,
                              const float *g, const float *beta, float *const *states, float *out) {
    kcu_state *st = kcu_st(be);
    int64_t total = 0;
    for (int i = 0; i < n_seqs; i++) total += n_tokens[i] > 0 ? n_tokens[i] : 0;
    if (total <= 0) return;
    if (d->n_k_heads <= 0 || d->n_v_heads % d->n_k_heads || d->dk <= 0 || d->dv <= 0 ||
        d->dk > 4096) {
        kcu_report(st, "gdn_delta", "bad head geometry", __FILE__, __LINE__);
        return;
    }
    if (gdn_force_simple < 0) {
        const char *e = getenv("KILN_CUDA_GDN");
        gdn_force_simple = e && strcmp(e, "1") == 0;
    }
    const int nv = d->n_v_heads;
    const int64_t KD = (int64_t)d->n_k_heads * d->dk, VD = (int64_t)nv * d->dv;
    const int R = d->dk % 4 == 0 ? d->dk / 4 : 0;
    const bool reg = !gdn_force_simple && (R == 4 || R == 8 || R == 16 || R == 32);
    const size_t smem = (size_t)2 * d->dk * sizeof(float);
    gdn_delta_launch L;
    memset(&L, 0, sizeof L);
    L.q = q, L.k = k, L.v = v, L.g = g, L.beta = beta, L.out = out;
    L.nk = d->n_k_heads, L.nv = nv, L.dk = d->dk, L.dv = d->dv;
    /* false: the chunked form took sequence i */
    auto recurrent = [&](int i, int64_t t0) {
        return !kcu_gdn_delta_chunked(be, d, n_tokens[i], q + t0 * KD, k + t0 * KD, v + t0 * VD,
                                      g + t0 * nv, beta + t0 * nv, states[i], out + t0 * VD);
    };
    gdn_for_groups(L.s, n_seqs, n_tokens, states, recurrent, [&](int count) {
        if (reg) {
            const dim3 grid((unsigned)nv, (unsigned)((d->dv + 31) / 32), (unsigned)count);
            if (R == 4) KCU_LAUNCH(st, k_gdn_delta_reg<4>, grid, GDN_REG_THREADS, smem, L);
            if (R == 8) KCU_LAUNCH(st, k_gdn_delta_reg<8>, grid, GDN_REG_THREADS, smem, L);
            if (R == 16) KCU_LAUNCH(st, k_gdn_delta_reg<16>, grid, GDN_REG_THREADS, smem, L);
            if (R == 32) KCU_LAUNCH(st, k_gdn_delta_reg<32>, grid, GDN_REG_THREADS, smem, L);
        } else {
            const dim3 grid((unsigned)nv, (unsigned)((d->dv + GDN_THREADS - 1) / GDN_THREADS),
                            (unsigned)count);
            KCU_LAUNCH(st, k_gdn_delta, grid, GDN_THREADS, smem, L);
        }
        KCU_LAUNCHED(st);
    });
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
