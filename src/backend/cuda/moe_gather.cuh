/* moe_gather.cuh — the MoE block on the device, with no wait for the host (internal; moe.cu
 * launches these): the router's top-k choice per token (k_moe_route), the experts' matmuls on
 * the rows each (token, choice) pair selected (k_moe_gather: a GEMV whose weight rows come from
 * the stack slice of the expert named in device memory; with glu, gate and up rows of the pair and
 * the activation in the same warp), and the weighted sum of a token's expert outputs
 * (k_moe_combine). Semantics: the CPU references kiln_cpu_moe_route_ref,
 * kiln_cpu_matmul_gather_ref, kiln_cpu_matmul_gather_glu_ref and kiln_cpu_moe_combine_ref
 * (cpu_ops.h).
 *
 * The gather GEMV gives each output row one warp: lanes read 16-byte pieces of the row (dense: 8
 * values; quantized: 32 codes = B words with their group's scale and bias) two at a time and the
 * warp sums. blockIdx.y is the pair, blockIdx.x a group of MOEG_WARPS rows of its expert. A decode
 * step of a 30B-A3B shape (8 pairs x 768 rows) is 6144 warps, enough to stream the experts.
 * tests/emu/moe_emulate.cc compiles this file on the CPU (MOE_HOST_EMU). */
#ifndef KILN_CUDA_MOE_GATHER_CUH
#define KILN_CUDA_MOE_GATHER_CUH

#ifndef MOE_HOST_EMU
#include "backend/cuda/cuda_common.cuh"
#define MOE_SMEM(name) extern __shared__ float name[]
#endif
#include "backend/cuda/quant_words.cuh"

#include <stdint.h>

#define MOEG_WARPS    4   /* gather GEMV: warps (rows) per block */
#define MOER_THREADS  128 /* route: threads per token */
#define MOEC_THREADS  256 /* combine: threads per block (one hidden element each) */
#define MOEG_MAX_GRID 65535

/* One stack read by the gather: dense [E*stride, cols] or codes [E*stride, cols*bits/32] with
 * scales / biases [E*stride, cols/group]; expert e's rows start at e*stride + row_off. */
struct moeg_mat {
    const void *w, *scales, *biases;
    const float *bias; /* output bias [E*stride] or NULL */
    int64_t row_off;
};

/* matmul_gather (glu 0): y[i, rows] = x[i / x_div, cols] @ W_e^T (+ bias_e) with e = experts[i],
 * for the pairs i0 <= i < i0 + gridDim.y. matmul_gather_glu (glu 1): y[i, rows] =
 * act(x_i @ G_e^T) * (x_i @ U_e^T), G from m[0], U from m[1]. */
struct moeg_args {
    float *y;               /* [n, rows] */
    const float *x;         /* [ceil(n / x_div), cols] */
    const int32_t *experts; /* [n] */
    moeg_mat m[2];          /* the matrix (gate), up */
    int64_t rows, cols, x_div, i0, stride;
    int n_experts, sdt, group, glu, act;
};

/* Eight consecutive weights at p (16-byte aligned) of a dense dtype, as f32. */
template <int DT> __device__ __forceinline__ void moeg_load8(const void *p, float (&v)[8]) {
    if constexpr (DT == KILN_DT_F32) {
        const float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
    } else {
        const uint4 u = __ldg((const uint4 *)p);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (DT == KILN_DT_BF16) {
                v[2 * i] = __uint_as_float(w[i] << 16);
                v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
            } else {
                v[2 * i] = kcu_f16((uint16_t)(w[i] & 0xffffu));
                v[2 * i + 1] = kcu_f16((uint16_t)(w[i] >> 16));
            }
        }
    }
}

/* The lane's shares of row wrow . xs[q] for the first np <= NP x rows, dense weights (cols % 8 ==
 * 0, rows and x 16-byte aligned): 8-value pieces of the row, two in flight, each used for every x.
 * A pair's arithmetic does not depend on NP or on the other rows (the grouped gather gives the
 * same bits as the per-pair one). */
