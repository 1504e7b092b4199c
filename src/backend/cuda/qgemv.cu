/* qgemv.cu — decode GEMV (n <= 8 tokens) for MLX affine 4- and 8-bit weights, built to stream W at
 * the memory bandwidth instead of being bound by instruction issue: the dot products run as
 * integer dp4a (4 multiply-adds per instruction) against x converted once per call to 24-bit
 * fixed point.
 *
 * Pass 1, k_qx_digits (one warp per token and 32-column block g):
 *   E[t][g] = 2^(e-22) where max_j |x_j| < 2^e over the block, X_j = rint(x_j / E) (|X_j| <= 2^22,
 *   so x_j = E*X_j within 2^-23 of the block's max), X_j = 65536*d2 + 256*d1 + d0 with signed-byte
 *   digits, and sx16[t][c/16] = sum of x over each 16 columns (f32).
 * Pass 2, k_qgemv_dp4a: a warp owns one row (or 1/KS of one row's 16-byte chunks when KS warps
 *   split the columns of a row); each lane streams 16-byte chunks of codes (32 4-bit or 16 8-bit),
 *   coalesced along the row, four chunks in flight per lane, and for each chunk and token
 *     D_p = sum_j q_j * d_p,j  (dp4a; exact int32)
 *     acc += (s * E) * (65536*D2 + 256*D1 + D0) + b * sum_j x_j
 *   which is the group identity sum_j (s*q_j + b) x_j = s * sum_j q_j x_j + b * sum_j x_j. A chunk
 *   never straddles a quantization group (groups are multiples of 32 columns). 4-bit codes are
 *   split into the even and odd nibbles of each word ((w & 0x0F0F0F0F), (w >> 4) & 0x0F0F0F0F), so
 *   pass 1 stores each 8-column run's digits as columns 0,2,4,6,1,3,5,7 for 4-bit weights.
 *
 * On Hopper pass 2 is launched with programmatic dependent launch: its blocks start while pass 1
 * runs, issue their first weight loads, and wait (griddepcontrol.wait) only before reading x's
 * digits. Error: |x_j - E*X_j| <= 2^-23 * max|x| of its block, ~1e-7 relative in the result. */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/quant.cuh"

#include <stdlib.h>

#define QG_WARPS  8 /* warps per block */
#define QG_UNROLL 4 /* 16-byte chunks in flight per lane */

__device__ __forceinline__ void qg_wait_prior_grid(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void qg_allow_dependents(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/* acc + sum over the 4 bytes of a (unsigned) * b (signed) */
__device__ __forceinline__ int qg_dp4a(uint32_t a, uint32_t b, int acc) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(acc));
    return d;
}

/* Pass 1. x [n, cols] (cols % 32 == 0). Writes dig [n, cols/32, 3 digits, 32 bytes] (digit p of
 * the block's columns in storage order), E [n, cols/32], sx16 [n, cols/16]. perm4: 4-bit order. */
