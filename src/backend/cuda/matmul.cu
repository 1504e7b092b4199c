/* matmul.cu — y[n, rows] = x[n, cols] @ W^T (+ bias), W in its stored format.
 *
 * Small n (decode, n <= 8): a GEMV kernel that streams W once. A block of 4 warps owns R=4 rows and
 * splits the columns between its warps; each lane reads 16-byte pieces of all R rows (dense: 8
 * values; quantized: 32 codes = `bits` words) and reuses each x load across the R rows and each
 * weight load across the n tokens. Quantized rows are dequantized in registers with the group
 * identity  sum_j (s*q_j + b) x_j = s * sum_j q_j x_j + b * sum_j x_j. All accumulation in f32.
 *
 * Large n (prefill): cuBLAS. bf16 weights go straight to cublasGemmEx against x as a bf16 hi + lo
 * pair (exact mode) or one bf16 copy (fast mode); f32 weights use cublasSgemm; f16 and quantized
 * weights are first expanded to a bf16 scratch slice of rows (a hi + lo pair in exact mode), then
 * the same GemmEx. Anything the fast paths can't take (odd widths, unaligned
 * views) falls back to a plain per-element kernel. */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/gemm_tc.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/quant.cuh"
#include "backend/cuda/quant_words.cuh"

#include <stdlib.h>
#include <string.h>

#ifndef KCU_GEMM_SPLIT_DEFAULT
#define KCU_GEMM_SPLIT_DEFAULT 1
#endif
#ifndef KCU_QGEMV_DEFAULT
#define KCU_QGEMV_DEFAULT 0
#endif

static int g_force_path = 0;
extern "C" void kiln_cuda_force_matmul_path(int path) {
    g_force_path = path;
}

/* ---- GEMV: dense ---- */

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

/* The block's GEMV_R rows r0.. of a dense W: shared by the one-matrix and the multi kernels. */
template <int DT, int NT>
__device__ __forceinline__ void gemv_dense_rows(float *y, const float *x, int64_t n, int64_t rows,
                                                int64_t cols, const void *w, const float *bias,
                                                int64_t r0) {
    const int es = DT == KILN_DT_F32 ? 4 : 2;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const char *wr[GEMV_R];
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) {
        int64_t row = r0 + r < rows ? r0 + r : rows - 1;
        wr[r] = (const char *)w + row * cols * es;
    }
    /* the lane's first weight chunks head for L2 while the kernel before still runs (PDL) */
    const int64_t c_first = ((int64_t)warp * 32 + lane) * 8;
    if (c_first < cols)
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) kcu_prefetch_l2(wr[r] + c_first * es);
    KCU_PDL_ENTER();
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
            float4 a = kcu_ld(xp), b = kcu_ld(xp + 1);
            float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int r = 0; r < GEMV_R; r++)
#pragma unroll
                for (int i = 0; i < 8; i++) acc[r][t] = fmaf(wv[r][i], xv[i], acc[r][t]);
        }
    }
    gemv_finish<NT>(acc, y, n, rows, r0, bias);
}

template <int DT, int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_dense(float *y, const float *x, int64_t n, int64_t rows, int64_t cols, const void *w,
                 const float *bias) {
    gemv_dense_rows<DT, NT>(y, x, n, rows, cols, w, bias, (int64_t)blockIdx.x * GEMV_R);
}

/* Several dense matrices of one dtype that read the same x (q/k/v, gate/up) in one launch: block
 * b belongs to the matrix m with first[m] <= b < first[m+1]. */
#define GEMV_MULTI_MAX 4
struct gemv_multi {
    float *y[GEMV_MULTI_MAX];          /* [n, rows[m]] */
    const void *w[GEMV_MULTI_MAX];     /* [rows[m], cols] */
    const float *bias[GEMV_MULTI_MAX]; /* [rows[m]] or NULL */
    int64_t rows[GEMV_MULTI_MAX];
    unsigned first[GEMV_MULTI_MAX + 1]; /* first block of each matrix; first[count] = grid */
    int count;
};

template <int DT, int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_dense_multi(const __grid_constant__ gemv_multi M, const float *x, int64_t n,
                       int64_t cols) {
    int m = 0;
    while (m + 1 < M.count && blockIdx.x >= M.first[m + 1]) m++;
    gemv_dense_rows<DT, NT>(M.y[m], x, n, M.rows[m], cols, M.w[m], M.bias[m],
                            (int64_t)(blockIdx.x - M.first[m]) * GEMV_R);
}

