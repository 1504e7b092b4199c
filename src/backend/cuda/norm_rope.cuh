/* norm_rope.cuh — one attention head's RMSNorm + RoPE by a whole block (internal), shared by
 * qk_norm_rope (fused.cu) and the cache's fused q/k prep + K/V store (kv_cache.cu). */
#ifndef KILN_CUDA_NORM_ROPE_CUH
#define KILN_CUDA_NORM_ROPE_CUH

#include "backend/cuda/cuda_common.cuh"

/* xh [head_dim] in place: RMSNorm'd with nw (when given), then its first 2*half dims rotated
 * (rotate_half pairs, angle p*inv_freq in f32, sine and cosine in double as in rope.cu). sh:
 * shared memory [head_dim + 33]. Every thread of the block must call it. */
__device__ __forceinline__ void kcu_norm_rope_head(float *xh, const float *nw, float p,
                                                   int head_dim, int half, const float *inv_freq,
                                                   float eps, float *sh) {
    float *part = sh + head_dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float v = xh[i];
        sh[i] = v;
        ss += v * v;
    }
    if (nw) {
        float inv = rsqrtf(kcu_block_sum(ss, part) / (float)head_dim + eps);
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) sh[i] = sh[i] * inv * nw[i];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float v = sh[i];
        if (i < 2 * half) {
            int j = i < half ? i : i - half;
            double s, c;
            sincos((double)(p * inv_freq[j]), &s, &c);
            v = i < half ? sh[i] * (float)c - sh[i + half] * (float)s
                         : sh[i] * (float)c + sh[i - half] * (float)s;
        }
        xh[i] = v;
    }
}

#endif
