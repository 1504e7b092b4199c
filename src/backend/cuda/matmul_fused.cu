/* matmul_fused.cu — the decode-layer fusions around the dense GEMV (backend.h: matmul_norm,
 * matmul_add, matmul_norm_glu), so a Llama-style layer needs no separate RMSNorm, residual add or
 * SwiGLU launch at decode:
 *
 *   matmul_norm      ys[i] = rmsnorm(x) @ Wi^T   the norm is folded into the dot product:
 *                    dot(W_r, x*g) * rsqrt(mean(x^2) + eps), sum of squares taken in the same
 *                    pass over x, so x is read once and never written normalized
 *   matmul_add       y += x @ W^T                 the residual add in the epilogue
 *   matmul_norm_glu  out = act(h @ Wg^T) * (h @ Wu^T), h = rmsnorm(x): a block owns GEMV_R/2 rows
 *                    of the gate and the same rows of up, and writes the product
 *
 * Same block geometry as matmul.cu's dense GEMV (GEMV_WARPS warps own GEMV_R rows and split the
 * columns, 16-byte weight loads, f32 accumulation), for bf16 / f16 / f32 weights and n <= 8
 * tokens. 4/8-bit quantized weights take the same fusions on the dp4a GEMV (qgemv.cu). Anything
 * else (other bit widths, prefill, unaligned views) runs the composition of plain ops
 * (kiln_backend_*_composed). Results match the composition within f32 rounding (the
 * norm scales the dot product instead of each x). */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/gemm_tc.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/quant.cuh"

#include <string.h>

#define FUSED_MAX 4
enum { FUSE_NORM = 1, FUSE_ADD = 2, FUSE_GLU = 4 };

/* Kernel parameters: up to FUSED_MAX matrices sharing x (block b belongs to matrix m with
 * first[m] <= b < first[m+1]); GLU: w[0] gate, w[1] up, y[0] the output. */
struct gemv_fused {
    float *y[FUSED_MAX];          /* [n, rows[m]] (FUSE_ADD: added to) */
    const void *w[FUSED_MAX];     /* [rows[m], cols] */
    const float *bias[FUSED_MAX]; /* [rows[m]] or NULL */
    int64_t rows[FUSED_MAX];
    unsigned first[FUSED_MAX + 1];
    int count;
    const float *norm_w; /* [cols] (FUSE_NORM) */
    float eps;
    int plus_one; /* norm weight applied as (1 + w) */
    int act;      /* kiln_glu_act (FUSE_GLU) */
};

template <int DT, int NT, int F>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_fused(const __grid_constant__ gemv_fused M, const float *x, int n, int cols) {
    constexpr int es = DT == KILN_DT_F32 ? 4 : 2;
    constexpr int HR = GEMV_R / 2; /* GLU: rows of the gate (and of up) per block */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int m = 0;
    int64_t r0, rows;
    const char *wr[GEMV_R]; /* the block's weight rows */
    if (F & FUSE_GLU) {
        rows = M.rows[0];
        r0 = (int64_t)blockIdx.x * HR;
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) {
            const int64_t row = r0 + r % HR < rows ? r0 + r % HR : rows - 1;
            wr[r] = (const char *)M.w[r / HR] + row * cols * es;
        }
    } else {
        while (m + 1 < M.count && blockIdx.x >= M.first[m + 1]) m++;
        rows = M.rows[m];
        r0 = (int64_t)(blockIdx.x - M.first[m]) * GEMV_R;
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) {
            const int64_t row = r0 + r < rows ? r0 + r : rows - 1;
            wr[r] = (const char *)M.w[m] + row * cols * es;
        }
    }
    /* weights are never written by a kernel: their first chunks head for L2 before the wait */
    const int c_first = (warp * 32 + lane) * 8;
    if (c_first < cols)
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) kcu_prefetch_l2(wr[r] + (int64_t)c_first * es);
    KCU_PDL_ENTER();

    float acc[GEMV_R][NT], ss[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        ss[t] = 0.0f;
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) acc[r][t] = 0.0f;
    }
#pragma unroll 2
    for (int c = c_first; c < cols; c += GEMV_WARPS * 256) {
        float wv[GEMV_R][8];
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) dense8<DT>::load(wr[r] + (int64_t)c * es, wv[r]);
        float g[8];
        if (F & FUSE_NORM) {
            if (M.norm_w) {
                const float4 a = __ldg((const float4 *)(M.norm_w + c)),
                             b = __ldg((const float4 *)(M.norm_w + c) + 1);
                const float gl[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int i = 0; i < 8; i++) g[i] = M.plus_one ? 1.0f + gl[i] : gl[i];
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) g[i] = 1.0f;
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const float4 *xp = (const float4 *)(x + (int64_t)t * cols + c);
            const float4 a = kcu_ld(xp), b = kcu_ld(xp + 1);
            float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            if (F & FUSE_NORM) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    ss[t] = fmaf(xv[i], xv[i], ss[t]);
                    xv[i] *= g[i];
                }
            }
