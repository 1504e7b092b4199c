/* attention_prefill_tc.cu — prefill attention on tensor cores (FlashAttention-2 structure) over a
 * contiguous f16 / bf16 device KV cache: causal, GQA, optional sliding window and logit softcap,
 * head dims 64, 80, 96, 128, 256 (K and V of the same dim). attention.cu sends a launch's
 * sequences of >= FA_MIN_TOKENS tokens here (kcu_attention_prefill_tc) and keeps the rest.
 *
 * A block (4 warps) owns one KV head and 64 "rows" (query token x query head of that KV head's
 * GQA group, row = token * group + head-in-group, as in attention.cu), so each K/V tile it stages
 * serves the whole group. Each warp owns 16 rows: its Q fragments come from shared memory, S =
 * Q K^T of a KT-key tile accumulates in f32 registers (mma.sync m16n8k16, bf16 or f16 inputs to
 * match the cache), the online softmax (running max m, sum l) runs on those registers, and P
 * (rounded to the cache's 16-bit type) goes straight from S's accumulator fragments into the A
 * fragments of O += P V. Fragment layouts and tile index math live in fa_fragment.h (checked on the
 * CPU by tests/test_fa_fragment.c). Tiles fully outside a warp's causal / window range are skipped;
 * a tile fully inside it is not masked. Scores are q.k in f32 times scale (then softcap), as in
 * the CPU reference; Q is rounded to 16 bits once, when staged.
 *
 * Two variants of the same kernel (template FAST): the default double-buffers K/V tiles with
 * cp.async (the next tile loads while this one is computed) and loads fragments with ldmatrix
 * (V through .trans); the simple one (KILN_CUDA_FA_SIMPLE=1) stages one tile through registers,
 * stores V transposed and loads fragments 32 bits at a time: a fallback with less to go wrong.
 * f32 caches take the simple kernel, which converts K/V tiles as it stages them: in exact mode
 * (KILN_CUDA_FA_F32=2) to a bf16 hi + lo pair each (SPLIT; Q and P too, hi = bf16(x), lo = bf16(x -
 * hi)), and each MMA becomes three, lo hi + hi lo + hi hi: products kept to ~2^-16 relative, the
 * precise mode's numerics of the cuBLAS split path; measured on the H200 it prefills 1.5-5x faster
 * than the CUDA-core kernel (KILN_CUDA_FA_F32=0). Fast mode (--fast-math, bf16 matmul operands)
 * rounds K/V to one bf16 instead (KILN_CUDA_FA_F32=1; results then carry bf16 rounding of K and
 * V), 1.1-1.2x faster again at 4096 tokens. Paged caches (PAGED, kv_paged.cu's block pool: affine
 * q8 / q4 or plain-float records, not rotated) take the simple kernel too: each 8 dims of a key are
 * decoded from its record through the sequence's block table as the tile is staged, then kept as
 * bf16 hi + lo pairs like f32 caches. */
/* tests/emu/fa_emulate.cc compiles the kernel on the CPU (FA_HOST_EMU) with its own shims */
#ifndef FA_HOST_EMU
#include "backend/cuda/attention_paged.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/quant.cuh" /* kcu_fast_math */
#endif
#include "backend/cuda/fa_fragment.h"
#include "backend/cuda/kv_codec.cuh"

#include <stdlib.h>

#define FA_WARPS      4
#define FA_ROWS       (FA_WARPS * 16)
#define FA_MIN_TOKENS 64

/* one sequence of a launch */
struct fa_seq {
    const void *k, *v; /* PAGED: k is the sequence's device block table, v unused */
    int pos0, n, t0;   /* first position, tokens, first row of q / out */
};

struct fa_launch {
    kcu_attn_args a; /* q / out: stacked rows of all sequences; n, pos0, k, v unused */
    int group, n_seq;
    bool fast;          /* the cp.async + ldmatrix kernel (else the simple one) */
    kcu_paged_layer pl; /* PAGED: the pool, its layer and codecs */
    fa_seq s[KCU_ATT_MAX_SEQ];
};

#ifndef FA_HOST_EMU
template <bool BF16> __device__ __forceinline__ uint32_t fa_pack(float lo, float hi) {
    if (BF16) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* .x = lo: the low half */
        return *(uint32_t *)&v;
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        return *(uint32_t *)&v;
    }
}

