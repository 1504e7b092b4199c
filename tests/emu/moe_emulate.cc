/* moe_emulate.cc — runs the MoE device-routing kernels (src/backend/cuda/moe_gather.cuh:
 * k_moe_route, k_moe_gather plain and with SwiGLU / GeGLU, k_moe_combine) on the CPU and compares
 * them with the CPU reference ops (kiln_cpu_moe_route_ref, kiln_cpu_matmul_gather_ref,
 * kiln_cpu_matmul_gather_glu_ref, kiln_cpu_moe_combine_ref). The header is compiled as C++ with
 * MOE_HOST_EMU; every CUDA thread of a block is a std::thread, __syncthreads a block barrier, a
 * warp shuffle an exchange between two barriers of the warp's 32 threads; blocks run one after
 * another (thread_blocks.h).
 *
 * Checked besides the values: outputs start as NaN (a row never written shows), weight and code
 * loads must be aligned to their size (a fault on the device), dynamic shared memory is exactly
 * moer_smem_bytes followed by a guard zone, an expert id outside the stack writes NaN rows.
 * Cases: route over 8..512 experts, top 1..10, ties, a NaN logit, renormalised or not, with and
 * without per-expert scales; gathered matmuls in bf16 / f16 / f32 and 2..8-bit codes (groups
 * 32/64/128, bf16 / f16 / f32 scales), widths that take one, two and a partial second piece per
 * lane, pairs reading x rows by x_div 1 and k; gate and up from two stacks (SiLU) and from one
 * stack of gate-then-up rows (GELU); every gather also in its grouped form (k_moe_group's
 * buckets checked: each pair once, under its expert; the output the same bits as the per-pair
 * kernel; the token tiles it lays out for the tensor-core expert GEMM, and that GEMM's scatter
 * kernels), with more pairs per expert than a warp carries at once; the weighted sum with and
 * without a shared expert. A
 * development check for machines without a GPU (no races, timing or fast-math effects); run by
 * tests/test_moe_emulate.sh (CTest). */
#include "cuda_shim.h"
#include "thread_blocks.h"

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
#include "backend/cpu/cpu_ops.h"
#include "util/half.h"
}

#define MOE_HOST_EMU    1
#define KCU_PDL_ENTER() /* nothing to wait for on the CPU */
static std::atomic<int> emu_misaligned{0};
#define MOE_SMEM(name) float *name = emu_smem
template <typename T> static T __ldg(const T *p) {
    if (((uintptr_t)p % sizeof(T)) != 0) emu_misaligned++;
    T r;
    memcpy(&r, (const void *)p, sizeof r);
    return r;
}
template <typename T> static T kcu_ld(const T *p) {
    return __ldg(p);
}
static uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, int sh) {
    return (uint32_t)((((uint64_t)hi << 32) | lo) >> (sh & 31));
}
static float kcu_tanh(float x) {
    return tanhf(x);
}
static float kcu_f16(uint16_t h) {
    return kiln_f16_to_f32(h);
}
static float kcu_load(const void *p, int64_t i, int dt) {
    if (dt == KILN_DT_F32) return __ldg((const float *)p + i);
    const uint16_t h = __ldg((const uint16_t *)p + i);
    return dt == KILN_DT_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
}
#include "backend/cuda/moe_gather.cuh"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd_u32() {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 32);
}
static float rnd() { /* uniform in [-1, 1) */
    return (float)((rnd_u32() >> 8) * (1.0 / 8388608.0)) - 1.0f;
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        if (!std::isfinite(a[i])) return INFINITY;
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(e / (s > 0 ? s : 1));
}

static void report(bool ok, const char *label) {
    cases++;
    if (!ok) failures++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", label);
}

/* ---- route ---- */

