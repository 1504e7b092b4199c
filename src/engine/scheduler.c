/* scheduler.c — continuous batching on one engine thread (see scheduler.h for the contract).
 *
 * Locking: s->mu guards the queues, the per-request output buffers, flags and stats. The engine
 * thread builds and runs each forward step without the lock; the fields it alone touches
 * (seq, sampler, logits, tokens after submit, n_fed) are marked "engine" below.
 *
 * A step: reap cancelled requests -> admit FIFO while a slot and KV room exist (taking the kept
 * sequence with the longest common prefix) -> one kiln_forward over [decode tokens of running
 * sequences] + [prefill chunks in admission order, under step_tokens] -> sample where logits came
 * back -> publish tokens, finish on stop id / max_tokens / ctx -> retire finished sequences into
 * the kept LRU.
 *
 * Paged KV (the model's --kv kind is stored in the block pool): admission also attaches the
 * longest cached block run of the pool's prefix cache (kiln_seq_prefix_attach) when it beats the
 * kept sequences; a request is admitted when the pool's available blocks cover the uncached part
 * of its prompt and the pending prefill of the running ones (generation grows optimistically);
 * when kiln_forward answers KILN_ERR_CACHE_FULL the kept sequences are dropped first, then the
 * newest running request is preempted: its sequence is freed (its full blocks stay in the prefix
 * cache), it goes back to the head of the queue and resumes later by re-prefilling prompt +
 * generated tokens. Hybrid models (recurrent layers) split prefill chunks at block boundaries,
 * including the last one before the end of the prompt, so recurrent-state snapshots exist there. */
#include "engine/scheduler.h"

#include "kv/kv_factory.h"
#include "kv/kv_pool.h"
#include "model/model.h"
#include "util/status.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct kiln_sched_req {
    /* set at submit, then engine-only */
    int32_t *tokens; /* [cap_tokens]: prompt then generated ids (engine appends) */
    int n_tokens, cap_tokens;
    int n_prompt, max_tokens;
    kiln_sampler_params sp;
    int top_logprobs;
    int32_t *stop_ids;
    int n_stop;
    int64_t reserve;   /* KV tokens reserved while running */
    uint64_t admit_id; /* admission order (the newest is preempted first) */
    /* engine */
    kiln_seq *seq;
    kiln_sampler *sampler;
    float *logits;
    int n_fed; /* tokens in seq's cache */
    /* guarded by mu */
    kiln_sched_token *out; /* undelivered tokens [out_head, n_out) */
    int n_out, out_head, cap_out;
    kiln_sched_state st;
    bool cancel, released, engine_done, running;
    kiln_sched_req *next; /* waiting FIFO */
};

typedef struct kept_seq {
    kiln_seq *seq;
    int32_t *tokens;
    int n;
    uint64_t last_used;
} kept_seq;

typedef struct step_rec {
    double t;
    int n_gen, n_prefill;
} step_rec;

#define STEP_RING 512

