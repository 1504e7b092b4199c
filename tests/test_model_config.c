/* test_model_config.c — config.json parsing: every shared fixture loads with the sizes its file
 * states, old and new rope spellings agree, eos union with generation_config, MLX quantization
 * overrides, Gemma nesting, and wrong JSON types fail naming key and file. */
#include "format/model_config.h"

#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *fixture_dirs[] = {
    "fixtures/gemma3_text",
    "fixtures/gemma3_text-mlx-q4g32",
    "fixtures/gemma3_text-mlx-q8g64",
    "fixtures/gemma4_text",
    "fixtures/llama",
    "fixtures/llama-mlx-q4g32",
    "fixtures/llama-mlx-q8g64",
    "fixtures/llama-tied",
    "fixtures/qwen2",
    "fixtures/qwen3",
    "fixtures/qwen3-mlx-q4g32",
    "fixtures/qwen3-mlx-q8g64",
    "fixtures/qwen3_5_text",
    "fixtures/qwen3_moe",
    "fixtures/qwen3_moe-mlx-q4g32",
    "fixtures/qwen3_moe-mlx-q8g64",
    "fixtures/qwen3_next",
    "fixtures/qwen3_next-mlx-q4g32",
    "fixtures/qwen3_next-mlx-q8g64",
};

static void test_fixtures(void) {
    for (size_t i = 0; i < sizeof fixture_dirs / sizeof fixture_dirs[0]; i++) {
        kiln_config c;
        const char *name = fixture_dirs[i];
        CHECK_OK(kiln_config_load(test_shared(name), &c));
        /* facts of every fixture (README + config files): vocab 512, hidden 128, 4 heads, 2 kv
         * heads, head_dim 32, eos 2, bos 1 */
        CHECK_MSG(c.vocab_size == 512 && c.hidden_size == 128 && c.n_heads == 4 &&
                      c.n_kv_heads == 2 && c.head_dim == 32,
                  "%s", name);
        CHECK(c.n_eos == 1 && c.eos_token_ids[0] == 2 && c.bos_token_id == 1);
        CHECK(fabsf(c.rms_norm_eps - 1e-6f) < 1e-12f);
        CHECK(c.max_position_embeddings == 512);
        bool mlx = strstr(name, "-mlx-") != NULL;
        CHECK(c.quantized == mlx);
        if (mlx) {
            bool q4 = strstr(name, "q4g32") != NULL;
            CHECK(c.quant_bits == (q4 ? 4 : 8) && c.quant_group_size == (q4 ? 32 : 64));
        }
        bool gemma = strncmp(name, "fixtures/gemma", 14) == 0;
        CHECK(c.tie_word_embeddings == (gemma || strstr(name, "llama-tied") != NULL));
        CHECK(c.attention_bias == (strstr(name, "qwen2") != NULL));
        if (gemma) CHECK(c.rope.theta == 1000000.0f); /* full_attention's theta, not sliding's */
        kiln_config_free(&c);
    }
    kiln_config c;
    CHECK_OK(kiln_config_load(test_shared("fixtures/llama-tied"), &c));
    CHECK(strcmp(c.rope.type, "llama3") == 0 && c.rope.theta == 500000.0f &&
          c.rope.factor == 8.0f && c.rope.low_freq_factor == 1.0f &&
          c.rope.high_freq_factor == 4.0f && c.rope.original_max_position == 64);
    CHECK(strcmp(c.model_type, "llama") == 0 && strcmp(c.architecture, "LlamaForCausalLM") == 0);
    CHECK(c.n_layers == 3 && c.intermediate_size == 256);
    kiln_config_free(&c);
    CHECK_OK(kiln_config_load(test_shared("fixtures/gemma4_text"), &c));
    CHECK(strcmp(c.rope.type, "proportional") == 0 && c.rope.partial_rotary_factor == 0.25f);
    CHECK(kiln_config_int(&c, "hidden_size_per_layer_input", -1) == 16);
    kiln_config_free(&c);
    CHECK_OK(kiln_config_load(test_shared("fixtures/qwen3_next"), &c));
    CHECK(c.rope.partial_rotary_factor == 0.25f && c.n_layers == 4);
    CHECK(kiln_config_int(&c, "linear_num_value_heads", -1) == 4);
    CHECK(strcmp(kiln_config_string(&c, "hidden_act", ""), "silu") == 0);
    CHECK(kiln_config_bool(&c, "norm_topk_prob", false) == true);
    CHECK(kiln_config_float(&c, "router_aux_loss_coef", 0) == 0.001f);
    CHECK(kiln_config_int(&c, "no_such_key", 77) == 77);
    kiln_config_free(&c);
    /* the demo model: 8 layers, hidden 384, 6 heads x 64, tied, eos 0 */
    CHECK_OK(kiln_config_load(test_shared("models/demo-bf16"), &c));
    CHECK(c.vocab_size == 8192 && c.hidden_size == 384 && c.n_layers == 8 && c.n_heads == 6 &&
          c.head_dim == 64 && c.tie_word_embeddings && c.n_eos == 1 && c.eos_token_ids[0] == 0);
    kiln_config_free(&c);
}

