/* fa_emulate.cc — runs the tensor-core prefill attention kernel (src/backend/cuda/
 * attention_prefill_tc.cu, both variants) on the CPU: the kernel source is compiled as C++ with
 * FA_HOST_EMU, every CUDA thread of a block is a std::thread, __syncthreads and the warp
 * collectives (shuffles, mma.sync m16n8k16, ldmatrix x4) are emulated through barriers, with mma
 * and ldmatrix modelled from the PTX ISA's fragment description (as tests/test_fa_fragment.c), and
 * cp.async is a synchronous copy. Shared memory is poisoned with NaN before each block. Outputs
 * are compared with a double-precision causal GQA attention (window, softcap) on the same 16-bit
 * K/V, f32 Q: relative L2 error within 16-bit rounding, every element finite. The paged variant
 * reads a block pool built by paged_pool.h (records encoded by the CPU codecs, linked in).
 *
 * A development check for machines without a GPU (it does not see races or the real hardware);
 * run by tests/test_fa_emulate.sh (CTest), which also builds the CPU codec sources it links. */
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

/* ---- CUDA shims ---- */
#include "cuda_shim.h"
#define KCU_PDL_ENTER() /* programmatic dependent launch: nothing to wait for on the CPU */
static inline uint4 __ldg(const uint4 *p) {
    return *p;
}
static inline float4 __ldg(const float4 *p) {
    return *p;
}
template <typename T> static T kcu_ld(const T *p) { /* cuda_common.cuh's coherent load */
    return *p;
}
#define __expf(x) expf(x)          /* glibc declares its own __expf */
uint4 fa_sm_raw[(232 << 10) / 16]; /* "shared memory" of the running block */

static std::barrier<> *g_block_bar;
static std::barrier<> *g_warp_bar[4];
static void __syncthreads() {
    g_block_bar->arrive_and_wait();
}
static float xf[4][32];
static uint32_t xa[4][32][4], xb[4][32][2];
static const void *xp[4][32];
static float __shfl_xor_sync(unsigned, float v, int m) {
    int w = t_warp, l = t_lane;
    xf[w][l] = v;
    g_warp_bar[w]->arrive_and_wait();
    float r = xf[w][l ^ m];
    g_warp_bar[w]->arrive_and_wait();
    return r;
}

static float h16_to_f(uint16_t h, bool bf16) {
    if (bf16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}
static uint16_t f_to_h16(float f, bool bf16) {
    if (bf16) {
        uint32_t u;
        memcpy(&u, &f, 4);
        u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
        return (uint16_t)(u >> 16);
    }
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}
static uint32_t fa_emu_pack(float lo, float hi, bool bf16) {
    return (uint32_t)f_to_h16(lo, bf16) | (uint32_t)f_to_h16(hi, bf16) << 16;
}
/* mma.sync m16n8k16 from the PTX element description (a0..a7, b0..b3, c0..c3) */
static void fa_emu_mma(float d[4], const uint32_t a[4], const uint32_t b[2], bool bf16) {
    int w = t_warp, l = t_lane;
    memcpy(xa[w][l], a, 16), memcpy(xb[w][l], b, 8);
    g_warp_bar[w]->arrive_and_wait();
    float A[16][16], B[16][8];
    for (int lane = 0; lane < 32; lane++) {
        int gid = lane >> 2, tig = lane & 3;
        for (int i = 0; i < 8; i++) {
            int row = (i < 2 || (i >= 4 && i < 6)) ? gid : gid + 8;
            int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
            uint32_t r = xa[w][lane][i / 2];
            A[row][col] = h16_to_f((uint16_t)(i % 2 ? r >> 16 : r & 0xffff), bf16);
        }
        for (int i = 0; i < 4; i++) {
            int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0), col = gid;
            uint32_t r = xb[w][lane][i / 2];
            B[row][col] = h16_to_f((uint16_t)(i % 2 ? r >> 16 : r & 0xffff), bf16);
        }
    }
    for (int i = 0; i < 4; i++) {
        int row = (l >> 2) + (i >= 2 ? 8 : 0), col = (l & 3) * 2 + (i & 1);
        float s = 0;
        for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
        d[i] += s;
    }
    g_warp_bar[w]->arrive_and_wait();
}
/* ldmatrix x4: lanes 8i..8i+7 address matrix i's rows; lane gets (g, 2t..2t+1) or transposed */
static void fa_emu_ldsm4(uint32_t r[4], const void *smem, bool trans) {
    int w = t_warp, l = t_lane;
    xp[w][l] = smem;
    g_warp_bar[w]->arrive_and_wait();
    int gid = l >> 2, tig = l & 3;
    for (int i = 0; i < 4; i++) {
        uint16_t e[2];
        for (int k = 0; k < 2; k++) {
            int row = trans ? 2 * tig + k : gid, col = trans ? gid : 2 * tig + k;
            e[k] = ((const uint16_t *)xp[w][8 * i + row])[col];
        }
        r[i] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
    }
    g_warp_bar[w]->arrive_and_wait();
}
static void fa_emu_cp16(void *smem, const void *gmem, int src_bytes) {
    if (src_bytes == 16)
        memcpy(smem, gmem, 16);
    else
        memset(smem, 0, 16);
}

