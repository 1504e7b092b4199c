/* kv_cache.cu — the device KV cache: contiguous per sequence, one K and one V buffer per
 * attention layer ([capacity, n_kv_heads*head_dim]), f32, f16 or bf16 storage, grown by doubling
 * up to max_tokens; recurrent layers (Gated DeltaNet) get their fixed f32 state in device memory
 * (layer_state), zeroed at creation and by truncate(0). Sliding-window layers keep every token
 * (attention limits the window); a ring buffer would save memory there. attend() runs
 * attention.cu's kernel on the buffers in place. */
#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/norm_rope.cuh"
#include "util/hash.h"

#include <stdlib.h>
#include <string.h>

typedef struct kcu_kv {
    kiln_kv base;
    kiln_backend *be;
    int dtype; /* KILN_DT_F32 / F16 / BF16 */
    int max_tokens, cap;
    void **k, **v; /* [n_layers] device buffers (NULL for non-attention layers) */
    float **state; /* [n_layers] device [state_floats] of recurrent layers (else NULL) */
} kcu_kv;

static size_t elem_size(int dt) {
    return dt == KILN_DT_F32 ? 4 : 2;
}

/* One launch stores K and V of up to KCU_ATT_MAX_SEQ sequences (blockIdx.y = sequence); the
 * destinations travel in the kernel parameters, so no descriptor is copied to the device. */
struct kv_store_seq {
    void *kd, *vd; /* the layer's K / V buffer */
    int row;       /* first cache row written (the cache's length) unless pos is given */
    int t0, n;     /* rows t0..t0+n-1 of the stacked k / v */
};
struct kv_store_launch {
    const float *k, *v;
    const int32_t *pos; /* [T] device positions of the stacked rows, or NULL: row = S.row */
    int64_t kw, vw;
    int dt;
    kv_store_seq s[KCU_ATT_MAX_SEQ];
};

__global__ void k_kv_store(const __grid_constant__ kv_store_launch L) {
    KCU_PDL_ENTER();
    const kv_store_seq &S = L.s[blockIdx.y];
    int64_t nk = (int64_t)S.n * L.kw, nv = (int64_t)S.n * L.vw;
    const float *ks = L.k + (int64_t)S.t0 * L.kw, *vs = L.v + (int64_t)S.t0 * L.vw;
    const int64_t row = L.pos ? L.pos[S.t0] : S.row;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nk + nv;
         i += (int64_t)gridDim.x * blockDim.x) {
        if (i < nk)
            kcu_kv_put(S.kd, row * L.kw + i, ks[i], L.dt);
        else
            kcu_kv_put(S.vd, row * L.vw + i - nk, vs[i - nk], L.dt);
    }
}

/* A decode step's q/k prep and K/V store in one launch: grid (sequence = token, head) over the q
 * heads (RMSNorm + RoPE in place), the k heads (the same, then the row stored at the token's
 * position) and the v heads (the row stored). As qk_norm_rope followed by k_kv_store. */
struct qk_store_launch {
    float *q, *k;
    const float *v;
    const int32_t *pos; /* [T] device positions (= cache rows) */
    const float *inv_freq, *q_norm, *k_norm;
    float eps;
    int n_heads, n_kv_heads, head_dim, v_head_dim, half, dt;
    void *kd[KCU_ATT_MAX_SEQ], *vd[KCU_ATT_MAX_SEQ];
};

__global__ void k_qk_norm_rope_store(const __grid_constant__ qk_store_launch L) {
    KCU_PDL_ENTER();
    extern __shared__ float sh[]; /* [head_dim + 33] */
    const int t = blockIdx.x, hh = blockIdx.y;
    const int64_t row = L.pos[t];
    if (hh < L.n_heads + L.n_kv_heads) {
        const bool is_q = hh < L.n_heads;
        float *xh = is_q ? L.q + ((int64_t)t * L.n_heads + hh) * L.head_dim
                         : L.k + ((int64_t)t * L.n_kv_heads + (hh - L.n_heads)) * L.head_dim;
        kcu_norm_rope_head(xh, is_q ? L.q_norm : L.k_norm, (float)row, L.head_dim, L.half,
                           L.inv_freq, L.eps, sh);
        if (is_q) return;
        const int64_t base = (row * L.n_kv_heads + (hh - L.n_heads)) * L.head_dim;
        for (int i = threadIdx.x; i < L.head_dim; i += blockDim.x)
            kcu_kv_put(L.kd[t], base + i, xh[i], L.dt); /* this thread's own write above */
        return;
    }
    const int h = hh - L.n_heads - L.n_kv_heads;
    const float *src = L.v + ((int64_t)t * L.n_kv_heads + h) * L.v_head_dim;
    const int64_t base = (row * L.n_kv_heads + h) * L.v_head_dim;
    for (int i = threadIdx.x; i < L.v_head_dim; i += blockDim.x)
        kcu_kv_put(L.vd[t], base + i, src[i], L.dt);
}

