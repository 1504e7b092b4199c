/* sampling.cu — the `sample` op on the GPU: one token id per logits row, chosen as
 * kiln_sampler_sample (src/engine/sampler.c) chooses it, so a decode step copies back ids instead
 * of [rows, vocab] logits. Reference: kiln_cpu_sample_ref (cpu/cpu_sample.c).
 *
 * Greedy rows without penalties: k_sample_argmax, one block per row, a block reduction of
 * (value, id) that keeps the lowest id on ties (the sampler's strict `>` scan from id 0).
 *
 * Other rows: k_sample, one block of 1024 threads per row, in the sampler's order —
 *  1. penalties: occurrences of the window's ids counted in a [vocab] table (global atomics), each
 *     distinct id penalized once with its count (atomicExch hands it to one thread and leaves the
 *     table zeroed for the next call);
 *  2. argmax (greedy rows stop here);
 *  3. p_i = exp(l_i * (1/T) - max * (1/T)) (products and differences rounded separately, as the
 *     host computes them: no FMA contraction; exp in double, rounded to float, close to glibc's
 *     correctly rounded expf), their sum in double;
 *  4. without top-k / top-p: the optional min-p cut and the inverse-CDF draw walk the ids in index
 *     order, as the sampler does (each thread owns a contiguous range of ids; a block scan of the
 *     ranges' masses tells which range holds the draw);
 *  5. with top-k or top-p: the sampler walks the candidates sorted by (p descending, id
 *     ascending). That order is produced here in batches of KS_CAP: a 4-pass radix select over
 *     the float bits of p (non-negative, so the bits order like the values) finds the KS_CAP-th
 *     candidate after the previous batch's last one, the batch is gathered (ties at the threshold
 *     by lowest id) and bitonic-sorted in shared memory. Thread 0 then walks the batch with the
 *     sampler's sequential sums: the top-k sum, the top-p cut, the min-p cut (a prefix, since
 *     sorted) and the draw r = u * sum. Batches past the first are made only when a walk goes past
 *     KS_CAP candidates (top_k > KS_CAP, or a nucleus wider than KS_CAP).
 * Sums may differ from the host's in the last bits (tree order), so ids agree except when a draw
 * or a cut lands within rounding of a boundary. u comes from the host sampler's generator. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#include <limits.h>

#define KS_THREADS 1024
#define KS_WARPS   (KS_THREADS / 32)
#define KS_CAP     2048 /* candidates per sorted batch (a power of two) */

/* a ranks before b in argmax order: larger value, then lower id */
__device__ __forceinline__ bool ks_argmax_before(float av, int ai, float bv, int bi) {
    return av > bv || (av == bv && ai < bi);
}

/* (value, id) of the row's argmax, returned to every thread. */
__device__ int ks_block_argmax(float v, int i, float *sh_v, int *sh_i) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (ks_argmax_before(ov, oi, v, i)) v = ov, i = oi;
    }
    if (lane == 0) sh_v[warp] = v, sh_i[warp] = i;
    __syncthreads();
    if (warp == 0) {
        v = lane < KS_WARPS ? sh_v[lane] : -INFINITY;
        i = lane < KS_WARPS ? sh_i[lane] : INT_MAX;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, v, o);
            int oi = __shfl_xor_sync(0xffffffffu, i, o);
            if (ks_argmax_before(ov, oi, v, i)) v = ov, i = oi;
        }
        if (lane == 0) sh_i[32] = i;
    }
    __syncthreads();
    const int best = sh_i[32];
    __syncthreads(); /* the shared slots may be reused at once */
    return best;
}

/* Scan over this thread's ids (strided, ascending), then the block reduction. */
__device__ int ks_row_argmax(const float *x, int V, float *sh_v, int *sh_i) {
    float v = -INFINITY;
    int best = INT_MAX;
    for (int i = threadIdx.x; i < V; i += KS_THREADS) {
        const float xi = x[i];
        if (best == INT_MAX || xi > v) v = xi, best = i;
    }
    return ks_block_argmax(v, best, sh_v, sh_i);
}

__device__ double ks_block_sum(double v, double *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < KS_WARPS ? sh[lane] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    const double total = sh[32];
    __syncthreads();
    return total;
}

