/* attention.cu — attention of new queries against a contiguous device KV cache.
 *
 * One kernel serves decode and prefill, flash-attention style on CUDA cores: a block owns one KV
 * head and a tile of "rows" (query token x query head of that KV head's GQA group), so every K/V
 * tile it stages in shared memory (32 keys, f32) is reused by all the group's heads and tokens.
 * Each warp owns RPW rows; lane j scores key j of the tile, the warp keeps an online softmax
 * (running max m, sum l) and each lane accumulates the output dims lane, lane+32, ... .
 * Long key ranges with few blocks (decode) are split over gridDim.z; the partial (m, l, acc) of
 * each split are merged by log-sum-exp in a second kernel.
 *
 * Decode with the q/k prep inside (kcu_attention_decode_prep, one token per sequence): the same
 * kernel, instantiated with PREP, also does the work of qk_norm_rope and the KV store: each warp
 * RMSNorms and rotates its raw q rows while staging them, every block preps the step's k row of
 * its KV head (and reads its v row) into shared memory, rounded to the cache's dtype, uses them
 * for the new key instead of the cache, and the block that owns that key writes them to the
 * cache. The last split of each row tile to finish (an arrival counter per tile) merges the
 * splits, so the step needs one launch where it took four. */
#include "backend/cuda/attention.cuh"
#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/attention_tile.cuh"
#ifndef ATT_HOST_EMU /* tests/emu/attention_emulate.cc: the kernels only, shared memory its own */
#define ATT_SMEM(name) extern __shared__ float name[]
#endif

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define ATT_WARPS 4
#define ATT_KT    32
#define ATT_LOADS 8 /* 16-byte K/V loads a thread issues before using the first */

/* one sequence of a launch (passed by value in the kernel parameters: no host->device copy) */
struct att_seq {
    const void *k, *v;
    int pos0, n, t0; /* first position, tokens, first row of q / out */
    int kbeg;        /* first key any of its queries sees (window) */
};

/* Kernel parameters (< 4 KB): geometry shared by the launch plus up to KCU_ATT_MAX_SEQ sequences.
 * blockIdx.z = seq * splits + split. */
struct att_launch {
    kcu_attn_args a; /* q / out: stacked rows of all sequences; n, pos0, k, v unused */
    int group;
    int kps, splits; /* split z covers keys [kbeg + z*kps, kbeg + (z+1)*kps) */
    int rows_max;    /* max n * group over the sequences: the partials' row stride */
    int vec;         /* head dims allow 16-byte K/V loads */
    float *part_o;   /* [seqs, splits, n_kv_heads, rows_max, v_head_dim] (splits > 1) */
    float *part_ml;  /* [seqs, splits, n_kv_heads, rows_max, 2] */
    /* PREP kernels: the step's raw stacked k [T, n_kv_heads*hd] / v [T, n_kv_heads*vhd] rows, the
     * q/k norm + RoPE, and the split arrival counters [seqs, n_kv_heads, tiles] (kept zero) */
    const float *k_new, *v_new;
    kiln_qk_prep prep;
    unsigned *counters;
    int n_seq;
    att_seq s[KCU_ATT_MAX_SEQ];
};

/* x rounded as the cache stores it (what a later step will read back) */
__device__ __forceinline__ float att_round(float x, int dt) {
    if (dt == KILN_DT_F16) return __half2float(__float2half_rn(x));
    if (dt == KILN_DT_BF16) return __bfloat162float(__float2bfloat16_rn(x));
    return x;
}

/* One warp: dst [hd] = RoPE(RMSNorm(src) * nw) at position p, as k_qk_norm_rope (fused.cu) does
 * it: norm with the weight when nw is given, then rotate-half of the first rot_dim dims, the
 * angle p*inv_freq in f32, its sine and cosine in double. */
