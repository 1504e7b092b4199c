/* gdn_chunked.cu — the chunked (WY) form of the gated delta rule on CUDA, for prefill: what
 * kcu_gdn_delta (hybrid.cu) runs when a call has at least KILN_CUDA_GDN_CHUNK tokens (default 64)
 * and dk is 32, 64, 128 or 256 (dv <= 256). The math is kiln_gdn_chunked's (cpu_deltanet.c): per
 * value head h and chunk of L = 64 tokens with cumulative log decay c_i,
 *   A = -(beta_i k_i . k_j) e^{c_i - c_j} (j < i),  T = (I - A)^{-1} (forward substitution),
 *   U = T (beta v),  W = T (beta e^c k),  P_ij = (q_i . k_j) e^{c_i - c_j} / sqrt(dk) (j <= i),
 *   v' = U - W S,  o = e^c q S / sqrt(dk) + P v',  S <- e^{c_L} S + sum_j e^{c_L - c_j} k_j v'_j^T.
 * Two kernels per run of chunks (a "segment", bounded so its scratch stays under
 * GDN_SCRATCH_FLOATS):
 *   k_gdn_chunk_prep   grid (chunk, v head): everything that does not depend on the state, so
 *                      every chunk of the segment runs in parallel; writes W [L, dk], U [L, dv],
 *                      P [L, L] and c [L] per (chunk, head) to scratch.
 *   k_gdn_chunk_state  grid (v head, 32-column tile of dv): walks the chunks in order with its
 *                      [dk, 32] slice of S in shared memory: v' = U - W S, the outputs, then the
 *                      state update; S is read and written once per segment.
 * Blocks of 256 threads (8 warps); products are f32 on CUDA cores from shared-memory tiles, rows
 * padded by 4 floats so 16-byte row loads across lanes do not conflict. f32 throughout: results
 * differ from the CPU's by rounding only.
 * tests/emu/gdn_emulate.cc compiles this file for the host (GDN_HOST_EMU: threads, barriers and
 * shared memory emulated) and checks it against the CPU kernels; test_cuda_ops does on a GPU. */
#ifndef GDN_HOST_EMU
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#include <stdlib.h>
#include <string.h>

#define GDN_SMEM(name) extern __shared__ __align__(16) float name[]
__device__ __forceinline__ float4 gdn_ld4(const float *p) {
    return *(const float4 *)p;
}
#endif

#define GDN_L       64          /* tokens per chunk */
#define GDN_CT      256         /* threads per block (8 warps) */
#define GDN_VT      32          /* value columns per block of the state kernel (one per lane) */
#define GDN_RS      (GDN_L + 4) /* row stride of the [L, L] tiles in shared memory */
#define GDN_ROWS    (GDN_L / 8) /* chunk rows per thread: rows w, w + 8, ... of warp w */
#define GDN_SCRATCH ((int64_t)16 << 20) /* floats of scratch per segment (64 MiB) */

/* One kernel launch's view: a segment of n tokens (pointers at its first token) and its scratch. */
struct gdn_chunk_args {
    int64_t n; /* tokens in the segment */
    int nk, nv, dv;
    float scale;           /* 1 / sqrt(dk) */
    const float *q, *k;    /* [n, nk, dk] */
    const float *v;        /* [n, nv, dv] */
    const float *g, *beta; /* [n, nv] */
    float *S;              /* [nv, dk, dv], read and updated */
    float *out;            /* [n, nv, dv] */
    /* scratch, per (chunk of the segment, v head) = blk = chunk * nv + h */
    float *W; /* [blk, L, dk] */
    float *U; /* [blk, L, dv] */
    float *P; /* [blk, L, L] (zero above the diagonal and in rows past the chunk's end) */
    float *G; /* [blk, L] cumulative log decay (rows past the end repeat the last) */
};

