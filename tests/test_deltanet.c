/* test_deltanet.c — the Gated DeltaNet kernels agree with each other and with a float64 reference:
 * the chunked prefill and the per-token recurrence give the same outputs and final state at
 * lengths around the chunk size (1, 63, 64, 65, 200) from a zero and a non-zero state; a prefill
 * split in two pieces equals one piece (conv state and recurrent state carried); the causal conv
 * matches its definition; the CPU backend's batched gdn_conv / gdn_delta equal the kernels run
 * sequence by sequence (1, 3, 64, 70 sequences); and at model level, a qwen3_next prompt fed in
 * two pieces and a gemma3 prompt decoded past its sliding window match transformers' logits. */
#include "kiln.h"
#include "backend/cpu/cpu_deltanet.h"
#include "backend/cpu/cpu_ops.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
}

static double rel_l2(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* float64 recurrence: the definition the kernels implement */
static void ref_gdn(const kiln_gdn_dims *d, int n, const float *q, const float *k, const float *v,
                    const float *g, const float *beta, double *S, double *out) {
    const int nk = d->n_k_heads, nv = d->n_v_heads, dk = d->dk, dv = d->dv, r = nv / nk;
    for (int h = 0; h < nv; h++) {
        double *s = S + (size_t)h * dk * dv;
        for (int t = 0; t < n; t++) {
            const float *qt = q + ((size_t)t * nk + h / r) * dk,
                        *kt = k + ((size_t)t * nk + h / r) * dk;
            const float *vt = v + ((size_t)t * nv + h) * dv;
            double dec = exp(g[t * nv + h]);
            for (int i = 0; i < dk * dv; i++) s[i] *= dec;
            for (int c = 0; c < dv; c++) {
                double kv = 0;
                for (int i = 0; i < dk; i++) kv += s[i * dv + c] * kt[i];
                double dl = (vt[c] - kv) * beta[t * nv + h];
                for (int i = 0; i < dk; i++) s[i * dv + c] += kt[i] * dl;
            }
            for (int c = 0; c < dv; c++) {
                double o = 0;
                for (int i = 0; i < dk; i++) o += s[i * dv + c] * qt[i] / sqrt((double)dk);
                out[((size_t)t * nv + h) * dv + c] = o;
            }
        }
    }
}

static void check_rule(int n, bool warm_state) {
    kiln_gdn_dims d = {.n_k_heads = 2, .n_v_heads = 4, .dk = 16, .dv = 8};
    const size_t nq = (size_t)n * d.n_k_heads * d.dk, nvv = (size_t)n * d.n_v_heads * d.dv,
                 ng = (size_t)n * d.n_v_heads, ns = (size_t)d.n_v_heads * d.dk * d.dv;
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nvv * 4), *g = malloc(ng * 4),
          *b = malloc(ng * 4);
    float *S1 = malloc(ns * 4), *S2 = malloc(ns * 4), *o1 = malloc(nvv * 4), *o2 = malloc(nvv * 4);
    double *Sr = malloc(ns * 8), *orf = malloc(nvv * 8);
    for (size_t i = 0; i < nq; i++) q[i] = frand(), k[i] = frand();
    for (size_t i = 0; i < nvv; i++) v[i] = frand();
    for (size_t i = 0; i < ng; i++) g[i] = -0.3f * (frand() + 1.0f), b[i] = 0.5f * (frand() + 1.0f);
    kiln_gdn_l2norm(q, (int64_t)n * d.n_k_heads, d.dk, 1e-6f);
    kiln_gdn_l2norm(k, (int64_t)n * d.n_k_heads, d.dk, 1e-6f);
    for (size_t i = 0; i < ns; i++) {
        S1[i] = warm_state ? 0.3f * frand() : 0.0f;
        S2[i] = S1[i];
        Sr[i] = S1[i];
    }
    kiln_gdn_recurrent(&d, n, q, k, v, g, b, S1, o1, NULL);
    kiln_gdn_chunked(&d, n, 64, q, k, v, g, b, S2, o2, NULL);
    ref_gdn(&d, n, q, k, v, g, b, Sr, orf);
    double e1 = rel_l2(o1, orf, nvv), e2 = rel_l2(o2, orf, nvv), s1 = rel_l2(S1, Sr, ns),
           s2 = rel_l2(S2, Sr, ns);
    CHECK_MSG(e1 < 1e-5 && s1 < 1e-5, "n=%d recurrent vs f64: out %.2g state %.2g", n, e1, s1);
    CHECK_MSG(e2 < 1e-5 && s2 < 1e-5, "n=%d chunked vs f64: out %.2g state %.2g", n, e2, s2);
    fprintf(stderr, "gdn n=%-3d %s state: recurrent %.1e/%.1e chunked %.1e/%.1e\n", n,
            warm_state ? "warm" : "zero", e1, s1, e2, s2);

    /* chunked in two pieces (state carried) == one piece */
    if (n > 2) {
        int cut = n / 3;
        /* restart both from the same start state */
        rng = 12345;
        for (size_t i = 0; i < ns; i++) S1[i] = S2[i] = warm_state ? 0.3f * frand() : 0.0f;
        kiln_gdn_chunked(&d, n, 64, q, k, v, g, b, S1, o1, NULL);
        kiln_gdn_chunked(&d, cut, 64, q, k, v, g, b, S2, o2, NULL);
        kiln_gdn_chunked(&d, n - cut, 64, q + (size_t)cut * d.n_k_heads * d.dk,
                         k + (size_t)cut * d.n_k_heads * d.dk, v + (size_t)cut * d.n_v_heads * d.dv,
                         g + (size_t)cut * d.n_v_heads, b + (size_t)cut * d.n_v_heads, S2,
                         o2 + (size_t)cut * d.n_v_heads * d.dv, NULL);
        double worst = 0;
        for (size_t i = 0; i < nvv; i++) worst = fmax(worst, fabs(o1[i] - o2[i]));
        for (size_t i = 0; i < ns; i++) worst = fmax(worst, fabs(S1[i] - S2[i]));
        CHECK_MSG(worst < 1e-5, "n=%d split at %d differs by %.2g", n, cut, worst);
    }
    free(q), free(k), free(v), free(g), free(b), free(S1), free(S2), free(o1), free(o2), free(Sr),
        free(orf);
}

