/* test_cuda_ops.c — every op of the CUDA backend against the CPU references of cpu_ops.h and
 * kiln_attention_contiguous, on fresh random inputs at several shapes (including sizes that are
 * not multiples of any tile), every weight format and bit width, by normalized L2 error. Outputs
 * are poisoned (NaN) before each run, so an unwritten element fails. The sampling op is compared
 * by ids, exactly: greedy (with ties) and sampled draws on logits with clear gaps, for vocabularies
 * that are not multiples of the block (151936, 32000, 1000, 7). Without a GPU (or a build
 * without CUDA) the test prints why and exits 77: skipped, never passed. */
#include "backend/backend.h"
#include "backend/cpu/cpu_deltanet.h"
#include "backend/cpu/cpu_ops.h"
#include "kv/kv_cache.h"
#include "ref_matmul.h"
#include "test_util.h"
#include "util/half.h"

#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef KILN_HAVE_CUDA
int main(void) {
    return test_skip("built without CUDA (no nvcc at configure time)");
}
#else

static kiln_backend *be;
static uint64_t rng = 0x5eed1234abcdull;

static float *rand_f32(int64_t n, float scale) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = scale * test_rand_normal(&rng);
    return p;
}

static void *dev_copy(const void *host, size_t bytes) {
    void *d = be->alloc(be, bytes ? bytes : 4);
    if (bytes) be->upload(be, d, host, bytes);
    return d;
}

/* A device buffer of n floats filled with NaN. */
static float *dev_poisoned(int64_t n) {
    float *d = be->alloc(be, (size_t)(n > 0 ? n : 1) * sizeof(float));
    uint8_t *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memset(h, 0xff, (size_t)(n > 0 ? n : 1) * sizeof(float));
    be->upload(be, d, h, (size_t)n * sizeof(float));
    free(h);
    return d;
}

/* Downloads dev[n] and compares with ref: every element finite, rel L2 <= tol. */
static double compare(const char *what, const float *dev, const float *ref, int64_t n, double tol) {
    CHECK_OK(be->synchronize(be));
    float *got = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    be->download(be, got, dev, (size_t)n * sizeof(float));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(got[i])) bad++;
    double err = bad ? INFINITY : test_rel_l2(got, ref, (size_t)n);
    CHECK_MSG(bad == 0 && err <= tol, "%s: %lld non-finite, rel err %.3g (tol %.1g)", what,
              (long long)bad, err, tol);
    free(got);
    return err;
}

/* ---- weights ---- */

typedef struct {
    kiln_matrix host, dev;
    void *data, *scales, *biases;
    float *bias;
} test_matrix;

static uint16_t to_half(float f, kiln_dtype dt) {
    return dt == KILN_DT_BF16 ? kiln_f32_to_bf16(f) : kiln_f32_to_f16(f);
}

static void make_dense(test_matrix *m, kiln_dtype dt, int64_t rows, int64_t cols, bool with_bias) {
    memset(m, 0, sizeof *m);
    size_t es = kiln_dtype_size(dt);
    m->data = malloc((size_t)(rows * cols) * es);
    for (int64_t i = 0; i < rows * cols; i++) {
        float v = 0.05f * test_rand_normal(&rng);
        if (dt == KILN_DT_F32)
            ((float *)m->data)[i] = v;
        else
            ((uint16_t *)m->data)[i] = to_half(v, dt);
    }
    m->host = (kiln_matrix){.dtype = dt, .rows = rows, .cols = cols, .data = m->data};
    if (with_bias) m->host.bias = m->bias = rand_f32(rows, 0.5f);
    CHECK_OK(be->upload_matrix(be, &m->host, &m->dev));
}

static void make_quant(test_matrix *m, int bits, int group, kiln_dtype sdt, int64_t rows,
                       int64_t cols, bool with_bias) {
    memset(m, 0, sizeof *m);
    int64_t words = rows * cols * bits / 32, groups = rows * (cols / group);
    uint32_t *q = malloc((size_t)words * 4);
    for (int64_t i = 0; i < words; i++) q[i] = (uint32_t)test_rand_u64(&rng);
    size_t ss = kiln_dtype_size(sdt);
    m->scales = malloc((size_t)groups * ss);
    m->biases = malloc((size_t)groups * ss);
    for (int64_t g = 0; g < groups; g++) {
        float s = test_rand_uniform(&rng, 0.005f, 0.02f);
        float b = -s * (float)(1 << (bits - 1)) * test_rand_uniform(&rng, 0.8f, 1.2f);
        if (sdt == KILN_DT_F32) {
            ((float *)m->scales)[g] = s;
            ((float *)m->biases)[g] = b;
        } else {
            ((uint16_t *)m->scales)[g] = to_half(s, sdt);
            ((uint16_t *)m->biases)[g] = to_half(b, sdt);
        }
    }
    m->data = q;
    m->host = (kiln_matrix){.dtype = KILN_DT_U32,
                            .rows = rows,
                            .cols = cols,
                            .data = q,
                            .bits = bits,
                            .group_size = group,
                            .scale_dtype = sdt,
                            .scales = m->scales,
                            .biases = m->biases};
    if (with_bias) m->host.bias = m->bias = rand_f32(rows, 0.5f);
    CHECK_OK(be->upload_matrix(be, &m->host, &m->dev));
}

static void free_matrix(test_matrix *m) {
    be->free_matrix(be, &m->dev);
    free(m->data);
    free(m->scales);
    free(m->biases);
    free(m->bias);
}

/* x_ranges: the first and last token get a zero 32-column block and blocks scaled by 1e4 and
 * 1e-4 (columns 0..95), which the dp4a GEMV's per-block fixed point must follow. */
static double g_matmul_tol = 0; /* > 0: the tolerance of check_matmul_x whatever the path */
static void check_matmul_x(test_matrix *m, int64_t n, const char *label, int force_path,
                           bool x_ranges) {
    int64_t rows = m->host.rows, cols = m->host.cols;
    float *x = rand_f32(n * cols, 1.0f);
    for (int64_t t = 0; x_ranges && cols >= 96 && t < n; t++) {
        if (t != 0 && t != n - 1) continue;
        for (int64_t j = 0; j < 96; j++) x[t * cols + j] *= j < 32 ? 0.0f : j < 64 ? 1e4f : 1e-4f;
    }
    float *ref = malloc((size_t)(n * rows) * sizeof(float));
    ref_matmul(ref, x, n, &m->host);
    float *dx = dev_copy(x, (size_t)(n * cols) * sizeof(float));
    float *dy = dev_poisoned(n * rows);
    const long long tc0 = kiln_cuda_tc_gemm_launches();
    kiln_cuda_force_matmul_path(force_path);
    be->matmul(be, dy, dx, n, &m->dev);
    kiln_cuda_force_matmul_path(0);
    /* GEMV (n <= 8) and cuBLAS SGEMM (f32 weights) compute in f32; the other GEMMs round x and
     * the weights to bf16, except the tensor-core GEMM (16-bit weights at 2..16 tokens by
     * default), which keeps x as a 16-bit hi + lo pair: products to ~2^-16 relative. */
    bool gemm = force_path == 2 || (force_path == 0 && n > 8);
    bool bf16_operands = gemm && m->host.dtype != KILN_DT_F32;
    bool tc = kiln_cuda_tc_gemm_launches() != tc0;
    double tol = g_matmul_tol > 0 ? g_matmul_tol : tc ? 3e-5 : bf16_operands ? 1e-2 : 1e-5;
    char what[160];
    snprintf(what, sizeof what, "matmul %s %lldx%lld n=%lld path=%d", label, (long long)rows,
             (long long)cols, (long long)n, force_path);
    double err = compare(what, dy, ref, n * rows, tol);
    if (getenv("KILN_TEST_VERBOSE")) printf("  %-60s err %.2e\n", what, err);
    be->free(be, dx);
    be->free(be, dy);
    free(x);
    free(ref);
}

static void check_matmul(test_matrix *m, int64_t n, const char *label, int force_path) {
    check_matmul_x(m, n, label, force_path, false);
}

static void test_matmul(void) {
    static const int64_t shapes[][2] = {{1, 32}, {13, 64}, {100, 1024}, {257, 2048}, {64, 4160}};
    static const int64_t ns[] = {1, 2, 3, 5, 8, 17, 64};
    const kiln_dtype dense[] = {KILN_DT_F32, KILN_DT_F16, KILN_DT_BF16};
    for (int d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            test_matrix m;
            make_dense(&m, dense[d], shapes[s][0], shapes[s][1], s % 2 == 1);
            for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
                check_matmul(&m, ns[i], kiln_dtype_name(dense[d]), 0);
            check_matmul(&m, 4, kiln_dtype_name(dense[d]), 2); /* GEMM at small n */
            free_matrix(&m);
        }
    /* odd widths: generic kernel for n <= 8, cuBLAS above */
    for (int d = 0; d < 3; d++) {
        test_matrix m;
        make_dense(&m, dense[d], 37, 100, true);
        check_matmul(&m, 1, "odd", 0);
        check_matmul(&m, 7, "odd", 0);
        check_matmul(&m, 19, "odd", 0);
        free_matrix(&m);
    }
    static const int bits[] = {2, 3, 4, 5, 6, 8};
    static const int groups[] = {32, 64, 128};
    const kiln_dtype sdts[] = {KILN_DT_F16, KILN_DT_BF16, KILN_DT_F32};
    for (size_t b = 0; b < 6; b++)
        for (size_t g = 0; g < 3; g++) {
            int64_t rows = g == 0 ? 129 : 64, cols = g == 2 ? 1152 : 2048 + 64 * (int64_t)g;
            test_matrix m;
            char label[64];
            make_quant(&m, bits[b], groups[g], sdts[(b + g) % 3], rows, cols, g == 1);
            snprintf(label, sizeof label, "q%dg%d/%s", bits[b], groups[g],
                     kiln_dtype_name(sdts[(b + g) % 3]));
            for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) check_matmul(&m, ns[i], label, 0);
            check_matmul(&m, 3, label, 3); /* generic per-element kernel */
            free_matrix(&m);
        }
    /* a Llama-sized decode shape, once per main format */
    {
        test_matrix m;
        make_quant(&m, 4, 32, KILN_DT_F16, 1024, 4096, false);
        check_matmul(&m, 1, "q4g32 big", 0);
        free_matrix(&m);
        make_dense(&m, KILN_DT_BF16, 1024, 4096, false);
        check_matmul(&m, 1, "bf16 big", 0);
        check_matmul(&m, 33, "bf16 big", 0);
        free_matrix(&m);
    }
}

/* Quantized (and f16) weights on the dequantize + cuBLAS path (taken from n >= 2 here): exact mode
 * (W and x each a bf16 hi + lo pair, three products) within 4e-5 of the CPU's f32 product, fast
 * mode (one bf16 product) within 1e-2; every bit width, group and scale dtype, x blocks of
 * very different magnitude. The tensor-core GEMM must not have run. */
static void test_dequant_gemm(void) {
    static const int bits[] = {2, 3, 4, 5, 6, 8};
    static const int groups[] = {32, 64, 128};
    static const int64_t ns[] = {9, 33, 130};
    const kiln_dtype sdts[] = {KILN_DT_F16, KILN_DT_BF16, KILN_DT_F32};
    kiln_cuda_set_dequant_min_n(2, 2);
    const long long tc_before = kiln_cuda_tc_gemm_launches();
    for (int fast = 0; fast < 2; fast++) {
        kiln_cuda_set_gemm_split(!fast);
        g_matmul_tol = fast ? 1e-2 : 4e-5;
        for (size_t b = 0; b < 6; b++)
            for (size_t g = 0; g < 3; g++) {
                int64_t rows = g == 0 ? 131 : 96, cols = g == 2 ? 1152 : 1024 + 64 * (int64_t)g;
                test_matrix m;
                char label[64];
                make_quant(&m, bits[b], groups[g], sdts[(b + g) % 3], rows, cols, g == 1);
                snprintf(label, sizeof label, "%s q%dg%d/%s", fast ? "fast" : "exact", bits[b],
                         groups[g], kiln_dtype_name(sdts[(b + g) % 3]));
                for (size_t i = 0; i < 3; i++) check_matmul_x(&m, ns[i], label, 0, i == 1);
                free_matrix(&m);
            }
        test_matrix m;
        make_dense(&m, KILN_DT_F16, 77, 4160, true);
        check_matmul_x(&m, 40, fast ? "fast f16" : "exact f16", 0, true);
        free_matrix(&m);
    }
    CHECK_MSG(kiln_cuda_tc_gemm_launches() == tc_before,
              "the tensor-core GEMM ran %lld times on the dequantize path",
              kiln_cuda_tc_gemm_launches() - tc_before);
    g_matmul_tol = 0;
    kiln_cuda_set_gemm_split(1);
    kiln_cuda_set_dequant_min_n(-1, -1);
}

/* The dp4a GEMV for 4- and 8-bit codes (KILN_CUDA_QGEMV=3), forced, at 1, 2 and 4 rows per warp,
 * every column split (0 = by shape, 1..8 warps per row) and with programmatic dependent launch on
 * and off: row counts that leave the last tile and block partly empty, one group per row,
 * n = 1..8, group 32/64/128, every scale dtype, with and without an output bias, and x blocks of
 * very different magnitude. */
static void test_qgemv_dp4a(void) {
    static const int splits[] = {0, 1, 2, 4, 8};
    static const int rows_per_warp[] = {0, 1, 2, 4};
    static const int bits[] = {4, 8};
    static const int groups[] = {32, 64, 128};
    const kiln_dtype sdts[] = {KILN_DT_F16, KILN_DT_BF16, KILN_DT_F32};
    int k = 0;
    kiln_cuda_set_qgemv_variant(3, 0);
    /* exact mode (x in three int8 digits, 1e-5), then fast mode (--fast-math: one digit, ~1e-2 as
     * llama.cpp's Q8_1; tolerance 5e-2) on the shapes up to 259 rows */
    for (int fast = 0; fast < 2; fast++) {
        kiln_cuda_set_gemm_split(!fast);
        g_matmul_tol = fast ? 5e-2 : 0;
        kiln_cuda_set_tc_gemm(0, -1, 0, 0); /* n = 2..8 would take the tensor-core GEMM */
        for (int b = 0; b < 2; b++)
            for (int g = 0; g < 3; g++) {
                const int64_t G = groups[g];
                const int64_t shapes[][2] = {
                    {7, G}, {13, 3 * G}, {259, 4224}, {61, 14336}, {1024, 4096}};
                for (int s = 0; s < (fast ? 3 : 5); s++) {
                    test_matrix m;
                    kiln_dtype sdt = sdts[(b + g + s) % 3];
                    make_quant(&m, bits[b], (int)G, sdt, shapes[s][0], shapes[s][1], s % 2 == 1);
                    for (int64_t n = 1; n <= 8; n++) {
                        if (s == 4 && n != 1 && n != 4)
                            continue; /* large: keep the CPU side short */
                        int split = splits[k % 5], rpw = rows_per_warp[(k / 5) % 4], pdl = k % 2;
                        char label[96];
                        snprintf(label, sizeof label, "%sdp4a q%dg%d/%s R=%d KS=%d pdl=%d",
                                 fast ? "fast " : "", bits[b], (int)G, kiln_dtype_name(sdt), rpw,
                                 split, pdl);
                        kiln_cuda_set_qgemv_dp4a(rpw, split, pdl);
                        check_matmul_x(&m, n, label, 0, k % 3 == 0);
                        k++;
                    }
                    free_matrix(&m);
                }
            }
    }
    g_matmul_tol = 0;
    kiln_cuda_set_gemm_split(1);
    kiln_cuda_set_qgemv_variant(-1, 0);
    kiln_cuda_set_qgemv_dp4a(-1, -1, -1);
    kiln_cuda_set_tc_gemm(-1, -1, 0, 0);
}

/* The row-streaming bf16 GEMV (KILN_CUDA_GEMV_DENSE=2), forced, at every column split: a single
 * chunk per row, rows that leave the last block partly empty, n = 1..8, with and without bias. */
static void test_gemv_bf16_rows(void) {
    static const int splits[] = {0, 1, 2, 4, 8};
    static const int64_t shapes[][2] = {{7, 8}, {13, 264}, {259, 4160}, {1024, 4096}};
    int k = 0;
    kiln_cuda_set_tc_gemm(0, -1, 0, 0); /* n = 2..8 would take the tensor-core GEMM */
    for (int s = 0; s < 4; s++) {
        test_matrix m;
        make_dense(&m, KILN_DT_BF16, shapes[s][0], shapes[s][1], s % 2 == 0);
        for (int64_t n = 1; n <= 8; n++) {
            if (s == 3 && n != 1 && n != 4) continue;
            char label[64];
            snprintf(label, sizeof label, "bf16 rows split=%d", splits[k % 5]);
            kiln_cuda_set_gemv_dense_variant(2, splits[k % 5]);
            check_matmul(&m, n, label, 0);
            k++;
        }
        free_matrix(&m);
    }
    kiln_cuda_set_gemv_dense_variant(-1, 0);
    kiln_cuda_set_tc_gemm(-1, -1, 0, 0);
}

/* The tensor-core GEMM (gemm_tc.cu), forced onto every n (kiln_cuda_set_tc_gemm mode 2): 4- and
 * 8-bit codes with group 32/64/128 and every scale dtype, dense bf16; row counts that leave the
 * last 128-row tile partly empty, one group per row, cols % 64 = 32 (group 32) and bf16 cols % 64
 * = 8; n from 1 to 130 (partial token tiles of every block shape 8/16/64/128), block shape and
 * split-K by shape or forced, output bias, x with a zero block and blocks scaled by 1e4 / 1e-4.
 * Precise numerics: 1e-5 like the GEMV (x is split into 16-bit hi + lo), 4e-5 for bf16 weights.
 */
static void test_tc_gemm(void) {
    static const int bits[] = {4, 8, 16};
    static const int groups[] = {32, 64, 128};
    static const int64_t ns[] = {1, 2, 5, 8, 9, 16, 17, 33, 64, 100, 130};
    static const int bns[] = {0, 8, 16, 64, 128};
    static const int splits[] = {0, 1, 2, 3, 5};
    const kiln_dtype sdts[] = {KILN_DT_F16, KILN_DT_BF16, KILN_DT_F32};
    long long l0 = kiln_cuda_tc_gemm_launches();
    int k = 0;
    for (int b = 0; b < 3; b++)
        for (int g = 0; g < (bits[b] == 16 ? 1 : 3); g++) {
            const int64_t G = bits[b] == 16 ? 64 : groups[g];
            const int64_t shapes[][2] = {{7, G},
                                         {13, 3 * G - (bits[b] == 16 ? 56
                                                       : G == 32     ? 0
                                                                     : G)},
                                         {129, 1152},
                                         {300, 2048 + (bits[b] == 16 ? 8 : G)},
                                         {1024, 4096}};
            for (int s = 0; s < 5; s++) {
                test_matrix m;
                const kiln_dtype sdt = sdts[(b + g + s) % 3];
                if (bits[b] == 16)
                    make_dense(&m, KILN_DT_BF16, shapes[s][0], shapes[s][1], s % 2 == 0);
                else
                    make_quant(&m, bits[b], (int)G, sdt, shapes[s][0], shapes[s][1], s % 2 == 1);
                for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
                    if (s == 4 && ns[i] != 2 && ns[i] != 8 && ns[i] != 64 && ns[i] != 130)
                        continue; /* large: keep the CPU reference short */
                    const int bn = bns[k % 5], sp = splits[(k / 5) % 5];
                    char label[96];
                    snprintf(label, sizeof label, "tc %s%d g%d/%s bn=%d splits=%d",
                             bits[b] == 16 ? "bf" : "q", bits[b], bits[b] == 16 ? 0 : (int)G,
                             bits[b] == 16 ? "-" : kiln_dtype_name(sdt), bn, sp);
                    /* a forced block shape must fit n (8/16 tokens up to 16, 64/128 above) */
                    const bool fits = bn == 0 || (ns[i] <= 16) == (bn <= 16);
                    kiln_cuda_set_tc_gemm(2, -1, fits ? bn : 0, sp);
                    /* bf16 weights take x as a bf16 hi + lo pair (16 significant bits, the
                     * quantized codes an f16 pair with 22): 1.65e-5 seen at 1024x4096 n=8 */
                    g_matmul_tol = bits[b] == 16 ? 4e-5 : 1e-5;
                    check_matmul_x(&m, ns[i], label, 0, k % 3 == 0);
                    g_matmul_tol = 0;
                    k++;
                }
                free_matrix(&m);
            }
        }
    kiln_cuda_set_tc_gemm(-1, -1, 0, 0);
    CHECK_MSG(kiln_cuda_tc_gemm_launches() - l0 == k, "tc gemm ran %lld of %d calls",
              kiln_cuda_tc_gemm_launches() - l0, k);
}

