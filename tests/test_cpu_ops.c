/* test_cpu_ops.c — every CPU fast path against its reference on fresh random data, at each SIMD
 * level the CPU has (forced in turn), with thread pools of 1 and 2: matmul for f32/f16/bf16 and
 * MLX-quantized weights of 2..8 bits, groups 32/64/128, f16/bf16/f32 scales, with and without an
 * output bias, n = 1, 2, 3, 4, 7, 33 and row counts that are not tile multiples (and the 4/8-bit
 * prefill GEMM at n = 9..300 with outlier channels), in the exact
 * mode (<= 1e-5) and the fast mode (int8 / bf16 activations where the CPU has them: <= 2e-2 per
 * case vs the reference, typically 4e-3, noisy on 9-row views; and <= 1e-5 vs a double model of
 * its int8 arithmetic; the exact mode must be unchanged after it); embedding; and the
 * small ops against closed-form double-precision formulas. Weight buffers are allocated to their
 * exact size so the sanitizer build catches any over-read at the end of a matrix. */
#include "backend/cpu/cpu_ops.h"
#include "format/mlx_quant.h"
#include "test_util.h"
#include "util/half.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const levels[] = {"scalar", "avx2", "avx512"};
static uint64_t rng = 20240601;

static float *rand_vec(int64_t n, float sd) {
    float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = sd * test_rand_normal(&rng);
    return v;
}

