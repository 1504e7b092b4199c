/* kv_paged.c — the paged cache of one sequence: per-layer block tables into the model's kv_pool,
 * copy-on-write of shared blocks, sliding-window layers that drop blocks leaving their window,
 * prefix-block registration at commit, and the attention read through the block table (keys and
 * values are decoded row by row inside the loop; for f32 the loop is the one of
 * kiln_attention_contiguous, in the same order, so results match it bit for bit). TurboQuant
 * values are accumulated in the rotated basis and the output is unrotated once per head.
 * Hybrid models: a commit that ends exactly on a block boundary stores the recurrent states with
 * that block's prefix entry; attach and truncate go back only to boundaries holding a snapshot.
 * Device pools (kv_pool_new_on): the same bookkeeping, with a copy of the block tables in the
 * backend's memory at a fixed address ([blocks][n_layers], rows uploaded when reserve changes
 * them), recurrent states in the backend's memory, and store / attend run by the pool's
 * kv_device_ops. */
#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "kv/hadamard.h"
#include "kv/kv_factory.h"
#include "kv/kv_pool.h"
#include "kv/kv_sliding.h"
#include "model/model.h"
#include "util/status.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct kv_paged {
    kiln_kv base;
    kv_pool *pool;
    bool own_pool;
    int max_tokens;
    int n_alloc;     /* logical blocks covered by the tables */
    int cap;         /* capacity of the tables, in blocks */
    int32_t **table; /* [n_layers][cap] block ids, -1 = none; NULL for layers without KV */
    float **state;   /* [n_layers] recurrent state or NULL */
    int32_t *tokens; /* [tok_cap] ids of positions < known */
    int tok_cap, known;
    uint64_t *hashes; /* [cap] prefix hash chain of full blocks */
    int n_hashed;
    int32_t *blk; /* [n_layers] scratch */
    /* device pool only */
    int32_t *dev_table; /* [dev_blocks][n_layers] block ids in the backend's memory */
    int dev_blocks;     /* logical blocks it covers: ceil(max_tokens / block_tokens) */
    int dev_dirty;      /* first logical block whose device row is stale (INT_MAX: none) */
} kv_paged;

static const kiln_kv_vtable paged_vt, paged_dev_vt;

bool kv_is_paged(const kiln_kv *kv) {
    return kv && (kv->vt == &paged_vt || kv->vt == &paged_dev_vt);
}
const int32_t *kv_paged_device_table(const kiln_kv *kv) {
    return kv_is_paged(kv) ? ((const kv_paged *)kv)->dev_table : NULL;
}
int32_t kv_paged_block_id(const kiln_kv *kv, int layer, int block) {
    const kv_paged *c = (const kv_paged *)kv;
    if (!kv_is_paged(kv) || layer < 0 || layer >= kv->n_layers || !c->table[layer] || block < 0 ||
        block >= c->n_alloc)
        return -1;
    return c->table[layer][block];
}

static void mark_dirty(kv_paged *c, int block) {
    if (block < c->dev_dirty) c->dev_dirty = block;
}

/* Device pool: uploads the rows of the block tables changed since the last upload (one small
 * copy; the device table stays at its address, so recorded launches keep reading it). */
static kiln_status sync_device_table(kv_paged *c) {
    kiln_backend *be = c->pool->be;
    int hi = c->n_alloc < c->dev_blocks ? c->n_alloc : c->dev_blocks;
    if (!be || !c->dev_table || c->dev_dirty >= hi) {
        c->dev_dirty = INT_MAX;
        return KILN_OK;
    }
    const int lo = c->dev_dirty, nl = c->base.n_layers;
    int32_t *rows = malloc((size_t)(hi - lo) * (size_t)nl * sizeof *rows);
    if (!rows) return kiln_error(KILN_ERR_OOM, "KV block table: out of memory");
    for (int b = lo; b < hi; b++)
        for (int l = 0; l < nl; l++)
            rows[(size_t)(b - lo) * nl + l] = c->table[l] ? c->table[l][b] : -1;
    be->upload(be, c->dev_table + (size_t)lo * nl, rows, (size_t)(hi - lo) * nl * sizeof *rows);
    free(rows);
    c->dev_dirty = INT_MAX;
    return KILN_OK;
}
kv_pool *kv_paged_pool(kiln_kv *kv) {
    return kv_is_paged(kv) ? ((kv_paged *)kv)->pool : NULL;
}

