/* test_kv_sched.c — the server's scheduler on the paged KV pool: (1) on the qwen3 fixture with a
 * pool too small for the requests at once, the pool-full step preempts the newest request, which
 * resumes later, and every greedy output equals the output of running that request alone; (2) on
 * the hybrid qwen3_next fixture, a repeated prompt is served from the pool's prefix cache
 * (recurrent-state snapshot at a block boundary) and gives the same tokens. */
#include "engine/scheduler.h"
#include "kiln.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

enum { NP = 40, GEN = 24, NREQ = 3 };

static kiln_model *load(const char *name, const char *kind, int block, int64_t budget) {
    kiln_load_options o;
    kiln_load_options_default(&o);
    o.n_threads = 2;
    CHECK_OK(kiln_kv_options_parse(kind, &o.kv));
    o.kv.block_tokens = block;
    o.kv.budget_bytes = budget;
    o.kv.paged = true;
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_load(test_shared(name), &o, &m));
    return m;
}

/* Submits n prompts at once (greedy, GEN tokens) and collects the ids; n_cached per request. */
static bool run_all(kiln_sched *s, int32_t (*prompts)[NP], int n, int32_t (*out)[GEN],
                    int *n_cached) {
    kiln_sched_req *req[NREQ] = {0};
    int got[NREQ] = {0};
    bool done[NREQ] = {0}, ok = true;
    for (int i = 0; i < n; i++) {
        kiln_sched_params p = {
            .prompt = prompts[i], .n_prompt = NP, .max_tokens = GEN, .top_logprobs = -1};
        kiln_sampler_params_default(&p.sampling);
        p.sampling.temperature = 0;
        CHECK_OK(kiln_sched_submit(s, &p, &req[i]));
        if (!req[i]) return false;
    }
    for (int left = n, spins = 0; left > 0 && spins < 20000; spins++) {
        kiln_sched_req *live[NREQ];
        int n_live = 0;
        for (int i = 0; i < n; i++)
            if (!done[i]) live[n_live++] = req[i];
        kiln_sched_wait(s, live, n_live, 100);
        for (int i = 0; i < n; i++) {
            if (done[i]) continue;
            kiln_sched_token t[GEN];
            kiln_sched_state st;
            int k = kiln_sched_take(s, req[i], t, GEN - got[i], &st);
            for (int j = 0; j < k; j++) out[i][got[i]++] = t[j].id;
            if (st.finish != KILN_FINISH_NONE) {
                CHECK_MSG(st.finish == KILN_FINISH_LENGTH, "request %d: finish %d (%s)", i,
                          (int)st.finish, st.error);
                CHECK_MSG(got[i] == GEN, "request %d: %d tokens", i, got[i]);
                ok &= st.finish == KILN_FINISH_LENGTH && got[i] == GEN;
                if (n_cached) n_cached[i] = st.n_cached;
                done[i] = true;
                left--;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        ok &= done[i];
        kiln_sched_release(s, req[i]);
    }
    return ok;
}

static kiln_sched *sched(kiln_model *m) {
    kiln_sched_options o;
    kiln_sched_options_default(&o);
    o.max_batch = 4;
    o.step_tokens = 16;
    o.ctx = 256;
    o.cache_entries = -1; /* no kept sequences: only the pool's prefix cache */
    kiln_sched *s = NULL;
    CHECK_OK(kiln_sched_new(m, &o, &s));
    return s;
}

static void test_preemption(void) {
    int32_t prompts[NREQ][NP];
    uint32_t x = 99;
    for (int i = 0; i < NREQ; i++)
        for (int t = 0; t < NP; t++) {
            x = x * 1664525u + 1013904223u;
            prompts[i][t] = (int32_t)((x >> 8) % 512);
        }
    int32_t alone[NREQ][GEN], together[NREQ][GEN];
    /* alone: a roomy pool, one request at a time */
    kiln_model *big = load("fixtures/qwen3", "f32", 8, 0);
    kiln_sched *s = big ? sched(big) : NULL;
    for (int i = 0; s && i < NREQ; i++) CHECK(run_all(s, &prompts[i], 1, &alone[i], NULL));
    kiln_sched_free(s);
    kiln_model_free(big);
    /* together: room for about 100 tokens, the three need 3 * 64 */
    kiln_model *m = load("fixtures/qwen3", "f32", 8, 0);
    int64_t bpt = m ? kiln_model_get_info(m)->kv_bytes_per_token : 0;
    kiln_model_free(m);
    m = load("fixtures/qwen3", "f32", 8, 100 * bpt);
    s = m ? sched(m) : NULL;
    if (!s) {
        kiln_model_free(m);
        return;
    }
    CHECK(run_all(s, prompts, NREQ, together, NULL));
    kiln_sched_stats st;
    kiln_sched_get_stats(s, &st);
    printf("preemption: %lld preemptions, pool %lld blocks\n", (long long)st.preemptions_total,
           (long long)st.kv_pool_blocks);
    CHECK(st.preemptions_total > 0);
    CHECK(st.requests_failed == 0 && st.requests_finished == NREQ);
    CHECK(st.kv_pool_blocks > 0 && st.kv_pool_blocks < 100);
    for (int i = 0; i < NREQ; i++)
        CHECK_MSG(memcmp(alone[i], together[i], sizeof alone[i]) == 0,
                  "request %d: output under preemption differs from alone", i);
    kiln_sched_free(s);
    kiln_model_free(m);
}

static void test_hybrid_repeat(void) {
    kiln_model *m = load("fixtures/qwen3_next", "f32", 8, 0);
    kiln_sched *s = m ? sched(m) : NULL;
    if (!s) {
        kiln_model_free(m);
        return;
    }
    int32_t prompt[1][NP], first[1][GEN], again[1][GEN];
    for (int t = 0; t < NP; t++) prompt[0][t] = (t * 37 + 11) % 512;
    int cached[2] = {-1, -1};
    CHECK(run_all(s, prompt, 1, first, &cached[0]));
    CHECK(run_all(s, prompt, 1, again, &cached[1]));
    printf("hybrid repeat: cached %d then %d of %d prompt tokens\n", cached[0], cached[1], NP);
    CHECK(cached[0] == 0);
    CHECK(cached[1] == 32); /* the prefill was cut at 32 = the last boundary before token 40 */
    CHECK(memcmp(first, again, sizeof first) == 0);
    kiln_sched_free(s);
    kiln_model_free(m);
}

int main(void) {
    char *cfg = test_read_file(test_shared("fixtures/qwen3_next/config.json"), NULL);
    if (!cfg) return test_skip("no fixtures in KILN_SHARED");
    free(cfg);
    test_preemption();
    test_hybrid_repeat();
    return test_finish();
}
