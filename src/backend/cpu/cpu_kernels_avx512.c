/* cpu_kernels_avx512.c — the AVX-512 (F/BW/VL/DQ) level of the matmul building blocks and
 * dot/axpy (this file is compiled with -mavx512*; only called after run-time detection).
 *
 * Quantized codes of any width are decoded 16 at a time with one recipe: the 2*bits bytes that
 * hold codes [j, j+16) are broadcast to the four 128-bit lanes, a byte shuffle gathers for each
 * code the (up to) 4 bytes starting at its first byte, a per-lane variable shift drops the bits
 * before it and a mask keeps `bits` bits. 8-bit codes take the shorter zero-extend route.
 * Dequantization is s*q+b per element (one FMA), then the dot product is plain f32. */
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

/* Shuffle/shift/mask constants that turn 2*bits packed bytes into 16 codes. */
typedef struct {
    __m512i shuffle, shift, mask;
    const uint8_t *safe_end; /* last address from which a 16-byte load stays inside the matrix */
    int bits;
} code_decoder;

static code_decoder make_decoder(const kiln_matrix *w) {
    code_decoder d;
    uint8_t shuffle[64];
    uint32_t shift[16];
    for (int lane = 0; lane < 16; lane++) {
        int bit = lane * w->bits;
        for (int t = 0; t < 4; t++) {
            int byte = (bit >> 3) + t;
            shuffle[lane * 4 + t] = byte < 16 ? (uint8_t)byte : 0x80;
        }
        shift[lane] = (uint32_t)(bit & 7);
    }
    d.shuffle = _mm512_loadu_si512(shuffle);
    d.shift = _mm512_loadu_si512(shift);
    d.mask = _mm512_set1_epi32((1 << w->bits) - 1);
    d.bits = w->bits;
    d.safe_end = (const uint8_t *)w->data + w->rows * kiln_matrix_row_code_bytes(w) - 16;
    return d;
}

/* Codes [j, j+16) as f32, from p = the byte where code j starts (j a multiple of 16). */
static ALWAYS_INLINE __m512 decode16(const code_decoder *d, const uint8_t *p) {
    __m128i raw;
    if (p <= d->safe_end) {
        raw = _mm_loadu_si128((const __m128i *)p);
    } else { /* last bytes of the matrix: never read past them */
        uint8_t tmp[16] = {0};
        memcpy(tmp, p, (size_t)(2 * d->bits));
        raw = _mm_loadu_si128((const __m128i *)tmp);
    }
    __m512i v;
    if (d->bits == 8) {
        v = _mm512_cvtepu8_epi32(raw);
    } else {
        v = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(raw), d->shuffle);
        v = _mm512_and_si512(_mm512_srlv_epi32(v, d->shift), d->mask);
    }
    return _mm512_cvtepi32_ps(v);
}

/* 16 dense weights starting at element i (masked when fewer than 16 remain). */
static ALWAYS_INLINE __m512 load_dense16(const void *data, kiln_dtype dt, int64_t i, __mmask16 m) {
    switch (dt) {
    case KILN_DT_BF16: {
        __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)data + i);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case KILN_DT_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)data + i));
    default:
        return _mm512_maskz_loadu_ps(m, (const float *)data + i);
    }
}

static ALWAYS_INLINE __mmask16 tail_mask(int64_t remaining) {
    return remaining >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << remaining) - 1u);
}

void kiln_decode_avx512(const kiln_matrix *w, int64_t r, int64_t k0, int64_t len, float *out) {
    if (!kiln_matrix_is_quantized(w)) {
        const void *row =
            (const uint8_t *)w->data + r * w->cols * (int64_t)kiln_dtype_size(w->dtype);
        for (int64_t k = 0; k < len; k += 16) {
            __mmask16 m = tail_mask(len - k);
            _mm512_mask_storeu_ps(out + k, m, load_dense16(row, w->dtype, k0 + k, m));
        }
        return;
    }
    code_decoder d = make_decoder(w);
    int64_t groups_per_row = w->cols / w->group_size;
    const uint8_t *p =
        (const uint8_t *)w->data + r * kiln_matrix_row_code_bytes(w) + k0 * w->bits / 8;
    for (int64_t k = 0; k < len; k += w->group_size) {
        int64_t g = r * groups_per_row + (k0 + k) / w->group_size;
        __m512 s = _mm512_set1_ps(group_value(w->scales, w->scale_dtype, g));
        __m512 b = _mm512_set1_ps(group_value(w->biases, w->scale_dtype, g));
        for (int j = 0; j < w->group_size; j += 16, p += 2 * w->bits)
            _mm512_storeu_ps(out + k + j, _mm512_fmadd_ps(decode16(&d, p), s, b));
    }
}

