/* cuda_backend.cu — the CUDA backend's table: device selection, the stream and cuBLAS handle,
 * memory and copies, weights uploaded in their stored format, the scratch buffer and the sticky
 * error that synchronize() reports. The kernels live one family per file beside this one. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "util/hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool kcu_report(kcu_state *st, const char *what, const char *err, const char *file, int line) {
    KILN_LOG_E("cuda: %s:%d: %s: %s", file, line, what, err);
    if (st && st->sticky == KILN_OK) {
        st->sticky = KILN_ERR_DEVICE;
        snprintf(st->sticky_msg, sizeof st->sticky_msg, "%s:%d: %s: %s", file, line, what, err);
    }
    return false;
}

/* *buf grown to at least `bytes` (contents not kept): a capture in progress ends first, the
 * stream drains before the old buffer goes, and graphs recorded with it are dropped */
static void *grow_buffer(kcu_state *st, void **buf, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return *buf;
    if (st->capturing) {
        kcu_graph_flush(st); /* the rest of this step runs eagerly */
        st->graph_flushes_early++;
    }
    size_t want = bytes + bytes / 4 + (1 << 20);
    if (*buf) {
        KCU_CHECK(st, cudaStreamSynchronize(st->stream)); /* in-flight ops may still read it */
        KCU_CHECK(st, cudaFree(*buf));
        *buf = NULL;
        *cap = 0;
    }
    st->scratch_epoch++; /* graphs recorded with the old pointer must not be replayed */
    if (!KCU_CHECK(st, cudaMalloc(buf, want))) return NULL;
    *cap = want;
    return *buf;
}

void *kcu_scratch(kcu_state *st, size_t bytes) {
    return grow_buffer(st, &st->scratch, &st->scratch_bytes, bytes);
}

void *kcu_multi_out(kcu_state *st, size_t bytes) {
    return grow_buffer(st, &st->multi_out, &st->multi_out_bytes, bytes);
}

void *kcu_grow(kcu_state *st, void **buf, size_t *cap, size_t bytes, bool zeroed) {
    const bool grows = bytes > *cap;
    void *p = grow_buffer(st, buf, cap, bytes);
    if (p && grows && zeroed) KCU_CHECK(st, cudaMemsetAsync(p, 0, *cap, st->stream));
    return p;
}

/* ---- decode-step graphs ----
 * A decode step of a small model is hundreds of short kernels; launched one by one, the GPU waits
 * on the host between them. The forward pass brackets its layers with graph_begin(key) /
 * graph_end: the first time a key is seen the launches are captured, instantiated once and kept
 * under the key; later steps with the same key replay the kept graph with one launch and no
 * capture. Kernels that must see the step's positions read them from device memory (the forward
 * uploads them before the graph), so one graph serves every position until a cache grows or the
 * attention split geometry moves to its next bucket, which changes the key. Key 0 is captured
 * every time and applied to one executable with cudaGraphExecUpdate (cheap when the topology is
 * unchanged). */
static void graph_slot_store(kcu_state *st, uint64_t key, cudaGraphExec_t exec) {
    int victim = 0;
    for (int i = 1; i < KCU_GRAPH_SLOTS; i++)
        if (st->graphs[i].last_use < st->graphs[victim].last_use) victim = i;
    /* destroying an executable graph in flight is allowed: it is freed when it completes */
    if (st->graphs[victim].exec) cudaGraphExecDestroy(st->graphs[victim].exec);
    st->graphs[victim].key = key;
    st->graphs[victim].exec = exec;
    st->graphs[victim].last_use = ++st->graph_clock;
}

static void graphs_clear(kcu_state *st) {
    for (int i = 0; i < KCU_GRAPH_SLOTS; i++) {
        if (st->graphs[i].exec) cudaGraphExecDestroy(st->graphs[i].exec);
        st->graphs[i].exec = NULL;
        st->graphs[i].key = 0;
    }
    if (st->graph_exec) cudaGraphExecDestroy(st->graph_exec);
    st->graph_exec = NULL;
}

