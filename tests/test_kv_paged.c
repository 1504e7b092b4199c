/* test_kv_paged.c — the paged KV pool: on the Llama-family fixtures, paged f32 caches (blocks of
 * 1, 16 and 7 tokens) give logits bit-identical to the contiguous cache, token by token and for a
 * whole prompt; prefix sharing gives each sequence the logits it gets alone; and, on the cache
 * interface directly, copy-on-write, sliding windows, pool exhaustion (KILN_ERR_CACHE_FULL with
 * nothing changed, then room after a free) and LRU eviction of cached prefix blocks; the kind
 * strings' group suffixes and their byte costs; kiln_seq_fill_synthetic (benchmarks' long
 * contexts) writes the same rows into paged and contiguous caches. */
#include "kiln.h"
#include "kv/kv_cache.h"
#include "kv/kv_factory.h"
#include "kv/kv_pool.h"
#include "model/model.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *fixtures[] = {
    "llama",           "llama-tied",      "qwen2",           "qwen3",
    "llama-mlx-q4g32", "llama-mlx-q8g64", "qwen3-mlx-q4g32", "qwen3-mlx-q8g64",
};

static int32_t *load_prompt(const char *dir, int *n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/reference.json", dir);
    char *text = test_read_file(path, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    cJSON *ids = cJSON_GetObjectItem(j, "input_ids");
    *n = cJSON_GetArraySize(ids);
    int32_t *out = *n > 0 ? malloc((size_t)*n * sizeof *out) : NULL;
    for (int i = 0; out && i < *n; i++) out[i] = (int32_t)cJSON_GetArrayItem(ids, i)->valuedouble;
    cJSON_Delete(j);
    return out;
}

static kiln_model *load(const char *dir, const char *kind, int block) {
    kiln_load_options o;
    kiln_load_options_default(&o);
    o.n_threads = 2;
    if (kind) CHECK_OK(kiln_kv_options_parse(kind, &o.kv));
    if (block) {
        o.kv.block_tokens = block;
        o.kv.paged = true;
    }
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_load(dir, &o, &m));
    return m;
}

/* Forwards tokens in chunks of `chunk` (the last chunk may be shorter) and returns the logits of
 * every token [n, V]; skip: tokens already in the cache. */
static float *run(kiln_model *m, kiln_seq *s, const int32_t *tok, int n, int chunk, int skip) {
    int V = kiln_model_get_info(m)->vocab_size;
    float *logits = calloc((size_t)n * V, sizeof *logits);
    for (int t = skip; t < n; t += chunk) {
        int c = n - t < chunk ? n - t : chunk;
        kiln_batch_entry e = {s, tok + t, c, KILN_LOGITS_ALL, logits + (size_t)t * V};
        CHECK_OK(kiln_forward(m, &e, 1));
    }
    return logits;
}

static void test_fixture_parity(const char *name) {
    const char *dir = test_shared(name);
    char dirbuf[4096];
    snprintf(dirbuf, sizeof dirbuf, "%s", dir);
    int T;
    int32_t *tok = load_prompt(dirbuf, &T);
    CHECK(tok && T > 16);
    if (!tok) return;
    kiln_model *ref = load(dirbuf, NULL, 0);
    if (!ref) return;
    int V = kiln_model_get_info(ref)->vocab_size;
    size_t bytes = (size_t)T * V * sizeof(float);
    kiln_seq *s;
    CHECK_OK(kiln_seq_new(ref, &s));
    float *want_step = run(ref, s, tok, T, 1, 0);
    kiln_seq_free(s);
    CHECK_OK(kiln_seq_new(ref, &s));
    float *want_full = run(ref, s, tok, T, T, 0);
    kiln_seq_free(s);
    static const int blocks[] = {1, 16, 7};
    for (int bi = 0; bi < 3; bi++) {
        kiln_model *m = load(dirbuf, "f32", blocks[bi]);
        if (!m) continue;
        CHECK_OK(kiln_seq_new(m, &s));
        CHECK(kv_is_paged(s->kv));
        float *got = run(m, s, tok, T, 1, 0);
        CHECK_MSG(memcmp(got, want_step, bytes) == 0,
                  "%s block %d: token-by-token logits differ "
                  "(rel %g)",
                  name, blocks[bi], test_rel_l2(got, want_step, (size_t)T * V));
        free(got);
        kiln_seq_free(s);
        CHECK_OK(kiln_seq_new(m, &s));
        got = run(m, s, tok, T, T, 0);
        CHECK_MSG(memcmp(got, want_full, bytes) == 0, "%s block %d: prompt logits differ", name,
                  blocks[bi]);
        free(got);
        kiln_seq_free(s);
        kiln_model_free(m);
    }
    free(want_step);
    free(want_full);
    kiln_model_free(ref);
    free(tok);
}

