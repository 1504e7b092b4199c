/* test_moe_device.c — the MoE block with its routing on the backend (backend.h moe_route,
 * matmul_gather, moe_combine; model/moe.c's device forward, gemma.c's), on the CPU backend:
 *  1. the ops against values worked out here: top-k choices and softmax weights (ties, NaN,
 *     renormalisation, per-expert scales), gathered matmuls against weights dequantized by this
 *     file's own bit reader (bf16, f32, 3/4/8-bit codes), the gathered SwiGLU / GeGLU (two stacks,
 *     and one of gate-then-up rows), the weighted sum with a shared expert;
 *  2. the MoE fixtures (mlx-lm stacked experts) and the Gemma 4 MoE model forced onto that path
 *     (KILN_MOE_DEVICE_TOKENS) still match transformers' / numpy's logits as test_families asks,
 *     and the forward really ran there (kiln_moe_device_calls); the HF layout on the CPU keeps
 *     its tensors in place and so the bucketed forward;
 *  3. kiln_model_info's expert counts and the bytes a decoded token reads;
 *  4. when a forward routes on the backend (kiln_moe_routes_on_device), and forwards cut into
 *     chunks there give the same logits. */
#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "fixture_parity.h"
#include "kiln.h"
#include "model/moe.h"
#include "test_util.h"
#include "util/half.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static kiln_backend *cpu;

#define CHECK_NEAR(got, want, tol)                                                                 \
    CHECK_MSG(fabs((double)(got) - (double)(want)) <= (tol), "%s = %.9g, want %.9g", #got,         \
              (double)(got), (double)(want))

static void check_route(void) {
    /* two tokens: distinct logits, then a tie (lower index first) */
    const float logits[8] = {0.5f, 2.0f, 1.0f, 3.0f, 1.0f, 2.0f, 2.0f, 0.0f};
    int32_t ex[4];
    float w[4];
    cpu->moe_route(cpu, ex, w, logits, 2, 4, 2, false, NULL);
    CHECK_MSG(ex[0] == 3 && ex[1] == 1, "route token 0: %d,%d (want 3,1)", ex[0], ex[1]);
    CHECK_MSG(ex[2] == 1 && ex[3] == 2, "route token 1 (tie): %d,%d (want 1,2)", ex[2], ex[3]);
    const double z0 = exp(0.5) + exp(2.0) + exp(1.0) + exp(3.0);
    CHECK_NEAR(w[0], exp(3.0) / z0, 1e-6);
    CHECK_NEAR(w[1], exp(2.0) / z0, 1e-6);
    const double z1 = exp(1.0) + 2 * exp(2.0) + 1.0;
    CHECK_NEAR(w[2], exp(2.0) / z1, 1e-6);
    /* renormalised over the k, then times the chosen experts' scales */
    const float scale[4] = {10.0f, 20.0f, 30.0f, 40.0f};
    cpu->moe_route(cpu, ex, w, logits, 1, 4, 2, true, scale);
    const double s = exp(3.0) + exp(2.0);
    CHECK_NEAR(w[0], exp(3.0) / s * 40.0, 1e-5);
    CHECK_NEAR(w[1], exp(2.0) / s * 20.0, 1e-5);
    /* NaN logits lose to every number and are taken last, lowest index first */
    const float nan_logits[4] = {NAN, 1.0f, NAN, 0.0f};
    int32_t ex3[3];
    float w3[3];
    cpu->moe_route(cpu, ex3, w3, nan_logits, 1, 4, 3, false, NULL);
    CHECK_MSG(ex3[0] == 1 && ex3[1] == 3 && ex3[2] == 0, "route with NaN: %d,%d,%d (want 1,3,0)",
              ex3[0], ex3[1], ex3[2]);
    /* kiln_moe_route (the host forward's) is the same choice */
    int idx[2];
    float wh[2];
    kiln_moe_route(logits + 4, 4, 2, false, idx, wh);
    CHECK_MSG(idx[0] == 1 && idx[1] == 2, "kiln_moe_route tie: %d,%d", idx[0], idx[1]);
}

/* Code c of a row's little-endian bit stream of `bits`-bit codes, read bit by bit. */
static unsigned code_at(const uint32_t *row, int64_t c, int bits) {
    unsigned v = 0;
    for (int b = 0; b < bits; b++) {
        const int64_t bit = c * bits + b;
        v |= ((row[bit / 32] >> (bit % 32)) & 1u) << b;
    }
    return v;
}

/* A stack of E experts of `rows` rows, gathered for pairs with x_div 2, against double sums over
 * weights this test dequantizes itself. bits 0: dense of dtype dt. */
