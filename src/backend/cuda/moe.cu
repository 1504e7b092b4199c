/* moe.cu — the backend ops that keep a MoE block's routing on the device (backend.h moe_route,
 * matmul_gather, matmul_gather_glu, moe_combine): launchers of moe_gather.cuh's kernels, with the
 * plain per-element kernel for stacks the gather GEMV does not take (odd widths, unaligned slices).
 * No op waits for the host, so a decode step with MoE layers records as one CUDA graph. */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/gemm_tc.cuh"
#include "backend/cuda/moe_gather.cuh"
#include "backend/cuda/quant.cuh"

#include <stdlib.h>

/* Any format, any shape: a warp per output row of a pair, kcu_matrix_at per element. */
__global__ void k_moe_gather_generic(const __grid_constant__ moeg_args A, kiln_matrix g,
                                     kiln_matrix u) {
    KCU_PDL_ENTER();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * MOEG_WARPS + warp, i = A.i0 + blockIdx.y;
    if (row >= A.rows) return;
    const int e = kcu_ld(A.experts + i);
    float *out = A.y + i * A.rows + row;
    if (e < 0 || e >= A.n_experts) {
        if (lane == 0) *out = __uint_as_float(0x7fc00000u);
        return;
    }
    const float *x = A.x + (i / A.x_div) * A.cols;
    float v[2] = {0.0f, 0.0f};
    for (int p = 0; p <= A.glu; p++) {
        const kiln_matrix &w = p ? u : g;
        const int64_t wrow = (int64_t)e * A.stride + A.m[p].row_off + row;
        float acc = 0.0f;
        for (int64_t c = lane; c < A.cols; c += 32)
            acc += kcu_matrix_at(w, wrow, c) * kcu_ld(x + c);
        v[p] = kcu_warp_sum(acc) + (w.bias ? w.bias[wrow] : 0.0f);
    }
    if (lane == 0) *out = A.glu ? moeg_act(v[0], A.act) * v[1] : v[0];
}

static bool aligned16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

extern "C" void kcu_moe_route(kiln_backend *be, int32_t *experts, float *weights,
                              const float *logits, int64_t T, int n_experts, int top_k,
                              bool norm_topk, const float *expert_scale) {
    kcu_state *st = kcu_st(be);
    if (T <= 0) return;
    if (top_k < 1 || top_k > KILN_MOE_ROUTE_MAX_K || top_k > n_experts ||
        n_experts > KILN_MOE_ROUTE_MAX_EXPERTS) {
        kcu_report(st, "moe_route", "top k must be 1..64 and at most the experts (at most 4096)",
                   __FILE__, __LINE__);
        return;
    }
    const moer_args A = {experts, weights, logits, expert_scale, n_experts, top_k, norm_topk};
    for (int64_t t0 = 0; t0 < T; t0 += MOEG_MAX_GRID) {
        moer_args a = A;
        a.experts += t0 * top_k, a.weights += t0 * top_k, a.logits += t0 * n_experts;
        const unsigned grid = (unsigned)(T - t0 < MOEG_MAX_GRID ? T - t0 : MOEG_MAX_GRID);
        KCU_LAUNCH(st, k_moe_route, grid, MOER_THREADS, moer_smem_bytes(n_experts), a);
        KCU_LAUNCHED(st);
    }
}

/* Which gather kernel takes the stack: the F of k_moe_gather, or -1 for the generic one. */
static int gather_kind(const kiln_matrix *w, const float *x) {
    if (!aligned16(x) || w->cols % 8) return -1;
    if (kiln_matrix_is_quantized(w)) {
        const bool ok = w->bits >= 2 && w->bits <= 8 && w->group_size % 32 == 0 &&
                        w->cols % 32 == 0 && aligned16(w->data);
        return ok ? 100 + w->bits : -1;
    }
    const bool dense =
        w->dtype == KILN_DT_F32 || w->dtype == KILN_DT_F16 || w->dtype == KILN_DT_BF16;
    return dense && aligned16(w->data) ? (int)w->dtype : -1;
}

static bool same_format(const kiln_matrix *a, const kiln_matrix *b) {
    return a->dtype == b->dtype && a->cols == b->cols && a->bits == b->bits &&
           a->group_size == b->group_size && a->scale_dtype == b->scale_dtype;
}