__global__ void __launch_bounds__(256)
    k_qx_digits(int8_t *dig, float *E, float *sx16, const float *x, int n, int cols, int perm4) {
    qg_allow_dependents();
    const int lane = threadIdx.x & 31, ng = cols >> 5;
    const int64_t gw = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; /* t * ng + g */
    if (gw >= (int64_t)n * ng) return;                                        /* whole warps */
    const int t = (int)(gw / ng), g = (int)(gw % ng);
    const float v = x[(int64_t)t * cols + g * 32 + lane];
    float m = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    /* m < 2^e from m's exponent bits, clamped so 2^(22-e) and 2^(e-22) are normal floats (m == 0
     * or tiny: e = -104, every X is 0 or tiny); powers of two built from bits scale exactly */
    int e = ((__float_as_int(m) >> 23) & 0xff) - 126;
    e = e < -104 ? -104 : e > 128 ? 128 : e;
    const int X = __float2int_rn(v * __int_as_float((127 + 22 - e) << 23));
    const int d0 = ((X & 0xff) ^ 0x80) - 0x80;
    const int r1 = (X - d0) / 256;
    const int d1 = ((r1 & 0xff) ^ 0x80) - 0x80;
    const int d2 = (r1 - d1) / 256; /* |d2| <= 64 */
    /* 4-bit: an 8-column run is stored as its even columns, then its odd ones */
    const int pos = perm4 ? (lane & ~7) | ((lane & 1) << 2) | ((lane & 7) >> 1) : lane;
    int8_t *o = dig + gw * 96 + pos;
    o[0] = (int8_t)d0;
    o[32] = (int8_t)d1;
    o[64] = (int8_t)d2;
    float s = v; /* sums of lanes 0..15 and 16..31 */
#pragma unroll
    for (int k = 1; k < 16; k <<= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    if (lane == 0) E[gw] = __int_as_float((127 + e - 22) << 23);
    if ((lane & 15) == 0) sx16[(int64_t)t * (cols / 16) + 2 * g + (lane >> 4)] = s;
}

/* Issues the loads of a lane's next QG_UNROLL chunks c0 + u*step of a row (codes, and the scale
 * and bias of each chunk's group; g0 = the row's first group) so they are all in flight at once.
 * Chunks past the row's end read as 0. */
template <int B>
__device__ __forceinline__ void qg_load_chunks(uint4 (&q)[QG_UNROLL], float (&s)[QG_UNROLL],
                                               float (&b)[QG_UNROLL], const uint4 *wrow,
                                               const void *scales, const void *biases, int sdt,
                                               int64_t g0, int group, int c0, int step, int nch) {
#pragma unroll
    for (int u = 0; u < QG_UNROLL; u++) {
        const int c = c0 + u * step;
        if (c < nch) {
            const int64_t gi = g0 + c * (128 / B) / group;
            q[u] = kcu_load_stream16(wrow + c);
            s[u] = kcu_load(scales, gi, sdt);
            b[u] = kcu_load(biases, gi, sdt);
        } else {
            q[u] = make_uint4(0, 0, 0, 0);
            s[u] = b[u] = 0.0f;
        }
    }
}

/* Pass 2. y [n, rows] (+bias), w uint32 [rows, cols*B/32], scales/biases [rows, cols/group]. A
 * block holds QG_WARPS/KS rows; warp = row tile * KS + ks, and warp ks of a row reads the chunks
 * ks*32 + lane + i*32*KS. */
template <int B, int NT>
__global__ void __launch_bounds__(QG_WARPS * 32, NT <= 2 ? 4 : 2) /* 64 / 128 registers */
    k_qgemv_dp4a(float *y, const uint32_t *w, const void *scales, const void *biases, int sdt,
                 int group, const float *bias, const int8_t *dig, const float *E, const float *sx16,
                 int n, int rows, int cols, int ks_log2) {
    static_assert(B == 4 || B == 8, "dp4a GEMV: 4- or 8-bit codes");
    constexpr int CODES = 128 / B;     /* codes per 16-byte chunk */
    constexpr int NW = B == 4 ? 8 : 4; /* 4-byte code words (after nibble split) per chunk */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int KS = 1 << ks_log2, ks = warp & (KS - 1);
    const int row = blockIdx.x * (QG_WARPS >> ks_log2) + (warp >> ks_log2);
    const bool live = row < rows;
    const int nch = live ? cols / CODES : 0; /* chunks this warp's row has (0: no row) */
    const int ng = cols >> 5, gpr = cols / group, n16 = cols >> 4;
    const uint4 *wrow = (const uint4 *)w + (int64_t)(live ? row : 0) * (cols / CODES);
    const int step = 32 * KS;

    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;

    /* QG_UNROLL chunks per lane in flight; the first ones are issued before waiting for pass 1 */
    uint4 cur[QG_UNROLL];
    float sc[QG_UNROLL], bc[QG_UNROLL]; /* the chunks' group scale and bias */
    int c0 = ks * 32 + lane;
    qg_load_chunks<B>(cur, sc, bc, wrow, scales, biases, sdt, (int64_t)row * gpr, group, c0, step,
                      nch);
    qg_wait_prior_grid(); /* pass 1's digits are complete from here on */

    for (;;) {
#pragma unroll
        for (int u = 0; u < QG_UNROLL; u++) {
            const int c = c0 + u * step;
            if (c >= nch) break;
            const int col0 = c * CODES;
            const float s = sc[u], b = bc[u];
            const uint32_t wd[4] = {cur[u].x, cur[u].y, cur[u].z, cur[u].w};
            uint32_t cw[NW];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if constexpr (B == 4) {
                    cw[2 * i] = wd[i] & 0x0F0F0F0Fu;
                    cw[2 * i + 1] = (wd[i] >> 4) & 0x0F0F0F0Fu;
                } else {
                    cw[i] = wd[i];
                }
            }
            const int gq = col0 >> 5; /* 32-column block of x */
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                const int64_t tb = (int64_t)t * ng + gq;
                /* digit p of this chunk's columns: bytes p*32 (+16 for the second half of the
                 * block when a chunk holds 16 8-bit codes) of the block's 96 */
                const uint4 *dp = (const uint4 *)(dig + tb * 96 + (col0 & 31));
                int D[3];
#pragma unroll
                for (int p = 0; p < 3; p++) {
                    int d = 0;
#pragma unroll
                    for (int k = 0; k < NW / 4; k++) {
                        const uint4 dv = __ldg(dp + 2 * p + k);
                        d = qg_dp4a(cw[4 * k], dv.x, d);
                        d = qg_dp4a(cw[4 * k + 1], dv.y, d);
                        d = qg_dp4a(cw[4 * k + 2], dv.z, d);
                        d = qg_dp4a(cw[4 * k + 3], dv.w, d);
                    }
                    D[p] = d;
                }
                const float qx =
                    fmaf((float)D[2], 65536.0f, fmaf((float)D[1], 256.0f, (float)D[0]));
                const float *sxp = sx16 + (int64_t)t * n16 + (col0 >> 4);
                const float sx = B == 4 ? __ldg(sxp) + __ldg(sxp + 1) : __ldg(sxp);
                acc[t] = fmaf(s * __ldg(E + tb), qx, fmaf(b, sx, acc[t]));
            }
        }
        c0 += QG_UNROLL * step;
        if (c0 >= nch) break;
        qg_load_chunks<B>(cur, sc, bc, wrow, scales, biases, sdt, (int64_t)row * gpr, group, c0,
                          step, nch);
    }

    __shared__ float part[QG_WARPS][NT];
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

