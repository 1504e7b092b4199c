/* routes_openai.c — the OpenAI-compatible endpoints: POST /v1/chat/completions (chat template,
 * tools, reasoning_content, logprobs, n, SSE chunks with an optional usage chunk),
 * POST /v1/completions (raw text or token-id prompt) and GET /v1/models. */
#include "server/gen.h"
#include "server/sse.h"
#include "server/toolcall.h"

#include "util/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { KIND_CHAT, KIND_TEXT } oa_kind;

typedef struct oa_stream {
    srv *s;
    gen g;
    oa_kind kind;
    char id[64];
    long created;
    bool started, finished_sent[GEN_MAX_N], usage_done;
    int ids_sent[GEN_MAX_N];
    bool return_ids;
} oa_stream;

static void new_id(char *buf, size_t n, const char *prefix) {
    toolcall_new_id(buf, n, prefix);
}

static cJSON *usage_json(const gen *g) {
    int completion = 0, cached = 0;
    for (int i = 0; i < g->n; i++) {
        completion += g->ch[i].n_completion;
        if (i == 0) cached = g->ch[i].n_cached;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", g->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", g->n_prompt + completion);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", cached);
    return u;
}

static cJSON *top_list_chat(srv *s, const kiln_sched_token *t) {
    cJSON *arr = cJSON_CreateArray();
    for (int k = 0; k < t->n_top; k++) {
        cJSON *o = cJSON_CreateObject();
        char *txt = gen_token_text(s, t->top_ids[k]);
        cJSON_AddStringToObject(o, "token", txt);
        cJSON_AddNumberToObject(o, "logprob", t->top_logprobs[k]);
        cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
        for (const unsigned char *p = (const unsigned char *)txt; *p; p++)
            cJSON_AddItemToArray(bytes, cJSON_CreateNumber(*p));
        free(txt);
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

/* Chat logprobs {"content": [...]} for tokens [from, to). */
static cJSON *chat_logprobs(srv *s, const gen_choice *c, int from, int to) {
    cJSON *lp = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(lp, "content");
    for (int i = from; i < to; i++) {
        const kiln_sched_token *t = &c->toks[i];
        cJSON *o = cJSON_CreateObject();
        char *txt = gen_token_text(s, t->id);
        cJSON_AddStringToObject(o, "token", txt);
        cJSON_AddNumberToObject(o, "logprob", t->logprob);
        cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
        for (const unsigned char *p = (const unsigned char *)txt; *p; p++)
            cJSON_AddItemToArray(bytes, cJSON_CreateNumber(*p));
        free(txt);
        cJSON_AddItemToObject(o, "top_logprobs", top_list_chat(s, t));
        cJSON_AddItemToArray(content, o);
    }
    return lp;
}

/* Legacy completions logprobs {tokens, token_logprobs, top_logprobs, text_offset}. */
static cJSON *text_logprobs(srv *s, const gen_choice *c, int from, int to) {
    cJSON *lp = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(lp, "tokens");
    cJSON *tlp = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *top = cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON *off = cJSON_AddArrayToObject(lp, "text_offset");
    size_t pos = 0;
    for (int i = from; i < to; i++) {
        const kiln_sched_token *t = &c->toks[i];
        char *txt = gen_token_text(s, t->id);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(txt));
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(t->logprob));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)pos));
        pos += strlen(txt);
        free(txt);
        cJSON *m = cJSON_CreateObject();
        for (int k = 0; k < t->n_top; k++) {
            char *alt = gen_token_text(s, t->top_ids[k]);
            if (!cJSON_GetObjectItemCaseSensitive(m, alt))
                cJSON_AddNumberToObject(m, alt, t->top_logprobs[k]);
            free(alt);
        }
        cJSON_AddItemToArray(top, m);
    }
    return lp;
}

