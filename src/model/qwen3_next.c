/* qwen3_next.c — the Qwen hybrid decoder: `qwen3_next` and `qwen3_5_text` (Gated DeltaNet linear
 * layers interleaved with gated full attention) and `qwen3_moe` (every layer full attention, no
 * output gate), which is the same block with a sparse MLP. One block:
 *   x += mixer(norm(x));  x += mlp(norm(x))
 * mixer: full attention (q_proj also yields a per-head sigmoid output gate in qwen3_next/3.5,
 * per-head q/k RMSNorm, partial rotary) or Gated DeltaNet (fused/unfused input projections,
 * causal conv1d + SiLU, L2-normed q/k, decay g = -exp(A_log) softplus(a + dt_bias),
 * beta = sigmoid(b), gated RMSNorm with silu(z), out_proj); mlp: dense SwiGLU or moe.c.
 * Norms are (1+w) in the qwen3_next/3.5 HF layout; mlx-lm stores them as 1+w (conv1d as
 * [C, K, 1]), so they are applied plainly there. The conv and recurrent states live in each
 * sequence's cache (layer_state, in the backend's memory), so batching and truncate(0) work per
 * sequence. The forward is written against the backend op table, so it runs on the CPU and on
 * CUDA alike. */
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

typedef struct qn_layer {
    bool linear;      /* Gated DeltaNet layer (else full attention) */
    float *attn_norm; /* [hidden] */
    float *ffn_norm;  /* [hidden] */
    /* full attention */
    float *q_norm;  /* [head_dim] */
    float *k_norm;  /* [head_dim] */
    kiln_matrix wq; /* [n_heads*head_dim*(gated ? 2 : 1), hidden] */
    kiln_matrix wk; /* [n_kv_heads*head_dim, hidden] */
    kiln_matrix wv; /* [n_kv_heads*head_dim, hidden] */
    kiln_matrix wo; /* [hidden, n_heads*head_dim] */
    /* Gated DeltaNet */
    kiln_matrix in_qkvz;  /* qwen3_next: [nk*(2dk + 2r*dv), hidden], grouped per key head */
    kiln_matrix in_ba;    /* qwen3_next: [nk*2r, hidden] */
    kiln_matrix in_qkv;   /* qwen3_5: [2*nk*dk + nv*dv, hidden] */
    kiln_matrix in_z;     /* qwen3_5: [nv*dv, hidden] */
    kiln_matrix in_a;     /* qwen3_5: [nv, hidden] */
    kiln_matrix in_b;     /* qwen3_5: [nv, hidden] */
    kiln_matrix out_proj; /* [hidden, nv*dv] */
    float *conv_w;        /* backend [conv_dim, K] */
    float *neg_a;         /* backend [nv]: -exp(A_log) */
    float *dt_bias;       /* backend [nv] */
    float *gnorm;         /* [dv] gated-norm weight (plain w) */
    /* MLP */
    bool moe;
    kiln_moe sparse;
    kiln_matrix w_gate, w_up, w_down; /* dense: [ffn, hidden] x2, [hidden, ffn] */
} qn_layer;

typedef struct qn_state {
    int hidden, n_heads, n_kv_heads, head_dim, ffn, vocab, n_layers, rot;
    float eps;
    bool gated_attn;    /* q_proj carries the output gate */
    bool fused_proj;    /* qwen3_next in_proj_qkvz / in_proj_ba */
    bool norm_plus_one; /* apply RMSNorm as (1+w) */
    kiln_gdn_dims gdn;
    int conv_k, conv_dim;
    kiln_matrix embed;   /* [vocab, hidden] */
    kiln_matrix lm_head; /* [vocab, hidden] */
    bool tied;
    float *final_norm;                  /* [hidden] */
    float *inv_freq;                    /* [rot/2] */
    qn_layer *layers;                   /* [n_layers] */
    kiln_scratch act, ids, moe, logits; /* backend scratch kept across forwards */
} qn_state;

static bool qn_matches(const kiln_config *cfg) {
    return strcmp(cfg->model_type, "qwen3_next") == 0 ||
           strcmp(cfg->model_type, "qwen3_5_text") == 0 ||
           strcmp(cfg->model_type, "qwen3_moe") == 0;
}

static void free_backend(kiln_backend *be, float **p) {
    if (*p) be->free(be, *p);
    *p = NULL;
}

