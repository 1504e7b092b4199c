/* rope.cu — rotary embedding in place, HF rotate_half layout on the first rot_dim dims of each
 * head: pairs (i, i + rot_dim/2) turned by pos*inv_freq[i]. The angle is an f32 product as on the
 * CPU; its sine and cosine are taken in double, since --use_fast_math's sinf is far off for the
 * large angles of long contexts. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

__global__ void k_rope(float *x, const int32_t *pos, int n_heads, int head_dim, int half,
                       const float *inv_freq) {
    KCU_PDL_ENTER();
    int64_t t = blockIdx.x;
    float p = (float)pos[t];
    for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        int h = k / half, i = k % half;
        float ang = p * inv_freq[i];
        double s, c;
        sincos((double)ang, &s, &c);
        float *xh = x + (t * n_heads + h) * head_dim;
        float a = xh[i], b = xh[i + half];
        xh[i] = a * (float)c - b * (float)s;
        xh[i + half] = b * (float)c + a * (float)s;
    }
}

extern "C" void kcu_rope(kiln_backend *be, float *x, const int32_t *pos, int64_t n, int n_heads,
                         int head_dim, int rot_dim, const float *inv_freq) {
    kcu_state *st = kcu_st(be);
    if (n <= 0 || rot_dim < 2) return;
    int half = rot_dim / 2;
    int threads = n_heads * half >= 256 ? 256 : 128;
    KCU_LAUNCH(st, k_rope, (unsigned)n, threads, 0, x, pos, n_heads, head_dim, half, inv_freq);
    KCU_LAUNCHED(st);
}