/* The tensor-core GEMM in fast mode (--fast-math), forced onto n = 2..130 across the block
 * shapes with forced split-K, on 300-row matrices (a partial row tile), x blocks of very
 * different magnitude:
 *  - int8 (the int8 variant, gemm_tc_int8.cuh): x on steps of 1/127 of its group's max |x| (one
 *    digit), so within 2e-2 of the f32 product (~7e-3 seen in the emulator's noise model); 4/8-bit
 *    codes at every group and scale dtype.
 *  - else the f16 kernels: the hi product only, x to 11 bits against codes (f16 after a
 *    power-of-two scale) and 8 against bf16 W, codes dequantized to f16 in registers (or, with
 *    kiln_cuda_set_tc_dq(0), against x with the scales folded in per group), so within 3e-3 /
 *    1e-2 (the emulator: 1.1e-4-6.7e-4 / 1.5e-3, each y inside its rounding bound); 4/8-bit codes
 *    and bf16 W. */
static void tc_fast_cases(bool int8) {
    static const int64_t ns[] = {2, 9, 17, 64, 130};
    const kiln_dtype sdts[] = {KILN_DT_F16, KILN_DT_BF16, KILN_DT_F32};
    const long long l0 = kiln_cuda_tc_gemm_launches();
    int k = 0;
    kiln_cuda_set_gemm_split(0);
    for (int b = 4; b <= (int8 ? 8 : 16); b += 4) {
        if (b == 12) continue;
        for (int g = 32; g <= (b == 16 ? 32 : 128); g *= 2) {
            test_matrix m;
            const kiln_dtype sdt = sdts[k % 3];
            if (b == 16)
                make_dense(&m, KILN_DT_BF16, 300, 2056, true);
            else
                make_quant(&m, b, g, sdt, 300, 2048 + g, g == 64);
            for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
                char label[96];
                snprintf(label, sizeof label, "tc %s %s%d g%d/%s splits=%d",
                         int8 ? "int8 fast" : "fast", b == 16 ? "bf" : "q", b, b == 16 ? 0 : g,
                         b == 16 ? "-" : kiln_dtype_name(sdt), (int)(i % 3));
                kiln_cuda_set_tc_gemm(2, -1, 0, (int)(i % 3));
                g_matmul_tol = int8 ? 2e-2 : b == 16 ? 1e-2 : 3e-3;
                check_matmul_x(&m, ns[i], label, 0, i % 2 == 0);
                g_matmul_tol = 0;
                k++;
            }
            free_matrix(&m);
        }
    }
    kiln_cuda_set_gemm_split(1);
    kiln_cuda_set_tc_gemm(-1, -1, 0, 0);
    CHECK_MSG(kiln_cuda_tc_gemm_launches() - l0 == k, "tc %s gemm ran %lld of %d calls",
              int8 ? "int8 fast" : "fast", kiln_cuda_tc_gemm_launches() - l0, k);
}
/* (the caller turns the int8 variant on) */
static void test_tc_gemm_int8_fast(void) {
    tc_fast_cases(true);
}
static void test_tc_gemm_fast(void) {
    tc_fast_cases(false);
}

/* One layer's fused ops at n tokens against the CPU references in order, as a layer calls them:
 * (with_multi: matmul_multi of x over the three q/k/v-like matrices m first), matmul_norm of x
 * over them, matmul_norm_glu through gate g / up u (F rows), matmul_add of the GLU output
 * through o (O rows); tag prefixes each check's name. */
static void check_layer_fusions(const char *tag, int c, int64_t n, int64_t cols,
                                const test_matrix m[3], const int64_t rows[3], const test_matrix *g,
                                const test_matrix *u, const test_matrix *o, int64_t F, int64_t O,
                                bool plus_one, kiln_glu_act act, double tol, bool with_multi) {
    float *x = rand_f32(n * cols, 1.5f), *nw = rand_f32(cols, 0.5f);
    float *hn = malloc((size_t)(n * cols) * 4);
    kiln_cpu_rmsnorm_ref(hn, x, nw, n, cols, 1e-6f, plus_one);
    float *dx = dev_copy(x, (size_t)(n * cols) * 4), *dnw = dev_copy(nw, (size_t)cols * 4);
    float *dh = dev_poisoned(n * (cols > F ? cols : F));
    float *ref[3], *dy[3];
    const kiln_matrix *ws[3];
    char what[128];
    /* matmul_multi on x (with_multi), then matmul_norm on rmsnorm(x) */
    for (int pass = with_multi ? 0 : 1; pass < 2; pass++) {
        for (int i = 0; i < 3; i++) {
            ref[i] = malloc((size_t)(n * rows[i]) * 4);
            ref_matmul(ref[i], pass ? hn : x, n, &m[i].host);
            dy[i] = dev_poisoned(n * rows[i]);
            ws[i] = &m[i].dev;
        }
        if (pass)
            be->matmul_norm(be, 3, dy, dx, dh, n, ws, dnw, 1e-6f, plus_one);
        else
            be->matmul_multi(be, 3, dy, dx, n, ws);
        for (int i = 0; i < 3; i++) {
            snprintf(what, sizeof what, "%s%s case %d n=%lld matrix %d", tag,
                     pass ? "matmul_norm" : "matmul_multi", c, (long long)n, i);
            compare(what, dy[i], ref[i], n * rows[i], tol);
            be->free(be, dy[i]);
            free(ref[i]);
        }
    }
    /* matmul_norm_glu */
    float *gr = malloc((size_t)(n * F) * 4), *ur = malloc((size_t)(n * F) * 4);
    ref_matmul(gr, hn, n, &g->host);
    ref_matmul(ur, hn, n, &u->host);
    if (act == KILN_GLU_GELU_TANH)
        kiln_cpu_gelu_tanh_mul(gr, gr, ur, n * F);
    else
        kiln_cpu_silu_mul_ref(gr, gr, ur, n * F);
    float *dout = dev_poisoned(n * F), *dup = dev_poisoned(n * F);
    be->matmul_norm_glu(be, dout, dx, dh, dup, n, &g->dev, &u->dev, dnw, 1e-6f, plus_one, act);
    snprintf(what, sizeof what, "%smatmul_norm_glu case %d n=%lld act %d", tag, c, (long long)n,
             (int)act);
    compare(what, dout, gr, n * F, tol);
    /* matmul_add: y += act @ o^T (act: the GLU reference output as the input) */
    float *y0 = rand_f32(n * O, 1.0f), *yr = malloc((size_t)(n * O) * 4);
    ref_matmul(yr, gr, n, &o->host);
    kiln_cpu_add(yr, yr, y0, n * O);
    float *dy0 = dev_copy(y0, (size_t)(n * O) * 4), *dact = dev_copy(gr, (size_t)(n * F) * 4);
    float *dtmp = dev_poisoned(n * O);
    be->matmul_add(be, dy0, dact, dtmp, n, &o->dev);
    snprintf(what, sizeof what, "%smatmul_add case %d n=%lld", tag, c, (long long)n);
    compare(what, dy0, yr, n * O, tol);
    be->free(be, dx), be->free(be, dnw), be->free(be, dh), be->free(be, dout);
    be->free(be, dup), be->free(be, dy0), be->free(be, dact), be->free(be, dtmp);
    free(x), free(nw), free(hn), free(gr), free(ur), free(y0), free(yr);
}

/* matmul_multi and the fused ops (norm, add, norm + GLU) on the tensor-core GEMM at n = 2..64,
 * against the references in order, at the GEMV's tolerance. */
static void test_tc_fused(void) {
    static const int64_t ns[] = {2, 5, 8, 17, 64};
    for (int c = 0; c < 3; c++) { /* q4g32 f16, q8g64 bf16, bf16 */
        const int64_t cols = c == 0 ? 1024 : c == 1 ? 576 : 1000, rows[3] = {2048, 7, 130};
        const int64_t F = c == 1 ? 192 : 1536, O = 200;
        test_matrix m[3], gt, up, o;
        for (int i = 0; i < 3; i++) {
            if (c == 2)
                make_dense(&m[i], KILN_DT_BF16, rows[i], cols, i == 1);
            else
                make_quant(&m[i], c == 0 ? 4 : 8, c == 0 ? 32 : 64,
                           c == 0 ? KILN_DT_F16 : KILN_DT_BF16, rows[i], cols, i == 1);
        }
        if (c == 2) {
            make_dense(&gt, KILN_DT_BF16, F, cols, true);
            make_dense(&up, KILN_DT_BF16, F, cols, false);
            make_dense(&o, KILN_DT_BF16, O, F, true);
        } else {
            const int bb = c == 0 ? 4 : 8, gg = c == 0 ? 32 : 64;
            const kiln_dtype sd = c == 0 ? KILN_DT_F16 : KILN_DT_BF16;
            make_quant(&gt, bb, gg, sd, F, cols, false);
            make_quant(&up, bb, gg, sd, F, cols, false);
            make_quant(&o, bb, c == 0 ? 32 : 64, sd, O, F, true);
        }
        kiln_cuda_set_tc_gemm(2, 64, 0,
                              0); /* forced: quantized n = 2..4 go to the GEMV by default */
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            const int64_t n = ns[k];
            const bool plus_one = k % 2 == 1;
            const kiln_glu_act act = k % 2 ? KILN_GLU_GELU_TANH : KILN_GLU_SILU;
            const long long l0 = kiln_cuda_tc_gemm_launches();
            check_layer_fusions("tc ", c, n, cols, m, rows, &gt, &up, &o, F, O, plus_one, act, 2e-5,
                                true);
            /* one launch each for multi, norm, glu, add */
            CHECK_MSG(kiln_cuda_tc_gemm_launches() - l0 == 4,
                      "tc fused case %d n=%lld: %lld launches", c, (long long)n,
                      kiln_cuda_tc_gemm_launches() - l0);
        }
        kiln_cuda_set_tc_gemm(-1, -1, 0, 0);
        for (int i = 0; i < 3; i++) free_matrix(&m[i]);
        free_matrix(&gt), free_matrix(&up), free_matrix(&o);
    }
}

/* The prefetch hint (prefetch.cu): with a budget it launches one kernel per call (whole first
 * matrix, a leading part of the others, a budget smaller than the first), without one nothing;
 * the matmuls after it give the same bits as before it. */
static void test_prefetch(void) {
    test_matrix q4, q8, bf;
    make_quant(&q4, 4, 64, KILN_DT_BF16, 1000, 4096, false);
    make_quant(&q8, 8, 32, KILN_DT_F16, 1000, 4096, true);
    make_dense(&bf, KILN_DT_BF16, 777, 4096, false);
    const kiln_matrix *ws[3] = {&q4.dev, &q8.dev, &bf.dev};
    float *x = rand_f32(2 * 4096, 1.0f), *dx = dev_copy(x, 2 * 4096 * 4);
    float *y0[3], *y1[3];
    for (int i = 0; i < 3; i++) {
        y0[i] = dev_poisoned(2 * 1000), y1[i] = dev_poisoned(2 * 1000);
        be->matmul(be, y0[i], dx, 2, ws[i]);
    }
    const int budgets[] = {0, 1, 3, 64};
    for (int b = 0; b < 4; b++) {
        kiln_cuda_set_prefetch_mb(budgets[b]);
        const long long l0 = kiln_cuda_prefetch_launches();
        be->prefetch(be, ws, 3);
        be->prefetch(be, ws + 2, 1);
        CHECK_MSG(kiln_cuda_prefetch_launches() - l0 == (budgets[b] ? 2 : 0),
                  "prefetch budget %d MB: %lld launches", budgets[b],
                  kiln_cuda_prefetch_launches() - l0);
        for (int i = 0; i < 3; i++) {
            be->matmul(be, y1[i], dx, 2, ws[i]);
            float h0[2000], h1[2000];
            const int64_t rows = ws[i]->rows;
            be->download(be, h0, y0[i], (size_t)(2 * rows) * 4);
            be->download(be, h1, y1[i], (size_t)(2 * rows) * 4);
            CHECK_MSG(memcmp(h0, h1, (size_t)(2 * rows) * 4) == 0,
                      "prefetch budget %d MB: matrix %d changed", budgets[b], i);
        }
    }
    kiln_cuda_set_prefetch_mb(-1);
    CHECK_OK(be->synchronize(be));
    for (int i = 0; i < 3; i++) be->free(be, y0[i]), be->free(be, y1[i]);
    be->free(be, dx);
    free(x);
    free_matrix(&q4), free_matrix(&q8), free_matrix(&bf);
}

static void test_embed(void) {
    test_matrix ms[4];
    make_dense(&ms[0], KILN_DT_BF16, 300, 96, false);
    make_dense(&ms[1], KILN_DT_F32, 50, 33, false);
    make_quant(&ms[2], 4, 64, KILN_DT_F16, 300, 256, false);
    make_quant(&ms[3], 3, 32, KILN_DT_BF16, 70, 96, false);
    for (int k = 0; k < 4; k++) {
        int64_t n = 11, cols = ms[k].host.cols;
        int32_t ids[11];
        for (int i = 0; i < 11; i++)
            ids[i] = (int32_t)(test_rand_u64(&rng) % (uint64_t)ms[k].host.rows);
        float *ref = malloc((size_t)(n * cols) * sizeof(float));
        kiln_cpu_embed(ref, ids, n, &ms[k].host);
        int32_t *dids = dev_copy(ids, sizeof ids);
        float *dout = dev_poisoned(n * cols);
        be->embed(be, dout, dids, n, &ms[k].dev);
        compare("embed", dout, ref, n * cols, 1e-6);
        be->free(be, dids);
        be->free(be, dout);
        free(ref);
        free_matrix(&ms[k]);
    }
}

static void test_rmsnorm(void) {
    static const int64_t dims[] = {1, 7, 128, 1000, 4096, 5120};
    for (size_t d = 0; d < 6; d++)
        for (int mode = 0; mode < 3; mode++) {
            int64_t n = 5, dim = dims[d];
            float *x = rand_f32(n * dim, 3.0f), *w = rand_f32(dim, 0.3f);
            float *ref = malloc((size_t)(n * dim) * sizeof(float));
            const float *wp = mode == 2 ? NULL : w;
            kiln_cpu_rmsnorm_ref(ref, x, wp, n, dim, 1e-6f, mode == 1);
            float *dx = dev_copy(x, (size_t)(n * dim) * 4), *dw = dev_copy(w, (size_t)dim * 4);
            float *dy = dev_poisoned(n * dim);
            be->rmsnorm(be, dy, dx, mode == 2 ? NULL : dw, n, dim, 1e-6f, mode == 1);
            compare("rmsnorm", dy, ref, n * dim, 1e-5);
            be->rmsnorm(be, dx, dx, mode == 2 ? NULL : dw, n, dim, 1e-6f, mode == 1); /* in place */
            compare("rmsnorm in place", dx, ref, n * dim, 1e-5);
            be->free(be, dx), be->free(be, dw), be->free(be, dy);
            free(x), free(w), free(ref);
        }
}

static void test_rope(void) {
    static const int cfg[][3] = {
        {4, 64, 64}, {8, 128, 128}, {2, 128, 64}, {3, 96, 32}, {2, 256, 256}};
    for (size_t c = 0; c < 5; c++) {
        int heads = cfg[c][0], hd = cfg[c][1], rot = cfg[c][2];
        int64_t n = 9, len = n * heads * hd;
        float *x = rand_f32(len, 1.0f), *ref = malloc((size_t)len * 4);
        float inv[256];
        for (int i = 0; i < rot / 2; i++) inv[i] = powf(10000.0f, -2.0f * (float)i / (float)rot);
        int32_t pos[9];
        for (int i = 0; i < 9; i++) pos[i] = i < 3 ? i : (int32_t)(test_rand_u64(&rng) % 131072);
        memcpy(ref, x, (size_t)len * 4);
        kiln_cpu_rope(ref, pos, n, heads, hd, rot, inv);
        float *dx = dev_copy(x, (size_t)len * 4), *dinv = dev_copy(inv, sizeof inv);
        int32_t *dpos = dev_copy(pos, sizeof pos);
        be->rope(be, dx, dpos, n, heads, hd, rot, dinv);
        compare("rope", dx, ref, len, 1e-5);
        be->free(be, dx), be->free(be, dinv), be->free(be, dpos);
        free(x), free(ref);
    }
}

/* matmul_multi: several matrices sharing x (one launch when all are bf16 and n <= 8, else one
 * matmul each) == the CPU reference of each matrix. Row counts not multiples of the GEMV tile. */
static void test_matmul_multi(void) {
    static const int64_t rows[][3] = {{2048, 512, 512}, {13, 7, 130}, {3072, 3072, 0}};
    static const int64_t ns[] = {1, 2, 5, 8, 17};
    for (int c = 0; c < 3; c++)
        for (int quant_mix = 0; quant_mix < 3; quant_mix++) { /* bf16, one quantized, all */
            const int64_t cols = c == 1 ? 96 : 1024;
            const int count = rows[c][2] ? 3 : 2;
            test_matrix m[3];
            for (int i = 0; i < count; i++) {
                if (quant_mix == 2)
                    make_quant(&m[i], c == 1 ? 8 : 4, 32, KILN_DT_F16, rows[c][i], cols, i == 0);
                else if (quant_mix == 1 && i == 1)
                    make_quant(&m[i], 4, 32, KILN_DT_BF16, rows[c][i], cols, false);
                else
                    make_dense(&m[i], KILN_DT_BF16, rows[c][i], cols, i == 2);
            }
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                int64_t n = ns[k];
                float *x = rand_f32(n * cols, 1.0f), *ref[3], *dy[3];
                float *dx = dev_copy(x, (size_t)(n * cols) * sizeof(float));
                const kiln_matrix *ws[3];
                for (int i = 0; i < count; i++) {
                    ref[i] = malloc((size_t)(n * rows[c][i]) * sizeof(float));
                    ref_matmul(ref[i], x, n, &m[i].host);
                    dy[i] = dev_poisoned(n * rows[c][i]);
                    ws[i] = &m[i].dev;
                }
                be->matmul_multi(be, count, dy, dx, n, ws);
                for (int i = 0; i < count; i++) {
                    char what[128];
                    snprintf(what, sizeof what, "matmul_multi case %d mix %d n=%lld matrix %d", c,
                             quant_mix, (long long)n, i);
                    /* n > 8 goes to cuBLAS with bf16 operands */
                    compare(what, dy[i], ref[i], n * rows[c][i], n > 8 ? 1e-2 : 1e-5);
                    be->free(be, dy[i]);
                    free(ref[i]);
                }
                be->free(be, dx);
                free(x);
            }
            for (int i = 0; i < count; i++) free_matrix(&m[i]);
        }
}

/* upload_matrices (default; KILN_CUDA_FUSE_WEIGHTS=0 turns it off): q/k/v- and gate/up-like sets in
 * one allocation each (bf16 with output biases, q4 / q8 with f16 / bf16 scales); matmul_multi over
 * them at n = 1..70 (past 8: one product of the stacked matrix, its columns scattered back) == the
 * CPU reference per matrix; a set whose parts are not whole 256-byte multiples comes back
 * KILN_ERR_UNSUPPORTED; the views free with their owner in any order. */
