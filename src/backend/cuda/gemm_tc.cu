/* gemm_tc.cu — y[n, rows] = x[n, cols] @ W^T (+ bias) on tensor cores (mma.sync m16n8k16, f32
 * accumulators) in the backend's precise numerics, for MLX affine 4/8-bit W (group 32/64/128,
 * f16/bf16/f32 scales) and dense bf16 W: prefill, batched decode, and the fused ops' matmuls.
 *
 * Operands. W [rows, cols] is the A operand as stored (row major, read from memory once per call);
 * x is the B operand, converted once per call by k_tc_prep into two 16-bit halves, x = hi + lo:
 *  - quantized W: the MMA runs on the raw codes q (0..255, exact in f16) against x in f16, scaled
 *    per token by a power of two sigma so that max|x| * sigma < 2^15 (hi = f16(x sigma), lo =
 *    f16(x sigma - hi): ~22 bits of x, no overflow). Each quantization group accumulates into its
 *    own f32 fragment acc_g = sum q (x_hi + x_lo) (two MMAs), folded in at the group's end:
 *    acc += scale[r, g] * acc_g + bias[r, g] * xsum[t, g] (xsum: the f32 sum of x sigma over the
 *    group, from k_tc_prep), and y = acc / sigma. Codes become f16 pairs with integer tricks: a
 *    byte or nibble is or-ed under the exponent of 1024 (0x6400) and 1024 subtracted (exact).
 *  - bf16 W: exact as stored; x in bf16 hi + lo (~16 bits, as the cuBLAS split path), both MMAs
 *    into one accumulator.
 *  Fast mode (--fast-math; ONE kernels): the hi product only (x to 11 bits against codes, 8
 *  against bf16 W, as the fast cuBLAS path), so half the MMAs and x copies; the fold's x sums
 *  stay the f32 ones.
 *
 * k order. Within a step of 16 columns the MMA sums over k in any order, so each thread's A and B
 * fragments may map to whichever columns, as long as A and B agree: a thread (g = lane/4, t =
 * lane%4) takes, in a span of SS steps (16*SS columns, one quantization group or 64 columns),
 * the 4*SS contiguous columns [4*SS*t, 4*SS*(t+1)); its registers for step s are columns 4s..4s+3
 * of that run (A regs 0/1: run columns 4s, 4s+1; regs 2/3: 4s+2, 4s+3; B likewise). So a thread
 * reads contiguous bytes of W and x from shared memory (no ldmatrix), and each step stays inside
 * one group. 4-bit words give code pairs (j, j+4) (nibble masks 0x000F000F / 0x00F000F0), so
 * k_tc_prep stores x's 8-column runs as columns 0,4,1,5,2,6,3,7 for 4-bit weights.
 *
 * Tiles. A block of 8 warps owns 128 rows x BN tokens (BN = 8, 16, 64, 128) and walks the columns
 * in chunks of 64 through a STAGES-deep cp.async pipeline (W tile, x hi/lo tile); warps split the
 * tile WM x WN. Split-K (grid z) when row x token tiles leave SMs idle: each split writes f32
 * partials and k_tc_reduce sums them in a fixed order (deterministic), then scales, adds bias (and
 * y for matmul_add). Several matrices sharing x (q/k/v, gate/up) go in one launch: block x picks
 * the matrix from a table in the kernel parameters.
 *
 * tests/emu/tc_gemm_emulate.cc compiles this file on the CPU (TC_HOST_EMU) with emulated warps. */
#ifndef TC_HOST_EMU
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/gemm_tc.cuh"
#include "backend/cuda/quant.cuh"

#include <stdlib.h>
#include <string.h>
#endif

#define TC_BM      128 /* rows per block */
#define TC_BK      64  /* columns per pipeline stage */
#define TC_THREADS 256 /* 8 warps */
#define TC_MATS    4   /* matrices per launch */

enum { TC_Q4 = 4, TC_Q8 = 8, TC_BF16 = 16 };

struct tc_mat {
    const void *w;              /* codes [rows, cols*bits/32] u32 or bf16 [rows, cols] */
    const void *scales, *qbias; /* quantized: scales / biases [rows, cols/group] */
    const float *obias;         /* output bias [rows] or NULL */
    float *y;                   /* [n, rows] */
    int rows, first;            /* rows; first row tile (block x) of this matrix */
    int roff;                   /* first row of this matrix in the partials' rows */
    int64_t wrow;               /* expert mode: first row of the matrix in an expert's rows */
};

struct tc_args {
    tc_mat m[TC_MATS];
    int count;
    const uint16_t *xh, *xl; /* [n_pad, cols_pad] 16-bit halves of x (4-bit: runs permuted) */
    const int8_t *xd;        /* int8 variant: digits [n_pad, cols_pad / 64, DIG, 64] */
    const float *xe;         /* int8 variant: [n_pad, cols_pad / group] steps E of the digits */
    const float *xsum;       /* quantized: [n_pad, cols_pad / group] sums of x * sigma */
    const float *inv_sigma;  /* [n_pad] 1 / sigma (1 for bf16) */
    float *part;             /* split-K: [splits, n, rows_total] partial sums, else NULL */
    /* split-K summed in the kernel (tc_reduce_last): [row tiles * token tiles] arrival
     * counters, zero between launches; NULL: k_tc_reduce sums the partials */
    unsigned *counters;
    int n, cols, cols_pad, group, sdt, chunks_per_split, rows_total, add, splits;
    /* Expert mode (grouped MoE; NULL otherwise): x's rows are (token, expert) pairs sorted by
     * expert and block y is token tile etiles[y] = {expert e, first row, end row, 0} of x (e < 0:
     * no tile); the block reads rows e * estride + m.wrow + r of each stack. out_row (or NULL: y
     * in x's row order) is the y row of each x row. No split-K. */
    const int32_t *etiles;
    const int32_t *out_row;
    int64_t estride;
};

struct tc_prep_args {
    const float *x;          /* [n, cols] */
    uint16_t *xh, *xl;       /* [n_pad, cols_pad] */
    int8_t *xd;              /* int8 variant: digits [n_pad, cols_pad / 64, DIG, 64] */
    float *xe;               /* int8 variant: [n_pad, cols_pad / group] */
    float *xsum, *inv_sigma; /* [n_pad, cols_pad / group], [n_pad] */
    const float *norm_w;     /* RMSNorm weight [cols], or NULL: weight 1 */
    const int32_t *rows;     /* or NULL: row tok of the buffers is x row rows[tok] / x_div */
    int64_t x_div;
    int n, cols, cols_pad, group; /* group: quantized only */
    float eps;
    int norm, plus_one; /* norm: x is RMS-normalized first (with or without a weight) */
};

/* ---- device primitives (the emulator supplies its own) ---- */
#ifndef TC_HOST_EMU
/* d += a b, m16n8k16, f32 accumulators; F16: f16 inputs, else bf16 */
template <bool F16>
__device__ __forceinline__ void tc_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
    if (F16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* 16 bytes global -> shared without registers; src_bytes 0 writes zeros */
__device__ __forceinline__ void tc_cp16(void *smem, const void *gmem, int src_bytes) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa), "l"(gmem),
                 "r"(src_bytes));
}
__device__ __forceinline__ void tc_cp_commit() {
    asm volatile("cp.async.commit_group;");
}
template <int N> __device__ __forceinline__ void tc_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}
__device__ __forceinline__ uint32_t tc_prmt(uint32_t a, uint32_t b, uint32_t sel) {
    return __byte_perm(a, b, sel);
}
__device__ __forceinline__ uint32_t tc_hsub2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ uint32_t tc_hfma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
/* v = hi + lo in 16-bit halves (f16 or bf16), hi = round(v), lo = round(v - hi) */
template <bool F16>
__device__ __forceinline__ void tc_split16(float v, uint16_t *hi, uint16_t *lo) {
    if (F16) {
        const __half h = __float2half_rn(v);
        *hi = __half_as_ushort(h);
        *lo = __half_as_ushort(__float2half_rn(v - __half2float(h)));
    } else {
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        *hi = __bfloat16_as_ushort(h);
        *lo = __bfloat16_as_ushort(__float2bfloat16_rn(v - __bfloat162float(h)));
    }
}
__device__ __forceinline__ float tc_load_scale(const void *p, int64_t i, int dt) {
    return kcu_load(p, i, dt);
}
/* f16 pair (v, v) */
__device__ __forceinline__ uint32_t tc_f2h2(float v) {
    const uint32_t h = __half_as_ushort(__float2half_rn(v));
    return h | h << 16;
}
#endif

/* ---- the GEMM kernel ---- */

/* Shared-memory row strides (bytes) of the W tile (128 rows of 64 columns) and the x tile (BN
 * tokens of 64 hi + 64 lo values): chosen so the fragment loads below meet no bank conflicts
 * (16-byte loads are served 8 lanes at a time = 2 rows x 4 threads; 8-byte 16 lanes = 4 rows;
 * 4-byte all 32 = 8 rows), and multiples of 16 for cp.async. */
template <int MODE, int SS> struct tc_geom {
    static constexpr bool QUANT = MODE != TC_BF16;
    static constexpr int BITS = MODE;             /* 4, 8, 16 */
    static constexpr int WROW = TC_BK * BITS / 8; /* bytes of a W tile row */
    static constexpr int TB = 4 * SS * BITS / 8;  /* W bytes of a thread's run (a span) */
    static constexpr int WS = MODE == TC_Q4   ? (SS == 2 ? 48 : 32)
                              : MODE == TC_Q8 ? (SS == 2 ? 96 : 64)
                                              : 144;
    static constexpr int XS = SS == 2 ? 320 : 272;
    static constexpr int SPANS = 4 / SS; /* spans per chunk */
};

template <int MODE, int SS, int BN, int STAGES> struct tc_layout {
    static constexpr int W = TC_BM * tc_geom<MODE, SS>::WS;
    static constexpr int X = BN * tc_geom<MODE, SS>::XS;
    static constexpr int STAGE = W + X;
    static constexpr size_t bytes = (size_t)STAGES * STAGE;
};

/* f16 pair (code j, code j+4) of a 4-bit word: k = 0..3 -> codes (0,4), (1,5), (2,6), (3,7);
 * w8 = word >> 8 */