/* d (+)= a b for one m16n8k16 tile; a, b, d in the fragment layouts of fa_fragment.h. */
template <bool BF16>
__device__ __forceinline__ void fa_mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    if (BF16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* 16-byte global -> shared copy that bypasses registers (and L1); src_bytes = 0 writes zeros. */
__device__ __forceinline__ void fa_cp16(void *smem, const void *gmem, int src_bytes) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa), "l"(gmem),
                 "r"(src_bytes));
}
__device__ __forceinline__ void fa_cp_commit() {
    asm volatile("cp.async.commit_group;");
}
template <int N> __device__ __forceinline__ void fa_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}
/* ldmatrix x4 (plain or .trans): registers r[0..3] from matrices 0..3 (fa_fragment.h). */
template <bool TRANS> __device__ __forceinline__ void fa_ldsm4(uint32_t r[4], const void *smem) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(sa));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(sa));
}
#else /* the emulator's warp-collective versions (tests/emu/fa_emulate.cc) */
template <bool BF16> uint32_t fa_pack(float lo, float hi) {
    return fa_emu_pack(lo, hi, BF16);
}
template <bool BF16> void fa_mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    fa_emu_mma(d, a, b, BF16);
}
static void fa_cp16(void *smem, const void *gmem, int src_bytes) {
    fa_emu_cp16(smem, gmem, src_bytes);
}
static void fa_cp_commit() {}
template <int N> void fa_cp_wait() {}
template <bool TRANS> void fa_ldsm4(uint32_t r[4], const void *smem) {
    fa_emu_ldsm4(r, smem, TRANS);
}
#endif

/* Shared memory (16-bit elements), row strides D + 8 and KT + 8. In 32-bit words that is D/2 + 4
 * (KT/2 + 4): the 8 groups g of a warp read words g * stride + t (t = 0..3), 8 distinct bank
 * quads for every D in {64, 80, 96, 128, 256} and KT in {32, 64}, and the 8 rows of an ldmatrix
 * cover all 32 banks (checked by tests/test_fa_fragment.c). 16-byte rows keep uint4 / cp.async
 * stores aligned.
 *   simple kernel (FAST = false): Qs [64][D+8], Ks [KT][D+8], Vt [D][KT+8], one K/V stage,
 *     staged through registers, fragments loaded 32 bits at a time;
 *   fast kernel (FAST = true): Qs, then two stages of Ks [KT][D+8] and Vs [KT][D+8] (key-major)
 *     filled by cp.async while the other stage is computed on, fragments by ldmatrix. */
template <int D, int KT, bool FAST, bool SPLIT = false> struct fa_smem {
    static constexpr int Q = FA_ROWS * (D + FA_PAD);
    static constexpr int K = KT * (D + FA_PAD);
    static constexpr int V = FAST ? KT * (D + FA_PAD) : D * (KT + FA_PAD);
    static constexpr int STAGES = FAST ? 2 : 1;
    /* SPLIT: the lo halves of Q, K and V, HALF elements after the hi ones, in the same layout */
    static constexpr int HALF = Q + STAGES * (K + V);
    static constexpr size_t bytes = (size_t)HALF * 2 * (SPLIT ? 2 : 1);
};

/* hi = bf16 pair of (a, b), lo = bf16 pair of the remainders (a - hi.a, b - hi.b) */
__device__ __forceinline__ void fa_split_bf16(float a, float b, uint32_t *hi, uint32_t *lo) {
    *hi = fa_pack<true>(a, b);
    *lo = fa_pack<true>(a - __uint_as_float(*hi << 16), b - __uint_as_float(*hi & 0xffff0000u));
}

/* F32KV (simple kernel only, BF16): the cache holds f32, rounded to bf16 as tiles are staged;
 * with SPLIT, staged as bf16 hi + lo pairs and multiplied as three products. PAGED (with F32KV
 * and SPLIT): the f32 values are decoded from paged records instead of read. */
