/* gdn_recurrent.cuh — the Gated DeltaNet kernels of hybrid.cu that take a batch of sequences in
 * one launch: the causal depthwise conv (outputs, then the roll of each sequence's [K-1, C]
 * state) and the gated delta rule's token-by-token recurrence (column-per-thread, and the
 * register-resident form for dk = 4 R). Semantics are the CPU kernels' (cpu_deltanet.h,
 * kiln_cpu_gdn_delta_ref) on each sequence's rows alone.
 *
 * A launch covers up to GDN_MAX_SEQ sequences; their state pointers and token ranges travel in the
 * kernel parameters (a __grid_constant__ struct, as kv_cache.cu's store does), so nothing is
 * copied to the device and the launches can be captured in a graph. gdn_for_groups splits a batch
 * into such launches.
 *
 * tests/emu/gdn_emulate.cc compiles this header for the host (GDN_HOST_EMU: threads, barriers,
 * shared memory and shuffles emulated) and checks the kernels against the CPU reference. */
#ifndef KILN_BACKEND_CUDA_GDN_RECURRENT_CUH
#define KILN_BACKEND_CUDA_GDN_RECURRENT_CUH

#include <stdint.h>

#ifndef GDN_SMEM
#define GDN_SMEM(name) extern __shared__ __align__(16) float name[]
#endif

#define GDN_MAX_SEQ     64 /* sequences per launch */
#define GDN_THREADS     32 /* threads per block of the column-per-thread delta kernel */
#define GDN_REG_THREADS 128

/* One sequence of a launch: its state and its rows of the stacked activations. */
struct gdn_seq {
    float *state; /* conv: [K-1, C]; delta rule: [nv, dk, dv]; read and updated */
    int64_t t0;   /* first row */
    int n;        /* rows (> 0) */
};

struct gdn_conv_launch {
    float *out;             /* [T, C] */
    const float *x;         /* [T, C] */
    const float *w;         /* [C, K] */
    int C, K;               /* channels, kernel width */
    int n_seq;              /* sequences in s, rows ascending and contiguous */
    int64_t t_begin, t_end; /* the rows they cover */
    gdn_seq s[GDN_MAX_SEQ];
};

struct gdn_delta_launch {
    const float *q, *k;    /* [T, nk, dk] */
    const float *v;        /* [T, nv, dv] */
    const float *g, *beta; /* [T, nv] */
    float *out;            /* [T, nv, dv] */
    int nk, nv, dk, dv;
    gdn_seq s[GDN_MAX_SEQ]; /* blockIdx.z = sequence */
};

/* Calls launch(count) for each run of up to GDN_MAX_SEQ sequences of the batch, after filling
 * s[0..count) in order; sequences without tokens are left out, and so are those for which
 * take(i, t0) is false (it sees every sequence with tokens once, in order, with its first row
 * t0). Host code. */
template <typename Take, typename Launch>
static inline void gdn_for_groups(gdn_seq *s, int n_seqs, const int *n_tokens, float *const *states,
                                  Take take, Launch launch) {
    int i = 0;
    int64_t t = 0;
    for (;;) {
        int c = 0;
        for (; i < n_seqs && c < GDN_MAX_SEQ; t += n_tokens[i], i++)
            if (n_tokens[i] > 0 && take(i, t)) {
                s[c].state = states[i];
                s[c].t0 = t;
                s[c].n = n_tokens[i];
                c++;
            }
        if (c == 0) return;
        launch(c);
    }
}

/* out[t, c] for every row t of the launch and channel c: the window of K inputs of t's sequence
 * ending at t, rows before the sequence's first from its state [K-1, C] (oldest first); the states
 * are rolled afterwards by k_gdn_conv_state. The sequence of row t: the last with t0 <= t. */
__global__ void k_gdn_conv_out(const __grid_constant__ gdn_conv_launch L) {
    KCU_PDL_ENTER();
    const int P = L.K - 1, C = L.C, K = L.K;
    const int64_t total = (L.t_end - L.t_begin) * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = L.t_begin + i / C;
        const int c = (int)(i % C);
        int lo = 0, hi = L.n_seq - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (L.s[mid].t0 <= t)
                lo = mid;
            else
                hi = mid - 1;
        }
        const gdn_seq &S = L.s[lo];
        const int64_t tl = t - S.t0; /* row within the sequence */
        float acc = 0.0f;
        for (int j = 0; j < K; j++) {
            const int64_t src = tl - P + j;
            const float xv = src >= 0 ? L.x[(S.t0 + src) * C + c] : S.state[(P + src) * C + c];
            acc += L.w[(int64_t)c * K + j] * xv;
        }
        L.out[t * C + c] = acc / (1.0f + expf(-acc));
    }
}

/* grid (channel blocks, sequence): new state = the last K-1 rows of (state ++ x); each thread
 * owns one channel of one sequence, and for n < K-1 reads row i + n before it writes row i
 * (ascending i), so no row is overwritten before use */
__global__ void k_gdn_conv_state(const __grid_constant__ gdn_conv_launch L) {
    KCU_PDL_ENTER();
    const gdn_seq &S = L.s[blockIdx.y];
    const int C = L.C, P = L.K - 1;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const float *x = L.x + S.t0 * C;
    const int64_t n = S.n;
    float *state = S.state;
    if (n >= P) {
        for (int i = 0; i < P; i++) state[(int64_t)i * C + c] = x[(n - P + i) * C + c];
    } else {
        for (int i = 0; i < P; i++)
            state[(int64_t)i * C + c] =
                i < P - n ? state[(i + n) * C + c] : x[(i - (P - n)) * C + c];
    }
}

