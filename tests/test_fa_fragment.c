/* test_fa_fragment.c — the index math of the tensor-core prefill attention (fa_fragment.h) run on
 * the CPU against an emulated warp, so it is checked on machines without a GPU:
 *   - mma.sync m16n8k16 is modelled from the PTX ISA's element-wise fragment description (a0..a7,
 *     b0..b3, c0..c3 by groupID / threadID_in_group), written independently of fa_fragment.h;
 *   - the kernel's tile staging (K key-major, V transposed) and fragment loads (fa_q_frag,
 *     fa_k_frag, fa_v_frag), the S -> P repacking (fa_p_nb / fa_p_c) and the output mapping
 *     (fa_c_row / fa_c_col) must give S = Q K^T and O = S V exactly (small integers);
 *   - every A / B element is delivered exactly once, fragment loads are free of bank conflicts;
 *   - the fast kernel's ldmatrix addresses (fa_ldsm_*) against the same per-register fragments,
 *     with ldmatrix modelled from the PTX ISA, and without bank conflicts;
 *   - the causal / window key ranges (fa_rows_keys) against brute force. */
#include "backend/cuda/fa_fragment.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>

/* ---- mma.sync m16n8k16 from the PTX ISA element description ---- */

/* a[lane][i], i = 0..7: the A elements a0..a7 a lane holds (register j = a_{2j}, a_{2j+1}). */
static void model_a_pos(int lane, int i, int *row, int *col) {
    int gid = lane >> 2, tig = lane % 4;
    *row = (i < 2 || (i >= 4 && i < 6)) ? gid : gid + 8;
    *col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
}
static void model_b_pos(int lane, int i, int *row, int *col) { /* i = 0..3, row = k */
    int gid = lane >> 2, tig = lane % 4;
    *row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0);
    *col = gid;
}
static void model_c_pos(int lane, int i, int *row, int *col) {
    int gid = lane >> 2, tig = lane % 4;
    *row = i < 2 ? gid : gid + 8;
    *col = tig * 2 + (i & 1);
}

/* d[lane][4] += A B where A, B are given as the lanes' registers (two elements each). */
static void model_mma(double d[32][4], double a[32][4][2], double b[32][2][2]) {
    double A[16][16], B[16][8];
    int seen_a[16][16] = {{0}}, seen_b[16][8] = {{0}};
    for (int lane = 0; lane < 32; lane++) {
        for (int i = 0; i < 8; i++) {
            int r, c;
            model_a_pos(lane, i, &r, &c);
            A[r][c] = a[lane][i / 2][i % 2];
            seen_a[r][c]++;
        }
        for (int i = 0; i < 4; i++) {
            int r, c;
            model_b_pos(lane, i, &r, &c);
            B[r][c] = b[lane][i / 2][i % 2];
            seen_b[r][c]++;
        }
    }
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) CHECK(seen_a[r][c] == 1);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 8; c++) CHECK(seen_b[r][c] == 1);
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            int r, c;
            model_c_pos(lane, i, &r, &c);
            double s = 0;
            for (int k = 0; k < 16; k++) s += A[r][k] * B[k][c];
            d[lane][i] += s;
        }
}

/* The 32 word addresses of one 32-bit shared load across a warp hit distinct banks, or the same
 * word (broadcast). */
static bool conflict_free(const int elem_off[32]) {
    int word_of_bank[32];
    for (int b = 0; b < 32; b++) word_of_bank[b] = -1;
    for (int lane = 0; lane < 32; lane++) {
        if (elem_off[lane] % 2) return false; /* 32-bit loads must be aligned */
        int w = elem_off[lane] / 2, b = w % 32;
        if (word_of_bank[b] >= 0 && word_of_bank[b] != w) return false;
        word_of_bank[b] = w;
    }
    return true;
}

static int rnd_small(uint64_t *s) {
    return (int)(test_rand_u64(s) % 7) - 3;
}

/* One warp's tile through the kernel's formulas: 16 query rows (warp 1 of the block, so the row
 * offset is exercised), KT keys, head dim D. */
