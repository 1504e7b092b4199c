/* gemv.cuh — what the GEMV kernels share (internal): the block geometry (GEMV_WARPS warps own
 * GEMV_R rows and split the columns; decode batches up to GEMV_MAX_N tokens), the 16-byte loader
 * of 8 weights per dtype, the test whether a matrix can take the GEMV path, the GLU activation and
 * the switch of the fused kernels. */
#ifndef KILN_CUDA_GEMV_CUH
#define KILN_CUDA_GEMV_CUH

#include "backend/cuda/cuda_common.cuh"

#define GEMV_WARPS 4
#define GEMV_R     4
#define GEMV_MAX_N 8

/* dense8<DT>::load(p, v): the 8 consecutive weights at p (16-byte aligned) as f32 */
template <int DT> struct dense8;
template <> struct dense8<KILN_DT_BF16> {
    static __device__ __forceinline__ void load(const void *p, float v[8]) {
        uint4 u = __ldg((const uint4 *)p);
        uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[2 * i] = __uint_as_float(w[i] << 16);
            v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
};
template <> struct dense8<KILN_DT_F16> {
    static __device__ __forceinline__ void load(const void *p, float v[8]) {
        uint4 u = __ldg((const uint4 *)p);
        uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = __half22float2(*(const __half2 *)&w[i]);
            v[2 * i] = f.x;
            v[2 * i + 1] = f.y;
        }
    }
};
template <> struct dense8<KILN_DT_F32> {
    static __device__ __forceinline__ void load(const void *p, float v[8]) {
        float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
    }
};

/* act(g) of a gated linear unit (kiln_glu_act): SiLU, or GELU with the tanh approximation. */
__device__ __forceinline__ float kcu_glu_act(float g, int act) {
    if (act == KILN_GLU_GELU_TANH) {
        const float k0 = 0.7978845608028654f; /* sqrt(2/pi) */
        return 0.5f * g * (1.0f + kcu_tanh(k0 * (g + 0.044715f * g * g * g)));
    }
    return g / (1.0f + __expf(-g));
}

/* The decode-layer fusion kernels of matmul_fused.cu (dense weights) are on unless
 * KILN_CUDA_FUSED=0 (then the ops run as compositions of plain ops, for A/B runs). */
bool kcu_fused_enabled(void);
/* The dp4a ones of qgemv.cu (quantized weights at n <= 8: fused norm / add / GLU, q/k/v in one
 * launch, digits made in the blocks) are on unless KILN_CUDA_QFUSED=0 or KILN_CUDA_FUSED=0.
 * (They were opt-in while test_qgemv_fused failed on the H200: first through the test's own bug,
 * then through the tensor-core GEMM's, which skipped a norm without a weight at n >= 2; both
 * fixed, the kernels themselves were right.) Tests switch them with kiln_cuda_set_qfused. */
bool kcu_qfused_enabled(void);

/* x and w->data 16-byte aligned and rows that keep 16-byte alignment (matmul.cu). */
bool kcu_gemv_ok(const kiln_matrix *w, const float *x);

#endif
