/* fused.cu — small ops of a decoder layer merged into one launch each, so a decode step has fewer
 * kernels: residual add + RMSNorm, RMSNorm + residual add (post-norm), and the per-head q/k
 * RMSNorm + RoPE of q and k. Each has the semantics of its CPU reference (kiln_cpu_add_rmsnorm,
 * kiln_cpu_norm_add, kiln_cpu_qk_norm_rope). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/norm_rope.cuh"

/* One block per row: x += h, then y = rmsnorm(x) * (w | 1+w). Each thread rereads only the
 * elements it wrote itself. */
__global__ void k_add_rmsnorm(float *x, const float *h, float *y, const float *w, int64_t dim,
                              float eps, int plus_one) {
    KCU_PDL_ENTER();
    __shared__ float part[33];
    float *xr = x + blockIdx.x * dim;
    const float *hr = h + blockIdx.x * dim;
    float *yr = y + blockIdx.x * dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i] + hr[i];
        xr[i] = v;
        ss += v * v;
    }
    float inv = rsqrtf(kcu_block_sum(ss, part) / (float)dim + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float g = w ? (plus_one ? 1.0f + w[i] : w[i]) : 1.0f;
        yr[i] = xr[i] * inv * g;
    }
}

extern "C" void kcu_add_rmsnorm(kiln_backend *be, float *x, const float *h, float *y,
                                const float *w, int64_t n, int64_t dim, float eps, bool plus_one) {
    kcu_state *st = kcu_st(be);
    if (n <= 0 || dim <= 0) return;
    int threads = dim >= 4096 ? 1024 : dim >= 1024 ? 512 : 256;
    KCU_LAUNCH(st, k_add_rmsnorm, (unsigned)n, threads, 0, x, h, y, w, dim, eps, plus_one ? 1 : 0);
    KCU_LAUNCHED(st);
}

/* One block per row: x = (x + rmsnorm(h) * (w | 1+w)) * scale; h is left as it was. */
__global__ void k_norm_add(float *x, const float *h, const float *w, int64_t dim, float eps,
                           int plus_one, float scale) {
    KCU_PDL_ENTER();
    __shared__ float part[33];
    float *xr = x + blockIdx.x * dim;
    const float *hr = h + blockIdx.x * dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += hr[i] * hr[i];
    const float inv = rsqrtf(kcu_block_sum(ss, part) / (float)dim + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const float g = w ? (plus_one ? 1.0f + w[i] : w[i]) : 1.0f;
        xr[i] = (xr[i] + hr[i] * inv * g) * scale;
    }
}

extern "C" void kcu_norm_add(kiln_backend *be, float *x, float *h, const float *w, int64_t n,
                             int64_t dim, float eps, bool plus_one, float scale) {
    kcu_state *st = kcu_st(be);
    if (n <= 0 || dim <= 0) return;
    int threads = dim >= 4096 ? 1024 : dim >= 1024 ? 512 : 256;
    KCU_LAUNCH(st, k_norm_add, (unsigned)n, threads, 0, x, h, w, dim, eps, plus_one ? 1 : 0, scale);
    KCU_LAUNCHED(st);
}

/* One block per (token, head) over the q heads then the k heads: the head (head_dim <= 1024
 * floats) is staged in shared memory, RMSNorm'd with its norm weight (when given), then its
 * first rot_dim dims are rotated (rotate_half pairs, angle pos*inv_freq in f32, sine and cosine
 * in double as in rope.cu). */
__global__ void k_qk_norm_rope(float *q, float *k, const int32_t *pos, int n_heads, int n_kv_heads,
                               int head_dim, int half, const float *inv_freq, const float *q_norm,
                               const float *k_norm, float eps) {
    KCU_PDL_ENTER();
    extern __shared__ float sh[]; /* [head_dim] then [33] for the reduction */
    const int64_t t = blockIdx.x;
    const int hh = blockIdx.y;
    const bool is_q = hh < n_heads;
    float *xh =
        is_q ? q + (t * n_heads + hh) * head_dim : k + (t * n_kv_heads + (hh - n_heads)) * head_dim;
    kcu_norm_rope_head(xh, is_q ? q_norm : k_norm, (float)pos[t], head_dim, half, inv_freq, eps,
                       sh);
}

extern "C" void kcu_qk_norm_rope(kiln_backend *be, float *q, float *k, const int32_t *pos,
                                 int64_t n, int n_heads, int n_kv_heads, int head_dim, int rot_dim,
                                 const float *inv_freq, const float *q_norm, const float *k_norm,
                                 float eps) {
    kcu_state *st = kcu_st(be);
    if (n <= 0 || head_dim <= 0) return;
    if (head_dim > 1024) {
        kcu_report(st, "qk_norm_rope", "head_dim > 1024", __FILE__, __LINE__);
        return;
    }
    int threads = head_dim >= 256 ? 256 : head_dim > 64 ? 128 : 64;
    size_t smem = sizeof(float) * ((size_t)head_dim + 33);
    dim3 grid((unsigned)n, (unsigned)(n_heads + n_kv_heads));
    KCU_LAUNCH(st, k_qk_norm_rope, grid, threads, smem, q, k, pos, n_heads, n_kv_heads, head_dim,
               rot_dim / 2, inv_freq, q_norm, k_norm, eps);
    KCU_LAUNCHED(st);
}