static void check_tile(int D, int KT) {
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)(D * 131 + KT);
    const int ROWS = 64, warp = 1;
    double *Q = malloc(sizeof(double) * ROWS * D), *K = malloc(sizeof(double) * KT * D);
    double *V = malloc(sizeof(double) * KT * D);
    for (int i = 0; i < ROWS * D; i++) Q[i] = rnd_small(&rng);
    for (int i = 0; i < KT * D; i++) K[i] = rnd_small(&rng), V[i] = rnd_small(&rng);
    /* shared memory as the kernel stages it (NaN in the padding: must never be read) */
    int nq = ROWS * (D + FA_PAD), nk = KT * (D + FA_PAD), nv = D * (KT + FA_PAD);
    double *Qs = malloc(sizeof(double) * nq), *Ks = malloc(sizeof(double) * nk);
    double *Vt = malloc(sizeof(double) * nv);
    for (int i = 0; i < nq; i++) Qs[i] = NAN;
    for (int i = 0; i < nk; i++) Ks[i] = NAN;
    for (int i = 0; i < nv; i++) Vt[i] = NAN;
    for (int i = 0; i < ROWS * (D / 4); i++) { /* the kernel's Q loop: 4 dims per step */
        int r = i / (D / 4), d = (i - r * (D / 4)) * 4;
        for (int e = 0; e < 4; e++) Qs[fa_qs_off(D, r, d) + e] = Q[r * D + d + e];
    }
    for (int i = 0; i < KT * (D / 8); i++) { /* K: 8 dims of one key per step */
        int j = i / (D / 8), d = (i - j * (D / 8)) * 8;
        CHECK(fa_ks_off(D, j, d) % 8 == 0); /* uint4 store alignment */
        for (int e = 0; e < 8; e++) Ks[fa_ks_off(D, j, d) + e] = K[j * D + d + e];
    }
    for (int i = 0; i < KT * (D / 8); i++) { /* V transposed: keys fastest */
        int d = (i / KT) * 8, j = i % KT;
        for (int e = 0; e < 8; e++) Vt[fa_vt_off(KT, j, d + e)] = V[j * D + d + e];
    }

    /* S = Q K^T */
    double(*s)[KT / 8][4] = calloc(32, sizeof *s); /* s[lane][nb][i] */
    bool banks_ok = true;
    for (int kk = 0; kk < D / 16; kk++) {
        double a[32][4][2];
        for (int r = 0; r < 4; r++) {
            int off[32];
            for (int lane = 0; lane < 32; lane++) {
                off[lane] = fa_q_frag(D, warp * 16, kk, lane, r);
                a[lane][r][0] = Qs[off[lane]], a[lane][r][1] = Qs[off[lane] + 1];
            }
            banks_ok = banks_ok && conflict_free(off);
        }
        for (int nb = 0; nb < KT / 8; nb++) {
            double b[32][2][2], d[32][4];
            for (int r = 0; r < 2; r++) {
                int off[32];
                for (int lane = 0; lane < 32; lane++) {
                    off[lane] = fa_k_frag(D, nb, kk, lane, r);
                    b[lane][r][0] = Ks[off[lane]], b[lane][r][1] = Ks[off[lane] + 1];
                }
                banks_ok = banks_ok && conflict_free(off);
            }
            for (int lane = 0; lane < 32; lane++)
                for (int i = 0; i < 4; i++) d[lane][i] = s[lane][nb][i];
            model_mma(d, a, b);
            for (int lane = 0; lane < 32; lane++)
                for (int i = 0; i < 4; i++) s[lane][nb][i] = d[lane][i];
        }
    }
    int bad_s = 0;
    for (int lane = 0; lane < 32; lane++)
        for (int nb = 0; nb < KT / 8; nb++)
            for (int i = 0; i < 4; i++) {
                int r = warp * 16 + fa_c_row(lane, i), j = 8 * nb + fa_c_col(lane, i);
                double ref = 0;
                for (int d = 0; d < D; d++) ref += Q[r * D + d] * K[j * D + d];
                if (s[lane][nb][i] != ref) bad_s++;
            }
    CHECK_MSG(bad_s == 0, "S = Q K^T: D=%d KT=%d, %d wrong elements", D, KT, bad_s);

    /* O = S V through the P repacking (P = S here: no softmax, exact) */
    double(*o)[D / 8][4] = calloc(32, sizeof *o);
    for (int kk = 0; kk < KT / 16; kk++) {
        double a[32][4][2];
        for (int lane = 0; lane < 32; lane++)
            for (int r = 0; r < 4; r++) {
                a[lane][r][0] = s[lane][fa_p_nb(kk, r)][fa_p_c(r)];
                a[lane][r][1] = s[lane][fa_p_nb(kk, r)][fa_p_c(r) + 1];
            }
        for (int db = 0; db < D / 8; db++) {
            double b[32][2][2], d[32][4];
            for (int r = 0; r < 2; r++) {
                int off[32];
                for (int lane = 0; lane < 32; lane++) {
                    off[lane] = fa_v_frag(KT, db, kk, lane, r);
                    b[lane][r][0] = Vt[off[lane]], b[lane][r][1] = Vt[off[lane] + 1];
                }
                banks_ok = banks_ok && conflict_free(off);
            }
            for (int lane = 0; lane < 32; lane++)
                for (int i = 0; i < 4; i++) d[lane][i] = o[lane][db][i];
            model_mma(d, a, b);
            for (int lane = 0; lane < 32; lane++)
                for (int i = 0; i < 4; i++) o[lane][db][i] = d[lane][i];
        }
    }
    /* the kernel's output loop: rows g (h = 0) and g + 8 (h = 1), dims 8db + 2t, + 1 */
    double *out = malloc(sizeof(double) * 16 * D);
    for (int i = 0; i < 16 * D; i++) out[i] = NAN;
    for (int lane = 0; lane < 32; lane++)
        for (int h = 0; h < 2; h++) {
            int row = fa_c_row(lane, 2 * h);
            for (int db = 0; db < D / 8; db++) {
                int d = 8 * db + fa_c_col(lane, 2 * h);
                out[row * D + d] = o[lane][db][2 * h];
                out[row * D + d + 1] = o[lane][db][2 * h + 1];
            }
        }
    int bad_o = 0;
    for (int r = 0; r < 16; r++)
        for (int d = 0; d < D; d++) {
            double ref = 0;
            for (int j = 0; j < KT; j++) {
                double sj = 0;
                for (int e = 0; e < D; e++) sj += Q[(warp * 16 + r) * D + e] * K[j * D + e];
                ref += sj * V[j * D + d];
            }
            if (!(out[r * D + d] == ref)) bad_o++;
        }
    CHECK_MSG(bad_o == 0, "O = S V: D=%d KT=%d, %d wrong elements", D, KT, bad_o);
    CHECK_MSG(banks_ok, "fragment loads with bank conflicts: D=%d KT=%d", D, KT);
    free(Q), free(K), free(V), free(Qs), free(Ks), free(Vt), free(s), free(o), free(out);
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 from the PTX ISA: lanes 8i..8i+7 address the
 * rows of matrix i; lane gets in register i the elements (groupID, 2 * tig + {0, 1}) of matrix i,
 * of its transpose with .trans. Also checks that each matrix's 8 rows (16 bytes each) fall into
 * distinct banks. */
