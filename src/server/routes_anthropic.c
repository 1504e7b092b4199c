/* routes_anthropic.c — POST /v1/messages, the Anthropic Messages API: system, content blocks,
 * tool_use / tool_result, stop_sequences, thinking blocks, usage with cache_read_input_tokens and
 * the streaming event grammar (message_start, content_block_start/delta/stop, message_delta,
 * message_stop). Requests are mapped onto the chat template's OpenAI-style messages. */
#include "server/gen.h"
#include "server/sse.h"
#include "server/toolcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { BLK_NONE = 0, BLK_TEXT, BLK_THINKING } blk_kind;

typedef struct an_stream {
    srv *s;
    gen g;
    char id[64];
    bool started, finished;
    blk_kind open;
    int index; /* index of the open (or next) block */
} an_stream;

static bool block_text(const cJSON *content, strbuf *out, char *err, size_t errsz,
                       const char *where) {
    if (cJSON_IsString(content)) {
        sb_puts(out, content->valuestring);
        return true;
    }
    if (!cJSON_IsArray(content)) {
        snprintf(err, errsz, "%s must be a string or an array of content blocks", where);
        return false;
    }
    const cJSON *b;
    cJSON_ArrayForEach(b, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(b, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(b, "text");
        if (!cJSON_IsObject(b) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text)) {
            snprintf(err, errsz, "%s: only text blocks are supported here", where);
            return false;
        }
        sb_puts(out, text->valuestring);
    }
    return true;
}

/* Anthropic messages (+ system) -> OpenAI-style messages for the chat template. */
static cJSON *convert_messages(const cJSON *body, char *err, size_t errsz) {
    cJSON *out = cJSON_CreateArray();
    const cJSON *system = cJSON_GetObjectItemCaseSensitive(body, "system");
    if (system && !cJSON_IsNull(system)) {
        strbuf t = {0};
        if (!block_text(system, &t, err, errsz, "system")) {
            sb_free(&t);
            goto fail;
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", t.data ? t.data : "");
        sb_free(&t);
        cJSON_AddItemToArray(out, m);
    }
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
        snprintf(err, errsz,
                 msgs ? "messages: must be a non-empty array" : "messages: Field required");
        goto fail;
    }
    int idx = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role) ||
            (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant"))) {
            snprintf(err, errsz, "messages.%d.role: must be 'user' or 'assistant'", idx);
            goto fail;
        }
        bool assistant = strcmp(role->valuestring, "assistant") == 0;
        if (cJSON_IsString(content)) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "role", role->valuestring);
            cJSON_AddStringToObject(o, "content", content->valuestring);
            cJSON_AddItemToArray(out, o);
            idx++;
            continue;
        }
        if (!cJSON_IsArray(content)) {
            snprintf(err, errsz, "messages.%d.content: must be a string or an array of blocks",
                     idx);
            goto fail;
        }
        strbuf text = {0};
        cJSON *calls = NULL;
        const cJSON *b;
        cJSON_ArrayForEach(b, content) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(b, "type");
            if (!cJSON_IsObject(b) || !cJSON_IsString(type)) {
                snprintf(err, errsz, "messages.%d.content: each block needs a string 'type'", idx);
                goto fail_block;
            }
            const char *ty = type->valuestring;
            if (strcmp(ty, "text") == 0) {
                const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "text");
                if (!cJSON_IsString(t)) {
                    snprintf(err, errsz, "messages.%d.content: text block needs a string 'text'",
                             idx);
                    goto fail_block;
                }
                sb_puts(&text, t->valuestring);
            } else if (strcmp(ty, "tool_use") == 0 && assistant) {
                const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "id");
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(b, "name");
                const cJSON *input = cJSON_GetObjectItemCaseSensitive(b, "input");
                if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsObject(input)) {
                    snprintf(err, errsz,
                             "messages.%d.content: tool_use needs id, name and object input", idx);
                    goto fail_block;
                }
                if (!calls) calls = cJSON_CreateArray();
                cJSON *c = cJSON_CreateObject();
                cJSON_AddStringToObject(c, "id", id->valuestring);
                cJSON_AddStringToObject(c, "type", "function");
                cJSON *f = cJSON_AddObjectToObject(c, "function");
                cJSON_AddStringToObject(f, "name", name->valuestring);
                char *args = cJSON_PrintUnformatted(input);
                cJSON_AddStringToObject(f, "arguments", args ? args : "{}");
                free(args);
                cJSON_AddItemToArray(calls, c);
            } else if (strcmp(ty, "tool_result") == 0 && !assistant) {
                const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "tool_use_id");
                const cJSON *rc = cJSON_GetObjectItemCaseSensitive(b, "content");
                if (!cJSON_IsString(id)) {
                    snprintf(err, errsz,
                             "messages.%d.content: tool_result needs a string tool_use_id", idx);
                    goto fail_block;
                }
                strbuf rt = {0};
                if (rc && !cJSON_IsNull(rc) &&
                    !block_text(rc, &rt, err, errsz, "tool_result.content")) {
                    sb_free(&rt);
                    goto fail_block;
                }
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "role", "tool");
                cJSON_AddStringToObject(o, "tool_call_id", id->valuestring);
                cJSON_AddStringToObject(o, "content", rt.data ? rt.data : "");
                sb_free(&rt);
                cJSON_AddItemToArray(out, o);
            } else if (strcmp(ty, "thinking") == 0 || strcmp(ty, "redacted_thinking") == 0) {
                /* earlier reasoning is not replayed into the prompt */
            } else {
                snprintf(err, errsz, "messages.%d.content: block type '%s' is not supported", idx,
                         ty);
                goto fail_block;
            }
        }
        if (text.len || calls || !cJSON_GetArraySize(content)) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "role", role->valuestring);
            cJSON_AddStringToObject(o, "content", text.data ? text.data : "");
            if (calls) cJSON_AddItemToObject(o, "tool_calls", calls);
            cJSON_AddItemToArray(out, o);
        }
        sb_free(&text);
        idx++;
        continue;
    fail_block:
        sb_free(&text);
        cJSON_Delete(calls);
        goto fail;
    }
    return out;
