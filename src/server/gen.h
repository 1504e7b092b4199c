/* gen.h — one generation request as the routes see it: request options parsed from JSON (shared by
 * the OpenAI and Anthropic routes), submission of n choices to the scheduler, and turning sampled
 * tokens into text deltas (detokenize -> stop strings -> think split -> tool-call withholding). */
#ifndef KILN_SERVER_GEN_H
#define KILN_SERVER_GEN_H

#include "server/server_internal.h"
#include "server/textstream.h"

#define GEN_MAX_N 8

typedef struct gen_opts {
    int max_tokens; /* -1 = server default */
    kiln_sampler_params sp;
    const char *stops[TS_MAX_STOPS];
    int n_stops;
    int top_logprobs; /* -1 = none */
    int n;
    bool stream, include_usage;
    bool ignore_eos;
} gen_opts;

typedef struct gen_choice {
    kiln_sched_req *req;
    kiln_detok_stream *detok;
    textstream ts;
    strbuf content, reasoning; /* accumulated text (stream routes consume deltas from here) */
    kiln_sched_token *toks;    /* every sampled token (logprobs, token ids) */
    int n_toks, cap_toks, toks_reported;
    size_t content_sent, reasoning_sent; /* streaming: bytes already sent */
    int n_completion, n_cached;
    bool done;
    const char *finish; /* "stop", "length", "tool_calls" (set when done) */
    char error[256];    /* non-empty: the request failed */
    cJSON *tool_calls;  /* [{name, arguments}] parsed at the end, or NULL */
} gen_choice;

typedef struct gen {
    srv *s;
    gen_opts o;
    int32_t *prompt;
    int n_prompt;
    gen_choice ch[GEN_MAX_N];
    int n;
    bool tools;
    bool cancelled; /* client went away */
} gen;

/* Fills o from the request's JSON fields, using server defaults. api selects field names
 * (OpenAI: max_tokens/max_completion_tokens, stop, n, logprobs/top_logprobs; Anthropic:
 * max_tokens, stop_sequences). On a bad field writes a message into err and returns false. */
bool gen_parse_opts(srv *s, const cJSON *body, api_kind api, gen_opts *o, char *err, size_t errsz);

/* Takes ownership of prompt (malloc'd). Returns a kiln_status (limits -> INVALID_ARG, queue
 * full -> CACHE_FULL); on failure g holds nothing to free except via gen_free. */
kiln_status gen_start(gen *g, srv *s, const gen_opts *o, int32_t *prompt, int n_prompt, bool think,
                      bool start_in_think, bool tools);
/* Waits up to timeout_ms for tokens and processes them. Returns true when every choice is done. */
bool gen_poll(gen *g, int timeout_ms);
/* Runs to completion (non-streaming), polling the client socket; false if the client left. */
bool gen_run(gen *g, int fd);
void gen_cancel(gen *g);
void gen_free(gen *g);
/* Renders messages (normalized JSON array) + tools with the chat template and tokenizes;
 * *start_in_think when the rendered prompt ends inside <think>. (routes_openai.c) */
kiln_status chat_prompt(srv *s, const cJSON *messages, const cJSON *tools, const cJSON *kwargs,
                        int32_t **ids, int *n, bool *start_in_think);
/* Token text for logprobs ("" without a tokenizer); malloc'd. */
char *gen_token_text(srv *s, int32_t id);

#endif