static void check_gather_case(kiln_dtype dt, int bits, int group) {
    enum { E = 3, ROWS = 5, COLS = 64, N = 6, XDIV = 2 };
    const int64_t R = (int64_t)E * ROWS;
    kiln_matrix w = {.dtype = bits ? KILN_DT_U32 : dt, .rows = R, .cols = COLS};
    double *ref_w = malloc((size_t)(R * COLS) * sizeof(double)); /* [R, COLS] */
    void *data = NULL;
    uint16_t *sc = NULL, *bi = NULL;
    uint64_t seed = 1234u + (uint64_t)bits * 7u + (uint64_t)dt;
    if (bits) {
        const int64_t wpr = COLS * bits / 32, gpr = COLS / group;
        uint32_t *codes = malloc((size_t)(R * wpr) * 4);
        sc = malloc((size_t)(R * gpr) * 2);
        bi = malloc((size_t)(R * gpr) * 2);
        for (int64_t i = 0; i < R * wpr; i++) codes[i] = (uint32_t)(test_rand_u64(&seed) >> 7);
        for (int64_t i = 0; i < R * gpr; i++) {
            sc[i] = kiln_f32_to_bf16(test_rand_uniform(&seed, 0.01f, 0.03f));
            bi[i] = kiln_f32_to_bf16(test_rand_uniform(&seed, -0.2f, -0.1f));
        }
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < COLS; c++) {
                const int64_t g = r * gpr + c / group;
                ref_w[r * COLS + c] =
                    (double)kiln_bf16_to_f32(sc[g]) * code_at(codes + r * wpr, c, bits) +
                    kiln_bf16_to_f32(bi[g]);
            }
        data = codes;
        w.bits = bits, w.group_size = group, w.scale_dtype = KILN_DT_BF16;
        w.scales = sc, w.biases = bi;
    } else if (dt == KILN_DT_BF16) {
        uint16_t *h = malloc((size_t)(R * COLS) * 2);
        for (int64_t i = 0; i < R * COLS; i++) {
            h[i] = kiln_f32_to_bf16(test_rand_uniform(&seed, -0.5f, 0.5f));
            ref_w[i] = kiln_bf16_to_f32(h[i]);
        }
        data = h;
    } else {
        float *f = malloc((size_t)(R * COLS) * 4);
        for (int64_t i = 0; i < R * COLS; i++)
            ref_w[i] = f[i] = test_rand_uniform(&seed, -0.5f, 0.5f);
        data = f;
    }
    w.data = data;
    float x[(N / XDIV) * COLS], y[N * ROWS];
    for (int i = 0; i < (N / XDIV) * COLS; i++) x[i] = test_rand_uniform(&seed, -1.0f, 1.0f);
    const int32_t experts[N] = {2, 0, 1, 1, 2, 2};
    cpu->matmul_gather(cpu, y, x, XDIV, N, experts, &w, ROWS);
    double err = 0, norm = 0;
    for (int i = 0; i < N; i++)
        for (int r = 0; r < ROWS; r++) {
            double want = 0;
            for (int c = 0; c < COLS; c++)
                want +=
                    ref_w[((int64_t)experts[i] * ROWS + r) * COLS + c] * x[(i / XDIV) * COLS + c];
            err += (y[i * ROWS + r] - want) * (y[i * ROWS + r] - want);
            norm += want * want;
        }
    const double rel = sqrt(err / (norm > 0 ? norm : 1));
    CHECK_MSG(rel <= 1e-6, "matmul_gather %s bits %d group %d: rel L2 %.3g", kiln_dtype_name(dt),
              bits, group, rel);
    free(data), free(sc), free(bi), free(ref_w);
}

/* The gathered SwiGLU / GeGLU against dense weights written here: gate and up as two stacks, and
 * as one stack of gate-then-up rows per expert (Gemma's gate_up), against explicit sums. */