static int g_qg_pdl = -1; /* < 0: env KILN_CUDA_QGEMV_PDL (default on) */
extern "C" void kiln_cuda_set_qgemv_pdl(int on) {
    g_qg_pdl = on;
}

/* PDL needs griddepcontrol.wait in the kernel, which only the sm_90 build has: Hopper only. */
static bool qg_use_pdl(kcu_state *st) {
    if (g_qg_pdl < 0) {
        const char *e = getenv("KILN_CUDA_QGEMV_PDL");
        g_qg_pdl = e && *e ? atoi(e) != 0 : 1;
    }
    static int major = -1;
    if (major < 0 && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                            st->device) != cudaSuccess)
        major = 0;
    return g_qg_pdl && major == 9;
}

bool kcu_qgemv_dp4a_applies(const kiln_matrix *w, int64_t n) {
    return kiln_matrix_is_quantized(w) && (w->bits == 4 || w->bits == 8) && n >= 1 && n <= 8 &&
           w->group_size >= 32 && w->group_size % 32 == 0 && w->cols % w->group_size == 0 &&
           ((uintptr_t)w->data & 15) == 0 && w->rows < INT32_MAX && w->cols < INT32_MAX / 8;
}

template <int B, int NT>
static void launch_dp4a(kcu_state *st, dim3 grid, bool pdl, float *y, const kiln_matrix *w,
                        const int8_t *dig, const float *E, const float *sx16, int n, int ks_log2) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(QG_WARPS * 32);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = st->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    const uint32_t *q = (const uint32_t *)w->data;
    const int sdt = (int)w->scale_dtype, group = w->group_size, rows = (int)w->rows,
              cols = (int)w->cols;
    cudaError_t e = cudaLaunchKernelEx(&cfg, k_qgemv_dp4a<B, NT>, y, q, w->scales, w->biases, sdt,
                                       group, w->bias, dig, E, sx16, n, rows, cols, ks_log2);
    if (e != cudaSuccess && pdl) { /* e.g. a driver without PDL: launch plainly */
        (void)cudaGetLastError();
        cfg.numAttrs = 0;
        e = cudaLaunchKernelEx(&cfg, k_qgemv_dp4a<B, NT>, y, q, w->scales, w->biases, sdt, group,
                               w->bias, dig, E, sx16, n, rows, cols, ks_log2);
    }
    KCU_CHECK(st, e);
}

