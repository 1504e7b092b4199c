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
 * A development check for machines without a GPU (it does not see races between warps that the
 * barriers hide, nor the real hardware's FMA contraction and fast exp); run by
 * tests/test_gdn_emulate.sh (CTest), which also builds it. */
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
#define KCU_PDL_ENTER()         /* programmatic dependent launch: nothing to wait for on the CPU */
static float *emu_smem;         /* the running block's shared memory */
static std::barrier<> *emu_bar; /* the running block's __syncthreads */
static std::atomic<int> emu_misaligned{0}; /* 16-byte shared loads off a 16-byte boundary */
#define GDN_SMEM(name) float *name = emu_smem
static void __syncthreads() {
    emu_bar->arrive_and_wait();
}
static inline float4 gdn_ld4(const float *p) {
    if (((uintptr_t)p & 15) != 0) emu_misaligned++; /* a fault on the device */
    float4 r;
    memcpy(&r, p, 16);
    return r;
}

#include "backend/cuda/gdn_chunked.cu"

/* ---- launches ---- */
static int failures = 0;
enum { GUARD = 1024 };

/* Runs kernel(a) over grid with 256 threads per block and smem_floats of shared memory. */
static void run_grid(void (*kernel)(gdn_chunk_args), emu_dim3 grid, int64_t smem_floats,
                     const gdn_chunk_args &a, const char *name) {
    std::vector<float> sm((size_t)smem_floats + GUARD + 4);
    /* 16-byte aligned base, as extern __shared__ __align__(16) */
    float *base = (float *)(((uintptr_t)sm.data() + 15) & ~(uintptr_t)15);
    for (unsigned y = 0; y < grid.y; y++)
        for (unsigned x = 0; x < grid.x; x++) {
            for (int64_t i = 0; i < smem_floats; i++) base[i] = NAN;
            for (int i = 0; i < GUARD; i++) base[smem_floats + i] = 1234.5f;
            emu_smem = base;
            std::barrier<> bar(GDN_CT);
            emu_bar = &bar;
            std::vector<std::thread> th;
            th.reserve(GDN_CT);
            for (int t = 0; t < GDN_CT; t++)
                th.emplace_back([&, t, x, y] {
                    threadIdx = {(unsigned)t, 0, 0};
                    blockIdx = {x, y, 0};
                    kernel(a);
                });
            for (auto &t : th) t.join();
            for (int i = 0; i < GUARD; i++)
                if (base[smem_floats + i] != 1234.5f) {
                    printf("FAIL %s block (%u, %u) wrote past its %lld floats of shared memory\n",
                           name, x, y, (long long)smem_floats);
                    failures++;
                    break;
                }
        }
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
    std::vector<float> scr(scr_n + GUARD, NAN);
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

int main() {
    check(1, 2, 64, 64, 0.3f, 0);
    check(2, 4, 128, 128, 0.3f, 0);
    check(2, 6, 64, 100, 0.3f, 2);
    check(1, 3, 32, 40, 0.3f, 1);
    check(1, 1, 128, 33, 2.0f, 0);
    check(1, 2, 256, 64, 0.3f, 0);
    check(2, 4, 128, 128, 0.02f, 1);
    if (emu_misaligned) {
        printf("FAIL %d misaligned 16-byte shared loads\n", emu_misaligned.load());
        failures++;
    }
    printf("%s\n", failures ? "FAILED" : "all passed");
    return failures != 0;
}