static cJSON *tool_calls_json(const cJSON *calls, bool with_index) {
    cJSON *arr = cJSON_CreateArray();
    int i = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        cJSON *o = cJSON_CreateObject();
        if (with_index) cJSON_AddNumberToObject(o, "index", i);
        char id[48];
        new_id(id, sizeof id, "call_");
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(o, "function");
        cJSON_AddStringToObject(f, "name",
                                cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring);
        cJSON_AddStringToObject(f, "arguments",
                                cJSON_GetObjectItemCaseSensitive(c, "arguments")->valuestring);
        cJSON_AddItemToArray(arr, o);
        i++;
    }
    return arr;
}

static cJSON *ids_json(const gen_choice *c) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < c->n_toks; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(c->toks[i].id));
    return a;
}

/* ---- prompt building ---------------------------------------------------------------------- */

/* Flattens OpenAI content (string | [{type:text,text}] | null) into a string. */
static bool content_text(const cJSON *content, strbuf *out, char *err, size_t errsz, int idx) {
    if (!content || cJSON_IsNull(content)) return true;
    if (cJSON_IsString(content)) {
        sb_puts(out, content->valuestring);
        return true;
    }
    if (!cJSON_IsArray(content)) {
        snprintf(err, errsz, "messages[%d].content must be a string or an array of content parts",
                 idx);
        return false;
    }
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type)) {
            snprintf(err, errsz, "messages[%d].content parts must be objects with a 'type'", idx);
            return false;
        }
        if (strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text)) {
            snprintf(err, errsz,
                     "messages[%d].content: part type '%s' is not supported (text only)", idx,
                     type->valuestring);
            return false;
        }
        sb_puts(out, text->valuestring);
    }
    return true;
}

/* Validates OpenAI messages and returns the normalized array the chat template gets. */
static cJSON *normalize_messages(const cJSON *msgs, char *err, size_t errsz) {
    if (!msgs) {
        snprintf(err, errsz, "'messages' is required");
        return NULL;
    }
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
        snprintf(err, errsz, "'messages' must be a non-empty array");
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    int idx = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            snprintf(err, errsz, "messages[%d] must be an object with a string 'role'", idx);
            goto fail;
        }
        const char *r = role->valuestring;
        if (strcmp(r, "developer") == 0) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") &&
            strcmp(r, "tool")) {
            snprintf(
                err, errsz,
                "messages[%d].role '%s' is not one of system, developer, user, assistant, tool",
                idx, role->valuestring);
            goto fail;
        }
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if ((!content || cJSON_IsNull(content)) && !(strcmp(r, "assistant") == 0)) {
            snprintf(err, errsz, "messages[%d].content is required", idx);
            goto fail;
        }
        strbuf text = {0};
        if (!content_text(content, &text, err, errsz, idx)) {
            sb_free(&text);
            goto fail;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "role", r);
        cJSON_AddStringToObject(o, "content", text.data ? text.data : "");
        sb_free(&text);
        if (calls && !cJSON_IsNull(calls)) {
            if (!cJSON_IsArray(calls)) {
                cJSON_Delete(o);
                snprintf(err, errsz, "messages[%d].tool_calls must be an array", idx);
                goto fail;
            }
            cJSON_AddItemToObject(o, "tool_calls", cJSON_Duplicate(calls, true));
        }
        const cJSON *tcid = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
        if (cJSON_IsString(tcid)) cJSON_AddStringToObject(o, "tool_call_id", tcid->valuestring);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name");
        if (cJSON_IsString(name)) cJSON_AddStringToObject(o, "name", name->valuestring);
        cJSON_AddItemToArray(out, o);
        idx++;
    }
    return out;
fail:
    cJSON_Delete(out);
    return NULL;
}

