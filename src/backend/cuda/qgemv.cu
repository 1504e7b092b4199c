/* qgemv.cu — decode GEMV (n <= 8 tokens) for MLX affine 4- and 8-bit weights, built to stream W at
 * the memory bandwidth instead of being bound by instruction issue: the dot products run as
 * integer dp4a (4 multiply-adds per instruction) against x converted once per call to 24-bit
 * fixed point.
 *
 * Pass 1, k_qx_digits (one warp per token and 32-column block g):
 *   E[t][g] = 2^(e-22) where max_j |x_j| < 2^e over the block, X_j = rint(x_j / E) (|X_j| <= 2^22,
 *   so x_j = E*X_j within 2^-23 of the block's max), X_j = 65536*d2 + 256*d1 + d0 with signed-byte
 *   digits, and sx16[t][c/16] = sum of x over each 16 columns (f32).
 * Pass 2, k_qgemv_dp4a: a warp owns one row (or 1/KS of one row's 16-byte chunks when KS warps
 *   split the columns of a row); each lane streams 16-byte chunks of codes (32 4-bit or 16 8-bit),
 *   coalesced along the row, four chunks in flight per lane, and for each chunk and token
 *     D_p = sum_j q_j * d_p,j  (dp4a; exact int32)
 *     acc += (s * E) * (65536*D2 + 256*D1 + D0) + b * sum_j x_j
 *   which is the group identity sum_j (s*q_j + b) x_j = s * sum_j q_j x_j + b * sum_j x_j. A chunk
 *   never straddles a quantization group (groups are powers of two >= 32 columns). 4-bit codes are
 *   split into the even and odd nibbles of each word ((w & 0x0F0F0F0F), (w >> 4) & 0x0F0F0F0F), so
 *   pass 1 stores each 8-column run's digits as columns 0,2,4,6,1,3,5,7 for 4-bit weights.
 *
 * The decode-layer fusions of backend.h run on the same kernel (template flags, QG_*): matmul_norm
 *   digits of x*g (g the norm weight) and x's sums of squares per 32 columns; the dot products are
 *   scaled by rsqrt(mean x^2 + eps) in the epilogue (the norm is linear in x, so this is
 *   rmsnorm(x) @ W^T within f32 rounding); q/k/v (up to QG_MAX matrices sharing x) in one launch
 *   whose blocks pick their matrix from a table in the kernel parameters. matmul_add: y += in the
 *   epilogue. matmul_norm_glu: a warp owns matching rows of gate and up (each digit load serves
 *   both) and writes act(gate) * up. At n = 1, where the grid is small (decode of small models:
 *   launches, not the weight stream, bound the time), each block makes x's digits itself in shared
 *   memory instead of pass 1 (QG_INL): one launch per op. KILN_CUDA_FUSED=0: none of this, as
 *   before (pass 1, then one launch per matrix; the fusions run as compositions of plain ops).
 *
 * qg_link (further down; opt-in, KILN_CUDA_QGEMV_LINK=1 or 2): where the model hints that a
 *   GEMV's output feeds the next GEMV (backend.h feeds_next), the first also writes pass 1's
 *   digits of its output and the second skips pass 1. The blocks of a 32-row group meet to make
 *   them: through an arrival count in global memory, the last block making them (1, qg_emit), or
 *   launched as a thread-block cluster whose leader gathers the group in its shared memory (2,
 *   qg_emit_cluster).
 *
 * With programmatic dependent launch (cuda_common.cuh) pass 2's blocks start while pass 1
 * runs, issue their first weight loads, and wait (griddepcontrol.wait) only before reading x's
 * digits. Error: |x_j - E*X_j| <= 2^-23 * max|x| of its block, ~1e-7 relative in the result.
 * Fast mode (kcu_fast_math: --fast-math) keeps one digit, X_j = rint(127 x_j / max|x|) with
 * E = max|x| / 127 (llama.cpp's Q8_1 steps, ~1e-3 relative): a third of the dp4a and digit loads.
 *
 * k_qgemv_mma (further down; opt-in, KILN_CUDA_QGEMV_MMA=1, n = 1) runs pass 2 on int8 tensor
 * cores instead: one mma.m16n8k32 per 16 rows and 32 columns takes all digits at once.
 *
 * tests/emu/qgemv_emulate.cc compiles this file on the CPU (QG_HOST_EMU: its own device helpers,
 * launches on emulated threads) and checks every variant against the CPU reference ops. */
#ifndef QG_HOST_EMU
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/quant.cuh"
#include "util/log.h"
#endif
#include "backend/cuda/qx_digits.cuh"

#include <stdlib.h>
#include <string.h>

#define QG_WARPS    8    /* warps per block */
#define QG_INFLIGHT 4    /* 16-byte chunks in flight per lane (over its rows) */
#define QG_MAX      4    /* matrices per launch */
#define QG_INL_COLS 8192 /* most columns whose digits a block makes itself (28 KiB of shared) */

/* Kernel variants (template flags F): the decode-layer fusions of backend.h on the dp4a GEMV. */
enum {
    QG_NORM =
        1,      /* rmsnorm(x) @ W^T: digits of x*g, the dot product scaled by rsqrt(mean x^2+eps) */
    QG_ADD = 2, /* y += x @ W^T */
    QG_GLU = 4, /* y[0] = act(x @ W0^T) * (x @ W1^T): a warp owns matching rows of both */
    QG_INL = 8, /* x's digits made by each block in shared memory (n = 1), no pass 1 */
};

#ifndef QG_HOST_EMU
/* acc + sum over the 4 bytes of a (unsigned) * b (signed) */
__device__ __forceinline__ int qg_dp4a(uint32_t a, uint32_t b, int acc) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(acc));
    return d;
}
/* A block's shared arrays, as macros so that the emulator gives every emulated block fresh,
 * poisoned ones: a static one, and the dynamic one (16-byte aligned). */
#define QG_SHARED(type, name, dims) __shared__ type name dims
#define QG_DYN_SHARED(name)         extern __shared__ uint4 name[]
/* qg_emit's block that digitizes group grp (the emulator counts them: exactly one a group) */
#define QG_EMITS_GROUP(grp)
/* Thread-block clusters (sm_90; qg_emit_cluster): this block's rank in its cluster, the
 * cluster barrier's two halves (every thread of the block executes them, the warp not
 * necessarily converged after the epilogue's branches, so not .aligned; an exited thread no
 * longer counts), and a store of v to the place of p (a shared array of this block) in the
 * shared memory of block `rank` of the cluster. The PTX fallback target never launches them. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned qg_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void qg_cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
}
__device__ __forceinline__ void qg_cluster_arrive_release() {
    asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}
__device__ __forceinline__ void qg_cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ void qg_cluster_store(float *p, unsigned rank, float v) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(r), "f"(v) : "memory");
}
#else
__device__ __forceinline__ unsigned qg_cluster_rank() {
    return 0;
}
__device__ __forceinline__ void qg_cluster_arrive_relaxed() {}
__device__ __forceinline__ void qg_cluster_arrive_release() {}
__device__ __forceinline__ void qg_cluster_wait() {}
__device__ __forceinline__ void qg_cluster_store(float *p, unsigned, float v) {
    *p = v;
}
#endif
/* the leader's array of qg_emit_cluster, which the other blocks of its cluster write into */
#define QG_CLUSTER_SHARED(type, name, dims) __shared__ type name dims
/* atomicAdd(p, 1) with acquire-release semantics at GPU scope: the previous value */
__device__ __forceinline__ unsigned qg_arrive_acq_rel(unsigned *p) {
    unsigned prev;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(p) : "memory");
    return prev;
}
#endif

/* The value of x a lane digitizes: x[t][g*32 + lane], times the norm weight when norm_w is set
 * (plus_one: 1 + w). ssq (non-NULL): lane 0 writes the 32 columns' sum of squares of x there. */
__device__ __forceinline__ float qx_value(const float *x, const float *norm_w, int plus_one,
                                          float *ssq, int t, int g, int cols, int lane) {
    const int col = g * 32 + lane;
    float v = x[(int64_t)t * cols + col];
    if (ssq) {
        const float q = kcu_warp_sum(v * v);
        if (lane == 0) *ssq = q;
    }
    if (norm_w) v *= plus_one ? 1.0f + norm_w[col] : norm_w[col];
    return v;
}

/* Pass 1. x [n, cols] (cols % 32 == 0). Writes dig [n, 3 digits, cols/16 units, 16 bytes] (digit p
 * of 16 columns in storage order, units ordered as below), E [n, cols/32], sx16 [n, cols/16].
 * perm4: the 4-bit column and unit order. norm_w (optional): digits of x * norm_w (plus_one:
 * 1 + norm_w); ssq (optional): [n, cols/32] sums of squares of x. */
__global__ void __launch_bounds__(256)
    k_qx_digits(int8_t *dig, float *E, float *sx16, const float *x, int n, int cols, int perm4,
                const float *norm_w, int plus_one, float *ssq, int nd) {
    KCU_PDL_ENTER();
    const int lane = threadIdx.x & 31, ng = cols >> 5;
    const int64_t gw = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; /* t * ng + g */
    if (gw >= (int64_t)n * ng) return;                                        /* whole warps */
    const int t = (int)(gw / ng), g = (int)(gw % ng);
    const float v = qx_value(x, norm_w, plus_one, ssq ? ssq + gw : NULL, t, g, cols, lane);
    qx_digit_block(dig, E, sx16, v, t, g, ng, perm4, lane, nd);
}