template <int K> __device__ __forceinline__ uint32_t tc_nib2(uint32_t w, uint32_t w8) {
    const uint32_t src = K < 2 ? w : w8;
    if (K % 2 == 0) /* 1024 + q -> q */
        return tc_hsub2((src & 0x000F000Fu) | 0x64006400u, 0x64006400u);
    /* 1024 + 16 q -> (1024 + 16 q) / 16 - 64 = q */
    return tc_hfma2((src & 0x00F000F0u) | 0x64006400u, 0x2C002C00u, 0xD400D400u);
}
/* f16 pair (byte 2h, byte 2h+1) of an 8-bit word */
template <int H> __device__ __forceinline__ uint32_t tc_byte2(uint32_t w) {
    return tc_hsub2(tc_prmt(w, 0x64646464u, H ? 0x4342u : 0x4140u), 0x64006400u);
}

extern __shared__ uint4 tc_sm_raw[];

/* ---- what the f16 kernel and the int8 variant (gemm_tc_int8.cuh) share ---- */

/* A block's matrix (block x picks it from the table), its first row (wrow0: in the stored
 * matrix), its tokens [tok0, tok_end) and its chunks [kc0, kc0 + nk) of 64 columns (split-K: grid
 * z). Expert mode: the token tile etiles[block y] (a block with none has tok0 == tok_end). */
struct tc_block {
    const tc_mat *M;
    int rows, row0, tok0, tok_end, kc0, nk;
    int64_t wrow0;
};
__device__ __forceinline__ tc_block tc_block_of(const tc_args &A, int bn) {
    int mi = 0;
    while (mi + 1 < A.count && (int)blockIdx.x >= A.m[mi + 1].first) mi++;
    tc_block b;
    b.M = &A.m[mi];
    b.rows = b.M->rows;
    b.row0 = ((int)blockIdx.x - b.M->first) * TC_BM;
    b.tok0 = (int)blockIdx.y * bn;
    b.tok_end = A.n;
    b.wrow0 = b.row0;
    if (A.etiles) { /* written by the kernel before (k_moe_group) */
        kcu_pdl_wait();
        const int32_t *et = A.etiles + 4 * (int64_t)blockIdx.y;
        const int e = kcu_ld(et);
        b.tok0 = kcu_ld(et + 1);
        b.tok_end = e < 0 ? b.tok0 : kcu_ld(et + 2);
        b.wrow0 = (int64_t)(e < 0 ? 0 : e) * A.estride + b.M->wrow + b.row0;
    }
    const int nchunks = A.cols_pad / TC_BK;
    b.kc0 = (int)blockIdx.z * A.chunks_per_split;
    const int kc1 = b.kc0 + A.chunks_per_split < nchunks ? b.kc0 + A.chunks_per_split : nchunks;
    b.nk = kc1 - b.kc0;
    return b;
}

/* W tile (128 rows) of chunk kc into dst: 16-byte pieces, rows / columns past the matrix zero */
template <int MODE, int SS>
__device__ __forceinline__ void tc_issue_w(char *dst, const tc_block &B, int cols, int kc) {
    using G = tc_geom<MODE, SS>;
    constexpr int SEGS = G::WROW / 16;
    const int64_t row_bytes = (int64_t)cols * G::BITS / 8;
    const char *wbase = (const char *)B.M->w;
    for (int i = threadIdx.x; i < TC_BM * SEGS; i += TC_THREADS) {
        const int r = i / SEGS, sg = i % SEGS;
        const int gcol = kc * TC_BK + sg * (128 / G::BITS);
        const bool ok = B.row0 + r < B.rows && gcol < cols;
        const char *src =
            wbase + (ok ? (B.wrow0 + r) * row_bytes + (int64_t)gcol * G::BITS / 8 : 0);
        tc_cp16(dst + r * G::WS + sg * 16, src, ok ? 16 : 0);
    }
}

/* The cp.async pipeline over a block's nk chunks (STAGES slots), given issue_w / issue_x (kc,
 * slot) for the W and x tiles. Start: weights are written by no kernel, so their first stages
 * load before waiting for the kernel before (programmatic dependent launch); one commit group per
 * stage, W of every prologue stage in the first. */
template <int STAGES, typename IW, typename IX>
__device__ __forceinline__ void tc_pipeline_start(int kc0, int nk, IW &issue_w, IX &issue_x) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++)
        if (s < nk) issue_w(kc0 + s, s);
    kcu_pdl_wait();
    kcu_pdl_trigger();
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nk) issue_x(kc0 + s, s);
        tc_cp_commit();
    }
}
/* Chunk it's turn: its copies have landed (everyone's: the barrier, which also frees chunk
 * it-1's slot), and chunk it + STAGES - 1 is issued into that slot. */
template <int STAGES, typename IW, typename IX>
__device__ __forceinline__ void tc_pipeline_next(int it, int kc0, int nk, IW &issue_w,
                                                 IX &issue_x) {
    tc_cp_wait<STAGES - 2>();
    __syncthreads();
    const int j = it + STAGES - 1;
    if (j < nk) {
        issue_w(kc0 + j, j % STAGES);
        issue_x(kc0 + j, j % STAGES);
    }
    tc_cp_commit();
}

/* Scales and biases of group gi for the thread's rows (g, g + 8 of each m tile; 0 past the
 * matrix), loaded at a span's start for the fold at its end */
template <int MT>
__device__ __forceinline__ void tc_group_scales(float (&fs)[MT][2], float (&fb)[MT][2],
                                                const tc_args &A, const tc_block &B, int mrow,
                                                int g, int gi) {
    const int gpr = A.cols / A.group;
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = mrow + 16 * mi + g + 8 * h;
            const bool ok = B.row0 + r < B.rows && gi < gpr;
            const int64_t k = (B.wrow0 + r) * gpr + gi;
            fs[mi][h] = ok ? tc_load_scale(B.M->scales, k, A.sdt) : 0.0f;
            fb[mi][h] = ok ? tc_load_scale(B.M->qbias, k, A.sdt) : 0.0f;
        }
}

/* Per-token values of group gi (v[ni][h] = src[token, gi], the thread's tokens 2t + h of each n
 * tile; src rows of cols_pad / group): x's group sums, the int8 variant's steps E */
template <int NT>
__device__ __forceinline__ void tc_token_groups(float (&v)[NT][2], const float *src,
                                                const tc_args &A, int tok, int t, int gi) {
    const int stride = A.cols_pad / A.group;
#pragma unroll
    for (int ni = 0; ni < NT; ni++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            v[ni][h] = src[(int64_t)(tok + 8 * ni + 2 * t + h) * stride + gi];
}

/* The codes of the thread's run (a span) for both rows of every m tile, from the W tile */
template <int MODE, int SS, int MT, int AW>
__device__ __forceinline__ void tc_load_codes(uint32_t (&araw)[MT][2][AW], const char *Ws, int mrow,
                                              int g, int run) {
    using G = tc_geom<MODE, SS>;
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const char *p = Ws + (mrow + 16 * mi + g + 8 * h) * G::WS + run * G::BITS / 8;
            if constexpr (AW == 1) {
                araw[mi][h][0] = *(const uint32_t *)p;
            } else if constexpr (AW == 2) {
                const uint2 v = *(const uint2 *)p;
                araw[mi][h][0] = v.x, araw[mi][h][1] = v.y;
            } else {
                const uint4 v = *(const uint4 *)p;
                araw[mi][h][0] = v.x, araw[mi][h][1] = v.y;
                araw[mi][h][2] = v.z, araw[mi][h][3] = v.w;
            }
        }
}

/* C fragments out: element i of tile (mi, ni) is row g (+8 for i >= 2), token 2t + (i & 1);
 * split-K partials as they are, else y = acc / sigma + bias (+ y) */
template <int MT, int NT>
__device__ __forceinline__ void tc_store(const tc_args &A, const tc_block &B,
                                         const float (&acc)[MT][NT][4], int mrow, int ntok, int g,
                                         int t) {
    const tc_mat &M = *B.M;
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = B.row0 + mrow + 16 * mi + g + (i >> 1) * 8;
                const int tk = B.tok0 + ntok + 8 * ni + 2 * t + (i & 1);
                if (r >= B.rows || tk >= B.tok_end) continue;
                const float v = acc[mi][ni][i];
                if (A.part) {
                    A.part[((int64_t)blockIdx.z * A.n + tk) * A.rows_total + M.roff + r] = v;
                } else {
                    const int64_t wr = B.wrow0 - B.row0 + r,
                                  yr = A.out_row ? kcu_ld(A.out_row + tk) : tk;
                    float o = v * A.inv_sigma[tk] + (M.obias ? M.obias[wr] : 0.0f);
                    float *yp = M.y + yr * B.rows + r;
                    if (A.add) o += *yp;
                    *yp = o;
                }
            }
}

/* Split-K summed in the kernel (A.counters): after its partials, each block counts itself in;
 * the last split of this (row tile, token tile) to arrive sums the tile's partials in split
 * order and writes y as k_tc_reduce does (the same operations, so the same bits), then sets the
 * count back to zero. One launch where k_tc_reduce took a second (~4 us at 8 tokens). */
__device__ __forceinline__ void tc_reduce_last(const tc_args &A, const tc_block &B, int bn) {
    if (!A.part || !A.counters) return;
    int *last = (int *)tc_sm_raw;
    __threadfence();
    __syncthreads(); /* every partial of the block written; the pipeline's shared memory free */
    if (threadIdx.x == 0) {
        unsigned *c = A.counters + (int64_t)blockIdx.y * gridDim.x + blockIdx.x;
        *last = atomicAdd(c, 1u) == (unsigned)A.splits - 1;
        if (*last) *c = 0;
    }
    __syncthreads();
    if (!*last) return;
    __threadfence();
    const tc_mat &M = *B.M;
    for (int i = threadIdx.x; i < TC_BM * bn; i += blockDim.x) {
        const int tk = B.tok0 + i / TC_BM, r = B.row0 + i % TC_BM;
        if (r >= B.rows || tk >= A.n) continue;
        float s = 0.0f;
        for (int k = 0; k < A.splits; k++)
            s += __ldcg(A.part + ((int64_t)k * A.n + tk) * A.rows_total + M.roff + r);
        float o = s * A.inv_sigma[tk] + (M.obias ? M.obias[r] : 0.0f);
        float *yp = M.y + (int64_t)tk * B.rows + r;
        if (A.add) o += *yp;
        *yp = o;
    }
}

/* The lean main loop's per-thread copy state (LEAN kernels): what a chunk's W and x copies need
 * that does not change over the call, worked out once, so that a chunk costs its MMAs, fragment
 * loads and conversions plus a few adds (the loop that recomputed it per chunk, with divisions
 * and a dtype branch per scale load, ran ~1100 PTX instructions per 64 MMAs of a warp at 64
 * tokens: issue-bound, not tensor-bound).
 * A thread's W pieces are i = tid + 256 k: row tid / SEGS + k * (256 / SEGS), segment tid % SEGS
 * (the same for every k); its x pieces likewise token tid / 16 + 16 k, segment tid % 16. */
