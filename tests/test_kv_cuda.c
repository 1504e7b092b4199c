/* test_kv_cuda.c — the paged KV caches in device memory (kv_paged.cu, attention_paged.cu)
 * against the CPU paged caches (kv_paged.c) fed the same random K/V/Q, for every cache kind
 * (f32, bf16, f16, q8, q4, TurboQuant with and without key rotation, 3- and 4-bit values) and
 * several geometries (GQA and not, head dims 64 / 96 / 128 / 256, a sliding window, a logit
 * softcap):
 *   - attention outputs of every step (prefill chunks n > 1 from empty and at an offset, decode
 *     n = 1, lengths that do not divide the 16-token block, a 1030-key context that takes the
 *     split-K path with its log-sum-exp merge; prefill chunks of 64+ tokens on the tensor-core
 *     kernel where the records are not rotated) by relative L2 <= 1e-4;
 *   - both the per-sequence calls (store / attend) and the batched hook (store_attend_batch with
 *     positions read from device memory) of three sequences at different lengths;
 *   - a fork (prefix shared block by block) followed by diverging writes: copy-on-write of the
 *     shared device block;
 *   - the stored records: the device encodes each K/V row to the same bytes as the CPU codec
 *     (at most 0.1% of the records may differ by a rounding tie, and their decoded values must
 *     stay within 1e-3 relative L2).
 * Outputs are poisoned (NaN) before each step, so an unwritten element fails. Without a GPU, a
 * build without CUDA, or KILN_CUDA_PAGED=0, the test prints why and exits 77: skipped. */
#include "backend/backend.h"
#include "kv/kv_codec.h"
#include "kv/kv_factory.h"
#include "kv/kv_pool.h"
#include "test_util.h"

#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef KILN_HAVE_CUDA
int main(void) {
    return test_skip("built without CUDA (no nvcc at configure time)");
}
#else

enum { N_LAYERS = 2, MAX_SEQ = 4, MAX_TOKENS = 2048, BLOCK = 16 };

typedef struct kv_case {
    const char *kind;
    int n_heads, n_kv_heads, head_dim;
    int window; /* layer 1's sliding window (0: full attention) */
    float softcap;
    int prefill; /* tokens of sequence 0's first chunk */
} kv_case;

static kiln_backend *be;
static uint64_t rng = 0x6b76637564610001ull;

static void fill_normal(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = test_rand_normal(&rng);
}

/* Both sides of one test: the CPU caches and the device caches, each drawn from its own pool. */
typedef struct kv_pair {
    const kv_case *c;
    kiln_kv_layer_desc layers[N_LAYERS];
    void *cpu_shared, *gpu_shared;
    kiln_kv *cpu[MAX_SEQ], *gpu[MAX_SEQ];
    int n_seq;
    /* device buffers for the stacked rows of one step */
    float *dk, *dv, *dq, *dout;
    int32_t *dpos;
    int64_t cap_rows;
} kv_pair;

static double worst_out_err;

/* One step: sequence ids[i] adds n[i] tokens (random K/V/Q). The CPU runs store + attend per
 * sequence; the device runs the batched hook (batched) or the per-sequence calls. Every layer's
 * outputs are compared. */