static void route_case(int E, int K, int T, bool norm, bool scaled, bool ties, bool with_nan) {
    std::vector<float> logits((size_t)T * E), scale(E);
    for (auto &l : logits) l = rnd() * 4.0f;
    if (ties) /* the best value repeated: the lower index must win */
        for (int t = 0; t < T; t++)
            for (int e = 0; e < E; e += 3) logits[(size_t)t * E + e] = 4.5f;
    if (with_nan) logits[1] = NAN;
    for (auto &s : scale) s = 0.5f + rnd() * 0.25f;
    std::vector<int32_t> ex((size_t)T * K, -7), ref_ex((size_t)T * K);
    std::vector<float> w((size_t)T * K, NAN), ref_w((size_t)T * K);
    kiln_cpu_moe_route_ref(ref_ex.data(), ref_w.data(), logits.data(), T, E, K, norm,
                           scaled ? scale.data() : nullptr);
    const moer_args A = {ex.data(), w.data(), logits.data(), scaled ? scale.data() : nullptr,
                         E,         K,        norm};
    emu_run(
        "k_moe_route", {(unsigned)T, 1, 1}, moer_smem_bytes(E), [&] { k_moe_route(A); },
        MOER_THREADS);
    bool same = ex == ref_ex;
    /* a NaN logit makes the softmax sum NaN on both sides: only the choice is compared */
    const double err = with_nan ? 0.0 : rel_l2(w.data(), ref_w.data(), w.size());
    char label[160];
    snprintf(label, sizeof label,
             "route E=%d k=%d T=%d norm=%d scale=%d ties=%d nan=%d: %s, "
             "weights rel %.2e",
             E, K, T, norm, scaled, ties, with_nan, same ? "same experts" : "DIFFERENT experts",
             err);
    report(same && err <= 1e-5, label);
}

/* ---- gather ---- */

static uint16_t to16(float x, int dt) {
    return dt == KILN_DT_BF16 ? kiln_f32_to_bf16(x) : kiln_f32_to_f16(x);
}

/* A random stack of R rows x cols: dense dtype dt (bits 0) or bits-bit codes of group `group` with
 * scales of sdt; its bytes live in the three vectors (16-byte aligned storage). */
struct emu_stack {
    kiln_matrix m;
    std::vector<uint32_t> words, sc, bi;
};
static void make_stack(emu_stack &st, int64_t R, int cols, int dt, int bits, int group, int sdt) {
    kiln_matrix &w = st.m;
    memset(&w, 0, sizeof w);
    w.rows = R, w.cols = cols;
    if (bits) {
        const int64_t wpr = (int64_t)cols * bits / 32, gpr = cols / group;
        st.words.resize((size_t)(R * wpr) + 4);
        for (auto &v : st.words) v = rnd_u32();
        const int ss = sdt == KILN_DT_F32 ? 4 : 2;
        st.sc.resize((size_t)(R * gpr * ss / 4) + 4), st.bi.resize(st.sc.size());
        for (int64_t g = 0; g < R * gpr; g++) {
            const float sv = 0.01f + 0.01f * (rnd() + 1.0f), bv = -0.1f + 0.05f * rnd();
            if (sdt == KILN_DT_F32) {
                ((float *)st.sc.data())[g] = sv, ((float *)st.bi.data())[g] = bv;
            } else {
                ((uint16_t *)st.sc.data())[g] = to16(sv, sdt);
                ((uint16_t *)st.bi.data())[g] = to16(bv, sdt);
            }
        }
        w.dtype = KILN_DT_U32, w.bits = bits, w.group_size = group;
        w.scale_dtype = (kiln_dtype)sdt, w.scales = st.sc.data(), w.biases = st.bi.data();
    } else {
        const int es = dt == KILN_DT_F32 ? 4 : 2;
        st.words.resize((size_t)(R * cols * es / 4) + 4);
        for (int64_t i = 0; i < R * cols; i++) {
            const float v = rnd() * 0.5f;
            if (dt == KILN_DT_F32)
                ((float *)st.words.data())[i] = v;
            else
                ((uint16_t *)st.words.data())[i] = to16(v, dt);
        }
        w.dtype = (kiln_dtype)dt;
    }
    w.data = st.words.data();
}

