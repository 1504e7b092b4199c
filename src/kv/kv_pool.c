/* kv_pool.c — the paged block pool: arena, refcounts, free list, and the prefix cache with LRU
 * eviction. A prefix entry holds one reference on each block of its layers; it is evictable when
 * those are its only references. Chains are touched from the leaf back to the root, so the LRU
 * victim is a leaf before its parents. */
#include "kv/kv_pool.h"

#include "backend/backend.h"
#include "kv/kv_factory.h"
#include "util/huge_alloc.h"
#include "util/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kv_prefix_entry {
    uint64_t hash;
    uint64_t tick;
    kv_prefix_entry *next;
    int32_t *tokens;  /* [block_tokens] */
    float *snap;      /* [snap_floats] recurrent states at the block's end, or NULL */
    int32_t blocks[]; /* [n_layers] */
};

kiln_status kv_pool_new(const kiln_kv_layer_desc *layers, int n_layers, const kiln_kv_options *opts,
                        int max_tokens, const char *model_dir, kv_pool **out) {
    return kv_pool_new_on(NULL, NULL, layers, n_layers, opts, max_tokens, model_dir, out);
}

kiln_status kv_pool_new_on(kiln_backend *be, const kv_device_ops *ops,
                           const kiln_kv_layer_desc *layers, int n_layers,
                           const kiln_kv_options *opts, int max_tokens, const char *model_dir,
                           kv_pool **out) {
    *out = NULL;
    kv_kind_spec spec;
    KILN_TRY(kv_kind_parse(opts && opts->kind[0] ? opts->kind : "f32", &spec));
    kv_pool *p = calloc(1, sizeof *p);
    if (!p) return kiln_error(KILN_ERR_OOM, "out of memory");
    pthread_mutex_init(&p->mu, NULL);
    p->be = be;
    p->dev = ops;
    snprintf(p->kind, sizeof p->kind, "%s", opts && opts->kind[0] ? opts->kind : "f32");
    p->block_tokens = opts && opts->block_tokens > 0 ? opts->block_tokens : 16;
    p->n_layers = n_layers;
    p->layers = malloc((size_t)n_layers * sizeof *layers);
    p->fmt = calloc((size_t)n_layers, sizeof *p->fmt);
    kiln_status st = KILN_OK;
    if (!p->layers || !p->fmt) {
        st = kiln_error(KILN_ERR_OOM, "out of memory");
        goto fail;
    }
    memcpy(p->layers, layers, (size_t)n_layers * sizeof *layers);
    st = kv_layer_formats(&spec, layers, n_layers, model_dir, p->fmt);
    if (st != KILN_OK) goto fail;
    p->prefix_ok = true;
    int64_t bytes_per_token = 0;
    for (int l = 0; l < n_layers; l++) {
        const kiln_kv_layer_desc *d = &layers[l];
        if (!d->is_attention) { /* its state comes back from a snapshot, not from blocks */
            p->snap_floats += d->state_floats > 0 ? d->state_floats : 0;
            continue;
        }
        if (d->window > 0) p->prefix_ok = false;
        p->n_attn_layers++;
        kv_layer_fmt *f = &p->fmt[l];
        f->v_offset = (size_t)p->block_tokens * d->n_kv_heads * f->k_rec;
        size_t bb = f->v_offset + (size_t)p->block_tokens * d->n_kv_heads * f->v_rec;
        if (bb > p->block_bytes) p->block_bytes = bb;
        bytes_per_token += (int64_t)d->n_kv_heads * (int64_t)(f->k_rec + f->v_rec);
    }
    if (p->n_attn_layers == 0) p->block_bytes = 64; /* no KV: a token pool is never used */
    if (be) p->block_bytes = (p->block_bytes + 15) / 16 * 16; /* 16-byte aligned blocks */
    int64_t budget = opts ? opts->budget_bytes : 0;
    if (budget <= 0) {
        /* default: 256 MiB, or two full contexts if larger, at most 8 GiB */
        budget = (int64_t)256 << 20;
        int64_t two = 2 * (int64_t)max_tokens * bytes_per_token;
        if (two > budget) budget = two;
        if (budget > ((int64_t)8 << 30)) budget = (int64_t)8 << 30;
    }
    int64_t nb = budget / (int64_t)p->block_bytes;
    if (nb < 1) {
        st = kiln_error(KILN_ERR_CACHE_FULL,
                        "KV pool budget of %lld bytes holds no block "
                        "(one %d-token block of kind %s is %zu bytes)",
                        (long long)budget, p->block_tokens, p->kind, p->block_bytes);
        goto fail;
    }
    if (nb > INT32_MAX / 2) nb = INT32_MAX / 2;
    /* snapshots: a quarter of the block budget, but room for at least 8 of them */
    p->snap_bytes_max = budget / 4;
    if (p->snap_bytes_max < 8 * p->snap_floats * 4) p->snap_bytes_max = 8 * p->snap_floats * 4;
    p->n_blocks = (int32_t)nb;
    /* pages are touched as blocks are written */
    p->data = be ? be->alloc(be, (size_t)nb * p->block_bytes)
                 : kiln_huge_alloc((size_t)nb * p->block_bytes);
    p->refcount = calloc((size_t)nb, sizeof *p->refcount);
    p->free_list = malloc((size_t)nb * sizeof *p->free_list);
    p->n_buckets = (int32_t)(nb < 64 ? 64 : nb);
    p->buckets = calloc((size_t)p->n_buckets, sizeof *p->buckets);
    if (!p->data || !p->refcount || !p->free_list || !p->buckets) {
        st = kiln_error(KILN_ERR_OOM, "KV pool: cannot allocate %lld blocks of %zu bytes",
                        (long long)nb, p->block_bytes);
        goto fail;
    }
    for (int32_t i = 0; i < p->n_blocks; i++) p->free_list[i] = p->n_blocks - 1 - i;
    p->n_free = p->n_blocks;
    uint64_t salt = 0xcbf29ce484222325ull;
    for (const char *c = p->kind; *c; c++) salt = (salt ^ (uint8_t)*c) * 0x100000001b3ull;
    p->salt = (salt ^ (uint64_t)p->block_tokens) * 0x100000001b3ull;
    *out = p;
    return KILN_OK;
fail:
    kv_pool_free(p);
    return st;
}

