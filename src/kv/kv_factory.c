/* kv_factory.c — maps a --kv option string to a cache kind, and the cache kinds' byte costs. */
#include "kv/kv_factory.h"

#include "util/status.h"

#include <stdio.h>
#include <string.h>

void kiln_load_options_default(kiln_load_options *o) {
    memset(o, 0, sizeof *o);
    o->device = KILN_DEVICE_CPU;
    snprintf(o->kv.kind, sizeof o->kv.kind, "f32");
}

kiln_status kiln_kv_options_parse(const char *text, kiln_kv_options *out) {
    static const char *kinds[] = {"f32"};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (strcmp(text, kinds[i]) == 0) {
            memset(out, 0, sizeof *out);
            snprintf(out->kind, sizeof out->kind, "%s", text);
            return KILN_OK;
        }
    }
    return kiln_error(KILN_ERR_UNSUPPORTED, "KV cache kind '%s' is not supported (supported: f32)",
                      text);
}

kiln_status kiln_kv_cpu_new(const kiln_kv_layer_desc *layers, int n_layers,
                            const kiln_kv_options *opts, int max_tokens, kiln_kv **out) {
    if (!opts || !opts->kind[0] || strcmp(opts->kind, "f32") == 0)
        return kiln_kv_contiguous_new(layers, n_layers, max_tokens, out);
    return kiln_error(KILN_ERR_UNSUPPORTED, "KV cache kind '%s' is not supported", opts->kind);
}

int64_t kiln_kv_bytes_per_token(const kiln_kv_layer_desc *layers, int n_layers,
                                const kiln_kv_options *opts) {
    (void)opts;
    int64_t b = 0;
    for (int i = 0; i < n_layers; i++)
        if (layers[i].is_attention)
            b += (int64_t)layers[i].n_kv_heads * (layers[i].head_dim + layers[i].v_head_dim) * 4;
    return b;
}