static void test_upload_matrices(void) {
    setenv("KILN_CUDA_FUSE_WEIGHTS", "1", 1);
    static const int64_t ns[] = {1, 8, 9, 40, 70};
    static const struct {
        int bits;
        kiln_dtype sdt;
        int64_t cols, rows[3];
        int count;
        bool bias;
    } cases[] = {{0, KILN_DT_BF16, 1024, {2048, 512, 512}, 3, true},
                 {4, KILN_DT_F16, 1024, {1536, 1536, 0}, 2, false},
                 {8, KILN_DT_BF16, 512, {1024, 256, 256}, 3, false}};
    for (int c = 0; c < 3; c++) {
        const int count = cases[c].count;
        const int64_t cols = cases[c].cols;
        test_matrix m[3];
        kiln_matrix hosts[3], outs[3];
        for (int i = 0; i < count; i++) {
            if (cases[c].bits)
                make_quant(&m[i], cases[c].bits, 64, cases[c].sdt, cases[c].rows[i], cols,
                           cases[c].bias);
            else
                make_dense(&m[i], KILN_DT_BF16, cases[c].rows[i], cols, cases[c].bias);
            hosts[i] = m[i].host;
        }
        CHECK_OK(be->upload_matrices(be, count, hosts, outs));
        for (int i = 1; i < count; i++) CHECK(outs[i].view && !outs[0].view);
        const kiln_matrix *ws[3] = {&outs[0], &outs[1], &outs[2]};
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            const int64_t n = ns[k];
            float *x = rand_f32(n * cols, 1.0f), *ref[3], *dy[3];
            float *dx = dev_copy(x, (size_t)(n * cols) * sizeof(float));
            for (int i = 0; i < count; i++) {
                ref[i] = malloc((size_t)(n * cases[c].rows[i]) * sizeof(float));
                ref_matmul(ref[i], x, n, &m[i].host);
                dy[i] = dev_poisoned(n * cases[c].rows[i]);
            }
            be->matmul_multi(be, count, dy, dx, n, ws);
            for (int i = 0; i < count; i++) {
                char what[128];
                snprintf(what, sizeof what, "upload_matrices case %d n=%lld matrix %d", c,
                         (long long)n, i);
                compare(what, dy[i], ref[i], n * cases[c].rows[i], n > 8 ? 1e-2 : 3e-5);
                be->free(be, dy[i]);
                free(ref[i]);
            }
            be->free(be, dx);
            free(x);
        }
        /* the views first: nothing freed until the owner goes */
        for (int i = count - 1; i >= 0; i--)
            if (!outs[i].view) be->free_matrix(be, &outs[i]);
        for (int i = 0; i < count; i++) {
            be->free_matrix(be, &m[i].dev); /* the separate upload make_* did */
            free(m[i].data), free(m[i].scales), free(m[i].biases), free(m[i].bias);
        }
    }
    /* 100 rows of 100 bf16: 20,000 bytes, not a multiple of 256 */
    test_matrix a, b;
    make_dense(&a, KILN_DT_BF16, 100, 100, false);
    make_dense(&b, KILN_DT_BF16, 100, 100, false);
    kiln_matrix hosts[2] = {a.host, b.host}, outs[2];
    CHECK(be->upload_matrices(be, 2, hosts, outs) == KILN_ERR_UNSUPPORTED);
    free_matrix(&a);
    free_matrix(&b);
    /* switched off: not fused (the loader uploads one by one) */
    setenv("KILN_CUDA_FUSE_WEIGHTS", "0", 1);
    make_dense(&a, KILN_DT_BF16, 128, 1024, false);
    make_dense(&b, KILN_DT_BF16, 128, 1024, false);
    kiln_matrix hosts2[2] = {a.host, b.host};
    CHECK(be->upload_matrices(be, 2, hosts2, outs) == KILN_ERR_UNSUPPORTED);
    free_matrix(&a);
    free_matrix(&b);
    unsetenv("KILN_CUDA_FUSE_WEIGHTS");
}

/* The decode-layer fusions (matmul_norm, matmul_add, matmul_norm_glu) == rmsnorm / matmul / add /
 * GLU references in order: dense bf16, f16, f32 weights through the fused GEMV (n <= 8), n = 17
 * and a quantized case through the composition; row counts not multiples of the tile; biases,
 * (1 + w) norms and both GLU activations. */
static void test_matmul_fused(void) {
    static const int64_t ns[] = {1, 2, 5, 8, 17};
    static const kiln_dtype dts[] = {KILN_DT_BF16, KILN_DT_F16, KILN_DT_F32};
    for (int c = 0; c < 4; c++) { /* dtypes, then a quantized case */
        const int64_t cols = c == 1 ? 96 : 1024, rows[3] = {c == 1 ? 13 : 2048, 7, 130};
        const int64_t F = c == 1 ? 40 : 3072, O = c == 1 ? 96 : 1024; /* glu rows, add rows */
        test_matrix m[3], g, u, o;
        for (int i = 0; i < 3; i++) {
            if (c == 3)
                make_quant(&m[i], 4, 32, KILN_DT_F16, rows[i], cols, i == 1);
            else
                make_dense(&m[i], dts[c], rows[i], cols, i == 1);
        }
        if (c == 3) {
            make_quant(&g, 4, 32, KILN_DT_F16, F, cols, false);
            make_quant(&u, 8, 64, KILN_DT_F16, F, cols, false);
            make_quant(&o, 4, 32, KILN_DT_F16, O, F, false);
        } else {
            make_dense(&g, dts[c], F, cols, c == 0);
            make_dense(&u, dts[c], F, cols, false);
            make_dense(&o, dts[c], O, F, c == 2);
        }
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            const int64_t n = ns[k];
            const bool plus_one = k % 2 == 1;
            const kiln_glu_act act = k % 2 ? KILN_GLU_GELU_TANH : KILN_GLU_SILU;
            const double tol = n > 8 || c == 3 ? 1e-2 : 2e-5; /* n > 8: cuBLAS with bf16 x */
            check_layer_fusions("", c, n, cols, m, rows, &g, &u, &o, F, O, plus_one, act, tol,
                                false);
        }
        for (int i = 0; i < 3; i++) free_matrix(&m[i]);
        free_matrix(&g), free_matrix(&u), free_matrix(&o);
    }
}

/* The fusions on the dp4a GEMV (4/8-bit weights, n <= 8): matmul_norm (q/k/v in one launch),
 * matmul_add, matmul_norm_glu and the plain multi-matmul against the CPU reference composition
 * (rmsnorm, matmul, add, SiLU/GELU), with x's digits from pass 1 and made in the blocks (inline
 * 0 = never, 1 = wherever it fits, 2 = by the default budget), PDL on and off; row counts that
 * leave the last tile and block partly empty, (1 + w) and absent norm weights, biases, x blocks of
 * very different magnitude (matmul_add). One call per op, as a layer makes them. */
static void check_qfused_case(int bits, int G, kiln_dtype sdt, int64_t cols, const int64_t rows[3],
                              int64_t F, int64_t O, int64_t n, int k) {
    const bool plus_one = k % 2 == 1, bias = k % 3 == 1, no_norm_w = k % 7 == 3;
    const kiln_glu_act act = (k / 2) % 2 ? KILN_GLU_GELU_TANH : KILN_GLU_SILU;
    const int inl = k % 3, pdl = (k / 3) % 2;
    kiln_cuda_set_qgemv_inline(inl);
    kiln_cuda_set_qgemv_dp4a(0, 0, pdl);
    char label[120];
    snprintf(label, sizeof label, "q%dg%d/%s cols=%lld n=%lld inline=%d pdl=%d", bits, G,
             kiln_dtype_name(sdt), (long long)cols, (long long)n, inl, pdl);
    /* o's cols (the GLU width F, which need not be a multiple of the group: gate / up rows that
     * leave tiles partly empty) rounded up to whole groups: a quantized matrix of F columns is
     * refused by upload_matrix, and matmul_add then ran on its NULL device copy (an illegal
     * address that failed every later check in the process) */
    const int64_t Fo = (F + G - 1) / G * G;
    test_matrix m[3], g, u, o;
    for (int i = 0; i < 3; i++) make_quant(&m[i], bits, G, sdt, rows[i], cols, bias && i == 1);
    make_quant(&g, bits, G, sdt, F, cols, bias);
    make_quant(&u, bits, G, sdt, F, cols, false);
    make_quant(&o, bits, G, sdt, O, Fo, bias);
    float *x = rand_f32(n * cols, 1.5f), *nw = no_norm_w ? NULL : rand_f32(cols, 0.5f);
    float *hn = malloc((size_t)(n * cols) * 4);
    kiln_cpu_rmsnorm_ref(hn, x, nw, n, cols, 1e-6f, plus_one);
    float *dx = dev_copy(x, (size_t)(n * cols) * 4);
    float *dnw = nw ? dev_copy(nw, (size_t)cols * 4) : NULL;
    float *dh = dev_poisoned(n * (cols > F ? cols : F));
    char what[200];
    /* matmul_norm over q/k/v-like matrices, and the plain multi-matmul of x */
    for (int plain = 0; plain < 2; plain++) {
        float *ref[3], *dy[3];
        const kiln_matrix *ws[3];
        for (int i = 0; i < 3; i++) {
            ref[i] = malloc((size_t)(n * rows[i]) * 4);
            ref_matmul(ref[i], plain ? x : hn, n, &m[i].host);
            dy[i] = dev_poisoned(n * rows[i]);
            ws[i] = &m[i].dev;
        }
        if (plain)
            be->matmul_multi(be, 3, dy, dx, n, ws);
        else
            be->matmul_norm(be, 3, dy, dx, dh, n, ws, dnw, 1e-6f, plus_one);
        for (int i = 0; i < 3; i++) {
            snprintf(what, sizeof what, "%s %s matrix %d%s", plain ? "matmul_multi" : "matmul_norm",
                     label, i,
                     plus_one ? " (1+w)"
                     : nw     ? ""
                              : " (no w)");
            compare(what, dy[i], ref[i], n * rows[i], 1e-5);
            be->free(be, dy[i]);
            free(ref[i]);
        }
    }
    /* matmul_norm_glu */
    float *gr = malloc((size_t)(n * F) * 4), *ur = malloc((size_t)(n * F) * 4);
    ref_matmul(gr, hn, n, &g.host);
    ref_matmul(ur, hn, n, &u.host);
    if (act == KILN_GLU_GELU_TANH)
        kiln_cpu_gelu_tanh_mul(gr, gr, ur, n * F);
    else
        kiln_cpu_silu_mul_ref(gr, gr, ur, n * F);
    float *dout = dev_poisoned(n * F), *dup = dev_poisoned(n * F);
    be->matmul_norm_glu(be, dout, dx, dh, dup, n, &g.dev, &u.dev, dnw, 1e-6f, plus_one, act);
    snprintf(what, sizeof what, "matmul_norm_glu %s act %d", label, (int)act);
    compare(what, dout, gr, n * F, 2e-5);
    /* matmul_add: y += a @ o^T, a = the GLU reference output (repeated to Fo columns) with (every
     * third case) a zero 32-column block and blocks scaled by 1e4 and 1e-4 in its first and last
     * token */
    float *a = malloc((size_t)(n * Fo) * 4);
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < Fo; j++) a[t * Fo + j] = gr[t * F + j % F];
    for (int64_t t = 0; k % 3 == 0 && Fo >= 96 && t < n; t++)
        for (int64_t j = 0; (t == 0 || t == n - 1) && j < 96; j++)
            a[t * Fo + j] *= j < 32 ? 0.0f : j < 64 ? 1e4f : 1e-4f;
    float *y0 = rand_f32(n * O, 1.0f), *yr = malloc((size_t)(n * O) * 4);
    ref_matmul(yr, a, n, &o.host);
    kiln_cpu_add(yr, yr, y0, n * O);
    float *dy0 = dev_copy(y0, (size_t)(n * O) * 4), *da = dev_copy(a, (size_t)(n * Fo) * 4);
    float *dtmp = dev_poisoned(n * O);
    be->matmul_add(be, dy0, da, dtmp, n, &o.dev);
    snprintf(what, sizeof what, "matmul_add %s", label);
    compare(what, dy0, yr, n * O, 1e-5);
    be->free(be, dx), be->free(be, dh), be->free(be, dout), be->free(be, dup);
    be->free(be, dy0), be->free(be, da), be->free(be, dtmp);
    if (dnw) be->free(be, dnw);
    free(x), free(nw), free(hn), free(gr), free(ur), free(a), free(y0), free(yr);
    for (int i = 0; i < 3; i++) free_matrix(&m[i]);
    free_matrix(&g), free_matrix(&u), free_matrix(&o);
    kiln_cuda_set_qgemv_inline(-1);
    kiln_cuda_set_qgemv_dp4a(-1, -1, -1);
}

/* qg_link (qgemv.cu): a Llama decode layer's quantized GEMV chain (o + residual, norm + gate/up,
 * down + residual, the next layer's norm + q/k/v) with the feeds_next hints gives the same bits
 * as without them (the handed-on digits are pass 1's), run `reps` times to give a race between
 * the blocks of a 32-row group a chance to show; links: hand-offs each hinted chain must take
 * (-1: not checked, where the consumers may make their own digits). */
static void check_qgemv_link_case(int bits, int G, int64_t H, int64_t F, int64_t n, int reps,
                                  int links) {
    char label[120];
    snprintf(label, sizeof label, "q%dg%d H=%lld F=%lld n=%lld", bits, G, (long long)H,
             (long long)F, (long long)n);
    test_matrix wo, wg, wu, wd, wq[3];
    make_quant(&wo, bits, G, KILN_DT_BF16, H, H, false);
    make_quant(&wg, bits, G, KILN_DT_BF16, F, H, false);
    make_quant(&wu, bits, G, KILN_DT_BF16, F, H, true);
    make_quant(&wd, bits, G, KILN_DT_BF16, H, F, false);
    const int64_t qrows[3] = {H, H / 4, H / 4};
    for (int i = 0; i < 3; i++) make_quant(&wq[i], bits, G, KILN_DT_BF16, qrows[i], H, i == 0);
    float *h0 = rand_f32(n * H, 1.0f), *attn = rand_f32(n * H, 0.5f);
    float *n1 = rand_f32(H, 0.5f), *n2 = rand_f32(H, 0.5f);
    float *dh0 = dev_copy(h0, (size_t)(n * H) * 4), *dattn = dev_copy(attn, (size_t)(n * H) * 4);
    float *dn1 = dev_copy(n1, (size_t)H * 4), *dn2 = dev_copy(n2, (size_t)H * 4);
    float *dh = dev_poisoned(n * H), *dgate = dev_poisoned(n * F), *dup = dev_poisoned(n * F);
    float *dtmp = dev_poisoned(n * (F > H ? F : H)), *dq[3];
    for (int i = 0; i < 3; i++) dq[i] = dev_poisoned(n * qrows[i]);
    const kiln_matrix *qw[3] = {&wq[0].dev, &wq[1].dev, &wq[2].dev};
    const int64_t sizes[4] = {n * H, n * F, n * qrows[0], n * qrows[1]};
    float *want[4], *got[4];
    for (int i = 0; i < 4; i++) {
        want[i] = malloc((size_t)sizes[i] * 4);
        got[i] = malloc((size_t)sizes[i] * 4);
    }
    int mismatches = 0;
    long long taken = 0;
    for (int r = 0; r <= reps; r++) {
        const bool hinted = r > 0;
        be->copy2d(be, dh, H, dh0, H, n, H);
        const long long l0 = kiln_cuda_qgemv_links_total();
        if (hinted) be->feeds_next(be, dh, dn1, 1e-6f, false);
        be->matmul_add(be, dh, dattn, dtmp, n, &wo.dev);
        if (hinted) be->feeds_next(be, dgate, NULL, 0.0f, false);
        be->matmul_norm_glu(be, dgate, dh, dtmp, dup, n, &wg.dev, &wu.dev, dn1, 1e-6f, false,
                            KILN_GLU_SILU);
        if (hinted) be->feeds_next(be, dh, dn2, 1e-6f, true);
        be->matmul_add(be, dh, dgate, dtmp, n, &wd.dev);
        be->matmul_norm(be, 3, dq, dh, dtmp, n, qw, dn2, 1e-6f, true);
        CHECK_OK(be->synchronize(be));
        if (hinted) taken += kiln_cuda_qgemv_links_total() - l0;
        float *dst[4] = {hinted ? got[0] : want[0], hinted ? got[1] : want[1],
                         hinted ? got[2] : want[2], hinted ? got[3] : want[3]};
        const float *src[4] = {dh, dgate, dq[0], dq[1]};
        for (int i = 0; i < 4; i++) be->download(be, dst[i], src[i], (size_t)sizes[i] * 4);
        for (int i = 0; hinted && i < 4; i++)
            mismatches += memcmp(got[i], want[i], (size_t)sizes[i] * 4) != 0;
    }
    /* the unhinted chain itself against the CPU: its last output, q, is finite */
    bool finite = true;
    for (int64_t i = 0; i < sizes[2]; i++) finite = finite && isfinite(want[2][i]);
    CHECK(finite);
    if (mismatches)
        fprintf(stderr, "qgemv link %s: %d outputs of %d hinted chains differ\n", label, mismatches,
                reps);
    CHECK(mismatches == 0);
    if (links >= 0) {
        if (taken != (long long)links * reps)
            fprintf(stderr, "qgemv link %s: %lld hand-offs in %d chains (want %d each)\n", label,
                    taken, reps, links);
        CHECK(taken == (long long)links * reps);
    }
    for (int i = 0; i < 4; i++) free(want[i]), free(got[i]);
    be->free(be, dh0), be->free(be, dattn), be->free(be, dn1), be->free(be, dn2);
    be->free(be, dh), be->free(be, dgate), be->free(be, dup), be->free(be, dtmp);
    for (int i = 0; i < 3; i++) be->free(be, dq[i]), free_matrix(&wq[i]);
    free_matrix(&wo), free_matrix(&wg), free_matrix(&wu), free_matrix(&wd);
    free(h0), free(attn), free(n1), free(n2);
}
/* Decode attention hands its output's digits to the o projection (qg_link; attention.cu
 * attention_short): n_seq sequences of the f32 contiguous cache with prefixes pres (short, and
 * long enough for key splits), 32 query / 8 KV heads of 128 dims, then o = attention @ wo^T,
 * hinted reps times (store_attend_batch attending only, k = NULL) against unhinted, bit for bit,
 * with one hand-off each (links >= 0). */
static void check_attn_link_case(int bits, int G, int n_seq, const int *pres, int reps, int links) {
    enum { HEADS = 32, NKV = 8, HD = 128 };
    const int64_t qw = HEADS * HD, kw = NKV * HD;
    kiln_kv_layer_desc layer = {
        .n_kv_heads = NKV, .head_dim = HD, .v_head_dim = HD, .is_attention = true};
    kiln_kv_options opts;
    memset(&opts, 0, sizeof opts);
    snprintf(opts.kind, sizeof opts.kind, "f32");
    kiln_kv *kvs[4] = {0};
    int ones[4], pos[4];
    for (int i = 0; i < n_seq; i++) {
        ones[i] = 1;
        CHECK_OK(be->kv_new(be, &layer, 1, &opts, pres[i] + 1, &kvs[i]));
        if (!kvs[i]) return;
        float *k = rand_f32((pres[i] + 1) * kw, 1.0f), *v = rand_f32((pres[i] + 1) * kw, 1.0f);
        float *dk = dev_copy(k, sizeof(float) * (size_t)((pres[i] + 1) * kw)),
              *dv = dev_copy(v, sizeof(float) * (size_t)((pres[i] + 1) * kw));
        CHECK_OK(kvs[i]->vt->reserve(kvs[i], pres[i] + 1));
        kvs[i]->vt->store(kvs[i], 0, dk, dv, pres[i] + 1); /* the step's row too: attend only */
        kvs[i]->vt->commit(kvs[i], pres[i]);
        be->free(be, dk), be->free(be, dv);
        free(k), free(v);
        pos[i] = pres[i];
    }
    test_matrix wo;
    make_quant(&wo, bits, G, KILN_DT_BF16, qw, qw, false);
    float *q = rand_f32(n_seq * qw, 1.0f);
    float *dq = dev_copy(q, sizeof(float) * (size_t)(n_seq * qw));
    int32_t *dpos = dev_copy(pos, sizeof(int32_t) * (size_t)n_seq);
    float *dout = dev_poisoned(n_seq * qw), *dy = dev_poisoned(n_seq * qw);
    float *want = malloc(sizeof(float) * (size_t)(n_seq * qw)),
          *got = malloc(sizeof(float) * (size_t)(n_seq * qw));
    kiln_attn_params p = {.n_heads = HEADS, .scale = 1.0f / sqrtf((float)HD), .positions = dpos};
    int mismatches = 0;
    long long taken = 0;
    for (int r = 0; r <= reps; r++) {
        const bool hinted = r > 0;
        const long long l0 = kiln_cuda_qgemv_links_total();
        if (hinted) be->feeds_next(be, dout, NULL, 0.0f, false);
        kvs[0]->vt->store_attend_batch(kvs, ones, n_seq, 0, NULL, NULL, dq, dout, &p, NULL);
        be->matmul(be, dy, dout, n_seq, &wo.dev);
        CHECK_OK(be->synchronize(be));
        if (hinted) taken += kiln_cuda_qgemv_links_total() - l0;
        be->download(be, hinted ? got : want, dy, sizeof(float) * (size_t)(n_seq * qw));
        if (hinted) mismatches += memcmp(got, want, sizeof(float) * (size_t)(n_seq * qw)) != 0;
    }
    bool finite = true;
    for (int64_t i = 0; i < n_seq * qw; i++) finite = finite && isfinite(want[i]);
    CHECK(finite);
    if (mismatches || (links >= 0 && taken != (long long)links * reps))
        fprintf(stderr, "attention link q%dg%d seqs=%d pre=%d: %d of %d differ, %lld hand-offs\n",
                bits, G, n_seq, pres[0], mismatches, reps, taken);
    CHECK(mismatches == 0);
    if (links >= 0) CHECK(taken == (long long)links * reps);
    for (int i = 0; i < n_seq; i++) kiln_kv_free(kvs[i]);
    be->free(be, dq), be->free(be, dpos), be->free(be, dout), be->free(be, dy);
    free(q), free(want), free(got);
    free_matrix(&wo);
}

