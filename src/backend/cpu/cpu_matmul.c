/* cpu_matmul.c — y = x @ W^T for every weight format: the reference and the threaded driver.
 * n <= KILN_GEMV_MAX_N (decode) prepares the activations once (the level's prepare: group sums,
 * permuted / quantized x), then streams each weight row once and splits the output rows across
 * the pool. Larger n (prefill) is the panel GEMM: x transposed once into panels of XP rows, each
 * weight row decoded to f32 once per call, WR x XP tiles over the full depth (the level's tile_t,
 * pack_x, store_tile); 4/8-bit weights on AVX512-VNNI take the integer panel GEMM (x in three
 * int8 digits, codes as bytes; gemm_q_vnni), bf16 in fast mode on AVX512-BF16 vdpbf16ps. Without
 * memory for the panels, GEMV passes of KILN_GEMV_MAX_N tokens. The per-level pieces come from
 * cpu_internal.h. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops.h"

#include <stdlib.h>
#include <string.h>

/* ---- reference ------------------------------------------------------------------------------ */

void kiln_cpu_matmul_ref(float *y, const float *x, int64_t n, const kiln_matrix *w) {
    const uint8_t *codes = w->data;
    int64_t row_bytes = kiln_matrix_is_quantized(w) ? kiln_matrix_row_code_bytes(w) : 0;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t r = 0; r < w->rows; r++) {
            double acc = 0.0;
            for (int64_t c = 0; c < w->cols; c++) {
                float wv;
                if (kiln_matrix_is_quantized(w)) {
                    int64_t g = r * (w->cols / w->group_size) + c / w->group_size;
                    float s = kiln_q_scale(w->scales, w->scale_dtype, g);
                    float b = kiln_q_scale(w->biases, w->scale_dtype, g);
                    wv = s * (float)kiln_q_code(codes + r * row_bytes, c, w->bits) + b;
                } else {
                    wv = kiln_dense_at(w, r, c);
                }
                acc += (double)wv * (double)x[i * w->cols + c];
            }
            if (w->bias) acc += w->bias[r];
            y[i * w->rows + r] = (float)acc;
        }
    }
}

void kiln_cpu_matmul_gather_glu_ref(float *y, const float *x, int64_t x_div, int64_t n,
                                    const int32_t *experts, const kiln_matrix *gate,
                                    const kiln_matrix *up, int64_t rows, int64_t stride,
                                    int64_t up_offset, int act) {
    float *u = malloc((size_t)rows * sizeof(float)); /* [rows] one pair's up products */
    if (!u) return;
    for (int64_t i = 0; i < n; i++) {
        const int64_t e = experts[i];
        const kiln_matrix g = kiln_matrix_rows(gate, e * stride, rows);
        const kiln_matrix w = kiln_matrix_rows(up, e * stride + up_offset, rows);
        const float *xi = x + (i / x_div) * gate->cols;
        kiln_cpu_matmul_ref(y + i * rows, xi, 1, &g);
        kiln_cpu_matmul_ref(u, xi, 1, &w);
        if (act == KILN_GLU_GELU_TANH)
            kiln_cpu_gelu_tanh_mul(y + i * rows, y + i * rows, u, rows);
        else
            kiln_cpu_silu_mul_ref(y + i * rows, y + i * rows, u, rows);
    }
    free(u);
}

void kiln_cpu_matmul_gather_ref(float *y, const float *x, int64_t x_div, int64_t n,
                                const int32_t *experts, const kiln_matrix *stack, int64_t rows) {
    for (int64_t i = 0; i < n; i++) {
        const kiln_matrix w = kiln_matrix_rows(stack, (int64_t)experts[i] * rows, rows);
        kiln_cpu_matmul_ref(y + i * rows, x + (i / x_div) * stack->cols, 1, &w);
    }
}

/* ---- GEMV (decode) -------------------------------------------------------------------------- */

typedef struct {
    const kiln_cpu_kernels *kernels;
    const kiln_matrix *w;
    const float *x; /* [n, cols] */
    float *y;       /* [n, rows] */
    int64_t n;
    const kiln_gemv_x *px; /* GEMV only */
} matmul_job;

