/* fixture_parity.c — implementation of fixture_parity_check (see fixture_parity.h). */
#include "fixture_parity.h"

#include "test_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct reference {
    int32_t *input;
    int n_input;
    int32_t *greedy;
    int n_greedy;
    float *logits; /* [n_input, vocab] */
} reference;

int32_t *fixture_json_ids(const cJSON *arr, int *n) {
    *n = cJSON_GetArraySize(arr);
    int32_t *ids = malloc((size_t)(*n > 0 ? *n : 1) * sizeof *ids);
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valuedouble;
    return ids;
}

static bool load_reference(const char *dir, int vocab, reference *r) {
    char path[4200];
    snprintf(path, sizeof path, "%s/reference.json", dir);
    char *text = test_read_file(path, NULL);
    if (!text) return false;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) return false;
    r->input = fixture_json_ids(cJSON_GetObjectItem(j, "input_ids"), &r->n_input);
    r->greedy = fixture_json_ids(cJSON_GetObjectItem(j, "greedy_continuation"), &r->n_greedy);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/logits.f32", dir);
    size_t len;
    r->logits = (float *)test_read_file(path, &len);
    return r->logits && len == (size_t)r->n_input * vocab * sizeof(float);
}

static void free_reference(reference *r) {
    free(r->input);
    free(r->greedy);
    free(r->logits);
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy continuation vs transformers. At the first differing step, the reference's own logits
 * for that step are recomputed (a full forward on the reference's prefix) and the reference
 * token's lead over our pick is measured: with allow_near_tie (reduced-precision backends) a flip
 * within near_tie (default 2e-3) of the logit scale is reported as a near-tie; anything else
 * fails. */
static void report_greedy(const char *name, const char *how, const int32_t *gen,
                          const reference *ref, kiln_model *m, int V, bool allow_near_tie,
                          double tie) {
    int i = 0;
    while (i < ref->n_greedy && gen[i] == ref->greedy[i]) i++;
    if (i == ref->n_greedy) {
        CHECK(memcmp(gen, ref->greedy, (size_t)i * sizeof *gen) == 0);
        fprintf(stderr, "%-18s %-12s greedy: %d/%d identical\n", name, how, i, ref->n_greedy);
        return;
    }
    int n = ref->n_input + i;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    float *row = malloc((size_t)V * sizeof(float));
    memcpy(ids, ref->input, (size_t)ref->n_input * sizeof *ids);
    memcpy(ids + ref->n_input, ref->greedy, (size_t)i * sizeof *ids);
    kiln_seq *s = NULL;
    CHECK_OK(kiln_seq_new(m, &s));
    kiln_batch_entry e = {s, ids, n, KILN_LOGITS_LAST, row};
    CHECK_OK(kiln_forward(m, &e, 1));
    double scale = 0;
    for (int v = 0; v < V; v++) scale = fmax(scale, fabs(row[v]));
    double gap = fabs((double)row[gen[i]] - row[ref->greedy[i]]) / (scale > 0 ? scale : 1);
    bool near_tie = allow_near_tie && gap <= (tie > 0 ? tie : 2e-3);
    fprintf(stderr,
            "%-18s %-12s greedy: first difference at step %d/%d (ours %d, reference %d, "
            "logit gap %.2e of max |logit|): %s\n",
            name, how, i, ref->n_greedy, gen[i], ref->greedy[i], gap,
            near_tie ? "near-tie, allowed" : "FAIL");
    CHECK_MSG(near_tie, "%s: %s greedy continuation differs from transformers at step %d", name,
              how, i);
    kiln_seq_free(s);
    free(ids);
    free(row);
}

void fixture_parity_check(const char *name, const fixture_parity_opts *o) {
    char rel[256], fixture_dir[4000];
    snprintf(rel, sizeof rel, "fixtures/%s", name);
    snprintf(fixture_dir, sizeof fixture_dir, "%s", test_shared(rel));
    kiln_model *m = NULL;
    kiln_load_options lo;
    kiln_load_options_default(&lo);
    lo.device = o->device;
    CHECK_OK(kiln_model_load(fixture_dir, &lo, &m));
    if (!m) return;
    const kiln_model_info *info = kiln_model_get_info(m);
    const int V = info->vocab_size;
    reference ref = {0};
    CHECK_MSG(load_reference(fixture_dir, V, &ref), "%s: cannot read reference", name);
    if (!ref.logits) {
        kiln_model_free(m);
        free_reference(&ref);
        return;
    }
    const int T = ref.n_input;
    float *logits = malloc((size_t)(T + ref.n_greedy) * V * sizeof(float));

    /* 1. one full forward */
    kiln_seq *seq = NULL;
    CHECK_OK(kiln_seq_new(m, &seq));
    kiln_batch_entry e = {seq, ref.input, T, KILN_LOGITS_ALL, logits};
    CHECK_OK(kiln_forward(m, &e, 1));
    double err = test_rel_l2(logits, ref.logits, (size_t)T * V);
    CHECK_MSG(err <= o->tol, "%s: full forward rel L2 %.3g > %g", name, err, o->tol);
    fprintf(stderr, "%-18s full forward   rel L2 %.2e\n", name, err);
    float *alone = malloc((size_t)T * V * sizeof(float));
    memcpy(alone, logits, (size_t)T * V * sizeof(float));

    /* 2. token by token through the cache */
    CHECK_OK(kiln_seq_truncate(seq, 0));
    for (int t = 0; t < T; t++) {
        e = (kiln_batch_entry){seq, ref.input + t, 1, KILN_LOGITS_LAST, logits + (size_t)t * V};
        CHECK_OK(kiln_forward(m, &e, 1));
    }
    err = test_rel_l2(logits, ref.logits, (size_t)T * V);
    CHECK_MSG(err <= o->tol, "%s: stepwise rel L2 %.3g > %g", name, err, o->tol);
    fprintf(stderr, "%-18s token by token rel L2 %.2e\n", name, err);

    /* 3. greedy continuation through the cache (seq holds the prompt now) */
    int32_t *gen = calloc((size_t)ref.n_greedy + 1, sizeof *gen);
    int32_t next = argmax(logits + (size_t)(T - 1) * V, V);
    float *row = malloc((size_t)V * sizeof(float));
    for (int i = 0; i < ref.n_greedy; i++) {
        gen[i] = next;
        e = (kiln_batch_entry){seq, &next, 1, KILN_LOGITS_LAST, row};
        CHECK_OK(kiln_forward(m, &e, 1));
        next = argmax(row, V);
    }
    report_greedy(name, "cached", gen, &ref, m, V, o->allow_near_tie, o->near_tie);

    /* 4. greedy continuation by full forwards without reuse */
    int32_t *all = malloc((size_t)(T + ref.n_greedy) * sizeof *all);
    memcpy(all, ref.input, (size_t)T * sizeof *all);
    for (int i = 0; i < ref.n_greedy; i++) {
        CHECK_OK(kiln_seq_truncate(seq, 0));
        e = (kiln_batch_entry){seq, all, T + i, KILN_LOGITS_LAST, row};
        CHECK_OK(kiln_forward(m, &e, 1));
        all[T + i] = argmax(row, V);
    }
    report_greedy(name, "full-forward", all + T, &ref, m, V, o->allow_near_tie, o->near_tie);

    /* 5. a batch of three sequences: different lengths and offsets, same answers as alone */
    kiln_seq *s[3] = {0};
    for (int i = 0; i < 3; i++) CHECK_OK(kiln_seq_new(m, &s[i]));
    /* s[1] already holds 10 prompt tokens; s[2] holds 3 */
    e = (kiln_batch_entry){s[1], ref.input, 10, KILN_LOGITS_NONE, NULL};
    CHECK_OK(kiln_forward(m, &e, 1));
    e = (kiln_batch_entry){s[2], ref.input, 3, KILN_LOGITS_NONE, NULL};
    CHECK_OK(kiln_forward(m, &e, 1));
    float *b0 = malloc((size_t)T * V * sizeof(float));
    float *b1 = malloc((size_t)(T - 10) * V * sizeof(float));
    float *b2 = malloc((size_t)V * sizeof(float));
    kiln_batch_entry be[3] = {
        {s[0], ref.input, T, KILN_LOGITS_ALL, b0},
        {s[1], ref.input + 10, T - 10, KILN_LOGITS_ALL, b1},
        {s[2], ref.input + 3, 1, KILN_LOGITS_LAST, b2},
    };
    CHECK_OK(kiln_forward(m, be, 3));
    err = test_rel_l2(b0, ref.logits, (size_t)T * V);
    CHECK_MSG(err <= o->tol, "%s: batch entry 0 rel L2 %.3g", name, err);
    err = test_rel_l2(b1, ref.logits + (size_t)10 * V, (size_t)(T - 10) * V);
    CHECK_MSG(err <= o->tol, "%s: batch entry 1 rel L2 %.3g", name, err);
    err = test_rel_l2(b2, ref.logits + (size_t)3 * V, (size_t)V);
    CHECK_MSG(err <= o->tol, "%s: batch entry 2 rel L2 %.3g", name, err);
    double e_alone = test_rel_l2(b0, alone, (size_t)T * V);
    CHECK_MSG(e_alone <= o->tol, "%s: batch entry 0 vs alone rel L2 %.3g", name, e_alone);
    fprintf(stderr, "%-18s batch of 3     rel L2 %.2e (entry 0 vs alone %.2e)\n", name, err,
            e_alone);
    free(alone);
    CHECK(kiln_seq_len(s[0]) == T && kiln_seq_len(s[1]) == T && kiln_seq_len(s[2]) == 4);

    for (int i = 0; i < 3; i++) kiln_seq_free(s[i]);
    free(b0);
    free(b1);
    free(b2);
    free(all);
    free(row);
    free(gen);
    kiln_seq_free(seq);
    free(logits);
    free_reference(&ref);
    kiln_model_free(m);
}

/* One side of fixture_sampling_check: sequence `main` (and from step 12 a passenger decoded in the
 * same batch, first, so main's logits are row 1) on this model; in_forward picks main's token with
 * kiln_forward_sample, otherwise the caller samples the downloaded logits. */
typedef struct sampling_side {
    kiln_seq *main, *passenger;
    kiln_sampler *sampler, *passenger_sampler;
    bool in_forward;
} sampling_side;

static int32_t sampling_step(kiln_model *m, sampling_side *s, const int32_t *tokens, int n_tokens,
                             int32_t passenger_token, bool with_passenger, const int32_t *hist,
                             int n_hist, float *row, float *passenger_row) {
    kiln_batch_entry e[2];
    kiln_sample_request q[2] = {{0}};
    int32_t picked[2] = {-1, -1};
    int n = 0;
    if (with_passenger) {
        e[n] = (kiln_batch_entry){s->passenger, &passenger_token, 1, KILN_LOGITS_LAST,
                                  s->in_forward ? NULL : passenger_row};
        if (s->in_forward)
            q[n] = (kiln_sample_request){.sampler = s->passenger_sampler, .token_out = &picked[n]};
        n++;
    }
    e[n] =
        (kiln_batch_entry){s->main, tokens, n_tokens, KILN_LOGITS_LAST, s->in_forward ? NULL : row};
    if (s->in_forward)
        q[n] = (kiln_sample_request){
            .sampler = s->sampler, .history = hist, .n_history = n_hist, .token_out = &picked[n]};
    n++;
    if (s->in_forward) {
        CHECK_OK(kiln_forward_sample(m, e, n, q));
        return picked[n - 1];
    }
    CHECK_OK(kiln_forward(m, e, n));
    return kiln_sampler_sample(s->sampler, row, hist, n_hist);
}

void fixture_sampling_check(const char *name, kiln_device device) {
    char rel[256], dir[4000];
    snprintf(rel, sizeof rel, "fixtures/%s", name);
    snprintf(dir, sizeof dir, "%s", test_shared(rel));
    kiln_load_options lo;
    kiln_load_options_default(&lo);
    lo.device = device;
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_load(dir, &lo, &m));
    if (!m) return;
    const int V = kiln_model_get_info(m)->vocab_size, STEPS = 24;
    kiln_sampler_params cases[3];
    for (int c = 0; c < 3; c++) kiln_sampler_params_default(&cases[c]);
    cases[1].temperature = 1.0f; /* plain softmax draws */
    cases[1].seed = 3;
    cases[2].temperature = 0.8f; /* everything at once */
    cases[2].top_k = 40;
    cases[2].top_p = 0.95f;
    cases[2].min_p = 0.02f;
    cases[2].repetition_penalty = 1.1f;
    cases[2].presence_penalty = 0.2f;
    cases[2].frequency_penalty = 0.1f;
    cases[2].seed = 7;
    float *row = malloc((size_t)V * sizeof(float)), *prow = malloc((size_t)V * sizeof(float));
    const int32_t prompt[7] = {1, 5, 9, 2, 7, 3, 11};
    for (int c = 0; c < 3; c++) {
        sampling_side side[2] = {{.in_forward = false}, {.in_forward = true}};
        kiln_sampler_params greedy;
        kiln_sampler_params_default(&greedy);
        for (int k = 0; k < 2; k++) {
            CHECK_OK(kiln_seq_new(m, &side[k].main));
            CHECK_OK(kiln_seq_new(m, &side[k].passenger));
            CHECK_OK(kiln_sampler_new(&cases[c], V, &side[k].sampler));
            CHECK_OK(kiln_sampler_new(&greedy, V, &side[k].passenger_sampler));
        }
        int32_t hist[7 + STEPS];
        memcpy(hist, prompt, sizeof prompt);
        int n_hist = 7, mismatches = 0;
        for (int t = 0; t < STEPS; t++) {
            const bool batch = t >= 12;
            const int32_t ptok = (int32_t)((t * 7919 + 13) % V);
            const int32_t *tokens = t == 0 ? prompt : &hist[n_hist - 1];
            const int n_tokens = t == 0 ? 7 : 1;
            int32_t want =
                sampling_step(m, &side[0], tokens, n_tokens, ptok, batch, hist, n_hist, row, prow);
            int32_t got =
                sampling_step(m, &side[1], tokens, n_tokens, ptok, batch, hist, n_hist, row, prow);
            mismatches += got != want;
            CHECK(want >= 0 && want < V);
            hist[n_hist++] = want; /* both sides continue with the host's choice */
        }
        CHECK_MSG(mismatches == 0,
                  "%s: sampling case %d: forward_sample differs from the host "
                  "sampler at %d of %d steps",
                  name, c, mismatches, STEPS);
        fprintf(stderr, "%-18s sampling case %d: %d/%d steps identical\n", name, c,
                STEPS - mismatches, STEPS);
        for (int k = 0; k < 2; k++) {
            kiln_seq_free(side[k].main);
            kiln_seq_free(side[k].passenger);
            kiln_sampler_free(side[k].sampler);
            kiln_sampler_free(side[k].passenger_sampler);
        }
    }
    free(row);
    free(prow);
    kiln_model_free(m);
}

void fixture_gemma4_moe_check(kiln_device device, double tol, bool python_optional) {
    char dir[512], cmd[2048], path[600];
    snprintf(dir, sizeof dir, "%s/gemma4_moe", test_tmpdir());
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s' >&2",
             test_source("tests/gemma4_moe_ref.py"), dir);
    const int rc = system(cmd);
    if (rc != 0 && python_optional) {
        fprintf(stderr,
                "gemma4_text+moe    numpy reference LEFT OUT: '%s' failed (no python3 "
                "with numpy?)\n",
                cmd);
        return;
    }
    CHECK_MSG(rc == 0, "gemma4 moe: %s failed", cmd);
    snprintf(path, sizeof path, "%s/input_ids.json", dir);
    char *text = test_read_file(path, NULL);
    CHECK_MSG(text != NULL, "gemma4 moe: no %s", path);
    if (!text) return;
    cJSON *j = cJSON_Parse(text);
    free(text);
    int T = 0;
    int32_t *ids = fixture_json_ids(j, &T);
    cJSON_Delete(j);
    kiln_model *m = NULL;
    kiln_load_options lo;
    kiln_load_options_default(&lo);
    lo.device = device;
    CHECK_OK(kiln_model_load(dir, &lo, &m));
    if (!m) {
        free(ids);
        return;
    }
    const kiln_model_info *info = kiln_model_get_info(m);
    CHECK_MSG(strcmp(info->layer_pattern, "S+M F+M") == 0, "gemma4 moe: layer pattern '%s'",
              info->layer_pattern);
    const int V = info->vocab_size;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/logits.f32", dir);
    float *ref = (float *)test_read_file(path, &len);
    CHECK(ref && len == (size_t)T * V * sizeof(float));
    float *logits = malloc((size_t)T * V * sizeof(float));
    kiln_seq *seq = NULL;
    CHECK_OK(kiln_seq_new(m, &seq));
    kiln_batch_entry e = {seq, ids, T, KILN_LOGITS_ALL, logits};
    CHECK_OK(kiln_forward(m, &e, 1));
    double err = ref ? test_rel_l2(logits, ref, (size_t)T * V) : 1;
    CHECK_MSG(err <= tol, "gemma4 moe: full forward rel L2 %.3g > %g", err, tol);
    fprintf(stderr, "%-18s full forward   rel L2 %.2e (numpy reference, %s)\n", "gemma4_text+moe",
            err, device == KILN_DEVICE_CUDA ? "cuda" : "cpu");
    CHECK_OK(kiln_seq_truncate(seq, 0));
    for (int t = 0; t < T; t++) {
        e = (kiln_batch_entry){seq, ids + t, 1, KILN_LOGITS_LAST, logits + (size_t)t * V};
        CHECK_OK(kiln_forward(m, &e, 1));
    }
    err = ref ? test_rel_l2(logits, ref, (size_t)T * V) : 1;
    CHECK_MSG(err <= tol, "gemma4 moe: stepwise rel L2 %.3g > %g", err, tol);
    fprintf(stderr, "%-18s token by token rel L2 %.2e (numpy reference, %s)\n", "gemma4_text+moe",
            err, device == KILN_DEVICE_CUDA ? "cuda" : "cpu");
    kiln_seq_free(seq);
    free(logits);
    free(ref);
    free(ids);
    kiln_model_free(m);
}
