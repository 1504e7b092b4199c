/* test_sampler.c — the sampler against its definitions: greedy is argmax; the same seed gives
 * the same draws; top-k / top-p / min-p keep exactly the tokens their definitions keep; draws
 * follow softmax(logits / T) (chi-square check); penalties follow the HF / OpenAI formulas; bad
 * parameters are rejected. */
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

int main(void) {
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