static void gemv_slice(void *ctx, int64_t r0, int64_t r1, int thread) {
    (void)thread;
    const matmul_job *job = ctx;
    const kiln_matrix *w = job->w;
    job->kernels->gemv(w, job->px, job->y, w->rows, r0, r1);
    if (w->bias)
        for (int64_t i = 0; i < job->n; i++)
            for (int64_t r = r0; r < r1; r++) job->y[i * w->rows + r] += w->bias[r];
}

/* ---- panel GEMM (prefill, levels with tile_t) ------------------------------------------------ */

typedef struct {
    const kiln_cpu_kernels *kernels;
    const kiln_matrix *w;
    const float *x; /* [n, cols] */
    float *y;       /* [n, rows] */
    int64_t n;
    float *xt;   /* [panels][cols][XP] */
    bool failed; /* a slice had no memory for its decoded rows */
} panel_job;

/* Panels [p0, p1): xt[p][k][i] = x[p*XP + i, k] (0 past n). */
static void pack_x_slice(void *ctx, int64_t p0, int64_t p1, int thread) {
    (void)thread;
    const panel_job *job = ctx;
    const int64_t cols = job->w->cols;
    for (int64_t p = p0; p < p1; p++) {
        float *xt = job->xt + p * cols * KILN_GEMM_XP;
        int64_t np =
            job->n - p * KILN_GEMM_XP < KILN_GEMM_XP ? job->n - p * KILN_GEMM_XP : KILN_GEMM_XP;
        const float *xp = job->x + p * KILN_GEMM_XP * cols;
        if (job->kernels->pack_x) { /* register transposes */
            job->kernels->pack_x(xp, np, cols, xt);
            continue;
        }
        /* k outer: each xt line is written whole; the np source rows stay in L1 across 16 k */
        for (int64_t k = 0; k < cols; k++) {
            float *dst = xt + k * KILN_GEMM_XP;
            int64_t i = 0;
            for (; i < np; i++) dst[i] = xp[i * cols + k];
            for (; i < KILN_GEMM_XP; i++) dst[i] = 0.0f;
        }
    }
}

/* Stored bytes of rows [r0, r0 + nr) of W (codes or dense values; scales and biases are small). */
static void weight_rows_span(const kiln_matrix *w, int64_t r0, int64_t nr, const char **p,
                             int64_t *bytes) {
    int64_t row_bytes = kiln_matrix_is_quantized(w) ? kiln_matrix_row_code_bytes(w)
                                                    : w->cols * (int64_t)kiln_dtype_size(w->dtype);
    *p = (const char *)w->data + r0 * row_bytes;
    *bytes = nr * row_bytes;
}

/* Rows of a decoded weight block lie one cache line more than a multiple of 64 bytes apart: at a
 * multiple of 4 KB (cols = 1024, 2048, ...) the WR weights the tile reads per k would all fall in
 * one L1 set, which holds fewer lines than that with x streaming through it (164 -> 220 GFLOP/s
 * per core). */
static int64_t decoded_row_stride(int64_t cols) {
    return ((cols + 15) & ~(int64_t)15) + 16;
}

/* Blocks [b0, b1) of WR rows of w against the x panels xt (n rows): decode the block's rows once
 * into wd ([WR][decoded_row_stride]), then one tile per x panel. While the tiles of one block
 * run, the next block's weights are prefetched a slice per panel (decoding reads them straight
 * from memory otherwise: one stream, no compute to hide it). */
