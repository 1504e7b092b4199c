/* test_kv_hybrid.c — prefix reuse for hybrid models (gated DeltaNet + attention) through recurrent
 * state snapshots at block boundaries, on the qwen3_next and qwen3_5_text fixtures with a paged f32
 * cache (blocks of 8 tokens): a sequence that attaches a cached prefix gets logits bit-identical to
 * a sequence computing the same calls alone on a contiguous cache; attach stops at the last
 * boundary holding a snapshot; truncate rolls back only to such a boundary; and the snapshot store
 * stays within its bound. */
#include "kiln.h"
#include "kv/kv_factory.h"
#include "kv/kv_pool.h"
#include "model/model.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

enum { BLK = 8, N = 72 };

static kiln_model *load(const char *name, bool paged) {
    kiln_load_options o;
    kiln_load_options_default(&o);
    o.n_threads = 2;
    if (paged) {
        o.kv.block_tokens = BLK;
        o.kv.paged = true;
    }
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_load(test_shared(name), &o, &m));
    return m;
}

/* Forwards tok[from..to) as calls ending at each cut in cuts[] (ascending, last == to), logits of
 * every token into out + (t - from) * V. */
static bool run(kiln_model *m, kiln_seq *s, const int32_t *tok, int from, const int *cuts,
                int n_cuts, float *out) {
    int V = kiln_model_get_info(m)->vocab_size;
    for (int i = 0, t = from; i < n_cuts; t = cuts[i++]) {
        kiln_batch_entry e = {s, tok + t, cuts[i] - t, KILN_LOGITS_ALL,
                              out + (size_t)(t - from) * V};
        kiln_status st = kiln_forward(m, &e, 1);
        CHECK_OK(st);
        if (st != KILN_OK) return false;
    }
    return true;
}