static kiln_status grow_tables(kv_paged *c, int need) {
    if (need <= c->cap) return KILN_OK;
    int cap = c->cap ? c->cap : 16;
    while (cap < need) cap *= 2;
    for (int l = 0; l < c->base.n_layers; l++) {
        if (!c->base.layers[l].is_attention) continue;
        int32_t *t = realloc(c->table[l], (size_t)cap * sizeof *t);
        if (!t) return kiln_error(KILN_ERR_OOM, "KV block table: out of memory");
        for (int b = c->cap; b < cap; b++) t[b] = -1;
        c->table[l] = t;
    }
    uint64_t *h = realloc(c->hashes, (size_t)cap * sizeof *h);
    if (!h) return kiln_error(KILN_ERR_OOM, "KV block table: out of memory");
    c->hashes = h;
    c->cap = cap;
    return KILN_OK;
}

static kiln_status grow_tokens(kv_paged *c, int need) {
    if (need <= c->tok_cap) return KILN_OK;
    int cap = c->tok_cap ? c->tok_cap : 256;
    while (cap < need) cap *= 2;
    int32_t *t = realloc(c->tokens, (size_t)cap * sizeof *t);
    if (!t) return kiln_error(KILN_ERR_OOM, "KV token history: out of memory");
    c->tokens = t;
    c->tok_cap = cap;
    return KILN_OK;
}

static void paged_free(kiln_kv *kv) {
    kv_paged *c = (kv_paged *)kv;
    if (!c) return;
    kv_pool *p = c->pool;
    if (c->table) {
        pthread_mutex_lock(&p->mu);
        for (int l = 0; l < kv->n_layers; l++) {
            for (int b = 0; c->table[l] && b < c->n_alloc; b++)
                if (c->table[l][b] >= 0) kv_pool_unref_locked(p, c->table[l][b]);
            free(c->table[l]);
        }
        pthread_mutex_unlock(&p->mu);
    }
    if (c->state)
        for (int l = 0; l < kv->n_layers; l++) {
            if (!c->state[l]) continue;
            if (p->be)
                p->be->free(p->be, c->state[l]);
            else
                free(c->state[l]);
        }
    if (c->dev_table) p->be->free(p->be, c->dev_table);
    free(c->table);
    free(c->state);
    free(c->tokens);
    free(c->hashes);
    free(c->blk);
    free(kv->layers);
    if (c->own_pool) kv_pool_free(p);
    free(c);
}

static kiln_status paged_reserve(kiln_kv *kv, int n_new) {
    kv_paged *c = (kv_paged *)kv;
    kv_pool *p = c->pool;
    if (n_new < 0) return kiln_error(KILN_ERR_INVALID_ARG, "kv: negative token count");
    if ((int64_t)kv->len + n_new > c->max_tokens)
        return kiln_error(KILN_ERR_CACHE_FULL,
                          "KV cache full: %d tokens held + %d new exceeds the context limit of %d",
                          kv->len, n_new, c->max_tokens);
    if (n_new == 0 || p->n_attn_layers == 0) return sync_device_table(c);
    const int B = p->block_tokens;
    int need = (kv->len + n_new + B - 1) / B;
    KILN_TRY(grow_tables(c, need));
    pthread_mutex_lock(&p->mu);
    int fresh = need > c->n_alloc ? need - c->n_alloc : 0;
    int64_t cow = 0;
    int upto = need < c->n_alloc ? need : c->n_alloc;
    for (int b = kv->len / B; b < upto; b++)
        for (int l = 0; l < kv->n_layers; l++)
            if (c->table[l] && c->table[l][b] >= 0 && p->refcount[c->table[l][b]] > 1) cow++;
    int64_t required = (int64_t)fresh * p->n_attn_layers + cow;
    if (required > p->n_free) {
        int64_t avail = kv_pool_available_locked(p);
        if (required > avail) {
            pthread_mutex_unlock(&p->mu);
            return kiln_error(KILN_ERR_CACHE_FULL,
                              "KV pool full: %d new tokens need %lld blocks of %d tokens, %lld of "
                              "%d are available (free a sequence or raise --kv-budget)",
                              n_new, (long long)required, B, (long long)avail, p->n_blocks);
        }
    }
    for (int b = kv->len / B; b < upto;
         b++) /* copy-on-write of shared blocks about to be written */
        for (int l = 0; l < kv->n_layers; l++) {
            if (!c->table[l]) continue;
            int32_t id = c->table[l][b];
            if (id < 0 || p->refcount[id] <= 1) continue;
            int32_t nid = kv_pool_alloc_locked(p);
            if (p->be) { /* a device-to-device copy of the block, ordered on the backend */
                const int64_t w = (int64_t)(p->block_bytes / sizeof(float));
                p->be->copy2d(p->be, (float *)(void *)(p->data + (size_t)nid * p->block_bytes), w,
                              (const float *)(const void *)(p->data + (size_t)id * p->block_bytes),
                              w, 1, w);
            } else {
                memcpy(kv_pool_block(p, nid), kv_pool_block(p, id), p->block_bytes);
            }
            kv_pool_unref_locked(p, id);
            c->table[l][b] = nid;
        }
    for (int b = c->n_alloc; b < need; b++)
        for (int l = 0; l < kv->n_layers; l++)
            if (c->table[l]) c->table[l][b] = kv_pool_alloc_locked(p);
    if (fresh > 0 || cow > 0) mark_dirty(c, kv->len / B);
    if (need > c->n_alloc) c->n_alloc = need;
    pthread_mutex_unlock(&p->mu);
    return sync_device_table(c);
}

