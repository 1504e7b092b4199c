/* llama.c — the Llama family: `llama` (Llama 2/3, MiniCPM5 layout), `qwen2` (qkv bias) and
 * `qwen3` (per-head q/k RMSNorm). Pre-norm decoder blocks: RMSNorm -> GQA attention with RoPE ->
 * residual -> RMSNorm -> SwiGLU MLP -> residual; final RMSNorm; LM head (tied or not).
 *
 * The forward runs a batch of sequences: the new tokens of every entry are stacked into one
 * [T, hidden] activation so every matmul sees all T rows at once; only attention goes entry by
 * entry, each against its own cache. */
#include "model/model.h"

#include "util/hash.h"
#include "util/log.h"
#include "util/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct llama_layer {
    float *attn_norm;   /* [hidden] */
    float *ffn_norm;    /* [hidden] */
    float *q_norm;      /* [head_dim] (qwen3) or NULL */
    float *k_norm;      /* [head_dim] (qwen3) or NULL */
    kiln_matrix wq;     /* [n_heads*head_dim, hidden] (+bias for qwen2) */
    kiln_matrix wk;     /* [n_kv_heads*head_dim, hidden] */
    kiln_matrix wv;     /* [n_kv_heads*head_dim, hidden] */
    kiln_matrix wo;     /* [hidden, n_heads*head_dim] */
    kiln_matrix w_gate; /* [ffn, hidden] */
    kiln_matrix w_up;   /* [ffn, hidden] */
    kiln_matrix w_down; /* [hidden, ffn] */
} llama_layer;

typedef struct llama_state {
    int hidden, n_heads, n_kv_heads, head_dim, ffn, vocab, n_layers;
    int rot; /* rotated dims of a head (partial_rotary_factor) */
    float eps;
    kiln_matrix embed;   /* [vocab, hidden] */
    kiln_matrix lm_head; /* [vocab, hidden] (a copy of embed's view when tied) */
    bool tied;
    float *final_norm;   /* [hidden] */
    float *inv_freq;     /* [rot/2] on the backend */
    llama_layer *layers; /* [n_layers] */
    /* scratch, grown to the largest batch seen */
    kiln_scratch act;
    kiln_scratch ids;
    kiln_scratch logits; /* [R, vocab] when it does not fit in gate/up (kept: no alloc per step) */
} llama_state;

static bool llama_matches(const kiln_config *cfg) {
    return strcmp(cfg->model_type, "llama") == 0 || strcmp(cfg->model_type, "qwen2") == 0 ||
           strcmp(cfg->model_type, "qwen3") == 0 || strcmp(cfg->model_type, "mistral") == 0;
}

static void llama_free(kiln_model *m) {
    llama_state *s = m->family_state;
    if (!s) return;
    if (s->layers) {
        for (int i = 0; i < s->n_layers; i++) {
            llama_layer *L = &s->layers[i];
            kiln_weights_free_vector(m, L->attn_norm);
            kiln_weights_free_vector(m, L->ffn_norm);
            kiln_weights_free_vector(m, L->q_norm);
            kiln_weights_free_vector(m, L->k_norm);
            kiln_weights_free_matrix(m, &L->wq);
            kiln_weights_free_matrix(m, &L->wk);
            kiln_weights_free_matrix(m, &L->wv);
            kiln_weights_free_matrix(m, &L->wo);
            kiln_weights_free_matrix(m, &L->w_gate);
            kiln_weights_free_matrix(m, &L->w_up);
            kiln_weights_free_matrix(m, &L->w_down);
        }
        free(s->layers);
    }
    kiln_weights_free_matrix(m, &s->embed);
    if (!s->tied) kiln_weights_free_matrix(m, &s->lm_head);
    kiln_weights_free_vector(m, s->final_norm);
    if (s->inv_freq) m->be->free(m->be, s->inv_freq);
    kiln_scratch_free(m->be, &s->act);
    kiln_scratch_free(m->be, &s->ids);
    kiln_scratch_free(m->be, &s->logits);
    free(s);
    m->family_state = NULL;
}

