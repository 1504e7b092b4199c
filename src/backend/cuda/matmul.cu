/* matmul.cu — y[n, rows] = x[n, cols] @ W^T (+ bias), W in its stored format.
 *
 * Small n (decode, n <= 8): a GEMV kernel that streams W once. A block of 4 warps owns R=4 rows and
 * splits the columns between its warps; each lane reads 16-byte pieces of all R rows (dense: 8
 * values; quantized: 32 codes = `bits` words) and reuses each x load across the R rows and each
 * weight load across the n tokens. Quantized rows are dequantized in registers with the group
 * identity  sum_j (s*q_j + b) x_j = s * sum_j q_j x_j + b * sum_j x_j. All accumulation in f32.
 *
 * Large n (prefill): cuBLAS. bf16 weights go straight to cublasGemmEx against a bf16 copy of x;
 * f32 weights use cublasSgemm; f16 and quantized weights are first expanded to a bf16 scratch
 * slice of rows, then the same GemmEx. Anything the fast paths can't take (odd widths, unaligned
 * views) falls back to a plain per-element kernel. */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/quant.cuh"

#include <stdlib.h>

#define GEMV_WARPS 4
#define GEMV_R     4
#define GEMV_MAX_N 8

static int g_force_path = 0;
extern "C" void kiln_cuda_force_matmul_path(int path) {
    g_force_path = path;
}

/* ---- GEMV: dense ---- */

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

/* Sums acc[R][NT] over the block's warps and writes y (+bias). */
template <int NT>
__device__ __forceinline__ void gemv_finish(float (&acc)[GEMV_R][NT], float *y, int64_t n,
                                            int64_t rows, int64_t r0, const float *bias) {
    __shared__ float part[GEMV_WARPS][GEMV_R][NT];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < GEMV_R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = kcu_warp_sum(acc[r][t]);
            if (lane == 0) part[warp][r][t] = v;
        }
    __syncthreads();
    for (int i = threadIdx.x; i < GEMV_R * NT; i += blockDim.x) {
        int r = i / NT, t = i % NT;
        int64_t row = r0 + r;
        if (row >= rows || t >= n) continue;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < GEMV_WARPS; w++) v += part[w][r][t];
        if (bias) v += bias[row];
        y[t * rows + row] = v;
    }
}

template <int DT, int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_dense(float *y, const float *x, int64_t n, int64_t rows, int64_t cols, const void *w,
                 const float *bias) {
    const int es = DT == KILN_DT_F32 ? 4 : 2;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t r0 = (int64_t)blockIdx.x * GEMV_R;
    const char *wr[GEMV_R];
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) {
        int64_t row = r0 + r < rows ? r0 + r : rows - 1;
        wr[r] = (const char *)w + row * cols * es;
    }
    float acc[GEMV_R][NT];
#pragma unroll
    for (int r = 0; r < GEMV_R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
#pragma unroll 2
    for (int64_t c = ((int64_t)warp * 32 + lane) * 8; c < cols; c += GEMV_WARPS * 256) {
        float wv[GEMV_R][8];
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) dense8<DT>::load(wr[r] + c * es, wv[r]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const float4 *xp = (const float4 *)(x + t * cols + c);
            float4 a = __ldg(xp), b = __ldg(xp + 1);
            float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int r = 0; r < GEMV_R; r++)
#pragma unroll
                for (int i = 0; i < 8; i++) acc[r][t] = fmaf(wv[r][i], xv[i], acc[r][t]);
        }
    }
    gemv_finish<NT>(acc, y, n, rows, r0, bias);
}

/* ---- GEMV: affine-quantized ---- */

template <int B> __device__ __forceinline__ void load_words(const uint32_t *p, uint32_t (&wd)[B]) {
    if constexpr (B % 4 == 0) {
#pragma unroll
        for (int i = 0; i < B / 4; i++) {
            uint4 u = __ldg((const uint4 *)p + i);
            wd[4 * i] = u.x, wd[4 * i + 1] = u.y, wd[4 * i + 2] = u.z, wd[4 * i + 3] = u.w;
        }
    } else if constexpr (B % 2 == 0) {
#pragma unroll
        for (int i = 0; i < B / 2; i++) {
            uint2 u = __ldg((const uint2 *)p + i);
            wd[2 * i] = u.x, wd[2 * i + 1] = u.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < B; i++) wd[i] = __ldg(p + i);
    }
}

/* Code j of the lane's 32 as the float 1 + q*2^-B: the code lands in the top mantissa bits of 1.0f
 * (one shift and one and-or, no int->float conversion). Then sum_j q_j x_j =
 * 2^B * (sum_j f_j x_j - sum_j x_j); the products f_j*x_j round relative to |x_j|, which is
 * ~sqrt(12)*2^-23 of the signal q_j*x_j, well inside f32 accuracy of the result. */
