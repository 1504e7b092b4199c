/* attention_decode.cuh — decode attention over a short context in one launch: one block per (KV
 * head, sequence), its warps splitting the keys.
 *
 * A decode step (one query token per sequence) against a contiguous cache: 16 warps of one block
 * take key groups of ATTS_KB = 4 in turn (warp w: keys kbeg + 4w .. + 3, then + 64, ...); lane l
 * holds dims 4l..4l+3 (and 128 + 4l.. for head dims above 128) of q, of each key's K and V rows
 * and of the output, so a score is a 4- or 8-term partial dot product per lane and a warp sum.
 * Each warp keeps an online softmax per query head of the GQA group; the warps' (m, l, acc) are
 * merged by log-sum-exp in shared memory. One launch and no partials in global memory, where
 * attention.cu's split kernel needs a split launch and a merge launch, each split waiting on its
 * own K/V tile. attention.cu launches it (attention_short) for contexts up to
 * KILN_CUDA_ATT_SHORT keys; tests/emu/attention_emulate.cc compiles this file on the CPU
 * (ATTS_HOST_EMU) with emulated threads, barriers and shuffles. */
#ifndef KILN_CUDA_ATTENTION_DECODE_CUH
#define KILN_CUDA_ATTENTION_DECODE_CUH

#ifndef ATTS_HOST_EMU
#include "backend/cuda/cuda_common.cuh"
#define ATTS_SMEM(name) extern __shared__ float name[]
#endif

#include <stdint.h>

#define ATTS_WARPS   16
#define ATTS_KB      4  /* keys per warp per turn */
#define ATTS_MAX_SEQ 64 /* sequences per launch (KCU_ATT_MAX_SEQ) */

struct atts_seq {
    const void *k, *v; /* the sequence's cache: [>= pos+1, n_kv_heads*hd | *vhd], key i at row i */
    int pos0, t0;      /* the query's position (unless positions), its row in q / out */
};

/* Kernel parameters (< 4 KB). */
struct atts_args {
    const float *q;           /* [rows, n_heads*hd], row t0 of each sequence */
    float *out;               /* [rows, n_heads*vhd] */
    const int32_t *positions; /* device positions by row (a recorded step), or NULL: pos0 */
    int n_heads, n_kv_heads, group, hd, vhd, window, kv_dtype;
    float scale, softcap;
    atts_seq s[ATTS_MAX_SEQ];
};

/* Whether the kernel takes the geometry: group <= 8 (<= 2 with head dims above 128: registers),
 * head dims multiples of 4 up to 256, shared memory <= 96 KiB. */
static inline size_t atts_smem_bytes(int group, int vhd) {
    return sizeof(float) * (size_t)ATTS_WARPS * (size_t)group * (size_t)(vhd + 2);
}
static inline bool atts_applies(int group, int hd, int vhd) {
    const bool two = hd > 128 || vhd > 128;
    return group >= 1 && group <= (two ? 2 : 8) && hd % 4 == 0 && vhd % 4 == 0 && hd <= 256 &&
           vhd <= 256 && atts_smem_bytes(group, vhd) <= 96 * 1024;
}

/* The two 16-bit cache values of a 32-bit word (low half first) as f32: bf16 or f16 (dt). */
__device__ __forceinline__ void kcu_kv_unpack2(uint32_t w, int dt, float v[2]) {
    if (dt == KILN_DT_BF16) {
        v[0] = __uint_as_float(w << 16);
        v[1] = __uint_as_float(w & 0xffff0000u);
    } else {
        v[0] = kcu_f16((uint16_t)(w & 0xffffu));
        v[1] = kcu_f16((uint16_t)(w >> 16));
    }
}

/* 4 values of K or V at element offset off (one 16-byte f32 or 8-byte f16/bf16 load), as f32. The
 * cache dtype DT is a template argument: a runtime branch around each load kept the compiler from
 * issuing a turn's loads together (f16 steps measured 13.3 against f32's 10.4 us on the H200). */
template <int DT>
__device__ __forceinline__ void atts_load4(const void *base, int64_t off, float v[4]) {
    if constexpr (DT == KILN_DT_F32) {
        const float4 f = kcu_ld((const float4 *)((const float *)base + off));
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
        const uint2 u = kcu_ld((const uint2 *)((const uint16_t *)base + off));
        kcu_kv_unpack2(u.x, DT, v);
        kcu_kv_unpack2(u.y, DT, v + 2);
    }
}

/* GM: the group size rounded up (1, 2, 4, 8); CH: 4-dim chunks per lane (hd, vhd <= 128 * CH); DT:
 * the cache dtype (A.kv_dtype).
 * grid (n_kv_heads, sequences), ATTS_WARPS * 32 threads; dynamic shared memory
 * atts_smem_bytes: [ATTS_WARPS][group][vhd] accumulators, then [ATTS_WARPS][group][2] (m, l). */