kiln_status chat_prompt(srv *s, const cJSON *messages, const cJSON *tools, const cJSON *kwargs,
                        int32_t **ids, int *n, bool *start_in_think) {
    if (!s->tok)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "this model has no tokenizer; use /v1/completions with token ids");
    if (!kiln_tokenizer_has_chat_template(s->tok))
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "this model has no chat template; use /v1/completions");
    char *mj = cJSON_PrintUnformatted(messages);
    char *tj = tools ? cJSON_PrintUnformatted(tools) : NULL;
    char *kj = kwargs ? cJSON_PrintUnformatted(kwargs) : NULL;
    char *text = NULL;
    kiln_status st = kiln_chat_render(s->tok, mj, tj, true, kj, &text);
    free(mj), free(tj), free(kj);
    if (st != KILN_OK) return kiln_error_wrap(st, "chat template");
    size_t len = strlen(text);
    *start_in_think = s->has_think && len >= 7 &&
                      (strcmp(text + len - 7, "<think>") == 0 ||
                       (len >= 8 && strcmp(text + len - 8, "<think>\n") == 0));
    st = kiln_tokenize(s->tok, text, len, false, ids, n);
    free(text);
    return st;
}

/* ---- responses ---------------------------------------------------------------------------- */

static cJSON *final_response(oa_stream *os) {
    gen *g = &os->g;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", os->id);
    cJSON_AddStringToObject(j, "object",
                            os->kind == KIND_CHAT ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)os->created);
    cJSON_AddStringToObject(j, "model", os->s->cfg.model_id);
    cJSON *choices = cJSON_AddArrayToObject(j, "choices");
    for (int i = 0; i < g->n; i++) {
        gen_choice *c = &g->ch[i];
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", i);
        if (os->kind == KIND_CHAT) {
            cJSON *m = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            if (c->tool_calls && c->content.len == 0)
                cJSON_AddNullToObject(m, "content");
            else
                cJSON_AddStringToObject(m, "content", c->content.data ? c->content.data : "");
            if (c->reasoning.len)
                cJSON_AddStringToObject(m, "reasoning_content", c->reasoning.data);
            if (c->tool_calls)
                cJSON_AddItemToObject(m, "tool_calls", tool_calls_json(c->tool_calls, false));
            if (g->o.top_logprobs >= 0)
                cJSON_AddItemToObject(ch, "logprobs", chat_logprobs(os->s, c, 0, c->n_toks));
            else
                cJSON_AddNullToObject(ch, "logprobs");
        } else {
            cJSON_AddStringToObject(ch, "text", c->content.data ? c->content.data : "");
            if (g->o.top_logprobs >= 0)
                cJSON_AddItemToObject(ch, "logprobs", text_logprobs(os->s, c, 0, c->n_toks));
            else
                cJSON_AddNullToObject(ch, "logprobs");
            if (os->return_ids) cJSON_AddItemToObject(ch, "token_ids", ids_json(c));
        }
        cJSON_AddStringToObject(ch, "finish_reason", c->finish ? c->finish : "stop");
        cJSON_AddItemToArray(choices, ch);
    }
    cJSON_AddItemToObject(j, "usage", usage_json(g));
    if (os->return_ids) {
        cJSON *p = cJSON_CreateArray();
        for (int i = 0; i < g->n_prompt; i++)
            cJSON_AddItemToArray(p, cJSON_CreateNumber(g->prompt[i]));
        cJSON_AddItemToObject(j, "prompt_token_ids", p);
    }
    return j;
}

static cJSON *chunk_base(oa_stream *os) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", os->id);
    cJSON_AddStringToObject(j, "object",
                            os->kind == KIND_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)os->created);
    cJSON_AddStringToObject(j, "model", os->s->cfg.model_id);
    return j;
}

