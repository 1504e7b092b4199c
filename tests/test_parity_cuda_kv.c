/* test_parity_cuda_kv.c — whole models on the GPU with the paged device KV caches against the
 * same models on the CPU with the same --kv kind (fixtures in ../shared/fixtures):
 *   - logits of the fixture prompt (one forward, every position) within a relative L2 bound of
 *     the kind (the K/V rows differ by the backends' float error before they are quantized),
 *     or of the codec's own noise (the CPU with this kind vs the CPU with the exact f32 cache);
 *   - a 24-token greedy continuation through the cache: the same tokens (a flip where the CPU's
 *     top-2 margin is below 2e-3 of its logit range, or below the largest logit shift the codec
 *     itself causes, is reported as a near-tie, not failed); in MoE models the same experts at
 *     every step (from the routing log, KILN_MOE_LOG; a flip of the router's choice where the
 *     CPU's margin is below the largest margin shift the codec itself causes is a routing
 *     near-tie: reported, and the comparison stops there, as the two then run other experts);
 *   - prefix sharing on the device pool: a sequence attached to the cached blocks of another
 *     (kiln_seq_prefix_attach; with a prompt of whole blocks, its first write is a copy-on-write
 *     of the shared last block) gives the logits it gets alone, then both decode as one batch;
 *     the hybrid fixture (qwen3_next: recurrent states in device memory, snapshots copied to the
 *     host) reuses up to the boundary where the first sequence's first call ended;
 *   - decode steps replayed from recorded CUDA graphs give the same bits as launched ops while
 *     the block tables grow under them.
 * Without a GPU (or KILN_CUDA_PAGED=0) the test exits 77 with the reason. For a diagnosis,
 * KILN_TEST_FIXTURE=name and KILN_TEST_KV=kind run only that fixture's / kind's parity checks
 * (e.g. qwen3_next and q4 with KILN_MOE_LOG: the CPU model, then the device one, then the exact
 * one), without the prefix and graph checks. */
#include "kiln.h"
#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#endif
#include "fixture_parity.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef KILN_HAVE_CUDA
/* hybrid: recurrent layers beside attention ones (states in device memory); prefix sharing then
 * reuses up to the last block boundary where a forward call ended (a state snapshot) */
static const struct {
    const char *name;
    bool hybrid;
} fixtures[] = {
    {"llama", false}, {"qwen3", false}, {"llama-mlx-q4g32", false}, {"qwen3_next", true}};
/* block > 0: explicit blocks (--kv-block), which put the plain kinds in the device pool too;
 * without, they stay in the contiguous device caches */
static const struct {
    const char *kind;
    double tol;
    int block;
} kinds[] = {
    {"bf16", 2e-3, 0},       {"q8", 5e-3, 0},         {"q4", 2e-2, 0},
    {"turbo:k8v4", 2e-2, 0}, {"turbo:k8v3", 3e-2, 0}, {"turbo:k4v4:rotk", 3e-2, 0},
    {"f32", 1e-3, 16},       {"bf16", 2e-3, 16},      {"f16", 2e-3, 16},
};

static kiln_model *load(const char *dir, kiln_device dev, const char *kind, int block) {
    kiln_load_options lo;
    kiln_load_options_default(&lo);
    lo.device = dev;
    CHECK_OK(kiln_kv_options_parse(kind, &lo.kv));
    if (block > 0) lo.kv.block_tokens = block, lo.kv.paged = true;
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_load(dir, &lo, &m));
    return m;
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Top-2 margin of x relative to its range. */
static double margin(const float *x, int n) {
    int32_t b = argmax(x, n);
    float second = -INFINITY, lo = x[0], hi = x[0];
    for (int i = 0; i < n; i++) {
        if (i != b && x[i] > second) second = x[i];
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    return hi > lo ? (x[b] - second) / (hi - lo) : 0;
}

static bool read_prompt(const char *dir, int32_t **ids, int *n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/reference.json", dir);
    char *text = test_read_file(path, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!j) return false;
    *ids = fixture_json_ids(cJSON_GetObjectItem(j, "input_ids"), n);
    cJSON_Delete(j);
    return *n > 1;
}

/* Largest |a[i] - b[i]|. */
static double max_abs_diff(const float *a, const float *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        m = d > m ? d : m;
    }
    return m;
}

