/* gemma.c — the Gemma family: `gemma3_text` and `gemma4_text`. Pre-norm blocks with extra
 * post-norms: x += post_attn_norm(attn(norm(x))); x += post_ffn_norm(geglu(pre_ffn_norm(x))).
 * Sliding and full attention layers (layer_types) each have their own RoPE (rope_parameters keyed
 * by layer type, or rope_local_base_freq); sliding layers set `window` in their KV desc so the
 * cache limits attention. The embedding is scaled by sqrt(hidden) rounded to the checkpoint dtype
 * (transformers keeps that scale in a buffer cast with the model), logits are soft-capped.
 * Gemma 3: RMSNorm as (1+w), attention scale query_pre_attn_scalar^-1/2.
 * Gemma 4: RMSNorm as w, scale 1 with an unweighted RMSNorm on values, proportional (partial) RoPE
 * on full layers, per-layer inputs (embed_tokens_per_layer + per_layer_model_projection, gated
 * per layer), layer_scalar, k_eq_v on full layers and KV-shared tail layers (read the cache of the
 * last earlier layer of the same type). Gemma 4 MoE (enable_moe_block, every layer): the dense MLP
 * and a routed expert block both read the post-attention residual r and are summed,
 *   x = r + post_ffn_norm(post_ffn_norm_1(mlp(pre_ffn_norm(r)))
 *                         + post_ffn_norm_2(experts(pre_ffn_norm_2(r))))
 * with the router on rmsnorm(r) * scale / sqrt(hidden): softmax over experts, top-k renormalised,
 * times per_expert_scale; experts are GeGLU with a fused [E, 2F, H] gate_up_proj.
 *
 * The forward is written against the backend op table (weights, norm vectors, RoPE tables and
 * activations all in the backend's memory), so it runs on the CPU and on CUDA alike: the embedding
 * and per-layer-input scales and layer_scalar are `scale` ops, per-layer inputs are sliced out with
 * copy2d, the final soft-cap is the `softcap` op (logits_head.c). KV-shared layers only `attend`
 * to their source layer's cache (stored earlier in the same step). The MoE block routes as moe.c
 * does: on the backend for decode-sized batches where it offers the MoE ops (route, gathered
 * matmuls over the (token, choice) pairs, weighted sum; the step can then be recorded), else with
 * the router logits on the host and the experts as gather_rows -> matmuls -> scatter_add_rows. */
#include "model/model.h"
#include "model/moe.h"

#include "util/half.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gemma_layer {
    bool sliding;
    int head_dim, n_kv_heads, rot;
    int kv_src;            /* layer whose cache this layer reads (itself unless KV-shared) */
    bool k_eq_v;           /* values are the (unnormed) key projection */
    const float *inv_freq; /* backend [head_dim/2 or rot/2] (owned by gemma_state) */
    float *attn_norm, *post_attn_norm, *pre_ffn_norm, *post_ffn_norm; /* [hidden] */
    float *q_norm, *k_norm;                                           /* [head_dim] */
    kiln_matrix wq, wk, wv, wo;
    kiln_matrix w_gate, w_up, w_down;
    /* gemma4 per-layer input */
    kiln_matrix ple_gate; /* [ple, hidden] */
    kiln_matrix ple_proj; /* [hidden, ple] */
    float *ple_norm;      /* [hidden] */
    float layer_scalar;
    /* gemma4 MoE block */
    bool moe;
    kiln_matrix router;  /* [E, hidden] */
    float *router_w;     /* backend [hidden]: router.scale / sqrt(hidden), the router norm's w */
    float *expert_scale; /* [E] (host) per_expert_scale, applied to the routing weights */
    float *expert_scale_dev;   /* [E] the same in backend memory (backends with moe_route) */
    kiln_matrix gate_up, down; /* [E*2F, hidden], [E*hidden, F] */
    float *pre_ffn_norm2, *post_ffn_norm1, *post_ffn_norm2; /* [hidden] */
} gemma_layer;

typedef struct gemma_state {
    bool g4;
    int hidden, n_heads, vocab, n_layers, ffn, ple; /* ple: hidden_size_per_layer_input (g4) */
    int n_experts, top_k, moe_ffn;                  /* gemma4 MoE block (n_experts 0: none) */
    float eps, embed_scale, softcap, attn_scale;
    float attn_softcap; /* attn_logit_softcapping (null / absent in Gemma 3 and 4: 0, off) */
    bool plus_one;
    kiln_matrix embed, lm_head;
    bool tied;
    float *final_norm;
    float *inv_sliding, *inv_full; /* rope tables (backend) */
    kiln_matrix ple_embed;         /* [vocab_ple, n_layers*ple] */
    kiln_matrix ple_model_proj;    /* [n_layers*ple, hidden] */
    float *ple_proj_norm;          /* [ple] */
    gemma_layer *layers;
    kiln_scratch act, ids, moe, logits; /* backend scratch kept across forwards */
} gemma_state;

static bool gemma_matches(const kiln_config *cfg) {
    return strcmp(cfg->model_type, "gemma3_text") == 0 ||
           strcmp(cfg->model_type, "gemma4_text") == 0;
}