/* Gated delta rule, grid (v head h, column tile, sequence), blocks of one warp: thread c owns
 * column c of the head's state S [dk, dv] (so no thread touches another's column) and walks the
 * sequence's tokens in order. q_t / k_t of the head's key head are staged in shared memory
 * ([2, dk] floats). */
__global__ void k_gdn_delta(const __grid_constant__ gdn_delta_launch L) {
    KCU_PDL_ENTER();
    GDN_SMEM(qk); /* [2, dk] */
    const gdn_seq &Q = L.s[blockIdx.z];
    const int nk = L.nk, nv = L.nv, dk = L.dk, dv = L.dv;
    float *sq = qk, *sk = qk + dk;
    const int h = blockIdx.x, r = nv / nk, kh = h / r;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    const int64_t n = Q.n;
    const float *q = L.q + Q.t0 * nk * dk, *k = L.k + Q.t0 * nk * dk;
    const float *v = L.v + Q.t0 * nv * dv, *g = L.g + Q.t0 * nv, *beta = L.beta + Q.t0 * nv;
    float *out = L.out + Q.t0 * nv * dv;
    float *Sh = Q.state + (int64_t)h * dk * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    for (int64_t t = 0; t < n; t++) {
        __syncthreads(); /* the previous token's reads of sq / sk are done */
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            sq[i] = q[(t * nk + kh) * dk + i];
            sk[i] = k[(t * nk + kh) * dk + i];
        }
        __syncthreads();
        if (c >= dv) continue;
        const float decay = expf(g[t * nv + h]), bt = beta[t * nv + h];
        float kS = 0.0f;
        for (int i = 0; i < dk; i++) kS += sk[i] * Sh[(int64_t)i * dv + c];
        const float delta = bt * (v[(t * nv + h) * dv + c] - decay * kS);
        float o = 0.0f;
        for (int i = 0; i < dk; i++) {
            float s = decay * Sh[(int64_t)i * dv + c] + sk[i] * delta;
            Sh[(int64_t)i * dv + c] = s;
            o += sq[i] * s;
        }
        out[(t * nv + h) * dv + c] = o * scale;
    }
}

/* Register-resident form for dk = 4 * R (R <= 32), grid (v head, 32-column tile, sequence): a
 * block of 128 threads covers 32 value columns; the 4 lanes 4c'..4c'+3 of a warp share column c
 * and hold rows j*R .. j*R+R-1 of it (j = lane & 3) in registers for all the sequence's tokens,
 * so S is read and written once per call. The two dot products over dk are per-lane partial sums
 * added across the 4 lanes by shuffles; every lane runs the shuffles (columns past dv compute on
 * zeros and store nothing). */
template <int R>
__global__ void __launch_bounds__(GDN_REG_THREADS)
    k_gdn_delta_reg(const __grid_constant__ gdn_delta_launch L) {
    KCU_PDL_ENTER();
    GDN_SMEM(qk); /* [2, dk] */
    const gdn_seq &Q = L.s[blockIdx.z];
    const int nk = L.nk, nv = L.nv, dk = L.dk, dv = L.dv;
    float *sq = qk, *sk = qk + dk;
    const int h = blockIdx.x, r = nv / nk, kh = h / r;
    const int j = threadIdx.x & 3, c = blockIdx.y * 32 + (threadIdx.x >> 2);
    const bool live = c < dv;
    const int64_t n = Q.n;
    const float *q = L.q + Q.t0 * nk * dk, *k = L.k + Q.t0 * nk * dk;
    const float *v = L.v + Q.t0 * nv * dv, *g = L.g + Q.t0 * nv, *beta = L.beta + Q.t0 * nv;
    float *out = L.out + Q.t0 * nv * dv;
    float *Sh = Q.state + (int64_t)h * dk * dv;
    float s[R];
#pragma unroll
    for (int i = 0; i < R; i++) s[i] = live ? Sh[(int64_t)(j * R + i) * dv + c] : 0.0f;
    const float scale = 1.0f / sqrtf((float)dk);
    for (int64_t t = 0; t < n; t++) {
        __syncthreads(); /* the previous token's reads of sq / sk are done */
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            sq[i] = q[(t * nk + kh) * dk + i];
            sk[i] = k[(t * nk + kh) * dk + i];
        }
        __syncthreads();
        const float decay = expf(g[t * nv + h]), bt = beta[t * nv + h];
        const float *kk = sk + j * R, *qq = sq + j * R;
        float kS = 0.0f;
#pragma unroll
        for (int i = 0; i < R; i++) kS += kk[i] * s[i];
        kS += __shfl_xor_sync(0xffffffffu, kS, 1);
        kS += __shfl_xor_sync(0xffffffffu, kS, 2);
        const float vc = live ? v[(t * nv + h) * dv + c] : 0.0f;
        const float delta = bt * (vc - decay * kS);
        float o = 0.0f;
#pragma unroll
        for (int i = 0; i < R; i++) {
            s[i] = decay * s[i] + kk[i] * delta;
            o += qq[i] * s[i];
        }
        o += __shfl_xor_sync(0xffffffffu, o, 1);
        o += __shfl_xor_sync(0xffffffffu, o, 2);
        if (live && j == 0) out[(t * nv + h) * dv + c] = o * scale;
    }
    if (live) {
#pragma unroll
        for (int i = 0; i < R; i++) Sh[(int64_t)(j * R + i) * dv + c] = s[i];
    }
}

#endif