/* The MoE routing of one forward call, read from the routing log (KILN_MOE_LOG, src/model/moe.c):
 * each line's experts and margin (the k-th chosen router logit minus the best one left out), in
 * file order (layer after layer, token after token). */
typedef struct {
    int n, cap;
    char (*experts)[48];
    double *margin;
} route_list;

static const char *g_route_log; /* the log this process writes (set before any model loads) */

/* The lines appended to the log since *pos (then *pos = its end) into r. */
static void routes_read(long *pos, route_list *r) {
    r->n = 0;
    FILE *f = g_route_log ? fopen(g_route_log, "r") : NULL;
    if (!f) return;
    char line[256], run[64], experts[48];
    long call;
    long long t;
    double m;
    if (fseek(f, *pos, SEEK_SET) == 0)
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "moe %63s %ld %lld %47s %lf", run, &call, &t, experts, &m) == 5) {
                if (r->n == r->cap) {
                    r->cap = r->cap ? 2 * r->cap : 256;
                    r->experts = realloc(r->experts, sizeof *r->experts * (size_t)r->cap);
                    r->margin = realloc(r->margin, sizeof *r->margin * (size_t)r->cap);
                    if (!r->experts || !r->margin) abort();
                }
                snprintf(r->experts[r->n], sizeof r->experts[r->n], "%s", experts);
                r->margin[r->n++] = m;
            }
    *pos = ftell(f);
    fclose(f);
}

static void routes_free(route_list *r) {
    free(r->experts);
    free(r->margin);
}

/* First line where a and b chose different experts (-1: none, or different lengths: -2). */
static int routes_first_difference(const route_list *a, const route_list *b) {
    if (a->n != b->n) return -2;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->experts[i], b->experts[i]) != 0) return i;
    return -1;
}

/* Largest |margin a - margin b| over the lines where a and b chose the same experts: how far the
 * codec moves the router's decisions (a = the CPU with the kind, b = the CPU with f32). */
static double routes_margin_shift(const route_list *a, const route_list *b) {
    double shift = 0;
    for (int i = 0; i < a->n && i < b->n; i++)
        if (strcmp(a->experts[i], b->experts[i]) == 0) {
            double d = fabs(a->margin[i] - b->margin[i]);
            shift = d > shift ? d : shift;
        }
    return shift;
}

/* Prompt logits and greedy continuation: CUDA vs CPU with the same cache kind. A third model, the
 * CPU with the exact f32 cache fed the CPU's tokens, measures the codec's own noise at each step
 * (CPU kind vs CPU f32): a quantized cache turns the backends' ~1e-6 float differences into whole
 * code steps where a value sits near a rounding boundary, so the device may differ from the CPU by
 * up to that noise (bound: max(tol, 1.5 x noise)), and a greedy flip is a near-tie when the CPU's
 * top-2 gap is below 2e-3 of its range or below the codec's own largest logit shift. In MoE
 * models the same holds for the router: a step where the device chose other experts than the CPU
 * is a routing near-tie when the CPU's margin there is below the codec's largest margin shift so
 * far (CPU kind vs CPU f32, where those two chose alike); a flip with a wider margin fails. */
