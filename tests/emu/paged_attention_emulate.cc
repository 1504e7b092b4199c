/* paged_attention_emulate.cc — runs the paged-cache attention kernels (src/backend/cuda/
 * attention_paged.cu: k_paged_attn, the log-sum-exp merge of its key splits, the TurboQuant
 * unrotation; attention_paged_decode.cuh: the one-launch decode kernel with its in-kernel split
 * merge) and their launch plans on the CPU: the source is compiled as C++ with PATT_HOST_EMU
 * and KCU_HOST_EMU, every CUDA thread of a block is a std::thread, __syncthreads is a block
 * barrier, a warp shuffle goes through an exchange buffer between two barriers of that warp's 32
 * threads, and dynamic shared memory is a NaN-poisoned buffer of exactly the launch's size with a
 * guard zone checked after each block.
 *
 * The cache is built as the device pool lays it out (paged_pool.h: records encoded by the CPU
 * codecs, f32 / f16 / bf16, affine q8 / q4, TurboQuant Lloyd-Max with rotated keys and values;
 * shuffled, shared and dropped blocks). Cases: decode and
 * prefill chunks, several sequences at different positions, GQA groups 1..8, head dims 64..512,
 * windows, logit softcaps, positions from a "device" array, key splits forced by a small SM
 * count; decode cases run on both kernels (the one-launch kernel wherever pdec_plan takes the
 * layout, and the arrival counters must be zero again after it). Reference: softmax attention in
 * double over the rows kv_codec_decode gives (brought
 * back from the rotated basis), relative L2 error <= 2e-5. A development check for machines
 * without a GPU (it does not see the hardware's scheduling or fast exp); run by
 * tests/test_paged_attention_emulate.sh (CTest). */
#include "cuda_shim.h"
#include "thread_blocks.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

extern "C" {
#include "backend/backend.h"
#include "kv/kv_cache.h"
}

#define PATT_HOST_EMU   1
#define ATTS_HOST_EMU   1
#define KCU_PDL_ENTER()                            /* nothing to wait for on the CPU */
#define KCU_ATT_MAX_SEQ 64                         /* attention.cuh */
static inline int kcu_attn_keys_bucket(int keys) { /* attention.cuh */
    return keys <= 4096 ? (keys + 127) / 128 * 128 : (keys + 1023) / 1024 * 1024;
}

#define PATT_SMEM(name) float *name = emu_smem
#define ATTS_SMEM(name) float *name = emu_smem
static int emu_misaligned = 0; /* record loads off their natural boundary (a fault on the GPU) */
template <typename T> static T kcu_ld(const T *p) {
    if (((uintptr_t)p % sizeof(T)) != 0) emu_misaligned++;
    T r;
    memcpy(&r, (const void *)p, sizeof r);
    return r;
}
static float kcu_tanh(float x) {
    return tanhf(x);
}
#define __expf(x) expf(x) /* (glibc declares an __expf but does not export it) */
using std::max;
using std::min;

#include "kv_codec_shim.h"
#include "paged_pool.h"
#include "backend/cuda/attention_paged.cu"

