/* gen.c — request options, submission and token -> text processing (see gen.h). */
#include "server/gen.h"

#include "server/toolcall.h"
#include "util/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static bool get_num(const cJSON *body, const char *key, double lo, double hi, double *out,
                    bool *set, char *err, size_t errsz) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, key);
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        snprintf(err, errsz, "'%s' must be a number", key);
        return false;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        snprintf(err, errsz, "'%s' must be between %g and %g (got %g)", key, lo, hi,
                 v->valuedouble);
        return false;
    }
    *out = v->valuedouble;
    if (set) *set = true;
    return true;
}

static bool get_int(const cJSON *body, const char *key, double lo, double hi, double *out,
                    bool *set, char *err, size_t errsz) {
    double d = *out;
    bool was = false;
    if (!get_num(body, key, lo, hi, &d, &was, err, errsz)) {
        if (strstr(err, "must be a number")) snprintf(err, errsz, "'%s' must be an integer", key);
        return false;
    }
    if (was && d != floor(d)) {
        snprintf(err, errsz, "'%s' must be an integer", key);
        return false;
    }
    if (was) *out = d;
    if (set && was) *set = true;
    return true;
}

static bool get_bool(const cJSON *body, const char *key, bool *out, char *err, size_t errsz) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, key);
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsBool(v)) {
        snprintf(err, errsz, "'%s' must be a boolean", key);
        return false;
    }
    *out = cJSON_IsTrue(v);
    return true;
}

static bool get_stops(const cJSON *body, const char *key, gen_opts *o, char *err, size_t errsz) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, key);
    if (!v || cJSON_IsNull(v)) return true;
    if (cJSON_IsString(v)) {
        if (v->valuestring[0]) o->stops[o->n_stops++] = v->valuestring;
        return true;
    }
    if (!cJSON_IsArray(v)) {
        snprintf(err, errsz, "'%s' must be a string or an array of strings", key);
        return false;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsString(it)) {
            snprintf(err, errsz, "'%s' must contain only strings", key);
            return false;
        }
        if (o->n_stops == TS_MAX_STOPS) {
            snprintf(err, errsz, "'%s' may hold at most %d strings", key, TS_MAX_STOPS);
            return false;
        }
        if (it->valuestring[0]) o->stops[o->n_stops++] = it->valuestring;
    }
    return true;
}

static uint64_t fresh_seed(void) {
    static _Atomic uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^
           (++counter * 0x9E3779B97F4A7C15ull);
}

bool gen_parse_opts(srv *s, const cJSON *body, api_kind api, gen_opts *o, char *err, size_t errsz) {
    memset(o, 0, sizeof *o);
    o->sp = s->cfg.defaults;
    o->sp.seed = fresh_seed();
    o->max_tokens = -1;
    o->top_logprobs = -1;
    o->n = 1;
    double d;
    bool set = false;
#define NUM(key, lo, hi, dst)                                                                      \
    do {                                                                                           \
        d = (dst);                                                                                 \
        set = false;                                                                               \
        if (!get_num(body, key, lo, hi, &d, &set, err, errsz)) return false;                       \
        if (set) (dst) = d;                                                                        \
    } while (0)
    NUM("temperature", 0, 100, o->sp.temperature);
    NUM("top_p", 0, 1, o->sp.top_p);
    NUM("min_p", 0, 1, o->sp.min_p);
    NUM("presence_penalty", -2, 2, o->sp.presence_penalty);
    NUM("frequency_penalty", -2, 2, o->sp.frequency_penalty);
    NUM("repetition_penalty", 0.01, 100, o->sp.repetition_penalty);
#undef NUM
    if (o->sp.top_p == 0) o->sp.top_p = 1e-6f;
    d = o->sp.top_k, set = false;
    if (!get_int(body, "top_k", -1, 1e9, &d, &set, err, errsz)) return false;
    if (set) o->sp.top_k = d < 0 ? 0 : (int)d;
    d = 0, set = false;
    if (!get_int(body, "seed", -9.2e18, 9.2e18, &d, &set, err, errsz)) return false;
    if (set) o->sp.seed = (uint64_t)(int64_t)d;
    const char *mt[] = {"max_tokens", "max_completion_tokens", NULL};
    for (int i = 0; mt[i]; i++) {
        if (api == API_ANTHROPIC && i > 0) break;
        d = 0, set = false;
        if (!get_int(body, mt[i], 1, 1e9, &d, &set, err, errsz)) return false;
        if (set) o->max_tokens = (int)d;
    }
    if (!get_bool(body, "stream", &o->stream, err, errsz)) return false;
    if (!get_bool(body, "ignore_eos", &o->ignore_eos, err, errsz)) return false;
    if (api == API_ANTHROPIC) {
        if (o->max_tokens < 0) {
            snprintf(err, errsz, "max_tokens: Field required");
            return false;
        }
        return get_stops(body, "stop_sequences", o, err, errsz);
    }
    if (!get_stops(body, "stop", o, err, errsz)) return false;
    d = 1, set = false;
    if (!get_int(body, "n", 1, GEN_MAX_N, &d, &set, err, errsz)) return false;
    o->n = (int)d;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(body, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) {
            snprintf(err, errsz, "'stream_options' must be an object");
            return false;
        }
        if (!get_bool(so, "include_usage", &o->include_usage, err, errsz)) return false;
    }
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(body, "logprobs");
    if (cJSON_IsNumber(lp)) { /* /v1/completions: logprobs = number of alternatives */
        d = 0;
        if (!get_int(body, "logprobs", 0, KILN_SCHED_MAX_TOP, &d, NULL, err, errsz)) return false;
        o->top_logprobs = (int)d;
    } else {
        bool want = false;
        if (!get_bool(body, "logprobs", &want, err, errsz)) {
            snprintf(err, errsz, "'logprobs' must be a boolean");
            return false;
        }
        d = 0, set = false;
        if (!get_int(body, "top_logprobs", 0, KILN_SCHED_MAX_TOP, &d, &set, err, errsz))
            return false;
        if (set && !want) {
            snprintf(err, errsz, "'top_logprobs' requires 'logprobs' to be true");
            return false;
        }
        if (want) o->top_logprobs = (int)d;
    }
    return true;
}

