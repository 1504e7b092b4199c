/* kv_factory.h — creating a CPU KV cache of the kind named by kiln_kv_options, and the hooks the
 * engine uses for caches shared across a model's sequences (the paged pool, prefix sharing). */
#ifndef KILN_KV_FACTORY_H
#define KILN_KV_FACTORY_H

#include "kv/kv_cache.h"
#include "kv/kv_codec.h"

kiln_status kiln_kv_cpu_new(const kiln_kv_layer_desc *layers, int n_layers,
                            const kiln_kv_options *opts, int max_tokens, kiln_kv **out);
/* Like kiln_kv_cpu_new, but paged kinds draw from one pool per model: *shared (NULL at first) is
 * created on first use and must be released with kiln_kv_shared_free after every cache drawn
 * from it. model_dir: folder that may hold kv_config.json (per-layer bits), or NULL. */
kiln_status kiln_kv_cpu_new_shared(void **shared, const char *model_dir,
                                   const kiln_kv_layer_desc *layers, int n_layers,
                                   const kiln_kv_options *opts, int max_tokens, kiln_kv **out);
void kiln_kv_shared_free(void *shared);
/* Whether opts ask for a paged cache (any kind but f32, or opts->paged: --kv-block / --kv-budget).
 */
bool kiln_kv_wants_paged(const kiln_kv_options *opts);
/* kiln_kv_cpu_new_shared for a backend that offers paged-cache kernels (be->kv_paged_ops): the
 * one pool of *shared lives in be's memory. Only for opts that want a paged cache. */
struct kiln_backend;
kiln_status kiln_kv_backend_new_shared(void **shared, struct kiln_backend *be,
                                       const char *model_dir, const kiln_kv_layer_desc *layers,
                                       int n_layers, const kiln_kv_options *opts, int max_tokens,
                                       kiln_kv **out);
/* Bytes per token of every attention layer for a cache kind (for `info`). */
int64_t kiln_kv_bytes_per_token(const kiln_kv_layer_desc *layers, int n_layers,
                                const kiln_kv_options *opts);
/* Tells a cache the token ids of the next n positions (len..len+n-1) before they are forwarded,
 * so full blocks can be registered for prefix sharing when committed. No-op for other kinds. */
void kiln_kv_note_tokens(kiln_kv *kv, const int32_t *tokens, int n);

/* ---- storage kinds (for the pool) ---- */
typedef struct kv_kind_spec {
    kv_codec_kind k_kind, v_kind;
    int k_bits, v_bits;
    int k_group, v_group; /* requested group (clamped to the head dim) */
    bool rotk, rotv;
    bool affine_config; /* kv_config.json may override per-layer bits (affine kinds) */
} kv_kind_spec;

/* "f32", "f16", "bf16", "q8", "q4", "q8:g32", "turbo:k8v3", "turbo:k8v4:rotk", ... */
kiln_status kv_kind_parse(const char *text, kv_kind_spec *out);
struct kv_layer_fmt;
kiln_status kv_layer_formats(const kv_kind_spec *spec, const kiln_kv_layer_desc *layers,
                             int n_layers, const char *model_dir, struct kv_layer_fmt *fmt);

/* Paged caches (kv_paged.c). */
struct kv_pool;
kiln_status kv_paged_new(struct kv_pool *pool, bool own_pool, int max_tokens, kiln_kv **out);
bool kv_is_paged(const kiln_kv *kv);
/* Shares every block of src with a new cache (copy-on-write on the next write to a shared block).
 */
kiln_status kv_paged_fork(kiln_kv *src, kiln_kv **out);
/* Pool behind a paged cache (NULL otherwise). */
struct kv_pool *kv_paged_pool(kiln_kv *kv);
/* Device pool: the cache's block table in the backend's memory, [ceil(max_tokens / block_tokens)]
 * rows of n_layers block ids (row b: logical block b of every layer), at a fixed address for the
 * cache's life and current up to its allocated blocks after reserve(). NULL otherwise. */
const int32_t *kv_paged_device_table(const kiln_kv *kv);
/* Block id of logical block `block` of layer `layer` (-1: none). For tests. */
int32_t kv_paged_block_id(const kiln_kv *kv, int layer, int block);

#endif