/* Row stride of the prep kernel's second [L, *] tile, which holds q and then v. */
static inline __host__ __device__ int gdn_qs(int dk, int dv) {
    return (((dk > dv ? dk : dv) + 3) & ~3) + 4;
}
static inline __host__ __device__ int64_t gdn_prep_smem_floats(int dk, int dv) {
    return (int64_t)GDN_L * (dk + 4 + gdn_qs(dk, dv) + 2 * GDN_RS) + 3 * GDN_L;
}
static inline __host__ __device__ int64_t gdn_state_smem_floats(int dk) {
    return (int64_t)dk * GDN_VT + (int64_t)GDN_L * (2 * (dk + 4) + GDN_RS + GDN_VT) + 3 * GDN_L;
}
/* Scratch floats per (chunk, v head). */
static inline int64_t gdn_chunk_floats(int dk, int dv) {
    return (int64_t)GDN_L * (dk + dv + GDN_L + 1);
}

/* acc += a . b, in x order */
static inline __device__ float gdn_dot4(float acc, float4 a, float4 b) {
    acc += a.x * b.x;
    acc += a.y * b.y;
    acc += a.z * b.z;
    acc += a.w * b.w;
    return acc;
}

template <int DK> __global__ void __launch_bounds__(GDN_CT) k_gdn_chunk_prep(gdn_chunk_args a) {
    KCU_PDL_ENTER();
    GDN_SMEM(sm);
    constexpr int L = GDN_L, KS = DK + 4, AS = GDN_RS, NG = DK / 32, R = GDN_ROWS;
    const int QS = gdn_qs(DK, a.dv), dv = a.dv;
    float *sk = sm;          /* [L, KS] k rows */
    float *sq = sk + L * KS; /* [L, QS] q rows, then v rows */
    float *sA = sq + L * QS; /* [L, AS] A, then the coefficients T (I + ...) beta */
    float *sT = sA + L * AS; /* [L, AS] strictly lower part of T */
    float *sg = sT + L * AS; /* [L] cumulative log decay */
    float *sb = sg + L;      /* [L] beta (0 past the end) */
    float *se = sb + L;      /* [L] e^{c} */
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int ci = blockIdx.x, h = blockIdx.y, kh = h / (a.nv / a.nk);
    const int64_t c0 = (int64_t)ci * L, blk = (int64_t)ci * a.nv + h;
    const int Lc = a.n - c0 < L ? (int)(a.n - c0) : L;

    if (tid == 0) { /* the running sum in token order, as the CPU forms it */
        float acc = 0.0f;
        for (int i = 0; i < L; i++) {
            if (i < Lc) acc += a.g[(c0 + i) * a.nv + h];
            sg[i] = acc;
            se[i] = expf(acc);
            sb[i] = i < Lc ? a.beta[(c0 + i) * a.nv + h] : 0.0f;
        }
    }
    for (int e = tid; e < L * DK; e += GDN_CT) {
        const int i = e / DK, x = e % DK;
        const int64_t src = ((c0 + i) * a.nk + kh) * DK + x;
        sk[i * KS + x] = i < Lc ? a.k[src] : 0.0f;
        sq[i * QS + x] = i < Lc ? a.q[src] : 0.0f;
    }
    for (int e = tid; e < L * L; e += GDN_CT) sT[(e / L) * AS + e % L] = 0.0f;
    __syncthreads();
    if (tid < L) a.G[blk * L + tid] = sg[tid];

    /* A and P: warp w owns rows w + 8r, lane owns columns lane and lane + 32 */
    {
        float ak[R][2], aq[R][2];
#pragma unroll
        for (int r = 0; r < R; r++) ak[r][0] = ak[r][1] = aq[r][0] = aq[r][1] = 0.0f;
        for (int x = 0; x < DK; x += 4) {
            const float4 kj0 = gdn_ld4(sk + lane * KS + x),
                         kj1 = gdn_ld4(sk + (lane + 32) * KS + x);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int i = w + 8 * r;
                const float4 ki = gdn_ld4(sk + i * KS + x), qi = gdn_ld4(sq + i * QS + x);
                ak[r][0] = gdn_dot4(ak[r][0], ki, kj0);
                ak[r][1] = gdn_dot4(ak[r][1], ki, kj1);
                aq[r][0] = gdn_dot4(aq[r][0], qi, kj0);
                aq[r][1] = gdn_dot4(aq[r][1], qi, kj1);
            }
        }
        float *P = a.P + blk * L * L;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int i = w + 8 * r;
#pragma unroll
            for (int s = 0; s < 2; s++) {
                const int j = lane + 32 * s;
                float av = 0.0f, pv = 0.0f;
                if (j <= i) { /* e^{c_i - c_j} <= 1; never formed above the diagonal */
                    const float dec = expf(sg[i] - sg[j]);
                    if (j < i) av = -sb[i] * ak[r][s] * dec;
                    pv = aq[r][s] * a.scale * dec;
                }
                sA[i * AS + j] = av;
                P[i * L + j] = pv;
            }
        }
    }
    __syncthreads();

    /* forward substitution, one row at a time: T_ij = A_ij + sum_{j<m<i} A_im T_mj, thread j */
    for (int i = 1; i < Lc; i++) {
        if (tid < i) {
            float s = sA[i * AS + tid];
            for (int m = tid + 1; m < i; m++) s += sA[i * AS + m] * sT[m * AS + tid];
            sT[i * AS + tid] = s;
        }
        __syncthreads();
    }

    /* coefficients (I + T)_ij beta_j (A is no longer needed); v rows replace q rows */
    for (int e = tid; e < L * L; e += GDN_CT) {
        const int i = e / L, j = e % L;
        const float t = j < i ? sT[i * AS + j] : 1.0f;
        sA[i * AS + j] = i < Lc && j <= i ? t * sb[j] : 0.0f;
    }
    for (int e = tid; e < L * dv; e += GDN_CT) {
        const int i = e / dv, c = e % dv;
        sq[i * QS + c] = i < Lc ? a.v[((c0 + i) * a.nv + h) * dv + c] : 0.0f;
    }
    __syncthreads();

    /* W = coef e^c k: rows w + 8r, columns lane + 32s */
    {
        float acc[R][NG];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int s = 0; s < NG; s++) acc[r][s] = 0.0f;
        for (int j = 0; j < L; j += 4) {
            float kx[4][NG];
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
#pragma unroll
                for (int s = 0; s < NG; s++) kx[jj][s] = sk[(j + jj) * KS + lane + 32 * s];
            const float e0 = se[j], e1 = se[j + 1], e2 = se[j + 2], e3 = se[j + 3];
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float4 c4 = gdn_ld4(sA + (w + 8 * r) * AS + j);
                const float cf[4] = {c4.x * e0, c4.y * e1, c4.z * e2, c4.w * e3};
#pragma unroll
                for (int jj = 0; jj < 4; jj++)
#pragma unroll
                    for (int s = 0; s < NG; s++) acc[r][s] += cf[jj] * kx[jj][s];
            }
        }
        float *W = a.W + blk * L * DK;
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int s = 0; s < NG; s++) W[(w + 8 * r) * DK + lane + 32 * s] = acc[r][s];
    }
    /* U = coef v: the same, over dv in passes of 128 columns */
    for (int cb = 0; cb < dv; cb += 128) {
        float acc[R][4];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.0f;
        for (int j = 0; j < L; j += 4) {
            float vx[4][4];
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
#pragma unroll
                for (int s = 0; s < 4; s++) {
                    const int c = cb + lane + 32 * s;
                    vx[jj][s] = c < dv ? sq[(j + jj) * QS + c] : 0.0f;
                }
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float4 c4 = gdn_ld4(sA + (w + 8 * r) * AS + j);
                const float cf[4] = {c4.x, c4.y, c4.z, c4.w};
#pragma unroll
                for (int jj = 0; jj < 4; jj++)
#pragma unroll
                    for (int s = 0; s < 4; s++) acc[r][s] += cf[jj] * vx[jj][s];
            }
        }
        float *U = a.U + blk * L * dv;
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int s = 0; s < 4; s++) {
                const int c = cb + lane + 32 * s;
                if (c < dv) U[(w + 8 * r) * dv + c] = acc[r][s];
            }
    }
}