__device__ __forceinline__ void att_prep_head(float *dst, const float *src, int hd, const float *nw,
                                              const kiln_qk_prep &P, float p, int lane) {
    float ss = 0.0f;
    for (int d = lane; d < hd; d += 32) {
        float v = src[d];
        dst[d] = v;
        ss += v * v;
    }
    if (nw) {
        float inv = rsqrtf(kcu_warp_sum(ss) / (float)hd + P.eps);
        for (int d = lane; d < hd; d += 32) dst[d] = dst[d] * inv * nw[d];
    }
    __syncwarp();
    const int half = P.rot_dim / 2;
    for (int j = lane; j < half; j += 32) {
        double sn, cs;
        sincos((double)(p * P.inv_freq[j]), &sn, &cs);
        float x1 = dst[j], x2 = dst[j + half];
        dst[j] = x1 * (float)cs - x2 * (float)sn;
        dst[j + half] = x2 * (float)cs + x1 * (float)sn;
    }
    __syncwarp();
}

template <int DPL, int RPW, bool PREP>
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attn(const __grid_constant__ att_launch L) {
    KCU_PDL_ENTER();
    const int si = blockIdx.z / L.splits, z = blockIdx.z - si * L.splits;
    const att_seq &S = L.s[si];
    const int ROWS = ATT_WARPS * RPW, row0 = blockIdx.x * ROWS, G = L.group;
    const int rows_total = S.n * G;
    if (row0 >= rows_total) return; /* a shorter sequence of the batch: whole block idle */
    kcu_attn_args a = L.a;
    a.q += (int64_t)S.t0 * a.p.n_heads * a.head_dim;
    a.out += (int64_t)S.t0 * a.p.n_heads * a.v_head_dim;
    a.k = S.k;
    a.v = S.v;
    /* positions in device memory (a recorded decode step): this step's, not the recording's */
    a.pos0 = a.p.positions ? a.p.positions[S.t0] : S.pos0;
    const int kbeg = a.p.positions ? (a.window > 0 ? max(0, a.pos0 - a.window + 1) : 0) : S.kbeg;
    const int hd = a.head_dim, vhd = a.v_head_dim;
    ATT_SMEM(sm);
    float *Qs = sm;                     /* [ROWS][hd] */
    float *Ks = Qs + ROWS * hd;         /* [KT][hd+1] (padded: lanes read different banks) */
    float *Vs = Ks + ATT_KT * (hd + 1); /* [KT][vhd] */
    float *Kn = Vs + ATT_KT * vhd;      /* PREP: the step's k row of this KV head, as stored [hd] */
    float *Vn = Kn + hd;                /* PREP: its v row, as stored [vhd] */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kvh = blockIdx.y;
    int n_heads = a.p.n_heads;
    int64_t kstride = (int64_t)a.n_kv_heads * hd, vstride = (int64_t)a.n_kv_heads * vhd;
    const int s_lo = kbeg + z * L.kps, s_hi = s_lo + L.kps;
    const int pos_new = a.pos0 + S.n - 1; /* PREP (one token per sequence): the new key */

    if (PREP) {
        /* each warp preps its own q rows; warp 0 the step's k row, the others copy its v row */
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const int row = row0 + warp * RPW + r;
            float *qs = Qs + (warp * RPW + r) * hd;
            if (row >= rows_total) {
                for (int d = lane; d < hd; d += 32) qs[d] = 0.0f;
                continue;
            }
            const int t = row / G, h = kvh * G + row % G;
            att_prep_head(qs, a.q + ((int64_t)t * n_heads + h) * hd, hd, L.prep.q_norm, L.prep,
                          (float)(a.pos0 + t), lane);
            for (int d = lane; d < hd; d += 32) qs[d] *= a.p.scale;
        }
        if (warp == 0)
            att_prep_head(Kn, L.k_new + ((int64_t)S.t0 * a.n_kv_heads + kvh) * hd, hd,
                          L.prep.k_norm, L.prep, (float)pos_new, lane);
        else
            for (int d = threadIdx.x - 32; d < vhd; d += blockDim.x - 32)
                Vn[d] = L.v_new[((int64_t)S.t0 * a.n_kv_heads + kvh) * vhd + d];
        __syncthreads();
        const bool owner = blockIdx.x == 0 && pos_new >= s_lo && pos_new < s_hi;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            Kn[d] = att_round(Kn[d], a.kv_dtype);
            if (owner)
                kcu_kv_put((void *)S.k, (int64_t)pos_new * kstride + kvh * hd + d, Kn[d],
                           a.kv_dtype);
        }
        for (int d = threadIdx.x; d < vhd; d += blockDim.x) {
            Vn[d] = att_round(Vn[d], a.kv_dtype);
            if (owner)
                kcu_kv_put((void *)S.v, (int64_t)pos_new * vstride + kvh * vhd + d, Vn[d],
                           a.kv_dtype);
        }
    } else {
        for (int i = threadIdx.x; i < ROWS * hd; i += blockDim.x) {
            int r = row0 + i / hd, d = i % hd;
            float v = 0.0f;
            if (r < rows_total) {
                int t = r / G, h = kvh * G + r % G;
                v = a.q[((int64_t)t * n_heads + h) * hd + d] * a.p.scale;
            }
            Qs[i] = v;
        }
    }

    /* rows of this warp: their token, and visible keys [lo, hi); the block's keys */
    int lo[RPW], hi[RPW];
    bool live[RPW];
    att_warp_rows<RPW>(row0, warp, rows_total, a.pos0, G, a.window, lo, hi, live);
    int k0, k1;
    att_block_keys(row0, ROWS, rows_total, a.pos0, G, a.window, s_lo, s_hi, &k0, &k1);
    float m[RPW], l[RPW], acc[RPW][DPL];
    att_state_init<DPL, RPW>(m, l, acc);

    for (int ks = k0; ks < k1; ks += ATT_KT) {
        __syncthreads(); /* Q staged / previous tile consumed */
        if (L.vec) {     /* 16-byte loads: 4 f32 or 8 f16/bf16 per thread and step */
            /* K's chunks then V's: ATT_LOADS raw loads a thread are issued before the first is
             * converted and stored (a load, store, load, ... loop kept one 16-byte load a thread
             * in flight and left long-context decode latency-bound) */
            const int VEC = a.kv_dtype == KILN_DT_F32 ? 4 : 8, kc = hd / VEC, vc = vhd / VEC;
            const int esz = a.kv_dtype == KILN_DT_F32 ? 4 : 2, nk = ATT_KT * kc,
                      nall = nk + ATT_KT * vc;
            for (int i0 = threadIdx.x; i0 < nall; i0 += ATT_LOADS * blockDim.x) {
                uint4 raw[ATT_LOADS];
#pragma unroll
                for (int u = 0; u < ATT_LOADS; u++) {
                    const int i = i0 + u * (int)blockDim.x;
                    const bool isk = i < nk, in = i < nall;
                    const int ii = isk ? i : i - nk, c = isk ? kc : vc, j = ii / c;
                    const int64_t off = (int64_t)(ks + j) * (isk ? kstride : vstride) +
                                        (int64_t)kvh * (isk ? hd : vhd) + (ii - j * c) * VEC;
                    const char *base = (const char *)(isk ? a.k : a.v);
                    raw[u] = in && ks + j < k1 ? kcu_ld((const uint4 *)(base + off * esz))
                                               : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
                for (int u = 0; u < ATT_LOADS; u++) {
                    const int i = i0 + u * (int)blockDim.x;
                    if (i >= nall) break;
                    const bool isk = i < nk;
                    const int ii = isk ? i : i - nk, c = isk ? kc : vc, j = ii / c;
                    const int d0 = (ii - j * c) * VEC;
                    float *dst = isk ? Ks + j * (hd + 1) + d0 : Vs + j * vhd + d0;
                    const uint32_t w[4] = {raw[u].x, raw[u].y, raw[u].z, raw[u].w};
                    if (esz == 4) {
#pragma unroll
                        for (int e = 0; e < 4; e++) dst[e] = __uint_as_float(w[e]);
                    } else {
#pragma unroll
                        for (int e = 0; e < 4; e++) kcu_kv_unpack2(w[e], a.kv_dtype, dst + 2 * e);
                    }
                }
            }
        } else {
            for (int i = threadIdx.x; i < ATT_KT * hd; i += blockDim.x) {
                int j = i / hd, d = i % hd;
                Ks[j * (hd + 1) + d] =
                    ks + j < k1
                        ? kcu_load(a.k, (int64_t)(ks + j) * kstride + kvh * hd + d, a.kv_dtype)
                        : 0.0f;
            }
            for (int i = threadIdx.x; i < ATT_KT * vhd; i += blockDim.x) {
                int j = i / vhd, d = i % vhd;
                Vs[i] = ks + j < k1
                            ? kcu_load(a.v, (int64_t)(ks + j) * vstride + kvh * vhd + d, a.kv_dtype)
                            : 0.0f;
            }
        }
        if (PREP && pos_new >= ks && pos_new < ks + ATT_KT && pos_new < k1) {
            /* the new key: this step's prepped row, not what the cache held before the store */
            __syncthreads();
            const int jn = pos_new - ks;
            for (int d = threadIdx.x; d < hd; d += blockDim.x) Ks[jn * (hd + 1) + d] = Kn[d];
            for (int d = threadIdx.x; d < vhd; d += blockDim.x) Vs[jn * vhd + d] = Vn[d];
        }
        __syncthreads();
        att_tile_update<DPL, RPW, ATT_KT>(Qs + warp * RPW * hd, Ks, Vs, hd, vhd, lane, ks, k1, lo,
                                          hi, live, a.p.softcap, m, l, acc);
    }
    att_store_rows<DPL, RPW>(
        row0, warp, lane, G, kvh, n_heads, vhd, L.splits, a.out, L.part_o, L.part_ml,
        (((int64_t)si * L.splits + z) * a.n_kv_heads + kvh) * L.rows_max, live, m, l, acc);
    if (!PREP || L.splits == 1) return;
    /* the last split of this row tile to arrive merges all of them (as k_attn_merge does) */
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *c = L.counters + ((int64_t)si * a.n_kv_heads + kvh) * gridDim.x + blockIdx.x;
        last = atomicAdd(c, 1u) == (unsigned)L.splits - 1;
        if (last) *c = 0; /* every split has arrived: ready for the next launch */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int64_t per_split = (int64_t)a.n_kv_heads * L.rows_max;
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        if (!live[r]) continue;
        const int row = row0 + warp * RPW + r;
        const int64_t base = (int64_t)si * L.splits * per_split + (int64_t)kvh * L.rows_max + row;
        float M = -INFINITY, den = 0.0f;
        for (int zz = 0; zz < L.splits; zz++)
            M = fmaxf(M, __ldcg(L.part_ml + 2 * (zz * per_split + base)));
        float num[DPL];
#pragma unroll
        for (int i = 0; i < DPL; i++) num[i] = 0.0f;
        for (int zz = 0; zz < L.splits; zz++) {
            const int64_t pz = zz * per_split + base;
            const float mz = __ldcg(L.part_ml + 2 * pz);
            if (mz == -INFINITY) continue;
            const float e = __expf(mz - M);
            den += __ldcg(L.part_ml + 2 * pz + 1) * e;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                if (lane + 32 * i < vhd) num[i] += __ldcg(L.part_o + pz * vhd + lane + 32 * i) * e;
        }
        const int t = row / G, h = kvh * G + row % G;
        float *o = a.out + ((int64_t)t * n_heads + h) * vhd;
#pragma unroll
        for (int i = 0; i < DPL; i++)
            if (lane + 32 * i < vhd) o[lane + 32 * i] = den > 0.0f ? num[i] / den : 0.0f;
    }
}

