/* attention.cu — attention of new queries against a contiguous device KV cache.
 *
 * One kernel serves decode and prefill, flash-attention style on CUDA cores: a block owns one KV
 * head and a tile of "rows" (query token x query head of that KV head's GQA group), so every K/V
 * tile it stages in shared memory (32 keys, f32) is reused by all the group's heads and tokens.
 * Each warp owns RPW rows; lane j scores key j of the tile, the warp keeps an online softmax
 * (running max m, sum l) and each lane accumulates the output dims lane, lane+32, ... .
 * Long key ranges with few blocks (decode) are split over gridDim.z; the partial (m, l, acc) of
 * each split are merged by log-sum-exp in a second kernel. */
#include "backend/cuda/attention.cuh"

#define ATT_WARPS 4
#define ATT_KT    32

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
    int n_seq;
    att_seq s[KCU_ATT_MAX_SEQ];
};

/* 16 bytes of K or V at element offset off (4 f32 or 8 f16/bf16) as f32; zeros when !ok. */
__device__ __forceinline__ void load16(const void *base, int64_t off, int dt, bool ok, float v[8]) {
    if (dt == KILN_DT_F32) {
        float4 f =
            ok ? __ldg((const float4 *)((const float *)base + off)) : make_float4(0, 0, 0, 0);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
        return;
    }
    uint4 u = ok ? __ldg((const uint4 *)((const uint16_t *)base + off)) : make_uint4(0, 0, 0, 0);
    uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (dt == KILN_DT_BF16) {
            v[2 * i] = __uint_as_float(w[i] << 16);
            v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        } else {
            v[2 * i] = kcu_f16((uint16_t)(w[i] & 0xffffu));
            v[2 * i + 1] = kcu_f16((uint16_t)(w[i] >> 16));
        }
    }
}