/* Stores f32 values in dtype dt (F32/F16/BF16) into a fresh exact-size buffer. */
static void *store_as(const float *v, int64_t n, kiln_dtype dt) {
    if (dt == KILN_DT_F32) {
        float *out = malloc(sizeof(float) * (size_t)n);
        memcpy(out, v, sizeof(float) * (size_t)n);
        return out;
    }
    uint16_t *out = malloc(2 * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        out[i] = dt == KILN_DT_F16 ? kiln_f32_to_f16(v[i]) : kiln_f32_to_bf16(v[i]);
    return out;
}

/* A random weight matrix in the given format (bits = 0: dense dtype). */
static kiln_matrix make_matrix(int64_t rows, int64_t cols, kiln_dtype dtype, int bits, int group,
                               kiln_dtype scale_dtype, bool with_bias) {
    kiln_matrix m = {.dtype = dtype, .rows = rows, .cols = cols};
    if (bits) {
        m.dtype = KILN_DT_U32;
        m.bits = bits, m.group_size = group, m.scale_dtype = scale_dtype;
        int64_t bytes = rows * cols * bits / 8, groups = rows * cols / group;
        uint8_t *codes = malloc((size_t)bytes);
        for (int64_t i = 0; i < bytes; i++) codes[i] = (uint8_t)test_rand_u64(&rng);
        m.data = codes;
        float *s = rand_vec(groups, 0.02f), *b = rand_vec(groups, 0.05f);
        m.scales = store_as(s, groups, scale_dtype);
        m.biases = store_as(b, groups, scale_dtype);
        free(s), free(b);
    } else {
        float *w = rand_vec(rows * cols, 0.1f);
        m.data = store_as(w, rows * cols, dtype);
        free(w);
    }
    if (with_bias) m.bias = rand_vec(rows, 0.5f);
    return m;
}

static void free_matrix(kiln_matrix *m) {
    free((void *)m->data), free((void *)m->scales), free((void *)m->biases);
    free((void *)m->bias);
}

/* Code j of a packed MLX row and a group value, written out independently of the kernels. */
static unsigned kiln_q_code_test(const uint8_t *row, int64_t j, int bits) {
    unsigned v = 0;
    for (int b = 0; b < bits; b++) {
        int64_t bit = j * bits + b;
        v |= (unsigned)((row[bit >> 3] >> (bit & 7)) & 1) << b;
    }
    return v;
}
static double kiln_q_scale_test(const void *p, kiln_dtype dt, int64_t i) {
    if (dt == KILN_DT_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == KILN_DT_F16 ? kiln_f16_to_f32(h) : kiln_bf16_to_f32(h);
}

static int matmul_cases = 0;
static double matmul_tol = 1e-5; /* 2e-2 while the fast mode is on */

/* Runs the fast matmul for every n against the reference; returns the worst relative error. */
static double check_matmul(kiln_threadpool *pool, const kiln_matrix *w, const char *what) {
    static const int64_t ns[] = {1, 2, 3, 4, 7, 33};
    double worst = 0.0;
    for (size_t t = 0; t < sizeof ns / sizeof *ns; t++) {
        int64_t n = ns[t];
        float *x = rand_vec(n * w->cols, 1.0f);
        float *y = malloc(sizeof(float) * (size_t)(n * w->rows));
        float *ref = malloc(sizeof(float) * (size_t)(n * w->rows));
        for (int64_t i = 0; i < n * w->rows; i++) y[i] = NAN; /* every output must be written */
        kiln_cpu_matmul(pool, y, x, n, w);
        kiln_cpu_matmul_ref(ref, x, n, w);
        double err = test_rel_l2(y, ref, (size_t)(n * w->rows));
        CHECK_MSG(err <= matmul_tol, "%s [%s %s] n=%lld rows=%lld cols=%lld: rel err %g", what,
                  kiln_cpu_simd_name(), kiln_cpu_matmul_mode(), (long long)n, (long long)w->rows,
                  (long long)w->cols, err);
        if (!(err <= worst)) worst = err;
        matmul_cases++;
        free(x), free(y), free(ref);
    }
    return worst;
}

static void test_matmul_dense(kiln_threadpool *pool) {
    static const kiln_dtype dts[] = {KILN_DT_F32, KILN_DT_F16, KILN_DT_BF16};
    static const int64_t shapes[][2] = {{37, 96}, {70, 160}, {33, 320}, {5, 17}, {41, 131}};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            kiln_matrix w = make_matrix(shapes[s][0], shapes[s][1], dts[d], 0, 0, 0, s % 2 == 0);
            check_matmul(pool, &w, kiln_dtype_name(dts[d]));
            free_matrix(&w);
        }
}

/* Worst exact-mode error of the quantized matmuls at the current level (printed per level: the
 * 4/8-bit GEMV runs on x split into three int8 parts, ~1e-7 expected). */
static double quant_worst = 0.0;

static void test_matmul_quant(kiln_threadpool *pool) {
    static const int bits_list[] = {2, 3, 4, 5, 6, 8};
    static const int groups[] = {32, 64, 128};
    static const kiln_dtype sdts[] = {KILN_DT_F16, KILN_DT_BF16, KILN_DT_F32};
    for (size_t b = 0; b < 6; b++)
        for (size_t g = 0; g < 3; g++) {
            int64_t rows = 35 + (int64_t)(b * 3 + g), cols = groups[g] * (g == 0 ? 5 : 3);
            kiln_matrix w = make_matrix(rows, cols, 0, bits_list[b], groups[g], sdts[(b + g) % 3],
                                        (b + g) % 2 == 0);
            char what[64];
            snprintf(what, sizeof what, "q%dg%d %s", bits_list[b], groups[g],
                     kiln_dtype_name(w.scale_dtype));
            double err = check_matmul(pool, &w, what);
            if (err > quant_worst) quant_worst = err;
            /* a row view ending at the matrix end (the tail guard of the SIMD decoders) */
            kiln_matrix tail = kiln_matrix_rows(&w, rows - 9, 9);
            err = check_matmul(pool, &tail, what);
            if (err > quant_worst) quant_worst = err;
            free_matrix(&w);
        }
    /* rows of 35 groups: two full 16-group scale windows (the int8 GEMV's 4-step quads) and a
     * short one, at every group size the quads take */
    for (int bits = 4; bits <= 8; bits += 4)
        for (int gs = 32; gs <= 128; gs *= 2) {
            kiln_matrix w = make_matrix(13, (int64_t)gs * 35, 0, bits, gs, KILN_DT_F16, gs == 64);
            double err = check_matmul(pool, &w, "wide rows");
            if (err > quant_worst) quant_worst = err;
            free_matrix(&w);
        }
    /* group 16: the 4-bit prefill decoder's 32-code fast path does not apply (generic decoder) */
    for (int bits = 4; bits <= 8; bits += 4) {
        kiln_matrix w = make_matrix(19, 16 * 7, 0, bits, 16, KILN_DT_BF16, true);
        double err = check_matmul(pool, &w, bits == 4 ? "q4g16" : "q8g16");
        if (err > quant_worst) quant_worst = err;
        free_matrix(&w);
    }
}

/* The prefill GEMM of 4/8-bit weights (on AVX512-VNNI: x in three int8 digits per block, see
 * cpu_kernels_avx512.c) against the reference at prefill sizes: n from 9 to 300 (panels of 32
 * tokens with short last ones), row counts that are not multiples of the 12-row blocks, every
 * group size, and activations with outlier channels (x100, as the residual stream has) and an
 * all-zero token. Bounds: relative L2 <= 1e-5 (the exact-mode bound of every matmul here) and
 * per output |y - ref| <= 3e-5 * rms(ref) (the f32 paths reach ~1e-5 of rms on these inputs). */
static double prefill_worst = 0.0, prefill_l2 = 0.0;

static void test_gemm_prefill(kiln_threadpool *pool) {
    static const int64_t ns[] = {9, 17, 32, 33, 64, 100, 129};
    static const kiln_dtype sdts[] = {KILN_DT_F16, KILN_DT_BF16, KILN_DT_F32};
    for (int bits = 4; bits <= 8; bits += 4)
        for (int gs = 32; gs <= 128; gs *= 2)
            for (int shape = 0; shape < 2; shape++) {
                int64_t rows = shape ? 29 : 13 + gs / 32, cols = (int64_t)gs * (shape ? 3 : 5);
                kiln_matrix w =
                    make_matrix(rows, cols, 0, bits, gs, sdts[(bits + gs / 32) % 3], shape == 1);
                for (size_t t = 0; t < sizeof ns / sizeof *ns; t++) {
                    int64_t n = ns[t] + (shape && t == 6 ? 171 : 0); /* and n = 300 */
                    float *x = rand_vec(n * cols, 1.0f);
                    for (int64_t i = 0; i < n; i++)
                        for (int64_t k = 3; k < cols; k += 97) x[i * cols + k] *= 100.0f;
                    for (int64_t k = 0; k < cols; k++) x[(n / 2) * cols + k] = 0.0f;
                    float *y = malloc(sizeof(float) * (size_t)(n * rows));
                    float *ref = malloc(sizeof(float) * (size_t)(n * rows));
                    for (int64_t i = 0; i < n * rows; i++) y[i] = NAN;
                    kiln_cpu_matmul(pool, y, x, n, &w);
                    kiln_cpu_matmul_ref(ref, x, n, &w);
                    double ss = 0.0, worst = 0.0;
                    for (int64_t i = 0; i < n * rows; i++) ss += (double)ref[i] * ref[i];
                    double rms = sqrt(ss / (double)(n * rows));
                    for (int64_t i = 0; i < n * rows; i++) {
                        double e = fabs((double)y[i] - ref[i]) / rms;
                        if (!(e <= worst)) worst = e;
                    }
                    double l2 = test_rel_l2(y, ref, (size_t)(n * rows));
                    CHECK_MSG(l2 <= 1e-5 && worst <= 3e-5,
                              "prefill q%dg%d [%s] n=%lld rows=%lld cols=%lld: rel L2 %g, worst "
                              "%g of rms",
                              bits, gs, kiln_cpu_simd_name(), (long long)n, (long long)rows,
                              (long long)cols, l2, worst);
                    if (l2 > prefill_l2) prefill_l2 = l2;
                    if (worst > prefill_worst) prefill_worst = worst;
                    matmul_cases++;
                    free(x), free(y), free(ref);
                }
                free_matrix(&w);
            }
}

/* A row's GEMV result must not depend on the batch (n = 1..4) or the thread count: the server
 * samples the same tokens for the same seed whether or not a request shares its decode step. */
static void test_gemv_batch_invariant(kiln_threadpool *pool) {
    static const int bits_list[] = {0, 4, 8, 3};
    for (size_t b = 0; b < sizeof bits_list / sizeof *bits_list; b++) {
        int bits = bits_list[b];
        kiln_matrix w = make_matrix(203, 256, KILN_DT_BF16, bits, 64, KILN_DT_F16, false);
        float *x = rand_vec(4 * w.cols, 1.0f);
        float *y1 = malloc(sizeof(float) * (size_t)w.rows);
        float *yn = malloc(sizeof(float) * (size_t)(4 * w.rows));
        kiln_cpu_matmul(NULL, y1, x, 1, &w);
        for (int n = 1; n <= 4; n++) {
            kiln_cpu_matmul(pool, yn, x, n, &w);
            CHECK_MSG(!memcmp(y1, yn, sizeof(float) * (size_t)w.rows),
                      "[%s %s] bits=%d: row results differ between n=1 (1 thread) and n=%d",
                      kiln_cpu_simd_name(), kiln_cpu_matmul_mode(), bits, n);
        }
        /* the same weights 8 and 24 bytes past a cache line (safetensors offsets): same result */
        size_t bytes = (size_t)kiln_matrix_bytes(&w);
        if (bits) bytes = (size_t)(w.rows * kiln_matrix_row_code_bytes(&w));
        /* and the panel GEMM (prefill; its weight decoding reads the rows unaligned) */
        enum { NG = 40 };
        float *xg = rand_vec(NG * w.cols, 1.0f);
        float *yg = malloc(sizeof(float) * (size_t)(NG * w.rows));
        float *yg2 = malloc(sizeof(float) * (size_t)(NG * w.rows));
        kiln_cpu_matmul(pool, yg, xg, NG, &w);
        for (int off = 8; off <= 24; off += 16) {
            char *buf = aligned_alloc(64, (bytes + off + 63) / 64 * 64);
            memcpy(buf + off, w.data, bytes);
            kiln_matrix ws = w;
            ws.data = buf + off;
            kiln_cpu_matmul(pool, yn, x, 1, &ws);
            CHECK_MSG(!memcmp(y1, yn, sizeof(float) * (size_t)w.rows),
                      "[%s] bits=%d: weights at offset %d give different results",
                      kiln_cpu_simd_name(), bits, off);
            kiln_cpu_matmul(pool, yg2, xg, NG, &ws);
            CHECK_MSG(!memcmp(yg, yg2, sizeof(float) * (size_t)(NG * w.rows)),
                      "[%s] bits=%d: GEMM n=%d with weights at offset %d gives different results",
                      kiln_cpu_simd_name(), bits, NG, off);
            free(buf);
        }
        free(x), free(y1), free(yn), free(xg), free(yg), free(yg2);
        free_matrix(&w);
    }
}

/* kiln_cpu_matmul_multi (q/k/v, gate/up at decode: one prepared x, one loop over all rows) gives
 * each matrix exactly what kiln_cpu_matmul gives it alone, for n = 1..4, with biases, row counts
 * that split 16-row slices across matrices, and mixed formats (which fall back to one matmul
 * each); and at n = 40 (prefill) too. */
static void test_matmul_multi(kiln_threadpool *pool) {
    static const int bits_list[] = {0, 4, 8, 3};
    for (size_t b = 0; b < sizeof bits_list / sizeof *bits_list; b++) {
        const int bits = bits_list[b];
        kiln_matrix ws[3] = {
            make_matrix(37, 256, KILN_DT_BF16, bits, 64, KILN_DT_F16, true),
            make_matrix(21, 256, KILN_DT_BF16, bits, 64, KILN_DT_F16, false),
            make_matrix(50, 256, KILN_DT_BF16, bits ? 0 : 4, 64, KILN_DT_F16, true)};
        const kiln_matrix *wp[3] = {&ws[0], &ws[1], &ws[2]};
        float *x = rand_vec(40 * 256, 1.0f);
        for (int count = 2; count <= 3; count++) /* 3: the last one has another format */
            for (int n = 1; n <= 40; n = n == 4 ? 40 : n + 1) {
                float *ys[3], *ref[3];
                for (int m = 0; m < count; m++) {
                    ys[m] = malloc(sizeof(float) * (size_t)(n * wp[m]->rows));
                    ref[m] = malloc(sizeof(float) * (size_t)(n * wp[m]->rows));
                    for (int64_t i = 0; i < n * wp[m]->rows; i++) ys[m][i] = NAN;
                    kiln_cpu_matmul(pool, ref[m], x, n, wp[m]);
                }
                kiln_cpu_matmul_multi(pool, count, ys, x, n, wp);
                for (int m = 0; m < count; m++) {
                    CHECK_MSG(!memcmp(ys[m], ref[m], sizeof(float) * (size_t)(n * wp[m]->rows)),
                              "[%s %s] matmul_multi bits=%d count=%d n=%d: matrix %d differs from "
                              "its own matmul",
                              kiln_cpu_simd_name(), kiln_cpu_matmul_mode(), bits, count, n, m);
                    free(ys[m]), free(ref[m]);
                }
                matmul_cases++;
            }
        free(x);
        for (int m = 0; m < 3; m++) free_matrix(&ws[m]);
    }
}

/* The fast GEMV's model of the arithmetic: x rounded to int8 in blocks of 16 (dx = max|x|/127),
 * y = sum_g s_g * sum_j q_j * xhat_j + b_g * sum_j x_j in double, for row i = 0 of x. */
static void fast_model(const kiln_matrix *w, const float *x, double *out) {
    float *xh = malloc(sizeof(float) * (size_t)w->cols);
    for (int64_t k = 0; k < w->cols; k += 16) {
        float amax = 0.0f;
        for (int j = 0; j < 16; j++) amax = fmaxf(amax, fabsf(x[k + j]));
        float dx = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < 16; j++) xh[k + j] = nearbyintf(x[k + j] * inv) * dx;
    }
    const uint8_t *codes = w->data;
    int64_t groups = w->cols / w->group_size;
    for (int64_t r = 0; r < w->rows; r++) {
        double acc = 0.0;
        for (int64_t g = 0; g < groups; g++) {
            double qx = 0.0, xs = 0.0;
            for (int64_t c = g * w->group_size; c < (g + 1) * w->group_size; c++) {
                double q = (double)kiln_q_code_test(codes + r * w->cols * w->bits / 8, c, w->bits);
                qx += q * xh[c], xs += x[c];
            }
            acc += kiln_q_scale_test(w->scales, w->scale_dtype, r * groups + g) * qx +
                   kiln_q_scale_test(w->biases, w->scale_dtype, r * groups + g) * xs;
        }
        out[r] = acc + (w->bias ? w->bias[r] : 0.0);
    }
    free(xh);
}

