/* tc_gemm_emulate.cc — runs the tensor-core GEMM (src/backend/cuda/gemm_tc.cu: k_tc_prep,
 * k_tc_gemm at every block shape, k_tc_reduce) on the CPU: the kernel source is compiled as C++
 * with TC_HOST_EMU, every CUDA thread of a block is a std::thread, __syncthreads is a barrier, and
 * mma.sync m16n8k16 (f16 and bf16 inputs, f32 accumulators) is a warp-collective modelled from
 * the PTX ISA's fragment description (A 16x16 row major: a0..a7 at rows g / g+8, cols 2t+{0,1}
 * / 2t+8+{0,1}; B 16x8: b0..b3 at k 2t+{0,1} / 2t+8+{0,1}, col g; C 16x8: rows g / g+8, cols
 * 2t+{0,1}), independently of the kernel's own k ordering. cp.async copies are deferred to the
 * thread's cp.async.wait_group (the latest moment the ISA allows them to land) or, in the second
 * pass, done at issue (the earliest); shared memory and outputs are poisoned with NaN first.
 * The second pass also sums split-K in the kernel (tc_reduce_last: the last split of a tile to
 * arrive, by an arrival counter that must be zero again after the launch) instead of
 * k_tc_reduce.
 * f16x2 arithmetic and prmt are modelled bit for bit; shuffles are warp-collective. The host plan
 * (block shape, split-K, scratch layout) is the backend's own (tc_plan_make / tc_plan_args).
 *
 * Checks, against a double-precision reference on the same stored weights (w = scale*q + bias
 * from the decoded scale/bias dtype; bf16 as stored): 4- and 8-bit codes with group 32/64/128
 * and f16/bf16/f32 scales, dense bf16, rows / cols / tokens that are not tile multiples (cols
 * % 64 = 32 with group 32, bf16 cols % 64 = 8), every block shape (8/16/64/128 tokens), forced
 * and automatic split-K, several matrices in one launch, output bias, the fused RMSNorm and
 * residual add, and x with a zero token and tokens scaled by 1e4 / 1e-4; expert mode (the
 * grouped MoE GEMM: pairs sorted by expert, token tiles per expert, x rows gathered, y in sorted
 * order or scattered back). Relative L2 error per
 * matrix (quantized <= 2e-6, bf16 <= 3e-5; the split keeps x to ~2^-22 / 2^-17), every output
 * finite.
 *
 * A development check for machines without a GPU (no races, timing or real hardware); run by
 * tests/test_tc_gemm_emulate.sh (CTest), or by hand from the repository root:
 *   g++ -std=c++20 -O2 -pthread -Isrc -DTC_HOST_EMU tests/emu/tc_gemm_emulate.cc -o /tmp/tce
 *   /tmp/tce */
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
#include "backend/matrix.h"
}

/* ---- CUDA shims ---- */
#include "cuda_shim.h"
static inline void kcu_pdl_wait() {}
static inline void kcu_pdl_trigger() {}
static inline void __threadfence() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
}
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
    return std::atomic_ref<unsigned>(*p).fetch_add(v);
}
static inline float __ldcg(const float *p) {
    return *p;
}
static inline float rsqrtf(float x) {
    return 1.0f / sqrtf(x);
}
uint4 tc_sm_raw[(232 << 10) / 16]; /* "shared memory" of the running block */

static std::barrier<> *g_block_bar;
static std::barrier<> *g_warp_bar[8];
static void __syncthreads() {
    g_block_bar->arrive_and_wait();
}

static float xf[8][32];
static float __shfl_xor_sync(unsigned, float v, int m) {
    const int w = t_warp, l = t_lane;
    xf[w][l] = v;
    g_warp_bar[w]->arrive_and_wait();
    const float r = xf[w][l ^ m];
    g_warp_bar[w]->arrive_and_wait();
    return r;
}

static float f16_to_f(uint16_t h) {
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}
static uint16_t f_to_f16(double f) {
    _Float16 x = (_Float16)f; /* round to nearest even */
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}
static float bf16_to_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t f_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: every lane hands in its fragments, the warp
 * meets, each lane computes its 4 outputs from the whole A and B */
static uint32_t xa[8][32][4], xb[8][32][2];
template <bool F16>
static void tc_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const int w = t_warp, l = t_lane;
    memcpy(xa[w][l], a, 16);
    xb[w][l][0] = b0, xb[w][l][1] = b1;
    g_warp_bar[w]->arrive_and_wait();
    auto dec = [](uint32_t r, int half) {
        const uint16_t h = (uint16_t)(half ? r >> 16 : r & 0xffff);
        return F16 ? f16_to_f(h) : bf16_to_f(h);
    };
    float A[16][16], B[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const int gid = lane >> 2, tig = lane & 3;
        for (int i = 0; i < 8; i++) { /* a_i: reg i/2, half i%2 */
            const int row = gid + ((i / 2) % 2) * 8, col = 2 * tig + (i % 2) + (i / 4) * 8;
            A[row][col] = dec(xa[w][lane][i / 2], i % 2);
        }
        for (int i = 0; i < 4; i++) { /* b_i: reg i/2, half i%2 */
            const int k = 2 * tig + (i % 2) + (i / 2) * 8;
            B[k][gid] = dec(xb[w][lane][i / 2], i % 2);
        }
    }
    for (int i = 0; i < 4; i++) {
        const int row = (l >> 2) + (i / 2) * 8, col = 2 * (l & 3) + (i % 2);
        double s = 0; /* products are exact in f32; the sum in double */
        for (int k = 0; k < 16; k++) s += (double)A[row][k] * B[k][col];
        d[i] = (float)((double)d[i] + s);
    }
    g_warp_bar[w]->arrive_and_wait();
}

/* mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 (the int8 variant; ZERO: C = 0): A 16x32 u8 from
 * a0 (row g, k 4t..4t+3, byte i = k 4t+i), a1 (row g+8), a2 / a3 (k 16+4t..); B 32x8 s8 from b0 (k
 * 4t.., column g), b1 (k 16+4t..); D as above, summed exactly in integers */
static uint32_t xi[8][32][6];
template <bool ZERO>
static void tc_mma_i8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if (ZERO) d[0] = d[1] = d[2] = d[3] = 0; /* C = 0: what d held before is not read */
    const int w = t_warp, l = t_lane;
    memcpy(xi[w][l], a, 16);
    xi[w][l][4] = b0, xi[w][l][5] = b1;
    g_warp_bar[w]->arrive_and_wait();
    int A[16][32], B[32][8];
    for (int lane = 0; lane < 32; lane++) {
        const int gid = lane >> 2, tig = lane & 3;
        for (int r = 0; r < 4; r++)
            for (int i = 0; i < 4; i++) {
                const int row = gid + (r & 1) * 8, k = 4 * tig + i + (r >> 1) * 16;
                A[row][k] = (int)(uint8_t)(xi[w][lane][r] >> (8 * i));
            }
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < 4; i++)
                B[4 * tig + i + 16 * r][gid] =
                    (int)(int8_t)(uint8_t)(xi[w][lane][4 + r] >> (8 * i));
    }
    for (int i = 0; i < 4; i++) {
        const int row = (l >> 2) + (i / 2) * 8, col = 2 * (l & 3) + (i % 2);
        int s = 0;
        for (int k = 0; k < 32; k++) s += A[row][k] * B[k][col];
        d[i] += s;
    }
    g_warp_bar[w]->arrive_and_wait();
}

/* cp.async: deferred to wait_group (g_cp_early = false) or done at issue */
static bool g_cp_early = false;
struct cp_op {
    void *dst;
    const void *src;
    int bytes;
};
thread_local std::vector<std::vector<cp_op>> t_groups; /* committed, oldest first */
thread_local std::vector<cp_op> t_open;
static void cp_do(const cp_op &o) {
    if (o.bytes == 16)
        memcpy(o.dst, o.src, 16);
    else
        memset(o.dst, 0, 16);
}
static void tc_cp16(void *smem, const void *gmem, int src_bytes) {
    if (g_cp_early)
        cp_do({smem, gmem, src_bytes});
    else
        t_open.push_back({smem, gmem, src_bytes});
}
static void tc_cp_commit() {
    t_groups.push_back(t_open);
    t_open.clear();
}
template <int N> static void tc_cp_wait() {
    while (t_groups.size() > (size_t)N) {
        for (auto &o : t_groups.front()) cp_do(o);
        t_groups.erase(t_groups.begin());
    }
}

