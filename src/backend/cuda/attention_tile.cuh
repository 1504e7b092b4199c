/* attention_tile.cuh — the flash-attention pieces shared by the CUDA-core attention kernels of
 * the contiguous cache (attention.cu k_attn) and the paged cache (attention_paged.cu
 * k_paged_attn), which differ only in how they stage a tile of K and V in shared memory:
 * each warp's rows and the keys they see, a block's key range, the online softmax over one
 * staged tile, the rows' output (final, or a split's partial), and the log-sum-exp merge of the
 * splits. A "row" is one query token x one query head of the block's KV head (GQA group G). */
#ifndef KILN_CUDA_ATTENTION_TILE_CUH
#define KILN_CUDA_ATTENTION_TILE_CUH
#ifndef KCU_HOST_EMU /* tests/emu: the emulator's shims instead */
#include "backend/cuda/cuda_common.cuh"
#endif

/* The RPW rows of warp `warp` in the tile from row0: live (below rows_total), and the keys
 * [lo, hi) row r sees: causal up to its position pos0 + row / G, from window - 1 keys back when
 * window > 0. */
template <int RPW>
__device__ __forceinline__ void att_warp_rows(int row0, int warp, int rows_total, int pos0, int G,
                                              int window, int (&lo)[RPW], int (&hi)[RPW],
                                              bool (&live)[RPW]) {
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int row = row0 + warp * RPW + r;
        live[r] = row < rows_total;
        const int p = pos0 + (live[r] ? row / G : 0);
        hi[r] = p + 1;
        lo[r] = window > 0 ? max(0, p - window + 1) : 0;
    }
}

/* Keys [*k0, *k1) a block of ROWS rows from row0 looks at: the split's range [s_lo, s_hi)
 * clipped to the union of its rows' ranges. */
__device__ __forceinline__ void att_block_keys(int row0, int ROWS, int rows_total, int pos0, int G,
                                               int window, int s_lo, int s_hi, int *k0, int *k1) {
    const int last_row = min(row0 + ROWS, rows_total) - 1;
    const int blk_lo = window > 0 ? max(0, pos0 + row0 / G - window + 1) : 0;
    const int blk_hi = pos0 + last_row / G + 1;
    *k0 = max(blk_lo, s_lo);
    *k1 = min(blk_hi, s_hi);
}

/* Online softmax state of a warp's rows: running max m, sum l, and each lane's output dims
 * lane, lane + 32, ... (DPL of them) in acc. */
template <int DPL, int RPW>
__device__ __forceinline__ void att_state_init(float (&m)[RPW], float (&l)[RPW],
                                               float (&acc)[RPW][DPL]) {
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[r][i] = 0.0f;
    }
}

/* One staged tile of KT keys from ks (Ks [KT][hd+1], Vs [KT][vhd] in shared memory; keys at or
 * past k1 are not visible): lane j scores key ks + j against the warp's rows qw [RPW][hd] (already
 * scaled), softcap when > 0, then the online softmax update and acc += p V. */
template <int DPL, int RPW, int KT>
__device__ __forceinline__ void
att_tile_update(const float *qw, const float *Ks, const float *Vs, int hd, int vhd, int lane,
                int ks, int k1, const int (&lo)[RPW], const int (&hi)[RPW], const bool (&live)[RPW],
                float softcap, float (&m)[RPW], float (&l)[RPW], float (&acc)[RPW][DPL]) {
    float s[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) s[r] = 0.0f;
    const float *kr = Ks + lane * (hd + 1);
    for (int d = 0; d < hd; d++) {
        const float kd = kr[d];
#pragma unroll
        for (int r = 0; r < RPW; r++) s[r] = fmaf(qw[r * hd + d], kd, s[r]);
    }
    const int j = ks + lane;
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const bool ok = live[r] && j < k1 && j >= lo[r] && j < hi[r];
        float sc = s[r];
        if (softcap > 0.0f) sc = softcap * kcu_tanh(sc / softcap);
        sc = ok ? sc : -INFINITY;
        const float mt = kcu_warp_max(sc);
        const float mn = fmaxf(m[r], mt);
        if (mn == -INFINITY) continue; /* nothing visible yet for this row (warp-uniform) */
        const float alpha = __expf(m[r] - mn);
        const float pj = ok ? __expf(sc - mn) : 0.0f;
        l[r] = l[r] * alpha + kcu_warp_sum(pj);
        m[r] = mn;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[r][i] *= alpha;
        for (int jj = 0; jj < KT; jj++) {
            const float pb = __shfl_sync(0xffffffffu, pj, jj);
            const float *vr = Vs + jj * vhd;
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                const int d = lane + 32 * i;
                if (d < vhd) acc[r][i] = fmaf(pb, vr[d], acc[r][i]);
            }
        }
    }
}

/* The warp's live rows out: with one split, acc / l into out (rows of token t, head h at
 * (t * n_heads + h) * vhd, heads kvh * G ...); with several, the split's partials: acc into
 * part_o and (m, l) into part_ml at row index part_row0 + row. */
template <int DPL, int RPW>
__device__ __forceinline__ void
att_store_rows(int row0, int warp, int lane, int G, int kvh, int n_heads, int vhd, int splits,
               float *out, float *part_o, float *part_ml, int64_t part_row0,
               const bool (&live)[RPW], const float (&m)[RPW], const float (&l)[RPW],
               const float (&acc)[RPW][DPL]) {
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        if (!live[r]) continue;
        const int row = row0 + warp * RPW + r;
        const int t = row / G, h = kvh * G + row % G;
        if (splits == 1) {
            const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
            float *o = out + ((int64_t)t * n_heads + h) * vhd;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                if (lane + 32 * i < vhd) o[lane + 32 * i] = acc[r][i] * inv;
        } else {
            const int64_t pi = part_row0 + row;
            float *o = part_o + pi * vhd;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                if (lane + 32 * i < vhd) o[lane + 32 * i] = acc[r][i];
            if (lane == 0) part_ml[2 * pi] = m[r], part_ml[2 * pi + 1] = l[r];
        }
    }
}

/* A block's threads merge one row's splits: o [vhd] = sum_z acc_z e^(m_z - M) / sum_z l_z
 * e^(m_z - M), M the largest m_z, split z's partial at row index z * per_split + base. */
__device__ __forceinline__ void att_merge_row(const float *part_o, const float *part_ml,
                                              int64_t per_split, int64_t base, int splits, int vhd,
                                              float *o) {
    float M = -INFINITY;
    for (int z = 0; z < splits; z++) M = fmaxf(M, part_ml[2 * (z * per_split + base)]);
    float den = 0.0f;
    for (int z = 0; z < splits; z++) {
        const float mz = part_ml[2 * (z * per_split + base)];
        if (mz != -INFINITY) den += part_ml[2 * (z * per_split + base) + 1] * __expf(mz - M);
    }
    for (int d = threadIdx.x; d < vhd; d += blockDim.x) {
        float num = 0.0f;
        for (int z = 0; z < splits; z++) {
            const float mz = part_ml[2 * (z * per_split + base)];
            if (mz != -INFINITY) num += part_o[(z * per_split + base) * vhd + d] * __expf(mz - M);
        }
        o[d] = den > 0.0f ? num / den : 0.0f;
    }
}

#endif