/* Row-streaming bf16 GEMV (KILN_CUDA_GEMV_DENSE=2; kiln_cuda_set_gemv_dense_variant): a block of
 * 8 warps holds 8/KS rows, the KS warps of a row split its 16-byte chunks (8 values), each lane
 * keeps DGEMV_UNROLL chunks in flight and partial sums meet in shared memory. Short matrices get
 * several warps per row (1024x4096: KS = 4), so more bytes are in flight than k_gemv_dense's 4
 * rows per 4-warp block. */
#define DGEMV_WARPS  8
#define DGEMV_UNROLL 4
template <int NT>
__global__ void __launch_bounds__(DGEMV_WARPS * 32)
    k_gemv_bf16_rows(float *y, const float *x, int n, int rows, int cols, const void *w,
                     const float *bias, int ks_log2) {
    KCU_PDL_ENTER();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int KS = 1 << ks_log2, ks = warp & (KS - 1);
    const int row = blockIdx.x * (DGEMV_WARPS >> ks_log2) + (warp >> ks_log2);
    const bool live = row < rows;
    const int nch = live ? cols / 8 : 0; /* 16-byte chunks of this warp's row (0: no row) */
    const uint4 *wrow = (const uint4 *)w + (int64_t)(live ? row : 0) * (cols / 8);
    const int step = 32 * KS;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int c0 = ks * 32 + lane; c0 < nch; c0 += DGEMV_UNROLL * step) {
        uint4 cur[DGEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < DGEMV_UNROLL; u++) {
            const int c = c0 + u * step;
            cur[u] = c < nch ? kcu_load_stream16(wrow + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < DGEMV_UNROLL; u++) {
            const int c = c0 + u * step;
            if (c >= nch) break;
            const uint32_t wd[4] = {cur[u].x, cur[u].y, cur[u].z, cur[u].w};
            float wv[8];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                wv[2 * i] = __uint_as_float(wd[i] << 16);
                wv[2 * i + 1] = __uint_as_float(wd[i] & 0xffff0000u);
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                const float4 *xp = (const float4 *)(x + (int64_t)t * cols + (int64_t)c * 8);
                const float4 a = kcu_ld(xp), b = kcu_ld(xp + 1);
                const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int i = 0; i < 8; i++) acc[t] = fmaf(wv[i], xv[i], acc[t]);
            }
        }
    }
    __shared__ float part[DGEMV_WARPS][NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float v = kcu_warp_sum(acc[t]);
        if (lane == 0) part[warp][t] = v;
    }
    __syncthreads();
    if (ks == 0 && live && lane < NT && lane < n) {
        float v = 0.0f;
        for (int k = 0; k < KS; k++) v += part[warp + k][lane];
        y[(int64_t)lane * rows + row] = v + (bias ? bias[row] : 0.0f);
    }
}

static int g_dense_variant = -1, g_dense_split = 0;
static int kcu_gemv_dense_variant(void) {
    if (g_dense_variant < 0) {
        const char *e = getenv("KILN_CUDA_GEMV_DENSE");
        g_dense_variant = e && *e ? atoi(e) : 1;
        const char *k = getenv("KILN_CUDA_GEMV_DENSE_KS");
        g_dense_split = k && *k ? atoi(k) : 0;
    }
    return g_dense_variant;
}
extern "C" void kiln_cuda_set_gemv_dense_variant(int variant, int split) {
    g_dense_variant = variant; /* < 0: back to the environment / default */
    g_dense_split = split;
    if (variant < 0) kcu_gemv_dense_variant();
}

template <int NT>
static void launch_bf16_rows(kcu_state *st, float *y, const float *x, int64_t n,
                             const kiln_matrix *w) {
    int ks_log2 = 0;
    const int split = g_dense_split;
    if (split == 1 || split == 2 || split == 4 || split == 8) {
        while ((1 << ks_log2) < split) ks_log2++;
    } else { /* several warps per row only when rows alone leave SMs short of warps */
        const int64_t want = (int64_t)st->n_sms * 16, nch = w->cols / 8;
        while (ks_log2 < 3 && (w->rows << ks_log2) < want && nch >= (128 << ks_log2)) ks_log2++;
    }
    const int rows_per_block = DGEMV_WARPS >> ks_log2;
    dim3 grid((unsigned)((w->rows + rows_per_block - 1) / rows_per_block)), block(DGEMV_WARPS * 32);
    KCU_LAUNCH(st, (k_gemv_bf16_rows<NT>), grid, block, 0, y, x, (int)n, (int)w->rows, (int)w->cols,
               w->data, w->bias, ks_log2);
}

/* ---- GEMV: affine-quantized ---- */