/* Issues the loads of a lane's next QG_INFLIGHT/RR chunks c0 + u*step of its RR rows (codes, and
 * the scale and bias of each chunk's group; g0[r] = row r's first group; rows r < HALF read the
 * scales of matrix sp[0], the others sp[1]) so they are all in flight at once. Chunks past the
 * row's end read as 0. */
/* A group's scale or bias (bf16 or f16, the kernel's scale dtypes) without a branch on the dtype */
__device__ __forceinline__ float qg_scale16(const void *p, int64_t i, bool bf16) {
    const uint16_t h = ((const uint16_t *)p)[i];
    const float b = kcu_bf16(h), f = kcu_f16(h);
    return bf16 ? b : f;
}

template <int B, int RR, int U, int HALF>
__device__ __forceinline__ void
qg_load_chunks(uint4 (&q)[U][RR], float (&s)[U][RR], float (&b)[U][RR],
               const uint4 *const (&wr)[RR], const int64_t (&g0)[RR], const void *const (&sp)[2],
               const void *const (&bp)[2], bool bf16, int group_log2, int c0, int step, int nch) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = c0 + u * step;
        const int g = (c * (128 / B)) >> group_log2;
#pragma unroll
        for (int r = 0; r < RR; r++) {
            if (c < nch) {
                q[u][r] = kcu_load_stream16(wr[r] + c);
                s[u][r] = qg_scale16(sp[r >= HALF], g0[r] + g, bf16);
                b[u][r] = qg_scale16(bp[r >= HALF], g0[r] + g, bf16);
            } else {
                q[u][r] = make_uint4(0, 0, 0, 0);
                s[u][r] = b[u][r] = 0.0f;
            }
        }
    }
}

/* The number of x's digits as a type, for the main loop's template lambda */
template <int N> struct qg_nd { static constexpr int value = N; };

/* Kernel parameters: up to QG_MAX matrices with the same cols, bits, group size and scale dtype
 * (block b belongs to matrix m with first[m] <= b < first[m+1]); QG_GLU: w[0] gate, w[1] up (same
 * rows), y[0] the output. */
struct qg_args {
    float *y[QG_MAX];           /* [n, rows[m]] (QG_ADD: added to) */
    const uint32_t *w[QG_MAX];  /* codes [rows[m], cols*B/32] */
    const void *scales[QG_MAX]; /* [rows[m], cols/group] */
    const void *biases[QG_MAX]; /* [rows[m], cols/group] */
    const float *bias[QG_MAX];  /* [rows[m]] or NULL */
    int rows[QG_MAX];
    unsigned first[QG_MAX + 1];
    int count, sdt, group_log2, n, cols, ks_log2;
    /* x's digits from pass 1 (dig, E, sx16, and ssq with QG_NORM), or with QG_INL made by every
     * block from x (times norm_w) */
    const uint4 *dig;
    const float *E, *sx16, *ssq;
    const float *x, *norm_w;
    float eps;
    int plus_one, act;
    int nd; /* digits of x: 3 (exact, 24-bit fixed point) or 1 (fast mode: int8, as Q8_1) */
    /* emit_dig set: this launch also writes pass 1's digits of its output y (QG_GLU: y[0], else
     * the one matrix's), times emit_norm_w when set (with the sums of squares), for the next
     * GEMV (qg_link). The block that completes a 32-row group (emit_arrivals blocks each,
     * counted in emit_count, which the last one sets back to 0) digitizes it. */
    int8_t *emit_dig;
    float *emit_E, *emit_sx16, *emit_ssq;
    unsigned *emit_count;
    const float *emit_norm_w;
    int emit_plus_one, emit_perm4, emit_arrivals;
    /* > 1: launched as clusters of emit_cluster blocks, one 32-row group each, which meet in
     * the cluster (qg_emit_cluster) instead of counting arrivals in global memory */
    int emit_cluster;
};

/* One warp makes token t's digits of the 32-row group grp from lane's value v of y (times the
 * norm weight g, with the sums of squares, when the emission has a norm): pass 1's bits. */
__device__ __forceinline__ void qg_emit_digits(const qg_args &A, float v, float g, int t, int grp,
                                               int ng) {
    const int lane = threadIdx.x & 31;
    if (A.emit_norm_w) {
        const float q = kcu_warp_sum(v * v);
        if (lane == 0) A.emit_ssq[(int64_t)t * ng + grp] = q;
        v *= A.emit_plus_one ? 1.0f + g : g;
    }
    qx_digit_block(A.emit_dig, A.emit_E, A.emit_sx16, v, t, grp, ng, A.emit_perm4, lane, A.nd);
}

/* The emission of qg_args (emit_dig set): y [n, rows] of this launch; grp the 32-row group this
 * block's rows lie in. After the block's barrier, thread 0 counts the block's arrival with one
 * acquire-release atomic (the barrier orders every thread's writes of y before its release, as
 * CUTLASS's semaphores do; no fence per thread); the last block of the group reads the group
 * back from L2 and warp t makes token t's digits. The norm weight is loaded before the count. A
 * block whose rows are the whole group (emit_arrivals 1) skips the count. */
__device__ __noinline__ void qg_emit(const qg_args &A, const float *y, int rows, int n, int grp) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, ng = rows >> 5;
    const float g = A.emit_norm_w && warp < n ? A.emit_norm_w[grp * 32 + lane] : 0.0f;
    __syncthreads();
    if (A.emit_arrivals == 1) { /* the block holds the whole group: nothing to count */
        if (threadIdx.x == 0) QG_EMITS_GROUP(grp);
        if (warp < n)
            qg_emit_digits(A, __ldcg(y + (int64_t)warp * rows + grp * 32 + lane), g, warp, grp, ng);
        return;
    }
    QG_SHARED(int, emit_last, [1]);
    if (threadIdx.x == 0) {
        const unsigned prev = qg_arrive_acq_rel(A.emit_count + grp);
        emit_last[0] = prev + 1 == (unsigned)A.emit_arrivals;
        if (emit_last[0]) {
            A.emit_count[grp] = 0u; /* for the next launch */
            QG_EMITS_GROUP(grp);
        }
    }
    __syncthreads();
    if (!emit_last[0] || warp >= n) return;
    qg_emit_digits(A, __ldcg(y + (int64_t)warp * rows + grp * 32 + lane), g, warp, grp, ng);
}

/* qg_emit for a launch in clusters of emit_cluster blocks, a 32-row group each (emit_cluster >
 * 1): every block arrived at the cluster barrier when it started (relaxed), so its first wait
 * here returns at once and says that the leader (rank 0) runs and its shared memory exists. The
 * thread holding output (token t, row r32 of the group) stores it, has set (v), into the
 * leader's array (distributed shared memory), and arrives with release semantics; the blocks but
 * the leader exit there (an exited thread does not hold the barrier up), the leader waits for the
 * others' values and its warp t makes token t's digits. No global atomics, no fence to L2. */
__device__ __noinline__ void qg_emit_cluster(const qg_args &A, bool has, float v, int t, int r32,
                                             int rows, int n, int grp) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    QG_CLUSTER_SHARED(float, emit_vals, [8][32]); /* the leader's: [token][row of the group] */
    const unsigned rank = qg_cluster_rank();
    const float g = rank == 0 && A.emit_norm_w && warp < n ? A.emit_norm_w[grp * 32 + lane] : 0.0f;
    qg_cluster_wait(); /* the arrival at the start */
    if (has) qg_cluster_store(&emit_vals[t][r32], 0, v);
    qg_cluster_arrive_release();
    if (rank != 0) return;
    qg_cluster_wait(); /* every block's values are in */
    if (threadIdx.x == 0) QG_EMITS_GROUP(grp);
    if (warp >= n) return;
    qg_emit_digits(A, emit_vals[warp][lane], g, warp, grp, rows >> 5);
}

/* Pass 2. A warp owns a tile of RR rows (QG_GLU: RR/2 rows of the gate and the same rows of up; a
 * partial last tile re-reads its last row and does not write it) and lane l of warp ks of the
 * tile's KS warps reads chunks ks*32 + l + i*32*KS of every row of the tile: each digit load
 * serves RR rows. A block holds QG_WARPS/KS tiles of one matrix; warp = tile in block * KS + ks.
 * QG_INL (n = 1): the block first turns x into digits in shared memory (its weight loads already
 * in flight), which saves pass 1's launch where the grid is small. */
