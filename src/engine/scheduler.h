/* scheduler.h — the engine thread behind the server: continuous batching over kiln_forward.
 *
 * One thread owns the model. Each step it runs, in ONE kiln_forward call, the decode token of every
 * running sequence plus a chunk of each admitted prompt (chunked prefill) under a token budget.
 * Requests are admitted FIFO when a batch slot and KV room (prompt + max_tokens tokens) are free.
 * Finished sequences are kept (a small LRU) so a later prompt that shares a token prefix reuses the
 * cache: the kept sequence is truncated to the common prefix and only the rest is prefilled
 * (reported as cached_tokens). With a paged KV kind the pool's prefix cache is consulted too
 * (kiln_seq_prefix_attach), admission counts the pool's free blocks, and a full pool preempts the
 * newest request (re-queued, resumed later) instead of failing it; see scheduler.c.
 * Callers submit token ids, poll sampled tokens, and cancel/release.
 */
#ifndef KILN_ENGINE_SCHEDULER_H
#define KILN_ENGINE_SCHEDULER_H

#include "kiln.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kiln_sched kiln_sched;
typedef struct kiln_sched_req kiln_sched_req;

#define KILN_SCHED_MAX_TOP 20

typedef struct kiln_sched_options {
    int max_batch;     /* running sequences at once (default 8) */
    int ctx;           /* max tokens per sequence, prompt + generated (default model max) */
    int step_tokens;   /* tokens per forward step, decode + prefill chunks (default 256) */
    int max_waiting;   /* queued requests before submit answers CACHE_FULL (default 256) */
    int cache_entries; /* finished sequences kept for prefix reuse (default max_batch) */
    int64_t kv_tokens; /* KV admission budget in tokens (default max_batch * ctx; paged KV: the
                          pool's capacity) */
} kiln_sched_options;

typedef struct kiln_sched_params {
    const int32_t *prompt; /* copied */
    int n_prompt;
    int max_tokens;
    kiln_sampler_params sampling;
    int top_logprobs; /* -1: no logprobs; 0..KILN_SCHED_MAX_TOP: chosen + that many alternatives */
    const int32_t *stop_ids; /* copied; generation ends after emitting one of these */
    int n_stop_ids;
} kiln_sched_params;

typedef struct kiln_sched_token {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_ids[KILN_SCHED_MAX_TOP];
    float top_logprobs[KILN_SCHED_MAX_TOP];
} kiln_sched_token;

typedef enum {
    KILN_FINISH_NONE = 0, /* still running */
    KILN_FINISH_STOP,     /* a stop id was sampled (it is the last token delivered) */
    KILN_FINISH_LENGTH,   /* max_tokens reached */
    KILN_FINISH_CANCELLED,
    KILN_FINISH_ERROR,
} kiln_sched_finish;

typedef struct kiln_sched_state {
    kiln_sched_finish finish;
    int n_cached;    /* prompt tokens served from a kept cache */
    int n_generated; /* tokens sampled so far */
    bool started;    /* admitted (prefill began) */
    char error[256]; /* when finish == ERROR */
} kiln_sched_state;

typedef struct kiln_sched_stats {
    int running, waiting, prefilling;
    int cached_seqs;        /* kept finished sequences */
    int64_t kv_tokens_used; /* tokens held by running + kept sequences */
    int64_t kv_tokens_reserved;
    int64_t kv_tokens_budget;
    int64_t kv_bytes_per_token;
    int64_t live_seqs; /* kiln_seq objects alive (running + kept) */
    int64_t requests_total, requests_finished, requests_cancelled, requests_failed;
    int64_t prompt_tokens_total, cached_tokens_total, generated_tokens_total;
    int64_t steps_total;
    int64_t preemptions_total; /* paged KV: requests paused because the pool was full */
    int64_t kv_pool_blocks, kv_pool_free_blocks, kv_pool_prefix_blocks; /* paged KV, else 0 */
    double decode_tok_per_s; /* generated tokens/s over the recent window */
    double prefill_tok_per_s;
    int max_batch, ctx;
} kiln_sched_stats;

void kiln_sched_options_default(kiln_sched_options *o);
kiln_status kiln_sched_new(kiln_model *model, const kiln_sched_options *o, kiln_sched **out);
/* Cancels everything, joins the engine thread, frees kept sequences. */
void kiln_sched_free(kiln_sched *s);

/* Validates limits (INVALID_ARG naming the limit), queues (CACHE_FULL when the queue is full). */
kiln_status kiln_sched_submit(kiln_sched *s, const kiln_sched_params *p, kiln_sched_req **out);
/* Moves up to cap new tokens into out (non-blocking); fills *st. Returns the count. */
int kiln_sched_take(kiln_sched *s, kiln_sched_req *r, kiln_sched_token *out, int cap,
                    kiln_sched_state *st);
/* Blocks until one of reqs has undelivered tokens or finished, or timeout_ms passes. */
void kiln_sched_wait(kiln_sched *s, kiln_sched_req *const *reqs, int n, int timeout_ms);
/* Asks the engine to stop the request (frees its batch slot at the next step). */
void kiln_sched_cancel(kiln_sched *s, kiln_sched_req *r);
/* The caller is done with r (cancels it if still running). */
void kiln_sched_release(kiln_sched *s, kiln_sched_req *r);

void kiln_sched_get_stats(kiln_sched *s, kiln_sched_stats *out);
/* Stops admitting; waits up to timeout_ms for running/waiting requests to finish, then cancels
 * the rest. Returns the number cancelled. */
int kiln_sched_drain(kiln_sched *s, int timeout_ms);

#endif