template <int D, int KT, bool BF16, bool FAST, bool F32KV, bool SPLIT = false, bool PAGED = false>
__global__ void __launch_bounds__(FA_WARPS * 32) k_fa_prefill(const __grid_constant__ fa_launch L) {
    KCU_PDL_ENTER();
    static_assert(!SPLIT || (F32KV && BF16 && !FAST), "the split takes f32 caches, simple kernel");
    static_assert(!PAGED || SPLIT, "paged records are staged as pairs");
    using SM = fa_smem<D, KT, FAST, SPLIT>;
    const fa_seq &S = L.s[blockIdx.z];
    const int G = L.group, rows_total = S.n * G;
    /* blockIdx.x = KV head (fastest, so every head's heavy tiles start first), blockIdx.y = row
     * tile, heavy tiles (late tokens see more keys) first */
    const int row0 = (gridDim.y - 1 - blockIdx.y) * FA_ROWS;
    if (row0 >= rows_total) return; /* a shorter sequence of the batch */
    const kcu_attn_args &a = L.a;
    const int kvh = blockIdx.x, n_heads = a.p.n_heads, pos0 = S.pos0, window = a.window;
    const float *q = a.q + (int64_t)S.t0 * n_heads * D;
    float *out = a.out + (int64_t)S.t0 * n_heads * D;
    const int64_t kvstride = (int64_t)a.n_kv_heads * D;
    const uint16_t *kg = (const uint16_t *)S.k + (int64_t)kvh * D;
    const uint16_t *vg = (const uint16_t *)S.v + (int64_t)kvh * D;

    extern __shared__ uint4 fa_sm_raw[]; /* 16-byte aligned */
    uint16_t *Qs = (uint16_t *)fa_sm_raw;
    uint16_t *Ks0 = Qs + SM::Q;  /* stage 0 K; stage s at Ks0 + s * (K + V) */
    uint16_t *Vs0 = Ks0 + SM::K; /* stage 0 V (Vt in the simple kernel) */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    /* keys of the block: from the first row's window start to the last row's position */
    int k0, k1, unused_lo, unused_hi;
    fa_rows_keys(pos0, G, window, rows_total, row0, FA_ROWS, &k0, &k1, &unused_lo, &unused_hi);

    /* the fast kernel's K/V stage for keys [ks, ks + KT): 16 bytes (8 dims of a key) per copy,
     * dims fastest (coalesced); keys past k1 are zero-filled (never NaN in P V) */
    auto issue = [&](int ks, int stage) {
        uint16_t *Kd = Ks0 + stage * (SM::K + SM::V), *Vd = Kd + SM::K;
        for (int i = threadIdx.x; i < KT * (D / 8); i += blockDim.x) {
            int j = i / (D / 8), d = (i - j * (D / 8)) * 8;
            bool ok = ks + j < k1;
            int64_t off = (int64_t)(ok ? ks + j : k0) * kvstride + d;
            fa_cp16(Kd + fa_ks_off(D, j, d), kg + off, ok ? 16 : 0);
            fa_cp16(Vd + fa_ks_off(D, j, d), vg + off, ok ? 16 : 0);
        }
        fa_cp_commit();
    };
    if (FAST && k0 < k1) issue(k0, 0); /* overlaps the Q staging below */

    /* PAGED keys stored rotated (turbo ...:rotk): the block's Q rows are rotated the same way,
     * q -> H.D.q / sqrt(D) (kiln_hadamard_rotate; q.k is invariant), in f32 in the hi K/V stage's
     * shared memory (free until the first tile is staged, after a barrier), QR rows a pass */
    const bool qrot = PAGED && L.pl.k.rotate;
    constexpr int KV_BYTES = (SM::K + SM::V) * 2;
    constexpr int QR = FA_ROWS * D * 4 <= KV_BYTES       ? FA_ROWS
                       : FA_ROWS / 2 * D * 4 <= KV_BYTES ? FA_ROWS / 2
                                                         : FA_ROWS / 4;
    static_assert(QR * D * 4 <= KV_BYTES, "rotated Q rows fit");
    float *qr_sm = (float *)Ks0; /* [QR][D] while qrot */
    const float qr_scale = qrot ? kcu_inv_sqrt_rn(D) : 1.0f;
    for (int r0 = 0; r0 < FA_ROWS; r0 += qrot ? QR : FA_ROWS) {
        const int nr = qrot ? QR : FA_ROWS;
        if (qrot) {
            for (int i = threadIdx.x; i < nr * D; i += blockDim.x) {
                int r = r0 + i / D, d = i % D, row = row0 + r;
                float v = 0.0f;
                if (row < rows_total) {
                    int t = row / G, h = kvh * G + row % G;
                    v = q[((int64_t)t * n_heads + h) * D + d] * kcu_hadamard_sign(d);
                }
                qr_sm[i] = v;
            }
            kcu_fwht_rows(qr_sm, nr, D); /* begins and ends with a barrier */
        }
        /* Q: 4 dims per thread and step, rounded to the cache's 16-bit type; dead rows are zero */
        for (int i = threadIdx.x; i < nr * (D / 4); i += blockDim.x) {
            int r = r0 + i / (D / 4), d = (i % (D / 4)) * 4, row = row0 + r;
            float x0 = 0.0f, x1 = 0.0f, x2 = 0.0f, x3 = 0.0f;
            if (qrot) {
                const float *src = qr_sm + (r - r0) * D + d;
                x0 = __fmul_rn(src[0], qr_scale), x1 = __fmul_rn(src[1], qr_scale);
                x2 = __fmul_rn(src[2], qr_scale), x3 = __fmul_rn(src[3], qr_scale);
            } else if (row < rows_total) {
                int t = row / G, h = kvh * G + row % G;
                const float *src = q + ((int64_t)t * n_heads + h) * D + d;
                x0 = src[0], x1 = src[1], x2 = src[2], x3 = src[3];
            }
            uint32_t *dst = (uint32_t *)(Qs + fa_qs_off(D, r, d));
            if (SPLIT) {
                uint32_t *dlo = (uint32_t *)(Qs + SM::HALF + fa_qs_off(D, r, d));
                fa_split_bf16(x0, x1, &dst[0], &dlo[0]);
                fa_split_bf16(x2, x3, &dst[1], &dlo[1]);
            } else {
                dst[0] = fa_pack<BF16>(x0, x1);
                dst[1] = fa_pack<BF16>(x2, x3);
            }
        }
        if (qrot) __syncthreads(); /* this pass's rotated rows read before the next overwrites */
    }

    /* this thread's two rows (g and g + 8 of the warp's 16): last visible key hi (-1: dead row,
     * sees nothing) and first visible key lo */
    const int wrow0 = row0 + warp * 16;
    const bool warp_live = wrow0 < rows_total;
    int hi[2], lo[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int row = wrow0 + fa_c_row(lane, 2 * h);
        hi[h] = row < rows_total ? fa_row_hi(pos0, G, row) : -1;
        lo[h] = row < rows_total ? fa_row_lo(pos0, G, window, row) : 0;
    }
    /* the warp's key range [w_lo, w_hi] (union over its live rows) and [all_lo, all_hi], the
     * keys every live row of it sees: a tile inside that needs no mask */
    int w_lo = 0, w_hi = -1, all_lo = 0, all_hi = -1;
    if (warp_live) {
        fa_rows_keys(pos0, G, window, rows_total, wrow0, 16, &w_lo, &w_hi, &all_lo, &all_hi);
        w_hi--; /* inclusive */
    }

    /* the fast kernel keeps the warp's Q fragments in registers where they fit (D <= 128) */
    constexpr bool QREG = FAST && D <= 128;
    uint32_t qf[QREG ? D / 16 : 1][4];
    if (QREG) {
        __syncthreads(); /* Q staged */
        if (warp_live)
#pragma unroll
            for (int kk = 0; kk < (QREG ? D / 16 : 0); kk++)
                fa_ldsm4<false>(qf[kk], Qs + fa_qs_off(D, warp * 16 + fa_ldsm_q_row(lane),
                                                       16 * kk + fa_ldsm_q_col(lane)));
    }

    float o[D / 8][4];
#pragma unroll
    for (int db = 0; db < D / 8; db++) o[db][0] = o[db][1] = o[db][2] = o[db][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float scale = a.p.scale, cap = a.p.softcap;

    for (int ks = k0, it = 0; ks < k1; ks += KT, it++) {
        const uint16_t *Ks = Ks0, *Vs = Vs0;
        if (FAST) {
            const int stage = it & 1;
            Ks = Ks0 + stage * (SM::K + SM::V), Vs = Ks + SM::K;
            if (ks + KT < k1) { /* next tile into the other stage (freed by the last barrier) */
                issue(ks + KT, stage ^ 1);
                fa_cp_wait<1>(); /* this tile's group has landed (this thread's copies) */
            } else {
                fa_cp_wait<0>();
            }
            __syncthreads(); /* every thread's copies (and, first time, Q) visible */
        } else {
            __syncthreads(); /* Q staged / previous tile consumed */
            uint16_t *Kd = Ks0, *Vt = Vs0;
            /* 8 dims of key `key` as 16-bit values (zeros past the block's keys: never NaN);
             * SPLIT: the hi halves, the lo ones in *lo */
            auto load8 = [&](const void *base, bool is_v, int key, int d, uint4 *lo) -> uint4 {
                if (SPLIT) *lo = make_uint4(0, 0, 0, 0);
                if (key >= k1) return make_uint4(0, 0, 0, 0);
                int64_t off = (int64_t)key * kvstride + (int64_t)kvh * D + d;
                if (F32KV) {
                    float4 x, y;
                    if (PAGED) { /* a dropped block (window) reads as zeros, masked anyway */
                        const uint8_t *rec =
                            kcu_paged_rec(L.pl, (const int32_t *)S.k, key, kvh, is_v);
                        const kcu_codec &c = is_v ? L.pl.v : L.pl.k;
                        float e[8];
#pragma unroll
                        for (int i = 0; i < 8; i++)
                            e[i] = rec ? kcu_codec_elem(c, rec, D, d + i) : 0.0f;
                        x = make_float4(e[0], e[1], e[2], e[3]),
                        y = make_float4(e[4], e[5], e[6], e[7]);
                    } else {
                        const float4 *f = (const float4 *)((const float *)base + off);
                        x = kcu_ld(f), y = kcu_ld(f + 1);
                    }
                    if (SPLIT) {
                        uint4 h;
                        fa_split_bf16(x.x, x.y, &h.x, &lo->x);
                        fa_split_bf16(x.z, x.w, &h.y, &lo->y);
                        fa_split_bf16(y.x, y.y, &h.z, &lo->z);
                        fa_split_bf16(y.z, y.w, &h.w, &lo->w);
                        return h;
                    }
                    return make_uint4(fa_pack<BF16>(x.x, x.y), fa_pack<BF16>(x.z, x.w),
                                      fa_pack<BF16>(y.x, y.y), fa_pack<BF16>(y.z, y.w));
                }
                return kcu_ld((const uint4 *)((const uint16_t *)base + off));
            };
            /* K: 16 bytes (8 dims of one key) per thread and step, dims fastest (coalesced) */
            for (int i = threadIdx.x; i < KT * (D / 8); i += blockDim.x) {
                int j = i / (D / 8), d = (i - j * (D / 8)) * 8;
                uint4 lo;
                *(uint4 *)(Kd + fa_ks_off(D, j, d)) = load8(S.k, false, ks + j, d, &lo);
                if (SPLIT) *(uint4 *)(Kd + SM::HALF + fa_ks_off(D, j, d)) = lo;
            }
            /* V, transposed: keys fastest, so a warp's 16-bit stores go to 32 consecutive keys
             * of one Vt row (no bank conflicts); keys past the block's range are zero */
            for (int i = threadIdx.x; i < KT * (D / 8); i += blockDim.x) {
                int d = (i / KT) * 8, j = i % KT;
                uint4 ul, u = load8(S.v, true, ks + j, d, &ul);
#pragma unroll
                for (int half = 0; half < (SPLIT ? 2 : 1); half++) {
                    const uint4 &x = half ? ul : u;
                    uint16_t *dst = Vt + (half ? SM::HALF : 0);
                    uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        dst[fa_vt_off(KT, j, d + 2 * e)] = (uint16_t)(w[e] & 0xffffu);
                        dst[fa_vt_off(KT, j, d + 2 * e + 1)] = (uint16_t)(w[e] >> 16);
                    }
                }
            }
            __syncthreads();
        }
        /* warps with nothing visible in this tile only take part in the barriers */
        if (warp_live && ks <= w_hi && ks + KT - 1 >= w_lo) {
            const bool full = ks + KT - 1 <= all_hi && ks >= all_lo;

            /* S = Q K^T */
            float s[KT / 8][4];
#pragma unroll
            for (int nb = 0; nb < KT / 8; nb++) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t af[4];
                if (FAST) {
                    if (QREG) {
#pragma unroll
                        for (int r = 0; r < 4; r++) af[r] = qf[QREG ? kk : 0][r];
                    } else {
                        fa_ldsm4<false>(af, Qs + fa_qs_off(D, warp * 16 + fa_ldsm_q_row(lane),
                                                           16 * kk + fa_ldsm_q_col(lane)));
                    }
#pragma unroll
                    for (int nb = 0; nb < KT / 8; nb += 2) {
                        uint32_t bf[4];
                        fa_ldsm4<false>(bf, Ks + fa_ks_off(D, 8 * nb + fa_ldsm_k_key(lane),
                                                           16 * kk + fa_ldsm_k_dim(lane)));
                        fa_mma<BF16>(s[nb], af, bf);
                        fa_mma<BF16>(s[nb + 1], af, bf + 2);
                    }
                } else {
                    uint32_t afl[4]; /* SPLIT: Q's lo halves */
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        af[r] = *(const uint32_t *)(Qs + fa_q_frag(D, warp * 16, kk, lane, r));
                        if (SPLIT)
                            afl[r] = *(const uint32_t *)(Qs + SM::HALF +
                                                         fa_q_frag(D, warp * 16, kk, lane, r));
                    }
#pragma unroll
                    for (int nb = 0; nb < KT / 8; nb++) {
                        uint32_t bf[2], bfl[2];
#pragma unroll
                        for (int r = 0; r < 2; r++) {
                            bf[r] = *(const uint32_t *)(Ks + fa_k_frag(D, nb, kk, lane, r));
                            if (SPLIT)
                                bfl[r] = *(const uint32_t *)(Ks + SM::HALF +
                                                             fa_k_frag(D, nb, kk, lane, r));
                        }
                        if (SPLIT) { /* the small products first */
                            fa_mma<BF16>(s[nb], afl, bf);
                            fa_mma<BF16>(s[nb], af, bfl);
                        }
                        fa_mma<BF16>(s[nb], af, bf);
                    }
                }
            }

            /* scale, softcap, mask; row maxima (the 4 lanes of a group share a row) */
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nb = 0; nb < KT / 8; nb++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float x = s[nb][i] * scale;
                    if (cap > 0.0f) x = cap * kcu_tanh(x / cap);
                    if (!full) {
                        int key = ks + 8 * nb + fa_c_col(lane, i), h = i >> 1;
                        if (key > hi[h] || key < lo[h]) x = -INFINITY;
                    }
                    s[nb][i] = x;
                    mx[i >> 1] = fmaxf(mx[i >> 1], x);
                }
            float alpha[2], base[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                float mn = fmaxf(m[h], mx[h]);
                base[h] = mn == -INFINITY ? 0.0f : mn; /* no visible key yet: exp(-inf - 0) = 0 */
                alpha[h] = __expf(m[h] - base[h]);
                m[h] = mn;
                l[h] *= alpha[h]; /* this lane's partial sum; the group's 4 are added at the end */
            }