struct kiln_sched {
    kiln_model *model;
    kiln_sched_options o;
    int vocab;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* engine waits for work */
    pthread_cond_t out;  /* callers wait for tokens */
    bool stop, draining;
    kiln_sched_req *wait_head, *wait_tail;
    int n_waiting;
    kiln_sched_req **run; /* [max_batch] */
    int n_run;
    kept_seq *kept; /* [cache_entries] */
    int n_kept;
    uint64_t clock;
    int64_t reserved, kept_tokens;
    kiln_sched_stats totals;
    step_rec ring[STEP_RING];
    int ring_n, ring_pos;
    float *scratch;  /* [vocab] raw logits for logprobs (engine) */
    kv_pool *pool;   /* the model's paged pool, or NULL (contiguous caches) */
    int snap_block;  /* hybrid paged models: block size at which prefill chunks are cut (0: off) */
    bool hold_admit; /* after a preemption: admit again once a running request retires */
    uint64_t admit_clock;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void kiln_sched_options_default(kiln_sched_options *o) {
    memset(o, 0, sizeof *o);
    o->max_batch = 8;
    o->step_tokens = 256;
    o->max_waiting = 256;
}

static void req_free(kiln_sched_req *r) {
    if (!r) return;
    kiln_sampler_free(r->sampler);
    kiln_seq_free(r->seq);
    free(r->logits);
    free(r->tokens);
    free(r->stop_ids);
    free(r->out);
    free(r);
}

/* ---- kept sequences (prefix reuse) -------------------------------------------------------- */

static void kept_drop(kiln_sched *s, int i) {
    s->kept_tokens -= s->kept[i].n;
    kiln_seq_free(s->kept[i].seq);
    free(s->kept[i].tokens);
    s->kept[i] = s->kept[--s->n_kept];
}

static void kept_evict_lru(kiln_sched *s) {
    int lru = 0;
    for (int i = 1; i < s->n_kept; i++)
        if (s->kept[i].last_used < s->kept[lru].last_used) lru = i;
    kept_drop(s, lru);
}

static void kept_put(kiln_sched *s, kiln_seq *seq, const int32_t *tokens, int n) {
    if (s->o.cache_entries <= 0 || n <= 0) {
        kiln_seq_free(seq);
        return;
    }
    int32_t *copy = malloc(sizeof(int32_t) * (size_t)n);
    if (!copy) {
        kiln_seq_free(seq);
        return;
    }
    memcpy(copy, tokens, sizeof(int32_t) * (size_t)n);
    if (s->n_kept == s->o.cache_entries) kept_evict_lru(s);
    s->kept[s->n_kept++] = (kept_seq){seq, copy, n, ++s->clock};
    s->kept_tokens += n;
}

/* Takes the kept sequence sharing the longest prefix with r's tokens (capped at n_tokens - 1 so
 * at least one token is fed for logits), truncated to that prefix. Returns the prefix length. */
static int kept_take(kiln_sched *s, kiln_sched_req *r) {
    int best = -1, best_len = 0;
    for (int i = 0; i < s->n_kept; i++) {
        int n = s->kept[i].n < r->n_tokens - 1 ? s->kept[i].n : r->n_tokens - 1;
        int l = 0;
        while (l < n && s->kept[i].tokens[l] == r->tokens[l]) l++;
        if (l > best_len || (l == best_len && best >= 0 && l > 0 &&
                             s->kept[i].last_used > s->kept[best].last_used)) {
            best = i;
            best_len = l;
        }
    }
    if (best < 0 || best_len == 0) return 0;
    kiln_seq *seq = s->kept[best].seq;
    s->kept[best].seq = NULL;
    kept_drop(s, best);
    if (kiln_seq_truncate(seq, best_len) != KILN_OK) {
        kiln_seq_free(seq);
        return 0;
    }
    r->seq = seq;
    return best_len;
}

/* ---- request lifecycle -------------------------------------------------------------------- */

static void publish(kiln_sched *s, kiln_sched_req *r, const kiln_sched_token *t) {
    if (r->out_head > 0 && r->out_head == r->n_out) r->out_head = r->n_out = 0;
    if (r->n_out == r->cap_out) {
        if (r->out_head > 0) {
            memmove(r->out, r->out + r->out_head,
                    sizeof *r->out * (size_t)(r->n_out - r->out_head));
            r->n_out -= r->out_head;
            r->out_head = 0;
        } else {
            int cap = r->cap_out ? r->cap_out * 2 : 16;
            kiln_sched_token *p = realloc(r->out, sizeof *p * (size_t)cap);
            if (!p) return; /* token lost only under OOM; the request still finishes */
            r->out = p;
            r->cap_out = cap;
        }
    }
    r->out[r->n_out++] = *t;
}

/* Retires a running request (mu held): its sequence goes to the kept LRU unless it failed. */
static void retire(kiln_sched *s, int slot, kiln_sched_finish why, const char *err) {
    kiln_sched_req *r = s->run[slot];
    s->run[slot] = s->run[--s->n_run];
    if (r->st.finish == KILN_FINISH_NONE) r->st.finish = why;
    if (why == KILN_FINISH_ERROR && err) snprintf(r->st.error, sizeof r->st.error, "%s", err);
    s->reserved -= r->reserve;
    s->hold_admit = false;
    r->running = false;
    r->engine_done = true;
    if (why == KILN_FINISH_CANCELLED)
        s->totals.requests_cancelled++;
    else if (why == KILN_FINISH_ERROR)
        s->totals.requests_failed++;
    else
        s->totals.requests_finished++;
    if (r->seq && why != KILN_FINISH_ERROR && kiln_seq_len(r->seq) == r->n_fed)
        kept_put(s, r->seq, r->tokens, r->n_fed);
    else
        kiln_seq_free(r->seq);
    r->seq = NULL;
    kiln_sampler_free(r->sampler);
    r->sampler = NULL;
    free(r->logits);
    r->logits = NULL;
    if (r->released) req_free(r);
}

static void finish_waiting(kiln_sched *s, kiln_sched_req *r, kiln_sched_finish why) {
    r->st.finish = why;
    r->engine_done = true;
    s->totals.requests_cancelled++;
    if (r->released) req_free(r);
}

/* Pool blocks of n tokens over every attention layer. */
static int64_t pool_blocks(const kv_pool *p, int64_t n) {
    return (n + p->block_tokens - 1) / p->block_tokens * p->n_attn_layers;
}

/* Paged admission: would r's prompt, with the pending prefill of the running requests and one
 * block of decode headroom each, exceed the blocks the pool can hand out now? (mu held) */
static bool pool_short(kiln_sched *s, const kiln_sched_req *r) {
    int64_t need = pool_blocks(s->pool, r->n_tokens) + s->pool->n_attn_layers;
    for (int i = 0; i < s->n_run; i++)
        need +=
            pool_blocks(s->pool, s->run[i]->n_tokens - s->run[i]->n_fed) + s->pool->n_attn_layers;
    pthread_mutex_lock(&s->pool->mu);
    int64_t avail = kv_pool_available_locked(s->pool);
    pthread_mutex_unlock(&s->pool->mu);
    return need > avail;
}

/* KILN_ERR_CACHE_FULL from the pool (mu held): drops the kept sequences, else preempts the newest
 * running request (back to the head of the queue, its sequence freed). False if neither helps. */
static bool relieve_pool(kiln_sched *s) {
    if (s->n_kept > 0) {
        while (s->n_kept > 0) kept_drop(s, s->n_kept - 1);
        return true;
    }
    if (s->n_run < 2) return false;
    int slot = 0;
    for (int i = 1; i < s->n_run; i++)
        if (s->run[i]->admit_id > s->run[slot]->admit_id) slot = i;
    kiln_sched_req *r = s->run[slot];
    s->run[slot] = s->run[--s->n_run];
    s->reserved -= r->reserve;
    kiln_seq_free(r->seq);
    r->seq = NULL;
    r->n_fed = 0;
    r->running = false;
    r->next = s->wait_head;
    s->wait_head = r;
    if (!s->wait_tail) s->wait_tail = r;
    s->n_waiting++;
    s->hold_admit = true;
    s->totals.preemptions_total++;
    return true;
}

/* Admits waiting requests FIFO while a slot and KV room exist (mu held). */
static void admit(kiln_sched *s) {
    while (s->wait_head && s->n_run < s->o.max_batch) {
        kiln_sched_req *r = s->wait_head;
        if (r->cancel) {
            s->wait_head = r->next;
            if (!s->wait_head) s->wait_tail = NULL;
            s->n_waiting--;
            finish_waiting(s, r, KILN_FINISH_CANCELLED);
            continue;
        }
        if (s->hold_admit && s->n_run > 0) break; /* a preempted request waits for room */
        if (s->pool) {
            r->reserve = r->n_tokens; /* generation grows optimistically: preemption covers it */
            while (s->n_kept > 0 && pool_short(s, r)) kept_evict_lru(s);
            if (s->n_run > 0 && pool_short(s, r)) break;
        } else {
            r->reserve = (int64_t)r->n_prompt + r->max_tokens;
        }
        while (s->reserved + s->kept_tokens + r->reserve > s->o.kv_tokens && s->n_kept > 0)
            kept_evict_lru(s);
        if (s->reserved + r->reserve > s->o.kv_tokens) break; /* FIFO: wait for room */
        s->wait_head = r->next;
        if (!s->wait_head) s->wait_tail = NULL;
        s->n_waiting--;
        r->next = NULL;
        int cached = kept_take(s, r);
        kiln_status st = KILN_OK;
        if (s->pool) { /* the pool's prefix cache may hold a longer run than any kept sequence */
            kiln_seq *fresh = NULL;
            int reused = 0;
            st = kiln_seq_new(s->model, &fresh);
            if (st == KILN_OK) st = kiln_seq_prefix_attach(fresh, r->tokens, r->n_tokens, &reused);
            if (st == KILN_OK && reused > cached) {
                kiln_seq_free(r->seq);
                r->seq = fresh;
                cached = reused;
            } else {
                kiln_seq_free(fresh);
            }
        }
        if (st == KILN_OK && !r->seq) st = kiln_seq_new(s->model, &r->seq);
        if (st == KILN_OK && !r->sampler) st = kiln_sampler_new(&r->sp, s->vocab, &r->sampler);
        if (st == KILN_OK && !r->logits && !(r->logits = malloc(sizeof(float) * (size_t)s->vocab)))
            st = kiln_error(KILN_ERR_OOM, "logits buffer");
        r->running = true;
        r->admit_id = ++s->admit_clock;
        s->reserved += r->reserve;
        s->run[s->n_run++] = r;
        r->n_fed = cached;
        if (!r->st.started) { /* a resumed (preempted) request is counted once */
            r->st.n_cached = cached;
            s->totals.prompt_tokens_total += r->n_prompt;
            s->totals.cached_tokens_total += cached;
        }
        r->st.started = true;
        if (st != KILN_OK) retire(s, s->n_run - 1, KILN_FINISH_ERROR, kiln_last_error());
    }
}

/* ---- sampling ----------------------------------------------------------------------------- */

static void sample_into(kiln_sched *s, kiln_sched_req *r, kiln_sched_token *t) {
    memset(t, 0, sizeof *t);
    int k = r->top_logprobs;
    if (k >= 0) memcpy(s->scratch, r->logits, sizeof(float) * (size_t)s->vocab);
    t->id = kiln_sampler_sample(r->sampler, r->logits, r->tokens, r->n_tokens);
    if (k < 0) return;
    const float *x = s->scratch;
    float mx = -INFINITY;
    for (int i = 0; i < s->vocab; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < s->vocab; i++) sum += exp((double)(x[i] - mx));
    float lse = mx + (float)log(sum);
    if (t->id >= 0 && t->id < s->vocab) t->logprob = x[t->id] - lse;
    for (int i = 0; i < s->vocab; i++) { /* insertion into the top-k list, best first */
        if (t->n_top == k && (k == 0 || x[i] <= t->top_logprobs[k - 1] + lse)) continue;
        int j = t->n_top < k ? t->n_top++ : k - 1;
        while (j > 0 && t->top_logprobs[j - 1] + lse < x[i]) {
            t->top_ids[j] = t->top_ids[j - 1];
            t->top_logprobs[j] = t->top_logprobs[j - 1];
            j--;
        }
        t->top_ids[j] = i;
        t->top_logprobs[j] = x[i] - lse;
    }
}

/* ---- the engine thread -------------------------------------------------------------------- */

static void *engine_main(void *arg) {
    kiln_sched *s = arg;
    int cap = s->o.max_batch;
    kiln_batch_entry *e = calloc((size_t)cap, sizeof *e);
    kiln_sched_req **er = calloc((size_t)cap, sizeof *er);
    kiln_sched_token *tok = calloc((size_t)cap, sizeof *tok);
    kiln_sample_request *pick = calloc((size_t)cap, sizeof *pick);
    if (!e || !er || !tok || !pick) {
        free(e), free(er), free(tok), free(pick);
        return NULL;
    }
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        for (int i = s->n_run - 1; i >= 0; i--)
            if (s->run[i]->cancel) retire(s, i, KILN_FINISH_CANCELLED, NULL);
        admit(s);
        if (s->n_run == 0) {
            pthread_cond_broadcast(&s->out);
            pthread_cond_wait(&s->wake, &s->mu);
            continue;
        }
        /* Build the step: decode tokens first, then prefill chunks in admission order. */
        int n = 0, budget = s->o.step_tokens, n_gen = 0, n_prefill = 0;
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < s->n_run; i++) {
                kiln_sched_req *r = s->run[i];
                int pending = r->n_tokens - r->n_fed;
                bool decode = r->n_tokens > r->n_prompt;
                if (pending <= 0 || decode != (pass == 0) || budget <= 0) continue;
                int chunk = pending < budget ? pending : budget;
                if (s->snap_block > 0 && chunk > 1) { /* end on a boundary: a state snapshot */
                    const int B = s->snap_block, start = r->n_fed;
                    int end = start + chunk;
                    int cut = end < r->n_tokens ? end / B * B : (r->n_tokens - 1) / B * B;
                    if (cut > start && cut < end) chunk = cut - start;
                }
                budget -= chunk;
                e[n] = (kiln_batch_entry){r->seq, r->tokens + r->n_fed, chunk,
                                          chunk == pending ? KILN_LOGITS_LAST : KILN_LOGITS_NONE,
                                          chunk == pending ? r->logits : NULL};
                pick[n] = (kiln_sample_request){0};
                if (chunk == pending && r->top_logprobs < 0 && r->sampler) {
                    /* the forward picks the token (on the GPU for cuda: only the id comes
                     * back); logprobs need the raw logits, so those requests sample here */
                    e[n].logits_out = NULL;
                    pick[n] = (kiln_sample_request){.sampler = r->sampler,
                                                    .history = r->tokens,
                                                    .n_history = r->n_tokens,
                                                    .token_out = &tok[n].id};
                }
                er[n++] = r;
                if (decode)
                    n_gen += chunk;
                else
                    n_prefill += chunk;
            }
        }
        pthread_mutex_unlock(&s->mu);

        kiln_status st = kiln_forward_sample(s->model, e, n, pick);
        char err[256] = "";
        if (st != KILN_OK) snprintf(err, sizeof err, "forward: %s", kiln_last_error());
        for (int i = 0; i < n && st == KILN_OK; i++) {
            er[i]->n_fed += e[i].n_tokens;
            if (e[i].logits == KILN_LOGITS_LAST) {
                if (pick[i].sampler) { /* picked by the forward into tok[i].id */
                    const int32_t id = tok[i].id;
                    memset(&tok[i], 0, sizeof tok[i]);
                    tok[i].id = id;
                } else {
                    sample_into(s, er[i], &tok[i]);
                }
                er[i]->tokens[er[i]->n_tokens++] = tok[i].id;
            }
        }

        pthread_mutex_lock(&s->mu);
        if (st == KILN_ERR_CACHE_FULL && s->pool && relieve_pool(s)) {
            pthread_cond_broadcast(&s->out);
            continue; /* nothing was fed: the step is rebuilt without the preempted request */
        }
        s->totals.steps_total++;
        s->ring[s->ring_pos] = (step_rec){now_s(), 0, n_prefill};
        for (int i = 0; i < n; i++) {
            kiln_sched_req *r = er[i];
            int slot = 0;
            while (slot < s->n_run && s->run[slot] != r) slot++;
            if (st != KILN_OK) {
                retire(s, slot, KILN_FINISH_ERROR, err);
                continue;
            }
            if (e[i].logits != KILN_LOGITS_LAST) continue;
            publish(s, r, &tok[i]);
            r->st.n_generated++;
            s->totals.generated_tokens_total++;
            s->ring[s->ring_pos].n_gen++;
            bool stop = false;
            for (int j = 0; j < r->n_stop; j++) stop |= r->stop_ids[j] == tok[i].id;
            if (stop)
                retire(s, slot, KILN_FINISH_STOP, NULL);
            else if (r->st.n_generated >= r->max_tokens || r->n_tokens >= r->cap_tokens)
                retire(s, slot, KILN_FINISH_LENGTH, NULL);
        }
        (void)n_gen;
        s->ring_pos = (s->ring_pos + 1) % STEP_RING;
        if (s->ring_n < STEP_RING) s->ring_n++;
        pthread_cond_broadcast(&s->out);
    }
    pthread_mutex_unlock(&s->mu);
    free(e), free(er), free(tok), free(pick);
    return NULL;
}