static void qn_free(kiln_model *m) {
    qn_state *s = m->family_state;
    if (!s) return;
    for (int i = 0; s->layers && i < s->n_layers; i++) {
        qn_layer *L = &s->layers[i];
        float **vec[] = {&L->attn_norm, &L->ffn_norm, &L->q_norm, &L->k_norm, &L->gnorm};
        for (size_t j = 0; j < sizeof vec / sizeof vec[0]; j++)
            kiln_weights_free_vector(m, *vec[j]);
        kiln_matrix *mats[] = {&L->wq,       &L->wk,     &L->wv,   &L->wo,    &L->in_qkvz,
                               &L->in_ba,    &L->in_qkv, &L->in_z, &L->in_a,  &L->in_b,
                               &L->out_proj, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t j = 0; j < sizeof mats / sizeof mats[0]; j++)
            kiln_weights_free_matrix(m, mats[j]);
        if (L->moe) kiln_moe_free(m, &L->sparse);
        free_backend(m->be, &L->conv_w);
        free_backend(m->be, &L->neg_a);
        free_backend(m->be, &L->dt_bias);
    }
    free(s->layers);
    kiln_scratch_free(m->be, &s->act);
    kiln_scratch_free(m->be, &s->ids);
    kiln_scratch_free(m->be, &s->moe);
    kiln_scratch_free(m->be, &s->logits);
    kiln_weights_free_matrix(m, &s->embed);
    if (!s->tied) kiln_weights_free_matrix(m, &s->lm_head);
    kiln_weights_free_vector(m, s->final_norm);
    if (s->inv_freq) m->be->free(m->be, s->inv_freq);
    free(s);
    m->family_state = NULL;
}

/* Reads a float tensor of n elements (any shape) to a malloc'd host f32 array; transform (may be
 * NULL) maps every value before it goes to the backend. */
static kiln_status host_floats(kiln_model *m, const char *name, int64_t n, float **out) {
    *out = NULL;
    const kiln_st_tensor *t = kiln_st_find(m->archive, name);
    if (!t) return kiln_error(KILN_ERR_NOT_FOUND, "%s: tensor '%s' is missing", m->dir, name);
    if (t->numel != n)
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s' has %lld elements, expected %lld",
                          m->dir, name, (long long)t->numel, (long long)n);
    float *h = malloc((size_t)n * sizeof *h);
    if (!h) return kiln_error(KILN_ERR_OOM, "out of memory for '%s'", name);
    for (int64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case KILN_DT_F32:
            memcpy(&h[i], (const char *)t->data + 4 * i, 4);
            break;
        case KILN_DT_F16:
            h[i] = kiln_f16_to_f32(((const uint16_t *)t->data)[i]);
            break;
        case KILN_DT_BF16:
            h[i] = kiln_bf16_to_f32(((const uint16_t *)t->data)[i]);
            break;
        default:
            free(h);
            return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected a float",
                              m->dir, name, kiln_dtype_name(t->dtype));
        }
    }
    *out = h;
    return KILN_OK;
}

static float neg_exp(float x) {
    return -expf(x);
}

/* A float tensor of n elements copied to backend memory as f32 (mapped through fn if not NULL). */
static kiln_status backend_floats(kiln_model *m, const char *name, int64_t n, float (*fn)(float),
                                  float **out) {
    float *h = NULL;
    *out = NULL;
    KILN_TRY(host_floats(m, name, n, &h));
    for (int64_t i = 0; fn && i < n; i++) h[i] = fn(h[i]);
    *out = m->be->alloc(m->be, (size_t)n * sizeof(float));
    if (*out) m->be->upload(m->be, *out, h, (size_t)n * sizeof(float));
    free(h);
    return *out ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of backend memory for '%s'", name);
}

static bool layer_is_linear(const kiln_config *c, int i) {
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(c->json, "layer_types");
    if (cJSON_IsArray(types) && cJSON_GetArraySize(types) == c->n_layers) {
        const cJSON *t = cJSON_GetArrayItem(types, i);
        return cJSON_IsString(t) && strcmp(t->valuestring, "linear_attention") == 0;
    }
    if (strcmp(c->model_type, "qwen3_moe") == 0) return false;
    int every = kiln_config_int(c, "full_attention_interval", 4);
    return every > 0 && (i + 1) % every != 0;
}

