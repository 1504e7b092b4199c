/* moe.cu — the backend ops that keep a MoE block's routing on the device (backend.h moe_route,
 * matmul_gather, moe_combine): launchers of moe_gather.cuh's kernels, with the plain per-element
 * kernel for stacks the gather GEMV does not take (odd widths, unaligned slices). No op waits for
 * the host, so a decode step with MoE layers records as one CUDA graph. */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/moe_gather.cuh"
#include "backend/cuda/quant.cuh"

/* Any format, any shape: one warp per (pair, row), kcu_matrix_at per element. */
__global__ void k_moe_gather_generic(const __grid_constant__ moeg_args A, kiln_matrix w) {
    KCU_PDL_ENTER();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    moeg_row r;
    if (!moeg_locate(A, warp, lane, r)) return;
    float acc = 0.0f;
    for (int64_t c = lane; c < A.cols; c += 32)
        acc += kcu_matrix_at(w, r.wrow, c) * kcu_ld(r.x + c);
    moeg_store(A, r, lane, acc);
}

static bool aligned16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

extern "C" void kcu_moe_route(kiln_backend *be, int32_t *experts, float *weights,
                              const float *logits, int64_t T, int n_experts, int top_k,
                              bool norm_topk, const float *expert_scale) {
    kcu_state *st = kcu_st(be);
    if (T <= 0) return;
    if (top_k < 1 || top_k > 64 || top_k > n_experts || moer_smem_bytes(n_experts) > 40000) {
        kcu_report(st, "moe_route", "top k must be 1..64 and at most the experts (at most 8000)",
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

/* Which gather kernel takes the stack: 0 = the generic one. */
static int gather_kind(const kiln_matrix *w, const float *x) {
    if (!aligned16(x) || w->cols % 8) return 0;
    if (kiln_matrix_is_quantized(w)) {
        const bool ok = w->bits >= 2 && w->bits <= 8 && w->group_size % 32 == 0 &&
                        w->cols % 32 == 0 && aligned16(w->data);
        return ok ? 100 + w->bits : 0;
    }
    return aligned16(w->data) ? 1 : 0;
}

extern "C" void kcu_matmul_gather(kiln_backend *be, float *y, const float *x, int64_t x_div,
                                  int64_t n, const int32_t *experts, const kiln_matrix *w,
                                  int64_t rows) {
    kcu_state *st = kcu_st(be);
    if (n <= 0 || rows <= 0) return;
    if (x_div < 1 || w->rows % rows) {
        kcu_report(st, "matmul_gather", "the stack's rows are not whole experts", __FILE__,
                   __LINE__);
        return;
    }
    moeg_args A = {};
    A.y = y, A.x = x, A.experts = experts, A.w = w->data, A.scales = w->scales;
    A.biases = w->biases, A.bias = w->bias, A.rows = rows, A.cols = w->cols, A.x_div = x_div;
    A.n_experts = (int)(w->rows / rows), A.sdt = (int)w->scale_dtype, A.group = w->group_size;
    const int kind = gather_kind(w, x);
    const unsigned row_blocks = (unsigned)((rows + MOEG_WARPS - 1) / MOEG_WARPS);
    for (int64_t i0 = 0; i0 < n; i0 += MOEG_MAX_GRID) {
        A.i0 = i0;
        const dim3 grid(row_blocks, (unsigned)(n - i0 < MOEG_MAX_GRID ? n - i0 : MOEG_MAX_GRID));
        const dim3 block(MOEG_WARPS * 32);
#define KQ(B)                                                                                      \
    case 100 + B:                                                                                  \
        KCU_LAUNCH(st, k_moe_gather_quant<B>, grid, block, 0, A);                                  \
        break
        switch (kind) {
        case 1:
            if (w->dtype == KILN_DT_BF16)
                KCU_LAUNCH(st, k_moe_gather_dense<KILN_DT_BF16>, grid, block, 0, A);
            else if (w->dtype == KILN_DT_F16)
                KCU_LAUNCH(st, k_moe_gather_dense<KILN_DT_F16>, grid, block, 0, A);
            else
                KCU_LAUNCH(st, k_moe_gather_dense<KILN_DT_F32>, grid, block, 0, A);
            break;
            KQ(2);
            KQ(3);
            KQ(4);
            KQ(5);
            KQ(6);
            KQ(7);
            KQ(8);
        default:
            KCU_LAUNCH(st, k_moe_gather_generic, grid, block, 0, A, *w);
            break;
        }
#undef KQ
        KCU_LAUNCHED(st);
    }
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