static void gemma_free(kiln_model *m) {
    gemma_state *s = m->family_state;
    if (!s) return;
    for (int i = 0; s->layers && i < s->n_layers; i++) {
        gemma_layer *L = &s->layers[i];
        float *v[] = {L->attn_norm,      L->post_attn_norm, L->pre_ffn_norm, L->post_ffn_norm,
                      L->q_norm,         L->k_norm,         L->ple_norm,     L->pre_ffn_norm2,
                      L->post_ffn_norm1, L->post_ffn_norm2, L->router_w,     L->expert_scale_dev};
        for (size_t j = 0; j < sizeof v / sizeof v[0]; j++) kiln_weights_free_vector(m, v[j]);
        kiln_matrix *w[] = {&L->wq,       &L->wk,     &L->wv,      &L->wo,
                            &L->w_gate,   &L->w_up,   &L->w_down,  &L->ple_gate,
                            &L->ple_proj, &L->router, &L->gate_up, &L->down};
        for (size_t j = 0; j < sizeof w / sizeof w[0]; j++) kiln_weights_free_matrix(m, w[j]);
        free(L->expert_scale);
    }
    free(s->layers);
    kiln_weights_free_matrix(m, &s->embed);
    if (!s->tied) kiln_weights_free_matrix(m, &s->lm_head);
    kiln_weights_free_matrix(m, &s->ple_embed);
    kiln_weights_free_matrix(m, &s->ple_model_proj);
    kiln_weights_free_vector(m, s->final_norm);
    kiln_weights_free_vector(m, s->ple_proj_norm);
    kiln_weights_free_vector(m, s->inv_sliding);
    kiln_weights_free_vector(m, s->inv_full);
    kiln_scratch_free(m->be, &s->act);
    kiln_scratch_free(m->be, &s->ids);
    kiln_scratch_free(m->be, &s->moe);
    kiln_scratch_free(m->be, &s->logits);
    free(s);
    m->family_state = NULL;
}

static const char *layer_type(const kiln_config *c, int i) {
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(c->json, "layer_types");
    if (cJSON_IsArray(types) && cJSON_GetArraySize(types) == c->n_layers) {
        const cJSON *t = cJSON_GetArrayItem(types, i);
        if (cJSON_IsString(t)) return t->valuestring;
    }
    int pat = kiln_config_int(c, "sliding_window_pattern", 6);
    return pat > 0 && (i + 1) % pat == 0 ? "full_attention" : "sliding_attention";
}

/* RoPE table for one layer type: rope_parameters[type] if present, else the top-level rope (and
 * rope_local_base_freq for sliding layers). Proportional RoPE rotates all head_dim dims with zero
 * frequencies past partial_rotary_factor * head_dim. Returns a [*rot/2] table in backend memory
 * (free with kiln_weights_free_vector). */
static kiln_status rope_table(kiln_model *m, const char *type, int head_dim, kiln_dtype dt,
                              float **out, int *rot) {
    const kiln_config *c = &m->cfg;
    kiln_rope_config rc = c->rope;
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(c->json, "rope_parameters");
    const cJSON *blk = params ? cJSON_GetObjectItemCaseSensitive(params, type) : NULL;
    if (cJSON_IsObject(blk)) {
        memset(&rc, 0, sizeof rc);
        const cJSON *v;
        if ((v = cJSON_GetObjectItemCaseSensitive(blk, "rope_theta")) && cJSON_IsNumber(v))
            rc.theta = (float)v->valuedouble;
        if ((v = cJSON_GetObjectItemCaseSensitive(blk, "rope_type")) && cJSON_IsString(v))
            snprintf(rc.type, sizeof rc.type, "%s", v->valuestring);
        if ((v = cJSON_GetObjectItemCaseSensitive(blk, "factor")) && cJSON_IsNumber(v))
            rc.factor = (float)v->valuedouble;
        rc.partial_rotary_factor = 1.0f;
        if ((v = cJSON_GetObjectItemCaseSensitive(blk, "partial_rotary_factor")) &&
            cJSON_IsNumber(v))
            rc.partial_rotary_factor = (float)v->valuedouble;
    } else if (strcmp(type, "sliding_attention") == 0) {
        rc.theta = kiln_config_float(c, "rope_local_base_freq", 10000.0f);
        snprintf(rc.type, sizeof rc.type, "default");
        rc.factor = 1.0f;
    }
    float *inv = calloc((size_t)head_dim / 2 + 1, sizeof *inv);
    if (!inv) return kiln_error(KILN_ERR_OOM, "out of memory");
    if (strcmp(rc.type, "proportional") == 0) {
        int angles = (int)(rc.partial_rotary_factor * head_dim / 2);
        double f = rc.factor > 0 ? rc.factor : 1.0;
        for (int i = 0; i < angles; i++) {
            float expo = (float)(2 * i) / (float)head_dim;
            inv[i] = (float)(1.0 / pow(rc.theta, (double)expo) / f);
        }
        *rot = head_dim;
    } else {
        int r = (int)(head_dim * (rc.partial_rotary_factor > 0 ? rc.partial_rotary_factor : 1.0f));
        r -= r % 2;
        kiln_status st = kiln_rope_inv_freq(&rc, r, inv);
        if (st != KILN_OK) {
            free(inv);
            return st;
        }
        *rot = r;
    }
    kiln_rope_round_to_dtype(inv, *rot / 2, dt);
    const size_t bytes = ((size_t)head_dim / 2 + 1) * sizeof *inv;
    *out = m->be->alloc(m->be, bytes);
    if (*out) m->be->upload(m->be, *out, inv, bytes);
    free(inv);
    return *out ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of backend memory for a RoPE table");
}

/* Reads a float tensor of n elements to a malloc'd host f32 array. */
static kiln_status host_floats(kiln_model *m, const char *name, int64_t n, float **out) {
    const kiln_st_tensor *t = kiln_st_find(m->archive, name);
    if (!t) return kiln_error(KILN_ERR_NOT_FOUND, "%s: tensor '%s' is missing", m->dir, name);
    if (t->numel != n ||
        (t->dtype != KILN_DT_F32 && t->dtype != KILN_DT_F16 && t->dtype != KILN_DT_BF16))
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s' should be %lld floats", m->dir, name,
                          (long long)n);
    float *h = malloc((size_t)n * sizeof *h);
    if (!h) return kiln_error(KILN_ERR_OOM, "out of memory for '%s'", name);
    for (int64_t i = 0; i < n; i++) {
        const uint16_t u = t->dtype == KILN_DT_F32 ? 0 : ((const uint16_t *)t->data)[i];
        if (t->dtype == KILN_DT_F32)
            memcpy(&h[i], (const char *)t->data + 4 * i, 4);
        else
            h[i] = t->dtype == KILN_DT_F16 ? kiln_f16_to_f32(u) : kiln_bf16_to_f32(u);
    }
    *out = h;
    return KILN_OK;
}