#pragma unroll
            for (int nb = 0; nb < KT / 8; nb++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float p = __expf(s[nb][i] - base[i >> 1]);
                    s[nb][i] = p;
                    l[i >> 1] += p;
                }
#pragma unroll
            for (int db = 0; db < D / 8; db++) {
                o[db][0] *= alpha[0], o[db][1] *= alpha[0];
                o[db][2] *= alpha[1], o[db][3] *= alpha[1];
            }

            /* O += P V: P's A fragments are S's accumulators, two key blocks per 16-key step */
#pragma unroll
            for (int kk = 0; kk < KT / 16; kk++) {
                uint32_t pf[4], pfl[4]; /* pfl: SPLIT, P's lo halves */
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const float *c = s[fa_p_nb(kk, r)];
                    if (SPLIT)
                        fa_split_bf16(c[fa_p_c(r)], c[fa_p_c(r) + 1], &pf[r], &pfl[r]);
                    else
                        pf[r] = fa_pack<BF16>(c[fa_p_c(r)], c[fa_p_c(r) + 1]);
                }
                if (FAST) {
#pragma unroll
                    for (int db = 0; db < D / 8; db += 2) {
                        uint32_t bf[4];
                        fa_ldsm4<true>(bf, Vs + fa_ks_off(D, 16 * kk + fa_ldsm_v_key(lane),
                                                          8 * db + fa_ldsm_v_dim(lane)));
                        fa_mma<BF16>(o[db], pf, bf);
                        fa_mma<BF16>(o[db + 1], pf, bf + 2);
                    }
                } else {
#pragma unroll
                    for (int db = 0; db < D / 8; db++) {
                        uint32_t bf[2], bfl[2];
#pragma unroll
                        for (int r = 0; r < 2; r++) {
                            bf[r] = *(const uint32_t *)(Vs + fa_v_frag(KT, db, kk, lane, r));
                            if (SPLIT)
                                bfl[r] = *(const uint32_t *)(Vs + SM::HALF +
                                                             fa_v_frag(KT, db, kk, lane, r));
                        }
                        if (SPLIT) {
                            fa_mma<BF16>(o[db], pfl, bf);
                            fa_mma<BF16>(o[db], pf, bfl);
                        }
                        fa_mma<BF16>(o[db], pf, bf);
                    }
                }
            }
        }
        if (FAST) __syncthreads(); /* this stage consumed before the next issue overwrites it */
    }

    /* out = O / l for the live rows */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int row = wrow0 + fa_c_row(lane, 2 * h);
        if (row >= rows_total) continue;
        float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
        int t = row / G, head = kvh * G + row % G;
        float *dst = out + ((int64_t)t * n_heads + head) * D;
