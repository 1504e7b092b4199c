/* attention_prefill_tc.cu — prefill attention on tensor cores (FlashAttention-2 structure) over a
 * contiguous f16 / bf16 device KV cache: causal, GQA, optional sliding window and logit softcap,
 * head dims 64, 80, 96, 128, 256 (K and V of the same dim). attention.cu sends a launch's
 * sequences of >= FA_MIN_TOKENS tokens here (kcu_fa_prefill_min) and keeps the rest.
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
 * the CPU reference; Q is rounded to 16 bits once, when staged. */
#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/fa_fragment.h"

#include <stdlib.h>

#define FA_WARPS      4
#define FA_ROWS       (FA_WARPS * 16)
#define FA_MIN_TOKENS 64

/* one sequence of a launch */
struct fa_seq {
    const void *k, *v;
    int pos0, n, t0; /* first position, tokens, first row of q / out */
};

struct fa_launch {
    kcu_attn_args a; /* q / out: stacked rows of all sequences; n, pos0, k, v unused */
    int group, n_seq;
    fa_seq s[KCU_ATT_MAX_SEQ];
};

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
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Row strides (16-bit elements): D + 8 and KT + 8. In 32-bit words that is D/2 + 4 (KT/2 + 4); the
 * 8 groups g of a warp read words g * stride + t (t = 0..3), which fall into 8 distinct bank
 * quads for every D in {64, 80, 96, 128, 256} and KT in {32, 64} (stride mod 32 = 4, 12, 20 or
 * 36 mod 32 = 4): no bank conflicts on fragment loads. 16-byte rows keep uint4 stores aligned. */
template <int D, int KT> struct fa_smem {
    static constexpr int Q = FA_ROWS * (D + FA_PAD);
    static constexpr int K = KT * (D + FA_PAD);
    static constexpr int V = D * (KT + FA_PAD);
    static constexpr size_t bytes = (size_t)(Q + K + V) * 2;
};