template <int MODE, int SS, int BN, bool ONE = false> struct tc_lean {
    using G = tc_geom<MODE, SS>;
    static constexpr int SEGS = G::WROW / 16;             /* 16-byte W pieces a row */
    static constexpr int RSTEP = TC_THREADS / SEGS;       /* rows between a thread's pieces */
    static constexpr int WPT = TC_BM * SEGS / TC_THREADS; /* W pieces a thread: 1, 2, 4 */
    static constexpr int XPT = (BN * 16 + TC_THREADS - 1) / TC_THREADS; /* x pieces: 1, 4, 8 */
    const char *w;     /* this thread's first W piece in chunk 0 (a valid address) */
    const char *wbase; /* any valid W address (for pieces past the matrix: 0 bytes read) */
    int64_t row_bytes; /* of W */
    int wrow, wcol;    /* first piece's row in the tile, its first column in a chunk */
    int rows_left;     /* rows of the matrix from the tile's first */
    int wdst;          /* first piece's byte offset in a stage */
    const char *x;     /* this thread's first x piece in chunk 0 (hi or lo buffer) */
    int64_t x_kstep;   /* bytes between a thread's x pieces (16 tokens) */
    int xdst;          /* first piece's byte offset in the x part of a stage */
    bool xok;          /* BN = 8: half the threads copy no x; ONE: the lo half's threads none */

    __device__ __forceinline__ void init(const tc_args &A, const tc_block &B, int tid) {
        row_bytes = (int64_t)A.cols * G::BITS / 8;
        wbase = (const char *)B.M->w;
        wrow = tid / SEGS;
        wcol = (tid % SEGS) * (128 / G::BITS);
        rows_left = B.rows - B.row0;
        w = wbase + (B.wrow0 + (wrow < rows_left ? wrow : 0)) * row_bytes +
            (int64_t)wcol * G::BITS / 8;
        wdst = wrow * G::WS + (tid % SEGS) * 16;
        const int tk = tid / 16, sg = tid % 16;
        xok = tk < BN && (!ONE || sg < 8);
        x = (const char *)((sg < 8 ? A.xh : A.xl) +
                           (int64_t)(B.tok0 + (xok ? tk : 0)) * A.cols_pad + (sg % 8) * 8);
        x_kstep = (int64_t)16 * A.cols_pad * 2;
        xdst = tk * G::XS + sg * 16;
    }
    /* W tile of chunk kc into stage st: rows / columns past the matrix read 0 bytes (zeros) */
    __device__ __forceinline__ void issue_w(char *st, int kc, int cols) const {
        const bool cok = kc * TC_BK + wcol < cols;
#pragma unroll
        for (int k = 0; k < WPT; k++) {
            const bool ok = cok && wrow + k * RSTEP < rows_left;
            const char *src =
                ok ? w + (int64_t)k * RSTEP * row_bytes + (int64_t)kc * G::WROW : wbase;
            tc_cp16(st + wdst + k * RSTEP * G::WS, src, ok ? 16 : 0);
        }
    }
    /* x tile (hi, lo) of chunk kc into the x part of a stage */
    __device__ __forceinline__ void issue_x(char *stx, int kc) const {
        if (!xok) return;
#pragma unroll
        for (int k = 0; k < XPT; k++)
            tc_cp16(stx + xdst + k * 16 * G::XS, x + k * x_kstep + (int64_t)kc * TC_BK * 2, 16);
    }
};

/* The fold's operands of group gi for the thread's rows and tokens (LEAN kernels): scales and
 * biases of rows mrow + 16 mi + g + 8 h, x sums of tokens 2t + h of each n tile; zeros past the
 * matrix or the groups. The dtype branch is taken once per group, not per load. Loaded one group
 * ahead of the fold that uses them. (Keeping them raw until the fold, so no conversion waits on
 * the loads, measured slower: 142 against 117 us at 64 tokens on an H100.) */
template <int MT, int NT>
__device__ __forceinline__ void
tc_fold_operands(float (&fs)[MT][2], float (&fb)[MT][2], float (&fx)[NT][2], const tc_args &A,
                 const tc_block &B, int mrow, int tok, int g, int gpr, int ngp, int gi) {
    const int64_t srow = (B.wrow0 + mrow + g) * gpr + gi;
    const bool gok = gi < gpr;
    if (A.sdt == KILN_DT_F32) {
        const float *sp = (const float *)B.M->scales, *bp = (const float *)B.M->qbias;
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const bool ok = gok && B.row0 + mrow + 16 * mi + g + 8 * h < B.rows;
                const int64_t k = srow + (int64_t)(16 * mi + 8 * h) * gpr;
                fs[mi][h] = ok ? sp[k] : 0.0f;
                fb[mi][h] = ok ? bp[k] : 0.0f;
            }
    } else {
        const uint16_t *sp = (const uint16_t *)B.M->scales, *bp = (const uint16_t *)B.M->qbias;
        const bool bf = A.sdt == KILN_DT_BF16;
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const bool ok = gok && B.row0 + mrow + 16 * mi + g + 8 * h < B.rows;
                const int64_t k = srow + (int64_t)(16 * mi + 8 * h) * gpr;
                const uint16_t sv = ok ? sp[k] : 0, bv = ok ? bp[k] : 0;
                fs[mi][h] = bf ? kcu_bf16(sv) : kcu_f16(sv);
                fb[mi][h] = bf ? kcu_bf16(bv) : kcu_f16(bv);
            }
    }
    const float *xs = A.xsum + (int64_t)tok * ngp + gi;
    const bool xok = gi < ngp; /* the load after a row's last group reads nothing */
#pragma unroll
    for (int ni = 0; ni < NT; ni++)
#pragma unroll
        for (int h = 0; h < 2; h++) fx[ni][h] = xok ? xs[(int64_t)(8 * ni + h) * ngp] : 0.0f;
}

/* Fast mode with W dequantized in registers (DQ kernels): group gi's scales and biases of the
 * thread's rows as f16 pairs (v, v), zeros past the matrix or the groups; loaded one group ahead */
template <int MT>
__device__ __forceinline__ void tc_dq_operands(uint32_t (&s2)[MT][2], uint32_t (&b2)[MT][2],
                                               const tc_args &A, const tc_block &B, int mrow, int g,
                                               int gpr, int gi) {
    const int64_t srow = (B.wrow0 + mrow + g) * gpr + gi;
    const bool gok = gi < gpr;
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const bool ok = gok && B.row0 + mrow + 16 * mi + g + 8 * h < B.rows;
            const int64_t k = srow + (int64_t)(16 * mi + 8 * h) * gpr;
            if (A.sdt == KILN_DT_F16) { /* as stored */
                const uint32_t sv = ok ? ((const uint16_t *)B.M->scales)[k] : 0;
                const uint32_t bv = ok ? ((const uint16_t *)B.M->qbias)[k] : 0;
                s2[mi][h] = sv | sv << 16, b2[mi][h] = bv | bv << 16;
            } else {
                s2[mi][h] = tc_f2h2(ok ? tc_load_scale(B.M->scales, k, A.sdt) : 0.0f);
                b2[mi][h] = tc_f2h2(ok ? tc_load_scale(B.M->qbias, k, A.sdt) : 0.0f);
            }
        }
}

/* The GEMM (one block: 128 rows x BN tokens over its chunks). LEAN: the lean main loop; ONE: fast
 * mode's hi product only; DQ (ONE, codes): W dequantized to f16 in registers instead of the
 * group sums and their fold; TWO: fold operands loaded at a span's start (k_tc_gemm_two's
 * 128-register cap). */
template <int MODE, int SS, int BN, int WM, int WN, int STAGES, bool LEAN, bool ONE, bool DQ,
          bool TWO>