/* ---- what the kernel needs from attention.cuh / cuda_common.cuh ---- */
struct kiln_attn_params {
    int n_heads;
    float scale, softcap;
    const int32_t *positions;
};
struct kcu_attn_args {
    const float *q;
    float *out;
    int n, pos0;
    const void *k, *v;
    int kv_dtype;
    int n_kv_heads, head_dim, v_head_dim, window;
    kiln_attn_params p;
};
#define KCU_ATT_MAX_SEQ 64
static inline float kcu_tanh(float x) {
    return tanhf(x);
}

#include "kv_codec_shim.h"
#include "paged_pool.h"

#include "backend/cuda/attention_prefill_tc.cu"

/* ---- driver ---- */
template <int D, int KT, bool BF16, bool FAST, bool F32KV, bool SPLIT, bool PAGED = false>
static void run_grid(const fa_launch &L, emu_dim3 g) {
    gridDim = g;
    blockDim = {FA_WARPS * 32, 1, 1};
    for (unsigned z = 0; z < g.z; z++)
        for (unsigned y = 0; y < g.y; y++)
            for (unsigned x = 0; x < g.x; x++) {
                memset(fa_sm_raw, 0xff, sizeof fa_sm_raw); /* NaN in f16 and bf16 */
                std::barrier<> bb(FA_WARPS * 32);
                std::barrier<> wb0(32), wb1(32), wb2(32), wb3(32);
                g_block_bar = &bb;
                g_warp_bar[0] = &wb0, g_warp_bar[1] = &wb1, g_warp_bar[2] = &wb2;
                g_warp_bar[3] = &wb3;
                std::vector<std::thread> th;
                for (int t = 0; t < FA_WARPS * 32; t++)
                    th.emplace_back([&, t] {
                        threadIdx = {(unsigned)t, 0, 0};
                        blockIdx = {x, y, z};
                        t_warp = t >> 5, t_lane = t & 31;
                        k_fa_prefill<D, KT, BF16, FAST, F32KV, SPLIT, PAGED>(L);
                    });
                for (auto &t : th) t.join();
            }
}

static uint64_t rng = 12345;
static float rnd() { /* rough normal */
    float s = 0;
    for (int i = 0; i < 4; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        s += (float)(rng >> 40) / (float)(1ull << 24);
    }
    return (s - 2.0f) * 1.7f;
}

struct seq_spec {
    int pos0, n;
};

static int failures = 0;

/* Compares out with causal GQA attention in double (window, softcap) over the rows key(i, j, g) /
 * value(i, j, g) (sequence i, position j, kv head g): relative L2 error; *bad counts non-finite
 * outputs. */