/* One block per (row, kv head, seq): out = sum_z acc_z e^(m_z - M) / sum_z l_z e^(m_z - M). */
__global__ void k_attn_merge(const __grid_constant__ att_launch L, int splits) {
    KCU_PDL_ENTER();
    const kcu_attn_args &a = L.a;
    const att_seq &S = L.s[blockIdx.z];
    int row = blockIdx.x, kvh = blockIdx.y, vhd = a.v_head_dim, G = L.group;
    if (row >= S.n * G) return;
    const int64_t per_split = (int64_t)a.n_kv_heads * L.rows_max;
    const int64_t base = (int64_t)blockIdx.z * splits * per_split + (int64_t)kvh * L.rows_max + row;
    const int t = row / G, h = kvh * G + row % G;
    att_merge_row(L.part_o, L.part_ml, per_split, base, splits, vhd,
                  a.out + ((int64_t)(S.t0 + t) * a.p.n_heads + h) * vhd);
}

#ifndef ATT_HOST_EMU
template <int DPL, int RPW, bool PREP>
static void launch(kcu_state *st, const att_launch &L, dim3 grid) {
    int hd = L.a.head_dim, vhd = L.a.v_head_dim;
    size_t smem = sizeof(float) * ((size_t)ATT_WARPS * RPW * hd + (size_t)ATT_KT * (hd + 1) +
                                   (size_t)ATT_KT * vhd + (PREP ? (size_t)hd + vhd : 0));
    static size_t raised = 48 * 1024;
    if (smem > raised) {
        if (!KCU_CHECK(st, cudaFuncSetAttribute(k_attn<DPL, RPW, PREP>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)smem)))
            return;
        raised = smem;
    }
    KCU_LAUNCH(st, (k_attn<DPL, RPW, PREP>), grid, ATT_WARPS * 32, smem, L);
    KCU_LAUNCHED(st);
}

