/* cpu_kernels_avx2.c — the AVX2 + FMA + F16C level of the matmul building blocks and dot/axpy
 * (compiled with -mavx2 -mfma -mf16c; only called after run-time detection). Same recipe as the
 * AVX-512 file at half the width: 16 codes per step come out as two vectors of 8, each lane
 * gathering its code's bytes with a byte shuffle, shifting and masking. */
#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>
#include <string.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE float group_value(const void *p, kiln_dtype dt, int64_t i) {
    switch (dt) {
    case KILN_DT_F16:
        return _cvtsh_ss(((const uint16_t *)p)[i]);
    case KILN_DT_BF16:
        return kiln_bf16_to_f32(((const uint16_t *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

typedef struct {
    __m256i shuffle_lo, shuffle_hi; /* codes 0..7 and 8..15 of a 16-code step */
    __m256i shift_lo, shift_hi, mask;
    const uint8_t *safe_end; /* last address from which a 16-byte load stays inside the matrix */
    int bits;
} code_decoder;

static code_decoder make_decoder(const kiln_matrix *w) {
    uint8_t shuffle[2][32];
    uint32_t shift[2][8];
    for (int code = 0; code < 16; code++) {
        int bit = code * w->bits, half = code / 8, lane = code % 8;
        for (int t = 0; t < 4; t++) {
            int byte = (bit >> 3) + t;
            shuffle[half][lane * 4 + t] = byte < 16 ? (uint8_t)byte : 0x80;
        }
        shift[half][lane] = (uint32_t)(bit & 7);
    }
    code_decoder d;
    d.shuffle_lo = _mm256_loadu_si256((const __m256i *)shuffle[0]);
    d.shuffle_hi = _mm256_loadu_si256((const __m256i *)shuffle[1]);
    d.shift_lo = _mm256_loadu_si256((const __m256i *)shift[0]);
    d.shift_hi = _mm256_loadu_si256((const __m256i *)shift[1]);
    d.mask = _mm256_set1_epi32((1 << w->bits) - 1);
    d.bits = w->bits;
    d.safe_end = (const uint8_t *)w->data + w->rows * kiln_matrix_row_code_bytes(w) - 16;
    return d;
}

/* Codes [j, j+16) as two f32 vectors, from p = the byte where code j starts. */
static ALWAYS_INLINE void decode16(const code_decoder *d, const uint8_t *p, __m256 *lo,
                                   __m256 *hi) {
    __m128i raw;
    if (p <= d->safe_end) {
        raw = _mm_loadu_si128((const __m128i *)p);
    } else {
        uint8_t tmp[16] = {0};
        memcpy(tmp, p, (size_t)(2 * d->bits));
        raw = _mm_loadu_si128((const __m128i *)tmp);
    }
    __m256i a, b;
    if (d->bits == 8) {
        a = _mm256_cvtepu8_epi32(raw);
        b = _mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8));
    } else {
        __m256i v = _mm256_broadcastsi128_si256(raw);
        a = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(v, d->shuffle_lo), d->shift_lo),
                             d->mask);
        b = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(v, d->shuffle_hi), d->shift_hi),
                             d->mask);
    }
    *lo = _mm256_cvtepi32_ps(a);
    *hi = _mm256_cvtepi32_ps(b);
}

/* 8 dense weights starting at element i (caller guarantees 8 remain). */
static ALWAYS_INLINE __m256 load_dense8(const void *data, kiln_dtype dt, int64_t i) {
    switch (dt) {
    case KILN_DT_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)data + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case KILN_DT_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)data + i)));
    default:
        return _mm256_loadu_ps((const float *)data + i);
    }
}

static ALWAYS_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void kiln_decode_avx2(const kiln_matrix *w, int64_t r, int64_t k0, int64_t len, float *out) {
    if (!kiln_matrix_is_quantized(w)) {
        int64_t k = 0;
        for (; k + 8 <= len; k += 8)
            _mm256_storeu_ps(out + k, load_dense8(w->data, w->dtype, r * w->cols + k0 + k));
        for (; k < len; k++) out[k] = kiln_dense_at(w, r, k0 + k);
        return;
    }
    code_decoder d = make_decoder(w);
    int64_t groups_per_row = w->cols / w->group_size;
    const uint8_t *p =
        (const uint8_t *)w->data + r * kiln_matrix_row_code_bytes(w) + k0 * w->bits / 8;
    for (int64_t k = 0; k < len; k += w->group_size) {
        int64_t g = r * groups_per_row + (k0 + k) / w->group_size;
        __m256 s = _mm256_set1_ps(group_value(w->scales, w->scale_dtype, g));
        __m256 b = _mm256_set1_ps(group_value(w->biases, w->scale_dtype, g));
        for (int j = 0; j < w->group_size; j += 16, p += 2 * w->bits) {
            __m256 lo, hi;
            decode16(&d, p, &lo, &hi);
            _mm256_storeu_ps(out + k + j, _mm256_fmadd_ps(lo, s, b));
            _mm256_storeu_ps(out + k + j + 8, _mm256_fmadd_ps(hi, s, b));
        }
    }
}

