/* fa_fragment.h — the index math of the tensor-core prefill attention (attention_prefill_tc.cu):
 * the register fragments of mma.sync m16n8k16 (16-bit inputs, f32 accumulators) and the shared
 * memory tile layouts the kernel reads them from. Plain C so that tests/test_fa_fragment.c can run
 * the same formulas on the CPU against an emulated warp (internal to src/backend/cuda/).
 *
 * Fragments of mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (PTX ISA, "Matrix
 * fragments for mma.m16n8k16 with floating point type"), with g = lane >> 2 (groupID) and
 * t = lane & 3 (threadID_in_group). Each 32-bit register holds two 16-bit elements, the lower
 * column (A) / lower k (B) in the low half:
 *   A (16 x 16, row major), 4 registers:
 *     reg 0: rows g,   cols 2t, 2t+1        reg 2: rows g,   cols 2t+8, 2t+9
 *     reg 1: rows g+8, cols 2t, 2t+1        reg 3: rows g+8, cols 2t+8, 2t+9
 *   B (16 x 8, k x n, "col": element pairs run along k), 2 registers:
 *     reg 0: k 2t, 2t+1, col g              reg 1: k 2t+8, 2t+9, col g
 *   C / D (16 x 8, f32), 4 registers:
 *     c0, c1: row g,   cols 2t, 2t+1        c2, c3: row g+8, cols 2t, 2t+1
 *
 * Shared memory tiles (16-bit elements, rows padded by FA_PAD so that the eight groups g of a
 * warp read eight different bank quads: see the stride notes in attention_prefill_tc.cu):
 *   Qs [FA_ROWS][D + FA_PAD]  query rows of the block (row = token x GQA head), A of S = Q K^T
 *   Ks [KT][D + FA_PAD]       keys as stored (key-major): B of S = Q K^T is K^T, whose element
 *                             (k = dim d, n = key j) is Ks[j][d]: pairs along d are contiguous
 *   Vt [D][KT + FA_PAD]       values transposed at staging: B of O = P V has element (k = key j,
 *                             n = dim d) = V[j][d] = Vt[d][j]: pairs along j are contiguous
 * P = softmax(S) goes from the C fragments of S straight into A fragments of P V (FA-2): key
 * block kk of 16 keys is n-blocks 2kk (A regs 0, 1) and 2kk+1 (A regs 2, 3) of S. */
#ifndef KILN_CUDA_FA_FRAGMENT_H
#define KILN_CUDA_FA_FRAGMENT_H

#if defined(__CUDACC__)
#define FA_FN static __host__ __device__ __forceinline__
#else
#define FA_FN static inline
#endif

#define FA_PAD 8 /* 16-bit elements of padding per shared-memory row (16 bytes) */

/* A fragment register r (0..3) of lane: row and column of its low element (high: column + 1). */
FA_FN int fa_a_row(int lane, int r) {
    return (lane >> 2) + ((r & 1) ? 8 : 0);
}
FA_FN int fa_a_col(int lane, int r) {
    return ((lane & 3) << 1) + ((r & 2) ? 8 : 0);
}
/* B fragment register r (0..1) of lane: k of its low element (high: k + 1) and its column n. */
FA_FN int fa_b_k(int lane, int r) {
    return ((lane & 3) << 1) + (r ? 8 : 0);
}
FA_FN int fa_b_n(int lane) {
    return lane >> 2;
}
/* C fragment element i (0..3) of lane: row and column. */
FA_FN int fa_c_row(int lane, int i) {
    return (lane >> 2) + ((i & 2) ? 8 : 0);
}
FA_FN int fa_c_col(int lane, int i) {
    return ((lane & 3) << 1) + (i & 1);
}

/* Element offsets into the tiles (row strides include the padding). */
FA_FN int fa_qs_off(int D, int row, int d) {
    return row * (D + FA_PAD) + d;
}
FA_FN int fa_ks_off(int D, int key, int d) {
    return key * (D + FA_PAD) + d;
}
FA_FN int fa_vt_off(int KT, int key, int d) {
    return d * (KT + FA_PAD) + key;
}

/* Offsets of the 32-bit registers a warp loads for one mma:
 *   S = Q K^T, k-step kk (dims 16kk..16kk+15) of the warp's 16 rows starting at row qrow0:
 *     A reg r: Qs at fa_qs_off(D, qrow0 + fa_a_row(lane, r), 16kk + fa_a_col(lane, r))
 *     B reg r of key block nb (keys 8nb..8nb+7): Ks at fa_ks_off(D, 8nb + fa_b_n(lane),
 *                                                                16kk + fa_b_k(lane, r))
 *   O += P V, key step kk (keys 16kk..16kk+15), dim block db (dims 8db..8db+7):
 *     B reg r: Vt at fa_vt_off(KT, 16kk + fa_b_k(lane, r), 8db + fa_b_n(lane)) */
