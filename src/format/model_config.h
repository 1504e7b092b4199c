/* model_config.h — config.json and generation_config.json of a Hugging Face / mlx-community model
 * folder, parsed into one struct. Fields every family uses are typed here; family-specific keys
 * are read from `json` (the parsed config, text_config merged in for nested configs). */
#ifndef KILN_FORMAT_MODEL_CONFIG_H
#define KILN_FORMAT_MODEL_CONFIG_H

#include "kiln.h"

#include <cjson/cJSON.h>

#define KILN_MAX_EOS 16

typedef struct kiln_quant_override {
    char *path;     /* module path, e.g. "model.layers.0.mlp.gate" */
    bool quantized; /* false: this module is stored unquantized */
    int bits;
    int group_size;
} kiln_quant_override;

typedef struct kiln_rope_config {
    float theta;                 /* rope_theta (default 10000) */
    char type[32];               /* "default", "llama3", "linear", "proportional", ... */
    float factor;                /* scaling factor (llama3/linear) */
    float low_freq_factor;       /* llama3 */
    float high_freq_factor;      /* llama3 */
    int original_max_position;   /* llama3 original_max_position_embeddings */
    float partial_rotary_factor; /* fraction of head_dim rotated (1 = all) */
} kiln_rope_config;

typedef struct kiln_config {
    char model_type[64];   /* "llama", "qwen2", "qwen3", "qwen3_next", "gemma3_text", ... */
    char architecture[96]; /* architectures[0], "" if absent */
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim; /* head_dim, or hidden_size / n_heads */
    float rms_norm_eps;
    kiln_rope_config rope; /* from rope_parameters (new) or rope_theta/rope_scaling (old) */
    bool tie_word_embeddings;
    bool attention_bias; /* qkv bias (qwen2 always true) */
    bool mlp_bias;
    int max_position_embeddings;
    int bos_token_id; /* -1 if none */
    int n_eos;
    int eos_token_ids[KILN_MAX_EOS];
    /* MLX quantization ("quantization" or "quantization_config" block) */
    bool quantized;
    int quant_bits;
    int quant_group_size;
    int n_quant_overrides;
    kiln_quant_override *quant_overrides;
    /* generation_config.json (has_* false when absent) */
    bool has_temperature, has_top_p, has_top_k, has_repetition_penalty;
    float gen_temperature, gen_top_p, gen_repetition_penalty;
    int gen_top_k;
    bool gen_do_sample;
    cJSON *json; /* owned: the whole config.json (text_config merged over the top level) */
} kiln_config;

/* Reads dir/config.json (required) and dir/generation_config.json (optional). */
kiln_status kiln_config_load(const char *dir, kiln_config *out);
/* Parses config JSON text (the fuzz entry point); label names the source in errors. */
kiln_status kiln_config_parse(const char *text, size_t len, const char *label, kiln_config *out);
void kiln_config_free(kiln_config *cfg);

/* Quantization of one module (e.g. "model.layers.3.mlp.gate_proj"): per-module override if one
 * matches, else the default. Returns false if the module is unquantized. */
bool kiln_config_module_quant(const kiln_config *cfg, const char *module, int *bits, int *group);

/* Typed getters on cfg->json with defaults (missing or wrong type -> default). */
int kiln_config_int(const kiln_config *cfg, const char *key, int dflt);
float kiln_config_float(const kiln_config *cfg, const char *key, float dflt);
bool kiln_config_bool(const kiln_config *cfg, const char *key, bool dflt);
const char *kiln_config_string(const kiln_config *cfg, const char *key, const char *dflt);

#endif