/* Two sequences share a prefix: the second attaches the first's blocks and still gets exactly
 * the logits it gets alone (computed on a contiguous cache with the same chunking), and the
 * first keeps decoding correctly after the second wrote past the shared part. */
static void test_prefix_sharing(void) {
    const char *dir = test_shared("fixtures/qwen3");
    char dirbuf[4096];
    snprintf(dirbuf, sizeof dirbuf, "%s", dir);
    int T;
    int32_t *tok = load_prompt(dirbuf, &T);
    if (!tok) return;
    kiln_model *ref = load(dirbuf, NULL, 0), *m = load(dirbuf, "f32", 8);
    if (!ref || !m) return;
    int V = kiln_model_get_info(m)->vocab_size;
    /* b = the first 30 tokens of a, then 10 different ones */
    int32_t *b = malloc((size_t)T * sizeof *b);
    memcpy(b, tok, 30 * sizeof *b);
    for (int i = 30; i < T; i++) b[i] = (tok[i] * 7 + 3) % V;
    kiln_seq *sa, *sb, *r;
    CHECK_OK(kiln_seq_new(m, &sa));
    float *la = run(m, sa, tok, 36, 36, 0);
    CHECK(kv_prefix_count(kv_paged_pool(sa->kv)) == 4); /* 4 full 8-token blocks committed */
    int reused = -1;
    CHECK_OK(kiln_seq_new(m, &sb));
    CHECK_OK(kiln_seq_prefix_attach(sb, b, T, &reused));
    CHECK_MSG(reused == 24, "reused %d tokens, want 24 (3 full blocks match)", reused);
    CHECK(kiln_seq_len(sb) == reused);
    float *lb = run(m, sb, b, T, T, reused);
    /* alone, on a contiguous cache, with the same chunking: 24 tokens, then the rest */
    CHECK_OK(kiln_seq_new(ref, &r));
    float *rb = run(ref, r, b, 24, 24, 0);
    float *rb1 = calloc((size_t)T * V, sizeof *rb1);
    kiln_batch_entry e = {r, b + 24, T - 24, KILN_LOGITS_ALL, rb1 + (size_t)24 * V};
    CHECK_OK(kiln_forward(ref, &e, 1));
    CHECK(memcmp(lb + (size_t)24 * V, rb1 + (size_t)24 * V, (size_t)(T - 24) * V * 4) == 0);
    free(rb);
    free(rb1);
    kiln_seq_free(r);
    /* a continues: its next tokens see only its own history */
    float *la2 = calloc((size_t)V * 4, sizeof *la2);
    e = (kiln_batch_entry){sa, tok + 36, 4, KILN_LOGITS_ALL, la2};
    CHECK_OK(kiln_forward(m, &e, 1));
    CHECK_OK(kiln_seq_new(ref, &r));
    float *ra = run(ref, r, tok, 36, 36, 0);
    float *ra2 = calloc((size_t)V * 4, sizeof *ra2);
    e = (kiln_batch_entry){r, tok + 36, 4, KILN_LOGITS_ALL, ra2};
    CHECK_OK(kiln_forward(ref, &e, 1));
    CHECK(memcmp(la, ra, (size_t)36 * V * 4) == 0);
    CHECK(memcmp(la2, ra2, (size_t)4 * V * 4) == 0);
    kiln_seq_free(r);
    /* the whole prompt cached: reuse stops one short, inside a shared block (copy-on-write) */
    kiln_seq *sc;
    CHECK_OK(kiln_seq_new(m, &sc));
    CHECK_OK(kiln_seq_prefix_attach(sc, tok, 32, &reused));
    CHECK(reused == 31);
    float *lc = run(m, sc, tok, 32, 32, 31);
    CHECK(memcmp(lc + (size_t)31 * V, la + (size_t)31 * V, (size_t)V * 4) == 0 ||
          test_rel_l2(lc + (size_t)31 * V, la + (size_t)31 * V, (size_t)V) < 1e-5);
    CHECK_ERR(kiln_seq_prefix_attach(sc, tok, 32, &reused), KILN_ERR_INVALID_ARG, "empty");
    free(lc);
    free(la);
    free(la2);
    free(ra);
    free(ra2);
    free(lb);
    free(b);
    free(tok);
    kiln_seq_free(sa);
    kiln_seq_free(sb);
    kiln_seq_free(sc);
    kiln_model_free(m);
    kiln_model_free(ref);
}

