/* cuda_backend.cu — the CUDA backend's table: device selection, the stream and cuBLAS handle,
 * memory and copies, weights uploaded in their stored format, the scratch buffer and the sticky
 * error that synchronize() reports. The kernels live one family per file beside this one. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

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

void *kcu_scratch(kcu_state *st, size_t bytes) {
    if (bytes <= st->scratch_bytes) return st->scratch;
    size_t want = bytes + bytes / 4 + (1 << 20);
    if (st->scratch) {
        KCU_CHECK(st, cudaStreamSynchronize(st->stream)); /* in-flight ops may still read it */
        KCU_CHECK(st, cudaFree(st->scratch));
        st->scratch = NULL;
        st->scratch_bytes = 0;
    }
    if (!KCU_CHECK(st, cudaMalloc(&st->scratch, want))) return NULL;
    st->scratch_bytes = want;
    return st->scratch;
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
        if (st->stream) cudaStreamSynchronize(st->stream);
        if (st->scratch) cudaFree(st->scratch);
        for (int i = 0; i < KCU_STAGE_SLOTS; i++) {
            if (st->stage[i]) cudaFreeHost(st->stage[i]);
            if (st->stage_ev[i]) cudaEventDestroy(st->stage_ev[i]);
        }
        if (st->cublas) cublasDestroy(st->cublas);
        if (st->stream) cudaStreamDestroy(st->stream);
        free(st);
    }
    kiln_threadpool_free(be->pool);
    free(be);
}

static void *cu_alloc(kiln_backend *be, size_t bytes) {
    void *p = NULL;
    if (!KCU_CHECK(kcu_st(be), cudaMalloc(&p, bytes ? bytes : 256))) return NULL;
    return p;
}

static void cu_free(kiln_backend *be, void *p) {
    if (!p) return;
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

static kiln_status cu_synchronize(kiln_backend *be) {
    kcu_state *st = kcu_st(be);
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
              KCU_CUBLAS(st, cublasSetStream(st->cublas, st->stream));
    if (!ok) {
        kiln_status e = kiln_error(KILN_ERR_DEVICE, "cuda: %s", st->sticky_msg);
        cu_destroy(be);
        return e;
    }
    st->n_sms = prop.multiProcessorCount;
    KILN_LOG_I("cuda: %s, %d SMs, %.1f GiB", prop.name, st->n_sms,
               prop.totalGlobalMem / 1073741824.0);
    be->name = "cuda";
    be->device = KILN_DEVICE_CUDA;
    be->destroy = cu_destroy;
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->upload = cu_upload;
    be->download = cu_download;
    be->upload_matrix = cu_upload_matrix;
    be->free_matrix = cu_free_matrix;
    be->synchronize = cu_synchronize;
    be->matmul = kcu_matmul;
    be->embed = kcu_embed;
    be->rmsnorm = kcu_rmsnorm;
    be->rope = kcu_rope;
    be->silu_mul = kcu_silu_mul;
    be->gelu_tanh_mul = kcu_gelu_tanh_mul;
    be->add = kcu_add;
    be->kv_new = kcu_kv_new;
    *out = be;
    return KILN_OK;
}
