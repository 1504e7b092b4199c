/* rmsnorm.cu — y = x * rsqrt(mean(x^2) + eps) * (w | 1+w | 1): one block per row, f32 sum of
 * squares reduced through warp shuffles. y may alias x. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

__global__ void k_rmsnorm(float *y, const float *x, const float *w, int64_t dim, float eps,
                          int plus_one) {
    KCU_PDL_ENTER();
    __shared__ float part[33];
    const float *xr = x + blockIdx.x * dim;
    float *yr = y + blockIdx.x * dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = rsqrtf(kcu_block_sum(ss, part) / (float)dim + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float g = w ? (plus_one ? 1.0f + w[i] : w[i]) : 1.0f;
        yr[i] = xr[i] * inv * g;
    }
}

extern "C" void kcu_rmsnorm(kiln_backend *be, float *y, const float *x, const float *w, int64_t n,
                            int64_t dim, float eps, bool plus_one) {
    kcu_state *st = kcu_st(be);
    if (n <= 0 || dim <= 0) return;
    int threads = dim >= 4096 ? 1024 : dim >= 1024 ? 512 : 256;
    KCU_LAUNCH(st, k_rmsnorm, (unsigned)n, threads, 0, y, x, w, dim, eps, plus_one ? 1 : 0);
    KCU_LAUNCHED(st);
}
