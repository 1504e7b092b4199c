/* kv_cache.h — the interface every KV cache kind implements (contiguous, sliding, paged,
 * quantized, TurboQuant, recurrent state). A cache belongs to one sequence and covers every layer
 * of the model; each layer may be a different kind of storage. The cache owns the attention read:
 * `attend` runs the attention of new queries against what the cache holds, so a quantized or paged
 * cache is read in place (no gather into a contiguous copy).
 *
 * Protocol for one forward step that adds n tokens at positions len..len+n-1:
 *   reserve(n)  -> may fail with KILN_ERR_CACHE_FULL (nothing changed)
 *   for each attention layer: store(layer, k, v, n); attend(layer, q, n, out)
 *   commit(n)   -> len += n
 */
#ifndef KILN_KV_CACHE_H
#define KILN_KV_CACHE_H

#include "kiln.h"
#include "util/threadpool.h"

typedef struct kiln_kv kiln_kv;

/* Geometry of one attention layer. */
typedef struct kiln_kv_layer_desc {
    int n_kv_heads;
    int head_dim;         /* of keys */
    int v_head_dim;       /* of values (usually == head_dim) */
    int window;           /* sliding window in tokens (0 = full attention) */
    bool is_attention;    /* false: the layer keeps no KV (recurrent / shared) */
    int64_t state_floats; /* fixed per-sequence state of a non-attention layer (f32 count) */
} kiln_kv_layer_desc;

typedef struct kiln_attn_params {
    int n_heads;   /* query heads; GQA group = n_heads / n_kv_heads */
    float scale;   /* applied to q.k */
    float softcap; /* attention logit soft-capping (0 = off) */
    /* Optional: [T] positions of the stacked tokens in the cache's memory (the backend's). A
     * device cache given them reads each sequence's position from there instead of from its
     * host-side length, so a recorded decode step can be replayed at later positions. */
    const int32_t *positions;
    /* Optional (only for caches whose vtable sets prep_inside): q and k arrive as the matmuls
     * left them and the cache applies the per-head RMSNorm and RoPE of the qk_norm_rope op
     * itself, reading positions from `positions`, before storing k and attending with q. q and k
     * may be left raw or overwritten. A device cache fuses this with its store and attention. */
    const struct kiln_qk_prep *prep;
} kiln_attn_params;

/* The qk_norm_rope op's arguments (backend.h) for kiln_attn_params.prep. */
typedef struct kiln_qk_prep {
    const float *q_norm, *k_norm; /* [head_dim] each, or NULL: no norm */
    const float *inv_freq;        /* [rot_dim / 2] */
    int rot_dim;                  /* even, <= head_dim */
    float eps;
} kiln_qk_prep;

typedef struct kiln_kv_vtable {
    const char *kind;
    void (*free)(kiln_kv *kv);
    kiln_status (*reserve)(kiln_kv *kv, int n_new);
    /* k [n, n_kv_heads*head_dim], v [n, n_kv_heads*v_head_dim] for positions len..len+n-1. */
    void (*store)(kiln_kv *kv, int layer, const float *k, const float *v, int n);
    /* q [n, n_heads*head_dim] at positions len..len+n-1 (causal, window-limited) ->
     * out [n, n_heads*v_head_dim]. Must be called after store() for the same step. */
    void (*attend)(kiln_kv *kv, int layer, const float *q, int n, float *out,
                   const kiln_attn_params *p, kiln_threadpool *pool);
    void (*commit)(kiln_kv *kv, int n);
    kiln_status (*truncate)(kiln_kv *kv, int len);
    int64_t (*bytes_used)(const kiln_kv *kv);
    /* Fixed-size state of layer (state_floats f32, zeroed at creation and by truncate(0)); NULL
     * for layers without state. Recurrent layers read and update it in place. */
    float *(*layer_state)(kiln_kv *kv, int layer);
    /* Optional (NULL: the forward calls store + attend per cache). store + attend of one layer for
     * all caches of a batch step at once; every kvs[i] has this same vtable. Entry i adds n[i]
     * tokens whose rows start at row t0 = n[0]+...+n[i-1] of k, v, q and out (rows as in store /
     * attend). Same result as store(i) + attend(i) for each i. Device caches use it to launch one
     * kernel for the whole batch instead of one per sequence. k == NULL (v unused): attend only,
     * to what `layer` already holds (a KV-shared layer reading its source layer's cache). */
    void (*store_attend_batch)(kiln_kv *const *kvs, const int *n, int n_kv, int layer,
                               const float *k, const float *v, const float *q, float *out,
                               const kiln_attn_params *p, kiln_threadpool *pool);
    /* Optional: a key for the launches that store_attend_batch would make for n_new tokens at
     * the cache's current length, apart from values read through kiln_attn_params.positions.
     * Equal keys promise identical launches (buffers, split geometry), so a recorded step may
     * be replayed. 0 = not replayable. */
    uint64_t (*graph_key)(const kiln_kv *kv, int n_new);
    /* store_attend_batch accepts kiln_attn_params.prep (q / k norm + RoPE done by the cache). */
    bool prep_inside;
} kiln_kv_vtable;

struct kiln_kv {
    const kiln_kv_vtable *vt;
    int len; /* tokens committed */
    int n_layers;
    kiln_kv_layer_desc *layers; /* [n_layers], owned */
};

/* Contiguous per-sequence cache (f32, grows by doubling up to max_tokens). */
kiln_status kiln_kv_contiguous_new(const kiln_kv_layer_desc *layers, int n_layers, int max_tokens,
                                   kiln_kv **out);

static inline void kiln_kv_free(kiln_kv *kv) {
    if (kv) kv->vt->free(kv);
}

/* Shared CPU attention over contiguous K/V rows for one layer: used by contiguous caches and as
 * the reference for the others. k_rows/v_rows: [n_keys, n_kv_heads*hd]; queries at absolute
 * positions pos0..pos0+n-1 see keys [max(0, p-window+1) .. p] where key i has position key_pos0+i.
 */
void kiln_attention_contiguous(const float *q, int n, int pos0, const float *k_rows,
                               const float *v_rows, int n_keys, int key_pos0, int n_kv_heads,
                               int head_dim, int v_head_dim, int window, float *out,
                               const kiln_attn_params *p, kiln_threadpool *pool);

#endif
