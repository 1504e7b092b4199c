/* gdn_emulate.cc — runs the chunked gated delta rule kernels (src/backend/cuda/gdn_chunked.cu:
 * k_gdn_chunk_prep, k_gdn_chunk_state and the segment loop of gdn_chunk_run) on the CPU: the
 * kernel source is compiled as C++ with GDN_HOST_EMU, every CUDA thread of a block is a
 * std::thread, __syncthreads is a barrier, dynamic shared memory is a buffer of exactly the size
 * the launch asks for (poisoned with NaN before each block, followed by a guard zone checked after
 * it), every 16-byte shared load is checked for alignment, and the scratch and outputs start as
 * NaN, so an element read before it is written shows up in the results.
 *
 * Each case carries a random non-zero state through calls of 1, 63, 64, 65 and 200 tokens (with
 * the chunked path forced for every length, as kiln_cuda_set_gdn_chunk(1, ..) does on the GPU) and
 * compares each call's outputs and the final state with the CPU's chunked kernel
 * (kiln_gdn_chunked, what the CPU backend runs for prefill) and its token-by-token reference
 * (kiln_cpu_gdn_delta_ref), by relative L2 error, every element finite. Shapes: dk 32 / 64 / 128 /
 * 256, dv 33 / 40 / 64 / 100 / 128 (not all multiples of the 32-column tile), n_k < n_v (GQA),
 * mild and strong decay, and segments of 1 or 2 chunks (the host loop over segments).
 *
 * Then the batched kernels of gdn_recurrent.cuh (the conv's output and state kernels, the
 * column-per-thread and register-resident delta rule, with shuffles emulated through the block's
 * barrier), driven by the same grouping as hybrid.cu (gdn_for_groups, sequences of 80 tokens to
 * the chunked kernels above): batches of 1, 3, 64 and 70 sequences (two launches) with 0, 1, a few
 * and 80 tokens, every sequence with its own state, over two steps, against kiln_gdn_conv and
 * kiln_cpu_gdn_delta_ref run sequence by sequence.
 *
 * A development check for machines without a GPU (it does not see races between warps that the
 * barriers hide, nor the real hardware's FMA contraction and fast exp); run by
 * tests/test_gdn_emulate.sh (CTest), which also builds it. */
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

extern "C" {
#include "backend/cpu/cpu_deltanet.h"
#include "backend/cpu/cpu_ops.h"
}

/* ---- CUDA shims ---- */
#include "cuda_shim.h"
#include "thread_blocks.h"
#define KCU_PDL_ENTER() /* programmatic dependent launch: nothing to wait for on the CPU */
static std::atomic<int> emu_misaligned{0}; /* 16-byte shared loads off a 16-byte boundary */
#define GDN_SMEM(name) float *name = emu_smem
static inline float4 gdn_ld4(const float *p) {
    if (((uintptr_t)p & 15) != 0) emu_misaligned++; /* a fault on the device */
    float4 r;
    memcpy(&r, p, 16);
    return r;
}

#include "backend/cuda/gdn_chunked.cu"
#include "backend/cuda/gdn_recurrent.cuh"

/* ---- launches ---- */
/* Runs body() as every thread of every block of grid (threads per block, smem_floats of shared
 * memory, NaN-poisoned before each block and followed by a guard zone checked after it:
 * thread_blocks.h's emu_run). */
template <typename Body>
static void run_blocks(emu_dim3 grid, int threads, int64_t smem_floats, Body body,
                       const char *name) {
    emu_run(name, grid, (size_t)smem_floats * sizeof(float), body, threads);
}

/* Runs kernel(a) over grid with 256 threads per block and smem_floats of shared memory. */
static void run_grid(void (*kernel)(gdn_chunk_args), emu_dim3 grid, int64_t smem_floats,
                     const gdn_chunk_args &a, const char *name) {
    auto body = [&] { kernel(a); };
    run_blocks(grid, GDN_CT, smem_floats, body, name);
}

