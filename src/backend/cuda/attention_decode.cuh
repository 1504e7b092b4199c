/* attention_decode.cuh — decode attention in one launch: one block per (KV head, query heads of
 * its group, sequence, key split), its warps splitting the block's keys.
 *
 * A decode step (one query token per sequence) against a contiguous cache: 16 warps of one block
 * take key groups of KB (4; 2 for head dims above 256) in turn (warp w: keys lo + KB*w ..,
 * then + 16*KB, ...); lane l holds dims 4l..4l+3 (and 128 + 4l.., ... for larger head dims) of q,
 * of each key's K and V rows and of the output, so a score is a 4- to 16-term partial dot
 * product per lane and a warp sum. A turn's K/V loads are all issued before the first is used
 * (registers, no shared-memory staging), which keeps enough bytes in flight to stream the cache.
 * A block takes up to 8 query heads of a KV head's GQA group (head dims <= 128), 2 (<= 256) or 1
 * (<= 512), so that q and the accumulators stay in registers; larger groups take several blocks
 * per KV head (each reads the head's K/V, from L2 after the first).
 * Each warp keeps an online softmax per query head of the GQA group; the warps' (m, l, acc) are
 * merged by log-sum-exp in shared memory. Long contexts with few (sequence, KV head) pairs split
 * the keys over gridDim.z (atts_plan_splits): each split writes its merged (m, l, acc) to global
 * partials and the last split of a block column to arrive (an arrival counter) merges them, so
 * the step stays one launch with no separate merge kernel. attention.cu launches it
 * (attention_short) for decode steps up to KILN_CUDA_ATT_SHORT keys (default: any);
 * tests/emu/attention_emulate.cc compiles this file on the CPU (ATTS_HOST_EMU) with emulated
 * threads, barriers, shuffles and atomics. */
#ifndef KILN_CUDA_ATTENTION_DECODE_CUH
#define KILN_CUDA_ATTENTION_DECODE_CUH

#ifndef ATTS_HOST_EMU
#include "backend/cuda/cuda_common.cuh"
#define ATTS_SMEM(name) extern __shared__ float name[]
#endif

#include "backend/cuda/qx_digits.cuh"

#include <stdint.h>

#define ATTS_WARPS   16
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
    int nsub; /* blocks per KV head: ceil(group / atts_heads_per_block) (atts_plan) */
    float scale, softcap;
    /* key splits (grid z, atts_plan_splits): split z takes keys [kbeg + z*kps, + kps) */
    int splits, kps;
    float *part_o;  /* splits > 1: [sequences, n_heads, splits, vhd] each split's unscaled acc */
    float *part_ml; /* [sequences, n_heads, splits, 2] its (max, sum of exp) */
    unsigned *counters; /* [sequences * gridDim.x] split arrivals, zero between launches */
    /* emit_dig set: out's digits for the quantized GEMV that reads out next (the o projection;
     * qgemv.cu qg_link), in pass 1's layout for [rows, n_heads*vhd] (vhd % 32 == 0): each block
     * makes those of the heads it wrote, after writing them */
    int8_t *emit_dig;
    float *emit_E, *emit_sx16;
    int emit_perm4, emit_nd;
    atts_seq s[ATTS_MAX_SEQ];
};

/* 128-dim chunks of the larger head dim a lane's registers hold (1, 2 or 4), and the query heads
 * one block takes: the whole group up to 8 at one chunk, 2 at two, 1 at four (registers: q and
 * the accumulators are heads * chunks * 8 floats per lane). */
static inline int atts_chunks(int hd, int vhd) {
    const int d = hd > vhd ? hd : vhd;
    return d <= 128 ? 1 : d <= 256 ? 2 : 4;
}
static inline int atts_heads_per_block(int group, int hd, int vhd) {
    const int ch = atts_chunks(hd, vhd), cap = ch == 1 ? 8 : ch == 2 ? 2 : 1;
    return group < cap ? group : cap;
}
/* Dynamic shared memory of a block with `heads` query heads: [ATTS_WARPS][heads][vhd + 2], then
 * the split-arrival flag (16 bytes). */
