/* test_sampler.c — the sampler against its definitions: greedy is argmax; the same seed gives
 * the same draws; top-k / top-p / min-p keep exactly the tokens their definitions keep; draws
 * follow softmax(logits / T) (chi-square check); penalties follow the HF / OpenAI formulas; bad
 * parameters are rejected. Then the `sample` op's CPU reference (kiln_cpu_sample_ref, fed with
 * kiln_sampler_fill_row's rows and uniform draws) against kiln_sampler_sample over thousands of
 * random logits, parameters, histories and seeds: the same ids and the same penalized logits,
 * exactly, and the generators of the two samplers stay in step. */
#include "backend/cpu/cpu_ops.h"
#include "engine/sampler_rows.h"
#include "kiln.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int32_t draw(kiln_sampler *s, const float *logits, int V) {
    float buf[64];
    memcpy(buf, logits, (size_t)V * sizeof(float));
    return kiln_sampler_sample(s, buf, NULL, 0);
}

/* Random logits: normal, or quantized to 1/8 (many exact ties), with some -inf and a few +-large
 * values. */
static void random_logits(float *x, int V, uint64_t *rng) {
    const int kind = (int)(test_rand_u64(rng) % 3);
    const float scale = test_rand_uniform(rng, 0.5f, 8.0f);
    for (int i = 0; i < V; i++) {
        float v = scale * test_rand_normal(rng);
        if (kind == 1) v = floorf(v * 8.0f) / 8.0f;
        if (kind == 2 && test_rand_u64(rng) % 16 == 0) v = -INFINITY;
        x[i] = v;
    }
    if (V > 1 && test_rand_u64(rng) % 4 == 0) x[test_rand_u64(rng) % (uint64_t)V] = x[0]; /* tie */
}

static void random_params(kiln_sampler_params *p, int V, uint64_t *rng) {
    static const float temps[] = {0.0f, 0.25f, 0.7f, 1.0f, 1.6f};
    static const float top_ps[] = {1.0f, 1.0f, 0.95f, 0.6f, 0.1f};
    static const float min_ps[] = {0.0f, 0.0f, 0.02f, 0.2f, 1.0f};
    static const float reps[] = {1.0f, 1.0f, 1.3f, 0.8f};
    kiln_sampler_params_default(p);
    p->temperature = temps[test_rand_u64(rng) % 5];
    const int k_kind = (int)(test_rand_u64(rng) % 6);
    p->top_k = k_kind == 0   ? 0
               : k_kind == 1 ? 1
               : k_kind == 2 ? V
               : k_kind == 3 ? V + 5
                             : (int)(test_rand_u64(rng) % (uint64_t)(V + 1));
    p->top_p = top_ps[test_rand_u64(rng) % 5];
    p->min_p = min_ps[test_rand_u64(rng) % 5];
    p->repetition_penalty = reps[test_rand_u64(rng) % 4];
    p->presence_penalty = test_rand_u64(rng) % 2 ? 0.0f : 0.5f;
    p->frequency_penalty = test_rand_u64(rng) % 2 ? 0.0f : 0.3f;
    p->penalty_last_n = (int)(test_rand_u64(rng) % 3) * 7;
    p->seed = test_rand_u64(rng);
}

/* The reference op fed by a second sampler of the same parameters gives kiln_sampler_sample's
 * ids and penalized logits, call after call. */
