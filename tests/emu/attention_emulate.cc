/* attention_emulate.cc — runs the short decode attention kernel (src/backend/cuda/
 * attention_decode.cuh, k_attn_decode_short) on the CPU: the kernel source is compiled as C++ with
 * ATTS_HOST_EMU, every CUDA thread of a block is a std::thread, __syncthreads is a block barrier,
 * a warp shuffle goes through an exchange buffer between two barriers of that warp's 32 threads
 * (warps run different numbers of key turns, so a block-wide barrier would not do), dynamic
 * shared memory is a buffer of exactly atts_smem_bytes (NaN-poisoned, followed by a guard zone
 * checked after each block), every K/V load is checked for its alignment and the outputs start as
 * NaN.
 *
 * Cases: GQA groups 1..12 (split over blocks above a block's heads), head dims 64 to 512 (v head
 * dim different from k's in some), f32 / f16 / bf16 caches, sliding windows, logit softcaps,
 * several sequences per launch at different positions (0, short, several turns of the 16 warps),
 * positions from the arguments or from a "device" array, and long contexts split over grid z as
 * atts_plan_splits plans them for a GPU of a given SM count (blocks run in grid order, so the last
 * split of a column merges; splits past a sequence's last key, as a recorded step planned for its
 * bucket's key count has; the arrival counters must be zero again after the launch). Reference:
 * softmax attention in double over the same rounded K/V, by relative L2 error <= 1e-5 (what
 * test_cuda_ops asks of the GPU). A development check for machines without a GPU (it does not see
 * the hardware's scheduling, fast exp or FMA contraction); run by tests/test_attention_emulate.sh
 * (CTest).
 *
 * It runs attention.cu's flash-style kernel k_attn (prefill chunks and the decode launches the
 * short kernel does not take) and its split merge k_attn_merge too, launched as attention_chunk
 * plans them, against the same reference over query tokens at consecutive positions. */
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
#include "util/half.h"
}

#define ATTS_HOST_EMU   1
#define KCU_PDL_ENTER()                    /* nothing to wait for on the CPU */
static std::atomic<int> emu_misaligned{0}; /* loads off their natural boundary */
#define ATTS_SMEM(name) float *name = emu_smem
template <typename T> static T __ldg(const T *p) {
    if (((uintptr_t)p % sizeof(T)) != 0) emu_misaligned++; /* a fault on the device */
    T r;
    memcpy(&r, (const void *)p, sizeof r);
    return r;
}
template <typename T> static T kcu_ld(const T *p) { /* cuda_common.cuh's coherent load */
    return __ldg(p);
}
#define __expf(x) expf(x) /* (glibc declares an __expf but does not export it) */
static float kcu_f16(uint16_t h) {
    return kiln_f16_to_f32(h);
}
static float kcu_tanh(float x) {
    return tanhf(x);
}
using std::max;
using std::min;

#include "backend/cuda/attention_decode.cuh"

/* attention.cu's kernels (k_attn, k_attn_merge) with ATT_HOST_EMU: the CUDA helpers they call,
 * on the CPU (the f16 / bf16 rounding of util/half.h, the warp's own barrier for __syncwarp) */
#define ATT_HOST_EMU   1
#define KCU_HOST_EMU   1
#define ATT_SMEM(name) float *name = emu_smem
struct __half {
    uint16_t bits;
};
struct __nv_bfloat16 {
    uint16_t bits;
};
static __half __float2half_rn(float x) {
    return {kiln_f32_to_f16(x)};
}
static float __half2float(__half h) {
    return kiln_f16_to_f32(h.bits);
}
static __nv_bfloat16 __float2bfloat16_rn(float x) {
    return {kiln_f32_to_bf16(x)};
}
static float __bfloat162float(__nv_bfloat16 h) {
    return kiln_bf16_to_f32(h.bits);
}
static float kcu_load(const void *p, int64_t i, int dt) { /* cuda_common.cuh */
    if (dt == KILN_DT_F32) return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    return dt == KILN_DT_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
}
static void kcu_kv_put(void *dst, int64_t i, float x, int dt) { /* attention.cuh */
    if (dt == KILN_DT_F32)
        ((float *)dst)[i] = x;
    else
        ((uint16_t *)dst)[i] = dt == KILN_DT_BF16 ? kiln_f32_to_bf16(x) : kiln_f32_to_f16(x);
}
static float rsqrtf(float x) {
    return 1.0f / sqrtf(x);
}
static void __syncwarp() {
    emu_warp_bar[t_warp]->arrive_and_wait();
}
#include "backend/cuda/attention.cu"