bool kcu_qgemv_dp4a(kcu_state *st, float *y, const float *x, int64_t n, const kiln_matrix *w,
                    int split) {
    if (!kcu_qgemv_dp4a_applies(w, n)) return false;
    const int cols = (int)w->cols, rows = (int)w->rows, ng = cols / 32;
    /* scratch: E [n, ng] f32, sx16 [n, 2ng] f32, digits [n, ng, 96] bytes */
    const size_t e_bytes = ((size_t)n * ng * 4 + 255) & ~(size_t)255;
    const size_t s_bytes = ((size_t)n * ng * 8 + 255) & ~(size_t)255;
    char *scr = (char *)kcu_scratch(st, e_bytes + s_bytes + (size_t)n * ng * 96);
    if (!scr) return true; /* the sticky error is set */
    float *E = (float *)scr, *sx16 = (float *)(scr + e_bytes);
    int8_t *dig = (int8_t *)(scr + e_bytes + s_bytes);
    const int64_t warps = n * ng;
    k_qx_digits<<<(unsigned)((warps + 7) / 8), 256, 0, st->stream>>>(dig, E, sx16, x, (int)n, cols,
                                                                     w->bits == 4);
    KCU_LAUNCHED(st);
    /* columns split between KS warps of a block only when rows alone leave SMs short of warps */
    int ks_log2 = 0;
    if (split == 1 || split == 2 || split == 4 || split == 8) {
        while ((1 << ks_log2) < split) ks_log2++;
    } else {
        const int64_t want = (int64_t)st->n_sms * 16, nch = cols / (128 / w->bits);
        while (ks_log2 < 3 && ((int64_t)rows << ks_log2) < want && nch >= (64 << ks_log2))
            ks_log2++;
    }
    const int rows_per_block = QG_WARPS >> ks_log2;
    dim3 grid((unsigned)((rows + rows_per_block - 1) / rows_per_block));
    const bool pdl = qg_use_pdl(st);
#define QG(BB, NN) launch_dp4a<BB, NN>(st, grid, pdl, y, w, dig, E, sx16, (int)n, ks_log2)
    if (w->bits == 4) {
        if (n == 1)
            QG(4, 1);
        else if (n == 2)
            QG(4, 2);
        else if (n <= 4)
            QG(4, 4);
        else
            QG(4, 8);
    } else {
        if (n == 1)
            QG(8, 1);
        else if (n == 2)
            QG(8, 2);
        else if (n <= 4)
            QG(8, 4);
        else
            QG(8, 8);
    }
#undef QG
    return true;
}