__device__ __forceinline__ void tc_gemm_block(const tc_args &A) {
    using G = tc_geom<MODE, SS>;
    using SM = tc_layout<MODE, SS, BN, STAGES>;
    constexpr bool QUANT = G::QUANT;
    constexpr int MT = TC_BM / 16 / WM; /* m16 tiles per warp */
    constexpr int NT = BN / 8 / WN;     /* n8 tiles per warp */
    static_assert(WM * WN == TC_THREADS / 32 && MT >= 1 && NT >= 1, "warp layout");
    static_assert(SS == 2 || SS == 4, "span");
    static_assert(LEAN || !ONE, "one product: lean loop only");
    static_assert(!DQ || (ONE && QUANT), "W dequantized in registers: fast mode's codes only");

    const tc_block B = tc_block_of(A, BN);
    if (B.tok0 >= B.tok_end) return; /* expert mode: no token tile */
    const int tok0 = B.tok0, kc0 = B.kc0, nk = B.nk;
    char *smem = (char *)tc_sm_raw;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    tc_lean<MODE, SS, BN, ONE> L;
    if constexpr (LEAN) L.init(A, B, tid);
    auto issue_w = [&](int kc, int slot) {
        if constexpr (LEAN)
            L.issue_w(smem + slot * SM::STAGE, kc, A.cols);
        else
            tc_issue_w<MODE, SS>(smem + slot * SM::STAGE, B, A.cols, kc);
    };
    /* x tile (hi, lo) of chunk kc: always inside the padded buffers */
    auto issue_x = [&](int kc, int slot) {
        if constexpr (LEAN) {
            L.issue_x(smem + slot * SM::STAGE + SM::W, kc);
            return;
        }
        char *dst = smem + slot * SM::STAGE + SM::W;
        for (int i = tid; i < BN * 16; i += TC_THREADS) {
            const int tk = i / 16, sg = i % 16;
            const uint16_t *src = (sg < 8 ? A.xh : A.xl) + (int64_t)(tok0 + tk) * A.cols_pad +
                                  kc * TC_BK + (sg % 8) * 8;
            tc_cp16(dst + tk * G::XS + sg * 16, src, 16);
        }
    };

    tc_pipeline_start<STAGES>(kc0, nk, issue_w, issue_x);

    const int wm = warp % WM, wn = warp / WM;
    const int g = lane >> 2, t = lane & 3;
    const int mrow = wm * MT * 16, ntok = wn * NT * 8;

    /* accg: the group's sums (quantized); acc2 (bf16 W, LEAN, up to 8 tiles a warp): the lo
     * products' sums, so a tile's hi and lo MMAs do not wait on each other (bf16 n=64 98.7 ->
     * 94.2 us on an H100; on codes the same measured no faster) */
    constexpr bool SPLITACC = LEAN && !ONE && !QUANT && MT * NT <= 8;
    float acc[MT][NT][4], accg[MT][NT][4], acc2[MT][NT][4];
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mi][ni][i] = accg[mi][ni][i] = acc2[mi][ni][i] = 0.0f;

    /* LEAN: the next fold's operands, loaded one group ahead (right after the fold before) */
    const int glog = QUANT ? __ffs(A.group) - 1 : 0;
    const int gpr = A.cols >> glog, ngp = A.cols_pad >> glog;
    int gnext = (kc0 * TC_BK) >> glog; /* a split starts on a group */
    /* ahead where registers allow (up to 8 tiles a warp: BN <= 64); 128-token blocks, which
     * spilled with the extra 24 registers, load them at the span's start as before */
    constexpr bool AHEAD = MT * NT <= 8 && !TWO;
    float ns[MT][2] = {}, nb[MT][2] = {}, nx[NT][2] = {};
    if constexpr (LEAN && QUANT && AHEAD && !DQ)
        tc_fold_operands<MT, NT>(ns, nb, nx, A, B, mrow, tok0 + ntok + 2 * t, g, gpr, ngp, gnext);
    /* DQ: the current group's f16 scale / bias pairs (cs, cb) and the next's (qs, qb) */
    uint32_t cs[MT][2] = {}, cb[MT][2] = {}, qs[MT][2] = {}, qb[MT][2] = {};
    if constexpr (DQ) {
        tc_dq_operands<MT>(cs, cb, A, B, mrow, g, gpr, gnext);
        tc_dq_operands<MT>(qs, qb, A, B, mrow, g, gpr, gnext + 1);
    }

    for (int it = 0; it < nk; it++) {
        tc_pipeline_next<STAGES>(it, kc0, nk, issue_w, issue_x);
        const char *Ws = smem + (it % STAGES) * SM::STAGE;
        const char *Xs = Ws + SM::W;
        const int c0 = (kc0 + it) * TC_BK;

#pragma unroll
        for (int sp = 0; sp < G::SPANS; sp++) {
            const int run = sp * 16 * SS + t * 4 * SS; /* the thread's first column in the chunk */
            /* the group folded at this span's end (quantized): its scales, biases and x sums are
             * loaded now, before the span's MMAs */
            const int cend = c0 + (sp + 1) * 16 * SS;
            const bool fold = QUANT && (cend & (A.group - 1)) == 0; /* group: a power of 2 */
            float fs[MT][2] = {}, fb[MT][2] = {}, fx[NT][2] = {};
            if (DQ) {
                /* scales are applied to the codes below; the next group's at the fold */
            } else if (LEAN && !AHEAD && fold) {
                tc_fold_operands<MT, NT>(fs, fb, fx, A, B, mrow, tok0 + ntok + 2 * t, g, gpr, ngp,
                                         (cend >> glog) - 1);
            } else if (LEAN && fold) {
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) fs[mi][h] = ns[mi][h], fb[mi][h] = nb[mi][h];
#pragma unroll
                for (int ni = 0; ni < NT; ni++)
#pragma unroll
                    for (int h = 0; h < 2; h++) fx[ni][h] = nx[ni][h];
                gnext++;
                /* issued now, used at the next fold: a group's MMAs cover their latency */
                tc_fold_operands<MT, NT>(ns, nb, nx, A, B, mrow, tok0 + ntok + 2 * t, g, gpr, ngp,
                                         gnext);
            } else if (fold) {
                const int gi = cend / A.group - 1;
                tc_group_scales<MT>(fs, fb, A, B, mrow, g, gi);
                tc_token_groups<NT>(fx, A.xsum, A, tok0 + ntok, t, gi);
            }
            /* quantized A: the thread's run of both its rows of every m tile, for the span */
            constexpr int AW = QUANT ? G::TB / 4 : 1;
            uint32_t araw[MT][2][AW];
            if constexpr (QUANT) tc_load_codes<MODE, SS, MT, AW>(araw, Ws, mrow, g, run);
#pragma unroll
            for (int pr = 0; pr < SS / 2; pr++) { /* pairs of steps: 8 columns of the run */
                uint4 bh[NT], bl[NT];
#pragma unroll
                for (int ni = 0; ni < NT; ni++) {
                    const char *p = Xs + (ntok + 8 * ni + g) * G::XS + (run + 8 * pr) * 2;
                    bh[ni] = *(const uint4 *)p;
                    bl[ni] = ONE ? uint4{} : *(const uint4 *)(p + 128); /* ONE: not copied */
                }
                uint4 ab[MT][2]; /* bf16 A: 8 columns of both rows */
                if constexpr (!QUANT)
#pragma unroll
                    for (int mi = 0; mi < MT; mi++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            ab[mi][h] = *(const uint4 *)(Ws + (mrow + 16 * mi + g + 8 * h) * G::WS +
                                                         (run + 8 * pr) * 2);
#pragma unroll
                for (int st = 0; st < 2; st++) {
                    const int s = 2 * pr + st; /* step in the span (8-bit: word s of the run) */
                    (void)s;
                    uint32_t a[MT][4];
#pragma unroll
                    for (int mi = 0; mi < MT; mi++) {
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            uint32_t lo2, hi2; /* run columns 4s, 4s+1 and 4s+2, 4s+3 */
                            if constexpr (MODE == TC_Q8) {
                                const uint32_t w = araw[mi][h][s];
                                lo2 = tc_byte2<0>(w), hi2 = tc_byte2<1>(w);
                            } else if constexpr (MODE == TC_Q4) {
                                const uint32_t w = araw[mi][h][pr], w8 = w >> 8;
                                if (st == 0)
                                    lo2 = tc_nib2<0>(w, w8), hi2 = tc_nib2<1>(w, w8);
                                else
                                    lo2 = tc_nib2<2>(w, w8), hi2 = tc_nib2<3>(w, w8);
                            } else {
                                const uint4 v = ab[mi][h];
                                lo2 = st == 0 ? v.x : v.z, hi2 = st == 0 ? v.y : v.w;
                            }
                            if constexpr (DQ) /* W = scale q + bias, one f16 rounding */
                                lo2 = tc_hfma2(lo2, cs[mi][h], cb[mi][h]),
                                hi2 = tc_hfma2(hi2, cs[mi][h], cb[mi][h]);
                            a[mi][h] = lo2, a[mi][2 + h] = hi2;
                        }
                    }
#pragma unroll
                    for (int mi = 0; mi < MT; mi++)
#pragma unroll
                        for (int ni = 0; ni < NT; ni++) {
                            const uint32_t h0 = st == 0 ? bh[ni].x : bh[ni].z;
                            const uint32_t h1 = st == 0 ? bh[ni].y : bh[ni].w;
                            const uint32_t l0 = st == 0 ? bl[ni].x : bl[ni].z;
                            const uint32_t l1 = st == 0 ? bl[ni].y : bl[ni].w;
                            if constexpr (LEAN && !QUANT) { /* lo products below */
                                (void)l0, (void)l1;
                                tc_mma<false>(acc[mi][ni], a[mi], h0, h1);
                            } else if constexpr (DQ) {
                                (void)l0, (void)l1;
                                tc_mma<true>(acc[mi][ni], a[mi], h0, h1);
                            } else if constexpr (QUANT) {
                                tc_mma<true>(accg[mi][ni], a[mi], h0, h1);
                                if constexpr (!ONE) tc_mma<true>(accg[mi][ni], a[mi], l0, l1);
                            } else {
                                tc_mma<false>(acc[mi][ni], a[mi], h0, h1);
                                tc_mma<false>(acc[mi][ni], a[mi], l0, l1);
                            }
                        }
                    /* bf16 W, LEAN: the lo products after every hi product of the step, so
                     * dependent MMAs sit MT * NT apart, into their own sums where registers
                     * allow */
                    if constexpr (LEAN && !QUANT && !ONE)
#pragma unroll
                        for (int mi = 0; mi < MT; mi++)
#pragma unroll
                            for (int ni = 0; ni < NT; ni++) {
                                const uint32_t l0 = st == 0 ? bl[ni].x : bl[ni].z;
                                const uint32_t l1 = st == 0 ? bl[ni].y : bl[ni].w;
                                tc_mma<false>(SPLITACC ? acc2[mi][ni] : acc[mi][ni], a[mi], l0, l1);
                            }
                }
            }
            if (DQ && fold) { /* the next group's pairs; the one after it issued */
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) cs[mi][h] = qs[mi][h], cb[mi][h] = qb[mi][h];
                gnext++;
                tc_dq_operands<MT>(qs, qb, A, B, mrow, g, gpr, gnext + 1);
            } else if (fold) {
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int ni = 0; ni < NT; ni++)
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            float &e = accg[mi][ni][i];
                            acc[mi][ni][i] =
                                fmaf(fs[mi][i >> 1], e,
                                     fmaf(fb[mi][i >> 1], fx[ni][i & 1], acc[mi][ni][i]));
                            e = 0.0f;
                        }
            }
        }
    }
    tc_cp_wait<0>(); /* nothing in flight at exit (the trailing groups are empty) */
    if constexpr (SPLITACC)
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int ni = 0; ni < NT; ni++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[mi][ni][i] += acc2[mi][ni][i];
    tc_store<MT, NT>(A, B, acc, mrow, ntok, g, t);
    tc_reduce_last(A, B, BN);
}
template <int MODE, int SS, int BN, int WM, int WN, int STAGES, bool LEAN = true, bool ONE = false,
          bool DQ = false, bool TWO = false>
__global__ void __launch_bounds__(TC_THREADS) k_tc_gemm(const __grid_constant__ tc_args A) {
    tc_gemm_block<MODE, SS, BN, WM, WN, STAGES, LEAN, ONE, DQ, TWO>(A);
}
/* Two blocks a SM (<= 128 registers): the 64-token DQ kernels (123 without the cap) and, as an
 * A/B knob (KILN_CUDA_TC_TWO), exact mode's */
template <int MODE, int SS, int BN, int WM, int WN, int STAGES, bool LEAN, bool ONE, bool DQ,
          bool TWO>
__global__ void __launch_bounds__(TC_THREADS, 2) k_tc_gemm_two(const __grid_constant__ tc_args A) {
    tc_gemm_block<MODE, SS, BN, WM, WN, STAGES, LEAN, ONE, DQ, TWO>(A);
}