static void paged_store(kiln_kv *kv, int layer, const float *k, const float *v, int n) {
    kv_paged *c = (kv_paged *)kv;
    const kv_pool *p = c->pool;
    const kiln_kv_layer_desc *d = &kv->layers[layer];
    const kv_layer_fmt *f = &p->fmt[layer];
    const int B = p->block_tokens, H = d->n_kv_heads;
    float tmp[1024];
    for (int t = 0; t < n; t++) {
        int pos = kv->len + t;
        uint8_t *blk = kv_pool_block(p, c->table[layer][pos / B]);
        size_t row = (size_t)(pos % B) * H;
        for (int h = 0; h < H; h++) {
            kv_codec_encode(&f->k, k + ((int64_t)t * H + h) * d->head_dim, d->head_dim,
                            blk + (row + h) * f->k_rec, tmp);
            kv_codec_encode(&f->v, v + ((int64_t)t * H + h) * d->v_head_dim, d->v_head_dim,
                            blk + f->v_offset + (row + h) * f->v_rec, tmp);
        }
    }
}

typedef struct paged_job {
    const kv_paged *c;
    int layer;
    const float *q;
    float *out;
    int n;
    const kiln_attn_params *p;
} paged_job;

enum { TILE_Q = 16 }; /* queries sharing one decode of each key / value row */

/* One work item: kv head g and a tile of up to TILE_Q queries, with every query head of the GQA
 * group. The key and value rows of one block are decoded once for the whole tile (kblk / vblk,
 * or read in place for plain f32), then every (query, head) takes them through dot_rows /
 * axpy_rows; the scores, the softmax sums and the weighted sum of values run in increasing key
 * order, exactly as in kiln_attention_contiguous. */