static void kind_parity(const char *name, const char *dir, const char *kind, double tol, int block,
                        const int32_t *prompt, int n) {
    char label[80]; /* the kind as given on the command line */
    snprintf(label, sizeof label, block > 0 ? "%s --kv-block %d" : "%s", kind, block);
    kiln_model *cpu = load(dir, KILN_DEVICE_CPU, kind, block);
    kiln_model *gpu = load(dir, KILN_DEVICE_CUDA, kind, block);
    kiln_model *exact = load(dir, KILN_DEVICE_CPU, "f32", 0);
    if (!cpu || !gpu || !exact) {
        kiln_model_free(cpu);
        kiln_model_free(gpu);
        kiln_model_free(exact);
        return;
    }
    const int V = kiln_model_get_info(cpu)->vocab_size;
    kiln_seq *sc = NULL, *sg = NULL, *sx = NULL;
    CHECK_OK(kiln_seq_new(cpu, &sc));
    CHECK_OK(kiln_seq_new(gpu, &sg));
    CHECK_OK(kiln_seq_new(exact, &sx));
    float *lc = malloc(sizeof(float) * (size_t)n * V), *lg = malloc(sizeof(float) * (size_t)n * V);
    float *lx = malloc(sizeof(float) * (size_t)n * V);
    kiln_batch_entry e = {sc, prompt, n, KILN_LOGITS_ALL, lc};
    CHECK_OK(kiln_forward(cpu, &e, 1));
    e = (kiln_batch_entry){sg, prompt, n, KILN_LOGITS_ALL, lg};
    CHECK_OK(kiln_forward(gpu, &e, 1));
    e = (kiln_batch_entry){sx, prompt, n, KILN_LOGITS_ALL, lx};
    CHECK_OK(kiln_forward(exact, &e, 1));
    double err = test_rel_l2(lg, lc, (size_t)n * V);
    double noise = test_rel_l2(lc, lx, (size_t)n * V);
    double bound = tol > 1.5 * noise ? tol : 1.5 * noise;
    CHECK_MSG(err <= bound,
              "%s --kv %s: prompt logits cuda vs cpu rel err %.3g (bound %.2g: tol %.1g, codec "
              "noise %.3g)",
              name, label, err, bound, tol, noise);
    /* greedy through the cache, each side feeding its own picks (the exact model the CPU's) */
    enum { STEPS = 24 };
    int32_t tc = argmax(lc + (size_t)(n - 1) * V, V), tg = argmax(lg + (size_t)(n - 1) * V, V);
    int same = 0, near_tie = -1, route_tie = -1;
    double worst = err, worst_noise = noise, route_shift = 0;
    route_list rc = {0}, rg = {0}, rx = {0};
    long route_pos = 0;
    routes_read(&route_pos, &rc);                   /* to the log's end */
    const float *last_c = lc + (size_t)(n - 1) * V; /* the CPU logits that picked tc */
    double shift = max_abs_diff(last_c, lx + (size_t)(n - 1) * V, V);
    for (int s = 0; s < STEPS; s++) {
        if (tc != tg) {
            int32_t b = argmax(last_c, V);
            float second = -INFINITY;
            for (int i = 0; i < V; i++)
                if (i != b && last_c[i] > second) second = last_c[i];
            if (margin(last_c, V) < 2e-3 || (double)(last_c[b] - second) < shift)
                near_tie = s;
            else
                CHECK_MSG(false,
                          "%s --kv %s: greedy step %d: cpu %d, cuda %d (gap %.3g, codec "
                          "shift %.3g)",
                          name, label, s, tc, tg, (double)(last_c[b] - second), shift);
            break;
        }
        same++;
        e = (kiln_batch_entry){sc, &tc, 1, KILN_LOGITS_LAST, lc};
        CHECK_OK(kiln_forward(cpu, &e, 1));
        routes_read(&route_pos, &rc);
        e = (kiln_batch_entry){sg, &tg, 1, KILN_LOGITS_LAST, lg};
        CHECK_OK(kiln_forward(gpu, &e, 1));
        routes_read(&route_pos, &rg);
        e = (kiln_batch_entry){sx, &tc, 1, KILN_LOGITS_LAST, lx};
        CHECK_OK(kiln_forward(exact, &e, 1));
        routes_read(&route_pos, &rx);
        if (rc.n > 0) { /* an MoE model: the device must route as the CPU did */
            double sh = routes_margin_shift(&rc, &rx); /* the codec's, up to this step */
            route_shift = sh > route_shift ? sh : route_shift;
            int at = routes_first_difference(&rc, &rg);
            CHECK_MSG(at != -2,
                      "%s --kv %s: decode step %d: %d routing lines on the cpu, %d on cuda", name,
                      label, s, rc.n, rg.n);
            if (at >= 0 && rc.margin[at] < route_shift) {
                route_tie = s;
                fprintf(stderr,
                        "%-16s --kv %-18s decode step %d: routing near-tie (line %d: cpu %s "
                        "margin %.3g, cuda %s; codec margin shift %.3g): compared up to here\n",
                        name, label, s, at, rc.experts[at], rc.margin[at], rg.experts[at],
                        route_shift);
                break;
            }
            CHECK_MSG(at == -1,
                      "%s --kv %s: decode step %d: routing line %d: cpu %s (margin %.3g), cuda %s "
                      "(codec margin shift %.3g)",
                      name, label, s, at, at >= 0 ? rc.experts[at] : "",
                      at >= 0 ? rc.margin[at] : 0, at >= 0 ? rg.experts[at] : "", route_shift);
        }
        double d = test_rel_l2(lg, lc, (size_t)V), dn = test_rel_l2(lc, lx, (size_t)V);
        double b = tol > 1.5 * dn ? tol : 1.5 * dn;
        if (d > worst) worst = d;
        if (dn > worst_noise) worst_noise = dn;
        CHECK_MSG(d <= b,
                  "%s --kv %s: decode step %d logits rel err %.3g (bound %.2g: tol %.1g, codec "
                  "noise %.3g; cuda vs the exact cache %.3g)",
                  name, label, s, d, b, tol, dn, test_rel_l2(lg, lx, (size_t)V));
        shift = max_abs_diff(lc, lx, V);
        tc = argmax(lc, V);
        tg = argmax(lg, V);
        last_c = lc;
    }
    fprintf(stderr,
            "%-16s --kv %-18s prompt err %.2g, worst %.2g (codec noise up to %.2g), greedy %d/%d "
            "same%s%s\n",
            name, label, err, worst, worst_noise, same, STEPS,
            near_tie >= 0 ? " (then a near-tie)" : "",
            route_tie >= 0 ? " (then a routing near-tie)" : "");
    if (route_tie >= 0) /* near-ties may end the comparison, but not before half the steps */
        CHECK_MSG(route_tie >= STEPS / 2, "%s --kv %s: routing near-tie already at step %d", name,
                  label, route_tie);
    routes_free(&rc), routes_free(&rg), routes_free(&rx);
    free(lc), free(lg), free(lx);
    kiln_seq_free(sc);
    kiln_seq_free(sg);
    kiln_seq_free(sx);
    kiln_model_free(cpu);
    kiln_model_free(gpu);
    kiln_model_free(exact);
}