template <int DT, int NP>
__device__ __forceinline__ void moeg_dot_dense(const moeg_mat &m, int64_t wrow,
                                               const float *const (&xs)[NP], int np, int64_t cols,
                                               int lane, float (&acc)[NP]) {
    const int64_t es = DT == KILN_DT_F32 ? 4 : 2;
    const char *wp = (const char *)m.w + wrow * cols * es;
#pragma unroll
    for (int q = 0; q < NP; q++) acc[q] = 0.0f;
    for (int64_t c = (int64_t)lane * 8; c < cols; c += 2 * 256) {
        float wv[2][8];
        const bool second = c + 256 < cols;
        moeg_load8<DT>(wp + c * es, wv[0]);
        if (second) moeg_load8<DT>(wp + (c + 256) * es, wv[1]);
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (u == 1 && !second) break;
#pragma unroll
            for (int q = 0; q < NP; q++) {
                if (q >= np) break;
                const float4 *xp = (const float4 *)(xs[q] + c + u * 256);
                const float4 a = kcu_ld(xp), b = kcu_ld(xp + 1);
                const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int k = 0; k < 8; k++) acc[q] = fmaf(wv[u][k], xv[k], acc[q]);
            }
        }
    }
}

/* The same for B-bit codes (cols % 32 == 0, group % 32 == 0, codes aligned for load_words):
 * 32-code pieces, two in flight; per piece (one group)
 * sum_j (s*q_j + b) x_j = s*2^B (sum_j f_j x_j - sum_j x_j) + b sum_j x_j (code_f1). */
template <int B, int NP>
__device__ __forceinline__ void moeg_dot_quant(const moeg_mat &m, int64_t wrow,
                                               const float *const (&xs)[NP], int np, int64_t cols,
                                               int group, int sdt, int lane, float (&acc)[NP]) {
    const int64_t wpr = cols / 32 * B, g0 = wrow * (cols / group);
    const uint32_t *wp = (const uint32_t *)m.w + wrow * wpr;
    const float scale_b = (float)(1 << B);
#pragma unroll
    for (int q = 0; q < NP; q++) acc[q] = 0.0f;
    for (int64_t c = (int64_t)lane * 32; c < cols; c += 2 * 1024) {
        uint32_t wd[2][B];
        float s[2], bb[2];
        const bool second = c + 1024 < cols;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (u == 1 && !second) break;
            const int64_t cu = c + u * 1024;
            load_words<B>(wp + cu / 32 * B, wd[u]);
            s[u] = kcu_load(m.scales, g0 + cu / group, sdt) * scale_b;
            bb[u] = kcu_load(m.biases, g0 + cu / group, sdt);
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (u == 1 && !second) break;
#pragma unroll
            for (int q = 0; q < NP; q++) {
                if (q >= np) break;
                const float4 *xp = (const float4 *)(xs[q] + c + u * 1024);
                float d = 0.0f, sx = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const float4 a = kcu_ld(xp + k);
                    sx += (a.x + a.y) + (a.z + a.w);
                    d = fmaf(code_f1<B>(wd[u], 4 * k), a.x, d);
                    d = fmaf(code_f1<B>(wd[u], 4 * k + 1), a.y, d);
                    d = fmaf(code_f1<B>(wd[u], 4 * k + 2), a.z, d);
                    d = fmaf(code_f1<B>(wd[u], 4 * k + 3), a.w, d);
                }
                acc[q] = fmaf(s[u], d - sx, fmaf(bb[u], sx, acc[q]));
            }
        }
    }
}