#pragma unroll
        for (int db = 0; db < D / 8; db++) {
            int d = 8 * db + fa_c_col(lane, 2 * h);
            dst[d] = o[db][2 * h] * inv;
            dst[d + 1] = o[db][2 * h + 1] * inv;
        }
    }
}

#ifndef FA_HOST_EMU /* host side */
static int fa_f32(void);
template <int D, int KT, bool BF16, bool FAST, bool F32KV = false, bool SPLIT = false,
          bool PAGED = false>
static void fa_launch_one(kcu_state *st, const fa_launch &L, dim3 grid) {
    const size_t smem = fa_smem<D, KT, FAST, SPLIT>::bytes;
    static bool raised = false; /* per instantiation */
    if (!raised && smem > 48 * 1024) {
        if (!KCU_CHECK(
                st, cudaFuncSetAttribute(k_fa_prefill<D, KT, BF16, FAST, F32KV, SPLIT, PAGED>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)))
            return;
        raised = true;
    }
    KCU_LAUNCH(st, (k_fa_prefill<D, KT, BF16, FAST, F32KV, SPLIT, PAGED>), grid, FA_WARPS * 32,
               smem, L);
    KCU_LAUNCHED(st);
}

template <int D, int KT, bool FAST>
static void fa_launch_dt(kcu_state *st, const fa_launch &L, dim3 grid) {
    if (L.a.kv_dtype == KILN_DT_BF16)
        fa_launch_one<D, KT, true, FAST>(st, L, grid);
    else
        fa_launch_one<D, KT, false, FAST>(st, L, grid);
}