static inline size_t atts_smem_bytes(int heads, int vhd) {
    return sizeof(float) * ((size_t)ATTS_WARPS * (size_t)heads * (size_t)(vhd + 2) + 4);
}
/* Whether the kernel takes the geometry: head dims multiples of 4 up to 512, any group. */
static inline bool atts_applies(int group, int hd, int vhd) {
    return group >= 1 && hd >= 4 && vhd >= 4 && hd % 4 == 0 && vhd % 4 == 0 && hd <= 512 &&
           vhd <= 512 && atts_smem_bytes(atts_heads_per_block(group, hd, vhd), vhd) <= 96 * 1024;
}
/* Sets A->nsub (A's group and head dims set); the launch grid is (n_kv_heads * nsub, sequences). */
static inline void atts_plan(atts_args *A) {
    const int hpb = atts_heads_per_block(A->group, A->hd, A->vhd);
    A->nsub = (A->group + hpb - 1) / hpb;
}
/* Keys a split takes at least: four turns of the block's warps (fewer and the block's fixed
 * work, q loads and the warp merge, outweighs its keys). */
#define ATTS_SPLIT_MIN_KEYS (4 * 4 * ATTS_WARPS)
#define ATTS_MAX_SPLITS     64

/* Key splits for `blocks` (sequence, block) pairs whose longest key range is `keys` on a GPU of
 * n_sms SMs: while the pairs leave SMs without a block (each SM holds one or two of these
 * 16-warp blocks), the keys split so that about two blocks a SM stream the cache, each split a
 * multiple of min_keys / 4 keys and at least min_keys (<= 0: ATTS_SPLIT_MIN_KEYS). max_splits > 0
 * caps the splits (A/B runs). atts_plan_splits: for A (A->nsub set), n_seq sequences. */
static inline void atts_split_plan(int blocks, int keys, int n_sms, int max_splits, int min_keys,
                                   int *splits_out, int *kps_out) {
    if (min_keys <= 0) min_keys = ATTS_SPLIT_MIN_KEYS;
    const int want = 2 * n_sms;
    int splits = 1;
    if (blocks < want && keys > min_keys) {
        splits = (want + blocks - 1) / blocks;
        const int most = keys / min_keys;
        if (splits > most) splits = most;
        if (splits > ATTS_MAX_SPLITS) splits = ATTS_MAX_SPLITS;
    }
    if (max_splits > 0 && splits > max_splits) splits = max_splits;
    if (splits < 1) splits = 1;
    const int unit = min_keys / 4 > 0 ? min_keys / 4 : 1;
    int kps = (keys + splits - 1) / splits;
    kps = (kps + unit - 1) / unit * unit;
    if (kps < unit) kps = unit;
    *kps_out = kps;
    *splits_out = (keys + kps - 1) / kps;
    if (*splits_out < 1) *splits_out = 1;
}
static inline void atts_plan_splits(atts_args *A, int keys, int n_seq, int n_sms, int max_splits,
                                    int min_keys) {
    atts_split_plan(A->n_kv_heads * A->nsub * n_seq, keys, n_sms, max_splits, min_keys, &A->splits,
                    &A->kps);
}

/* Calls f.template run<GM, CH, KB>() for the kernel instance of A's geometry (GM: heads per block
 * rounded up to 1, 2, 4, 8; CH: chunks; KB: keys per warp per turn), for the launcher and the
 * CPU emulator alike. */
template <typename F> static inline void atts_dispatch_geometry(int group, int hd, int vhd, F &f) {
    const int ch = atts_chunks(hd, vhd), hpb = atts_heads_per_block(group, hd, vhd);
    if (ch == 4)
        f.template run<1, 4, 2>();
    else if (ch == 2)
        hpb == 1 ? f.template run<1, 2, 4>() : f.template run<2, 2, 4>();
    else if (hpb == 1)
        f.template run<1, 1, 4>();
    else if (hpb == 2)
        f.template run<2, 1, 4>();
    else if (hpb <= 4)
        f.template run<4, 1, 4>();
    else
        f.template run<8, 1, 4>();
}
template <typename F> static inline void atts_dispatch(const atts_args &A, F &f) {
    atts_dispatch_geometry(A.group, A.hd, A.vhd, f);
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

/* An empty online softmax: m = -inf, l = 0, acc = 0. */
template <int GM, int CH>
__device__ __forceinline__ void atts_start(float (&m)[GM], float (&l)[GM],
                                           float (&acc)[GM][CH][4]) {
#pragma unroll
    for (int g = 0; g < GM; g++) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int c = 0; c < CH; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[g][c][e] = 0.0f;
    }
}