void kcu_graph_flush(kcu_state *st) {
    if (!st->capturing) return;
    st->capturing = false;
    /* an early end (a call had to wait or allocate) holds only part of the step: never keep it */
    uint64_t key = st->capture_complete ? st->capture_key : 0;
    st->capture_complete = false;
    cudaGraph_t g = NULL;
    if (!KCU_CHECK(st, cudaStreamEndCapture(st->stream, &g)) || !g) return;
    cudaGraphExec_t exec = NULL;
    if (key) {
        if (KCU_CHECK(st, cudaGraphInstantiate(&exec, g, 0))) {
            st->graph_instantiations++;
            graph_slot_store(st, key, exec);
        }
    } else {
        bool updated = false;
        if (st->graph_exec) {
            cudaGraphExecUpdateResultInfo info;
            updated = cudaGraphExecUpdate(st->graph_exec, g, &info) == cudaSuccess;
            if (!updated) {
                cudaGetLastError(); /* a topology change is not an error: instantiate anew */
                cudaGraphExecDestroy(st->graph_exec);
                st->graph_exec = NULL;
            }
        }
        if (!updated) {
            if (KCU_CHECK(st, cudaGraphInstantiate(&st->graph_exec, g, 0)))
                st->graph_instantiations++;
            else
                st->graph_exec = NULL;
        }
        exec = st->graph_exec;
    }
    if (exec && KCU_CHECK(st, cudaGraphLaunch(exec, st->stream))) st->graph_launches++;
    cudaGraphDestroy(g);
}

/* ---- per-op profile (KILN_CUDA_PROFILE=1) ---- */
void kcu_prof_begin(kcu_state *st) {
    if (st->prof_on) cudaEventRecord(st->prof_ev[0], st->stream);
}

void kcu_prof_end(kcu_state *st, const char *name) {
    if (!st->prof_on) return;
    float ms = 0;
    cudaEventRecord(st->prof_ev[1], st->stream);
    cudaEventSynchronize(st->prof_ev[1]);
    cudaEventElapsedTime(&ms, st->prof_ev[0], st->prof_ev[1]);
    int i = 0;
    while (i < st->n_prof && strcmp(st->prof[i].name, name) != 0) i++;
    if (i == st->n_prof) {
        if (i == 64) return;
        snprintf(st->prof[i].name, sizeof st->prof[i].name, "%s", name);
        st->n_prof++;
    }
    st->prof[i].ms += ms;
    st->prof[i].calls++;
}

static void prof_report(kcu_state *st) {
    double total = 0;
    for (int i = 0; i < st->n_prof; i++) total += st->prof[i].ms;
    for (int done = 0; done < st->n_prof; done++) { /* largest first */
        int best = done;
        for (int i = done + 1; i < st->n_prof; i++)
            if (st->prof[i].ms > st->prof[best].ms) best = i;
        kcu_prof_entry t = st->prof[done];
        st->prof[done] = st->prof[best];
        st->prof[best] = t;
        const kcu_prof_entry *e = &st->prof[done];
        fprintf(stderr, "cuda profile: %-44s %8lld calls %10.2f ms %5.1f%% %8.2f us/call\n",
                e->name, e->calls, e->ms, 100 * e->ms / (total > 0 ? total : 1),
                1e3 * e->ms / (double)e->calls);
    }
}

/* A matmul's token-count class in the profile's rows: batch-1 decode, the GEMV's small batches,
 * batched decode (up to 64 sequences), prefill. */
static const char *prof_n(int64_t n) {
    return n == 1 ? "1" : n <= 8 ? "2-8" : n <= 64 ? "9-64" : ">64";
}