template <int RPW, bool PREP>
static void launch_dpl(kcu_state *st, const att_launch &L, dim3 grid) {
    int vhd = L.a.v_head_dim;
    if (vhd <= 64)
        launch<2, RPW, PREP>(st, L, grid);
    else if (vhd <= 128)
        launch<4, RPW, PREP>(st, L, grid);
    else if (vhd <= 256)
        launch<8, RPW, PREP>(st, L, grid);
    else
        launch<16, RPW, PREP>(st, L, grid);
}

static_assert(ATTS_MAX_SEQ >= KCU_ATT_MAX_SEQ, "a chunk's sequences fit the short kernel's");

/* Most keys (bucketed) for the one-launch decode kernel; 0 = never, default any (INT_MAX): it
 * splits long contexts itself. Up to the fifteenth session it stopped at 512 keys and longer
 * contexts took k_attn's 32-key shared-memory tiles (Qwen3-0.6B at 8k context, f32 cache, 340
 * tok/s: ~15% of the copy bandwidth on its K/V). Env KILN_CUDA_ATT_SHORT, and
 * KILN_CUDA_ATT_SHORT_SPLITS caps its splits (A/B runs); kiln_cuda_set_attn_short for tests. */
static int g_att_short = -1, g_att_short_splits = -1;
extern "C" void kiln_cuda_set_attn_short(int max_keys) {
    g_att_short = max_keys;
}
static int att_short_max(void) {
    if (g_att_short < 0) {
        const char *e = getenv("KILN_CUDA_ATT_SHORT");
        g_att_short = e && *e ? atoi(e) : INT_MAX;
        if (g_att_short < 0) g_att_short = 0;
    }
    return g_att_short;
}
static int att_short_splits_cap(void) {
    if (g_att_short_splits < 0) {
        const char *e = getenv("KILN_CUDA_ATT_SHORT_SPLITS");
        g_att_short_splits = e && *e ? atoi(e) : 0;
        if (g_att_short_splits < 0) g_att_short_splits = 0;
    }
    return g_att_short_splits;
}