fail:
    cJSON_Delete(out);
    return NULL;
}

static cJSON *convert_tools(const cJSON *tools, char *err, size_t errsz, bool *bad) {
    *bad = false;
    if (!tools || cJSON_IsNull(tools)) return NULL;
    if (!cJSON_IsArray(tools)) {
        snprintf(err, errsz, "tools: must be an array");
        *bad = true;
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        if (!cJSON_IsObject(t) || !cJSON_IsString(name)) {
            snprintf(err, errsz, "tools: each tool needs a string 'name'");
            *bad = true;
            cJSON_Delete(out);
            return NULL;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(o, "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(t, "description");
        if (cJSON_IsString(d)) cJSON_AddStringToObject(f, "description", d->valuestring);
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
        cJSON_AddItemToObject(f, "parameters",
                              cJSON_IsObject(schema) ? cJSON_Duplicate(schema, true)
                                                     : cJSON_CreateObject());
        cJSON_AddItemToArray(out, o);
    }
    if (cJSON_GetArraySize(out) == 0) {
        cJSON_Delete(out);
        return NULL;
    }
    return out;
}

static const char *stop_reason(const gen_choice *c) {
    if (c->tool_calls) return "tool_use";
    if (c->ts.matched_stop >= 0) return "stop_sequence";
    if (c->finish && strcmp(c->finish, "length") == 0) return "max_tokens";
    return "end_turn";
}

static void add_stop_sequence(cJSON *o, const gen_choice *c) {
    if (c->ts.matched_stop >= 0)
        cJSON_AddStringToObject(o, "stop_sequence", c->ts.stops[c->ts.matched_stop]);
    else
        cJSON_AddNullToObject(o, "stop_sequence");
}

static cJSON *usage_json(const gen *g, bool final) {
    cJSON *u = cJSON_CreateObject();
    const gen_choice *c = &g->ch[0];
    int cached = final ? c->n_cached : 0;
    cJSON_AddNumberToObject(u, "input_tokens", g->n_prompt - cached);
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", cached);
    cJSON_AddNumberToObject(u, "output_tokens", final ? c->n_completion : 0);
    return u;
}

static cJSON *tool_use_block(const cJSON *call) {
    cJSON *b = cJSON_CreateObject();
    char id[48];
    toolcall_new_id(id, sizeof id, "toolu_");
    cJSON_AddStringToObject(b, "type", "tool_use");
    cJSON_AddStringToObject(b, "id", id);
    cJSON_AddStringToObject(b, "name", cJSON_GetObjectItemCaseSensitive(call, "name")->valuestring);
    cJSON *input = cJSON_Parse(cJSON_GetObjectItemCaseSensitive(call, "arguments")->valuestring);
    if (!cJSON_IsObject(input)) {
        cJSON_Delete(input);
        input = cJSON_CreateObject();
    }
    cJSON_AddItemToObject(b, "input", input);
    return b;
}

static cJSON *message_json(an_stream *as, bool final) {
    gen *g = &as->g;
    const gen_choice *c = &g->ch[0];
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", as->id);
    cJSON_AddStringToObject(j, "type", "message");
    cJSON_AddStringToObject(j, "role", "assistant");
    cJSON_AddStringToObject(j, "model", as->s->cfg.model_id);
    cJSON *content = cJSON_AddArrayToObject(j, "content");
    if (final) {
        if (c->reasoning.len) {
            cJSON *b = cJSON_CreateObject();
            cJSON_AddStringToObject(b, "type", "thinking");
            cJSON_AddStringToObject(b, "thinking", c->reasoning.data);
            cJSON_AddStringToObject(b, "signature", "");
            cJSON_AddItemToArray(content, b);
        }
        if (c->content.len || !c->tool_calls) {
            cJSON *b = cJSON_CreateObject();
            cJSON_AddStringToObject(b, "type", "text");
            cJSON_AddStringToObject(b, "text", c->content.data ? c->content.data : "");
            cJSON_AddItemToArray(content, b);
        }
        const cJSON *call;
        if (c->tool_calls)
            cJSON_ArrayForEach(call, c->tool_calls)
                cJSON_AddItemToArray(content, tool_use_block(call));
        cJSON_AddStringToObject(j, "stop_reason", stop_reason(c));
        add_stop_sequence(j, c);
    } else {
        cJSON_AddNullToObject(j, "stop_reason");
        cJSON_AddNullToObject(j, "stop_sequence");
    }
    cJSON_AddItemToObject(j, "usage", usage_json(g, final));
    return j;
}

/* ---- streaming ---------------------------------------------------------------------------- */

static void ev(strbuf *out, const char *type, cJSON *j) {
    cJSON_AddStringToObject(j, "type", type);
    sse_json(out, type, j);
}

static void close_block(an_stream *as, strbuf *out) {
    if (as->open == BLK_NONE) return;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "index", as->index);
    ev(out, "content_block_stop", j);
    as->open = BLK_NONE;
    as->index++;
}

static void open_block(an_stream *as, strbuf *out, blk_kind kind) {
    if (as->open == kind) return;
    close_block(as, out);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "index", as->index);
    cJSON *b = cJSON_AddObjectToObject(j, "content_block");
    if (kind == BLK_TEXT) {
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", "");
    } else {
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", "");
    }
    ev(out, "content_block_start", j);
    as->open = kind;
}