static bool layer_is_sparse(const kiln_config *c, int i) {
    if (strcmp(c->model_type, "qwen3_5_text") == 0) return false;
    int n_exp = kiln_config_int(c, "num_experts", kiln_config_int(c, "num_local_experts", 0));
    int step = kiln_config_int(c, "decoder_sparse_step", 1);
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(c->json, "mlp_only_layers");
    const cJSON *it;
    cJSON_ArrayForEach(it, only) if (cJSON_IsNumber(it) && (int)it->valuedouble == i) return false;
    return n_exp > 0 && step > 0 && (i + 1) % step == 0;
}

static kiln_status load_layer(kiln_model *m, qn_state *s, int i) {
    const kiln_config *c = &m->cfg;
    qn_layer *L = &s->layers[i];
    char p[64], n[256];
    snprintf(p, sizeof p, "model.layers.%d", i);
    L->linear = layer_is_linear(c, i);
    snprintf(n, sizeof n, "%s.input_layernorm.weight", p);
    KILN_TRY(kiln_weights_vector(m, n, s->hidden, false, &L->attn_norm));
    snprintf(n, sizeof n, "%s.post_attention_layernorm.weight", p);
    KILN_TRY(kiln_weights_vector(m, n, s->hidden, false, &L->ffn_norm));
    const int H = s->hidden;
    if (!L->linear) {
        int qd = s->n_heads * s->head_dim, kvd = s->n_kv_heads * s->head_dim;
        snprintf(n, sizeof n, "%s.self_attn.q_norm.weight", p);
        /* 1 + w already where the norms are (1 + w): qk_norm_rope takes plain weights */
        KILN_TRY(kiln_weights_vector(m, n, s->head_dim, s->norm_plus_one, &L->q_norm));
        snprintf(n, sizeof n, "%s.self_attn.k_norm.weight", p);
        KILN_TRY(kiln_weights_vector(m, n, s->head_dim, s->norm_plus_one, &L->k_norm));
        snprintf(n, sizeof n, "%s.self_attn.q_proj", p);
        KILN_TRY(
            kiln_weights_matrix(m, n, qd * (s->gated_attn ? 2 : 1), H, c->attention_bias, &L->wq));
        snprintf(n, sizeof n, "%s.self_attn.k_proj", p);
        KILN_TRY(kiln_weights_matrix(m, n, kvd, H, c->attention_bias, &L->wk));
        snprintf(n, sizeof n, "%s.self_attn.v_proj", p);
        KILN_TRY(kiln_weights_matrix(m, n, kvd, H, c->attention_bias, &L->wv));
        snprintf(n, sizeof n, "%s.self_attn.o_proj", p);
        KILN_TRY(kiln_weights_matrix(m, n, H, qd, false, &L->wo));
    } else {
        const kiln_gdn_dims *d = &s->gdn;
        const int r = d->n_v_heads / d->n_k_heads, vd = d->n_v_heads * d->dv;
        if (s->fused_proj) {
            snprintf(n, sizeof n, "%s.linear_attn.in_proj_qkvz", p);
            KILN_TRY(kiln_weights_matrix(m, n, (int64_t)d->n_k_heads * (2 * d->dk + 2 * r * d->dv),
                                         H, false, &L->in_qkvz));
            snprintf(n, sizeof n, "%s.linear_attn.in_proj_ba", p);
            KILN_TRY(kiln_weights_matrix(m, n, 2 * d->n_v_heads, H, false, &L->in_ba));
        } else {
            snprintf(n, sizeof n, "%s.linear_attn.in_proj_qkv", p);
            KILN_TRY(kiln_weights_matrix(m, n, s->conv_dim, H, false, &L->in_qkv));
            snprintf(n, sizeof n, "%s.linear_attn.in_proj_z", p);
            KILN_TRY(kiln_weights_matrix(m, n, vd, H, false, &L->in_z));
            snprintf(n, sizeof n, "%s.linear_attn.in_proj_a", p);
            KILN_TRY(kiln_weights_matrix(m, n, d->n_v_heads, H, false, &L->in_a));
            snprintf(n, sizeof n, "%s.linear_attn.in_proj_b", p);
            KILN_TRY(kiln_weights_matrix(m, n, d->n_v_heads, H, false, &L->in_b));
        }
        snprintf(n, sizeof n, "%s.linear_attn.out_proj", p);
        KILN_TRY(kiln_weights_matrix(m, n, H, vd, false, &L->out_proj));
        /* conv1d weight: HF [C, 1, K], mlx-lm [C, K, 1]: the same C*K values in the same order */
        snprintf(n, sizeof n, "%s.linear_attn.conv1d.weight", p);
        KILN_TRY(backend_floats(m, n, (int64_t)s->conv_dim * s->conv_k, NULL, &L->conv_w));
        snprintf(n, sizeof n, "%s.linear_attn.A_log", p);
        KILN_TRY(backend_floats(m, n, d->n_v_heads, neg_exp, &L->neg_a));
        snprintf(n, sizeof n, "%s.linear_attn.dt_bias", p);
        KILN_TRY(backend_floats(m, n, d->n_v_heads, NULL, &L->dt_bias));
        snprintf(n, sizeof n, "%s.linear_attn.norm.weight", p);
        KILN_TRY(kiln_weights_vector(m, n, d->dv, false, &L->gnorm));
    }
    snprintf(n, sizeof n, "%s.mlp", p);
    if (layer_is_sparse(c, i)) {
        L->moe = true;
        int E = kiln_config_int(c, "num_experts", kiln_config_int(c, "num_local_experts", 0));
        int K = kiln_config_int(c, "num_experts_per_tok", 0);
        int F = kiln_config_int(c, "moe_intermediate_size", 0);
        int SF = kiln_config_int(c, "shared_expert_intermediate_size", 0);
        KILN_TRY(kiln_moe_load(m, n, H, E, K, F, kiln_config_bool(c, "norm_topk_prob", false), SF,
                               &L->sparse));
    } else {
        snprintf(n, sizeof n, "%s.mlp.gate_proj", p);
        KILN_TRY(kiln_weights_matrix(m, n, s->ffn, H, false, &L->w_gate));
        snprintf(n, sizeof n, "%s.mlp.up_proj", p);
        KILN_TRY(kiln_weights_matrix(m, n, s->ffn, H, false, &L->w_up));
        snprintf(n, sizeof n, "%s.mlp.down_proj", p);
        KILN_TRY(kiln_weights_matrix(m, n, H, s->ffn, false, &L->w_down));
    }
    return KILN_OK;
}