/* A dense stacked expert tensor [E, rows, cols] (no ".weight" suffix in the HF layout) as one
 * [E*rows, cols] matrix on the backend. */
static kiln_status load_experts(kiln_model *m, const char *name, int E, int64_t rows, int64_t cols,
                                kiln_matrix *out) {
    const kiln_st_tensor *t = kiln_st_find(m->archive, name);
    if (!t) return kiln_error(KILN_ERR_NOT_FOUND, "%s: tensor '%s' is missing", m->dir, name);
    if ((t->dtype != KILN_DT_F32 && t->dtype != KILN_DT_F16 && t->dtype != KILN_DT_BF16) ||
        t->ndim != 3 || t->shape[0] != E || t->shape[1] != rows || t->shape[2] != cols)
        return kiln_error(KILN_ERR_FORMAT, "%s: '%s' should be a float [%d, %lld, %lld]", m->dir,
                          name, E, (long long)rows, (long long)cols);
    kiln_matrix host = {.dtype = t->dtype, .rows = E * rows, .cols = cols, .data = t->data};
    return m->be->upload_matrix(m->be, &host, out);
}

static kiln_status load_moe(kiln_model *m, gemma_state *s, gemma_layer *L, const char *p) {
    char n[256];
    const int H = s->hidden, E = s->n_experts, F = s->moe_ffn;
    L->moe = true;
    snprintf(n, sizeof n, "%s.router.proj", p);
    KILN_TRY(kiln_weights_matrix(m, n, E, H, false, &L->router));
    /* the router input is rmsnorm(r) * scale / sqrt(hidden): one weighted RMSNorm with
     * w = scale * hidden^-1/2 (the product rounded once, as the unfused form did) */
    snprintf(n, sizeof n, "%s.router.scale", p);
    float *rs = NULL;
    KILN_TRY(host_floats(m, n, H, &rs));
    const float root = 1.0f / sqrtf((float)H);
    for (int i = 0; i < H; i++) rs[i] = rs[i] * root;
    L->router_w = m->be->alloc(m->be, (size_t)H * sizeof(float));
    if (L->router_w) m->be->upload(m->be, L->router_w, rs, (size_t)H * sizeof(float));
    free(rs);
    if (!L->router_w) return kiln_error(KILN_ERR_OOM, "out of backend memory for '%s'", n);
    snprintf(n, sizeof n, "%s.router.per_expert_scale", p);
    KILN_TRY(host_floats(m, n, E, &L->expert_scale));
    if (m->be->moe_route) {
        L->expert_scale_dev = m->be->alloc(m->be, (size_t)E * sizeof(float));
        if (!L->expert_scale_dev)
            return kiln_error(KILN_ERR_OOM, "out of backend memory for '%s'", n);
        m->be->upload(m->be, L->expert_scale_dev, L->expert_scale, (size_t)E * sizeof(float));
    }
    snprintf(n, sizeof n, "%s.experts.gate_up_proj", p);
    KILN_TRY(load_experts(m, n, E, 2 * (int64_t)F, H, &L->gate_up));
    snprintf(n, sizeof n, "%s.experts.down_proj", p);
    KILN_TRY(load_experts(m, n, E, H, F, &L->down));
    struct {
        const char *name;
        float **dst;
    } v[] = {{"pre_feedforward_layernorm_2", &L->pre_ffn_norm2},
             {"post_feedforward_layernorm_1", &L->post_ffn_norm1},
             {"post_feedforward_layernorm_2", &L->post_ffn_norm2}};
    for (size_t j = 0; j < sizeof v / sizeof v[0]; j++) {
        snprintf(n, sizeof n, "%s.%s.weight", p, v[j].name);
        KILN_TRY(kiln_weights_vector(m, n, H, false, v[j].dst));
    }
    return KILN_OK;
}