static void delta(an_stream *as, strbuf *out, blk_kind kind, const char *text) {
    open_block(as, out, kind);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "index", as->index);
    cJSON *d = cJSON_AddObjectToObject(j, "delta");
    cJSON_AddStringToObject(d, "type", kind == BLK_TEXT ? "text_delta" : "thinking_delta");
    cJSON_AddStringToObject(d, kind == BLK_TEXT ? "text" : "thinking", text);
    ev(out, "content_block_delta", j);
}

static void an_produce(void *ctx, strbuf *out, bool *done) {
    an_stream *as = ctx;
    gen *g = &as->g;
    gen_choice *c = &g->ch[0];
    if (!as->started) {
        as->started = true;
        cJSON *j = cJSON_CreateObject();
        cJSON_AddItemToObject(j, "message", message_json(as, false));
        ev(out, "message_start", j);
        ev(out, "ping", cJSON_CreateObject());
        return;
    }
    bool all = gen_poll(g, 50);
    if (c->error[0]) {
        cJSON *j = cJSON_CreateObject();
        cJSON *e = cJSON_AddObjectToObject(j, "error");
        cJSON_AddStringToObject(e, "type", "api_error");
        cJSON_AddStringToObject(e, "message", c->error);
        ev(out, "error", j);
        *done = true;
        return;
    }
    if (c->reasoning.len > c->reasoning_sent) {
        delta(as, out, BLK_THINKING, c->reasoning.data + c->reasoning_sent);
        c->reasoning_sent = c->reasoning.len;
    }
    if (c->content.len > c->content_sent) {
        delta(as, out, BLK_TEXT, c->content.data + c->content_sent);
        c->content_sent = c->content.len;
    }
    if (!all) return;
    if (as->index == 0 && as->open == BLK_NONE && !c->tool_calls) open_block(as, out, BLK_TEXT);
    close_block(as, out);
    const cJSON *call;
    if (c->tool_calls) cJSON_ArrayForEach(call, c->tool_calls) {
            cJSON *b = tool_use_block(call);
            char *input = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(b, "input"));
            cJSON_ReplaceItemInObject(b, "input", cJSON_CreateObject());
            cJSON *j = cJSON_CreateObject();
            cJSON_AddNumberToObject(j, "index", as->index);
            cJSON_AddItemToObject(j, "content_block", b);
            ev(out, "content_block_start", j);
            j = cJSON_CreateObject();
            cJSON_AddNumberToObject(j, "index", as->index);
            cJSON *d = cJSON_AddObjectToObject(j, "delta");
            cJSON_AddStringToObject(d, "type", "input_json_delta");
            cJSON_AddStringToObject(d, "partial_json", input ? input : "{}");
            free(input);
            ev(out, "content_block_delta", j);
            j = cJSON_CreateObject();
            cJSON_AddNumberToObject(j, "index", as->index++);
            ev(out, "content_block_stop", j);
        }
    cJSON *j = cJSON_CreateObject();
    cJSON *d = cJSON_AddObjectToObject(j, "delta");
    cJSON_AddStringToObject(d, "stop_reason", stop_reason(c));
    add_stop_sequence(d, c);
    cJSON_AddItemToObject(j, "usage", usage_json(g, true));
    ev(out, "message_delta", j);
    ev(out, "message_stop", cJSON_CreateObject());
    *done = true;
}