static void prof_matmul(kiln_backend *be, float *y, const float *x, int64_t n,
                        const kiln_matrix *w) {
    kcu_state *st = kcu_st(be);
    char name[72];
    snprintf(name, sizeof name, "matmul n=%s %lldx%lld %s%d", prof_n(n), (long long)w->rows,
             (long long)w->cols, kiln_matrix_is_quantized(w) ? "q" : "dt",
             kiln_matrix_is_quantized(w) ? w->bits : (int)w->dtype);
    kcu_prof_begin(st);
    kcu_matmul(be, y, x, n, w);
    kcu_prof_end(st, name);
}
static void prof_rmsnorm(kiln_backend *be, float *y, const float *x, const float *w, int64_t n,
                         int64_t dim, float eps, bool plus_one) {
    kcu_prof_begin(kcu_st(be));
    kcu_rmsnorm(be, y, x, w, n, dim, eps, plus_one);
    kcu_prof_end(kcu_st(be), dim < 512 ? "rmsnorm (per head)" : "rmsnorm");
}
static void prof_rope(kiln_backend *be, float *x, const int32_t *pos, int64_t n, int n_heads,
                      int head_dim, int rot_dim, const float *inv_freq) {
    kcu_prof_begin(kcu_st(be));
    kcu_rope(be, x, pos, n, n_heads, head_dim, rot_dim, inv_freq);
    kcu_prof_end(kcu_st(be), "rope");
}
static void prof_silu_mul(kiln_backend *be, float *y, const float *g, const float *u, int64_t n) {
    kcu_prof_begin(kcu_st(be));
    kcu_silu_mul(be, y, g, u, n);
    kcu_prof_end(kcu_st(be), "silu_mul");
}
static void prof_add(kiln_backend *be, float *y, const float *a, const float *b, int64_t n) {
    kcu_prof_begin(kcu_st(be));
    kcu_add(be, y, a, b, n);
    kcu_prof_end(kcu_st(be), "add");
}
static void prof_matmul_multi(kiln_backend *be, int count, float *const *ys, const float *x,
                              int64_t n, const kiln_matrix *const *ws) {
    char name[72];
    snprintf(name, sizeof name, "matmul_multi x%d n=%s %lldx%lld", count, prof_n(n),
             (long long)ws[0]->rows, (long long)ws[0]->cols);
    kcu_prof_begin(kcu_st(be));
    kcu_matmul_multi(be, count, ys, x, n, ws);
    kcu_prof_end(kcu_st(be), name);
}
static void prof_matmul_norm(kiln_backend *be, int count, float *const *ys, const float *x,
                             float *h, int64_t n, const kiln_matrix *const *ws, const float *nw,
                             float eps, bool plus_one) {
    char name[72];
    snprintf(name, sizeof name, "matmul_norm x%d n=%s %lldx%lld", count, prof_n(n),
             (long long)ws[0]->rows, (long long)ws[0]->cols);
    kcu_prof_begin(kcu_st(be));
    kcu_matmul_norm(be, count, ys, x, h, n, ws, nw, eps, plus_one);
    kcu_prof_end(kcu_st(be), name);
}
static void prof_matmul_add(kiln_backend *be, float *y, const float *x, float *tmp, int64_t n,
                            const kiln_matrix *w) {
    char name[72];
    snprintf(name, sizeof name, "matmul_add n=%s %lldx%lld", prof_n(n), (long long)w->rows,
             (long long)w->cols);
    kcu_prof_begin(kcu_st(be));
    kcu_matmul_add(be, y, x, tmp, n, w);
    kcu_prof_end(kcu_st(be), name);
}
static void prof_matmul_norm_glu(kiln_backend *be, float *out, const float *x, float *h, float *up,
                                 int64_t n, const kiln_matrix *wg, const kiln_matrix *wu,
                                 const float *nw, float eps, bool plus_one, kiln_glu_act act) {
    char name[72];
    snprintf(name, sizeof name, "matmul_norm_glu n=%s 2x%lldx%lld", prof_n(n), (long long)wg->rows,
             (long long)wg->cols);
    kcu_prof_begin(kcu_st(be));
    kcu_matmul_norm_glu(be, out, x, h, up, n, wg, wu, nw, eps, plus_one, act);
    kcu_prof_end(kcu_st(be), name);
}
static void prof_add_rmsnorm(kiln_backend *be, float *x, const float *h, float *y, const float *w,
                             int64_t n, int64_t dim, float eps, bool plus_one) {
    kcu_prof_begin(kcu_st(be));
    kcu_add_rmsnorm(be, x, h, y, w, n, dim, eps, plus_one);
    kcu_prof_end(kcu_st(be), "add_rmsnorm");
}
static void prof_norm_add(kiln_backend *be, float *x, float *h, const float *w, int64_t n,
                          int64_t dim, float eps, bool plus_one, float scale) {
    kcu_prof_begin(kcu_st(be));
    kcu_norm_add(be, x, h, w, n, dim, eps, plus_one, scale);
    kcu_prof_end(kcu_st(be), "norm_add");
}
static void prof_qk_norm_rope(kiln_backend *be, float *q, float *k, const int32_t *pos, int64_t n,
                              int n_heads, int n_kv_heads, int head_dim, int rot_dim,
                              const float *inv_freq, const float *q_norm, const float *k_norm,
                              float eps) {
    kcu_prof_begin(kcu_st(be));
    kcu_qk_norm_rope(be, q, k, pos, n, n_heads, n_kv_heads, head_dim, rot_dim, inv_freq, q_norm,
                     k_norm, eps);
    kcu_prof_end(kcu_st(be), "qk_norm_rope");
}
static void prof_embed(kiln_backend *be, float *out, const int32_t *ids, int64_t n,
                       const kiln_matrix *w) {
    kcu_prof_begin(kcu_st(be));
    kcu_embed(be, out, ids, n, w);
    kcu_prof_end(kcu_st(be), "embed");
}

static int g_graph_mode = -1;               /* kiln_cuda_set_graph_mode */
static long long g_graph_replays_total = 0; /* kiln_cuda_graph_replays */