/* ---- the cache interface directly ---- */

enum { H = 2, D = 8, W = H * D, NL = 2 };

static void fill(float *x, int n, uint64_t *rng) {
    for (int i = 0; i < n; i++) x[i] = test_rand_normal(rng);
}

/* Appends n tokens of k/v rows to kv, recording them in kr/vr (per layer [max, W]). */
static kiln_status append(kiln_kv *kv, float *kr, float *vr, int n, uint64_t *rng) {
    kiln_status st = kv->vt->reserve(kv, n);
    if (st != KILN_OK) return st;
    for (int l = 0; l < NL; l++) {
        float *k = kr + ((size_t)l * 64 + kv->len) * W, *v = vr + ((size_t)l * 64 + kv->len) * W;
        fill(k, n * W, rng);
        fill(v, n * W, rng);
        kv->vt->store(kv, l, k, v, n);
    }
    kv->vt->commit(kv, n);
    return KILN_OK;
}

/* Attention of one query at position len (against len keys + itself) vs the contiguous reference.
 */
static bool attend_matches(kiln_kv *kv, const float *kr, const float *vr, int window_l1,
                           uint64_t *rng) {
    kiln_attn_params p = {.n_heads = 4, .scale = 0.35f, .softcap = 0};
    float q[4 * D], k[W], v[W], got[4 * D], want[4 * D];
    fill(q, 4 * D, rng);
    fill(k, W, rng);
    fill(v, W, rng);
    bool ok = kv->vt->reserve(kv, 1) == KILN_OK;
    for (int l = 0; ok && l < NL; l++) {
        float *kk = malloc((size_t)(kv->len + 1) * W * sizeof *kk);
        float *vv = malloc((size_t)(kv->len + 1) * W * sizeof *vv);
        memcpy(kk, kr + (size_t)l * 64 * W, (size_t)kv->len * W * sizeof *kk);
        memcpy(vv, vr + (size_t)l * 64 * W, (size_t)kv->len * W * sizeof *vv);
        memcpy(kk + (size_t)kv->len * W, k, sizeof k);
        memcpy(vv + (size_t)kv->len * W, v, sizeof v);
        kv->vt->store(kv, l, k, v, 1);
        kv->vt->attend(kv, l, q, 1, got, &p, NULL);
        kiln_attention_contiguous(q, 1, kv->len, kk, vv, kv->len + 1, 0, H, D, D,
                                  l == 1 ? window_l1 : 0, want, &p, NULL);
        ok = ok && memcmp(got, want, sizeof got) == 0;
        free(kk);
        free(vv);
    }
    return ok; /* not committed: the probe token is overwritten by the next append */
}

static kiln_kv *new_cache(void **shared, int block, int64_t budget, int window_l1) {
    kiln_kv_layer_desc layers[NL] = {{H, D, D, 0, true, 0}, {H, D, D, window_l1, true, 0}};
    kiln_kv_options o = {.block_tokens = block, .budget_bytes = budget, .paged = true};
    snprintf(o.kind, sizeof o.kind, "f32");
    kiln_kv *kv = NULL;
    CHECK_OK(kiln_kv_cpu_new_shared(shared, NULL, layers, NL, &o, 64, &kv));
    return kv;
}

