/* quant.cuh — reading MLX affine-quantized weights on the device (layout: backend/matrix.h):
 * code j of a row at bit j*bits of the row's little-endian word stream, w = scale*code + bias. */
#ifndef KILN_CUDA_QUANT_CUH
#define KILN_CUDA_QUANT_CUH

#include "backend/cuda/cuda_common.cuh"

/* Code j of a row (any bits 2..8): one or two 32-bit words. */
__device__ __forceinline__ uint32_t kcu_code(const uint32_t *row_words, int64_t j, int bits) {
    int64_t bit = j * bits;
    int64_t w = bit >> 5;
    int sh = (int)(bit & 31);
    uint32_t v = row_words[w] >> sh;
    if (sh + bits > 32) v |= row_words[w + 1] << (32 - sh);
    return v & ((1u << bits) - 1u);
}

/* w[r][c] of any kiln_matrix format, as f32 (slow path: embeddings, odd shapes, dequant). */
__device__ __forceinline__ float kcu_matrix_at(const kiln_matrix &m, int64_t r, int64_t c) {
    if (m.dtype != KILN_DT_U32) return kcu_load(m.data, r * m.cols + c, m.dtype);
    const uint32_t *rw = (const uint32_t *)m.data + r * (m.cols * m.bits / 32);
    int64_t g = r * (m.cols / m.group_size) + c / m.group_size;
    float s = kcu_load(m.scales, g, m.scale_dtype), b = kcu_load(m.biases, g, m.scale_dtype);
    return s * (float)kcu_code(rw, c, m.bits) + b;
}

/* Exact float of a small integer code: one OR and one subtract instead of a conversion. */
__device__ __forceinline__ float kcu_code_f(uint32_t c) {
    return __uint_as_float(0x4B000000u | c) - 8388608.0f;
}

/* Fewest tokens at which quantized weights take matmul.cu's dequantize + cuBLAS path instead of
 * the tensor-core GEMM (depends on the exact / fast mode). */
int kcu_quant_cublas_min_n(void);
/* Fast matmul mode (kiln_set_matmul_mode("fast"), --fast-math): one bf16 product in the GEMMs,
 * one int8 digit of x in the dp4a GEMV. */
bool kcu_fast_math(void);

/* The dp4a GEMV of qgemv.cu (4/8-bit codes, bf16 / f16 scales, n <= 8): whether it takes w, and
 * the call (false when it does not apply). */
bool kcu_qgemv_dp4a_applies(const kiln_matrix *w, int64_t n);
bool kcu_qgemv_dp4a(kcu_state *st, float *y, const float *x, int64_t n, const kiln_matrix *w);
bool kcu_qgemv_dp4a_multi(kcu_state *st, int count, float *const *ys, const float *x, int64_t n,
                          const kiln_matrix *const *ws);
/* The decode-layer fusions (backend.h: matmul_norm, matmul_add, matmul_norm_glu) on the dp4a GEMV:
 * false, with nothing launched, where it does not apply (the caller composes plain ops). */
bool kcu_qgemv_dp4a_norm(kcu_state *st, int count, float *const *ys, const float *x, int64_t n,
                         const kiln_matrix *const *ws, const float *norm_w, float eps,
                         bool plus_one);
bool kcu_qgemv_dp4a_add(kcu_state *st, float *y, const float *x, int64_t n, const kiln_matrix *w);
bool kcu_qgemv_dp4a_norm_glu(kcu_state *st, float *out, const float *x, int64_t n,
                             const kiln_matrix *wg, const kiln_matrix *wu, const float *norm_w,
                             float eps, bool plus_one, int act);

#endif
