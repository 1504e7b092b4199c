/* kv_contiguous.c — the simplest cache kind: per layer, f32 K and V rows for every position of
 * the sequence in one growing buffer ([capacity, n_kv_heads*head_dim]). Capacity doubles up to
 * the model's context limit; reserve() fails with KILN_ERR_CACHE_FULL beyond it. */
#include "kv/kv_cache.h"

#include "util/huge_alloc.h"
#include "util/status.h"

#include <stdlib.h>
#include <string.h>

typedef struct contiguous_layer {
    float *k;         /* [capacity, n_kv_heads*head_dim] */
    float *v;         /* [capacity, n_kv_heads*v_head_dim] */
    float *state;     /* [state_floats] for recurrent layers */
    int k_cap, v_cap; /* positions k and v have room for (equal, unless a grow failed midway) */
} contiguous_layer;

typedef struct kv_contiguous {
    kiln_kv base;
    int capacity;
    int max_tokens;
    contiguous_layer *layer; /* [n_layers] */
} kv_contiguous;

static int64_t k_width(const kiln_kv_layer_desc *d) {
    return (int64_t)d->n_kv_heads * d->head_dim;
}
static int64_t v_width(const kiln_kv_layer_desc *d) {
    return (int64_t)d->n_kv_heads * d->v_head_dim;
}

static size_t rows_bytes(int64_t rows, int64_t width) {
    return (size_t)(rows * width) * sizeof(float);
}

/* A layer's K or V rows moved to room for new_cap positions (huge-page backed when large: a
 * head's rows are read a few hundred bytes every few kilobytes, a TLB miss per row on small
 * pages); the old buffer is freed on success. */
static float *grow_rows(float *old, int64_t old_cap, int64_t new_cap, int64_t width) {
    float *p = kiln_huge_alloc(rows_bytes(new_cap, width));
    if (!p) return NULL;
    if (old) {
        memcpy(p, old, rows_bytes(old_cap, width));
        kiln_huge_free(old, rows_bytes(old_cap, width));
    }
    return p;
}

static void contiguous_free(kiln_kv *kv) {
    kv_contiguous *c = (kv_contiguous *)kv;
    if (!c) return;
    for (int l = 0; l < kv->n_layers; l++) {
        const kiln_kv_layer_desc *d = &kv->layers[l];
        kiln_huge_free(c->layer[l].k, rows_bytes(c->layer[l].k_cap, k_width(d)));
        kiln_huge_free(c->layer[l].v, rows_bytes(c->layer[l].v_cap, v_width(d)));
        free(c->layer[l].state);
    }
    free(c->layer);
    free(kv->layers);
    free(c);
}

static kiln_status contiguous_reserve(kiln_kv *kv, int n_new) {
    kv_contiguous *c = (kv_contiguous *)kv;
    if (n_new < 0) return kiln_error(KILN_ERR_INVALID_ARG, "kv: negative token count");
    int64_t need = (int64_t)kv->len + n_new;
    if (need > c->max_tokens)
        return kiln_error(KILN_ERR_CACHE_FULL,
                          "KV cache full: %d tokens held + %d new exceeds the context limit of %d",
                          kv->len, n_new, c->max_tokens);
    if (need <= c->capacity) return KILN_OK;
    int64_t cap = c->capacity ? c->capacity : 64;
    while (cap < need) cap *= 2;
    if (cap > c->max_tokens) cap = c->max_tokens;
    for (int l = 0; l < kv->n_layers; l++) {
        const kiln_kv_layer_desc *d = &kv->layers[l];
        if (!d->is_attention) continue;
        contiguous_layer *L = &c->layer[l];
        float *k = L->k_cap >= cap ? L->k : grow_rows(L->k, L->k_cap, cap, k_width(d));
        if (!k)
            return kiln_error(KILN_ERR_OOM, "KV cache: out of memory for %lld tokens",
                              (long long)cap);
        if (k != L->k) L->k = k, L->k_cap = (int)cap;
        float *v = L->v_cap >= cap ? L->v : grow_rows(L->v, L->v_cap, cap, v_width(d));
        if (!v)
            return kiln_error(KILN_ERR_OOM, "KV cache: out of memory for %lld tokens",
                              (long long)cap);
        if (v != L->v) L->v = v, L->v_cap = (int)cap;
    }
    c->capacity = (int)cap;
    return KILN_OK;
}