static void paged_slice(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const paged_job *j = ctx;
    const kv_paged *c = j->c;
    const kv_pool *pool = c->pool;
    const kiln_kv_layer_desc *d = &c->base.layers[j->layer];
    const kv_layer_fmt *f = &pool->fmt[j->layer];
    const int32_t *table = c->table[j->layer];
    const int B = pool->block_tokens, H = d->n_kv_heads, hd = d->head_dim, vhd = d->v_head_dim;
    const int n_heads = j->p->n_heads, group = n_heads / H;
    const int n_keys = c->base.len + j->n;
    const bool k_direct = f->k.kind == KV_CODEC_F32 && !f->k.rotate;
    const bool v_direct = f->v.kind == KV_CODEC_F32 && !f->v.rotate;
    const int rows = TILE_Q * group;
    float *scores = malloc((size_t)rows * (size_t)(n_keys > 0 ? n_keys : 1) * sizeof(float));
    /* kblk [B, hd], vblk [B, vhd], qrot [rows, hd], coef [B] */
    float *buf = malloc((size_t)(B * hd + B * vhd + rows * hd + B) * sizeof(float));
    float *mx = malloc((size_t)rows * 2 * sizeof(float));
    const float **qv = malloc((size_t)rows * sizeof *qv);
    if (!scores || !buf || !mx || !qv) { /* cannot happen in practice; leaves out untouched */
        free(scores);
        free(buf);
        free(mx);
        free(qv);
        return;
    }
    float *kblk = buf, *vblk = buf + (size_t)B * hd, *qrot = vblk + (size_t)B * vhd;
    float *coef = qrot + (size_t)rows * hd;
    float *inv = mx + rows;
    const int n_tiles = (j->n + TILE_Q - 1) / TILE_Q;
    for (int64_t w = begin; w < end; w++) {
        const int g = (int)(w / n_tiles), t0 = (int)(w % n_tiles) * TILE_Q;
        const int nt = j->n - t0 < TILE_Q ? j->n - t0 : TILE_Q;
        /* rows r = (t - t0) * group + (h - g*group); query t sees keys first(t)..pos(t) */
        const int pos_hi = c->base.len + t0 + nt - 1;
        int lo = c->base.len + t0; /* smallest first(t) over the tile */
        lo = d->window > 0 ? lo - d->window + 1 : 0;
        if (lo < 0) lo = 0;
        for (int r = 0; r < nt * group; r++) {
            int t = t0 + r / group, h = g * group + r % group;
            const float *q = j->q + (int64_t)t * n_heads * hd + (int64_t)h * hd;
            float *o = j->out + (int64_t)t * n_heads * vhd + (int64_t)h * vhd;
            for (int e = 0; e < vhd; e++) o[e] = 0.0f;
            if (f->k.rotate) { /* q.k is invariant under the orthonormal rotation of k */
                memcpy(qrot + (size_t)r * hd, q, (size_t)hd * sizeof(float));
                kiln_hadamard_rotate(qrot + (size_t)r * hd, hd);
                q = qrot + (size_t)r * hd;
            }
            qv[r] = q;
            mx[r] = -INFINITY;
        }
        /* keys block by block: kp0..kp1 lie in one block */
        for (int kp0 = lo; kp0 <= pos_hi;) {
            const int kp1 = kp0 - kp0 % B + B - 1 < pos_hi ? kp0 - kp0 % B + B - 1 : pos_hi;
            const int cnt = kp1 - kp0 + 1;
            const uint8_t *rec0 = kv_pool_block(pool, table[kp0 / B]) +
                                  ((size_t)(kp0 % B) * H + (size_t)g) * f->k_rec;
            const float *krows;
            int64_t kstride; /* floats between consecutive keys' rows */
            if (k_direct) {
                krows = (const float *)(const void *)rec0;
                kstride = (int64_t)H * f->k_rec / (int64_t)sizeof(float);
            } else {
                for (int i = 0; i < cnt; i++)
                    kv_codec_decode(&f->k, rec0 + (size_t)i * H * f->k_rec, hd,
                                    kblk + (size_t)i * hd);
                krows = kblk;
                kstride = hd;
            }
            for (int r = 0; r < nt * group; r++) {
                int pos = c->base.len + t0 + r / group;
                int first = d->window > 0 ? pos - d->window + 1 : 0;
                int a = kp0 > first ? kp0 : first, b = kp1 < pos ? kp1 : pos;
                if (a > b) continue;
                float *sc = scores + (size_t)r * n_keys;
                kiln_cpu_dot_rows(sc + a, qv[r], krows + (int64_t)(a - kp0) * kstride, kstride,
                                  b - a + 1, hd);
                for (int kp = a; kp <= b; kp++) {
                    float s = sc[kp] * j->p->scale;
                    if (j->p->softcap > 0) s = j->p->softcap * tanhf(s / j->p->softcap);
                    sc[kp] = s;
                    if (s > mx[r]) mx[r] = s;
                }
            }
            kp0 = kp1 + 1;
        }
        for (int r = 0; r < nt * group; r++) {
            int pos = c->base.len + t0 + r / group;
            int first = d->window > 0 ? pos - d->window + 1 : 0;
            if (first < 0) first = 0;
            float *sc = scores + (size_t)r * n_keys;
            inv[r] = 1.0f / kiln_cpu_exp_sum(sc + first, pos - first + 1, mx[r]);
        }
        for (int kp0 = lo; kp0 <= pos_hi;) {
            const int kp1 = kp0 - kp0 % B + B - 1 < pos_hi ? kp0 - kp0 % B + B - 1 : pos_hi;
            const int cnt = kp1 - kp0 + 1;
            const uint8_t *rec0 = kv_pool_block(pool, table[kp0 / B]) + f->v_offset +
                                  ((size_t)(kp0 % B) * H + (size_t)g) * f->v_rec;
            const float *vrows;
            int64_t vstride;
            if (v_direct) {
                vrows = (const float *)(const void *)rec0;
                vstride = (int64_t)H * f->v_rec / (int64_t)sizeof(float);
            } else {
                for (int i = 0; i < cnt; i++)
                    kv_codec_decode(&f->v, rec0 + (size_t)i * H * f->v_rec, vhd,
                                    vblk + (size_t)i * vhd);
                vrows = vblk;
                vstride = vhd;
            }
            for (int r = 0; r < nt * group; r++) {
                int t = t0 + r / group, h = g * group + r % group, pos = c->base.len + t;
                int first = d->window > 0 ? pos - d->window + 1 : 0;
                int a = kp0 > first ? kp0 : first, b = kp1 < pos ? kp1 : pos;
                if (a > b) continue;
                for (int kp = a; kp <= b; kp++)
                    coef[kp - a] = scores[(size_t)r * n_keys + kp] * inv[r];
                float *o = j->out + (int64_t)t * n_heads * vhd + (int64_t)h * vhd;
                kiln_cpu_axpy_rows(o, coef, vrows + (int64_t)(a - kp0) * vstride, vstride,
                                   b - a + 1, vhd);
            }
            kp0 = kp1 + 1;
        }
        if (f->v.rotate) /* once per output row, not per key */
            for (int r = 0; r < nt * group; r++) {
                int t = t0 + r / group, h = g * group + r % group;
                kiln_hadamard_unrotate(j->out + (int64_t)t * n_heads * vhd + (int64_t)h * vhd, vhd);
            }
    }
    free(scores);
    free(buf);
    free(mx);
    free(qv);
}

