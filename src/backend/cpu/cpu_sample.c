/* cpu_sample.c — the plain-C reference of the `sample` op (backend.h): the token choice of
 * kiln_sampler_sample (src/engine/sampler.c) written against one kiln_sample_row, with the uniform
 * number u passed in instead of drawn. Every step uses the sampler's arithmetic in its order, so
 * the choice is bit-for-bit the sampler's (tests/test_sampler.c checks it); the CUDA kernel
 * (cuda/sampling.cu) follows the same steps. */
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <stdlib.h>

typedef struct sample_candidate {
    float p;
    int32_t id;
} sample_candidate;

/* Higher probability first; equal probabilities by lower id (the sampler's qsort order). */
static int candidate_order(const void *a, const void *b) {
    const sample_candidate *x = a, *y = b;
    if (x->p > y->p) return -1;
    if (x->p < y->p) return 1;
    return x->id - y->id;
}

/* HF repetition penalty, then OpenAI frequency / presence, once per distinct token of the window
 * with its count in the window. counts: [vocab] zeros, left zeroed. */
static void penalize(float *logits, int64_t vocab, const kiln_sample_row *row,
                     const int32_t *window, int32_t *counts) {
    for (int i = 0; i < row->n_history; i++)
        if (window[i] >= 0 && window[i] < vocab) counts[window[i]]++;
    for (int i = 0; i < row->n_history; i++) {
        int32_t id = window[i];
        if (id < 0 || id >= vocab || counts[id] == 0) continue;
        float l = logits[id];
        if (row->repetition_penalty != 1.0f)
            l = l > 0 ? l / row->repetition_penalty : l * row->repetition_penalty;
        l -= row->frequency_penalty * (float)counts[id] + row->presence_penalty;
        logits[id] = l;
        counts[id] = 0;
    }
}

static int32_t sample_one(float *logits, int64_t vocab, const kiln_sample_row *row,
                          sample_candidate *cand) {
    const int V = (int)vocab;
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (row->temperature <= 0.0f || row->top_k == 1) return best;

    const float inv_t = row->inv_temperature, mx = logits[best] * inv_t;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        float e = isfinite(logits[i]) || logits[i] > 0 ? expf(logits[i] * inv_t - mx) : 0.0f;
        cand[i] = (sample_candidate){e, i};
        sum += e;
    }
    int n = V;
    bool sorted = false;
    if (row->top_k > 0 && row->top_k < n) {
        qsort(cand, (size_t)n, sizeof *cand, candidate_order);
        sorted = true;
        n = row->top_k;
        sum = 0;
        for (int i = 0; i < n; i++) sum += cand[i].p;
    }
    if (row->top_p < 1.0f) {
        if (!sorted) qsort(cand, (size_t)n, sizeof *cand, candidate_order);
        double acc = 0, target = row->top_p * sum;
        int keep = n;
        for (int i = 0; i < n; i++) {
            acc += cand[i].p;
            if (acc >= target) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = acc;
    }
    if (row->min_p > 0.0f) {
        float maxp = 0;
        for (int i = 0; i < n; i++) maxp = cand[i].p > maxp ? cand[i].p : maxp;
        const float thr = row->min_p * maxp;
        int kept = 0;
        sum = 0;
        for (int i = 0; i < n; i++)
            if (cand[i].p >= thr) {
                cand[kept++] = cand[i];
                sum += cand[i].p;
            }
        n = kept;
    }
    const double r = row->u * sum;
    double acc = 0;
    for (int i = 0; i < n; i++) {
        acc += cand[i].p;
        if (r < acc) return cand[i].id;
    }
    return n > 0 ? cand[n - 1].id : best;
}

void kiln_cpu_sample_ref(int32_t *ids, float *logits, int64_t vocab, int n_rows,
                         const kiln_sample_row *rows, const int32_t *history) {
    sample_candidate *cand = malloc((size_t)vocab * sizeof *cand);
    int32_t *counts = calloc((size_t)vocab, sizeof *counts);
    for (int r = 0; r < n_rows; r++) {
        float *row_logits = logits + rows[r].logits_row * vocab;
        if (rows[r].n_history > 0 && counts)
            penalize(row_logits, vocab, &rows[r], history + rows[r].history_offset, counts);
        /* without memory for the candidates only greedy rows can be served: argmax */
        kiln_sample_row greedy = rows[r];
        greedy.temperature = 0.0f;
        ids[r] = sample_one(row_logits, vocab, cand ? &rows[r] : &greedy, cand);
    }
    free(cand);
    free(counts);
}