static void test_qgemv_link_mode(void) {
    for (int b = 4; b <= 8; b += 4) {
        /* Llama-3-8B's shapes: every consumer reads handed-on digits at one token; at 8 some
         * of the matmuls may take the tensor-core GEMM instead */
        check_qgemv_link_case(b, 64, 4096, 14336, 1, 10, 3);
        check_qgemv_link_case(b, 64, 4096, 14336, 8, 4, -1);
        /* smaller: the consumers may make their digits in the blocks instead */
        check_qgemv_link_case(b, 32, 1024, 3072, 1, 10, -1);
        check_qgemv_link_case(b, 128, 1024, 3072, 3, 10, -1);
    }
    /* attention -> o: one sequence at 100 keys (no split) and 3000 (splits merged by the last
     * block), then 3 sequences (3 tokens: the GEMV or the tensor cores may take them) */
    static const int one_short[] = {100}, one_long[] = {3000}, three[] = {40, 700, 2100};
    for (int b = 4; b <= 8; b += 4) {
        check_attn_link_case(b, 64, 1, one_short, 6, 1);
        check_attn_link_case(b, 64, 1, one_long, 6, 1);
        check_attn_link_case(b, 64, 3, three, 4, -1);
    }
    kiln_cuda_set_qgemv_inline(0); /* digits never in the blocks: every consumer linked */
    check_qgemv_link_case(4, 32, 1024, 3072, 1, 10, 3);
    check_qgemv_link_case(8, 64, 512, 1024, 1, 10, 3);
    check_qgemv_link_case(8, 64, 512, 1024, 2, 10, -1); /* norms of 2+ tokens: tensor cores */
    kiln_cuda_set_qgemv_inline(-1);
}

static void test_qgemv_link(void) {
    /* the groups' blocks meeting through global atomics (1), as clusters (2): every check */
    for (int mode = 1; mode <= 2; mode++) {
        kiln_cuda_set_qgemv_link(mode);
        const long long clusters0 = kiln_cuda_qgemv_cluster_launches_total();
        test_qgemv_link_mode();
        const long long clusters = kiln_cuda_qgemv_cluster_launches_total() - clusters0;
        const bool want = mode == 2 && kiln_cuda_qgemv_clusters_supported();
        CHECK_MSG((clusters > 0) == want, "qgemv link mode %d: %lld launches in clusters", mode,
                  clusters);
    }
    kiln_cuda_set_qgemv_link(-1);
}

static void test_qgemv_fused(void) {
    static const int bits[] = {4, 8};
    static const int groups[] = {32, 64, 128};
    const kiln_dtype sdts[] = {KILN_DT_BF16, KILN_DT_F16};
    int k = 0;
    for (int b = 0; b < 2; b++)
        for (int gi = 0; gi < 3; gi++) {
            const int G = groups[gi];
            const kiln_dtype sdt = sdts[(b + gi) % 2];
            /* small: a few chunks per row, rows that leave tiles partly empty */
            const int64_t small[3] = {13, 7, 130};
            for (int64_t n = 1; n <= 8; n++, k++)
                check_qfused_case(bits[b], G, sdt, 3 * G, small, 77, 41, n, k);
            /* Qwen3-0.6B-like (cols 1024, F 3072, q 2048, k/v 1024) at n = 1 under each inline
             * mode, and n = 2, 5 */
            const int64_t qkv[3] = {2048, 1024, 1024};
            for (int i = 0; i < 5; i++, k++)
                check_qfused_case(bits[b], G, sdt, 1024, qkv, 3072, 1024,
                                  i < 3 ? 1 : 2 + 3 * (i - 3), k);
            /* columns past one block's 32-column groups per warp, odd rows (3, not 1: the
             * relative error of a single output is its cancellation's, ~30x the typical in one
             * case of tests/emu/qgemv_emulate.cc) */
            const int64_t odd[3] = {259, 61, 3};
            check_qfused_case(bits[b], G, sdt, 4096 + 2 * G, odd, 515, 129, 1, k++);
            check_qfused_case(bits[b], G, sdt, 8192, odd, 33, 17, 1, k++); /* QG_INL_COLS */
            check_qfused_case(bits[b], G, sdt, 4 * G, odd, 33, 17, 3, k++);
        }
    /* gate and up of different formats: the composition */
    {
        test_matrix g, u;
        const int64_t n = 1, cols = 256, F = 64;
        make_quant(&g, 4, 32, KILN_DT_F16, F, cols, false);
        make_quant(&u, 8, 64, KILN_DT_BF16, F, cols, false);
        float *x = rand_f32(n * cols, 1.0f), *nw = rand_f32(cols, 0.5f);
        float *hn = malloc((size_t)(n * cols) * 4), *gr = malloc((size_t)(n * F) * 4),
              *ur = malloc((size_t)(n * F) * 4);
        kiln_cpu_rmsnorm_ref(hn, x, nw, n, cols, 1e-6f, false);
        ref_matmul(gr, hn, n, &g.host);
        ref_matmul(ur, hn, n, &u.host);
        kiln_cpu_silu_mul_ref(gr, gr, ur, n * F);
        float *dx = dev_copy(x, (size_t)(n * cols) * 4), *dnw = dev_copy(nw, (size_t)cols * 4);
        float *dh = dev_poisoned(n * cols), *dout = dev_poisoned(n * F), *dup = dev_poisoned(n * F);
        be->matmul_norm_glu(be, dout, dx, dh, dup, n, &g.dev, &u.dev, dnw, 1e-6f, false,
                            KILN_GLU_SILU);
        compare("matmul_norm_glu q4 gate, q8 up (composition)", dout, gr, n * F, 1e-5);
        be->free(be, dx), be->free(be, dnw), be->free(be, dh), be->free(be, dout);
        be->free(be, dup);
        free(x), free(nw), free(hn), free(gr), free(ur);
        free_matrix(&g), free_matrix(&u);
    }
}

/* The dp4a GEMV's tensor-core variant (KILN_CUDA_QGEMV_MMA=1, n = 1): the fusions' cases at one
 * token (partial 16-row tiles, columns not a multiple of its 128-column chunks, every group size,
 * both scale dtypes), then plain matmuls in exact and fast mode at Llama-3-8B-like widths. */
static void test_qgemv_mma(void) {
    static const int bits[] = {4, 8};
    static const int groups[] = {32, 64, 128};
    const kiln_dtype sdts[] = {KILN_DT_BF16, KILN_DT_F16};
    kiln_cuda_set_qfused(1);
    kiln_cuda_set_qgemv_mma(1);
    int k = 0;
    for (int b = 0; b < 2; b++)
        for (int gi = 0; gi < 3; gi++) {
            const int G = groups[gi];
            const kiln_dtype sdt = sdts[(b + gi) % 2];
            const int64_t small[3] = {13, 7, 130}, odd[3] = {259, 61, 3};
            const int64_t qkv[3] = {2048, 1024, 1024};
            check_qfused_case(bits[b], G, sdt, 3 * G, small, 77, 41, 1, k++);
            check_qfused_case(bits[b], G, sdt, 5 * G, small, 77, 41, 1, k++);
            check_qfused_case(bits[b], G, sdt, 4096 + 2 * G, odd, 515, 129, 1, k++);
            if (gi == 1) check_qfused_case(bits[b], G, sdt, 1024, qkv, 3072, 1024, 1, k++);
        }
    kiln_cuda_set_tc_gemm(0, -1, 0, 0);
    for (int fast = 0; fast < 2; fast++) {
        kiln_cuda_set_gemm_split(!fast);
        g_matmul_tol = fast ? 5e-2 : 0;
        for (int b = 0; b < 2; b++) {
            test_matrix m;
            make_quant(&m, bits[b], 64, sdts[b], 1000, 4096, b == 1);
            char label[64];
            snprintf(label, sizeof label, "%smma q%dg64 1000x4096", fast ? "fast " : "", bits[b]);
            check_matmul_x(&m, 1, label, 0, false);
            free_matrix(&m);
        }
    }
    g_matmul_tol = 0;
    kiln_cuda_set_gemm_split(1);
    kiln_cuda_set_tc_gemm(-1, -1, 0, 0);
    kiln_cuda_set_qgemv_mma(-1);
    kiln_cuda_set_qfused(-1);
}

/* add_rmsnorm == add then rmsnorm; output aliasing h (as the forward uses it) and separate. */
static void test_add_rmsnorm(void) {
    static const int64_t dims[] = {7, 1024, 4096, 5000};
    for (size_t d = 0; d < 4; d++)
        for (int alias = 0; alias < 2; alias++) {
            int64_t n = 3, dim = dims[d];
            float *x = rand_f32(n * dim, 2.0f), *h = rand_f32(n * dim, 1.0f);
            float *w = rand_f32(dim, 0.3f);
            float *xref = malloc((size_t)(n * dim) * 4), *yref = malloc((size_t)(n * dim) * 4);
            memcpy(xref, x, (size_t)(n * dim) * 4);
            kiln_cpu_add(xref, xref, h, n * dim);
            kiln_cpu_rmsnorm_ref(yref, xref, w, n, dim, 1e-6f, alias == 1);
            float *dx = dev_copy(x, (size_t)(n * dim) * 4),
                  *dh = dev_copy(h, (size_t)(n * dim) * 4);
            float *dw = dev_copy(w, (size_t)dim * 4);
            float *dy = alias ? dh : dev_poisoned(n * dim);
            be->add_rmsnorm(be, dx, dh, dy, dw, n, dim, 1e-6f, alias == 1);
            compare("add_rmsnorm x", dx, xref, n * dim, 1e-6);
            compare("add_rmsnorm y", dy, yref, n * dim, 1e-5);
            be->free(be, dx), be->free(be, dw), be->free(be, dh);
            if (!alias) be->free(be, dy);
            free(x), free(h), free(w), free(xref), free(yref);
        }
}

/* qk_norm_rope == per-head rmsnorm of q and k (or none) then rope of both. */
static void test_qk_norm_rope(void) {
    /* n_heads, n_kv_heads, head_dim, rot_dim, norms */
    static const int cfg[][5] = {{16, 8, 128, 128, 1}, {4, 1, 64, 64, 0}, {6, 2, 80, 40, 1},
                                 {8, 8, 256, 256, 1},  {3, 3, 96, 0, 1},  {2, 1, 512, 128, 0}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        int hq = cfg[c][0], hk = cfg[c][1], hd = cfg[c][2], rot = cfg[c][3];
        bool norms = cfg[c][4];
        int64_t n = 5, lq = n * hq * hd, lk = n * hk * hd;
        float *q = rand_f32(lq, 1.5f), *k = rand_f32(lk, 1.5f);
        float *qn = rand_f32(hd, 0.5f), *kn = rand_f32(hd, 0.5f);
        float inv[256];
        for (int i = 0; i < rot / 2; i++) inv[i] = powf(1e6f, -2.0f * (float)i / (float)rot);
        int32_t pos[5] = {0, 1, 7, 4095, 100000};
        float *qr = malloc((size_t)lq * 4), *kr = malloc((size_t)lk * 4);
        memcpy(qr, q, (size_t)lq * 4), memcpy(kr, k, (size_t)lk * 4);
        kiln_cpu_qk_norm_rope(qr, kr, pos, n, hq, hk, hd, rot, inv, norms ? qn : NULL,
                              norms ? kn : NULL, 1e-6f);
        float *dq = dev_copy(q, (size_t)lq * 4), *dk = dev_copy(k, (size_t)lk * 4);
        float *dqn = dev_copy(qn, (size_t)hd * 4), *dkn = dev_copy(kn, (size_t)hd * 4);
        float *dinv = dev_copy(inv, sizeof inv);
        int32_t *dpos = dev_copy(pos, sizeof pos);
        be->qk_norm_rope(be, dq, dk, dpos, n, hq, hk, hd, rot, dinv, norms ? dqn : NULL,
                         norms ? dkn : NULL, 1e-6f);
        compare("qk_norm_rope q", dq, qr, lq, 1e-5);
        compare("qk_norm_rope k", dk, kr, lk, 1e-5);
        be->free(be, dq), be->free(be, dk), be->free(be, dqn), be->free(be, dkn);
        be->free(be, dinv), be->free(be, dpos);
        free(q), free(k), free(qn), free(kn), free(qr), free(kr);
    }
}

static void test_elementwise(void) {
    static const int64_t ns[] = {1, 1000, 100003};
    for (size_t i = 0; i < 3; i++) {
        int64_t n = ns[i];
        float *a = rand_f32(n, 3.0f), *b = rand_f32(n, 1.0f), *ref = malloc((size_t)n * 4);
        float *da = dev_copy(a, (size_t)n * 4), *db = dev_copy(b, (size_t)n * 4);
        float *dy = dev_poisoned(n);
        kiln_cpu_silu_mul_ref(ref, a, b, n);
        be->silu_mul(be, dy, da, db, n);
        compare("silu_mul", dy, ref, n, 1e-5);
        kiln_cpu_gelu_tanh_mul(ref, a, b, n);
        be->free(be, dy);
        dy = dev_poisoned(n);
        be->gelu_tanh_mul(be, dy, da, db, n);
        compare("gelu_tanh_mul", dy, ref, n, 1e-5);
        kiln_cpu_add(ref, a, b, n);
        be->add(be, da, da, db, n); /* y aliases a */
        compare("add", da, ref, n, 1e-6);
        be->free(be, da), be->free(be, db), be->free(be, dy);
        free(a), free(b), free(ref);
    }
}

/* scale and softcap (Gemma: embedding / per-layer-input scales, layer_scalar, logit capping), in
 * place, at sizes that are not multiples of the block; softcap on large logits so the tanh
 * saturates as well as on small ones where it is near linear. */
static void test_scale_softcap(void) {
    static const int64_t ns[] = {1, 777, 100003};
    for (size_t i = 0; i < 3; i++) {
        int64_t n = ns[i];
        float *a = rand_f32(n, 40.0f), *ref = malloc((size_t)n * 4);
        for (int64_t j = 0; j < n; j += 3) a[j] *= 0.001f; /* near zero: tanh ~ identity */
        float *dx = dev_copy(a, (size_t)n * 4);
        memcpy(ref, a, (size_t)n * 4);
        kiln_cpu_scale(ref, 11.3137f, n);
        be->scale(be, dx, 11.3137f, n);
        compare("scale", dx, ref, n, 1e-7);
        memcpy(ref, a, (size_t)n * 4);
        be->upload(be, dx, a, (size_t)n * 4);
        kiln_cpu_softcap(ref, 30.0f, n);
        be->softcap(be, dx, 30.0f, n);
        compare("softcap", dx, ref, n, 1e-6);
        be->free(be, dx);
        free(a), free(ref);
    }
}

/* ---- hybrid (Gated DeltaNet) and MoE ops ---- */

static void test_copy_zero_gate(void) {
    /* copy2d: strided block into a strided destination whose gaps must stay untouched */
    static const int64_t shapes[][4] = {{37, 29, 53, 41}, {1, 1, 1, 1}, {300, 7, 7, 16}};
    for (size_t c = 0; c < 3; c++) {
        int64_t rows = shapes[c][0], cols = shapes[c][1], ss = shapes[c][2], ds = shapes[c][3];
        float *src = rand_f32(rows * ss, 1.0f), *dst = rand_f32(rows * ds, 1.0f);
        float *dsrc = dev_copy(src, (size_t)(rows * ss) * 4),
              *ddst = dev_copy(dst, (size_t)(rows * ds) * 4);
        kiln_cpu_copy2d(dst, ds, src, ss, rows, cols);
        be->copy2d(be, ddst, ds, dsrc, ss, rows, cols);
        compare("copy2d", ddst, dst, rows * ds, 0.0);
        be->free(be, dsrc), be->free(be, ddst);
        free(src), free(dst);
    }
    /* copy3d: a batch of strided blocks (the fused-projection split), gaps untouched */
    static const int64_t s3[][7] = {/* n0, n1, cols, src s0, src s1, dst s0, dst s1 */
                                    {5, 3, 7, 40, 12, 30, 8},
                                    {1, 1, 1, 1, 1, 1, 1},
                                    {9, 16, 32, 16 * 96, 96, 16 * 40, 40}};
    for (size_t c = 0; c < 3; c++) {
        const int64_t *z = s3[c];
        int64_t src_n = (z[0] - 1) * z[3] + (z[1] - 1) * z[4] + z[2];
        int64_t dst_n = (z[0] - 1) * z[5] + (z[1] - 1) * z[6] + z[2];
        float *src = rand_f32(src_n, 1.0f), *dst = rand_f32(dst_n, 1.0f);
        float *dsrc = dev_copy(src, (size_t)src_n * 4), *ddst = dev_copy(dst, (size_t)dst_n * 4);
        kiln_cpu_copy3d(dst, z[5], z[6], src, z[3], z[4], z[0], z[1], z[2]);
        be->copy3d(be, ddst, z[5], z[6], dsrc, z[3], z[4], z[0], z[1], z[2]);
        compare("copy3d", ddst, dst, dst_n, 0.0);
        be->free(be, dsrc), be->free(be, ddst);
        free(src), free(dst);
    }
    /* zero */
    {
        int64_t n = 1003;
        float *dx = dev_poisoned(n), *got = malloc((size_t)n * 4);
        be->zero(be, dx, n);
        CHECK_OK(be->synchronize(be));
        be->download(be, got, dx, (size_t)n * 4);
        int64_t nonzero = 0;
        for (int64_t i = 0; i < n; i++) nonzero += got[i] != 0.0f;
        CHECK_MSG(nonzero == 0, "zero: %lld elements not zero", (long long)nonzero);
        be->free(be, dx);
        free(got);
    }
    /* sigmoid_mul, out of place and with y aliasing x */
    static const int64_t ns[] = {1, 1000, 100003};
    for (size_t i = 0; i < 3; i++) {
        int64_t n = ns[i];
        float *x = rand_f32(n, 2.0f), *g = rand_f32(n, 4.0f), *ref = malloc((size_t)n * 4);
        float *dx = dev_copy(x, (size_t)n * 4), *dg = dev_copy(g, (size_t)n * 4);
        float *dy = dev_poisoned(n);
        kiln_cpu_sigmoid_mul(ref, x, g, n);
        be->sigmoid_mul(be, dy, dx, dg, n);
        compare("sigmoid_mul", dy, ref, n, 1e-6);
        be->sigmoid_mul(be, dx, dx, dg, n);
        compare("sigmoid_mul in place", dx, ref, n, 1e-6);
        be->free(be, dx), be->free(be, dg), be->free(be, dy);
        free(x), free(g), free(ref);
    }
}