static void panel_blocks(const kiln_cpu_kernels *kernels, const kiln_matrix *w, const float *xt,
                         int64_t n, float *y, int64_t b0, int64_t b1, float *wd) {
    const int64_t cols = w->cols, ldw = decoded_row_stride(cols);
    const int64_t panels = (n + KILN_GEMM_XP - 1) / KILN_GEMM_XP;
    _Alignas(64) float c[KILN_GEMM_WR * KILN_GEMM_XP];
    for (int64_t b = b0; b < b1; b++) {
        int64_t r0 = b * KILN_GEMM_WR;
        int64_t nr = w->rows - r0 < KILN_GEMM_WR ? w->rows - r0 : KILN_GEMM_WR;
        for (int64_t j = 0; j < KILN_GEMM_WR; j++) {
            if (j < nr)
                kernels->decode(w, r0 + j, 0, cols, wd + j * ldw);
            else
                memset(wd + j * ldw, 0, (size_t)cols * sizeof *wd);
        }
        const char *next = NULL;
        int64_t next_bytes = 0;
        if (b + 1 < b1) {
            int64_t r1 = r0 + KILN_GEMM_WR;
            weight_rows_span(w, r1, w->rows - r1 < KILN_GEMM_WR ? w->rows - r1 : KILN_GEMM_WR,
                             &next, &next_bytes);
        }
        for (int64_t p = 0; p < panels; p++) {
            for (int64_t o = next_bytes * p / panels; o < next_bytes * (p + 1) / panels; o += 64)
                __builtin_prefetch(next + o);
            kernels->tile_t(cols, xt + p * cols * KILN_GEMM_XP, wd, ldw, c);
            int64_t np = n - p * KILN_GEMM_XP < KILN_GEMM_XP ? n - p * KILN_GEMM_XP : KILN_GEMM_XP;
            if (kernels->store_tile) { /* transposed in registers */
                kernels->store_tile(c, np, nr, w->bias ? w->bias + r0 : NULL,
                                    y + p * KILN_GEMM_XP * w->rows + r0, w->rows);
                continue;
            }
            for (int64_t i = 0; i < np; i++) {
                float *yi = y + (p * KILN_GEMM_XP + i) * w->rows + r0;
                for (int64_t j = 0; j < nr; j++)
                    yi[j] = c[j * KILN_GEMM_XP + i] + (w->bias ? w->bias[r0 + j] : 0.0f);
            }
        }
    }
}

static void panel_slice(void *ctx, int64_t b0, int64_t b1, int thread) {
    (void)thread;
    panel_job *job = ctx;
    float *wd = aligned_alloc(64, (size_t)(KILN_GEMM_WR * decoded_row_stride(job->w->cols)) *
                                      sizeof(float));
    if (!wd) {
        job->failed = true;
        return;
    }
    panel_blocks(job->kernels, job->w, job->xt, job->n, job->y, b0, b1, wd);
    free(wd);
}

/* ---- fast mode: bf16 panel GEMM (bf16 weights, AVX512-BF16) ---------------------------------- */

typedef struct {
    const kiln_matrix *w;
    const float *x; /* [n, cols] */
    float *y;       /* [n, rows] */
    int64_t n;
    uint32_t *xt; /* [panels][cols/2][XP] bf16 pairs */
    bool failed;  /* a slice had no memory for its decoded rows */
} bf16_panel_job;

static void pack_x_bf16_slice(void *ctx, int64_t p0, int64_t p1, int thread) {
    (void)thread;
    const bf16_panel_job *job = ctx;
    const int64_t cols = job->w->cols;
    for (int64_t p = p0; p < p1; p++) {
        int64_t np =
            job->n - p * KILN_GEMM_XP < KILN_GEMM_XP ? job->n - p * KILN_GEMM_XP : KILN_GEMM_XP;
        kiln_pack_x_bf16_avx512(job->x + p * KILN_GEMM_XP * cols, np, cols,
                                job->xt + p * (cols / 2) * KILN_GEMM_XP);
    }
}