/* y = sum over splits of the partials (in split order) / sigma + bias (+ y) */
__global__ void __launch_bounds__(256) k_tc_reduce(const __grid_constant__ tc_args A, int splits) {
    kcu_pdl_wait();
    kcu_pdl_trigger();
    const int64_t total = (int64_t)A.n * A.rows_total;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int tk = (int)(i / A.rows_total), rr = (int)(i % A.rows_total);
        int m = 0;
        while (m + 1 < A.count && rr >= A.m[m + 1].roff) m++;
        const tc_mat &M = A.m[m];
        const int r = rr - M.roff;
        float s = 0.0f;
        for (int k = 0; k < splits; k++) s += A.part[((int64_t)k * A.n + tk) * A.rows_total + rr];
        float o = s * A.inv_sigma[tk] + (M.obias ? M.obias[r] : 0.0f);
        float *yp = M.y + (int64_t)tk * M.rows + r;
        if (A.add) o += *yp;
        *yp = o;
    }
}

/* ---- x -> 16-bit halves ---- */

/* Slot of column j (0..7) of an 8-column run in x's buffer: 4-bit weights store each run as
 * columns 0,4,1,5,2,6,3,7 (the nibble pairs of a code word), others as is. */
template <bool PERM> __device__ __forceinline__ int tc_xslot(int j) {
    return PERM ? ((j & 3) << 1) | (j >> 2) : j;
}

/* The 8 values of run o of the token's x as the matmul sees them: x, or x times inv (its 1/rms)
 * times the norm weight (w, 1 + w, or none); zeros past cols. */
__device__ __forceinline__ void tc_prep_run(const tc_prep_args &P, const float *x, int o, float inv,
                                            float (&v)[8]) {
    const int nrun = P.cols_pad / 8;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int c = 8 * o + j;
        const bool ok = o < nrun && c < P.cols;
        v[j] = ok ? x[c] : 0.0f;
        if (P.norm && ok)
            v[j] *= inv * (!P.norm_w ? 1.0f : P.plus_one ? 1.0f + P.norm_w[c] : P.norm_w[c]);
    }
}

/* Sum (or max) of v over the block in a fixed order: deterministic. red: 8 floats of shared
 * memory, free again on return. */
__device__ __forceinline__ float tc_block_reduce(float v, bool is_max, float *red) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, m);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < TC_THREADS / 32; w++) r = is_max ? fmaxf(r, red[w]) : r + red[w];
    __syncthreads();
    return r;
}

/* 1 / rms of the token's x (1 without norm); every thread of the block calls it */
__device__ __forceinline__ float tc_prep_inv_rms(const tc_prep_args &P, const float *x,
                                                 float *red) {
    if (!P.norm) return 1.0f;
    const int nrun = P.cols_pad / 8, nk = (nrun + TC_THREADS - 1) / TC_THREADS;
    float ss = 0.0f;
    for (int k = 0; k < nk; k++) {
        const int o = threadIdx.x + k * TC_THREADS;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int c = 8 * o + j;
            const float v = o < nrun && c < P.cols ? x[c] : 0.0f;
            ss += v * v;
        }
    }
    return rsqrtf(tc_block_reduce(ss, false, red) / (float)P.cols + P.eps);
}

/* One block per token row of the padded buffers (rows past n are zero); each thread owns 8-column
 * runs o = tid + 256 k (consecutive lanes, consecutive runs, so a group's runs sit on 4/8/16
 * adjacent lanes). F16: quantized W (x scaled by sigma, f16 halves, group sums); else bf16
 * halves. With norm_w, x is first RMS-normalized as rmsnorm.cu does. Reductions (sum of squares,
 * max, group sums) run in a fixed order: deterministic. Dynamic shared memory: 8 floats. */
template <bool F16, bool PERM>
__global__ void __launch_bounds__(TC_THREADS) k_tc_prep(const __grid_constant__ tc_prep_args P) {
    kcu_pdl_wait();
    kcu_pdl_trigger();
    float *red = (float *)tc_sm_raw;
    const int tok = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
    const int nrun = P.cols_pad / 8, ngp = F16 ? P.cols_pad / P.group : 0;
    uint4 *xh = (uint4 *)(P.xh + (int64_t)tok * P.cols_pad);
    uint4 *xl = (uint4 *)(P.xl + (int64_t)tok * P.cols_pad);
    if (tok >= P.n) {
        for (int o = tid; o < nrun; o += TC_THREADS) xh[o] = xl[o] = make_uint4(0, 0, 0, 0);
        for (int gi = tid; gi < ngp; gi += TC_THREADS) P.xsum[(int64_t)tok * ngp + gi] = 0.0f;
        if (tid == 0) P.inv_sigma[tok] = 1.0f;
        return;
    }
    const float *x = P.x + (P.rows ? kcu_ld(P.rows + tok) / P.x_div : tok) * P.cols;
    /* a warp walks its runs while any lane of it has one (shuffles need the whole warp) */
    const int nk = (nrun + TC_THREADS - 1) / TC_THREADS;
    const float inv = tc_prep_inv_rms(P, x, red);
    auto vals = [&](int o, float(&v)[8]) { tc_prep_run(P, x, o, inv, v); };
    float sigma = 1.0f, inv_sigma = 1.0f;
    if (F16) { /* max |x| sigma < 2^15: a power of two from the exponent of max |x| */
        float m = 0.0f;
        for (int k = 0; k < nk; k++) {
            float v[8];
            vals(tid + k * TC_THREADS, v);
#pragma unroll
            for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(v[j]));
        }
        m = tc_block_reduce(m, true, red);
        if (m > 0.0f && m <= 3.4e38f) {
            const int e = ((__float_as_int(m) >> 23) & 0xff) - 126; /* m < 2^e */
            int sh = 15 - e;
            sh = sh < -126 ? -126 : sh > 126 ? 126 : sh;
            sigma = __int_as_float((127 + sh) << 23);
            inv_sigma = __int_as_float((127 - sh) << 23);
        }
    }
    const int gr = F16 ? P.group / 8 : 1; /* runs per group: 4, 8, 16 adjacent lanes */
    for (int k = 0; k < nk; k++) {
        const int o = tid + k * TC_THREADS;
        float v[8];
        vals(o, v);
        uint16_t hi[8], lo[8];
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float y = v[j] * sigma; /* exact: a power of two */
            s += y;
            tc_split16<F16>(y, &hi[tc_xslot<PERM>(j)], &lo[tc_xslot<PERM>(j)]);
        }
        if (o < nrun) {
            uint32_t h2[4], l2[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                h2[j] = (uint32_t)hi[2 * j] | (uint32_t)hi[2 * j + 1] << 16;
                l2[j] = (uint32_t)lo[2 * j] | (uint32_t)lo[2 * j + 1] << 16;
            }
            xh[o] = make_uint4(h2[0], h2[1], h2[2], h2[3]);
            xl[o] = make_uint4(l2[0], l2[1], l2[2], l2[3]);
        }
        if (F16) {
            for (int m = 1; m < gr; m <<= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
            if (o < nrun && lane % gr == 0) P.xsum[(int64_t)tok * ngp + o / gr] = s;
        }
    }
    if (tid == 0) P.inv_sigma[tok] = inv_sigma;
}

#include "backend/cuda/gemm_tc_int8.cuh"

/* ---- host side ---- */

/* Block shapes by tokens per block: warps along rows x tokens, pipeline depth. */
template <int BN> struct tc_cfg;
template <> struct tc_cfg<8> { static constexpr int WM = 8, WN = 1, STAGES = 6; };
template <> struct tc_cfg<16> { static constexpr int WM = 8, WN = 1, STAGES = 5; };
template <> struct tc_cfg<64> { static constexpr int WM = 4, WN = 2, STAGES = 4; };
template <> struct tc_cfg<128> { static constexpr int WM = 2, WN = 4, STAGES = 3; };

/* Pipeline depth: bf16 tiles are 2-4x the bytes of code tiles, so small-n bf16 shapes keep 4
 * stages (2 blocks a SM) instead of 6/5. */
template <int MODE, int BN> constexpr int tc_stages() {
    return MODE == TC_BF16 && BN <= 16 ? 4 : tc_cfg<BN>::STAGES;
}

/* What a call launches: block shape, split-K, and the scratch layout (byte offsets). dig: 0 for
 * the f16 kernels, else the int8 variant's digits of x (1 in fast mode, 3 in exact). */
struct tc_plan {
    int quant, bits, group, cols, cols_pad, bn, n_pad, tiles, rows_total, splits, cps, ngp, dig;
    size_t off_xl, off_xe, off_xsum, off_isg, off_part, bytes;
};

/* The format the kernel takes (whatever n): 16-byte row starts, 4/8-bit codes with group
 * 32/64/128 or bf16. */
static bool tc_format_ok(const kiln_matrix *w) {
    if ((uintptr_t)w->data & 15) return false;
    if (w->rows <= 0 || w->rows >= INT32_MAX / 2 || w->cols <= 0 || w->cols >= INT32_MAX / 16)
        return false;
    if (kiln_matrix_is_quantized(w))
        return (w->bits == 4 || w->bits == 8) &&
               (w->group_size == 32 || w->group_size == 64 || w->group_size == 128) &&
               w->cols % w->group_size == 0 &&
               (w->scale_dtype == KILN_DT_F16 || w->scale_dtype == KILN_DT_BF16 ||
                w->scale_dtype == KILN_DT_F32);
    return w->dtype == KILN_DT_BF16 && w->cols % 8 == 0;
}

/* same format and cols as b */
static bool tc_same(const kiln_matrix *a, const kiln_matrix *b) {
    if (a->dtype != b->dtype || a->cols != b->cols) return false;
    if (!kiln_matrix_is_quantized(a)) return true;
    return a->bits == b->bits && a->group_size == b->group_size && a->scale_dtype == b->scale_dtype;
}

/* Resident blocks per SM by shared memory (227 KiB a SM, 1 KiB reserved a block) and by
 * registers (8 warps; 64K registers: <= 80 a thread for 3 blocks, <= 128 for 2). */
static int tc_blocks_fit(size_t smem, int by_regs) {
    const int by_smem = (int)((227 << 10) / (smem + 1024));
    const int b = by_smem < by_regs ? by_smem : by_regs;
    return b > 0 ? b : 1;
}
template <int MODE, int SS, int BN> static int tc_blocks_per_sm_t(void) {
    return tc_blocks_fit(tc_layout<MODE, SS, BN, tc_stages<MODE, BN>()>::bytes, BN == 8    ? 3
                                                                                : BN == 16 ? 2
                                                                                           : 1);
}
template <int MODE, int SS> static int tc_blocks_per_sm_m(int bn) {
    return bn == 8    ? tc_blocks_per_sm_t<MODE, SS, 8>()
           : bn == 16 ? tc_blocks_per_sm_t<MODE, SS, 16>()
           : bn == 64 ? tc_blocks_per_sm_t<MODE, SS, 64>()
                      : tc_blocks_per_sm_t<MODE, SS, 128>();
}
/* The int8 variant: its registers (three digit planes' integer fragments in exact mode) allow 2
 * blocks of 8 or 16 tokens a SM, 1 of 64 or 128; shared memory as for group 32 (the wider x rows).
 */