template <int D, int KT> static void fa_launch_d(kcu_state *st, const fa_launch &L, dim3 grid) {
    if (L.pl.data) /* paged records */
        fa_launch_one<D, KT, true, false, true, true, true>(st, L, grid);
    else if (L.a.kv_dtype == KILN_DT_F32 && fa_f32() == 2)
        fa_launch_one<D, KT, true, false, true, true>(st, L, grid);
    else if (L.a.kv_dtype == KILN_DT_F32)
        fa_launch_one<D, KT, true, false, true>(st, L, grid);
    else if (L.fast)
        fa_launch_dt<D, KT, true>(st, L, grid);
    else
        fa_launch_dt<D, KT, false>(st, L, grid);
}

static int fa_mode_set = -1, fa_simple_set = -1, fa_f32_set = -1;
static long long fa_launches = 0;

extern "C" void kiln_cuda_set_fa_mode(int mode) {
    fa_mode_set = mode;
}

extern "C" void kiln_cuda_set_fa_simple(int simple) {
    fa_simple_set = simple;
}

static bool fa_simple(void) {
    if (fa_simple_set >= 0) return fa_simple_set != 0;
    const char *e = getenv("KILN_CUDA_FA_SIMPLE");
    return e && *e && atoi(e) != 0;
}

extern "C" void kiln_cuda_set_fa_f32(int on) {
    fa_f32_set = on;
}