static bool same(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static void test_fixture(const char *name) {
    kiln_model *ref = load(name, false), *m = load(name, true);
    if (!ref || !m) {
        kiln_model_free(ref);
        kiln_model_free(m);
        return;
    }
    const int V = kiln_model_get_info(m)->vocab_size;
    int32_t tok[N], alt[N];
    uint32_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 1664525u + 1013904223u;
        tok[i] = (int32_t)((x >> 8) % (uint32_t)V);
        alt[i] = i < 44 ? tok[i] : (tok[i] + 7) % V; /* diverges inside block 5 */
    }
    float *want = calloc((size_t)N * V, sizeof(float)), *got = calloc((size_t)N * V, sizeof(float));
    kiln_seq *a = NULL, *b = NULL, *r = NULL;

    /* A: 48 tokens in one call (ends on a boundary: snapshot of block 5), then 48..60 */
    CHECK_OK(kiln_seq_new(m, &a));
    int cuts_a[] = {48, 60};
    run(m, a, tok, 0, cuts_a, 2, got);
    kv_pool *pool = kv_paged_pool(a->kv);
    CHECK(pool && pool->snap_floats > 0);
    if (!pool) goto done;
    CHECK_MSG(kv_prefix_snapshot_count(pool) == 1, "%lld snapshots",
              (long long)kv_prefix_snapshot_count(pool));
    CHECK(kv_prefix_count(pool) == 60 / BLK);

    /* alone, contiguous cache, same calls: the reference for every reuse below */
    CHECK_OK(kiln_seq_new(ref, &r));
    run(ref, r, tok, 0, cuts_a, 2, want);
    CHECK_MSG(same(want, got, (size_t)60 * V), "%s: paged f32 differs from contiguous", name);
    kiln_seq_free(r);

    /* B attaches 60 tokens: the longest snapshotted run is 48 */
    CHECK_OK(kiln_seq_new(m, &b));
    int reused = -1;
    CHECK_OK(kiln_seq_prefix_attach(b, tok, 60, &reused));
    CHECK_MSG(reused == 48, "%s: reused %d", name, reused);
    int cut_b[] = {60};
    memset(got, 0, (size_t)N * V * sizeof(float));
    run(m, b, tok, 48, cut_b, 1, got);
    CHECK_MSG(same(want + (size_t)48 * V, got, (size_t)12 * V),
              "%s: logits after attaching differ from computing alone", name);
    /* and it continues like A: one more token */
    float *la = calloc((size_t)V, sizeof(float)), *lb = calloc((size_t)V, sizeof(float));
    kiln_batch_entry ea = {a, tok + 60, 1, KILN_LOGITS_LAST, la},
                     eb = {b, tok + 60, 1, KILN_LOGITS_LAST, lb};
    CHECK_OK(kiln_forward(m, &ea, 1));
    CHECK_OK(kiln_forward(m, &eb, 1));
    CHECK(same(la, lb, (size_t)V));
    kiln_seq_free(b);
    b = NULL;

    /* The alternative prompt diverges at 44: blocks 0..4 match but none ends on a snapshot */
    CHECK_OK(kiln_seq_new(m, &b));
    CHECK_OK(kiln_seq_prefix_attach(b, alt, N, &reused));
    CHECK_MSG(reused == 0, "%s: reused %d without a snapshot", name, reused);
    kiln_seq_free(b);
    b = NULL;

    /* Decoding one token per call snapshots every boundary: now 40 of alt is reusable */
    CHECK_OK(kiln_seq_new(m, &b));
    int steps[N];
    for (int i = 0; i < N; i++) steps[i] = i + 1;
    run(m, b, tok, 0, steps, 44, got);
    kiln_seq_free(b);
    b = NULL;
    CHECK_MSG(kv_prefix_snapshot_count(pool) == 6, "%lld snapshots (8..48)",
              (long long)kv_prefix_snapshot_count(pool));
    CHECK_OK(kiln_seq_new(m, &b));
    CHECK_OK(kiln_seq_prefix_attach(b, alt, N, &reused));
    CHECK_MSG(reused == 40, "%s: reused %d", name, reused);
    int cuts_alt[] = {N};
    run(m, b, alt, 40, cuts_alt, 1, got);
    CHECK_OK(kiln_seq_new(ref, &r));
    int cuts_ref[41]; /* the snapshot at 40 came from one-token calls: so does the reference */
    memcpy(cuts_ref, steps, 40 * sizeof(int));
    cuts_ref[40] = N;
    run(ref, r, alt, 0, cuts_ref, 41, want);
    kiln_seq_free(r);
    r = NULL;
    /* the attention blocks of 0..40 came from A's one-call prefill, the states from one-token
     * calls: the two paths differ in rounding only */
    double err = test_rel_l2(got, want + (size_t)40 * V, (size_t)(N - 40) * V);
    printf("%s: diverging prompt after reusing 40 (mixed calls): rel L2 %.3g vs alone\n", name,
           err);
    CHECK_MSG(err <= 1e-5, "%s: rel L2 %.3g", name, err);
    /* on a fresh pool whose blocks and snapshots all come from one-token calls: bit-identical */
    {
        kiln_model *m2 = load(name, true);
        kiln_seq *d = NULL, *e = NULL;
        CHECK_OK(kiln_seq_new(m2, &d));
        run(m2, d, tok, 0, steps, 44, got);
        kiln_seq_free(d);
        CHECK_OK(kiln_seq_new(m2, &e));
        CHECK_OK(kiln_seq_prefix_attach(e, alt, N, &reused));
        CHECK_MSG(reused == 40, "%s: reused %d", name, reused);
        run(m2, e, alt, 40, cuts_alt, 1, got);
        CHECK_MSG(same(want + (size_t)40 * V, got, (size_t)(N - 40) * V),
                  "%s: logits of the diverging prompt differ from computing alone", name);
        kiln_seq_free(e);
        kiln_model_free(m2);
    }

    /* Truncate: back to a snapshotted boundary replays bit for bit; elsewhere it refuses */
    CHECK_ERR(kiln_seq_truncate(a, 44), KILN_ERR_UNSUPPORTED, "snapshot");
    CHECK(kiln_seq_len(a) == 61);
    CHECK_OK(kiln_seq_truncate(a, 48));
    CHECK(kiln_seq_len(a) == 48);
    int cut_a2[] = {60};
    run(m, a, tok, 48, cut_a2, 1, got);
    CHECK_OK(kiln_seq_new(ref, &r));
    run(ref, r, tok, 0, cuts_a, 2, want);
    CHECK(same(want + (size_t)48 * V, got, (size_t)12 * V));

    /* The snapshot store keeps its bound: many boundaries, at most snap_bytes_max held */
    pool->snap_bytes_max = 3 * pool->snap_floats * 4;
    kiln_seq_free(b);
    CHECK_OK(kiln_seq_new(m, &b));
    run(m, b, alt, 0, steps, N, got); /* new snapshots at 48, 56, 64, 72 */
    CHECK(kv_prefix_snapshot_count(pool) == 3);
    CHECK(pool->snap_bytes <= pool->snap_bytes_max);
    free(la);
    free(lb);
done:
    kiln_seq_free(a);
    kiln_seq_free(b);
    kiln_seq_free(r);
    free(want);
    free(got);
    kiln_model_free(ref);
    kiln_model_free(m);
}

int main(void) {
    char *cfg = test_read_file(test_shared("fixtures/qwen3_next/config.json"), NULL);
    if (!cfg) return test_skip("no fixtures in KILN_SHARED");
    free(cfg);
    test_fixture("fixtures/qwen3_next");
    test_fixture("fixtures/qwen3_5_text");
    return test_finish();
}