static void check_conv(void) {
    enum { N = 10, C = 5, K = 4 };
    float x[N * C], w[C * K], st1[(K - 1) * C] = {0}, st2[(K - 1) * C] = {0}, o1[N * C], o2[N * C];
    for (int i = 0; i < N * C; i++) x[i] = frand();
    for (int i = 0; i < C * K; i++) w[i] = frand();
    kiln_gdn_conv(o1, x, N, C, w, K, st1);
    for (int t = 0; t < N; t++)
        for (int c = 0; c < C; c++) {
            double a = 0;
            for (int j = 0; j < K; j++) {
                int s = t - (K - 1) + j;
                if (s >= 0) a += (double)w[c * K + j] * x[s * C + c];
            }
            double want = a / (1 + exp(-a));
            CHECK_MSG(fabs(o1[t * C + c] - want) < 1e-5, "conv t=%d c=%d: %g vs %g", t, c,
                      o1[t * C + c], want);
        }
    /* in pieces 1 + 2 + 7: same outputs and state */
    kiln_gdn_conv(o2, x, 1, C, w, K, st2);
    kiln_gdn_conv(o2 + C, x + C, 2, C, w, K, st2);
    kiln_gdn_conv(o2 + 3 * C, x + 3 * C, 7, C, w, K, st2);
    CHECK(memcmp(o1, o2, sizeof o1) == 0);
    CHECK(memcmp(st1, st2, sizeof st1) == 0);
    CHECK(memcmp(st1, x + (N - K + 1) * C, sizeof st1) == 0);
}

/* Token counts of the batch compositions the batched ops are checked on: 1, 3, 64 and 70
 * sequences, with 0, 1, a few and (70) a prefill's worth of tokens. */
static int batch_tokens(int n_seqs, int i) {
    if (n_seqs == 1) return 3;
    if (n_seqs == 3) return (int[]){1, 0, 5}[i];
    if (n_seqs == 64) return 1;
    if (i == 40) return 70;
    return i == 3 || i == 13 ? 0 : i % 10 == 7 ? 1 + i % 5 : 1;
}

/* The CPU backend's batched gdn_conv and gdn_delta equal the single-sequence kernels run on each
 * sequence's rows, bit for bit (decode steps: the recurrence, longer runs: the chunked form), for
 * the batch compositions of batch_tokens, every sequence with its own non-zero state, over two
 * steps (states carried); the delta rule also against the token-by-token reference. */
