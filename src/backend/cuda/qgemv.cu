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
 *   never straddles a quantization group (groups are powers of two >= 32 columns). 4-bit codes are
 *   split into the even and odd nibbles of each word ((w & 0x0F0F0F0F), (w >> 4) & 0x0F0F0F0F), so
 *   pass 1 stores each 8-column run's digits as columns 0,2,4,6,1,3,5,7 for 4-bit weights.
 *
 * With programmatic dependent launch (cuda_common.cuh) pass 2's blocks start while pass 1
 * runs, issue their first weight loads, and wait (griddepcontrol.wait) only before reading x's
 * digits. Error: |x_j - E*X_j| <= 2^-23 * max|x| of its block, ~1e-7 relative in the result. */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/quant.cuh"

#include <stdlib.h>

#define QG_WARPS    8 /* warps per block */
#define QG_INFLIGHT 4 /* 16-byte chunks in flight per lane (over its R rows) */

/* acc + sum over the 4 bytes of a (unsigned) * b (signed) */
__device__ __forceinline__ int qg_dp4a(uint32_t a, uint32_t b, int acc) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(acc));
    return d;
}

/* Pass 1. x [n, cols] (cols % 32 == 0). Writes dig [n, 3 digits, cols/16 units, 16 bytes] (digit p
 * of 16 columns in storage order, units ordered as below), E [n, cols/32], sx16 [n, cols/16].
 * perm4: the 4-bit column and unit order. */
__global__ void __launch_bounds__(256)
    k_qx_digits(int8_t *dig, float *E, float *sx16, const float *x, int n, int cols, int perm4) {
    KCU_PDL_ENTER();
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
    /* 16-column unit u = 2g + lane/16, stored at U(u) = u (8-bit) or (u & 1) * ng + u / 2 (4-bit,
     * where a lane reads units 2c and 2c+1 of its chunk c: consecutive lanes, consecutive 16 B) */
    const int h = lane >> 4, unit = perm4 ? h * ng + g : 2 * g + h, n16 = cols >> 4;
    int8_t *o = dig + ((int64_t)t * 3 * n16 + unit) * 16 + (pos & 15);
    o[0] = (int8_t)d0;
    o[(int64_t)n16 * 16] = (int8_t)d1;
    o[(int64_t)n16 * 32] = (int8_t)d2;
    float s = v; /* sums of lanes 0..15 and 16..31 */
#pragma unroll
    for (int k = 1; k < 16; k <<= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    if (lane == 0) E[gw] = __int_as_float((127 + e - 22) << 23);
    if ((lane & 15) == 0) sx16[(int64_t)t * (cols / 16) + 2 * g + (lane >> 4)] = s;
}

/* Issues the loads of a lane's next QG_INFLIGHT/R chunks c0 + u*step of its R rows (codes, and the
 * scale and bias of each chunk's group; g0[r] = row r's first group) so they are all in flight at
 * once. Chunks past the row's end read as 0. */
template <int B, int R, int U>
__device__ __forceinline__ void qg_load_chunks(uint4 (&q)[U][R], float (&s)[U][R], float (&b)[U][R],
                                               const uint4 *const (&wr)[R], const int64_t (&g0)[R],
                                               const void *scales, const void *biases, int sdt,
                                               int group_log2, int c0, int step, int nch) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = c0 + u * step;
        const int g = (c * (128 / B)) >> group_log2;
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (c < nch) {
                q[u][r] = kcu_load_stream16(wr[r] + c);
                s[u][r] = kcu_load(scales, g0[r] + g, sdt);
                b[u][r] = kcu_load(biases, g0[r] + g, sdt);
            } else {
                q[u][r] = make_uint4(0, 0, 0, 0);
                s[u][r] = b[u][r] = 0.0f;
            }
        }
    }
}

/* Pass 2. y [n, rows] (+bias), w uint32 [rows, cols*B/32], scales/biases [rows, cols/group],
 * dig/E/sx16 from pass 1. A warp owns a tile of R consecutive rows (a partial last tile re-reads
 * its last row and does not write it) and lane l of warp ks of the tile's KS warps reads chunks
 * ks*32 + l + i*32*KS of every row of the tile: each digit load serves R rows. A block holds
 * QG_WARPS/KS tiles; warp = tile in block * KS + ks. */