/* act(g) of a gated linear unit (kiln_glu_act): SiLU, or GELU with the tanh approximation. */
__device__ __forceinline__ float moeg_act(float g, int act) {
    if (act == KILN_GLU_GELU_TANH)
        return 0.5f * g * (1.0f + kcu_tanh(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    return g / (1.0f + expf(-g));
}

/* Row `row` of expert e for the first np <= NP pairs: out[q] = the plain product, or act(gate) *
 * up with glu, output biases added; written by lane 0 to y[pairs[q], row]. */
template <int F, int NP>
__device__ __forceinline__ void moeg_rows(const moeg_args &A, int e, int64_t row,
                                          const int64_t (&pairs)[NP], int np, int lane) {
    const float *xs[NP];
#pragma unroll
    for (int q = 0; q < NP; q++) xs[q] = A.x + (pairs[q < np ? q : 0] / A.x_div) * A.cols;
    float v[2][NP] = {};
    for (int p = 0; p <= A.glu; p++) {
        const moeg_mat &m = A.m[p];
        const int64_t wrow = (int64_t)e * A.stride + m.row_off + row;
        float acc[NP];
        if constexpr (F >= 100)
            moeg_dot_quant<F - 100, NP>(m, wrow, xs, np, A.cols, A.group, A.sdt, lane, acc);
        else
            moeg_dot_dense<F, NP>(m, wrow, xs, np, A.cols, lane, acc);
        const float bias = m.bias ? m.bias[wrow] : 0.0f;
#pragma unroll
        for (int q = 0; q < NP; q++)
            if (q < np) v[p][q] = kcu_warp_sum(acc[q]) + bias;
    }
    if (lane == 0) {
#pragma unroll
        for (int q = 0; q < NP; q++)
            if (q < np)
                A.y[pairs[q] * A.rows + row] = A.glu ? moeg_act(v[0][q], A.act) * v[1][q] : v[0][q];
    }
}

/* A warp per output row (blockIdx.x * MOEG_WARPS + warp) of pair i0 + blockIdx.y: the expert id
 * read on the device picks the stack rows (one outside [0, E) writes NaN: a routing bug shows
 * instead of reading another matrix). F: a dense dtype (KILN_DT_*) or 100 + bits. */
template <int F>
__global__ void __launch_bounds__(MOEG_WARPS * 32)
    k_moe_gather(const __grid_constant__ moeg_args A) {
    KCU_PDL_ENTER();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * MOEG_WARPS + warp, i = A.i0 + blockIdx.y;
    if (row >= A.rows) return;
    const int e = kcu_ld(A.experts + i);
    if (e < 0 || e >= A.n_experts) {
        if (lane == 0) A.y[i * A.rows + row] = __uint_as_float(0x7fc00000u);
        return;
    }
    const int64_t pairs[1] = {i};
    moeg_rows<F, 1>(A, e, row, pairs, 1, lane);
}

/* The grouped form, for batches whose pairs share experts: the pairs bucketed by expert
 * (k_moe_group: offsets [E+2], list [n]; bucket E holds pairs whose id is outside [0, E)), then
 * block (x, e) reads each of its MOEG_WARPS rows of expert e once per MOEG_NP of e's pairs, where
 * the per-pair gather reads it once per pair. The same bits as k_moe_gather. */
#define MOEG_NP            8
#define MOEG_GROUP_THREADS 1024
struct moeg_group_args {
    const int32_t *experts; /* [n] */
    int32_t *offsets;       /* [E + 2]: bucket e is list[offsets[e] .. offsets[e + 1]) */
    int32_t *list;          /* [n] pair ids */
    int n, n_experts;
    /* or NULL: the token tiles of the tensor-core expert GEMM (gemm_tc.cu), [max_tiles, 4]:
     * {e, first, end, 0} for the tiles first = offsets[e] + j * tile_tokens < end = offsets[e+1]
     * of each expert in order, then {-1, 0, 0, 0} */
    int32_t *tiles;
    int tile_tokens, max_tiles;
};
static inline size_t moeg_group_smem_bytes(int n_experts) {
    return (size_t)(2 * n_experts + 2) * sizeof(int);
}
/* One block: count the pairs of each bucket, lay the buckets (and the experts' token tiles) out
 * in expert order (thread 0), then place each pair (its place inside the bucket is the order of
 * arrival: a pair's result does not depend on it) and write the tiles. */
__global__ void __launch_bounds__(MOEG_GROUP_THREADS)
    k_moe_group(const __grid_constant__ moeg_group_args A) {
    KCU_PDL_ENTER();
    MOE_SMEM(sm);
    const int E = A.n_experts;
    int *cursor = (int *)sm;      /* [E + 1] counts, then each bucket's next free place */
    int *tfirst = cursor + E + 1; /* [E + 1] each expert's first tile */
    for (int e = threadIdx.x; e <= E; e += blockDim.x) cursor[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < A.n; i += blockDim.x) {
        const int e = kcu_ld(A.experts + i);
        atomicAdd(&cursor[e >= 0 && e < E ? e : E], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int at = 0, tiles = 0;
        for (int e = 0; e <= E; e++) {
            const int c = cursor[e];
            A.offsets[e] = cursor[e] = at;
            tfirst[e] = tiles;
            at += c;
            if (e < E && A.tiles) tiles += (c + A.tile_tokens - 1) / A.tile_tokens;
        }
        A.offsets[E + 1] = at;
    }
    __syncthreads(); /* thread 0's offsets too (global writes are visible to the block now) */
    for (int i = threadIdx.x; i < A.n; i += blockDim.x) {
        const int e = kcu_ld(A.experts + i);
        A.list[atomicAdd(&cursor[e >= 0 && e < E ? e : E], 1)] = i;
    }
    for (int j = threadIdx.x; A.tiles && j < A.max_tiles; j += blockDim.x) {
        int32_t *t = A.tiles + 4 * (int64_t)j;
        if (j >= tfirst[E]) { /* past the last tile (max_tiles bounds the count) */
            t[0] = -1, t[1] = t[2] = t[3] = 0;
            continue;
        }
        int lo = 0, hi = E - 1; /* the last expert whose first tile is <= j: j's expert */
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (tfirst[mid] <= j)
                lo = mid;
            else
                hi = mid - 1;
        }
        t[0] = lo, t[1] = kcu_ld(A.offsets + lo) + (j - tfirst[lo]) * A.tile_tokens;
        t[2] = kcu_ld(A.offsets + lo + 1), t[3] = 0;
    }
}

template <int F>
__global__ void __launch_bounds__(MOEG_WARPS * 32)
    k_moe_gather_grouped(const __grid_constant__ moeg_args A, const int32_t *offsets,
                         const int32_t *list) {
    KCU_PDL_ENTER();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * MOEG_WARPS + warp;
    const int e = (int)blockIdx.y;
    if (row >= A.rows) return;
    const int begin = kcu_ld(offsets + e), end = kcu_ld(offsets + e + 1);
    if (e == A.n_experts) { /* pairs with an expert id outside the stack: NaN rows */
        for (int p = begin; lane == 0 && p < end; p++)
            A.y[(int64_t)kcu_ld(list + p) * A.rows + row] = __uint_as_float(0x7fc00000u);
        return;
    }
    for (int p0 = begin; p0 < end; p0 += MOEG_NP) {
        const int np = end - p0 < MOEG_NP ? end - p0 : MOEG_NP;
        int64_t pairs[MOEG_NP];
#pragma unroll
        for (int q = 0; q < MOEG_NP; q++) pairs[q] = q < np ? kcu_ld(list + p0 + q) : 0;
        moeg_rows<F, MOEG_NP>(A, e, row, pairs, np, lane);
    }
}

/* After the tensor-core expert GEMM (gemm_tc.cu expert mode) of matmul_gather_glu: gate and up
 * of sorted pair s (rows of g / u) into y row list[s] as act(gate) * up, NaN rows for the pairs
 * of bucket E (an expert id outside the stack). Block (x, y): 256 rows of sorted pairs y, y +
 * gridDim.y, ... */
#define MOES_THREADS 256
struct moes_args {
    float *y;               /* [n, rows] in pair order */
    const float *g, *u;     /* [n, rows] in sorted order (glu), or NULL */
    const int32_t *offsets; /* [E + 2] */
    const int32_t *list;    /* [n] */
    int64_t rows;
    int n, n_experts, act;
};
__global__ void __launch_bounds__(MOES_THREADS)
    k_moe_scatter_glu(const __grid_constant__ moes_args A) {
    KCU_PDL_ENTER();
    const int64_t r = (int64_t)blockIdx.x * MOES_THREADS + threadIdx.x;
    if (r >= A.rows) return;
    const int bad = kcu_ld(A.offsets + A.n_experts); /* sorted pairs from here: bucket E */
    for (int s = blockIdx.y; s < A.n; s += gridDim.y) {
        const int64_t i = kcu_ld(A.list + s);
        A.y[i * A.rows + r] =
            s >= bad ? __uint_as_float(0x7fc00000u)
                     : moeg_act(kcu_ld(A.g + s * A.rows + r), A.act) * kcu_ld(A.u + s * A.rows + r);
    }
}
/* The same for matmul_gather, whose GEMM wrote y in pair order: NaN rows for bucket E only. */
__global__ void __launch_bounds__(MOES_THREADS)
    k_moe_scatter_bad(const __grid_constant__ moes_args A) {
    KCU_PDL_ENTER();
    const int64_t r = (int64_t)blockIdx.x * MOES_THREADS + threadIdx.x;
    if (r >= A.rows) return;
    const int end = kcu_ld(A.offsets + A.n_experts + 1);
    for (int s = kcu_ld(A.offsets + A.n_experts); s < end; s++)
        A.y[(int64_t)kcu_ld(A.list + s) * A.rows + r] = __uint_as_float(0x7fc00000u);
}

/* moe_route: token blockIdx.x's top k of softmax(logits) (ties: lower index) into experts /
 * weights [T, k], renormalised when norm_topk, times expert_scale[expert] when given. */
struct moer_args {
    int32_t *experts;          /* [T, k] */
    float *weights;            /* [T, k] */
    const float *logits;       /* [T, E] */
    const float *expert_scale; /* [E] or NULL */
    int n_experts, top_k;
    bool norm_topk;
};
/* Dynamic shared memory (all of it, so that an emulated block shares it too): the reductions'
 * slots and the choices, then the token's logits and one taken flag per expert. */
struct moer_shared {
    float red_v[MOER_THREADS / 32];
    int red_i[MOER_THREADS / 32];
    float stat[2];  /* max, sum of exp */
    int chosen[64]; /* KILN_MOE_ROUTE_MAX_K */
    float chosen_w[64];
};
#define MOER_HEAD ((sizeof(moer_shared) + 15) / 16 * 16)
static inline size_t moer_smem_bytes(int n_experts) {
    return MOER_HEAD + (size_t)n_experts * sizeof(float) + (size_t)n_experts;
}

/* (v, i) beats (bv, bi): larger value, or equal value and lower index (NaN never beats). */
__device__ __forceinline__ bool moer_beats(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(MOER_THREADS) k_moe_route(const __grid_constant__ moer_args A) {
    KCU_PDL_ENTER();
    MOE_SMEM(sm);
    const int E = A.n_experts, K = A.top_k, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    moer_shared &S = *(moer_shared *)sm;
    float *lg = (float *)((char *)sm + MOER_HEAD);    /* [E] */
    unsigned char *taken = (unsigned char *)(lg + E); /* [E] */
    float *red_v = S.red_v, *stat = S.stat, *chosen_w = S.chosen_w;
    int *red_i = S.red_i, *chosen = S.chosen;
    const float *src = A.logits + (int64_t)blockIdx.x * E;
    float mx = -INFINITY;
    for (int e = tid; e < E; e += MOER_THREADS) {
        lg[e] = kcu_ld(src + e);
        taken[e] = 0;
        mx = fmaxf(mx, lg[e]);
    }
    mx = kcu_warp_max(mx);
    if (lane == 0) red_v[warp] = mx;
    __syncthreads();
    if (tid == 0) {
        float m = red_v[0];
        for (int w = 1; w < MOER_THREADS / 32; w++) m = fmaxf(m, red_v[w]);
        stat[0] = m;
    }
    __syncthreads();
    mx = stat[0];
    float sum = 0.0f;
    for (int e = tid; e < E; e += MOER_THREADS) sum += expf(lg[e] - mx);
    sum = kcu_warp_sum(sum);
    __syncthreads(); /* everyone has read stat[0] and red_v */
    if (lane == 0) red_v[warp] = sum;
    __syncthreads();
    if (tid == 0) {
        float s = 0.0f;
        for (int w = 0; w < MOER_THREADS / 32; w++) s += red_v[w];
        stat[1] = s;
    }
    for (int j = 0; j < K; j++) {
        __syncthreads(); /* taken[] and red_* from the last round are settled */
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = tid; e < E; e += MOER_THREADS)
            if (!taken[e] && moer_beats(lg[e], e, bv, bi)) bv = lg[e], bi = e;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (moer_beats(ov, oi, bv, bi)) bv = ov, bi = oi;
        }
        if (lane == 0) red_v[warp] = bv, red_i[warp] = bi;
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < MOER_THREADS / 32; w++)
                if (moer_beats(red_v[w], red_i[w], bv, bi)) bv = red_v[w], bi = red_i[w];
            if (bi >= E) /* every expert left is NaN: the first of them, as the host scan */
                for (bi = 0; taken[bi]; bi++) {
                }
            taken[bi] = 1;
            chosen[j] = bi;
            chosen_w[j] = expf(lg[bi] - stat[0]) / stat[1];
        }
    }
    if (tid == 0) {
        float s = 0.0f;
        for (int j = 0; j < K; j++) s += chosen_w[j];
        for (int j = 0; j < K; j++) {
            float w = A.norm_topk ? chosen_w[j] / s : chosen_w[j];
            if (A.expert_scale) w *= A.expert_scale[chosen[j]];
            A.experts[(int64_t)blockIdx.x * K + j] = chosen[j];
            A.weights[(int64_t)blockIdx.x * K + j] = w;
        }
    }
}