static void check_gather_glu(bool one_stack) {
    enum { E = 3, ROWS = 4, COLS = 16, N = 4 };
    const int64_t stride = one_stack ? 2 * ROWS : ROWS, up_off = one_stack ? ROWS : 0;
    float *g = malloc((size_t)(E * stride * COLS) * 4),
          *u = malloc((size_t)(E * stride * COLS) * 4);
    uint64_t seed = one_stack ? 77 : 78;
    for (int64_t i = 0; i < E * stride * COLS; i++) {
        g[i] = test_rand_uniform(&seed, -0.5f, 0.5f);
        u[i] = test_rand_uniform(&seed, -0.5f, 0.5f);
    }
    const kiln_matrix gm = {.dtype = KILN_DT_F32, .rows = E * stride, .cols = COLS, .data = g};
    const kiln_matrix um = {
        .dtype = KILN_DT_F32, .rows = E * stride, .cols = COLS, .data = one_stack ? g : u};
    float x[N * COLS], y[N * ROWS];
    for (int i = 0; i < N * COLS; i++) x[i] = test_rand_uniform(&seed, -1.0f, 1.0f);
    const int32_t experts[N] = {1, 2, 0, 2};
    const kiln_glu_act act = one_stack ? KILN_GLU_GELU_TANH : KILN_GLU_SILU;
    cpu->matmul_gather_glu(cpu, y, x, 1, N, experts, &gm, &um, ROWS, stride, up_off, act);
    const float *ud = one_stack ? g : u;
    for (int i = 0; i < N; i++)
        for (int r = 0; r < ROWS; r++) {
            double a = 0, b = 0;
            const int64_t gr = experts[i] * stride + r, ur = experts[i] * stride + up_off + r;
            for (int c = 0; c < COLS; c++) {
                a += (double)g[gr * COLS + c] * x[i * COLS + c];
                b += (double)ud[ur * COLS + c] * x[i * COLS + c];
            }
            const double act_a =
                one_stack ? 0.5 * a * (1 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))
                          : a / (1 + exp(-a));
            CHECK_NEAR(y[i * ROWS + r], act_a * b, 1e-5);
        }
    free(g), free(u);
}

static void check_combine(void) {
    /* T = 2 tokens, k = 2, H = 3 */
    const float ye[12] = {1, 2, 3, 4, 5, 6, -1, 0, 1, 10, 20, 30};
    const float wts[4] = {0.25f, 0.75f, 0.5f, 0.1f};
    const float shared[6] = {100, 200, 300, 1, 1, 1};
    const float logit[2] = {0.0f, 2.0f};
    float y[6];
    cpu->moe_combine(cpu, y, ye, wts, 2, 2, 3, NULL, NULL);
    const float want[6] = {3.25f, 4.25f, 5.25f, 0.5f, 2.0f, 3.5f};
    for (int i = 0; i < 6; i++) CHECK_NEAR(y[i], want[i], 1e-6);
    cpu->moe_combine(cpu, y, ye, wts, 2, 2, 3, shared, logit);
    const double g1 = 1.0 / (1.0 + exp(-2.0));
    CHECK_NEAR(y[0], 3.25 + 0.5 * 100, 1e-5);
    CHECK_NEAR(y[5], 3.5 + g1, 1e-5);
    cpu->moe_combine(cpu, y, ye, wts, 2, 2, 3, shared, NULL); /* no gate: weight 1 */
    CHECK_NEAR(y[4], 2.0 + 1.0, 1e-6);
}

/* kiln_model_info of a MoE model counts what a token reads: qwen3_moe has 3 layers of 8 bf16
 * experts of gate / up [64, 128] and down [128, 64], 2 per token, so 6/8 of their 1,179,648
 * bytes are left out; a dense model reads everything. */
static void check_info(void) {
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_load(test_shared("fixtures/qwen3_moe"), NULL, &m));
    if (m) {
        const kiln_model_info *in = kiln_model_get_info(m);
        CHECK(in->n_experts == 8 && in->experts_per_token == 2);
        const int64_t experts = 3LL * 8 * 3 * 64 * 128 * 2;
        CHECK_MSG(in->active_weight_bytes == in->weight_bytes - experts / 8 * 6,
                  "active %lld of %lld bytes", (long long)in->active_weight_bytes,
                  (long long)in->weight_bytes);
        kiln_model_free(m);
    }
    CHECK_OK(kiln_model_load(test_shared("fixtures/qwen3"), NULL, &m));
    if (m) {
        const kiln_model_info *in = kiln_model_get_info(m);
        CHECK(in->n_experts == 0 && in->active_weight_bytes == in->weight_bytes);
        kiln_model_free(m);
    }
}

/* The fixture forced onto the device forward: parity as test_families, and MoE calls counted. */
static long check_fixture(const char *name, bool want_device) {
    const long before = kiln_moe_device_calls();
    const fixture_parity_opts o = {.device = KILN_DEVICE_CPU, .tol = 1e-4, .allow_near_tie = false};
    fixture_parity_check(name, &o);
    const long ran = kiln_moe_device_calls() - before;
    CHECK_MSG(want_device ? ran > 0 : ran == 0, "%s: %ld MoE blocks ran on the device path", name,
              ran);
    fprintf(stderr, "%-22s %ld MoE blocks routed on the backend\n", name, ran);
    return ran;
}

/* a backend's moe_gather_grouped for this rule test: grouped from 64 pairs, not for 3-bit codes */
static bool grouped_from_64(const kiln_backend *be, const kiln_matrix *w, int64_t pairs) {
    (void)be;
    return pairs >= 64 && w->bits != 3;
}