/* One chunk for choice i: delta (chat) or text (completions). */
static void emit_choice_chunk(oa_stream *os, strbuf *out, int i, cJSON *delta_or_text,
                              const char *finish, cJSON *logprobs, cJSON *token_ids) {
    cJSON *j = chunk_base(os);
    cJSON *choices = cJSON_AddArrayToObject(j, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", i);
    if (os->kind == KIND_CHAT)
        cJSON_AddItemToObject(ch, "delta", delta_or_text);
    else
        cJSON_AddItemToObject(ch, "text", delta_or_text);
    if (logprobs)
        cJSON_AddItemToObject(ch, "logprobs", logprobs);
    else
        cJSON_AddNullToObject(ch, "logprobs");
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    if (token_ids) cJSON_AddItemToObject(ch, "token_ids", token_ids);
    cJSON_AddItemToArray(choices, ch);
    if (os->g.o.include_usage) cJSON_AddNullToObject(j, "usage");
    sse_json(out, NULL, j);
}

static void oa_produce(void *ctx, strbuf *out, bool *done) {
    oa_stream *os = ctx;
    gen *g = &os->g;
    if (!os->started) {
        os->started = true;
        if (os->kind == KIND_CHAT)
            for (int i = 0; i < g->n; i++) {
                cJSON *d = cJSON_CreateObject();
                cJSON_AddStringToObject(d, "role", "assistant");
                cJSON_AddStringToObject(d, "content", "");
                emit_choice_chunk(os, out, i, d, NULL, NULL, NULL);
            }
        return;
    }
    bool all = gen_poll(g, 50);
    for (int i = 0; i < g->n; i++) {
        gen_choice *c = &g->ch[i];
        if (os->finished_sent[i]) continue;
        if (c->error[0]) {
            sse_error(out, "server_error", c->error);
            os->finished_sent[i] = true;
            continue;
        }
        cJSON *lp = NULL;
        if (g->o.top_logprobs >= 0 && c->toks_reported < c->n_toks) {
            lp = os->kind == KIND_CHAT ? chat_logprobs(os->s, c, c->toks_reported, c->n_toks)
                                       : text_logprobs(os->s, c, c->toks_reported, c->n_toks);
            c->toks_reported = c->n_toks;
        }
        if (c->reasoning.len > c->reasoning_sent) {
            cJSON *d = cJSON_CreateObject();
            cJSON_AddStringToObject(d, "reasoning_content", c->reasoning.data + c->reasoning_sent);
            c->reasoning_sent = c->reasoning.len;
            emit_choice_chunk(os, out, i, d, NULL, NULL, NULL);
        }
        cJSON *new_ids = NULL;
        if (os->return_ids && os->kind == KIND_TEXT && os->ids_sent[i] < c->n_toks) {
            new_ids = cJSON_CreateArray();
            for (int k = os->ids_sent[i]; k < c->n_toks; k++)
                cJSON_AddItemToArray(new_ids, cJSON_CreateNumber(c->toks[k].id));
            os->ids_sent[i] = c->n_toks;
        }
        if (c->content.len > c->content_sent || lp || new_ids) {
            const char *t = c->content.data ? c->content.data + c->content_sent : "";
            cJSON *d;
            if (os->kind == KIND_CHAT) {
                d = cJSON_CreateObject();
                cJSON_AddStringToObject(d, "content", t);
            } else {
                d = cJSON_CreateString(t);
            }
            c->content_sent = c->content.len;
            emit_choice_chunk(os, out, i, d, NULL, lp, new_ids);
        }
        if (c->done) {
            if (c->tool_calls && os->kind == KIND_CHAT) {
                cJSON *d = cJSON_CreateObject();
                cJSON_AddItemToObject(d, "tool_calls", tool_calls_json(c->tool_calls, true));
                emit_choice_chunk(os, out, i, d, NULL, NULL, NULL);
            }
            cJSON *d = os->kind == KIND_CHAT ? cJSON_CreateObject() : cJSON_CreateString("");
            emit_choice_chunk(os, out, i, d, c->finish, NULL, NULL);
            os->finished_sent[i] = true;
        }
    }
    if (all) {
        if (g->o.include_usage) {
            cJSON *j = chunk_base(os);
            cJSON_AddArrayToObject(j, "choices");
            cJSON_AddItemToObject(j, "usage", usage_json(g));
            sse_json(out, NULL, j);
        }
        sse_done(out);
        *done = true;
    }
}

static void oa_cleanup(void *ctx) {
    oa_stream *os = ctx;
    gen_free(&os->g);
    free(os);
}

/* Submits and answers (streaming or not). Takes ownership of prompt. */
static enum MHD_Result generate(srv *s, http_req *r, oa_kind kind, const gen_opts *o,
                                int32_t *prompt, int n_prompt, bool think, bool start_in_think,
                                bool tools, bool return_ids) {
    oa_stream *os = calloc(1, sizeof *os);
    if (!os) {
        free(prompt);
        return http_error(r, API_OPENAI, 500, NULL, "out of memory");
    }
    os->s = s;
    os->kind = kind;
    os->created = (long)time(NULL);
    os->return_ids = return_ids;
    new_id(os->id, sizeof os->id, kind == KIND_CHAT ? "chatcmpl-" : "cmpl-");
    kiln_status st = gen_start(&os->g, s, o, prompt, n_prompt, think, start_in_think, tools);
    if (st != KILN_OK) {
        enum MHD_Result ret = http_error_status(r, API_OPENAI, st, "request");
        oa_cleanup(os);
        return ret;
    }
    if (o->stream) return http_stream(r, "text/event-stream", oa_produce, oa_cleanup, os);
    if (!gen_run(&os->g, r->fd)) {
        oa_cleanup(os);
        return MHD_NO; /* client gone */
    }
    for (int i = 0; i < os->g.n; i++)
        if (os->g.ch[i].error[0]) {
            enum MHD_Result ret = http_error(r, API_OPENAI, 500, NULL, "%s", os->g.ch[i].error);
            oa_cleanup(os);
            return ret;
        }
    enum MHD_Result ret = http_send_json(r, 200, final_response(os));
    oa_cleanup(os);
    return ret;
}

static cJSON *parse_body(http_req *r, api_kind api, enum MHD_Result *ret) {
    cJSON *body = cJSON_ParseWithLength(r->body, r->body_len);
    if (!body) {
        *ret = http_error(r, api, 400, NULL, "the request body is not valid JSON");
        return NULL;
    }
    if (!cJSON_IsObject(body)) {
        cJSON_Delete(body);
        *ret = http_error(r, api, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return body;
}

enum MHD_Result route_chat_completions(srv *s, http_req *r) {
    enum MHD_Result ret;
    cJSON *body = parse_body(r, API_OPENAI, &ret);
    if (!body) return ret;
    char err[512] = "";
    gen_opts o;
    cJSON *msgs = NULL;
    int32_t *ids = NULL;
    int n = 0;
    if (!gen_parse_opts(s, body, API_OPENAI, &o, err, sizeof err)) goto bad;
    if (!(msgs = normalize_messages(cJSON_GetObjectItemCaseSensitive(body, "messages"), err,
                                    sizeof err)))
        goto bad;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
    if (tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools)) {
            snprintf(err, sizeof err, "'tools' must be an array");
            goto bad;
        }
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
            if (!cJSON_IsObject(t) || !cJSON_IsObject(f) ||
                !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(f, "name"))) {
                snprintf(err, sizeof err,
                         "each tool must be {\"type\":\"function\",\"function\":{\"name\":...}}");
                goto bad;
            }
        }
    } else {
        tools = NULL;
    }
    if (choice && !cJSON_IsNull(choice) && !cJSON_IsString(choice) && !cJSON_IsObject(choice)) {
        snprintf(err, sizeof err, "'tool_choice' must be a string or an object");
        goto bad;
    }
    if (cJSON_IsString(choice) && strcmp(choice->valuestring, "none") == 0) tools = NULL;
    if (tools && cJSON_GetArraySize(tools) == 0) tools = NULL;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(body, "chat_template_kwargs");
    if (kw && !cJSON_IsNull(kw) && !cJSON_IsObject(kw)) {
        snprintf(err, sizeof err, "'chat_template_kwargs' must be an object");
        goto bad;
    }
    cJSON *kwargs = kw && cJSON_IsObject(kw) ? cJSON_Duplicate(kw, true) : cJSON_CreateObject();
    const cJSON *effort = cJSON_GetObjectItemCaseSensitive(body, "reasoning_effort");
    if (cJSON_IsString(effort) && strcmp(effort->valuestring, "none") == 0 &&
        !cJSON_GetObjectItemCaseSensitive(kwargs, "enable_thinking"))
        cJSON_AddFalseToObject(kwargs, "enable_thinking");
    bool start_in_think = false;
    kiln_status st = chat_prompt(s, msgs, tools, cJSON_GetArraySize(kwargs) ? kwargs : NULL, &ids,
                                 &n, &start_in_think);
    cJSON_Delete(kwargs);
    cJSON_Delete(msgs);
    if (st != KILN_OK) {
        cJSON_Delete(body);
        return http_error_status(r, API_OPENAI, st, "prompt");
    }
    /* stop strings point into body: generate copies them (textstream) before body is freed */
    ret = generate(s, r, KIND_CHAT, &o, ids, n, s->has_think, start_in_think, tools != NULL, false);
    cJSON_Delete(body);
    return ret;