static void paged_attend(kiln_kv *kv, int layer, const float *q, int n, float *out,
                         const kiln_attn_params *p, kiln_threadpool *pool) {
    paged_job j = {.c = (const kv_paged *)kv, .layer = layer, .q = q, .out = out, .n = n, .p = p};
    int64_t tiles = (n + TILE_Q - 1) / TILE_Q;
    kiln_parallel_for(pool, tiles * kv->layers[layer].n_kv_heads, 1, paged_slice, &j);
}

/* Registers full blocks whose tokens are known (p->mu held). */
static void register_blocks_locked(kv_paged *c) {
    kv_pool *p = c->pool;
    const int B = p->block_tokens;
    if (!p->prefix_ok) return;
    while (c->n_hashed < c->base.len / B && c->known >= (c->n_hashed + 1) * B) {
        int b = c->n_hashed;
        uint64_t parent = b ? c->hashes[b - 1] : 0;
        uint64_t h = kv_prefix_hash(p, parent, c->tokens + (size_t)b * B);
        for (int l = 0; l < c->base.n_layers; l++) c->blk[l] = c->table[l] ? c->table[l][b] : -1;
        /* the recurrent states describe position len: a snapshot only for the block ending there */
        bool at_end = p->snap_floats > 0 && (b + 1) * B == c->base.len;
        kv_prefix_insert_locked(p, h, c->tokens + (size_t)b * B, c->blk, at_end ? c->state : NULL);
        c->hashes[b] = h;
        c->n_hashed++;
    }
}

/* Restores the recurrent states from the snapshot of full block b-1's entry (len = b*B); false if
 * there is none (p->mu held). */
static bool restore_snapshot_locked(kv_paged *c, int b, const int32_t *tokens) {
    kv_pool *p = c->pool;
    if (b <= 0) return false;
    const float *snap =
        kv_prefix_snapshot_locked(p, c->hashes[b - 1], tokens + (size_t)(b - 1) * p->block_tokens);
    if (!snap) return false;
    for (int l = 0, o = 0; l < c->base.n_layers; l++) {
        if (!c->state[l]) continue;
        const size_t bytes = (size_t)c->base.layers[l].state_floats * sizeof(float);
        if (p->be)
            p->be->upload(p->be, c->state[l], snap + o, bytes);
        else
            memcpy(c->state[l], snap + o, bytes);
        o += (int)c->base.layers[l].state_floats;
    }
    return true;
}