/* kiln_moe_routes_on_device: decode steps up to the backend's token limit, longer forwards only
 * where every stack's gathers run grouped, and KILN_MOE_DEVICE_TOKENS's limit is final. */
static void check_routing_rule(void) {
    const kiln_matrix q4 = {.dtype = KILN_DT_U32, .bits = 4, .group_size = 32};
    const kiln_matrix q3 = {.dtype = KILN_DT_U32, .bits = 3, .group_size = 32};
    const kiln_matrix *const both4[2] = {&q4, &q4}, *const mixed[2] = {&q4, &q3};
    CHECK_MSG(!kiln_moe_routes_on_device(cpu, 1, 8, 2, both4), "the CPU routed on the backend");
    kiln_backend be = *cpu;
    be.moe_device_max_tokens = 4;
    be.moe_gather_grouped = grouped_from_64;
    be.moe_device_tokens_set = false;
    CHECK(kiln_moe_routes_on_device(&be, 4, 8, 2, both4));   /* decode: the token limit */
    CHECK(!kiln_moe_routes_on_device(&be, 5, 8, 2, both4));  /* 40 pairs: not grouped */
    CHECK(kiln_moe_routes_on_device(&be, 8, 8, 2, both4));   /* 64 pairs: grouped */
    CHECK(!kiln_moe_routes_on_device(&be, 16, 4, 2, mixed)); /* one stack not grouped */
    CHECK(kiln_moe_routes_on_device(&be, 4, 8, 2, mixed));   /* the decode limit still holds */
    be.moe_device_tokens_set = true; /* KILN_MOE_DEVICE_TOKENS: its limit and no more */
    CHECK(!kiln_moe_routes_on_device(&be, 8, 8, 2, both4));
    CHECK(kiln_moe_routes_on_device(&be, 4, 8, 2, both4));
    be.moe_device_tokens_set = false;
    be.moe_route = NULL; /* without the ops, never */
    CHECK(!kiln_moe_routes_on_device(&be, 1, 8, 2, both4));
    CHECK(!kiln_moe_routes_on_device(&be, 8, 8, 2, both4));
}

int main(void) {
    CHECK_OK(kiln_backend_cpu_new(2, &cpu));
    if (!cpu) return test_finish();
    CHECK_MSG(kiln_moe_device_max_tokens(cpu) == 0, "the CPU routes on the host by default");
    check_route();
    check_gather_case(KILN_DT_BF16, 0, 0);
    check_gather_case(KILN_DT_F32, 0, 0);
    check_gather_case(KILN_DT_U32, 4, 32);
    check_gather_case(KILN_DT_U32, 3, 32);
    check_gather_case(KILN_DT_U32, 8, 64);
    check_gather_glu(false);
    check_gather_glu(true);
    check_combine();
    check_info();
    check_routing_rule();

    setenv("KILN_MOE_DEVICE_TOKENS", "100000", 1); /* every forward, prefill included */
    kiln_backend *env_be = NULL;                   /* backends made from now on take it */
    CHECK_OK(kiln_backend_new(KILN_DEVICE_CPU, 1, &env_be));
    CHECK(env_be && kiln_moe_device_max_tokens(env_be) == 100000);
    kiln_backend_free(env_be);
    const long whole = check_fixture("qwen3_moe-mlx-q4g32", true);
    /* forwards cut into chunks of 3 tokens (as CUDA cuts prefill into 2048): same logits, more
     * blocks */
    kiln_moe_set_device_chunk(3);
    const long chunked = check_fixture("qwen3_moe-mlx-q4g32", true);
    CHECK_MSG(chunked > whole, "chunks of 3 tokens ran %ld blocks, whole forwards %ld", chunked,
              whole);
    const long g_before = kiln_moe_device_calls();
    fixture_gemma4_moe_check(KILN_DEVICE_CPU, 1e-4, false);
    CHECK_MSG(kiln_moe_device_calls() > g_before, "gemma4 moe did not route on the backend");
    kiln_moe_set_device_chunk(0);
    CHECK(kiln_moe_device_chunk() == 2048);
    check_fixture("qwen3_moe-mlx-q8g64", true);
    check_fixture("qwen3_next-mlx-q4g32", true);
    check_fixture("qwen3_next-mlx-q8g64", true);
    check_fixture("qwen3_moe", false); /* HF layout: no upload_stack on the CPU */
    const long before = kiln_moe_device_calls();
    fixture_gemma4_moe_check(KILN_DEVICE_CPU, 1e-4, false);
    CHECK_MSG(kiln_moe_device_calls() > before, "gemma4 moe did not route on the backend");
    setenv("KILN_MOE_DEVICE_TOKENS", "1", 1); /* decode steps only */
    check_fixture("qwen3_next-mlx-q4g32", true);
    kiln_backend_free(cpu);
    return test_finish();
}