static void test_l2norm(void) {
    static const int dims[] = {1, 32, 128, 200, 1000};
    for (size_t d = 0; d < 5; d++) {
        int64_t rows = 7, n = rows * dims[d];
        float *x = rand_f32(n, 2.0f);
        float *dx = dev_copy(x, (size_t)n * 4);
        kiln_gdn_l2norm(x, rows, dims[d], 1e-6f);
        be->l2norm(be, dx, rows, dims[d], 1e-6f);
        compare("l2norm", dx, x, n, 1e-6);
        be->free(be, dx);
        free(x);
    }
}

/* conv over several calls (a prefill, decode steps, a call shorter than the window): outputs
 * and the carried state both match the CPU reference after every call */
/* gdn_split_qkv == three copies out of the conv rows, then l2norm of q and k per head
 * (kiln_gdn_l2norm); geometries of Qwen3.5 (16 x 128, v 32 x 128), odd ones, padding columns. */
static void test_gdn_split_qkv(void) {
    static const struct {
        int64_t n;
        int nk, dk;
        int64_t vd, pad;
    } cases[] = {{1, 16, 128, 4096, 0}, {5, 2, 33, 70, 3}, {3, 3, 64, 192, 0}, {2, 1, 7, 5, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t n = cases[c].n, KD = (int64_t)cases[c].nk * cases[c].dk, vd = cases[c].vd;
        const int64_t C = 2 * KD + vd + cases[c].pad;
        float *conv = rand_f32(n * C, 1.5f);
        float *q = malloc((size_t)(n * KD) * 4), *k = malloc((size_t)(n * KD) * 4),
              *v = malloc((size_t)(n * vd) * 4);
        kiln_cpu_copy2d(q, KD, conv, C, n, KD);
        kiln_cpu_copy2d(k, KD, conv + KD, C, n, KD);
        kiln_cpu_copy2d(v, vd, conv + 2 * KD, C, n, vd);
        kiln_gdn_l2norm(q, n * cases[c].nk, cases[c].dk, 1e-6f);
        kiln_gdn_l2norm(k, n * cases[c].nk, cases[c].dk, 1e-6f);
        float *dconv = dev_copy(conv, (size_t)(n * C) * 4);
        float *dq = dev_poisoned(n * KD), *dk = dev_poisoned(n * KD), *dv = dev_poisoned(n * vd);
        be->gdn_split_qkv(be, dq, dk, dv, dconv, n, C, cases[c].nk, cases[c].dk, vd, 1e-6f);
        compare("gdn_split_qkv q", dq, q, n * KD, 1e-6);
        compare("gdn_split_qkv k", dk, k, n * KD, 1e-6);
        compare("gdn_split_qkv v", dv, v, n * vd, 0);
        be->free(be, dconv), be->free(be, dq), be->free(be, dk), be->free(be, dv);
        free(conv), free(q), free(k), free(v);
    }
}

/* gated_rmsnorm == rmsnorm (w, or none) then silu_mul(y, z, y), in place (y = x) and not */
static void test_gated_rmsnorm(void) {
    static const int dims[] = {128, 7, 256, 1000};
    for (int c = 0; c < 4; c++)
        for (int inplace = 0; inplace < 2; inplace++) {
            const int64_t rows = 3 + 29 * inplace, dim = dims[c];
            float *x = rand_f32(rows * dim, 2.0f), *z = rand_f32(rows * dim, 3.0f);
            float *w = c == 1 ? NULL : rand_f32(dim, 0.5f);
            float *ref = malloc((size_t)(rows * dim) * 4);
            kiln_cpu_rmsnorm_ref(ref, x, w, rows, dim, 1e-6f, false);
            kiln_cpu_silu_mul_ref(ref, z, ref, rows * dim);
            float *dx = dev_copy(x, (size_t)(rows * dim) * 4),
                  *dz = dev_copy(z, (size_t)(rows * dim) * 4);
            float *dw = w ? dev_copy(w, (size_t)dim * 4) : NULL;
            float *dy = inplace ? dx : dev_poisoned(rows * dim);
            be->gated_rmsnorm(be, dy, dx, dz, dw, rows, (int)dim, 1e-6f);
            compare("gated_rmsnorm", dy, ref, rows * dim, 1e-5);
            be->free(be, dx), be->free(be, dz);
            if (dw) be->free(be, dw);
            if (!inplace) be->free(be, dy);
            free(x), free(z), free(w), free(ref);
        }
}

static void test_gdn_conv(void) {
    static const int cfg[][2] = {{37, 4}, {300, 4}, {1, 2}, {64, 1}, {129, 3}};
    static const int steps[] = {5, 1, 1, 2, 1, 9};
    for (size_t c = 0; c < 5; c++) {
        const int C = cfg[c][0], K = cfg[c][1], P = K - 1;
        float *w = rand_f32((int64_t)C * K, 0.5f);
        float *state = calloc((size_t)(P > 0 ? P : 1) * C, sizeof(float));
        float *dw = dev_copy(w, (size_t)C * K * 4);
        float *dstate = dev_copy(state, (size_t)(P > 0 ? P : 1) * C * 4);
        for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
            const int64_t n = steps[s];
            float *x = rand_f32(n * C, 1.0f), *ref = malloc((size_t)(n * C) * 4);
            float *dx = dev_copy(x, (size_t)(n * C) * 4), *dout = dev_poisoned(n * C);
            kiln_gdn_conv(ref, x, n, C, w, K, state);
            be->gdn_conv(be, dout, dx, 1, &(int){(int)n}, C, dw, K, &dstate);
            char what[96];
            snprintf(what, sizeof what, "gdn_conv C=%d K=%d step %zu n=%lld", C, K, s,
                     (long long)n);
            compare(what, dout, ref, n * C, 1e-5);
            if (P > 0) {
                snprintf(what, sizeof what, "gdn_conv state C=%d K=%d step %zu", C, K, s);
                compare(what, dstate, state, (int64_t)P * C, 0.0);
            }
            be->free(be, dx), be->free(be, dout);
            free(x), free(ref);
        }
        be->free(be, dw), be->free(be, dstate);
        free(w), free(state);
    }
}

static void test_gdn_gates(void) {
    static const int nvs[] = {1, 4, 37};
    for (size_t c = 0; c < 3; c++) {
        const int nv = nvs[c];
        const int64_t n = 9, len = n * nv;
        float *a = rand_f32(len, 10.0f), *b = rand_f32(len, 3.0f); /* a + dt_bias crosses 20 */
        float *dtb = rand_f32(nv, 8.0f), *neg_a = rand_f32(nv, 1.0f);
        for (int h = 0; h < nv; h++) neg_a[h] = -expf(neg_a[h]);
        float *g = malloc((size_t)len * 4), *beta = malloc((size_t)len * 4);
        kiln_cpu_gdn_gates(g, beta, a, b, n, nv, neg_a, dtb);
        float *da = dev_copy(a, (size_t)len * 4), *db = dev_copy(b, (size_t)len * 4);
        float *ddtb = dev_copy(dtb, (size_t)nv * 4), *dna = dev_copy(neg_a, (size_t)nv * 4);
        float *dg = dev_poisoned(len), *dbeta = dev_poisoned(len);
        be->gdn_gates(be, dg, dbeta, da, db, n, nv, dna, ddtb);
        compare("gdn_gates g", dg, g, len, 1e-5);
        compare("gdn_gates beta", dbeta, beta, len, 1e-5);
        be->free(be, da), be->free(be, db), be->free(be, ddtb), be->free(be, dna);
        be->free(be, dg), be->free(be, dbeta);
        free(a), free(b), free(dtb), free(neg_a), free(g), free(beta);
    }
}

/* the recurrent delta rule over a prefill then decode steps (the chunked form off), state carried
 * on the device: outputs after every call and the final state match the token-by-token
 * reference; simple = 1 runs the column-per-thread kernel, 0 the register-resident one (dk = 16,
 * 32, 64, 128; dk = 7 falls back to the simple kernel either way) */
static void test_gdn_delta(int simple) {
    static const kiln_gdn_dims dims[] = {
        {2, 4, 16, 8}, {1, 3, 32, 40}, {2, 2, 128, 128}, {4, 8, 64, 100}, {1, 1, 7, 33}};
    static const int steps[] = {23, 1, 1, 70, 1};
    kiln_cuda_set_gdn_simple(simple);
    kiln_cuda_set_gdn_chunk(0, 0); /* the recurrent kernels, also for the 70-token call */
    for (size_t c = 0; c < 5; c++) {
        const kiln_gdn_dims *d = &dims[c];
        const int64_t sn = (int64_t)d->n_v_heads * d->dk * d->dv;
        float *S = calloc((size_t)sn, sizeof(float));
        float *dS = dev_copy(S, (size_t)sn * 4);
        for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
            const int64_t n = steps[s], qn = n * d->n_k_heads * d->dk,
                          vn = n * d->n_v_heads * d->dv, gn = n * d->n_v_heads;
            float *q = rand_f32(qn, 1.0f), *k = rand_f32(qn, 1.0f), *v = rand_f32(vn, 1.0f);
            float *g = rand_f32(gn, 1.0f), *beta = rand_f32(gn, 1.0f);
            kiln_gdn_l2norm(q, n * d->n_k_heads, d->dk, 1e-6f);
            kiln_gdn_l2norm(k, n * d->n_k_heads, d->dk, 1e-6f);
            for (int64_t i = 0; i < gn; i++) {
                g[i] = -0.3f * fabsf(g[i]);               /* log decay <= 0 */
                beta[i] = 1.0f / (1.0f + expf(-beta[i])); /* in (0, 1) */
            }
            float *ref = malloc((size_t)vn * 4);
            kiln_cpu_gdn_delta_ref(d, n, q, k, v, g, beta, S, ref);
            float *dq = dev_copy(q, (size_t)qn * 4), *dk = dev_copy(k, (size_t)qn * 4),
                  *dv = dev_copy(v, (size_t)vn * 4), *dg = dev_copy(g, (size_t)gn * 4),
                  *dbeta = dev_copy(beta, (size_t)gn * 4), *dout = dev_poisoned(vn);
            be->gdn_delta(be, d, 1, &(int){(int)n}, dq, dk, dv, dg, dbeta, &dS, dout);
            char what[128];
            snprintf(what, sizeof what, "gdn_delta%s nk=%d nv=%d dk=%d dv=%d step %zu n=%lld",
                     simple ? " (simple)" : "", d->n_k_heads, d->n_v_heads, d->dk, d->dv, s,
                     (long long)n);
            compare(what, dout, ref, vn, 1e-5);
            be->free(be, dq), be->free(be, dk), be->free(be, dv), be->free(be, dg);
            be->free(be, dbeta), be->free(be, dout);
            free(q), free(k), free(v), free(g), free(beta), free(ref);
        }
        compare("gdn_delta final state", dS, S, sn, 1e-5);
        be->free(be, dS);
        free(S);
    }
    kiln_cuda_set_gdn_chunk(-1, 0);
}

/* the chunked delta rule (gdn_chunked.cu), forced for every length (min 1 token) or at the default
 * threshold, with the state carried over calls of 1, 63, 64, 65 and 200 tokens from a non-zero
 * start: each call's outputs and the final state against the CPU op (kiln_gdn_chunked, the CPU
 * backend's prefill path) and the token-by-token reference; dk 32/64/128/256, dv not a multiple
 * of the 32-column tile, n_k < n_v, the Qwen3-Next head counts, strong and mild decay, and
 * segments of 1 or 2 chunks (max_seg) besides the scratch-sized ones */
static void test_gdn_delta_chunked(void) {
    static const struct {
        kiln_gdn_dims d;
        float decay;
        int min_tokens, max_seg;
    } cases[] = {
        {{1, 2, 64, 64}, 0.3f, 1, 0},      {{2, 4, 128, 128}, 0.3f, 1, 0},
        {{2, 6, 64, 100}, 0.3f, 1, 2},     {{1, 3, 32, 40}, 0.3f, 1, 1},
        {{1, 1, 128, 33}, 2.0f, 1, 0},     {{1, 2, 256, 64}, 0.3f, 1, 0},
        {{2, 4, 128, 128}, 0.02f, 1, 1},   {{16, 32, 128, 128}, 0.3f, 1, 0},
        {{16, 16, 128, 128}, 0.3f, 64, 0}, /* default threshold: 1 and 63 take the recurrence */
    };
    static const int steps[] = {1, 63, 64, 65, 200};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const kiln_gdn_dims *d = &cases[c].d;
        kiln_cuda_set_gdn_chunk(cases[c].min_tokens, cases[c].max_seg);
        const int64_t sn = (int64_t)d->n_v_heads * d->dk * d->dv;
        float *S = rand_f32(sn, 0.3f), *Sc = malloc((size_t)sn * 4);
        memcpy(Sc, S, (size_t)sn * 4);
        float *dS = dev_copy(S, (size_t)sn * 4);
        for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
            const int64_t n = steps[s], qn = n * d->n_k_heads * d->dk,
                          vn = n * d->n_v_heads * d->dv, gn = n * d->n_v_heads;
            float *q = rand_f32(qn, 1.0f), *k = rand_f32(qn, 1.0f), *v = rand_f32(vn, 1.0f);
            float *g = rand_f32(gn, 1.0f), *beta = rand_f32(gn, 1.0f);
            kiln_gdn_l2norm(q, n * d->n_k_heads, d->dk, 1e-6f);
            kiln_gdn_l2norm(k, n * d->n_k_heads, d->dk, 1e-6f);
            for (int64_t i = 0; i < gn; i++) {
                g[i] = -cases[c].decay * fabsf(g[i]);
                beta[i] = 1.0f / (1.0f + expf(-beta[i]));
            }
            float *ref = malloc((size_t)vn * 4), *chk = malloc((size_t)vn * 4);
            kiln_cpu_gdn_delta_ref(d, n, q, k, v, g, beta, S, ref);
            kiln_gdn_chunked(d, n, 64, q, k, v, g, beta, Sc, chk, NULL);
            float *dq = dev_copy(q, (size_t)qn * 4), *dk = dev_copy(k, (size_t)qn * 4),
                  *dv = dev_copy(v, (size_t)vn * 4), *dg = dev_copy(g, (size_t)gn * 4),
                  *dbeta = dev_copy(beta, (size_t)gn * 4), *dout = dev_poisoned(vn);
            be->gdn_delta(be, d, 1, &(int){(int)n}, dq, dk, dv, dg, dbeta, &dS, dout);
            char what[160];
            snprintf(what, sizeof what,
                     "gdn_delta chunked (min %d, seg %d) nk=%d nv=%d dk=%d dv=%d decay=%g n=%lld",
                     cases[c].min_tokens, cases[c].max_seg, d->n_k_heads, d->n_v_heads, d->dk,
                     d->dv, cases[c].decay, (long long)n);
            compare(what, dout, ref, vn, 1e-4);
            compare(what, dout, chk, vn, 1e-4);
            be->free(be, dq), be->free(be, dk), be->free(be, dv), be->free(be, dg);
            be->free(be, dbeta), be->free(be, dout);
            free(q), free(k), free(v), free(g), free(beta), free(ref), free(chk);
        }
        compare("gdn_delta chunked final state vs reference", dS, S, sn, 1e-4);
        compare("gdn_delta chunked final state vs CPU chunked", dS, Sc, sn, 1e-4);
        be->free(be, dS);
        free(S), free(Sc);
    }
    kiln_cuda_set_gdn_chunk(-1, 0);
}

/* Token counts of the batch compositions: 1, 3, 64 (a decode step) and 70 sequences (67 or 68
 * of them recurrent: two launches), with 0, 1, a few and (the last of 3, the 41st of 70) a
 * prefill's 80 tokens, which take the chunked form at the threshold of 64 where dk allows. */
static int batch_tokens(int n_seqs, int i) {
    if (n_seqs == 1) return 1;
    if (n_seqs == 3) return (int[]){5, 1, 80}[i];
    if (n_seqs == 64) return 1;
    if (i == 40) return 80;
    return i == 3 || i == 13 ? 0 : i % 10 == 7 ? 1 + i % 5 : 1;
}

/* The batched conv and delta rule against the CPU references run sequence by sequence, for the
 * compositions of batch_tokens, every sequence with its own random state, over two steps (states
 * carried on the device): each sequence's outputs after every step and its final state. The conv
 * at odd channel counts and kernel widths; the delta rule with the register (simple = 0) or the
 * column-per-thread kernel at dk 16 / 32 / 128 and odd dk = 7 / dv = 33, GQA, and the Qwen3.5-4B
 * heads (16k / 32v, 128) for the 64-sequence decode step. */
static void test_gdn_batch(int simple) {
    static const int batches[] = {1, 3, 64, 70};
    static const int convs[][2] = {{37, 4}, {300, 4}, {129, 3}, {64, 1}};
    static const kiln_gdn_dims dims[] = {
        {2, 4, 16, 8}, {1, 3, 32, 40}, {1, 1, 7, 33}, {2, 2, 128, 128}, {16, 32, 128, 128}};
    kiln_cuda_set_gdn_simple(simple);
    kiln_cuda_set_gdn_chunk(64, 0);
    for (int b = 0; b < 4; b++) {
        const int ns = batches[b];
        int n[70], t0[70], T = 0;
        for (int i = 0; i < ns; i++) t0[i] = T, T += n[i] = batch_tokens(ns, i);
        float *hs[70], *ds[70];
        char what[160];
        for (int c = 0; c < 4 && !simple; c++) { /* the conv has one kernel: checked once */
            const int C = convs[c][0], K = convs[c][1], P = K - 1;
            const int64_t sz = (int64_t)(P > 0 ? P : 1) * C;
            float *w = rand_f32((int64_t)C * K, 0.5f), *dw = dev_copy(w, (size_t)C * K * 4);
            for (int i = 0; i < ns; i++) {
                hs[i] = rand_f32(sz, 1.0f);
                ds[i] = dev_copy(hs[i], (size_t)sz * 4);
            }
            for (int step = 0; step < 2; step++) {
                float *x = rand_f32((int64_t)T * C, 1.0f), *ref = malloc((size_t)T * C * 4 + 4);
                float *dx = dev_copy(x, (size_t)T * C * 4), *dout = dev_poisoned((int64_t)T * C);
                for (int i = 0; i < ns; i++)
                    kiln_gdn_conv(ref + (int64_t)t0[i] * C, x + (int64_t)t0[i] * C, n[i], C, w, K,
                                  hs[i]);
                be->gdn_conv(be, dout, dx, ns, n, C, dw, K, ds);
                for (int i = 0; i < ns; i++) {
                    if (!n[i]) continue;
                    snprintf(what, sizeof what, "batched gdn_conv %d seqs C=%d K=%d step %d seq %d",
                             ns, C, K, step, i);
                    compare(what, dout + (int64_t)t0[i] * C, ref + (int64_t)t0[i] * C,
                            (int64_t)n[i] * C, 1e-5);
                }
                be->free(be, dx), be->free(be, dout);
                free(x), free(ref);
            }
            for (int i = 0; i < ns && P > 0; i++) {
                snprintf(what, sizeof what, "batched gdn_conv %d seqs C=%d K=%d state %d", ns, C, K,
                         i);
                compare(what, ds[i], hs[i], sz, 0.0);
            }
            for (int i = 0; i < ns; i++) be->free(be, ds[i]), free(hs[i]);
            be->free(be, dw), free(w);
        }
        for (size_t c = 0; c < sizeof dims / sizeof *dims; c++) {
            const kiln_gdn_dims *d = &dims[c];
            if (d->n_v_heads == 32 && ns != 64) continue; /* the model shape: its decode step */
            const int64_t KD = (int64_t)d->n_k_heads * d->dk, VD = (int64_t)d->n_v_heads * d->dv,
                          NV = d->n_v_heads, sn = NV * d->dk * d->dv;
            const bool chunkable = d->dk == 32 || d->dk == 64 || d->dk == 128 || d->dk == 256;
            for (int i = 0; i < ns; i++) {
                hs[i] = rand_f32(sn, 0.3f);
                ds[i] = dev_copy(hs[i], (size_t)sn * 4);
            }
            for (int step = 0; step < 2; step++) {
                float *q = rand_f32(T * KD, 1.0f), *k = rand_f32(T * KD, 1.0f);
                float *v = rand_f32(T * VD, 1.0f), *g = rand_f32(T * NV, 1.0f);
                float *beta = rand_f32(T * NV, 1.0f), *ref = malloc((size_t)(T * VD) * 4 + 4);
                kiln_gdn_l2norm(q, (int64_t)T * d->n_k_heads, d->dk, 1e-6f);
                kiln_gdn_l2norm(k, (int64_t)T * d->n_k_heads, d->dk, 1e-6f);
                for (int64_t i = 0; i < T * NV; i++) {
                    g[i] = -0.3f * fabsf(g[i]);
                    beta[i] = 1.0f / (1.0f + expf(-beta[i]));
                }
                for (int i = 0; i < ns; i++)
                    kiln_cpu_gdn_delta_ref(d, n[i], q + t0[i] * KD, k + t0[i] * KD, v + t0[i] * VD,
                                           g + t0[i] * NV, beta + t0[i] * NV, hs[i],
                                           ref + t0[i] * VD);
                float *dq = dev_copy(q, (size_t)(T * KD) * 4),
                      *dk = dev_copy(k, (size_t)(T * KD) * 4),
                      *dv = dev_copy(v, (size_t)(T * VD) * 4),
                      *dg = dev_copy(g, (size_t)(T * NV) * 4),
                      *dbeta = dev_copy(beta, (size_t)(T * NV) * 4), *dout = dev_poisoned(T * VD);
                be->gdn_delta(be, d, ns, n, dq, dk, dv, dg, dbeta, ds, dout);
                for (int i = 0; i < ns; i++) {
                    if (!n[i]) continue;
                    const bool chunked = chunkable && n[i] >= 64;
                    snprintf(what, sizeof what,
                             "batched gdn_delta%s %d seqs nk=%d nv=%d dk=%d dv=%d step %d seq %d "
                             "n=%d%s",
                             simple ? " (simple)" : "", ns, d->n_k_heads, d->n_v_heads, d->dk,
                             d->dv, step, i, n[i], chunked ? " (chunked)" : "");
                    compare(what, dout + t0[i] * VD, ref + t0[i] * VD, n[i] * VD,
                            chunked ? 1e-4 : 1e-5);
                }
                be->free(be, dq), be->free(be, dk), be->free(be, dv), be->free(be, dg);
                be->free(be, dbeta), be->free(be, dout);
                free(q), free(k), free(v), free(g), free(beta), free(ref);
            }
            for (int i = 0; i < ns; i++) {
                const bool chunked = chunkable && n[i] >= 64;
                snprintf(what, sizeof what,
                         "batched gdn_delta%s %d seqs nk=%d nv=%d dk=%d dv=%d state %d",
                         simple ? " (simple)" : "", ns, d->n_k_heads, d->n_v_heads, d->dk, d->dv,
                         i);
                compare(what, ds[i], hs[i], sn, chunked ? 1e-4 : 1e-5);
                be->free(be, ds[i]), free(hs[i]);
            }
        }
    }
    kiln_cuda_set_gdn_chunk(-1, 0);
    kiln_cuda_set_gdn_simple(-1);
}

