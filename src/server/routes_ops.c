/* routes_ops.c — operational endpoints: GET /health, GET /stats (JSON: KV use, prefix-cache hit
 * rate, running/waiting requests, tok/s), GET /metrics (Prometheus text) and the chat page at /. */
#include "server/server_internal.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static double uptime(srv *s) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9 - s->start_time;
}

enum MHD_Result route_health(srv *s, http_req *r) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "status", atomic_load(&s->stopping) ? "stopping" : "ok");
    return http_send_json(r, atomic_load(&s->stopping) ? 503 : 200, j);
}

enum MHD_Result route_stats(srv *s, http_req *r) {
    kiln_sched_stats st;
    kiln_sched_get_stats(s->sched, &st);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", s->cfg.model_id);
    cJSON_AddNumberToObject(j, "uptime_s", uptime(s));
    cJSON *req = cJSON_AddObjectToObject(j, "requests");
    cJSON_AddNumberToObject(req, "running", st.running);
    cJSON_AddNumberToObject(req, "waiting", st.waiting);
    cJSON_AddNumberToObject(req, "prefilling", st.prefilling);
    cJSON_AddNumberToObject(req, "total", (double)st.requests_total);
    cJSON_AddNumberToObject(req, "finished", (double)st.requests_finished);
    cJSON_AddNumberToObject(req, "cancelled", (double)st.requests_cancelled);
    cJSON_AddNumberToObject(req, "failed", (double)st.requests_failed);
    cJSON_AddNumberToObject(req, "http_active", atomic_load(&s->active));
    cJSON_AddNumberToObject(req, "http_total", (double)atomic_load(&s->http_requests));
    cJSON_AddNumberToObject(req, "http_errors", (double)atomic_load(&s->http_errors));
    cJSON_AddNumberToObject(req, "client_disconnects", (double)atomic_load(&s->disconnects));
    cJSON *kv = cJSON_AddObjectToObject(j, "kv");
    cJSON_AddNumberToObject(kv, "tokens_used", (double)st.kv_tokens_used);
    cJSON_AddNumberToObject(kv, "tokens_reserved", (double)st.kv_tokens_reserved);
    cJSON_AddNumberToObject(kv, "tokens_budget", (double)st.kv_tokens_budget);
    cJSON_AddNumberToObject(kv, "bytes_per_token", (double)st.kv_bytes_per_token);
    cJSON_AddNumberToObject(kv, "bytes_used", (double)(st.kv_tokens_used * st.kv_bytes_per_token));
    cJSON_AddNumberToObject(
        kv, "use",
        st.kv_tokens_budget ? (double)st.kv_tokens_used / (double)st.kv_tokens_budget : 0);
    cJSON_AddNumberToObject(kv, "live_sequences", (double)st.live_seqs);
    cJSON_AddNumberToObject(kv, "pool_blocks", (double)st.kv_pool_blocks); /* 0: not paged */
    cJSON_AddNumberToObject(kv, "pool_free_blocks", (double)st.kv_pool_free_blocks);
    cJSON_AddNumberToObject(kv, "pool_prefix_blocks", (double)st.kv_pool_prefix_blocks);
    cJSON_AddNumberToObject(kv, "preemptions", (double)st.preemptions_total);
    cJSON *pc = cJSON_AddObjectToObject(j, "prefix_cache");
    cJSON_AddNumberToObject(pc, "kept_sequences", st.cached_seqs);
    cJSON_AddNumberToObject(pc, "prompt_tokens", (double)st.prompt_tokens_total);
    cJSON_AddNumberToObject(pc, "cached_tokens", (double)st.cached_tokens_total);
    cJSON_AddNumberToObject(pc, "hit_rate",
                            st.prompt_tokens_total
                                ? (double)st.cached_tokens_total / (double)st.prompt_tokens_total
                                : 0);
    cJSON *tp = cJSON_AddObjectToObject(j, "throughput");
    cJSON_AddNumberToObject(tp, "decode_tok_per_s", st.decode_tok_per_s);
    cJSON_AddNumberToObject(tp, "prefill_tok_per_s", st.prefill_tok_per_s);
    cJSON_AddNumberToObject(tp, "generated_tokens", (double)st.generated_tokens_total);
    cJSON_AddNumberToObject(tp, "steps", (double)st.steps_total);
    cJSON *cfg = cJSON_AddObjectToObject(j, "config");
    cJSON_AddNumberToObject(cfg, "max_batch", st.max_batch);
    cJSON_AddNumberToObject(cfg, "ctx", st.ctx);
    return http_send_json(r, 200, j);
}

enum MHD_Result route_metrics(srv *s, http_req *r) {
    kiln_sched_stats st;
    kiln_sched_get_stats(s->sched, &st);
    strbuf b = {0};
#define GAUGE(name, help, val)                                                                     \
    sb_printf(&b,                                                                                  \
              "# HELP kiln_" name " " help "\n# TYPE kiln_" name " gauge\nkiln_" name " %.6g\n",   \
              (double)(val))
#define COUNTER(name, help, val)                                                                   \
    sb_printf(&b,                                                                                  \
              "# HELP kiln_" name " " help "\n# TYPE kiln_" name " counter\nkiln_" name " %.0f\n", \
              (double)(val))
    GAUGE("requests_running", "Requests in the running batch.", st.running);
    GAUGE("requests_waiting", "Requests queued for admission.", st.waiting);
    GAUGE("kv_tokens_used", "Tokens held in KV caches (running + kept).", st.kv_tokens_used);
    GAUGE("kv_tokens_budget", "KV admission budget in tokens.", st.kv_tokens_budget);
    GAUGE("kv_use_ratio", "kv_tokens_used / kv_tokens_budget.",
          st.kv_tokens_budget ? (double)st.kv_tokens_used / (double)st.kv_tokens_budget : 0);
    GAUGE("prefix_cache_sequences", "Finished sequences kept for prefix reuse.", st.cached_seqs);
    GAUGE("decode_tokens_per_second", "Generated tokens per second (last 5 s).",
          st.decode_tok_per_s);
    GAUGE("prefill_tokens_per_second", "Prefilled tokens per second (last 5 s).",
          st.prefill_tok_per_s);
    COUNTER("requests_total", "Generation requests submitted.", st.requests_total);
    COUNTER("requests_cancelled_total", "Generation requests cancelled.", st.requests_cancelled);
    COUNTER("requests_failed_total", "Generation requests failed.", st.requests_failed);
    COUNTER("prompt_tokens_total", "Prompt tokens submitted.", st.prompt_tokens_total);
    COUNTER("cached_tokens_total", "Prompt tokens served from the prefix cache.",
            st.cached_tokens_total);
    COUNTER("generated_tokens_total", "Tokens generated.", st.generated_tokens_total);
    COUNTER("engine_steps_total", "Batched forward steps.", st.steps_total);
    COUNTER("http_requests_total", "HTTP requests received.", atomic_load(&s->http_requests));
    COUNTER("http_errors_total", "HTTP error responses.", atomic_load(&s->http_errors));
    COUNTER("client_disconnects_total", "Clients that left before the response ended.",
            atomic_load(&s->disconnects));
#undef GAUGE
#undef COUNTER
    enum MHD_Result ret =
        http_send(r, 200, "text/plain; version=0.0.4", b.data ? b.data : "", b.len);
    sb_free(&b);
    return ret;
}

enum MHD_Result route_web_page(srv *s, http_req *r) {
    (void)s;
    return http_send(r, 200, "text/html; charset=utf-8", kiln_web_page, strlen(kiln_web_page));
}
