/* http.c — the HTTP layer: libmicrohttpd daemon (one thread per connection, bounded), body
 * accumulation with a size limit, UTF-8 check, API-key auth, routing, error/JSON responses, the
 * streaming (SSE) hook with client-disconnect detection, and graceful shutdown. */
#include "server/server_internal.h"

#include "util/log.h"
#include "util/status.h"

#include <arpa/inet.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct conn_ctx {
    strbuf body;
    bool too_large;
    bool counted; /* counted in srv->active */
} conn_ctx;

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void kiln_server_config_default(kiln_server_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->model_id = "kiln";
    c->max_body_bytes = 8u << 20;
    c->max_connections = 512;
    c->default_max_tokens = 2048;
    c->drain_ms = 10000;
    kiln_sampler_params_default(&c->defaults);
    c->defaults.temperature = 1.0f;
    kiln_sched_options_default(&c->sched);
}

void kiln_server_load_generation_config(kiln_server_config *c, const char *model_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    FILE *f = fopen(path, "rb");
    if (!f) return;
    strbuf b = {0};
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0 && b.len < (1u << 20))
        sb_append(&b, chunk, n);
    fclose(f);
    cJSON *j = b.data ? cJSON_Parse(b.data) : NULL;
    sb_free(&b);
    if (!j) return;
    const cJSON *v;
    bool sample = true;
    if (cJSON_IsBool(v = cJSON_GetObjectItemCaseSensitive(j, "do_sample")))
        sample = cJSON_IsTrue(v);
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "temperature")))
        c->defaults.temperature = (float)v->valuedouble;
    if (!sample) c->defaults.temperature = 0;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "top_p")))
        c->defaults.top_p = (float)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "top_k")))
        c->defaults.top_k = v->valueint;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "min_p")))
        c->defaults.min_p = (float)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "repetition_penalty")))
        c->defaults.repetition_penalty = (float)v->valuedouble;
    cJSON_Delete(j);
}

/* ---- validation --------------------------------------------------------------------------- */

bool utf8_valid(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int n;
        unsigned min;
        if (c >= 0xC2 && c <= 0xDF)
            n = 1, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF)
            n = 2, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4)
            n = 3, min = 0x10000;
        else
            return false;
        unsigned cp = c & (0x3Fu >> n);
        for (int k = 1; k <= n; k++) {
            if (i + (size_t)k >= len || (s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += (size_t)n + 1;
    }
    return true;
}

/* ---- responses ---------------------------------------------------------------------------- */

static srv *g_srv; /* for status counters in response helpers */

enum MHD_Result http_send(http_req *r, unsigned status, const char *content_type, const char *body,
                          size_t len) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", content_type);
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
    enum MHD_Result ret = MHD_queue_response(r->conn, status, resp);
    MHD_destroy_response(resp);
    if (g_srv && status >= 100 && status < 600)
        atomic_fetch_add(&g_srv->status_count[status / 100], 1);
    return ret;
}

enum MHD_Result http_send_json(http_req *r, unsigned status, cJSON *json) {
    char *text = json ? cJSON_PrintUnformatted(json) : NULL;
    cJSON_Delete(json);
    if (!text)
        return http_send(r, 500, "application/json", "{\"error\":{\"message\":\"out of memory\"}}",
                         37);
    enum MHD_Result ret = http_send(r, status, "application/json", text, strlen(text));
    free(text);
    return ret;
}

static const char *default_type(api_kind api, unsigned status) {
    switch (status) {
    case 400:
        return "invalid_request_error";
    case 401:
        return api == API_ANTHROPIC ? "authentication_error" : "authentication_error";
    case 404:
        return api == API_ANTHROPIC ? "not_found_error" : "not_found_error";
    case 405:
        return "invalid_request_error";
    case 413:
        return api == API_ANTHROPIC ? "request_too_large" : "invalid_request_error";
    case 429:
        return "rate_limit_error";
    case 503:
    case 529:
        return api == API_ANTHROPIC ? "overloaded_error" : "server_overloaded";
    default:
        return api == API_ANTHROPIC ? "api_error" : "server_error";
    }
}

enum MHD_Result http_error(http_req *r, api_kind api, unsigned status, const char *type,
                           const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!utf8_valid(msg, strlen(msg))) snprintf(msg, sizeof msg, "invalid request");
    if (!type) type = default_type(api, status);
    if (g_srv) atomic_fetch_add(&g_srv->http_errors, 1);
    cJSON *j = cJSON_CreateObject(), *e = cJSON_CreateObject();
    if (api == API_ANTHROPIC) {
        cJSON_AddStringToObject(j, "type", "error");
        cJSON_AddStringToObject(e, "type", type);
        cJSON_AddStringToObject(e, "message", msg);
    } else {
        cJSON_AddStringToObject(e, "message", msg);
        cJSON_AddStringToObject(e, "type", type);
        cJSON_AddNullToObject(e, "param");
        cJSON_AddNumberToObject(e, "code", status);
    }
    cJSON_AddItemToObject(j, "error", e);
    return http_send_json(r, status, j);
}

