/* test_kv_quality.c — what each KV storage kind costs in accuracy on the demo model: mean NLL over
 * eval windows (tokens 1..N-1 predicted from the ones before) and the mean KL divergence of the
 * next-token distributions from those of the f32 cache, with bytes per token. Windows:
 * KILN_KV_QUALITY_WINDOWS (default 2; docs/kv-quality.md uses all 64). Checks the goals
 * on the default list of kinds (including turbo beating q4 at equal and at fewer bytes);
 * KILN_KV_QUALITY_KINDS="f32 q8 ..." (f32 first) measures others. */
#include "kiln.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { WIN = 513 };

/* log-softmax of a row into lp (double). */
static void log_softmax(const float *x, int V, double *lp) {
    double mx = x[0], s = 0;
    for (int i = 1; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < V; i++) s += exp((double)x[i] - mx);
    double l = log(s);
    for (int i = 0; i < V; i++) lp[i] = (double)x[i] - mx - l;
}

typedef struct result {
    double nll, kl;
    int64_t bytes;
} result;

/* Runs n_win windows with cache kind `kind`; ref_lp: f32 log-probs [n_win*(WIN-1), V] to compare
 * with (NULL: fill it instead). */
static bool run_kind(const char *kind, const int32_t *ids, int n_win, double **ref_lp, result *r) {
    kiln_load_options o;
    kiln_load_options_default(&o);
    if (kiln_kv_options_parse(kind, &o.kv) != KILN_OK) return false;
    kiln_model *m = NULL;
    if (kiln_model_load(test_shared("models/demo-bf16"), &o, &m) != KILN_OK) return false;
    const int V = kiln_model_get_info(m)->vocab_size;
    r->bytes = kiln_model_get_info(m)->kv_bytes_per_token;
    float *logits = malloc((size_t)WIN * V * sizeof *logits);
    double *lp = malloc((size_t)V * sizeof *lp);
    bool fill = *ref_lp == NULL;
    if (fill) *ref_lp = malloc((size_t)n_win * (WIN - 1) * V * sizeof **ref_lp);
    double nll = 0, kl = 0;
    bool ok = logits && lp && *ref_lp;
    for (int w = 0; ok && w < n_win; w++) {
        kiln_seq *s = NULL;
        ok = kiln_seq_new(m, &s) == KILN_OK;
        kiln_batch_entry e = {s, ids + (size_t)w * WIN, WIN, KILN_LOGITS_ALL, logits};
        ok = ok && kiln_forward(m, &e, 1) == KILN_OK;
        for (int t = 0; ok && t + 1 < WIN; t++) {
            double *ref = *ref_lp + ((size_t)w * (WIN - 1) + t) * V;
            log_softmax(logits + (size_t)t * V, V, fill ? ref : lp);
            const double *cur = fill ? ref : lp;
            nll -= cur[ids[(size_t)w * WIN + t + 1]];
            if (!fill)
                for (int i = 0; i < V; i++) kl += exp(ref[i]) * (ref[i] - cur[i]);
        }
        kiln_seq_free(s);
    }
    r->nll = nll / ((double)n_win * (WIN - 1));
    r->kl = kl / ((double)n_win * (WIN - 1));
    free(logits);
    free(lp);
    kiln_model_free(m);
    return ok;
}