template <int B, int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32, NT == 1 ? 4 : 2)
    k_gemv_quant(float *y, const float *x, int64_t n, int64_t rows, int64_t cols, const uint32_t *w,
                 const void *scales, const void *biases, int sdt, int group, const float *bias) {
    KCU_PDL_ENTER();
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
                float4 a = kcu_ld(xp + k);
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

/* Warp-per-rows variant: each warp owns R whole rows and walks all columns (no block reduction, no
 * __syncthreads), with 32-bit offsets inside a row; each code is turned into a float once and used
 * for all NT tokens. Selected by kcu_qgemv_variant() (env KILN_CUDA_QGEMV: 1 = the kernel above,
 * 2 = this one, 3 = the dp4a kernel of qgemv.cu where it applies, 0 = auto: 3 for 4/8 bits). */
template <int B, int NT, int R>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_quant_w(float *y, const float *x, int n, int rows, int cols, const uint32_t *w,
                   const void *scales, const void *biases, int sdt, int group, const float *bias) {
    KCU_PDL_ENTER();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r0 = (blockIdx.x * GEMV_WARPS + warp) * R;
    if (r0 >= rows) return;
    const int wpr = cols / 32 * B, gpr = cols / group;
    const uint32_t *wr[R];
    int64_t gr[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        int row = r0 + r < rows ? r0 + r : rows - 1;
        wr[r] = w + (int64_t)row * wpr;
        gr[r] = (int64_t)row * gpr;
    }
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    const float scale_b = (float)(1 << B);
    for (int c = lane * 32; c < cols; c += 1024) {
        uint32_t wd[R][B];
        float s[R], bb[R];
        const int g = c / group;
#pragma unroll
        for (int r = 0; r < R; r++) {
            load_words<B>(wr[r] + c / 32 * B, wd[r]);
            s[r] = kcu_load(scales, gr[r] + g, sdt) * scale_b;
            bb[r] = kcu_load(biases, gr[r] + g, sdt);
        }
        float d[R][NT], sx[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            sx[t] = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) d[r][t] = 0.0f;
        }
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float xv[NT][4];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float4 a = t < n ? kcu_ld((const float4 *)(x + (int64_t)t * cols + c) + k)
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
                xv[t][0] = a.x, xv[t][1] = a.y, xv[t][2] = a.z, xv[t][3] = a.w;
                sx[t] += (a.x + a.y) + (a.z + a.w);
            }
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float f = code_f1<B>(wd[r], 4 * k + i);
#pragma unroll
                    for (int t = 0; t < NT; t++) d[r][t] = fmaf(f, xv[t][i], d[r][t]);
                }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
                acc[r][t] = fmaf(s[r], d[r][t] - sx[t], fmaf(bb[r], sx[t], acc[r][t]));
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = kcu_warp_sum(acc[r][t]);
            if (lane == 0 && r0 + r < rows && t < n)
                y[(int64_t)t * rows + r0 + r] = v + (bias ? bias[r0 + r] : 0.0f);
        }
}

static int g_qgemv_variant = -1, g_qgemv_rows = 0;
static int kcu_qgemv_variant(void) {
    if (g_qgemv_variant < 0) {
        const char *e = getenv("KILN_CUDA_QGEMV");
        g_qgemv_variant = e && *e ? atoi(e) : KCU_QGEMV_DEFAULT;
        const char *r = getenv("KILN_CUDA_QGEMV_R"); /* rows per warp of kernel 2 */
        g_qgemv_rows = r && *r ? atoi(r) : 0;
    }
    return g_qgemv_variant;
}
extern "C" void kiln_cuda_set_qgemv_variant(int variant, int rows_per_warp) {
    g_qgemv_variant = variant; /* < 0: back to the environment / default */
    g_qgemv_rows = rows_per_warp;
    if (variant < 0) kcu_qgemv_variant();
}

template <int B, int NT>
static void launch_quant_w(kcu_state *st, float *y, const float *x, int64_t n,
                           const kiln_matrix *w) {
    int R = g_qgemv_rows;
    if (R != 1 && R != 2 && R != 4) { /* enough warps to fill the GPU: >= 24 per SM */
        int64_t want = (int64_t)st->n_sms * 24;
        R = w->rows / 4 >= want ? 4 : w->rows / 2 >= want ? 2 : 1;
    }
    if (NT > 1 && R > 2) R = 2;
    const int Rc = NT > 1 ? (R > 1 ? 2 : 1) : R;
    dim3 block(GEMV_WARPS * 32),
        grid((unsigned)((w->rows + GEMV_WARPS * Rc - 1) / (GEMV_WARPS * Rc)));
    const uint32_t *q = (const uint32_t *)w->data;
    int sdt = (int)w->scale_dtype, g = w->group_size;
#define KW(RR)                                                                                     \
    KCU_LAUNCH(st, (k_gemv_quant_w<B, NT, RR>), grid, block, 0, y, x, (int)n, (int)w->rows,        \
               (int)w->cols, q, w->scales, w->biases, sdt, g, w->bias)
    if (Rc == 1) {
        KW(1);
    } else {
        if constexpr (NT == 1) {
            if (Rc == 4)
                KW(4);
            else
                KW(2);
        } else {
            KW(2);
        }
    }
    KCU_LAUNCHED(st);
#undef KW
}