enum MHD_Result http_error_status(http_req *r, api_kind api, kiln_status st, const char *what) {
    const char *msg = kiln_last_error();
    switch (st) {
    case KILN_ERR_INVALID_ARG:
    case KILN_ERR_FORMAT:
    case KILN_ERR_NOT_FOUND:
        return http_error(r, api, 400, NULL, "%s: %s", what, msg);
    case KILN_ERR_CACHE_FULL:
        return http_error(r, api, api == API_ANTHROPIC ? 529 : 503, NULL, "%s", msg);
    case KILN_ERR_CANCELLED:
        return http_error(r, api, 503, NULL, "%s", msg);
    case KILN_ERR_UNSUPPORTED:
        return http_error(r, api, 400, NULL, "%s: %s", what, msg);
    default:
        return http_error(r, api, 500, NULL, "%s: %s", what, msg);
    }
}

bool http_peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* ---- streaming ---------------------------------------------------------------------------- */

typedef struct stream {
    http_produce_fn produce;
    void (*cleanup)(void *);
    void *ctx;
    strbuf out;
    bool done;
    int fd;
} stream;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    for (;;) {
        if (st->out.len > 0) {
            size_t n = st->out.len < max ? st->out.len : max;
            memcpy(buf, st->out.data, n);
            sb_consume(&st->out, n);
            return (ssize_t)n;
        }
        if (st->done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (http_peer_gone(st->fd)) {
            if (g_srv) atomic_fetch_add(&g_srv->disconnects, 1);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        st->produce(st->ctx, &st->out, &st->done);
    }
}

static void stream_free(void *cls) {
    stream *st = cls;
    if (st->cleanup) st->cleanup(st->ctx);
    sb_free(&st->out);
    free(st);
}

enum MHD_Result http_stream(http_req *r, const char *content_type, http_produce_fn produce,
                            void (*cleanup)(void *ctx), void *ctx) {
    stream *st = calloc(1, sizeof *st);
    if (!st) {
        if (cleanup) cleanup(ctx);
        return http_error(r, API_OPENAI, 500, NULL, "out of memory");
    }
    *st = (stream){produce, cleanup, ctx, {0}, false, r->fd};
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                                  stream_read, st, stream_free);
    if (!resp) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", content_type);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    if (g_srv) atomic_fetch_add(&g_srv->status_count[2], 1);
    return ret;
}

/* ---- dispatch ----------------------------------------------------------------------------- */

static bool authorized(srv *s, struct MHD_Connection *c) {
    if (!s->cfg.api_key || !s->cfg.api_key[0]) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (h && strncasecmp(h, "Bearer ", 7) == 0 && strcmp(h + 7, s->cfg.api_key) == 0) return true;
    h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    return h && strcmp(h, s->cfg.api_key) == 0;
}

static api_kind api_of(const char *url) {
    return strncmp(url, "/v1/messages", 12) == 0 ? API_ANTHROPIC : API_OPENAI;
}