static void check_batch_ops(void) {
    kiln_backend *be = NULL;
    CHECK_OK(kiln_backend_cpu_new(2, &be));
    if (!be) return;
    static const kiln_gdn_dims dims[] = {{2, 4, 16, 8}, {1, 3, 12, 20}};
    static const int convs[][2] = {{37, 4}, {5, 2}, {9, 1}};
    static const int batches[] = {1, 3, 64, 70};
    for (int b = 0; b < 4; b++) {
        const int ns = batches[b];
        int n[70], T = 0;
        for (int i = 0; i < ns; i++) T += n[i] = batch_tokens(ns, i);
        float *st1[70], *st2[70];
        for (int c = 0; c < 3; c++) { /* conv */
            const int C = convs[c][0], K = convs[c][1], P = K - 1, sz = (P > 0 ? P : 1) * C;
            float *w = malloc((size_t)C * K * 4), *x = malloc((size_t)T * C * 4);
            float *o1 = malloc((size_t)T * C * 4), *o2 = malloc((size_t)T * C * 4);
            for (int i = 0; i < C * K; i++) w[i] = frand();
            for (int i = 0; i < ns; i++) {
                st1[i] = malloc((size_t)sz * 4), st2[i] = malloc((size_t)sz * 4);
                for (int j = 0; j < sz; j++) st1[i][j] = st2[i][j] = frand();
            }
            bool same = true;
            for (int step = 0; step < 2; step++) {
                for (int i = 0; i < T * C; i++) x[i] = frand();
                be->gdn_conv(be, o1, x, ns, n, C, w, K, st1);
                for (int i = 0, t = 0; i < ns; t += n[i], i++)
                    if (n[i]) kiln_gdn_conv(o2 + t * C, x + t * C, n[i], C, w, K, st2[i]);
                same = same && memcmp(o1, o2, (size_t)T * C * 4) == 0;
                for (int i = 0; i < ns; i++) same = same && !memcmp(st1[i], st2[i], sz * 4u);
            }
            CHECK_MSG(same, "batched gdn_conv of %d sequences, C=%d K=%d", ns, C, K);
            for (int i = 0; i < ns; i++) free(st1[i]), free(st2[i]);
            free(w), free(x), free(o1), free(o2);
        }
        for (int dd = 0; dd < 2; dd++) { /* delta rule */
            const kiln_gdn_dims *d = &dims[dd];
            const int KD = d->n_k_heads * d->dk, VD = d->n_v_heads * d->dv, NV = d->n_v_heads,
                      sn = NV * d->dk * d->dv;
            float *q = malloc((size_t)T * KD * 4), *k = malloc((size_t)T * KD * 4),
                  *v = malloc((size_t)T * VD * 4), *g = malloc((size_t)T * NV * 4),
                  *bt = malloc((size_t)T * NV * 4), *o1 = malloc((size_t)T * VD * 4),
                  *o2 = malloc((size_t)T * VD * 4), *o3 = malloc((size_t)T * VD * 4);
            float *st3[70];
            for (int i = 0; i < ns; i++) {
                st1[i] = malloc((size_t)sn * 4), st2[i] = malloc((size_t)sn * 4);
                st3[i] = malloc((size_t)sn * 4);
                for (int j = 0; j < sn; j++) st1[i][j] = st2[i][j] = st3[i][j] = 0.3f * frand();
            }
            bool same = true;
            double worst = 0;
            for (int step = 0; step < 2; step++) {
                for (int i = 0; i < T * KD; i++) q[i] = frand(), k[i] = frand();
                for (int i = 0; i < T * VD; i++) v[i] = frand();
                for (int i = 0; i < T * NV; i++)
                    g[i] = -0.3f * (frand() + 1.0f), bt[i] = 0.5f * (frand() + 1.0f);
                kiln_gdn_l2norm(q, (int64_t)T * d->n_k_heads, d->dk, 1e-6f);
                kiln_gdn_l2norm(k, (int64_t)T * d->n_k_heads, d->dk, 1e-6f);
                be->gdn_delta(be, d, ns, n, q, k, v, g, bt, st1, o1);
                for (int i = 0, t = 0; i < ns; t += n[i], i++) {
                    if (!n[i]) continue;
                    const float *qi = q + t * KD, *ki = k + t * KD, *vi = v + t * VD,
                                *gi = g + t * NV, *bi = bt + t * NV;
                    if (n[i] == 1)
                        kiln_gdn_recurrent(d, 1, qi, ki, vi, gi, bi, st2[i], o2 + t * VD, NULL);
                    else
                        kiln_gdn_chunked(d, n[i], 64, qi, ki, vi, gi, bi, st2[i], o2 + t * VD,
                                         NULL);
                    kiln_cpu_gdn_delta_ref(d, n[i], qi, ki, vi, gi, bi, st3[i], o3 + t * VD);
                }
                same = same && memcmp(o1, o2, (size_t)T * VD * 4) == 0;
                for (int i = 0; i < ns; i++) same = same && !memcmp(st1[i], st2[i], sn * 4u);
                for (int i = 0; i < T * VD; i++) worst = fmax(worst, fabs(o1[i] - o3[i]));
                for (int i = 0; i < ns; i++)
                    for (int j = 0; j < sn; j++) worst = fmax(worst, fabs(st1[i][j] - st3[i][j]));
            }
            CHECK_MSG(same, "batched gdn_delta of %d sequences, dk=%d dv=%d", ns, d->dk, d->dv);
            CHECK_MSG(worst < 1e-4, "batched gdn_delta of %d sequences vs reference: %.2g", ns,
                      worst);
            for (int i = 0; i < ns; i++) free(st1[i]), free(st2[i]), free(st3[i]);
            free(q), free(k), free(v), free(g), free(bt), free(o1), free(o2), free(o3);
        }
    }
    kiln_backend_free(be);
}