static void kv_free(kiln_kv *base) {
    kcu_kv *kv = (kcu_kv *)base;
    if (!kv) return;
    for (int l = 0; l < base->n_layers; l++) {
        if (kv->k && kv->k[l]) kv->be->free(kv->be, kv->k[l]);
        if (kv->v && kv->v[l]) kv->be->free(kv->be, kv->v[l]);
    }
    for (int l = 0; kv->state && l < base->n_layers; l++)
        if (kv->state[l]) kv->be->free(kv->be, kv->state[l]);
    free(kv->k);
    free(kv->v);
    free(kv->state);
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

/* Stores the new K/V rows of kvs[0..n_kv) (n_kv <= KCU_ATT_MAX_SEQ, all of one dtype) in one
 * launch; entry i's rows start at row t0[i] of k / v. */
static void store_chunk(kcu_kv *const *kvs, const int *n, const int *t0, int n_kv, int layer,
                        const float *k, const float *v, const int32_t *pos) {
    kcu_state *st = kcu_st(kvs[0]->be);
    const kiln_kv_layer_desc *d = &kvs[0]->base.layers[layer];
    if (!d->is_attention) return;
    kv_store_launch L;
    L.k = k, L.v = v;
    L.pos = pos;
    L.kw = (int64_t)d->n_kv_heads * d->head_dim;
    L.vw = (int64_t)d->n_kv_heads * d->v_head_dim;
    L.dt = kvs[0]->dtype;
    int max_n = 0;
    for (int i = 0; i < n_kv; i++) {
        const kcu_kv *kv = kvs[i];
        if (kv->base.len + n[i] > kv->cap) {
            kcu_report(st, "kv store", "store() past reserve()", __FILE__, __LINE__);
            return;
        }
        L.s[i].kd = kv->k[layer];
        L.s[i].vd = kv->v[layer];
        L.s[i].row = kv->base.len;
        L.s[i].t0 = t0[i];
        L.s[i].n = n[i] > 0 ? n[i] : 0;
        if (n[i] > max_n) max_n = n[i];
    }
    if (max_n <= 0) return;
    dim3 grid(kcu_blocks(max_n * (L.kw + L.vw), 256, 4096), n_kv);
    KCU_LAUNCH(st, k_kv_store, grid, 256, 0, L);
    KCU_LAUNCHED(st);
}

static void kv_store(kiln_kv *base, int layer, const float *k, const float *v, int n) {
    kcu_kv *kv = (kcu_kv *)base;
    int t0 = 0;
    if (n <= 0) return;
    store_chunk(&kv, &n, &t0, 1, layer, k, v, NULL);
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
    a.p.positions = NULL; /* rows of one sequence: its host-side length is the position */
    kcu_attention(kcu_st(kv->be), &a);
}

/* The q/k prep + K/V store kernel for decode steps the PREP kernel does not take: on unless
 * KILN_CUDA_QK_STORE=0 (kiln_cuda_set_qk_store, < 0 back to the environment). H200: Qwen3-0.6B bf16
 * batch 1 842 -> 864 tok/s against the separate launches. */
static int g_qk_store = -1;
extern "C" void kiln_cuda_set_qk_store(int on) {
    g_qk_store = on < 0 ? -1 : on != 0;
}
static bool qk_store_on(void) {
    if (g_qk_store < 0) {
        const char *e = getenv("KILN_CUDA_QK_STORE");
        g_qk_store = !(e && strcmp(e, "0") == 0);
    }
    return g_qk_store != 0;
}

/* Decode with p->prep as k_qk_norm_rope_store (one launch) instead of qk_norm_rope + store; the
 * caller then attends. False: not launched. */
static bool qk_prep_store(kiln_kv *const *kvs, const int *n, int n_kv, int layer, const float *k,
                          const float *v, const float *q, const kiln_attn_params *p) {
    const kcu_kv *kv0 = (const kcu_kv *)kvs[0];
    const kiln_kv_layer_desc *d = &kvs[0]->layers[layer];
    if (!qk_store_on() || !d->is_attention || n_kv > KCU_ATT_MAX_SEQ || !p->positions ||
        d->head_dim > 1024 || p->prep->rot_dim > d->head_dim)
        return false;
    qk_store_launch L;
    for (int i = 0; i < n_kv; i++) {
        const kcu_kv *kv = (const kcu_kv *)kvs[i];
        if (n[i] != 1 || kv->dtype != kv0->dtype || kv->base.len + 1 > kv->cap) return false;
        L.kd[i] = kv->k[layer];
        L.vd[i] = kv->v[layer];
    }
    L.q = (float *)q, L.k = (float *)k, L.v = v; /* the forward's activations (kv_cache.h) */
    L.pos = p->positions;
    L.inv_freq = p->prep->inv_freq, L.q_norm = p->prep->q_norm, L.k_norm = p->prep->k_norm;
    L.eps = p->prep->eps;
    L.n_heads = p->n_heads, L.n_kv_heads = d->n_kv_heads;
    L.head_dim = d->head_dim, L.v_head_dim = d->v_head_dim;
    L.half = p->prep->rot_dim / 2;
    L.dt = kv0->dtype;
    kcu_state *st = kcu_st(kv0->be);
    const int hd = d->head_dim;
    int threads = hd >= 256 ? 256 : hd > 64 ? 128 : 64;
    size_t smem = sizeof(float) * ((size_t)hd + 33);
    kcu_prof_begin(st);
    KCU_LAUNCH(st, k_qk_norm_rope_store,
               dim3((unsigned)n_kv, (unsigned)(p->n_heads + 2 * d->n_kv_heads)), threads, smem, L);
    KCU_LAUNCHED(st);
    kcu_prof_end(st, "qk_norm_rope + kv store");
    return true;
}

/* When the PREP kernel runs: 0 (default) never, 1 always, 2 for steps of at least 32 sequences.
 * Measured on the H200 (bf16, context 128-192, medians of 3) against k_attn's split launches:
 * batch 64 1.01x (Llama-3-8B 6617 -> 6685 tok/s, Qwen3-0.6B 14,567 -> 14,669), batch 1 slower
 * (8B 222 -> 205, 0.6B 847 -> 801: every split block preps q and k itself on the critical
 * path). Since the one-launch decode kernel takes every step (eighteenth session), the prep +
 * store launch before it beats PREP at batch 64 too: Qwen3-0.6B decode 17,706 -> 19,817 tok/s
 * without it on an H200, 16,993 -> 18,528 on an H100, so it is off. */
static int g_attn_prep = -1;
extern "C" void kiln_cuda_set_attn_prep(int on) {
    g_attn_prep = on < 0 ? -1 : on;
}
static bool attn_prep_on(int n_seq) {
    if (g_attn_prep < 0) {
        const char *e = getenv("KILN_CUDA_ATT_PREP");
        g_attn_prep = e && *e ? atoi(e) : 0;
    }
    return g_attn_prep == 1 || (g_attn_prep == 2 && n_seq >= 32);
}

/* The geometry of a batched attention launch on layer d of caches like kv0 (stacked q / out). */
static kcu_attn_args attn_args(const kcu_kv *kv0, const kiln_kv_layer_desc *d, const float *q,
                               float *out, const kiln_attn_params *p) {
    kcu_attn_args a;
    memset(&a, 0, sizeof a);
    a.q = q;
    a.out = out;
    a.kv_dtype = kv0->dtype;
    a.n_kv_heads = d->n_kv_heads;
    a.head_dim = d->head_dim;
    a.v_head_dim = d->v_head_dim;
    a.window = d->window;
    a.p = *p;
    return a;
}

/* Decode with p->prep: one PREP attention launch per KCU_ATT_MAX_SEQ sequences (q/k norm +
 * RoPE, the store and the merge inside). False: nothing launched. */
static bool store_attend_prep(kiln_kv *const *kvs, const int *n, int n_kv, int layer,
                              const float *k, const float *v, const float *q, float *out,
                              const kiln_attn_params *p) {
    const kcu_kv *kv0 = (const kcu_kv *)kvs[0];
    const kiln_kv_layer_desc *d = &kvs[0]->layers[layer];
    if (!attn_prep_on(n_kv) || !d->is_attention || n_kv > KCU_ATT_MAX_SEQ || !p->positions)
        return false;
    kcu_attn_seq seqs[KCU_ATT_MAX_SEQ];
    for (int i = 0; i < n_kv; i++) {
        const kcu_kv *kv = (const kcu_kv *)kvs[i];
        if (n[i] != 1 || kv->dtype != kv0->dtype || kv->base.len + 1 > kv->cap) return false;
        seqs[i].k = kv->k[layer];
        seqs[i].v = kv->v[layer];
        seqs[i].pos0 = kv->base.len;
        seqs[i].n = 1;
        seqs[i].t0 = i;
    }
    kcu_attn_args a = attn_args(kv0, d, q, out, p);
    kcu_state *st = kcu_st(kv0->be);
    kcu_prof_begin(st);
    bool ok = kcu_attention_decode_prep(st, &a, seqs, n_kv, k, v);
    kcu_prof_end(st, "attention (q/k prep + store inside)");
    return ok;
}

/* The batch hook (kiln_kv_vtable.store_attend_batch): one store launch and one attention launch
 * per KCU_ATT_MAX_SEQ sequences, instead of three launches per sequence; decode steps given
 * p->prep take one launch in all (store_attend_prep), other steps with it run qk_norm_rope
 * first. */
static void kv_store_attend_batch(kiln_kv *const *kvs, const int *n, int n_kv, int layer,
                                  const float *k, const float *v, const float *q, float *out,
                                  const kiln_attn_params *p, kiln_threadpool *pool) {
    if (n_kv <= 0) return;
    const kcu_kv *kv0 = (const kcu_kv *)kvs[0];
    const kiln_kv_layer_desc *d = &kvs[0]->layers[layer];
    const unsigned long long seq0 = kcu_st(kv0->be)->launch_seq; /* a hint given before the op */
    kiln_attn_params plain;
    bool stored = !k; /* the K/V rows already went in with the q/k prep, or k == NULL: attend
                       * only (kv_cache.h) */
    if (p->prep && k) {
        if (store_attend_prep(kvs, n, n_kv, layer, k, v, q, out, p)) return;
        stored = qk_prep_store(kvs, n, n_kv, layer, k, v, q, p);
    }
    if (p->prep && !stored) {
        int64_t T = 0;
        for (int i = 0; i < n_kv; i++) T += n[i];
        if (!p->positions) {
            kcu_report(kcu_st(kv0->be), "kv store_attend", "q/k prep without positions", __FILE__,
                       __LINE__);
            return;
        }
        /* q and k are the forward's activations: the prep may overwrite them (kv_cache.h) */
        kcu_qk_norm_rope(kv0->be, (float *)q, (float *)k, p->positions, T, p->n_heads,
                         d->n_kv_heads, d->head_dim, p->prep->rot_dim, p->prep->inv_freq,
                         p->prep->q_norm, p->prep->k_norm, p->prep->eps);
    }
    if (p->prep) {
        plain = *p;
        plain.prep = NULL;
        p = &plain;
    }
    bool same = d->is_attention;
    for (int i = 1; same && i < n_kv; i++) same = ((const kcu_kv *)kvs[i])->dtype == kv0->dtype;
    if (!same) { /* not expected within one model: fall back to the per-sequence calls */
        for (int i = 0, t = 0; i < n_kv; t += n[i], i++) {
            int64_t kw = (int64_t)d->n_kv_heads * d->head_dim;
            int64_t qw = (int64_t)p->n_heads * d->head_dim,
                    ow = (int64_t)p->n_heads * d->v_head_dim;
            if (k)
                kvs[i]->vt->store(kvs[i], layer, k + t * kw,
                                  v + t * (int64_t)d->n_kv_heads * d->v_head_dim, n[i]);
            kvs[i]->vt->attend(kvs[i], layer, q + t * qw, n[i], out + t * ow, p, pool);
        }
        return;
    }
    kcu_kv *ch[KCU_ATT_MAX_SEQ];
    int t0[KCU_ATT_MAX_SEQ];
    kcu_attn_seq seqs[KCU_ATT_MAX_SEQ];
    kcu_attn_args a = attn_args(kv0, d, q, out, p);
    int t = 0;
    for (int i0 = 0; i0 < n_kv; i0 += KCU_ATT_MAX_SEQ) {
        int c = n_kv - i0 < KCU_ATT_MAX_SEQ ? n_kv - i0 : KCU_ATT_MAX_SEQ;
        for (int i = 0; i < c; i++) {
            ch[i] = (kcu_kv *)kvs[i0 + i];
            t0[i] = t;
            seqs[i].k = ch[i]->k[layer];
            seqs[i].v = ch[i]->v[layer];
            seqs[i].pos0 = ch[i]->base.len;
            seqs[i].n = n[i0 + i];
            seqs[i].t0 = t;
            t += n[i0 + i];
        }
        kcu_state *st = kcu_st(kv0->be);
        kcu_prof_begin(st);
        if (!stored) store_chunk(ch, n + i0, t0, c, layer, k, v, p->positions);
        kcu_prof_end(st, "kv store");
        kcu_prof_begin(st);
        /* the last launch writes out: a feeds_next hint for it holds across the store */
        if (i0 + c == n_kv) kcu_qg_hint_carry(st, out, seq0);
        kcu_attention_batch(st, &a, seqs, c);
        kcu_prof_end(st, "attention");
    }
}

static uint64_t kv_graph_key(const kiln_kv *base, int n_new) {
    const kcu_kv *kv = (const kcu_kv *)base;
    uint64_t h = kiln_hash_mix(kiln_hash_mix(0, (uint64_t)kv->dtype), (uint64_t)kv->cap);
    h = kiln_hash_mix(h, (uint64_t)n_new);
    /* the attention split geometry of decode follows the bucket of the key count */
    h = kiln_hash_mix(h, (uint64_t)kcu_attn_keys_bucket(base->len + n_new));
    for (int l = 0; l < base->n_layers; l++)
        h = kiln_hash_mix(kiln_hash_mix(h, (uintptr_t)kv->k[l]), (uintptr_t)kv->v[l]);
    return h;
}

static void kv_commit(kiln_kv *base, int n) {
    base->len += n;
}

static kiln_status kv_truncate(kiln_kv *base, int len) {
    kcu_kv *kv = (kcu_kv *)base;
    if (len < 0 || len > base->len)
        return kiln_error(KILN_ERR_INVALID_ARG, "cuda kv: truncate to %d of %d tokens", len,
                          base->len);
    bool has_state = false;
    for (int l = 0; l < base->n_layers; l++) has_state |= kv->state[l] != NULL;
    if (has_state && len != 0 && len != base->len)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "cuda kv: a recurrent state cannot be rolled back to %d of %d tokens "
                          "(only to 0)",
                          len, base->len);
    if (len == 0 && has_state) {
        kcu_state *st = kcu_st(kv->be);
        for (int l = 0; l < base->n_layers; l++)
            if (kv->state[l])
                KCU_CHECK(st, cudaMemsetAsync(kv->state[l], 0,
                                              (size_t)base->layers[l].state_floats * sizeof(float),
                                              st->stream));
    }
    base->len = len;
    return KILN_OK;
}