template <int B> __device__ __forceinline__ float code_f1(const uint32_t (&wd)[B], int j) {
    const int bit = j * B, w = bit >> 5, sh = bit & 31;
    uint32_t v = sh + B <= 32 ? wd[w] >> sh : __funnelshift_r(wd[w], wd[w + 1], sh);
    return __uint_as_float(0x3F800000u | ((v & ((1u << B) - 1u)) << (23 - B)));
}

template <int B, int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32, NT == 1 ? 4 : 2)
    k_gemv_quant(float *y, const float *x, int64_t n, int64_t rows, int64_t cols, const uint32_t *w,
                 const void *scales, const void *biases, int sdt, int group, const float *bias) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t r0 = (int64_t)blockIdx.x * GEMV_R;
    int64_t wpr = cols * B / 32, gpr = cols / group;
    int64_t row[GEMV_R];
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) row[r] = r0 + r < rows ? r0 + r : rows - 1;
    float acc[GEMV_R][NT];
#pragma unroll
    for (int r = 0; r < GEMV_R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    const float scale_b = (float)(1 << B);
    for (int64_t c = ((int64_t)warp * 32 + lane) * 32; c < cols; c += GEMV_WARPS * 1024) {
        uint32_t wd[GEMV_R][B];
        float s[GEMV_R], bb[GEMV_R];
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) {
            load_words<B>(w + row[r] * wpr + c / 32 * B, wd[r]);
            int64_t g = row[r] * gpr + c / group;
            s[r] = kcu_load(scales, g, sdt) * scale_b;
            bb[r] = kcu_load(biases, g, sdt);
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const float4 *xp = (const float4 *)(x + t * cols + c);
            float d[GEMV_R], sx = 0.0f;
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) d[r] = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) { /* 4 codes at a time keeps few x values live */
                float4 a = __ldg(xp + k);
                float xv[4] = {a.x, a.y, a.z, a.w};
                sx += (a.x + a.y) + (a.z + a.w);
#pragma unroll
                for (int r = 0; r < GEMV_R; r++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        d[r] = fmaf(code_f1<B>(wd[r], 4 * k + i), xv[i], d[r]);
            }
#pragma unroll
            for (int r = 0; r < GEMV_R; r++)
                acc[r][t] = fmaf(s[r], d[r] - sx, fmaf(bb[r], sx, acc[r][t]));
        }
    }
    gemv_finish<NT>(acc, y, n, rows, r0, bias);
}

/* ---- fallbacks and helpers ---- */

/* One warp per (token, row): any format, any shape or alignment. */
__global__ void k_matmul_generic(float *y, const float *x, int64_t n, kiln_matrix w) {
    int64_t idx = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (idx >= n * w.rows) return;
    int64_t t = idx / w.rows, r = idx % w.rows;
    float acc = 0.0f;
    for (int64_t c = lane; c < w.cols; c += 32)
        acc = fmaf(kcu_matrix_at(w, r, c), x[t * w.cols + c], acc);
    acc = kcu_warp_sum(acc);
    if (lane == 0) y[t * w.rows + r] = acc + (w.bias ? w.bias[r] : 0.0f);
}

__global__ void k_to_bf16(__nv_bfloat16 *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

/* Rows [r0, r0+nr) of w as bf16 [nr, cols]. */
__global__ void k_dequant_bf16(__nv_bfloat16 *dst, kiln_matrix w, int64_t r0, int64_t nr) {
    int64_t total = nr * w.cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(kcu_matrix_at(w, r0 + i / w.cols, i % w.cols));
}

__global__ void k_add_bias(float *y, const float *bias, int64_t n, int64_t rows) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * rows;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += bias[i % rows];
}

/* ---- dispatch ---- */

template <int NT>
static void launch_gemv(kcu_state *st, float *y, const float *x, int64_t n, const kiln_matrix *w) {
    dim3 grid((unsigned)((w->rows + GEMV_R - 1) / GEMV_R)), block(GEMV_WARPS * 32);
    cudaStream_t s = st->stream;
    if (kiln_matrix_is_quantized(w)) {
        const uint32_t *q = (const uint32_t *)w->data;
        int sdt = (int)w->scale_dtype, g = w->group_size;
#define KQ(B)                                                                                      \
    k_gemv_quant<B, NT><<<grid, block, 0, s>>>(y, x, n, w->rows, w->cols, q, w->scales, w->biases, \
                                               sdt, g, w->bias)
        switch (w->bits) {
        case 2:
            KQ(2);
            break;
        case 3:
            KQ(3);
            break;
        case 4:
            KQ(4);
            break;
        case 5:
            KQ(5);
            break;
        case 6:
            KQ(6);
            break;
        default:
            KQ(8);
            break;
        }
#undef KQ
    } else if (w->dtype == KILN_DT_BF16) {
        k_gemv_dense<KILN_DT_BF16, NT>
            <<<grid, block, 0, s>>>(y, x, n, w->rows, w->cols, w->data, w->bias);
    } else if (w->dtype == KILN_DT_F16) {
        k_gemv_dense<KILN_DT_F16, NT>
            <<<grid, block, 0, s>>>(y, x, n, w->rows, w->cols, w->data, w->bias);
    } else {
        k_gemv_dense<KILN_DT_F32, NT>
            <<<grid, block, 0, s>>>(y, x, n, w->rows, w->cols, w->data, w->bias);
    }
    KCU_LAUNCHED(st);
}