template <typename KF, typename VF>
static double ref_error(const fa_launch &L, const std::vector<seq_spec> &seqs, int D,
                        const std::vector<float> &q, const std::vector<float> &out, KF key,
                        VF value, long *bad) {
    const int G = L.group, heads = L.a.p.n_heads, window = L.a.window;
    const float cap = L.a.p.softcap;
    double num = 0, den = 0;
    *bad = 0;
    for (size_t i = 0; i < seqs.size(); i++)
        for (int t = 0; t < seqs[i].n; t++)
            for (int h = 0; h < heads; h++) {
                int g = h / G, p = seqs[i].pos0 + t,
                    lo = window > 0 ? std::max(0, p - window + 1) : 0;
                const float *qr = &q[((size_t)(L.s[i].t0 + t) * heads + h) * D];
                std::vector<double> sc(p + 1 - lo);
                double mx = -1e300;
                for (int j = lo; j <= p; j++) {
                    const float *k = key(i, j, g);
                    double s = 0;
                    for (int d = 0; d < D; d++) s += (double)qr[d] * k[d];
                    s *= L.a.p.scale;
                    if (cap > 0) s = cap * tanh(s / cap);
                    sc[j - lo] = s, mx = std::max(mx, s);
                }
                double sum = 0;
                for (auto &s : sc) s = exp(s - mx), sum += s;
                const float *o = &out[((size_t)(L.s[i].t0 + t) * heads + h) * D];
                for (int d = 0; d < D; d++) {
                    double r = 0;
                    for (int j = lo; j <= p; j++) r += sc[j - lo] * value(i, j, g)[d];
                    r /= sum;
                    if (!std::isfinite(o[d])) (*bad)++;
                    num += (o[d] - r) * (o[d] - r), den += r * r;
                }
            }
    return sqrt(num / (den > 0 ? den : 1));
}

/* F32KV: the cache holds f32 (the reference reads it unrounded), the kernel rounds to bf16, or
 * with SPLIT keeps it as bf16 hi + lo pairs (three products: 2e-5, where bf16 gets 1e-2). */
template <int D, int KT, bool BF16, bool FAST, bool F32KV = false, bool SPLIT = false>
static void check(int n_kv, int G, int window, float cap, std::vector<seq_spec> seqs) {
    int heads = n_kv * G, T = 0;
    for (auto &s : seqs) T += s.n;
    std::vector<float> q((size_t)T * heads * D), out((size_t)T * heads * D, NAN);
    for (auto &x : q) x = rnd();
    std::vector<std::vector<uint16_t>> K(seqs.size()), V(seqs.size());
    std::vector<std::vector<float>> Kf(seqs.size()), Vf(seqs.size());
    fa_launch L;
    memset(&L, 0, sizeof L);
    L.a.q = q.data(), L.a.out = out.data();
    L.a.n_kv_heads = n_kv, L.a.head_dim = L.a.v_head_dim = D, L.a.window = window;
    L.a.p.n_heads = heads, L.a.p.scale = 1.0f / sqrtf((float)D), L.a.p.softcap = cap;
    L.group = G, L.n_seq = (int)seqs.size(), L.fast = FAST;
    int max_n = 0, t0 = 0;
    for (size_t i = 0; i < seqs.size(); i++) {
        int keys = seqs[i].pos0 + seqs[i].n;
        K[i].resize((size_t)keys * n_kv * D), V[i].resize((size_t)keys * n_kv * D);
        Kf[i].resize(K[i].size()), Vf[i].resize(V[i].size());
        for (size_t e = 0; e < K[i].size(); e++) {
            Kf[i][e] = rnd(), Vf[i][e] = rnd();
            K[i][e] = f_to_h16(Kf[i][e], BF16), V[i][e] = f_to_h16(Vf[i][e], BF16);
            if (!F32KV) Kf[i][e] = h16_to_f(K[i][e], BF16), Vf[i][e] = h16_to_f(V[i][e], BF16);
        }
        L.s[i].k = F32KV ? (const void *)Kf[i].data() : K[i].data();
        L.s[i].v = F32KV ? (const void *)Vf[i].data() : V[i].data();
        L.s[i].pos0 = seqs[i].pos0, L.s[i].n = seqs[i].n, L.s[i].t0 = t0;
        t0 += seqs[i].n;
        if (seqs[i].n > max_n) max_n = seqs[i].n;
    }
    run_grid<D, KT, BF16, FAST, F32KV, SPLIT>(
        L,
        {(unsigned)n_kv, (unsigned)((max_n * G + FA_ROWS - 1) / FA_ROWS), (unsigned)seqs.size()});
    long bad = 0;
    const double err = ref_error(
        L, seqs, D, q, out,
        [&](size_t i, int j, int g) { return &Kf[i][((size_t)j * n_kv + g) * D]; },
        [&](size_t i, int j, int g) { return &Vf[i][((size_t)j * n_kv + g) * D]; }, &bad);
    double tol = SPLIT ? 2e-5 : BF16 ? 1e-2 : 2e-3;
    bool ok = bad == 0 && err <= tol;
    failures += !ok;
    printf("%s D=%d KT=%d %s %s kv=%d G=%d win=%d cap=%g seqs=", ok ? "ok  " : "FAIL", D, KT,
           SPLIT   ? "f32 split"
           : F32KV ? "f32 "
           : BF16  ? "bf16"
                   : "f16 ",
           FAST ? "fast  " : "simple", n_kv, G, window, cap);
    for (auto &s : seqs) printf("(%d+%d)", s.pos0, s.n);
    printf(": rel err %.2e, %ld non-finite\n", err, bad);
    fflush(stdout);
}