extern "C" void kiln_cuda_set_graph_mode(int mode) {
    g_graph_mode = mode;
}

static int g_pdl_mode = -1; /* kiln_cuda_set_pdl_mode */
extern "C" void kiln_cuda_set_pdl_mode(int mode) {
    g_pdl_mode = mode;
}

extern "C" long long kiln_cuda_graph_replays(void) {
    return __atomic_load_n(&g_graph_replays_total, __ATOMIC_RELAXED);
}

static bool cu_graph_begin(kiln_backend *be, uint64_t key) {
    kcu_state *st = kcu_st(be);
    if (!st->graph_on || st->capturing || st->sticky != KILN_OK) return false;
    if (key) {
        /* scratch that moved since a graph was recorded makes its pointers stale */
        key = kiln_hash_mix(key, (uint64_t)st->scratch_epoch);
        for (int i = 0; i < KCU_GRAPH_SLOTS; i++) {
            if (st->graphs[i].exec && st->graphs[i].key == key) {
                if (!KCU_CHECK(st, cudaGraphLaunch(st->graphs[i].exec, st->stream))) return false;
                st->graphs[i].last_use = ++st->graph_clock;
                st->graph_launches++;
                st->graph_replays++;
                __atomic_fetch_add(&g_graph_replays_total, 1, __ATOMIC_RELAXED);
                return true;
            }
        }
    }
    if (cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError(); /* capture unavailable: run eagerly */
        return false;
    }
    st->capturing = true;
    st->capture_complete = false;
    st->capture_key = key;
    return false;
}

static void cu_graph_end(kiln_backend *be) {
    kcu_state *st = kcu_st(be);
    if (st->capturing) st->capture_complete = true;
    kcu_graph_flush(st);
}

int kiln_cuda_device_count(char *why, size_t why_len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why) snprintf(why, why_len, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return 0;
    }
    if (n == 0 && why) snprintf(why, why_len, "no CUDA device present");
    return n;
}

void *kiln_cuda_stream(kiln_backend *be) {
    return (void *)kcu_st(be)->stream;
}

static void cu_destroy(kiln_backend *be) {
    kcu_state *st = kcu_st(be);
    if (st) {
        kcu_graph_flush(st);
        if (st->stream) cudaStreamSynchronize(st->stream);
        graphs_clear(st);
        if (st->prof_on) prof_report(st);
        for (int i = 0; i < 2; i++)
            if (st->prof_ev[i]) cudaEventDestroy(st->prof_ev[i]);
        if (st->graph_launches)
            KILN_LOG_I("cuda: %lld decode steps ran as graphs (%lld replayed, %lld "
                       "instantiations, %lld ended early by a scratch growth)",
                       st->graph_launches, st->graph_replays, st->graph_instantiations,
                       st->graph_flushes_early);
        if (st->scratch) cudaFree(st->scratch);
        if (st->multi_out) cudaFree(st->multi_out);
        if (st->sample_args) cudaFree(st->sample_args);
        if (st->sample_probs) cudaFree(st->sample_probs);
        if (st->sample_counts) cudaFree(st->sample_counts);
        for (int i = 0; i < KCU_STAGE_SLOTS; i++) {
            if (st->stage[i]) cudaFreeHost(st->stage[i]);
            if (st->stage_ev[i]) cudaEventDestroy(st->stage_ev[i]);
        }
        if (st->cublas) cublasDestroy(st->cublas);
        if (st->cublas_workspace) cudaFree(st->cublas_workspace);
        if (st->attn_counters) cudaFree(st->attn_counters);
        kcu_qg_link_free(st);
        if (st->stream) cudaStreamDestroy(st->stream);
        free(st);
    }
    kiln_threadpool_free(be->pool);
    free(be);
}

static void *cu_alloc(kiln_backend *be, size_t bytes) {
    void *p = NULL;
    kcu_graph_flush(kcu_st(be));
    if (!KCU_CHECK(kcu_st(be), cudaMalloc(&p, bytes ? bytes : 256))) return NULL;
    return p;
}

static void cu_free(kiln_backend *be, void *p) {
    if (!p) return;
    kcu_graph_flush(kcu_st(be));
    KCU_CHECK(kcu_st(be), cudaFree(p)); /* cudaFree waits for work using p */
}

/* Copies are ordered on the backend stream. The host buffer may be reused as soon as upload()
 * returns: small uploads (the per-step token ids and positions) are copied into a pinned staging
 * slot and queued without waiting for the GPU; large ones (weights) wait for the copy. download()
 * returns once the data is in dst. */