/* gdn_chunk_run's segment loop on emulated launches; scratch sized exactly, NaN-poisoned. */
template <int DK>
static void emu_chunked(const kiln_gdn_dims *d, int64_t n, int seg_limit, const float *q,
                        const float *k, const float *v, const float *g, const float *beta, float *S,
                        float *out) {
    const int nv = d->n_v_heads, dv = d->dv;
    int64_t seg = gdn_seg_chunks(nv, DK, dv, n, GDN_SCRATCH);
    if (seg_limit > 0 && seg > seg_limit) seg = seg_limit;
    const size_t scr_n = (size_t)(seg * nv * gdn_chunk_floats(DK, dv));
    std::vector<float> scr(scr_n + EMU_GUARD, NAN);
    for (size_t i = scr_n; i < scr.size(); i++) scr[i] = 1234.5f;
    for (int64_t s0 = 0; s0 < n; s0 += seg * GDN_L) {
        const gdn_chunk_args a = gdn_seg_args(d->n_k_heads, nv, DK, dv, n, s0, seg, q, k, v, g,
                                              beta, S, out, scr.data());
        run_grid(k_gdn_chunk_prep<DK>, {(unsigned)((a.n + GDN_L - 1) / GDN_L), (unsigned)nv, 1},
                 gdn_prep_smem_floats(DK, dv), a, "prep");
        run_grid(k_gdn_chunk_state<DK>, {(unsigned)nv, (unsigned)((dv + GDN_VT - 1) / GDN_VT), 1},
                 gdn_state_smem_floats(DK), a, "state");
    }
    for (size_t i = scr_n; i < scr.size(); i++)
        if (scr[i] != 1234.5f) {
            printf("FAIL scratch written past its %zu floats\n", scr_n);
            failures++;
            break;
        }
}

/* ---- checks ---- */
static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float rnd() { /* rough normal */
    float s = 0;
    for (int i = 0; i < 4; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        s += (float)(rng >> 40) / (float)(1ull << 24);
    }
    return (s - 2.0f) * 1.7f;
}

/* relative L2 of got against want; INFINITY when got has a non-finite element */
static double rel_l2(const float *got, const float *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!std::isfinite(got[i])) return INFINITY;
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    return std::sqrt(num / (den > 0 ? den : 1));
}

static const double TOL = 2e-5;

static void check(int nk, int nv, int dk, int dv, float decay, int seg_limit) {
    const kiln_gdn_dims d = {nk, nv, dk, dv};
    const size_t sn = (size_t)nv * dk * dv;
    std::vector<float> S_emu(sn), S_chk(sn), S_ref(sn);
    for (size_t i = 0; i < sn; i++) S_emu[i] = S_chk[i] = S_ref[i] = 0.3f * rnd();
    static const int lens[] = {1, 63, 64, 65, 200};
    double worst_chk = 0, worst_ref = 0;
    for (int n : lens) {
        const size_t qn = (size_t)n * nk * dk, vn = (size_t)n * nv * dv, gn = (size_t)n * nv;
        std::vector<float> q(qn), k(qn), v(vn), g(gn), beta(gn);
        for (auto &x : q) x = rnd();
        for (auto &x : k) x = rnd();
        for (auto &x : v) x = rnd();
        for (size_t i = 0; i < gn; i++) {
            g[i] = -decay * std::fabs(rnd());
            beta[i] = 1.0f / (1.0f + std::exp(-rnd()));
        }
        kiln_gdn_l2norm(q.data(), (int64_t)n * nk, dk, 1e-6f);
        kiln_gdn_l2norm(k.data(), (int64_t)n * nk, dk, 1e-6f);
        std::vector<float> o_emu(vn, NAN), o_chk(vn), o_ref(vn);
        switch (dk) {
        case 32:
            emu_chunked<32>(&d, n, seg_limit, q.data(), k.data(), v.data(), g.data(), beta.data(),
                            S_emu.data(), o_emu.data());
            break;
        case 64:
            emu_chunked<64>(&d, n, seg_limit, q.data(), k.data(), v.data(), g.data(), beta.data(),
                            S_emu.data(), o_emu.data());
            break;
        case 128:
            emu_chunked<128>(&d, n, seg_limit, q.data(), k.data(), v.data(), g.data(), beta.data(),
                             S_emu.data(), o_emu.data());
            break;
        default:
            emu_chunked<256>(&d, n, seg_limit, q.data(), k.data(), v.data(), g.data(), beta.data(),
                             S_emu.data(), o_emu.data());
            break;
        }
        kiln_gdn_chunked(&d, n, 64, q.data(), k.data(), v.data(), g.data(), beta.data(),
                         S_chk.data(), o_chk.data(), NULL);
        kiln_cpu_gdn_delta_ref(&d, n, q.data(), k.data(), v.data(), g.data(), beta.data(),
                               S_ref.data(), o_ref.data());
        const double ec = rel_l2(o_emu.data(), o_chk.data(), vn),
                     er = rel_l2(o_emu.data(), o_ref.data(), vn);
        worst_chk = std::fmax(worst_chk, ec), worst_ref = std::fmax(worst_ref, er);
        const bool ok = ec <= TOL && er <= TOL;
        failures += !ok;
        if (!ok)
            printf("FAIL nk=%d nv=%d dk=%d dv=%d decay=%g seg=%d n=%d: out vs chunked %.2e, vs "
                   "recurrent %.2e\n",
                   nk, nv, dk, dv, decay, seg_limit, n, ec, er);
    }
    const double sc = rel_l2(S_emu.data(), S_chk.data(), sn),
                 sr = rel_l2(S_emu.data(), S_ref.data(), sn);
    const bool ok = sc <= TOL && sr <= TOL && worst_chk <= TOL && worst_ref <= TOL;
    failures += sc > TOL || sr > TOL;
    printf("%s nk=%-2d nv=%-2d dk=%-3d dv=%-3d decay=%-4g seg=%d  out vs chunked %.1e vs recurrent "
           "%.1e  state %.1e / %.1e\n",
           ok ? "ok  " : "FAIL", nk, nv, dk, dv, decay, seg_limit, worst_chk, worst_ref, sc, sr);
    fflush(stdout);
}