/* Prefix sharing on the device pool (4-token blocks so the short prompt has full ones). */
static void prefix_check(const char *name, const char *dir, const char *kind, const int32_t *prompt,
                         int n, bool hybrid) {
    const int B = 4;
    n -= n % B; /* whole blocks: the attached sequence recomputes the last token in place (COW) */
    if (n < 2 * B) return;
    kiln_model *m = load(dir, KILN_DEVICE_CUDA, kind, B);
    if (!m) return;
    const int V = kiln_model_get_info(m)->vocab_size;
    kiln_seq *a = NULL, *b = NULL, *solo = NULL;
    CHECK_OK(kiln_seq_new(m, &a));
    CHECK_OK(kiln_seq_new(m, &b));
    CHECK_OK(kiln_seq_new(m, &solo));
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V),
          *ls = malloc(sizeof(float) * V);
    /* a: two calls, the first ending on a block boundary (a hybrid model's snapshot point) */
    const int first = n - B;
    kiln_batch_entry e = {a, prompt, first, KILN_LOGITS_NONE, NULL};
    CHECK_OK(kiln_forward(m, &e, 1));
    e = (kiln_batch_entry){a, prompt + first, n - first, KILN_LOGITS_LAST, la};
    CHECK_OK(kiln_forward(m, &e, 1));
    e = (kiln_batch_entry){solo, prompt, n, KILN_LOGITS_LAST, ls};
    CHECK_OK(kiln_forward(m, &e, 1));
    int reused = 0;
    CHECK_OK(kiln_seq_prefix_attach(b, prompt, n, &reused));
    CHECK_MSG(reused == (hybrid ? first : n - 1), "%s --kv %s: attached %d of %d prompt tokens",
              name, kind, reused, n);
    e = (kiln_batch_entry){b, prompt + reused, n - reused, KILN_LOGITS_LAST, lb};
    CHECK_OK(kiln_forward(m, &e, 1));
    double err = test_rel_l2(lb, ls, (size_t)V);
    CHECK_MSG(err <= 5e-3, "%s --kv %s: attached sequence vs solo logits rel err %.3g", name, kind,
              err);
    /* a and b (sharing blocks) decode one batch together; each matches the solo sequence */
    int32_t tok = argmax(ls, V);
    kiln_batch_entry be2[2] = {{a, &tok, 1, KILN_LOGITS_LAST, la},
                               {b, &tok, 1, KILN_LOGITS_LAST, lb}};
    CHECK_OK(kiln_forward(m, be2, 2));
    e = (kiln_batch_entry){solo, &tok, 1, KILN_LOGITS_LAST, ls};
    CHECK_OK(kiln_forward(m, &e, 1));
    double ea = test_rel_l2(la, ls, (size_t)V), eb = test_rel_l2(lb, ls, (size_t)V);
    CHECK_MSG(ea <= 5e-3 && eb <= 5e-3, "%s --kv %s: batched decode vs solo rel err %.3g / %.3g",
              name, kind, ea, eb);
    fprintf(stderr, "%-16s --kv %-18s prefix: %d reused, err %.2g, batched %.2g / %.2g\n", name,
            kind, reused, err, ea, eb);
    free(la), free(lb), free(ls);
    kiln_seq_free(a);
    kiln_seq_free(b);
    kiln_seq_free(solo);
    kiln_model_free(m);
}