/* ---- fallbacks and helpers ---- */

/* One warp per (token, row): any format, any shape or alignment. */
__global__ void k_matmul_generic(float *y, const float *x, int64_t n, kiln_matrix w) {
    KCU_PDL_ENTER();
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
    KCU_PDL_ENTER();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

/* x = hi + lo with both halves bf16 (hi = bf16(x), lo = bf16(x - hi)): one GEMM against the
 * stacked [hi; lo] and a sum of the two result halves carry x to ~2^-17 relative instead of
 * bf16's 2^-9, reading W once. */
__global__ void k_to_bf16_split(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *src, int64_t n) {
    KCU_PDL_ENTER();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        __nv_bfloat16 h = __float2bfloat16_rn(src[i]);
        hi[i] = h;
        lo[i] = __float2bfloat16_rn(src[i] - __bfloat162float(h));
    }
}

/* y[i] = y2[i] + y2[half + i]: the hi and lo halves of a split GEMM's result */
__global__ void k_sum_halves(float *y, const float *y2, int64_t half) {
    KCU_PDL_ENTER();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < half;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = y2[i] + y2[half + i];
}

static int g_gemm_split = -1;
static bool kcu_gemm_split(void) {
    if (g_gemm_split < 0) {
        /* KILN_CUDA_GEMM=split|bf16, else KILN_MATMUL=fast|exact (the CPU's switch too) */
        const char *e = getenv("KILN_CUDA_GEMM"), *m = getenv("KILN_MATMUL");
        g_gemm_split = e && *e   ? strcmp(e, "split") == 0
                       : m && *m ? strcmp(m, "fast") != 0
                                 : KCU_GEMM_SPLIT_DEFAULT;
    }
    return g_gemm_split == 1;
}
extern "C" void kiln_cuda_set_gemm_split(int on) {
    g_gemm_split = on ? 1 : 0;
}
bool kcu_fast_math(void) {
    return !kcu_gemm_split();
}

/* Rows [r0, r0+nr) of w as bf16 [nr, cols] (hi); with lo, also the remainder w - hi as bf16, so
 * hi + lo carries w to ~2^-17 relative (exact mode). Any format, one element per thread. */
__global__ void k_dequant_bf16(__nv_bfloat16 *hi, __nv_bfloat16 *lo, kiln_matrix w, int64_t r0,
                               int64_t nr) {
    KCU_PDL_ENTER();
    int64_t total = nr * w.cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float v = kcu_matrix_at(w, r0 + i / w.cols, i % w.cols);
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        hi[i] = h;
        if (lo) lo[i] = __float2bfloat16_rn(v - __bfloat162float(h));
    }
}

/* The same for 2/4/8-bit codes, one 32-bit word (32/BITS values, all in one group) per thread and
 * one 4..32-byte store per output: w = s * q + b with q = bits [j*BITS, (j+1)*BITS) of the word. */
template <int BITS>
__global__ void k_dequant_words_bf16(__nv_bfloat16 *hi, __nv_bfloat16 *lo, kiln_matrix w,
                                     int64_t r0, int64_t nr) {
    KCU_PDL_ENTER();
    constexpr int V = 32 / BITS; /* values per word: 16, 8, 4 */
    const int64_t wpr = w.cols / V, gpr = w.cols / w.group_size;
    const int64_t total = nr * wpr;
    const uint32_t *codes = (const uint32_t *)w.data + r0 * wpr;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / wpr, c0 = (i - r * wpr) * V;
        const int64_t g = (r0 + r) * gpr + c0 / w.group_size;
        const float s = kcu_load(w.scales, g, w.scale_dtype);
        const float b = kcu_load(w.biases, g, w.scale_dtype);
        const uint32_t q = codes[i];
        __align__(16) __nv_bfloat16 h[V], l[V];
#pragma unroll
        for (int j = 0; j < V; j++) {
            const float v = s * kcu_code_f((q >> (j * BITS)) & ((1u << BITS) - 1)) + b;
            h[j] = __float2bfloat16_rn(v);
            l[j] = __float2bfloat16_rn(v - __bfloat162float(h[j]));
        }
        __nv_bfloat16 *dh = hi + i * V, *dl = lo ? lo + i * V : NULL;
#pragma unroll
        for (int k = 0; k < V / 8 + (V < 8); k++) { /* 16-byte pieces (8 B for BITS = 8) */
            if (V >= 8) {
                ((uint4 *)dh)[k] = ((const uint4 *)h)[k];
                if (dl) ((uint4 *)dl)[k] = ((const uint4 *)l)[k];
            } else {
                ((uint2 *)dh)[k] = ((const uint2 *)h)[k];
                if (dl) ((uint2 *)dl)[k] = ((const uint2 *)l)[k];
            }
        }
    }
}