/* k_moe_gather<F>(A) for the stack's format */
static void gather_kernel(const moeg_args &A, int dt, int bits) {
    switch (bits ? 100 + bits : dt) {
    case KILN_DT_F32:
        k_moe_gather<KILN_DT_F32>(A);
        break;
    case KILN_DT_F16:
        k_moe_gather<KILN_DT_F16>(A);
        break;
    case KILN_DT_BF16:
        k_moe_gather<KILN_DT_BF16>(A);
        break;
    case 102:
        k_moe_gather<102>(A);
        break;
    case 103:
        k_moe_gather<103>(A);
        break;
    case 104:
        k_moe_gather<104>(A);
        break;
    case 105:
        k_moe_gather<105>(A);
        break;
    case 106:
        k_moe_gather<106>(A);
        break;
    case 107:
        k_moe_gather<107>(A);
        break;
    case 108:
        k_moe_gather<108>(A);
        break;
    }
}

/* k_moe_gather_grouped<F>(A, offsets, list) for the stack's format */
static void gather_grouped_kernel(const moeg_args &A, int dt, int bits, const int32_t *off,
                                  const int32_t *list) {
    switch (bits ? 100 + bits : dt) {
    case KILN_DT_F32:
        k_moe_gather_grouped<KILN_DT_F32>(A, off, list);
        break;
    case KILN_DT_F16:
        k_moe_gather_grouped<KILN_DT_F16>(A, off, list);
        break;
    case KILN_DT_BF16:
        k_moe_gather_grouped<KILN_DT_BF16>(A, off, list);
        break;
    case 102:
        k_moe_gather_grouped<102>(A, off, list);
        break;
    case 103:
        k_moe_gather_grouped<103>(A, off, list);
        break;
    case 104:
        k_moe_gather_grouped<104>(A, off, list);
        break;
    case 105:
        k_moe_gather_grouped<105>(A, off, list);
        break;
    case 106:
        k_moe_gather_grouped<106>(A, off, list);
        break;
    case 107:
        k_moe_gather_grouped<107>(A, off, list);
        break;
    case 108:
        k_moe_gather_grouped<108>(A, off, list);
        break;
    }
}

/* The token tiles k_moe_group lays out for the tensor-core expert GEMM: each expert's bucket in
 * order, tile_tokens pairs a tile (the last partial), then {-1, ...} up to max_tiles. */
static bool tiles_ok(const std::vector<int32_t> &tiles, const std::vector<int32_t> &off, int E,
                     int bn) {
    size_t j = 0;
    for (int e = 0; e < E; e++)
        for (int t0 = off[e]; t0 < off[e + 1]; t0 += bn, j++)
            if (4 * j + 3 >= tiles.size() || tiles[4 * j] != e || tiles[4 * j + 1] != t0 ||
                tiles[4 * j + 2] != off[e + 1] || tiles[4 * j + 3] != 0)
                return false;
    for (; 4 * j < tiles.size(); j++)
        if (tiles[4 * j] != -1) return false;
    return true;
}

/* k_moe_scatter_glu / k_moe_scatter_bad after the expert GEMM: rows of sorted pairs (gate and
 * up made up here) into pair order as act(gate) * up, NaN for pairs of bucket E. */
static bool scatter_ok(const std::vector<int32_t> &off, const std::vector<int32_t> &list, int n,
                       int E, int act) {
    const int rows = 300; /* two blocks of rows, the second partial */
    std::vector<float> g((size_t)n * rows), u((size_t)n * rows), y((size_t)n * rows, 1.0f);
    for (auto &v : g) v = 4 * rnd();
    for (auto &v : u) v = rnd();
    moes_args S = {y.data(), g.data(), u.data(), off.data(), list.data(), rows, n, E, act};
    const emu_dim3 grid = {(rows + MOES_THREADS - 1) / MOES_THREADS, (unsigned)(n < 7 ? n : 7), 1};
    emu_run(
        "k_moe_scatter_glu", grid, 0, [&] { k_moe_scatter_glu(S); }, MOES_THREADS);
    bool ok = true;
    for (int s = 0; s < n; s++)
        for (int r = 0; r < rows; r++) {
            const float v = y[(size_t)list[s] * rows + r];
            if (s >= off[E]) {
                ok = ok && std::isnan(v);
                continue;
            }
            const float a = g[(size_t)s * rows + r];
            const float ref =
                (act == KILN_GLU_SILU
                     ? a / (1.0f + expf(-a))
                     : 0.5f * a * (1.0f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a)))) *
                u[(size_t)s * rows + r];
            ok = ok && fabsf(v - ref) <= 1e-5f * (1.0f + fabsf(ref));
        }
    std::fill(y.begin(), y.end(), 1.0f);
    emu_run(
        "k_moe_scatter_bad", {grid.x, 1, 1}, 0, [&] { k_moe_scatter_bad(S); }, MOES_THREADS);
    for (int s = 0; s < n; s++)
        for (int r = 0; r < rows; r++) {
            const float v = y[(size_t)list[s] * rows + r];
            ok = ok && (s >= off[E] ? std::isnan(v) : v == 1.0f);
        }
    return ok;
}