kiln_status gen_start(gen *g, srv *s, const gen_opts *o, int32_t *prompt, int n_prompt, bool think,
                      bool start_in_think, bool tools) {
    memset(g, 0, sizeof *g);
    g->s = s;
    g->o = *o;
    g->prompt = prompt;
    g->n_prompt = n_prompt;
    g->n = o->n;
    g->tools = tools;
    int ctx = s->cfg.sched.ctx > 0 ? s->cfg.sched.ctx : s->info->max_position;
    int max_tokens = o->max_tokens;
    if (max_tokens < 0) {
        max_tokens = s->cfg.default_max_tokens;
        if (ctx - n_prompt < max_tokens) max_tokens = ctx - n_prompt;
        if (max_tokens < 1)
            return kiln_error(KILN_ERR_INVALID_ARG,
                              "this model's maximum context length is %d tokens; the prompt has %d",
                              ctx, n_prompt);
    }
    g->o.max_tokens = max_tokens;
    for (int i = 0; i < g->n; i++) {
        gen_choice *c = &g->ch[i];
        kiln_sched_params p = {prompt,
                               n_prompt,
                               max_tokens,
                               o->sp,
                               o->top_logprobs,
                               o->ignore_eos ? NULL : s->stop_ids,
                               o->ignore_eos ? 0 : s->n_stop_ids};
        p.sampling.seed = o->sp.seed + (uint64_t)i;
        kiln_status st = kiln_sched_submit(s->sched, &p, &c->req);
        if (st != KILN_OK) return st;
        if (s->tok) {
            st = kiln_detok_stream_new(s->tok, true, &c->detok);
            if (st != KILN_OK) return st;
        }
        ts_init(&c->ts, o->stops, o->n_stops, think, start_in_think, tools);
    }
    return KILN_OK;
}

static bool is_stop_id(gen *g, int32_t id) {
    if (g->o.ignore_eos) return false;
    for (int i = 0; i < g->s->n_stop_ids; i++)
        if (g->s->stop_ids[i] == id) return true;
    return false;
}

static void push_text(gen_choice *c, gen *g, char *text) {
    if (!text) return;
    if (text[0] && !c->ts.stopped &&
        ts_push(&c->ts, text, strlen(text), &c->content, &c->reasoning)) {
        c->finish = "stop";
        kiln_sched_cancel(g->s->sched, c->req);
    }
    free(text);
}