/* The grouped gather (k_moe_group + k_moe_gather_grouped) where pairs share experts: more pairs
 * than half the experts (a decode batch of a few tokens or more). KILN_CUDA_MOE_GROUPED=0 / 1
 * forces it off / on; kiln_cuda_set_moe_grouped does the same for tests. */
static int g_moe_grouped = -2; /* -2: read the environment; -1 auto */
extern "C" void kiln_cuda_set_moe_grouped(int mode) {
    g_moe_grouped = mode;
}
static bool use_grouped(int64_t n, int n_experts) {
    if (g_moe_grouped == -2) {
        const char *e = getenv("KILN_CUDA_MOE_GROUPED");
        g_moe_grouped = e && *e ? atoi(e) : -1;
    }
    if (g_moe_grouped >= 0) return g_moe_grouped == 1 && n <= 0x7fffffff;
    return n >= 16 && 2 * n > n_experts && n <= 0x7fffffff;
}

/* Calls l.run<F>() for the gather kind F (a dense dtype or 100 + bits). */
template <typename L> static void by_kind(int kind, const L &l) {
    switch (kind) {
    case KILN_DT_F32:
        l.template run<KILN_DT_F32>();
        break;
    case KILN_DT_F16:
        l.template run<KILN_DT_F16>();
        break;
    case KILN_DT_BF16:
        l.template run<KILN_DT_BF16>();
        break;
    case 102:
        l.template run<102>();
        break;
    case 103:
        l.template run<103>();
        break;
    case 104:
        l.template run<104>();
        break;
    case 105:
        l.template run<105>();
        break;
    case 106:
        l.template run<106>();
        break;
    case 107:
        l.template run<107>();
        break;
    case 108:
        l.template run<108>();
        break;
    }
}
struct per_pair_gather {
    kcu_state *st;
    dim3 grid, block;
    const moeg_args &A;
    template <int F> void run() const { KCU_LAUNCH(st, k_moe_gather<F>, grid, block, 0, A); }
};
struct grouped_gather {
    kcu_state *st;
    dim3 grid, block;
    const moeg_args &A;
    const int32_t *offsets, *list;
    template <int F> void run() const {
        KCU_LAUNCH(st, k_moe_gather_grouped<F>, grid, block, 0, A, offsets, list);
    }
};

static void grouped_launch(kcu_state *st, const moeg_args &A, int kind, int64_t n,
                           unsigned row_blocks) {
    const int E = A.n_experts;
    int32_t *offsets = (int32_t *)kcu_scratch(st, (size_t)(E + 2 + n) * sizeof(int32_t));
    if (!offsets) return; /* reported */
    int32_t *list = offsets + E + 2;
    const moeg_group_args G = {A.experts, offsets, list, (int)n, E, NULL, 0, 0};
    KCU_LAUNCH(st, k_moe_group, 1, MOEG_GROUP_THREADS, moeg_group_smem_bytes(E), G);
    KCU_LAUNCHED(st);
    const dim3 grid(row_blocks, (unsigned)(E + 1)), block(MOEG_WARPS * 32);
    const grouped_gather L = {st, grid, block, A, offsets, list};
    by_kind(kind, L);
    KCU_LAUNCHED(st);
}

/* The tensor-core expert GEMM (gemm_tc.cu expert mode) for batches of many pairs (prefill): the
 * pairs bucketed by expert with their token tiles (k_moe_group), x's rows gathered in that order,
 * each block a 128-row x token tile of one expert's matrix (each weight tile read once per tile
 * of up to 64 pairs), then glu's act(gate) * up and the scatter into pair order.
 * KILN_CUDA_MOE_TC=0 / 1 forces it off / on (where the format allows), kiln_cuda_set_moe_tc the
 * same for tests; auto from KCU_MOE_TC_MIN_PAIRS pairs. Measured (Qwen3-30B-A3B's shape, 4
 * layers, 4-bit, top-8; decode tok/s, gather vs this): H200, 64 pairs (batch 8) 3981 vs 6846,
 * 512 pairs (batch 64) 4666 vs 23,257; H100 (twenty-fifth session), 8 pairs (batch 1) 1729 vs
 * 1594, 16 pairs 2569 vs 2833, 24 pairs 3094 vs 3908, 32 pairs 3431 vs 4845, 56 pairs 4116 vs
 * 7600: one token's pairs keep the gather. */