/* Rows [r0, r0+nr) of w as bf16 hi (+ lo) in dst, by the fastest kernel that takes the format. */
static void dequant_rows_bf16(kcu_state *st, __nv_bfloat16 *hi, __nv_bfloat16 *lo,
                              const kiln_matrix *w, int64_t r0, int64_t nr) {
    const int bits = kiln_matrix_is_quantized(w) ? w->bits : 0;
    if (bits == 2 || bits == 4 || bits == 8) {
        const int64_t words = nr * w->cols * bits / 32;
        const unsigned blocks = kcu_blocks(words, 256, 16384);
        if (bits == 2)
            KCU_LAUNCH(st, k_dequant_words_bf16<2>, blocks, 256, 0, hi, lo, *w, r0, nr);
        else if (bits == 4)
            KCU_LAUNCH(st, k_dequant_words_bf16<4>, blocks, 256, 0, hi, lo, *w, r0, nr);
        else
            KCU_LAUNCH(st, k_dequant_words_bf16<8>, blocks, 256, 0, hi, lo, *w, r0, nr);
    } else {
        KCU_LAUNCH(st, k_dequant_bf16, kcu_blocks(nr * w->cols, 256, 16384), 256, 0, hi, lo, *w, r0,
                   nr);
    }
    KCU_LAUNCHED(st);
}

/* Quantized weights at n >= this many tokens leave the tensor-core GEMM for the cuBLAS path below
 * (W dequantized slice by slice): from 128 tokens in both modes (exact: three bf16 products; fast:
 * one). Fast mode took this path from 32 tokens until the codes GEMM multiplied one product there
 * (twentieth session, H100, Llama-3-8B batch-64 decode: q4 3752 -> 4353 tok/s, q8 3042 -> 4115).
 * Env KILN_CUDA_DEQUANT_MIN_N / KILN_CUDA_DEQUANT_MIN_N_FAST; kiln_cuda_set_dequant_min_n for
 * tests. */
static int g_deq_min_exact = -1, g_deq_min_fast = -1;
static int env_int(const char *name, int dflt) {
    const char *e = getenv(name);
    return e && *e ? atoi(e) : dflt;
}
extern "C" void kiln_cuda_set_dequant_min_n(int exact, int fast) {
    g_deq_min_exact = exact < 0 ? env_int("KILN_CUDA_DEQUANT_MIN_N", 128) : exact;
    g_deq_min_fast = fast < 0 ? env_int("KILN_CUDA_DEQUANT_MIN_N_FAST", 128) : fast;
}
int kcu_quant_cublas_min_n(void) {
    if (g_deq_min_exact < 0) kiln_cuda_set_dequant_min_n(-1, -1);
    return kcu_gemm_split() ? g_deq_min_exact : g_deq_min_fast;
}

__global__ void k_add_bias(float *y, const float *bias, int64_t n, int64_t rows) {
    KCU_PDL_ENTER();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * rows;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += bias[i % rows];
}

/* ---- dispatch ---- */