/* The fewest keys of a decode key split (atts_split_plan; 0: ATTS_SPLIT_MIN_KEYS), env
 * KILN_CUDA_ATT_SPLIT_KEYS for A/B runs. */
static int g_att_split_keys = -1;
int kcu_att_split_min_keys(void) {
    if (g_att_split_keys < 0) {
        const char *e = getenv("KILN_CUDA_ATT_SPLIT_KEYS");
        g_att_split_keys = e && *e ? atoi(e) : 0;
        if (g_att_split_keys < 0) g_att_split_keys = 0;
    }
    return g_att_split_keys;
}

template <int GM, int CH, int KB, int DT>
static void launch_short_dt(kcu_state *st, const atts_args &A, dim3 grid) {
    const size_t smem = atts_smem_bytes(atts_heads_per_block(A.group, A.hd, A.vhd), A.vhd);
    static size_t raised = 48 * 1024; /* per instance */
    if (smem > raised) {
        if (!KCU_CHECK(st, cudaFuncSetAttribute(k_attn_decode_short<GM, CH, KB, DT>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)smem)))
            return;
        raised = smem;
    }
    KCU_LAUNCH(st, (k_attn_decode_short<GM, CH, KB, DT>), grid, ATTS_WARPS * 32, smem, A);
    KCU_LAUNCHED(st);
}
/* atts_dispatch's callback: the instance for the cache dtype */
struct short_launcher {
    kcu_state *st;
    const atts_args &A;
    dim3 grid;
    template <int GM, int CH, int KB> void run() {
        if (A.kv_dtype == KILN_DT_F32)
            launch_short_dt<GM, CH, KB, KILN_DT_F32>(st, A, grid);
        else if (A.kv_dtype == KILN_DT_BF16)
            launch_short_dt<GM, CH, KB, KILN_DT_BF16>(st, A, grid);
        else
            launch_short_dt<GM, CH, KB, KILN_DT_F16>(st, A, grid);
    }
};

