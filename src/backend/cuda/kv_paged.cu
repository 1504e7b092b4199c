/* kv_paged.cu — the CUDA kernels of the paged KV caches whose pool lives in device memory
 * (kv_pool_new_on; the bookkeeping, prefix sharing and block tables are kv_paged.c's). Owns the
 * store kernel (new K/V rows encoded with the layer's codec straight into their blocks, through
 * the sequence's device block table) and kcu_kv_paged_ops, the kv_device_ops the backend offers:
 * store, attend (attention_paged.cu), the batched store + attend of a step, and the graph key of
 * a decode step (block tables and the pool stay at fixed addresses; the key changes with the
 * attention split bucket). */
#include "backend/cuda/attention_paged.cuh"
#include "backend/cuda/cuda_ops.h"

extern "C" {
#include "kv/kv_factory.h"
#include "kv/kv_pool.h"
#include "util/hash.h"
}

#include <stdlib.h>
#include <string.h>

struct pstore_seq {
    const int32_t *table;
    int row;   /* first position written (the cache's length) unless pos is given */
    int t0, n; /* rows t0..t0+n-1 of the stacked k / v */
};
struct pstore_launch {
    kcu_paged_layer L;
    const float *k, *v; /* [T, n_kv_heads*head_dim], [T, n_kv_heads*v_head_dim] */
    const int32_t *pos; /* [T] device positions of the stacked rows, or NULL: row = S.row */
    pstore_seq s[KCU_ATT_MAX_SEQ];
};

/* Block (token t = blockIdx.x of sequence blockIdx.z, kv head blockIdx.y): encodes that head's K
 * row then its V row into their records; rotation (FWHT) in shared memory by the whole block,
 * then the codec: plain formats one element per thread, group codecs one group per thread. */
__global__ void k_paged_store(const __grid_constant__ pstore_launch P) {
    KCU_PDL_ENTER();
    const pstore_seq &S = P.s[blockIdx.z];
    const kcu_paged_layer &L = P.L;
    const int t = blockIdx.x, h = blockIdx.y;
    if (t >= S.n) return;
    const int pos = (P.pos ? P.pos[S.t0] : S.row) + t;
    extern __shared__ float xs[];
    for (int which = 0; which < 2; which++) {
        const kcu_codec &c = which ? L.v : L.k;
        const int dim = which ? L.v_head_dim : L.head_dim;
        const float *src = (which ? P.v : P.k) + ((int64_t)(S.t0 + t) * L.n_kv_heads + h) * dim;
        __syncthreads(); /* xs of the K row consumed */
        for (int d = threadIdx.x; d < dim; d += blockDim.x)
            xs[d] = c.rotate ? src[d] * kcu_hadamard_sign(d) : src[d];
        if (c.rotate) { /* kiln_hadamard_rotate */
            kcu_fwht_rows(xs, 1, dim);
            const float s = kcu_inv_sqrt_rn(dim);
            for (int d = threadIdx.x; d < dim; d += blockDim.x) xs[d] = __fmul_rn(xs[d], s);
        }
        __syncthreads();
        uint8_t *rec = kcu_paged_rec(L, S.table, pos, h, which != 0);
        if (!rec) continue; /* cannot happen after reserve(); leaves the pool untouched */
        switch (c.kind) {
        case KV_CODEC_F32:
            for (int d = threadIdx.x; d < dim; d += blockDim.x) memcpy(rec + 4 * d, &xs[d], 4);
            break;
        case KV_CODEC_F16:
            for (int d = threadIdx.x; d < dim; d += blockDim.x)
                kcu_wr16(rec + 2 * d, kcu_f32_to_f16_bits(xs[d]));
            break;
        case KV_CODEC_BF16:
            for (int d = threadIdx.x; d < dim; d += blockDim.x)
                kcu_wr16(rec + 2 * d, __bfloat16_as_ushort(__float2bfloat16_rn(xs[d])));
            break;
        default: /* AFFINE, LLOYD */
            for (int g = threadIdx.x; g < dim / c.group; g += blockDim.x)
                kcu_encode_group(c, xs, dim, g, rec);
            break;
        }
    }
}

/* ---- the layer's geometry as kernel parameters ---- */

static void codec_params(const kv_codec *c, int dim, kcu_codec *o) {
    memset(o, 0, sizeof *o);
    o->kind = (int)c->kind;
    o->bits = c->bits;
    o->group = c->group > 0 ? c->group : dim;
    o->rotate = c->rotate ? 1 : 0;
    o->rec = (int)kv_codec_row_bytes(c, dim);
    if (c->kind == KV_CODEC_LLOYD) {
        for (int i = 0; i < c->lm.levels && i < (1 << KILN_LM_MAX_BITS); i++)
            o->centroid[i] = c->lm.centroid[i];
        for (int i = 0; i + 1 < c->lm.levels && i < (1 << KILN_LM_MAX_BITS) - 1; i++)
            o->boundary[i] = c->lm.boundary[i];
    }
}

static void layer_params(const kv_pool *p, int layer, kcu_paged_layer *L) {
    const kiln_kv_layer_desc *d = &p->layers[layer];
    const kv_layer_fmt *f = &p->fmt[layer];
    memset(L, 0, sizeof *L);
    L->data = p->data;
    L->block_bytes = (int64_t)p->block_bytes;
    L->v_offset = (int64_t)f->v_offset;
    L->block_tokens = p->block_tokens;
    L->table_stride = p->n_layers;
    L->layer = layer;
    L->n_kv_heads = d->n_kv_heads;
    L->head_dim = d->head_dim;
    L->v_head_dim = d->v_head_dim;
    L->window = d->window;
    codec_params(&f->k, d->head_dim, &L->k);
    codec_params(&f->v, d->v_head_dim, &L->v);
}