static kiln_status load_layer(kiln_model *m, llama_state *s, int i) {
    llama_layer *L = &s->layers[i];
    char p[256], n[320];
    bool qkv_bias = m->cfg.attention_bias;
    int q_dim = s->n_heads * s->head_dim, kv_dim = s->n_kv_heads * s->head_dim;
    snprintf(p, sizeof p, "model.layers.%d", i);
    snprintf(n, sizeof n, "%s.input_layernorm.weight", p);
    KILN_TRY(kiln_weights_vector(m, n, s->hidden, false, &L->attn_norm));
    snprintf(n, sizeof n, "%s.post_attention_layernorm.weight", p);
    KILN_TRY(kiln_weights_vector(m, n, s->hidden, false, &L->ffn_norm));
    if (strcmp(m->cfg.model_type, "qwen3") == 0) {
        snprintf(n, sizeof n, "%s.self_attn.q_norm.weight", p);
        KILN_TRY(kiln_weights_vector(m, n, s->head_dim, false, &L->q_norm));
        snprintf(n, sizeof n, "%s.self_attn.k_norm.weight", p);
        KILN_TRY(kiln_weights_vector(m, n, s->head_dim, false, &L->k_norm));
    }
    /* q/k/v and gate/up read the same x: a backend may keep each set as one matrix */
    char nq[320], nk[320], nv[320], ng[320], nu[320];
    snprintf(nq, sizeof nq, "%s.self_attn.q_proj", p);
    snprintf(nk, sizeof nk, "%s.self_attn.k_proj", p);
    snprintf(nv, sizeof nv, "%s.self_attn.v_proj", p);
    const char *const qkv[3] = {nq, nk, nv};
    const int64_t qkv_rows[3] = {q_dim, kv_dim, kv_dim};
    kiln_matrix qkv_m[3];
    KILN_TRY(kiln_weights_matrices(m, 3, qkv, qkv_rows, s->hidden, qkv_bias, qkv_m));
    L->wq = qkv_m[0], L->wk = qkv_m[1], L->wv = qkv_m[2];
    snprintf(n, sizeof n, "%s.self_attn.o_proj", p);
    KILN_TRY(kiln_weights_matrix(m, n, s->hidden, q_dim, false, &L->wo));
    snprintf(ng, sizeof ng, "%s.mlp.gate_proj", p);
    snprintf(nu, sizeof nu, "%s.mlp.up_proj", p);
    const char *const gu[2] = {ng, nu};
    const int64_t gu_rows[2] = {s->ffn, s->ffn};
    kiln_matrix gu_m[2];
    KILN_TRY(kiln_weights_matrices(m, 2, gu, gu_rows, s->hidden, m->cfg.mlp_bias, gu_m));
    L->w_gate = gu_m[0], L->w_up = gu_m[1];
    snprintf(n, sizeof n, "%s.mlp.down_proj", p);
    KILN_TRY(kiln_weights_matrix(m, n, s->hidden, s->ffn, m->cfg.mlp_bias, &L->w_down));
    return KILN_OK;
}

static kiln_status llama_load(kiln_model *m) {
    const kiln_config *c = &m->cfg;
    llama_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OOM, "out of memory");
    m->family_state = s;
    s->hidden = c->hidden_size;
    s->n_heads = c->n_heads;
    s->n_kv_heads = c->n_kv_heads;
    s->head_dim = c->head_dim;
    s->ffn = c->intermediate_size;
    s->vocab = c->vocab_size;
    s->n_layers = c->n_layers;
    s->eps = c->rms_norm_eps;
    if (s->ffn <= 0)
        return kiln_error(KILN_ERR_FORMAT, "%s/config.json: intermediate_size must be positive",
                          m->dir);
    s->layers = calloc((size_t)s->n_layers, sizeof *s->layers);
    if (!s->layers) return kiln_error(KILN_ERR_OOM, "out of memory");

    KILN_TRY(kiln_weights_embed_head(m, s->vocab, s->hidden, &s->embed, &s->lm_head, &s->tied,
                                     &s->final_norm));
    for (int i = 0; i < s->n_layers; i++) {
        KILN_TRY(load_layer(m, s, i));
        if (m->info.n_layers > 8 && (i + 1) % 4 == 0)
            KILN_LOG_I("loaded layer %d/%d", i + 1, s->n_layers);
    }

    KILN_TRY(kiln_rope_upload(m, s->head_dim, s->embed.dtype, &s->rot, &s->inv_freq));

    m->n_kv_layers = s->n_layers;
    m->kv_layers = calloc((size_t)s->n_layers, sizeof *m->kv_layers);
    if (!m->kv_layers) return kiln_error(KILN_ERR_OOM, "out of memory");
    for (int i = 0; i < s->n_layers; i++)
        m->kv_layers[i] = (kiln_kv_layer_desc){.n_kv_heads = s->n_kv_heads,
                                               .head_dim = s->head_dim,
                                               .v_head_dim = s->head_dim,
                                               .window = 0,
                                               .is_attention = true};
    return KILN_OK;
}