__device__ float ks_block_max(float v, float *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = kcu_warp_max(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = kcu_warp_max(lane < KS_WARPS ? sh[lane] : 0.0f);
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    const float m = sh[32];
    __syncthreads();
    return m;
}

/* Exclusive prefix of v over the block in thread order (int or double). */
template <typename T> __device__ T ks_block_exclusive_scan(T v, T *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    T incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        T y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    T excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = 0;
    if (lane == 31) sh[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        T w = lane < KS_WARPS ? sh[lane] : (T)0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            T y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        T before = __shfl_up_sync(0xffffffffu, w, 1);
        if (lane < KS_WARPS) sh[lane] = lane == 0 ? (T)0 : before; /* warps before this one */
    }
    __syncthreads();
    const T out = sh[warp] + excl;
    __syncthreads();
    return out;
}

/* The sampler's penalty arithmetic, each operation rounded on its own (no FMA), as on the host. */
__device__ __forceinline__ float ks_penalize(float l, int count, const kiln_sample_row &row) {
    if (row.repetition_penalty != 1.0f)
        l = l > 0 ? __fdiv_rn(l, row.repetition_penalty) : __fmul_rn(l, row.repetition_penalty);
    const float sub =
        __fadd_rn(__fmul_rn(row.frequency_penalty, (float)count), row.presence_penalty);
    return __fsub_rn(l, sub);
}

/* finite or +inf (the sampler's `isfinite(l) || l > 0`), by the bits: safe under fast math */
__device__ __forceinline__ bool ks_finite_or_pos_inf(float l) {
    return (__float_as_uint(l) & 0x7f800000u) != 0x7f800000u || l > 0;
}

/* Shared state of one row's sampling block. */
typedef struct ks_shared {
    float cand_p[KS_CAP]; /* the resident batch of the sorted order */
    int cand_i[KS_CAP];
    unsigned hist[256];
    double dsh[33];
    int ish[33];
    float fsh[33];
    int batch;     /* index of the resident batch (-1: none) */
    int batch_len; /* valid candidates in it */
    unsigned radix_prefix;
    int radix_want;
    int n_above;
    int found; /* inverse-CDF hit (lowest id), INT_MAX = none */
    int last_kept;
    /* walk results (written by thread 0) */
    int walk_done;
    int walk_n;
    double walk_acc;
    int walk_id;
} ks_shared;

/* (p, id) comes after the cursor (cbits, cid) in the sorted order */
__device__ __forceinline__ bool ks_after(unsigned bits, int id, bool has_cursor, unsigned cbits,
                                         int cid) {
    return !has_cursor || bits < cbits || (bits == cbits && id > cid);
}

/* a before b in the sampler's sort: larger p, then lower id */
__device__ __forceinline__ bool ks_sorted_before(float ap, int ai, float bp, int bi) {
    return ap > bp || (ap == bp && ai < bi);
}

/* Makes batch `first / KS_CAP` of the sorted order resident: the next min(KS_CAP, V - first)
 * candidates after the cursor (the last candidate of the previous batch; none for the first). */
__device__ void ks_fill_batch(ks_shared &sh, const float *p, int V, int first, bool has_cursor,
                              unsigned cbits, int cid) {
    const int tid = threadIdx.x;
    const int m = min(KS_CAP, V - first);
    /* radix select of the m-th largest bits among the candidates after the cursor */
    unsigned prefix = 0, mask = 0;
    if (tid == 0) sh.radix_want = m, sh.n_above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = tid; d < 256; d += KS_THREADS) sh.hist[d] = 0;
        __syncthreads();
        for (int i = tid; i < V; i += KS_THREADS) {
            const unsigned b = __float_as_uint(p[i]);
            if ((b & mask) == prefix && ks_after(b, i, has_cursor, cbits, cid))
                atomicAdd(&sh.hist[(b >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            int want = sh.radix_want, d = 255;
            for (; d > 0; d--) {
                const int c = (int)sh.hist[d];
                if (c >= want) break;
                want -= c;
            }
            sh.radix_prefix = prefix | ((unsigned)d << shift);
            sh.radix_want = want;
        }
        __syncthreads();
        prefix = sh.radix_prefix;
        mask |= 255u << shift;
    }
    const unsigned thr = prefix;
    const int take_equal = sh.radix_want; /* candidates equal to thr, by lowest id */
    const int n_above = m - take_equal;
    /* strictly above the threshold: any slot of [0, n_above), sorted below */
    for (int i = tid; i < V; i += KS_THREADS) {
        const unsigned b = __float_as_uint(p[i]);
        if (b > thr && ks_after(b, i, has_cursor, cbits, cid)) {
            const int slot = atomicAdd(&sh.n_above, 1);
            sh.cand_p[slot] = p[i];
            sh.cand_i[slot] = i;
        }
    }
    /* equal to the threshold: the take_equal lowest ids, ranked by a scan over id ranges */
    const int chunk = (V + KS_THREADS - 1) / KS_THREADS;
    const int lo = min(V, tid * chunk), hi = min(V, lo + chunk);
    int n_equal = 0;
    for (int i = lo; i < hi; i++) {
        const unsigned b = __float_as_uint(p[i]);
        n_equal += b == thr && ks_after(b, i, has_cursor, cbits, cid);
    }
    int rank = ks_block_exclusive_scan<int>(n_equal, sh.ish);
    for (int i = lo; i < hi && rank < take_equal; i++) {
        const unsigned b = __float_as_uint(p[i]);
        if (b == thr && ks_after(b, i, has_cursor, cbits, cid)) {
            sh.cand_p[n_above + rank] = p[i];
            sh.cand_i[n_above + rank] = i;
            rank++;
        }
    }
    for (int j = m + tid; j < KS_CAP; j += KS_THREADS) sh.cand_p[j] = -1.0f, sh.cand_i[j] = INT_MAX;
    __syncthreads();
    /* bitonic sort of KS_CAP entries into the sampler's order */
    for (int k = 2; k <= KS_CAP; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int t = tid; t < KS_CAP / 2; t += KS_THREADS) {
                const int a = (t / j) * 2 * j + (t % j), b = a + j;
                const bool ascending = (a & k) == 0;
                const float pa = sh.cand_p[a], pb = sh.cand_p[b];
                const int ia = sh.cand_i[a], ib = sh.cand_i[b];
                if (ascending ? ks_sorted_before(pb, ib, pa, ia)
                              : ks_sorted_before(pa, ia, pb, ib)) {
                    sh.cand_p[a] = pb, sh.cand_i[a] = ib;
                    sh.cand_p[b] = pa, sh.cand_i[b] = ia;
                }
            }
            __syncthreads();
        }
    if (tid == 0) {
        sh.batch = first / KS_CAP;
        sh.batch_len = m;
    }
    __syncthreads();
}

/* Makes batch b resident (every thread calls it): from the start when going back. */
__device__ void ks_ensure_batch(ks_shared &sh, const float *p, int V, int b) {
    if (sh.batch == b) return;
    if (sh.batch < 0 || sh.batch > b) ks_fill_batch(sh, p, V, 0, false, 0, 0);
    while (sh.batch < b) {
        const int last = sh.batch_len - 1;
        const unsigned cbits = __float_as_uint(sh.cand_p[last]);
        const int cid = sh.cand_i[last];
        const int first = (sh.batch + 1) * KS_CAP;
        __syncthreads(); /* everyone has read the cursor before the batch is overwritten */
        ks_fill_batch(sh, p, V, first, true, cbits, cid);
    }
}

enum { KS_WALK_SUM, KS_WALK_TOP_P, KS_WALK_MIN_P, KS_WALK_DRAW };

/* Thread 0 walks sorted positions [0, limit) as the sampler's loops do; the block makes the
 * batches. Results in sh.walk_*: acc (the running sum), n (positions kept), id (the choice). */
__device__ void ks_walk(ks_shared &sh, const float *p, int V, int limit, int kind, double target,
                        float thr) {
    __syncthreads(); /* previous readers of walk_* are done */
    if (threadIdx.x == 0) {
        sh.walk_done = 0;
        sh.walk_acc = 0.0;
        sh.walk_n = limit;
        sh.walk_id = -1;
    }
    __syncthreads();
    for (int b = 0; b * KS_CAP < limit; b++) {
        ks_ensure_batch(sh, p, V, b);
        if (threadIdx.x == 0) {
            double acc = sh.walk_acc;
            const int end = min(limit - b * KS_CAP, KS_CAP);
            for (int j = 0; j < end; j++) {
                const float pj = sh.cand_p[j];
                const int pos = b * KS_CAP + j;
                if (kind == KS_WALK_MIN_P && !(pj >= thr)) {
                    sh.walk_n = pos; /* sorted: the rest are below the cut as well */
                    sh.walk_done = 1;
                    break;
                }
                acc += pj;
                sh.walk_id = sh.cand_i[j];
                if ((kind == KS_WALK_TOP_P && acc >= target) ||
                    (kind == KS_WALK_DRAW && target < acc)) {
                    sh.walk_n = pos + 1;
                    sh.walk_done = 1;
                    break;
                }
            }
            sh.walk_acc = acc;
        }
        __syncthreads();
        if (sh.walk_done) break;
    }
}

__global__ void __launch_bounds__(KS_THREADS)
    k_sample_argmax(int32_t *ids, const float *logits, int64_t vocab, const kiln_sample_row *rows) {
    KCU_PDL_ENTER();
    __shared__ float sh_v[33];
    __shared__ int sh_i[33];
    const int best =
        ks_row_argmax(logits + rows[blockIdx.x].logits_row * vocab, (int)vocab, sh_v, sh_i);
    if (threadIdx.x == 0) ids[blockIdx.x] = best;
}

__global__ void __launch_bounds__(KS_THREADS)
    k_sample(int32_t *ids, float *logits, int64_t vocab, const kiln_sample_row *rows,
             const int32_t *history, float *probs, int32_t *counts) {
    KCU_PDL_ENTER();
    __shared__ ks_shared sh;
    const kiln_sample_row row = rows[blockIdx.x];
    const int V = (int)vocab, tid = threadIdx.x;
    float *x = logits + row.logits_row * vocab;
    float *p = probs + (int64_t)blockIdx.x * vocab;

    if (row.n_history > 0) { /* 1. penalties */
        int32_t *cnt = counts + (int64_t)blockIdx.x * vocab;
        const int32_t *win = history + row.history_offset;
        for (int i = tid; i < row.n_history; i += KS_THREADS)
            if (win[i] >= 0 && win[i] < V) atomicAdd(&cnt[win[i]], 1);
        __syncthreads();
        for (int i = tid; i < row.n_history; i += KS_THREADS) {
            const int id = win[i];
            if (id < 0 || id >= V) continue;
            const int c = atomicExch(&cnt[id], 0);
            if (c > 0) x[id] = ks_penalize(x[id], c, row);
        }
        __syncthreads();
    }
    const int best = ks_row_argmax(x, V, sh.fsh, sh.ish); /* 2. */
    if (row.temperature <= 0.0f || row.top_k == 1) {
        if (tid == 0) ids[blockIdx.x] = best;
        return;
    }
    const float inv_t = row.inv_temperature, mx = __fmul_rn(x[best], inv_t);
    double part = 0.0; /* 3. */
    for (int i = tid; i < V; i += KS_THREADS) {
        const float l = x[i];
        const float e =
            ks_finite_or_pos_inf(l) ? (float)exp((double)__fsub_rn(__fmul_rn(l, inv_t), mx)) : 0.0f;
        p[i] = e;
        part += e;
    }
    double sum = ks_block_sum(part, sh.dsh); /* also orders the p[] writes before the reads */
    const bool top_k_on = row.top_k > 0 && row.top_k < V;
    if (!top_k_on && !(row.top_p < 1.0f)) { /* 4. index order */
        const bool cut = row.min_p > 0.0f;
        float thr = 0.0f;
        if (cut) {
            float mp = 0.0f;
            for (int i = tid; i < V; i += KS_THREADS) mp = p[i] > mp ? p[i] : mp;
            thr = __fmul_rn(row.min_p, ks_block_max(mp, sh.fsh));
        }
        const int chunk = (V + KS_THREADS - 1) / KS_THREADS;
        const int lo = min(V, tid * chunk), hi = min(V, lo + chunk);
        double mine = 0.0;
        int last = -1;
        for (int i = lo; i < hi; i++)
            if (!cut || p[i] >= thr) mine += p[i], last = i;
        if (cut) sum = ks_block_sum(mine, sh.dsh);
        const double r = row.u * sum;
        if (tid == 0) sh.found = INT_MAX, sh.last_kept = -1;
        const double before = ks_block_exclusive_scan<double>(mine, sh.dsh); /* syncs */
        if (last >= 0) atomicMax(&sh.last_kept, last);
        if (before + mine > r) {
            double acc = before;
            for (int i = lo; i < hi; i++)
                if (!cut || p[i] >= thr) {
                    acc += p[i];
                    if (r < acc) {
                        atomicMin(&sh.found, i);
                        break;
                    }
                }
        }
        __syncthreads();
        if (tid == 0)
            ids[blockIdx.x] = sh.found != INT_MAX ? sh.found
                              : sh.last_kept >= 0 ? sh.last_kept
                                                  : best;
        return;
    }
    /* 5. sorted order */
    if (tid == 0) sh.batch = -1;
    __syncthreads();
    int n = V;
    if (top_k_on) {
        n = row.top_k;
        ks_walk(sh, p, V, n, KS_WALK_SUM, 0.0, 0.0f);
        sum = sh.walk_acc;
    }
    if (row.top_p < 1.0f) {
        ks_walk(sh, p, V, n, KS_WALK_TOP_P, row.top_p * sum, 0.0f);
        n = sh.walk_n;
        sum = sh.walk_acc;
    }
    if (row.min_p > 0.0f) {
        ks_ensure_batch(sh, p, V, 0);
        const float thr = __fmul_rn(row.min_p, sh.cand_p[0] > 0.0f ? sh.cand_p[0] : 0.0f);
        ks_walk(sh, p, V, n, KS_WALK_MIN_P, 0.0, thr);
        n = sh.walk_n;
        sum = sh.walk_acc;
    }
    ks_walk(sh, p, V, n, KS_WALK_DRAW, row.u * sum, 0.0f);
    if (tid == 0) ids[blockIdx.x] = sh.walk_done ? sh.walk_id : n > 0 ? sh.walk_id : best;
}

/* Grows a device buffer kept in the backend state (contents not kept unless zeroed: then all
 * zero after growth). */
static bool ks_reserve(kcu_state *st, void **buf, size_t *cap, size_t bytes, bool zero) {
    if (bytes <= *cap) return true;
    if (*buf) {
        KCU_CHECK(st, cudaFree(*buf)); /* waits for work still using it */
        *buf = NULL;
        *cap = 0;
    }
    if (!KCU_CHECK(st, cudaMalloc(buf, bytes))) return false;
    if (zero && !KCU_CHECK(st, cudaMemsetAsync(*buf, 0, bytes, st->stream))) return false;
    *cap = bytes;
    return true;
}

extern "C" void kcu_sample(kiln_backend *be, int32_t *ids, float *logits, int64_t vocab, int n_rows,
                           const kiln_sample_row *rows, const int32_t *history) {
    kcu_state *st = kcu_st(be);
    if (n_rows <= 0 || vocab <= 0) return;
    kcu_graph_flush(st);
    bool all_greedy = true;
    int64_t n_hist = 0;
    for (int r = 0; r < n_rows; r++) {
        const kiln_sample_row *row = &rows[r];
        if (row->n_history > 0) {
            all_greedy = false;
            if ((int64_t)row->history_offset + row->n_history > n_hist)
                n_hist = (int64_t)row->history_offset + row->n_history;
        }
        if (!(row->temperature <= 0.0f || row->top_k == 1)) all_greedy = false;
    }
    const size_t rows_bytes = ((size_t)n_rows * sizeof *rows + 255) & ~(size_t)255;
    const size_t args_bytes = rows_bytes + (size_t)n_hist * sizeof(int32_t);
    if (!ks_reserve(st, &st->sample_args, &st->sample_args_bytes, args_bytes, false)) return;
    kiln_sample_row *d_rows = (kiln_sample_row *)st->sample_args;
    int32_t *d_hist = (int32_t *)((char *)st->sample_args + rows_bytes);
    be->upload(be, d_rows, rows, (size_t)n_rows * sizeof *rows);
    if (n_hist > 0) be->upload(be, d_hist, history, (size_t)n_hist * sizeof(int32_t));
    kcu_prof_begin(st);
    if (all_greedy) {
        KCU_LAUNCH(st, k_sample_argmax, n_rows, KS_THREADS, 0, ids, logits, vocab, d_rows);
        KCU_LAUNCHED(st);
        kcu_prof_end(st, "sample (argmax)");
        return;
    }
    const size_t table_bytes = (size_t)n_rows * (size_t)vocab * sizeof(float);
    if (!ks_reserve(st, &st->sample_probs, &st->sample_probs_bytes, table_bytes, false)) return;
    if (n_hist > 0 &&
        !ks_reserve(st, &st->sample_counts, &st->sample_counts_bytes, table_bytes, true))
        return;
    KCU_LAUNCH(st, k_sample, n_rows, KS_THREADS, 0, ids, logits, vocab, d_rows, d_hist,
               (float *)st->sample_probs, (int32_t *)st->sample_counts);
    KCU_LAUNCHED(st);
    kcu_prof_end(st, "sample");
}