template <int B, int NT, int RR, int F> /* 64 / 80 / 128 registers: 32 / 24 / 16 warps per SM */
__global__ void __launch_bounds__(QG_WARPS * 32, NT *RR <= 2    ? 4
                                                 : NT * RR <= 4 ? 3
                                                                : 2)
    k_qgemv_dp4a(const __grid_constant__ qg_args A) {
    static_assert(B == 4 || B == 8, "dp4a GEMV: 4- or 8-bit codes");
    constexpr bool NORM = F & QG_NORM, ADD = F & QG_ADD, GLU = F & QG_GLU, INL = F & QG_INL;
    static_assert(!INL || NT == 1, "digits in shared memory: one token");
    static_assert(!GLU || RR % 2 == 0, "GLU: rows of gate and up");
    constexpr int R = GLU ? RR / 2 : RR; /* rows of one matrix per tile */
    constexpr int CODES = 128 / B;       /* codes per 16-byte chunk */
    constexpr int NW = B == 4 ? 8 : 4;   /* 4-byte code words (after the nibble split) per chunk */
    constexpr int U = QG_INFLIGHT / RR;  /* chunks per row in flight per lane */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (A.emit_cluster > 1) qg_cluster_arrive_relaxed(); /* qg_emit_cluster's first wait */
    const int ks_log2 = A.ks_log2, KS = 1 << ks_log2, ks = warp & (KS - 1);
    int m = 0;
    if (!GLU)
        while (m + 1 < A.count && blockIdx.x >= A.first[m + 1]) m++;
    const int rows = A.rows[m], n = A.n, cols = A.cols;
    const int r0 = ((int)(blockIdx.x - A.first[m]) * (QG_WARPS >> ks_log2) + (warp >> ks_log2)) * R;
    const bool live = r0 < rows;
    const int nch = live ? cols / CODES : 0; /* chunks per row (0: the warp has no rows) */
    const int ng = cols >> 5, gpr = cols >> A.group_log2, n16 = cols >> 4;
    const uint4 *wr[RR];
    int64_t g0[RR];
#pragma unroll
    for (int r = 0; r < RR; r++) {
        const int rr = r % R, row = !live ? 0 : r0 + rr < rows ? r0 + rr : rows - 1;
        wr[r] = (const uint4 *)A.w[GLU ? r / R : m] + (int64_t)row * (cols / CODES);
        g0[r] = (int64_t)row * gpr;
    }
    const void *const sp[2] = {A.scales[m], A.scales[GLU ? 1 : m]};
    const void *const bp[2] = {A.biases[m], A.biases[GLU ? 1 : m]};
    const int step = 32 * KS;

    float acc[RR][NT];
#pragma unroll
    for (int r = 0; r < RR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;

    /* the first chunks are in flight before waiting for the kernels before (pass 1) */
    uint4 q[U][RR];
    float sc[U][RR], bc[U][RR]; /* the chunks' group scales and biases */
    int c0 = ks * 32 + lane;
    const bool bf16 = A.sdt == KILN_DT_BF16;
    qg_load_chunks<B, RR, U, R>(q, sc, bc, wr, g0, sp, bp, bf16, A.group_log2, c0, step, nch);
    kcu_pdl_wait(); /* x (or pass 1's digits) are complete from here on */
    kcu_pdl_trigger();

    /* x's digits: pass 1's in global memory, or this block's in shared memory */
    QG_DYN_SHARED(qg_smem);
    QG_SHARED(float, nscale, [NT]); /* QG_NORM: rsqrt(mean x^2 + eps) per token */
    const uint4 *dig = A.dig;
    const float *E = A.E, *sx16 = A.sx16, *ssq = A.ssq;
    if constexpr (INL) {
        int8_t *sd = (int8_t *)qg_smem;
        float *sE = (float *)(sd + (int64_t)cols * 3), *ssx = sE + ng, *sss = ssx + n16;
        for (int g = warp; g < ng; g += QG_WARPS) {
            const float v = qx_value(A.x, NORM ? A.norm_w : NULL, A.plus_one, NORM ? sss + g : NULL,
                                     0, g, cols, lane);
            qx_digit_block(sd, sE, ssx, v, 0, g, ng, B == 4, lane, A.nd);
        }
        __syncthreads();
        dig = qg_smem, E = sE, sx16 = ssx, ssq = sss;
    }
    if (NORM && warp == 0) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            float s = 0.0f;
            for (int i = lane; i < ng; i += 32) s += ssq[(int64_t)t * ng + i];
            s = kcu_warp_sum(s);
            if (lane == 0) nscale[t] = rsqrtf(s / (float)cols + A.eps);
        }
    }

    /* The stream of chunks with ND digits of x (3 exact, 1 fast mode): a template argument, so
     * the loop has no branch on it. Chunks past the row's end (codes, scales and biases zero) read
     * the last chunk's digits and add nothing: every chunk runs the same straight code, and the
     * compiler issues all of a chunk's digit loads at once. */
    auto stream = [&](auto nd_tag) {
        constexpr int ND = decltype(nd_tag)::value;
        for (;;) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = min(c0 + u * step, nch - 1);
                uint32_t cw[RR][NW];
#pragma unroll
                for (int r = 0; r < RR; r++) {
                    const uint32_t wd[4] = {q[u][r].x, q[u][r].y, q[u][r].z, q[u][r].w};
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        if constexpr (B == 4) {
                            cw[r][2 * i] = wd[i] & 0x0F0F0F0Fu;
                            cw[r][2 * i + 1] = (wd[i] >> 4) & 0x0F0F0F0Fu;
                        } else {
                            cw[r][i] = wd[i];
                        }
                    }
                }
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= n) break;
                    /* digit p of the 16 columns k of this chunk (4-bit: unit 2c+k, stored at
                     * k*ng + c; 8-bit: unit c), the block's exponent and the sum of x */
                    uint4 dv[ND][NW / 4];
#pragma unroll
                    for (int p = 0; p < ND; p++)
#pragma unroll
                        for (int k = 0; k < NW / 4; k++) {
                            const int64_t di =
                                (int64_t)(t * 3 + p) * n16 + (B == 4 ? k * ng + c : c);
                            if constexpr (INL)
                                dv[p][k] = dig[di];
                            else
                                dv[p][k] = kcu_ld(dig + di);
                        }
                    float e, sx;
                    if constexpr (INL) {
                        e = E[c * CODES >> 5];
                        sx = B == 4 ? sx16[2 * c] + sx16[2 * c + 1] : sx16[c];
                    } else {
                        e = kcu_ld(E + (int64_t)t * ng + (c * CODES >> 5));
                        if constexpr (B == 4) {
                            const float2 s2 =
                                kcu_ld((const float2 *)(sx16 + (int64_t)t * n16 + 2 * c));
                            sx = s2.x + s2.y;
                        } else {
                            sx = kcu_ld(sx16 + (int64_t)t * n16 + c);
                        }
                    }
                    int D[RR][ND];
#pragma unroll
                    for (int r = 0; r < RR; r++)
#pragma unroll
                        for (int p = 0; p < ND; p++) {
                            int d = 0;
#pragma unroll
                            for (int k = 0; k < NW / 4; k++) {
                                d = qg_dp4a(cw[r][4 * k], dv[p][k].x, d);
                                d = qg_dp4a(cw[r][4 * k + 1], dv[p][k].y, d);
                                d = qg_dp4a(cw[r][4 * k + 2], dv[p][k].z, d);
                                d = qg_dp4a(cw[r][4 * k + 3], dv[p][k].w, d);
                            }
                            D[r][p] = d;
                        }
#pragma unroll
                    for (int r = 0; r < RR; r++) {
                        float qx = (float)D[r][0];
                        if constexpr (ND == 3)
                            qx = fmaf((float)D[r][2], 65536.0f, fmaf((float)D[r][1], 256.0f, qx));
                        acc[r][t] = fmaf(sc[u][r] * e, qx, fmaf(bc[u][r], sx, acc[r][t]));
                    }
                }
            }
            c0 += U * step;
            if (c0 >= nch) break;
            qg_load_chunks<B, RR, U, R>(q, sc, bc, wr, g0, sp, bp, bf16, A.group_log2, c0, step,
                                        nch);
        }
    };
    if (c0 < nch) {
        if (A.nd == 1)
            stream(qg_nd<1>{});
        else
            stream(qg_nd<3>{});
    }

    QG_SHARED(float, part, [QG_WARPS][RR][NT]);
#pragma unroll
    for (int r = 0; r < RR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = kcu_warp_sum(acc[r][t]);
            if (lane == 0) part[warp][r][t] = v;
        }
    __syncthreads();
    float out = 0.0f; /* y[t][row] as written, for qg_emit_cluster */
    bool has = false;
    const int r = lane / NT, t = lane % NT, row = r0 + r;
    if (ks == 0 && live && lane < R * NT && row < rows && t < n) {
        float v = 0.0f;
        for (int k = 0; k < KS; k++) v += part[warp + k][r][t];
        if (NORM) v *= nscale[t];
        if (A.bias[m]) v += A.bias[m][row];
        const int64_t o = (int64_t)t * rows + row;
        if constexpr (GLU) {
            float u = 0.0f;
            for (int k = 0; k < KS; k++) u += part[warp + k][r + R][t];
            if (NORM) u *= nscale[t];
            if (A.bias[1]) u += A.bias[1][row];
            out = kcu_glu_act(v, A.act) * u;
        } else if constexpr (ADD) {
            out = A.y[m][o] + v;
        } else {
            out = v;
        }
        A.y[m][o] = out;
        has = true;
    }
    if (A.emit_dig) {
        const int grp = (int)(blockIdx.x - A.first[m]) * (QG_WARPS >> ks_log2) * R >> 5;
        if (A.emit_cluster > 1)
            qg_emit_cluster(A, has, out, t, row & 31, rows, n, grp);
        else
            qg_emit(A, A.y[m], rows, n, grp);
    }
}