/* Runs k_attn_decode_short<GM, CH, KB, A.kv_dtype>(A) over grid (thread_blocks.h: one std::thread
 * per CUDA thread walks the blocks in order, shared memory of exactly atts_smem_bytes poisoned and
 * guarded around each block). */
template <int GM, int CH, int KB> static void emu_launch(const atts_args &A, emu_dim3 grid) {
    const size_t smem = atts_smem_bytes(atts_heads_per_block(A.group, A.hd, A.vhd), A.vhd);
    emu_run(
        "k_attn_decode_short", grid, smem,
        [&] {
            if (A.kv_dtype == KILN_DT_F32)
                k_attn_decode_short<GM, CH, KB, KILN_DT_F32>(A);
            else if (A.kv_dtype == KILN_DT_BF16)
                k_attn_decode_short<GM, CH, KB, KILN_DT_BF16>(A);
            else
                k_attn_decode_short<GM, CH, KB, KILN_DT_F16>(A);
        },
        ATTS_WARPS * 32);
}

/* atts_dispatch's callback: the emulated launch of the instance it picks */
struct emu_launcher {
    const atts_args &A;
    emu_dim3 grid;
    template <int GM, int CH, int KB> void run() { emu_launch<GM, CH, KB>(A, grid); }
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float rnd() { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static uint16_t to_bits(float x, int dt) {
    return dt == KILN_DT_BF16 ? kiln_f32_to_bf16(x) : kiln_f32_to_f16(x);
}
static float from_bits(uint16_t h, int dt) {
    return dt == KILN_DT_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
}

/* Random cache values f (amplitude amp) stored as dtype dt in bytes b; f keeps the rounded
 * values the reference reads. */
static void fill_cache(std::vector<float> &f, uint8_t *b, int dt, float amp) {
    for (size_t i = 0; i < f.size(); i++) {
        float x = rnd() * amp;
        if (dt == KILN_DT_F32) {
            memcpy(b + 4 * i, &x, 4);
        } else {
            const uint16_t h = to_bits(x, dt);
            memcpy(b + 2 * i, &h, 2);
            x = from_bits(h, dt);
        }
        f[i] = x;
    }
}

/* The squared error of one output row got [vhd] against softmax attention in double of query
 * row qr [hd] (times scale) over keys [kbeg, kend) of KV head kvh in K / V ([keys, n_kv, hd |
 * vhd]), with a logit softcap when > 0. */
struct ref_err {
    double num = 0, den = 0;
    int bad = 0; /* non-finite outputs */
    double rel() const { return den > 0 ? sqrt(num / den) : 0; }
};
static void ref_check_row(ref_err &r, const float *qr, float scale, const std::vector<float> &K,
                          const std::vector<float> &V, int n_kv, int kvh, int hd, int vhd, int kbeg,
                          int kend, float softcap, const float *got) {
    std::vector<double> sc(kend);
    double mx = -INFINITY;
    for (int j = kbeg; j < kend; j++) {
        double d = 0;
        for (int e = 0; e < hd; e++)
            d += (double)(qr[e] * scale) * K[((size_t)j * n_kv + kvh) * hd + e];
        if (softcap > 0) d = softcap * tanh(d / softcap);
        sc[j] = d;
        mx = std::max(mx, d);
    }
    double z = 0;
    for (int j = kbeg; j < kend; j++) z += exp(sc[j] - mx);
    for (int e = 0; e < vhd; e++) {
        double o = 0;
        for (int j = kbeg; j < kend; j++)
            o += exp(sc[j] - mx) / z * V[((size_t)j * n_kv + kvh) * vhd + e];
        if (!std::isfinite(got[e])) r.bad++;
        r.num += (got[e] - o) * (got[e] - o);
        r.den += o * o;
    }
}

/* The digits of x [n, cols] that k_qx_digits (qgemv.cu pass 1) makes: one emulated warp per
 * block and 32-column group, in the layout of qgemv.cu's qg_layout (E, sx16, dig). */
struct digits {
    std::vector<float> E, sx16;
    std::vector<int8_t> dig;
    explicit digits(int n, int ng)
        : E((size_t)n * ng, NAN), sx16((size_t)n * 2 * ng, NAN), dig((size_t)n * ng * 96, 0x5a) {}
    bool operator==(const digits &o) const {
        return !memcmp(E.data(), o.E.data(), E.size() * 4) &&
               !memcmp(sx16.data(), o.sx16.data(), sx16.size() * 4) && dig == o.dig;
    }
};
static void pass1_digits(digits &d, const float *x, int n, int cols, int perm4, int nd) {
    const int ng = cols / 32;
    emu_run(
        "pass 1 digits", {(unsigned)ng, (unsigned)n, 1}, 0,
        [&] {
            const int g = (int)blockIdx.x, t = (int)blockIdx.y, lane = (int)threadIdx.x;
            qx_digit_block(d.dig.data(), d.E.data(), d.sx16.data(),
                           x[(size_t)t * cols + g * 32 + lane], t, g, ng, perm4, lane, nd);
        },
        32);
}

/* One launch: n_seq sequences at positions pos[], geometry (n_kv, G, hd, vhd), cache dtype dt.
 * n_sms > 0: key splits as atts_plan_splits plans them for that many SMs, over plan_keys keys
 * (0: the longest sequence's) — more than any sequence has, as for a recorded step. emit > 0:
 * the kernel also makes out's digits for the o projection (qg_link), 4-bit order when emit & 1,
 * fast mode's one digit when emit & 2, which must equal pass 1's of out bit for bit. */
static void run_case(int n_kv, int G, int hd, int vhd, int dt, int window, float softcap,
                     const std::vector<int> &pos, bool device_positions, int n_sms = 0,
                     int plan_keys = 0, int emit = 0) {
    const int n_seq = (int)pos.size(), H = n_kv * G;
    if (!atts_applies(G, hd, vhd)) { /* a case the launcher would not give the kernel */
        printf("FAIL kv=%d g=%d hd=%d/%d: not a geometry atts_applies takes\n", n_kv, G, hd, vhd);
        failures++, cases++;
        return;
    }
    const int esz = dt == KILN_DT_F32 ? 4 : 2;
    atts_args A;
    memset(&A, 0, sizeof A);
    std::vector<float> q((size_t)n_seq * H * hd), out((size_t)n_seq * H * vhd, NAN);
    for (auto &x : q) x = rnd() * 2.0f;
    std::vector<std::vector<float>> Kf(n_seq), Vf(n_seq);   /* rounded values, for the ref */
    std::vector<std::vector<uint8_t>> Kb(n_seq), Vb(n_seq); /* cache bytes */
    std::vector<int32_t> dpos(n_seq);
    for (int s = 0; s < n_seq; s++) {
        const int keys = pos[s] + 1;
        Kf[s].resize((size_t)keys * n_kv * hd), Vf[s].resize((size_t)keys * n_kv * vhd);
        Kb[s].resize(Kf[s].size() * esz + 16), Vb[s].resize(Vf[s].size() * esz + 16);
        fill_cache(Kf[s], Kb[s].data(), dt, 1.5f);
        fill_cache(Vf[s], Vb[s].data(), dt, 1.0f);
        A.s[s].k = Kb[s].data(), A.s[s].v = Vb[s].data();
        A.s[s].pos0 = device_positions ? -12345 : pos[s]; /* must not be read then */
        A.s[s].t0 = s;
        dpos[s] = pos[s];
    }
    A.q = q.data(), A.out = out.data(), A.positions = device_positions ? dpos.data() : nullptr;
    A.n_heads = H, A.n_kv_heads = n_kv, A.group = G, A.hd = hd, A.vhd = vhd, A.window = window;
    A.kv_dtype = dt, A.scale = 1.0f / sqrtf((float)hd), A.softcap = softcap;
    atts_plan(&A);
    std::vector<float> part;
    std::vector<unsigned> counters;
    A.splits = 1;
    if (n_sms > 0) {
        int keys = plan_keys;
        for (int s = 0; s < n_seq && !plan_keys; s++) {
            const int kb = window > 0 ? std::max(0, pos[s] - window + 1) : 0;
            keys = std::max(keys, pos[s] + 1 - kb);
        }
        atts_plan_splits(&A, keys, n_seq, n_sms, 0, 0);
        const size_t n_part = (size_t)n_seq * H * A.splits;
        part.assign(n_part * (vhd + 2), NAN);
        A.part_o = part.data(), A.part_ml = part.data() + n_part * vhd;
        counters.assign((size_t)n_seq * n_kv * A.nsub, 0u);
        A.counters = counters.data();
        if (A.splits * A.kps < keys || (A.splits - 1) * A.kps >= keys) {
            printf("FAIL plan: %d splits of %d keys for %d keys\n", A.splits, A.kps, keys);
            failures++;
        }
    }
    const int ng = H * vhd / 32, perm4 = emit & 1, nd = emit & 2 ? 1 : 3;
    digits emitted(emit ? n_seq : 0, ng);
    if (emit) {
        A.emit_dig = emitted.dig.data(), A.emit_E = emitted.E.data();
        A.emit_sx16 = emitted.sx16.data(), A.emit_perm4 = perm4, A.emit_nd = nd;
    }
    emu_launcher launcher = {A, {(unsigned)(n_kv * A.nsub), (unsigned)n_seq, (unsigned)A.splits}};
    atts_dispatch(A, launcher);
    bool digits_ok = true;
    if (emit) {
        digits want(n_seq, ng);
        pass1_digits(want, out.data(), n_seq, H * vhd, perm4, nd);
        digits_ok = emitted == want;
    }
    for (unsigned c : counters)
        if (c != 0) {
            printf("FAIL an arrival counter is %u after the launch\n", c);
            failures++;
            break;
        }
    /* reference in double */
    ref_err r;
    for (int s = 0; s < n_seq; s++) {
        const int kbeg = window > 0 ? std::max(0, pos[s] - window + 1) : 0, kend = pos[s] + 1;
        for (int h = 0; h < H; h++)
            ref_check_row(r, &q[((size_t)s * H + h) * hd], A.scale, Kf[s], Vf[s], n_kv, h / G, hd,
                          vhd, kbeg, kend, softcap, &out[((size_t)s * H + h) * vhd]);
    }
    const double err = r.rel();
    const int bad = r.bad;
    const bool ok = bad == 0 && err <= 1e-5 && emu_misaligned == 0 && digits_ok;
    cases++;
    failures += !ok;
    printf("%s kv=%d g=%d hd=%d/%d %s win=%d cap=%g seqs=%d (last pos %d)%s splits=%d%s: rel err "
           "%.2e%s\n",
           ok ? "ok  " : "FAIL", n_kv, G, hd, vhd,
           dt == KILN_DT_F32   ? "f32"
           : dt == KILN_DT_F16 ? "f16"
                               : "bf16",
           window, softcap, n_seq, pos.back(), device_positions ? " device positions" : "",
           A.splits, emit ? " digits" : "", err,
           bad              ? " (non-finite outputs)"
           : emu_misaligned ? " (misaligned loads)"
           : !digits_ok     ? " (digits differ from pass 1's)"
                            : "");
    emu_misaligned = 0;
}

/* ---- attention.cu's k_attn (contiguous cache, CUDA cores; prefill chunks and decode that the
 * short kernel does not take) and k_attn_merge, launched as attention_chunk plans them ---- */
template <int DPL, int RPW> static void emu_flash(const att_launch &L, emu_dim3 grid) {
    const int hd = L.a.head_dim, vhd = L.a.v_head_dim;
    const size_t smem = sizeof(float) * ((size_t)ATT_WARPS * RPW * hd + (size_t)ATT_KT * (hd + 1) +
                                         (size_t)ATT_KT * vhd);
    emu_run(
        "k_attn", grid, smem, [&] { k_attn<DPL, RPW, false>(L); }, ATT_WARPS * 32);
}
template <int RPW> static void emu_flash_dpl(const att_launch &L, emu_dim3 grid) {
    const int vhd = L.a.v_head_dim;
    if (vhd <= 64)
        emu_flash<2, RPW>(L, grid);
    else if (vhd <= 128)
        emu_flash<4, RPW>(L, grid);
    else if (vhd <= 256)
        emu_flash<8, RPW>(L, grid);
    else
        emu_flash<16, RPW>(L, grid);
}

struct flash_seq {
    int pos0, n; /* first position of its new tokens, their count */
};

/* One launch of k_attn over sequences seqs (their caches hold pos0 + n keys), geometry (n_kv,
 * G, hd, vhd), cache dtype dt; key splits as attention_chunk plans them for n_sms SMs (0: none);
 * scalar: the element-wise K/V loader instead of the 16-byte one. Each query token j of a
 * sequence sees the keys up to its position pos0 + j (window-limited). */
static void run_flash_case(int n_kv, int G, int hd, int vhd, int dt, int window, float softcap,
                           const std::vector<flash_seq> &seqs, bool device_positions, int n_sms,
                           bool scalar = false) {
    const int n_seq = (int)seqs.size(), H = n_kv * G, esz = dt == KILN_DT_F32 ? 4 : 2;
    int T = 0;
    for (const auto &q : seqs) T += q.n;
    std::vector<float> q((size_t)T * H * hd), out((size_t)T * H * vhd, NAN);
    for (auto &x : q) x = rnd() * 2.0f;
    std::vector<std::vector<float>> Kf(n_seq), Vf(n_seq);
    std::vector<std::vector<uint8_t>> Kb(n_seq), Vb(n_seq);
    std::vector<int32_t> dpos(T);
    att_launch L;
    memset(&L, 0, sizeof L);
    int max_n = 0, keys = 0;
    for (int s = 0, t0 = 0; s < n_seq; t0 += seqs[s].n, s++) {
        const int kend = seqs[s].pos0 + seqs[s].n;
        Kf[s].resize((size_t)kend * n_kv * hd), Vf[s].resize((size_t)kend * n_kv * vhd);
        Kb[s].resize(Kf[s].size() * esz + 16), Vb[s].resize(Vf[s].size() * esz + 16);
        fill_cache(Kf[s], Kb[s].data(), dt, 1.5f);
        fill_cache(Vf[s], Vb[s].data(), dt, 1.0f);
        att_seq &d = L.s[s];
        d.k = Kb[s].data(), d.v = Vb[s].data(), d.n = seqs[s].n, d.t0 = t0;
        d.pos0 = device_positions ? -12345 : seqs[s].pos0; /* must not be read then */
        d.kbeg = window > 0 ? std::max(0, seqs[s].pos0 - window + 1) : 0;
        for (int j = 0; j < seqs[s].n; j++) dpos[t0 + j] = seqs[s].pos0 + j;
        keys = std::max(keys, kend - d.kbeg);
        max_n = std::max(max_n, seqs[s].n);
    }
    kcu_attn_args &a = L.a;
    a.q = q.data(), a.out = out.data(), a.kv_dtype = dt, a.n_kv_heads = n_kv;
    a.head_dim = hd, a.v_head_dim = vhd, a.window = window;
    a.p.n_heads = H, a.p.scale = 1.0f / sqrtf((float)hd), a.p.softcap = softcap;
    a.p.positions = device_positions ? dpos.data() : nullptr;
    L.group = G, L.n_seq = n_seq;
    if (device_positions && max_n == 1) keys = kcu_attn_keys_bucket(keys);
    L.rows_max = max_n * G;
    const int rpw = L.rows_max <= 2 * ATT_WARPS ? 1 : 4;
    const int tiles = (L.rows_max + ATT_WARPS * rpw - 1) / (ATT_WARPS * rpw);
    const int blocks = tiles * n_kv * n_seq;
    int splits = 1;
    if (n_sms > 0 && blocks < 2 * n_sms && keys > ATT_KT) {
        splits = (4 * n_sms + blocks - 1) / blocks;
        const int max_splits = keys > 1024 ? (keys + 127) / 128 : (keys + ATT_KT - 1) / ATT_KT;
        splits = std::min(splits, max_splits);
    }
    L.kps = ((keys + splits - 1) / splits + ATT_KT - 1) / ATT_KT * ATT_KT;
    L.splits = splits = (keys + L.kps - 1) / L.kps;
    const int vec_el = dt == KILN_DT_F32 ? 4 : 8;
    L.vec = !scalar && hd % vec_el == 0 && vhd % vec_el == 0;
    std::vector<float> part;
    if (splits > 1) {
        const size_t n_part = (size_t)n_seq * splits * n_kv * L.rows_max;
        part.assign(n_part * (vhd + 2), NAN);
        L.part_o = part.data(), L.part_ml = part.data() + n_part * vhd;
    }
    const emu_dim3 grid = {(unsigned)tiles, (unsigned)n_kv, (unsigned)(n_seq * splits)};
    if (rpw == 1)
        emu_flash_dpl<1>(L, grid);
    else
        emu_flash_dpl<4>(L, grid);
    if (splits > 1)
        emu_run(
            "k_attn_merge", {(unsigned)L.rows_max, (unsigned)n_kv, (unsigned)n_seq}, 0,
            [&] { k_attn_merge(L, splits); }, 128);
    /* reference in double */
    ref_err r;
    for (int s = 0, t0 = 0; s < n_seq; t0 += seqs[s].n, s++)
        for (int j = 0; j < seqs[s].n; j++) {
            const int p = seqs[s].pos0 + j, t = t0 + j;
            const int kbeg = window > 0 ? std::max(0, p - window + 1) : 0;
            for (int h = 0; h < H; h++)
                ref_check_row(r, &q[((size_t)t * H + h) * hd], a.p.scale, Kf[s], Vf[s], n_kv, h / G,
                              hd, vhd, kbeg, p + 1, softcap, &out[((size_t)t * H + h) * vhd]);
        }
    const double err = r.rel();
    const int bad = r.bad;
    const bool ok = bad == 0 && err <= 1e-5 && emu_misaligned == 0;
    cases++;
    failures += !ok;
    printf("%s k_attn kv=%d g=%d hd=%d/%d %s win=%d cap=%g seqs=%d tokens=%d rpw=%d splits=%d%s%s: "
           "rel err %.2e%s\n",
           ok ? "ok  " : "FAIL", n_kv, G, hd, vhd,
           dt == KILN_DT_F32   ? "f32"
           : dt == KILN_DT_F16 ? "f16"
                               : "bf16",
           window, softcap, n_seq, T, rpw, splits, device_positions ? " device positions" : "",
           L.vec ? "" : " scalar loads", err,
           bad              ? " (non-finite outputs)"
           : emu_misaligned ? " (misaligned loads)"
                            : "");
    emu_misaligned = 0;
}

int main() {
    run_case(8, 2, 128, 128, KILN_DT_F32, 0, 0.0f, {127}, false);       /* Qwen3-0.6B decode */
    run_case(8, 4, 128, 128, KILN_DT_BF16, 0, 0.0f, {0, 5, 200}, true); /* Llama-3-8B */
    run_case(2, 1, 64, 64, KILN_DT_F16, 0, 0.0f, {1, 63, 64, 65}, false);
    run_case(1, 3, 80, 80, KILN_DT_BF16, 0, 30.0f, {37, 300}, true);
    run_case(2, 5, 96, 64, KILN_DT_F32, 40, 0.0f, {10, 39, 40, 41, 500}, false);
    run_case(1, 8, 128, 128, KILN_DT_F16, 0, 50.0f, {511}, true);
    run_case(2, 2, 256, 256, KILN_DT_F32, 8, 0.0f, {3, 129}, false);
    run_case(1, 2, 256, 128, KILN_DT_BF16, 0, 0.0f, {700}, true);
    run_case(3, 1, 128, 256, KILN_DT_F16, 100, 0.0f, {99, 100, 101, 450}, false);
    /* groups split over blocks: Qwen3.5-4B (4 heads per KV head, 256), Gemma 4's global layers
     * (head dim 512), a group above 8 at 128 and an odd group at 256 */
    run_case(4, 4, 256, 256, KILN_DT_F32, 0, 0.0f, {127, 3}, true);
    run_case(2, 4, 512, 512, KILN_DT_BF16, 0, 30.0f, {200, 0, 70}, false);
    run_case(1, 3, 384, 512, KILN_DT_F16, 16, 0.0f, {40, 41}, true);
    run_case(1, 12, 128, 128, KILN_DT_F32, 0, 0.0f, {300}, false);
    run_case(2, 5, 256, 192, KILN_DT_BF16, 0, 0.0f, {64, 65}, true);
    /* long contexts split over grid z: Qwen3-0.6B- / Llama-3-8B-like groups at batch 1 on a 132-SM
     * GPU, a batch of two on a small one, a window, Gemma 4's head dim, a recorded step planned for
     * more keys than it has (splits past the last key), several groups a KV head */
    run_case(4, 2, 128, 128, KILN_DT_F32, 0, 0.0f, {1999}, false, 132);
    run_case(2, 4, 128, 128, KILN_DT_BF16, 0, 0.0f, {1800}, true, 132);
    run_case(2, 2, 64, 64, KILN_DT_F16, 0, 0.0f, {1500, 700}, false, 8);
    run_case(2, 3, 96, 96, KILN_DT_F32, 600, 20.0f, {1300, 599}, true, 16);
    run_case(1, 2, 512, 512, KILN_DT_BF16, 0, 0.0f, {900}, false, 32);
    run_case(4, 2, 128, 128, KILN_DT_F32, 0, 0.0f, {700, 20}, true, 132, 2048);
    run_case(2, 12, 128, 64, KILN_DT_BF16, 0, 0.0f, {1100}, true, 24);
    /* out's digits for the o projection (qg_link): Llama-3-8B at batch 1 unsplit and split (the
     * last split's block makes them), three sequences, a group split over blocks, each digit
     * order and mode */
    run_case(8, 4, 128, 128, KILN_DT_F32, 0, 0.0f, {100}, true, 132, 0, 1);
    run_case(8, 4, 128, 128, KILN_DT_F32, 0, 0.0f, {1500}, true, 132, 0, 3);
    run_case(2, 4, 128, 128, KILN_DT_BF16, 0, 0.0f, {40, 700, 5}, false, 16, 0, 2);
    run_case(1, 12, 128, 64, KILN_DT_F16, 0, 0.0f, {300, 2}, true, 0, 0, 1);
    run_case(2, 4, 256, 256, KILN_DT_F32, 0, 0.0f, {127, 900}, true, 24, 0, 0 + 2);
    /* k_attn: prefill chunks (4 rows a warp), continued chunks, several sequences, windows and
     * softcaps, every head-dim class, the scalar loader, decode split over keys and merged */
    run_flash_case(8, 2, 128, 128, KILN_DT_F32, 0, 0.0f, {{0, 40}}, false, 0);
    run_flash_case(2, 4, 128, 128, KILN_DT_BF16, 0, 0.0f, {{100, 17}}, true, 0);
    run_flash_case(1, 3, 80, 80, KILN_DT_F16, 30, 30.0f, {{50, 20}, {0, 3}}, false, 0);
    run_flash_case(2, 2, 64, 64, KILN_DT_F32, 0, 0.0f, {{300, 1}, {5, 1}, {700, 1}}, true, 16);
    run_flash_case(1, 2, 256, 128, KILN_DT_BF16, 0, 0.0f, {{0, 9}, {33, 3}}, false, 0, true);
    run_flash_case(1, 2, 512, 512, KILN_DT_F32, 0, 20.0f, {{400, 1}}, false, 8);
    run_flash_case(1, 2, 36, 36, KILN_DT_F16, 0, 0.0f, {{70, 6}}, true, 4);
    run_flash_case(2, 3, 96, 64, KILN_DT_F16, 64, 0.0f, {{200, 20}, {10, 5}}, false, 32);
    printf("%d cases: %s\n", cases, failures ? "FAILED" : "all passed");
    return failures != 0;
}