/* Quantized GEMV for a constant n (1..4): two accumulators per x row, 32 codes per step. */
static ALWAYS_INLINE void gemv_quant(const kiln_matrix *w, const float *x, const int n, float *y,
                                     int64_t ldy, int64_t r0, int64_t r1) {
    code_decoder d = make_decoder(w);
    const int64_t cols = w->cols, gs = w->group_size, groups_per_row = cols / gs;
    const int64_t step_bytes = 2 * w->bits; /* bytes of 16 codes */
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = (const uint8_t *)w->data + r * kiln_matrix_row_code_bytes(w);
        __m512 acc[KILN_GEMV_MAX_N][2];
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] = acc[i][1] =
            _mm512_setzero_ps();
        for (int64_t g = 0; g < groups_per_row; g++) {
            __m512 s =
                _mm512_set1_ps(group_value(w->scales, w->scale_dtype, r * groups_per_row + g));
            __m512 b =
                _mm512_set1_ps(group_value(w->biases, w->scale_dtype, r * groups_per_row + g));
            for (int64_t k = g * gs; k < (g + 1) * gs; k += 32, p += 2 * step_bytes) {
                __m512 w0 = _mm512_fmadd_ps(decode16(&d, p), s, b);
                __m512 w1 = _mm512_fmadd_ps(decode16(&d, p + step_bytes), s, b);
                _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
                    acc[i][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + i * cols + k), acc[i][0]);
                    acc[i][1] =
                        _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + i * cols + k + 16), acc[i][1]);
                }
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) y[i * ldy + r] =
            _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
    }
}

/* Dense GEMV for a constant n (1..4). */
static ALWAYS_INLINE void gemv_dense(const kiln_matrix *w, const float *x, const int n, float *y,
                                     int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols;
    for (int64_t r = r0; r < r1; r++) {
        __m512 acc[KILN_GEMV_MAX_N][2];
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] = acc[i][1] =
            _mm512_setzero_ps();
        int64_t base = r * cols, k = 0;
        for (; k + 32 <= cols; k += 32) {
            __m512 w0 = load_dense16(w->data, w->dtype, base + k, 0xffff);
            __m512 w1 = load_dense16(w->data, w->dtype, base + k + 16, 0xffff);
            _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
                acc[i][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + i * cols + k), acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + i * cols + k + 16), acc[i][1]);
            }
        }
        for (; k < cols; k += 16) {
            __mmask16 m = tail_mask(cols - k);
            __m512 w0 = load_dense16(w->data, w->dtype, base + k, m);
            _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] =
                _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x + i * cols + k), acc[i][0]);
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) y[i * ldy + r] =
            _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
    }
}

void kiln_gemv_avx512(const kiln_matrix *w, const float *x, int n, float *y, int64_t ldy,
                      int64_t r0, int64_t r1) {
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

/* 8 x 32 micro-tile: 16 accumulators, per k two weight vectors and 8 broadcasts of x. */
void kiln_tile_avx512(int64_t kc, const float *const *xrows, const float *wp, float *c) {
    _Static_assert(KILN_GEMM_MR == 8 && KILN_GEMM_NR == 32, "tile shape");
    __m512 acc[8][2];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        __m512 w0 = _mm512_load_ps(wp + k * 32), w1 = _mm512_load_ps(wp + k * 32 + 16);
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            __m512 xv = _mm512_set1_ps(xrows[i][k]);
            acc[i][0] = _mm512_fmadd_ps(xv, w0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(xv, w1, acc[i][1]);
        }
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
        _mm512_storeu_ps(c + i * 32, acc[i][0]);
        _mm512_storeu_ps(c + i * 32 + 16, acc[i][1]);
    }
}

float kiln_dot_avx512(const float *a, const float *b, int64_t n) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        acc0 =
            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

void kiln_axpy_avx512(float *y, float a, const float *x, int64_t n) {
    __m512 av = _mm512_set1_ps(a);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 yv = _mm512_maskz_loadu_ps(m, y + i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), yv));
    }
}