template <int DPL, int RPW>
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
    extern __shared__ float sm[];
    float *Qs = sm;                     /* [ROWS][hd] */
    float *Ks = Qs + ROWS * hd;         /* [KT][hd+1] (padded: lanes read different banks) */
    float *Vs = Ks + ATT_KT * (hd + 1); /* [KT][vhd] */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kvh = blockIdx.y;
    int n_heads = a.p.n_heads;
    int64_t kstride = (int64_t)a.n_kv_heads * hd, vstride = (int64_t)a.n_kv_heads * vhd;

    for (int i = threadIdx.x; i < ROWS * hd; i += blockDim.x) {
        int r = row0 + i / hd, d = i % hd;
        float v = 0.0f;
        if (r < rows_total) {
            int t = r / G, h = kvh * G + r % G;
            v = a.q[((int64_t)t * n_heads + h) * hd + d] * a.p.scale;
        }
        Qs[i] = v;
    }

    /* rows of this warp: their token, and visible keys [lo, hi) */
    int lo[RPW], hi[RPW];
    bool live[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        int row = row0 + warp * RPW + r;
        live[r] = row < rows_total;
        int p = a.pos0 + (live[r] ? row / G : 0);
        hi[r] = p + 1;
        lo[r] = a.window > 0 ? max(0, p - a.window + 1) : 0;
    }
    /* keys this block looks at: the split's range clipped to the union of its rows' ranges */
    int last_row = min(row0 + ROWS, rows_total) - 1;
    int blk_lo = a.window > 0 ? max(0, a.pos0 + row0 / G - a.window + 1) : 0;
    int blk_hi = a.pos0 + last_row / G + 1;
    int s_lo = kbeg + z * L.kps, s_hi = s_lo + L.kps;
    int k0 = max(blk_lo, s_lo), k1 = min(blk_hi, s_hi);

    float m[RPW], l[RPW], acc[RPW][DPL];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[r][i] = 0.0f;
    }

    for (int ks = k0; ks < k1; ks += ATT_KT) {
        __syncthreads(); /* Q staged / previous tile consumed */
        if (L.vec) {     /* 16-byte loads: 4 f32 or 8 f16/bf16 per thread and step */
            const int VEC = a.kv_dtype == KILN_DT_F32 ? 4 : 8, kc = hd / VEC, vc = vhd / VEC;
            for (int i = threadIdx.x; i < ATT_KT * kc; i += blockDim.x) {
                int j = i / kc, d0 = (i - j * kc) * VEC;
                float v[8];
                load16(a.k, (int64_t)(ks + j) * kstride + kvh * hd + d0, a.kv_dtype, ks + j < k1,
                       v);

#pragma unroll
                for (int e = 0; e < 8; e++)
                    if (e < VEC) Ks[j * (hd + 1) + d0 + e] = v[e];
            }
            for (int i = threadIdx.x; i < ATT_KT * vc; i += blockDim.x) {
                int j = i / vc, d0 = (i - j * vc) * VEC;
                float v[8];
                load16(a.v, (int64_t)(ks + j) * vstride + kvh * vhd + d0, a.kv_dtype, ks + j < k1,
                       v);

#pragma unroll
                for (int e = 0; e < 8; e++)
                    if (e < VEC) Vs[j * vhd + d0 + e] = v[e];
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
        __syncthreads();
        float s[RPW];
#pragma unroll
        for (int r = 0; r < RPW; r++) s[r] = 0.0f;
        const float *kr = Ks + lane * (hd + 1);
        const float *qw = Qs + warp * RPW * hd;
        for (int d = 0; d < hd; d++) {
            float kd = kr[d];
#pragma unroll
            for (int r = 0; r < RPW; r++) s[r] = fmaf(qw[r * hd + d], kd, s[r]);
        }
        int j = ks + lane;
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            bool ok = live[r] && j < k1 && j >= lo[r] && j < hi[r];
            float sc = s[r];
            if (a.p.softcap > 0.0f) sc = a.p.softcap * kcu_tanh(sc / a.p.softcap);
            sc = ok ? sc : -INFINITY;
            float mt = kcu_warp_max(sc);
            float mn = fmaxf(m[r], mt);
            if (mn == -INFINITY) continue; /* nothing visible yet for this row (warp-uniform) */
            float alpha = __expf(m[r] - mn);
            float pj = ok ? __expf(sc - mn) : 0.0f;
            l[r] = l[r] * alpha + kcu_warp_sum(pj);
            m[r] = mn;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[r][i] *= alpha;
            for (int jj = 0; jj < ATT_KT; jj++) {
                float pb = __shfl_sync(0xffffffffu, pj, jj);
                const float *vr = Vs + jj * vhd;
#pragma unroll
                for (int i = 0; i < DPL; i++) {
                    int d = lane + 32 * i;
                    if (d < vhd) acc[r][i] = fmaf(pb, vr[d], acc[r][i]);
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < RPW; r++) {
        if (!live[r]) continue;
        int row = row0 + warp * RPW + r;
        int t = row / G, h = kvh * G + row % G;
        if (L.splits == 1) {
            float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
            float *o = a.out + ((int64_t)t * n_heads + h) * vhd;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                if (lane + 32 * i < vhd) o[lane + 32 * i] = acc[r][i] * inv;
        } else {
            int64_t pi = (((int64_t)si * L.splits + z) * a.n_kv_heads + kvh) * L.rows_max + row;
            float *o = L.part_o + pi * vhd;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                if (lane + 32 * i < vhd) o[lane + 32 * i] = acc[r][i];
            if (lane == 0) L.part_ml[2 * pi] = m[r], L.part_ml[2 * pi + 1] = l[r];
        }
    }
}

/* One block per (row, kv head, seq): out = sum_z acc_z e^(m_z - M) / sum_z l_z e^(m_z - M). */
__global__ void k_attn_merge(const __grid_constant__ att_launch L, int splits) {
    KCU_PDL_ENTER();
    const kcu_attn_args &a = L.a;
    const att_seq &S = L.s[blockIdx.z];
    int row = blockIdx.x, kvh = blockIdx.y, vhd = a.v_head_dim, G = L.group;
    if (row >= S.n * G) return;
    int64_t per_split = (int64_t)a.n_kv_heads * L.rows_max;
    int64_t base = (int64_t)blockIdx.z * splits * per_split + (int64_t)kvh * L.rows_max + row;
    float M = -INFINITY;
    for (int z = 0; z < splits; z++) M = fmaxf(M, L.part_ml[2 * (z * per_split + base)]);
    float den = 0.0f;
    for (int z = 0; z < splits; z++) {
        float mz = L.part_ml[2 * (z * per_split + base)];
        if (mz != -INFINITY) den += L.part_ml[2 * (z * per_split + base) + 1] * __expf(mz - M);
    }
    int t = row / G, h = kvh * G + row % G;
    float *o = a.out + ((int64_t)(S.t0 + t) * a.p.n_heads + h) * vhd;
    for (int d = threadIdx.x; d < vhd; d += blockDim.x) {
        float num = 0.0f;
        for (int z = 0; z < splits; z++) {
            float mz = L.part_ml[2 * (z * per_split + base)];
            if (mz != -INFINITY) num += L.part_o[(z * per_split + base) * vhd + d] * __expf(mz - M);
        }
        o[d] = den > 0.0f ? num / den : 0.0f;
    }
}

template <int DPL, int RPW> static void launch(kcu_state *st, const att_launch &L, dim3 grid) {
    int hd = L.a.head_dim, vhd = L.a.v_head_dim;
    size_t smem = sizeof(float) *
                  ((size_t)ATT_WARPS * RPW * hd + (size_t)ATT_KT * (hd + 1) + (size_t)ATT_KT * vhd);
    static size_t raised = 48 * 1024;
    if (smem > raised) {
        if (!KCU_CHECK(st, cudaFuncSetAttribute(k_attn<DPL, RPW>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)smem)))
            return;
        raised = smem;
    }
    KCU_LAUNCH(st, (k_attn<DPL, RPW>), grid, ATT_WARPS * 32, smem, L);
    KCU_LAUNCHED(st);
}

template <int RPW> static void launch_dpl(kcu_state *st, const att_launch &L, dim3 grid) {
    int d = L.a.head_dim > L.a.v_head_dim ? L.a.head_dim : L.a.v_head_dim;
    (void)d;
    int vhd = L.a.v_head_dim;
    if (vhd <= 64)
        launch<2, RPW>(st, L, grid);
    else if (vhd <= 128)
        launch<4, RPW>(st, L, grid);
    else if (vhd <= 256)
        launch<8, RPW>(st, L, grid);
    else
        launch<16, RPW>(st, L, grid);
}

/* Launches one chunk of at most KCU_ATT_MAX_SEQ sequences. */
static void attention_chunk(kcu_state *st, const kcu_attn_args *a, const kcu_attn_seq *seqs,
                            int n_seq) {
    att_launch L;
    L.a = *a;
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
    if (max_n <= 0) return;
    if (a->p.positions && max_n == 1) keys = kcu_attn_keys_bucket(keys);
    L.rows_max = max_n * L.group;
    int rpw = L.rows_max <= 2 * ATT_WARPS ? 1 : 4;
    int rows_per_block = ATT_WARPS * rpw;
    int tiles = (L.rows_max + rows_per_block - 1) / rows_per_block;
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
        if (!scr) return;
        L.part_o = scr;
        L.part_ml = scr + n_part * a->v_head_dim;
    }
    dim3 grid(tiles, a->n_kv_heads, n_seq * splits);
    if (rpw == 1)
        launch_dpl<1>(st, L, grid);
    else
        launch_dpl<4>(st, L, grid);
    if (splits > 1) {
        KCU_LAUNCH(st, k_attn_merge, dim3(L.rows_max, a->n_kv_heads, n_seq), 128, 0, L, splits);
        KCU_LAUNCHED(st);
    }
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
