/* embed.cu — embedding lookup: out[i] = row ids[i] of W as f32, any kiln_matrix format (dense
 * f32/f16/bf16 or affine-quantized). Ids outside [0, rows) give a zero row. */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/quant.cuh"

__global__ void k_embed(float *out, const int32_t *ids, kiln_matrix w) {
    KCU_PDL_ENTER();
    int64_t t = blockIdx.x;
    int64_t r = ids[t];
    float *o = out + t * w.cols;
    bool ok = r >= 0 && r < w.rows;
    for (int64_t c = threadIdx.x; c < w.cols; c += blockDim.x)
        o[c] = ok ? kcu_matrix_at(w, r, c) : 0.0f;
}

extern "C" void kcu_embed(kiln_backend *be, float *out, const int32_t *ids, int64_t n,
                          const kiln_matrix *w) {
    kcu_state *st = kcu_st(be);
    if (n <= 0) return;
    KCU_LAUNCH(st, k_embed, (unsigned)n, 256, 0, out, ids, *w);
    KCU_LAUNCHED(st);
}