bad:
    cJSON_Delete(msgs);
    cJSON_Delete(body);
    return http_error(r, API_OPENAI, 400, NULL, "%s", err);
}

enum MHD_Result route_completions(srv *s, http_req *r) {
    enum MHD_Result ret;
    cJSON *body = parse_body(r, API_OPENAI, &ret);
    if (!body) return ret;
    char err[512] = "";
    gen_opts o;
    int32_t *ids = NULL;
    int n = 0;
    if (!gen_parse_opts(s, body, API_OPENAI, &o, err, sizeof err)) goto bad;
    bool return_ids = false;
    const cJSON *ri = cJSON_GetObjectItemCaseSensitive(body, "return_token_ids");
    if (ri && !cJSON_IsNull(ri)) {
        if (!cJSON_IsBool(ri)) {
            snprintf(err, sizeof err, "'return_token_ids' must be a boolean");
            goto bad;
        }
        return_ids = cJSON_IsTrue(ri);
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (!p) {
        snprintf(err, sizeof err, "'prompt' is required");
        goto bad;
    }
    if (cJSON_IsString(p)) {
        if (!s->tok) {
            snprintf(err, sizeof err,
                     "this model has no tokenizer: 'prompt' must be a list of token ids");
            goto bad;
        }
        kiln_status st =
            kiln_tokenize(s->tok, p->valuestring, strlen(p->valuestring), true, &ids, &n);
        if (st != KILN_OK) {
            cJSON_Delete(body);
            return http_error_status(r, API_OPENAI, st, "prompt");
        }
    } else if (cJSON_IsArray(p)) {
        n = cJSON_GetArraySize(p);
        ids = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
        int i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, p) {
            if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int32_t)it->valuedouble) {
                free(ids);
                snprintf(err, sizeof err,
                         "'prompt' must be a string or a list of integer token ids");
                goto bad;
            }
            ids[i++] = (int32_t)it->valuedouble;
        }
    } else {
        snprintf(err, sizeof err, "'prompt' must be a string or a list of integer token ids");
        goto bad;
    }
    if (n == 0) {
        free(ids);
        snprintf(err, sizeof err, "'prompt' is empty");
        goto bad;
    }
    if (!s->tok && o.n_stops) {
        free(ids);
        snprintf(err, sizeof err, "'stop' needs a tokenizer; this model has none");
        goto bad;
    }
    ret = generate(s, r, KIND_TEXT, &o, ids, n, false, false, false, return_ids);
    cJSON_Delete(body);
    return ret;
bad:
    cJSON_Delete(body);
    return http_error(r, API_OPENAI, 400, NULL, "%s", err);
}

static cJSON *model_json(srv *s) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->cfg.model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "kiln");
    cJSON_AddNumberToObject(m, "context_length",
                            s->cfg.sched.ctx > 0 ? s->cfg.sched.ctx : s->info->max_position);
    return m;
}

enum MHD_Result route_models(srv *s, http_req *r) {
    if (strncmp(r->url, "/v1/models/", 11) == 0) {
        if (strcmp(r->url + 11, s->cfg.model_id) != 0)
            return http_error(r, API_OPENAI, 404, NULL, "model '%s' not found", r->url + 11);
        return http_send_json(r, 200, model_json(s));
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(j, "data");
    cJSON_AddItemToArray(data, model_json(s));
    return http_send_json(r, 200, j);
}