/* The fast GEMM's model (prefill, n > 16): every weight (s*q + b as one f32 fma for quantized
 * ones) and x rounded to bf16, products summed in double, plus the bias. out[n, rows]. */
static void fast_gemm_model(const kiln_matrix *w, const float *x, int64_t n, double *out) {
    const uint8_t *codes = w->data;
    int64_t groups = kiln_matrix_is_quantized(w) ? w->cols / w->group_size : 0;
    for (int64_t r = 0; r < w->rows; r++)
        for (int64_t i = 0; i < n; i++) {
            double acc = 0.0;
            for (int64_t c = 0; c < w->cols; c++) {
                float wv;
                if (groups) {
                    int64_t g = r * groups + c / w->group_size;
                    float q =
                        (float)kiln_q_code_test(codes + r * w->cols * w->bits / 8, c, w->bits);
                    wv = fmaf(q, (float)kiln_q_scale_test(w->scales, w->scale_dtype, g),
                              (float)kiln_q_scale_test(w->biases, w->scale_dtype, g));
                } else {
                    wv = kiln_bf16_to_f32(((const uint16_t *)w->data)[r * w->cols + c]);
                }
                acc += (double)kiln_bf16_to_f32(kiln_f32_to_bf16(wv)) *
                       (double)kiln_bf16_to_f32(kiln_f32_to_bf16(x[i * w->cols + c]));
            }
            out[i * w->rows + r] = acc + (w->bias ? w->bias[r] : 0.0);
        }
}