static int64_t state_floats(const qn_state *s) {
    const kiln_gdn_dims *d = &s->gdn;
    return (int64_t)(s->conv_k - 1) * s->conv_dim + (int64_t)d->n_v_heads * d->dk * d->dv;
}

static kiln_status qn_load(kiln_model *m) {
    const kiln_config *c = &m->cfg;
    qn_state *s = calloc(1, sizeof *s);
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
    bool moe_family = strcmp(c->model_type, "qwen3_moe") == 0;
    s->gated_attn = !moe_family;
    s->fused_proj = strcmp(c->model_type, "qwen3_next") == 0;
    if (!moe_family)
        s->gdn = (kiln_gdn_dims){.n_k_heads = kiln_config_int(c, "linear_num_key_heads", 16),
                                 .n_v_heads = kiln_config_int(c, "linear_num_value_heads", 32),
                                 .dk = kiln_config_int(c, "linear_key_head_dim", 128),
                                 .dv = kiln_config_int(c, "linear_value_head_dim", 128)};
    s->conv_k = moe_family ? 1 : kiln_config_int(c, "linear_conv_kernel_dim", 4);
    s->conv_dim = 2 * s->gdn.n_k_heads * s->gdn.dk + s->gdn.n_v_heads * s->gdn.dv;
    if (!moe_family &&
        (s->gdn.n_k_heads <= 0 || s->gdn.n_v_heads % s->gdn.n_k_heads || s->gdn.dk <= 0 ||
         s->gdn.dv <= 0 || s->conv_k < 1 || s->gdn.n_v_heads > 256))
        return kiln_error(KILN_ERR_FORMAT, "%s/config.json: bad linear-attention geometry", m->dir);
    /* mlx-lm layout: conv1d stored [C, K, 1] and (1+w) norms pre-added. */
    bool mlx = false;
    for (int i = 0; i < s->n_layers && !moe_family; i++) {
        char n[128];
        snprintf(n, sizeof n, "model.layers.%d.linear_attn.conv1d.weight", i);
        const kiln_st_tensor *t = kiln_st_find(m->archive, n);
        if (t) {
            mlx = t->ndim == 3 && t->shape[2] == 1 && s->conv_k != 1;
            break;
        }
    }
    s->norm_plus_one = !moe_family && !mlx;
    s->layers = calloc((size_t)s->n_layers, sizeof *s->layers);
    if (!s->layers) return kiln_error(KILN_ERR_OOM, "out of memory");
    KILN_TRY(kiln_weights_embed_head(m, s->vocab, s->hidden, &s->embed, &s->lm_head, &s->tied,
                                     &s->final_norm));
    for (int i = 0; i < s->n_layers; i++) {
        KILN_TRY(load_layer(m, s, i));
        if (s->n_layers > 8 && (i + 1) % 4 == 0)
            KILN_LOG_I("loaded layer %d/%d", i + 1, s->n_layers);
    }
    KILN_TRY(kiln_rope_upload(m, s->head_dim, s->embed.dtype, &s->rot, &s->inv_freq));

    m->n_kv_layers = s->n_layers;
    m->kv_layers = calloc((size_t)s->n_layers, sizeof *m->kv_layers);
    if (!m->kv_layers) return kiln_error(KILN_ERR_OOM, "out of memory");
    m->info.state_bytes_fixed = 0;
    m->layer_moe = calloc((size_t)s->n_layers, sizeof *m->layer_moe);
    if (!m->layer_moe) return kiln_error(KILN_ERR_OOM, "out of memory");
    for (int i = 0; i < s->n_layers; i++) {
        m->layer_moe[i] = s->layers[i].moe;
        if (s->layers[i].linear) {
            m->kv_layers[i] =
                (kiln_kv_layer_desc){.is_attention = false, .state_floats = state_floats(s)};
            m->info.state_bytes_fixed += state_floats(s) * 4;
        } else {
            m->kv_layers[i] = (kiln_kv_layer_desc){.n_kv_heads = s->n_kv_heads,
                                                   .head_dim = s->head_dim,
                                                   .v_head_dim = s->head_dim,
                                                   .is_attention = true};
        }
    }
    return KILN_OK;
}