static void *stage_slot(kcu_state *st) {
    int i = st->stage_next;
    if (!st->stage[i]) {
        if (!KCU_CHECK(st, cudaHostAlloc(&st->stage[i], KCU_STAGE_BYTES, cudaHostAllocDefault)) ||
            !KCU_CHECK(st, cudaEventCreateWithFlags(&st->stage_ev[i], cudaEventDisableTiming))) {
            if (st->stage[i]) cudaFreeHost(st->stage[i]);
            st->stage[i] = NULL;
            return NULL;
        }
    } else if (st->stage_used[i]) {
        /* the copy queued from this slot KCU_STAGE_SLOTS uploads ago has normally run long ago */
        KCU_CHECK(st, cudaEventSynchronize(st->stage_ev[i]));
    }
    return st->stage[i];
}

static void cu_upload(kiln_backend *be, void *dst, const void *src, size_t bytes) {
    kcu_state *st = kcu_st(be);
    if (!bytes) return;
    kcu_graph_flush(st);
    void *slot = bytes <= KCU_STAGE_BYTES ? stage_slot(st) : NULL;
    if (slot) {
        int i = st->stage_next;
        memcpy(slot, src, bytes);
        KCU_CHECK(st, cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, st->stream));
        KCU_CHECK(st, cudaEventRecord(st->stage_ev[i], st->stream));
        st->stage_used[i] = true;
        st->stage_next = (i + 1) % KCU_STAGE_SLOTS;
        return;
    }
    KCU_CHECK(st, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->stream));
    KCU_CHECK(st, cudaStreamSynchronize(st->stream));
}

static void cu_download(kiln_backend *be, void *dst, const void *src, size_t bytes) {
    kcu_state *st = kcu_st(be);
    if (!bytes) return;
    kcu_graph_flush(st);
    KCU_CHECK(st, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st->stream));
    KCU_CHECK(st, cudaStreamSynchronize(st->stream));
}

static void *cu_copy_up(kiln_backend *be, const void *src, size_t bytes) {
    void *p = cu_alloc(be, bytes);
    if (p) cu_upload(be, p, src, bytes);
    return p;
}

static void cu_free_matrix(kiln_backend *be, kiln_matrix *m) {
    cu_free(be, (void *)m->data);
    cu_free(be, (void *)m->scales);
    cu_free(be, (void *)m->biases);
    cu_free(be, (void *)m->bias);
    m->data = m->scales = m->biases = NULL;
    m->bias = NULL;
}

static kiln_status cu_upload_matrix(kiln_backend *be, const kiln_matrix *host, kiln_matrix *out) {
    kcu_state *st = kcu_st(be);
    *out = *host;
    out->data = out->scales = out->biases = NULL;
    out->bias = NULL;
    bool q = kiln_matrix_is_quantized(host);
    if (!q && host->dtype != KILN_DT_F32 && host->dtype != KILN_DT_F16 &&
        host->dtype != KILN_DT_BF16)
        return kiln_error(KILN_ERR_UNSUPPORTED, "cuda: matrix dtype %s",
                          kiln_dtype_name(host->dtype));
    if (q && (host->bits < 2 || host->bits > 8 || host->bits == 7 || host->group_size % 32 ||
              host->cols % host->group_size))
        return kiln_error(KILN_ERR_UNSUPPORTED, "cuda: quantized matrix bits=%d group=%d cols=%lld",
                          host->bits, host->group_size, (long long)host->cols);
    size_t data_bytes = q ? (size_t)(host->rows * kiln_matrix_row_code_bytes(host))
                          : (size_t)(host->rows * host->cols) * kiln_dtype_size(host->dtype);
    out->data = cu_copy_up(be, host->data, data_bytes);
    if (q) {
        size_t sb = (size_t)(host->rows * (host->cols / host->group_size)) *
                    kiln_dtype_size(host->scale_dtype);
        out->scales = cu_copy_up(be, host->scales, sb);
        out->biases = cu_copy_up(be, host->biases, sb);
    }
    if (host->bias) out->bias = (const float *)cu_copy_up(be, host->bias, (size_t)host->rows * 4);
    if (!out->data || (q && (!out->scales || !out->biases)) || (host->bias && !out->bias) ||
        st->sticky != KILN_OK) {
        cu_free_matrix(be, out);
        return kiln_error(KILN_ERR_OOM, "cuda: uploading a %lldx%lld matrix (%zu bytes): %s",
                          (long long)host->rows, (long long)host->cols, data_bytes, st->sticky_msg);
    }
    return KILN_OK;
}

