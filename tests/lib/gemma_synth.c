/* gemma_synth.c — writes the random Gemma 4 checkpoint described in gemma_synth.h. */
#include "gemma_synth.h"

#include "format/safetensors.h"
#include "test_util.h"
#include "util/half.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* geometry: 6 layers S S F S S F, the last two KV-shared (4 reads 3, 5 reads 2) */
enum { G_H = 64, G_NH = 4, G_NKV = 2, G_HD = 16, G_GHD = 32, G_GKV = 1, G_FF = 96, G_V = 128 };
enum { G_L = 6, G_SHARED = 2, G_PLE = 8, G_E = 5, G_MF = 24 }; /* top 2 experts, window 8 */

static bool g_sliding(int i) {
    return i != 2 && i != 5;
}

/* A bf16 tensor of n values: normal * std + mean. */
static kiln_status add_t(kiln_st_writer *w, uint64_t *rng, const char *name, int ndim,
                         const int64_t *shape, float mean, float std) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    uint16_t *d = malloc((size_t)n * sizeof *d);
    if (!d) return KILN_ERR_OOM;
    for (int64_t i = 0; i < n; i++) d[i] = kiln_f32_to_bf16(mean + std * test_rand_normal(rng));
    return kiln_st_writer_add(w, name, KILN_DT_BF16, ndim, shape, d, true);
}

static kiln_status add_mat(kiln_st_writer *w, uint64_t *rng, const char *name, int64_t r, int64_t c,
                           float std) {
    const int64_t shape[2] = {r, c};
    return add_t(w, rng, name, 2, shape, 0.0f, std);
}

/* Gemma 4 norms are plain w: near 1, perturbed so an ignored one shows */
static kiln_status add_norm(kiln_st_writer *w, uint64_t *rng, const char *name, int64_t n) {
    return add_t(w, rng, name, 1, &n, 1.0f, 0.2f);
}

static const char *config_json =
    "{\"architectures\": [\"Gemma4ForCausalLM\"], \"model_type\": \"gemma4_text\",\n"
    " \"hidden_size\": 64, \"num_hidden_layers\": 6, \"num_attention_heads\": 4,\n"
    " \"num_key_value_heads\": 2, \"head_dim\": 16, \"global_head_dim\": 32,\n"
    " \"num_global_key_value_heads\": 1, \"attention_k_eq_v\": true,\n"
    " \"num_kv_shared_layers\": 2, \"intermediate_size\": 96, \"vocab_size\": 128,\n"
    " \"vocab_size_per_layer_input\": 128, \"hidden_size_per_layer_input\": 8,\n"
    " \"rms_norm_eps\": 1e-06, \"sliding_window\": 8,\n"
    " \"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"full_attention\",\n"
    "                 \"sliding_attention\", \"sliding_attention\", \"full_attention\"],\n"
    " \"rope_parameters\": {\n"
    "   \"full_attention\": {\"partial_rotary_factor\": 0.25, \"rope_theta\": 1000000.0,\n"
    "                      \"rope_type\": \"proportional\"},\n"
    "   \"sliding_attention\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\"}},\n"
    " \"final_logit_softcapping\": 30.0, \"tie_word_embeddings\": true,\n"
    " \"enable_moe_block\": %s, \"num_experts\": 5, \"top_k_experts\": 2,\n"
    " \"moe_intermediate_size\": 24, \"hidden_activation\": \"gelu_pytorch_tanh\",\n"
    " \"max_position_embeddings\": 512, \"bos_token_id\": 1, \"eos_token_id\": 2,\n"
    " \"pad_token_id\": 0, \"attention_bias\": false, \"dtype\": \"bfloat16\"}\n";