static void test_cow(void) {
    uint64_t rng = 42;
    void *shared = NULL;
    float *kr = calloc((size_t)NL * 64 * W, 4), *vr = calloc((size_t)NL * 64 * W, 4);
    float *kr2 = calloc((size_t)NL * 64 * W, 4), *vr2 = calloc((size_t)NL * 64 * W, 4);
    kiln_kv *a = new_cache(&shared, 4, 0, 0);
    kv_pool *p = shared;
    CHECK_OK(append(a, kr, vr, 10, &rng)); /* 3 blocks per layer */
    CHECK(p->n_blocks - p->n_free == 6);
    kiln_kv *b = NULL;
    CHECK_OK(kv_paged_fork(a, &b));
    CHECK(b->len == 10 && p->n_blocks - p->n_free == 6); /* shared, nothing copied */
    memcpy(kr2, kr, (size_t)NL * 64 * W * 4);
    memcpy(vr2, vr, (size_t)NL * 64 * W * 4);
    CHECK_OK(b->vt->truncate(b, 6)); /* drops the fork's ref on block 2; block 1 stays shared */
    CHECK(p->n_blocks - p->n_free == 6);
    CHECK_OK(append(b, kr2, vr2, 3, &rng)); /* writes into shared block 1: copied first */
    CHECK(p->n_blocks - p->n_free == 6 + 2 /* cow */ + 2 /* new block 2 */);
    CHECK(attend_matches(a, kr, vr, 0, &rng));   /* a still sees its own rows */
    CHECK(attend_matches(b, kr2, vr2, 0, &rng)); /* b sees the shared start and its new rows */
    kiln_kv_free(a);
    CHECK(p->n_blocks - p->n_free == 6); /* freeing returns a's private blocks at once */
    kiln_kv_free(b);
    CHECK(p->n_free == p->n_blocks);
    kiln_kv_shared_free(shared);
    free(kr);
    free(vr);
    free(kr2);
    free(vr2);
}

static void test_sliding(void) {
    uint64_t rng = 9;
    void *shared = NULL;
    float *kr = calloc((size_t)NL * 64 * W, 4), *vr = calloc((size_t)NL * 64 * W, 4);
    kiln_kv *a = new_cache(&shared, 2, 0, 5); /* layer 1: window 5 */
    kv_pool *p = shared;
    for (int n = 0; n < 30; n++) {
        CHECK(attend_matches(a, kr, vr, 5, &rng));
        CHECK_OK(append(a, kr, vr, 1, &rng));
    }
    /* layer 0 holds 15 blocks; layer 1 only those with positions >= 30-5+1 = 26: blocks 13, 14 */
    CHECK_MSG(p->n_blocks - p->n_free == 15 + 2, "%d blocks in use",
              (int)(p->n_blocks - p->n_free));
    CHECK(a->vt->bytes_used(a) == 17 * (int64_t)p->block_bytes);
    CHECK_ERR(a->vt->truncate(a, 29), KILN_ERR_UNSUPPORTED, "window");
    CHECK_OK(a->vt->truncate(a, 0));
    CHECK(p->n_free == p->n_blocks);
    CHECK(attend_matches(a, kr, vr, 5, &rng));
    kiln_kv_free(a);
    kiln_kv_shared_free(shared);
    free(kr);
    free(vr);
}

static void test_pressure_and_eviction(void) {
    uint64_t rng = 1;
    void *shared = NULL;
    float *kr = calloc((size_t)NL * 64 * W, 4), *vr = calloc((size_t)NL * 64 * W, 4);
    const int64_t block_bytes = 4 * H * (D + D) * 4; /* 4 tokens of one layer */
    kiln_kv *a = new_cache(&shared, 4, 6 * block_bytes, 0);
    kv_pool *p = shared;
    CHECK(p->n_blocks == 6);
    CHECK_OK(append(a, kr, vr, 12, &rng)); /* 3 blocks x 2 layers: the whole pool */
    kiln_kv *b = new_cache(&shared, 4, 0, 0);
    CHECK_ERR(b->vt->reserve(b, 1), KILN_ERR_CACHE_FULL, "KV pool full");
    CHECK(b->len == 0 && b->vt->bytes_used(b) == 0 && a->len == 12);
    CHECK_ERR(a->vt->reserve(a, 1), KILN_ERR_CACHE_FULL, "--kv-budget");
    kiln_kv_free(a); /* no tokens noted: nothing cached, all returned */
    CHECK(p->n_free == 6);
    CHECK_OK(b->vt->reserve(b, 12));
    kiln_kv_free(b);

    /* prefix entries: X and Y each cache one 4-token block; X is used again, so Y is the LRU */
    int32_t X[5] = {1, 2, 3, 4, 9}, Y[4] = {5, 6, 7, 8};
    kiln_kv *x = new_cache(&shared, 4, 0, 0), *y = new_cache(&shared, 4, 0, 0);
    kiln_kv_note_tokens(x, X, 4);
    CHECK_OK(append(x, kr, vr, 4, &rng));
    kiln_kv_note_tokens(y, Y, 4);
    CHECK_OK(append(y, kr, vr, 4, &rng));
    CHECK(kv_prefix_count(p) == 2);
    kiln_kv_free(x);
    kiln_kv_free(y);
    CHECK(p->n_free == 2); /* 4 blocks kept by the cache, unreferenced */
    kiln_seq seq = {0};
    int reused = -1;
    CHECK_OK(kiln_kv_cpu_new_shared(
        &shared, NULL, p->layers, NL,
        &(kiln_kv_options){.kind = "f32", .block_tokens = 4, .paged = true}, 64, &seq.kv));
    CHECK_OK(kiln_seq_prefix_attach(&seq, X, 5, &reused));
    CHECK(reused == 4 && seq.kv->len == 4);
    kiln_kv_free(seq.kv);
    kiln_kv *z = new_cache(&shared, 4, 0, 0);
    CHECK_OK(z->vt->reserve(z, 8)); /* 4 blocks: 2 free + evict one entry (Y, least recent) */
    CHECK(kv_prefix_count(p) == 1);
    CHECK_OK(kiln_kv_cpu_new_shared(
        &shared, NULL, p->layers, NL,
        &(kiln_kv_options){.kind = "f32", .block_tokens = 4, .paged = true}, 64, &seq.kv));
    CHECK_OK(kiln_seq_prefix_attach(&seq, (int32_t[]){5, 6, 7, 8, 0}, 5, &reused));
    CHECK(reused == 0);
    CHECK_OK(kiln_seq_prefix_attach(&seq, X, 5, &reused));
    CHECK(reused == 4);
    /* z asks for more than free + evictable: CACHE_FULL, z unchanged */
    CHECK_ERR(z->vt->reserve(z, 12), KILN_ERR_CACHE_FULL, NULL);
    CHECK(z->vt->bytes_used(z) == 4 * block_bytes);
    kiln_kv_free(seq.kv);
    kiln_kv_free(z);
    kiln_kv_shared_free(shared);
    free(kr);
    free(vr);
}