static void contiguous_store(kiln_kv *kv, int layer, const float *k, const float *v, int n) {
    kv_contiguous *c = (kv_contiguous *)kv;
    const kiln_kv_layer_desc *d = &kv->layers[layer];
    memcpy(c->layer[layer].k + (int64_t)kv->len * k_width(d), k,
           (size_t)(n * k_width(d)) * sizeof(float));
    memcpy(c->layer[layer].v + (int64_t)kv->len * v_width(d), v,
           (size_t)(n * v_width(d)) * sizeof(float));
}

static void contiguous_attend(kiln_kv *kv, int layer, const float *q, int n, float *out,
                              const kiln_attn_params *p, kiln_threadpool *pool) {
    kv_contiguous *c = (kv_contiguous *)kv;
    const kiln_kv_layer_desc *d = &kv->layers[layer];
    kiln_attention_contiguous(q, n, kv->len, c->layer[layer].k, c->layer[layer].v, kv->len + n, 0,
                              d->n_kv_heads, d->head_dim, d->v_head_dim, d->window, out, p, pool);
}

static void contiguous_commit(kiln_kv *kv, int n) {
    kv->len += n;
}

static kiln_status contiguous_truncate(kiln_kv *kv, int len) {
    kv_contiguous *c = (kv_contiguous *)kv;
    if (len < 0 || len > kv->len)
        return kiln_error(KILN_ERR_INVALID_ARG, "kv: cannot truncate %d tokens to %d", kv->len,
                          len);
    bool has_state = false;
    for (int l = 0; l < kv->n_layers; l++) has_state |= c->layer[l].state != NULL;
    if (has_state && len != 0 && len != kv->len)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "kv: a recurrent state cannot be rolled back to "
                          "%d of %d tokens (only to 0)",
                          len, kv->len);
    if (len == 0)
        for (int l = 0; l < kv->n_layers; l++)
            if (c->layer[l].state)
                memset(c->layer[l].state, 0, (size_t)kv->layers[l].state_floats * sizeof(float));
    kv->len = len;
    return KILN_OK;
}

static float *contiguous_layer_state(kiln_kv *kv, int layer) {
    return ((kv_contiguous *)kv)->layer[layer].state;
}

static int64_t contiguous_bytes(const kiln_kv *kv) {
    const kv_contiguous *c = (const kv_contiguous *)kv;
    int64_t b = 0;
    for (int l = 0; l < kv->n_layers; l++)
        if (kv->layers[l].is_attention)
            b += (int64_t)c->capacity * (k_width(&kv->layers[l]) + v_width(&kv->layers[l])) * 4;
        else
            b += kv->layers[l].state_floats * 4;
    return b;
}

static const kiln_kv_vtable contiguous_vt = {
    .kind = "contiguous-f32",
    .free = contiguous_free,
    .reserve = contiguous_reserve,
    .store = contiguous_store,
    .attend = contiguous_attend,
    .commit = contiguous_commit,
    .truncate = contiguous_truncate,
    .bytes_used = contiguous_bytes,
    .layer_state = contiguous_layer_state,
};

kiln_status kiln_kv_contiguous_new(const kiln_kv_layer_desc *layers, int n_layers, int max_tokens,
                                   kiln_kv **out) {
    *out = NULL;
    kv_contiguous *c = calloc(1, sizeof *c);
    if (!c) return kiln_error(KILN_ERR_OOM, "out of memory");
    c->base.vt = &contiguous_vt;
    c->base.n_layers = n_layers;
    c->max_tokens = max_tokens;
    c->base.layers = malloc((size_t)n_layers * sizeof *layers);
    c->layer = calloc((size_t)n_layers, sizeof *c->layer);
    if (!c->base.layers || !c->layer) {
        contiguous_free(&c->base);
        return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    memcpy(c->base.layers, layers, (size_t)n_layers * sizeof *layers);
    for (int l = 0; l < n_layers; l++) {
        if (layers[l].state_floats <= 0) continue;
        c->layer[l].state = calloc((size_t)layers[l].state_floats, sizeof(float));
        if (!c->layer[l].state) {
            contiguous_free(&c->base);
            return kiln_error(KILN_ERR_OOM, "out of memory for recurrent state");
        }
    }
    *out = &c->base;
    return KILN_OK;
}