/* ---- the batched kernels of gdn_recurrent.cuh ---- */

/* Any dk of the chunked form through emu_chunked. */
static void emu_chunked_any(const kiln_gdn_dims *d, int64_t n, const float *q, const float *k,
                            const float *v, const float *g, const float *beta, float *S,
                            float *out) {
    if (d->dk == 32) emu_chunked<32>(d, n, 0, q, k, v, g, beta, S, out);
    if (d->dk == 64) emu_chunked<64>(d, n, 0, q, k, v, g, beta, S, out);
    if (d->dk == 128) emu_chunked<128>(d, n, 0, q, k, v, g, beta, S, out);
    if (d->dk == 256) emu_chunked<256>(d, n, 0, q, k, v, g, beta, S, out);
}

/* kcu_gdn_conv's launches: per group of sequences the output kernel, then the state kernel.
 * Neither shares memory between threads, so their threads run one after another. The output
 * kernel gets at most 7 blocks, so its grid-stride loop runs several rounds. */
static int emu_conv(float *out, const float *x, int n_seqs, const int *n_tokens, int C,
                    const float *w, int K, float *const *states) {
    gdn_conv_launch L;
    memset(&L, 0, sizeof L);
    L.out = out, L.x = x, L.w = w, L.C = C, L.K = K;
    int launches = 0;
    auto all = [](int, int64_t) { return true; };
    gdn_for_groups(L.s, n_seqs, n_tokens, states, all, [&](int count) {
        L.n_seq = count;
        L.t_begin = L.s[0].t0;
        L.t_end = L.s[count - 1].t0 + L.s[count - 1].n;
        const int64_t total = (L.t_end - L.t_begin) * C;
        blockDim = {256, 1, 1};
        gridDim = {(unsigned)std::min<int64_t>((total + 255) / 256, 7), 1, 1};
        for (unsigned b = 0; b < gridDim.x; b++)
            for (unsigned t = 0; t < 256; t++) {
                blockIdx = {b, 0, 0}, threadIdx = {t, 0, 0};
                k_gdn_conv_out(L);
            }
        gridDim = {(unsigned)((C + 255) / 256), (unsigned)count, 1};
        for (unsigned z = 0; K > 1 && z < gridDim.y; z++)
            for (unsigned b = 0; b < gridDim.x; b++)
                for (unsigned t = 0; t < 256; t++) {
                    blockIdx = {b, z, 0}, threadIdx = {t, 0, 0};
                    k_gdn_conv_state(L);
                }
        launches++;
    });
    return launches;
}

/* kcu_gdn_delta's dispatch: sequences of at least chunk_min tokens (dk 32..256) through the
 * chunked kernels, one call each; the others in launches of the register (reg) or the
 * column-per-thread recurrent kernel. Counts the recurrent launches and the chunked calls. */