/* Blocks [b0, b1) of WR weight rows, read in place (bf16 pairs), one tile per panel. */
static void bf16_panel_slice(void *ctx, int64_t b0, int64_t b1, int thread) {
    (void)thread;
    bf16_panel_job *job = ctx;
    const kiln_matrix *w = job->w;
    const int64_t cols = w->cols, pairs = cols / 2;
    const int64_t panels = (job->n + KILN_GEMM_XP - 1) / KILN_GEMM_XP;
    const bool decode = kiln_matrix_is_quantized(w);
    /* quantized rows: decoded to f32, then rounded to bf16 rows 32 elements more than a multiple
     * of 64 bytes apart (see panel_slice) */
    const int64_t ldb = ((cols + 31) & ~(int64_t)31) + 32;
    float *row = NULL;
    uint16_t *wb = NULL;
    if (decode) {
        row = aligned_alloc(64, (size_t)((cols + 15) & ~(int64_t)15) * sizeof(float));
        wb = aligned_alloc(64, (size_t)(KILN_GEMM_WR * ldb) * sizeof(uint16_t));
        if (!row || !wb) {
            free(row), free(wb);
            job->failed = true;
            return;
        }
    }
    _Alignas(64) float c[KILN_GEMM_WR * KILN_GEMM_XP];
    for (int64_t b = b0; b < b1; b++) {
        int64_t r0 = b * KILN_GEMM_WR;
        int64_t nr = w->rows - r0 < KILN_GEMM_WR ? w->rows - r0 : KILN_GEMM_WR;
        const uint16_t *wrows[KILN_GEMM_WR];
        for (int64_t j = 0; j < KILN_GEMM_WR; j++) { /* rows past nr repeat row r0 (discarded) */
            int64_t r = r0 + (j < nr ? j : 0);
            if (decode) {
                if (j < nr) {
                    kiln_cpu_kernels_active()->decode(w, r, 0, cols, row);
                    kiln_f32_to_bf16_avx512(row, cols, wb + j * ldb);
                }
                wrows[j] = wb + (j < nr ? j : 0) * ldb;
            } else {
                wrows[j] = (const uint16_t *)w->data + r * cols;
            }
        }
        for (int64_t p = 0; p < panels; p++) {
            kiln_tile_bf16_avx512(pairs, job->xt + p * pairs * KILN_GEMM_XP, wrows, c);
            int64_t np =
                job->n - p * KILN_GEMM_XP < KILN_GEMM_XP ? job->n - p * KILN_GEMM_XP : KILN_GEMM_XP;
            kiln_store_tile_avx512(c, np, nr, w->bias ? w->bias + r0 : NULL,
                                   job->y + p * KILN_GEMM_XP * w->rows + r0, w->rows);
        }
    }
    free(row), free(wb);
}

/* Fast-mode GEMM (x and the weights as bf16, vdpbf16ps): bf16 weights read in place, quantized
 * ones decoded per block of WR rows. Returns false when it does not apply or out of memory (then
 * the exact GEMM runs and overwrites whatever was written). */
static bool gemm_bf16_fast(kiln_threadpool *pool, float *y, const float *x, int64_t n,
                           const kiln_matrix *w) {
    if ((w->dtype != KILN_DT_BF16 && !kiln_matrix_is_quantized(w)) || w->cols % 2 ||
        !kiln_cpu_matmul_fast_active() || kiln_cpu_simd_level() != KILN_SIMD_AVX512)
        return false;
    int64_t panels = (n + KILN_GEMM_XP - 1) / KILN_GEMM_XP;
    uint32_t *xt =
        aligned_alloc(64, (size_t)(panels * (w->cols / 2) * KILN_GEMM_XP) * sizeof(uint32_t));
    if (!xt) return false;
    bf16_panel_job job = {w, x, y, n, xt, false};
    kiln_parallel_for(pool, panels, 1, pack_x_bf16_slice, &job);
    kiln_parallel_for(pool, (w->rows + KILN_GEMM_WR - 1) / KILN_GEMM_WR, 1, bf16_panel_slice, &job);
    free(xt);
    return !job.failed;
}

/* ---- exact VNNI panel GEMM (4/8-bit MLX weights, AVX512-VNNI) -------------------------------- */

typedef struct {
    const kiln_matrix *w;
    const float *x; /* [n, cols] */
    float *y;       /* [n, rows] */
    int64_t n;
    int kb;      /* x block: min(group, 64) elements per scale */
    int8_t *xd;  /* [panels][3 * cols * XP] digits */
    float *dxp;  /* [panels][blocks][XP] */
    float *xs;   /* [panels][groups][XP] group sums of x */
    bool failed; /* a slice had no memory for its buffers */
} qx_job;

/* Panels [p0, p1): x's digits, block scales and group sums in the panel layouts. */
static void qx_pack_slice(void *ctx, int64_t p0, int64_t p1, int thread) {
    (void)thread;
    qx_job *job = ctx;
    const kiln_matrix *w = job->w;
    const int64_t cols = w->cols, groups = cols / w->group_size, blocks = cols / job->kb;
    float *sums = malloc((size_t)groups * sizeof(float));
    if (!sums) {
        job->failed = true;
        return;
    }
    for (int64_t p = p0; p < p1; p++) {
        int64_t np =
            job->n - p * KILN_GEMM_XP < KILN_GEMM_XP ? job->n - p * KILN_GEMM_XP : KILN_GEMM_XP;
        const float *xp = job->x + p * KILN_GEMM_XP * cols;
        kiln_pack_xq_avx512(xp, np, cols, job->kb, job->xd + p * 3 * cols * KILN_GEMM_XP,
                            job->dxp + p * blocks * KILN_GEMM_XP);
        float *xs = job->xs + p * groups * KILN_GEMM_XP;
        for (int64_t i = 0; i < KILN_GEMM_XP; i++) { /* the GEMV's group sums, per token */
            if (i < np) kiln_group_sums(xp + i * cols, 1, cols, w->group_size, sums);
            for (int64_t g = 0; g < groups; g++) xs[g * KILN_GEMM_XP + i] = i < np ? sums[g] : 0.0f;
        }
    }
    free(sums);
}