/* ---- the same GEMV on int8 tensor cores (n = 1; opt-in, KILN_CUDA_QGEMV_MMA=1) ----
 * mma.m16n8k32 (u8 codes x s8 digits -> s32) takes a 16-row tile of W against a block of 32
 * columns of x, the digits of x as B's columns 0..ND-1: one instruction gives all ND digit dot
 * products of 16 rows (the dp4a kernel spends ND * 8 dp4a per row and chunk). A block of QM_WARPS
 * warps owns one tile (QG_GLU: 8 rows of gate as rows 0-7 and the same 8 of up as rows 8-15), its
 * warps split the columns in chunks of 4 blocks (warp w: chunks w, w + QM_WARPS, ...). Per chunk
 * a warp loads the tile's codes with 16-byte loads (the next chunk's in flight meanwhile), stores
 * them to its shared tile (rows padded by 16 bytes: no bank conflicts) and reads them back as A
 * fragments with ldmatrix.x4: thread (g, t) gets row g's and row g+8's bytes 4t..4t+3 of a
 * 16-byte segment. 4-bit: a segment is a whole block, those bytes are codes 8t..8t+7, the even
 * codes (w & 0x0F0F0F0F) stand for k = 4t..4t+3 and the odd ones for k = 16+4t..; 8-bit: the
 * block's two segments are k < 16 and k >= 16 directly. B's fragments are the same k's of x's
 * digits, and pass 1 already stores them so (4-bit: each 8-column run even columns first): 8
 * bytes of digit g per thread. After each block thread (g, 0) holds digits 0 and 1 of rows g and
 * g+8, lane + 1 digit 2; it adds s*E*(D0 + 256 D1 + 65536 D2) + b*sum(x), as the dp4a kernel
 * does per chunk. The warps' sums meet in shared memory; the epilogue is the dp4a kernel's. */
#define QM_WARPS 8
template <int B> struct qm_geom {
    static constexpr int ROW = B == 4 ? 64 : 128; /* bytes of a tile row per chunk */
    static constexpr int ROWB = ROW + 16;         /* its pitch in shared memory */
    static constexpr int P = ROW / 32;            /* 16-byte pieces per lane (2 lanes per row) */
};
static inline size_t qm_smem_bytes(int bits) {
    return (size_t)QM_WARPS * 16 * (bits == 4 ? qm_geom<4>::ROWB : qm_geom<8>::ROWB);
}

#ifndef QG_HOST_EMU
/* r[j] = this thread's 32-bit word of 8x16-byte matrix j, whose row (lane & 7) this lane's p
 * addresses when lane >> 3 == j (ldmatrix.x4: thread (g, t) gets row g's bytes 4t..4t+3) */