/* q/k/v and gate/up uploaded as one allocation each (cu_upload_matrices), so that batched
 * decode and prefill multiply them as one matrix (kcu_matmul_multi); KILN_CUDA_FUSE_WEIGHTS=0
 * uploads them one by one. Default since the twenty-sixth session (H100, Llama-3-8B: bf16 batch
 * 64 decode +5% and prefill +5%, quantized prefill +3%, batch 1 and 8 level). */
static bool fuse_weights_on(void) {
    const char *e = getenv("KILN_CUDA_FUSE_WEIGHTS");
    return !(e && *e && atoi(e) == 0);
}

/* Consecutive row ranges of one allocation per part (codes or dense data, scales, biases,
 * output biases), each part's size a multiple of `align` bytes; else KILN_ERR_UNSUPPORTED (the
 * caller uploads them one by one). outs[0] owns the allocations, outs[1..] are views. */
static kiln_status upload_row_ranges(kiln_backend *be, int count, const kiln_matrix *hosts,
                                     kiln_matrix *outs, size_t align) {
    kcu_state *st = kcu_st(be);
    const kiln_matrix *h0 = &hosts[0];
    const bool q = kiln_matrix_is_quantized(h0);
    if (!q && h0->dtype != KILN_DT_F32 && h0->dtype != KILN_DT_F16 && h0->dtype != KILN_DT_BF16)
        return KILN_ERR_UNSUPPORTED;
    if (q && (h0->bits < 2 || h0->bits > 8 || h0->bits == 7 || h0->group_size % 32 ||
              h0->cols % h0->group_size))
        return KILN_ERR_UNSUPPORTED; /* upload_matrix says why */
    size_t *data = (size_t *)calloc(3 * (size_t)count, sizeof(size_t));
    if (!data) return kiln_error(KILN_ERR_OOM, "out of memory");
    size_t *sc = data + count, *bias = sc + count, data_all = 0, sc_all = 0, bias_all = 0;
    for (int i = 0; i < count; i++) {
        const kiln_matrix *h = &hosts[i];
        if (h->dtype != h0->dtype || h->cols != h0->cols || h->bits != h0->bits ||
            h->group_size != h0->group_size || h->scale_dtype != h0->scale_dtype ||
            (h->bias != NULL) != (h0->bias != NULL) || h->rows <= 0) {
            free(data);
            return KILN_ERR_UNSUPPORTED;
        }
        data[i] = q ? (size_t)(h->rows * kiln_matrix_row_code_bytes(h))
                    : (size_t)(h->rows * h->cols) * kiln_dtype_size(h->dtype);
        sc[i] =
            q ? (size_t)(h->rows * (h->cols / h->group_size)) * kiln_dtype_size(h->scale_dtype) : 0;
        bias[i] = h->bias ? (size_t)h->rows * 4 : 0;
        if (data[i] % align || sc[i] % align || bias[i] % align) {
            free(data);
            return KILN_ERR_UNSUPPORTED;
        }
        data_all += data[i], sc_all += sc[i], bias_all += bias[i];
    }
    kiln_matrix all = *h0;
    all.data = all.scales = all.biases = NULL;
    all.bias = NULL;
    all.view = false;
    all.data = cu_alloc(be, data_all);
    if (q) all.scales = cu_alloc(be, sc_all), all.biases = cu_alloc(be, sc_all);
    if (bias_all) all.bias = (const float *)cu_alloc(be, bias_all);
    if (!all.data || (q && (!all.scales || !all.biases)) || (bias_all && !all.bias)) {
        cu_free_matrix(be, &all);
        free(data);
        return kiln_error(KILN_ERR_OOM, "cuda: uploading %d matrices (%zu bytes): %s", count,
                          data_all, st->sticky_msg);
    }
    size_t od = 0, os = 0, ob = 0;
    for (int i = 0; i < count; i++) {
        const kiln_matrix *h = &hosts[i];
        outs[i] = *h;
        outs[i].data = (const char *)all.data + od;
        cu_upload(be, (void *)outs[i].data, h->data, data[i]);
        outs[i].scales = outs[i].biases = NULL;
        if (q) {
            outs[i].scales = (const char *)all.scales + os;
            outs[i].biases = (const char *)all.biases + os;
            cu_upload(be, (void *)outs[i].scales, h->scales, sc[i]);
            cu_upload(be, (void *)outs[i].biases, h->biases, sc[i]);
        }
        outs[i].bias = NULL;
        if (h->bias) {
            outs[i].bias = (const float *)((const char *)all.bias + ob);
            cu_upload(be, (void *)outs[i].bias, h->bias, bias[i]);
        }
        outs[i].view = i > 0; /* outs[0] owns the allocations (its pointers are their starts) */
        od += data[i], os += sc[i], ob += bias[i];
    }
    free(data);
    if (st->sticky != KILN_OK) {
        cu_free_matrix(be, &all);
        for (int i = 0; i < count; i++) memset(&outs[i], 0, sizeof outs[i]);
        return kiln_error(KILN_ERR_DEVICE, "cuda: uploading %d matrices: %s", count,
                          st->sticky_msg);
    }
    return KILN_OK;
}