/* What fast mode changes at the running level: AVX-512 (VNNI + BF16) every 4/8-bit and bf16
 * matmul; AVX2 only the 4-bit GEMV on int8 x (groups >= 32, rows of whole 64-code steps). */
static bool fast_everywhere(void) {
    return !strcmp(kiln_cpu_matmul_mode(), "fast") && !strcmp(kiln_cpu_simd_name(), "avx512");
}
static bool fast_gemv_int8(const kiln_matrix *w) {
    if (strcmp(kiln_cpu_matmul_mode(), "fast") != 0 || !kiln_matrix_is_quantized(w)) return false;
    const bool pow2 = (w->group_size & (w->group_size - 1)) == 0;
    if (!strcmp(kiln_cpu_simd_name(), "avx512"))
        return (w->bits == 4 || w->bits == 8) && w->group_size >= 16 && pow2;
    return (w->bits == 4 || w->bits == 8) && w->group_size >= 32 && pow2 && w->cols % 64 == 0;
}

/* Fast GEMM (n = 40: two x panels, the second partial) on bf16 / 4-bit / 8-bit weights: within
 * 1e-5 of its bf16 model, and not equal to the exact GEMM (it is the bf16 kernel that ran). */
static void test_gemm_fast(kiln_threadpool *pool) {
    if (!fast_everywhere()) return; /* the level lacks it */
    enum { N = 40 };
    for (int b = 0; b <= 8; b += 4) {
        kiln_matrix w = b ? make_matrix(29, 192, 0, b, 64, KILN_DT_BF16, true)
                          : make_matrix(29, 198, KILN_DT_BF16, 0, 0, 0, true);
        float *x = rand_vec(N * w.cols, 1.0f);
        float *yf = malloc(sizeof(float) * (size_t)(N * w.rows));
        float *ye = malloc(sizeof(float) * (size_t)(N * w.rows));
        float *m32 = malloc(sizeof(float) * (size_t)(N * w.rows));
        double *model = malloc(sizeof(double) * (size_t)(N * w.rows));
        kiln_cpu_matmul(pool, yf, x, N, &w);
        fast_gemm_model(&w, x, N, model);
        for (int64_t i = 0; i < N * w.rows; i++) m32[i] = (float)model[i];
        double merr = test_rel_l2(yf, m32, (size_t)(N * w.rows));
        CHECK_MSG(merr <= 1e-5, "fast GEMM bits=%d vs its bf16 model: rel err %g", b, merr);
        CHECK(kiln_cpu_matmul_mode_set("exact") == 0);
        kiln_cpu_matmul(pool, ye, x, N, &w);
        CHECK(kiln_cpu_matmul_mode_set("fast") == 0);
        CHECK_MSG(memcmp(yf, ye, sizeof(float) * (size_t)(N * w.rows)) != 0,
                  "fast GEMM bits=%d equals the exact one", b);
        free(x), free(yf), free(ye), free(m32), free(model);
        free_matrix(&w);
    }
}

/* Fast bf16 GEMV (n = 1, 3): within 1e-5 of the bf16 model and unlike exact, for rows that start
 * on a cache line, 8 bytes past one (the aligned-block reads) and a width with a 32-element tail.
 */