/* Activation buffers for T stacked tokens, carved out of one scratch allocation. */
typedef struct llama_acts {
    float *x;     /* [T, hidden] residual stream */
    float *h;     /* [T, hidden] normed input */
    float *q;     /* [T, n_heads*head_dim] */
    float *k;     /* [T, n_kv_heads*head_dim] */
    float *v;     /* [T, n_kv_heads*head_dim] */
    float *attn;  /* [T, n_heads*head_dim] */
    float *gate;  /* [T, ffn] */
    float *up;    /* [T, ffn] */
    float *rows;  /* [R, hidden] rows that need logits */
    int32_t *tok; /* [T] token ids */
    int32_t *pos; /* [T] positions */
} llama_acts;

static kiln_status llama_forward(kiln_model *m, kiln_batch_entry *e, int n_entries) {
    llama_state *s = m->family_state;
    kiln_backend *be = m->be;
    int64_t T, R;
    kiln_batch_sizes(e, n_entries, &T, &R);
    if (T == 0) return KILN_OK;
    const int64_t H = s->hidden, QD = (int64_t)s->n_heads * s->head_dim,
                  KVD = (int64_t)s->n_kv_heads * s->head_dim, F = s->ffn;
    size_t floats = (size_t)(T * (2 * H + 2 * QD + 2 * KVD + 2 * F) + R * H);
    KILN_TRY(kiln_scratch_reserve(be, &s->act, floats * sizeof(float)));
    KILN_TRY(kiln_scratch_reserve(be, &s->ids, (size_t)(2 * T) * sizeof(int32_t)));
    llama_acts a;
    float *p = s->act.ptr;
    a.x = p, p += T * H;
    a.h = p, p += T * H;
    a.q = p, p += T * QD;
    a.k = p, p += T * KVD;
    a.v = p, p += T * KVD;
    a.attn = p, p += T * QD;
    a.gate = p, p += T * F;
    a.up = p, p += T * F;
    a.rows = p;
    a.tok = s->ids.ptr;
    a.pos = a.tok + T;

    /* Reserve cache room first so a full cache fails before any state changes. */
    KILN_TRY(kiln_batch_reserve(e, n_entries));

    /* One store + attend call per layer for the whole batch when the caches offer it (device
     * caches: one launch instead of several per sequence); otherwise per cache as before. */
    kiln_batch_kv bkv;
    KILN_TRY(kiln_batch_begin(be, &bkv, e, n_entries, T, a.tok));
    const bool batch_kv = bkv.ok;
    const kiln_kv_vtable *bvt = bkv.vt;
    kiln_kv **kvs = bkv.kvs;
    int *kv_n = bkv.n;

    be->embed(be, a.x, a.tok, T, &s->embed);
    kiln_attn_params ap = {
        .n_heads = s->n_heads, .scale = 1.0f / sqrtf((float)s->head_dim), .positions = a.pos};
    const int rot = s->rot;
    /* decode steps (one token per sequence, up to kiln_graph_max_batch() sequences, batched K/V
     * calls) run as one recorded unit where the backend offers it: on CUDA a graph instead of
     * ~6 launches per layer, recorded once per key and replayed while the key holds. */
    const bool graph = kiln_decode_step_recordable(be, &bkv, T, n_entries);
    bool replayed = false;
    if (graph) replayed = be->graph_begin(be, kiln_decode_step_key(s, a.x, a.tok, &bkv, n_entries));
    /* fused ops (backend.h): each layer's input RMSNorm folded into the q/k/v multi-matmul, the
     * post-attention norm and SwiGLU into the gate/up one, each residual add into the matmul
     * producing it, q/k norm + RoPE as one op. h: work buffer of the norms and matmul outputs. */
    for (int l = 0; !replayed && l < s->n_layers; l++) {
        llama_layer *L = &s->layers[l];
        float *const qkv_out[3] = {a.q, a.k, a.v};
        const kiln_matrix *const qkv_w[3] = {&L->wq, &L->wk, &L->wv};
        be->matmul_norm(be, 3, qkv_out, a.x, a.h, T, qkv_w, L->attn_norm, s->eps, false);
        /* at a decode step, the o projection and the start of gate / up may move towards the
         * compute while attention runs (a hint: CUDA prefetches into L2 when given a budget) */
        if (be->prefetch && T == n_entries) {
            const kiln_matrix *const next[3] = {&L->wo, &L->w_gate, &L->w_up};
            be->prefetch(be, next, 3);
        }
        /* decode steps on caches that take the q/k norm + RoPE into their store + attention
         * (the CUDA contiguous cache: one kernel instead of three) */
        const kiln_qk_prep prep = {L->q_norm, L->k_norm, s->inv_freq, rot, s->eps};
        ap.prep = batch_kv && bvt->prep_inside && T == n_entries ? &prep : NULL;
        if (!ap.prep)
            be->qk_norm_rope(be, a.q, a.k, a.pos, T, s->n_heads, s->n_kv_heads, s->head_dim, rot,
                             s->inv_freq, L->q_norm, L->k_norm, s->eps);
        /* attention's output feeds the o projection (the hints below: each matmul feeds the
         * next; they let CUDA's quantized GEMV take x's digits from the op writing x instead of
         * a launch of their own) */
        if (batch_kv && be->feeds_next) be->feeds_next(be, a.attn, NULL, 0.0f, false);
        if (batch_kv)
            bvt->store_attend_batch(kvs, kv_n, n_entries, l, a.k, a.v, a.q, a.attn, &ap, be->pool);
        else
            for (int i = 0, t = 0; i < n_entries; t += e[i].n_tokens, i++) {
                kiln_kv *kv = e[i].seq->kv;
                kv->vt->store(kv, l, a.k + t * KVD, a.v + t * KVD, e[i].n_tokens);
                kv->vt->attend(kv, l, a.q + t * QD, e[i].n_tokens, a.attn + t * QD, &ap, be->pool);
            }
        if (be->feeds_next) be->feeds_next(be, a.x, L->ffn_norm, s->eps, false);
        be->matmul_add(be, a.x, a.attn, a.h, T, &L->wo);
        if (be->feeds_next) be->feeds_next(be, a.gate, NULL, 0.0f, false);
        be->matmul_norm_glu(be, a.gate, a.x, a.h, a.up, T, &L->w_gate, &L->w_up, L->ffn_norm,
                            s->eps, false, KILN_GLU_SILU);
        if (be->feeds_next && l + 1 < s->n_layers)
            be->feeds_next(be, a.x, s->layers[l + 1].attn_norm, s->eps, false);
        be->matmul_add(be, a.x, a.gate, a.h, T, &L->w_down);
    }
    if (graph && !replayed) be->graph_end(be);
    kiln_batch_kv_free(&bkv);
    kiln_batch_commit(e, n_entries);
    const kiln_logits_head head = {.hidden = H,
                                   .vocab = s->vocab,
                                   .final_norm = s->final_norm,
                                   .eps = s->eps,
                                   .lm_head = &s->lm_head};
    return kiln_logits_head_run(m, &head, e, n_entries, a.x, a.rows, &s->logits);
}

const kiln_family kiln_family_llama = {
    .name = "llama",
    .matches = llama_matches,
    .load = llama_load,
    .forward = llama_forward,
    .free = llama_free,
};
