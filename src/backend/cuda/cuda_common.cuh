/* cuda_common.cuh — what every CUDA kernel file of the backend shares: the C headers under C
 * linkage, the check macro (file:line, sticky error), the backend's private state and the small
 * device helpers (16-bit float loads, warp reductions). Internal to src/backend/cuda/. */
#ifndef KILN_CUDA_COMMON_CUH
#define KILN_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend/backend.h"
#include "util/log.h"
#include "util/status.h"
}

#define KCU_STAGE_SLOTS      4
#define KCU_STAGE_BYTES      (256 << 10)
#define KCU_CUBLAS_WORKSPACE (32 << 20)
#define KCU_GRAPH_SLOTS      8
#define KCU_ATT_COUNTERS     65536 /* attention split arrival counters (attention.cu) */

/* One line of the KILN_CUDA_PROFILE report. */
typedef struct kcu_prof_entry {
    char name[72];
    double ms;
    long long calls;
} kcu_prof_entry;

/* The backend's private state (kiln_backend.impl). One stream: every op and copy is ordered on it,
 * so scratch buffers can be reused from op to op without further synchronization. */
struct qg_link; /* qgemv.cu: x's digits handed from one dp4a GEMV to the next */
typedef struct kcu_state {
    int device;
    int n_sms;
    bool sm90; /* compute capability 9.x: the sm_90a code runs (clusters, PDL) */
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *cublas_workspace; /* given to cuBLAS so it never allocates (graph capture) */
    /* [KCU_ATT_COUNTERS] zeroed: per (sequence, kv head, row tile) count of the decode attention
     * splits done; the last to arrive merges them and sets its count back to 0 */
    unsigned *attn_counters;
    void *scratch; /* growable device scratch (bf16 copies of x / W tiles, attention partials) */
    size_t scratch_bytes;
    /* growable: the stacked result of a multi-matmul over a fused allocation (matmul.cu), apart
     * from scratch because the matmul itself uses scratch */
    void *multi_out;
    size_t multi_out_bytes;
    /* pinned staging ring for small uploads (ids, positions): the host copy goes into a slot and
     * the device copy is queued without waiting; a slot is reused once its event has passed */
    void *stage[KCU_STAGE_SLOTS];
    cudaEvent_t stage_ev[KCU_STAGE_SLOTS];
    bool stage_used[KCU_STAGE_SLOTS];
    int stage_next;
    /* decode-step CUDA graphs: graph_begin(key) replays the executable graph kept under key, or
     * starts capturing the stream; graph_end() (or the first call that must wait or allocate:
     * kcu_graph_flush, which then keeps nothing) ends the capture, instantiates it, keeps it
     * under its key (least recently used slot) and launches it. Key 0: the one unkept graph,
     * updated in place with cudaGraphExecUpdate. */
    bool graph_on; /* on unless KILN_CUDA_GRAPH=0 (or profiling) */
    bool capturing;
    bool capture_complete;      /* set by graph_end: the capture holds the whole bracketed run */
    uint64_t capture_key;       /* key of the capture in progress (0: do not keep) */
    cudaGraphExec_t graph_exec; /* the key-0 graph */
    struct {
        uint64_t key;
        cudaGraphExec_t exec;
        long long last_use;
    } graphs[KCU_GRAPH_SLOTS];
    long long graph_clock;
    long long scratch_epoch; /* bumped whenever scratch moves: recorded graphs point into it */
    long long graph_launches, graph_replays, graph_instantiations, graph_flushes_early;
    /* KILN_CUDA_PROFILE=1: every op is timed between two events (and waited for), totals per op
     * and shape are logged when the backend is destroyed; graphs are off then */
    bool prof_on;
    cudaEvent_t prof_ev[2];
    kcu_prof_entry prof[64];
    int n_prof;
    /* Programmatic dependent launch (Hopper; off with KILN_CUDA_PDL=0): kernels launched through
     * KCU_LAUNCH may start while the kernel before them is still running (see kcu_pdl_wait). */
    bool pdl_on;
    /* the sample op's buffers (sampling.cu), grown as needed: the rows and penalty windows it
     * uploads, per-row probabilities [rows, vocab] and occurrence counts [rows, vocab] (kept all
     * zero between calls) */
    void *sample_args, *sample_probs, *sample_counts;
    size_t sample_args_bytes, sample_probs_bytes, sample_counts_bytes;
    /* counts the checked CUDA / cuBLAS calls (launches among them): a hand-off between two ops
     * (qg_link) holds only while nothing ran between them */
    unsigned long long launch_seq;
    struct qg_link *qg_link; /* NULL until the first feeds_next hint */
    kiln_status sticky; /* first failure seen by an op (ops return void); reported by synchronize */
    char sticky_msg[256];
} kcu_state;