__device__ __forceinline__ void qm_ldmatrix_x4(uint32_t (&r)[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
/* d += A (16x32 u8, row) * B (32x8 s8, col): a0 (row g, k 4t..4t+3), a1 (row g+8, same k), a2 (row
 * g, k 16+4t..), a3 (row g+8, k 16+4t..); b0 (k 4t.., column g), b1 (k 16+4t..); d0 / d1 (row g,
 * columns 2t / 2t+1), d2 / d3 (row g+8) */
__device__ __forceinline__ void qm_mma(int (&d)[4], const uint32_t (&a)[4],
                                       const uint32_t (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#define QM_SYNCWARP() __syncwarp()
#endif

template <int B, int ND, int F>
__global__ void __launch_bounds__(QM_WARPS * 32) k_qgemv_mma(const __grid_constant__ qg_args A) {
    static_assert(B == 4 || B == 8, "mma GEMV: 4- or 8-bit codes");
    constexpr bool NORM = F & QG_NORM, ADD = F & QG_ADD, GLU = F & QG_GLU;
    constexpr int ROW = qm_geom<B>::ROW, ROWB = qm_geom<B>::ROWB, P = qm_geom<B>::P;
    constexpr int R = GLU ? 8 : 16; /* output rows of a tile */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int m = 0;
    if (!GLU)
        while (m + 1 < A.count && blockIdx.x >= A.first[m + 1]) m++;
    const int rows = A.rows[m], cols = A.cols;
    const int r0 = (int)(blockIdx.x - A.first[m]) * R;
    const int nblk = cols >> 5, nchunk = (nblk + 3) >> 2, gpr = cols >> A.group_log2;
    const int n16 = cols >> 4;
    /* the row this lane loads (tile row lane / 2; GLU: rows 8-15 from up) and its pieces */
    const int lr = lane >> 1, lmat = GLU ? lr >> 3 : m,
              lrow = min(r0 + (GLU ? lr & 7 : lr), rows - 1);
    const uint4 *wl = (const uint4 *)A.w[lmat] + (int64_t)lrow * (cols * B / 128) + (lane & 1) * P;
    auto load = [&](uint4(&v)[P], int ci) {
#pragma unroll
        for (int k = 0; k < P; k++) {
            const int pc = (lane & 1) * P + k, blk = ci * 4 + (B == 4 ? pc : pc >> 1);
            v[k] = ci < nchunk && blk < nblk ? kcu_load_stream16(wl + (int64_t)ci * (ROW / 16) + k)
                                             : make_uint4(0, 0, 0, 0);
        }
    };
    uint4 cur[P], nxt[P];
    load(cur, warp);
    kcu_pdl_wait(); /* pass 1's digits are complete from here on */
    kcu_pdl_trigger();

    /* this thread's rows for the scales: g and g + 8 (GLU: row g of gate and of up) */
    const int rg = min(r0 + g, rows - 1), rg8 = GLU ? rg : min(r0 + g + 8, rows - 1);
    const void *sg = A.scales[GLU ? 0 : m], *bg = A.biases[GLU ? 0 : m];
    const void *sg8 = A.scales[GLU ? 1 : m], *bg8 = A.biases[GLU ? 1 : m];
    const bool bf16 = A.sdt == KILN_DT_BF16;
    QG_DYN_SHARED(qm_smem);
    char *tile = (char *)qm_smem + (size_t)warp * 16 * ROWB;
    const char *dig = (const char *)A.dig;
    float acc0 = 0.0f, acc1 = 0.0f; /* rows g and g + 8 (used from the lanes t == 0) */
    for (int ci = warp; ci < nchunk; ci += QM_WARPS) {
        load(nxt, ci + QM_WARPS);
#pragma unroll
        for (int k = 0; k < P; k++)
            *(uint4 *)(tile + lr * ROWB + ((lane & 1) * P + k) * 16) = cur[k];
        QM_SYNCWARP();
        uint32_t w4[4] = {0, 0, 0, 0}; /* 4-bit: rows g / g+8 of blocks sb and sb + 1 */
#pragma unroll
        for (int sb = 0; sb < 4; sb++) {
            const int s = ci * 4 + sb;
            if (s >= nblk) break; /* the same for the whole warp */
            uint32_t a[4];
            const int mj = lane >> 3, mrow = (mj & 1) * 8 + (lane & 7);
            if constexpr (B == 4) {
                if ((sb & 1) == 0) qm_ldmatrix_x4(w4, tile + mrow * ROWB + (sb + (mj >> 1)) * 16);
                const uint32_t wg = w4[(sb & 1) * 2], wg8 = w4[(sb & 1) * 2 + 1];
                a[0] = wg & 0x0F0F0F0Fu, a[1] = wg8 & 0x0F0F0F0Fu;
                a[2] = (wg >> 4) & 0x0F0F0F0Fu, a[3] = (wg8 >> 4) & 0x0F0F0F0Fu;
            } else {
                qm_ldmatrix_x4(a, tile + mrow * ROWB + (2 * sb + (mj >> 1)) * 16);
            }
            /* B: digit g (g < ND) of the block's k's */
            uint32_t b[2] = {0, 0};
            if (g < ND) {
                if constexpr (B == 4) {
                    const uint2 d =
                        kcu_ld((const uint2 *)(dig + ((int64_t)g * n16 + (t >> 1) * nblk + s) * 16 +
                                               (t & 1) * 8));
                    b[0] = d.x, b[1] = d.y;
                } else {
                    const char *d = dig + ((int64_t)g * n16 + 2 * s) * 16 + 4 * t;
                    b[0] = kcu_ld((const uint32_t *)d), b[1] = kcu_ld((const uint32_t *)(d + 16));
                }
            }
            int c[4] = {0, 0, 0, 0};
            qm_mma(c, a, b);
            /* lane (g, 0): digits 0 and 1 of rows g (c0, c1) and g + 8 (c2, c3); lane + 1's c0 / c2
             * are digit 2 */
            const float h0 = __shfl_xor_sync(0xffffffffu, (float)c[0], 1);
            const float h2 = __shfl_xor_sync(0xffffffffu, (float)c[2], 1);
            float q0 = (float)c[0], q1 = (float)c[2];
            if constexpr (ND == 3) {
                q0 = fmaf(h0, 65536.0f, fmaf((float)c[1], 256.0f, q0));
                q1 = fmaf(h2, 65536.0f, fmaf((float)c[3], 256.0f, q1));
            }
            const float e = kcu_ld(A.E + s),
                        sx = kcu_ld(A.sx16 + 2 * s) + kcu_ld(A.sx16 + 2 * s + 1);
            const int grp = (s * 32) >> A.group_log2;
            const float s0 = qg_scale16(sg, (int64_t)rg * gpr + grp, bf16);
            const float b0 = qg_scale16(bg, (int64_t)rg * gpr + grp, bf16);
            const float s1 = qg_scale16(sg8, (int64_t)rg8 * gpr + grp, bf16);
            const float b1 = qg_scale16(bg8, (int64_t)rg8 * gpr + grp, bf16);
            acc0 = fmaf(s0 * e, q0, fmaf(b0, sx, acc0));
            acc1 = fmaf(s1 * e, q1, fmaf(b1, sx, acc1));
        }
        QM_SYNCWARP(); /* the tile is read before the next chunk is stored */
#pragma unroll
        for (int k = 0; k < P; k++) cur[k] = nxt[k];
    }

    QG_SHARED(float, part, [QM_WARPS][16]);
    QG_SHARED(float, nsc, [1]);
    if (t == 0) part[warp][g] = acc0, part[warp][g + 8] = acc1;
    if (NORM && warp == 0) {
        float q = 0.0f;
        for (int i = lane; i < nblk; i += 32) q += A.ssq[i];
        q = kcu_warp_sum(q);
        if (lane == 0) nsc[0] = rsqrtf(q / (float)cols + A.eps);
    }
    __syncthreads();
    if ((int)threadIdx.x < R) {
        const int i = threadIdx.x, row = r0 + i;
        if (row < rows) {
            float v = 0.0f;
            for (int k = 0; k < QM_WARPS; k++) v += part[k][i];
            if (NORM) v *= nsc[0];
            if (A.bias[GLU ? 0 : m]) v += A.bias[GLU ? 0 : m][row];
            if constexpr (GLU) {
                float u = 0.0f;
                for (int k = 0; k < QM_WARPS; k++) u += part[k][i + 8];
                if (NORM) u *= nsc[0];
                if (A.bias[1]) u += A.bias[1][row];
                A.y[0][row] = kcu_glu_act(v, A.act) * u;
            } else if constexpr (ADD) {
                A.y[m][row] += v;
            } else {
                A.y[m][row] = v;
            }
        }
    }
}

static int g_qg_rows = -1, g_qg_split = -1, g_qg_pdl = -1; /* < 0: from the environment */
static int g_qg_inline = -1, g_qg_inline_cols = -1;
extern "C" void kiln_cuda_set_qgemv_dp4a(int rows_per_warp, int split, int pdl) {
    g_qg_rows = rows_per_warp, g_qg_split = split, g_qg_pdl = pdl;
}
extern "C" void kiln_cuda_set_qgemv_inline(int mode) {
    g_qg_inline = mode;
}
static int qg_env(int *v, const char *name, int dflt) {
    if (*v < 0) {
        const char *e = getenv(name);
        *v = e && *e ? atoi(e) : dflt;
    }
    return *v;
}

/* Pass 2 as a programmatic dependent launch: where the backend launches so (st->pdl_on, Hopper)
 * unless KILN_CUDA_QGEMV_PDL=0 / kiln_cuda_set_qgemv_dp4a(..., pdl = 0). */
static bool qg_use_pdl(kcu_state *st) {
    return qg_env(&g_qg_pdl, "KILN_CUDA_QGEMV_PDL", 1) != 0 && st->pdl_on;
}

bool kcu_qgemv_dp4a_applies(const kiln_matrix *w, int64_t n) {
    return kiln_matrix_is_quantized(w) && (w->bits == 4 || w->bits == 8) && n >= 1 && n <= 8 &&
           (w->scale_dtype == KILN_DT_BF16 || w->scale_dtype == KILN_DT_F16) &&
           w->group_size >= 32 && (w->group_size & (w->group_size - 1)) == 0 &&
           w->cols % w->group_size == 0 && ((uintptr_t)w->data & 15) == 0 && w->rows < INT32_MAX &&
           w->cols < INT32_MAX / 8;
}

/* What one call of the dp4a GEMV computes (the kernel flags but QG_INL, which the launcher picks).
 */
struct qg_call {
    int flags, count;
    float *const *ys;
    const kiln_matrix *const *ws;
    const float *x;
    int64_t n;
    const float *norm_w;
    float eps;
    bool plus_one;
    int act;
    int rows_per_warp; /* 0: by n and flags */
};

/* Whether a launch in clusters (qg_emit_cluster) may be tried: cleared for the process when one
 * fails, after which emissions count arrivals in global memory (qg_emit) */
static bool g_qg_cluster_ok = true;
#ifndef QG_HOST_EMU
static long long g_qg_cluster_launches = 0; /* kiln_cuda_qgemv_cluster_launches_total */
#endif

template <int B, int NT, int RR, int F>
static void qg_launch(kcu_state *st, bool pdl, const qg_args &A, unsigned blocks, size_t smem) {
#ifdef QG_HOST_EMU /* the emulator's launch runs the blocks on emulated threads */
    (void)pdl;
    qe_cluster_dim = A.emit_cluster > 1 ? A.emit_cluster : 1;
    qe_spanning_emits += A.emit_dig && A.emit_arrivals > 1;
    KCU_LAUNCH(st, (k_qgemv_dp4a<B, NT, RR, F>), blocks, QG_WARPS * 32, smem, A);
    qe_cluster_dim = 1;
#else
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(QG_WARPS * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st->stream;
    cudaLaunchAttribute attr[2];
    unsigned na = 0;
    if (pdl) {
        attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (A.emit_cluster > 1) {
        attr[na].id = cudaLaunchAttributeClusterDimension;
        attr[na].val.clusterDim.x = (unsigned)A.emit_cluster;
        attr[na].val.clusterDim.y = attr[na].val.clusterDim.z = 1;
        na++;
    }
    cfg.attrs = attr;
    cfg.numAttrs = na;
    cudaError_t e = cudaLaunchKernelEx(&cfg, k_qgemv_dp4a<B, NT, RR, F>, A);
    if (e != cudaSuccess && A.emit_cluster > 1) { /* no clusters here: the meeting in global */
        (void)cudaGetLastError();
        KILN_LOG_W("cuda: qgemv link: a launch in clusters of %d failed (%s); counting arrivals "
                   "in global memory from here on",
                   A.emit_cluster, cudaGetErrorString(e));
        g_qg_cluster_ok = false;
        qg_args G = A;
        G.emit_cluster = 0;
        qg_launch<B, NT, RR, F>(st, pdl, G, blocks, smem);
        return;
    }
    if (e != cudaSuccess && pdl) { /* e.g. a driver without PDL: launch plainly */
        (void)cudaGetLastError();
        cfg.numAttrs = 0;
        e = cudaLaunchKernelEx(&cfg, k_qgemv_dp4a<B, NT, RR, F>, A);
    }
    if (e == cudaSuccess && A.emit_cluster > 1)
        __atomic_fetch_add(&g_qg_cluster_launches, 1, __ATOMIC_RELAXED);
    KCU_CHECK(st, e);
#endif
}

/* The instantiations: plain GEMV at every R (the bench's and tests' knob), the fusions at the
 * default R (QG_GLU: RR = 4, two rows of each matrix, at n = 1), QG_INL only at n = 1. */
template <int B, int NT, int F>
static bool qg_dispatch_rr(kcu_state *st, bool pdl, int rr, const qg_args &A, unsigned blocks,
                           size_t smem) {
    if constexpr (F == 0 || F == QG_INL) {
        if (rr == 1) return qg_launch<B, NT, 1, F>(st, pdl, A, blocks, smem), true;
        if (rr == 4) return qg_launch<B, NT, 4, F>(st, pdl, A, blocks, smem), true;
        if (rr == 2) return qg_launch<B, NT, 2, F>(st, pdl, A, blocks, smem), true;
        return false;
    } else {
        constexpr int RR = (F & QG_GLU) ? (NT == 1 ? 4 : 2) : NT == 4 ? 4 : 2;
        if (rr != RR) return false;
        qg_launch<B, NT, RR, F>(st, pdl, A, blocks, smem);
        return true;
    }
}

template <int B, int F>
static bool qg_dispatch_nt(kcu_state *st, bool pdl, int rr, const qg_args &A, unsigned blocks,
                           size_t smem) {
    const int n = A.n;
    if constexpr ((F & QG_INL) != 0) {
        return n == 1 && qg_dispatch_rr<B, 1, F>(st, pdl, rr, A, blocks, smem);
    } else {
        if (n == 1) return qg_dispatch_rr<B, 1, F>(st, pdl, rr, A, blocks, smem);
        if (n == 2) return qg_dispatch_rr<B, 2, F>(st, pdl, rr, A, blocks, smem);
        if (n <= 4) return qg_dispatch_rr<B, 4, F>(st, pdl, rr, A, blocks, smem);
        return qg_dispatch_rr<B, 8, F>(st, pdl, rr, A, blocks, smem);
    }
}

template <int B>
static bool qg_dispatch(kcu_state *st, bool pdl, int flags, int rr, const qg_args &A,
                        unsigned blocks, size_t smem) {
    switch (flags) {
    case 0:
        return qg_dispatch_nt<B, 0>(st, pdl, rr, A, blocks, smem);
    case QG_NORM:
        return qg_dispatch_nt<B, QG_NORM>(st, pdl, rr, A, blocks, smem);
    case QG_ADD:
        return qg_dispatch_nt<B, QG_ADD>(st, pdl, rr, A, blocks, smem);
    case QG_NORM | QG_GLU:
        return qg_dispatch_nt<B, QG_NORM | QG_GLU>(st, pdl, rr, A, blocks, smem);
    case QG_INL:
        return qg_dispatch_nt<B, QG_INL>(st, pdl, rr, A, blocks, smem);
    case QG_INL | QG_NORM:
        return qg_dispatch_nt<B, QG_INL | QG_NORM>(st, pdl, rr, A, blocks, smem);
    case QG_INL | QG_ADD:
        return qg_dispatch_nt<B, QG_INL | QG_ADD>(st, pdl, rr, A, blocks, smem);
    case QG_INL | QG_NORM | QG_GLU:
        return qg_dispatch_nt<B, QG_INL | QG_NORM | QG_GLU>(st, pdl, rr, A, blocks, smem);
    }
    return false;
}

/* Rows per warp of a call: the knob (plain GEMV only), else 4 for n = 3..4 and 2 otherwise;
 * QG_GLU: 4 at n = 1 (two rows of gate and up), else 2. */
static int qg_rows_per_warp(const qg_call &c) {
    if (c.flags & QG_GLU) return c.n == 1 ? 4 : 2;
    const int dflt = c.n >= 3 && c.n <= 4 ? 4 : 2;
    if (c.flags) return dflt;
    int R = c.rows_per_warp;
    return R == 1 || R == 2 || R == 4 ? R : dflt;
}

/* Fills A with c's matrices and the launch shape (KS, blocks per matrix); false when the kernel
 * does not apply to c. */
static bool qg_plan(kcu_state *st, const qg_call &c, qg_args &A, unsigned *blocks) {
    if (c.count < 1 || c.count > QG_MAX || c.n < 1 || c.n > 8) return false;
    const kiln_matrix *w0 = c.ws[0];
    for (int i = 0; i < c.count; i++) {
        const kiln_matrix *w = c.ws[i];
        if (!kcu_qgemv_dp4a_applies(w, c.n) || w->cols != w0->cols || w->bits != w0->bits ||
            w->group_size != w0->group_size || w->scale_dtype != w0->scale_dtype || w->rows < 1)
            return false;
    }
    if ((c.flags & QG_GLU) && (c.count != 2 || c.ws[1]->rows != w0->rows)) return false;
    const int B = w0->bits, cols = (int)w0->cols, rr = qg_rows_per_warp(c);
    const int R = (c.flags & QG_GLU) ? rr / 2 : rr; /* rows of one matrix per tile */
    memset(&A, 0, sizeof A);
    int64_t tiles = 0;
    for (int i = 0; i < c.count; i++) {
        A.y[i] = c.ys[i];
        A.w[i] = (const uint32_t *)c.ws[i]->data;
        A.scales[i] = c.ws[i]->scales;
        A.biases[i] = c.ws[i]->biases;
        A.bias[i] = c.ws[i]->bias;
        A.rows[i] = (int)c.ws[i]->rows;
        if (!(c.flags & QG_GLU) || i == 0) tiles += (c.ws[i]->rows + R - 1) / R;
    }
    A.count = c.count;
    A.sdt = (int)w0->scale_dtype;
    A.group_log2 = 5;
    while ((1 << A.group_log2) < w0->group_size) A.group_log2++;
    A.n = (int)c.n;
    A.cols = cols;
    A.x = c.x;
    A.norm_w = c.norm_w;
    A.eps = c.eps;
    A.plus_one = c.plus_one ? 1 : 0;
    A.act = c.act;
    A.nd = kcu_fast_math() ? 1 : 3;
    /* columns split between KS warps only when row tiles alone leave SMs short of warps */
    const int split = c.flags ? 0 : qg_env(&g_qg_split, "KILN_CUDA_QGEMV_KS", 0);
    int ks_log2 = 0;
    if (split == 1 || split == 2 || split == 4 || split == 8) {
        while ((1 << ks_log2) < split) ks_log2++;
    } else {
        const int64_t want = (int64_t)st->n_sms * 24, nch = cols / (128 / B);
        while (ks_log2 < 3 && (tiles << ks_log2) < want && nch >= (64 << ks_log2)) ks_log2++;
    }
    A.ks_log2 = ks_log2;
    const int tpb = QG_WARPS >> ks_log2;
    unsigned b = 0;
    for (int i = 0; i < c.count; i++) {
        A.first[i] = b;
        if (!(c.flags & QG_GLU) || i == 0)
            b += (unsigned)(((c.ws[i]->rows + R - 1) / R + tpb - 1) / tpb);
    }
    for (int i = c.count; i <= QG_MAX; i++) A.first[i] = b;
    *blocks = b;
    return true;
}

/* Pass 1's buffer for n tokens of cols columns: byte offsets of E [n, ng] f32, sx16 [n, 2ng] f32,
 * ssq [n, ng] f32 and the digits [n, 3, 2ng, 16] bytes (ng = cols / 32), and its size */
struct qg_digit_layout {
    size_t e, s, q, d, bytes;
};
static qg_digit_layout qg_layout(int64_t n, int cols) {
    const int ng = cols / 32;
    const size_t e_bytes = ((size_t)n * ng * 4 + 255) & ~(size_t)255;
    const size_t s_bytes = ((size_t)n * ng * 8 + 255) & ~(size_t)255;
    return {0, e_bytes, e_bytes + s_bytes, 2 * e_bytes + s_bytes,
            2 * e_bytes + s_bytes + (size_t)n * ng * 96};
}

/* Pass 1 of c into scratch (digits of x, or of x * norm_w and x's sums of squares with QG_NORM);
 * sets A's digit pointers. False when scratch could not grow (the sticky error is set). */
static bool qg_pass1(kcu_state *st, const qg_call &c, qg_args &A) {
    const int cols = (int)c.ws[0]->cols, ng = cols / 32;
    const qg_digit_layout lay = qg_layout(c.n, cols);
    char *scr = (char *)kcu_scratch(st, lay.bytes);
    if (!scr) return false;
    float *E = (float *)(scr + lay.e), *sx16 = (float *)(scr + lay.s);
    float *ssq = (float *)(scr + lay.q);
    int8_t *dig = (int8_t *)(scr + lay.d);
    const int64_t warps = c.n * ng;
    const bool norm = (c.flags & QG_NORM) != 0;
    KCU_LAUNCH(st, k_qx_digits, (unsigned)((warps + 7) / 8), 256, 0, dig, E, sx16, c.x, (int)c.n,
               cols, c.ws[0]->bits == 4 ? 1 : 0, norm ? c.norm_w : (const float *)NULL,
               c.plus_one ? 1 : 0, norm ? ssq : (float *)NULL, A.nd);
    KCU_LAUNCHED(st);
    A.dig = (const uint4 *)dig;
    A.E = E;
    A.sx16 = sx16;
    A.ssq = ssq;
    return true;
}

static void qg_pass2(kcu_state *st, const qg_call &c, int flags, const qg_args &A,
                     unsigned blocks) {
    const int cols = (int)c.ws[0]->cols;
    const size_t smem = (flags & QG_INL) ? (size_t)cols * 3 + (size_t)(cols / 32) * 16 : 0;
    const int rr = qg_rows_per_warp(c);
    const bool pdl = qg_use_pdl(st);
    const bool ok = c.ws[0]->bits == 4 ? qg_dispatch<4>(st, pdl, flags, rr, A, blocks, smem)
                                       : qg_dispatch<8>(st, pdl, flags, rr, A, blocks, smem);
    if (!ok) kcu_report(st, "qgemv_dp4a", "no kernel instance for the call", __FILE__, __LINE__);
}

/* The tensor-core variant (k_qgemv_mma) at n = 1: 0 off (default), 1 on; < 0 back to env
 * KILN_CUDA_QGEMV_MMA. */
static int g_qg_mma = -1;
extern "C" void kiln_cuda_set_qgemv_mma(int on) {
    g_qg_mma = on;
}

template <int B, int ND>
static bool qm_launch_f(kcu_state *st, int flags, const qg_args &A, unsigned blocks) {
    const size_t smem = qm_smem_bytes(B);
    switch (flags) {
    case 0:
        KCU_LAUNCH(st, (k_qgemv_mma<B, ND, 0>), blocks, QM_WARPS * 32, smem, A);
        return true;
    case QG_NORM:
        KCU_LAUNCH(st, (k_qgemv_mma<B, ND, QG_NORM>), blocks, QM_WARPS * 32, smem, A);
        return true;
    case QG_ADD:
        KCU_LAUNCH(st, (k_qgemv_mma<B, ND, QG_ADD>), blocks, QM_WARPS * 32, smem, A);
        return true;
    case QG_NORM | QG_GLU:
        KCU_LAUNCH(st, (k_qgemv_mma<B, ND, QG_NORM | QG_GLU>), blocks, QM_WARPS * 32, smem, A);
        return true;
    }
    return false;
}

/* c (n = 1, planned into A) on the tensor-core kernel: pass 1, then one block per tile of 16
 * rows (QG_GLU: 8 rows of gate and of up) of every matrix. */
static void qm_run(kcu_state *st, const qg_call &c, qg_args &A) {
    const int R = (c.flags & QG_GLU) ? 8 : 16;
    unsigned b = 0;
    for (int i = 0; i < c.count; i++) {
        A.first[i] = b;
        if (!(c.flags & QG_GLU) || i == 0) b += (unsigned)((c.ws[i]->rows + R - 1) / R);
    }
    for (int i = c.count; i <= QG_MAX; i++) A.first[i] = b;
    if (!qg_pass1(st, c, A)) return; /* the sticky error is set */
    const int bits = c.ws[0]->bits;
    const bool ok = bits == 4 ? (A.nd == 1 ? qm_launch_f<4, 1>(st, c.flags, A, b)
                                           : qm_launch_f<4, 3>(st, c.flags, A, b))
                              : (A.nd == 1 ? qm_launch_f<8, 1>(st, c.flags, A, b)
                                           : qm_launch_f<8, 3>(st, c.flags, A, b));
    if (ok)
        KCU_LAUNCHED(st);
    else
        kcu_report(st, "qgemv_mma", "no kernel instance for the call", __FILE__, __LINE__);
}

/* ---- x's digits handed from one GEMV to the next (backend.h feeds_next) ----
 * Each quantized GEMV of a decode layer starts with pass 1, a launch of its own that the GEMV
 * waits for (measured on an H100: the 8B's batch-1 decode without any pass 1 would run 8-14%
 * faster). When the model says that the op writing x feeds a GEMV of x next (the hint), the
 * GEMV writing x also writes x's digits (qg_emit) into one of two hand-off buffers, and the next
 * GEMV reads them instead of running pass 1 — if it comes next (no CUDA call between: launch_seq)
 * and reads the same x with the same token count, columns, digit layout, mode and norm weight.
 * The digits are pass 1's bits, so results do not change (test_cuda_ops' test_qgemv_link checks
 * it on the GPU, where the blocks of a group race; the emulator runs them one after another).
 * Opt-in (KILN_CUDA_QGEMV_LINK=1): on an H100 the 8B's batch-1 decode measured level to +3%,
 * since the producer's meeting per group costs about what pass 1 did (docs/gpu.md, twenty-third
 * session). KILN_CUDA_QGEMV_LINK=2 makes that meeting a cluster's (no global atomics or fences:
 * qg_emit_cluster). */
struct qg_link {
    /* the hint (feeds_next): the next GEMV writing hint_x feeds a GEMV of it (through the norm
     * with hint_norm_w when set), valid while launch_seq is hint_seq */
    const float *hint_x, *hint_norm_w;
    bool hint_plus_one, hint_set;
    unsigned long long hint_seq;
    /* the last emission: x's digits at dig / E / sx16 / ssq, valid while launch_seq is seq */
    bool valid;
    unsigned long long seq;
    const float *x, *norm_w;
    bool plus_one;
    int64_t n;
    int cols, perm4, nd, side;
    const uint4 *dig;
    const float *E, *sx16, *ssq;
    void *buf[2]; /* the two hand-off buffers (a GEMV may read one while it writes the other) */
    size_t cap[2];
    void *count; /* [groups] arrival counts, zero between launches */
    size_t count_cap;
    long long taken;            /* GEMVs that read handed-on digits */
    long long emitted, by_attn; /* emissions (host side: a replayed graph counts once), of them
                                 * by attention */
    int last_perm4; /* the digit order of the last GEMV (4-bit: 1), which a producer that is
                     * not a GEMV assumes for the next (a mismatch only costs pass 1) */
};
static int g_qg_link = -1;
static long long g_qg_links_total = 0; /* kiln_cuda_qgemv_links_total */
extern "C" void kiln_cuda_set_qgemv_link(int mode) {
    g_qg_link = mode;
}
void kcu_qg_link_free(kcu_state *st) {
    qg_link *L = st->qg_link;
    if (!L) return;
#ifndef QG_HOST_EMU
    KILN_LOG_I("cuda: qgemv link: %lld GEMVs read digits handed on, of %lld emitted (%lld by "
               "attention; steps replayed from a graph not counted)",
               L->taken, L->emitted, L->by_attn);
#endif
    void *bufs[3] = {L->buf[0], L->buf[1], L->count};
    for (void *b : bufs)
        if (b) {
#ifdef QG_HOST_EMU
            qe_dev_free(b);
#else
            cudaFree(b);
#endif
        }
    free(L);
    st->qg_link = NULL;
}
/* The hint of backend.h feeds_next for st (dropped when the knob is off or memory is short). */
void kcu_qg_hint(kcu_state *st, const float *x, const float *norm_w, bool plus_one) {
    if (qg_env(&g_qg_link, "KILN_CUDA_QGEMV_LINK", 0) == 0) return;
    if (!st->qg_link) st->qg_link = (qg_link *)calloc(1, sizeof(qg_link));
    qg_link *L = st->qg_link;
    if (!L) return;
    L->hint_x = x, L->hint_norm_w = norm_w, L->hint_plus_one = plus_one;
    L->hint_seq = st->launch_seq;
    L->hint_set = true;
}

void kcu_qg_hint_carry(kcu_state *st, const float *x, unsigned long long seq0) {
    qg_link *L = st->qg_link;
    if (L && L->hint_set && L->hint_x == x && L->hint_seq == seq0) L->hint_seq = st->launch_seq;
}

/* The hint for x, used up either way: when it holds (given just before, for x, and ok: a norm
 * only where the producer can make its digits), the hand-off buffer the last emission did not
 * use, grown to lay's bytes for n tokens of cols columns; else NULL. */
static char *qg_link_buffer(kcu_state *st, const float *x, bool ok, int64_t n, int cols,
                            qg_digit_layout &lay) {
    qg_link *L = st->qg_link;
    if (!L || !L->hint_set) return NULL;
    L->hint_set = false;
    if (!ok || L->hint_seq != st->launch_seq || L->hint_x != x) return NULL;
    lay = qg_layout(n, cols);
    const int side = L->side ^ 1;
    char *b = (char *)kcu_grow(st, &L->buf[side], &L->cap[side], lay.bytes, false);
    if (b) L->side = side;
    return b;
}
/* After the producer's launch: the digits of x [n, cols] (times norm_w when set) it made, which
 * the next GEMV may take while nothing else runs */
static void qg_link_record(kcu_state *st, const float *x, int64_t n, int cols, const float *norm_w,
                           bool plus_one, const kcu_qx_emit &e) {
    qg_link *L = st->qg_link;
    L->valid = true;
    L->emitted++;
    L->seq = st->launch_seq;
    L->x = x, L->n = n, L->cols = cols;
    L->norm_w = norm_w, L->plus_one = plus_one;
    L->perm4 = e.perm4, L->nd = e.nd;
    L->dig = (const uint4 *)e.dig, L->E = e.E, L->sx16 = e.sx16, L->ssq = e.ssq;
}

/* A producer that is not a GEMV (kcu_qx_emit): x without a norm, in the digit order of the last
 * GEMV. */
bool kcu_qg_link_claim(kcu_state *st, const float *x, int64_t n, int cols, kcu_qx_emit *e) {
    const qg_link *L = st->qg_link;
    const bool ok = L && !L->hint_norm_w && n >= 1 && n <= 8 && cols >= 32 && cols % 32 == 0;
    qg_digit_layout lay;
    char *b = qg_link_buffer(st, x, ok, n, cols, lay);
    if (!b) return false;
    e->E = (float *)(b + lay.e), e->sx16 = (float *)(b + lay.s), e->dig = (int8_t *)(b + lay.d);
    e->ssq = NULL;
    e->perm4 = L->last_perm4;
    e->nd = kcu_fast_math() ? 1 : 3;
    return true;
}
void kcu_qg_link_emitted(kcu_state *st, const float *x, int64_t n, int cols, const kcu_qx_emit *e) {
    qg_link_record(st, x, n, cols, NULL, false, *e);
    st->qg_link->by_attn++;
}

/* Consumer: c's x digits from the last emission when it matches (A's digit pointers set, true);
 * the emission is used up either way. */
static bool qg_link_take(kcu_state *st, const qg_call &c, qg_args &A) {
    qg_link *L = st->qg_link;
    if (!L || !L->valid) return false;
    L->valid = false;
    const bool norm = (c.flags & QG_NORM) != 0;
    if (L->seq != st->launch_seq || L->x != c.x || L->n != c.n || L->cols != c.ws[0]->cols ||
        L->perm4 != (c.ws[0]->bits == 4 ? 1 : 0) || L->nd != A.nd ||
        (norm ? L->norm_w != c.norm_w || L->plus_one != c.plus_one : L->norm_w != NULL))
        return false;
    A.dig = L->dig, A.E = L->E, A.sx16 = L->sx16, A.ssq = L->ssq;
    L->taken++;
    __atomic_fetch_add(&g_qg_links_total, 1, __ATOMIC_RELAXED);
    return true;
}

/* Producer: when the hint names c's output, sets A's emission (true) into the hand-off buffer
 * the last emission did not use. The hint is used up either way. */
static bool qg_link_emit(kcu_state *st, const qg_call &c, qg_args &A) {
    const int rows = (int)c.ws[0]->rows, rr = qg_rows_per_warp(c);
    const int R = (c.flags & QG_GLU) ? rr / 2 : rr, rpb = (QG_WARPS >> A.ks_log2) * R;
    /* one output (GLU's, or one matrix's) whose blocks' rows each lie in one 32-row group */
    const bool ok = ((c.flags & QG_GLU) || c.count == 1) && rows % 32 == 0 && 32 % rpb == 0;
    qg_digit_layout lay;
    char *b = qg_link_buffer(st, c.ys[0], ok, c.n, rows, lay);
    qg_link *L = st->qg_link;
    unsigned *count = b ? (unsigned *)kcu_grow(st, &L->count, &L->count_cap,
                                               (size_t)(rows / 32) * sizeof(unsigned), true)
                        : NULL;
    if (!count) return false;
    A.emit_E = (float *)(b + lay.e), A.emit_sx16 = (float *)(b + lay.s);
    A.emit_ssq = (float *)(b + lay.q), A.emit_dig = (int8_t *)(b + lay.d);
    A.emit_count = count;
    A.emit_norm_w = L->hint_norm_w, A.emit_plus_one = L->hint_plus_one ? 1 : 0;
    A.emit_perm4 = c.ws[0]->bits == 4 ? 1 : 0;
    A.emit_arrivals = 32 / rpb;
    /* KILN_CUDA_QGEMV_LINK=2: the group's blocks meet as a cluster (sm_90; at most 8 blocks) */
    A.emit_cluster = qg_env(&g_qg_link, "KILN_CUDA_QGEMV_LINK", 0) == 2 && st->sm90 &&
                             g_qg_cluster_ok && A.emit_arrivals <= 8
                         ? A.emit_arrivals
                         : 0;
    return true;
}
/* After the producer's launch: what it emits, for the next GEMV */
static void qg_link_emitted(kcu_state *st, const qg_call &c, const qg_args &A) {
    const kcu_qx_emit e = {A.emit_dig, A.emit_E, A.emit_sx16, A.emit_ssq, A.emit_perm4, A.nd};
    qg_link_record(st, c.ys[0], c.n, (int)c.ws[0]->rows, A.emit_norm_w, A.emit_plus_one != 0, e);
}

/* Runs c as one pass-2 launch over all its matrices, preceded by pass 1 unless the blocks make x's
 * digits themselves (QG_INL: n = 1, cols <= QG_INL_COLS). Every block repeats that digit work (a
 * warp makes 32 columns' digits in ~40 instructions, about the issue slots of its share of a q4
 * GEMV), which pays only where launches, not the weight stream, bound the time: by default where
 * the grid's digit work is at most KILN_CUDA_QGEMV_INLINE_COLS (6144) columns per SM, ~1 us of
 * issue, less than a launch (Qwen3-0.6B's layer matrices; not Llama-3-8B's or any LM head). Knob
 * KILN_CUDA_QGEMV_INLINE / kiln_cuda_set_qgemv_inline: 0 never, 1 wherever it fits, 2 by that
 * budget. The digits may instead come from the GEMV before (qg_link). False (nothing launched)
 * when the kernel does not apply. */
static bool qg_run(kcu_state *st, const qg_call &c) {
    qg_args A;
    unsigned blocks = 0;
    if (!qg_plan(st, c, A, &blocks)) return false;
    if (c.n == 1 && qg_env(&g_qg_mma, "KILN_CUDA_QGEMV_MMA", 0) == 1) {
        qm_run(st, c, A);
        return true;
    }
    const int inl_mode = qg_env(&g_qg_inline, "KILN_CUDA_QGEMV_INLINE", 2);
    const int64_t budget = qg_env(&g_qg_inline_cols, "KILN_CUDA_QGEMV_INLINE_COLS", 6144);
    const bool inl = kcu_qfused_enabled() && inl_mode != 0 && c.n == 1 &&
                     c.ws[0]->cols <= QG_INL_COLS &&
                     (inl_mode == 1 || (int64_t)blocks * c.ws[0]->cols <= budget * st->n_sms);
    /* x's digits: handed on by the GEMV before, made in the blocks, or pass 1 */
    if (st->qg_link) st->qg_link->last_perm4 = c.ws[0]->bits == 4 ? 1 : 0;
    const bool linked = !inl && qg_link_take(st, c, A);
    if (inl && st->qg_link) st->qg_link->valid = false; /* makes its own: the emission is used up */
    const bool emits = qg_link_emit(st, c, A);
    if (!inl && !linked && !qg_pass1(st, c, A)) return true; /* the sticky error is set */
    qg_pass2(st, c, c.flags | (inl ? QG_INL : 0), A, blocks);
    if (emits) qg_link_emitted(st, c, A);
    return true;
}

/* ys[i] = x @ ws[i]^T for count matrices that all take the dp4a kernel with the same cols and
 * bits: one launch for all of them where they share group size and scale dtype (and no pass 1
 * where QG_INL applies); with KILN_CUDA_FUSED=0, as before the fusions: x's digits once, then one
 * launch per matrix. */
bool kcu_qgemv_dp4a_multi(kcu_state *st, int count, float *const *ys, const float *x, int64_t n,
                          const kiln_matrix *const *ws) {
    if (count < 1) return false;
    qg_call c = {};
    c.x = x;
    c.n = n;
    c.rows_per_warp = qg_env(&g_qg_rows, "KILN_CUDA_QGEMV_ROWS", 0);
    if (kcu_qfused_enabled() && count <= QG_MAX) {
        c.count = count, c.ys = ys, c.ws = ws;
        if (qg_run(st, c)) return true;
    }
    for (int i = 0; i < count; i++)
        if (!kcu_qgemv_dp4a_applies(ws[i], n) || ws[i]->cols != ws[0]->cols ||
            ws[i]->bits != ws[0]->bits || ws[i]->rows < 1)
            return false;
    qg_args A = {};
    unsigned blocks = 0;
    for (int i = 0; i < count; i++) {
        c.count = 1, c.ys = ys + i, c.ws = ws + i;
        const uint4 *dig = A.dig;
        const float *E = A.E, *sx16 = A.sx16;
        if (!qg_plan(st, c, A, &blocks)) return false; /* not past 0: checked above */
        if (i == 0) {
            if (!qg_pass1(st, c, A)) return true;
        } else {
            A.dig = dig, A.E = E, A.sx16 = sx16;
        }
        qg_pass2(st, c, 0, A, blocks);
    }
    return true;
}

#ifndef QG_HOST_EMU
extern "C" long long kiln_cuda_qgemv_links_total(void) {
    return __atomic_load_n(&g_qg_links_total, __ATOMIC_RELAXED);
}
extern "C" long long kiln_cuda_qgemv_cluster_launches_total(void) {
    return __atomic_load_n(&g_qg_cluster_launches, __ATOMIC_RELAXED);
}
extern "C" int kiln_cuda_qgemv_clusters_supported(void) {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return major == 9; /* as kcu_state.sm90 */
}
extern "C" void kcu_feeds_next(kiln_backend *be, const float *x, const float *norm_w, float eps,
                               bool plus_one) {
    (void)eps; /* the digits do not depend on it: the GEMV applies the norm's scale itself */
    kcu_qg_hint(kcu_st(be), x, norm_w, plus_one);
}
#endif

bool kcu_qgemv_dp4a(kcu_state *st, float *y, const float *x, int64_t n, const kiln_matrix *w) {
    return kcu_qgemv_dp4a_multi(st, 1, &y, x, n, &w);
}

/* The fusions (backend.h) on the dp4a GEMV; false (nothing launched) where it does not apply. */
bool kcu_qgemv_dp4a_norm(kcu_state *st, int count, float *const *ys, const float *x, int64_t n,
                         const kiln_matrix *const *ws, const float *norm_w, float eps,
                         bool plus_one) {
    qg_call c = {};
    c.flags = QG_NORM, c.count = count, c.ys = ys, c.ws = ws, c.x = x, c.n = n;
    c.norm_w = norm_w, c.eps = eps, c.plus_one = plus_one;
    return qg_run(st, c);
}

bool kcu_qgemv_dp4a_add(kcu_state *st, float *y, const float *x, int64_t n, const kiln_matrix *w) {
    qg_call c = {};
    c.flags = QG_ADD, c.count = 1, c.ys = &y, c.ws = &w, c.x = x, c.n = n;
    return qg_run(st, c);
}

bool kcu_qgemv_dp4a_norm_glu(kcu_state *st, float *out, const float *x, int64_t n,
                             const kiln_matrix *wg, const kiln_matrix *wu, const float *norm_w,
                             float eps, bool plus_one, int act) {
    float *const ys[2] = {out, out};
    const kiln_matrix *const ws[2] = {wg, wu};
    qg_call c = {};
    c.flags = QG_NORM | QG_GLU, c.count = 2, c.ys = ys, c.ws = ws, c.x = x, c.n = n;
    c.norm_w = norm_w, c.eps = eps, c.plus_one = plus_one, c.act = act;
    return qg_run(st, c);
}