static void check_reference_op(void) {
    static const int vocabs[] = {1, 2, 7, 64, 1000, 4099};
    uint64_t rng = 0x5a3b1e;
    int n_cases = 0, n_sampled = 0;
    for (int trial = 0; trial < 600; trial++) {
        const int V = vocabs[trial % 6];
        kiln_sampler_params p;
        random_params(&p, V, &rng);
        kiln_sampler *a = NULL, *b = NULL;
        CHECK_OK(kiln_sampler_new(&p, V, &a));
        CHECK_OK(kiln_sampler_new(&p, V, &b));
        float *logits = malloc((size_t)V * sizeof(float)), *xa = malloc((size_t)V * sizeof(float)),
              *xb = malloc((size_t)V * sizeof(float));
        int32_t hist[80];
        const int n_hist = (int)(test_rand_u64(&rng) % 80);
        for (int i = 0; i < n_hist; i++) /* repeats, and a few ids outside the vocabulary */
            hist[i] = test_rand_u64(&rng) % 20 == 0 ? -3 - (int)(test_rand_u64(&rng) % 2) * V
                                                    : (int32_t)(test_rand_u64(&rng) % (uint64_t)V);
        for (int step = 0; step < 6; step++) {
            random_logits(logits, V, &rng);
            memcpy(xa, logits, (size_t)V * sizeof(float));
            memcpy(xb, logits, (size_t)V * sizeof(float));
            const int32_t want = kiln_sampler_sample(a, xa, hist, n_hist);
            kiln_sample_row row;
            const int start = kiln_sampler_fill_row(b, n_hist, 0, &row);
            int32_t got = -1;
            kiln_cpu_sample_ref(&got, xb, V, 1, &row, hist + start);
            CHECK_MSG(got == want,
                      "trial %d step %d (V %d, T %g, k %d, p %g, min_p %g): op %d, sampler %d",
                      trial, step, V, p.temperature, p.top_k, p.top_p, p.min_p, got, want);
            CHECK_MSG(memcmp(xa, xb, (size_t)V * sizeof(float)) == 0,
                      "trial %d: penalized logits differ", trial);
            n_cases++;
            n_sampled += !(p.temperature <= 0.0f || p.top_k == 1);
        }
        /* both generators advanced alike: their next draws agree */
        CHECK(kiln_sampler_draw_uniform(a) == kiln_sampler_draw_uniform(b));
        kiln_sampler_free(a);
        kiln_sampler_free(b);
        free(logits), free(xa), free(xb);
    }
    CHECK(n_sampled > n_cases / 3);
}