/* Blocks [b0, b1) of WR weight rows: the rows' codes (a byte per code, [block][WR][kb]), scales
 * and biases once, then one tile per x panel; the next block's rows are prefetched meanwhile. */
static void qx_slice(void *ctx, int64_t b0, int64_t b1, int thread) {
    (void)thread;
    qx_job *job = ctx;
    const kiln_matrix *w = job->w;
    const int64_t cols = w->cols, groups = cols / w->group_size, blocks = cols / job->kb;
    const int64_t panels = (job->n + KILN_GEMM_XP - 1) / KILN_GEMM_XP;
    const int64_t row_bytes = kiln_matrix_row_code_bytes(w);
    uint8_t *wq = aligned_alloc(64, (size_t)(KILN_GEMM_WR * cols));
    float *sb = malloc((size_t)(2 * KILN_GEMM_WR * groups) * sizeof(float));
    if (!wq || !sb) {
        free(wq), free(sb);
        job->failed = true;
        return;
    }
    float *sc = sb, *bi = sb + KILN_GEMM_WR * groups;
    _Alignas(64) float c[KILN_GEMM_WR * KILN_GEMM_XP];
    for (int64_t b = b0; b < b1; b++) {
        int64_t r0 = b * KILN_GEMM_WR;
        int64_t nr = w->rows - r0 < KILN_GEMM_WR ? w->rows - r0 : KILN_GEMM_WR;
        kiln_pack_wq_avx512((const uint8_t *)w->data + r0 * row_bytes, row_bytes, nr, cols, w->bits,
                            job->kb, wq);
        for (int64_t j = 0; j < KILN_GEMM_WR; j++) { /* rows past nr repeat row r0 (discarded) */
            int64_t r = r0 + (j < nr ? j : 0);
            kiln_scales_f32_avx512(w->scales, w->scale_dtype, r * groups, groups, sc + j * groups);
            kiln_scales_f32_avx512(w->biases, w->scale_dtype, r * groups, groups, bi + j * groups);
        }
        /* the next block's codes, scales and biases, a slice per panel (see panel_slice), into
         * L2: a panel's x digits (3 * cols * XP bytes) stream through L1 and would evict them */
        const char *next[3] = {NULL, NULL, NULL};
        int64_t next_bytes[3] = {0, 0, 0};
        if (b + 1 < b1) {
            int64_t r1 = r0 + KILN_GEMM_WR;
            int64_t nr1 = w->rows - r1 < KILN_GEMM_WR ? w->rows - r1 : KILN_GEMM_WR;
            int64_t sbytes = (int64_t)kiln_dtype_size(w->scale_dtype);
            next[0] = (const char *)w->data + r1 * row_bytes, next_bytes[0] = nr1 * row_bytes;
            next[1] = (const char *)w->scales + r1 * groups * sbytes;
            next[2] = (const char *)w->biases + r1 * groups * sbytes;
            next_bytes[1] = next_bytes[2] = nr1 * groups * sbytes;
        }
        for (int64_t p = 0; p < panels; p++) {
            for (int q = 0; q < 3; q++)
                for (int64_t o = next_bytes[q] * p / panels; o < next_bytes[q] * (p + 1) / panels;
                     o += 64)
                    __builtin_prefetch(next[q] + o, 0, 2);
            kiln_tile_qx_avx512(cols, job->kb, (int)w->group_size, w->bits,
                                job->xd + p * 3 * cols * KILN_GEMM_XP,
                                job->dxp + p * blocks * KILN_GEMM_XP,
                                job->xs + p * groups * KILN_GEMM_XP, wq, sc, bi, groups, c);
            int64_t np =
                job->n - p * KILN_GEMM_XP < KILN_GEMM_XP ? job->n - p * KILN_GEMM_XP : KILN_GEMM_XP;
            kiln_store_tile_avx512(c, np, nr, w->bias ? w->bias + r0 : NULL,
                                   job->y + p * KILN_GEMM_XP * w->rows + r0, w->rows);
        }
    }
    free(wq), free(sb);
}