template <int DK> __global__ void __launch_bounds__(GDN_CT, 2) k_gdn_chunk_state(gdn_chunk_args a) {
    KCU_PDL_ENTER();
    GDN_SMEM(sm);
    constexpr int L = GDN_L, KS = DK + 4, AS = GDN_RS, NG = DK / 32, R = GDN_ROWS, VT = GDN_VT;
    float *sS = sm;            /* [DK, VT] this block's columns of S */
    float *sB0 = sS + DK * VT; /* [L, KS] W, then e^{c_L - c_j} k_j */
    float *sB1 = sB0 + L * KS; /* [L, KS] q */
    float *sP = sB1 + L * KS;  /* [L, AS] */
    float *sV = sP + L * AS;   /* [L, VT] U, then v' */
    float *sg = sV + L * VT;   /* [L] cumulative log decay */
    float *se = sg + L;        /* [L] e^{c} / sqrt(dk) */
    float *sf = se + L;        /* [L] e^{c_L - c} */
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int h = blockIdx.x, kh = h / (a.nv / a.nk), dv = a.dv;
    const int c = blockIdx.y * VT + lane;
    const bool live = c < dv;
    float *Sh = a.S + (int64_t)h * DK * dv;
    for (int x = w; x < DK; x += 8) sS[x * VT + lane] = live ? Sh[(int64_t)x * dv + c] : 0.0f;

    const int64_t n_chunks = (a.n + L - 1) / L;
    for (int64_t ci = 0; ci < n_chunks; ci++) {
        const int64_t c0 = ci * L, blk = ci * a.nv + h;
        const int Lc = a.n - c0 < L ? (int)(a.n - c0) : L;
        /* (a) stage the chunk: c, W, q, P, this block's columns of U */
        if (tid < L) {
            const float gi = a.G[blk * L + tid];
            sg[tid] = gi;
            se[tid] = a.scale * expf(gi);
            sf[tid] = expf(a.G[blk * L + Lc - 1] - gi);
        }
        const float *W = a.W + blk * L * DK;
        for (int e = tid; e < L * DK; e += GDN_CT) {
            const int i = e / DK, x = e % DK;
            sB0[i * KS + x] = W[e];
            sB1[i * KS + x] = i < Lc ? a.q[((c0 + i) * a.nk + kh) * DK + x] : 0.0f;
        }
        const float *P = a.P + blk * L * L;
        for (int e = tid; e < L * L; e += GDN_CT) sP[(e / L) * AS + e % L] = P[e];
        const float *U = a.U + blk * L * dv;
        for (int e = tid; e < L * VT; e += GDN_CT) {
            const int i = e / VT, cc = blockIdx.y * VT + e % VT;
            sV[e] = cc < dv ? U[(int64_t)i * dv + cc] : 0.0f;
        }
        __syncthreads();

        /* (b) v' = U - W S and q S for rows w + 8r, column lane */
        float ws[R], qs[R];
#pragma unroll
        for (int r = 0; r < R; r++) ws[r] = qs[r] = 0.0f;
        for (int x = 0; x < DK; x += 4) {
            const float4 s4 = make_float4(sS[x * VT + lane], sS[(x + 1) * VT + lane],
                                          sS[(x + 2) * VT + lane], sS[(x + 3) * VT + lane]);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int i = w + 8 * r;
                ws[r] = gdn_dot4(ws[r], gdn_ld4(sB0 + i * KS + x), s4);
                qs[r] = gdn_dot4(qs[r], gdn_ld4(sB1 + i * KS + x), s4);
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) sV[(w + 8 * r) * VT + lane] -= ws[r];
        __syncthreads();

        /* (c) decayed k rows replace W; outputs o = e^c q S / sqrt(dk) + P v' */
        const float gL = sg[Lc - 1];
        for (int e = tid; e < L * DK; e += GDN_CT) {
            const int i = e / DK, x = e % DK;
            sB0[i * KS + x] = i < Lc ? a.k[((c0 + i) * a.nk + kh) * DK + x] * sf[i] : 0.0f;
        }
        float o[R];
#pragma unroll
        for (int r = 0; r < R; r++) o[r] = qs[r] * se[w + 8 * r];
        for (int j = 0; j < L; j += 4) {
            const float4 v4 = make_float4(sV[j * VT + lane], sV[(j + 1) * VT + lane],
                                          sV[(j + 2) * VT + lane], sV[(j + 3) * VT + lane]);
#pragma unroll
            for (int r = 0; r < R; r++)
                o[r] = gdn_dot4(o[r], gdn_ld4(sP + (w + 8 * r) * AS + j), v4);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int i = w + 8 * r;
            if (live && i < Lc) a.out[((c0 + i) * a.nv + h) * dv + c] = o[r];
        }
        __syncthreads();

        /* (d) S = e^{c_L} S + sum_j (e^{c_L - c_j} k_j) v'_j^T: warp w owns rows 4(w + 8m) .. +3 */
        const float eL = expf(gL);
        float acc[NG][4];
#pragma unroll
        for (int m = 0; m < NG; m++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[m][e] = eL * sS[(4 * (w + 8 * m) + e) * VT + lane];
        for (int j = 0; j < Lc; j++) {
            const float vp = sV[j * VT + lane];
#pragma unroll
            for (int m = 0; m < NG; m++) {
                const float4 k4 = gdn_ld4(sB0 + j * KS + 4 * (w + 8 * m));
                acc[m][0] += k4.x * vp;
                acc[m][1] += k4.y * vp;
                acc[m][2] += k4.z * vp;
                acc[m][3] += k4.w * vp;
            }
        }
#pragma unroll
        for (int m = 0; m < NG; m++)
#pragma unroll
            for (int e = 0; e < 4; e++) sS[(4 * (w + 8 * m) + e) * VT + lane] = acc[m][e];
        __syncthreads();
    }
    if (live)
        for (int x = w; x < DK; x += 8) Sh[(int64_t)x * dv + c] = sS[x * VT + lane];
}

/* The segments of a call: at most seg_chunks chunks each (so the scratch of one segment is
 * seg_chunks * nv * gdn_chunk_floats); the args of segment s0 (its first token) with scratch scr.
 */
static inline int64_t gdn_seg_chunks(int nv, int dk, int dv, int64_t n, int64_t budget_floats) {
    int64_t c = budget_floats / ((int64_t)nv * gdn_chunk_floats(dk, dv));
    const int64_t need = (n + GDN_L - 1) / GDN_L;
    if (c < 1) c = 1;
    return c < need ? c : need;
}
static inline gdn_chunk_args gdn_seg_args(int nk, int nv, int dk, int dv, int64_t n, int64_t s0,
                                          int64_t seg_chunks, const float *q, const float *k,
                                          const float *v, const float *g, const float *beta,
                                          float *S, float *out, float *scr) {
    gdn_chunk_args a;
    const int64_t len = seg_chunks * GDN_L;
    a.n = n - s0 < len ? n - s0 : len;
    a.nk = nk, a.nv = nv, a.dv = dv;
    a.scale = 1.0f / sqrtf((float)dk);
    a.q = q + s0 * nk * dk, a.k = k + s0 * nk * dk, a.v = v + s0 * nv * dv;
    a.g = g + s0 * nv, a.beta = beta + s0 * nv;
    a.S = S, a.out = out + s0 * nv * dv;
    const int64_t blocks = seg_chunks * nv;
    a.W = scr;
    a.U = a.W + blocks * GDN_L * dk;
    a.P = a.U + blocks * GDN_L * dv;
    a.G = a.P + blocks * GDN_L * GDN_L;
    return a;
}

#ifndef GDN_HOST_EMU /* host side */
/* KILN_CUDA_GDN_CHUNK: 0 = off, N = calls of at least N tokens (default 64); the setter's
 * segment limit (chunks per segment, 0 = by the scratch budget) is for tests. */
static int gdn_chunk_min = -1, gdn_chunk_seg = 0;

extern "C" void kiln_cuda_set_gdn_chunk(int min_tokens, int max_seg_chunks) {
    gdn_chunk_min = min_tokens;
    gdn_chunk_seg = max_seg_chunks > 0 ? max_seg_chunks : 0;
}

/* the environment is read once: batched calls ask for every sequence of every layer */
static int gdn_chunk_threshold(void) {
    if (gdn_chunk_min >= 0) return gdn_chunk_min;
    static int env_min = -1;
    if (env_min < 0) {
        const char *e = getenv("KILN_CUDA_GDN_CHUNK");
        const int v = e && *e ? atoi(e) : 64;
        env_min = v < 0 ? 64 : v;
    }
    return env_min;
}

template <int DK>
static void gdn_chunk_run(kcu_state *st, const kiln_gdn_dims *d, int64_t n, const float *q,
                          const float *k, const float *v, const float *g, const float *beta,
                          float *state, float *out) {
    const int nv = d->n_v_heads, dv = d->dv;
    const size_t prep_smem = (size_t)gdn_prep_smem_floats(DK, dv) * sizeof(float);
    const size_t state_smem = (size_t)gdn_state_smem_floats(DK) * sizeof(float);
    static size_t prep_raised = 48 << 10; /* per instantiation: the opt-in size set so far */
    if (prep_smem > prep_raised) {
        if (!KCU_CHECK(st, cudaFuncSetAttribute(k_gdn_chunk_prep<DK>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)prep_smem)))
            return;
        prep_raised = prep_smem;
    }
    static bool state_raised = false;
    if (!state_raised && state_smem > (48 << 10)) {
        if (!KCU_CHECK(st, cudaFuncSetAttribute(k_gdn_chunk_state<DK>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)state_smem)))
            return;
        state_raised = true;
    }
    int64_t seg = gdn_seg_chunks(nv, DK, dv, n, GDN_SCRATCH);
    if (gdn_chunk_seg > 0 && seg > gdn_chunk_seg) seg = gdn_chunk_seg;
    float *scr = (float *)kcu_scratch(st, (size_t)(seg * nv * gdn_chunk_floats(DK, dv)) * 4);
    if (!scr) return;
    for (int64_t s0 = 0; s0 < n; s0 += seg * GDN_L) {
        const gdn_chunk_args a =
            gdn_seg_args(d->n_k_heads, nv, DK, dv, n, s0, seg, q, k, v, g, beta, state, out, scr);
        const dim3 pgrid((unsigned)((a.n + GDN_L - 1) / GDN_L), (unsigned)nv);
        KCU_LAUNCH(st, k_gdn_chunk_prep<DK>, pgrid, GDN_CT, prep_smem, a);
        KCU_LAUNCHED(st);
        const dim3 sgrid((unsigned)nv, (unsigned)((dv + GDN_VT - 1) / GDN_VT));
        KCU_LAUNCH(st, k_gdn_chunk_state<DK>, sgrid, GDN_CT, state_smem, a);
        KCU_LAUNCHED(st);
    }
}