template <int B, int NT, int R> /* 64 / 80 / 128 registers: 32 / 24 / 16 warps per SM */
__global__ void __launch_bounds__(QG_WARPS * 32, NT *R <= 2    ? 4
                                                 : NT * R <= 4 ? 3
                                                               : 2)
    k_qgemv_dp4a(float *y, const uint32_t *w, const void *scales, const void *biases, int sdt,
                 int group_log2, const float *bias, const uint4 *dig, const float *E,
                 const float *sx16, int n, int rows, int cols, int ks_log2) {
    static_assert(B == 4 || B == 8, "dp4a GEMV: 4- or 8-bit codes");
    constexpr int CODES = 128 / B;     /* codes per 16-byte chunk */
    constexpr int NW = B == 4 ? 8 : 4; /* 4-byte code words (after the nibble split) per chunk */
    constexpr int U = QG_INFLIGHT / R; /* chunks per row in flight per lane */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int KS = 1 << ks_log2, ks = warp & (KS - 1);
    const int r0 = (blockIdx.x * (QG_WARPS >> ks_log2) + (warp >> ks_log2)) * R;
    const bool live = r0 < rows;
    const int nch = live ? cols / CODES : 0; /* chunks per row (0: the warp has no rows) */
    const int ng = cols >> 5, gpr = cols >> group_log2, n16 = cols >> 4;
    const uint4 *wr[R];
    int64_t g0[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int row = !live ? 0 : r0 + r < rows ? r0 + r : rows - 1;
        wr[r] = (const uint4 *)w + (int64_t)row * (cols / CODES);
        g0[r] = (int64_t)row * gpr;
    }
    const int step = 32 * KS;

    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;

    /* the first chunks are in flight before waiting for pass 1 */
    uint4 q[U][R];
    float sc[U][R], bc[U][R]; /* the chunks' group scales and biases */
    int c0 = ks * 32 + lane;
    qg_load_chunks<B, R, U>(q, sc, bc, wr, g0, scales, biases, sdt, group_log2, c0, step, nch);
    kcu_pdl_wait(); /* pass 1's digits are complete from here on */
    kcu_pdl_trigger();

    for (;;) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * step;
            if (c >= nch) break;
            uint32_t cw[R][NW];
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint32_t wd[4] = {q[u][r].x, q[u][r].y, q[u][r].z, q[u][r].w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if constexpr (B == 4) {
                        cw[r][2 * i] = wd[i] & 0x0F0F0F0Fu;
                        cw[r][2 * i + 1] = (wd[i] >> 4) & 0x0F0F0F0Fu;
                    } else {
                        cw[r][i] = wd[i];
                    }
                }
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                int D[R][3];
#pragma unroll
                for (int p = 0; p < 3; p++) {
#pragma unroll
                    for (int r = 0; r < R; r++) D[r][p] = 0;
#pragma unroll
                    for (int k = 0; k < NW / 4; k++) {
                        /* digit p of the 16 columns k of this chunk (4-bit: unit 2c+k, stored at
                         * k*ng + c; 8-bit: unit c) */
                        const uint4 dv =
                            __ldg(dig + (int64_t)(t * 3 + p) * n16 + (B == 4 ? k * ng + c : c));
#pragma unroll
                        for (int r = 0; r < R; r++) {
                            D[r][p] = qg_dp4a(cw[r][4 * k], dv.x, D[r][p]);
                            D[r][p] = qg_dp4a(cw[r][4 * k + 1], dv.y, D[r][p]);
                            D[r][p] = qg_dp4a(cw[r][4 * k + 2], dv.z, D[r][p]);
                            D[r][p] = qg_dp4a(cw[r][4 * k + 3], dv.w, D[r][p]);
                        }
                    }
                }
                const float e = __ldg(E + (int64_t)t * ng + (c * CODES >> 5));
                float sx;
                if constexpr (B == 4) {
                    const float2 s2 = __ldg((const float2 *)(sx16 + (int64_t)t * n16 + 2 * c));
                    sx = s2.x + s2.y;
                } else {
                    sx = __ldg(sx16 + (int64_t)t * n16 + c);
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const float qx = fmaf((float)D[r][2], 65536.0f,
                                          fmaf((float)D[r][1], 256.0f, (float)D[r][0]));
                    acc[r][t] = fmaf(sc[u][r] * e, qx, fmaf(bc[u][r], sx, acc[r][t]));
                }
            }
        }
        c0 += U * step;
        if (c0 >= nch) break;
        qg_load_chunks<B, R, U>(q, sc, bc, wr, g0, scales, biases, sdt, group_log2, c0, step, nch);
    }

    __shared__ float part[QG_WARPS][R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = kcu_warp_sum(acc[r][t]);
            if (lane == 0) part[warp][r][t] = v;
        }
    __syncthreads();
    if (ks == 0 && live && lane < R * NT) {
        const int r = lane / NT, t = lane % NT, row = r0 + r;
        if (row < rows && t < n) {
            float v = 0.0f;
            for (int k = 0; k < KS; k++) v += part[warp + k][r][t];
            y[(int64_t)t * rows + row] = v + (bias ? bias[row] : 0.0f);
        }
    }
}