static void step(kv_pair *P, const int *ids, const int *n, int count, bool batched) {
    const kv_case *c = P->c;
    const int H = c->n_kv_heads, hd = c->head_dim, NH = c->n_heads;
    const int64_t kw = (int64_t)H * hd, qw = (int64_t)NH * hd;
    int T = 0;
    for (int i = 0; i < count; i++) T += n[i];
    if (T > P->cap_rows) {
        CHECK_MSG(false, "test step of %d rows over the buffers' %lld", T, (long long)P->cap_rows);
        return;
    }
    float *k = malloc(sizeof(float) * (size_t)(T * kw)),
          *v = malloc(sizeof(float) * (size_t)(T * kw));
    float *q = malloc(sizeof(float) * (size_t)(T * qw));
    float *ref = malloc(sizeof(float) * (size_t)(T * qw)),
          *got = malloc(sizeof(float) * (size_t)(T * qw));
    float *nan_rows = malloc(sizeof(float) * (size_t)(T * qw));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    kiln_kv *gk[MAX_SEQ];
    for (int i = 0, t = 0; i < count; i++) {
        CHECK_OK(P->cpu[ids[i]]->vt->reserve(P->cpu[ids[i]], n[i]));
        CHECK_OK(P->gpu[ids[i]]->vt->reserve(P->gpu[ids[i]], n[i]));
        for (int j = 0; j < n[i]; j++) pos[t + j] = P->gpu[ids[i]]->len + j;
        gk[i] = P->gpu[ids[i]];
        t += n[i];
    }
    be->upload(be, P->dpos, pos, sizeof(int32_t) * (size_t)T);
    memset(nan_rows, 0xff, sizeof(float) * (size_t)(T * qw));
    kiln_attn_params ap = {.n_heads = NH, .scale = 1.0f / sqrtf((float)hd), .softcap = c->softcap};
    for (int l = 0; l < N_LAYERS; l++) {
        fill_normal(k, T * kw);
        fill_normal(v, T * kw);
        fill_normal(q, T * qw);
        for (int i = 0, t = 0; i < count; t += n[i], i++) {
            kiln_kv *kv = P->cpu[ids[i]];
            kv->vt->store(kv, l, k + t * kw, v + t * kw, n[i]);
            kv->vt->attend(kv, l, q + t * qw, n[i], ref + t * qw, &ap, NULL);
        }
        be->upload(be, P->dk, k, sizeof(float) * (size_t)(T * kw));
        be->upload(be, P->dv, v, sizeof(float) * (size_t)(T * kw));
        be->upload(be, P->dq, q, sizeof(float) * (size_t)(T * qw));
        be->upload(be, P->dout, nan_rows, sizeof(float) * (size_t)(T * qw));
        if (batched) {
            kiln_attn_params dp = ap;
            dp.positions = P->dpos;
            gk[0]->vt->store_attend_batch(gk, n, count, l, P->dk, P->dv, P->dq, P->dout, &dp, NULL);
        } else {
            for (int i = 0, t = 0; i < count; t += n[i], i++) {
                gk[i]->vt->store(gk[i], l, P->dk + t * kw, P->dv + t * kw, n[i]);
                gk[i]->vt->attend(gk[i], l, P->dq + t * qw, n[i], P->dout + t * qw, &ap, NULL);
            }
        }
        CHECK_OK(be->synchronize(be)); /* a failed launch or kernel fault shows up here */
        be->download(be, got, P->dout, sizeof(float) * (size_t)(T * qw));
        int64_t bad = 0;
        for (int64_t i = 0; i < T * qw; i++) bad += !isfinite(got[i]);
        double err = bad ? INFINITY : test_rel_l2(got, ref, (size_t)(T * qw));
        if (err > worst_out_err) worst_out_err = err;
        CHECK_MSG(bad == 0 && err <= 1e-4,
                  "%s h%d/%d d%d layer %d, %d seqs (%s, first n %d, len %d): %lld non-finite, "
                  "rel err %.3g",
                  c->kind, NH, H, hd, l, count, batched ? "batched" : "per sequence", n[0],
                  P->gpu[ids[0]]->len, (long long)bad, err);
    }
    for (int i = 0; i < count; i++) {
        P->cpu[ids[i]]->vt->commit(P->cpu[ids[i]], n[i]);
        P->gpu[ids[i]]->vt->commit(P->gpu[ids[i]], n[i]);
    }
    free(k), free(v), free(q), free(ref), free(got), free(nan_rows), free(pos);
}

/* Every record still held (both sides' block tables): same bytes, or (rare rounding ties) close
 * decoded values. */