extern "C" bool kcu_gdn_delta_chunked(kiln_backend *be, const kiln_gdn_dims *d, int64_t n,
                                      const float *q, const float *k, const float *v,
                                      const float *g, const float *beta, float *state, float *out) {
    kcu_state *st = kcu_st(be);
    const int min_n = gdn_chunk_threshold();
    if (min_n <= 0 || n < min_n) return false;
    const int dk = d->dk, dv = d->dv;
    if (!(dk == 32 || dk == 64 || dk == 128 || dk == 256) || dv < 1 || dv > 256) return false;
    static int smem_max = -1; /* opt-in shared memory per block of this device */
    if (smem_max < 0 &&
        !KCU_CHECK(st, cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                              st->device)))
        return false;
    if (gdn_prep_smem_floats(dk, dv) * 4 > smem_max || gdn_state_smem_floats(dk) * 4 > smem_max)
        return false;
    if (dk == 32) gdn_chunk_run<32>(st, d, n, q, k, v, g, beta, state, out);
    if (dk == 64) gdn_chunk_run<64>(st, d, n, q, k, v, g, beta, state, out);
    if (dk == 128) gdn_chunk_run<128>(st, d, n, q, k, v, g, beta, state, out);
    if (dk == 256) gdn_chunk_run<256>(st, d, n, q, k, v, g, beta, state, out);
    return true;
}
#endif