static int g_qg_rows = -1, g_qg_split = -1, g_qg_pdl = -1; /* < 0: from the environment */
extern "C" void kiln_cuda_set_qgemv_dp4a(int rows_per_warp, int split, int pdl) {
    g_qg_rows = rows_per_warp, g_qg_split = split, g_qg_pdl = pdl;
}
static int qg_env(int *v, const char *name, int dflt) {
    if (*v < 0) {
        const char *e = getenv(name);
        *v = e && *e ? atoi(e) : dflt;
    }
    return *v;
}

/* Pass 2 as a programmatic dependent launch: where the backend launches so (st->pdl_on, Hopper)
 * unless KILN_CUDA_QGEMV_PDL=0 / kiln_cuda_set_qgemv_dp4a(..., pdl = 0). */
static bool qg_use_pdl(kcu_state *st) {
    return qg_env(&g_qg_pdl, "KILN_CUDA_QGEMV_PDL", 1) != 0 && st->pdl_on;
}

bool kcu_qgemv_dp4a_applies(const kiln_matrix *w, int64_t n) {
    return kiln_matrix_is_quantized(w) && (w->bits == 4 || w->bits == 8) && n >= 1 && n <= 8 &&
           w->group_size >= 32 && (w->group_size & (w->group_size - 1)) == 0 &&
           w->cols % w->group_size == 0 && ((uintptr_t)w->data & 15) == 0 && w->rows < INT32_MAX &&
           w->cols < INT32_MAX / 8;
}

template <int B, int NT, int R>
static void launch_dp4a(kcu_state *st, bool pdl, float *y, const kiln_matrix *w, const uint4 *dig,
                        const float *E, const float *sx16, int n, int split) {
    const int rows = (int)w->rows, cols = (int)w->cols, tiles = (rows + R - 1) / R;
    /* columns split between KS warps only when row tiles alone leave SMs short of warps */
    int ks_log2 = 0;
    if (split == 1 || split == 2 || split == 4 || split == 8) {
        while ((1 << ks_log2) < split) ks_log2++;
    } else {
        const int64_t want = (int64_t)st->n_sms * 24, nch = cols / (128 / B);
        while (ks_log2 < 3 && ((int64_t)tiles << ks_log2) < want && nch >= (64 << ks_log2))
            ks_log2++;
    }
    const int tiles_per_block = QG_WARPS >> ks_log2;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)((tiles + tiles_per_block - 1) / tiles_per_block));
    cfg.blockDim = dim3(QG_WARPS * 32);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = st->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    const uint32_t *q = (const uint32_t *)w->data;
    const int sdt = (int)w->scale_dtype;
    int group_log2 = 5;
    while ((1 << group_log2) < w->group_size) group_log2++;
    cudaError_t e =
        cudaLaunchKernelEx(&cfg, k_qgemv_dp4a<B, NT, R>, y, q, w->scales, w->biases, sdt,
                           group_log2, w->bias, dig, E, sx16, n, rows, cols, ks_log2);
    if (e != cudaSuccess && pdl) { /* e.g. a driver without PDL: launch plainly */
        (void)cudaGetLastError();
        cfg.numAttrs = 0;
        e = cudaLaunchKernelEx(&cfg, k_qgemv_dp4a<B, NT, R>, y, q, w->scales, w->biases, sdt,
                               group_log2, w->bias, dig, E, sx16, n, rows, cols, ks_log2);
    }
    KCU_CHECK(st, e);
}