static bool gemv_ok(const kiln_matrix *w, const float *x) {
    uintptr_t a = (uintptr_t)x | (uintptr_t)w->data;
    if (a & 15) return false;
    /* row starts stay 16-byte aligned: dense cols%8==0; quantized cols%32==0 (group%32==0) */
    if (kiln_matrix_is_quantized(w))
        return w->bits >= 2 && w->bits <= 8 && w->bits != 7 && w->group_size % 32 == 0 &&
               w->cols % w->group_size == 0;
    return w->cols % 8 == 0;
}

static void gemm_cublas(kcu_state *st, float *y, const float *x, int64_t n, const kiln_matrix *w) {
    const float one = 1.0f, zero = 0.0f;
    int64_t rows = w->rows, cols = w->cols;
    if (w->dtype == KILN_DT_F32) {
        KCU_CUBLAS(st, cublasSgemm(st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n,
                                   (int)cols, &one, (const float *)w->data, (int)cols, x, (int)cols,
                                   &zero, y, (int)rows));
    } else {
        /* scratch: x as bf16, then (unless W is bf16) a slice of W rows as bf16 */
        size_t xb = ((size_t)(n * cols) * 2 + 255) & ~(size_t)255;
        int64_t slice = w->dtype == KILN_DT_BF16 ? 0 : rows;
        const int64_t max_slice_elems = (int64_t)64 << 20; /* 128 MiB of bf16 */
        if (slice * cols > max_slice_elems) slice = max_slice_elems / cols;
        if (slice > 256) slice &= ~(int64_t)255;
        if (slice < 1 && w->dtype != KILN_DT_BF16) slice = 1;
        char *scr = (char *)kcu_scratch(st, xb + (size_t)(slice * cols) * 2);
        if (!scr) return;
        __nv_bfloat16 *xh = (__nv_bfloat16 *)scr, *wh = (__nv_bfloat16 *)(scr + xb);
        k_to_bf16<<<kcu_blocks(n * cols, 256, 8192), 256, 0, st->stream>>>(xh, x, n * cols);
        KCU_LAUNCHED(st);
        if (w->dtype == KILN_DT_BF16) {
            KCU_CUBLAS(st, cublasGemmEx(st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n,
                                        (int)cols, &one, w->data, CUDA_R_16BF, (int)cols, xh,
                                        CUDA_R_16BF, (int)cols, &zero, y, CUDA_R_32F, (int)rows,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        } else {
            for (int64_t r0 = 0; r0 < rows; r0 += slice) {
                int64_t nr = rows - r0 < slice ? rows - r0 : slice;
                k_dequant_bf16<<<kcu_blocks(nr * cols, 256, 16384), 256, 0, st->stream>>>(wh, *w,
                                                                                          r0, nr);
                KCU_LAUNCHED(st);
                KCU_CUBLAS(st, cublasGemmEx(st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)n,
                                            (int)cols, &one, wh, CUDA_R_16BF, (int)cols, xh,
                                            CUDA_R_16BF, (int)cols, &zero, y + r0, CUDA_R_32F,
                                            (int)rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            }
        }
    }
    if (w->bias) {
        k_add_bias<<<kcu_blocks(n * rows, 256, 8192), 256, 0, st->stream>>>(y, w->bias, n, rows);
        KCU_LAUNCHED(st);
    }
}

extern "C" void kcu_matmul(kiln_backend *be, float *y, const float *x, int64_t n,
                           const kiln_matrix *w) {
    kcu_state *st = kcu_st(be);
    if (n <= 0 || w->rows <= 0) return;
    int path = g_force_path;
    if (path == 0) path = n <= GEMV_MAX_N ? 1 : 2;
    if (path == 1 && n <= GEMV_MAX_N && gemv_ok(w, x)) {
        if (n == 1)
            launch_gemv<1>(st, y, x, n, w);
        else if (n == 2)
            launch_gemv<2>(st, y, x, n, w);
        else if (n <= 4)
            launch_gemv<4>(st, y, x, n, w);
        else
            launch_gemv<8>(st, y, x, n, w);
        return;
    }
    bool dense_ok =
        !kiln_matrix_is_quantized(w) &&
        (w->dtype == KILN_DT_F32 || w->dtype == KILN_DT_F16 || w->dtype == KILN_DT_BF16);
    if (path == 2 && (dense_ok || kiln_matrix_is_quantized(w)) && w->rows < INT32_MAX &&
        w->cols < INT32_MAX && n < INT32_MAX) {
        gemm_cublas(st, y, x, n, w);
        return;
    }
    int64_t warps = n * w->rows;
    k_matmul_generic<<<(unsigned)((warps * 32 + 255) / 256), 256, 0, st->stream>>>(y, x, n, *w);
    KCU_LAUNCHED(st);
}