static void paged_commit(kiln_kv *kv, int n) {
    kv_paged *c = (kv_paged *)kv;
    kv_pool *p = c->pool;
    kv->len += n;
    pthread_mutex_lock(&p->mu);
    for (int l = 0; l < kv->n_layers; l++) { /* sliding layers: return blocks left behind */
        if (!c->table[l] || kv->layers[l].window <= 0) continue;
        int dead = kv_sliding_dead_blocks(kv->len, kv->layers[l].window, p->block_tokens);
        for (int b = 0; b < dead && b < c->n_alloc; b++)
            if (c->table[l][b] >= 0) {
                kv_pool_unref_locked(p, c->table[l][b]);
                c->table[l][b] = -1;
            }
    }
    register_blocks_locked(c);
    pthread_mutex_unlock(&p->mu);
}

static kiln_status paged_truncate(kiln_kv *kv, int len) {
    kv_paged *c = (kv_paged *)kv;
    kv_pool *p = c->pool;
    const int B = p->block_tokens;
    if (len < 0 || len > kv->len)
        return kiln_error(KILN_ERR_INVALID_ARG, "kv: cannot truncate %d tokens to %d", kv->len,
                          len);
    for (int l = 0; l < kv->n_layers; l++) {
        if (c->table[l] && kv->layers[l].window > 0 && len > 0) {
            int first = kv_sliding_first_needed(len, kv->layers[l].window);
            for (int b = first / B; b * B < len; b++)
                if (c->table[l][b] < 0)
                    return kiln_error(KILN_ERR_UNSUPPORTED,
                                      "kv: layer %d (window %d) already "
                                      "dropped position %d needed after truncating to %d",
                                      l, kv->layers[l].window, b * B, len);
        }
    }
    pthread_mutex_lock(&p->mu);
    if (p->snap_floats > 0 && len != 0 && len != kv->len) {
        /* recurrent states roll back only to a block boundary whose snapshot is cached */
        bool ok = p->prefix_ok && len % B == 0 && len / B <= c->n_hashed && c->known >= len &&
                  restore_snapshot_locked(c, len / B, c->tokens);
        if (!ok) {
            pthread_mutex_unlock(&p->mu);
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "kv: a recurrent state cannot be rolled back to %d of %d tokens "
                              "(only to 0 or to a block boundary with a cached snapshot)",
                              len, kv->len);
        }
    }
    int keep = (len + B - 1) / B;
    for (int l = 0; l < kv->n_layers; l++)
        for (int b = keep; c->table[l] && b < c->n_alloc; b++)
            if (c->table[l][b] >= 0) {
                kv_pool_unref_locked(p, c->table[l][b]);
                c->table[l][b] = -1;
            }
    if (c->n_alloc > keep) c->n_alloc = keep;
    pthread_mutex_unlock(&p->mu);
    if (c->n_hashed > len / B) c->n_hashed = len / B;
    if (c->known > len) c->known = len;
    if (len == 0)
        for (int l = 0; l < kv->n_layers; l++) {
            if (!c->state[l]) continue;
            if (p->be)
                p->be->zero(p->be, c->state[l], kv->layers[l].state_floats);
            else
                memset(c->state[l], 0, (size_t)kv->layers[l].state_floats * sizeof(float));
        }
    kv->len = len;
    return KILN_OK;
}

static int64_t paged_bytes(const kiln_kv *kv) {
    const kv_paged *c = (const kv_paged *)kv;
    int64_t blocks = 0, b = 0;
    for (int l = 0; l < kv->n_layers; l++) {
        for (int i = 0; c->table[l] && i < c->n_alloc; i++) blocks += c->table[l][i] >= 0;
        if (c->state[l]) b += kv->layers[l].state_floats * 4;
    }
    return b + blocks * (int64_t)c->pool->block_bytes;
}

static float *paged_layer_state(kiln_kv *kv, int layer) {
    return ((kv_paged *)kv)->state[layer];
}

static const kiln_kv_vtable paged_vt = {
    .kind = "paged",
    .free = paged_free,
    .reserve = paged_reserve,
    .store = paged_store,
    .attend = paged_attend,
    .commit = paged_commit,
    .truncate = paged_truncate,
    .bytes_used = paged_bytes,
    .layer_state = paged_layer_state,
};