/* One turn of a warp: its KB keys (ok[u]: visible) against the block's G query heads — scores
 * q . k (per-lane partial dot products and a warp sum), the softcap, the online softmax update of
 * (m, l) and acc += p v. A turn with no visible key changes nothing (warp-uniform). */
template <int GM, int CH, int KB>
__device__ __forceinline__ void atts_turn(const float (&q)[GM][CH][4], const float (&kx)[KB][CH][4],
                                          const float (&vx)[KB][CH][4], const bool (&ok)[KB], int G,
                                          float softcap, float (&m)[GM], float (&l)[GM],
                                          float (&acc)[GM][CH][4]) {
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g >= G) break;
        float sc[KB];
#pragma unroll
        for (int u = 0; u < KB; u++) {
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
            for (int u = 0; u < KB; u++) sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], o);
        float mt = -INFINITY;
#pragma unroll
        for (int u = 0; u < KB; u++) {
            if (softcap > 0.0f) sc[u] = softcap * kcu_tanh(sc[u] / softcap);
            if (!ok[u]) sc[u] = -INFINITY;
            mt = fmaxf(mt, sc[u]);
        }
        if (mt == -INFINITY) continue;
        const float mn = fmaxf(m[g], mt);
        const float alpha = __expf(m[g] - mn);
        float pu[KB], ps = 0.0f;
#pragma unroll
        for (int u = 0; u < KB; u++) {
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
                for (int u = 0; u < KB; u++) v = fmaf(pu[u], vx[u][c][e], v);
                acc[g][c][e] = v;
            }
    }
}

/* The block's end: the warps' (m, l, acc) merged by log-sum-exp in shared memory sm
 * (atts_smem_bytes), out = sum_w acc_w e^(m_w - M) / sum_w l_w e^(m_w - M), M = max_w m_w, into
 * rows row0 .. row0 + G - 1 of out [rows, vhd]; with splits > 1 into this split's partial
 * (part_o / part_ml [rows, splits, ...]) instead, and the last split of the block column to arrive
 * (counters[blockIdx.y * gridDim.x + blockIdx.x]) merges all of them into out. Every thread of
 * the block calls it; true (for all of them) when this block wrote its rows of out. */
template <int GM, int CH>
__device__ __forceinline__ bool atts_finish(float *sm, int G, int vhd, const float (&m)[GM],
                                            const float (&l)[GM], const float (&acc)[GM][CH][4],
                                            int64_t row0, float *out, int splits, float *part_o,
                                            float *part_ml, unsigned *counters) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *sacc = sm;                               /* [ATTS_WARPS][G][vhd] */
    float *sml = sm + (size_t)ATTS_WARPS * G * vhd; /* [ATTS_WARPS][G][2] */
    __syncthreads(); /* whatever the block kept in sm before (rotated q rows) is in registers */
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
    const bool split = splits > 1;
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
        const int64_t row = row0 + g;
        if (!split) {
            out[row * vhd + d] = den > 0.0f ? num / den : 0.0f;
            continue;
        }
        const int64_t pz = row * splits + blockIdx.z; /* this split's partial */
        part_o[pz * vhd + d] = num;
        if (d == 0) part_ml[2 * pz] = M, part_ml[2 * pz + 1] = den;
    }
    if (!split) return true;
    int *last = (int *)(sml + (size_t)ATTS_WARPS * G * 2);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *c = counters + (int64_t)blockIdx.y * gridDim.x + blockIdx.x;
        *last = atomicAdd(c, 1u) == (unsigned)splits - 1;
        if (*last) *c = 0; /* every split has arrived: ready for the next launch */
    }
    __syncthreads();
    if (!*last) return false;
    __threadfence();
    for (int i = threadIdx.x; i < G * vhd; i += blockDim.x) {
        const int g = i / vhd, d = i - g * vhd;
        const int64_t row = row0 + g, p0 = row * splits;
        float M = -INFINITY;
        for (int z = 0; z < splits; z++) M = fmaxf(M, __ldcg(part_ml + 2 * (p0 + z)));
        float num = 0.0f, den = 0.0f;
        for (int z = 0; z < splits; z++) {
            const float mz = __ldcg(part_ml + 2 * (p0 + z));
            if (mz == -INFINITY) continue; /* a split past the last key */
            const float e = __expf(mz - M);
            den += __ldcg(part_ml + 2 * (p0 + z) + 1) * e;
            num += __ldcg(part_o + (p0 + z) * vhd + d) * e;
        }
        out[row * vhd + d] = den > 0.0f ? num / den : 0.0f;
    }
    return true;
}