/* Model level: prompt fed in pieces (prefill, then a second prefill on top of the state, then
 * single tokens) must give transformers' logits for every position. */
static void check_model_pieces(const char *name) {
    char rel[128], path[4200];
    snprintf(rel, sizeof rel, "fixtures/%s", name);
    const char *dir = test_shared(rel);
    char dirbuf[4000];
    snprintf(dirbuf, sizeof dirbuf, "%s", dir);
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_load(dirbuf, NULL, &m));
    if (!m) return;
    const int V = kiln_model_get_info(m)->vocab_size;
    snprintf(path, sizeof path, "%s/reference.json", dirbuf);
    char *text = test_read_file(path, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *ids = cJSON_GetObjectItem(j, "input_ids");
    int T = cJSON_GetArraySize(ids);
    int32_t *in = malloc((size_t)T * sizeof *in);
    for (int i = 0; i < T; i++) in[i] = (int32_t)cJSON_GetArrayItem(ids, i)->valuedouble;
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/logits.f32", dirbuf);
    size_t len = 0;
    float *ref = (float *)test_read_file(path, &len);
    CHECK(ref && len == (size_t)T * V * sizeof(float));
    float *out = malloc((size_t)T * V * sizeof(float));
    kiln_seq *s = NULL;
    CHECK_OK(kiln_seq_new(m, &s));
    int cuts[] = {0, 13, 30, T - 3, T - 2, T - 1, T};
    for (int c = 0; c + 1 < (int)(sizeof cuts / sizeof cuts[0]); c++) {
        kiln_batch_entry e = {s, in + cuts[c], cuts[c + 1] - cuts[c], KILN_LOGITS_ALL,
                              out + (size_t)cuts[c] * V};
        CHECK_OK(kiln_forward(m, &e, 1));
    }
    double err = ref ? test_rel_l2(out, ref, (size_t)T * V) : 1;
    CHECK_MSG(err <= 1e-4, "%s: prefill in pieces rel L2 %.3g", name, err);
    fprintf(stderr, "%-14s pieces 13+17+%d+1+1+1 rel L2 %.2e\n", name, T - 33, err);
    kiln_seq_free(s);
    free(out);
    free(ref);
    free(in);
    kiln_model_free(m);
}

int main(void) {
    int lens[] = {1, 63, 64, 65, 200};
    for (int i = 0; i < 5; i++) {
        check_rule(lens[i], false);
        check_rule(lens[i], true);
    }
    check_conv();
    check_batch_ops();
    check_model_pieces("qwen3_next");
    check_model_pieces("qwen3_5_text");
    check_model_pieces("gemma3_text"); /* sliding window 8: pieces straddle the window edge */
    return test_finish();
}