/* The short decode kernel (attention_decode.cuh) for L when it applies (every sequence one token,
 * keys <= the limit, and atts_applies): true when launched. */
static bool attention_short(kcu_state *st, const att_launch &L, int max_n, int keys, bool aligned,
                            int n_seq) {
    const kcu_attn_args &a = L.a;
    if (max_n != 1 || keys > att_short_max() || !aligned ||
        !atts_applies(L.group, a.head_dim, a.v_head_dim))
        return false;
    atts_args A;
    memset(&A, 0, sizeof A);
    A.q = a.q, A.out = a.out, A.positions = a.p.positions;
    A.n_heads = a.p.n_heads, A.n_kv_heads = a.n_kv_heads, A.group = L.group;
    A.hd = a.head_dim, A.vhd = a.v_head_dim, A.window = a.window, A.kv_dtype = a.kv_dtype;
    A.scale = a.p.scale, A.softcap = a.p.softcap;
    for (int i = 0; i < n_seq; i++)
        A.s[i].k = L.s[i].k, A.s[i].v = L.s[i].v, A.s[i].pos0 = L.s[i].pos0, A.s[i].t0 = L.s[i].t0;
    atts_plan(&A);
    atts_plan_splits(&A, keys, n_seq, st->n_sms, att_short_splits_cap(), kcu_att_split_min_keys());
    if (A.splits > 1) {
        if ((int64_t)n_seq * a.n_kv_heads * A.nsub > KCU_ATT_COUNTERS) return false;
        const size_t n_part = (size_t)n_seq * a.p.n_heads * A.splits;
        float *scr = (float *)kcu_scratch(st, n_part * (size_t)(A.vhd + 2) * sizeof(float));
        if (!scr) return true; /* reported */
        A.part_o = scr;
        A.part_ml = scr + n_part * A.vhd;
        A.counters = st->attn_counters;
    }
    /* the o projection's digits of out, when the model hinted that it reads out next (qg_link):
     * every row of out is one sequence's query (rows 0 .. n_seq-1) */
    const int64_t cols = (int64_t)a.p.n_heads * a.v_head_dim;
    bool rows_once = a.v_head_dim % 32 == 0;
    for (int i = 0; rows_once && i < n_seq; i++) rows_once = L.s[i].t0 == i;
    kcu_qx_emit emit;
    const bool emits =
        rows_once && cols <= INT_MAX && kcu_qg_link_claim(st, a.out, n_seq, (int)cols, &emit);
    if (emits) {
        A.emit_dig = emit.dig, A.emit_E = emit.E, A.emit_sx16 = emit.sx16;
        A.emit_perm4 = emit.perm4, A.emit_nd = emit.nd;
    }
    const unsigned long long seq0 = st->launch_seq;
    short_launcher launcher = {
        st, A, dim3((unsigned)(a.n_kv_heads * A.nsub), (unsigned)n_seq, (unsigned)A.splits)};
    atts_dispatch(A, launcher);
    if (emits && st->launch_seq != seq0) kcu_qg_link_emitted(st, a.out, n_seq, (int)cols, &emit);
    return true;
}