bool gemma_synth_write(const char *dir, bool moe) {
    char path[1024], n[256], config[2048];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(config, sizeof config, config_json, moe ? "true" : "false");
    if (!test_write_file(path, config, strlen(config))) return false;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    kiln_st_writer *w = NULL;
    if (kiln_st_writer_new(&w) != KILN_OK) return false;
    kiln_status st = KILN_OK;
#define T_(call)                                                                                   \
    do {                                                                                           \
        if (st == KILN_OK) st = (call);                                                            \
    } while (0)
    T_(add_mat(w, &rng, "model.embed_tokens.weight", G_V, G_H, 0.5f));
    T_(add_norm(w, &rng, "model.norm.weight", G_H));
    T_(add_mat(w, &rng, "model.embed_tokens_per_layer.weight", G_V, G_L * G_PLE, 0.5f));
    T_(add_mat(w, &rng, "model.per_layer_model_projection.weight", G_L * G_PLE, G_H, 0.15f));
    T_(add_norm(w, &rng, "model.per_layer_projection_norm.weight", G_PLE));
    for (int i = 0; i < G_L; i++) {
        const bool sl = g_sliding(i), shared = i >= G_L - G_SHARED;
        const int hd = sl ? G_HD : G_GHD, nkv = sl ? G_NKV : G_GKV;
        static const char *norms[] = {"input_layernorm",
                                      "post_attention_layernorm",
                                      "pre_feedforward_layernorm",
                                      "post_feedforward_layernorm",
                                      "pre_feedforward_layernorm_2",
                                      "post_feedforward_layernorm_1",
                                      "post_feedforward_layernorm_2",
                                      "post_per_layer_input_norm"};
        for (size_t j = 0; j < sizeof norms / sizeof norms[0]; j++) {
            snprintf(n, sizeof n, "model.layers.%d.%s.weight", i, norms[j]);
            T_(add_norm(w, &rng, n, G_H));
        }
        const int64_t one = 1;
        snprintf(n, sizeof n, "model.layers.%d.layer_scalar", i);
        T_(add_t(w, &rng, n, 1, &one, 0.8f, 0.05f));
        snprintf(n, sizeof n, "model.layers.%d.self_attn.q_proj.weight", i);
        T_(add_mat(w, &rng, n, G_NH * hd, G_H, 0.15f));
        snprintf(n, sizeof n, "model.layers.%d.self_attn.o_proj.weight", i);
        T_(add_mat(w, &rng, n, G_H, G_NH * hd, 0.15f));
        snprintf(n, sizeof n, "model.layers.%d.self_attn.q_norm.weight", i);
        T_(add_norm(w, &rng, n, hd));
        if (!shared) {
            snprintf(n, sizeof n, "model.layers.%d.self_attn.k_norm.weight", i);
            T_(add_norm(w, &rng, n, hd));
            snprintf(n, sizeof n, "model.layers.%d.self_attn.k_proj.weight", i);
            T_(add_mat(w, &rng, n, nkv * hd, G_H, 0.15f));
            if (sl) { /* full layers: k_eq_v, no v_proj */
                snprintf(n, sizeof n, "model.layers.%d.self_attn.v_proj.weight", i);
                T_(add_mat(w, &rng, n, nkv * hd, G_H, 0.15f));
            }
        }
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate_proj.weight", i);
        T_(add_mat(w, &rng, n, G_FF, G_H, 0.15f));
        snprintf(n, sizeof n, "model.layers.%d.mlp.up_proj.weight", i);
        T_(add_mat(w, &rng, n, G_FF, G_H, 0.15f));
        snprintf(n, sizeof n, "model.layers.%d.mlp.down_proj.weight", i);
        T_(add_mat(w, &rng, n, G_H, G_FF, 0.15f));
        if (moe) { /* the router and the experts */
            snprintf(n, sizeof n, "model.layers.%d.router.proj.weight", i);
            T_(add_mat(w, &rng, n, G_E, G_H, 1.0f));
            snprintf(n, sizeof n, "model.layers.%d.router.scale", i);
            T_(add_norm(w, &rng, n, G_H));
            const int64_t ne = G_E;
            snprintf(n, sizeof n, "model.layers.%d.router.per_expert_scale", i);
            T_(add_t(w, &rng, n, 1, &ne, 1.0f, 0.25f));
            const int64_t gu[3] = {G_E, 2 * G_MF, G_H}, dn[3] = {G_E, G_H, G_MF};
            snprintf(n, sizeof n, "model.layers.%d.experts.gate_up_proj", i);
            T_(add_t(w, &rng, n, 3, gu, 0.0f, 0.15f));
            snprintf(n, sizeof n, "model.layers.%d.experts.down_proj", i);
            T_(add_t(w, &rng, n, 3, dn, 0.0f, 0.15f));
        }
        snprintf(n, sizeof n, "model.layers.%d.per_layer_input_gate.weight", i);
        T_(add_mat(w, &rng, n, G_PLE, G_H, 0.15f));
        snprintf(n, sizeof n, "model.layers.%d.per_layer_projection.weight", i);
        T_(add_mat(w, &rng, n, G_H, G_PLE, 0.15f));
    }
#undef T_
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st == KILN_OK) st = kiln_st_writer_finish(w, path);
    kiln_st_writer_free(w);
    return st == KILN_OK;
}