/* Each part a multiple of 256 bytes, so that every slice keeps the allocation's alignment. */
static kiln_status cu_upload_matrices(kiln_backend *be, int count, const kiln_matrix *hosts,
                                      kiln_matrix *outs) {
    if (!fuse_weights_on() || count < 2 || count > 8) return KILN_ERR_UNSUPPORTED;
    return upload_row_ranges(be, count, hosts, outs, 256);
}

/* Experts of one shape back to back: the slices of whole rows keep the alignment the GEMV
 * kernels need wherever a row does (moe.cu checks the stack's start). */
static kiln_status cu_upload_stack(kiln_backend *be, int count, const kiln_matrix *hosts,
                                   kiln_matrix *out) {
    memset(out, 0, sizeof *out);
    if (count < 1) return KILN_ERR_UNSUPPORTED;
    for (int i = 1; i < count; i++)
        if (hosts[i].rows != hosts[0].rows) return KILN_ERR_UNSUPPORTED;
    kiln_matrix *outs = (kiln_matrix *)calloc((size_t)count, sizeof *outs);
    if (!outs) return kiln_error(KILN_ERR_OOM, "out of memory");
    kiln_status s = upload_row_ranges(be, count, hosts, outs, 1);
    if (s == KILN_OK) {
        *out = outs[0];
        out->rows = hosts[0].rows * count;
    }
    free(outs);
    return s;
}

static kiln_status cu_synchronize(kiln_backend *be) {
    kcu_state *st = kcu_st(be);
    kcu_graph_flush(st);
    KCU_CHECK(st, cudaStreamSynchronize(st->stream));
    if (st->sticky != KILN_OK) return kiln_error(st->sticky, "cuda: %s", st->sticky_msg);
    return KILN_OK;
}