static void test_moe_rows(void) {
    static const int64_t widths[] = {1, 70, 1000};
    for (size_t c = 0; c < 3; c++) {
        const int64_t W = widths[c], n_src = 20, n = 9;
        int32_t rows[9]; /* distinct rows of the 20, shuffled */
        int32_t perm[20];
        for (int i = 0; i < 20; i++) perm[i] = i;
        for (int i = 19; i > 0; i--) {
            int j = (int)(test_rand_u64(&rng) % (uint64_t)(i + 1));
            int32_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        memcpy(rows, perm, sizeof rows);
        float *src = rand_f32(n_src * W, 1.0f), *wts = rand_f32(n, 1.0f);
        float *y = rand_f32(n_src * W, 1.0f), *ex = rand_f32(n * W, 1.0f);
        float *gathered = malloc((size_t)(n * W) * 4);
        int32_t *drows = dev_copy(rows, sizeof rows);
        float *dsrc = dev_copy(src, (size_t)(n_src * W) * 4), *dw = dev_copy(wts, (size_t)n * 4);
        float *dy = dev_copy(y, (size_t)(n_src * W) * 4), *dex = dev_copy(ex, (size_t)(n * W) * 4);
        float *dg = dev_poisoned(n * W);
        kiln_cpu_gather_rows(gathered, src, rows, n, W);
        be->gather_rows(be, dg, dsrc, drows, n, W);
        compare("gather_rows", dg, gathered, n * W, 0.0);
        kiln_cpu_scatter_add_rows(y, ex, rows, wts, n, W);
        be->scatter_add_rows(be, dy, dex, drows, dw, n, W);
        compare("scatter_add_rows", dy, y, n_src * W, 1e-6);
        be->free(be, drows), be->free(be, dsrc), be->free(be, dw), be->free(be, dy);
        be->free(be, dex), be->free(be, dg);
        free(src), free(wts), free(y), free(ex), free(gathered);
    }
}

/* The tensor-core expert GEMM (gemm_tc.cu expert mode, taken by moe.cu for batches of many
 * pairs; forced here) against the CPU references: 4-bit g64, 8-bit g32 / g128 (f16 scales, output
 * bias) and bf16 stacks, cols that are not multiples of 64, experts of uneven load (one gets half
 * the pairs, more than a token tile; the last none), x rows shared by x_div pairs, the gathered
 * SwiGLU over two stacks and GeGLU over one stack of gate-then-up rows, and a pair whose expert
 * id is outside the stack (its row NaN, the others as the reference). */
static void test_moe_tc(void) {
    kiln_cuda_set_moe_tc(1);
    const int E = 6, x_div = 4, bad = 7;
    static const int cases[][7] = {
        /* bits (0: bf16), group, rows, cols, pairs, glu (2: one stack), output bias */
        {4, 64, 200, 512, 320, 0, 0}, {8, 32, 72, 288, 96, 0, 1}, {0, 0, 130, 520, 96, 0, 0},
        {4, 32, 64, 1024, 512, 1, 0}, {0, 0, 48, 256, 200, 2, 0}, {8, 128, 136, 512, 1500, 0, 0},
        {8, 64, 40, 768, 64, 2, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int *k = cases[c];
        const int64_t rows = k[2], cols = k[3], n = k[4], glu = k[5];
        const int64_t stride = glu == 2 ? 2 * rows : rows, up_off = glu == 2 ? rows : 0;
        test_matrix g, u;
        const kiln_dtype sdt = c % 2 ? KILN_DT_F16 : KILN_DT_BF16;
        for (int q = 0; q < (glu == 1 ? 2 : 1); q++) {
            test_matrix *m = q ? &u : &g;
            if (k[0])
                make_quant(m, k[0], k[1], sdt, E * stride, cols, k[6]);
            else
                make_dense(m, KILN_DT_BF16, E * stride, cols, k[6]);
        }
        const test_matrix *up = glu == 2 ? &g : &u;
        int32_t *experts = malloc((size_t)n * 4), *ref_ex = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) {
            const uint64_t r = test_rand_u64(&rng);
            experts[i] = r % 2 ? 0 : (int32_t)(1 + (r >> 8) % (E - 2)); /* E - 1: no pair */
            ref_ex[i] = experts[i];
        }
        experts[bad] = E; /* outside the stack: NaN */
        float *x = rand_f32((n / x_div) * cols, 1.0f), *ref = malloc((size_t)(n * rows) * 4);
        const kiln_glu_act act = glu == 2 ? KILN_GLU_GELU_TANH : KILN_GLU_SILU;
        if (glu)
            kiln_cpu_matmul_gather_glu_ref(ref, x, x_div, n, ref_ex, &g.host, &up->host, rows,
                                           stride, up_off, act);
        else
            kiln_cpu_matmul_gather_ref(ref, x, x_div, n, ref_ex, &g.host, rows);
        float *dx = dev_copy(x, (size_t)((n / x_div) * cols) * 4), *dy = dev_poisoned(n * rows);
        int32_t *dex = dev_copy(experts, (size_t)n * 4);
        const long long l0 = kiln_cuda_tc_gemm_launches();
        if (glu)
            be->matmul_gather_glu(be, dy, dx, x_div, n, dex, &g.dev, &up->dev, rows, stride, up_off,
                                  act);
        else
            be->matmul_gather(be, dy, dx, x_div, n, dex, &g.dev, rows);
        CHECK_OK(be->synchronize(be));
        CHECK_MSG(kiln_cuda_tc_gemm_launches() == l0 + 1, "expert GEMM case %zu: %lld launches", c,
                  kiln_cuda_tc_gemm_launches() - l0);
        float *got = malloc((size_t)(n * rows) * 4);
        be->download(be, got, dy, (size_t)(n * rows) * 4);
        int64_t nan_bad = 0, nonfinite = 0;
        for (int64_t r = 0; r < rows; r++) {
            nan_bad += isnan(got[bad * rows + r]) != 0;
            got[bad * rows + r] = ref[bad * rows + r];
        }
        for (int64_t i = 0; i < n * rows; i++) nonfinite += !isfinite(got[i]);
        const double err = test_rel_l2(got, ref, (size_t)(n * rows));
        CHECK_MSG(nan_bad == rows && nonfinite == 0 && err <= 2e-5,
                  "expert GEMM bits=%d %lldx%lld n=%lld glu=%d: %lld of %lld NaN in the bad row, "
                  "%lld non-finite, rel err %.3g",
                  k[0], (long long)rows, (long long)cols, (long long)n, (int)glu,
                  (long long)nan_bad, (long long)rows, (long long)nonfinite, err);
        be->free(be, dx), be->free(be, dy), be->free(be, dex);
        free(x), free(ref), free(got), free(experts), free(ref_ex);
        free_matrix(&g);
        if (glu == 1) free_matrix(&u);
    }
    kiln_cuda_set_moe_tc(-2);
}

/* The MoE ops with routing on the device (moe.cu) against the CPU references: the top-k choice
 * (ids exactly), gathered matmuls over dense and quantized stacks (the GEMV kernels and the
 * generic one for widths they do not take, output biases, x rows shared by x_div pairs; grouped
 * or per pair as kiln_cuda_set_moe_grouped says), the gathered SwiGLU / GeGLU, stacks made by
 * upload_stack from separate matrices, and the weighted sum. */
static void test_moe_device_ops(void) {
    static const int route_cases[][4] = {
        {8, 2, 1, 0}, {128, 8, 5, 1}, {512, 10, 3, 1}, {60, 4, 2, 0}};
    for (size_t c = 0; c < sizeof route_cases / sizeof route_cases[0]; c++) {
        const int E = route_cases[c][0], K = route_cases[c][1], T = route_cases[c][2];
        const bool norm = route_cases[c][3], scaled = c % 2 == 1;
        float *logits = rand_f32(T * E, 3.0f), *scale = rand_f32(E, 1.0f);
        logits[E - 1] = logits[0]; /* a tie */
        int32_t *ref_ex = malloc((size_t)(T * K) * 4), *got_ex = malloc((size_t)(T * K) * 4);
        float *ref_w = malloc((size_t)(T * K) * 4);
        kiln_cpu_moe_route_ref(ref_ex, ref_w, logits, T, E, K, norm, scaled ? scale : NULL);
        float *dl = dev_copy(logits, (size_t)(T * E) * 4), *ds = dev_copy(scale, (size_t)E * 4);
        float *dw = dev_poisoned(T * K);
        int32_t *dex = (int32_t *)dev_poisoned(T * K);
        be->moe_route(be, dex, dw, dl, T, E, K, norm, scaled ? ds : NULL);
        char what[96];
        snprintf(what, sizeof what, "moe_route E=%d k=%d T=%d weights", E, K, T);
        compare(what, dw, ref_w, T * K, 1e-5);
        be->download(be, got_ex, dex, (size_t)(T * K) * 4);
        CHECK_MSG(memcmp(got_ex, ref_ex, (size_t)(T * K) * 4) == 0, "moe_route E=%d k=%d: experts",
                  E, K);
        be->free(be, dl), be->free(be, ds), be->free(be, dw), be->free(be, dex);
        free(logits), free(scale), free(ref_ex), free(got_ex), free(ref_w);
    }
    /* gathered matmuls: {bits (0 dense), dtype, group, rows, cols, bias} */
    static const int gather_cases[][6] = {
        {0, KILN_DT_BF16, 0, 96, 768, 0}, {0, KILN_DT_F16, 0, 40, 520, 1},
        {0, KILN_DT_F32, 0, 17, 264, 0},  {0, KILN_DT_BF16, 0, 9, 36, 0}, /* generic kernel */
        {4, 0, 64, 96, 2048, 0},          {8, 0, 32, 40, 1536, 1},
        {2, 0, 128, 33, 768, 0},          {3, 0, 32, 24, 2080, 0},
        {5, 0, 32, 16, 320, 0},           {6, 0, 64, 20, 1024, 0},
    };
    const int E = 5, n = 16, x_div = 4;
    for (size_t c = 0; c < sizeof gather_cases / sizeof gather_cases[0]; c++) {
        const int *gc = gather_cases[c];
        const int64_t rows = gc[3], cols = gc[4];
        test_matrix m;
        if (gc[0])
            make_quant(&m, gc[0], gc[2], (kiln_dtype)(c % 2 ? KILN_DT_F16 : KILN_DT_BF16), E * rows,
                       cols, gc[5]);
        else
            make_dense(&m, (kiln_dtype)gc[1], E * rows, cols, gc[5]);
        int32_t experts[16];
        for (int i = 0; i < n; i++) experts[i] = (int32_t)(test_rand_u64(&rng) % E);
        experts[3] = E - 1;
        float *x = rand_f32((n / x_div) * cols, 1.0f), *ref = malloc((size_t)(n * rows) * 4);
        kiln_cpu_matmul_gather_ref(ref, x, x_div, n, experts, &m.host, rows);
        float *dx = dev_copy(x, (size_t)((n / x_div) * cols) * 4), *dy = dev_poisoned(n * rows);
        int32_t *dex = dev_copy(experts, sizeof experts);
        be->matmul_gather(be, dy, dx, x_div, n, dex, &m.dev, rows);
        char what[96];
        snprintf(what, sizeof what, "matmul_gather bits=%d %lldx%lld", gc[0], (long long)rows,
                 (long long)cols);
        compare(what, dy, ref, n * rows, 2e-5);
        be->free(be, dx), be->free(be, dy), be->free(be, dex);
        free(x), free(ref);
        free_matrix(&m);
    }
    /* the gathered GLU: gate and up as two stacks (SiLU), or one stack of gate-then-up rows per
     * expert (GELU), dense and 4-bit, and a width for the generic kernel */
    static const int glu_cases[][5] = {/* bits (0: bf16), group, rows, cols, one stack */
                                       {0, 0, 64, 512, 0},
                                       {0, 0, 48, 1024, 1},
                                       {4, 64, 96, 2048, 0},
                                       {8, 32, 40, 768, 1},
                                       {0, 0, 12, 36, 0}};
    for (size_t c = 0; c < sizeof glu_cases / sizeof glu_cases[0]; c++) {
        const int *gc = glu_cases[c];
        const int64_t rows = gc[2], cols = gc[3], stride = gc[4] ? 2 * rows : rows;
        const int64_t up_off = gc[4] ? rows : 0;
        test_matrix g, u;
        if (gc[0]) {
            make_quant(&g, gc[0], gc[1], KILN_DT_BF16, E * stride, cols, false);
            make_quant(&u, gc[0], gc[1], KILN_DT_BF16, E * stride, cols, false);
        } else {
            make_dense(&g, KILN_DT_BF16, E * stride, cols, false);
            make_dense(&u, KILN_DT_BF16, E * stride, cols, false);
        }
        const test_matrix *up = gc[4] ? &g : &u;
        const kiln_glu_act act = gc[4] ? KILN_GLU_GELU_TANH : KILN_GLU_SILU;
        int32_t experts[16];
        for (int i = 0; i < n; i++) experts[i] = (int32_t)(test_rand_u64(&rng) % E);
        float *x = rand_f32((n / x_div) * cols, 1.0f), *ref = malloc((size_t)(n * rows) * 4);
        kiln_cpu_matmul_gather_glu_ref(ref, x, x_div, n, experts, &g.host, &up->host, rows, stride,
                                       up_off, act);
        float *dx = dev_copy(x, (size_t)((n / x_div) * cols) * 4), *dy = dev_poisoned(n * rows);
        int32_t *dex = dev_copy(experts, sizeof experts);
        be->matmul_gather_glu(be, dy, dx, x_div, n, dex, &g.dev, &up->dev, rows, stride, up_off,
                              act);
        char what[96];
        snprintf(what, sizeof what, "matmul_gather_glu bits=%d %lldx%lld%s", gc[0], (long long)rows,
                 (long long)cols, gc[4] ? " one stack" : "");
        compare(what, dy, ref, n * rows, 2e-5);
        be->free(be, dx), be->free(be, dy), be->free(be, dex);
        free(x), free(ref);
        free_matrix(&g), free_matrix(&u);
    }
    /* upload_stack: E separate matrices become one stack the gather reads expert by expert */
    for (int q = 0; q < 2; q++) {
        const int64_t rows = 48, cols = 512;
        test_matrix parts[5];
        kiln_matrix hosts[5], stack;
        for (int e = 0; e < E; e++) {
            if (q)
                make_quant(&parts[e], 4, 64, KILN_DT_BF16, rows, cols, false);
            else
                make_dense(&parts[e], KILN_DT_BF16, rows, cols, false);
            hosts[e] = parts[e].host;
        }
        CHECK_OK(be->upload_stack(be, E, hosts, &stack));
        CHECK(stack.rows == E * rows && !stack.view);
        int32_t experts[16];
        for (int i = 0; i < n; i++) experts[i] = (int32_t)((i * 3) % E);
        float *x = rand_f32(n * cols, 1.0f), *ref = malloc((size_t)(n * rows) * 4);
        for (int i = 0; i < n; i++) /* each pair against its own separate matrix */
            ref_matmul(ref + i * rows, x + i * cols, 1, &hosts[experts[i]]);
        float *dx = dev_copy(x, (size_t)(n * cols) * 4), *dy = dev_poisoned(n * rows);
        int32_t *dex = dev_copy(experts, sizeof experts);
        be->matmul_gather(be, dy, dx, 1, n, dex, &stack, rows);
        compare(q ? "upload_stack q4 + matmul_gather" : "upload_stack bf16 + matmul_gather", dy,
                ref, n * rows, 2e-5);
        be->free(be, dx), be->free(be, dy), be->free(be, dex);
        be->free_matrix(be, &stack);
        free(x), free(ref);
        for (int e = 0; e < E; e++) free_matrix(&parts[e]);
    }
    /* the weighted sum, with and without a gated shared expert */
    for (int shared = 0; shared < 3; shared++) {
        const int T = 5, K = 8;
        const int64_t H = 1000;
        float *ye = rand_f32(T * K * H, 1.0f), *w = rand_f32(T * K, 1.0f);
        float *sh = rand_f32(T * H, 1.0f), *sl = rand_f32(T, 2.0f),
              *ref = malloc((size_t)(T * H) * 4);
        const bool with_sh = shared > 0, with_gate = shared > 1;
        kiln_cpu_moe_combine_ref(ref, ye, w, T, K, H, with_sh ? sh : NULL, with_gate ? sl : NULL);
        float *dye = dev_copy(ye, (size_t)(T * K * H) * 4), *dw = dev_copy(w, (size_t)(T * K) * 4);
        float *dsh = dev_copy(sh, (size_t)(T * H) * 4), *dsl = dev_copy(sl, (size_t)T * 4);
        float *dy = dev_poisoned(T * H);
        be->moe_combine(be, dy, dye, dw, T, K, H, with_sh ? dsh : NULL, with_gate ? dsl : NULL);
        compare("moe_combine", dy, ref, T * H, 1e-6);
        be->free(be, dye), be->free(be, dw), be->free(be, dsh), be->free(be, dsl), be->free(be, dy);
        free(ye), free(w), free(sh), free(sl), free(ref);
    }
}

/* the device cache keeps a recurrent layer's state: zeroed at creation, kept across steps,
 * zeroed again by truncate(0); a rollback to a middle length is refused */
static void test_kv_state(void) {
    kiln_kv_layer_desc layers[2] = {
        {.is_attention = false, .state_floats = 1001},
        {.n_kv_heads = 2, .head_dim = 64, .v_head_dim = 64, .is_attention = true},
    };
    kiln_kv_options opts;
    memset(&opts, 0, sizeof opts);
    kiln_kv *kv = NULL;
    CHECK_OK(be->kv_new(be, layers, 2, &opts, 64, &kv));
    if (!kv) return;
    CHECK(kv->vt->layer_state != NULL && kv->vt->layer_state(kv, 1) == NULL);
    float *st = kv->vt->layer_state(kv, 0);
    float *zeros = calloc(1001, sizeof(float)), *x = rand_f32(1001, 1.0f);
    compare("kv state at creation", st, zeros, 1001, 0.0);
    be->upload(be, st, x, 1001 * 4);
    CHECK_OK(kv->vt->reserve(kv, 3));
    kv->vt->commit(kv, 3);
    CHECK(kv->vt->layer_state(kv, 0) == st);
    compare("kv state kept", st, x, 1001, 0.0);
    CHECK_ERR(kv->vt->truncate(kv, 1), KILN_ERR_UNSUPPORTED, NULL);
    CHECK_OK(kv->vt->truncate(kv, 0));
    compare("kv state after truncate(0)", st, zeros, 1001, 0.0);
    CHECK(kv->vt->bytes_used(kv) >= 1001 * 4);
    kiln_kv_free(kv);
    free(zeros), free(x);
}

/* ---- attention through the device KV cache ---- */

static float round_kv(float v, const char *kind) {
    if (!strcmp(kind, "f16")) return kiln_f16_to_f32(kiln_f32_to_f16(v));
    if (!strcmp(kind, "bf16")) return kiln_bf16_to_f32(kiln_f32_to_bf16(v));
    return v;
}

static void test_attention_case(const char *kind, int n_kv, int group, int hd, int vhd, int window,
                                float softcap, const int *steps, int n_steps) {
    kiln_kv_layer_desc layers[2] = {
        {.n_kv_heads = n_kv, .head_dim = hd, .v_head_dim = vhd, .window = 0, .is_attention = false},
        {.n_kv_heads = n_kv,
         .head_dim = hd,
         .v_head_dim = vhd,
         .window = window,
         .is_attention = true},
    };
    kiln_kv_options opts;
    memset(&opts, 0, sizeof opts);
    snprintf(opts.kind, sizeof opts.kind, "%s", kind);
    int total = 0;
    for (int s = 0; s < n_steps; s++) total += steps[s];
    kiln_kv *kv = NULL;
    CHECK_OK(be->kv_new(be, layers, 2, &opts, total, &kv));
    if (!kv) return;
    int heads = n_kv * group;
    kiln_attn_params p = {.n_heads = heads, .scale = 1.0f / sqrtf((float)hd), .softcap = softcap};
    int64_t kw = (int64_t)n_kv * hd, vw = (int64_t)n_kv * vhd;
    float *all_k = malloc((size_t)(total * kw) * 4), *all_v = malloc((size_t)(total * vw) * 4);
    int len = 0;
    for (int s = 0; s < n_steps; s++) {
        int n = steps[s];
        float *q = rand_f32(n * heads * hd, 1.0f), *k = rand_f32(n * kw, 1.0f),
              *v = rand_f32(n * vw, 1.0f);
        for (int64_t i = 0; i < n * kw; i++) all_k[len * kw + i] = round_kv(k[i], kind);
        for (int64_t i = 0; i < n * vw; i++) all_v[len * vw + i] = round_kv(v[i], kind);
        float *ref = malloc((size_t)(n * heads * vhd) * 4);
        kiln_attention_contiguous(q, n, len, all_k, all_v, len + n, 0, n_kv, hd, vhd, window, ref,
                                  &p, NULL);
        float *dq = dev_copy(q, (size_t)(n * heads * hd) * 4),
              *dk = dev_copy(k, (size_t)(n * kw) * 4);
        float *dv = dev_copy(v, (size_t)(n * vw) * 4), *dout = dev_poisoned(n * heads * vhd);
        CHECK_OK(kv->vt->reserve(kv, n));
        kv->vt->store(kv, 1, dk, dv, n);
        kv->vt->attend(kv, 1, dq, n, dout, &p, NULL);
        kv->vt->commit(kv, n);
        char what[160];
        snprintf(what, sizeof what, "attention %s kv=%d g=%d hd=%d/%d win=%d cap=%g pos=%d n=%d",
                 kind, n_kv, group, hd, vhd, window, softcap, len, n);
        double err = compare(what, dout, ref, n * heads * vhd, 1e-5);
        if (getenv("KILN_TEST_VERBOSE")) printf("  %-70s err %.2e\n", what, err);
        len += n;
        be->free(be, dq), be->free(be, dk), be->free(be, dv), be->free(be, dout);
        free(q), free(k), free(v), free(ref);
    }
    CHECK(kv->len == total);
    CHECK_ERR(kv->vt->reserve(kv, 1), KILN_ERR_CACHE_FULL, NULL);
    CHECK_OK(kv->vt->truncate(kv, 3));
    CHECK(kv->len == 3);
    kiln_kv_free(kv);
    free(all_k);
    free(all_v);
}

static void test_attention(void) {
    kiln_cuda_set_fa_mode(0); /* the CUDA-core kernel, exact to 1e-5 (the tensor-core one below) */
    const int short_steps[] = {37, 1, 1, 1, 3, 1};
    const int long_steps[] = {1200, 1, 2, 700, 1};
    /* decode steps (n = 1) on the short kernel (k_attn_decode_short) where the keys allow it
     * (default), on it for every context (1 << 30), and on the split kernel (0) */
    static const int short_modes[] = {-1, 1 << 30, 0};
    for (int mode = 0; mode < 3; mode++) {
        kiln_cuda_set_attn_short(short_modes[mode]);
        test_attention_case("f32", 2, 4, 64, 64, 0, 0.0f, short_steps, 6);
        test_attention_case("f32", 8, 4, 128, 128, 0, 0.0f, long_steps, 5);
        test_attention_case("f32", 1, 8, 256, 256, 8, 50.0f, short_steps, 6);
        test_attention_case("f32", 3, 1, 96, 96, 300, 0.0f, long_steps, 5);
        test_attention_case("f16", 2, 2, 128, 64, 0, 0.0f, long_steps, 5);
        test_attention_case("bf16", 1, 5, 80, 80, 0, 30.0f, short_steps, 6);
        test_attention_case("f32", 1, 4, 512, 512, 0, 0.0f, short_steps, 6);
        test_attention_case("bf16", 4, 8, 128, 128, 0, 0.0f, short_steps, 6);
        test_attention_case("f16", 2, 2, 256, 128, 40, 0.0f, long_steps, 5);
        /* groups split over blocks by the short kernel: Qwen3.5-4B's layers, Gemma 4's global */
        test_attention_case("bf16", 4, 4, 256, 256, 0, 0.0f, short_steps, 6);
        test_attention_case("bf16", 2, 4, 512, 512, 0, 0.0f, long_steps, 5);
    }
    kiln_cuda_set_attn_short(-1);
    kiln_cuda_set_fa_mode(-1);
}

/* norm_add == rmsnorm of h, add to x, scale (kiln_cpu_norm_add), with and without a weight,
 * 1 + w, a scale; h on the device unchanged or rmsnorm(h) (the op may overwrite it). */
static void test_norm_add(void) {
    static const int64_t dims[] = {7, 1024, 2560, 5000};
    for (size_t d = 0; d < 4; d++)
        for (int mode = 0; mode < 3; mode++) {
            const int64_t n = 3, dim = dims[d];
            const bool plus_one = mode == 1;
            const float scale = mode == 2 ? 0.37f : 1.0f;
            float *x = rand_f32(n * dim, 2.0f), *h = rand_f32(n * dim, 1.5f);
            float *w = mode == 2 && d == 0 ? NULL : rand_f32(dim, 0.3f);
            float *xref = malloc((size_t)(n * dim) * 4), *href = malloc((size_t)(n * dim) * 4);
            memcpy(xref, x, (size_t)(n * dim) * 4), memcpy(href, h, (size_t)(n * dim) * 4);
            kiln_cpu_norm_add(xref, href, w, n, dim, 1e-6f, plus_one, scale);
            float *dx = dev_copy(x, (size_t)(n * dim) * 4),
                  *dh = dev_copy(h, (size_t)(n * dim) * 4);
            float *dw = w ? dev_copy(w, (size_t)dim * 4) : NULL;
            be->norm_add(be, dx, dh, dw, n, dim, 1e-6f, plus_one, scale);
            compare("norm_add x", dx, xref, n * dim, 1e-5);
            be->free(be, dx), be->free(be, dh);
            if (dw) be->free(be, dw);
            free(x), free(h), free(w), free(xref), free(href);
        }
}

/* Decode steps through the contiguous cache's store_attend_batch with the q/k prep inside
 * (kiln_attn_params.prep: attention.cu's PREP kernel, one launch for q/k RMSNorm + RoPE, the KV
 * store and attention with its split merge), for n_seq sequences with cached prefixes of
 * different lengths, against the CPU: kiln_cpu_qk_norm_rope, the K/V rows rounded to the cache
 * kind, kiln_attention_contiguous. Three steps in a row, each reading the rows the ones before
 * stored: the PREP kernel, then the q/k prep + store kernel (kv_cache.cu) before attention, then
 * qk_norm_rope, store and attention launched apart. n_seq > 64 takes the composition. */
static void test_attention_prep_case(const char *kind, int n_seq, int n_kv, int group, int hd,
                                     int vhd, int rot, int window, float softcap, bool norms,
                                     int max_pre) {
    enum { STEPS = 3 };
    kiln_kv_layer_desc layer = {.n_kv_heads = n_kv,
                                .head_dim = hd,
                                .v_head_dim = vhd,
                                .window = window,
                                .is_attention = true};
    kiln_kv_options opts;
    memset(&opts, 0, sizeof opts);
    snprintf(opts.kind, sizeof opts.kind, "%s", kind);
    const int heads = n_kv * group;
    const int64_t kw = (int64_t)n_kv * hd, vw = (int64_t)n_kv * vhd, qw = (int64_t)heads * hd,
                  ow = (int64_t)heads * vhd;
    float *inv_freq = malloc(sizeof(float) * (size_t)(rot / 2 + 1));
    for (int j = 0; j < rot / 2; j++) inv_freq[j] = powf(10000.0f, -2.0f * j / (float)rot);
    float *qn = norms ? rand_f32(hd, 0.5f) : NULL, *kn = norms ? rand_f32(hd, 0.5f) : NULL;
    for (int i = 0; norms && i < hd; i++) qn[i] += 1.0f, kn[i] += 1.0f;
    float *d_inv = dev_copy(inv_freq, sizeof(float) * (size_t)(rot / 2 + 1));
    float *d_qn = norms ? dev_copy(qn, sizeof(float) * (size_t)hd) : NULL;
    float *d_kn = norms ? dev_copy(kn, sizeof(float) * (size_t)hd) : NULL;
    const kiln_qk_prep prep_dev = {d_qn, d_kn, d_inv, rot, 1e-6f};
    kiln_kv **kvs = calloc((size_t)n_seq, sizeof *kvs);
    float **ck = calloc((size_t)n_seq, sizeof *ck), **cv = calloc((size_t)n_seq, sizeof *cv);
    int *len = calloc((size_t)n_seq, sizeof *len), *ones = calloc((size_t)n_seq, sizeof *ones);
    for (int i = 0; i < n_seq; i++) {
        /* prefixes 0, 1, 31, 32, 33, ... up to max_pre: across the 32-key tiles and the splits */
        static const int pres[] = {0, 1, 31, 32, 33, 127, 128, 200, 1030, 5};
        int pre = pres[i % 10] <= max_pre ? pres[i % 10] : i % (max_pre + 1);
        ones[i] = 1;
        CHECK_OK(be->kv_new(be, &layer, 1, &opts, pre + STEPS, &kvs[i]));
        if (!kvs[i]) return;
        ck[i] = malloc(sizeof(float) * (size_t)((pre + STEPS) * kw));
        cv[i] = malloc(sizeof(float) * (size_t)((pre + STEPS) * vw));
        if (pre) {
            float *k = rand_f32(pre * kw, 1.0f), *v = rand_f32(pre * vw, 1.0f);
            float *dk = dev_copy(k, sizeof(float) * (size_t)(pre * kw)),
                  *dv = dev_copy(v, sizeof(float) * (size_t)(pre * vw));
            CHECK_OK(kvs[i]->vt->reserve(kvs[i], pre));
            kvs[i]->vt->store(kvs[i], 0, dk, dv, pre);
            kvs[i]->vt->commit(kvs[i], pre);
            for (int64_t e = 0; e < pre * kw; e++) ck[i][e] = round_kv(k[e], kind);
            for (int64_t e = 0; e < pre * vw; e++) cv[i][e] = round_kv(v[e], kind);
            be->free(be, dk), be->free(be, dv);
            free(k), free(v);
        }
        len[i] = pre;
    }
    const double tol = strcmp(kind, "f32") ? 1e-3 : 1e-4;
    for (int step = 0; step < STEPS; step++) {
        float *q = rand_f32(n_seq * qw, 1.0f), *k = rand_f32(n_seq * kw, 1.0f),
              *v = rand_f32(n_seq * vw, 1.0f);
        float *dq = dev_copy(q, sizeof(float) * (size_t)(n_seq * qw)),
              *dk = dev_copy(k, sizeof(float) * (size_t)(n_seq * kw)),
              *dv = dev_copy(v, sizeof(float) * (size_t)(n_seq * vw));
        float *dout = dev_poisoned(n_seq * ow), *ref = malloc(sizeof(float) * (size_t)(n_seq * ow));
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_seq);
        for (int i = 0; i < n_seq; i++) pos[i] = len[i];
        int32_t *dpos = dev_copy(pos, sizeof(int32_t) * (size_t)n_seq);
        kiln_cpu_qk_norm_rope(q, k, pos, n_seq, heads, n_kv, hd, rot, inv_freq, qn, kn, 1e-6f);
        for (int i = 0; i < n_seq; i++) {
            for (int64_t e = 0; e < kw; e++) ck[i][len[i] * kw + e] = round_kv(k[i * kw + e], kind);
            for (int64_t e = 0; e < vw; e++) cv[i][len[i] * vw + e] = round_kv(v[i * vw + e], kind);
            kiln_attention_contiguous(q + i * qw, 1, len[i], ck[i], cv[i], len[i] + 1, 0, n_kv, hd,
                                      vhd, window, ref + i * ow,
                                      &(kiln_attn_params){.n_heads = heads,
                                                          .scale = 1.0f / sqrtf((float)hd),
                                                          .softcap = softcap},
                                      NULL);
            CHECK_OK(kvs[i]->vt->reserve(kvs[i], 1));
        }
        kiln_attn_params p = {.n_heads = heads,
                              .scale = 1.0f / sqrtf((float)hd),
                              .softcap = softcap,
                              .positions = dpos,
                              .prep = &prep_dev};
        CHECK(kvs[0]->vt->prep_inside);
        /* step 0: the PREP kernel; 1: q/k prep + store kernel, then attention; 2: apart */
        kiln_cuda_set_attn_prep(step == 0 ? 1 : 0);
        kiln_cuda_set_qk_store(step == 1 ? 1 : 0);
        kvs[0]->vt->store_attend_batch(kvs, ones, n_seq, 0, dk, dv, dq, dout, &p, NULL);
        kiln_cuda_set_attn_prep(-1);
        kiln_cuda_set_qk_store(-1);
        CHECK_OK(be->synchronize(be));
        for (int i = 0; i < n_seq; i++) kvs[i]->vt->commit(kvs[i], 1), len[i]++;
        char what[192];
        snprintf(what, sizeof what,
                 "attention prep (%s) %s seqs=%d kv=%d g=%d hd=%d/%d rot=%d win=%d cap=%g "
                 "norms=%d step %d",
                 step == 0   ? "one kernel"
                 : step == 1 ? "prep+store kernel"
                             : "apart",
                 kind, n_seq, n_kv, group, hd, vhd, rot, window, softcap, norms, step);
        double err = compare(what, dout, ref, n_seq * ow, tol);
        if (getenv("KILN_TEST_VERBOSE")) printf("  %-90s err %.2e\n", what, err);
        be->free(be, dq), be->free(be, dk), be->free(be, dv), be->free(be, dout);
        be->free(be, dpos);
        free(q), free(k), free(v), free(ref), free(pos);
    }
    for (int i = 0; i < n_seq; i++) {
        kiln_kv_free(kvs[i]);
        free(ck[i]), free(cv[i]);
    }
    free(kvs), free(ck), free(cv), free(len), free(ones), free(inv_freq), free(qn), free(kn);
    be->free(be, d_inv);
    if (d_qn) be->free(be, d_qn), be->free(be, d_kn);
}