#define KCU_MOE_TC_MIN_PAIRS 16
static int g_moe_tc = -2; /* -2: read the environment; -1 auto */
extern "C" void kiln_cuda_set_moe_tc(int mode) {
    g_moe_tc = mode;
}
static bool use_tc(int64_t n) {
    if (g_moe_tc == -2) {
        const char *e = getenv("KILN_CUDA_MOE_TC");
        g_moe_tc = e && *e ? atoi(e) : -1;
    }
    if (g_moe_tc >= 0) return g_moe_tc == 1;
    return n >= KCU_MOE_TC_MIN_PAIRS;
}

/* backend.h moe_gather_grouped: the expert GEMM takes `pairs` pairs of stack w (prefill then
 * routes on the device: measured 5.3x host routing at 512 tokens of Qwen3-30B-A3B's shape) */
extern "C" bool kcu_moe_gather_grouped(const kiln_backend *be, const kiln_matrix *w,
                                       int64_t pairs) {
    (void)be;
    return use_tc(pairs) && kcu_tc_format_on(w);
}

static bool tc_launch(kcu_state *st, const moeg_args &A, const kiln_matrix *g, const kiln_matrix *u,
                      int64_t n) {
    const int E = A.n_experts, count = u ? 2 : 1;
    const kiln_matrix *stacks[2] = {g, u ? u : g};
    const int64_t row_offs[2] = {A.m[0].row_off, A.m[1].row_off};
    int max_tiles = 0, bn = 0;
    const size_t tcb = kcu_tc_experts_bytes(count, stacks, A.rows, n, E, &max_tiles, &bn);
    if (!tcb || n > 0x7fffffff) return false;
    auto al = [](size_t b) { return (b + 255) & ~(size_t)255; };
    const size_t b_off = al((size_t)(E + 2) * 4), b_list = al((size_t)n * 4),
                 b_tiles = al((size_t)max_tiles * 16), b_h = u ? al((size_t)n * A.rows * 4) : 0;
    char *scr = (char *)kcu_scratch(st, b_off + b_list + b_tiles + 2 * b_h + tcb);
    if (!scr) return true; /* reported */
    int32_t *offsets = (int32_t *)scr, *list = (int32_t *)(scr + b_off);
    int32_t *tiles = (int32_t *)(scr + b_off + b_list);
    float *hg = (float *)(scr + b_off + b_list + b_tiles), *hu = (float *)((char *)hg + b_h);
    void *tscr = scr + b_off + b_list + b_tiles + 2 * b_h;
    const moeg_group_args G = {A.experts, offsets, list, (int)n, E, tiles, bn, max_tiles};
    KCU_LAUNCH(st, k_moe_group, 1, MOEG_GROUP_THREADS, moeg_group_smem_bytes(E), G);
    KCU_LAUNCHED(st);
    float *ys[2] = {u ? hg : A.y, hu};
    if (!kcu_tc_experts(st, count, ys, A.x, A.x_div, n, stacks, A.rows, row_offs, A.stride, list,
                        tiles, !u, tscr)) {
        kcu_report(st, "matmul_gather", "the expert GEMM did not take a planned call", __FILE__,
                   __LINE__);
        return true;
    }
    const moes_args S = {A.y, hg, hu, offsets, list, A.rows, (int)n, E, A.act};
    const unsigned rb = (unsigned)((A.rows + MOES_THREADS - 1) / MOES_THREADS);
    if (u)
        KCU_LAUNCH(st, k_moe_scatter_glu, dim3(rb, (unsigned)(n < 4096 ? n : 4096)), MOES_THREADS,
                   0, S);
    else
        KCU_LAUNCH(st, k_moe_scatter_bad, rb, MOES_THREADS, 0, S);
    KCU_LAUNCHED(st);
    return true;
}

/* Both ops: u NULL for the plain gather. Expert e reads rows [e*stride + off, + rows) of g (and
 * [e*stride + up_off, + rows) of u). */