int main(void) {
    check_reference_op();
    enum { V = 8 };
    const float logits[V] = {1.0f, 3.0f, 2.5f, -1.0f, 0.0f, 2.0f, -INFINITY, 0.5f};
    kiln_sampler_params p;
    kiln_sampler *s = NULL;

    /* greedy */
    kiln_sampler_params_default(&p);
    CHECK_OK(kiln_sampler_new(&p, V, &s));
    CHECK(draw(s, logits, V) == 1);
    kiln_sampler_free(s);

    /* same seed, same sequence; different seed, different sequence */
    int32_t a[200], b[200], c[200];
    p.temperature = 1.0f;
    p.seed = 42;
    CHECK_OK(kiln_sampler_new(&p, V, &s));
    for (int i = 0; i < 200; i++) a[i] = draw(s, logits, V);
    kiln_sampler_free(s);
    CHECK_OK(kiln_sampler_new(&p, V, &s));
    for (int i = 0; i < 200; i++) b[i] = draw(s, logits, V);
    kiln_sampler_free(s);
    p.seed = 43;
    CHECK_OK(kiln_sampler_new(&p, V, &s));
    for (int i = 0; i < 200; i++) c[i] = draw(s, logits, V);
    kiln_sampler_free(s);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);

    /* distribution at T = 0.7 matches softmax(logits / T): chi-square with 6 dof < 30 */
    p.temperature = 0.7f;
    p.seed = 7;
    CHECK_OK(kiln_sampler_new(&p, V, &s));
    int counts[V] = {0};
    const int N = 40000;
    for (int i = 0; i < N; i++) counts[draw(s, logits, V)]++;
    kiln_sampler_free(s);
    double z = 0, prob[V];
    for (int i = 0; i < V; i++) z += (prob[i] = isinf(logits[i]) ? 0 : exp(logits[i] / 0.7));
    double chi2 = 0;
    for (int i = 0; i < V; i++) {
        prob[i] /= z;
        if (prob[i] > 0) chi2 += pow(counts[i] - N * prob[i], 2) / (N * prob[i]);
    }
    CHECK_MSG(chi2 < 30, "chi-square %.1f", chi2);
    CHECK(counts[6] == 0); /* -inf never drawn */

    /* top-k = 2 keeps tokens 1 and 2 only */
    p.temperature = 1.0f;
    p.top_k = 2;
    CHECK_OK(kiln_sampler_new(&p, V, &s));
    bool only12 = true, saw1 = false, saw2 = false;
    for (int i = 0; i < 2000; i++) {
        int32_t t = draw(s, logits, V);
        only12 &= t == 1 || t == 2;
        saw1 |= t == 1;
        saw2 |= t == 2;
    }
    CHECK(only12 && saw1 && saw2);
    kiln_sampler_free(s);

    /* top-p: softmax(1, 3, 2.5, ...) has p(1) ~ 0.40, p(2) ~ 0.24; top_p 0.5 keeps {1, 2} */
    p.top_k = 0;
    p.top_p = 0.5f;
    CHECK_OK(kiln_sampler_new(&p, V, &s));
    only12 = true;
    for (int i = 0; i < 2000; i++) {
        int32_t t = draw(s, logits, V);
        only12 &= t == 1 || t == 2;
    }
    CHECK(only12);
    kiln_sampler_free(s);

    /* min-p 0.5: keeps tokens with p >= 0.5 * p_max: exp(2.5-3)=0.61 yes, exp(2-3)=0.37 no */
    p.top_p = 1.0f;
    p.min_p = 0.5f;
    CHECK_OK(kiln_sampler_new(&p, V, &s));
    only12 = true;
    for (int i = 0; i < 2000; i++) {
        int32_t t = draw(s, logits, V);
        only12 &= t == 1 || t == 2;
    }
    CHECK(only12);
    kiln_sampler_free(s);

    /* penalties, applied to the logits in place (greedy so nothing else changes them) */
    kiln_sampler_params_default(&p);
    p.repetition_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    CHECK_OK(kiln_sampler_new(&p, V, &s));
    float buf[V];
    memcpy(buf, logits, sizeof buf);
    const int32_t hist[] = {1, 1, 3, 1};
    int32_t t = kiln_sampler_sample(s, buf, hist, 4);
    /* token 1: 3/2 - 3*0.25 - 0.5 = 0.25; token 3: -1*2 - 0.25 - 0.5 = -2.75 */
    CHECK(fabsf(buf[1] - 0.25f) < 1e-6f);
    CHECK(fabsf(buf[3] + 2.75f) < 1e-6f);
    CHECK(buf[2] == 2.5f && t == 2);
    kiln_sampler_free(s);

    /* penalty window: only the last 1 token counts */
    p.penalty_last_n = 1;
    CHECK_OK(kiln_sampler_new(&p, V, &s));
    memcpy(buf, logits, sizeof buf);
    const int32_t hist2[] = {1, 3};
    kiln_sampler_sample(s, buf, hist2, 2);
    CHECK(buf[1] == 3.0f);
    kiln_sampler_free(s);

    /* bad parameters */
    kiln_sampler_params_default(&p);
    p.temperature = -1;
    CHECK_ERR(kiln_sampler_new(&p, V, &s), KILN_ERR_INVALID_ARG, "temperature");
    kiln_sampler_params_default(&p);
    p.top_p = 0;
    CHECK_ERR(kiln_sampler_new(&p, V, &s), KILN_ERR_INVALID_ARG, "top_p");
    kiln_sampler_params_default(&p);
    p.temperature = NAN;
    CHECK_ERR(kiln_sampler_new(&p, V, &s), KILN_ERR_INVALID_ARG, NULL);
    kiln_sampler_params_default(&p);
    CHECK_ERR(kiln_sampler_new(&p, 0, &s), KILN_ERR_INVALID_ARG, NULL);
    return test_finish();
}