/* ---- public API --------------------------------------------------------------------------- */

kiln_status kiln_sched_new(kiln_model *model, const kiln_sched_options *o, kiln_sched **out) {
    *out = NULL;
    const kiln_model_info *info = kiln_model_get_info(model);
    if (!info) return kiln_error(KILN_ERR_INVALID_ARG, "scheduler: model has no info");
    kiln_sched *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OOM, "scheduler");
    s->model = model;
    s->o = *o;
    s->vocab = info->vocab_size;
    if (s->o.max_batch <= 0) s->o.max_batch = 8;
    if (s->o.ctx <= 0) s->o.ctx = info->max_position > 0 ? info->max_position : 4096;
    if (s->o.step_tokens < s->o.max_batch) s->o.step_tokens = s->o.max_batch;
    if (s->o.max_waiting <= 0) s->o.max_waiting = 256;
    if (s->o.cache_entries < 0)
        s->o.cache_entries = 0;
    else if (s->o.cache_entries == 0)
        s->o.cache_entries = s->o.max_batch;
    if (s->o.kv_tokens <= 0) s->o.kv_tokens = (int64_t)s->o.max_batch * s->o.ctx;
    s->totals.kv_bytes_per_token = info->kv_bytes_per_token;
    s->run = calloc((size_t)s->o.max_batch, sizeof *s->run);
    s->kept = calloc((size_t)(s->o.cache_entries + 1), sizeof *s->kept);
    s->scratch = malloc(sizeof(float) * (size_t)s->vocab);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->out, &ca);
    pthread_condattr_destroy(&ca);
    if (!s->run || !s->kept || !s->scratch) {
        kiln_sched_free(s);
        return kiln_error(KILN_ERR_OOM, "scheduler buffers");
    }
    kiln_seq *probe = NULL; /* which kind of cache do this model's sequences get? */
    if (kiln_seq_new(model, &probe) == KILN_OK) {
        s->pool = kv_paged_pool(probe->kv);
        kiln_seq_free(probe);
    }
    if (s->pool && s->pool->n_attn_layers > 0) {
        int64_t cap = (int64_t)s->pool->n_blocks / s->pool->n_attn_layers * s->pool->block_tokens;
        if (o->kv_tokens <= 0) s->o.kv_tokens = cap; /* the pool is the budget */
        s->totals.kv_pool_blocks = s->pool->n_blocks;
    }
    if (s->pool && s->pool->snap_floats > 0 && s->pool->prefix_ok)
        s->snap_block = s->pool->block_tokens;
    if (pthread_create(&s->thread, NULL, engine_main, s) != 0) {
        kiln_sched_free(s);
        return kiln_error(KILN_ERR_INTERNAL, "scheduler: cannot start the engine thread");
    }
    s->thread_started = true;
    *out = s;
    return KILN_OK;
}