/* prmt (default mode): result byte i = byte sel_i of {b, a} (0..3 from a, 4..7 from b) */
static uint32_t tc_prmt(uint32_t a, uint32_t b, uint32_t sel) {
    const uint64_t v = (uint64_t)b << 32 | a;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)((v >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
static uint32_t f16x2(uint32_t a, uint32_t b, uint32_t c, int op) {
    uint32_t r = 0;
    for (int i = 0; i < 2; i++) {
        const double x = f16_to_f((uint16_t)(a >> 16 * i)), y = f16_to_f((uint16_t)(b >> 16 * i));
        const double z = op ? f16_to_f((uint16_t)(c >> 16 * i)) : 0.0;
        r |= (uint32_t)f_to_f16(op ? x * y + z : x - y) << 16 * i; /* one rounding */
    }
    return r;
}
static uint32_t tc_hsub2(uint32_t a, uint32_t b) {
    return f16x2(a, b, 0, 0);
}
static uint32_t tc_hfma2(uint32_t a, uint32_t b, uint32_t c) {
    return f16x2(a, b, c, 1);
}
static uint32_t tc_f2h2(float v) {
    const uint32_t h = f_to_f16(v);
    return h | h << 16;
}
template <bool F16> static void tc_split16(float v, uint16_t *hi, uint16_t *lo) {
    if (F16) {
        *hi = f_to_f16(v);
        *lo = f_to_f16(v - f16_to_f(*hi));
    } else {
        *hi = f_to_bf16(v);
        *lo = f_to_bf16(v - bf16_to_f(*hi));
    }
}
static inline float kcu_f16(uint16_t h) {
    return f16_to_f(h);
}
static inline float kcu_bf16(uint16_t h) {
    return bf16_to_f(h);
}
static inline int __ffs(int v) {
    return __builtin_ffs(v);
}
static float tc_load_scale(const void *p, int64_t i, int dt) {
    if (dt == KILN_DT_F32) return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    return dt == KILN_DT_BF16 ? bf16_to_f(h) : f16_to_f(h);
}

template <typename T> static inline T kcu_ld(const T *p) {
    return *p;
}
#include "backend/cuda/gemm_tc.cu"

/* ---- driver ---- */

/* Runs fn as every thread of every block of grid (threads per block: nt). */
template <typename F> static void run_grid(emu_dim3 grid, int nt, F fn) {
    gridDim = grid;
    blockDim = {(unsigned)nt, 1, 1};
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                memset(tc_sm_raw, 0xff, sizeof tc_sm_raw); /* NaN as f16 / bf16 / f32 */
                std::barrier<> bb(nt);
                std::vector<std::barrier<> *> wb;
                for (int w = 0; w < nt / 32; w++) wb.push_back(new std::barrier<>(32));
                g_block_bar = &bb;
                for (int w = 0; w < nt / 32; w++) g_warp_bar[w] = wb[w];
                std::vector<std::thread> th;
                for (int t = 0; t < nt; t++)
                    th.emplace_back([&, t] {
                        threadIdx = {(unsigned)t, 0, 0};
                        blockIdx = {x, y, z};
                        t_warp = t >> 5, t_lane = t & 31;
                        t_groups.clear(), t_open.clear();
                        fn();
                    });
                for (auto &t : th) t.join();
                for (auto *b : wb) delete b;
            }
}

static bool g_one = false, g_dq = false; /* fast mode's one-product kernels (W dequantized) */
static bool g_two = false;               /* exact mode's 64-token kernels capped for 2 a SM */
template <int MODE, int SS, int BN> static void run_gemm(const tc_args &A, emu_dim3 grid) {
    using C = tc_cfg<BN>;
    constexpr int S = tc_stages<MODE, BN>();
    if constexpr (MODE != TC_BF16 && BN == 64)
        if (g_two) {
            run_grid(grid, TC_THREADS, [&] {
                k_tc_gemm<MODE, SS, BN, C::WM, C::WN, S, true, false, false, true>(A);
            });
            return;
        }
    if constexpr (MODE != TC_BF16)
        if (g_one && g_dq) {
            run_grid(grid, TC_THREADS,
                     [&] { k_tc_gemm<MODE, SS, BN, C::WM, C::WN, S, true, true, true>(A); });
            return;
        }
    if (g_one)
        run_grid(grid, TC_THREADS,
                 [&] { k_tc_gemm<MODE, SS, BN, C::WM, C::WN, S, true, true>(A); });
    else
        run_grid(grid, TC_THREADS, [&] { k_tc_gemm<MODE, SS, BN, C::WM, C::WN, S>(A); });
}
template <int MODE, int SS> static void run_gemm_bn(const tc_args &A, emu_dim3 grid, int bn) {
    if (bn == 8)
        run_gemm<MODE, SS, 8>(A, grid);
    else if (bn == 16)
        run_gemm<MODE, SS, 16>(A, grid);
    else if (bn == 64)
        run_gemm<MODE, SS, 64>(A, grid);
    else
        run_gemm<MODE, SS, 128>(A, grid);
}

template <int MODE, int SS, int DIG, int BN>
static void run_gemm_i8(const tc_args &A, emu_dim3 grid) {
    using C = tc_cfg<BN>;
    run_grid(grid, TC_THREADS,
             [&] { k_tc_gemm_i8<MODE, SS, DIG, BN, C::WM, C::WN, C::STAGES>(A); });
}
template <int MODE, int SS, int DIG>
static void run_gemm_i8_bn(const tc_args &A, emu_dim3 grid, int bn) {
    if (bn == 8)
        run_gemm_i8<MODE, SS, DIG, 8>(A, grid);
    else if (bn == 16)
        run_gemm_i8<MODE, SS, DIG, 16>(A, grid);
    else if (bn == 64 || DIG == 3)
        run_gemm_i8<MODE, SS, DIG, 64>(A, grid);
    else
        run_gemm_i8<MODE, SS, DIG == 3 ? 1 : DIG, 128>(A, grid);
}
template <int MODE, int SS>
static void run_gemm_i8_dig(const tc_args &A, emu_dim3 grid, int bn, int dig) {
    if (dig == 3)
        run_gemm_i8_bn<MODE, SS, 3>(A, grid, bn);
    else
        run_gemm_i8_bn<MODE, SS, 1>(A, grid, bn);
}

static uint64_t rng = 0x7c0ffee5;
static uint64_t rnd_u64() {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static float rnd_uniform(float a, float b) {
    return a + (b - a) * (float)(rnd_u64() >> 40) / (float)(1ull << 24);
}
static float rnd_normal() {
    float s = 0;
    for (int i = 0; i < 4; i++) s += rnd_uniform(0.0f, 1.0f);
    return (s - 2.0f) * 1.7f;
}

struct host_matrix {
    kiln_matrix m;
    std::vector<uint32_t> codes;
    std::vector<uint16_t> dense, s16, b16;
    std::vector<float> s32, b32, obias;
    double at(int64_t r, int64_t c) const {
        if (!kiln_matrix_is_quantized(&m)) return bf16_to_f(dense[r * m.cols + c]);
        const int64_t bit = c * m.bits, wpr = m.cols * m.bits / 32;
        const uint32_t q = (codes[r * wpr + bit / 32] >> (bit % 32)) & ((1u << m.bits) - 1);
        const int64_t gi = r * (m.cols / m.group_size) + c / m.group_size;
        return (double)tc_load_scale(m.scales, gi, m.scale_dtype) * q +
               tc_load_scale(m.biases, gi, m.scale_dtype);
    }
    /* the part of W the MMAs multiply: scale q (the bias goes with x's f32 group sums) */
    double mma_part(int64_t r, int64_t c) const {
        if (!kiln_matrix_is_quantized(&m)) return at(r, c);
        const int64_t gi = r * (m.cols / m.group_size) + c / m.group_size;
        return at(r, c) - tc_load_scale(m.biases, gi, m.scale_dtype);
    }
};

static void make_matrix(host_matrix &h, int bits, int group, kiln_dtype sdt, int rows, int cols,
                        bool with_bias) {
    memset(&h.m, 0, sizeof h.m);
    h.m.rows = rows, h.m.cols = cols;
    if (bits == 16) {
        h.dense.resize((size_t)rows * cols);
        for (auto &v : h.dense) v = f_to_bf16(0.05f * rnd_normal());
        h.m.dtype = KILN_DT_BF16;
        h.m.data = h.dense.data();
    } else {
        h.codes.resize((size_t)rows * cols * bits / 32);
        for (auto &v : h.codes) v = (uint32_t)rnd_u64();
        const size_t ng = (size_t)rows * (cols / group);
        h.s16.resize(ng), h.b16.resize(ng), h.s32.resize(ng), h.b32.resize(ng);
        for (size_t g = 0; g < ng; g++) {
            const float s = rnd_uniform(0.005f, 0.02f);
            const float b = -s * (float)(1 << (bits - 1)) * rnd_uniform(0.8f, 1.2f);
            h.s32[g] = s, h.b32[g] = b;
            h.s16[g] = sdt == KILN_DT_BF16 ? f_to_bf16(s) : f_to_f16(s);
            h.b16[g] = sdt == KILN_DT_BF16 ? f_to_bf16(b) : f_to_f16(b);
        }
        h.m.dtype = KILN_DT_U32;
        h.m.data = h.codes.data();
        h.m.bits = bits, h.m.group_size = group, h.m.scale_dtype = sdt;
        h.m.scales = sdt == KILN_DT_F32 ? (const void *)h.s32.data() : h.s16.data();
        h.m.biases = sdt == KILN_DT_F32 ? (const void *)h.b32.data() : h.b16.data();
    }
    if (with_bias) {
        h.obias.resize(rows);
        for (auto &v : h.obias) v = 0.5f * rnd_normal();
        h.m.bias = h.obias.data();
    }
}

static int failures = 0, cases = 0;

struct spec {
    int bits, group;
    kiln_dtype sdt;
    std::vector<int> rows;
    int cols, n;
    int bn, splits, n_sms; /* 0: by the plan */
    bool norm, add, bias;
    int dig; /* the int8 variant's digits of x (1: fast mode, 3: exact), 0: the f16 kernels */
    bool one = false; /* the f16 kernels in fast mode: the hi product only */
    bool dq = false;  /* ... with W dequantized in registers (codes only) */
    bool two = false; /* exact mode's TWO kernels (codes, 64-token blocks) */
};

static void check(const spec &c) {
    const int count = (int)c.rows.size();
    std::vector<host_matrix> hm(count);
    std::vector<const kiln_matrix *> ws(count);
    for (int i = 0; i < count; i++) {
        make_matrix(hm[i], c.bits, c.group, c.sdt, c.rows[i], c.cols, c.bias && i == 0);
        ws[i] = &hm[i].m;
    }
    /* x: normal; token 0 zero, token 1 scaled 1e4, token 2 1e-4, a zero 32-column block */
    std::vector<float> x((size_t)c.n * c.cols), nw(c.cols);
    for (auto &v : x) v = rnd_normal();
    for (int j = 0; j < c.cols; j++) {
        if (c.n > 3) x[j] = 0.0f;
        if (c.n > 3) x[(size_t)c.cols + j] *= 1e4f;
        if (c.n > 3) x[2 * (size_t)c.cols + j] *= 1e-4f;
        if (c.n > 4 && j >= 32 && j < 64) x[4 * (size_t)c.cols + j] = 0.0f;
    }
    for (auto &v : nw) v = 0.5f * rnd_normal();
    const bool plus_one = c.norm && (c.cols / 32) % 2 == 1;
    /* a norm without a weight (weight 1, as kiln_cpu_rmsnorm; plus_one then changes nothing)
     * where cols % 7 == 0 */
    const bool no_w = c.norm && c.cols % 7 == 0;
    /* reference input: rmsnorm in double */
    std::vector<double> xr(x.begin(), x.end());
    if (c.norm)
        for (int t = 0; t < c.n; t++) {
            double ss = 0;
            for (int j = 0; j < c.cols; j++)
                ss += (double)x[(size_t)t * c.cols + j] * x[(size_t)t * c.cols + j];
            const double inv = 1.0 / sqrt(ss / c.cols + 1e-6);
            for (int j = 0; j < c.cols; j++)
                xr[(size_t)t * c.cols + j] *= inv * (no_w ? 1.0 : plus_one ? 1.0 + nw[j] : nw[j]);
        }
    std::vector<std::vector<float>> y(count), y0(count);
    std::vector<float *> ys(count);
    for (int i = 0; i < count; i++) {
        y[i].assign((size_t)c.n * c.rows[i], NAN);
        if (c.add)
            for (auto &v : y[i]) v = rnd_normal();
        y0[i] = y[i];
        ys[i] = y[i].data();
    }
    tc_plan p;
    if (!tc_plan_make(&p, count, ws.data(), c.n, c.n_sms > 0 ? c.n_sms : 132, c.bn, c.splits, c.dig,
                      c.dq || c.two)) {
        printf("FAIL plan refused\n");
        failures++;
        return;
    }
    std::vector<uint4> scratch(p.bytes / 16 + 1);
    memset(scratch.data(), 0xff, scratch.size() * 16); /* NaN */
    tc_args A;
    tc_prep_args P;
    tc_plan_args(p, (char *)scratch.data(), count, ys.data(), x.data(), c.n, ws.data(), c.norm,
                 c.norm && !no_w ? nw.data() : NULL, 1e-6f, plus_one, c.add, &A, &P);
    const int mode = p.quant ? p.bits : 16;
    std::vector<unsigned> counters;
    if (g_cp_early && p.splits > 1) { /* the second pass: split-K summed in the kernel */
        counters.assign((size_t)p.tiles * (p.n_pad / p.bn), 0u);
        A.counters = counters.data();
    }
    /* fast mode's reference: x rounded to the digits' steps (E = max |x| / 127 over each group) */
    if (c.dig == 1)
        for (int t = 0; t < c.n; t++)
            for (int g0 = 0; g0 < c.cols; g0 += c.group) {
                double m = 0;
                for (int j = g0; j < g0 + c.group; j++)
                    m = fmax(m, fabs(xr[(size_t)t * c.cols + j]));
                for (int j = g0; j < g0 + c.group && m > 0; j++) {
                    double &v = xr[(size_t)t * c.cols + j];
                    v = m / 127 * nearbyint(v / (m / 127));
                }
            }
    const emu_dim3 pgrid = {(unsigned)p.n_pad, 1, 1};
    if (c.dig == 3 && p.bits == 4)
        run_grid(pgrid, TC_THREADS, [&] { k_tc_prep_i8<3, true>(P); });
    else if (c.dig == 3)
        run_grid(pgrid, TC_THREADS, [&] { k_tc_prep_i8<3, false>(P); });
    else if (c.dig == 1 && p.bits == 4)
        run_grid(pgrid, TC_THREADS, [&] { k_tc_prep_i8<1, true>(P); });
    else if (c.dig == 1)
        run_grid(pgrid, TC_THREADS, [&] { k_tc_prep_i8<1, false>(P); });
    else if (!p.quant)
        run_grid({(unsigned)p.n_pad, 1, 1}, TC_THREADS, [&] { k_tc_prep<false, false>(P); });
    else if (p.bits == 4)
        run_grid({(unsigned)p.n_pad, 1, 1}, TC_THREADS, [&] { k_tc_prep<true, true>(P); });
    else
        run_grid({(unsigned)p.n_pad, 1, 1}, TC_THREADS, [&] { k_tc_prep<true, false>(P); });
    const emu_dim3 grid = {(unsigned)p.tiles, (unsigned)(p.n_pad / p.bn), (unsigned)p.splits};
    g_one = c.one, g_dq = c.dq, g_two = c.two;
    if (c.dig && mode == 4 && p.group == 32)
        run_gemm_i8_dig<TC_Q4, 2>(A, grid, p.bn, c.dig);
    else if (c.dig && mode == 4)
        run_gemm_i8_dig<TC_Q4, 4>(A, grid, p.bn, c.dig);
    else if (c.dig && p.group == 32)
        run_gemm_i8_dig<TC_Q8, 2>(A, grid, p.bn, c.dig);
    else if (c.dig)
        run_gemm_i8_dig<TC_Q8, 4>(A, grid, p.bn, c.dig);
    else if (mode == 16)
        run_gemm_bn<TC_BF16, 4>(A, grid, p.bn);
    else if (mode == 4 && p.group == 32)
        run_gemm_bn<TC_Q4, 2>(A, grid, p.bn);
    else if (mode == 4)
        run_gemm_bn<TC_Q4, 4>(A, grid, p.bn);
    else if (p.group == 32)
        run_gemm_bn<TC_Q8, 2>(A, grid, p.bn);
    else
        run_gemm_bn<TC_Q8, 4>(A, grid, p.bn);
    g_one = g_two = false;
    if (p.splits > 1 && !A.counters) run_grid({3, 1, 1}, 256, [&] { k_tc_reduce(A, p.splits); });
    for (unsigned v : counters)
        if (v != 0) {
            printf("FAIL an arrival counter is %u after the launch\n", v);
            failures++;
            break;
        }

    bool ok = true;
    double worst = 0;
    /* fast mode's one product: x rounded once (f16 after a power-of-two scale against codes:
     * |error| <= 2^-11 |x|; bf16 against bf16 W: 2^-8), so each y is within that of |W| |x| summed
     * over the MMAs' part of W, plus f32 accumulation; a dropped or doubled product is far outside.
     * W dequantized to f16 (dq): scale and bias rounded to f16 and scale q + bias once more, so
     * |error| <= 2^-11 (|scale q| + |bias| + |W|) more per element. */
    const double unit = p.quant ? 1.0 / 2048 : 1.0 / 256;
    long outside = 0;
    for (int i = 0; i < count; i++) {
        double num = 0, den = 0;
        long bad = 0;
        for (int t = 0; t < c.n; t++)
            for (int r = 0; r < c.rows[i]; r++) {
                double ref = 0, bound = 0, mag = 0;
                for (int j = 0; j < c.cols; j++) ref += hm[i].at(r, j) * xr[(size_t)t * c.cols + j];
                if (c.one)
                    for (int j = 0; j < c.cols; j++) {
                        const double xv = fabs(xr[(size_t)t * c.cols + j]);
                        const double wv = hm[i].at(r, j), sq = hm[i].mma_part(r, j);
                        bound += (c.dq ? fabs(sq) + fabs(wv - sq) + 2 * fabs(wv) : fabs(sq)) * xv;
                        mag += fabs(hm[i].at(r, j)) * xv;
                    }
                if (hm[i].m.bias) ref += hm[i].m.bias[r];
                const size_t k = (size_t)t * c.rows[i] + r;
                if (c.add) ref += y0[i][k];
                const double got = y[i][k];
                if (!std::isfinite(got)) bad++;
                if (c.one && !(fabs(got - ref) <= unit * bound + 1e-5 * mag + 1e-6 * fabs(ref)))
                    outside++;
                num += (got - ref) * (got - ref), den += ref * ref;
            }
        const double err = sqrt(num / (den > 0 ? den : 1));
        /* fast mode: against x on its steps; a value that rounds the other way on a tie moves
         * one element by a step */
        const double tol = c.one ? 1e-2 : c.dig == 1 ? 1e-4 : p.quant ? 2e-6 : 3e-5;
        if (bad || outside || !(err <= tol)) ok = false;
        if (bad) worst = INFINITY;
        if (err > worst) worst = err;
    }
    cases++;
    failures += !ok;
    printf("%s %s%s g%d %-4s rows", ok ? "ok  " : "FAIL",
           c.bits == 16  ? "bf16"
           : c.bits == 8 ? "q8  "
                         : "q4  ",
           c.dig == 3   ? " int8 x3"
           : c.dig == 1 ? " int8 x1"
           : c.dq       ? " one dq"
           : c.two      ? " two"
           : c.one      ? " one"
                        : "",
           c.bits == 16 ? 0 : c.group,
           c.bits == 16            ? "-"
           : c.sdt == KILN_DT_F32  ? "f32"
           : c.sdt == KILN_DT_BF16 ? "bf16"
                                   : "f16");
    for (int r : c.rows) printf(" %d", r);
    printf(" cols %d n %d: bn %d splits %d%s%s%s cp.async %s%s: rel err %.2e\n", c.cols, c.n, p.bn,
           p.splits, c.norm ? (no_w ? " norm (no w)" : " norm") : "", c.add ? " add" : "",
           c.bias ? " bias" : "", g_cp_early ? "early" : "late",
           A.counters ? " reduce in kernel" : "", worst);
    fflush(stdout);
}

/* Expert mode (the grouped MoE GEMM): count stacks (2: gate and up; one_stack: up is rows
 * [rows, 2 rows) of each expert of the same stack) of E experts, n pairs with skewed experts
 * (expert 0 about half, the last none), x rows shared by x_div pairs; the pairs sorted by expert
 * and the token tiles laid out here as k_moe_group does; y in sorted order, or scattered back to
 * pair order. Against a double reference per pair. */
static void check_experts(int bits, int group, kiln_dtype sdt, int E, int rows, int cols, int n,
                          int count, bool one_stack, bool scatter, bool bias, bool fast = false) {
    const int x_div = 3, stride = one_stack ? 2 * rows : rows;
    std::vector<host_matrix> hm(one_stack ? 1 : count);
    for (size_t i = 0; i < hm.size(); i++)
        make_matrix(hm[i], bits, group, sdt, E * stride, cols, bias && i == 0);
    const kiln_matrix *stacks[2] = {&hm[0].m, &hm[hm.size() - 1].m};
    const int64_t row_offs[2] = {0, one_stack ? rows : 0};
    std::vector<int> ex(n);
    for (auto &e : ex) {
        const uint64_t r = rnd_u64();
        e = r % 2 ? 0 : (int)(1 + (r >> 8) % (E - 2));
    }
    std::vector<int32_t> list, off(E + 1, 0);
    for (int e = 0; e < E; e++) {
        off[e] = (int)list.size();
        for (int i = 0; i < n; i++)
            if (ex[i] == e) list.push_back(i);
    }
    off[E] = n;
    std::vector<float> x((size_t)((n + x_div - 1) / x_div) * cols);
    for (auto &v : x) v = rnd_normal();
    tc_plan p;
    if (!tc_experts_plan(&p, count, stacks, rows, n, E)) {
        printf("FAIL expert plan refused\n");
        failures++;
        return;
    }
    const int bn = tc_experts_bn(n, E), max_tiles = (int)tc_experts_max_tiles(n, E);
    std::vector<int32_t> tiles;
    for (int e = 0; e < E; e++)
        for (int t0 = off[e]; t0 < off[e + 1]; t0 += bn)
            tiles.insert(tiles.end(), {e, t0, off[e + 1], 0});
    if ((int)tiles.size() / 4 > max_tiles) {
        printf("FAIL %zu tiles, at most %d planned\n", tiles.size() / 4, max_tiles);
        failures++;
        return;
    }
    tiles.resize((size_t)max_tiles * 4, 0);
    for (size_t j = tiles.size() / 4; j-- > 0 && tiles[4 * j + 2] == 0;) tiles[4 * j] = -1;
    std::vector<std::vector<float>> y(count, std::vector<float>((size_t)n * rows, NAN));
    float *ys[2] = {y[0].data(), y[count - 1].data()};
    std::vector<uint4> scratch(p.bytes / 16 + 1);
    memset(scratch.data(), 0xff, scratch.size() * 16);
    tc_args A;
    tc_prep_args P;
    tc_experts_args(p, (char *)scratch.data(), count, ys, x.data(), x_div, n, stacks, rows,
                    row_offs, stride, list.data(), tiles.data(), scatter, &A, &P);
    if (!p.quant)
        run_grid({(unsigned)p.n_pad, 1, 1}, TC_THREADS, [&] { k_tc_prep<false, false>(P); });
    else if (p.bits == 4)
        run_grid({(unsigned)p.n_pad, 1, 1}, TC_THREADS, [&] { k_tc_prep<true, true>(P); });
    else
        run_grid({(unsigned)p.n_pad, 1, 1}, TC_THREADS, [&] { k_tc_prep<true, false>(P); });
    const emu_dim3 grid = {(unsigned)p.tiles, (unsigned)max_tiles, 1};
    g_one = g_dq = fast; /* fast mode: one product, codes dequantized in registers */
    if (!p.quant)
        run_gemm_bn<TC_BF16, 4>(A, grid, p.bn);
    else if (p.bits == 4 && p.group == 32)
        run_gemm_bn<TC_Q4, 2>(A, grid, p.bn);
    else if (p.bits == 4)
        run_gemm_bn<TC_Q4, 4>(A, grid, p.bn);
    else if (p.group == 32)
        run_gemm_bn<TC_Q8, 2>(A, grid, p.bn);
    else
        run_gemm_bn<TC_Q8, 4>(A, grid, p.bn);
    double worst = 0;
    long bad = 0;
    for (int i = 0; i < count; i++) {
        const host_matrix &h = hm[one_stack ? 0 : i];
        double num = 0, den = 0;
        for (int s = 0; s < n; s++) {
            const int pair = list[s], e = ex[pair];
            for (int r = 0; r < rows; r++) {
                const int64_t wr = (int64_t)e * stride + row_offs[i] + r;
                double ref = h.m.bias ? h.m.bias[wr] : 0.0;
                for (int j = 0; j < cols; j++)
                    ref += h.at(wr, j) * x[(size_t)(pair / x_div) * cols + j];
                const double got = y[i][(size_t)(scatter ? pair : s) * rows + r];
                if (!std::isfinite(got)) bad++;
                num += (got - ref) * (got - ref), den += ref * ref;
            }
        }
        worst = fmax(worst, sqrt(num / (den > 0 ? den : 1)));
    }
    g_one = g_dq = false;
    /* fast mode: x and W to f16 (the one-product cases of check() measure <= 6.7e-4) */
    const bool ok = bad == 0 && worst <= (fast ? 1e-2 : p.quant ? 2e-6 : 3e-5);
    cases++;
    failures += !ok;
    printf("%s experts %s%s g%d E %d rows %d cols %d pairs %d x%d%s%s%s: bn %d, %d tiles: rel err "
           "%.2e, %ld non-finite\n",
           ok ? "ok  " : "FAIL",
           bits == 16  ? "bf16"
           : bits == 8 ? "q8"
                       : "q4",
           fast ? " one dq" : "", group, E, rows, cols, n, count, one_stack ? " one stack" : "",
           scatter ? " scatter" : "", bias ? " bias" : "", bn, (int)(tiles.size() / 4), worst, bad);
    fflush(stdout);
}

/* `plans`: what the host plan picks at Llama-3-8B shapes on 132 SMs (no kernel runs) */
static void print_plans() {
    const int fmts[][2] = {{16, 0}, {8, 64}, {4, 64}, {4, 32}};
    const int shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {1024, 4096}};
    const int ns[] = {2, 8, 16, 64, 512, 4096};
    for (auto &f : fmts)
        for (auto &sh : shapes)
            for (int n : ns) {
                kiln_matrix m;
                memset(&m, 0, sizeof m);
                m.rows = sh[0], m.cols = sh[1];
                m.data = (const void *)(uintptr_t)4096;
                if (f[0] == 16) {
                    m.dtype = KILN_DT_BF16;
                } else {
                    m.dtype = KILN_DT_U32, m.bits = f[0], m.group_size = f[1];
                    m.scale_dtype = KILN_DT_F16;
                }
                const kiln_matrix *w = &m;
                tc_plan p;
                if (!tc_plan_make(&p, 1, &w, n, 132, 0, 0, 0)) continue;
                printf("%s%d g%-3d %5dx%-5d n=%-4d: bn %3d, %4d row tiles x %3d token tiles x %2d "
                       "splits (%d chunks each), %d blocks/SM, scratch %.1f MB\n",
                       f[0] == 16 ? "bf" : "q", f[0], f[1], sh[0], sh[1], n, p.bn, p.tiles,
                       p.n_pad / p.bn, p.splits, p.cps, tc_blocks_per_sm(p.bits, p.group, p.bn, 0),
                       p.bytes / 1e6);
            }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "plans") == 0) {
        print_plans();
        return 0;
    }
    const bool quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    const kiln_dtype F16 = KILN_DT_F16, BF = KILN_DT_BF16, F32 = KILN_DT_F32;
    const std::vector<spec> specs = {
        /* bits group sdt rows cols n bn splits n_sms norm add bias dig */
        {4, 32, F16, {200}, 320, 5, 0, 0, 0, false, false, true, 0},
        {4, 64, BF, {130}, 384, 20, 0, 0, 4, false, false, false, 0},
        {4, 128, F32, {129}, 512, 3, 16, 2, 0, false, true, true, 0},
        {8, 32, F32, {77}, 96, 9, 0, 0, 0, false, false, true, 0},
        {8, 64, F16, {300}, 448, 130, 0, 0, 0, false, false, false, 0},
        {8, 128, BF, {64}, 1024, 1, 8, 4, 0, false, false, true, 0},
        {8, 32, BF, {40}, 160, 70, 64, 3, 0, true, true, false, 0},
        {4, 32, F16, {100, 30, 50}, 256, 12, 0, 0, 0, true, true, true, 0},
        {4, 32, F16, {64, 40}, 224, 6, 0, 0, 0, true, false, false, 0},
        {4, 64, F32, {136, 20}, 192, 17, 128, 0, 8, false, false, true, 0},
        {16, 0, F16, {150}, 200, 7, 0, 0, 0, false, false, true, 0},
        {16, 0, F16, {260}, 512, 70, 0, 0, 0, false, true, false, 0},
        {16, 0, F16, {33, 70}, 136, 16, 0, 2, 0, true, false, true, 0},
        {16, 0, F16, {128}, 1024, 2, 8, 0, 4, false, false, false, 0},
        /* the int8 variant: exact (3 digits) and fast (1) */
        {4, 32, F16, {200}, 320, 5, 0, 0, 0, false, false, true, 3},
        {4, 64, BF, {130}, 384, 20, 0, 0, 4, false, false, false, 3},
        {4, 128, F32, {129}, 512, 3, 16, 2, 0, false, true, true, 3},
        {8, 32, F32, {77}, 96, 9, 0, 0, 0, false, false, true, 3},
        {8, 64, F16, {300}, 448, 130, 0, 0, 0, false, false, false, 3},
        {8, 128, BF, {64}, 1024, 1, 8, 4, 0, false, false, true, 3},
        {8, 32, BF, {40}, 160, 70, 64, 3, 0, true, true, false, 3},
        {4, 32, F16, {100, 30, 50}, 256, 12, 0, 0, 0, true, true, true, 3},
        {4, 64, F32, {136, 20}, 192, 17, 64, 0, 8, true, false, true, 3},
        {4, 64, F16, {150}, 256, 130, 0, 0, 0, false, false, true, 1},
        {4, 32, BF, {70, 60}, 160, 9, 0, 2, 0, true, true, false, 1},
        {8, 64, F32, {129}, 320, 40, 128, 0, 0, false, true, true, 1},
        {8, 128, F16, {64}, 768, 16, 0, 3, 0, true, false, false, 1},
        /* fast mode's f16 kernels: the hi product only */
        {4, 64, BF, {130}, 384, 64, 0, 0, 0, false, false, true, 0, true},
        {4, 32, F16, {100, 30}, 256, 12, 0, 2, 0, true, true, false, 0, true},
        {8, 128, F32, {129}, 512, 130, 0, 0, 0, false, false, false, 0, true},
        {8, 64, BF, {77}, 192, 5, 8, 0, 0, true, false, true, 0, true},
        {16, 0, F16, {150}, 200, 40, 0, 0, 0, false, true, true, 0, true},
        {16, 0, F16, {70}, 136, 9, 16, 2, 0, true, false, false, 0, true},
        /* ... with W dequantized in registers */
        {4, 64, BF, {130}, 384, 64, 0, 0, 0, false, false, true, 0, true, true},
        {4, 32, F16, {100, 30}, 256, 12, 0, 2, 0, true, true, false, 0, true, true},
        {4, 128, F32, {129}, 512, 70, 0, 3, 0, false, false, true, 0, true, true},
        {8, 128, F32, {129}, 512, 130, 0, 0, 0, false, false, false, 0, true, true},
        {8, 64, BF, {77}, 192, 5, 8, 0, 0, true, false, true, 0, true, true},
        {8, 32, F16, {40}, 160, 33, 0, 2, 0, false, true, false, 0, true, true},
        /* exact mode's 64-token kernels for two blocks a SM */
        {4, 64, BF, {130}, 384, 64, 0, 0, 0, false, false, true, 0, false, false, true},
        {8, 32, F32, {100, 30}, 256, 40, 0, 3, 0, true, true, false, 0, false, false, true},
    };
    for (int pass = 0; pass < (quick ? 1 : 2); pass++) {
        g_cp_early = pass == 1;
        for (size_t i = 0; i < specs.size(); i++)
            if (pass == 0 || i % 3 == 0) check(specs[i]);
    }
    /* expert mode: bits group sdt E rows cols pairs stacks one_stack scatter bias */
    check_experts(4, 64, BF, 5, 130, 256, 40, 1, false, true, true);
    check_experts(8, 32, F16, 4, 64, 160, 90, 2, false, false, false);
    check_experts(16, 0, F16, 6, 40, 136, 26, 2, true, false, false);
    if (!quick) check_experts(4, 32, F32, 3, 70, 192, 150, 1, false, true, false);
    /* fast mode's DQ kernels on expert tiles */
    check_experts(4, 64, BF, 5, 130, 256, 40, 1, false, true, true, true);
    check_experts(8, 32, F16, 4, 64, 160, 90, 2, false, false, false, true);
    printf("%d cases, %s\n", cases, failures ? "FAILED" : "all passed");
    return failures != 0;
}
