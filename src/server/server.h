/* server.h — the HTTP server's entry point for `kiln serve`: configuration and the blocking run
 * loop. OpenAI (/v1/chat/completions, /v1/completions, /v1/models) and Anthropic (/v1/messages)
 * APIs plus /health, /stats, /metrics and the chat page at /, over the scheduler. */
#ifndef KILN_SERVER_SERVER_H
#define KILN_SERVER_SERVER_H

#include "engine/scheduler.h"
#include "kiln.h"

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct kiln_server_config {
    const char *host;             /* default "127.0.0.1" */
    int port;                     /* default 8080; 0 = any free port (printed) */
    const char *api_key;          /* NULL = no auth */
    const char *model_id;         /* name in /v1/models and responses */
    size_t max_body_bytes;        /* 413 above (default 8 MiB) */
    int max_connections;          /* concurrent connections (default 512) */
    int default_max_tokens;       /* when a request names none (default 2048, capped by ctx) */
    int drain_ms;                 /* graceful shutdown: time to finish in-flight requests (10000) */
    kiln_sampler_params defaults; /* generation_config.json sampling defaults */
    kiln_sched_options sched;
} kiln_server_config;

void kiln_server_config_default(kiln_server_config *c);
/* Reads sampling defaults (temperature, top_p, top_k, min_p, repetition_penalty) from
 * <model_dir>/generation_config.json if present. */
void kiln_server_load_generation_config(kiln_server_config *c, const char *model_dir);

/* Serves until *stop becomes nonzero, then drains and returns KILN_OK. tok may be NULL (token-id
 * prompts only). Prints "kiln: listening on http://host:port" to stderr once ready. */
kiln_status kiln_server_run(kiln_model *model, kiln_tokenizer *tok, const kiln_server_config *c,
                            volatile sig_atomic_t *stop);

#endif