/* moe_combine: y[t, h] = sum_j weights[t*k + j] * ye[t*k + j, h] (j ascending), plus
 * sigmoid(shared_logit[t]) * shared[t, h] (weight 1 without shared_logit) when shared is given.
 * Grid: (ceil(H / MOEC_THREADS), T). */
struct moec_args {
    float *y;                  /* [T, H] */
    const float *ye;           /* [T*k, H] */
    const float *weights;      /* [T*k] */
    const float *shared;       /* [T, H] or NULL */
    const float *shared_logit; /* [T] or NULL */
    int64_t hidden;
    int top_k;
};
__global__ void __launch_bounds__(MOEC_THREADS) k_moe_combine(const __grid_constant__ moec_args A) {
    KCU_PDL_ENTER();
    const int64_t h = (int64_t)blockIdx.x * MOEC_THREADS + threadIdx.x, t = blockIdx.y;
    if (h >= A.hidden) return;
    float acc = 0.0f;
    for (int j = 0; j < A.top_k; j++) {
        const int64_t p = t * A.top_k + j;
        acc += kcu_ld(A.weights + p) * kcu_ld(A.ye + p * A.hidden + h);
    }
    if (A.shared) {
        const float g = A.shared_logit ? 1.0f / (1.0f + expf(-kcu_ld(A.shared_logit + t))) : 1.0f;
        acc += g * kcu_ld(A.shared + t * A.hidden + h);
    }
    A.y[t * A.hidden + h] = acc;
}

#endif