static void compare_records(kv_pair *P) {
    kv_pool *cp = kv_paged_pool(P->cpu[0]), *gp = kv_paged_pool(P->gpu[0]);
    const size_t bytes = (size_t)gp->n_blocks * gp->block_bytes;
    uint8_t *gdata = malloc(bytes);
    be->download(be, gdata, gp->data, bytes);
    int64_t records = 0, differ = 0;
    double num = 0, den = 0;
    const kv_case *c = P->c;
    float *a = malloc(sizeof(float) * (size_t)c->head_dim),
          *b = malloc(sizeof(float) * (size_t)c->head_dim);
    for (int s = 0; s < P->n_seq; s++)
        for (int l = 0; l < N_LAYERS; l++) {
            const kv_layer_fmt *f = &cp->fmt[l];
            for (int p = 0; p < P->cpu[s]->len; p++) {
                int32_t ci = kv_paged_block_id(P->cpu[s], l, p / BLOCK);
                int32_t gi = kv_paged_block_id(P->gpu[s], l, p / BLOCK);
                CHECK((ci < 0) == (gi < 0));
                if (ci < 0 || gi < 0) continue; /* dropped by the sliding window */
                for (int h = 0; h < c->n_kv_heads; h++)
                    for (int which = 0; which < 2; which++) {
                        size_t rec = which ? f->v_rec : f->k_rec;
                        size_t off = (which ? f->v_offset : 0) +
                                     ((size_t)(p % BLOCK) * c->n_kv_heads + h) * rec;
                        const uint8_t *cr = kv_pool_block(cp, ci) + off;
                        const uint8_t *gr = gdata + (size_t)gi * gp->block_bytes + off;
                        records++;
                        const kv_codec *codec = which ? &f->v : &f->k;
                        kv_codec_decode(codec, cr, c->head_dim, a);
                        kv_codec_decode(codec, gr, c->head_dim, b);
                        for (int d = 0; d < c->head_dim; d++) {
                            num += (double)(a[d] - b[d]) * (a[d] - b[d]);
                            den += (double)a[d] * a[d];
                        }
                        if (memcmp(cr, gr, rec) != 0 && differ++ == 0) /* the first one */
                            fprintf(stderr,
                                    "%s: first differing record: seq %d layer %d pos %d head %d "
                                    "%s, decoded cpu/gpu: %g/%g %g/%g %g/%g %g/%g\n",
                                    c->kind, s, l, p, h, which ? "V" : "K", a[0], b[0], a[1], b[1],
                                    a[2], b[2], a[3], b[3]);
                    }
            }
        }
    double rel = den > 0 ? sqrt(num / den) : 0;
    CHECK_MSG(records > 0 && differ * 1000 <= records && rel <= 1e-3,
              "%s: %lld of %lld device records differ from the CPU's bytes, decoded rel err %.3g",
              c->kind, (long long)differ, (long long)records, rel);
    fprintf(stderr, "%-24s h%2d/%d d%3d  %6lld records, %lld differ in bytes, out err <= %.2g\n",
            c->kind, c->n_heads, c->n_kv_heads, c->head_dim, (long long)records, (long long)differ,
            worst_out_err);
    free(a), free(b), free(gdata);
}

