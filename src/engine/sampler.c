/* sampler.c — choosing the next token from logits: repetition / presence / frequency penalties,
 * then greedy (temperature 0) or temperature -> top-k -> top-p -> min-p -> a draw from a seeded
 * generator (splitmix64 + xoshiro256**), so the same seed gives the same tokens. */
#include "kiln.h"

#include "engine/sampler_rows.h"
#include "util/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct candidate {
    float p;
    int32_t id;
} candidate;

struct kiln_sampler {
    kiln_sampler_params p;
    int vocab;
    uint64_t rng[4];
    candidate *cand; /* [vocab] */
    int32_t *counts; /* [vocab] occurrences in the penalty window */
};

void kiln_sampler_params_default(kiln_sampler_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 0.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
    p->seed = 0;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t *s) {
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

kiln_status kiln_sampler_new(const kiln_sampler_params *p, int vocab, kiln_sampler **out) {
    if (!p || !out || vocab <= 0)
        return kiln_error(KILN_ERR_INVALID_ARG, "kiln_sampler_new: bad arguments");
    *out = NULL;
    if (!(p->temperature >= 0) || !(p->top_p > 0 && p->top_p <= 1) ||
        !(p->min_p >= 0 && p->min_p <= 1) || p->top_k < 0 || !(p->repetition_penalty > 0) ||
        p->penalty_last_n < 0 || !isfinite(p->presence_penalty) ||
        !isfinite(p->frequency_penalty) || !isfinite(p->temperature))
        return kiln_error(KILN_ERR_INVALID_ARG,
                          "sampler: temperature must be >= 0, top_p in (0, 1], min_p in [0, 1], "
                          "top_k >= 0, repetition_penalty > 0");
    kiln_sampler *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OOM, "out of memory");
    s->p = *p;
    s->vocab = vocab;
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    s->counts = calloc((size_t)vocab, sizeof *s->counts);
    if (!s->cand || !s->counts) {
        kiln_sampler_free(s);
        return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    *out = s;
    return KILN_OK;
}

void kiln_sampler_free(kiln_sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->counts);
    free(s);
}

const kiln_sampler_params *kiln_sampler_get_params(const kiln_sampler *s) {
    return s ? &s->p : NULL;
}

int kiln_sampler_vocab(const kiln_sampler *s) {
    return s ? s->vocab : 0;
}

/* The sampler draws only when it samples: greedy settings return the argmax before drawing. */
static bool sampler_draws(const kiln_sampler *s) {
    return !(s->p.temperature <= 0.0f || s->p.top_k == 1);
}

static double next_uniform(kiln_sampler *s) {
    return (double)(xoshiro_next(s->rng) >> 11) / 9007199254740992.0;
}

double kiln_sampler_draw_uniform(kiln_sampler *s) {
    return s && sampler_draws(s) ? next_uniform(s) : 0.0;
}

static bool penalties_on(const kiln_sampler_params *p) {
    return !(p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f &&
             p->frequency_penalty == 0.0f);
}

/* First history index inside the penalty window (penalty_last_n most recent tokens, 0 = all). */
static int penalty_window_start(const kiln_sampler_params *p, int n_hist) {
    return p->penalty_last_n > 0 && n_hist > p->penalty_last_n ? n_hist - p->penalty_last_n : 0;
}

int kiln_sampler_fill_row(kiln_sampler *s, int n_hist, int64_t logits_row, kiln_sample_row *row) {
    const kiln_sampler_params *p = &s->p;
    const int start = penalties_on(p) ? penalty_window_start(p, n_hist) : n_hist;
    *row =
        (kiln_sample_row){.logits_row = logits_row,
                          .temperature = p->temperature,
                          .inv_temperature = p->temperature > 0.0f ? 1.0f / p->temperature : 0.0f,
                          .top_k = p->top_k,
                          .top_p = p->top_p,
                          .min_p = p->min_p,
                          .repetition_penalty = p->repetition_penalty,
                          .presence_penalty = p->presence_penalty,
                          .frequency_penalty = p->frequency_penalty,
                          .n_history = n_hist - start,
                          .u = kiln_sampler_draw_uniform(s)};
    return start;
}

static void apply_penalties(kiln_sampler *s, float *logits, const int32_t *hist, int n_hist) {
    const kiln_sampler_params *p = &s->p;
    if (!penalties_on(p)) return;
    int start = penalty_window_start(p, n_hist);
    for (int i = start; i < n_hist; i++)
        if (hist[i] >= 0 && hist[i] < s->vocab) s->counts[hist[i]]++;
    for (int i = start; i < n_hist; i++) {
        int32_t id = hist[i];
        if (id < 0 || id >= s->vocab || s->counts[id] == 0) continue;
        float l = logits[id];
        if (p->repetition_penalty != 1.0f)
            l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
        l -= p->frequency_penalty * (float)s->counts[id] + p->presence_penalty;
        logits[id] = l;
        s->counts[id] = 0; /* each distinct token once; also resets for the next call */
    }
}

static int cmp_desc(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->p > y->p) return -1;
    if (x->p < y->p) return 1;
    return x->id - y->id;
}

int32_t kiln_sampler_sample(kiln_sampler *s, float *logits, const int32_t *hist, int n_hist) {
    apply_penalties(s, logits, hist, n_hist);
    int V = s->vocab;
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (s->p.temperature <= 0.0f || s->p.top_k == 1) return best;

    float inv_t = 1.0f / s->p.temperature, mx = logits[best] * inv_t;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        float e = isfinite(logits[i]) || logits[i] > 0 ? expf(logits[i] * inv_t - mx) : 0.0f;
        s->cand[i] = (candidate){e, i};
        sum += e;
    }
    int n = V;
    bool sorted = false;
    if (s->p.top_k > 0 && s->p.top_k < n) {
        qsort(s->cand, (size_t)n, sizeof *s->cand, cmp_desc);
        sorted = true;
        n = s->p.top_k;
        sum = 0;
        for (int i = 0; i < n; i++) sum += s->cand[i].p;
    }
    if (s->p.top_p < 1.0f) {
        if (!sorted) qsort(s->cand, (size_t)n, sizeof *s->cand, cmp_desc);
        sorted = true;
        double acc = 0, target = s->p.top_p * sum;
        int keep = n;
        for (int i = 0; i < n; i++) {
            acc += s->cand[i].p;
            if (acc >= target) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = acc;
    }
    if (s->p.min_p > 0.0f) {
        float maxp = 0;
        for (int i = 0; i < n; i++) maxp = s->cand[i].p > maxp ? s->cand[i].p : maxp;
        float thr = s->p.min_p * maxp;
        int k = 0;
        sum = 0;
        for (int i = 0; i < n; i++)
            if (s->cand[i].p >= thr) {
                s->cand[k++] = s->cand[i];
                sum += s->cand[i].p;
            }
        n = k;
    }
    double r = next_uniform(s) * sum;
    double acc = 0;
    for (int i = 0; i < n; i++) {
        acc += s->cand[i].p;
        if (r < acc) return s->cand[i].id;
    }
    return n > 0 ? s->cand[n - 1].id : best;
}