/* Per-forward activations, carved out of the backend scratch s->act (ids from s->ids). */
typedef struct qn_acts {
    float *x, *h;       /* [T, hidden] residual, normed */
    float *q, *gate;    /* [T, n_heads*head_dim] (gate: attention output gate) */
    float *qg;          /* [T, 2*n_heads*head_dim] raw gated q_proj output */
    float *k, *v;       /* [T, n_kv_heads*head_dim] */
    float *attn;        /* [T, max(n_heads*head_dim, nv*dv)] mixer output before projection */
    float *proj;        /* [T, conv_dim + nv*dv] raw fused in_proj_qkvz output */
    float *mixed;       /* [T, conv_dim] conv input (q | k | v) */
    float *conv;        /* [T, conv_dim] conv output */
    float *z;           /* [T, nv*dv] */
    float *ba;          /* [T, 2*nv] raw fused in_proj_ba output (b, a interleaved per group) */
    float *b_in, *a_in; /* [T, nv] each: the beta and decay inputs */
    float *g, *beta;    /* [T, nv] each: log decay and beta per token and value head */
    float *qn, *kn;     /* [T, nk*dk] each: q and k split out of the conv output, L2-normed */
    float *vn;          /* [T, nv*dv] v split out of the conv output */
    float *ff1, *ff2;   /* [T, ffn] */
    float *y;           /* [T, hidden] MoE output */
    float *rows;        /* [R, hidden] rows that need logits */
    int32_t *tok, *pos; /* [T] each */
} qn_acts;

/* Host arrays of a forward pass for the batched DeltaNet ops: each entry's new tokens, and per
 * layer the entries' conv states then their delta-rule states. */
typedef struct qn_gdn_batch {
    int *n_tokens;  /* [n_entries] */
    float **states; /* [2 * n_entries] */
} qn_gdn_batch;

/* Gated DeltaNet mixer for T stacked tokens of all entries: rmsnorm(x; attn_norm) -> a->attn
 * [T, nv*dv] (the input norm folded into the projections: backend.h matmul_norm; a->h is its
 * work buffer). */