void kiln_sched_free(kiln_sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->wake);
    pthread_mutex_unlock(&s->mu);
    if (s->thread_started) pthread_join(s->thread, NULL);
    while (s->n_run > 0) retire(s, s->n_run - 1, KILN_FINISH_CANCELLED, NULL);
    while (s->wait_head) {
        kiln_sched_req *r = s->wait_head;
        s->wait_head = r->next;
        finish_waiting(s, r, KILN_FINISH_CANCELLED);
    }
    while (s->n_kept > 0) kept_drop(s, s->n_kept - 1);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->wake);
    pthread_cond_destroy(&s->out);
    free(s->run);
    free(s->kept);
    free(s->scratch);
    free(s);
}

kiln_status kiln_sched_submit(kiln_sched *s, const kiln_sched_params *p, kiln_sched_req **out) {
    *out = NULL;
    if (p->n_prompt <= 0) return kiln_error(KILN_ERR_INVALID_ARG, "the prompt is empty");
    if (p->max_tokens < 1) return kiln_error(KILN_ERR_INVALID_ARG, "max_tokens must be at least 1");
    if ((int64_t)p->n_prompt + p->max_tokens > s->o.ctx)
        return kiln_error(KILN_ERR_INVALID_ARG,
                          "this model's maximum context length is %d tokens; the request has %d "
                          "prompt tokens + max_tokens %d",
                          s->o.ctx, p->n_prompt, p->max_tokens);
    if ((int64_t)p->n_prompt + p->max_tokens > s->o.kv_tokens)
        return kiln_error(KILN_ERR_INVALID_ARG,
                          "the KV cache budget is %lld tokens; the request needs %d",
                          (long long)s->o.kv_tokens, p->n_prompt + p->max_tokens);
    if (p->top_logprobs > KILN_SCHED_MAX_TOP)
        return kiln_error(KILN_ERR_INVALID_ARG, "top_logprobs must be at most %d",
                          KILN_SCHED_MAX_TOP);
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= s->vocab)
            return kiln_error(KILN_ERR_INVALID_ARG,
                              "prompt token %d (id %d) is outside the vocabulary [0, %d)", i,
                              p->prompt[i], s->vocab);
    kiln_sched_req *r = calloc(1, sizeof *r);
    if (!r) return kiln_error(KILN_ERR_OOM, "request");
    r->cap_tokens = p->n_prompt + p->max_tokens;
    r->tokens = malloc(sizeof(int32_t) * (size_t)r->cap_tokens);
    r->stop_ids = malloc(sizeof(int32_t) * (size_t)(p->n_stop_ids + 1));
    if (!r->tokens || !r->stop_ids) {
        req_free(r);
        return kiln_error(KILN_ERR_OOM, "request");
    }
    memcpy(r->tokens, p->prompt, sizeof(int32_t) * (size_t)p->n_prompt);
    if (p->n_stop_ids > 0)
        memcpy(r->stop_ids, p->stop_ids, sizeof(int32_t) * (size_t)p->n_stop_ids);
    r->n_stop = p->n_stop_ids;
    r->n_tokens = r->n_prompt = p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->sp = p->sampling;
    r->top_logprobs = p->top_logprobs;
    r->reserve = (int64_t)p->n_prompt + p->max_tokens;
    pthread_mutex_lock(&s->mu);
    if (s->draining || s->stop) {
        pthread_mutex_unlock(&s->mu);
        req_free(r);
        return kiln_error(KILN_ERR_CANCELLED, "the server is shutting down");
    }
    if (s->n_waiting >= s->o.max_waiting) {
        pthread_mutex_unlock(&s->mu);
        req_free(r);
        return kiln_error(KILN_ERR_CACHE_FULL, "the server is overloaded: %d requests are waiting",
                          s->o.max_waiting);
    }
    if (s->wait_tail)
        s->wait_tail->next = r;
    else
        s->wait_head = r;
    s->wait_tail = r;
    s->n_waiting++;
    s->totals.requests_total++;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    *out = r;
    return KILN_OK;
}