static kiln_status parse(const char *text, kiln_config *c) {
    return kiln_config_parse(text, strlen(text), "test.json", c);
}

#define BASE                                                                                       \
    "\"vocab_size\":100,\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4"

static void test_rope_forms(void) {
    kiln_config old_form, new_form;
    CHECK_OK(parse("{" BASE ",\"rope_theta\":500000.0,\"rope_scaling\":{\"type\":\"llama3\","
                   "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                   "\"original_max_position_embeddings\":8192}}",
                   &old_form));
    CHECK_OK(parse("{" BASE
                   ",\"rope_parameters\":{\"rope_type\":\"llama3\",\"rope_theta\":500000.0,"
                   "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                   "\"original_max_position_embeddings\":8192}}",
                   &new_form));
    CHECK(memcmp(&old_form.rope, &new_form.rope, sizeof old_form.rope) == 0);
    CHECK(strcmp(new_form.rope.type, "llama3") == 0 && new_form.rope.original_max_position == 8192);
    kiln_config_free(&old_form);
    kiln_config_free(&new_form);
    /* defaults: theta 10000, type default, all of head_dim rotated; head_dim = hidden/heads */
    kiln_config c;
    CHECK_OK(parse("{" BASE "}", &c));
    CHECK(c.rope.theta == 10000.0f && strcmp(c.rope.type, "default") == 0 &&
          c.rope.partial_rotary_factor == 1.0f && c.head_dim == 16 && c.n_kv_heads == 4);
    CHECK(c.bos_token_id == -1 && c.n_eos == 0 && !c.quantized && !c.tie_word_embeddings);
    kiln_config_free(&c);
    /* old rope_scaling with rope_type spelling, and top-level partial_rotary_factor */
    CHECK_OK(parse("{" BASE
                   ",\"partial_rotary_factor\":0.5,\"rope_scaling\":{\"rope_type\":\"linear\","
                   "\"factor\":2.0},\"bos_token_id\":null}",
                   &c));
    CHECK(strcmp(c.rope.type, "linear") == 0 && c.rope.factor == 2.0f &&
          c.rope.partial_rotary_factor == 0.5f && c.bos_token_id == -1);
    kiln_config_free(&c);
}

static void test_nested_and_eos(void) {
    kiln_config c;
    /* Gemma-style text_config merged over the top level; gemma defaults to tied */
    CHECK_OK(
        parse("{\"model_type\":\"gemma3\",\"architectures\":[\"Gemma3ForConditionalGeneration\"],"
              "\"eos_token_id\":[1,106],\"text_config\":{\"model_type\":\"gemma3_text\","
              "\"vocab_size\":262208,\"hidden_size\":640,\"num_hidden_layers\":18,"
              "\"num_attention_heads\":4,\"num_key_value_heads\":1,\"head_dim\":256,"
              "\"rope_parameters\":{\"sliding_attention\":{\"rope_theta\":10000.0},"
              "\"full_attention\":{\"rope_theta\":1000000.0,\"rope_type\":\"linear\","
              "\"factor\":8.0}}}}",
              &c));
    CHECK(strcmp(c.model_type, "gemma3_text") == 0 && c.vocab_size == 262208 && c.head_dim == 256);
    CHECK(c.tie_word_embeddings && c.rope.theta == 1000000.0f && c.rope.factor == 8.0f);
    CHECK(c.n_eos == 2 && c.eos_token_ids[0] == 1 && c.eos_token_ids[1] == 106);
    CHECK(kiln_config_int(&c, "num_key_value_heads", 0) == 1); /* merged into json */
    kiln_config_free(&c);

    /* eos union with generation_config.json, without duplicates */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/eos", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    char path[700];
    const char *cfg =
        "{" BASE ",\"model_type\":\"qwen2\",\"attention_bias\":false,\"eos_token_id\":[7,9]}";
    const char *gen = "{\"eos_token_id\":[9,11,7],\"temperature\":0.6,\"top_p\":0.95,\"top_k\":20,"
                      "\"repetition_penalty\":1.1,\"do_sample\":true}";
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(test_write_file(path, cfg, strlen(cfg)));
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    CHECK(test_write_file(path, gen, strlen(gen)));
    CHECK_OK(kiln_config_load(dir, &c));
    CHECK(c.n_eos == 3 && c.eos_token_ids[0] == 7 && c.eos_token_ids[1] == 9 &&
          c.eos_token_ids[2] == 11);
    CHECK(c.has_temperature && fabsf(c.gen_temperature - 0.6f) < 1e-7f && c.has_top_p &&
          fabsf(c.gen_top_p - 0.95f) < 1e-7f && c.has_top_k && c.gen_top_k == 20 &&
          c.has_repetition_penalty && fabsf(c.gen_repetition_penalty - 1.1f) < 1e-7f &&
          c.gen_do_sample);
    CHECK(c.attention_bias); /* qwen2 always has qkv bias */
    kiln_config_free(&c);
    /* a wrong type in generation_config.json names that file */
    gen = "{\"top_k\":\"twenty\"}";
    CHECK(test_write_file(path, gen, strlen(gen)));
    CHECK_ERR(kiln_config_load(dir, &c), KILN_ERR_FORMAT, "generation_config.json: key 'top_k'");
}