static void an_cleanup(void *ctx) {
    an_stream *as = ctx;
    gen_free(&as->g);
    free(as);
}

enum MHD_Result route_messages(srv *s, http_req *r) {
    cJSON *body = cJSON_ParseWithLength(r->body, r->body_len);
    if (!body) return http_error(r, API_ANTHROPIC, 400, NULL, "the request body is not valid JSON");
    if (!cJSON_IsObject(body)) {
        cJSON_Delete(body);
        return http_error(r, API_ANTHROPIC, 400, NULL, "the request body must be a JSON object");
    }
    char err[512] = "";
    gen_opts o;
    cJSON *msgs = NULL, *tools = NULL;
    if (!gen_parse_opts(s, body, API_ANTHROPIC, &o, err, sizeof err)) goto bad;
    if (!(msgs = convert_messages(body, err, sizeof err))) goto bad;
    bool bad_tools = false;
    tools =
        convert_tools(cJSON_GetObjectItemCaseSensitive(body, "tools"), err, sizeof err, &bad_tools);
    if (bad_tools) goto bad;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
    if (tc && !cJSON_IsNull(tc)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
        if (!cJSON_IsObject(tc) || !cJSON_IsString(ty)) {
            snprintf(err, sizeof err, "tool_choice: must be an object with a 'type'");
            goto bad;
        }
        if (strcmp(ty->valuestring, "none") == 0) cJSON_Delete(tools), tools = NULL;
    }
    cJSON *kwargs = NULL;
    const cJSON *thinking = cJSON_GetObjectItemCaseSensitive(body, "thinking");
    const cJSON *tt =
        cJSON_IsObject(thinking) ? cJSON_GetObjectItemCaseSensitive(thinking, "type") : NULL;
    if (cJSON_IsString(tt) && strcmp(tt->valuestring, "disabled") == 0) {
        kwargs = cJSON_CreateObject();
        cJSON_AddFalseToObject(kwargs, "enable_thinking");
    }
    int32_t *ids = NULL;
    int n = 0;
    bool start_in_think = false;
    kiln_status st = chat_prompt(s, msgs, tools, kwargs, &ids, &n, &start_in_think);
    cJSON_Delete(kwargs);
    cJSON_Delete(msgs);
    bool has_tools = tools != NULL;
    cJSON_Delete(tools);
    if (st != KILN_OK) {
        cJSON_Delete(body);
        return http_error_status(r, API_ANTHROPIC, st, "prompt");
    }
    an_stream *as = calloc(1, sizeof *as);
    if (!as) {
        free(ids);
        cJSON_Delete(body);
        return http_error(r, API_ANTHROPIC, 500, NULL, "out of memory");
    }
    as->s = s;
    toolcall_new_id(as->id, sizeof as->id, "msg_");
    st = gen_start(&as->g, s, &o, ids, n, s->has_think, start_in_think, has_tools);
    cJSON_Delete(body);
    enum MHD_Result ret;
    if (st != KILN_OK) {
        ret = http_error_status(r, API_ANTHROPIC, st, "request");
        an_cleanup(as);
        return ret;
    }
    if (o.stream) return http_stream(r, "text/event-stream", an_produce, an_cleanup, as);
    if (!gen_run(&as->g, r->fd)) {
        an_cleanup(as);
        return MHD_NO;
    }
    if (as->g.ch[0].error[0])
        ret = http_error(r, API_ANTHROPIC, 500, NULL, "%s", as->g.ch[0].error);
    else
        ret = http_send_json(r, 200, message_json(as, true));
    an_cleanup(as);
    return ret;
bad:
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    cJSON_Delete(body);
    return http_error(r, API_ANTHROPIC, 400, NULL, "%s", err);
}