int kiln_sched_take(kiln_sched *s, kiln_sched_req *r, kiln_sched_token *out, int cap,
                    kiln_sched_state *st) {
    pthread_mutex_lock(&s->mu);
    int n = r->n_out - r->out_head;
    if (n > cap) n = cap;
    if (n > 0) memcpy(out, r->out + r->out_head, sizeof *out * (size_t)n);
    r->out_head += n;
    if (st) {
        *st = r->st;
        if (r->out_head < r->n_out) st->finish = KILN_FINISH_NONE; /* more to deliver first */
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

void kiln_sched_wait(kiln_sched *s, kiln_sched_req *const *reqs, int n, int timeout_ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        bool ready = false;
        for (int i = 0; i < n && !ready; i++)
            ready = reqs[i] && (reqs[i]->out_head < reqs[i]->n_out || reqs[i]->engine_done);
        if (ready || pthread_cond_timedwait(&s->out, &s->mu, &ts) == ETIMEDOUT) break;
    }
    pthread_mutex_unlock(&s->mu);
}

void kiln_sched_cancel(kiln_sched *s, kiln_sched_req *r) {
    if (!r) return;
    pthread_mutex_lock(&s->mu);
    r->cancel = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
}

void kiln_sched_release(kiln_sched *s, kiln_sched_req *r) {
    if (!r) return;
    pthread_mutex_lock(&s->mu);
    r->cancel = true;
    r->released = true;
    bool free_now = r->engine_done;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    if (free_now) req_free(r);
}

void kiln_sched_get_stats(kiln_sched *s, kiln_sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->totals;
    out->running = s->n_run;
    out->waiting = s->n_waiting;
    out->prefilling = 0;
    int64_t used = 0;
    for (int i = 0; i < s->n_run; i++) {
        used += s->run[i]->n_fed;
        if (s->run[i]->n_tokens <= s->run[i]->n_prompt) out->prefilling++;
    }
    out->cached_seqs = s->n_kept;
    out->kv_tokens_used = used + s->kept_tokens;
    out->kv_tokens_reserved = s->reserved;
    out->kv_tokens_budget = s->o.kv_tokens;
    out->live_seqs = s->n_run + s->n_kept;
    out->max_batch = s->o.max_batch;
    out->ctx = s->o.ctx;
    if (s->pool) {
        pthread_mutex_lock(&s->pool->mu);
        out->kv_pool_free_blocks = s->pool->n_free;
        pthread_mutex_unlock(&s->pool->mu);
        out->kv_pool_prefix_blocks = kv_prefix_count(s->pool);
    }
    /* rates over the last 5 seconds of steps */
    double t_now = now_s(), t0 = t_now, gen = 0, pre = 0;
    for (int i = 0; i < s->ring_n; i++) {
        const step_rec *r = &s->ring[(s->ring_pos - 1 - i + STEP_RING) % STEP_RING];
        if (r->t < t_now - 5.0) break;
        gen += r->n_gen;
        pre += r->n_prefill;
        t0 = r->t;
    }
    double span = t_now - t0;
    if (span < 1.0) span = 1.0;
    out->decode_tok_per_s = gen / span;
    out->prefill_tok_per_s = pre / span;
    pthread_mutex_unlock(&s->mu);
}

int kiln_sched_drain(kiln_sched *s, int timeout_ms) {
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    pthread_mutex_unlock(&s->mu);
    double deadline = now_s() + timeout_ms / 1000.0;
    int cancelled = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        bool idle = s->n_run == 0 && s->n_waiting == 0;
        if (!idle && now_s() >= deadline && cancelled == 0) {
            for (int i = 0; i < s->n_run; i++) s->run[i]->cancel = true, cancelled++;
            for (kiln_sched_req *r = s->wait_head; r; r = r->next) r->cancel = true, cancelled++;
            pthread_cond_signal(&s->wake);
        }
        pthread_mutex_unlock(&s->mu);
        if (idle) break;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return cancelled;
}