/* env KILN_QGEMM=f32 turns the VNNI GEMM off (the f32 panel GEMM instead): A/B measurements.
 * Read on every call (a GEMM call is long; benchmarks flip it between runs). */
static bool qgemm_vnni_enabled(void) {
    const char *env = getenv("KILN_QGEMM");
    return !(env && !strcmp(env, "f32"));
}

/* Exact-mode GEMM of 4/8-bit weights on vpdpbusd (x in three int8 digits). Returns false when it
 * does not apply (no AVX512-VNNI, other widths, group not a power of two >= 32) or out of memory
 * (then the f32 GEMM runs and overwrites whatever was written). */
static bool gemm_q_vnni(kiln_threadpool *pool, float *y, const float *x, int64_t n,
                        const kiln_matrix *w) {
    if (!kiln_matrix_is_quantized(w) || (w->bits != 4 && w->bits != 8) || w->group_size < 32 ||
        (w->group_size & (w->group_size - 1)) || kiln_cpu_simd_level() != KILN_SIMD_AVX512 ||
        !kiln_cpu_has_vnni() || !qgemm_vnni_enabled())
        return false;
    const int64_t cols = w->cols, panels = (n + KILN_GEMM_XP - 1) / KILN_GEMM_XP;
    const int kb = w->group_size < 64 ? (int)w->group_size : 64;
    const int64_t blocks = cols / kb, groups = cols / w->group_size;
    int8_t *xd = aligned_alloc(64, (size_t)(panels * 3 * cols * KILN_GEMM_XP));
    float *dxp = aligned_alloc(64, (size_t)(panels * blocks * KILN_GEMM_XP) * sizeof(float));
    float *xs = aligned_alloc(64, (size_t)(panels * groups * KILN_GEMM_XP) * sizeof(float));
    bool ok = xd && dxp && xs;
    if (ok) {
        qx_job job = {w, x, y, n, kb, xd, dxp, xs, false};
        kiln_parallel_for(pool, panels, 1, qx_pack_slice, &job);
        if (!job.failed)
            kiln_parallel_for(pool, (w->rows + KILN_GEMM_WR - 1) / KILN_GEMM_WR, 1, qx_slice, &job);
        ok = !job.failed;
    }
    free(xd), free(dxp), free(xs);
    return ok;
}

/* Returns false (nothing written) when out of memory. */
static bool gemm_panels(kiln_threadpool *pool, const kiln_cpu_kernels *kernels, float *y,
                        const float *x, int64_t n, const kiln_matrix *w) {
    int64_t panels = (n + KILN_GEMM_XP - 1) / KILN_GEMM_XP;
    float *xt = aligned_alloc(64, (size_t)(panels * w->cols * KILN_GEMM_XP) * sizeof(float));
    if (!xt) return false;
    panel_job job = {kernels, w, x, y, n, xt, false};
    kiln_parallel_for(pool, panels, 1, pack_x_slice, &job);
    kiln_parallel_for(pool, (w->rows + KILN_GEMM_WR - 1) / KILN_GEMM_WR, 1, panel_slice, &job);
    free(xt);
    return !job.failed;
}