/* f32 caches: 0 = not here (CUDA-core attention), 1 = as bf16 (default in fast mode, whose
 * matmuls take bf16 operands too), 2 = as bf16 hi + lo pairs (default in exact mode) */
static int fa_f32(void) {
    if (fa_f32_set >= 0) return fa_f32_set;
    const char *e = getenv("KILN_CUDA_FA_F32");
    return e && *e ? atoi(e) : kcu_fast_math() ? 1 : 2;
}

extern "C" long long kiln_cuda_fa_launches(void) {
    return fa_launches;
}

static int fa_mode(void) {
    if (fa_mode_set >= 0) return fa_mode_set;
    const char *e = getenv("KILN_CUDA_FA");
    return e && *e ? atoi(e) : 1;
}

/* Fewest tokens of a sequence this kernel takes under a's geometry and the mode, or -1. */
static int fa_min_tokens(const kcu_attn_args *a) {
    int mode = fa_mode();
    if (mode == 0) return -1;
    bool f32 = a->kv_dtype == KILN_DT_F32 && fa_f32() != 0; /* as pairs or bf16 */
    if (a->kv_dtype != KILN_DT_F16 && a->kv_dtype != KILN_DT_BF16 && !f32) return -1;
    if (a->head_dim != a->v_head_dim || a->n_kv_heads <= 0 || a->p.n_heads % a->n_kv_heads)
        return -1;
    switch (a->head_dim) {
    case 64:
    case 80:
    case 96:
    case 128:
    case 256:
        break;
    default:
        return -1;
    }
    return mode == 2 ? 1 : FA_MIN_TOKENS;
}

static void fa_run(kcu_state *st, const kcu_attn_args *a, const fa_launch &L, int max_n) {
    int64_t rows = (int64_t)max_n * L.group;
    dim3 grid(a->n_kv_heads, (unsigned)((rows + FA_ROWS - 1) / FA_ROWS), L.n_seq);
    switch (a->head_dim) {
    case 64:
        fa_launch_d<64, 64>(st, L, grid);
        break;
    case 80:
        fa_launch_d<80, 64>(st, L, grid);
        break;
    case 96:
        fa_launch_d<96, 64>(st, L, grid);
        break;
    case 128:
        fa_launch_d<128, 64>(st, L, grid);
        break;
    case 256:
        fa_launch_d<256, 32>(st, L, grid);
        break;
    default:
        kcu_report(st, "kcu_attention_prefill_tc", "head dim", __FILE__, __LINE__);
        return;
    }
    fa_launches++;
}