template <int MODE, int DIG, int BN> static int tc_blocks_per_sm_i8_t(void) {
    return tc_blocks_fit(tc_layout_i8<MODE, 2, DIG, BN, tc_cfg<BN>::STAGES>::bytes,
                         BN <= 16 ? 2 : 1);
}
template <int MODE, int DIG> static int tc_blocks_per_sm_i8_m(int bn) {
    return bn == 8    ? tc_blocks_per_sm_i8_t<MODE, DIG, 8>()
           : bn == 16 ? tc_blocks_per_sm_i8_t<MODE, DIG, 16>()
           : bn == 64 ? tc_blocks_per_sm_i8_t<MODE, DIG, 64>()
                      : tc_blocks_per_sm_i8_t<MODE, DIG, 128>();
}
static int tc_blocks_per_sm_i8(int bits, int dig, int bn) {
    if (bits == 4)
        return dig == 3 ? tc_blocks_per_sm_i8_m<TC_Q4, 3>(bn) : tc_blocks_per_sm_i8_m<TC_Q4, 1>(bn);
    return dig == 3 ? tc_blocks_per_sm_i8_m<TC_Q8, 3>(bn) : tc_blocks_per_sm_i8_m<TC_Q8, 1>(bn);
}
/* 64-token kernels capped at 128 registers (DQ, TWO): two blocks a SM by registers */
template <int MODE, int SS> static int tc_blocks_per_sm_two(void) {
    return tc_blocks_fit(tc_layout<MODE, SS, 64, tc_stages<MODE, 64>()>::bytes, 2);
}
static int tc_blocks_per_sm(int bits, int group, int bn, int dig, bool two64 = false) {
    if (dig) return tc_blocks_per_sm_i8(bits, dig, bn);
    if (bits == 16) return tc_blocks_per_sm_m<TC_BF16, 4>(bn);
    if (two64 && bn == 64 && bits == 4)
        return group == 32 ? tc_blocks_per_sm_two<TC_Q4, 2>() : tc_blocks_per_sm_two<TC_Q4, 4>();
    if (two64 && bn == 64)
        return group == 32 ? tc_blocks_per_sm_two<TC_Q8, 2>() : tc_blocks_per_sm_two<TC_Q8, 4>();
    if (bits == 4)
        return group == 32 ? tc_blocks_per_sm_m<TC_Q4, 2>(bn) : tc_blocks_per_sm_m<TC_Q4, 4>(bn);
    return group == 32 ? tc_blocks_per_sm_m<TC_Q8, 2>(bn) : tc_blocks_per_sm_m<TC_Q8, 4>(bn);
}

/* Plans a call over count matrices (format checked here, not n's policy); bn / splits > 0 force
 * the block's tokens (8, 16, 64, 128; the int8 variant's exact mode stops at 64) / the split
 * count; dig > 0 (1 or 3 digits, quantized W only): the int8 variant. False: the kernels do not
 * take them. */
static bool tc_plan_make(tc_plan *p, int count, const kiln_matrix *const *ws, int64_t n, int n_sms,
                         int bn, int splits, int dig, bool two64 = false) {
    if (count < 1 || count > TC_MATS || n < 1 || n > (int64_t)1 << 24) return false;
    int64_t rows_total = 0;
    for (int i = 0; i < count; i++) {
        if (!tc_format_ok(ws[i]) || !tc_same(ws[i], ws[0])) return false;
        rows_total += ws[i]->rows;
    }
    if (rows_total >= INT32_MAX / 2) return false;
    memset(p, 0, sizeof *p);
    const kiln_matrix *w0 = ws[0];
    p->quant = kiln_matrix_is_quantized(w0);
    if (dig != 0 && (!p->quant || (dig != 1 && dig != 3))) return false;
    p->dig = dig;
    p->bits = p->quant ? w0->bits : 16;
    p->group = p->quant ? w0->group_size : 1;
    p->cols = (int)w0->cols;
    p->cols_pad = (p->cols + TC_BK - 1) / TC_BK * TC_BK;
    if (bn != 8 && bn != 16 && bn != 64 && bn != 128)
        bn = n <= 8 ? 8 : n <= 16 ? 16 : n <= 64 ? 64 : 128;
    if (dig == 3 && bn == 128) bn = 64;
    p->bn = bn;
    p->n_pad = (int)((n + bn - 1) / bn * bn);
    if (p->n_pad / bn > 65535) return false;
    for (int i = 0; i < count; i++) p->tiles += (int)((ws[i]->rows + TC_BM - 1) / TC_BM);
    p->rows_total = (int)rows_total;
    /* split-K while the blocks leave the SMs short of work; a split ends on a group's end and
     * gets >= 2 units (of max(64, group) columns) */
    const int nchunks = p->cols_pad / TC_BK;
    const int unit = p->quant && p->group > TC_BK ? p->group / TC_BK : 1;
    const int units = (nchunks + unit - 1) / unit;
    if (splits < 1) {
        const int64_t blocks = (int64_t)p->tiles * (p->n_pad / bn);
        const int64_t want = (int64_t)n_sms * tc_blocks_per_sm(p->bits, p->group, bn, dig, two64);
        /* split only when under 3/4 of a wave: partials cost a write and a read of y per split */
        splits = 4 * blocks < 3 * want ? (int)(want / blocks) : 1; /* within one wave */
        if (splits < 1) splits = 1;
        const int max_split = units / 2 > 1 ? units / 2 : 1;
        if (splits > max_split) splits = max_split;
        if (splits > 16) splits = 16;
    }
    if (splits > units) splits = units;
    p->cps = (units + splits - 1) / splits * unit;
    p->splits = (nchunks + p->cps - 1) / p->cps;
    /* scratch: x hi, lo [n_pad, cols_pad] u16 (int8 variant: the digits [n_pad, cols_pad * dig]
     * and no lo), xsum [n_pad, cols_pad / group] f32 (int8 variant: then E, the same size), 1/sigma
     * [n_pad], partials [splits, n, rows_total] f32 */
    p->ngp = p->quant ? p->cols_pad / p->group : 0;
    auto al = [](size_t b) { return (b + 255) & ~(size_t)255; };
    const size_t xb = al((size_t)p->n_pad * p->cols_pad * (dig ? dig : 2));
    const size_t gb = al((size_t)p->n_pad * (p->ngp + 1) * 4);
    p->off_xl = dig ? 0 : xb;
    p->off_xsum = dig ? xb : 2 * xb;
    p->off_xe = p->off_xsum + gb;
    p->off_isg = p->off_xe + (dig ? gb : 0);
    p->off_part = p->off_isg + al((size_t)p->n_pad * 4);
    p->bytes = p->off_part + (p->splits > 1 ? al((size_t)p->splits * n * rows_total * 4) : 0);
    return true;
}

/* The kernels' parameters for a plan and its scratch. */
static void tc_plan_args(const tc_plan &p, char *scr, int count, float *const *ys, const float *x,
                         int64_t n, const kiln_matrix *const *ws, bool norm, const float *norm_w,
                         float eps, bool plus_one, bool add, tc_args *A, tc_prep_args *P) {
    memset(A, 0, sizeof *A);
    memset(P, 0, sizeof *P);
    int tiles = 0, roff = 0;
    for (int i = 0; i < count; i++) {
        tc_mat &m = A->m[i];
        m.w = ws[i]->data;
        m.scales = ws[i]->scales;
        m.qbias = ws[i]->biases;
        m.obias = ws[i]->bias;
        m.y = ys[i];
        m.rows = (int)ws[i]->rows;
        m.first = tiles;
        m.roff = roff;
        tiles += (m.rows + TC_BM - 1) / TC_BM;
        roff += m.rows;
    }
    A->count = count;
    A->xh = (const uint16_t *)scr;
    A->xl = (const uint16_t *)(scr + p.off_xl);
    A->xd = p.dig ? (const int8_t *)scr : NULL;
    A->xe = p.dig ? (const float *)(scr + p.off_xe) : NULL;
    A->xsum = (const float *)(scr + p.off_xsum);
    A->inv_sigma = (const float *)(scr + p.off_isg);
    A->part = p.splits > 1 ? (float *)(scr + p.off_part) : NULL;
    A->n = (int)n, A->cols = p.cols, A->cols_pad = p.cols_pad, A->group = p.group;
    A->sdt = p.quant ? (int)ws[0]->scale_dtype : 0;
    A->chunks_per_split = p.cps, A->rows_total = p.rows_total, A->add = add ? 1 : 0;
    A->splits = p.splits;
    P->x = x;
    P->xh = (uint16_t *)scr;
    P->xl = (uint16_t *)(scr + p.off_xl);
    P->xd = p.dig ? (int8_t *)scr : NULL;
    P->xe = p.dig ? (float *)(scr + p.off_xe) : NULL;
    P->xsum = (float *)(scr + p.off_xsum);
    P->inv_sigma = (float *)(scr + p.off_isg);
    P->norm = norm ? 1 : 0;
    P->norm_w = norm_w;
    P->n = (int)n, P->cols = p.cols, P->cols_pad = p.cols_pad, P->group = p.group;
    P->eps = eps, P->plus_one = plus_one ? 1 : 0;
}

/* Expert mode (grouped MoE): count (1 or 2: gate and up) stacks [E * stride, cols] of one format
 * sharing x, each expert's matrix rows [row_off, row_off + rows) of its stride; n (token, expert)
 * pairs sorted by expert. Tokens per block by the pairs an expert gets on average; the x buffers
 * keep a whole token tile past the last pair (a tile of the last expert reads past its end); no
 * split-K. */