static bool model_ldsm(const double *mem, const int addr[32], bool trans, double reg[32][4][2]) {
    bool banks_ok = true;
    for (int i = 0; i < 4; i++) {
        int used[32] = {0};
        for (int r = 0; r < 8; r++) {
            if (addr[8 * i + r] % 8) banks_ok = false; /* 16-byte aligned rows */
            for (int w = 0; w < 4; w++) used[(addr[8 * i + r] / 2 + w) % 32]++;
        }
        for (int b = 0; b < 32; b++) banks_ok = banks_ok && used[b] == 1;
        for (int lane = 0; lane < 32; lane++) {
            int gid = lane >> 2, tig = lane & 3;
            for (int e = 0; e < 2; e++) {
                int row = trans ? 2 * tig + e : gid, col = trans ? gid : 2 * tig + e;
                reg[lane][i][e] = mem[addr[8 * i + row] + col];
            }
        }
    }
    return banks_ok;
}

/* The fast kernel's ldmatrix addresses give the same fragments as the per-register loads checked
 * by check_tile (Q, K as there; V key-major like K, through .trans). */
static void check_ldsm(int D, int KT) {
    uint64_t rng = 77 + (uint64_t)D;
    int nq = 64 * (D + FA_PAD), nk = KT * (D + FA_PAD);
    double *Qs = malloc(sizeof(double) * nq), *Ks = malloc(sizeof(double) * nk);
    double *Vs = malloc(sizeof(double) * nk);
    for (int i = 0; i < nq; i++) Qs[i] = (double)(test_rand_u64(&rng) % 100000);
    for (int i = 0; i < nk; i++) Ks[i] = (double)(test_rand_u64(&rng) % 100000);
    for (int i = 0; i < nk; i++) Vs[i] = (double)(test_rand_u64(&rng) % 100000);
    int bad = 0;
    bool banks_ok = true;
    double reg[32][4][2];
    int addr[32];
    const int qrow0 = 32; /* warp 2 */
    for (int kk = 0; kk < D / 16; kk++) {
        for (int lane = 0; lane < 32; lane++)
            addr[lane] = fa_qs_off(D, qrow0 + fa_ldsm_q_row(lane), 16 * kk + fa_ldsm_q_col(lane));
        banks_ok = model_ldsm(Qs, addr, false, reg) && banks_ok;
        for (int lane = 0; lane < 32; lane++)
            for (int r = 0; r < 4; r++) {
                int off = fa_q_frag(D, qrow0, kk, lane, r);
                bad += reg[lane][r][0] != Qs[off] || reg[lane][r][1] != Qs[off + 1];
            }
        for (int nb = 0; nb < KT / 8; nb += 2) {
            for (int lane = 0; lane < 32; lane++)
                addr[lane] =
                    fa_ks_off(D, 8 * nb + fa_ldsm_k_key(lane), 16 * kk + fa_ldsm_k_dim(lane));
            banks_ok = model_ldsm(Ks, addr, false, reg) && banks_ok;
            for (int lane = 0; lane < 32; lane++)
                for (int r = 0; r < 4; r++) {
                    int off = fa_k_frag(D, nb + r / 2, kk, lane, r % 2);
                    bad += reg[lane][r][0] != Ks[off] || reg[lane][r][1] != Ks[off + 1];
                }
        }
    }
    for (int kk = 0; kk < KT / 16; kk++)
        for (int db = 0; db < D / 8; db += 2) {
            for (int lane = 0; lane < 32; lane++)
                addr[lane] =
                    fa_ks_off(D, 16 * kk + fa_ldsm_v_key(lane), 8 * db + fa_ldsm_v_dim(lane));
            banks_ok = model_ldsm(Vs, addr, true, reg) && banks_ok;
            for (int lane = 0; lane < 32; lane++)
                for (int r = 0; r < 4; r++) {
                    /* B of dim block db + r / 2, register r % 2: V[key][dim], V[key + 1][dim] */
                    int key = 16 * kk + fa_b_k(lane, r % 2), dim = 8 * (db + r / 2) + fa_b_n(lane);
                    bad += reg[lane][r][0] != Vs[fa_ks_off(D, key, dim)] ||
                           reg[lane][r][1] != Vs[fa_ks_off(D, key + 1, dim)];
                }
        }
    CHECK_MSG(bad == 0, "ldmatrix fragments: D=%d KT=%d, %d wrong registers", D, KT, bad);
    CHECK_MSG(banks_ok, "ldmatrix bank conflicts: D=%d KT=%d", D, KT);
    free(Qs), free(Ks), free(Vs);
}

