/* kv_factory.h — creating a CPU KV cache of the kind named by kiln_kv_options. */
#ifndef KILN_KV_FACTORY_H
#define KILN_KV_FACTORY_H

#include "kv/kv_cache.h"

kiln_status kiln_kv_cpu_new(const kiln_kv_layer_desc *layers, int n_layers,
                            const kiln_kv_options *opts, int max_tokens, kiln_kv **out);
/* Bytes per token of every attention layer for a cache kind (for `info`). */
int64_t kiln_kv_bytes_per_token(const kiln_kv_layer_desc *layers, int n_layers,
                                const kiln_kv_options *opts);

#endif
