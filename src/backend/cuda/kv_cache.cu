/* kv_cache.cu — the device KV cache: contiguous per sequence, one K and one V buffer per
 * attention layer ([capacity, n_kv_heads*head_dim]), f32, f16 or bf16 storage, grown by doubling
 * up to max_tokens. Sliding-window layers keep every token (attention limits the window); a ring
 * buffer would save memory there. attend() runs attention.cu's kernel on the buffers in place. */
#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_ops.h"

#include <stdlib.h>
#include <string.h>

typedef struct kcu_kv {
    kiln_kv base;
    kiln_backend *be;
    int dtype; /* KILN_DT_F32 / F16 / BF16 */
    int max_tokens, cap;
    void **k, **v; /* [n_layers] device buffers (NULL for non-attention layers) */
} kcu_kv;

static size_t elem_size(int dt) {
    return dt == KILN_DT_F32 ? 4 : 2;
}

__global__ void k_kv_store(void *dst, const float *src, int64_t n, int dt) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float x = src[i];
        if (dt == KILN_DT_F32)
            ((float *)dst)[i] = x;
        else if (dt == KILN_DT_F16)
            ((__half *)dst)[i] = __float2half_rn(x);
        else
            ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(x);
    }
}

static void kv_free(kiln_kv *base) {
    kcu_kv *kv = (kcu_kv *)base;
    if (!kv) return;
    for (int l = 0; l < base->n_layers; l++) {
        if (kv->k && kv->k[l]) kv->be->free(kv->be, kv->k[l]);
        if (kv->v && kv->v[l]) kv->be->free(kv->be, kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(base->layers);
    free(kv);
}

static kiln_status kv_reserve(kiln_kv *base, int n_new) {
    kcu_kv *kv = (kcu_kv *)base;
    kcu_state *st = kcu_st(kv->be);
    int need = base->len + n_new;
    if (n_new < 0 || need > kv->max_tokens)
        return kiln_error(KILN_ERR_CACHE_FULL, "cuda kv: %d + %d tokens exceed the cache's %d",
                          base->len, n_new, kv->max_tokens);
    if (need <= kv->cap) return KILN_OK;
    int cap = kv->cap ? kv->cap : 256;
    while (cap < need) cap *= 2;
    if (cap > kv->max_tokens) cap = kv->max_tokens;
    size_t es = elem_size(kv->dtype);
    /* allocate every new buffer first so a failure leaves the cache unchanged */
    void **nk = (void **)calloc((size_t)base->n_layers, sizeof(void *));
    void **nv = (void **)calloc((size_t)base->n_layers, sizeof(void *));
    kiln_status before = st->sticky;
    bool ok = nk && nv;
    for (int l = 0; ok && l < base->n_layers; l++) {
        const kiln_kv_layer_desc *d = &base->layers[l];
        if (!d->is_attention) continue;
        ok = KCU_CHECK(st, cudaMalloc(&nk[l], (size_t)cap * d->n_kv_heads * d->head_dim * es)) &&
             KCU_CHECK(st, cudaMalloc(&nv[l], (size_t)cap * d->n_kv_heads * d->v_head_dim * es));
    }
    if (!ok) {
        for (int l = 0; nk && nv && l < base->n_layers; l++) cudaFree(nk[l]), cudaFree(nv[l]);
        free(nk);
        free(nv);
        st->sticky = before; /* an OOM here is reported as CACHE_FULL, not a device failure */
        return kiln_error(KILN_ERR_CACHE_FULL, "cuda kv: no device memory for %d tokens", cap);
    }
    for (int l = 0; l < base->n_layers; l++) {
        const kiln_kv_layer_desc *d = &base->layers[l];
        if (!d->is_attention) continue;
        size_t kb = (size_t)base->len * d->n_kv_heads * d->head_dim * es;
        size_t vb = (size_t)base->len * d->n_kv_heads * d->v_head_dim * es;
        if (kb)
            KCU_CHECK(st,
                      cudaMemcpyAsync(nk[l], kv->k[l], kb, cudaMemcpyDeviceToDevice, st->stream));
        if (vb)
            KCU_CHECK(st,
                      cudaMemcpyAsync(nv[l], kv->v[l], vb, cudaMemcpyDeviceToDevice, st->stream));
        if (kv->k[l]) kv->be->free(kv->be, kv->k[l]);
        if (kv->v[l]) kv->be->free(kv->be, kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    kv->k = nk;
    kv->v = nv;
    kv->cap = cap;
    return KILN_OK;
}

static void kv_store(kiln_kv *base, int layer, const float *k, const float *v, int n) {
    kcu_kv *kv = (kcu_kv *)base;
    kcu_state *st = kcu_st(kv->be);
    const kiln_kv_layer_desc *d = &base->layers[layer];
    if (n <= 0 || !d->is_attention) return;
    if (base->len + n > kv->cap) {
        kcu_report(st, "kv store", "store() past reserve()", __FILE__, __LINE__);
        return;
    }
    size_t es = elem_size(kv->dtype);
    int64_t kw = (int64_t)d->n_kv_heads * d->head_dim, vw = (int64_t)d->n_kv_heads * d->v_head_dim;
    char *kd = (char *)kv->k[layer] + (size_t)base->len * kw * es;
    char *vd = (char *)kv->v[layer] + (size_t)base->len * vw * es;
    k_kv_store<<<kcu_blocks(n * kw, 256, 4096), 256, 0, st->stream>>>(kd, k, n * kw, kv->dtype);
    KCU_LAUNCHED(st);
    k_kv_store<<<kcu_blocks(n * vw, 256, 4096), 256, 0, st->stream>>>(vd, v, n * vw, kv->dtype);
    KCU_LAUNCHED(st);
}

static void kv_attend(kiln_kv *base, int layer, const float *q, int n, float *out,
                      const kiln_attn_params *p, kiln_threadpool *pool) {
    kcu_kv *kv = (kcu_kv *)base;
    const kiln_kv_layer_desc *d = &base->layers[layer];
    kcu_attn_args a;
    a.q = q;
    a.out = out;
    a.n = n;
    a.pos0 = base->len;
    a.k = kv->k[layer];
    a.v = kv->v[layer];
    a.kv_dtype = kv->dtype;
    a.n_kv_heads = d->n_kv_heads;
    a.head_dim = d->head_dim;
    a.v_head_dim = d->v_head_dim;
    a.window = d->window;
    a.p = *p;
    kcu_attention(kcu_st(kv->be), &a);
}

static void kv_commit(kiln_kv *base, int n) {
    base->len += n;
}

static kiln_status kv_truncate(kiln_kv *base, int len) {
    if (len < 0 || len > base->len)
        return kiln_error(KILN_ERR_INVALID_ARG, "cuda kv: truncate to %d of %d tokens", len,
                          base->len);
    base->len = len;
    return KILN_OK;
}

static int64_t kv_bytes_used(const kiln_kv *base) {
    const kcu_kv *kv = (const kcu_kv *)base;
    int64_t per_tok = 0;
    for (int l = 0; l < base->n_layers; l++) {
        const kiln_kv_layer_desc *d = &base->layers[l];
        if (d->is_attention)
            per_tok += (int64_t)d->n_kv_heads * (d->head_dim + d->v_head_dim) *
                       (int64_t)elem_size(kv->dtype);
    }
    return per_tok * kv->cap;
}

static const kiln_kv_vtable kcu_kv_vt = {
    "cuda-contiguous", kv_free,   kv_reserve,  kv_store,
    kv_attend,         kv_commit, kv_truncate, kv_bytes_used,
};

extern "C" kiln_status kcu_kv_new(kiln_backend *be, const kiln_kv_layer_desc *layers, int n_layers,
                                  const kiln_kv_options *opts, int max_tokens, kiln_kv **out) {
    *out = NULL;
    const char *kind = opts && opts->kind[0] ? opts->kind : "f32";
    int dt;
    if (!strcmp(kind, "f32"))
        dt = KILN_DT_F32;
    else if (!strcmp(kind, "f16"))
        dt = KILN_DT_F16;
    else if (!strcmp(kind, "bf16"))
        dt = KILN_DT_BF16;
    else
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "--kv %s: the CUDA backend has f32, f16 and bf16 caches", kind);
    if (opts && opts->paged)
        return kiln_error(KILN_ERR_UNSUPPORTED, "cuda kv: paged caches are not implemented yet");
    if (n_layers <= 0 || max_tokens <= 0)
        return kiln_error(KILN_ERR_INVALID_ARG, "cuda kv: %d layers, %d tokens", n_layers,
                          max_tokens);
    kcu_kv *kv = (kcu_kv *)calloc(1, sizeof *kv);
    if (!kv) return kiln_error(KILN_ERR_OOM, "out of memory");
    kv->base.vt = &kcu_kv_vt;
    kv->base.n_layers = n_layers;
    kv->base.layers = (kiln_kv_layer_desc *)malloc(sizeof(kiln_kv_layer_desc) * (size_t)n_layers);
    kv->k = (void **)calloc((size_t)n_layers, sizeof(void *));
    kv->v = (void **)calloc((size_t)n_layers, sizeof(void *));
    kv->be = be;
    kv->dtype = dt;
    kv->max_tokens = max_tokens;
    if (!kv->base.layers || !kv->k || !kv->v) {
        kv_free(&kv->base);
        return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    memcpy(kv->base.layers, layers, sizeof(kiln_kv_layer_desc) * (size_t)n_layers);
    for (int l = 0; l < n_layers; l++) {
        const kiln_kv_layer_desc *d = &layers[l];
        if (d->is_attention && (d->v_head_dim > 512 || d->n_kv_heads <= 0 || d->head_dim <= 0)) {
            kv_free(&kv->base);
            return kiln_error(KILN_ERR_UNSUPPORTED, "cuda kv: layer %d head_dim %d/%d", l,
                              d->head_dim, d->v_head_dim);
        }
    }
    *out = &kv->base;
    return KILN_OK;
}