kiln_status kiln_backend_cuda_new(int n_threads, kiln_backend **out) {
    *out = NULL;
    char why[200];
    if (kiln_cuda_device_count(why, sizeof why) == 0)
        return kiln_error(KILN_ERR_DEVICE, "--device cuda: %s", why);
    kiln_backend *be = (kiln_backend *)calloc(1, sizeof *be);
    kcu_state *st = (kcu_state *)calloc(1, sizeof *st);
    if (!be || !st) {
        free(be);
        free(st);
        return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    be->impl = st;
    kiln_status s = kiln_threadpool_new(n_threads, &be->pool);
    if (s != KILN_OK) {
        free(st);
        free(be);
        return s;
    }
    cudaDeviceProp prop;
    bool ok = KCU_CHECK(st, cudaGetDevice(&st->device)) &&
              KCU_CHECK(st, cudaGetDeviceProperties(&prop, st->device)) &&
              KCU_CHECK(st, cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking)) &&
              KCU_CUBLAS(st, cublasCreate(&st->cublas)) &&
              KCU_CUBLAS(st, cublasSetStream(st->cublas, st->stream)) &&
              KCU_CHECK(st, cudaMalloc(&st->cublas_workspace, KCU_CUBLAS_WORKSPACE)) &&
              KCU_CUBLAS(
                  st, cublasSetWorkspace(st->cublas, st->cublas_workspace, KCU_CUBLAS_WORKSPACE)) &&
              KCU_CHECK(st, cudaMalloc(&st->attn_counters, KCU_ATT_COUNTERS * sizeof(unsigned))) &&
              KCU_CHECK(st, cudaMemsetAsync(st->attn_counters, 0,
                                            KCU_ATT_COUNTERS * sizeof(unsigned), st->stream));
    if (!ok) {
        kiln_status e = kiln_error(KILN_ERR_DEVICE, "cuda: %s", st->sticky_msg);
        cu_destroy(be);
        return e;
    }
    st->n_sms = prop.multiProcessorCount;
    st->sm90 = prop.major == 9;
    const char *ge = getenv("KILN_CUDA_GRAPH");
    /* on by default: a decode step is recorded once per key and replayed (KILN_CUDA_GRAPH=0
     * launches every op instead; docs/gpu.md has the measurements) */
    st->graph_on = g_graph_mode >= 0 ? g_graph_mode == 1 : !(ge && strcmp(ge, "0") == 0);
    const char *pe = getenv("KILN_CUDA_PROFILE");
    st->prof_on = pe && strcmp(pe, "1") == 0 && cudaEventCreate(&st->prof_ev[0]) == cudaSuccess &&
                  cudaEventCreate(&st->prof_ev[1]) == cudaSuccess;
    if (st->prof_on) st->graph_on = false;
    /* programmatic dependent launches: only where the sm_90a code runs (the kernels' waits are
     * compiled there; the PTX fallback has none) */
    const char *pd = getenv("KILN_CUDA_PDL");
    st->pdl_on =
        prop.major == 9 && (g_pdl_mode >= 0 ? g_pdl_mode == 1 : !(pd && strcmp(pd, "0") == 0));
    KILN_LOG_I("cuda: %s, %d SMs, %.1f GiB, graphs %s, PDL %s", prop.name, st->n_sms,
               prop.totalGlobalMem / 1073741824.0, st->graph_on ? "on" : "off",
               st->pdl_on ? "on" : "off");
    be->name = "cuda";
    be->device = KILN_DEVICE_CUDA;
    be->destroy = cu_destroy;
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->upload = cu_upload;
    be->download = cu_download;
    be->upload_matrix = cu_upload_matrix;
    be->upload_matrices = cu_upload_matrices;
    be->upload_stack = cu_upload_stack;
    be->free_matrix = cu_free_matrix;
    be->synchronize = cu_synchronize;
    be->graph_begin = cu_graph_begin;
    be->graph_end = cu_graph_end;
    be->matmul = kcu_matmul;
    be->embed = kcu_embed;
    be->rmsnorm = kcu_rmsnorm;
    be->rope = kcu_rope;
    be->silu_mul = kcu_silu_mul;
    be->gelu_tanh_mul = kcu_gelu_tanh_mul;
    be->add = kcu_add;
    be->scale = kcu_scale;
    be->softcap = kcu_softcap;
    be->matmul_multi = kcu_matmul_multi;
    be->add_rmsnorm = kcu_add_rmsnorm;
    be->norm_add = kcu_norm_add;
    be->matmul_norm = kcu_matmul_norm;
    be->matmul_add = kcu_matmul_add;
    be->matmul_norm_glu = kcu_matmul_norm_glu;
    be->prefetch = kcu_prefetch;
    be->feeds_next = kcu_feeds_next;
    be->qk_norm_rope = kcu_qk_norm_rope;
    be->copy2d = kcu_copy2d;
    be->copy3d = kcu_copy3d;
    be->zero = kcu_zero;
    be->sigmoid_mul = kcu_sigmoid_mul;
    be->sample = kcu_sample;
    be->l2norm = kcu_l2norm;
    be->gdn_split_qkv = kcu_gdn_split_qkv;
    be->gated_rmsnorm = kcu_gated_rmsnorm;
    be->gdn_conv = kcu_gdn_conv;
    be->gdn_gates = kcu_gdn_gates;
    be->gdn_delta = kcu_gdn_delta;
    be->gather_rows = kcu_gather_rows;
    be->scatter_add_rows = kcu_scatter_add_rows;
    be->moe_route = kcu_moe_route;
    be->matmul_gather = kcu_matmul_gather;
    be->matmul_gather_glu = kcu_matmul_gather_glu;
    be->moe_combine = kcu_moe_combine;
    be->moe_device_max_tokens = 64;
    be->moe_gather_grouped = kcu_moe_gather_grouped;
    be->kv_new = kcu_kv_new;
    /* paged caches in device memory for every --kv kind but the default f32 (kv_paged.cu);
     * KILN_CUDA_PAGED=0 goes back to contiguous f32/f16/bf16 caches only */
    const char *pg = getenv("KILN_CUDA_PAGED");
    be->kv_paged_ops = pg && strcmp(pg, "0") == 0 ? NULL : &kcu_kv_paged_ops;
    if (st->prof_on) {
        be->matmul = prof_matmul;
        be->rmsnorm = prof_rmsnorm;
        be->rope = prof_rope;
        be->silu_mul = prof_silu_mul;
        be->add = prof_add;
        be->embed = prof_embed;
        be->matmul_multi = prof_matmul_multi;
        be->add_rmsnorm = prof_add_rmsnorm;
        be->norm_add = prof_norm_add;
        be->qk_norm_rope = prof_qk_norm_rope;
        be->matmul_norm = prof_matmul_norm;
        be->matmul_add = prof_matmul_add;
        be->matmul_norm_glu = prof_matmul_norm_glu;
    }
    *out = be;
    return KILN_OK;
}