FA_FN int fa_q_frag(int D, int qrow0, int kk, int lane, int r) {
    return fa_qs_off(D, qrow0 + fa_a_row(lane, r), 16 * kk + fa_a_col(lane, r));
}
FA_FN int fa_k_frag(int D, int nb, int kk, int lane, int r) {
    return fa_ks_off(D, 8 * nb + fa_b_n(lane), 16 * kk + fa_b_k(lane, r));
}
FA_FN int fa_v_frag(int KT, int db, int kk, int lane, int r) {
    return fa_vt_off(KT, 16 * kk + fa_b_k(lane, r), 8 * db + fa_b_n(lane));
}
/* The S element (n-block nb, C element i) that becomes the low half of A register r of P for
 * key step kk: n-block 2kk + (r >> 1), C elements (r & 1) * 2 (low) and + 1 (high). */
FA_FN int fa_p_nb(int kk, int r) {
    return 2 * kk + (r >> 1);
}
FA_FN int fa_p_c(int r) {
    return (r & 1) * 2;
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (the fast kernel): lanes 8i..8i+7 give the
 * addresses of the 8 rows (16 bytes each) of matrix i, and lane gets in register i the elements
 * (row g, cols 2t, 2t+1) of matrix i, or with .trans (rows 2t, 2t+1, col g): the transpose.
 * The row each lane addresses, relative to the fragment's origin:
 *   Q, A of k-step kk: matrices (rows 0-7, 8-15) x (cols 0-7, 8-15) in A register order:
 *     row fa_ldsm_q_row(lane), col 16kk + fa_ldsm_q_col(lane)          (plain)
 *   K, B of key blocks nb and nb+1 at k-step kk: registers 0, 1 = B of nb, 2, 3 = B of nb + 1:
 *     key 8nb + fa_ldsm_k_key(lane), dim 16kk + fa_ldsm_k_dim(lane)     (plain)
 *   V (key-major, like K), B of dim blocks db and db+1 at key step kk: registers 0, 1 = B of db,
 *     2, 3 = B of db + 1: key 16kk + fa_ldsm_v_key(lane), dim 8db + fa_ldsm_v_dim(lane) (.trans) */
FA_FN int fa_ldsm_q_row(int lane) {
    return (lane & 7) + ((lane >> 3) & 1) * 8;
}
FA_FN int fa_ldsm_q_col(int lane) {
    return (lane >> 4) * 8;
}
FA_FN int fa_ldsm_k_key(int lane) {
    return (lane & 7) + (lane >> 4) * 8;
}
FA_FN int fa_ldsm_k_dim(int lane) {
    return ((lane >> 3) & 1) * 8;
}
FA_FN int fa_ldsm_v_key(int lane) {
    return (lane & 7) + ((lane >> 3) & 1) * 8;
}
FA_FN int fa_ldsm_v_dim(int lane) {
    return (lane >> 4) * 8;
}

/* Causal / window ranges. Row r (token r / G) of a sequence at positions pos0.. sees keys
 * [lo, hi]: hi = pos0 + r / G, lo = max(0, hi - window + 1) (0 without a window). */
FA_FN int fa_row_hi(int pos0, int G, int row) {
    return pos0 + row / G;
}
FA_FN int fa_row_lo(int pos0, int G, int window, int row) {
    int lo = fa_row_hi(pos0, G, row) - window + 1;
    return window > 0 && lo > 0 ? lo : 0;
}
/* Keys [*k0, *k1) some row of [row0, row0 + nrows) (clipped to rows_total, row0 < rows_total)
 * sees, and [*all_lo, *all_hi]: the keys every one of those rows sees (empty when
 * all_lo > all_hi). Rows are in token order, so the first row bounds lo / hi from below and the
 * last from above. */
FA_FN void fa_rows_keys(int pos0, int G, int window, int rows_total, int row0, int nrows, int *k0,
                        int *k1, int *all_lo, int *all_hi) {
    int last = row0 + nrows < rows_total ? row0 + nrows - 1 : rows_total - 1;
    *k0 = fa_row_lo(pos0, G, window, row0);
    *k1 = fa_row_hi(pos0, G, last) + 1;
    *all_lo = fa_row_lo(pos0, G, window, last);
    *all_hi = fa_row_hi(pos0, G, row0);
}

#endif