/* Paged records (PAGED: the simple kernel, decoded records staged as bf16 hi + lo pairs) from a
 * pool of bt-token blocks (paged_pool.h); reference over the decoded rows, tolerance as SPLIT's. */
template <int D, int KT>
static void check_paged(const char *kname, const char *vname, int group, int bt, int n_kv, int G,
                        int window, float cap, std::vector<seq_spec> seqs) {
    int heads = n_kv * G, T = 0;
    std::vector<int> keys, first;
    for (auto &s : seqs) T += s.n, keys.push_back(s.pos0 + s.n), first.push_back(s.pos0);
    emu_paged_pool pool;
    pool.build(kname, vname, group, n_kv, D, D, bt, window, keys, first,
               [] { return rnd() * 0.5f; });
    std::vector<float> q((size_t)T * heads * D), out((size_t)T * heads * D, NAN);
    for (auto &x : q) x = rnd();
    fa_launch L;
    memset(&L, 0, sizeof L);
    L.a.q = q.data(), L.a.out = out.data(), L.a.kv_dtype = 0;
    L.a.n_kv_heads = n_kv, L.a.head_dim = L.a.v_head_dim = D, L.a.window = window;
    L.a.p.n_heads = heads, L.a.p.scale = 1.0f / sqrtf((float)D), L.a.p.softcap = cap;
    L.group = G, L.n_seq = (int)seqs.size(), L.fast = false, L.pl = pool.L;
    int max_n = 0, t0 = 0;
    for (size_t i = 0; i < seqs.size(); i++) {
        L.s[i].k = pool.tables[i].data(), L.s[i].v = nullptr;
        L.s[i].pos0 = seqs[i].pos0, L.s[i].n = seqs[i].n, L.s[i].t0 = t0;
        t0 += seqs[i].n;
        max_n = std::max(max_n, seqs[i].n);
    }
    run_grid<D, KT, true, false, true, true, true>(
        L,
        {(unsigned)n_kv, (unsigned)((max_n * G + FA_ROWS - 1) / FA_ROWS), (unsigned)seqs.size()});
    if (pool.L.v.rotate) /* rotated values: the launcher's unrotation of each output row (its
                          * kernel, k_paged_unrotate, is checked by paged_attention_emulate) */
        for (int r = 0; r < T * heads; r++) kiln_hadamard_unrotate(&out[(size_t)r * D], D);
    long bad = 0;
    const double err = ref_error(
        L, seqs, D, q, out, [&](size_t i, int j, int g) { return pool.key((int)i, j, g); },
        [&](size_t i, int j, int g) { return pool.value((int)i, j, g); }, &bad);
    bool ok = bad == 0 && err <= 2e-5;
    failures += !ok;
    printf("%s D=%d KT=%d paged K %s V %s g%d block %d kv=%d G=%d win=%d cap=%g seqs=",
           ok ? "ok  " : "FAIL", D, KT, kname, vname, group, bt, n_kv, G, window, cap);
    for (auto &s : seqs) printf("(%d+%d)", s.pos0, s.n);
    printf(": rel err %.2e, %ld non-finite\n", err, bad);
    fflush(stdout);
}