template <int D, int KT, bool BF16>
__global__ void __launch_bounds__(FA_WARPS * 32) k_fa_prefill(const __grid_constant__ fa_launch L) {
    const fa_seq &S = L.s[blockIdx.z];
    const int G = L.group, rows_total = S.n * G;
    /* heavy tiles (late tokens see more keys) first */
    const int row0 = (gridDim.x - 1 - blockIdx.x) * FA_ROWS;
    if (row0 >= rows_total) return; /* a shorter sequence of the batch */
    const kcu_attn_args &a = L.a;
    const int kvh = blockIdx.y, n_heads = a.p.n_heads, pos0 = S.pos0, window = a.window;
    const float *q = a.q + (int64_t)S.t0 * n_heads * D;
    float *out = a.out + (int64_t)S.t0 * n_heads * D;
    const int64_t kvstride = (int64_t)a.n_kv_heads * D;
    const uint16_t *kg = (const uint16_t *)S.k + (int64_t)kvh * D;
    const uint16_t *vg = (const uint16_t *)S.v + (int64_t)kvh * D;

    extern __shared__ uint4 fa_sm_raw[]; /* 16-byte aligned */
    uint16_t *Qs = (uint16_t *)fa_sm_raw;
    uint16_t *Ks = Qs + fa_smem<D, KT>::Q;
    uint16_t *Vt = Ks + fa_smem<D, KT>::K;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    /* Q: 4 dims per thread and step, rounded to the cache's 16-bit type; dead rows are zero */
    for (int i = threadIdx.x; i < FA_ROWS * (D / 4); i += blockDim.x) {
        int r = i / (D / 4), d = (i - r * (D / 4)) * 4, row = row0 + r;
        float x0 = 0.0f, x1 = 0.0f, x2 = 0.0f, x3 = 0.0f;
        if (row < rows_total) {
            int t = row / G, h = kvh * G + row % G;
            const float *src = q + ((int64_t)t * n_heads + h) * D + d;
            x0 = src[0], x1 = src[1], x2 = src[2], x3 = src[3];
        }
        uint32_t *dst = (uint32_t *)(Qs + fa_qs_off(D, r, d));
        dst[0] = fa_pack<BF16>(x0, x1);
        dst[1] = fa_pack<BF16>(x2, x3);
    }

    /* keys of the block: from the first row's window start to the last row's position */
    int k0, k1, unused_lo, unused_hi;
    fa_rows_keys(pos0, G, window, rows_total, row0, FA_ROWS, &k0, &k1, &unused_lo, &unused_hi);

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

    float o[D / 8][4];
#pragma unroll
    for (int db = 0; db < D / 8; db++) o[db][0] = o[db][1] = o[db][2] = o[db][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float scale = a.p.scale, cap = a.p.softcap;

    for (int ks = k0; ks < k1; ks += KT) {
        __syncthreads(); /* Q staged / previous tile consumed */
        /* K: 16 bytes (8 dims of one key) per thread and step, dims fastest (coalesced) */
        for (int i = threadIdx.x; i < KT * (D / 8); i += blockDim.x) {
            int j = i / (D / 8), d = (i - j * (D / 8)) * 8;
            uint4 u = make_uint4(0, 0, 0, 0);
            if (ks + j < k1) u = __ldg((const uint4 *)(kg + (int64_t)(ks + j) * kvstride + d));
            *(uint4 *)(Ks + fa_ks_off(D, j, d)) = u;
        }
        /* V, transposed: keys fastest, so a warp's 16-bit stores go to 32 consecutive keys of
         * one Vt row (no bank conflicts); keys past the block's range are zero (never NaN) */
        for (int i = threadIdx.x; i < KT * (D / 8); i += blockDim.x) {
            int d = (i / KT) * 8, j = i % KT;
            uint4 u = make_uint4(0, 0, 0, 0);
            if (ks + j < k1) u = __ldg((const uint4 *)(vg + (int64_t)(ks + j) * kvstride + d));
            uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                Vt[fa_vt_off(KT, j, d + 2 * e)] = (uint16_t)(w[e] & 0xffffu);
                Vt[fa_vt_off(KT, j, d + 2 * e + 1)] = (uint16_t)(w[e] >> 16);
            }
        }
        __syncthreads();
        if (!warp_live || ks > w_hi || ks + KT - 1 < w_lo) continue; /* nothing visible here */
        const bool full = ks + KT - 1 <= all_hi && ks >= all_lo;

        /* S = Q K^T */
        float s[KT / 8][4];
#pragma unroll
        for (int nb = 0; nb < KT / 8; nb++) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t af[4];
#pragma unroll
            for (int r = 0; r < 4; r++)
                af[r] = *(const uint32_t *)(Qs + fa_q_frag(D, warp * 16, kk, lane, r));
#pragma unroll
            for (int nb = 0; nb < KT / 8; nb++) {
                uint32_t bf[2];
#pragma unroll
                for (int r = 0; r < 2; r++)
                    bf[r] = *(const uint32_t *)(Ks + fa_k_frag(D, nb, kk, lane, r));
                fa_mma<BF16>(s[nb], af, bf);
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
            uint32_t pf[4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const float *c = s[fa_p_nb(kk, r)];
                pf[r] = fa_pack<BF16>(c[fa_p_c(r)], c[fa_p_c(r) + 1]);
            }
#pragma unroll
            for (int db = 0; db < D / 8; db++) {
                uint32_t bf[2];
#pragma unroll
                for (int r = 0; r < 2; r++)
                    bf[r] = *(const uint32_t *)(Vt + fa_v_frag(KT, db, kk, lane, r));
                fa_mma<BF16>(o[db], pf, bf);
            }
        }
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

template <int D, int KT, bool BF16>
static void fa_launch_one(kcu_state *st, const fa_launch &L, dim3 grid) {
    const size_t smem = fa_smem<D, KT>::bytes;
    static bool raised = false; /* per instantiation */
    if (!raised && smem > 48 * 1024) {
        if (!KCU_CHECK(st, cudaFuncSetAttribute(k_fa_prefill<D, KT, BF16>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)smem)))
            return;
        raised = true;
    }
    k_fa_prefill<D, KT, BF16><<<grid, FA_WARPS * 32, smem, st->stream>>>(L);
    KCU_LAUNCHED(st);
}

template <int D, int KT> static void fa_launch_dt(kcu_state *st, const fa_launch &L, dim3 grid) {
    if (L.a.kv_dtype == KILN_DT_BF16)
        fa_launch_one<D, KT, true>(st, L, grid);
    else
        fa_launch_one<D, KT, false>(st, L, grid);
}

static int fa_mode_set = -1;
static long long fa_launches = 0;

extern "C" void kiln_cuda_set_fa_mode(int mode) {
    fa_mode_set = mode;
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
    if (a->kv_dtype != KILN_DT_F16 && a->kv_dtype != KILN_DT_BF16) return -1;
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
    dim3 grid((unsigned)((rows + FA_ROWS - 1) / FA_ROWS), a->n_kv_heads, L.n_seq);
    switch (a->head_dim) {
    case 64:
        fa_launch_dt<64, 64>(st, L, grid);
        break;
    case 80:
        fa_launch_dt<80, 64>(st, L, grid);
        break;
    case 96:
        fa_launch_dt<96, 64>(st, L, grid);
        break;
    case 128:
        fa_launch_dt<128, 64>(st, L, grid);
        break;
    case 256:
        fa_launch_dt<256, 32>(st, L, grid);
        break;
    default:
        kcu_report(st, "kcu_attention_prefill_tc", "head dim", __FILE__, __LINE__);
        return;
    }
    fa_launches++;
}

int kcu_attention_prefill_tc(kcu_state *st, const kcu_attn_args *a, const kcu_attn_seq *seqs,
                             int n_seq, kcu_attn_seq *rest) {
    int min_n = fa_min_tokens(a), n_rest = 0;
    fa_launch L;
    L.a = *a;
    L.group = min_n > 0 ? a->p.n_heads / a->n_kv_heads : 1;
    L.n_seq = 0;
    int max_n = 0;
    for (int i = 0; i < n_seq; i++) {
        const kcu_attn_seq *q = &seqs[i];
        bool aligned = (((uintptr_t)q->k | (uintptr_t)q->v) & 15) == 0;
        if (min_n < 0 || q->n < min_n || !aligned) {
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