static kcu_state *pool_state(const kv_pool *p) {
    return kcu_st(p->be);
}

/* One store launch for kvs[0..n_kv) (n_kv <= KCU_ATT_MAX_SEQ); entry i's rows start at t0[i]. */
static void store_chunk(kiln_kv *const *kvs, const int *n, const int *t0, int n_kv, int layer,
                        const float *k, const float *v, const int32_t *pos) {
    const kv_pool *p = kv_paged_pool(kvs[0]);
    kcu_state *st = pool_state(p);
    pstore_launch P;
    memset(&P, 0, sizeof P);
    layer_params(p, layer, &P.L);
    P.k = k;
    P.v = v;
    P.pos = pos;
    int max_n = 0;
    for (int i = 0; i < n_kv; i++) {
        P.s[i].table = kv_paged_device_table(kvs[i]);
        P.s[i].row = kvs[i]->len;
        P.s[i].t0 = t0[i];
        P.s[i].n = n[i] > 0 ? n[i] : 0;
        if (n[i] > max_n) max_n = n[i];
    }
    if (max_n <= 0) return;
    int dim = P.L.head_dim > P.L.v_head_dim ? P.L.head_dim : P.L.v_head_dim;
    dim3 grid((unsigned)max_n, (unsigned)P.L.n_kv_heads, (unsigned)n_kv);
    KCU_LAUNCH(st, k_paged_store, grid, 128, (size_t)dim * sizeof(float), P);
    KCU_LAUNCHED(st);
}

static bool layer_ok(kiln_kv *kv, int layer) {
    return layer >= 0 && layer < kv->n_layers && kv->layers[layer].is_attention;
}

static void paged_store(kiln_kv *kv, int layer, const float *k, const float *v, int n) {
    if (n <= 0 || !layer_ok(kv, layer)) return;
    int t0 = 0;
    store_chunk(&kv, &n, &t0, 1, layer, k, v, NULL);
}

static void paged_attend(kiln_kv *kv, int layer, const float *q, int n, float *out,
                         const kiln_attn_params *p, kiln_threadpool *pool) {
    (void)pool;
    if (n <= 0 || !layer_ok(kv, layer)) return;
    const kv_pool *pp = kv_paged_pool(kv);
    kcu_paged_layer L;
    layer_params(pp, layer, &L);
    kiln_attn_params ap = *p;
    ap.positions = NULL; /* rows of one sequence: its host-side length is the position */
    kcu_paged_seq s = {kv_paged_device_table(kv), kv->len, n, 0};
    kcu_paged_attention(pool_state(pp), &L, q, out, &ap, &s, 1);
}

/* The batch hook: one store launch and one attention launch (plus merge / unrotation) per
 * KCU_ATT_MAX_SEQ sequences of the step. */
static void paged_store_attend_batch(kiln_kv *const *kvs, const int *n, int n_kv, int layer,
                                     const float *k, const float *v, const float *q, float *out,
                                     const kiln_attn_params *p, kiln_threadpool *pool) {
    (void)pool;
    if (n_kv <= 0 || !layer_ok(kvs[0], layer)) return;
    const kv_pool *pp = kv_paged_pool(kvs[0]);
    kcu_state *st = pool_state(pp);
    kcu_paged_layer L;
    layer_params(pp, layer, &L);
    int t0[KCU_ATT_MAX_SEQ];
    kcu_paged_seq seqs[KCU_ATT_MAX_SEQ];
    int t = 0;
    for (int i0 = 0; i0 < n_kv; i0 += KCU_ATT_MAX_SEQ) {
        int c = n_kv - i0 < KCU_ATT_MAX_SEQ ? n_kv - i0 : KCU_ATT_MAX_SEQ;
        for (int i = 0; i < c; i++) {
            kiln_kv *kv = kvs[i0 + i];
            t0[i] = t;
            seqs[i].table = kv_paged_device_table(kv);
            seqs[i].pos0 = kv->len;
            seqs[i].n = n[i0 + i];
            seqs[i].t0 = t;
            t += n[i0 + i];
        }
        if (k) { /* NULL: attend only (kv_cache.h) */
            kcu_prof_begin(st);
            store_chunk(kvs + i0, n + i0, t0, c, layer, k, v, p->positions);
            kcu_prof_end(st, "kv paged store");
        }
        kcu_prof_begin(st);
        kcu_paged_attention(st, &L, q, out, p, seqs, c);
        kcu_prof_end(st, "attention paged");
    }
}

/* Every launch of a step reads the pool and the block table at fixed addresses and positions
 * from device memory; what changes the launches is the token count and the split geometry,
 * which follows the bucket of the key count (attention_paged.cu). */
static uint64_t paged_graph_key(const kiln_kv *kv, int n_new) {
    const kv_pool *p = kv_paged_pool((kiln_kv *)kv);
    uint64_t h = kiln_hash_mix(kiln_hash_mix(0, (uintptr_t)p), (uintptr_t)p->data);
    h = kiln_hash_mix(h, (uintptr_t)kv_paged_device_table(kv));
    h = kiln_hash_mix(h, (uint64_t)n_new);
    return kiln_hash_mix(h, (uint64_t)kcu_attn_keys_bucket(kv->len + n_new));
}

extern "C" const kv_device_ops kcu_kv_paged_ops = {
    paged_store,
    paged_attend,
    paged_store_attend_batch,
    paged_graph_key,
};