/* The grouped form of the launch in A (k_moe_group, then k_moe_gather_grouped) into A.y: the
 * buckets must hold every pair once, under its expert (ids outside the stack in bucket E), and
 * the token tiles (of a size from the case) follow the buckets; the scatter kernels of the
 * expert GEMM read them. */
static bool run_grouped(const moeg_args &A, int n, int dt, int bits) {
    const int E = A.n_experts, bn = 1 << (n % 4 + 1), max_tiles = (n + bn - 1) / bn + E;
    std::vector<int32_t> off(E + 2, -1), list(n, -1), tiles((size_t)max_tiles * 4, 7);
    const moeg_group_args G = {A.experts, off.data(),   list.data(), n,
                               E,         tiles.data(), bn,          max_tiles};
    emu_run(
        "k_moe_group", {1, 1, 1}, moeg_group_smem_bytes(E), [&] { k_moe_group(G); },
        MOEG_GROUP_THREADS);
    bool ok = off[0] == 0 && off[E + 1] == n && tiles_ok(tiles, off, E, bn);
    std::vector<int> seen(n, 0);
    for (int e = 0; ok && e <= E; e++)
        for (int p = off[e]; ok && p < off[e + 1]; p++) {
            const int i = list[p];
            ok = i >= 0 && i < n && !seen[i]++;
            if (ok) {
                const int ei = A.experts[i];
                ok = e == E ? (ei < 0 || ei >= E) : ei == e;
            }
        }
    const emu_dim3 grid = {(unsigned)((A.rows + MOEG_WARPS - 1) / MOEG_WARPS), (unsigned)(E + 1),
                           1};
    emu_run(
        "k_moe_gather_grouped", grid, 0,
        [&] { gather_grouped_kernel(A, dt, bits, off.data(), list.data()); }, MOEG_WARPS * 32);
    return ok && scatter_ok(off, list, n, E, A.act);
}

/* n pairs over E experts of `rows` x `cols`: glu 0 the plain gather; 1 SwiGLU over two stacks
 * (Qwen); 2 GeGLU over one stack holding gate then up rows per expert (Gemma's gate_up). */