static kiln_status load_layer(kiln_model *m, gemma_state *s, int i, int first_shared) {
    const kiln_config *c = &m->cfg;
    gemma_layer *L = &s->layers[i];
    char p[64], n[256];
    snprintf(p, sizeof p, "model.layers.%d", i);
    const int H = s->hidden;
    L->sliding = strcmp(layer_type(c, i), "sliding_attention") == 0;
    int ghd = kiln_config_int(c, "global_head_dim", 0);
    L->head_dim = !L->sliding && s->g4 && ghd > 0 ? ghd : c->head_dim;
    L->k_eq_v = s->g4 && !L->sliding && kiln_config_bool(c, "attention_k_eq_v", false);
    L->n_kv_heads =
        L->k_eq_v ? kiln_config_int(c, "num_global_key_value_heads", c->n_kv_heads) : c->n_kv_heads;
    L->kv_src = i;
    if (first_shared >= 0 && i >= first_shared) {
        for (int j = first_shared - 1; j >= 0; j--)
            if (s->layers[j].sliding == L->sliding) {
                L->kv_src = j;
                break;
            }
    }
    const int qd = s->n_heads * L->head_dim, kvd = L->n_kv_heads * L->head_dim;
    struct {
        const char *name;
        float **dst;
        int n;
    } vecs[] = {{"input_layernorm", &L->attn_norm, H},
                {"post_attention_layernorm", &L->post_attn_norm, H},
                {"pre_feedforward_layernorm", &L->pre_ffn_norm, H},
                {"post_feedforward_layernorm", &L->post_ffn_norm, H},
                {"self_attn.q_norm", &L->q_norm, L->head_dim}};
    for (size_t j = 0; j < sizeof vecs / sizeof vecs[0]; j++) {
        snprintf(n, sizeof n, "%s.%s.weight", p, vecs[j].name);
        /* the q / k norms hold 1 + w where the model's norms are (1 + w) (the same f32 value the
         * norm would form), so qk_norm_rope, which takes plain weights, serves every layer */
        const bool qk = vecs[j].dst == &L->q_norm;
        KILN_TRY(kiln_weights_vector(m, n, vecs[j].n, qk && s->plus_one, vecs[j].dst));
    }
    snprintf(n, sizeof n, "%s.self_attn.q_proj", p);
    KILN_TRY(kiln_weights_matrix(m, n, qd, H, c->attention_bias, &L->wq));
    snprintf(n, sizeof n, "%s.self_attn.o_proj", p);
    KILN_TRY(kiln_weights_matrix(m, n, H, qd, c->attention_bias, &L->wo));
    if (L->kv_src == i) {
        snprintf(n, sizeof n, "%s.self_attn.k_norm.weight", p);
        KILN_TRY(kiln_weights_vector(m, n, L->head_dim, s->plus_one, &L->k_norm));
        snprintf(n, sizeof n, "%s.self_attn.k_proj", p);
        KILN_TRY(kiln_weights_matrix(m, n, kvd, H, c->attention_bias, &L->wk));
        if (!L->k_eq_v) {
            snprintf(n, sizeof n, "%s.self_attn.v_proj", p);
            KILN_TRY(kiln_weights_matrix(m, n, kvd, H, c->attention_bias, &L->wv));
        }
    }
    snprintf(n, sizeof n, "%s.mlp.gate_proj", p);
    KILN_TRY(kiln_weights_matrix(m, n, s->ffn, H, false, &L->w_gate));
    snprintf(n, sizeof n, "%s.mlp.up_proj", p);
    KILN_TRY(kiln_weights_matrix(m, n, s->ffn, H, false, &L->w_up));
    snprintf(n, sizeof n, "%s.mlp.down_proj", p);
    KILN_TRY(kiln_weights_matrix(m, n, H, s->ffn, false, &L->w_down));
    L->layer_scalar = 1.0f;
    if (s->n_experts > 0) KILN_TRY(load_moe(m, s, L, p));
    if (s->g4) {
        snprintf(n, sizeof n, "%s.layer_scalar", p);
        if (kiln_weights_has(m, n)) { /* a host float: the forward scales by it */
            float *v = NULL;
            KILN_TRY(host_floats(m, n, 1, &v));
            L->layer_scalar = v[0];
            free(v);
        }
        if (s->ple > 0) {
            snprintf(n, sizeof n, "%s.per_layer_input_gate", p);
            KILN_TRY(kiln_weights_matrix(m, n, s->ple, H, false, &L->ple_gate));
            snprintf(n, sizeof n, "%s.per_layer_projection", p);
            KILN_TRY(kiln_weights_matrix(m, n, H, s->ple, false, &L->ple_proj));
            snprintf(n, sizeof n, "%s.post_per_layer_input_norm.weight", p);
            KILN_TRY(kiln_weights_vector(m, n, H, false, &L->ple_norm));
        }
    }
    return KILN_OK;
}