/* Device pool: the pool's kernels behind the same bookkeeping. */
static void dev_store(kiln_kv *kv, int layer, const float *k, const float *v, int n) {
    ((kv_paged *)kv)->pool->dev->store(kv, layer, k, v, n);
}
static void dev_attend(kiln_kv *kv, int layer, const float *q, int n, float *out,
                       const kiln_attn_params *p, kiln_threadpool *pool) {
    ((kv_paged *)kv)->pool->dev->attend(kv, layer, q, n, out, p, pool);
}
static void dev_store_attend_batch(kiln_kv *const *kvs, const int *n, int n_kv, int layer,
                                   const float *k, const float *v, const float *q, float *out,
                                   const kiln_attn_params *p, kiln_threadpool *pool) {
    if (n_kv <= 0) return;
    ((kv_paged *)kvs[0])->pool->dev->store_attend_batch(kvs, n, n_kv, layer, k, v, q, out, p, pool);
}
static uint64_t dev_graph_key(const kiln_kv *kv, int n_new) {
    const kv_device_ops *ops = ((const kv_paged *)kv)->pool->dev;
    return ops->graph_key ? ops->graph_key(kv, n_new) : 0;
}

static const kiln_kv_vtable paged_dev_vt = {
    .kind = "paged-device",
    .free = paged_free,
    .reserve = paged_reserve,
    .store = dev_store,
    .attend = dev_attend,
    .commit = paged_commit,
    .truncate = paged_truncate,
    .bytes_used = paged_bytes,
    .layer_state = paged_layer_state,
    .store_attend_batch = dev_store_attend_batch,
    .graph_key = dev_graph_key,
};

kiln_status kv_paged_new(kv_pool *pool, bool own_pool, int max_tokens, kiln_kv **out) {
    *out = NULL;
    kv_paged *c = calloc(1, sizeof *c);
    if (!c) return kiln_error(KILN_ERR_OOM, "out of memory");
    c->base.vt = pool->be ? &paged_dev_vt : &paged_vt;
    c->pool = pool;
    c->dev_dirty = INT_MAX;
    c->max_tokens = max_tokens;
    int nl = pool->n_layers;
    c->base.n_layers = nl;
    c->base.layers = malloc((size_t)nl * sizeof *c->base.layers);
    c->table = calloc((size_t)nl, sizeof *c->table);
    c->state = calloc((size_t)nl, sizeof *c->state);
    c->blk = malloc((size_t)nl * sizeof *c->blk);
    if (!c->base.layers || !c->table || !c->state || !c->blk) goto oom;
    memcpy(c->base.layers, pool->layers, (size_t)nl * sizeof *c->base.layers);
    kiln_backend *be = pool->be;
    for (int l = 0; l < nl; l++) {
        const int64_t sf = pool->layers[l].state_floats;
        if (sf <= 0) continue;
        if (be) { /* zeroed device memory, read and updated in place by the recurrent ops */
            if (!(c->state[l] = be->alloc(be, (size_t)sf * sizeof(float)))) goto oom;
            be->zero(be, c->state[l], sf);
        } else if (!(c->state[l] = calloc((size_t)sf, sizeof(float)))) {
            goto oom;
        }
    }
    if (be && pool->n_attn_layers > 0) {
        c->dev_blocks = (max_tokens + pool->block_tokens - 1) / pool->block_tokens;
        if (c->dev_blocks < 1) c->dev_blocks = 1;
        c->dev_table = be->alloc(be, (size_t)c->dev_blocks * (size_t)nl * sizeof(int32_t));
        if (!c->dev_table) goto oom;
    }
    if (grow_tables(c, 1) != KILN_OK) goto oom;
    c->own_pool = own_pool;
    *out = &c->base;
    return KILN_OK;
oom:
    paged_free(&c->base); /* own_pool still false: the caller keeps the pool */
    return kiln_error(KILN_ERR_OOM, "out of memory for a paged KV cache");
}