static void test_quant_overrides(void) {
    kiln_config c;
    CHECK_OK(kiln_config_load(test_shared("fixtures/qwen3_moe-mlx-q4g32"), &c));
    CHECK(c.quantized && c.quant_bits == 4 && c.quant_group_size == 32);
    CHECK(c.n_quant_overrides == 3);
    int bits = 0, group = 0;
    CHECK(kiln_config_module_quant(&c, "model.layers.1.mlp.gate", &bits, &group) && bits == 8 &&
          group == 64);
    /* same module spelled without / with an extra prefix */
    bits = group = 0;
    CHECK(kiln_config_module_quant(&c, "layers.2.mlp.gate", &bits, &group) && bits == 8 &&
          group == 64);
    bits = group = 0;
    CHECK(kiln_config_module_quant(&c, "language_model.model.layers.0.mlp.gate", &bits, &group) &&
          bits == 8 && group == 64);
    bits = group = 0;
    CHECK(kiln_config_module_quant(&c, "model.layers.1.mlp.switch_mlp.up_proj", &bits, &group) &&
          bits == 4 && group == 32);
    /* "gate" must not match "gate_proj" */
    CHECK(kiln_config_module_quant(&c, "model.layers.1.mlp.gate_proj", &bits, &group) && bits == 4);
    kiln_config_free(&c);

    /* false override = stored unquantized; quantization_config alone also works */
    CHECK_OK(parse("{" BASE ",\"quantization_config\":{\"group_size\":64,\"bits\":6,"
                   "\"lm_head\":false,\"model.embed_tokens\":{\"bits\":8}}}",
                   &c));
    CHECK(c.quantized && c.quant_bits == 6 && c.quant_group_size == 64 && c.n_quant_overrides == 2);
    CHECK(!kiln_config_module_quant(&c, "lm_head", &bits, &group));
    CHECK(kiln_config_module_quant(&c, "model.embed_tokens", &bits, &group) && bits == 8 &&
          group == 64);
    kiln_config_free(&c);
    CHECK_OK(parse("{" BASE "}", &c));
    CHECK(!kiln_config_module_quant(&c, "model.layers.0.mlp.up_proj", &bits, &group));
    kiln_config_free(&c);
}

static void test_bad_configs(void) {
    static const struct {
        const char *text;
        const char *needle;
    } cases[] = {
        {"{\"vocab_size\":\"100\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_"
         "heads\":4}",
         "test.json: key 'vocab_size'"},
        {"{" BASE ",\"rms_norm_eps\":\"1e-6\"}", "key 'rms_norm_eps'"},
        {"{" BASE ",\"tie_word_embeddings\":1}", "key 'tie_word_embeddings'"},
        {"{" BASE ",\"rope_parameters\":[1]}", "key 'rope_parameters'"},
        {"{" BASE ",\"rope_scaling\":{\"factor\":\"x\"}}", "rope_scaling: key 'factor'"},
        {"{" BASE ",\"eos_token_id\":\"2\"}", "key 'eos_token_id'"},
        {"{" BASE ",\"eos_token_id\":[2,\"x\"]}", "key 'eos_token_id'"},
        {"{" BASE ",\"num_key_value_heads\":3}", "not a multiple"},
        {"{" BASE ",\"head_dim\":0}", "key 'head_dim'"},
        {"{\"vocab_size\":0,\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4}",
         "key 'vocab_size'"},
        {"{\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4}",
         "key 'vocab_size'"},
        {"{" BASE ",\"quantization\":{\"bits\":\"4\"}}", "quantization: key 'bits'"},
        {"{" BASE ",\"quantization\":{\"bits\":4,\"group_size\":64,\"model.x\":{\"bits\":99}}}",
         "model.x"},
        {"{" BASE ",\"architectures\":\"Llama\"}", "key 'architectures'"},
        {"{" BASE ",\"model_type\":7}", "key 'model_type'"},
        {"{" BASE ",\"text_config\":3}", "key 'text_config'"},
        {"{\"vocab_size\":100,\"hidden_size\":1.5,\"num_hidden_layers\":2,\"num_attention_heads\":"
         "4}",
         "key 'hidden_size'"},
        {"{\"vocab_size\":100,\"hidden_size\":64,\"num_hidden_layers\":1e12,\"num_attention_"
         "heads\":4}",
         "key 'num_hidden_layers'"},
        {"[1,2]", "not a JSON object"},
        {"{" BASE, "not valid JSON"},
        {"", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_config c;
        CHECK_ERR(parse(cases[i].text, &c), KILN_ERR_FORMAT, cases[i].needle);
        CHECK(c.json == NULL && c.quant_overrides == NULL);
    }
    kiln_config c;
    CHECK_ERR(kiln_config_load("/nonexistent/model", &c), KILN_ERR_NOT_FOUND,
              "/nonexistent/model/config.json");
}

int main(void) {
    test_fixtures();
    test_rope_forms();
    test_nested_and_eos();
    test_quant_overrides();
    test_bad_configs();
    return test_finish();
}
