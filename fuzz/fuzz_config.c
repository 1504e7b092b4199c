/* fuzz_config.c — libFuzzer target: arbitrary text through kiln_config_parse, then the
 * quantization and typed-getter queries on whatever parsed. */
#include "format/model_config.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_config cfg;
    if (kiln_config_parse((const char *)data, size, "fuzz.json", &cfg) == KILN_OK) {
        int bits = 0, group = 0;
        kiln_config_module_quant(&cfg, "model.layers.0.mlp.gate", &bits, &group);
        kiln_config_module_quant(&cfg, "lm_head", &bits, &group);
        if (cfg.head_dim <= 0 || cfg.n_heads % cfg.n_kv_heads != 0) abort(); /* validated */
        (void)kiln_config_int(&cfg, "hidden_size", 0);
        (void)kiln_config_string(&cfg, "model_type", "");
        kiln_config_free(&cfg);
    }
    return 0;
}