static enum MHD_Result dispatch(srv *s, http_req *r) {
    const char *u = r->url;
    bool get = strcmp(r->method, "GET") == 0 || strcmp(r->method, "HEAD") == 0;
    bool post = strcmp(r->method, "POST") == 0;
    api_kind api = api_of(u);
    if (strcmp(r->method, "OPTIONS") == 0) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers", "*");
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        enum MHD_Result ret = MHD_queue_response(r->conn, 204, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    if (strcmp(u, "/") == 0 || strcmp(u, "/index.html") == 0) {
        if (!get) return http_error(r, api, 405, NULL, "method %s not allowed on %s", r->method, u);
        return route_web_page(s, r);
    }
    if (strcmp(u, "/health") == 0) return route_health(s, r);
    bool is_v1 = strncmp(u, "/v1/", 4) == 0;
    if ((is_v1 || strcmp(u, "/stats") == 0 || strcmp(u, "/metrics") == 0) &&
        !authorized(s, r->conn))
        return http_error(r, api, 401, NULL, "invalid or missing API key");
    struct {
        const char *path;
        bool post;
        enum MHD_Result (*fn)(srv *, http_req *);
    } routes[] = {
        {"/v1/chat/completions", true, route_chat_completions},
        {"/v1/completions", true, route_completions},
        {"/v1/messages", true, route_messages},
        {"/v1/models", false, route_models},
        {"/stats", false, route_stats},
        {"/metrics", false, route_metrics},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        size_t n = strlen(routes[i].path);
        bool match = strcmp(u, routes[i].path) == 0 ||
                     (routes[i].fn == route_models && strncmp(u, "/v1/models/", 11) == 0);
        (void)n;
        if (!match) continue;
        if (routes[i].post ? !post : !get)
            return http_error(r, api, 405, NULL, "method %s not allowed on %s", r->method, u);
        return routes[i].fn(s, r);
    }
    return http_error(r, api, 404, NULL, "no route for %s %s", r->method, u);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
    (void)version;
    srv *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        *con_cls = cc;
        cc->counted = true;
        atomic_fetch_add(&s->active, 1);
        atomic_fetch_add(&s->http_requests, 1);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) cc->too_large = true;
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        if (!cc->too_large && cc->body.len + *upload_data_size > s->cfg.max_body_bytes) {
            cc->too_large = true;
            sb_free(&cc->body);
        }
        if (!cc->too_large) sb_append(&cc->body, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    http_req r = {
        c, method, url, cc->body.data ? cc->body.data : "", cc->body.len, ci ? ci->connect_fd : -1};
    api_kind api = api_of(url);
    if (cc->too_large)
        return http_error(&r, api, 413, NULL, "request body exceeds the limit of %zu bytes",
                          s->cfg.max_body_bytes);
    if (cc->body.oom) return http_error(&r, api, 500, NULL, "out of memory reading the body");
    if (atomic_load(&s->stopping) && strcmp(url, "/health") != 0)
        return http_error(&r, api, 503, NULL, "the server is shutting down");
    if (!utf8_valid(r.body, r.body_len))
        return http_error(&r, api, 400, NULL, "the request body is not valid UTF-8");
    if (memchr(r.body, '\0', r.body_len))
        return http_error(&r, api, 400, NULL, "the request body contains a NUL byte");
    return dispatch(s, &r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)c;
    srv *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    if (toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT || toe == MHD_REQUEST_TERMINATED_READ_ERROR)
        atomic_fetch_add(&s->disconnects, 1);
    if (cc->counted) atomic_fetch_sub(&s->active, 1);
    sb_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

static void collect_stop_ids(srv *s) {
    for (int i = 0; i < s->info->n_eos && s->n_stop_ids < 16; i++)
        s->stop_ids[s->n_stop_ids++] = s->info->eos_ids[i];
    if (!s->tok) return;
    static const char *ends[] = {"<|im_end|>",      "<|endoftext|>", "<|eot_id|>", "<|eom_id|>",
                                 "<|end_of_text|>", "<end_of_turn>", "<|end|>"};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0] && s->n_stop_ids < 16; i++) {
        int32_t id = kiln_tokenizer_token_id(s->tok, ends[i]);
        bool dup = false;
        for (int j = 0; j < s->n_stop_ids; j++) dup |= s->stop_ids[j] == id;
        if (id >= 0 && !dup) s->stop_ids[s->n_stop_ids++] = id;
    }
    s->has_think = kiln_tokenizer_token_id(s->tok, "<think>") >= 0 &&
                   kiln_tokenizer_token_id(s->tok, "</think>") >= 0;
}

kiln_status kiln_server_run(kiln_model *model, kiln_tokenizer *tok, const kiln_server_config *c,
                            volatile sig_atomic_t *stop) {
    srv *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OOM, "server");
    s->model = model;
    s->tok = tok;
    s->cfg = *c;
    s->info = kiln_model_get_info(model);
    s->start_time = mono_s();
    collect_stop_ids(s);
    kiln_status st = kiln_sched_new(model, &s->cfg.sched, &s->sched);
    if (st != KILN_OK) {
        free(s);
        return st;
    }
    g_srv = s;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->port)};
    if (inet_pton(AF_INET, c->host, &addr.sin_addr) != 1) {
        kiln_sched_free(s->sched);
        free(s);
        g_srv = NULL;
        return kiln_error(KILN_ERR_INVALID_ARG, "--host '%s' is not an IPv4 address", c->host);
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
            MHD_USE_ITC,
        0, NULL, NULL, on_request, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)c->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
    if (!d) {
        kiln_sched_free(s->sched);
        free(s);
        g_srv = NULL;
        return kiln_error(KILN_ERR_IO, "cannot listen on %s:%d (port in use?)", c->host, c->port);
    }
    int port = c->port;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if (di) port = di->port;
    fprintf(stderr, "kiln: listening on http://%s:%d\n", c->host, port);
    fflush(stderr);
    while (!*stop) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "kiln: shutting down: finishing in-flight requests\n");
    atomic_store(&s->stopping, 1);
    MHD_socket ls = MHD_quiesce_daemon(d);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    int cancelled = kiln_sched_drain(s->sched, c->drain_ms);
    double deadline = mono_s() + 5.0;
    while (atomic_load(&s->active) > 0 && mono_s() < deadline) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(d);
    kiln_sched_free(s->sched);
    fprintf(stderr, "kiln: stopped (%d requests cancelled)\n", cancelled);
    g_srv = NULL;
    free(s);
    return KILN_OK;
}