static inline kcu_state *kcu_st(kiln_backend *be) {
    return (kcu_state *)be->impl;
}

/* Records a failed CUDA / cuBLAS call: logs it with file:line and keeps the first as the sticky
 * error that synchronize() returns. Returns true when the call succeeded. */
bool kcu_report(kcu_state *st, const char *what, const char *err, const char *file, int line);

static inline bool kcu_check_(kcu_state *st, cudaError_t e, const char *what, const char *file,
                              int line) {
    if (st) st->launch_seq++;
    return e == cudaSuccess ? true : kcu_report(st, what, cudaGetErrorString(e), file, line);
}
static inline bool kcu_cublas_(kcu_state *st, cublasStatus_t s, const char *what, const char *file,
                               int line) {
    if (st) st->launch_seq++;
    return s == CUBLAS_STATUS_SUCCESS ? true
                                      : kcu_report(st, what, cublasGetStatusString(s), file, line);
}
#define KCU_CHECK(st, call)  kcu_check_((st), (call), #call, __FILE__, __LINE__)
#define KCU_CUBLAS(st, call) kcu_cublas_((st), (call), #call, __FILE__, __LINE__)
/* After every kernel launch: catches bad launch configurations at the launch site. */
#define KCU_LAUNCHED(st) KCU_CHECK(st, cudaGetLastError())

/* Ends a capture in progress (if any) and launches what was captured, so the caller may wait,
 * allocate or free. Every host-synchronizing entry point calls it first. */
void kcu_graph_flush(kcu_state *st);

/* KILN_CUDA_PROFILE timing: begin records the start event, end waits for the op and adds its
 * time to the entry `name`. No-ops unless profiling. */
void kcu_prof_begin(kcu_state *st);
void kcu_prof_end(kcu_state *st, const char *name);

/* Device scratch of at least `bytes` (grows; contents not kept). NULL (and sticky error) on OOM. */
void *kcu_scratch(kcu_state *st, size_t bytes);
/* The same for st->multi_out. */
void *kcu_multi_out(kcu_state *st, size_t bytes);
/* The same for a buffer of the caller's (*buf of *cap bytes); zeroed: set to 0 when it grows. */
void *kcu_grow(kcu_state *st, void **buf, size_t *cap, size_t bytes, bool zeroed);
/* qgemv.cu: frees st->qg_link (the backend's destroy) */
void kcu_qg_link_free(kcu_state *st);
/* qgemv.cu, for an op of several launches whose last writes x (the KV cache's store +
 * attention): keeps a feeds_next hint for x given before the op began (seq0: launch_seq then)
 * valid for that last launch. */
void kcu_qg_hint_carry(kcu_state *st, const float *x, unsigned long long seq0);
/* Where a kernel other than the GEMV writes x [n, cols] and can make x's digits for the GEMV
 * that the hint says reads x next (decode attention): true (e, qx_digits.cuh, set) when the hint
 * names x without a norm and a hand-off buffer is at hand; after the launch that writes them,
 * kcu_qg_link_emitted records the emission. */
struct kcu_qx_emit;
bool kcu_qg_link_claim(kcu_state *st, const float *x, int64_t n, int cols, kcu_qx_emit *e);
void kcu_qg_link_emitted(kcu_state *st, const float *x, int64_t n, int cols, const kcu_qx_emit *e);