static void test_gemv_bf16_fast(kiln_threadpool *pool) {
    if (!fast_everywhere()) return;
    static const int64_t widths[] = {256, 200};
    for (int wi = 0; wi < 2; wi++)
        for (int off = 0; off <= 8; off += 8) {
            kiln_matrix w0 = make_matrix(23, widths[wi], KILN_DT_BF16, 0, 0, 0, false);
            size_t bytes = (size_t)(w0.rows * w0.cols) * 2;
            char *buf = aligned_alloc(64, (bytes + off + 63) / 64 * 64);
            memcpy(buf + off, w0.data, bytes);
            kiln_matrix w = w0;
            w.data = buf + off;
            for (int n = 1; n <= 3; n += 2) {
                float *x = rand_vec(n * w.cols, 1.0f);
                float *yf = malloc(sizeof(float) * (size_t)(n * w.rows));
                float *ye = malloc(sizeof(float) * (size_t)(n * w.rows));
                float *m32 = malloc(sizeof(float) * (size_t)(n * w.rows));
                double *model = malloc(sizeof(double) * (size_t)(n * w.rows));
                kiln_cpu_matmul(pool, yf, x, n, &w);
                fast_gemm_model(&w, x, n, model);
                for (int64_t i = 0; i < n * w.rows; i++) m32[i] = (float)model[i];
                double merr = test_rel_l2(yf, m32, (size_t)(n * w.rows));
                CHECK_MSG(merr <= 1e-5, "fast bf16 GEMV cols=%lld off=%d n=%d vs model: %g",
                          (long long)w.cols, off, n, merr);
                CHECK(kiln_cpu_matmul_mode_set("exact") == 0);
                kiln_cpu_matmul(pool, ye, x, n, &w);
                CHECK(kiln_cpu_matmul_mode_set("fast") == 0);
                CHECK_MSG(memcmp(yf, ye, sizeof(float) * (size_t)(n * w.rows)) != 0,
                          "fast bf16 GEMV cols=%lld equals the exact one", (long long)w.cols);
                free(x), free(yf), free(ye), free(m32), free(model);
            }
            free(buf);
            free_matrix(&w0);
        }
}

/* The fast mode: bf16 and 4/8-bit weights (the ones it may change) at every group size and scale
 * dtype, n = 1..4 GEMV plus GEMM sizes, within 2e-2 of the reference. Where the level runs an int8
 * GEMV for the weights (fast_gemv_int8) it must equal its int8 model and differ from the exact
 * result (it is the int8 kernel that ran). */
static void test_matmul_fast(kiln_threadpool *pool) {
    CHECK(kiln_cpu_matmul_mode_set("turbo") != 0);
    CHECK(kiln_cpu_matmul_mode_set("fast") == 0);
    bool active = !strcmp(kiln_cpu_matmul_mode(), "fast");
    matmul_tol = 2e-2;
    static const int bits_list[] = {4, 8};
    static const int groups[] = {32, 64, 128};
    static const kiln_dtype sdts[] = {KILN_DT_F16, KILN_DT_BF16, KILN_DT_F32};
    double worst = 0.0;
    int differs = 0, gemvs = 0;
    for (size_t b = 0; b < 2; b++)
        for (size_t g = 0; g < 3; g++) {
            int64_t rows = 37 + (int64_t)(b * 3 + g), cols = groups[g] * (g == 0 ? 5 : 3);
            kiln_matrix w = make_matrix(rows, cols, 0, bits_list[b], groups[g], sdts[(b + g) % 3],
                                        (b + g) % 2 == 1);
            char what[64];
            snprintf(what, sizeof what, "fast q%dg%d %s", bits_list[b], groups[g],
                     kiln_dtype_name(w.scale_dtype));
            double err = check_matmul(pool, &w, what);
            if (err > worst) worst = err;
            kiln_matrix tail = kiln_matrix_rows(&w, rows - 9, 9);
            check_matmul(pool, &tail, what);
            /* fast GEMV vs exact GEMV on the same x: different (when active), both near */
            float *x = rand_vec(2 * cols, 1.0f);
            float *yf = malloc(sizeof(float) * (size_t)(2 * rows));
            float *ye = malloc(sizeof(float) * (size_t)(2 * rows));
            kiln_cpu_matmul(pool, yf, x, 2, &w);
            const bool int8 = fast_gemv_int8(&w);
            if (int8) { /* and it is exactly the int8 arithmetic it claims to be */
                double *model = malloc(sizeof(double) * (size_t)rows);
                float *m32 = malloc(sizeof(float) * (size_t)rows);
                fast_model(&w, x, model);
                for (int64_t r = 0; r < rows; r++) m32[r] = (float)model[r];
                double merr = test_rel_l2(yf, m32, (size_t)rows);
                CHECK_MSG(merr <= 1e-5, "%s: fast GEMV vs its int8 model: rel err %g", what, merr);
                free(model), free(m32);
            }
            CHECK(kiln_cpu_matmul_mode_set("exact") == 0);
            kiln_cpu_matmul(pool, ye, x, 2, &w);
            CHECK(kiln_cpu_matmul_mode_set("fast") == 0);
            differs += int8 && memcmp(yf, ye, sizeof(float) * (size_t)(2 * rows)) != 0;
            gemvs += int8;
            free(x), free(yf), free(ye);
            free_matrix(&w);
        }
    /* 35 groups per row: full scale windows (4-step quads) and a short one */
    for (int b = 4; b <= 8; b += 4)
        for (int gs = 32; gs <= 128; gs *= 2) {
            kiln_matrix w = make_matrix(13, (int64_t)gs * 35, 0, b, gs, KILN_DT_BF16, gs == 32);
            double err = check_matmul(pool, &w, "fast wide rows");
            if (err > worst) worst = err;
            free_matrix(&w);
        }
    /* rows wider than the fast kernel's 512-group scale chunk, with a short last step */
    for (int b = 4; b <= 8; b += 4) {
        kiln_matrix w = make_matrix(5, 32 * 512 + 96, 0, b, 32, KILN_DT_F16, false);
        double err = check_matmul(pool, &w, b == 4 ? "fast wide q4g32" : "fast wide q8g32");
        if (err > worst) worst = err;
        free_matrix(&w);
    }
    /* whole 64-code steps over more than 512 groups (the AVX2 int8 GEMV's scale buffer): against
     * the int8 model where the level takes it, and in exact mode against the reference */
    {
        kiln_matrix w = make_matrix(6, 32 * 514, 0, 4, 32, KILN_DT_BF16, true);
        double err = check_matmul(pool, &w, "fast wide q4g32, 514 groups");
        if (err > worst) worst = err;
        if (fast_gemv_int8(&w)) {
            float *x = rand_vec(w.cols, 1.0f), *y = malloc(sizeof(float) * (size_t)w.rows);
            float *m32 = malloc(sizeof(float) * (size_t)w.rows);
            double *model = malloc(sizeof(double) * (size_t)w.rows);
            kiln_cpu_matmul(pool, y, x, 1, &w);
            fast_model(&w, x, model);
            for (int64_t r = 0; r < w.rows; r++) m32[r] = (float)model[r];
            double merr = test_rel_l2(y, m32, (size_t)w.rows);
            CHECK_MSG(merr <= 1e-5, "514 groups: fast GEMV vs its int8 model: rel err %g", merr);
            free(x), free(y), free(m32), free(model);
        }
        CHECK(kiln_cpu_matmul_mode_set("exact") == 0);
        matmul_tol = 1e-5;
        check_matmul(pool, &w, "exact wide q4g32, 514 groups");
        matmul_tol = 2e-2;
        CHECK(kiln_cpu_matmul_mode_set("fast") == 0);
        free_matrix(&w);
    }
    static const int64_t shapes[][2] = {{37, 96}, {70, 160}, {33, 320}, {5, 17}, {41, 131}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        kiln_matrix w = make_matrix(shapes[s][0], shapes[s][1], KILN_DT_BF16, 0, 0, 0, s % 2);
        double err = check_matmul(pool, &w, "fast bf16");
        if (err > worst) worst = err;
        free_matrix(&w);
    }
    test_gemm_fast(pool);
    test_gemv_bf16_fast(pool);
    if (active) {
        CHECK_MSG(gemvs > 0, "fast mode active but no case takes an int8 GEMV");
        CHECK_MSG(differs == gemvs, "fast mode active but %d/%d int8 GEMVs equal the exact ones",
                  gemvs - differs, gemvs);
    }
    printf("level %s: fast mode %s, worst rel err %.2e\n", kiln_cpu_simd_name(),
           kiln_cpu_matmul_mode(), worst);
    matmul_tol = 1e-5;
    CHECK(kiln_cpu_matmul_mode_set("exact") == 0);
    CHECK(!strcmp(kiln_cpu_matmul_mode(), "exact"));
}