#pragma unroll
            for (int r = 0; r < GEMV_R; r++)
#pragma unroll
                for (int i = 0; i < 8; i++) acc[r][t] = fmaf(wv[r][i], xv[i], acc[r][t]);
        }
    }

    /* block sums: part[warp][r][t], and the sum of squares in slot GEMV_R */
    __shared__ float part[GEMV_WARPS][GEMV_R + 1][NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) {
            const float v = kcu_warp_sum(acc[r][t]);
            if (lane == 0) part[warp][r][t] = v;
        }
        if (F & FUSE_NORM) {
            const float v = kcu_warp_sum(ss[t]);
            if (lane == 0) part[warp][GEMV_R][t] = v;
        }
    }
    __syncthreads();
    constexpr int OUT_R = (F & FUSE_GLU) ? HR : GEMV_R;
    for (int i = threadIdx.x; i < OUT_R * NT; i += blockDim.x) {
        const int r = i / NT, t = i % NT;
        const int64_t row = r0 + r;
        if (row >= rows || t >= n) continue;
        float scale = 1.0f;
        if (F & FUSE_NORM) {
            float s2 = 0.0f;
#pragma unroll
            for (int w = 0; w < GEMV_WARPS; w++) s2 += part[w][GEMV_R][t];
            scale = rsqrtf(s2 / (float)cols + M.eps);
        }
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < GEMV_WARPS; w++) v += part[w][r][t];
        v *= scale;
        if (F & FUSE_GLU) {
            float u = 0.0f;
#pragma unroll
            for (int w = 0; w < GEMV_WARPS; w++) u += part[w][r + HR][t];
            u *= scale;
            if (M.bias[0]) v += M.bias[0][row];
            if (M.bias[1]) u += M.bias[1][row];
            M.y[0][t * rows + row] = kcu_glu_act(v, M.act) * u;
        } else {
            if (M.bias[m]) v += M.bias[m][row];
            if (F & FUSE_ADD)
                M.y[m][t * rows + row] += v;
            else
                M.y[m][t * rows + row] = v;
        }
    }
}

static int g_fused_on = -1;
bool kcu_fused_enabled(void) {
    if (g_fused_on < 0) {
        const char *e = getenv("KILN_CUDA_FUSED");
        g_fused_on = !(e && strcmp(e, "0") == 0);
    }
    return g_fused_on != 0;
}

static int g_qfused_on = -1;
bool kcu_qfused_enabled(void) {
    if (g_qfused_on < 0) {
        const char *e = getenv("KILN_CUDA_QFUSED");
        g_qfused_on = !(e && strcmp(e, "0") == 0);
    }
    return g_qfused_on != 0 && kcu_fused_enabled();
}

extern "C" void kiln_cuda_set_qfused(int on) {
    g_qfused_on = on < 0 ? -1 : on != 0;
}

/* The GEMV applies: dense weights of one dtype, same cols, aligned, n <= GEMV_MAX_N, and the norm
 * weights (if any) 16-byte aligned. KILN_CUDA_FUSED=0 turns the kernels off (composition). */
static bool fused_applies(int count, const kiln_matrix *const *ws, const float *x, int64_t n,
                          const float *norm_w) {
    if (!kcu_fused_enabled() || n < 1 || n > GEMV_MAX_N || count < 1 || count > FUSED_MAX)
        return false;
    if (norm_w && ((uintptr_t)norm_w & 15)) return false;
    for (int i = 0; i < count; i++) {
        const kiln_matrix *w = ws[i];
        if (kiln_matrix_is_quantized(w) || w->dtype != ws[0]->dtype || w->cols != ws[0]->cols ||
            w->rows <= 0 || w->rows >= INT32_MAX || w->cols >= INT32_MAX || !kcu_gemv_ok(w, x))
            return false;
        if (w->dtype != KILN_DT_BF16 && w->dtype != KILN_DT_F16 && w->dtype != KILN_DT_F32)
            return false;
    }
    return true;
}

template <int DT, int F>
static void launch_fused_dt(kcu_state *st, const gemv_fused &M, const float *x, int64_t n, int cols,
                            unsigned blocks) {
    const dim3 grid(blocks), block(GEMV_WARPS * 32);
    if (n == 1)
        KCU_LAUNCH(st, (k_gemv_fused<DT, 1, F>), grid, block, 0, M, x, (int)n, cols);
    else if (n == 2)
        KCU_LAUNCH(st, (k_gemv_fused<DT, 2, F>), grid, block, 0, M, x, (int)n, cols);
    else if (n <= 4)
        KCU_LAUNCH(st, (k_gemv_fused<DT, 4, F>), grid, block, 0, M, x, (int)n, cols);
    else
        KCU_LAUNCH(st, (k_gemv_fused<DT, 8, F>), grid, block, 0, M, x, (int)n, cols);
}