static int tc_experts_bn(int64_t n, int n_experts) {
    const int64_t avg = n / (n_experts > 0 ? n_experts : 1);
    return avg >= 48 ? 64 : avg >= 12 ? 16 : 8;
}
/* Token tiles an expert-mode launch may have: ceil(n / bn) + one partial tile per expert. */
static int64_t tc_experts_max_tiles(int64_t n, int n_experts) {
    const int bn = tc_experts_bn(n, n_experts);
    return (n + bn - 1) / bn + n_experts;
}
static bool tc_experts_plan(tc_plan *p, int count, const kiln_matrix *const *stacks, int64_t rows,
                            int64_t n, int n_experts) {
    if (count < 1 || count > 2 || n < 1 || n_experts < 1 ||
        tc_experts_max_tiles(n, n_experts) > 65535)
        return false;
    kiln_matrix one[2];
    const kiln_matrix *ws[2];
    for (int i = 0; i < count; i++) {
        one[i] = *stacks[i];
        one[i].rows = rows; /* one expert's matrix: the row tiles of a block column */
        ws[i] = &one[i];
    }
    const int bn = tc_experts_bn(n, n_experts);
    return tc_plan_make(p, count, ws, n + bn, 1, bn, 1, 0) && p->splits == 1;
}
/* The parameters of an expert-mode call: x row of sorted pair s is list[s] / x_div, its y row s
 * (scatter: list[s]) of ys[i] [n, rows]; etiles [max tiles, 4] (k_moe_group). */
static void tc_experts_args(const tc_plan &p, char *scr, int count, float *const *ys,
                            const float *x, int64_t x_div, int64_t n,
                            const kiln_matrix *const *stacks, int64_t rows, const int64_t *row_offs,
                            int64_t stride, const int32_t *list, const int32_t *etiles,
                            bool scatter, tc_args *A, tc_prep_args *P) {
    kiln_matrix one[2];
    const kiln_matrix *ws[2];
    for (int i = 0; i < count; i++) {
        one[i] = *stacks[i];
        one[i].rows = rows;
        ws[i] = &one[i];
    }
    tc_plan_args(p, scr, count, ys, x, n, ws, false, NULL, 0.0f, false, false, A, P);
    for (int i = 0; i < count; i++) A->m[i].wrow = row_offs[i];
    A->etiles = etiles;
    A->out_row = scatter ? list : NULL;
    A->estride = stride;
    P->rows = list;
    P->x_div = x_div;
}

#ifndef TC_HOST_EMU
static int g_tc_mode = -1, g_tc_dense_max = -1, g_tc_bn = 0, g_tc_splits = 0;
static long long g_tc_launches = 0;
extern "C" long long kiln_cuda_tc_gemm_launches(void) {
    return g_tc_launches;
}
extern "C" void kiln_cuda_set_tc_gemm(int mode, int dense_max_n, int bn, int splits) {
    g_tc_mode = mode, g_tc_dense_max = dense_max_n, g_tc_bn = bn, g_tc_splits = splits;
}
static int tc_mode(void) {
    if (g_tc_mode < 0) {
        const char *e = getenv("KILN_CUDA_TC_GEMM");
        g_tc_mode = e && *e ? atoi(e) : 1;
        /* block shape and split-K for A/B runs (0: by shape) */
        const char *b = getenv("KILN_CUDA_TC_BN"), *k = getenv("KILN_CUDA_TC_SPLITS");
        if (b && *b) g_tc_bn = atoi(b);
        if (k && *k) g_tc_splits = atoi(k);
    }
    return g_tc_mode;
}
/* An on/off switch read from env `name` once (1 for any non-zero value; dflt when unset); a
 * setter's value >= 0 stands instead, < 0 reads the env again */
static int tc_switch(int *v, const char *name, int dflt) {
    if (*v < 0) {
        const char *e = getenv(name);
        *v = e && *e ? atoi(e) != 0 : dflt;
    }
    return *v;
}
/* Split-K summed by the last split in the kernel (tc_reduce_last) instead of k_tc_reduce:
 * KILN_CUDA_TC_REDUCE=1 or kiln_cuda_set_tc_reduce(1); default off until measured on the GPU. */
static int g_tc_reduce = -1;
extern "C" void kiln_cuda_set_tc_reduce(int in_kernel) {
    g_tc_reduce = in_kernel;
}
static bool tc_reduce_in_kernel(void) {
    return tc_switch(&g_tc_reduce, "KILN_CUDA_TC_REDUCE", 0) == 1;
}
/* The int8 variant for quantized W: KILN_CUDA_TC_INT8=1 or kiln_cuda_set_tc_int8(1) (default off
 * until measured on the GPU). */
static int g_tc_int8 = -1;
extern "C" void kiln_cuda_set_tc_int8(int on) {
    g_tc_int8 = on;
}
static bool tc_int8(void) {
    return tc_switch(&g_tc_int8, "KILN_CUDA_TC_INT8", 0) == 1;
}
static int tc_dense_max(void) {
    if (g_tc_dense_max < 0) {
        const char *e = getenv("KILN_CUDA_TC_DENSE_MAX_N");
        g_tc_dense_max = e && *e ? atoi(e) : 16;
    }
    return g_tc_dense_max;
}

/* Fewest tokens for quantized weights (below: the dp4a GEMV, up to GEMV_MAX_N = 8 tokens).
 * Measured on the H200 (Llama-3-8B q4g64 / q8g64, Qwen3-0.6B q4g64, aggregate decode tok/s): at
 * batch 4 the GEMV beats this GEMM in both modes (8B q4 exact 591 -> 875, fast 592 -> 1089); at
 * batch 8 only in fast mode (1170 -> 1402; exact 1169 vs 1071, its three x digits cost more).
 * So from 5 tokens in exact mode and 9 in fast mode. With fast mode's DQ kernels (twentieth
 * session, H100, Llama-3-8B batch 8 fast): q8 1134 tok/s on the GEMM vs 1027 on the GEMV, q4 1262
 * vs 1399, so 8-bit weights start at 8 tokens there. Env KILN_CUDA_TC_QUANT_MIN_N overrides. */
static int g_tc_quant_min = -1; /* the env's value; 0 = not set */
static int tc_quant_min(int bits) {
    if (g_tc_quant_min < 0) {
        const char *e = getenv("KILN_CUDA_TC_QUANT_MIN_N");
        g_tc_quant_min = e && *e ? atoi(e) : 0;
        if (e && *e && g_tc_quant_min < 2) g_tc_quant_min = 2;
    }
    if (g_tc_quant_min > 0) return g_tc_quant_min;
    return kcu_fast_math() ? (bits == 8 ? 8 : 9) : 5;
}

/* Largest bf16 matrix (rows * cols) that takes the tensor-core GEMM up to 64 tokens: measured on
 * the H200 at n = 64 it beats the cuBLAS split on the Qwen3-0.6B layer matrices (2048x1024 11.3 vs
 * 14.3 us, 1024x3072 13.8 vs 20.2) and loses on Llama-3-8B ones (6144x4096 52.9 vs 23.9), where
 * cuBLAS fills the GPU with output tiles. Env KILN_CUDA_TC_DENSE_SMALL (elements; 0 = off). */
static long long g_tc_dense_small = -1;
static long long tc_dense_small(void) {
    if (g_tc_dense_small < 0) {
        const char *e = getenv("KILN_CUDA_TC_DENSE_SMALL");
        g_tc_dense_small = e && *e ? atoll(e) : 4LL << 20;
        if (g_tc_dense_small < 0) g_tc_dense_small = 0;
    }
    return g_tc_dense_small;
}

size_t kcu_tc_experts_bytes(int count, const kiln_matrix *const *stacks, int64_t rows, int64_t n,
                            int n_experts, int *max_tiles, int *tile_tokens) {
    tc_plan p;
    if (tc_mode() == 0 || !tc_experts_plan(&p, count, stacks, rows, n, n_experts)) return 0;
    *max_tiles = (int)tc_experts_max_tiles(n, n_experts);
    *tile_tokens = tc_experts_bn(n, n_experts);
    return p.bytes;
}

bool kcu_tc_format_on(const kiln_matrix *w) {
    return tc_mode() != 0 && tc_format_ok(w);
}

bool kcu_tc_gemm_applies(const kiln_matrix *w, int64_t n) {
    const int mode = tc_mode();
    if (mode == 0 || n < 1 || !tc_format_ok(w)) return false;
    if (mode == 2) return true;      /* forced (tests, bench) */
    if (kiln_matrix_is_quantized(w)) /* from kcu_quant_cublas_min_n: dequantize + cuBLAS */
        return n >= tc_quant_min(w->bits) && n < kcu_quant_cublas_min_n();
    if (n >= 2 && n <= tc_dense_max()) return true;
    return n >= 2 && n <= 64 && (long long)w->rows * w->cols <= tc_dense_small();
}

template <int MODE, int SS, int BN, int WM, int WN, int S, bool LEAN = true, bool ONE = false,
          bool DQ = false, bool TWO = false>
static void tc_launch_shape(kcu_state *st, const tc_args &A, dim3 grid) {
    const size_t smem = tc_layout<MODE, SS, BN, S>::bytes;
    constexpr bool CAP = (DQ || TWO) && BN == 64; /* two blocks a SM */
    void (*kernel)(const tc_args);
    if constexpr (CAP)
        kernel = k_tc_gemm_two<MODE, SS, BN, WM, WN, S, LEAN, ONE, DQ, TWO>;
    else
        kernel = k_tc_gemm<MODE, SS, BN, WM, WN, S, LEAN, ONE, DQ, TWO>;
    static bool raised = false; /* per instantiation */
    if (!raised) {
        if (!KCU_CHECK(st, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)smem)))
            return;
        raised = true;
    }
    KCU_LAUNCH(st, kernel, grid, TC_THREADS, smem, A);
    KCU_LAUNCHED(st);
}

static int g_tc_lean = -1;
/* KILN_CUDA_TC_LEAN=0: the main loop that works out copy addresses and fold operands per chunk
 * (before the nineteenth session), for A/B runs */
static bool tc_lean_on(void) {
    return tc_switch(&g_tc_lean, "KILN_CUDA_TC_LEAN", 1) != 0;
}

static int g_tc_one = -1;
/* fast mode (--fast-math) multiplies the hi half of x only (lean loop); KILN_CUDA_TC_ONE=0 keeps
 * both products there, for A/B runs */
static bool tc_one_on(void) {
    return tc_switch(&g_tc_one, "KILN_CUDA_TC_ONE", 1) != 0 && kcu_fast_math();
}
static int g_tc_two = -1;
/* Exact mode's 64-token kernels on codes capped at 128 registers (TWO: two blocks a SM, split-K to
 * fill them). Measured on an H100 (twentieth session, n = 64): 4-bit group 64 faster (14336x4096
 * 112 vs 117 us, 6144x4096 56 vs 67; Llama-3-8B q4 batch-64 decode 3997 vs 3628 tok/s), 8-bit
 * slower (133 vs 120 us; 3374 vs 3517 tok/s), so on for 4-bit codes of groups >= 64 (group 32
 * spills 112 bytes at the cap and was not timed). KILN_CUDA_TC_TWO=1 / 0: every format / none. */