static void linear_mixer(kiln_model *m, qn_state *s, qn_layer *L, int l, kiln_batch_entry *e,
                         int n_entries, int64_t T, qn_acts *a, const qn_gdn_batch *b) {
    kiln_backend *be = m->be;
    const kiln_gdn_dims *d = &s->gdn;
    const int nk = d->n_k_heads, nv = d->n_v_heads, dk = d->dk, dv = d->dv, r = nv / nk;
    const int64_t C = s->conv_dim, VD = (int64_t)nv * dv, KD = (int64_t)nk * dk;
    if (s->fused_proj) {
        /* in_proj_qkvz rows are grouped per key head: q[dk] k[dk] v[r*dv] z[r*dv]; in_proj_ba
         * per key head: b[r] a[r]. Split them into q|k|v (conv input), z, b and a. */
        const int64_t G = 2 * dk + 2 * (int64_t)r * dv, W = nk * G;
        float *const outs[2] = {a->proj, a->ba};
        const kiln_matrix *const ws[2] = {&L->in_qkvz, &L->in_ba};
        be->matmul_norm(be, 2, outs, a->x, a->h, T, ws, L->attn_norm, s->eps, s->norm_plus_one);
        /* one batched copy per piece: i = token, j = key-head group */
        const int64_t rv = (int64_t)r * dv;
        be->copy3d(be, a->mixed, C, dk, a->proj, W, G, T, nk, dk);
        be->copy3d(be, a->mixed + KD, C, dk, a->proj + dk, W, G, T, nk, dk);
        be->copy3d(be, a->mixed + 2 * KD, C, rv, a->proj + 2 * dk, W, G, T, nk, rv);
        be->copy3d(be, a->z, VD, rv, a->proj + 2 * dk + rv, W, G, T, nk, rv);
        be->copy3d(be, a->b_in, nv, r, a->ba, 2 * nv, 2 * r, T, nk, r);
        be->copy3d(be, a->a_in, nv, r, a->ba + r, 2 * nv, 2 * r, T, nk, r);
    } else {
        float *const outs[4] = {a->mixed, a->z, a->b_in, a->a_in};
        const kiln_matrix *const ws[4] = {&L->in_qkv, &L->in_z, &L->in_b, &L->in_a};
        be->matmul_norm(be, 4, outs, a->x, a->h, T, ws, L->attn_norm, s->eps, s->norm_plus_one);
    }
    /* g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b) */
    be->gdn_gates(be, a->g, a->beta, a->a_in, a->b_in, T, nv, L->neg_a, L->dt_bias);
    /* the causal conv, then the delta rule, each one call for the batch; every sequence carries
     * its own state: [K-1, C] conv rows, then S [nv, dk, dv] */
    float **conv_st = b->states, **S = b->states + n_entries;
    for (int i = 0; i < n_entries; i++) {
        conv_st[i] = e[i].seq->kv->vt->layer_state(e[i].seq->kv, l);
        S[i] = conv_st[i] + (s->conv_k - 1) * C;
    }
    be->gdn_conv(be, a->conv, a->mixed, n_entries, b->n_tokens, (int)C, L->conv_w, s->conv_k,
                 conv_st);
    /* split q | k | v into contiguous [T, nk, dk], [T, nk, dk], [T, nv, dv]; L2-norm q and k */
    be->gdn_split_qkv(be, a->qn, a->kn, a->vn, a->conv, T, C, nk, dk, VD, 1e-6f);
    be->gdn_delta(be, d, n_entries, b->n_tokens, a->qn, a->kn, a->vn, a->g, a->beta, S, a->attn);
    /* gated RMSNorm per value head: norm(o) * w * silu(z) */
    be->gated_rmsnorm(be, a->attn, a->attn, a->z, L->gnorm, T * nv, dv, s->eps);
}

/* Full attention (gated in qwen3_next / 3.5) for T stacked tokens: rmsnorm(x; attn_norm) ->
 * a->attn [T, QD]. The batched call reads the positions from backend memory (a->pos), so a
 * recorded decode step replays at later positions. */