/* A block that wrote its G heads of out (from head0, token row t0) makes their digits for the
 * next GEMV (A.emit_dig; qx_digits.cuh): warp w the 32-column groups w, w + ATTS_WARPS, ... of
 * the block's G * vhd columns, read back after the barrier that makes the block's writes
 * visible to all its threads. */
__device__ __forceinline__ void atts_emit_digits(const atts_args &A, int t0, int head0, int G) {
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, vhd = A.vhd;
    const int ng = A.n_heads * vhd / 32, g0 = head0 * vhd / 32, groups = G * vhd / 32;
    const float *o = A.out + ((int64_t)t0 * A.n_heads + head0) * vhd; /* [G * vhd] */
    for (int gi = warp; gi < groups; gi += ATTS_WARPS)
        qx_digit_block(A.emit_dig, A.emit_E, A.emit_sx16, o[gi * 32 + lane], t0, g0 + gi, ng,
                       A.emit_perm4, lane, A.emit_nd);
}

/* GM: query heads per block rounded up (1, 2, 4, 8); CH: 4-dim chunks per lane (hd, vhd <= 128 *
 * CH); KB: keys per warp per turn; DT: the cache dtype (A.kv_dtype).
 * grid (n_kv_heads * A.nsub, sequences, A.splits), ATTS_WARPS * 32 threads: block x takes KV
 * head x / nsub and the group's heads h0 .. h0 + G - 1, h0 = (x % nsub) * GM, block z the keys
 * of split z; dynamic shared memory atts_smem_bytes(G): [ATTS_WARPS][G][vhd] accumulators, then
 * [ATTS_WARPS][G][2] (m, l), then the arrival flag. */
template <int GM, int CH, int KB, int DT>
__global__ void __launch_bounds__(ATTS_WARPS * 32)
    k_attn_decode_short(const __grid_constant__ atts_args A) {
    KCU_PDL_ENTER();
    const atts_seq &S = A.s[blockIdx.y];
    const int kvh = (int)blockIdx.x / A.nsub, h0 = ((int)blockIdx.x - kvh * A.nsub) * GM;
    const int G = A.group - h0 < GM ? A.group - h0 : GM, hd = A.hd, vhd = A.vhd;
    const int head0 = kvh * A.group + h0; /* the block's first query head */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pos = A.positions ? A.positions[S.t0] : S.pos0;
    const int kbeg = A.window > 0 ? max(0, pos - A.window + 1) : 0;
    /* this split's keys [lo, kend): empty for splits past the step's last key (a recorded step
     * planned for its bucket's key count) */
    const int lo = kbeg + (int)blockIdx.z * A.kps;
    const int kend = A.splits > 1 ? min(pos + 1, lo + A.kps) : pos + 1;
    const int64_t kstride = (int64_t)A.n_kv_heads * hd, vstride = (int64_t)A.n_kv_heads * vhd;
    /* the group's q rows, scaled: the lane's dims */
    float q[GM][CH][4];
#pragma unroll
    for (int g = 0; g < GM; g++)
#pragma unroll
        for (int c = 0; c < CH; c++) {
            const int d0 = 4 * lane + 128 * c;
            const float *qr = A.q + ((int64_t)S.t0 * A.n_heads + head0 + g) * hd + d0;
#pragma unroll
            for (int e = 0; e < 4; e++) q[g][c][e] = g < G && d0 < hd ? qr[e] * A.scale : 0.0f;
        }
    float m[GM], l[GM], acc[GM][CH][4];
    atts_start<GM, CH>(m, l, acc);
    for (int j0 = lo + KB * warp; j0 < kend; j0 += KB * ATTS_WARPS) {
        float kx[KB][CH][4], vx[KB][CH][4];
#pragma unroll
        for (int u = 0; u < KB; u++)
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
        bool ok[KB];
#pragma unroll
        for (int u = 0; u < KB; u++) ok[u] = j0 + u < kend;
        atts_turn<GM, CH, KB>(q, kx, vx, ok, G, A.softcap, m, l, acc);
    }
    ATTS_SMEM(sm);
    const bool wrote = atts_finish<GM, CH>(sm, G, vhd, m, l, acc, (int64_t)S.t0 * A.n_heads + head0,
                                           A.out, A.splits, A.part_o, A.part_ml, A.counters);
    if (wrote && A.emit_dig) atts_emit_digits(A, S.t0, head0, G);
}

#endif