int kcu_attention_prefill_tc_paged(kcu_state *st, const kcu_paged_layer *pl, const float *q,
                                   float *out, const kiln_attn_params *p, const kcu_paged_seq *seqs,
                                   int n_seq, kcu_paged_seq *rest) {
    fa_launch L;
    memset(&L, 0, sizeof L);
    L.a.q = q, L.a.out = out, L.a.p = *p;
    L.a.kv_dtype = KILN_DT_F32; /* decoded records */
    L.a.n_kv_heads = pl->n_kv_heads, L.a.head_dim = pl->head_dim;
    L.a.v_head_dim = pl->v_head_dim, L.a.window = pl->window;
    L.pl = *pl;
    int min_n = fa_min_tokens(&L.a), n_rest = 0;
    /* rotated keys (turbo ...:rotk): the kernel rotates each block's Q rows the same way (head
     * dims that are powers of two, as the codec requires); rotated values (TurboQuant) are
     * attended in the rotated basis and each output row unrotated after. Positions come from the
     * host (pos0), as in kcu_attention_prefill_tc: only recorded decode steps need
     * kiln_attn_params.positions */
    if (pl->k.rotate && (pl->head_dim & (pl->head_dim - 1)) != 0) min_n = -1;
    if (p->positions && min_n >= 0 && min_n < FA_MIN_TOKENS) min_n = FA_MIN_TOKENS;
    L.group = min_n > 0 ? p->n_heads / pl->n_kv_heads : 1;
    L.fast = false;
    kcu_paged_seq taken[KCU_ATT_MAX_SEQ]; /* the launch's sequences, for the unrotation */
    int max_n = 0;
    for (int i = 0; i < n_seq; i++) {
        const kcu_paged_seq *sq = &seqs[i];
        bool fits = (int64_t)sq->n * L.group <= (int64_t)65535 * FA_ROWS; /* gridDim.y */
        if (min_n < 0 || sq->n < min_n || !fits) {
            rest[n_rest++] = *sq;
            continue;
        }
        taken[L.n_seq] = *sq;
        fa_seq *d = &L.s[L.n_seq++];
        d->k = sq->table, d->v = NULL, d->pos0 = sq->pos0, d->n = sq->n, d->t0 = sq->t0;
        if (sq->n > max_n) max_n = sq->n;
        if (L.n_seq == KCU_ATT_MAX_SEQ) {
            fa_run(st, &L.a, L, max_n);
            if (pl->v.rotate) kcu_paged_unrotate_rows(st, pl, out, p, taken, L.n_seq);
            L.n_seq = 0, max_n = 0;
        }
    }
    if (L.n_seq > 0) {
        fa_run(st, &L.a, L, max_n);
        if (pl->v.rotate) kcu_paged_unrotate_rows(st, pl, out, p, taken, L.n_seq);
    }
    return n_rest;
}

int kcu_attention_prefill_tc(kcu_state *st, const kcu_attn_args *a, const kcu_attn_seq *seqs,
                             int n_seq, kcu_attn_seq *rest) {
    int min_n = fa_min_tokens(a), n_rest = 0;
    /* this kernel takes positions from the host (pos0), never from kiln_attn_params.positions:
     * only recorded decode steps need those, and they are far below FA_MIN_TOKENS; keep it so
     * even when mode 2 forces short sequences here */
    if (a->p.positions && min_n >= 0 && min_n < FA_MIN_TOKENS) min_n = FA_MIN_TOKENS;
    fa_launch L;
    memset(&L, 0, sizeof L); /* L.pl.data NULL: not paged */
    L.a = *a;
    L.group = min_n > 0 ? a->p.n_heads / a->n_kv_heads : 1;
    L.n_seq = 0;
    L.fast = !fa_simple(); /* (f32 caches always take the simple kernel) */
    int max_n = 0;
    for (int i = 0; i < n_seq; i++) {
        const kcu_attn_seq *q = &seqs[i];
        bool aligned = (((uintptr_t)q->k | (uintptr_t)q->v) & 15) == 0;
        bool fits = (int64_t)q->n * L.group <= (int64_t)65535 * FA_ROWS; /* gridDim.y */
        if (min_n < 0 || q->n < min_n || !aligned || !fits) {
            rest[n_rest++] = *q;
            continue;
        }
        fa_seq *d = &L.s[L.n_seq++];
        d->k = q->k, d->v = q->v, d->pos0 = q->pos0, d->n = q->n, d->t0 = q->t0;
        if (q->n > max_n) max_n = q->n;
        if (L.n_seq == KCU_ATT_MAX_SEQ) {
            fa_run(st, a, L, max_n);
            L.n_seq = 0, max_n = 0;
        }
    }
    if (L.n_seq > 0) fa_run(st, a, L, max_n);
    return n_rest;
}
#endif