/* Embedding rows equal the dequantized / converted rows, read independently. */
static void test_embed(void) {
    kiln_matrix q = make_matrix(50, 96, 0, 3, 32, KILN_DT_F16, false);
    kiln_matrix d = make_matrix(50, 40, KILN_DT_BF16, 0, 0, 0, false);
    int32_t ids[4] = {49, 0, 17, 49};
    float out[4 * 96], expect[96];
    kiln_cpu_embed(out, ids, 4, &q);
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        kiln_quant_dequantize_rows(&q, ids[i], 1, expect);
        for (int c = 0; c < 96; c++) bad += fabsf(out[i * 96 + c] - expect[c]) > 1e-6f;
    }
    kiln_cpu_embed(out, ids, 4, &d);
    for (int i = 0; i < 4; i++)
        for (int c = 0; c < 40; c++)
            bad += out[i * 40 + c] != kiln_bf16_to_f32(((const uint16_t *)d.data)[ids[i] * 40 + c]);
    CHECK_MSG(bad == 0, "embed [%s]: %d values differ", kiln_cpu_simd_name(), bad);
    free_matrix(&q), free_matrix(&d);
}

static void test_dot_axpy(void) {
    static const int64_t ns[] = {1, 7, 16, 33, 100, 1000};
    for (size_t t = 0; t < sizeof ns / sizeof *ns; t++) {
        int64_t n = ns[t];
        float *a = rand_vec(n, 1.0f), *b = rand_vec(n, 1.0f), *y = rand_vec(n, 1.0f);
        double dot = 0.0, norm = 0.0;
        for (int64_t i = 0; i < n; i++)
            dot += (double)a[i] * b[i], norm += fabs((double)a[i] * b[i]);
        float got = kiln_cpu_dot(a, b, n);
        CHECK_MSG(fabs(got - dot) <= 1e-6 * norm, "dot [%s] n=%lld: %g vs %g", kiln_cpu_simd_name(),
                  (long long)n, got, dot);
        float *expect = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) expect[i] = (float)((double)y[i] + 0.75 * b[i]);
        kiln_cpu_axpy(y, 0.75f, b, n);
        CHECK_MSG(test_rel_l2(y, expect, (size_t)n) < 1e-6, "axpy [%s] n=%lld",
                  kiln_cpu_simd_name(), (long long)n);
        free(a), free(b), free(y), free(expect);
    }
}

/* dot_rows / axpy_rows: bit for bit what dot / axpy give row by row (the attention relies on it:
 * the paged cache's attention calls dot / axpy per key and must match the contiguous one), for
 * lengths around the 16-lane, 4-row and 128-column blocking, row strides that leave rows off a
 * 64-byte boundary, and 0 rows. */
static void test_dot_axpy_rows(void) {
    static const int64_t ns[] = {1, 7, 16, 33, 64, 100, 128, 130, 256};
    static const int64_t counts[] = {0, 1, 3, 4, 5, 9};
    for (size_t t = 0; t < sizeof ns / sizeof *ns; t++)
        for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
            int64_t n = ns[t], count = counts[c], stride = n + 3; /* rows start off-alignment */
            float *a = rand_vec(n, 1.0f), *rows = rand_vec(count * stride + 1, 1.0f);
            float *coef = rand_vec(count + 1, 1.0f), *y0 = rand_vec(n, 1.0f);
            float *out = malloc(sizeof(float) * (size_t)(count + 1));
            float *y1 = malloc(sizeof(float) * (size_t)n), *y2 = malloc(sizeof(float) * (size_t)n);
            const float *r = rows + 1;
            kiln_cpu_dot_rows(out, a, r, stride, count, n);
            int bad = 0;
            for (int64_t i = 0; i < count; i++) bad += out[i] != kiln_cpu_dot(a, r + i * stride, n);
            memcpy(y1, y0, sizeof(float) * (size_t)n), memcpy(y2, y0, sizeof(float) * (size_t)n);
            kiln_cpu_axpy_rows(y1, coef, r, stride, count, n);
            for (int64_t i = 0; i < count; i++) kiln_cpu_axpy(y2, coef[i], r + i * stride, n);
            bad += memcmp(y1, y2, sizeof(float) * (size_t)n) != 0;
            CHECK_MSG(bad == 0, "dot_rows / axpy_rows [%s] n=%lld count=%lld: %d differ",
                      kiln_cpu_simd_name(), (long long)n, (long long)count, bad);
            free(a), free(rows), free(coef), free(y0), free(out), free(y1), free(y2);
        }
}