template <int NT>
static void launch_gemv(kcu_state *st, float *y, const float *x, int64_t n, const kiln_matrix *w) {
    dim3 grid((unsigned)((w->rows + GEMV_R - 1) / GEMV_R)), block(GEMV_WARPS * 32);
    /* otherwise (2/3/5/6 bits): the warp-per-rows kernel where it measured faster on the H200
     * (n = 1, enough rows for 4 rows per warp and >= 24 warps per SM: 29.7 vs 44.5 us for q4g32
     * 14336x4096), the column-split kernel elsewhere */
    int qv = kcu_qgemv_variant();
    /* auto (0): the dp4a kernel (qgemv.cu) for 4- and 8-bit codes */
    if ((qv == 0 || qv == 3) && kcu_qgemv_dp4a(st, y, x, n, w)) return;
    if (qv == 0 || qv == 3) qv = NT == 1 && w->rows / 4 >= (int64_t)st->n_sms * 24 ? 2 : 1;
    if (kiln_matrix_is_quantized(w) && qv == 2 && w->rows < INT32_MAX / 2 &&
        w->cols < INT32_MAX / 8) {
        switch (w->bits) {
        case 2:
            launch_quant_w<2, NT>(st, y, x, n, w);
            break;
        case 3:
            launch_quant_w<3, NT>(st, y, x, n, w);
            break;
        case 4:
            launch_quant_w<4, NT>(st, y, x, n, w);
            break;
        case 5:
            launch_quant_w<5, NT>(st, y, x, n, w);
            break;
        case 6:
            launch_quant_w<6, NT>(st, y, x, n, w);
            break;
        default:
            launch_quant_w<8, NT>(st, y, x, n, w);
            break;
        }
    } else if (kiln_matrix_is_quantized(w)) {
        const uint32_t *q = (const uint32_t *)w->data;
        int sdt = (int)w->scale_dtype, g = w->group_size;
#define KQ(B)                                                                                      \
    KCU_LAUNCH(st, (k_gemv_quant<B, NT>), grid, block, 0, y, x, n, w->rows, w->cols, q, w->scales, \
               w->biases, sdt, g, w->bias)
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
    } else if (w->dtype == KILN_DT_BF16 && kcu_gemv_dense_variant() == 2 && w->rows < INT32_MAX &&
               w->cols < INT32_MAX) {
        launch_bf16_rows<NT>(st, y, x, n, w);
    } else if (w->dtype == KILN_DT_BF16) {
        KCU_LAUNCH(st, (k_gemv_dense<KILN_DT_BF16, NT>), grid, block, 0, y, x, n, w->rows, w->cols,
                   w->data, w->bias);
    } else if (w->dtype == KILN_DT_F16) {
        KCU_LAUNCH(st, (k_gemv_dense<KILN_DT_F16, NT>), grid, block, 0, y, x, n, w->rows, w->cols,
                   w->data, w->bias);
    } else {
        KCU_LAUNCH(st, (k_gemv_dense<KILN_DT_F32, NT>), grid, block, 0, y, x, n, w->rows, w->cols,
                   w->data, w->bias);
    }
    KCU_LAUNCHED(st);
}