void kv_pool_free(kv_pool *p) {
    if (!p) return;
    if (p->buckets)
        for (int32_t b = 0; b < p->n_buckets; b++) {
            kv_prefix_entry *e = p->buckets[b];
            while (e) {
                kv_prefix_entry *n = e->next;
                free(e->snap);
                free(e->tokens);
                free(e);
                e = n;
            }
        }
    free(p->buckets);
    if (p->be) {
        if (p->data) p->be->free(p->be, p->data);
    } else {
        kiln_huge_free(p->data, (size_t)p->n_blocks * p->block_bytes);
    }
    free(p->refcount);
    free(p->free_list);
    free(p->layers);
    free(p->fmt);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void kv_pool_ref_locked(kv_pool *p, int32_t id) {
    p->refcount[id]++;
}

void kv_pool_unref_locked(kv_pool *p, int32_t id) {
    if (--p->refcount[id] == 0) p->free_list[p->n_free++] = id;
}

static bool entry_evictable(const kv_pool *p, const kv_prefix_entry *e) {
    for (int l = 0; l < p->n_layers; l++)
        if (e->blocks[l] >= 0 && p->refcount[e->blocks[l]] != 1) return false;
    return true;
}

int64_t kv_pool_available_locked(kv_pool *p) {
    int64_t n = p->n_free;
    for (int32_t b = 0; b < p->n_buckets; b++)
        for (kv_prefix_entry *e = p->buckets[b]; e; e = e->next)
            if (entry_evictable(p, e)) n += p->n_attn_layers;
    return n;
}

/* Drops the least recently used evictable entry; false if there is none. */
static bool evict_one(kv_pool *p) {
    kv_prefix_entry **victim = NULL;
    for (int32_t b = 0; b < p->n_buckets; b++)
        for (kv_prefix_entry **e = &p->buckets[b]; *e; e = &(*e)->next)
            if (entry_evictable(p, *e) && (!victim || (*e)->tick < (*victim)->tick)) victim = e;
    if (!victim) return false;
    kv_prefix_entry *e = *victim;
    *victim = e->next;
    for (int l = 0; l < p->n_layers; l++)
        if (e->blocks[l] >= 0) kv_pool_unref_locked(p, e->blocks[l]);
    if (e->snap) p->snap_bytes -= p->snap_floats * 4;
    free(e->snap);
    free(e->tokens);
    free(e);
    p->n_entries--;
    return true;
}

int32_t kv_pool_alloc_locked(kv_pool *p) {
    while (p->n_free == 0)
        if (!evict_one(p)) return -1;
    int32_t id = p->free_list[--p->n_free];
    p->refcount[id] = 1;
    return id;
}

uint64_t kv_prefix_hash(const kv_pool *p, uint64_t parent, const int32_t *tokens) {
    uint64_t h = parent ^ p->salt;
    for (int i = 0; i < p->block_tokens; i++) {
        h ^= (uint32_t)tokens[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h ? h : 1;
}

static kv_prefix_entry *find(kv_pool *p, uint64_t hash, const int32_t *tokens) {
    for (kv_prefix_entry *e = p->buckets[hash % (uint64_t)p->n_buckets]; e; e = e->next)
        if (e->hash == hash && memcmp(e->tokens, tokens, (size_t)p->block_tokens * 4) == 0)
            return e;
    return NULL;
}

bool kv_prefix_lookup_locked(kv_pool *p, uint64_t hash, const int32_t *tokens, int32_t *blocks_out,
                             uint64_t tick) {
    kv_prefix_entry *e = find(p, hash, tokens);
    if (!e) return false;
    e->tick = tick;
    if (blocks_out) memcpy(blocks_out, e->blocks, (size_t)p->n_layers * sizeof(int32_t));
    return true;
}

/* Drops least recently used snapshots (never keep's) until the store fits its bound. */
static void snap_trim(kv_pool *p, const kv_prefix_entry *keep) {
    while (p->snap_bytes > p->snap_bytes_max) {
        kv_prefix_entry *victim = NULL;
        for (int32_t b = 0; b < p->n_buckets; b++)
            for (kv_prefix_entry *e = p->buckets[b]; e; e = e->next)
                if (e->snap && e != keep && (!victim || e->tick < victim->tick)) victim = e;
        if (!victim) return;
        free(victim->snap);
        victim->snap = NULL;
        p->snap_bytes -= p->snap_floats * 4;
    }
}

static void snap_store(kv_pool *p, kv_prefix_entry *e, float *const *states) {
    if (!states || e->snap || p->snap_floats <= 0) return;
    float *snap = malloc((size_t)p->snap_floats * sizeof *snap);
    if (!snap) return; /* an optimisation: skip it when memory is short */
    int64_t o = 0;
    for (int l = 0; l < p->n_layers; l++) {
        int64_t n = p->layers[l].is_attention ? 0 : p->layers[l].state_floats;
        if (n <= 0) continue;
        if (p->be) /* device states: copied back to the host (waits for the GPU) */
            p->be->download(p->be, snap + o, states[l], (size_t)n * sizeof *snap);
        else
            memcpy(snap + o, states[l], (size_t)n * sizeof *snap);
        o += n;
    }
    e->snap = snap;
    p->snap_bytes += p->snap_floats * 4;
    snap_trim(p, e);
}

const float *kv_prefix_snapshot_locked(kv_pool *p, uint64_t hash, const int32_t *tokens) {
    kv_prefix_entry *e = find(p, hash, tokens);
    return e ? e->snap : NULL;
}

int64_t kv_prefix_snapshot_count(kv_pool *p) {
    pthread_mutex_lock(&p->mu);
    int64_t n = p->snap_floats > 0 ? p->snap_bytes / (p->snap_floats * 4) : 0;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void kv_prefix_insert_locked(kv_pool *p, uint64_t hash, const int32_t *tokens,
                             const int32_t *blocks, float *const *states) {
    kv_prefix_entry *old = find(p, hash, tokens);
    if (old) {
        if (states && !old->snap) {
            old->tick = ++p->tick;
            snap_store(p, old, states);
        }
        return;
    }
    kv_prefix_entry *e = malloc(sizeof *e + (size_t)p->n_layers * sizeof(int32_t));
    int32_t *tk = malloc((size_t)p->block_tokens * sizeof *tk);
    if (!e || !tk) { /* caching is an optimisation: skip it when memory is short */
        free(e);
        free(tk);
        return;
    }
    e->hash = hash;
    e->tick = ++p->tick;
    e->tokens = tk;
    e->snap = NULL;
    memcpy(tk, tokens, (size_t)p->block_tokens * sizeof *tk);
    for (int l = 0; l < p->n_layers; l++) {
        e->blocks[l] = blocks[l];
        if (blocks[l] >= 0) kv_pool_ref_locked(p, blocks[l]);
    }
    uint64_t b = hash % (uint64_t)p->n_buckets;
    e->next = p->buckets[b];
    p->buckets[b] = e;
    p->n_entries++;
    snap_store(p, e, states);
}

int64_t kv_prefix_count(kv_pool *p) {
    pthread_mutex_lock(&p->mu);
    int64_t n = p->n_entries;
    pthread_mutex_unlock(&p->mu);
    return n;
}
