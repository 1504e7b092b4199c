/* kv_pool.h — the paged KV block pool shared by every sequence of a model: one preallocated
 * arena of fixed-size blocks (block_tokens tokens of ONE layer: K records then V records, each
 * [block_tokens][n_kv_heads] rows in that layer's codec), reference counts, a free list, and the
 * prefix cache (hash chain over full token blocks -> the blocks of every layer holding them,
 * evicted least-recently-used when unreferenced and the pool needs room).
 *
 * Hybrid models (recurrent layers beside attention ones) cannot rebuild a recurrent state from
 * shared blocks, so an entry may also hold a snapshot of every recurrent layer's state (conv +
 * recurrent, state_floats each, in layer order) taken when a forward call ended exactly at the end
 * of its block. Snapshots live in a separate store bounded by snap_bytes_max: when it is over, the
 * least recently used snapshot is dropped (its entry stays, usable as an inner block of a longer
 * run); an evicted entry frees its snapshot.
 *
 * The bookkeeping (ids, refcounts, free list, prefix cache) always lives on the host; the block
 * bytes may live in a backend's memory instead (kv_pool_new_on: a device pool, allocated with
 * be->alloc). Such a pool carries the backend's paged-cache kernels (kv_device_ops); recurrent
 * states then live in the backend's memory too, and snapshots are copied to and from the host. */
#ifndef KILN_KV_POOL_H
#define KILN_KV_POOL_H

#include "kv/kv_cache.h"
#include "kv/kv_codec.h"

#include <pthread.h>

/* Storage of one layer: codecs of its K and V rows and the byte layout inside a block. */
typedef struct kv_layer_fmt {
    kv_codec k, v;
    size_t k_rec, v_rec; /* bytes of one head's row */
    size_t v_offset;     /* byte offset of the V records in a block */
} kv_layer_fmt;

typedef struct kv_prefix_entry kv_prefix_entry;
struct kiln_backend;

/* The kernels of a backend's paged caches (a device pool): store / attend of one sequence and the
 * batched form, with the semantics of kiln_kv_vtable; kvs are paged caches of the pool (kv_paged.c
 * exposes their device block tables through kv_paged_device_table). */
typedef struct kv_device_ops {
    void (*store)(kiln_kv *kv, int layer, const float *k, const float *v, int n);
    void (*attend)(kiln_kv *kv, int layer, const float *q, int n, float *out,
                   const kiln_attn_params *p, kiln_threadpool *pool);
    void (*store_attend_batch)(kiln_kv *const *kvs, const int *n, int n_kv, int layer,
                               const float *k, const float *v, const float *q, float *out,
                               const kiln_attn_params *p, kiln_threadpool *pool);
    uint64_t (*graph_key)(const kiln_kv *kv, int n_new);
} kv_device_ops;

typedef struct kv_pool {
    int block_tokens;
    size_t block_bytes; /* max over layers */
    int32_t n_blocks;
    uint8_t *data;            /* [n_blocks * block_bytes], in be's memory when be is set */
    struct kiln_backend *be;  /* NULL: host memory (malloc); else the backend holding data */
    const kv_device_ops *dev; /* with be: the kernels reading and writing the blocks */
    int32_t *refcount;        /* [n_blocks] */
    int32_t *free_list;       /* stack of free block ids */
    int32_t n_free;
    int n_layers;
    kiln_kv_layer_desc *layers; /* [n_layers], owned */
    kv_layer_fmt *fmt;          /* [n_layers] */
    int n_attn_layers;
    bool prefix_ok;         /* no sliding window layer: prefix blocks can be shared */
    int64_t snap_floats;    /* sum of state_floats over recurrent layers (0: no snapshots) */
    int64_t snap_bytes_max; /* bound of the snapshot store */
    int64_t snap_bytes;     /* held by snapshots now */
    uint64_t salt;          /* namespace of the prefix hashes (storage kind, block size) */
    kv_prefix_entry **buckets;
    int32_t n_buckets;
    int64_t n_entries;
    uint64_t tick; /* LRU clock */
    char kind[32];
    pthread_mutex_t mu; /* guards block metadata and the prefix cache */
} kv_pool;

/* Creates a pool for the layer geometry and the storage kind in opts (kind, block_tokens,
 * budget_bytes; model_dir: optional folder holding kv_config.json with per-layer bits). */
kiln_status kv_pool_new(const kiln_kv_layer_desc *layers, int n_layers, const kiln_kv_options *opts,
                        int max_tokens, const char *model_dir, kv_pool **out);
/* The same pool with its block bytes in be's memory (block_bytes rounded up to 16 for aligned
 * loads), read and written by ops; recurrent-state snapshots are downloaded from / uploaded to
 * the caches' states in be's memory. */
kiln_status kv_pool_new_on(struct kiln_backend *be, const kv_device_ops *ops,
                           const kiln_kv_layer_desc *layers, int n_layers,
                           const kiln_kv_options *opts, int max_tokens, const char *model_dir,
                           kv_pool **out);
void kv_pool_free(kv_pool *p);

/* Host pools only (a device pool's bytes are not addressable here). */
static inline uint8_t *kv_pool_block(const kv_pool *p, int32_t id) {
    return p->data + (size_t)id * p->block_bytes;
}

/* The following require p->mu held. */
/* Blocks that could be handed out now: free ones plus those held only by evictable prefix entries.
 */
int64_t kv_pool_available_locked(kv_pool *p);
/* Takes a block (refcount 1), evicting LRU prefix entries if needed; -1 if none left. */
int32_t kv_pool_alloc_locked(kv_pool *p);
void kv_pool_ref_locked(kv_pool *p, int32_t id);
void kv_pool_unref_locked(kv_pool *p, int32_t id);

/* Prefix cache (p->mu held). Hash of a full block given its parent's hash (0 for the first). */
uint64_t kv_prefix_hash(const kv_pool *p, uint64_t parent, const int32_t *tokens);
/* Entry whose hash and tokens match, or NULL. blocks_out (if found): [n_layers] ids (-1 for
 * layers without KV). Touches the entry (LRU) with the given tick. */
bool kv_prefix_lookup_locked(kv_pool *p, uint64_t hash, const int32_t *tokens, int32_t *blocks_out,
                             uint64_t tick);
/* Registers a full block (referencing blocks[n_layers]); if the hash is already cached, only adds
 * the snapshot when the entry has none. states: NULL, or [n_layers] pointers to the recurrent
 * states at the end of this block (NULL for layers without state), copied into a snapshot. */
void kv_prefix_insert_locked(kv_pool *p, uint64_t hash, const int32_t *tokens,
                             const int32_t *blocks, float *const *states);
/* Snapshot of the entry (snap_floats floats, layer order), or NULL if it has none / is absent. */
const float *kv_prefix_snapshot_locked(kv_pool *p, uint64_t hash, const int32_t *tokens);
/* Number of snapshots held. */
int64_t kv_prefix_snapshot_count(kv_pool *p);
/* Number of cached prefix blocks (entries). */
int64_t kv_prefix_count(kv_pool *p);

#endif
