/* cpu_internal.h — what the CPU kernel files share among themselves (not a public interface):
 * the SIMD level chosen at run time, helpers to read quantized codes and group scales, and the
 * per-level matmul building blocks that cpu_matmul.c drives:
 *   decode : one weight row segment -> f32 (dense convert or s*q+b dequantize)
 *   gemv   : y[n<=4, r0..r1) for a range of weight rows, weights streamed once (decode path)
 *   tile   : an MR x NR micro-tile c += x[MR, kc] @ wp[kc, NR] on a packed f32 weight block.
 * Invariants the callers keep: for quantized matrices k0 and len are multiples of group_size. */
#ifndef KILN_BACKEND_CPU_INTERNAL_H
#define KILN_BACKEND_CPU_INTERNAL_H

#include "backend/matrix.h"
#include "util/half.h"

#include <stdint.h>

typedef enum kiln_simd_level {
    KILN_SIMD_SCALAR = 0,
    KILN_SIMD_AVX2 = 1,   /* AVX2 + FMA + F16C */
    KILN_SIMD_AVX512 = 2, /* AVX-512 F/BW/VL/DQ */
} kiln_simd_level;

kiln_simd_level kiln_cpu_simd_level(void);

/* GEMM blocking shared by every level: MR rows of x by NR weight rows, KC deep. KC is a multiple
 * of every group size so a quantized block never splits a group. */
#define KILN_GEMM_MR 8
#define KILN_GEMM_NR 32
#define KILN_GEMM_KC 128
/* n at or below this runs the GEMV (decode) path. */
#define KILN_GEMV_MAX_N 4

/* Code j of a packed row (little-endian bit stream, code j at bit j*bits). Reads the second byte
 * only when the code straddles into it, so it never reads past the row. */
static inline uint32_t kiln_q_code(const uint8_t *row, int64_t j, int bits) {
    int64_t bit = j * bits;
    const uint8_t *p = row + (bit >> 3);
    int shift = (int)(bit & 7);
    uint32_t v = p[0];
    if (shift + bits > 8) v |= (uint32_t)p[1] << 8;
    return (v >> shift) & ((1u << bits) - 1u);
}

/* Element i of a scale/bias array of dtype dt as f32 (exact). */
static inline float kiln_q_scale(const void *p, kiln_dtype dt, int64_t i) {
    switch (dt) {
    case KILN_DT_F16:
        return kiln_f16_to_f32(((const uint16_t *)p)[i]);
    case KILN_DT_BF16:
        return kiln_bf16_to_f32(((const uint16_t *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

/* Dense element (r, c) of a f32/f16/bf16 matrix as f32. */
static inline float kiln_dense_at(const kiln_matrix *w, int64_t r, int64_t c) {
    int64_t i = r * w->cols + c;
    switch (w->dtype) {
    case KILN_DT_F16:
        return kiln_f16_to_f32(((const uint16_t *)w->data)[i]);
    case KILN_DT_BF16:
        return kiln_bf16_to_f32(((const uint16_t *)w->data)[i]);
    default:
        return ((const float *)w->data)[i];
    }
}

/* out[len] = W[r, k0 .. k0+len) as f32. */
typedef void (*kiln_decode_fn)(const kiln_matrix *w, int64_t r, int64_t k0, int64_t len,
                               float *out);
/* For rows r in [r0, r1) and i < n (n <= KILN_GEMV_MAX_N): y[i*ldy + r] = x[i, :] . W[r, :]
 * (no output bias; the driver adds it). x is [n, w->cols]. */
typedef void (*kiln_gemv_fn)(const kiln_matrix *w, const float *x, int n, float *y, int64_t ldy,
                             int64_t r0, int64_t r1);
/* c[MR][NR] = sum_k xrows[i][k] * wp[k*NR + j], k < kc (overwrites c). */
typedef void (*kiln_tile_fn)(int64_t kc, const float *const *xrows, const float *wp, float *c);

typedef struct kiln_cpu_kernels {
    kiln_decode_fn decode;
    kiln_gemv_fn gemv;
    kiln_tile_fn tile;
    float (*dot)(const float *a, const float *b, int64_t n);
    void (*axpy)(float *y, float a, const float *x, int64_t n);
} kiln_cpu_kernels;

/* The kernels of the active level. */
const kiln_cpu_kernels *kiln_cpu_kernels_active(void);

/* Per-level implementations (the AVX ones live in files built with those ISA flags). */
void kiln_decode_scalar(const kiln_matrix *w, int64_t r, int64_t k0, int64_t len, float *out);
void kiln_gemv_scalar(const kiln_matrix *w, const float *x, int n, float *y, int64_t ldy,
                      int64_t r0, int64_t r1);
void kiln_tile_scalar(int64_t kc, const float *const *xrows, const float *wp, float *c);
float kiln_dot_scalar(const float *a, const float *b, int64_t n);
void kiln_axpy_scalar(float *y, float a, const float *x, int64_t n);

void kiln_decode_avx2(const kiln_matrix *w, int64_t r, int64_t k0, int64_t len, float *out);
void kiln_gemv_avx2(const kiln_matrix *w, const float *x, int n, float *y, int64_t ldy, int64_t r0,
                    int64_t r1);
void kiln_tile_avx2(int64_t kc, const float *const *xrows, const float *wp, float *c);
float kiln_dot_avx2(const float *a, const float *b, int64_t n);
void kiln_axpy_avx2(float *y, float a, const float *x, int64_t n);

void kiln_decode_avx512(const kiln_matrix *w, int64_t r, int64_t k0, int64_t len, float *out);
void kiln_gemv_avx512(const kiln_matrix *w, const float *x, int n, float *y, int64_t ldy,
                      int64_t r0, int64_t r1);
void kiln_tile_avx512(int64_t kc, const float *const *xrows, const float *wp, float *c);
float kiln_dot_avx512(const float *a, const float *b, int64_t n);
void kiln_axpy_avx512(float *y, float a, const float *x, int64_t n);

#endif
