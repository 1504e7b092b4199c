/* prefetch.cu — the backend's prefetch hint (backend.h `prefetch`): the leading part of the next
 * matrices' bytes (codes or dense values, scales, biases) pulled into L2 by a small kernel that
 * issues one prefetch.global.L2::evict_last per 128-byte line and exits. At a decode step the
 * model calls it before attention, whose few reads leave DRAM mostly idle: the o projection and
 * the start of gate / up can then arrive while attention runs, and their GEMVs start on L2
 * instead of a DRAM ramp. It changes no result.
 *
 * Budget: env KILN_CUDA_PREFETCH_MB or kiln_cuda_set_prefetch_mb (default 0 = off, until measured
 * on the H200; H200's L2 is 50 MB). The first matrix is taken whole (it is read first), the rest
 * share what is left as one leading fraction of each (gate and up are read row by row together). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#include <stdlib.h>

#define PF_RANGES 12 /* 3 parts (data, scales, biases) of up to 4 matrices */

struct pf_ranges {
    const char *p[PF_RANGES];
    long long bytes[PF_RANGES];
    int n;
};

/* Issues the prefetches first (weights: no kernel writes them), then waits for the kernel before
 * it (programmatic dependent launch keeps its chain: the kernel after this one relies on it). */
__global__ void __launch_bounds__(256) k_prefetch_l2(const __grid_constant__ pf_ranges R) {
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long nt = (long long)gridDim.x * blockDim.x;
    for (int r = 0; r < R.n; r++)
        for (long long off = tid * 128; off < R.bytes[r]; off += nt * 128)
            asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(R.p[r] + off));
    KCU_PDL_ENTER();
}

static int g_prefetch_mb = -1;
extern "C" void kiln_cuda_set_prefetch_mb(int mb) {
    g_prefetch_mb = mb;
}
static long long prefetch_budget(void) {
    if (g_prefetch_mb < 0) {
        const char *e = getenv("KILN_CUDA_PREFETCH_MB");
        g_prefetch_mb = e && *e ? atoi(e) : 0;
        if (g_prefetch_mb < 0) g_prefetch_mb = 0;
    }
    return (long long)g_prefetch_mb << 20;
}
static long long g_prefetch_launches = 0;
extern "C" long long kiln_cuda_prefetch_launches(void) {
    return g_prefetch_launches;
}

/* Adds the leading fraction f of w's parts (data, scales, biases) to R. */
static void pf_add(pf_ranges *R, const kiln_matrix *w, double f) {
    const int64_t rows = (int64_t)(f * (double)w->rows + 0.5);
    if (rows <= 0) return;
    long long data, side = 0;
    if (kiln_matrix_is_quantized(w)) {
        data = (long long)rows * kiln_matrix_row_code_bytes(w);
        side = (long long)rows * (w->cols / w->group_size) *
               (long long)kiln_dtype_size(w->scale_dtype);
    } else {
        data = (long long)rows * w->cols * (long long)kiln_dtype_size(w->dtype);
    }
    const void *parts[3] = {w->data, w->scales, w->biases};
    const long long sizes[3] = {data, side, side};
    for (int i = 0; i < 3 && R->n < PF_RANGES; i++)
        if (parts[i] && sizes[i] > 0) {
            R->p[R->n] = (const char *)parts[i];
            R->bytes[R->n++] = sizes[i];
        }
}

extern "C" void kcu_prefetch(kiln_backend *be, const kiln_matrix *const *ws, int count) {
    long long budget = prefetch_budget();
    if (budget <= 0 || count < 1) return;
    if (count > 4) count = 4;
    kcu_state *st = kcu_st(be);
    pf_ranges R = {};
    long long first = kiln_matrix_bytes(ws[0]), total = 0;
    pf_add(&R, ws[0], first <= budget ? 1.0 : (double)budget / (double)first);
    budget -= first;
    for (int i = 1; i < count; i++) total += kiln_matrix_bytes(ws[i]);
    if (budget > 0 && total > 0)
        for (int i = 1; i < count; i++)
            pf_add(&R, ws[i], total <= budget ? 1.0 : (double)budget / (double)total);
    if (R.n == 0) return;
    long long lines = 0;
    for (int r = 0; r < R.n; r++) lines += (R.bytes[r] + 127) / 128;
    /* a few prefetches a thread: the kernel is done issuing in a few µs */
    long long blocks = (lines + 4 * 256 - 1) / (4 * 256);
    if (blocks > 4 * (long long)st->n_sms) blocks = 4 * (long long)st->n_sms;
    KCU_LAUNCH(st, k_prefetch_l2, (unsigned)blocks, 256, 0, R);
    KCU_LAUNCHED(st);
    g_prefetch_launches++;
}