template <bool FAST> static void all_cases() {
    check<64, 64, true, FAST>(1, 4, 0, 0.0f, {{0, 40}});
    check<64, 64, false, FAST>(2, 1, 0, 0.0f, {{37, 70}});
    check<80, 64, true, FAST>(1, 1, 20, 50.0f, {{0, 90}});
    check<96, 64, false, FAST>(1, 8, 30, 0.0f, {{37, 20}});
    check<128, 64, true, FAST>(2, 4, 0, 0.0f, {{100, 20}, {0, 33}, {5, 1}});
    check<128, 64, false, FAST>(1, 8, 0, 50.0f, {{0, 17}});
    check<256, 32, true, FAST>(1, 2, 16, 0.0f, {{5, 45}});
    check<256, 32, false, FAST>(1, 1, 0, 30.0f, {{64, 40}, {0, 70}});
}

int main() {
    all_cases<true>();
    all_cases<false>();
    check<64, 64, true, false, true>(2, 4, 0, 0.0f, {{37, 70}});
    check<80, 64, true, false, true>(1, 1, 20, 50.0f, {{0, 90}, {3, 10}});
    check<128, 64, true, false, true>(1, 8, 0, 0.0f, {{10, 24}});
    check<256, 32, true, false, true>(1, 2, 0, 0.0f, {{0, 40}});
    check<64, 64, true, false, true, true>(2, 4, 0, 0.0f, {{37, 70}});
    check<80, 64, true, false, true, true>(1, 1, 20, 50.0f, {{0, 90}, {3, 10}});
    check<128, 64, true, false, true, true>(1, 8, 0, 0.0f, {{10, 24}});
    check<256, 32, true, false, true, true>(1, 2, 16, 0.0f, {{0, 40}});
    check_paged<128, 64>("q8", "q8", 32, 16, 2, 4, 0, 0.0f, {{0, 70}, {37, 100}});
    check_paged<64, 64>("q4", "q4", 32, 4, 1, 2, 30, 0.0f, {{50, 80}});
    check_paged<80, 64>("f16", "bf16", 16, 16, 2, 1, 0, 50.0f, {{0, 66}, {5, 3}});
    check_paged<96, 64>("f32", "q8", 32, 8, 1, 8, 0, 0.0f, {{3, 70}});
    check_paged<256, 32>("q8", "q4", 64, 16, 1, 2, 20, 30.0f, {{10, 64}});
    check_paged<128, 64>("q8", "t4r", 32, 16, 2, 2, 0, 0.0f, {{0, 65}, {20, 70}}); /* turbo k8v4 */
    check_paged<64, 64>("q8", "t3r", 32, 8, 1, 4, 40, 0.0f, {{30, 64}});           /* turbo k8v3 */
    /* rotated keys (turbo ...:rotk): the kernel rotates Q, at head dim 256 in two passes */
    check_paged<128, 64>("t4r", "t4r", 32, 16, 2, 2, 0, 30.0f, {{0, 70}, {10, 66}});
    check_paged<256, 32>("q8r", "t4r", 64, 16, 1, 2, 0, 0.0f, {{5, 70}});
    check_paged<64, 64>("q4r", "q8", 32, 4, 2, 1, 24, 0.0f, {{40, 64}});
    printf("%s\n", failures ? "FAILED" : "all passed");
    return failures != 0;
}