int main(void) {
    size_t len = 0;
    int32_t *ids = (int32_t *)test_read_file(test_shared("models/eval-windows-64x513.i32"), &len);
    if (!ids) return test_skip("no demo model eval windows in KILN_SHARED");
    int n_win = 2;
    const char *env = getenv("KILN_KV_QUALITY_WINDOWS");
    if (env && atoi(env) > 0) n_win = atoi(env);
    if ((size_t)n_win * WIN * 4 > len) n_win = (int)(len / (WIN * 4));
    static const char *kinds[] = {"f32",
                                  "bf16",
                                  "f16",
                                  "q8",
                                  "q4",
                                  "q4:g32",
                                  "turbo:k8v4",
                                  "turbo:k8v3",
                                  "turbo:k8v2",
                                  "turbo:k8v3:rotk",
                                  "turbo:k4v3:rotk",
                                  "turbo:k4v4:rotk:kg64",
                                  "turbo:k4v4:rotk:kg64:vg64"};
    enum { NK = sizeof kinds / sizeof kinds[0], MAXK = 32 };
    const char *list[MAXK];
    int nk = NK;
    for (int k = 0; k < NK; k++) list[k] = kinds[k];
    char *custom = getenv("KILN_KV_QUALITY_KINDS") ? strdup(getenv("KILN_KV_QUALITY_KINDS")) : NULL;
    if (custom) { /* a custom list: measured and printed, no goal checks */
        nk = 0;
        for (char *tok = strtok(custom, " ,"); tok && nk < MAXK; tok = strtok(NULL, " ,"))
            list[nk++] = tok;
        CHECK_MSG(nk > 0 && strcmp(list[0], "f32") == 0,
                  "KILN_KV_QUALITY_KINDS must start with f32");
        if (nk == 0 || strcmp(list[0], "f32") != 0) return test_finish();
    }
    result res[MAXK];
    double *ref = NULL;
    printf("%d windows of %d tokens\n%-18s %10s %9s %10s %9s\n", n_win, WIN, "kind", "nll", "dNLL%",
           "KL", "B/token");
    for (int k = 0; k < nk; k++) {
        bool ok = run_kind(list[k], ids, n_win, &ref, &res[k]);
        CHECK_MSG(ok, "%s: %s", list[k], kiln_last_error());
        if (!ok) break;
        printf("%-18s %10.6f %+8.3f%% %10.3g %9lld\n", list[k], res[k].nll,
               100.0 * (res[k].nll / res[0].nll - 1.0), res[k].kl, (long long)res[k].bytes);
        fflush(stdout);
    }
    if (test_failures == 0 && !custom) {
        double base = res[0].nll;
        CHECK(res[0].kl == 0.0);
        CHECK(res[1].kl > 0 && res[1].kl < 1e-3); /* bf16 */
        CHECK_MSG(res[3].nll <= base * 1.002, "q8 %+.3f%%", 100 * (res[3].nll / base - 1));
        CHECK_MSG(res[4].nll <= base * 1.03, "q4 %+.3f%%", 100 * (res[4].nll / base - 1));
        CHECK_MSG(res[6].nll <= base * 1.01, "turbo:k8v4 %+.3f%%", 100 * (res[6].nll / base - 1));
        /* KL grows as value bits shrink, and every kind is cheaper than f32 */
        CHECK(res[3].kl < res[4].kl && res[6].kl < res[7].kl && res[7].kl < res[8].kl);
        for (int k = 1; k < NK; k++) CHECK(res[k].bytes < res[0].bytes);
        /* turbo beats q4 at equal bytes (k4v4 with 64-key groups: lower NLL and KL) and at
         * fewer bytes (64-value groups too: lower KL; its NLL margin, 0.09% on 64 windows, is
         * below the noise of the default 2 windows) */
        CHECK_MSG(res[11].bytes == res[4].bytes && res[11].nll < res[4].nll &&
                      res[11].kl < res[4].kl,
                  "%s: %lld B, NLL %.6f, KL %.4g vs q4 %lld B, NLL %.6f, KL %.4g", kinds[11],
                  (long long)res[11].bytes, res[11].nll, res[11].kl, (long long)res[4].bytes,
                  res[4].nll, res[4].kl);
        CHECK_MSG(res[12].kl < res[4].kl, "%s: KL %.4g vs q4 %.4g", kinds[12], res[12].kl,
                  res[4].kl);
        CHECK(res[12].bytes < res[4].bytes);
        CHECK(res[3].bytes < res[1].bytes && res[4].bytes < res[3].bytes);
    }
    free(ref);
    free(ids);
    free(custom);
    return test_finish();
}