static kiln_status gemma_load(kiln_model *m) {
    const kiln_config *c = &m->cfg;
    gemma_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OOM, "out of memory");
    m->family_state = s;
    s->g4 = strcmp(c->model_type, "gemma4_text") == 0;
    s->hidden = c->hidden_size;
    s->n_heads = c->n_heads;
    s->vocab = c->vocab_size;
    s->n_layers = c->n_layers;
    s->ffn = c->intermediate_size;
    s->eps = c->rms_norm_eps;
    s->plus_one = !s->g4;
    s->softcap = kiln_config_float(c, "final_logit_softcapping", 0.0f);
    s->attn_softcap = kiln_config_float(c, "attn_logit_softcapping", 0.0f);
    s->attn_scale =
        s->g4 ? 1.0f
              : 1.0f / sqrtf(kiln_config_float(c, "query_pre_attn_scalar", (float)c->head_dim));
    if (s->g4 && kiln_config_bool(c, "enable_moe_block", false)) {
        s->n_experts = kiln_config_int(c, "num_experts", 0);
        s->top_k = kiln_config_int(c, "top_k_experts", 0);
        s->moe_ffn = kiln_config_int(c, "moe_intermediate_size", 0);
        if (s->n_experts <= 0 || s->top_k <= 0 || s->top_k > s->n_experts || s->moe_ffn <= 0 ||
            s->top_k > 64)
            return kiln_error(KILN_ERR_FORMAT,
                              "%s/config.json: bad MoE geometry (%d experts, top %d, ffn %d)",
                              m->dir, s->n_experts, s->top_k, s->moe_ffn);
    }
    s->ple = s->g4 ? kiln_config_int(c, "hidden_size_per_layer_input", 0) : 0;
    KILN_TRY(kiln_weights_embed_head(m, s->vocab, s->hidden, &s->embed, &s->lm_head, &s->tied,
                                     &s->final_norm));
    /* the sqrt(hidden) buffer is cast with the model: bf16/f16 for dense checkpoints */
    s->embed_scale = sqrtf((float)s->hidden);
    if (s->embed.dtype == KILN_DT_BF16)
        s->embed_scale = kiln_bf16_to_f32(kiln_f32_to_bf16(s->embed_scale));
    else if (s->embed.dtype == KILN_DT_F16)
        s->embed_scale = kiln_f16_to_f32(kiln_f32_to_f16(s->embed_scale));
    if (s->ple > 0) {
        int vp = kiln_config_int(c, "vocab_size_per_layer_input", s->vocab);
        KILN_TRY(kiln_weights_matrix(m, "model.embed_tokens_per_layer", vp,
                                     (int64_t)s->n_layers * s->ple, false, &s->ple_embed));
        KILN_TRY(kiln_weights_matrix(m, "model.per_layer_model_projection",
                                     (int64_t)s->n_layers * s->ple, s->hidden, false,
                                     &s->ple_model_proj));
        KILN_TRY(kiln_weights_vector(m, "model.per_layer_projection_norm.weight", s->ple, false,
                                     &s->ple_proj_norm));
    }
    s->layers = calloc((size_t)s->n_layers, sizeof *s->layers);
    if (!s->layers) return kiln_error(KILN_ERR_OOM, "out of memory");
    int n_shared = s->g4 ? kiln_config_int(c, "num_kv_shared_layers", 0) : 0;
    int first_shared = n_shared > 0 ? s->n_layers - n_shared : -1;
    for (int i = 0; i < s->n_layers; i++) KILN_TRY(load_layer(m, s, i, first_shared));
    /* rope tables per layer type (the head dim of each type) */
    int rot_s = 0, rot_f = 0, hd_s = c->head_dim, hd_f = c->head_dim;
    for (int i = 0; i < s->n_layers; i++)
        if (!s->layers[i].sliding) hd_f = s->layers[i].head_dim;
    KILN_TRY(rope_table(m, "sliding_attention", hd_s, s->embed.dtype, &s->inv_sliding, &rot_s));
    KILN_TRY(rope_table(m, "full_attention", hd_f, s->embed.dtype, &s->inv_full, &rot_f));
    int window = kiln_config_int(c, "sliding_window", 4096);
    m->n_kv_layers = s->n_layers;
    m->kv_layers = calloc((size_t)s->n_layers, sizeof *m->kv_layers);
    if (!m->kv_layers) return kiln_error(KILN_ERR_OOM, "out of memory");
    if (s->n_experts > 0) {
        m->layer_moe = calloc((size_t)s->n_layers, sizeof *m->layer_moe);
        if (!m->layer_moe) return kiln_error(KILN_ERR_OOM, "out of memory");
        for (int i = 0; i < s->n_layers; i++) m->layer_moe[i] = s->layers[i].moe;
    }
    for (int i = 0; i < s->n_layers; i++) {
        gemma_layer *L = &s->layers[i];
        L->inv_freq = L->sliding ? s->inv_sliding : s->inv_full;
        L->rot = L->sliding ? rot_s : rot_f;
        m->kv_layers[i] = (kiln_kv_layer_desc){.n_kv_heads = L->n_kv_heads,
                                               .head_dim = L->head_dim,
                                               .v_head_dim = L->head_dim,
                                               .window = L->sliding ? window : 0,
                                               .is_attention = L->kv_src == i};
    }
    return KILN_OK;
}

/* n floats rounded up to a multiple of 4: scratch regions start 16-byte aligned, which the CUDA
 * GEMV needs of its input rows (an unaligned x takes the slower general path) */
static int64_t al4(int64_t n) {
    return (n + 3) & ~(int64_t)3;
}

/* Gemma 4 expert block over T rows of the residual r: y = post_ffn_norm_2(sum_k w_k expert_k(
 * pre_ffn_norm_2(r))), routed on rmsnorm(r) * scale / sqrt(hidden). Tokens are bucketed per expert
 * so each selected expert runs one matmul over its rows. y, r in backend memory; y must not alias
 * r. The router logits come to the host for the top-k choice (as in moe.c); the buckets go back as
 * row ids and weights. */
/* The same on the backend (moe.c's device forward): pair t*K + j is token t's j-th choice. */
static kiln_status gemma_moe_device(kiln_model *m, gemma_state *s, const gemma_layer *L, float *y,
                                    const float *r, int64_t T) {
    kiln_backend *be = m->be;
    const int64_t H = s->hidden, E = s->n_experts, K = s->top_k, F = s->moe_ffn, P = T * K;
    /* backend scratch: logits [T, E]; rn [T, H]; experts (int32), weights [P]; g [P, F] (the
     * experts' GeGLU); ye [P, H]; each region 16-byte aligned */
    const int64_t nl = al4(T * E), nh = al4(T * H), np = al4(P), nf = al4(P * F), ny = al4(P * H);
    KILN_TRY(kiln_scratch_reserve(be, &s->moe, (size_t)(nl + nh + 2 * np + nf + ny) * 4));
    float *logits = s->moe.ptr, *rn = logits + nl, *w = rn + nh, *g = w + 2 * np, *ye = g + nf;
    int32_t *experts = (int32_t *)(w + np);
    kiln_moe_count_device_call();
    be->rmsnorm(be, rn, r, L->router_w, T, H, s->eps, false);
    be->matmul(be, logits, rn, T, &L->router);
    be->moe_route(be, experts, w, logits, T, (int)E, (int)K, true, L->expert_scale_dev);
    be->rmsnorm(be, rn, r, L->pre_ffn_norm2, T, H, s->eps, false);
    /* expert e's gate_up rows: gate [e*2F, +F), up [e*2F + F, +F) */
    be->matmul_gather_glu(be, g, rn, K, P, experts, &L->gate_up, &L->gate_up, F, 2 * F, F,
                          KILN_GLU_GELU_TANH);
    be->matmul_gather(be, ye, g, 1, P, experts, &L->down, H);
    be->moe_combine(be, y, ye, w, T, (int)K, H, NULL, NULL);
    be->rmsnorm(be, y, y, L->post_ffn_norm2, T, H, s->eps, false);
    return KILN_OK;
}