static void run_case(const kv_case *c) {
    kv_pair P;
    memset(&P, 0, sizeof P);
    P.c = c;
    for (int l = 0; l < N_LAYERS; l++)
        P.layers[l] = (kiln_kv_layer_desc){.n_kv_heads = c->n_kv_heads,
                                           .head_dim = c->head_dim,
                                           .v_head_dim = c->head_dim,
                                           .window = l == 1 ? c->window : 0,
                                           .is_attention = true};
    kiln_kv_options o;
    CHECK_OK(kiln_kv_options_parse(c->kind, &o));
    o.block_tokens = BLOCK;
    o.budget_bytes = (int64_t)96 << 20;
    o.paged = true;
    worst_out_err = 0;
    P.cap_rows = c->prefill > 64 ? c->prefill : 64;
    const int64_t qw = (int64_t)c->n_heads * c->head_dim;
    P.dk = be->alloc(be, sizeof(float) * (size_t)(P.cap_rows * qw));
    P.dv = be->alloc(be, sizeof(float) * (size_t)(P.cap_rows * qw));
    P.dq = be->alloc(be, sizeof(float) * (size_t)(P.cap_rows * qw));
    P.dout = be->alloc(be, sizeof(float) * (size_t)(P.cap_rows * qw));
    P.dpos = be->alloc(be, sizeof(int32_t) * (size_t)P.cap_rows);
    P.n_seq = 3;
    kiln_status st = KILN_OK;
    for (int i = 0; i < P.n_seq && st == KILN_OK; i++) {
        st = kiln_kv_cpu_new_shared(&P.cpu_shared, NULL, P.layers, N_LAYERS, &o, MAX_TOKENS,
                                    &P.cpu[i]);
        if (st == KILN_OK)
            st = kiln_kv_backend_new_shared(&P.gpu_shared, be, NULL, P.layers, N_LAYERS, &o,
                                            MAX_TOKENS, &P.gpu[i]);
    }
    CHECK_OK(st);
    if (st == KILN_OK) {
        CHECK(strcmp(P.gpu[0]->vt->kind, "paged-device") == 0);
        /* seq 0's first chunk alone, by the per-sequence calls (prefill, or decode from empty) */
        int ids[MAX_SEQ] = {0, 1, 2, 3}, n[MAX_SEQ];
        n[0] = c->prefill;
        const long long fa0 = kiln_cuda_fa_launches();
        step(&P, ids, n, 1, false);
        /* 64+ tokens take the tensor-core prefill kernel, one launch a layer (every kind: rotated
         * keys with q rotated in the kernel); shorter chunks the paged CUDA-core kernel */
        const bool want_tc = c->prefill >= 64;
        CHECK_MSG(kiln_cuda_fa_launches() - fa0 == (want_tc ? N_LAYERS : 0),
                  "%s prefill %d: %lld tensor-core attention launches", c->kind, c->prefill,
                  kiln_cuda_fa_launches() - fa0);
        /* all three batched: a decode, a 19-token prefill from empty, one token from empty */
        n[0] = 1, n[1] = 19, n[2] = 1;
        step(&P, ids, n, 3, true);
        for (int s = 0; s < 3; s++) { /* decode steps, batched */
            n[0] = n[1] = n[2] = 1;
            step(&P, ids, n, 3, true);
        }
        /* per sequence: a decode of seq 2 and a 5-token chunk of seq 1 at an offset */
        int one[1] = {2}, five[1] = {5}, id1[1] = {1};
        n[0] = 1;
        step(&P, one, n, 1, false);
        step(&P, id1, five, 1, false);
        /* fork seq 0 into seq 3 on both sides; both then write into the shared last block */
        CHECK_OK(kv_paged_fork(P.cpu[0], &P.cpu[3]));
        CHECK_OK(kv_paged_fork(P.gpu[0], &P.gpu[3]));
        if (P.cpu[3] && P.gpu[3]) {
            P.n_seq = 4;
            int fid[2] = {0, 3}, fn[2] = {1, 1};
            for (int s = 0; s < 3; s++) step(&P, fid, fn, 2, true);
            fn[0] = 3, fn[1] = 18; /* past the block boundary on both */
            step(&P, fid, fn, 2, true);
        }
        compare_records(&P);
    }
    for (int i = 0; i < MAX_SEQ; i++) {
        kiln_kv_free(P.cpu[i]);
        kiln_kv_free(P.gpu[i]);
    }
    kiln_kv_shared_free(P.cpu_shared);
    kiln_kv_shared_free(P.gpu_shared);
    be->free(be, P.dk), be->free(be, P.dv), be->free(be, P.dq), be->free(be, P.dout);
    be->free(be, P.dpos);
}

/* The plain-float kinds (bf16, f16, f32) too: until 2026-12-03 their device records lost the low
 * byte of each 16-bit value (two byte stores; now one 16-bit store, kv_codec.cuh). */
static const kv_case cases[] = {
    {"q8", 8, 2, 128, 40, 0.0f, 37},         {"q4", 8, 2, 64, 0, 0.0f, 1030},
    {"turbo:k8v4", 8, 2, 128, 0, 0.0f, 17},  {"turbo:k4v4:rotk:kg64", 8, 2, 128, 0, 30.0f, 100},
    {"turbo:k8v3", 4, 4, 64, 0, 0.0f, 1},    {"turbo:k8v4:rotk", 16, 2, 256, 0, 0.0f, 40},
    {"q8:g32", 6, 2, 96, 24, 0.0f, 33},      {"q4:g32", 4, 1, 96, 0, 0.0f, 16},
    {"turbo:k8v4", 8, 2, 64, 0, 0.0f, 1030}, {"bf16", 8, 2, 128, 0, 0.0f, 100},
    {"f16", 8, 8, 64, 0, 0.0f, 5},           {"f32", 4, 2, 64, 0, 0.0f, 7},
};

int main(void) {
    char why[200];
    if (kiln_cuda_device_count(why, sizeof why) == 0) return test_skip(why);
    const char *env = getenv("KILN_CUDA_PAGED");
    if (env && strcmp(env, "0") == 0)
        return test_skip("KILN_CUDA_PAGED=0: the device paged caches are switched off");
    CHECK_OK(kiln_backend_cuda_new(1, &be));
    if (!be) return test_finish();
    CHECK(be->kv_paged_ops != NULL);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    kiln_backend_free(be);
    return test_finish();
}
#endif