bool kcu_gemv_ok(const kiln_matrix *w, const float *x) {
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
        /* Exact mode (split): x as a bf16 hi + lo pair, stacked [hi; lo] as one [2n, cols]
         * operand so W is read once for both; W not bf16 (f16, quantized) is expanded slice by
         * slice to a bf16 hi + lo pair too, and y = W_hi [x_hi; x_lo] + W_lo x_hi (three products;
         * W_lo x_lo ~2^-18 is left out). Fast mode: x and W each one bf16 operand, one product.
         * Scratch: x as bf16 [nx, cols], the split's [2n, rows] f32 result, then the W slices. */
        const bool split = kcu_gemm_split();
        const bool wpair = split && w->dtype != KILN_DT_BF16;
        const int64_t nx = split ? 2 * n : n;
        size_t xb = ((size_t)(nx * cols) * 2 + 255) & ~(size_t)255;
        size_t yb = split ? ((size_t)(nx * rows) * 4 + 255) & ~(size_t)255 : 0;
        int64_t slice = w->dtype == KILN_DT_BF16 ? 0 : rows;
        const int64_t max_slice_elems = (int64_t)(wpair ? 32 : 64) << 20; /* 128 MiB of bf16 */
        if (slice * cols > max_slice_elems) slice = max_slice_elems / cols;
        if (slice > 256) slice &= ~(int64_t)255;
        if (slice < 1 && w->dtype != KILN_DT_BF16) slice = 1;
        const size_t wb = ((size_t)(slice * cols) * 2 + 255) & ~(size_t)255;
        char *scr = (char *)kcu_scratch(st, xb + yb + wb * (wpair ? 2 : 1));
        if (!scr) return;
        __nv_bfloat16 *xh = (__nv_bfloat16 *)scr, *wh = (__nv_bfloat16 *)(scr + xb + yb);
        __nv_bfloat16 *wl = wpair ? (__nv_bfloat16 *)(scr + xb + yb + wb) : NULL;
        float *yout = split ? (float *)(scr + xb) : y; /* [nx, rows] */
        if (split)
            KCU_LAUNCH(st, k_to_bf16_split, kcu_blocks(n * cols, 256, 8192), 256, 0, xh,
                       xh + n * cols, x, n * cols);
        else
            KCU_LAUNCH(st, k_to_bf16, kcu_blocks(n * cols, 256, 8192), 256, 0, xh, x, n * cols);
        KCU_LAUNCHED(st);
        if (w->dtype == KILN_DT_BF16) {
            KCU_CUBLAS(st, cublasGemmEx(st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)nx,
                                        (int)cols, &one, w->data, CUDA_R_16BF, (int)cols, xh,
                                        CUDA_R_16BF, (int)cols, &zero, yout, CUDA_R_32F, (int)rows,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        } else {
            for (int64_t r0 = 0; r0 < rows; r0 += slice) {
                int64_t nr = rows - r0 < slice ? rows - r0 : slice;
                dequant_rows_bf16(st, wh, wl, w, r0, nr);
                KCU_CUBLAS(st, cublasGemmEx(st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)nx,
                                            (int)cols, &one, wh, CUDA_R_16BF, (int)cols, xh,
                                            CUDA_R_16BF, (int)cols, &zero, yout + r0, CUDA_R_32F,
                                            (int)rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                if (wpair) /* W_lo x_hi added into the hi half of the result */
                    KCU_CUBLAS(st,
                               cublasGemmEx(st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)n,
                                            (int)cols, &one, wl, CUDA_R_16BF, (int)cols, xh,
                                            CUDA_R_16BF, (int)cols, &one, yout + r0, CUDA_R_32F,
                                            (int)rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            }
        }
        if (split) {
            KCU_LAUNCH(st, k_sum_halves, kcu_blocks(n * rows, 256, 8192), 256, 0, y, yout,
                       n * rows);
            KCU_LAUNCHED(st);
        }
    }
    if (w->bias) {
        KCU_LAUNCH(st, k_add_bias, kcu_blocks(n * rows, 256, 8192), 256, 0, y, w->bias, n, rows);
        KCU_LAUNCHED(st);
    }
}

extern "C" void kcu_matmul(kiln_backend *be, float *y, const float *x, int64_t n,
                           const kiln_matrix *w) {
    kcu_state *st = kcu_st(be);
    if (n <= 0 || w->rows <= 0) return;
    int path = g_force_path;
    /* tensor cores (gemm_tc.cu): 4/8-bit weights at n >= 2, bf16 at 2 <= n <= 16 (by default) */
    if (path == 0 && kcu_tc_gemm(st, 1, &y, x, n, &w, false, NULL, 0.0f, false, false)) return;
    if (path == 0) path = n <= GEMV_MAX_N ? 1 : 2;
    if (path == 1 && n <= GEMV_MAX_N && kcu_gemv_ok(w, x)) {
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
    KCU_LAUNCH(st, k_matmul_generic, (unsigned)((warps * 32 + 255) / 256), 256, 0, y, x, n, *w);
    KCU_LAUNCHED(st);
}

/* ys[i][t, r] = all[t, off_i + r]: the stacked result of a fused multi-matmul back to each
 * matrix's output (count <= GEMV_MULTI_MAX; off[count] = the stacked width) */
struct multi_scatter {
    float *y[GEMV_MULTI_MAX];
    int64_t off[GEMV_MULTI_MAX + 1];
    int count;
};
__global__ void k_multi_scatter(const __grid_constant__ multi_scatter S, const float *all,
                                int64_t n) {
    KCU_PDL_ENTER();
    const int64_t R = S.off[S.count];
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n * R;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / R, c = idx - t * R;
        int i = 0;
        while (i + 1 < S.count && c >= S.off[i + 1]) i++;
        const int64_t rows = S.off[i + 1] - S.off[i];
        S.y[i][t * rows + (c - S.off[i])] = all[idx];
    }
}

/* Whether ws[0..count) are consecutive row ranges of one allocation (cuda_backend.cu's
 * upload_matrices) in one format: then *all is the [sum of rows, cols] matrix they form. */
static bool slices_of_one(int count, const kiln_matrix *const *ws, kiln_matrix *all) {
    if (count < 2 || count > GEMV_MULTI_MAX) return false;
    const kiln_matrix *w0 = ws[0];
    const bool q = kiln_matrix_is_quantized(w0);
    int64_t rows = 0;
    for (int i = 0; i < count; i++) {
        const kiln_matrix *w = ws[i];
        if (w->dtype != w0->dtype || w->cols != w0->cols || w->bits != w0->bits ||
            w->group_size != w0->group_size || w->scale_dtype != w0->scale_dtype ||
            (w->bias != NULL) != (w0->bias != NULL) || w->rows <= 0)
            return false;
        if (i > 0) {
            const kiln_matrix *p = ws[i - 1];
            const int64_t rb =
                q ? kiln_matrix_row_code_bytes(p) : p->cols * (int64_t)kiln_dtype_size(p->dtype);
            if ((const char *)w->data != (const char *)p->data + p->rows * rb) return false;
            if (q) {
                const int64_t sb =
                    p->cols / p->group_size * (int64_t)kiln_dtype_size(p->scale_dtype);
                if ((const char *)w->scales != (const char *)p->scales + p->rows * sb ||
                    (const char *)w->biases != (const char *)p->biases + p->rows * sb)
                    return false;
            }
            if (w->bias && w->bias != p->bias + p->rows) return false;
        }
        rows += w->rows;
    }
    *all = *w0;
    all->rows = rows;
    all->view = true;
    return true;
}

template <int NT>
static void launch_gemv_multi(kcu_state *st, const gemv_multi &M, const float *x, int64_t n,
                              int64_t cols) {
    KCU_LAUNCH(st, (k_gemv_dense_multi<KILN_DT_BF16, NT>), M.first[M.count], GEMV_WARPS * 32, 0, M,
               x, n, cols);
    KCU_LAUNCHED(st);
}

/* ys[i][n, ws[i]->rows] = x[n, cols] @ ws[i]^T for count matrices with the same cols: one launch
 * when they are all bf16 and the GEMV applies (decode); one digit conversion of x and a launch
 * per matrix when they all take the dp4a kernel; else one matmul each. */
extern "C" void kcu_matmul_multi(kiln_backend *be, int count, float *const *ys, const float *x,
                                 int64_t n, const kiln_matrix *const *ws) {
    kcu_state *st = kcu_st(be);
    /* one tensor-core launch for all of them (same format), x split once */
    if (g_force_path == 0 && kcu_tc_gemm(st, count, ys, x, n, ws, false, NULL, 0.0f, false, false))
        return;
    bool one =
        count >= 2 && count <= GEMV_MULTI_MAX && n >= 1 && n <= GEMV_MAX_N && g_force_path != 2;
    for (int i = 0; one && i < count; i++)
        one = !kiln_matrix_is_quantized(ws[i]) && ws[i]->dtype == KILN_DT_BF16 &&
              ws[i]->cols == ws[0]->cols && ws[i]->rows > 0 && kcu_gemv_ok(ws[i], x);
    if (!one) {
        /* quantized: the dp4a GEMV turns x into digits once for all of them */
        int qv = kcu_qgemv_variant();
        if ((g_force_path == 0 || g_force_path == 1) && (qv == 0 || qv == 3) &&
            ((uintptr_t)x & 15) == 0 && kcu_qgemv_dp4a_multi(st, count, ys, x, n, ws))
            return;
        /* one fused allocation (KILN_CUDA_FUSE_WEIGHTS), past the GEMV's batches: one matmul
         * (cuBLAS fills the GPU with one [q; k; v] or [gate; up] product where the separate
         * k / v products leave most SMs idle), then its columns back to each output */
        kiln_matrix all;
        if (n > GEMV_MAX_N && slices_of_one(count, ws, &all)) {
            float *out = (float *)kcu_multi_out(st, (size_t)(n * all.rows) * sizeof(float));
            if (!out) return; /* reported */
            kcu_matmul(be, out, x, n, &all);
            multi_scatter S;
            memset(&S, 0, sizeof S);
            S.count = count;
            for (int i = 0; i < count; i++) S.y[i] = ys[i], S.off[i + 1] = S.off[i] + ws[i]->rows;
            KCU_LAUNCH(st, k_multi_scatter, kcu_blocks(n * all.rows, 256, 8192), 256, 0, S,
                       (const float *)out, n);
            KCU_LAUNCHED(st);
            return;
        }
        for (int i = 0; i < count; i++) kcu_matmul(be, ys[i], x, n, ws[i]);
        return;
    }
    gemv_multi M;
    memset(&M, 0, sizeof M);
    M.count = count;
    unsigned blocks = 0;
    for (int i = 0; i < count; i++) {
        M.y[i] = ys[i];
        M.w[i] = ws[i]->data;
        M.bias[i] = ws[i]->bias;
        M.rows[i] = ws[i]->rows;
        M.first[i] = blocks;
        blocks += (unsigned)((ws[i]->rows + GEMV_R - 1) / GEMV_R);
    }
    M.first[count] = blocks;
    if (n == 1)
        launch_gemv_multi<1>(st, M, x, n, ws[0]->cols);
    else if (n == 2)
        launch_gemv_multi<2>(st, M, x, n, ws[0]->cols);
    else if (n <= 4)
        launch_gemv_multi<4>(st, M, x, n, ws[0]->cols);
    else
        launch_gemv_multi<8>(st, M, x, n, ws[0]->cols);
}