kiln_status kv_paged_fork(kiln_kv *src_kv, kiln_kv **out) {
    *out = NULL;
    if (!kv_is_paged(src_kv)) return kiln_error(KILN_ERR_INVALID_ARG, "kv fork: not a paged cache");
    kv_paged *s = (kv_paged *)src_kv;
    if (s->own_pool)
        return kiln_error(KILN_ERR_INVALID_ARG, "kv fork: the cache owns a private pool");
    kiln_kv *kv;
    KILN_TRY(kv_paged_new(s->pool, false, s->max_tokens, &kv));
    kv_paged *c = (kv_paged *)kv;
    if (grow_tables(c, s->n_alloc) != KILN_OK || grow_tokens(c, s->known) != KILN_OK) {
        paged_free(kv);
        return kiln_error(KILN_ERR_OOM, "kv fork: out of memory");
    }
    pthread_mutex_lock(&s->pool->mu);
    for (int l = 0; l < kv->n_layers; l++)
        for (int b = 0; c->table[l] && b < s->n_alloc; b++) {
            c->table[l][b] = s->table[l][b];
            if (c->table[l][b] >= 0) kv_pool_ref_locked(s->pool, c->table[l][b]);
        }
    pthread_mutex_unlock(&s->pool->mu);
    for (int l = 0; l < kv->n_layers; l++) {
        if (!c->state[l]) continue;
        const int64_t sf = kv->layers[l].state_floats;
        if (s->pool->be)
            s->pool->be->copy2d(s->pool->be, c->state[l], sf, s->state[l], sf, 1, sf);
        else
            memcpy(c->state[l], s->state[l], (size_t)sf * sizeof(float));
    }
    c->n_alloc = s->n_alloc;
    mark_dirty(c, 0);
    if (s->known) memcpy(c->tokens, s->tokens, (size_t)s->known * sizeof *c->tokens);
    c->known = s->known;
    if (s->n_hashed) memcpy(c->hashes, s->hashes, (size_t)s->n_hashed * sizeof *c->hashes);
    c->n_hashed = s->n_hashed;
    kv->len = src_kv->len;
    *out = kv;
    return KILN_OK;
}

void kiln_kv_note_tokens(kiln_kv *kv, const int32_t *tokens, int n) {
    if (!kv_is_paged(kv) || n <= 0) return;
    kv_paged *c = (kv_paged *)kv;
    if (c->known < kv->len || grow_tokens(c, kv->len + n) != KILN_OK) return;
    memcpy(c->tokens + kv->len, tokens, (size_t)n * sizeof *tokens);
    c->known = kv->len + n;
}

kiln_status kiln_seq_prefix_attach(kiln_seq *seq, const int32_t *tokens, int n_tokens,
                                   int *n_reused) {
    if (!seq || !n_reused || n_tokens < 0 || (n_tokens > 0 && !tokens))
        return kiln_error(KILN_ERR_INVALID_ARG, "kiln_seq_prefix_attach: bad argument");
    *n_reused = 0;
    kiln_kv *kv = seq->kv;
    if (kv->len != 0)
        return kiln_error(KILN_ERR_INVALID_ARG,
                          "kiln_seq_prefix_attach: the sequence must be "
                          "empty (it holds %d tokens)",
                          kv->len);
    if (!kv_is_paged(kv) || !((kv_paged *)kv)->pool->prefix_ok) return KILN_OK; /* windows */
    kv_paged *c = (kv_paged *)kv;
    kv_pool *p = c->pool;
    const int B = p->block_tokens, max_full = n_tokens / B;
    KILN_TRY(grow_tables(c, max_full + 1));
    KILN_TRY(grow_tokens(c, n_tokens));
    pthread_mutex_lock(&p->mu);
    int m = 0;
    for (uint64_t h = 0; m < max_full; m++) {
        h = kv_prefix_hash(p, h, tokens + (size_t)m * B);
        if (!kv_prefix_lookup_locked(p, h, tokens + (size_t)m * B, NULL, 0)) break;
        c->hashes[m] = h;
    }
    /* keep at least one token to forward, so the caller gets logits for the last one */
    int reuse = m * B < n_tokens ? m * B : n_tokens - 1;
    if (reuse < 0) reuse = 0;
    if (p->snap_floats > 0) { /* hybrid: the longest run that ends on a snapshot */
        int b = reuse / B;
        while (b > 0 && !restore_snapshot_locked(c, b, tokens)) b--;
        reuse = b * B;
    }
    int nblk = (reuse + B - 1) / B;
    for (int b = nblk - 1; b >= 0; b--) { /* leaf first: the root ends most recently used */
        kv_prefix_lookup_locked(p, c->hashes[b], tokens + (size_t)b * B, c->blk, ++p->tick);
        for (int l = 0; l < kv->n_layers; l++) {
            if (!c->table[l] || c->blk[l] < 0) continue;
            c->table[l][b] = c->blk[l];
            kv_pool_ref_locked(p, c->blk[l]);
        }
    }
    pthread_mutex_unlock(&p->mu);
    c->n_alloc = nblk;
    mark_dirty(c, 0);
    c->n_hashed = reuse / B;
    memcpy(c->tokens, tokens, (size_t)reuse * sizeof *tokens);
    c->known = reuse;
    kv->len = reuse;
    *n_reused = reuse;
    return KILN_OK;
}