template <int RPW> static void emu_attn(const patt_launch &P, emu_dim3 grid, size_t smem) {
    const int vhd = P.L.v_head_dim;
    if (vhd <= 64)
        emu_run("k_paged_attn", grid, smem, [&] { k_paged_attn<2, RPW>(P); });
    else if (vhd <= 128)
        emu_run("k_paged_attn", grid, smem, [&] { k_paged_attn<4, RPW>(P); });
    else if (vhd <= 256)
        emu_run("k_paged_attn", grid, smem, [&] { k_paged_attn<8, RPW>(P); });
    else
        emu_run("k_paged_attn", grid, smem, [&] { k_paged_attn<16, RPW>(P); });
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float rnd() { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

struct seq_spec {
    int pos0, n;
};

/* emulated k_paged_decode<GM, CH, KB, CLS> for atts_dispatch_geometry */
template <int CLS> struct emu_pdec {
    const pdec_args &A;
    emu_dim3 grid;
    template <int GM, int CH, int KB> void run() {
        emu_run(
            "k_paged_decode", grid, pdec_smem_bytes(A), [&] { k_paged_decode<GM, CH, KB, CLS>(A); },
            ATTS_WARPS * 32);
    }
};

/* Relative L2 error of out against ref; a case passes at <= 2e-5 with no misaligned load. */
static void check(const char *what, const std::vector<float> &out, const std::vector<double> &ref) {
    double num = 0, den = 0;
    int bad = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!std::isfinite(out[i])) bad++;
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    const double err = bad ? INFINITY : sqrt(num / (den > 0 ? den : 1));
    const bool ok = err <= 2e-5 && emu_misaligned == 0;
    cases++;
    printf("%s %s: rel err %.2e%s\n", ok ? "ok  " : "FAIL", what, err,
           emu_misaligned ? " (misaligned loads)" : "");
    emu_misaligned = 0;
    if (!ok) failures++;
}

/* Sequences seqs (cached length pos0, n new tokens each), geometry, codecs: k_paged_attn's
 * launches, and for decode steps the one-launch kernel's too, each against the reference. */
static void run_case(const char *kname, const char *vname, int group, int n_kv, int G, int hd,
                     int vhd, int bt, int window, float softcap, std::vector<seq_spec> seqs,
                     int n_sms, bool device_positions) {
    const int n_seq = (int)seqs.size(), H = n_kv * G;
    std::vector<int> keys, first;
    for (auto &q : seqs) keys.push_back(q.pos0 + q.n), first.push_back(q.pos0);
    emu_paged_pool pool;
    pool.build(kname, vname, group, n_kv, hd, vhd, bt, window, keys, first, rnd);
    const kcu_paged_layer &L = pool.L;
    /* queries, the plan, the launches */
    int T = 0;
    std::vector<kcu_paged_seq> ps((size_t)n_seq);
    std::vector<int32_t> dpos;
    for (int s = 0; s < n_seq; s++) {
        ps[s] = {pool.tables[s].data(), seqs[s].pos0, seqs[s].n, T};
        for (int i = 0; i < seqs[s].n; i++) dpos.push_back(seqs[s].pos0 + i);
        T += seqs[s].n;
    }
    std::vector<float> q((size_t)T * H * hd), out((size_t)T * H * vhd, NAN);
    for (auto &x : q) x = rnd() * 2.0f;
    kiln_attn_params p;
    memset(&p, 0, sizeof p);
    p.n_heads = H, p.scale = 1.0f / sqrtf((float)hd), p.softcap = softcap;
    p.positions = device_positions ? dpos.data() : nullptr;
    /* reference: softmax attention in double over the decoded rows */
    std::vector<double> ref((size_t)T * H * vhd, 0.0);
    for (int s = 0; s < n_seq; s++)
        for (int i = 0; i < seqs[s].n; i++) {
            const int t = ps[s].t0 + i, pos = seqs[s].pos0 + i;
            const int lo = window > 0 ? std::max(0, pos - window + 1) : 0;
            for (int h = 0; h < H; h++) {
                const int kvh = h / G;
                std::vector<double> sc((size_t)(pos + 1 - lo));
                double m = -INFINITY;
                for (int j = lo; j <= pos; j++) {
                    const float *k = pool.key(s, j, kvh);
                    double d = 0;
                    for (int e = 0; e < hd; e++)
                        d += (double)q[((size_t)t * H + h) * hd + e] * k[e];
                    d *= p.scale;
                    if (softcap > 0) d = softcap * tanh(d / softcap);
                    sc[j - lo] = d;
                    m = std::max(m, d);
                }
                double den = 0;
                for (auto &x : sc) den += (x = exp(x - m));
                double *o = ref.data() + ((size_t)t * H + h) * vhd;
                for (int j = lo; j <= pos; j++) {
                    const float *v = pool.value(s, j, kvh);
                    for (int e = 0; e < vhd; e++) o[e] += sc[j - lo] / den * v[e];
                }
            }
        }
    patt_launch P;
    int tiles = 0, rpw = 1;
    if (!patt_plan(&P, &L, q.data(), out.data(), &p, ps.data(), n_seq, n_sms, &tiles, &rpw)) {
        printf("FAIL %s/%s: no plan\n", kname, vname);
        failures++, cases++;
        return;
    }
    if (device_positions) /* a recorded step: the kernel reads positions, not the host's pos0 */
        for (int s = 0; s < n_seq; s++) P.s[s].pos0 = -12345, P.s[s].kbeg = -12345;
    char what[256];
    const int len = snprintf(what, sizeof what,
                             "K %s V %s g%d kv %d x %d hd %d/%d block %d window %d softcap %g "
                             "seqs %d T %d%s",
                             kname, vname, group, n_kv, G, hd, vhd, bt, window, softcap, n_seq, T,
                             device_positions ? " (device positions)" : "");
    /* the one-launch decode kernel (planned before the poisoned positions: its plan reads the
     * host's) */
    pdec_args A;
    patt_launch Pp;
    int t2 = 0, r2 = 1;
    patt_plan(&Pp, &L, q.data(), out.data(), &p, ps.data(), n_seq, n_sms, &t2, &r2);
    const int cls = pdec_plan(&A, Pp, n_sms, 0, 0);
    std::vector<float> part;
    if (P.splits > 1) {
        const size_t n_part = (size_t)n_seq * P.splits * n_kv * P.rows_max;
        part.assign(n_part * (vhd + 2), NAN);
        P.part_o = part.data();
        P.part_ml = part.data() + n_part * vhd;
    }
    const size_t smem = patt_smem_bytes(rpw, hd, vhd);
    const emu_dim3 grid = {(unsigned)tiles, (unsigned)n_kv, (unsigned)(n_seq * P.splits)};
    if (rpw == 1)
        emu_attn<1>(P, grid, smem);
    else
        emu_attn<4>(P, grid, smem);
    if (P.splits > 1)
        emu_run("k_paged_attn_merge", {(unsigned)P.rows_max, (unsigned)n_kv, (unsigned)n_seq}, 0,
                [&] { k_paged_attn_merge(P); });
    if (L.v.rotate)
        emu_run("k_paged_unrotate",
                {(unsigned)(P.rows_max / P.group), (unsigned)H, (unsigned)n_seq},
                (size_t)vhd * sizeof(float), [&] { k_paged_unrotate(P); });
    snprintf(what + len, sizeof what - (size_t)len, " [k_paged_attn splits %d rpw %d]", P.splits,
             rpw);
    check(what, out, ref);
    if (cls < 0) return;
    if (device_positions)
        for (int s = 0; s < n_seq; s++) A.s[s].pos0 = -12345;
    std::fill(out.begin(), out.end(), NAN);
    std::vector<float> dpart;
    std::vector<unsigned> counters((size_t)n_seq * n_kv * A.nsub, 0u);
    if (A.splits > 1) {
        const size_t n_part = (size_t)n_seq * H * A.splits;
        dpart.assign(n_part * (vhd + 2), NAN);
        A.part_o = dpart.data(), A.part_ml = dpart.data() + n_part * vhd;
        A.counters = counters.data();
    }
    const emu_dim3 dgrid = {(unsigned)(n_kv * A.nsub), (unsigned)n_seq, (unsigned)A.splits};
    if (cls == PDEC_F32) {
        emu_pdec<PDEC_F32> f = {A, dgrid};
        atts_dispatch_geometry(G, hd, vhd, f);
    } else if (cls == PDEC_F16) {
        emu_pdec<PDEC_F16> f = {A, dgrid};
        atts_dispatch_geometry(G, hd, vhd, f);
    } else {
        emu_pdec<PDEC_QUANT> f = {A, dgrid};
        atts_dispatch_geometry(G, hd, vhd, f);
    }
    if (L.v.rotate)
        emu_run("k_paged_unrotate", {1u, (unsigned)H, (unsigned)n_seq}, (size_t)vhd * sizeof(float),
                [&] { k_paged_unrotate(P); });
    for (unsigned c : counters)
        if (c != 0) {
            printf("FAIL an arrival counter is %u after the launch\n", c);
            failures++;
            break;
        }
    snprintf(what + len, sizeof what - (size_t)len, " [k_paged_decode class %d splits %d]", cls,
             A.splits);
    check(what, out, ref);
}

int main() {
    /* decode, several sequences, q8 both, key splits (8 SMs) */
    run_case("q8", "q8", 32, 2, 4, 128, 128, 16, 0, 0.0f, {{0, 1}, {37, 1}, {300, 1}}, 8, false);
    /* prefill chunks of two sequences after a cached prefix, q4 */
    run_case("q4", "q4", 32, 1, 2, 64, 64, 4, 0, 0.0f, {{0, 20}, {40, 5}}, 1000, false);
    /* plain rows, head dim 80 (not a power of two), softcap */
    run_case("f16", "bf16", 16, 2, 2, 80, 80, 16, 0, 30.0f, {{5, 1}, {70, 1}}, 8, false);
    run_case("f32", "f32", 32, 1, 1, 64, 64, 8, 0, 0.0f, {{3, 9}, {1, 1}}, 1000, false);
    /* TurboQuant: rotated keys and values (unrotation kernel), 4 bits */
    run_case("t4r", "t4r", 32, 2, 2, 128, 128, 16, 0, 0.0f, {{0, 3}, {90, 1}}, 8, false);
    /* turbo k8v3: affine keys, 3-bit rotated values; a window dropping blocks, device positions */
    run_case("q8", "t3r", 32, 1, 4, 64, 64, 8, 24, 0.0f, {{100, 1}, {60, 1}, {9, 1}}, 8, true);
    /* GQA 8 at head dim 256 (Gemma-like), a long key range over many splits */
    run_case("q8", "q4", 64, 1, 8, 256, 256, 16, 0, 50.0f, {{520, 1}}, 4, false);
    /* head dim 512, f16, prefill with 4 rows a warp */
    run_case("f16", "f16", 32, 1, 2, 512, 512, 16, 0, 0.0f, {{30, 12}}, 1000, false);
    /* a window on a prefill chunk (rows see different key ranges) */
    run_case("q4", "q8", 32, 2, 2, 64, 64, 4, 10, 0.0f, {{50, 17}, {3, 2}}, 1000, false);
    /* decode on the one-launch kernel: Qwen3-0.6B-like q8 / q4 / turbo (affine keys, rotated
     * Lloyd values) / bf16 at long contexts with splits (132 SMs), rotated keys, 3-bit values
     * straddling code words, a window with dropped blocks and device positions, head dim 256 */
    run_case("q8", "q8", 32, 8, 2, 128, 128, 16, 0, 0.0f, {{1500, 1}}, 132, false);
    run_case("q4", "q4", 64, 2, 4, 128, 128, 16, 0, 0.0f, {{900, 1}, {17, 1}}, 132, true);
    run_case("q8r", "t4r", 64, 2, 2, 128, 128, 16, 0, 0.0f, {{700, 1}, {3, 1}}, 64, false);
    run_case("q4r", "t3r", 32, 1, 4, 128, 128, 8, 0, 20.0f, {{640, 1}}, 16, true);
    run_case("bf16", "bf16", 64, 4, 2, 128, 128, 16, 0, 0.0f, {{1100, 1}, {0, 1}}, 132, false);
    run_case("q8", "t3r", 32, 2, 3, 64, 64, 16, 100, 0.0f, {{800, 1}, {90, 1}}, 32, true);
    run_case("q4", "q8", 64, 1, 2, 256, 256, 16, 0, 0.0f, {{600, 1}}, 32, false);
    printf("%d cases, %d failed\n", cases, failures);
    return failures ? 1 : 0;
}