static void gather_case(int E, int rows, int cols, int n, int x_div, int dt, int bits, int group,
                        int sdt, int glu = 0) {
    const int64_t stride = glu == 2 ? 2 * rows : rows, up_off = glu == 2 ? rows : 0;
    emu_stack gs, us;
    make_stack(gs, E * stride, cols, dt, bits, group, sdt);
    if (glu == 1) make_stack(us, E * stride, cols, dt, bits, group, sdt);
    const kiln_matrix *g = &gs.m, *u = glu == 1 ? &us.m : g;
    const int nx = (n + x_div - 1) / x_div;
    std::vector<float> x((size_t)nx * cols);
    for (auto &v : x) v = rnd();
    std::vector<int32_t> experts(n);
    for (int i = 0; i < n; i++) experts[i] = (int32_t)(rnd_u32() % (uint32_t)E);
    experts[0] = E - 1; /* the last slice is read */
    std::vector<float> y((size_t)n * rows, NAN), ref((size_t)n * rows);
    const int act = glu == 2 ? KILN_GLU_GELU_TANH : KILN_GLU_SILU;
    if (glu)
        kiln_cpu_matmul_gather_glu_ref(ref.data(), x.data(), x_div, n, experts.data(), g, u, rows,
                                       stride, up_off, act);
    else
        kiln_cpu_matmul_gather_ref(ref.data(), x.data(), x_div, n, experts.data(), g, rows);
    moeg_args A;
    memset(&A, 0, sizeof A);
    A.y = y.data(), A.x = x.data(), A.experts = experts.data(), A.rows = rows, A.cols = cols;
    A.x_div = x_div, A.stride = stride, A.n_experts = E, A.sdt = sdt, A.group = group;
    A.glu = glu != 0, A.act = act;
    A.m[0] = {g->data, g->scales, g->biases, nullptr, 0};
    A.m[1] = {u->data, u->scales, u->biases, nullptr, up_off};
    const emu_dim3 grid = {(unsigned)((rows + MOEG_WARPS - 1) / MOEG_WARPS), (unsigned)n, 1};
    const int before = emu_misaligned.load();
    emu_run(
        "k_moe_gather", grid, 0, [&] { gather_kernel(A, dt, bits); }, MOEG_WARPS * 32);
    /* the grouped form: the same bits */
    std::vector<float> yg((size_t)n * rows, NAN);
    moeg_args Ag = A;
    Ag.y = yg.data();
    const bool buckets = run_grouped(Ag, n, dt, bits);
    const bool same = memcmp(y.data(), yg.data(), y.size() * sizeof(float)) == 0;
    const int misaligned = emu_misaligned.load() - before;
    const double err = rel_l2(y.data(), ref.data(), y.size());
    const char *kind = glu == 1 ? " swiglu" : glu == 2 ? " geglu (one stack)" : "";
    char label[260];
    snprintf(label, sizeof label,
             "gather%s E=%d %dx%d n=%d x_div=%d %s bits=%d group=%d scales=%s: rel %.2e, grouped "
             "%s%s%s",
             kind, E, rows, cols, n, x_div, bits ? "codes" : kiln_dtype_name((kiln_dtype)dt), bits,
             group, bits ? kiln_dtype_name((kiln_dtype)sdt) : "-", err,
             same ? "same bits" : "DIFFERENT", buckets ? "" : " BAD BUCKETS",
             misaligned ? " MISALIGNED loads" : "");
    report(err <= 1e-5 && misaligned == 0 && same && buckets, label);
}

/* An expert id outside the stack: that pair's rows come out NaN, the others right. */
static void gather_bad_expert(void) {
    const int E = 2, rows = 8, cols = 64, n = 2;
    std::vector<uint16_t> wd((size_t)E * rows * cols + 8);
    for (auto &v : wd) v = kiln_f32_to_bf16(rnd());
    std::vector<float> x((size_t)n * cols), y((size_t)n * rows, 0.0f);
    for (auto &v : x) v = rnd();
    const int32_t experts[2] = {1, E};
    moeg_args A;
    memset(&A, 0, sizeof A);
    A.y = y.data(), A.x = x.data(), A.experts = experts, A.rows = rows, A.cols = cols;
    A.x_div = 1, A.stride = rows, A.n_experts = E;
    A.m[0] = {wd.data(), nullptr, nullptr, nullptr, 0};
    emu_run(
        "k_moe_gather", {(unsigned)(rows / MOEG_WARPS), (unsigned)n, 1}, 0,
        [&] { k_moe_gather<KILN_DT_BF16>(A); }, MOEG_WARPS * 32);
    bool ok = true;
    for (int r = 0; r < rows; r++) ok &= std::isfinite(y[r]) && std::isnan(y[rows + r]);
    report(ok, "gather with an expert id past the stack writes NaN rows");
    std::vector<float> yg((size_t)n * rows, 0.0f);
    A.y = yg.data();
    ok = run_grouped(A, n, KILN_DT_BF16, 0);
    for (int r = 0; r < rows; r++) ok &= yg[r] == y[r] && std::isnan(yg[rows + r]);
    report(ok, "grouped gather with an expert id past the stack writes NaN rows");
}