static void attention_mixer(kiln_model *m, qn_state *s, qn_layer *L, int l, kiln_batch_entry *e,
                            int n_entries, int64_t T, qn_acts *a, kiln_kv **kvs, int *kv_n) {
    kiln_backend *be = m->be;
    const int64_t QD = (int64_t)s->n_heads * s->head_dim,
                  KVD = (int64_t)s->n_kv_heads * s->head_dim, hd = s->head_dim;
    /* gated: q_proj rows per head are q[hd] then gate[hd] */
    float *const outs[3] = {s->gated_attn ? a->qg : a->q, a->k, a->v};
    const kiln_matrix *const ws[3] = {&L->wq, &L->wk, &L->wv};
    be->matmul_norm(be, 3, outs, a->x, a->h, T, ws, L->attn_norm, s->eps, s->norm_plus_one);
    if (s->gated_attn) {
        be->copy2d(be, a->q, hd, a->qg, 2 * hd, T * s->n_heads, hd);
        be->copy2d(be, a->gate, hd, a->qg + hd, 2 * hd, T * s->n_heads, hd);
    }
    /* q / k norm (weights 1 + w already where the norms are) + RoPE: inside the cache's store +
     * attention for decode steps on caches that take it (the CUDA contiguous cache), else one op */
    const kiln_qk_prep prep = {L->q_norm, L->k_norm, s->inv_freq, s->rot, s->eps};
    const bool prep_inside = kvs && kvs[0]->vt->prep_inside && T == n_entries;
    if (!prep_inside)
        be->qk_norm_rope(be, a->q, a->k, a->pos, T, s->n_heads, s->n_kv_heads, s->head_dim, s->rot,
                         s->inv_freq, L->q_norm, L->k_norm, s->eps);
    const kiln_attn_params ap = {.n_heads = s->n_heads, .scale = 1.0f / sqrtf((float)s->head_dim)},
                           apb = {.n_heads = s->n_heads,
                                  .scale = 1.0f / sqrtf((float)s->head_dim),
                                  .positions = a->pos,
                                  .prep = prep_inside ? &prep : NULL};
    if (kvs) {
        kvs[0]->vt->store_attend_batch(kvs, kv_n, n_entries, l, a->k, a->v, a->q, a->attn, &apb,
                                       be->pool);
    } else {
        for (int i = 0, t = 0; i < n_entries; t += e[i].n_tokens, i++) {
            kiln_kv *kv = e[i].seq->kv;
            kv->vt->store(kv, l, a->k + t * KVD, a->v + t * KVD, e[i].n_tokens);
            kv->vt->attend(kv, l, a->q + t * QD, e[i].n_tokens, a->attn + t * QD, &ap, be->pool);
        }
    }
    if (s->gated_attn) be->sigmoid_mul(be, a->attn, a->attn, a->gate, T * QD);
}