/* ---- programmatic dependent launch ----
 * A kernel launched with KCU_LAUNCH may become resident while the kernel before it on the stream
 * still runs: as soon as every block of that one has called kcu_pdl_trigger() (or exited). So
 * every such kernel calls kcu_pdl_wait() before it touches memory that earlier kernels write or
 * read (activations, caches, its outputs); before the wait it may only read what no kernel writes
 * (weights: kcu_prefetch_l2). The wait returns once the kernels before it have completed and
 * their writes are visible. Entry protocol: KCU_PDL_ENTER() = wait, then trigger (so at most one
 * kernel waits behind a running one). Kernels launched with <<<>>> keep plain stream order. On
 * the PTX fallback target (< sm_90) both are no-ops and st->pdl_on is false. */
__device__ __forceinline__ void kcu_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void kcu_pdl_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}
#define KCU_PDL_ENTER()                                                                            \
    do {                                                                                           \
        kcu_pdl_wait();                                                                            \
        kcu_pdl_trigger();                                                                         \
    } while (0)
/* Reads of what earlier kernels wrote (activations, KV caches, scratch) are plain coherent
 * loads, never __ldg: ld.global.nc promises that the bytes do not change while the kernel runs,
 * and under PDL a kernel runs while the one before it still writes, so such a load may be
 * scheduled above kcu_pdl_wait(). Weights, which no kernel writes, keep the read-only path. */
template <typename T> __device__ __forceinline__ T kcu_ld(const T *p) {
    return *p;
}
/* Starts pulling read-only bytes (weights) towards L2 before the wait. */
__device__ __forceinline__ void kcu_prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

template <typename... P, typename... A>
static inline cudaError_t kcu_launch_ex(kcu_state *st, void (*kernel)(P...), dim3 grid, dim3 block,
                                        size_t smem, A &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = st->pdl_on ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...);
}
/* Launches kernel (which must begin with KCU_PDL_ENTER or kcu_pdl_wait) on the backend's stream,
 * as a programmatic dependent launch when st->pdl_on; failures are reported with file:line.
 * A template kernel goes in parentheses: KCU_LAUNCH(st, (k<A, B>), grid, block, smem, args). */
#define KCU_LAUNCH(st, kernel, grid, block, smem, ...)                                             \
    KCU_CHECK(st, kcu_launch_ex(st, kernel, grid, block, smem, __VA_ARGS__))

/* ---- device helpers ---- */
__device__ __forceinline__ float kcu_bf16(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}
__device__ __forceinline__ float kcu_f16(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}
/* Element i of a 16/32-bit float array of dtype dt (F32, F16, BF16). */
__device__ __forceinline__ float kcu_load(const void *p, int64_t i, int dt) {
    if (dt == KILN_DT_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == KILN_DT_BF16 ? kcu_bf16(h) : kcu_f16(h);
}

/* 16 bytes of weights that are read once: through the non-coherent path without allocating in
 * L1, so what is reused (x) stays there. */
__device__ __forceinline__ uint4 kcu_load_stream16(const void *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ float kcu_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* Sum of v over the block (blockDim.x a multiple of 32, <= 1024), returned to every thread:
 * warp sums, then warp 0 sums the warps' partials. part: 33 floats of shared memory. */
__device__ __forceinline__ float kcu_block_sum(float v, float *part) {
    v = kcu_warp_sum(v);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0f;
        s = kcu_warp_sum(s);
        if (lane == 0) part[32] = s;
    }
    __syncthreads();
    return part[32];
}
__device__ __forceinline__ float kcu_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* tanh from exp, accurate to a few ulp also under --use_fast_math (tanh.approx is ~1e-3 off). */
__device__ __forceinline__ float kcu_tanh(float x) {
    float a = fabsf(x);
    float t = a > 9.0f ? 1.0f : 1.0f - 2.0f / (__expf(2.0f * a) + 1.0f);
    if (a < 0.004f) t = a * (1.0f - a * a * (1.0f / 3.0f)); /* avoids 1-(1-eps) cancellation */
    return copysignf(t, x);
}

static inline unsigned kcu_blocks(int64_t n, int threads, int64_t max_blocks) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return (unsigned)(b > max_blocks ? max_blocks : b);
}

#endif