static void test_attention_prep(void) {
    /* kind, seqs, kv heads, group, head dim, v head dim, rot dim, window, softcap, norms, max
     * prefix */
    test_attention_prep_case("f32", 1, 8, 2, 128, 128, 128, 0, 0.0f, true, 1030);
    test_attention_prep_case("f32", 3, 8, 2, 128, 128, 128, 0, 0.0f, true, 1030);
    test_attention_prep_case("bf16", 10, 4, 4, 64, 64, 32, 0, 0.0f, false, 1030);
    test_attention_prep_case("f16", 7, 2, 8, 128, 64, 128, 0, 30.0f, true, 200);
    test_attention_prep_case("f32", 5, 1, 16, 80, 80, 80, 40, 0.0f, true, 300);
    test_attention_prep_case("bf16", 64, 8, 4, 128, 128, 128, 0, 0.0f, true, 300);
    test_attention_prep_case("f32", 70, 2, 2, 64, 64, 64, 0, 0.0f, true, 64); /* > 64 seqs */
    test_attention_prep_case("f32", 2, 3, 1, 256, 256, 64, 0, 0.0f, true, 1030);
}

/* ---- prefill attention on tensor cores (attention_prefill_tc.cu) ---- */

/* Q is rounded to the cache's 16-bit type and so is P: bf16 ~3e-3 relative, f16 ~4e-4; f32
 * caches (opt-in) round K and V to bf16 too. */
static int tc_simple; /* which tensor-core kernel (kiln_cuda_set_fa_simple) */

static int tc_f32_split = 0; /* f32 caches as bf16 hi + lo pairs (kiln_cuda_set_fa_f32(2)) */
static double tc_tol(const char *kind) {
    if (tc_f32_split && !strcmp(kind, "f32")) return 5e-5; /* ~5e-6 in the emulator */
    return strcmp(kind, "f16") ? 1e-2 : 2e-3;
}

/* One sequence through kv->vt->attend (kcu_attention) with the tensor-core kernel forced for
 * every step (kiln_cuda_set_fa_mode(2): also the short and decode steps), against the CPU
 * reference; every step must have launched it. */