void kiln_cpu_matmul(kiln_threadpool *pool, float *y, const float *x, int64_t n,
                     const kiln_matrix *w) {
    if (n <= 0 || w->rows <= 0) return;
    if (w->cols <= 0) {
        for (int64_t i = 0; i < n; i++)
            for (int64_t r = 0; r < w->rows; r++) y[i * w->rows + r] = w->bias ? w->bias[r] : 0;
        return;
    }
    if (n > KILN_GEMV_MAX_N && n <= KILN_GEMV_CHUNKED_MAX_N) {
        /* Small batches (batched decode): a few GEMV passes beat the blocked GEMM, whose weight
         * packing costs a full pass of decoding per call whatever n is. */
        for (int64_t i0 = 0; i0 < n; i0 += KILN_GEMV_MAX_N) {
            int64_t nc = n - i0 < KILN_GEMV_MAX_N ? n - i0 : KILN_GEMV_MAX_N;
            kiln_cpu_matmul(pool, y + i0 * w->rows, x + i0 * w->cols, nc, w);
        }
        return;
    }
    matmul_job job = {kiln_cpu_kernels_active(), w, x, y, n, NULL};
    if (n <= KILN_GEMV_MAX_N) {
        bool fast = kiln_cpu_matmul_fast_active();
        kiln_gemv_x px;
        _Alignas(64) unsigned char stack[32768];
        size_t need = job.kernels->prepare(w, x, (int)n, fast, NULL, NULL);
        void *scratch = stack;
        if (need > sizeof stack) {
            scratch = aligned_alloc(64, (need + 63) & ~(size_t)63);
            if (!scratch) { /* no memory for the rearranged x: the plain scalar kernel needs none */
                kiln_gemv_prepare_scalar(w, x, (int)n, false, &px, NULL);
                job.px = &px;
                job.kernels = &(const kiln_cpu_kernels){.gemv = kiln_gemv_scalar};
                kiln_parallel_for(pool, w->rows, 16, gemv_slice, &job);
                return;
            }
        }
        job.kernels->prepare(w, x, (int)n, fast, &px, scratch);
        job.px = &px;
        kiln_parallel_for(pool, w->rows, 16, gemv_slice, &job);
        if (scratch != stack) free(scratch);
    } else {
        if (gemm_bf16_fast(pool, y, x, n, w)) return;
        if (gemm_q_vnni(pool, y, x, n, w)) return;
        if (job.kernels->tile_t && gemm_panels(pool, job.kernels, y, x, n, w)) return;
        /* no memory for the x panels or decoded rows: GEMV passes, which need little */
        for (int64_t i0 = 0; i0 < n; i0 += KILN_GEMV_MAX_N) {
            int64_t nc = n - i0 < KILN_GEMV_MAX_N ? n - i0 : KILN_GEMV_MAX_N;
            kiln_cpu_matmul(pool, y + i0 * w->rows, x + i0 * w->cols, nc, w);
        }
    }
}

/* ---- several matrices on one x (q/k/v, gate/up): decode and prefill ------------------------ */

typedef struct {
    const kiln_cpu_kernels *kernels;
    int count;
    float *const *ys;
    const kiln_matrix *const *ws;
    int64_t first[KILN_MATMUL_MULTI_MAX + 1]; /* global index of each matrix's first row */
    int64_t n;
    const kiln_gemv_x *px;
} multi_job;

static void multi_slice(void *ctx, int64_t r0, int64_t r1, int thread) {
    (void)thread;
    const multi_job *job = ctx;
    for (int m = 0; m < job->count; m++) {
        int64_t a = r0 > job->first[m] ? r0 : job->first[m];
        int64_t b = r1 < job->first[m + 1] ? r1 : job->first[m + 1];
        if (a >= b) continue;
        const kiln_matrix *w = job->ws[m];
        a -= job->first[m], b -= job->first[m];
        job->kernels->gemv(w, job->px, job->ys[m], w->rows, a, b);
        if (w->bias)
            for (int64_t i = 0; i < job->n; i++)
                for (int64_t r = a; r < b; r++) job->ys[m][i * w->rows + r] += w->bias[r];
    }
}

/* Whether x prepared for a can feed b's GEMV: the same storage format and width. */
static bool same_format(const kiln_matrix *a, const kiln_matrix *b) {
    return a->cols == b->cols && a->dtype == b->dtype && a->bits == b->bits &&
           kiln_matrix_is_quantized(a) == kiln_matrix_is_quantized(b) &&
           (!kiln_matrix_is_quantized(a) ||
            (a->group_size == b->group_size && a->scale_dtype == b->scale_dtype));
}

/* Prefill: the x panels packed once, one parallel loop over every matrix's row blocks. */
typedef struct {
    const kiln_cpu_kernels *kernels;
    int count;
    float *const *ys;
    const kiln_matrix *const *ws;
    int64_t first[KILN_MATMUL_MULTI_MAX + 1]; /* global index of each matrix's first row block */
    int64_t n;
    const float *xt;
    bool failed;
} multi_panel_job;