/* Graph replays vs launched ops, 200 decode steps of two sequences (alone, then batched). */
static void graph_check(const char *name, const char *dir, const char *kind) {
    kiln_model *m[2];
    for (int g = 0; g < 2; g++) {
        kiln_cuda_set_graph_mode(g);
        m[g] = load(dir, KILN_DEVICE_CUDA, kind, 0);
    }
    kiln_cuda_set_graph_mode(-1);
    if (!m[0] || !m[1]) {
        kiln_model_free(m[0]);
        kiln_model_free(m[1]);
        return;
    }
    const int V = kiln_model_get_info(m[0])->vocab_size, STEPS = 200;
    kiln_seq *s[2][2] = {{0}};
    float *row[2][2];
    const int32_t prompt[7] = {1, 5, 9, 2, 7, 3, 11};
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < 2; i++) {
            CHECK_OK(kiln_seq_new(m[g], &s[g][i]));
            row[g][i] = malloc(sizeof(float) * V);
            kiln_batch_entry e = {s[g][i], prompt, 7 - 4 * i, KILN_LOGITS_NONE, NULL};
            CHECK_OK(kiln_forward(m[g], &e, 1));
        }
    long long replays0 = kiln_cuda_graph_replays();
    int mismatches = 0, first_bad = -1;
    for (int t = 0; t < STEPS; t++) {
        int32_t tok[2] = {(int32_t)((t * 7919 + 13) % V), (int32_t)((t * 104729 + 5) % V)};
        int nb = t < 60 ? 1 : 2;
        for (int g = 0; g < 2; g++) {
            kiln_batch_entry e[2];
            for (int i = 0; i < nb; i++)
                e[i] = (kiln_batch_entry){s[g][i], &tok[i], 1, KILN_LOGITS_LAST, row[g][i]};
            CHECK_OK(kiln_forward(m[g], e, nb));
        }
        for (int i = 0; i < nb; i++)
            if (memcmp(row[0][i], row[1][i], sizeof(float) * V) != 0) {
                if (first_bad < 0) first_bad = t;
                mismatches++;
            }
    }
    long long replays = kiln_cuda_graph_replays() - replays0;
    CHECK_MSG(mismatches == 0, "%s --kv %s: graph replay differs at %d steps (first %d)", name,
              kind, mismatches, first_bad);
    CHECK_MSG(replays >= STEPS / 2, "%s --kv %s: only %lld of %d steps replayed", name, kind,
              replays, STEPS);
    fprintf(stderr, "%-16s --kv %-18s graphs: %d steps, %lld replayed, %d differ\n", name, kind,
            STEPS, replays, mismatches);
    for (int g = 0; g < 2; g++) {
        for (int i = 0; i < 2; i++) {
            kiln_seq_free(s[g][i]);
            free(row[g][i]);
        }
        kiln_model_free(m[g]);
    }
}
#endif