template <int F>
static void launch_fused(kcu_state *st, int dt, const gemv_fused &M, const float *x, int64_t n,
                         int cols, unsigned blocks) {
    if (dt == KILN_DT_BF16)
        launch_fused_dt<KILN_DT_BF16, F>(st, M, x, n, cols, blocks);
    else if (dt == KILN_DT_F16)
        launch_fused_dt<KILN_DT_F16, F>(st, M, x, n, cols, blocks);
    else
        launch_fused_dt<KILN_DT_F32, F>(st, M, x, n, cols, blocks);
}

extern "C" void kcu_matmul_norm(kiln_backend *be, int count, float *const *ys, const float *x,
                                float *h, int64_t n, const kiln_matrix *const *ws,
                                const float *norm_w, float eps, bool plus_one) {
    if (n <= 0) return;
    /* tensor cores (batched decode, prefill): the norm is applied as x is split */
    if (kcu_fused_enabled() &&
        kcu_tc_gemm(kcu_st(be), count, ys, x, n, ws, true, norm_w, eps, plus_one, false))
        return;
    if (!fused_applies(count, ws, x, n, norm_w)) {
        if (kcu_qfused_enabled() &&
            kcu_qgemv_dp4a_norm(kcu_st(be), count, ys, x, n, ws, norm_w, eps, plus_one))
            return;
        kiln_backend_matmul_norm_composed(be, count, ys, x, h, n, ws, norm_w, eps, plus_one);
        return;
    }
    gemv_fused M;
    memset(&M, 0, sizeof M);
    M.count = count;
    M.norm_w = norm_w;
    M.eps = eps;
    M.plus_one = plus_one ? 1 : 0;
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
    launch_fused<FUSE_NORM>(kcu_st(be), ws[0]->dtype, M, x, n, (int)ws[0]->cols, blocks);
}

extern "C" void kcu_matmul_add(kiln_backend *be, float *y, const float *x, float *tmp, int64_t n,
                               const kiln_matrix *w) {
    if (n <= 0) return;
    if (kcu_fused_enabled() &&
        kcu_tc_gemm(kcu_st(be), 1, &y, x, n, &w, false, NULL, 0.0f, false, true))
        return;
    if (!fused_applies(1, &w, x, n, NULL)) {
        if (kcu_qfused_enabled() && kcu_qgemv_dp4a_add(kcu_st(be), y, x, n, w)) return;
        kiln_backend_matmul_add_composed(be, y, x, tmp, n, w);
        return;
    }
    gemv_fused M;
    memset(&M, 0, sizeof M);
    M.count = 1;
    M.y[0] = y;
    M.w[0] = w->data;
    M.bias[0] = w->bias;
    M.rows[0] = w->rows;
    const unsigned blocks = (unsigned)((w->rows + GEMV_R - 1) / GEMV_R);
    M.first[1] = blocks;
    launch_fused<FUSE_ADD>(kcu_st(be), w->dtype, M, x, n, (int)w->cols, blocks);
}

extern "C" void kcu_matmul_norm_glu(kiln_backend *be, float *out, const float *x, float *h,
                                    float *up, int64_t n, const kiln_matrix *wg,
                                    const kiln_matrix *wu, const float *norm_w, float eps,
                                    bool plus_one, kiln_glu_act act) {
    if (n <= 0) return;
    const kiln_matrix *const ws[2] = {wg, wu};
    /* tensor cores: gate and up in one launch on the normalized x, then the activation */
    float *const gu[2] = {out, up};
    if (wg->rows == wu->rows && kcu_fused_enabled() &&
        kcu_tc_gemm(kcu_st(be), 2, gu, x, n, ws, true, norm_w, eps, plus_one, false)) {
        if (act == KILN_GLU_GELU_TANH)
            be->gelu_tanh_mul(be, out, out, up, n * wg->rows);
        else
            be->silu_mul(be, out, out, up, n * wg->rows);
        return;
    }
    if (wg->rows != wu->rows || !fused_applies(2, ws, x, n, norm_w)) {
        if (kcu_qfused_enabled() &&
            kcu_qgemv_dp4a_norm_glu(kcu_st(be), out, x, n, wg, wu, norm_w, eps, plus_one, (int)act))
            return;
        kiln_backend_matmul_norm_glu_composed(be, out, x, h, up, n, wg, wu, norm_w, eps, plus_one,
                                              act);
        return;
    }
    gemv_fused M;
    memset(&M, 0, sizeof M);
    M.count = 2;
    M.y[0] = out;
    M.w[0] = wg->data;
    M.w[1] = wu->data;
    M.bias[0] = wg->bias;
    M.bias[1] = wu->bias;
    M.rows[0] = M.rows[1] = wg->rows;
    M.norm_w = norm_w;
    M.eps = eps;
    M.plus_one = plus_one ? 1 : 0;
    M.act = (int)act;
    const unsigned blocks = (unsigned)((wg->rows + GEMV_R / 2 - 1) / (GEMV_R / 2));
    launch_fused<FUSE_NORM | FUSE_GLU>(kcu_st(be), wg->dtype, M, x, n, (int)wg->cols, blocks);
}