static void emu_delta(const kiln_gdn_dims *d, bool reg_kernel, int chunk_min, int n_seqs,
                      const int *n_tokens, const float *q, const float *k, const float *v,
                      const float *g, const float *beta, float *const *states, float *out,
                      int *launches, int *chunked) {
    const int nv = d->n_v_heads, dk = d->dk, dv = d->dv, R = dk % 4 == 0 ? dk / 4 : 0;
    const int64_t KD = (int64_t)d->n_k_heads * dk, VD = (int64_t)nv * dv;
    const bool reg = reg_kernel && (R == 4 || R == 8 || R == 16 || R == 32);
    const bool chunkable = (dk == 32 || dk == 64 || dk == 128 || dk == 256) && dv <= 256;
    gdn_delta_launch L;
    memset(&L, 0, sizeof L);
    L.q = q, L.k = k, L.v = v, L.g = g, L.beta = beta, L.out = out;
    L.nk = d->n_k_heads, L.nv = nv, L.dk = dk, L.dv = dv;
    auto recurrent = [&](int i, int64_t t0) {
        if (!chunkable || chunk_min <= 0 || n_tokens[i] < chunk_min) return true;
        emu_chunked_any(d, n_tokens[i], q + t0 * KD, k + t0 * KD, v + t0 * VD, g + t0 * nv,
                        beta + t0 * nv, states[i], out + t0 * VD);
        ++*chunked;
        return false;
    };
    gdn_for_groups(L.s, n_seqs, n_tokens, states, recurrent, [&](int count) {
        const emu_dim3 grid = {(unsigned)nv, (unsigned)((dv + 31) / 32), (unsigned)count};
        auto reg_body = [&] {
            if (R == 4) k_gdn_delta_reg<4>(L);
            if (R == 8) k_gdn_delta_reg<8>(L);
            if (R == 16) k_gdn_delta_reg<16>(L);
            if (R == 32) k_gdn_delta_reg<32>(L);
        };
        auto simple_body = [&] { k_gdn_delta(L); };
        if (reg)
            run_blocks(grid, GDN_REG_THREADS, 2 * dk, reg_body, "delta_reg");
        else
            run_blocks(grid, GDN_THREADS, 2 * dk, simple_body, "delta");
        ++*launches;
    });
}

/* Token counts of the batches: 1, 3, 64 (a decode step) and 70 sequences (67 or 68 of them
 * recurrent: two launches), with 0, 1, a few and a prefill's 80 tokens (chunked where dk
 * allows). */
static int batch_tokens(int n_seqs, int i) {
    if (n_seqs == 1) return 1;
    static const int three[] = {5, 1, 80};
    if (n_seqs == 3) return three[i];
    if (n_seqs == 64) return 1;
    if (i == 40) return 80;
    return i == 3 || i == 13 ? 0 : i % 10 == 7 ? 1 + i % 5 : 1;
}

/* The batched conv (channels C, width K) over two steps against kiln_gdn_conv per sequence:
 * every sequence's outputs and its carried state. */
static void check_conv_batch(int n_seqs, int C, int K) {
    std::vector<int> n(n_seqs);
    int64_t T = 0;
    for (int i = 0; i < n_seqs; i++) T += n[i] = batch_tokens(n_seqs, i);
    const int64_t sz = (int64_t)(K > 1 ? K - 1 : 1) * C;
    std::vector<float> w((size_t)C * K), st_emu((size_t)(n_seqs * sz)), st_ref(st_emu.size());
    for (auto &x : w) x = 0.5f * rnd();
    for (size_t i = 0; i < st_emu.size(); i++) st_emu[i] = st_ref[i] = rnd();
    std::vector<float *> se(n_seqs), sr(n_seqs);
    for (int i = 0; i < n_seqs; i++) se[i] = &st_emu[i * sz], sr[i] = &st_ref[i * sz];
    double worst = 0;
    int launches = 0;
    for (int step = 0; step < 2; step++) {
        std::vector<float> x((size_t)(T * C)), o_emu(x.size(), NAN), o_ref(x.size());
        for (auto &e : x) e = rnd();
        launches = emu_conv(o_emu.data(), x.data(), n_seqs, n.data(), C, w.data(), K, se.data());
        for (int i = 0, t = 0; i < n_seqs; t += n[i], i++)
            if (n[i]) kiln_gdn_conv(&o_ref[t * C], &x[t * C], n[i], C, w.data(), K, sr[i]);
        worst = std::fmax(worst, rel_l2(o_emu.data(), o_ref.data(), o_emu.size()));
        worst = std::fmax(worst, rel_l2(st_emu.data(), st_ref.data(), st_emu.size()));
    }
    const bool ok = worst <= 1e-6;
    failures += !ok;
    printf("%s conv  batch %-2d C=%-3d K=%d: %d launch pair(s), outputs and states %.1e\n",
           ok ? "ok  " : "FAIL", n_seqs, C, K, launches, worst);
    fflush(stdout);
}

