/* cpu_kernels_scalar.c — the portable (no SIMD intrinsics) level of the matmul building blocks
 * declared in cpu_internal.h, plus dot/axpy. Used on CPUs without AVX2 and as the middle rung
 * between the references and the AVX paths in tests. */
#include "backend/cpu/cpu_internal.h"

void kiln_decode_scalar(const kiln_matrix *w, int64_t r, int64_t k0, int64_t len, float *out) {
    if (!kiln_matrix_is_quantized(w)) {
        for (int64_t k = 0; k < len; k++) out[k] = kiln_dense_at(w, r, k0 + k);
        return;
    }
    const uint8_t *row = (const uint8_t *)w->data + r * kiln_matrix_row_code_bytes(w);
    int64_t groups_per_row = w->cols / w->group_size;
    for (int64_t k = 0; k < len; k += w->group_size) {
        int64_t g = r * groups_per_row + (k0 + k) / w->group_size;
        float scale = kiln_q_scale(w->scales, w->scale_dtype, g);
        float bias = kiln_q_scale(w->biases, w->scale_dtype, g);
        for (int64_t j = 0; j < w->group_size; j++)
            out[k + j] = scale * (float)kiln_q_code(row, k0 + k + j, w->bits) + bias;
    }
}

size_t kiln_gemv_prepare_scalar(const kiln_matrix *w, const float *x, int n, bool fast,
                                kiln_gemv_x *px, void *scratch) {
    (void)w, (void)fast, (void)scratch;
    if (px) *px = (kiln_gemv_x){.x = x, .n = n};
    return 0;
}

void kiln_gemv_scalar(const kiln_matrix *w, const kiln_gemv_x *px, float *y, int64_t ldy,
                      int64_t r0, int64_t r1) {
    const float *x = px->x;
    const int n = px->n;
    enum { SEG = 128 }; /* a multiple of every group size: a segment never splits a group */
    float wrow[SEG];    /* one segment of a weight row */
    for (int64_t r = r0; r < r1; r++) {
        float acc[KILN_GEMV_MAX_N][4] = {{0}};
        for (int64_t k0 = 0; k0 < w->cols; k0 += SEG) {
            int64_t len = w->cols - k0 < SEG ? w->cols - k0 : SEG;
            kiln_decode_scalar(w, r, k0, len, wrow);
            for (int i = 0; i < n; i++) {
                const float *xi = x + i * w->cols + k0;
                int64_t k = 0;
                for (; k + 4 <= len; k += 4)
                    for (int u = 0; u < 4; u++) acc[i][u] += wrow[k + u] * xi[k + u];
                for (; k < len; k++) acc[i][0] += wrow[k] * xi[k];
            }
        }
        for (int i = 0; i < n; i++)
            y[i * ldy + r] = (acc[i][0] + acc[i][1]) + (acc[i][2] + acc[i][3]);
    }
}

void kiln_tile_t_scalar(int64_t cols, const float *xt, const float *wd, int64_t ldw, float *c) {
    for (int i = 0; i < KILN_GEMM_WR * KILN_GEMM_XP; i++) c[i] = 0.0f;
    for (int64_t k = 0; k < cols; k++) {
        const float *xk = xt + k * KILN_GEMM_XP;
        for (int j = 0; j < KILN_GEMM_WR; j++) {
            float wv = wd[j * ldw + k];
            float *cj = c + j * KILN_GEMM_XP;
            for (int i = 0; i < KILN_GEMM_XP; i++) cj[i] += wv * xk[i];
        }
    }
}

float kiln_dot_scalar(const float *a, const float *b, int64_t n) {
    float acc[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int u = 0; u < 4; u++) acc[u] += a[i + u] * b[i + u];
    for (; i < n; i++) acc[0] += a[i] * b[i];
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

void kiln_axpy_scalar(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}