template <int B, int NT>
static void launch_dp4a_rows(kcu_state *st, bool pdl, float *y, const kiln_matrix *w,
                             const uint4 *dig, const float *E, const float *sx16, int n) {
    /* rows per warp: each digit load serves R rows (L1 traffic ~ 3 bytes per code / R) */
    int R = qg_env(&g_qg_rows, "KILN_CUDA_QGEMV_ROWS", 0);
    if (R != 1 && R != 2 && R != 4) R = NT == 4 ? 4 : 2;
    const int split = qg_env(&g_qg_split, "KILN_CUDA_QGEMV_KS", 0);
    if (R == 1)
        launch_dp4a<B, NT, 1>(st, pdl, y, w, dig, E, sx16, n, split);
    else if (R == 2)
        launch_dp4a<B, NT, 2>(st, pdl, y, w, dig, E, sx16, n, split);
    else
        launch_dp4a<B, NT, 4>(st, pdl, y, w, dig, E, sx16, n, split);
}

/* ys[i] = x @ ws[i]^T for count matrices that all take the dp4a kernel with the same cols and
 * bits: x is turned into digits once, then one GEMV launch per matrix (q/k/v, gate/up). */
bool kcu_qgemv_dp4a_multi(kcu_state *st, int count, float *const *ys, const float *x, int64_t n,
                          const kiln_matrix *const *ws) {
    if (count < 1) return false;
    for (int i = 0; i < count; i++)
        if (!kcu_qgemv_dp4a_applies(ws[i], n) || ws[i]->cols != ws[0]->cols ||
            ws[i]->bits != ws[0]->bits)
            return false;
    const kiln_matrix *w0 = ws[0];
    const int cols = (int)w0->cols, ng = cols / 32;
    /* scratch: E [n, ng] f32, sx16 [n, 2ng] f32, digits [n, 3, 2ng, 16] bytes */
    const size_t e_bytes = ((size_t)n * ng * 4 + 255) & ~(size_t)255;
    const size_t s_bytes = ((size_t)n * ng * 8 + 255) & ~(size_t)255;
    char *scr = (char *)kcu_scratch(st, e_bytes + s_bytes + (size_t)n * ng * 96);
    if (!scr) return true; /* the sticky error is set */
    float *E = (float *)scr, *sx16 = (float *)(scr + e_bytes);
    int8_t *dig = (int8_t *)(scr + e_bytes + s_bytes);
    const int64_t warps = n * ng;
    KCU_LAUNCH(st, k_qx_digits, (unsigned)((warps + 7) / 8), 256, 0, dig, E, sx16, x, (int)n, cols,
               w0->bits == 4 ? 1 : 0);
    KCU_LAUNCHED(st);
    const bool pdl = qg_use_pdl(st);
    const uint4 *d4 = (const uint4 *)dig;
    for (int i = 0; i < count; i++) {
        float *y = ys[i];
        const kiln_matrix *w = ws[i];
        const bool p = pdl;
#define QG(BB, NN) launch_dp4a_rows<BB, NN>(st, p, y, w, d4, E, sx16, (int)n)
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
    }
    return true;
}

bool kcu_qgemv_dp4a(kcu_state *st, float *y, const float *x, int64_t n, const kiln_matrix *w) {
    return kcu_qgemv_dp4a_multi(st, 1, &y, x, n, &w);
}