static ALWAYS_INLINE void gemv_quant(const kiln_matrix *w, const float *x, const int n, float *y,
                                     int64_t ldy, int64_t r0, int64_t r1) {
    code_decoder d = make_decoder(w);
    const int64_t cols = w->cols, gs = w->group_size, groups_per_row = cols / gs;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = (const uint8_t *)w->data + r * kiln_matrix_row_code_bytes(w);
        __m256 acc[KILN_GEMV_MAX_N][2];
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] = acc[i][1] =
            _mm256_setzero_ps();
        for (int64_t g = 0; g < groups_per_row; g++) {
            __m256 s =
                _mm256_set1_ps(group_value(w->scales, w->scale_dtype, r * groups_per_row + g));
            __m256 b =
                _mm256_set1_ps(group_value(w->biases, w->scale_dtype, r * groups_per_row + g));
            for (int64_t k = g * gs; k < (g + 1) * gs; k += 16, p += 2 * w->bits) {
                __m256 lo, hi;
                decode16(&d, p, &lo, &hi);
                __m256 w0 = _mm256_fmadd_ps(lo, s, b), w1 = _mm256_fmadd_ps(hi, s, b);
                _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
                    acc[i][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i * cols + k), acc[i][0]);
                    acc[i][1] =
                        _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i * cols + k + 8), acc[i][1]);
                }
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) y[i * ldy + r] =
            hsum8(_mm256_add_ps(acc[i][0], acc[i][1]));
    }
}

static ALWAYS_INLINE void gemv_dense(const kiln_matrix *w, const float *x, const int n, float *y,
                                     int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols;
    for (int64_t r = r0; r < r1; r++) {
        __m256 acc[KILN_GEMV_MAX_N][2];
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] = acc[i][1] =
            _mm256_setzero_ps();
        int64_t base = r * cols, k = 0;
        for (; k + 16 <= cols; k += 16) {
            __m256 w0 = load_dense8(w->data, w->dtype, base + k);
            __m256 w1 = load_dense8(w->data, w->dtype, base + k + 8);
            _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
                acc[i][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i * cols + k), acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i * cols + k + 8), acc[i][1]);
            }
        }
        for (; k + 8 <= cols; k += 8) {
            __m256 w0 = load_dense8(w->data, w->dtype, base + k);
            _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] =
                _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i * cols + k), acc[i][0]);
        }
        float tail[KILN_GEMV_MAX_N] = {0};
        for (; k < cols; k++) {
            float wv = kiln_dense_at(w, r, k);
            _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) tail[i] += wv * x[i * cols + k];
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) y[i * ldy + r] =
            hsum8(_mm256_add_ps(acc[i][0], acc[i][1])) + tail[i];
    }
}

void kiln_gemv_avx2(const kiln_matrix *w, const float *x, int n, float *y, int64_t ldy, int64_t r0,
                    int64_t r1) {
    if (kiln_matrix_is_quantized(w)) {
        switch (n) {
        case 1:
            gemv_quant(w, x, 1, y, ldy, r0, r1);
            break;
        case 2:
            gemv_quant(w, x, 2, y, ldy, r0, r1);
            break;
        case 3:
            gemv_quant(w, x, 3, y, ldy, r0, r1);
            break;
        default:
            gemv_quant(w, x, 4, y, ldy, r0, r1);
            break;
        }
    } else {
        switch (n) {
        case 1:
            gemv_dense(w, x, 1, y, ldy, r0, r1);
            break;
        case 2:
            gemv_dense(w, x, 2, y, ldy, r0, r1);
            break;
        case 3:
            gemv_dense(w, x, 3, y, ldy, r0, r1);
            break;
        default:
            gemv_dense(w, x, 4, y, ldy, r0, r1);
            break;
        }
    }
}

/* The 8 x 32 tile as four 4 x 16 passes (8 accumulators each) over the L1-resident block. */
void kiln_tile_avx2(int64_t kc, const float *const *xrows, const float *wp, float *c) {
    _Static_assert(KILN_GEMM_MR == 8 && KILN_GEMM_NR == 32, "tile shape");
    for (int i0 = 0; i0 < 8; i0 += 4) {
        for (int j0 = 0; j0 < 32; j0 += 16) {
            __m256 acc[4][2];
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] =
                _mm256_setzero_ps();
            for (int64_t k = 0; k < kc; k++) {
                __m256 w0 = _mm256_load_ps(wp + k * 32 + j0);
                __m256 w1 = _mm256_load_ps(wp + k * 32 + j0 + 8);
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
                    __m256 xv = _mm256_broadcast_ss(xrows[i0 + i] + k);
                    acc[i][0] = _mm256_fmadd_ps(xv, w0, acc[i][0]);
                    acc[i][1] = _mm256_fmadd_ps(xv, w1, acc[i][1]);
                }
            }
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(c + (i0 + i) * 32 + j0, acc[i][0]);
                _mm256_storeu_ps(c + (i0 + i) * 32 + j0 + 8, acc[i][1]);
            }
        }
    }
}

float kiln_dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    float s = hsum8(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

void kiln_axpy_avx2(float *y, float a, const float *x, int64_t n) {
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
