/* families.c — the registry of model families; the first whose matches() accepts the config
 * runs the model. New families add one line here. */
#include "model/model.h"

#include <stddef.h>

extern const kiln_family kiln_family_llama;
extern const kiln_family kiln_family_qwen3_next; /* also qwen3_5_text, qwen3_moe */
extern const kiln_family kiln_family_gemma;      /* gemma3_text, gemma4_text */

static const kiln_family *const families[] = {
    &kiln_family_llama,
    &kiln_family_qwen3_next,
    &kiln_family_gemma,
};

const kiln_family *kiln_family_find(const kiln_config *cfg) {
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (families[i]->matches(cfg)) return families[i];
    return NULL;
}

const char *kiln_family_supported_types(void) {
    return "llama, mistral, qwen2, qwen3, qwen3_moe, qwen3_next, qwen3_5_text, gemma3_text, "
           "gemma4_text";
}