static float *kv_layer_state(kiln_kv *base, int layer) {
    return ((kcu_kv *)base)->state[layer];
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
    int64_t state = 0;
    for (int l = 0; l < base->n_layers; l++)
        if (kv->state[l]) state += base->layers[l].state_floats * (int64_t)sizeof(float);
    return per_tok * kv->cap + state;
}

static const kiln_kv_vtable kcu_kv_vt = {
    .kind = "cuda-contiguous",
    .free = kv_free,
    .reserve = kv_reserve,
    .store = kv_store,
    .attend = kv_attend,
    .commit = kv_commit,
    .truncate = kv_truncate,
    .bytes_used = kv_bytes_used,
    .layer_state = kv_layer_state,
    .store_attend_batch = kv_store_attend_batch,
    .graph_key = kv_graph_key,
    .prep_inside = true,
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
                          "--kv %s: the contiguous CUDA caches are f32, f16 and bf16 (paged "
                          "device caches are off: KILN_CUDA_PAGED=0)",
                          kind);
    /* --kv f16/bf16 select a paged pool on the CPU; on the GPU they are contiguous device caches
     * unless blocks were asked for explicitly (--kv-block / --kv-budget) */
    if (opts && opts->paged && (opts->block_tokens > 0 || opts->budget_bytes > 0))
        return kiln_error(
            KILN_ERR_UNSUPPORTED,
            "cuda kv: paged caches (--kv-block, --kv-budget) are off (KILN_CUDA_PAGED=0)");
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
    kv->state = (float **)calloc((size_t)n_layers, sizeof(float *));
    kv->be = be;
    kv->dtype = dt;
    kv->max_tokens = max_tokens;
    if (!kv->base.layers || !kv->k || !kv->v || !kv->state) {
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
        /* recurrent layers (Gated DeltaNet conv + delta state): zeroed device memory */
        if (!d->is_attention && d->state_floats > 0) {
            size_t bytes = (size_t)d->state_floats * sizeof(float);
            kcu_state *st = kcu_st(be);
            kv->state[l] = (float *)be->alloc(be, bytes);
            if (!kv->state[l] ||
                !KCU_CHECK(st, cudaMemsetAsync(kv->state[l], 0, bytes, st->stream))) {
                kv_free(&kv->base);
                return kiln_error(KILN_ERR_OOM,
                                  "cuda kv: no device memory for the %lld-byte "
                                  "recurrent state of layer %d",
                                  (long long)bytes, l);
            }
        }
    }
    *out = &kv->base;
    return KILN_OK;
}