/* ---- combine ---- */

static void combine_case(int T, int K, int H, bool shared, bool logit) {
    std::vector<float> ye((size_t)T * K * H), w((size_t)T * K), sh((size_t)T * H), sl(T);
    for (auto &v : ye) v = rnd();
    for (auto &v : w) v = rnd() * 0.5f + 0.5f;
    for (auto &v : sh) v = rnd();
    for (auto &v : sl) v = rnd() * 3.0f;
    std::vector<float> y((size_t)T * H, NAN), ref((size_t)T * H);
    const float *shp = shared ? sh.data() : nullptr, *slp = logit ? sl.data() : nullptr;
    kiln_cpu_moe_combine_ref(ref.data(), ye.data(), w.data(), T, K, H, shp, slp);
    const moec_args A = {y.data(), ye.data(), w.data(), shp, slp, H, K};
    emu_run(
        "k_moe_combine", {(unsigned)((H + MOEC_THREADS - 1) / MOEC_THREADS), (unsigned)T, 1}, 0,
        [&] { k_moe_combine(A); }, MOEC_THREADS);
    const double err = rel_l2(y.data(), ref.data(), y.size());
    char label[160];
    snprintf(label, sizeof label, "combine T=%d k=%d H=%d shared=%d gate=%d: rel %.2e", T, K, H,
             shared, logit, err);
    report(err <= 1e-6, label);
}

int main() {
    route_case(8, 2, 3, false, false, false, false);
    route_case(8, 2, 2, true, false, true, false);
    route_case(128, 8, 3, true, false, false, false);
    route_case(128, 8, 2, true, true, true, false);
    route_case(512, 10, 2, true, false, false, false);
    route_case(300, 1, 2, false, true, false, false);
    route_case(64, 4, 1, false, false, false, true);

    gather_case(3, 5, 64, 6, 2, KILN_DT_BF16, 0, 0, 0);
    gather_case(4, 9, 768, 8, 8, KILN_DT_BF16, 0, 0, 0);
    gather_case(3, 6, 520, 5, 1, KILN_DT_F16, 0, 0, 0);
    gather_case(2, 7, 264, 4, 2, KILN_DT_F32, 0, 0, 0);
    for (int bits = 2; bits <= 8; bits++)
        gather_case(3, 6, 256, 6, 2, 0, bits, bits % 2 ? 32 : 64, KILN_DT_BF16);
    gather_case(4, 5, 2048, 4, 2, 0, 4, 64, KILN_DT_BF16);
    gather_case(4, 5, 1536, 4, 4, 0, 8, 128, KILN_DT_F16);
    gather_case(3, 4, 1536, 3, 1, 0, 3, 32, KILN_DT_F32);
    gather_case(2, 3, 64, 2, 1, 0, 6, 32, KILN_DT_BF16);
    gather_case(4, 9, 768, 8, 8, KILN_DT_BF16, 0, 0, 0, 1);
    gather_case(3, 6, 520, 6, 2, KILN_DT_F16, 0, 0, 0, 2);
    gather_case(4, 5, 2048, 8, 8, 0, 4, 64, KILN_DT_BF16, 1);
    gather_case(3, 7, 1536, 4, 2, 0, 8, 32, KILN_DT_F16, 2);
    gather_case(3, 6, 256, 6, 2, 0, 3, 32, KILN_DT_F32, 1);
    gather_case(3, 5, 512, 40, 4, KILN_DT_BF16, 0, 0, 0, 1); /* > MOEG_NP pairs per expert */
    gather_case(2, 4, 256, 30, 3, 0, 4, 32, KILN_DT_BF16, 0);
    gather_bad_expert();

    combine_case(1, 8, 300, false, false);
    combine_case(3, 2, 512, true, true);
    combine_case(2, 4, 100, true, false);

    printf("%d cases, %d failed\n", cases, failures);
    return failures ? 1 : 0;
}