/* The batched delta rule over two steps against the token-by-token reference per sequence: every
 * sequence's outputs (each its own relative L2) and its carried state. */
static void check_delta_batch(int n_seqs, int nk, int nv, int dk, int dv, bool reg) {
    const kiln_gdn_dims d = {nk, nv, dk, dv};
    std::vector<int> n(n_seqs);
    int64_t T = 0;
    for (int i = 0; i < n_seqs; i++) T += n[i] = batch_tokens(n_seqs, i);
    const int64_t sn = (int64_t)nv * dk * dv, KD = (int64_t)nk * dk, VD = (int64_t)nv * dv;
    std::vector<float> st_emu((size_t)(n_seqs * sn)), st_ref(st_emu.size());
    for (size_t i = 0; i < st_emu.size(); i++) st_emu[i] = st_ref[i] = 0.3f * rnd();
    std::vector<float *> se(n_seqs), sr(n_seqs);
    for (int i = 0; i < n_seqs; i++) se[i] = &st_emu[i * sn], sr[i] = &st_ref[i * sn];
    double worst = 0;
    int launches = 0, chunked = 0;
    for (int step = 0; step < 2; step++) {
        std::vector<float> q((size_t)(T * KD)), k(q.size()), v((size_t)(T * VD)),
            g((size_t)(T * nv)), beta(g.size()), o_emu(v.size(), NAN), o_ref(v.size());
        for (auto &x : q) x = rnd();
        for (auto &x : k) x = rnd();
        for (auto &x : v) x = rnd();
        for (size_t i = 0; i < g.size(); i++) {
            g[i] = -0.3f * std::fabs(rnd());
            beta[i] = 1.0f / (1.0f + std::exp(-rnd()));
        }
        kiln_gdn_l2norm(q.data(), T * nk, dk, 1e-6f);
        kiln_gdn_l2norm(k.data(), T * nk, dk, 1e-6f);
        launches = chunked = 0;
        emu_delta(&d, reg, 64, n_seqs, n.data(), q.data(), k.data(), v.data(), g.data(),
                  beta.data(), se.data(), o_emu.data(), &launches, &chunked);
        for (int i = 0, t = 0; i < n_seqs; t += n[i], i++) {
            if (!n[i]) continue;
            kiln_cpu_gdn_delta_ref(&d, n[i], &q[t * KD], &k[t * KD], &v[t * VD], &g[t * nv],
                                   &beta[t * nv], sr[i], &o_ref[t * VD]);
            worst = std::fmax(worst, rel_l2(&o_emu[t * VD], &o_ref[t * VD], (size_t)(n[i] * VD)));
        }
        for (int i = 0; i < n_seqs; i++) worst = std::fmax(worst, rel_l2(se[i], sr[i], (size_t)sn));
    }
    const bool ok = worst <= TOL;
    failures += !ok;
    printf("%s delta batch %-2d nk=%d nv=%d dk=%-2d dv=%-2d %s: %d recurrent launch(es), %d "
           "chunked call(s), outputs and states %.1e\n",
           ok ? "ok  " : "FAIL", n_seqs, nk, nv, dk, dv, reg ? "register" : "simple  ", launches,
           chunked, worst);
    fflush(stdout);
}

int main() {
    check(1, 2, 64, 64, 0.3f, 0);
    check(2, 4, 128, 128, 0.3f, 0);
    check(2, 6, 64, 100, 0.3f, 2);
    check(1, 3, 32, 40, 0.3f, 1);
    check(1, 1, 128, 33, 2.0f, 0);
    check(1, 2, 256, 64, 0.3f, 0);
    check(2, 4, 128, 128, 0.02f, 1);
    static const int batches[] = {1, 3, 64, 70};
    for (int b : batches) {
        check_conv_batch(b, 37, 4);
        check_conv_batch(b, 300, 4);
        check_conv_batch(b, 5, 3);
        check_conv_batch(b, 9, 1);
        check_delta_batch(b, 1, 2, 32, 40, false);
        check_delta_batch(b, 1, 2, 32, 40, true);
        check_delta_batch(b, 2, 4, 16, 8, true);
        check_delta_batch(b, 1, 1, 7, 33, false);
    }
    if (emu_misaligned) {
        printf("FAIL %d misaligned 16-byte shared loads\n", emu_misaligned.load());
        failures++;
    }
    printf("%s\n", failures ? "FAILED" : "all passed");
    return failures != 0;
}