template <int GM, int CH, int DT>
__global__ void __launch_bounds__(ATTS_WARPS * 32)
    k_attn_decode_short(const __grid_constant__ atts_args A) {
    KCU_PDL_ENTER();
    const atts_seq &S = A.s[blockIdx.y];
    const int kvh = blockIdx.x, G = A.group, hd = A.hd, vhd = A.vhd;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pos = A.positions ? A.positions[S.t0] : S.pos0;
    const int kbeg = A.window > 0 ? max(0, pos - A.window + 1) : 0, kend = pos + 1;
    const int64_t kstride = (int64_t)A.n_kv_heads * hd, vstride = (int64_t)A.n_kv_heads * vhd;
    /* the group's q rows, scaled: the lane's dims */
    float q[GM][CH][4];
#pragma unroll
    for (int g = 0; g < GM; g++)
#pragma unroll
        for (int c = 0; c < CH; c++) {
            const int d0 = 4 * lane + 128 * c;
            const float *qr = A.q + ((int64_t)S.t0 * A.n_heads + kvh * G + g) * hd + d0;
#pragma unroll
            for (int e = 0; e < 4; e++) q[g][c][e] = g < G && d0 < hd ? qr[e] * A.scale : 0.0f;
        }
    float m[GM], l[GM], acc[GM][CH][4];
#pragma unroll
    for (int g = 0; g < GM; g++) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int c = 0; c < CH; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[g][c][e] = 0.0f;
    }
    for (int j0 = kbeg + ATTS_KB * warp; j0 < kend; j0 += ATTS_KB * ATTS_WARPS) {
        float kx[ATTS_KB][CH][4], vx[ATTS_KB][CH][4];
#pragma unroll
        for (int u = 0; u < ATTS_KB; u++)
#pragma unroll
            for (int c = 0; c < CH; c++) {
                const int d0 = 4 * lane + 128 * c, j = j0 + u;
                if (j < kend && d0 < hd)
                    atts_load4<DT>(S.k, (int64_t)j * kstride + (int64_t)kvh * hd + d0, kx[u][c]);
                else
                    kx[u][c][0] = kx[u][c][1] = kx[u][c][2] = kx[u][c][3] = 0.0f;
                if (j < kend && d0 < vhd)
                    atts_load4<DT>(S.v, (int64_t)j * vstride + (int64_t)kvh * vhd + d0, vx[u][c]);
                else
                    vx[u][c][0] = vx[u][c][1] = vx[u][c][2] = vx[u][c][3] = 0.0f;
            }
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g >= G) break;
            float sc[ATTS_KB];
#pragma unroll
            for (int u = 0; u < ATTS_KB; u++) {
                float s = 0.0f;
#pragma unroll
                for (int c = 0; c < CH; c++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s = fmaf(q[g][c][e], kx[u][c][e], s);
                sc[u] = s;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
#pragma unroll
                for (int u = 0; u < ATTS_KB; u++) sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], o);
            float mt = -INFINITY;
#pragma unroll
            for (int u = 0; u < ATTS_KB; u++) {
                if (A.softcap > 0.0f) sc[u] = A.softcap * kcu_tanh(sc[u] / A.softcap);
                if (j0 + u >= kend) sc[u] = -INFINITY;
                mt = fmaxf(mt, sc[u]);
            }
            const float mn = fmaxf(m[g], mt); /* finite: key j0 is visible */
            const float alpha = __expf(m[g] - mn);
            float pu[ATTS_KB], ps = 0.0f;
#pragma unroll
            for (int u = 0; u < ATTS_KB; u++) {
                pu[u] = __expf(sc[u] - mn);
                ps += pu[u];
            }
            l[g] = l[g] * alpha + ps;
            m[g] = mn;
#pragma unroll
            for (int c = 0; c < CH; c++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float v = acc[g][c][e] * alpha;
#pragma unroll
                    for (int u = 0; u < ATTS_KB; u++) v = fmaf(pu[u], vx[u][c][e], v);
                    acc[g][c][e] = v;
                }
        }
    }
    /* merge the warps: out = sum_w acc_w e^(m_w - M) / sum_w l_w e^(m_w - M), M = max_w m_w */
    ATTS_SMEM(sm);
    float *sacc = sm;                               /* [ATTS_WARPS][G][vhd] */
    float *sml = sm + (size_t)ATTS_WARPS * G * vhd; /* [ATTS_WARPS][G][2] */
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g >= G) break;
#pragma unroll
        for (int c = 0; c < CH; c++) {
            const int d0 = 4 * lane + 128 * c;
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (d0 + e < vhd) sacc[((size_t)warp * G + g) * vhd + d0 + e] = acc[g][c][e];
        }
        if (lane == 0) sml[(warp * G + g) * 2] = m[g], sml[(warp * G + g) * 2 + 1] = l[g];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * vhd; i += blockDim.x) {
        const int g = i / vhd, d = i - g * vhd;
        float M = -INFINITY;
        for (int w = 0; w < ATTS_WARPS; w++) M = fmaxf(M, sml[(w * G + g) * 2]);
        float num = 0.0f, den = 0.0f;
        for (int w = 0; w < ATTS_WARPS; w++) {
            const float mw = sml[(w * G + g) * 2];
            if (mw == -INFINITY) continue; /* a warp that had no key */
            const float e = __expf(mw - M);
            den += sml[(w * G + g) * 2 + 1] * e;
            num += sacc[((size_t)w * G + g) * vhd + d] * e;
        }
        A.out[((int64_t)S.t0 * A.n_heads + kvh * G + g) * vhd + d] = den > 0.0f ? num / den : 0.0f;
    }
}

#endif