/* f16 / bf16 rows to f32: every one of the 65536 bit patterns, at lengths that leave a scalar
 * tail, equal to util/half.h's conversion (NaNs only need to stay NaN: F16C quiets them). */
static void test_half_rows(void) {
    const int64_t n = 65536 + 5;
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n);
    float *out = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) h[i] = (uint16_t)(i * 40503u); /* odd: a permutation */
    int bad16 = 0, badbf = 0;
    kiln_cpu_f16_to_f32(h, n, out);
    for (int64_t i = 0; i < n; i++) {
        float e = kiln_f16_to_f32(h[i]);
        bad16 += isnan(e) ? !isnan(out[i]) : memcmp(&e, out + i, sizeof e) != 0;
    }
    kiln_cpu_bf16_to_f32(h + 1, n - 1, out); /* an odd start and length */
    for (int64_t i = 0; i < n - 1; i++) {
        float e = kiln_bf16_to_f32(h[i + 1]);
        badbf += memcmp(&e, out + i, sizeof e) != 0;
    }
    CHECK_MSG(bad16 == 0 && badbf == 0, "half rows [%s]: f16 %d, bf16 %d differ",
              kiln_cpu_simd_name(), bad16, badbf);
    free(h), free(out);
}

/* exp_sum (the attention softmax): every x[i] within 2.5e-7 relative of exp in double (2 ulp),
 * exactly 0 where e^x underflows (x - shift below -87.3, -inf included), the returned sum within
 * 1e-6 of the double sum of the exact values; lengths around the 8-lane blocking. The reference
 * (expf, sum in order) is held to the same bounds. */
static void test_exp_sum(void) {
    static const int64_t ns[] = {0, 1, 5, 8, 9, 37, 300};
    for (int ref = 0; ref < 2; ref++)
        for (size_t t = 0; t < sizeof ns / sizeof *ns; t++) {
            const int64_t n = ns[t];
            float *x = rand_vec(n + 1, 15.0f), *x0 = malloc(sizeof(float) * (size_t)(n + 1));
            const float shift = 3.25f;
            for (int64_t i = 0; i < n; i++) x[i] = x[i] - 12.0f; /* about [-72, 48] */
            if (n > 4) x[1] = -INFINITY, x[2] = -200.0f, x[3] = shift - 87.0f, x[4] = shift;
            memcpy(x0, x, sizeof(float) * (size_t)(n + 1));
            const float sum =
                ref ? kiln_cpu_exp_sum_ref(x, n, shift) : kiln_cpu_exp_sum(x, n, shift);
            double want = 0, worst = 0;
            int bad = 0;
            for (int64_t i = 0; i < n; i++) {
                const double d = (double)(x0[i] - shift), e = d < -87.3 ? 0.0 : exp(d);
                want += e;
                if (d < -87.3) {
                    bad += x[i] != 0.0f && !(ref && x[i] < 1e-37f);
                } else {
                    const double err = fabs(x[i] - e) / e;
                    worst = err > worst ? err : worst;
                }
            }
            CHECK_MSG(worst <= 2.5e-7 && bad == 0,
                      "exp_sum [%s%s] n=%lld: worst rel err %.3g, %d underflows not 0",
                      ref ? "ref " : "", kiln_cpu_simd_name(), (long long)n, worst, bad);
            CHECK_MSG(n == 0 ? sum == 0.0f : fabs(sum - want) <= 1e-6 * want,
                      "exp_sum [%s%s] n=%lld: sum %.9g, want %.9g", ref ? "ref " : "",
                      kiln_cpu_simd_name(), (long long)n, sum, want);
            free(x), free(x0);
        }
}

static void test_rmsnorm(void) {
    /* closed form on a small vector: mean(x^2) = 7.5 */
    float x4[4] = {1, 2, 3, 4}, w4[4] = {0.5f, -1, 2, 0}, y4[4];
    kiln_cpu_rmsnorm_ref(y4, x4, w4, 1, 4, 1e-6f, false);
    for (int j = 0; j < 4; j++) CHECK(fabs(y4[j] - x4[j] / sqrt(7.5 + 1e-6) * w4[j]) < 1e-6);
    kiln_cpu_rmsnorm_ref(y4, x4, w4, 1, 4, 1e-6f, true);
    for (int j = 0; j < 4; j++)
        CHECK(fabs(y4[j] - x4[j] / sqrt(7.5 + 1e-6) * (1.0 + w4[j])) < 1e-6);
    static const int64_t dims[] = {4, 33, 128, 4096};
    for (size_t t = 0; t < 4; t++) {
        int64_t n = 3, dim = dims[t];
        float *x = rand_vec(n * dim, 2.0f), *w = rand_vec(dim, 0.3f);
        float *y = malloc(sizeof(float) * (size_t)(n * dim)),
              *r = malloc(sizeof(float) * (size_t)(n * dim));
        for (int mode = 0; mode < 3; mode++) {
            const float *wp = mode == 2 ? NULL : w;
            kiln_cpu_rmsnorm(y, x, wp, n, dim, 1e-5f, mode == 1);
            kiln_cpu_rmsnorm_ref(r, x, wp, n, dim, 1e-5f, mode == 1);
            CHECK_MSG(test_rel_l2(y, r, (size_t)(n * dim)) < 1e-6, "rmsnorm dim %lld mode %d",
                      (long long)dim, mode);
        }
        free(x), free(w), free(y), free(r);
    }
}