int main(void) {
#ifndef KILN_HAVE_CUDA
    return test_skip("built without CUDA (no nvcc at configure time)");
#else
    char why[200];
    if (kiln_cuda_device_count(why, sizeof why) == 0) return test_skip(why);
    const char *env = getenv("KILN_CUDA_PAGED");
    if (env && strcmp(env, "0") == 0)
        return test_skip("KILN_CUDA_PAGED=0: the device paged caches are switched off");
    /* the MoE routing log, before any model loads (moe.c opens it once): the user's, else ours */
    static char route_path[512];
    g_route_log = getenv("KILN_MOE_LOG");
    if (!g_route_log || !*g_route_log) {
        const char *tmp = getenv("TMPDIR");
        snprintf(route_path, sizeof route_path, "%s/kiln_parity_kv_routes.%ld.log",
                 tmp && *tmp ? tmp : "/tmp", (long)getpid());
        remove(route_path);
        setenv("KILN_MOE_LOG", route_path, 1);
        g_route_log = route_path;
    }
    const char *only_fixture = getenv("KILN_TEST_FIXTURE"), *only_kv = getenv("KILN_TEST_KV");
    const bool subset = (only_fixture && *only_fixture) || (only_kv && *only_kv);
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        char rel[256], dir[4000];
        const char *name = fixtures[f].name;
        if (only_fixture && *only_fixture && strcmp(only_fixture, name) != 0) continue;
        snprintf(rel, sizeof rel, "fixtures/%s", name);
        snprintf(dir, sizeof dir, "%s", test_shared(rel));
        int32_t *prompt = NULL;
        int n = 0;
        if (!read_prompt(dir, &prompt, &n)) {
            CHECK_MSG(false, "%s: cannot read reference.json", dir);
            free(prompt);
            continue;
        }
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
            if (!(only_kv && *only_kv) || (strcmp(only_kv, kinds[k].kind) == 0 && !kinds[k].block))
                kind_parity(name, dir, kinds[k].kind, kinds[k].tol, kinds[k].block, prompt, n);
        if (!subset) {
            prefix_check(name, dir, "q8", prompt, n, fixtures[f].hybrid);
            prefix_check(name, dir, "turbo:k8v4", prompt, n, fixtures[f].hybrid);
        }
        free(prompt);
    }
    if (subset) {
        fprintf(stderr, "subset only (KILN_TEST_FIXTURE=%s KILN_TEST_KV=%s)\n",
                only_fixture ? only_fixture : "", only_kv ? only_kv : "");
        if (route_path[0]) remove(route_path);
        return test_finish();
    }
    graph_check("qwen3", test_shared("fixtures/qwen3"), "q8");
    graph_check("llama", test_shared("fixtures/llama"), "turbo:k4v4:rotk");
    if (route_path[0]) remove(route_path);
    return test_finish();
#endif
}