/* :gN sets both groups, :kgN / :vgN one of them; bytes per token follow (demo-like layer: 2 KV
 * heads x 64 dims; affine row = groups x 4 B + codes, Lloyd-Max row = groups x 2 B + codes). */
static void test_kind_groups(void) {
    kv_kind_spec k;
    CHECK_OK(kv_kind_parse("turbo:k4v4", &k));
    CHECK(k.k_group == 32 && k.v_group == 32 && !k.rotk);
    CHECK_OK(kv_kind_parse("turbo:k4v4:rotk:kg64", &k));
    CHECK(k.k_group == 64 && k.v_group == 32 && k.rotk && k.k_bits == 4 && k.v_bits == 4);
    CHECK_OK(kv_kind_parse("turbo:k4v4:kg64:vg64", &k));
    CHECK(k.k_group == 64 && k.v_group == 64);
    CHECK_OK(kv_kind_parse("q4:vg32", &k));
    CHECK(k.k_group == 64 && k.v_group == 32);
    CHECK_OK(kv_kind_parse("q8:g32", &k));
    CHECK(k.k_group == 32 && k.v_group == 32);
    static const char *bad[] = {"turbo:k4v4:kg", "turbo:k4v4:kg48",  "turbo:k4v4:xg64",
                                "q4:kg512",      "turbo:k4v4:kg64:", "q4:rotk"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_ERR(kv_kind_parse(bad[i], &k), KILN_ERR_UNSUPPORTED, bad[i]);
    CHECK(kv_affine_row_bytes(64, 4, 64) == 36 && kv_affine_row_bytes(64, 4, 32) == 40);
    CHECK(kv_lloyd_row_bytes(64, 4, 32) == 36 && kv_lloyd_row_bytes(64, 4, 64) == 34);
}

/* The synthetic fill stores the same seeded rows whatever the cache, so a paged f32 cache (blocks
 * of 7) and the contiguous one give bit-identical logits for tokens that follow; the fill keeps
 * the context limit and its argument checks. */
static void test_fill_synthetic(void) {
    const char *dir = test_shared("fixtures/qwen3");
    int n = 0;
    int32_t *tok = load_prompt(dir, &n);
    kiln_model *mc = load(dir, NULL, 0), *mp = load(dir, NULL, 7);
    if (!tok || !mc || !mp) {
        CHECK_MSG(false, "qwen3 fixture: %s", kiln_last_error());
        goto done;
    }
    kiln_seq *sc = NULL, *sp = NULL;
    CHECK_OK(kiln_seq_new(mc, &sc));
    CHECK_OK(kiln_seq_new(mp, &sp));
    CHECK_OK(kiln_seq_fill_synthetic(sc, 300, 5));
    CHECK_OK(kiln_seq_fill_synthetic(sp, 300, 5));
    CHECK(kiln_seq_len(sc) == 300 && kiln_seq_len(sp) == 300);
    int V = kiln_model_get_info(mc)->vocab_size, T = n < 8 ? n : 8;
    float *lc = run(mc, sc, tok, T, 3, 0), *lp = run(mp, sp, tok, T, 3, 0);
    CHECK(memcmp(lc, lp, (size_t)T * V * sizeof(float)) == 0);
    /* and the context matters: without the fill the logits differ */
    kiln_seq *fresh = NULL;
    CHECK_OK(kiln_seq_new(mc, &fresh));
    float *l0 = run(mc, fresh, tok, T, 3, 0);
    CHECK(memcmp(lc, l0, (size_t)T * V * sizeof(float)) != 0);
    /* limits: the fixture's context is 512 tokens */
    int before = kiln_seq_len(sc);
    CHECK_ERR(kiln_seq_fill_synthetic(sc, 512, 1), KILN_ERR_CACHE_FULL, "context limit");
    CHECK(kiln_seq_len(sc) == before);
    CHECK_ERR(kiln_seq_fill_synthetic(sc, -1, 1), KILN_ERR_INVALID_ARG, "negative");
    CHECK_ERR(kiln_seq_fill_synthetic(NULL, 1, 1), KILN_ERR_INVALID_ARG, "NULL");
    free(lc);
    free(lp);
    free(l0);
    kiln_seq_free(fresh);
    kiln_seq_free(sc);
    kiln_seq_free(sp);
done:
    kiln_model_free(mc);
    kiln_model_free(mp);
    free(tok);
}

/* The contiguous cache grows by doubling, past the size where its rows move to huge-page memory
 * (util/huge_alloc.c; 700 tokens x 4 KiB): every row stored before a move must still be there.
 * With q = 0 every key weighs the same, so each output is the mean of its value column over all
 * N + 1 positions: t + c / 1024 for row t, column c, i.e. N / 2 + c / 1024. */
static void test_contiguous_growth(void) {
    enum { H = 8, HD = 128, W = H * HD, N = 700, STEP = 100 };
    kiln_kv_layer_desc d = {
        .n_kv_heads = H, .head_dim = HD, .v_head_dim = HD, .is_attention = true};
    kiln_kv *kv = NULL;
    CHECK_OK(kiln_kv_contiguous_new(&d, 1, 4096, &kv));
    if (!kv) return;
    float *k = calloc((size_t)STEP * W, sizeof(float)), *v = malloc(sizeof(float) * STEP * W);
    float *q = calloc(W, sizeof(float)), *out = malloc(sizeof(float) * W);
    for (int t0 = 0; t0 <= N; t0 += STEP) {
        const int n = t0 == N ? 1 : (N - t0 < STEP ? N - t0 : STEP);
        for (int i = 0; i < n; i++)
            for (int c = 0; c < W; c++) v[i * W + c] = (float)(t0 + i) + (float)c / 1024.0f;
        CHECK_OK(kv->vt->reserve(kv, n));
        kv->vt->store(kv, 0, k, v, n);
        if (t0 < N) kv->vt->commit(kv, n);
    }
    const kiln_attn_params p = {.n_heads = H, .scale = 1.0f};
    kv->vt->attend(kv, 0, q, 1, out, &p, NULL); /* the query at position N sees keys 0..N */
    double worst = 0;
    for (int c = 0; c < W; c++) {
        double want = N / 2.0 + c / 1024.0, err = fabs(out[c] - want) / want;
        worst = err > worst ? err : worst;
    }
    CHECK_MSG(worst < 1e-5, "contiguous cache after growth: worst rel err %.3g", worst);
    free(k), free(v), free(q), free(out);
    kiln_kv_free(kv);
}

int main(void) {
    test_contiguous_growth();
    test_kind_groups();
    test_cow();
    test_sliding();
    test_pressure_and_eviction();
    char *probe = test_read_file(test_shared("fixtures/llama/config.json"), NULL);
    if (!probe) return test_skip("no fixtures in KILN_SHARED");
    free(probe);
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "fixtures/%s", fixtures[i]);
        test_fixture_parity(rel);
    }
    test_prefix_sharing();
    test_fill_synthetic();
    return test_finish();
}