static bool gemma_moe_on_device(const kiln_model *m, const gemma_state *s, const gemma_layer *L,
                                int64_t T) {
    const kiln_matrix *const stacks[2] = {&L->gate_up, &L->down};
    return L->expert_scale_dev && s->top_k <= KILN_MOE_ROUTE_MAX_K &&
           s->n_experts <= KILN_MOE_ROUTE_MAX_EXPERTS &&
           kiln_moe_routes_on_device(m->be, T, s->top_k, 2, stacks);
}

static kiln_status gemma_moe(kiln_model *m, gemma_state *s, const gemma_layer *L, float *y,
                             const float *r, int64_t T) {
    if (gemma_moe_on_device(m, s, L, T)) {
        const int64_t chunk = kiln_moe_device_chunk();
        for (int64_t t0 = 0; t0 < T; t0 += chunk) {
            const int64_t c = T - t0 < chunk ? T - t0 : chunk;
            KILN_TRY(gemma_moe_device(m, s, L, y + t0 * s->hidden, r + t0 * s->hidden, c));
        }
        return KILN_OK;
    }
    kiln_backend *be = m->be;
    const int64_t H = s->hidden, E = s->n_experts, K = s->top_k, F = s->moe_ffn;
    /* backend scratch: logits [T, E]; rn, xe, ye [T, H]; gu [T, 2F]; g, u [T, F]; weights and row
     * ids [T*K] (expert by expert); each region starts 16-byte aligned (the GEMV's x) */
    const int64_t nl = al4(T * E), nh = al4(T * H), nf = al4(T * F), nk = al4(T * K);
    const size_t floats = (size_t)(nl + 3 * nh + 4 * nf + 2 * nk);
    KILN_TRY(kiln_scratch_reserve(be, &s->moe, floats * sizeof(float)));
    float *logits = s->moe.ptr, *rn = logits + nl, *xe = rn + nh, *ye = xe + nh, *gu = ye + nh,
          *g = gu + 2 * nf, *u = g + nf, *d_w = u + nf;
    int32_t *d_rows = (int32_t *)(d_w + nk);
    float *h_logits = malloc((size_t)(T * E) * sizeof(float));   /* [T, E] */
    int *sel = malloc((size_t)(T * K) * sizeof(int));            /* [T, K] */
    float *wsel = malloc((size_t)(T * K) * sizeof(float));       /* [T, K] */
    int32_t *h_rows = malloc((size_t)(T * K) * sizeof(int32_t)); /* [T*K] token of each row */
    float *h_w = malloc((size_t)(T * K) * sizeof(float));        /* [T*K] weight of each row */
    int64_t *start = malloc((size_t)(E + 1) * sizeof(int64_t));  /* expert e: [start[e], [e+1]) */
    kiln_status st = KILN_OK;
    if (!h_logits || !sel || !wsel || !h_rows || !h_w || !start) {
        st = kiln_error(KILN_ERR_OOM, "gemma moe: out of memory for %lld tokens", (long long)T);
        goto done;
    }
    be->rmsnorm(be, rn, r, L->router_w, T, H, s->eps, false);
    be->matmul(be, logits, rn, T, &L->router);
    be->download(be, h_logits, logits, (size_t)(T * E) * sizeof(float));
    for (int64_t t = 0; t < T; t++) {
        kiln_moe_route(h_logits + t * E, (int)E, (int)K, true, sel + t * K, wsel + t * K);
        for (int64_t j = 0; j < K; j++) wsel[t * K + j] *= L->expert_scale[sel[t * K + j]];
    }
    /* bucket the (token, weight) pairs per expert, tokens ascending inside a bucket */
    int64_t nr = 0;
    for (int64_t e = 0; e < E; e++) {
        start[e] = nr;
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < K; j++)
                if (sel[t * K + j] == e) {
                    h_rows[nr] = (int32_t)t;
                    h_w[nr++] = wsel[t * K + j];
                }
    }
    start[E] = nr;
    be->upload(be, d_rows, h_rows, (size_t)nr * sizeof(int32_t));
    be->upload(be, d_w, h_w, (size_t)nr * sizeof(float));
    be->rmsnorm(be, rn, r, L->pre_ffn_norm2, T, H, s->eps, false);
    be->zero(be, y, T * H);
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = start[e + 1] - start[e];
        if (n == 0) continue; /* unselected experts are never read */
        kiln_matrix gup = kiln_matrix_rows(&L->gate_up, e * 2 * F, 2 * F);
        kiln_matrix dn = kiln_matrix_rows(&L->down, e * H, H);
        be->gather_rows(be, xe, rn, d_rows + start[e], n, H);
        be->matmul(be, gu, xe, n, &gup);
        /* each row of gu is gate[F] | up[F]: split, then one GeGLU over the n rows */
        be->copy2d(be, g, F, gu, 2 * F, n, F);
        be->copy2d(be, u, F, gu + F, 2 * F, n, F);
        be->gelu_tanh_mul(be, g, g, u, n * F);
        be->matmul(be, ye, g, n, &dn);
        be->scatter_add_rows(be, y, ye, d_rows + start[e], d_w + start[e], n, H);
    }
    be->rmsnorm(be, y, y, L->post_ffn_norm2, T, H, s->eps, false);
done:
    free(h_logits);
    free(sel);
    free(wsel);
    free(h_rows);
    free(h_w);
    free(start);
    return st;
}