static void finalize(gen *g, gen_choice *c, const kiln_sched_state *st) {
    if (c->detok && !c->ts.stopped) {
        char *tail = NULL;
        if (kiln_detok_stream_flush(c->detok, &tail) == KILN_OK) push_text(c, g, tail);
    }
    ts_finish(&c->ts, &c->content, &c->reasoning);
    c->n_cached = st->n_cached;
    if (!c->finish) {
        switch (st->finish) {
        case KILN_FINISH_STOP:
            c->finish = "stop";
            break;
        case KILN_FINISH_LENGTH:
            c->finish = "length";
            break;
        case KILN_FINISH_ERROR:
            snprintf(c->error, sizeof c->error, "%s",
                     st->error[0] ? st->error : "generation failed");
            c->finish = "error";
            break;
        default:
            snprintf(c->error, sizeof c->error, "the request was cancelled (server shutting down)");
            c->finish = "error";
            break;
        }
    }
    if (g->tools && c->ts.tool_text.len) {
        c->tool_calls = toolcall_parse(c->ts.tool_text.data);
        if (c->tool_calls)
            c->finish = "tool_calls";
        else
            sb_append(&c->content, c->ts.tool_text.data, c->ts.tool_text.len);
    }
    c->done = true;
}

bool gen_poll(gen *g, int timeout_ms) {
    kiln_sched_req *reqs[GEN_MAX_N];
    int n_live = 0;
    for (int i = 0; i < g->n; i++)
        if (!g->ch[i].done) reqs[n_live++] = g->ch[i].req;
    if (n_live == 0) return true;
    kiln_sched_wait(g->s->sched, reqs, n_live, timeout_ms);
    bool all = true;
    for (int i = 0; i < g->n; i++) {
        gen_choice *c = &g->ch[i];
        if (c->done) continue;
        kiln_sched_token buf[32];
        kiln_sched_state st;
        int k;
        do {
            k = kiln_sched_take(g->s->sched, c->req, buf, 32, &st);
            for (int j = 0; j < k; j++) {
                if (c->ts.stopped) continue; /* tokens past a stop string are dropped */
                if (c->n_toks == c->cap_toks) {
                    int cap = c->cap_toks ? c->cap_toks * 2 : 64;
                    kiln_sched_token *p = realloc(c->toks, sizeof *p * (size_t)cap);
                    if (!p) continue;
                    c->toks = p, c->cap_toks = cap;
                }
                c->toks[c->n_toks++] = buf[j];
                c->n_completion++;
                if (is_stop_id(g, buf[j].id) || !c->detok) continue;
                char *text = NULL;
                if (kiln_detok_stream_push(c->detok, buf[j].id, &text) == KILN_OK)
                    push_text(c, g, text);
            }
        } while (k == 32);
        if (st.finish != KILN_FINISH_NONE || (c->ts.stopped && st.finish != KILN_FINISH_NONE))
            finalize(g, c, &st);
        else if (c->ts.stopped) {
            /* stop string hit: the engine is cancelling; finish now with what was kept */
            kiln_sched_state s2 = st;
            s2.finish = KILN_FINISH_STOP;
            finalize(g, c, &s2);
        }
        if (!c->done) all = false;
    }
    return all;
}

bool gen_run(gen *g, int fd) {
    while (!gen_poll(g, 50)) {
        if (http_peer_gone(fd)) {
            gen_cancel(g);
            atomic_fetch_add(&g->s->disconnects, 1);
            return false;
        }
    }
    return true;
}

void gen_cancel(gen *g) {
    g->cancelled = true;
    for (int i = 0; i < g->n; i++)
        if (g->ch[i].req) kiln_sched_cancel(g->s->sched, g->ch[i].req);
}

void gen_free(gen *g) {
    for (int i = 0; i < GEN_MAX_N; i++) {
        gen_choice *c = &g->ch[i];
        if (c->req) kiln_sched_release(g->s->sched, c->req);
        kiln_detok_stream_free(c->detok);
        ts_free(&c->ts);
        sb_free(&c->content);
        sb_free(&c->reasoning);
        free(c->toks);
        cJSON_Delete(c->tool_calls);
    }
    free(g->prompt);
    memset(g, 0, sizeof *g);
}

char *gen_token_text(srv *s, int32_t id) {
    char *out = NULL;
    if (!s->tok || kiln_detokenize(s->tok, &id, 1, false, &out) != KILN_OK) return strdup("");
    return out;
}