static void test_attention_tc_case(const char *kind, int n_kv, int group, int hd, int window,
                                   float softcap, const int *steps, int n_steps) {
    kiln_kv_layer_desc layer = {.n_kv_heads = n_kv,
                                .head_dim = hd,
                                .v_head_dim = hd,
                                .window = window,
                                .is_attention = true};
    kiln_kv_options opts;
    memset(&opts, 0, sizeof opts);
    snprintf(opts.kind, sizeof opts.kind, "%s", kind);
    int total = 0;
    for (int s = 0; s < n_steps; s++) total += steps[s];
    kiln_kv *kv = NULL;
    CHECK_OK(be->kv_new(be, &layer, 1, &opts, total, &kv));
    if (!kv) return;
    int heads = n_kv * group;
    kiln_attn_params p = {.n_heads = heads, .scale = 1.0f / sqrtf((float)hd), .softcap = softcap};
    int64_t kw = (int64_t)n_kv * hd;
    float *all_k = malloc((size_t)(total * kw) * 4), *all_v = malloc((size_t)(total * kw) * 4);
    int len = 0;
    kiln_cuda_set_fa_mode(2);
    for (int s = 0; s < n_steps; s++) {
        int n = steps[s];
        float *q = rand_f32(n * heads * hd, 1.0f), *k = rand_f32(n * kw, 1.0f),
              *v = rand_f32(n * kw, 1.0f);
        for (int64_t i = 0; i < n * kw; i++) all_k[len * kw + i] = round_kv(k[i], kind);
        for (int64_t i = 0; i < n * kw; i++) all_v[len * kw + i] = round_kv(v[i], kind);
        float *ref = malloc((size_t)(n * heads * hd) * 4);
        kiln_attention_contiguous(q, n, len, all_k, all_v, len + n, 0, n_kv, hd, hd, window, ref,
                                  &p, NULL);
        float *dq = dev_copy(q, (size_t)(n * heads * hd) * 4),
              *dk = dev_copy(k, (size_t)(n * kw) * 4);
        float *dv = dev_copy(v, (size_t)(n * kw) * 4), *dout = dev_poisoned(n * heads * hd);
        CHECK_OK(kv->vt->reserve(kv, n));
        kv->vt->store(kv, 0, dk, dv, n);
        long long launches = kiln_cuda_fa_launches();
        kv->vt->attend(kv, 0, dq, n, dout, &p, NULL);
        CHECK_MSG(kiln_cuda_fa_launches() == launches + 1, "tensor-core attention not launched");
        kv->vt->commit(kv, n);
        char what[160];
        snprintf(what, sizeof what, "attention tc%s %s kv=%d g=%d hd=%d win=%d cap=%g pos=%d n=%d",
                 tc_simple ? "-simple" : "", kind, n_kv, group, hd, window, softcap, len, n);
        double err = compare(what, dout, ref, n * heads * hd, tc_tol(kind));
        if (getenv("KILN_TEST_VERBOSE")) printf("  %-70s err %.2e\n", what, err);
        len += n;
        be->free(be, dq), be->free(be, dk), be->free(be, dv), be->free(be, dout);
        free(q), free(k), free(v), free(ref);
    }
    kiln_cuda_set_fa_mode(-1);
    kiln_kv_free(kv);
    free(all_k);
    free(all_v);
}

/* Several sequences of different lengths and cached prefixes in one store_attend_batch (the
 * default mode: sequences of >= 64 tokens on tensor cores, the others on the CUDA-core kernel
 * in the same call), each against the CPU reference. */
static void test_attention_tc_batch(const char *kind, int n_kv, int group, int hd, int window,
                                    float softcap) {
    enum { NS = 5 };
    const int pre[NS] = {0, 37, 5, 0, 300}; /* cached tokens before the batch */
    const int n[NS] = {100, 64, 1, 257, 20};
    kiln_kv_layer_desc layer = {.n_kv_heads = n_kv,
                                .head_dim = hd,
                                .v_head_dim = hd,
                                .window = window,
                                .is_attention = true};
    kiln_kv_options opts;
    memset(&opts, 0, sizeof opts);
    snprintf(opts.kind, sizeof opts.kind, "%s", kind);
    int heads = n_kv * group, T = 0;
    kiln_attn_params p = {.n_heads = heads, .scale = 1.0f / sqrtf((float)hd), .softcap = softcap};
    int64_t kw = (int64_t)n_kv * hd, qw = (int64_t)heads * hd;
    kiln_kv *kvs[NS];
    float *ks[NS], *vs[NS];
    for (int i = 0; i < NS; i++) {
        kvs[i] = NULL;
        CHECK_OK(be->kv_new(be, &layer, 1, &opts, pre[i] + n[i], &kvs[i]));
        if (!kvs[i]) return;
        int len = pre[i] + n[i];
        float *k = rand_f32(len * kw, 1.0f), *v = rand_f32(len * kw, 1.0f);
        if (pre[i]) { /* the cached prefix */
            float *dk = dev_copy(k, (size_t)(pre[i] * kw) * 4),
                  *dv = dev_copy(v, (size_t)(pre[i] * kw) * 4);
            CHECK_OK(kvs[i]->vt->reserve(kvs[i], pre[i]));
            kvs[i]->vt->store(kvs[i], 0, dk, dv, pre[i]);
            kvs[i]->vt->commit(kvs[i], pre[i]);
            be->free(be, dk), be->free(be, dv);
        }
        for (int64_t e = 0; e < len * kw; e++) k[e] = round_kv(k[e], kind);
        for (int64_t e = 0; e < len * kw; e++) v[e] = round_kv(v[e], kind);
        ks[i] = k, vs[i] = v;
        T += n[i];
    }
    /* the batch's new rows, stacked (already rounded: storing them again changes nothing) */
    float *q = rand_f32(T * qw, 1.0f), *k = malloc((size_t)(T * kw) * 4),
          *v = malloc((size_t)(T * kw) * 4), *ref = malloc((size_t)(T * heads * hd) * 4);
    for (int i = 0, t = 0; i < NS; t += n[i], i++) {
        memcpy(k + t * kw, ks[i] + pre[i] * kw, (size_t)(n[i] * kw) * 4);
        memcpy(v + t * kw, vs[i] + pre[i] * kw, (size_t)(n[i] * kw) * 4);
        kiln_attention_contiguous(q + t * qw, n[i], pre[i], ks[i], vs[i], pre[i] + n[i], 0, n_kv,
                                  hd, hd, window, ref + t * qw, &p, NULL);
        CHECK_OK(kvs[i]->vt->reserve(kvs[i], n[i]));
    }
    float *dq = dev_copy(q, (size_t)(T * qw) * 4), *dk = dev_copy(k, (size_t)(T * kw) * 4);
    float *dv = dev_copy(v, (size_t)(T * kw) * 4), *dout = dev_poisoned(T * qw);
    long long launches = kiln_cuda_fa_launches();
    kiln_cuda_set_fa_mode(1);
    kvs[0]->vt->store_attend_batch(kvs, n, NS, 0, dk, dv, dq, dout, &p, NULL);
    kiln_cuda_set_fa_mode(-1);
    CHECK_MSG(kiln_cuda_fa_launches() == launches + 1, "batch: tensor-core attention not launched");
    char what[160];
    snprintf(what, sizeof what, "attention tc%s batch %s kv=%d g=%d hd=%d win=%d cap=%g",
             tc_simple ? "-simple" : "", kind, n_kv, group, hd, window, softcap);
    double err = compare(what, dout, ref, T * qw, tc_tol(kind));
    if (getenv("KILN_TEST_VERBOSE")) printf("  %-70s err %.2e\n", what, err);
    for (int i = 0; i < NS; i++) {
        kvs[i]->vt->commit(kvs[i], n[i]);
        kiln_kv_free(kvs[i]);
        free(ks[i]), free(vs[i]);
    }
    be->free(be, dq), be->free(be, dk), be->free(be, dv), be->free(be, dout);
    free(q), free(k), free(v), free(ref);
}

/* Both tensor-core kernels (the pipelined default, then the simple one) on every case. */
static void test_attention_tc(void) {
    const int a[] = {64, 100, 1}, b[] = {37, 257}, c[] = {1000}, d[] = {37, 1000};
    for (tc_simple = 0; tc_simple < 2; tc_simple++) {
        kiln_cuda_set_fa_simple(tc_simple);
        /* kind, kv heads, group, head dim, window, softcap, steps (pos0 = sum of earlier steps) */
        test_attention_tc_case("bf16", 2, 4, 128, 0, 0.0f, a, 3);
        test_attention_tc_case("f16", 2, 4, 128, 0, 0.0f, b, 2);
        test_attention_tc_case("bf16", 1, 8, 256, 0, 50.0f, b, 2);
        test_attention_tc_case("f16", 2, 1, 64, 40, 0.0f, c, 1);
        test_attention_tc_case("bf16", 2, 1, 80, 0, 50.0f, a, 3);
        test_attention_tc_case("f16", 1, 8, 96, 30, 50.0f, b, 2);
        test_attention_tc_case("bf16", 8, 4, 128, 200, 0.0f, d, 2);
        test_attention_tc_case("bf16", 1, 4, 64, 0, 0.0f, c, 1);
        test_attention_tc_case("f16", 1, 4, 256, 0, 50.0f, c, 1);
        test_attention_tc_case("bf16", 1, 1, 96, 0, 0.0f, d, 2);
        test_attention_tc_case("f16", 1, 8, 80, 0, 0.0f, a, 3);
        test_attention_tc_batch("bf16", 2, 4, 128, 0, 0.0f);
        test_attention_tc_batch("f16", 1, 8, 64, 50, 50.0f);
        test_attention_tc_batch("bf16", 2, 1, 256, 0, 0.0f);
        test_attention_tc_batch("f16", 2, 4, 96, 0, 0.0f);
    }
    kiln_cuda_set_fa_simple(-1);
    /* f32 caches take the simple kernel: K/V rounded to bf16 on load (KILN_CUDA_FA_F32=1) ... */
    tc_simple = 1;
    kiln_cuda_set_fa_f32(1);
    test_attention_tc_case("f32", 2, 4, 128, 0, 0.0f, b, 2);
    test_attention_tc_case("f32", 1, 1, 80, 30, 50.0f, a, 3);
    test_attention_tc_batch("f32", 2, 4, 64, 0, 0.0f);
    /* ... or kept as bf16 hi + lo pairs, three products per MMA (KILN_CUDA_FA_F32=2, default) */
    kiln_cuda_set_fa_f32(2);
    tc_f32_split = 1;
    test_attention_tc_case("f32", 2, 4, 128, 0, 0.0f, b, 2);
    test_attention_tc_case("f32", 1, 1, 80, 30, 50.0f, a, 3);
    test_attention_tc_case("f32", 1, 2, 256, 16, 0.0f, c, 1);
    test_attention_tc_batch("f32", 2, 4, 64, 0, 0.0f);
    tc_f32_split = 0;
    kiln_cuda_set_fa_f32(-1);
    /* KILN_CUDA_FA=0 equivalent: nothing launched */
    long long launches = kiln_cuda_fa_launches();
    kiln_cuda_set_fa_mode(0);
    test_attention_case("bf16", 1, 4, 128, 128, 0, 0.0f, c, 1);
    kiln_cuda_set_fa_mode(-1);
    CHECK(kiln_cuda_fa_launches() == launches);
}

/* ---- sampling ---- */

typedef struct sample_case {
    const char *name;
    float temperature;
    int top_k;
    float top_p, min_p;
    float repetition, presence, frequency;
    int n_history;  /* penalty window per row */
    float scale;    /* logits ~ N(0, scale^2) on a grid of 1/16 */
    int n_max_ties; /* extra ids set to the row's maximum */
} sample_case;

/* n_logits random rows, each sampled `draws` times with its own uniform u (a row of logits per
 * draw, since penalties change them in place): the CUDA op's ids equal the reference's, and so do
 * the penalized logits. Logits sit on a grid of 1/16: distinct values are far apart compared with
 * float rounding of their probabilities, equal ones tie exactly on both sides (lowest id first). */
static void check_sample_case(int64_t V, const sample_case *c, int n_logits, int draws) {
    const int n = n_logits * draws;
    const size_t row_bytes = (size_t)V * sizeof(float);
    float *base = malloc((size_t)n_logits * row_bytes), *host = malloc((size_t)n * row_bytes);
    int32_t *hist = malloc((size_t)(n * c->n_history + 1) * sizeof *hist);
    kiln_sample_row *rows = calloc((size_t)n, sizeof *rows);
    int32_t *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got);
    for (int j = 0; j < n_logits; j++) {
        float *x = base + (size_t)j * V;
        int64_t top = 0;
        for (int64_t i = 0; i < V; i++) {
            x[i] = floorf(c->scale * test_rand_normal(&rng) * 16.0f) / 16.0f;
            if (x[i] > x[top]) top = i;
        }
        for (int t = 0; t < c->n_max_ties; t++) x[test_rand_u64(&rng) % (uint64_t)V] = x[top];
    }
    for (int r = 0; r < n; r++) {
        memcpy(host + (size_t)r * V, base + (size_t)(r % n_logits) * V, row_bytes);
        int32_t *h = hist + (size_t)r * c->n_history;
        for (int i = 0; i < c->n_history; i++) /* repeats of low ids, the odd id outside */
            h[i] = i % 17 == 16 ? -1 : (int32_t)(test_rand_u64(&rng) % (uint64_t)(V < 40 ? V : 40));
        rows[r] =
            (kiln_sample_row){.logits_row = r,
                              .temperature = c->temperature,
                              .inv_temperature = c->temperature > 0 ? 1.0f / c->temperature : 0.0f,
                              .top_k = c->top_k,
                              .top_p = c->top_p,
                              .min_p = c->min_p,
                              .repetition_penalty = c->repetition,
                              .presence_penalty = c->presence,
                              .frequency_penalty = c->frequency,
                              .history_offset = r * c->n_history,
                              .n_history = c->n_history,
                              .u = (double)(test_rand_u64(&rng) >> 11) / 9007199254740992.0};
    }
    float *d_logits = dev_copy(host, (size_t)n * row_bytes);
    int32_t *d_ids = be->alloc(be, (size_t)n * sizeof *d_ids);
    be->sample(be, d_ids, d_logits, V, n, rows, hist);
    CHECK_OK(be->synchronize(be));
    be->download(be, got, d_ids, (size_t)n * sizeof *got);
    kiln_cpu_sample_ref(want, host, V, n, rows, hist);
    int bad = 0, first_bad = -1;
    for (int r = 0; r < n; r++)
        if (got[r] != want[r] && bad++ == 0) first_bad = r;
    CHECK_MSG(bad == 0, "sample %s, vocab %lld: %d of %d draws differ (row %d: cuda %d, cpu %d)",
              c->name, (long long)V, bad, n, first_bad, first_bad >= 0 ? got[first_bad] : 0,
              first_bad >= 0 ? want[first_bad] : 0);
    if (c->n_history > 0) { /* penalized in place, bit for bit */
        float *back = malloc((size_t)n * row_bytes);
        be->download(be, back, d_logits, (size_t)n * row_bytes);
        CHECK_MSG(memcmp(back, host, (size_t)n * row_bytes) == 0,
                  "sample %s, vocab %lld: penalized logits differ", c->name, (long long)V);
        free(back);
    }
    be->free(be, d_logits);
    be->free(be, d_ids);
    free(base), free(host), free(hist), free(rows), free(want), free(got);
}

static void test_sample(void) {
    static const sample_case cases[] = {
        {"greedy", 0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 3.0f, 0},
        {"greedy ties", 0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 3.0f, 5},
        {"top_k 1", 0.7f, 1, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 3.0f, 3},
        {"greedy + penalties", 0.0f, 0, 1.0f, 0.0f, 1.3f, 0.5f, 0.2f, 48, 2.0f, 2},
        {"temperature", 1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 3.0f, 0},
        {"min_p", 0.7f, 0, 1.0f, 0.05f, 1.0f, 0.0f, 0.0f, 0, 3.0f, 0},
        {"min_p 1 (max ties)", 1.0f, 0, 1.0f, 1.0f, 1.0f, 0.0f, 0.0f, 0, 3.0f, 4},
        {"top_k", 0.8f, 40, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 3.0f, 0},
        {"top_p", 1.0f, 0, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 3.0f, 0},
        {"top_k top_p min_p penalties", 0.8f, 50, 0.95f, 0.05f, 1.3f, 0.5f, 0.2f, 64, 2.0f, 2},
        {"top_k 3000 (two batches)", 1.5f, 3000, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 1.0f, 0},
        {"wide nucleus (many batches, ties)", 3.0f, 0, 0.99f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 0.5f, 0},
        {"penalties only", 1.0f, 0, 1.0f, 0.0f, 0.8f, 0.0f, 0.3f, 200, 2.0f, 0},
    };
    static const int64_t vocabs[] = {151936, 32000, 1000, 7};
    for (size_t v = 0; v < sizeof vocabs / sizeof *vocabs; v++)
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            const int64_t V = vocabs[v];
            check_sample_case(V, &cases[c], V > 100000 ? 4 : 8, V > 100000 ? 12 : 32);
        }
}

/* KILN_TEST_ONLY=name[,name]: only the groups whose call contains one of the names (a short GPU
 * check of one kernel); unset: every group */
static bool selected(const char *call) {
    const char *only = getenv("KILN_TEST_ONLY");
    if (!only || !*only) return true;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", only);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (strstr(call, t)) return true;
    return false;
}
/* each group's wall time on stderr, so that a run cut off by a timeout shows where it was */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#define RUN(call)                                                                                  \
    do {                                                                                           \
        if (selected(#call)) {                                                                     \
            const double t0_ = now_s();                                                            \
            call;                                                                                  \
            fprintf(stderr, "group %s: %.1f s\n", #call, now_s() - t0_);                           \
        }                                                                                          \
    } while (0)

int main(void) {
    char why[200];
    if (kiln_cuda_device_count(why, sizeof why) == 0) return test_skip(why);
    kiln_status st = kiln_backend_cuda_new(1, &be);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln_backend_cuda_new: %s\n", kiln_last_error());
        return 1;
    }
    RUN(test_elementwise());
    RUN(test_scale_softcap());
    RUN(test_rmsnorm());
    RUN(test_rope());
    RUN(test_add_rmsnorm());
    RUN(test_norm_add());
    RUN(test_qk_norm_rope());
    RUN(test_matmul_multi());
    RUN(test_upload_matrices());
    RUN(test_matmul_fused());
    RUN(test_embed());
    RUN(test_prefetch());
    RUN(test_matmul());
    /* again on the paths the tensor-core GEMM replaced by default (KILN_CUDA_TC_GEMM=0) */
    kiln_cuda_set_tc_gemm(0, -1, 0, 0);
    RUN(test_matmul_multi());
    RUN(test_matmul_fused());
    RUN(test_matmul());
    kiln_cuda_set_tc_gemm(-1, -1, 0, 0);
    RUN(test_dequant_gemm());
    RUN(test_qgemv_dp4a());
    /* the quantized decode fusions (on by default): every flag combination, inline mode and
     * PDL setting; at n >= 2 the norm cases go through the tensor-core GEMM (a norm without a
     * weight among them: that GEMM skipped such norms before 2026-12-03) */
    kiln_cuda_set_qfused(1);
    RUN(test_qgemv_fused());
    RUN(test_qgemv_link());
    kiln_cuda_set_qfused(-1);
    RUN(test_qgemv_mma());
    RUN(test_gemv_bf16_rows());
    RUN(test_tc_gemm());
    RUN(test_tc_fused());
    RUN(test_tc_gemm_fast());
    kiln_cuda_set_tc_dq(0); /* fast mode on codes with the scales folded in per group */
    RUN(test_tc_gemm_fast());
    kiln_cuda_set_tc_dq(-1);
    /* the int8 variant for 4/8-bit weights: exact mode at the same tolerances, then fast mode */
    kiln_cuda_set_tc_int8(1);
    RUN(test_tc_gemm());
    RUN(test_tc_fused());
    RUN(test_tc_gemm_int8_fast());
    /* split-K summed by the last split in the kernel, both variants */
    kiln_cuda_set_tc_reduce(1);
    RUN(test_tc_gemm());
    RUN(test_tc_fused());
    kiln_cuda_set_tc_int8(-1);
    RUN(test_tc_gemm());
    kiln_cuda_set_tc_reduce(-1);
    RUN(test_attention());
    RUN(test_attention_prep());
    RUN(test_attention_tc());
    RUN(test_copy_zero_gate());
    RUN(test_l2norm());
    RUN(test_gdn_conv());
    RUN(test_gdn_split_qkv());
    RUN(test_gated_rmsnorm());
    RUN(test_gdn_gates());
    RUN(test_gdn_delta(0));
    RUN(test_gdn_delta(1));
    kiln_cuda_set_gdn_simple(-1);
    RUN(test_gdn_delta_chunked());
    RUN(test_gdn_batch(1));
    RUN(test_gdn_batch(0));
    RUN(test_moe_rows());
    kiln_cuda_set_moe_tc(0);    /* the CUDA-core gathers (the expert GEMM takes 64+ pairs) */
    RUN(test_moe_device_ops()); /* 16 pairs over 5 experts: the grouped gather */
    kiln_cuda_set_moe_grouped(0);
    RUN(test_moe_device_ops()); /* the per-pair gather */
    kiln_cuda_set_moe_grouped(-2);
    kiln_cuda_set_moe_tc(1);
    RUN(test_moe_device_ops()); /* the tensor-core expert GEMM where the format allows */
    kiln_cuda_set_moe_tc(-2);
    RUN(test_moe_tc());
    RUN(test_kv_state());
    RUN(test_sample());
    CHECK_OK(be->synchronize(be));
    kiln_backend_free(be);
    return test_finish();
}
#endif