static void gather_launch(kiln_backend *be, float *y, const float *x, int64_t x_div, int64_t n,
                          const int32_t *experts, const kiln_matrix *g, const kiln_matrix *u,
                          int64_t rows, int64_t stride, int64_t up_off, int act) {
    kcu_state *st = kcu_st(be);
    if (n <= 0 || rows <= 0) return;
    if (x_div < 1 || stride < rows || g->rows % stride ||
        (u && (!same_format(g, u) || u->rows != g->rows || up_off + rows > stride))) {
        kcu_report(st, "matmul_gather", "the stacks' rows are not whole experts of one format",
                   __FILE__, __LINE__);
        return;
    }
    moeg_args A = {};
    A.y = y, A.x = x, A.experts = experts, A.rows = rows, A.cols = g->cols, A.x_div = x_div;
    A.stride = stride, A.n_experts = (int)(g->rows / stride), A.sdt = (int)g->scale_dtype;
    A.group = g->group_size, A.glu = u != NULL, A.act = act;
    A.m[0] = {g->data, g->scales, g->biases, g->bias, 0};
    if (u) A.m[1] = {u->data, u->scales, u->biases, u->bias, up_off};
    int kind = gather_kind(g, x);
    if (u && kind != gather_kind(u, x)) kind = -1;
    const unsigned row_blocks = (unsigned)((rows + MOEG_WARPS - 1) / MOEG_WARPS);
    if (use_tc(n) && tc_launch(st, A, g, u, n)) return;
    if (kind >= 0 && use_grouped(n, A.n_experts)) {
        grouped_launch(st, A, kind, n, row_blocks);
        return;
    }
    for (int64_t i0 = 0; i0 < n; i0 += MOEG_MAX_GRID) {
        A.i0 = i0;
        const dim3 grid(row_blocks, (unsigned)(n - i0 < MOEG_MAX_GRID ? n - i0 : MOEG_MAX_GRID));
        const dim3 block(MOEG_WARPS * 32);
        if (kind >= 0)
            by_kind(kind, per_pair_gather{st, grid, block, A});
        else
            KCU_LAUNCH(st, k_moe_gather_generic, grid, block, 0, A, *g, u ? *u : *g);
        KCU_LAUNCHED(st);
    }
}

extern "C" void kcu_matmul_gather(kiln_backend *be, float *y, const float *x, int64_t x_div,
                                  int64_t n, const int32_t *experts, const kiln_matrix *w,
                                  int64_t rows) {
    gather_launch(be, y, x, x_div, n, experts, w, NULL, rows, rows, 0, 0);
}

extern "C" void kcu_matmul_gather_glu(kiln_backend *be, float *y, const float *x, int64_t x_div,
                                      int64_t n, const int32_t *experts, const kiln_matrix *gate,
                                      const kiln_matrix *up, int64_t rows, int64_t stride,
                                      int64_t up_offset, kiln_glu_act act) {
    gather_launch(be, y, x, x_div, n, experts, gate, up, rows, stride, up_offset, (int)act);
}

extern "C" void kcu_moe_combine(kiln_backend *be, float *y, const float *ye, const float *weights,
                                int64_t T, int top_k, int64_t hidden, const float *shared,
                                const float *shared_logit) {
    kcu_state *st = kcu_st(be);
    if (T <= 0 || hidden <= 0) return;
    const moec_args A0 = {y, ye, weights, shared, shared_logit, hidden, top_k};
    const unsigned hb = (unsigned)((hidden + MOEC_THREADS - 1) / MOEC_THREADS);
    for (int64_t t0 = 0; t0 < T; t0 += MOEG_MAX_GRID) {
        moec_args A = A0;
        A.y += t0 * hidden, A.ye += t0 * top_k * hidden, A.weights += t0 * top_k;
        if (A.shared) A.shared += t0 * hidden;
        if (A.shared_logit) A.shared_logit += t0;
        const dim3 grid(hb, (unsigned)(T - t0 < MOEG_MAX_GRID ? T - t0 : MOEG_MAX_GRID));
        KCU_LAUNCH(st, k_moe_combine, grid, MOEC_THREADS, 0, A);
        KCU_LAUNCHED(st);
    }
}