/* Per-forward activations, carved out of the backend scratch s->act (ids from s->ids). */
typedef struct gemma_acts {
    float *x, *h, *h2;  /* [T, hidden] residual, normed / branch output, second branch */
    float *q, *attn;    /* [T, n_heads*max head_dim] */
    float *k, *v;       /* [T, max n_kv_heads*max head_dim] */
    float *ff1, *ff2;   /* [T, ffn] */
    float *pli;         /* [T, n_layers, ple] per-layer inputs */
    float *plp;         /* [T, n_layers*ple] projection scratch */
    float *plg, *plin;  /* [T, ple] gate, this layer's slice of pli */
    float *rows;        /* [R, hidden] rows that need logits */
    int32_t *tok, *pos; /* [T] each */
} gemma_acts;

/* Per-layer inputs (gemma4): pli = (rmsnorm(x @ P^T / sqrt(hidden)) + E_ple[tok] * sqrt(ple)) /
 * sqrt(2), x being the scaled embedding. */
static void per_layer_inputs(kiln_backend *be, const gemma_state *s, const gemma_acts *a,
                             int64_t T) {
    const int64_t H = s->hidden, P = (int64_t)s->n_layers * s->ple;
    be->embed(be, a->pli, a->tok, T, &s->ple_embed);
    be->matmul(be, a->plp, a->x, T, &s->ple_model_proj);
    be->scale(be, a->plp, 1.0f / sqrtf((float)H), T * P);
    be->rmsnorm(be, a->plp, a->plp, s->ple_proj_norm, T * s->n_layers, s->ple, s->eps, false);
    be->scale(be, a->pli, sqrtf((float)s->ple), T * P);
    be->add(be, a->pli, a->plp, a->pli, T * P);
    be->scale(be, a->pli, 1.0f / sqrtf(2.0f), T * P);
}

