/* chat_template.c — kiln_chat_template_render: sets up the variables transformers passes to a chat
 * template (messages, tools, documents, add_generation_prompt, bos/eos tokens, extra kwargs) and
 * runs the Jinja interpreter, turning its errors into kiln_status. */
#include "tokenizer/chat_template.h"

#include "tokenizer/jinja.h"
#include "util/status.h"

#include <stdlib.h>
#include <string.h>

/* Everything that can longjmp lives here, so the caller's locals stay untouched. */
static bool render_guarded(jinja_ctx *c, const char *template_src, const char *messages_json,
                           const char *tools_json, bool add_generation_prompt,
                           const char *bos_token, const char *eos_token, const char *kwargs_json,
                           char **out, kiln_status *st) {
    jmp_buf jb;
    c->fail = &jb;
    if (setjmp(jb) != 0) {
        *st = strstr(c->err, "memory limit") || strstr(c->err, "out of memory") ? KILN_ERR_OOM
                                                                                : KILN_ERR_FORMAT;
        return false;
    }
    c->globals = jv_dict(c, JD_PLAIN).u.dict;
    jinja_install_globals(c);
    jv messages = jv_from_json(c, messages_json, "messages");
    if (messages.kind != JV_LIST) jinja_fail(c, 0, "messages must be a JSON array");
    jv tools = jv_from_json(c, tools_json, "tools");
    if (tools.kind != JV_LIST && tools.kind != JV_NONE)
        jinja_fail(c, 0, "tools must be a JSON array or null");
    jdict *g = c->globals;
    jdict_set_s(c, g, "messages", messages);
    jdict_set_s(c, g, "tools", tools);
    jdict_set_s(c, g, "documents", jv_none());
    jdict_set_s(c, g, "add_generation_prompt", jv_bool(add_generation_prompt));
    if (bos_token) jdict_set_s(c, g, "bos_token", jv_cstr(c, bos_token));
    if (eos_token) jdict_set_s(c, g, "eos_token", jv_cstr(c, eos_token));
    if (kwargs_json) {
        jv kw = jv_from_json(c, kwargs_json, "kwargs");
        if (kw.kind != JV_DICT) jinja_fail(c, 0, "kwargs must be a JSON object");
        for (size_t i = 0; i < kw.u.dict->n; i++)
            jdict_set(c, g, kw.u.dict->keys[i], kw.u.dict->vals[i]);
    }
    size_t n;
    const char *text = jinja_run(c, template_src, &n);
    *out = malloc(n + 1);
    if (!*out) jinja_fail(c, 0, "out of memory");
    memcpy(*out, text, n);
    (*out)[n] = 0;
    return true;
}

kiln_status kiln_chat_template_render(const char *template_src, const char *messages_json,
                                      const char *tools_json, bool add_generation_prompt,
                                      const char *bos_token, const char *eos_token,
                                      const char *kwargs_json, char **out) {
    if (!out) return kiln_error(KILN_ERR_INVALID_ARG, "chat template: out is NULL");
    *out = NULL;
    if (!template_src) return kiln_error(KILN_ERR_INVALID_ARG, "chat template: no template");
    if (!messages_json) return kiln_error(KILN_ERR_INVALID_ARG, "chat template: no messages");
    jinja_ctx *c = calloc(1, sizeof *c);
    if (!c) return kiln_error(KILN_ERR_OOM, "chat template: out of memory");
    c->fixed_date = getenv("KILN_CHAT_DATE");
    kiln_status st = KILN_OK;
    bool ok = render_guarded(c, template_src, messages_json, tools_json, add_generation_prompt,
                             bos_token, eos_token, kwargs_json, out, &st);
    if (!ok) {
        free(*out);
        *out = NULL;
        kiln_error(st, "%s", c->err);
    }
    jinja_arena_free(c);
    free(c);
    return ok ? KILN_OK : st;
}