static void multi_panel_slice(void *ctx, int64_t b0, int64_t b1, int thread) {
    (void)thread;
    multi_panel_job *job = ctx;
    float *wd = aligned_alloc(64, (size_t)(KILN_GEMM_WR * decoded_row_stride(job->ws[0]->cols)) *
                                      sizeof(float));
    if (!wd) {
        job->failed = true;
        return;
    }
    for (int m = 0; m < job->count; m++) {
        int64_t a = b0 > job->first[m] ? b0 : job->first[m];
        int64_t b = b1 < job->first[m + 1] ? b1 : job->first[m + 1];
        if (a < b)
            panel_blocks(job->kernels, job->ws[m], job->xt, job->n, job->ys[m], a - job->first[m],
                         b - job->first[m], wd);
    }
    free(wd);
}

/* Returns false (nothing or part written) when it does not apply or is out of memory. Only the
 * f32 panel GEMM shares its x panels: where the AVX-512 level has its own prefill paths (VNNI
 * integer GEMM, bf16 in fast mode) each matrix takes them alone. */
static bool matmul_multi_panels(kiln_threadpool *pool, int count, float *const *ys, const float *x,
                                int64_t n, const kiln_matrix *const *ws) {
    const kiln_cpu_kernels *kernels = kiln_cpu_kernels_active();
    if (!kernels->tile_t || kiln_cpu_simd_level() == KILN_SIMD_AVX512) return false;
    const int64_t cols = ws[0]->cols, panels = (n + KILN_GEMM_XP - 1) / KILN_GEMM_XP;
    for (int m = 1; m < count; m++)
        if (ws[m]->cols != cols) return false;
    float *xt = aligned_alloc(64, (size_t)(panels * cols * KILN_GEMM_XP) * sizeof(float));
    if (!xt) return false;
    panel_job pack = {kernels, ws[0], x, NULL, n, xt, false};
    kiln_parallel_for(pool, panels, 1, pack_x_slice, &pack);
    multi_panel_job job = {kernels, count, ys, ws, {0}, n, xt, false};
    for (int m = 0; m < count; m++)
        job.first[m + 1] = job.first[m] + (ws[m]->rows + KILN_GEMM_WR - 1) / KILN_GEMM_WR;
    kiln_parallel_for(pool, job.first[count], 1, multi_panel_slice, &job);
    free(xt);
    return !job.failed;
}

void kiln_cpu_matmul_multi(kiln_threadpool *pool, int count, float *const *ys, const float *x,
                           int64_t n, const kiln_matrix *const *ws) {
    if (count >= 2 && count <= KILN_MATMUL_MULTI_MAX && n > KILN_GEMV_CHUNKED_MAX_N) {
        bool ok = true;
        for (int m = 0; ok && m < count; m++) ok = ws[m]->rows > 0 && ws[m]->cols > 0;
        if (ok && matmul_multi_panels(pool, count, ys, x, n, ws)) return;
    }
    bool one = count >= 2 && count <= KILN_MATMUL_MULTI_MAX && n >= 1 && n <= KILN_GEMV_MAX_N;
    for (int m = 1; one && m < count; m++) one = same_format(ws[0], ws[m]);
    for (int m = 0; one && m < count; m++) one = ws[m]->rows > 0 && ws[m]->cols > 0;
    if (!one) {
        for (int m = 0; m < count; m++) kiln_cpu_matmul(pool, ys[m], x, n, ws[m]);
        return;
    }
    multi_job job = {kiln_cpu_kernels_active(), count, ys, ws, {0}, n, NULL};
    for (int m = 0; m < count; m++) job.first[m + 1] = job.first[m] + ws[m]->rows;
    const kiln_matrix *w = ws[0];
    bool fast = kiln_cpu_matmul_fast_active();
    kiln_gemv_x px;
    _Alignas(64) unsigned char stack[32768];
    size_t need = job.kernels->prepare(w, x, (int)n, fast, NULL, NULL);
    void *scratch = stack;
    if (need > sizeof stack && !(scratch = aligned_alloc(64, (need + 63) & ~(size_t)63))) {
        for (int m = 0; m < count; m++) kiln_cpu_matmul(pool, ys[m], x, n, ws[m]);
        return;
    }
    job.kernels->prepare(w, x, (int)n, fast, &px, scratch);
    job.px = &px;
    kiln_parallel_for(pool, job.first[count], 16, multi_slice, &job);
    if (scratch != stack) free(scratch);
}