static bool tc_two_on(int bits, int group) {
    const int v = tc_switch(&g_tc_two, "KILN_CUDA_TC_TWO", 2); /* 2: by format */
    return v == 2 ? bits == 4 && group >= 64 : v != 0;
}
static int g_tc_dq = -1;
/* fast mode on codes: W dequantized in registers (scale q + bias as f16 pairs, no per-group
 * fold); KILN_CUDA_TC_DQ=0 keeps the fold (codes against x, scales after), for A/B runs */
extern "C" void kiln_cuda_set_tc_dq(int on) {
    g_tc_dq = on;
}
static bool tc_dq_on(void) {
    return tc_switch(&g_tc_dq, "KILN_CUDA_TC_DQ", 1) != 0;
}

/* The kernel for the mode: fast mode's DQ (codes) or one-product (bf16) kernels, exact mode's
 * two-blocks-a-SM A/B variant (KILN_CUDA_TC_TWO), the lean loop, or the old one */
template <int MODE, int SS, int BN>
static void tc_launch_cfg(kcu_state *st, const tc_args &A, dim3 grid) {
    using C = tc_cfg<BN>;
    constexpr int S = tc_stages<MODE, BN>();
    constexpr bool CODES = MODE != TC_BF16;
    if (tc_lean_on() && tc_one_on()) {
        if (CODES && tc_dq_on())
            tc_launch_shape<MODE, SS, BN, C::WM, C::WN, S, true, true, CODES>(st, A, grid);
        else
            tc_launch_shape<MODE, SS, BN, C::WM, C::WN, S, true, true>(st, A, grid);
        return;
    }
    if constexpr (CODES && BN == 64)
        if (tc_lean_on() && tc_two_on(MODE, A.group)) {
            tc_launch_shape<MODE, SS, BN, C::WM, C::WN, S, true, false, false, true>(st, A, grid);
            return;
        }
    if (tc_lean_on())
        tc_launch_shape<MODE, SS, BN, C::WM, C::WN, S>(st, A, grid);
    else
        tc_launch_shape<MODE, SS, BN, C::WM, C::WN, S, false>(st, A, grid);
}

template <int MODE, int SS, int DIG, int BN>
static void tc_launch_i8_cfg(kcu_state *st, const tc_args &A, dim3 grid) {
    using C = tc_cfg<BN>;
    const size_t smem = tc_layout_i8<MODE, SS, DIG, BN, C::STAGES>::bytes;
    static bool raised = false; /* per instantiation */
    if (!raised) {
        if (!KCU_CHECK(
                st, cudaFuncSetAttribute(k_tc_gemm_i8<MODE, SS, DIG, BN, C::WM, C::WN, C::STAGES>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)))
            return;
        raised = true;
    }
    KCU_LAUNCH(st, (k_tc_gemm_i8<MODE, SS, DIG, BN, C::WM, C::WN, C::STAGES>), grid, TC_THREADS,
               smem, A);
    KCU_LAUNCHED(st);
}

/* the int8 variant by digits and tokens per block (exact mode: up to 64) */
template <int MODE, int SS>
static void tc_launch_i8(kcu_state *st, const tc_args &A, dim3 grid, int bn, int dig) {
    if (dig == 3) {
        if (bn == 8)
            tc_launch_i8_cfg<MODE, SS, 3, 8>(st, A, grid);
        else if (bn == 16)
            tc_launch_i8_cfg<MODE, SS, 3, 16>(st, A, grid);
        else
            tc_launch_i8_cfg<MODE, SS, 3, 64>(st, A, grid);
    } else if (bn == 8) {
        tc_launch_i8_cfg<MODE, SS, 1, 8>(st, A, grid);
    } else if (bn == 16) {
        tc_launch_i8_cfg<MODE, SS, 1, 16>(st, A, grid);
    } else if (bn == 64) {
        tc_launch_i8_cfg<MODE, SS, 1, 64>(st, A, grid);
    } else {
        tc_launch_i8_cfg<MODE, SS, 1, 128>(st, A, grid);
    }
}

template <int MODE, int SS>
static void tc_launch_bn(kcu_state *st, const tc_args &A, dim3 grid, int bn) {
    if (bn == 8)
        tc_launch_cfg<MODE, SS, 8>(st, A, grid);
    else if (bn == 16)
        tc_launch_cfg<MODE, SS, 16>(st, A, grid);
    else if (bn == 64)
        tc_launch_cfg<MODE, SS, 64>(st, A, grid);
    else
        tc_launch_cfg<MODE, SS, 128>(st, A, grid);
}

/* k_tc_prep for a plan: the f16 variants (quantized W; 4-bit permuted) or bf16 */
static void tc_prep_launch(kcu_state *st, const tc_plan &p, const tc_prep_args &P) {
    const size_t psm = TC_THREADS / 32 * sizeof(float);
    if (!p.quant)
        KCU_LAUNCH(st, (k_tc_prep<false, false>), (unsigned)p.n_pad, TC_THREADS, psm, P);
    else if (p.bits == 4)
        KCU_LAUNCH(st, (k_tc_prep<true, true>), (unsigned)p.n_pad, TC_THREADS, psm, P);
    else
        KCU_LAUNCH(st, (k_tc_prep<true, false>), (unsigned)p.n_pad, TC_THREADS, psm, P);
    KCU_LAUNCHED(st);
}

/* the f16 kernel for a plan's format and block shape */
static void tc_gemm_launch(kcu_state *st, const tc_plan &p, const tc_args &A, dim3 grid) {
    if (!p.quant)
        tc_launch_bn<TC_BF16, 4>(st, A, grid, p.bn);
    else if (p.bits == 4 && p.group == 32)
        tc_launch_bn<TC_Q4, 2>(st, A, grid, p.bn);
    else if (p.bits == 4)
        tc_launch_bn<TC_Q4, 4>(st, A, grid, p.bn);
    else if (p.group == 32)
        tc_launch_bn<TC_Q8, 2>(st, A, grid, p.bn);
    else
        tc_launch_bn<TC_Q8, 4>(st, A, grid, p.bn);
    g_tc_launches++;
}

bool kcu_tc_experts(kcu_state *st, int count, float *const *ys, const float *x, int64_t x_div,
                    int64_t n, const kiln_matrix *const *stacks, int64_t rows,
                    const int64_t *row_offs, int64_t stride, const int32_t *list,
                    const int32_t *etiles, bool scatter, void *scratch) {
    tc_plan p;
    if (tc_mode() == 0 ||
        !tc_experts_plan(&p, count, stacks, rows, n, (int)(stacks[0]->rows / stride)))
        return false;
    tc_args A;
    tc_prep_args P;
    tc_experts_args(p, (char *)scratch, count, ys, x, x_div, n, stacks, rows, row_offs, stride,
                    list, etiles, scatter, &A, &P);
    tc_prep_launch(st, p, P);
    const int64_t tiles = tc_experts_max_tiles(n, (int)(stacks[0]->rows / stride));
    tc_gemm_launch(st, p, A, dim3((unsigned)p.tiles, (unsigned)tiles, 1));
    return true;
}

bool kcu_tc_gemm(kcu_state *st, int count, float *const *ys, const float *x, int64_t n,
                 const kiln_matrix *const *ws, bool norm, const float *norm_w, float eps,
                 bool plus_one, bool add) {
    for (int i = 0; i < count; i++)
        if (!kcu_tc_gemm_applies(ws[i], n)) return false;
    tc_plan p;
    const int dig = kiln_matrix_is_quantized(ws[0]) && tc_int8() ? (kcu_fast_math() ? 1 : 3) : 0;
    /* the 64-token kernel tc_launch_cfg picks holds two blocks a SM (DQ or TWO) */
    const bool two64 = !dig && kiln_matrix_is_quantized(ws[0]) && tc_lean_on() &&
                       ((tc_one_on() && tc_dq_on()) || tc_two_on(ws[0]->bits, ws[0]->group_size));
    if (!tc_plan_make(&p, count, ws, n, st->n_sms, g_tc_bn, g_tc_splits, dig, two64)) return false;
    char *scr = (char *)kcu_scratch(st, p.bytes);
    if (!scr) return true; /* the sticky error is set */
    tc_args A;
    tc_prep_args P;
    tc_plan_args(p, scr, count, ys, x, n, ws, norm, norm_w, eps, plus_one, add, &A, &P);
    if (p.splits > 1 && tc_reduce_in_kernel() &&
        (int64_t)p.tiles * (p.n_pad / p.bn) <= KCU_ATT_COUNTERS)
        A.counters = st->attn_counters; /* shared with attention: stream-ordered, kept zero */

    const dim3 grid((unsigned)p.tiles, (unsigned)(p.n_pad / p.bn), (unsigned)p.splits);
    if (!p.dig) {
        tc_prep_launch(st, p, P);
        tc_gemm_launch(st, p, A, grid);
    } else { /* the int8 variant */
        const size_t psm = TC_THREADS / 32 * sizeof(float);
        if (p.dig == 3 && p.bits == 4)
            KCU_LAUNCH(st, (k_tc_prep_i8<3, true>), (unsigned)p.n_pad, TC_THREADS, psm, P);
        else if (p.dig == 3)
            KCU_LAUNCH(st, (k_tc_prep_i8<3, false>), (unsigned)p.n_pad, TC_THREADS, psm, P);
        else if (p.bits == 4)
            KCU_LAUNCH(st, (k_tc_prep_i8<1, true>), (unsigned)p.n_pad, TC_THREADS, psm, P);
        else
            KCU_LAUNCH(st, (k_tc_prep_i8<1, false>), (unsigned)p.n_pad, TC_THREADS, psm, P);
        KCU_LAUNCHED(st);
        if (p.bits == 4 && p.group == 32)
            tc_launch_i8<TC_Q4, 2>(st, A, grid, p.bn, p.dig);
        else if (p.bits == 4)
            tc_launch_i8<TC_Q4, 4>(st, A, grid, p.bn, p.dig);
        else if (p.group == 32)
            tc_launch_i8<TC_Q8, 2>(st, A, grid, p.bn, p.dig);
        else
            tc_launch_i8<TC_Q8, 4>(st, A, grid, p.bn, p.dig);
        g_tc_launches++;
    }
    if (p.splits > 1 && !A.counters) {
        KCU_LAUNCH(st, k_tc_reduce, kcu_blocks((int64_t)n * p.rows_total, 256, 4096), 256, 0, A,
                   p.splits);
        KCU_LAUNCHED(st);
    }
    return true;
}
#endif