/* fa_rows_keys against brute force over the rows' visible keys. */
static void check_ranges(void) {
    uint64_t rng = 42;
    for (int it = 0; it < 20000; it++) {
        int G = 1 + (int)(test_rand_u64(&rng) % 8), n = 1 + (int)(test_rand_u64(&rng) % 300);
        int pos0 = (int)(test_rand_u64(&rng) % 3) == 0 ? 0 : (int)(test_rand_u64(&rng) % 100);
        int window = (int)(test_rand_u64(&rng) % 3) == 0 ? 0 : 1 + (int)(test_rand_u64(&rng) % 90);
        int rows_total = n * G, nrows = test_rand_u64(&rng) % 2 ? 16 : 64;
        int row0 = (int)(test_rand_u64(&rng) % (uint64_t)rows_total);
        int k0, k1, all_lo, all_hi;
        fa_rows_keys(pos0, G, window, rows_total, row0, nrows, &k0, &k1, &all_lo, &all_hi);
        int last = row0 + nrows < rows_total ? row0 + nrows : rows_total;
        bool ok = true;
        for (int key = -2; key < pos0 + n + 2 && ok; key++) {
            int some = 0, every = 1;
            for (int r = row0; r < last; r++) {
                int p = pos0 + r / G;
                bool vis = key >= 0 && key <= p && (window == 0 || key > p - window);
                some |= vis, every &= vis;
                /* the per-row bounds the kernel masks with */
                ok = ok && (vis ==
                            (key >= fa_row_lo(pos0, G, window, r) && key <= fa_row_hi(pos0, G, r)));
            }
            ok = ok && (some == (key >= k0 && key < k1)) &&
                 (every == (key >= all_lo && key <= all_hi));
        }
        CHECK_MSG(ok, "key ranges: G=%d n=%d pos0=%d window=%d row0=%d nrows=%d", G, n, pos0,
                  window, row0, nrows);
        if (!ok) break;
    }
}

int main(void) {
    const int dims[] = {64, 80, 96, 128, 256};
    for (int i = 0; i < 5; i++) {
        check_tile(dims[i], 64);
        check_tile(dims[i], 32);
        check_ldsm(dims[i], 64);
        check_ldsm(dims[i], 32);
    }
    check_ranges();
    return test_finish();
}