static kiln_status gemma_forward(kiln_model *m, kiln_batch_entry *e, int n_entries) {
    gemma_state *s = m->family_state;
    kiln_backend *be = m->be;
    int64_t T, R;
    kiln_batch_sizes(e, n_entries, &T, &R);
    if (T == 0) return KILN_OK;
    KILN_TRY(kiln_batch_reserve(e, n_entries));
    int maxhd = 0, maxkv = 0;
    for (int l = 0; l < s->n_layers; l++) {
        if (s->layers[l].head_dim > maxhd) maxhd = s->layers[l].head_dim;
        if (s->layers[l].n_kv_heads > maxkv) maxkv = s->layers[l].n_kv_heads;
    }
    const int64_t H = s->hidden, QD = (int64_t)s->n_heads * maxhd, KVD = (int64_t)maxkv * maxhd,
                  F = s->ffn, P = (int64_t)s->n_layers * s->ple, PL = s->ple;
    const int64_t nh = al4(T * H), nq = al4(T * QD), nkv = al4(T * KVD), nf = al4(T * F),
                  np = al4(T * P), npl = al4(T * PL);
    size_t floats = (size_t)(3 * nh + 2 * nq + 2 * nkv + 2 * nf + 2 * np + 2 * npl + R * H);
    KILN_TRY(kiln_scratch_reserve(be, &s->act, floats * sizeof(float)));
    KILN_TRY(kiln_scratch_reserve(be, &s->ids, (size_t)(2 * T) * sizeof(int32_t)));
    gemma_acts a;
    float *p = s->act.ptr;
    a.x = p, p += nh;
    a.h = p, p += nh;
    a.h2 = p, p += nh;
    a.q = p, p += nq;
    a.attn = p, p += nq;
    a.k = p, p += nkv;
    a.v = p, p += nkv;
    a.ff1 = p, p += nf;
    a.ff2 = p, p += nf;
    a.pli = p, p += np;
    a.plp = p, p += np;
    a.plg = p, p += npl;
    a.plin = p, p += npl;
    a.rows = p;
    a.tok = s->ids.ptr;
    a.pos = a.tok + T;

    /* one store + attend call per (non-shared) layer for the whole batch when the caches offer
     * it; KV-shared layers attend per sequence to their source layer (nothing to store) */
    kiln_batch_kv bkv;
    KILN_TRY(kiln_batch_begin(be, &bkv, e, n_entries, T, a.tok));
    const bool batch_kv = bkv.ok;
    const kiln_kv_vtable *bvt = bkv.vt;
    kiln_kv **kvs = bkv.kvs;
    int *kv_n = bkv.n;

    /* decode steps run as one recorded unit where the backend offers it (llama.c), unless a
     * layer routes experts on the host (gemma_moe waits for the routes there); the MoE scratch
     * is part of the key */
    bool host_moe = false;
    for (int l = 0; l < s->n_layers; l++)
        host_moe |= s->layers[l].moe && !gemma_moe_on_device(m, s, &s->layers[l], T);
    const bool graph = !host_moe && kiln_decode_step_recordable(be, &bkv, T, n_entries);
    bool replayed = false;
    if (graph) {
        uint64_t key = kiln_decode_step_key(s, a.x, a.tok, &bkv, n_entries);
        replayed = be->graph_begin(be, key ? kiln_hash_mix(key, (uintptr_t)s->moe.ptr) : 0);
    }
    if (!replayed) {
        be->embed(be, a.x, a.tok, T, &s->embed);
        be->scale(be, a.x, s->embed_scale, T * H);
        if (s->ple > 0) per_layer_inputs(be, s, &a, T);
    }
    kiln_status st = KILN_OK;
    for (int l = 0; !replayed && l < s->n_layers && st == KILN_OK; l++) {
        gemma_layer *L = &s->layers[l];
        const int hd = L->head_dim;
        const int64_t qd = (int64_t)s->n_heads * hd, kvd = (int64_t)L->n_kv_heads * hd;
        const bool own = L->kv_src == l; /* else: KV-shared, reads layer kv_src's cache */
        /* positions in backend memory for the batched store; per-sequence calls use the caches'
         * own lengths */
        const kiln_attn_params ap = {.n_heads = s->n_heads,
                                     .scale = s->attn_scale,
                                     .softcap = s->attn_softcap},
                               apb = {.n_heads = s->n_heads,
                                      .scale = s->attn_scale,
                                      .softcap = s->attn_softcap,
                                      .positions = a.pos};
        /* the input norm folded into the q (k, v) projections: one fused op (backend.h) */
        float *const qkv_out[3] = {a.q, a.k, a.v};
        const kiln_matrix *const qkv_w[3] = {&L->wq, &L->wk, &L->wv};
        const int n_proj = !own ? 1 : L->k_eq_v ? 2 : 3;
        be->matmul_norm(be, n_proj, qkv_out, a.x, a.h, T, qkv_w, L->attn_norm, s->eps, s->plus_one);
        if (own && L->k_eq_v) /* values are the raw key projection (before k_norm and RoPE) */
            be->copy2d(be, a.v, kvd, a.k, kvd, T, kvd);
        if (own) { /* q / k norm (weights 1 + w already where plus_one) + RoPE as one op */
            be->qk_norm_rope(be, a.q, a.k, a.pos, T, s->n_heads, L->n_kv_heads, hd, L->rot,
                             L->inv_freq, L->q_norm, L->k_norm, s->eps);
        } else {
            be->rmsnorm(be, a.q, a.q, L->q_norm, T * s->n_heads, hd, s->eps, false);
            be->rope(be, a.q, a.pos, T, s->n_heads, hd, L->rot, L->inv_freq);
        }
        if (own && s->g4) be->rmsnorm(be, a.v, a.v, NULL, T * L->n_kv_heads, hd, s->eps, false);
        /* at a decode step, o and the start of gate / up may move towards the compute while
         * attention runs (a hint, as in llama.c) */
        if (be->prefetch && T == n_entries) {
            const kiln_matrix *const next[3] = {&L->wo, &L->w_gate, &L->w_up};
            be->prefetch(be, next, 3);
        }
        if (batch_kv) { /* KV-shared: attend only, to layer kv_src (k NULL: kv_cache.h) */
            /* attention's output feeds o (backend.h feeds_next) */
            if (be->feeds_next) be->feeds_next(be, a.attn, NULL, 0.0f, false);
            bvt->store_attend_batch(kvs, kv_n, n_entries, L->kv_src, own ? a.k : NULL,
                                    own ? a.v : NULL, a.q, a.attn, &apb, be->pool);
        } else {
            for (int i = 0, t = 0; i < n_entries; t += e[i].n_tokens, i++) {
                kiln_kv *kv = e[i].seq->kv;
                if (own) kv->vt->store(kv, l, a.k + t * kvd, a.v + t * kvd, e[i].n_tokens);
                kv->vt->attend(kv, L->kv_src, a.q + t * qd, e[i].n_tokens, a.attn + t * qd, &ap,
                               be->pool);
            }
        }
        be->matmul(be, a.h, a.attn, T, &L->wo);
        /* x += post_attn_norm(h); ff1 = gelu(pre_ffn_norm(x) @ gate^T) * (pre_ffn_norm(x) @ up^T)
         */
        be->norm_add(be, a.x, a.h, L->post_attn_norm, T, H, s->eps, s->plus_one, 1.0f);
        /* gate/up feeds down (backend.h feeds_next; o and down feed norms here) */
        if (be->feeds_next) be->feeds_next(be, a.ff1, NULL, 0.0f, false);
        be->matmul_norm_glu(be, a.ff1, a.x, a.h, a.ff2, T, &L->w_gate, &L->w_up, L->pre_ffn_norm,
                            s->eps, s->plus_one, KILN_GLU_GELU_TANH);
        be->matmul(be, a.h, a.ff1, T, &L->w_down);
        if (L->moe) { /* dense and expert branches both read the residual x */
            be->rmsnorm(be, a.h, a.h, L->post_ffn_norm1, T, H, s->eps, false);
            st = gemma_moe(m, s, L, a.h2, a.x, T);
            if (st != KILN_OK) break;
            be->add(be, a.h, a.h, a.h2, T * H);
        }
        /* x += post_ffn_norm(h), then (per-layer inputs) x += norm(proj(gelu(gate(x)) *
         * pli[:, l])); the last of them also scales x by layer_scalar */
        be->norm_add(be, a.x, a.h, L->post_ffn_norm, T, H, s->eps, s->plus_one,
                     s->ple > 0 ? 1.0f : L->layer_scalar);
        if (s->ple > 0) {
            be->matmul(be, a.plg, a.x, T, &L->ple_gate);
            be->copy2d(be, a.plin, PL, a.pli + (int64_t)l * PL, P, T, PL);
            be->gelu_tanh_mul(be, a.plg, a.plg, a.plin, T * PL);
            be->matmul(be, a.h2, a.plg, T, &L->ple_proj);
            be->norm_add(be, a.x, a.h2, L->ple_norm, T, H, s->eps, false, L->layer_scalar);
        }
    }
    if (graph && !replayed) be->graph_end(be);
    kiln_batch_kv_free(&bkv);
    if (st != KILN_OK) return st;
    kiln_batch_commit(e, n_entries);
    const kiln_logits_head head = {.hidden = H,
                                   .vocab = s->vocab,
                                   .final_norm = s->final_norm,
                                   .eps = s->eps,
                                   .plus_one = s->plus_one,
                                   .lm_head = &s->lm_head,
                                   .softcap = s->softcap};
    return kiln_logits_head_run(m, &head, e, n_entries, a.x, a.rows, &s->logits);
}

const kiln_family kiln_family_gemma = {
    .name = "gemma",
    .matches = gemma_matches,
    .load = gemma_load,
    .forward = gemma_forward,
    .free = gemma_free,
};