/* Launches one chunk of at most KCU_ATT_MAX_SEQ sequences; with k_new (decode, one token per
 * sequence) the PREP kernel, which also preps q / k and stores the step's rows. Returns false
 * (nothing launched) when the PREP kernel cannot take the chunk. */
static bool attention_chunk(kcu_state *st, const kcu_attn_args *a, const kcu_attn_seq *seqs,
                            int n_seq, const float *k_new = NULL, const float *v_new = NULL) {
    att_launch L;
    L.a = *a;
    L.k_new = k_new, L.v_new = v_new;
    if (a->p.prep) L.prep = *a->p.prep;
    L.counters = st->attn_counters;
    const bool prep = k_new != NULL;
    L.group = a->p.n_heads / a->n_kv_heads;
    L.n_seq = n_seq;
    int max_n = 0, keys = 0;
    bool aligned = true;
    for (int i = 0; i < n_seq; i++) {
        const kcu_attn_seq *q = &seqs[i];
        att_seq *d = &L.s[i];
        d->k = q->k, d->v = q->v, d->pos0 = q->pos0, d->n = q->n, d->t0 = q->t0;
        d->kbeg = a->window > 0 ? (q->pos0 - a->window + 1 > 0 ? q->pos0 - a->window + 1 : 0) : 0;
        int kend = q->pos0 + q->n;
        if (kend - d->kbeg > keys) keys = kend - d->kbeg;
        if (q->n > max_n) max_n = q->n;
        aligned = aligned && ((uintptr_t)q->k & 15) == 0 && ((uintptr_t)q->v & 15) == 0;
    }
    if (max_n <= 0) return true;
    if (a->p.positions && max_n == 1) keys = kcu_attn_keys_bucket(keys);
    L.rows_max = max_n * L.group;
    if (!prep && attention_short(st, L, max_n, keys, aligned, n_seq)) return true;
    int rpw = L.rows_max <= 2 * ATT_WARPS ? 1 : 4;
    int rows_per_block = ATT_WARPS * rpw;
    int tiles = (L.rows_max + rows_per_block - 1) / rows_per_block;
    if (prep) {
        for (int i = 0; i < n_seq; i++)
            if (seqs[i].n != 1) return false;
        if ((int64_t)n_seq * a->n_kv_heads * tiles > KCU_ATT_COUNTERS || !a->p.prep ||
            a->p.prep->rot_dim > a->head_dim)
            return false;
    }
    int blocks = tiles * a->n_kv_heads * n_seq, splits = 1;
    /* Few blocks (decode): split the keys so the GPU's SMs share them. Even a short context is
     * split down to one 32-key tile per block: a block walks its tiles one after another, and
     * at batch 1 an unsplit 128-key decode measured 56 us against a few us per tile. */
    if (blocks < 2 * st->n_sms && keys > ATT_KT) {
        splits = (4 * st->n_sms + blocks - 1) / blocks;
        int max_splits = keys > 1024 ? (keys + 127) / 128 : (keys + ATT_KT - 1) / ATT_KT;
        if (splits > max_splits) splits = max_splits;
    }
    L.kps = (keys + splits - 1) / splits;
    L.kps = (L.kps + ATT_KT - 1) / ATT_KT * ATT_KT;
    splits = (keys + L.kps - 1) / L.kps;
    L.splits = splits;
    L.part_o = L.part_ml = NULL;
    int vec_el = a->kv_dtype == KILN_DT_F32 ? 4 : 8;
    L.vec = a->head_dim % vec_el == 0 && a->v_head_dim % vec_el == 0 && aligned;
    if (splits > 1) {
        size_t n_part = (size_t)n_seq * splits * a->n_kv_heads * L.rows_max;
        float *scr = (float *)kcu_scratch(st, n_part * (a->v_head_dim + 2) * sizeof(float));
        if (!scr) return true; /* reported */
        L.part_o = scr;
        L.part_ml = scr + n_part * a->v_head_dim;
    }
    dim3 grid(tiles, a->n_kv_heads, n_seq * splits);
    if (prep) {
        if (rpw == 1)
            launch_dpl<1, true>(st, L, grid);
        else
            launch_dpl<4, true>(st, L, grid);
        return true; /* the last split of each tile merged */
    }
    if (rpw == 1)
        launch_dpl<1, false>(st, L, grid);
    else
        launch_dpl<4, false>(st, L, grid);
    if (splits > 1) {
        KCU_LAUNCH(st, k_attn_merge, dim3(L.rows_max, a->n_kv_heads, n_seq), 128, 0, L, splits);
        KCU_LAUNCHED(st);
    }
    return true;
}

