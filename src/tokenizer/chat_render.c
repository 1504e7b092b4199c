/* chat_render.c — kiln_chat_render: thin glue from a loaded tokenizer (its chat template and
 * bos/eos tokens from tokenizer_config.json / chat_template.jinja) to the template engine in
 * chat_template.c. */
#include "tokenizer/chat_template.h"
#include "tokenizer/tok_internal.h"

#include "util/status.h"

bool kiln_tokenizer_has_chat_template(const kiln_tokenizer *tok) {
    return tok && tok->chat_template && tok->chat_template[0];
}

kiln_status kiln_chat_render(const kiln_tokenizer *tok, const char *messages_json,
                             const char *tools_json, bool add_generation_prompt,
                             const char *kwargs_json, char **out) {
    if (!tok || !messages_json || !out)
        return kiln_error(KILN_ERR_INVALID_ARG, "kiln_chat_render: NULL argument");
    *out = NULL;
    if (!kiln_tokenizer_has_chat_template(tok))
        return kiln_error(KILN_ERR_NOT_FOUND,
                          "kiln_chat_render: the model has no chat template (tokenizer_config.json "
                          "chat_template or chat_template.jinja)");
    return kiln_chat_template_render(tok->chat_template, messages_json, tools_json,
                                     add_generation_prompt, tok->bos_token, tok->eos_token,
                                     kwargs_json, out);
}