static void test_rope(void) {
    int n = 3, heads = 2, head_dim = 16, rot_dim = 8, half = rot_dim / 2;
    int32_t pos[3] = {0, 5, 1000};
    float inv_freq[4];
    for (int i = 0; i < half; i++) inv_freq[i] = (float)pow(10000.0, -2.0 * i / rot_dim);
    float *x = rand_vec(n * heads * head_dim, 1.0f);
    float *orig = malloc(sizeof(float) * (size_t)(n * heads * head_dim));
    memcpy(orig, x, sizeof(float) * (size_t)(n * heads * head_dim));
    kiln_cpu_rope(x, pos, n, heads, head_dim, rot_dim, inv_freq);
    int bad = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < heads; h++) {
            const float *o = orig + (t * heads + h) * head_dim;
            const float *r = x + (t * heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                double a = (double)(float)((float)pos[t] * inv_freq[i]);
                double e1 = o[i] * cos(a) - o[i + half] * sin(a);
                double e2 = o[i + half] * cos(a) + o[i] * sin(a);
                bad += fabs(r[i] - e1) > 1e-5 || fabs(r[i + half] - e2) > 1e-5;
            }
            for (int i = rot_dim; i < head_dim; i++) bad += r[i] != o[i]; /* not rotated */
        }
    CHECK_MSG(bad == 0, "rope: %d values wrong", bad);
    for (int i = 0; i < heads * head_dim; i++) CHECK(x[i] == orig[i]); /* pos 0 = identity */
    free(x), free(orig);
}

static void test_activations(void) {
    int64_t n = 1001;
    float *g = rand_vec(n, 3.0f), *u = rand_vec(n, 1.0f), *y = malloc(sizeof(float) * (size_t)n);
    kiln_cpu_silu_mul(y, g, u, n);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        bad += fabs(y[i] - e) > 1e-6 * (1 + fabs(e));
    }
    float *yr = malloc(sizeof(float) * (size_t)n); /* the level's kernel vs the reference */
    kiln_cpu_silu_mul_ref(yr, g, u, n);
    for (int64_t i = 0; i < n; i++) bad += fabs(y[i] - yr[i]) > 1e-6 * (1 + fabs(yr[i]));
    free(yr);
    kiln_cpu_gelu_tanh_mul(y, g, u, n);
    for (int64_t i = 0; i < n; i++) {
        double v = g[i];
        double e = 0.5 * v * (1 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v))) * u[i];
        bad += fabs(y[i] - e) > 1e-6 * (1 + fabs(e));
    }
    kiln_cpu_add(y, g, u, n);
    for (int64_t i = 0; i < n; i++) bad += y[i] != g[i] + u[i];
    kiln_cpu_scale(y, 0.5f, n);
    for (int64_t i = 0; i < n; i++) bad += y[i] != (g[i] + u[i]) * 0.5f;
    memcpy(y, g, sizeof(float) * (size_t)n); /* silu_mul with y aliasing gate */
    kiln_cpu_silu_mul(y, y, u, n);
    for (int64_t i = 0; i < n; i++)
        bad += fabs(y[i] - g[i] / (1.0 + exp(-(double)g[i])) * u[i]) > 1e-5;
    CHECK_MSG(bad == 0, "activations: %d values wrong", bad);
    /* softmax: matches exp(x - max) / sum in double, sums to 1, survives large logits */
    float s[5] = {1000.0f, 999.0f, -5.0f, 1000.0f, 0.0f};
    double z = 0;
    for (int i = 0; i < 5; i++) z += exp((double)s[i] - 1000.0);
    float s_in[5];
    memcpy(s_in, s, sizeof s);
    kiln_cpu_softmax(s, 5);
    double total = 0;
    for (int i = 0; i < 5; i++) {
        CHECK(fabs(s[i] - exp((double)s_in[i] - 1000.0) / z) < 1e-7);
        total += s[i];
    }
    CHECK(fabs(total - 1.0) < 1e-6);
    free(g), free(u), free(y);
}

int main(void) {
    kiln_threadpool *pools[2] = {NULL, NULL};
    CHECK_OK(kiln_threadpool_new(1, &pools[0]));
    CHECK_OK(kiln_threadpool_new(2, &pools[1]));
    CHECK(kiln_cpu_matmul_mode_set("exact") == 0); /* whatever KILN_MATMUL says */
    int levels_run = 0;
    for (size_t l = 0; l < sizeof levels / sizeof *levels; l++) {
        if (kiln_cpu_simd_force(levels[l]) != 0) {
            printf("skipping SIMD level %s: this CPU lacks it\n", levels[l]);
            continue;
        }
        levels_run++;
        quant_worst = 0.0;
        for (int p = 0; p < 2; p++) {
            test_matmul_dense(pools[p]);
            test_matmul_quant(pools[p]);
        }
        test_matmul_quant(NULL);
        prefill_worst = prefill_l2 = 0.0;
        test_gemm_prefill(pools[0]);
        test_gemm_prefill(pools[1]);
        printf("level %s: prefill GEMM (4/8-bit, n 9..300): worst rel L2 %.2e, worst output "
               "%.2e of rms\n",
               kiln_cpu_simd_name(), prefill_l2, prefill_worst);
        test_gemv_batch_invariant(pools[1]);
        test_matmul_multi(pools[1]);
        test_matmul_multi(NULL);
        printf("level %s: exact quantized matmul worst rel err %.2e\n", kiln_cpu_simd_name(),
               quant_worst);
        test_matmul_fast(pools[1]);
        test_matmul_quant(pools[1]); /* the exact mode is back, unchanged */
        test_matmul_dense(pools[1]);
        test_embed();
        test_dot_axpy();
        test_dot_axpy_rows();
        test_half_rows();
        test_exp_sum();
        test_rmsnorm();
        test_activations();
        test_rope();
        printf("level %s: ok so far (%d matmul cases)\n", kiln_cpu_simd_name(), matmul_cases);
    }
    CHECK(levels_run >= 1);
    CHECK(kiln_cpu_simd_force("avx9000") != 0);
    CHECK(kiln_cpu_simd_force(NULL) == 0);
    CHECK(kiln_cpu_matmul_mode_set(NULL) == 0);
    kiln_threadpool_free(pools[0]);
    kiln_threadpool_free(pools[1]);
    return test_finish();
}