static bool geometry_ok(kcu_state *st, const kcu_attn_args *a) {
    if (a->v_head_dim > 512 || a->n_kv_heads <= 0 || a->p.n_heads % a->n_kv_heads) {
        kcu_report(st, "kcu_attention", "unsupported head geometry", __FILE__, __LINE__);
        return false;
    }
    return true;
}

void kcu_attention(kcu_state *st, const kcu_attn_args *a) {
    if (a->n <= 0 || !geometry_ok(st, a)) return;
    kcu_attn_seq one = {a->k, a->v, a->pos0, a->n, 0}, rest;
    if (kcu_attention_prefill_tc(st, a, &one, 1, &rest)) attention_chunk(st, a, &rest, 1);
}

void kcu_attention_batch(kcu_state *st, const kcu_attn_args *common, const kcu_attn_seq *seqs,
                         int n_seq) {
    if (n_seq <= 0 || !geometry_ok(st, common)) return;
    kcu_attn_seq rest[KCU_ATT_MAX_SEQ];
    for (int i = 0; i < n_seq; i += KCU_ATT_MAX_SEQ) {
        int c = n_seq - i < KCU_ATT_MAX_SEQ ? n_seq - i : KCU_ATT_MAX_SEQ;
        int n_rest = kcu_attention_prefill_tc(st, common, seqs + i, c, rest); /* long prefills */
        if (n_rest) attention_chunk(st, common, rest, n_rest);
    }
}

bool kcu_attention_decode_prep(kcu_state *st, const kcu_attn_args *common, const kcu_attn_seq *seqs,
                               int n_seq, const float *k_new, const float *v_new) {
    if (n_seq <= 0 || n_seq > KCU_ATT_MAX_SEQ || !geometry_ok(st, common)) return false;
    return attention_chunk(st, common, seqs, n_seq, k_new, v_new);
}
#endif /* ATT_HOST_EMU */