static kiln_status qn_forward(kiln_model *m, kiln_batch_entry *e, int n_entries) {
    qn_state *s = m->family_state;
    kiln_backend *be = m->be;
    int64_t T, R;
    kiln_batch_sizes(e, n_entries, &T, &R);
    if (T == 0) return KILN_OK;
    const kiln_gdn_dims *d = &s->gdn;
    const int64_t H = s->hidden, QD = (int64_t)s->n_heads * s->head_dim,
                  KVD = (int64_t)s->n_kv_heads * s->head_dim, VD = (int64_t)d->n_v_heads * d->dv,
                  KD = (int64_t)d->n_k_heads * d->dk, C = s->conv_dim, NV = d->n_v_heads;
    const int64_t F = s->ffn > 0 ? s->ffn : 1;
    const int64_t AW = QD > VD ? QD : VD;
    KILN_TRY(kiln_batch_reserve(e, n_entries));

    size_t floats = (size_t)(T * (2 * H + 4 * QD + 2 * KVD + AW + (C + VD) + 2 * C + VD + 6 * NV +
                                  2 * KD + VD + 2 * F + H) +
                             R * H);
    KILN_TRY(kiln_scratch_reserve(be, &s->act, floats * sizeof(float)));
    KILN_TRY(kiln_scratch_reserve(be, &s->ids, (size_t)(2 * T) * sizeof(int32_t)));
    qn_acts a;
    float *p = s->act.ptr;
    a.x = p, p += T * H;
    a.h = p, p += T * H;
    a.q = p, p += T * QD;
    a.gate = p, p += T * QD;
    a.qg = p, p += 2 * T * QD;
    a.k = p, p += T * KVD;
    a.v = p, p += T * KVD;
    a.attn = p, p += T * AW;
    a.proj = p, p += T * (C + VD);
    a.mixed = p, p += T * C;
    a.conv = p, p += T * C;
    a.z = p, p += T * VD;
    a.ba = p, p += 2 * T * NV;
    a.b_in = p, p += T * NV;
    a.a_in = p, p += T * NV;
    a.g = p, p += T * NV;
    a.beta = p, p += T * NV;
    a.qn = p, p += T * KD;
    a.kn = p, p += T * KD;
    a.vn = p, p += T * VD;
    a.ff1 = p, p += T * F;
    a.ff2 = p, p += T * F;
    a.y = p, p += T * H;
    a.rows = p;
    a.tok = s->ids.ptr;
    a.pos = a.tok + T;

    /* one store + attend call per attention layer for the whole batch when the caches offer it */
    kiln_batch_kv bkv;
    KILN_TRY(kiln_batch_begin(be, &bkv, e, n_entries, T, a.tok));
    kiln_kv **kvs = bkv.kvs; /* NULL unless the caches take one batched call */
    int *kv_n = bkv.n;
    qn_gdn_batch gb = {malloc((size_t)n_entries * sizeof *gb.n_tokens),
                       malloc((size_t)(2 * n_entries) * sizeof *gb.states)};
    if (!gb.n_tokens || !gb.states) {
        free(gb.n_tokens), free(gb.states);
        kiln_batch_kv_free(&bkv);
        return kiln_error(KILN_ERR_OOM, "out of memory (batch of %d)", n_entries);
    }
    for (int i = 0; i < n_entries; i++) gb.n_tokens[i] = e[i].n_tokens;

    be->embed(be, a.x, a.tok, T, &s->embed);
    /* decode steps run as one recorded unit where the backend offers it (llama.c), unless a
     * layer routes experts on the host (moe.c waits for the routes there). The recorded launches
     * also carry each sequence's recurrent state pointers (the conv and delta-rule ops take them
     * as arguments) and the MoE scratch, so those are part of the key. */
    bool host_moe = false;
    for (int l = 0; l < s->n_layers; l++)
        host_moe |= s->layers[l].moe && !kiln_moe_on_device(m, &s->layers[l].sparse, T);
    const bool graph = !host_moe && kiln_decode_step_recordable(be, &bkv, T, n_entries);
    bool replayed = false;
    if (graph) {
        uint64_t key = kiln_decode_step_key(s, a.x, a.tok, &bkv, n_entries);
        key = key ? kiln_hash_mix(key, (uintptr_t)s->moe.ptr) : 0;
        for (int l = 0; key && l < s->n_layers; l++)
            for (int i = 0; s->layers[l].linear && i < n_entries; i++)
                key = kiln_hash_mix(key, (uintptr_t)e[i].seq->kv->vt->layer_state(e[i].seq->kv, l));
        replayed = be->graph_begin(be, key);
    }
    /* fused ops (backend.h): the input norm folded into each mixer's projections, the residual
     * adds into the matmuls producing them, the FFN norm and SwiGLU into the gate/up matmul */
    kiln_status st = KILN_OK;
    for (int l = 0; !replayed && l < s->n_layers && st == KILN_OK; l++) {
        qn_layer *L = &s->layers[l];
        /* dense layers: each matmul feeds the next one (backend.h feeds_next, as in llama.c) */
        const bool hint = be->feeds_next && !L->moe;
        if (L->linear)
            linear_mixer(m, s, L, l, e, n_entries, T, &a, &gb);
        else
            attention_mixer(m, s, L, l, e, n_entries, T, &a, kvs, kv_n);
        if (hint) be->feeds_next(be, a.x, L->ffn_norm, s->eps, s->norm_plus_one);
        be->matmul_add(be, a.x, a.attn, a.h, T, L->linear ? &L->out_proj : &L->wo);
        if (L->moe) {
            be->rmsnorm(be, a.h, a.x, L->ffn_norm, T, H, s->eps, s->norm_plus_one);
            st = kiln_moe_forward(m, &L->sparse, a.y, a.h, T, &s->moe);
            if (st == KILN_OK) be->add(be, a.x, a.x, a.y, T * H);
        } else {
            if (hint) be->feeds_next(be, a.ff1, NULL, 0.0f, false);
            be->matmul_norm_glu(be, a.ff1, a.x, a.h, a.ff2, T, &L->w_gate, &L->w_up, L->ffn_norm,
                                s->eps, s->norm_plus_one, KILN_GLU_SILU);
            if (hint && l + 1 < s->n_layers)
                be->feeds_next(be, a.x, s->layers[l + 1].attn_norm, s->eps, s->norm_plus_one);
            be->matmul_add(be, a.x, a.ff1, a.h, T, &L->w_down);
        }
    }
    if (graph && !replayed) be->graph_end(be);
    kiln_batch_kv_free(&bkv);
    free(gb.n_tokens), free(gb.states);
    if (st != KILN_OK) return st;
    kiln_batch_commit(e, n_entries);
    const kiln_logits_head head = {.hidden = H,
                                   .vocab = s->vocab,
                                   .final_norm = s->final_norm,
                                   .eps = s->eps,
                                   .plus_one = s->norm_plus_one,
                                   .lm_head = &s->lm_head};
    return kiln_logits_head_run(m, &head, e, n_entries, a.x, a.rows, &s->logits);
}

const kiln_family kiln_family_qwen3_next = {
    .name = "qwen3_next",
    .matches = qn_matches,
    .load = qn_load,
    .forward = qn_forward,
    .free = qn_free,
};
