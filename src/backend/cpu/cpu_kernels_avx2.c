/* cpu_kernels_avx2.c — the AVX2 + FMA + F16C level of the matmul building blocks and dot/axpy
 * (compiled with -mavx2 -mfma -mf16c; only called after run-time detection). Same recipe as the
 * AVX-512 file at half the width: 16 codes per step come out as two vectors of 8, each lane
 * gathering its code's bytes with a byte shuffle, shifting and masking. */
#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
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

/* The shuffle / shift tables of each code width, built once (make_decoder runs per decoded row). */
static code_decoder decoder_of_bits[9];
static pthread_once_t decoders_once = PTHREAD_ONCE_INIT;

static void build_decoders(void) {
    for (int bits = 1; bits <= 8; bits++) {
        uint8_t shuffle[2][32];
        uint32_t shift[2][8];
        for (int code = 0; code < 16; code++) {
            int bit = code * bits, half = code / 8, lane = code % 8;
            for (int t = 0; t < 4; t++) {
                int byte = (bit >> 3) + t;
                shuffle[half][lane * 4 + t] = byte < 16 ? (uint8_t)byte : 0x80;
            }
            shift[half][lane] = (uint32_t)(bit & 7);
        }
        code_decoder *d = &decoder_of_bits[bits];
        d->shuffle_lo = _mm256_loadu_si256((const __m256i *)shuffle[0]);
        d->shuffle_hi = _mm256_loadu_si256((const __m256i *)shuffle[1]);
        d->shift_lo = _mm256_loadu_si256((const __m256i *)shift[0]);
        d->shift_hi = _mm256_loadu_si256((const __m256i *)shift[1]);
        d->mask = _mm256_set1_epi32((1 << bits) - 1);
        d->bits = bits;
    }
}

static code_decoder make_decoder(const kiln_matrix *w) {
    pthread_once(&decoders_once, build_decoders);
    code_decoder d = decoder_of_bits[w->bits];
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

static ALWAYS_INLINE float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
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

/* ---- GEMV (decode) ------------------------------------------------------------------------
 * As in the AVX-512 file, at half width: 4/8-bit weights use s*sum(q*x) + b*sum(x) per group
 * with group sums of x computed once per call; 4-bit codes come 16 per 8 bytes (low nibbles =
 * even codes, high nibbles = odd codes of a 16-block) against x permuted to that order once per
 * call; bf16 weights split each 32-bit lane into its even (shift) and odd (mask) element against
 * the same permutation. Other formats: the generic decoder / loads with natural x. */

/* Bytes ahead of the weight stream that the GEMVs prefetch in software (one prefetch per 64
 * bytes of codes): a thread's rows are one sequential stream, but the hardware prefetcher stops
 * at every 4 KiB page (Qwen3-0.6B-shape decode on Zen 2: 8-bit fast +25%, 4-bit exact +15%). */
#define GEMV_PREFETCH_AVX2 2048

/* out[0 .. count) = group values i .. i+count as f32, 8 at a time for f16 (F16C) and bf16 (a
 * shift: exact) */
static ALWAYS_INLINE void group_values_to(const void *p, kiln_dtype dt, int64_t i, int64_t count,
                                          float *out) {
    const uint16_t *h = (const uint16_t *)p + i;
    int64_t j = 0;
    if (dt == KILN_DT_F16)
        for (; j + 8 <= count; j += 8)
            _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j))));
    else if (dt == KILN_DT_BF16)
        for (; j + 8 <= count; j += 8) {
            const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + j)));
            _mm256_storeu_ps(out + j, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        }
    for (; j < count; j++) out[j] = group_value(p, dt, i + j);
}

/* sum_g biases[r, g] * xsum[g] over the row's groups. */
static ALWAYS_INLINE float bias_term(const kiln_matrix *w, int64_t r, const float *xsum,
                                     int64_t groups) {
    __m256 acc = _mm256_setzero_ps();
    float b[8];
    int64_t g = 0;
    for (; g + 8 <= groups; g += 8) {
        group_values_to(w->biases, w->scale_dtype, r * groups + g, 8, b);
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(b), _mm256_loadu_ps(xsum + g), acc);
    }
    float s = hsum8(acc);
    for (; g < groups; g++) s += group_value(w->biases, w->scale_dtype, r * groups + g) * xsum[g];
    return s;
}

/* x[n, cols] into dst with each full 16-block holding its even elements, then its odd ones; a
 * shorter last block copied. */
static void permute_even_odd16(const float *x, int n, int64_t cols, float *dst) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + i * cols;
        float *di = dst + i * cols;
        int64_t k = 0;
        for (; k + 16 <= cols; k += 16)
            for (int t = 0; t < 8; t++) {
                di[k + t] = xi[k + 2 * t];
                di[k + 8 + t] = xi[k + 2 * t + 1];
            }
        for (; k < cols; k++) di[k] = xi[k];
    }
}

/* Per-lane sums of one group (gs codes at p) against x: 8-bit natural order, 4-bit permuted. */
static ALWAYS_INLINE void group_dot(const uint8_t *p, const float *x, int64_t cols, int64_t k0,
                                    int64_t gs, const int n, const int bits, __m256 *out) {
    const __m256i low4 = _mm256_set1_epi32(15);
    __m256 pa[KILN_GEMV_MAX_N], pb[KILN_GEMV_MAX_N];
    _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) pa[i] = pb[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < gs; k += 16) {
        __m256 c0, c1;
        if (bits == 4) {
            __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + k / 2)));
            c0 = _mm256_cvtepi32_ps(_mm256_and_si256(v, low4));
            c1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
        } else {
            c0 =
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + k))));
            c1 = _mm256_cvtepi32_ps(
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + k + 8))));
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
            pa[i] = _mm256_fmadd_ps(c0, _mm256_loadu_ps(x + i * cols + k0 + k), pa[i]);
            pb[i] = _mm256_fmadd_ps(c1, _mm256_loadu_ps(x + i * cols + k0 + k + 8), pb[i]);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) out[i] = _mm256_add_ps(pa[i], pb[i]);
}

/* Exact 4/8-bit GEMV for a constant n: groups in pairs into two accumulators per x row. */
static ALWAYS_INLINE void gemv_q48(const kiln_matrix *w, const kiln_gemv_x *px, const int n,
                                   const int bits, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols, gs = w->group_size, groups = cols / gs;
    const int64_t group_bytes = gs * bits / 8;
    const float *xv = bits == 4 ? px->xp : px->x;
    float sbuf[16];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * (cols * bits / 8);
        __m256 acc[KILN_GEMV_MAX_N][2];
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] = acc[i][1] =
            _mm256_setzero_ps();
        for (int64_t g0 = 0; g0 < groups; g0 += 16) {
            int64_t cnt = groups - g0 < 16 ? groups - g0 : 16;
            if (w->scale_dtype == KILN_DT_F16 && cnt == 16) {
                const uint16_t *sp = (const uint16_t *)w->scales + r * groups + g0;
                _mm256_storeu_ps(sbuf, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sp)));
                _mm256_storeu_ps(sbuf + 8,
                                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp + 8))));
            } else {
                group_values_to(w->scales, w->scale_dtype, r * groups + g0, cnt, sbuf);
            }
            int64_t j = 0;
            for (; j + 2 <= cnt; j += 2) {
                int64_t g = g0 + j;
                for (int64_t o = 0; o < 2 * group_bytes; o += 64)
                    _mm_prefetch((const char *)(row + g * group_bytes + o) + GEMV_PREFETCH_AVX2,
                                 _MM_HINT_T0);
                __m256 d0[KILN_GEMV_MAX_N], d1[KILN_GEMV_MAX_N];
                group_dot(row + g * group_bytes, xv, cols, g * gs, gs, n, bits, d0);
                group_dot(row + (g + 1) * group_bytes, xv, cols, (g + 1) * gs, gs, n, bits, d1);
                __m256 s0 = _mm256_set1_ps(sbuf[j]), s1 = _mm256_set1_ps(sbuf[j + 1]);
                _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
                    acc[i][0] = _mm256_fmadd_ps(d0[i], s0, acc[i][0]);
                    acc[i][1] = _mm256_fmadd_ps(d1[i], s1, acc[i][1]);
                }
            }
            if (j < cnt) {
                int64_t g = g0 + j;
                __m256 d0[KILN_GEMV_MAX_N];
                group_dot(row + g * group_bytes, xv, cols, g * gs, gs, n, bits, d0);
                __m256 s0 = _mm256_set1_ps(sbuf[j]);
                _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] =
                    _mm256_fmadd_ps(d0[i], s0, acc[i][0]);
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) y[i * ldy + r] =
            hsum8(_mm256_add_ps(acc[i][0], acc[i][1])) +
            bias_term(w, r, px->xsum + i * groups, groups);
    }
}

/* Generic-width quantized GEMV (2/3/5/6 bits): decode, s*q+b, f32 dot. */
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

/* Dense GEMV for a constant n (1..4); bf16 full 16-blocks against xp (even/odd permuted). */
static ALWAYS_INLINE void gemv_dense(const kiln_matrix *w, const kiln_gemv_x *px, const int n,
                                     float *y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols;
    const float *x = px->x;
    const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
    const size_t esz = kiln_dtype_size(w->dtype);
    for (int64_t r = r0; r < r1; r++) {
        __m256 acc[KILN_GEMV_MAX_N][2];
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] = acc[i][1] =
            _mm256_setzero_ps();
        int64_t base = r * cols, k = 0;
        if (w->dtype == KILN_DT_BF16) {
            const uint16_t *row = (const uint16_t *)w->data + base;
            for (; k + 16 <= cols; k += 16) {
                if (k & 16) _mm_prefetch((const char *)(row + k) + GEMV_PREFETCH_AVX2, _MM_HINT_T0);
                __m256i v = _mm256_loadu_si256((const __m256i *)(row + k));
                __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
                __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, high));
                _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
                    acc[i][0] =
                        _mm256_fmadd_ps(we, _mm256_loadu_ps(px->xp + i * cols + k), acc[i][0]);
                    acc[i][1] =
                        _mm256_fmadd_ps(wo, _mm256_loadu_ps(px->xp + i * cols + k + 8), acc[i][1]);
                }
            }
        }
        const char *bytes = (const char *)w->data + base * (int64_t)esz;
        for (; k + 16 <= cols; k += 16) {
            _mm_prefetch(bytes + k * (int64_t)esz + GEMV_PREFETCH_AVX2, _MM_HINT_T0);
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

/* ---- 4-bit weights on int8 x (vpmaddubsw) ----
 * x is rounded to int8 in blocks of 16 (dx = max|x| / 127; the AVX-512 level's steps): one part in
 * fast mode, three in exact mode (x ~ dx * (q0 + q1/128 + q2/16384): 21 bits of the block's max,
 * combined per lane as ((d0 << 7) + d1) << 7 + d2). A step is 32 bytes of codes = 64 codes: the low
 * nibbles are codes k, k+2, ..., the high ones k+1, k+3, ..., and x is stored per 64-block as its
 * even elements then its odd ones, so vpmaddubsw (u8 code x s8 x, pairs summed in int16: at most
 * 2*15*127 each, 7620 for the two nibble halves) and vpmaddwd leave 32-bit lane j with codes
 * k+8j .. k+8j+7: one group (groups are >= 32 codes), its x block's dx per lane. Rows whose codes
 * are not whole steps, and 8-bit weights (whose codes overflow the int16 pairs), keep the f32
 * kernel. */
static bool q4_int8_applies(const kiln_matrix *w) {
    return kiln_matrix_is_quantized(w) && w->bits == 4 && w->group_size >= 32 &&
           (w->group_size & (w->group_size - 1)) == 0 && w->cols % 64 == 0;
}

/* The int8 scale of a 16-element block (a, b): dx = max|x| / 127 and its inverse (0 for an
 * all-zero block). */
static ALWAYS_INLINE void block16_scale(__m256 a, __m256 b, float *dx, float *inv) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const float amax = hmax8(_mm256_max_ps(_mm256_andnot_ps(sign, a), _mm256_andnot_ps(sign, b)));
    *dx = amax / 127.0f;
    *inv = amax > 0.0f ? 127.0f / amax : 0.0f;
}

/* x[n, cols] into parts int8 rows (each [cols], 64-blocks even then odd) and dl per 8-code lane.
 * Per 16-element block: dx = max|x| / 127; part p holds round(v_p) (nearest even, as cvtps), with
 * v_0 = x / dx and v_{p+1} = (v_p - round(v_p)) * 128 (exact); the block's 8 even elements go to
 * bytes b + t/2 and its 8 odd ones to b + 32 + t/2 of their 64-block b (t = offset in it). */
static void quantize_x_q4(const float *x, int n, int64_t cols, int parts, int8_t *xq, float *xdl) {
    const __m256 c128 = _mm256_set1_ps(128.0f);
    for (int i = 0; i < n; i++) {
        const float *xi = x + i * cols;
        int8_t *qi = xq + (int64_t)i * parts * cols;
        float *di = xdl + i * (cols / 8);
        for (int64_t k = 0; k < cols; k += 16) {
            const __m256 a = _mm256_loadu_ps(xi + k), b = _mm256_loadu_ps(xi + k + 8);
            float dx, inv;
            block16_scale(a, b, &dx, &inv);
            di[k / 8] = di[k / 8 + 1] = parts == 3 ? dx * (1.0f / 16384.0f) : dx;
            /* evens (0, 2, .., 14) and odds of the block, in order */
            const __m256 vi = _mm256_set1_ps(inv);
            __m256 ev = _mm256_castpd_ps(
                _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
            __m256 od = _mm256_castpd_ps(
                _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
            ev = _mm256_mul_ps(ev, vi), od = _mm256_mul_ps(od, vi);
            const int64_t blk = k & ~(int64_t)63, t = k - blk;
            for (int p = 0; p < parts; p++) {
                const __m256i qe = _mm256_cvtps_epi32(ev), qo = _mm256_cvtps_epi32(od);
                /* int16 [e0..e3 o0..o3 | e4..e7 o4..o7] -> [e0..e7 | o0..o7] -> int8 */
                __m256i h = _mm256_permute4x64_epi64(_mm256_packs_epi32(qe, qo), 0xD8);
                h = _mm256_packs_epi16(h, h);
                int8_t *dst = qi + p * cols + blk + t / 2;
                _mm_storel_epi64((__m128i *)dst, _mm256_castsi256_si128(h));
                _mm_storel_epi64((__m128i *)(dst + 32), _mm256_extracti128_si256(h, 1));
                ev = _mm256_mul_ps(_mm256_sub_ps(ev, _mm256_cvtepi32_ps(qe)), c128); /* exact */
                od = _mm256_mul_ps(_mm256_sub_ps(od, _mm256_cvtepi32_ps(qo)), c128);
            }
        }
    }
}

/* Lane sums of one step's codes (lo / hi nibbles) against one part of x (64 bytes at xq). */
static ALWAYS_INLINE __m256i q4_dot_part(__m256i lo, __m256i hi, const int8_t *xq) {
    const __m256i p =
        _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xq)),
                         _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xq + 32))));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

static ALWAYS_INLINE void gemv_q4_int8(const kiln_matrix *w, const kiln_gemv_x *px, const int n,
                                       const int parts, float *y, int64_t ldy, int64_t r0,
                                       int64_t r1) {
    const int64_t cols = w->cols, gs = w->group_size, groups = cols / gs;
    const int gsh = __builtin_ctzll((unsigned long long)gs); /* a power of two: no division */
    const __m256i low4 = _mm256_set1_epi8(15);
    float sbuf[512]; /* the row's scales as f32, when they fit */
    const bool buffered = groups <= 512;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * (cols / 2);
        const int64_t g0 = r * groups;
        if (buffered) group_values_to(w->scales, w->scale_dtype, g0, groups, sbuf);
        __m256 acc[KILN_GEMV_MAX_N];
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i] = _mm256_setzero_ps();
        for (int64_t k = 0; k < cols; k += 64) {
            if (k & 64) _mm_prefetch((const char *)(row + k / 2) + GEMV_PREFETCH_AVX2, _MM_HINT_T0);
            const __m256i v = _mm256_loadu_si256((const __m256i *)(row + k / 2));
            const __m256i lo = _mm256_and_si256(v, low4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            __m256 s; /* lanes 0-3: codes k..k+31, lanes 4-7: k+32..k+63 */
            if (gs >= 64 && buffered) {
                s = _mm256_broadcast_ss(sbuf + (k >> gsh));
            } else if (gs >= 64) {
                s = _mm256_set1_ps(group_value(w->scales, w->scale_dtype, g0 + (k >> gsh)));
            } else {
                const float s0 =
                    buffered ? sbuf[k >> 5] : group_value(w->scales, w->scale_dtype, g0 + (k >> 5));
                const float s1 = buffered
                                     ? sbuf[(k >> 5) + 1]
                                     : group_value(w->scales, w->scale_dtype, g0 + (k >> 5) + 1);
                s = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(s0)), _mm_set1_ps(s1),
                                         1);
            }
            _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
                const int8_t *xq = px->xq + i * px->xq_stride + k;
                __m256i d = q4_dot_part(lo, hi, xq);
                if (parts == 3) {
                    d = _mm256_add_epi32(_mm256_slli_epi32(d, 7),
                                         q4_dot_part(lo, hi, xq + px->xq_part));
                    d = _mm256_add_epi32(_mm256_slli_epi32(d, 7),
                                         q4_dot_part(lo, hi, xq + 2 * px->xq_part));
                }
                const __m256 dl = _mm256_loadu_ps(px->xdl + i * px->xdl_stride + k / 8);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(s, dl), acc[i]);
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) y[i * ldy + r] =
            hsum8(acc[i]) + bias_term(w, r, px->xsum + i * groups, groups);
    }
}

/* ---- 8-bit weights on int8 x (fast mode) ----
 * x is rounded to int8 in blocks of 16 in natural order (dx = max|x| / 127, as for 4-bit). The
 * codes c (0..255) become signed w' = c - 128 and vpmaddubsw multiplies |w'| by x carrying w''s
 * sign (vpsignb), at most 2*128*127 per int16 pair, so nothing saturates; vpmaddwd leaves 32-bit
 * lane j of a 32-code step with codes k+4j .. k+4j+3, and adding 128 * the sum of those four x
 * (xc, once per call) gives sum(c * x) exactly in int32. A lane lies in one x block and one
 * group (groups are >= 32 codes). */
static bool q8_int8_applies(const kiln_matrix *w) {
    return kiln_matrix_is_quantized(w) && w->bits == 8 && w->group_size >= 32 &&
           (w->group_size & (w->group_size - 1)) == 0 && w->cols % 64 == 0;
}

/* x[n, cols] into int8 rows xq [n, cols] (natural order), dl [n, cols/4] (each 4-code lane's
 * dx) and xc [n, cols/4] (128 * the lane's sum of xq). */
static void quantize_x_q8(const float *x, int n, int64_t cols, int8_t *xq, float *xdl,
                          int32_t *xc) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + i * cols;
        int8_t *qi = xq + (int64_t)i * cols;
        float *di = xdl + i * (cols / 4);
        int32_t *ci = xc + i * (cols / 4);
        for (int64_t k = 0; k < cols; k += 16) {
            const __m256 a = _mm256_loadu_ps(xi + k), b = _mm256_loadu_ps(xi + k + 8);
            float dx, inv;
            block16_scale(a, b, &dx, &inv);
            const __m256 vi = _mm256_set1_ps(inv);
            const __m256i qa = _mm256_cvtps_epi32(_mm256_mul_ps(a, vi));
            const __m256i qb = _mm256_cvtps_epi32(_mm256_mul_ps(b, vi));
            /* int16 [a0..a3 b0..b3 | a4..a7 b4..b7] -> [a0..a7 | b0..b7] -> int8 */
            __m256i h = _mm256_permute4x64_epi64(_mm256_packs_epi32(qa, qb), 0xD8);
            h = _mm256_packs_epi16(h, h);
            _mm_storel_epi64((__m128i *)(qi + k), _mm256_castsi256_si128(h));
            _mm_storel_epi64((__m128i *)(qi + k + 8), _mm256_extracti128_si256(h, 1));
            for (int l = 0; l < 4; l++) {
                const int8_t *q4 = qi + k + 4 * l;
                di[k / 4 + l] = dx;
                ci[k / 4 + l] = 128 * (q4[0] + q4[1] + q4[2] + q4[3]);
            }
        }
    }
}

static ALWAYS_INLINE void gemv_q8_int8(const kiln_matrix *w, const kiln_gemv_x *px, const int n,
                                       float *y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols, gs = w->group_size, groups = cols / gs;
    const int gsh = __builtin_ctzll((unsigned long long)gs); /* a power of two: no division */
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    float sbuf[512]; /* the row's scales as f32, when they fit */
    const bool buffered = groups <= 512;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * cols;
        const int64_t g0 = r * groups;
        if (buffered) group_values_to(w->scales, w->scale_dtype, g0, groups, sbuf);
        __m256 acc[KILN_GEMV_MAX_N][2];
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] = acc[i][1] =
            _mm256_setzero_ps();
        for (int64_t k = 0; k < cols; k += 64) { /* two 32-code steps: two chains */
            _mm_prefetch((const char *)(row + k) + GEMV_PREFETCH_AVX2, _MM_HINT_T0);
            const __m256i v0 =
                _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row + k)), flip);
            const __m256i v1 =
                _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row + k + 32)), flip);
            const __m256i a0 = _mm256_abs_epi8(v0), a1 = _mm256_abs_epi8(v1);
            const int64_t ga = k >> gsh, gb = (k + 32) >> gsh;
            const __m256 s0 = _mm256_set1_ps(
                buffered ? sbuf[ga] : group_value(w->scales, w->scale_dtype, g0 + ga));
            const __m256 s1 = _mm256_set1_ps(
                buffered ? sbuf[gb] : group_value(w->scales, w->scale_dtype, g0 + gb));
            _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
                const int8_t *xq = px->xq + i * px->xq_stride + k;
                const int32_t *xc = px->xc + i * px->xdl_stride + k / 4;
                const float *dl = px->xdl + i * px->xdl_stride + k / 4;
                const __m256i x0 = _mm256_loadu_si256((const __m256i *)xq);
                const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq + 32));
                const __m256i d0 = _mm256_add_epi32(
                    _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(x0, v0)), ones),
                    _mm256_loadu_si256((const __m256i *)xc));
                const __m256i d1 = _mm256_add_epi32(
                    _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(x1, v1)), ones),
                    _mm256_loadu_si256((const __m256i *)(xc + 8)));
                acc[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0),
                                            _mm256_mul_ps(s0, _mm256_loadu_ps(dl)), acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1),
                                            _mm256_mul_ps(s1, _mm256_loadu_ps(dl + 8)), acc[i][1]);
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) y[i * ldy + r] =
            hsum8(_mm256_add_ps(acc[i][0], acc[i][1])) +
            bias_term(w, r, px->xsum + i * groups, groups);
    }
}

/* Group sums for 4/8-bit weights; 4-bit weights in whole 64-code steps get int8 x (one part in
 * fast mode, three in exact mode), and so do 8-bit ones in fast mode (one part, natural order);
 * other 4-bit and bf16 weights x permuted to their code order. */
size_t kiln_gemv_prepare_avx2(const kiln_matrix *w, const float *x, int n, bool fast,
                              kiln_gemv_x *px, void *scratch) {
    const int64_t cols = w->cols;
    size_t off = 0;
    kiln_gemv_x p = {.x = x, .n = n};
    bool q48 = kiln_matrix_is_quantized(w) && (w->bits == 4 || w->bits == 8);
    if (q48) {
        int64_t groups = cols / w->group_size;
        float *xsum = kiln_scratch_take(scratch, &off, (size_t)(n * groups) * sizeof(float));
        if (scratch) kiln_group_sums(x, n, cols, w->group_size, xsum);
        p.xsum = xsum;
    }
    if (fast && q8_int8_applies(w)) {
        p.fast = true;
        p.xq_parts = 1;
        p.xq_part = p.xq_stride = cols;
        p.xdl_stride = cols / 4;
        int8_t *xq = kiln_scratch_take(scratch, &off, (size_t)(n * cols));
        float *xdl = kiln_scratch_take(scratch, &off, (size_t)(n * cols / 4) * sizeof(float));
        int32_t *xc = kiln_scratch_take(scratch, &off, (size_t)(n * cols / 4) * sizeof(int32_t));
        if (scratch) quantize_x_q8(x, n, cols, xq, xdl, xc);
        p.xq = xq, p.xdl = xdl, p.xc = xc;
    } else if (q4_int8_applies(w)) {
        p.fast = fast;
        p.xq_parts = fast ? 1 : 3;
        p.xq_part = cols;
        p.xq_stride = p.xq_parts * cols;
        p.xdl_stride = cols / 8;
        int8_t *xq = kiln_scratch_take(scratch, &off, (size_t)(n * p.xq_stride));
        float *xdl = kiln_scratch_take(scratch, &off, (size_t)(n * p.xdl_stride) * sizeof(float));
        if (scratch) quantize_x_q4(x, n, cols, p.xq_parts, xq, xdl);
        p.xq = xq, p.xdl = xdl;
    } else if ((q48 && w->bits == 4) || w->dtype == KILN_DT_BF16) {
        float *xp = kiln_scratch_take(scratch, &off, (size_t)(n * cols) * sizeof(float));
        if (scratch) permute_even_odd16(x, n, cols, xp);
        p.xp = xp;
    }
    if (scratch && px) *px = p;
    return off;
}

/* Calls KERNEL(n, ARG) with n a compile-time constant 1..4 matching px->n. */
#define EACH_N(KERNEL, ARG)                                                                        \
    switch (px->n) {                                                                               \
    case 1:                                                                                        \
        KERNEL(1, ARG);                                                                            \
        break;                                                                                     \
    case 2:                                                                                        \
        KERNEL(2, ARG);                                                                            \
        break;                                                                                     \
    case 3:                                                                                        \
        KERNEL(3, ARG);                                                                            \
        break;                                                                                     \
    default:                                                                                       \
        KERNEL(4, ARG);                                                                            \
        break;                                                                                     \
    }
#define Q48(N, B)   gemv_q48(w, px, N, B, y, ldy, r0, r1)
#define Q4I8(N, P)  gemv_q4_int8(w, px, N, P, y, ldy, r0, r1)
#define Q8I8(N, _)  gemv_q8_int8(w, px, N, y, ldy, r0, r1)
#define QGEN(N, _)  gemv_quant(w, px->x, N, y, ldy, r0, r1)
#define DENSE(N, _) gemv_dense(w, px, N, y, ldy, r0, r1)

void kiln_gemv_avx2(const kiln_matrix *w, const kiln_gemv_x *px, float *y, int64_t ldy, int64_t r0,
                    int64_t r1) {
    if (kiln_matrix_is_quantized(w)) {
        if (px->xc) {
            EACH_N(Q8I8, 0)
        } else if (px->xq && px->xq_parts == 1) {
            EACH_N(Q4I8, 1)
        } else if (px->xq) {
            EACH_N(Q4I8, 3)
        } else if (w->bits == 4) {
            EACH_N(Q48, 4)
        } else if (w->bits == 8) {
            EACH_N(Q48, 8)
        } else {
            EACH_N(QGEN, 0)
        }
    } else {
        EACH_N(DENSE, 0)
    }
}

/* The panel tile (prefill): c[j*XP + i] = sum_k wd[j*ldw + k] * xt[k*XP + i] for the 12 weight
 * rows by 32 x rows, as 2 x 2 passes of 6 weight rows by 16 x rows over the full depth: per k,
 * 6 weight broadcasts and 2 x loads feed 12 FMAs into 12 accumulators (enough to cover the FMA
 * latency on two pipes). The 6 rows of a pass stay in L1/L2 across its two x halves. */
void kiln_tile_t_avx2(int64_t cols, const float *xt, const float *wd, int64_t ldw, float *c) {
    _Static_assert(KILN_GEMM_WR == 12 && KILN_GEMM_XP == 32, "tile shape");
    for (int j0 = 0; j0 < 12; j0 += 6) {
        const float *w0 = wd + j0 * ldw; /* [6][ldw] */
        for (int i0 = 0; i0 < 32; i0 += 16) {
            __m256 acc[6][2];
            _Pragma("GCC unroll 6") for (int j = 0; j < 6; j++) acc[j][0] = acc[j][1] =
                _mm256_setzero_ps();
            const float *xk = xt + i0; /* [cols][XP], this pass's 16 columns */
            for (int64_t k = 0; k < cols; k++, xk += KILN_GEMM_XP) {
                __m256 x0 = _mm256_load_ps(xk), x1 = _mm256_load_ps(xk + 8);
                _Pragma("GCC unroll 6") for (int j = 0; j < 6; j++) {
                    __m256 wv = _mm256_broadcast_ss(w0 + j * ldw + k);
                    acc[j][0] = _mm256_fmadd_ps(wv, x0, acc[j][0]);
                    acc[j][1] = _mm256_fmadd_ps(wv, x1, acc[j][1]);
                }
            }
            _Pragma("GCC unroll 6") for (int j = 0; j < 6; j++) {
                _mm256_store_ps(c + (j0 + j) * KILN_GEMM_XP + i0, acc[j][0]);
                _mm256_store_ps(c + (j0 + j) * KILN_GEMM_XP + i0 + 8, acc[j][1]);
            }
        }
    }
}

/* r[i] = column i of the 8 x 8 block whose rows are r[0..7] (in place). */
static ALWAYS_INLINE void transpose8(__m256 *r) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

void kiln_pack_x_avx2(const float *x, int64_t np, int64_t cols, float *xt) {
    const int64_t full = cols / 8 * 8;
    for (int64_t k0 = 0; k0 < full; k0 += 8)
        for (int i0 = 0; i0 < KILN_GEMM_XP; i0 += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] =
                    i0 + i < np ? _mm256_loadu_ps(x + (i0 + i) * cols + k0) : _mm256_setzero_ps();
            transpose8(r);
            for (int c = 0; c < 8; c++) _mm256_store_ps(xt + (k0 + c) * KILN_GEMM_XP + i0, r[c]);
        }
    for (int64_t k = full; k < cols; k++) {
        float *dst = xt + k * KILN_GEMM_XP;
        int64_t i = 0;
        for (; i < np; i++) dst[i] = x[i * cols + k];
        for (; i < KILN_GEMM_XP; i++) dst[i] = 0.0f;
    }
}

void kiln_store_tile_avx2(const float *c, int64_t np, int64_t nr, const float *bias, float *y,
                          int64_t ldy) {
    _Static_assert(KILN_GEMM_WR <= 16 && KILN_GEMM_XP == 32, "tile store shape");
    for (int j0 = 0; j0 < KILN_GEMM_WR && j0 < nr; j0 += 8) {
        /* full 8-wide stores, or a copy of the first cnt lanes (vmaskmovps stores are slow on
         * AMD: microcoded) */
        const int64_t cnt = nr - j0 < 8 ? nr - j0 : 8;
        _Alignas(32) float bb[8] = {0};
        if (bias) memcpy(bb, bias + j0, (size_t)cnt * sizeof *bb);
        const __m256 b = _mm256_load_ps(bb);
        for (int i0 = 0; i0 < KILN_GEMM_XP && i0 < np; i0 += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++)
                r[j] = j0 + j < KILN_GEMM_WR ? _mm256_load_ps(c + (j0 + j) * KILN_GEMM_XP + i0)
                                             : _mm256_setzero_ps();
            transpose8(r); /* r[i] = c[j0..j0+7][i0 + i] */
            for (int i = 0; i < 8 && i0 + i < np; i++) {
                float *dst = y + (i0 + i) * ldy + j0;
                if (cnt == 8) {
                    _mm256_storeu_ps(dst, _mm256_add_ps(r[i], b));
                } else if (cnt == 4) { /* the last 4 rows of a full 12-row tile */
                    _mm_storeu_ps(dst, _mm256_castps256_ps128(_mm256_add_ps(r[i], b)));
                } else {
                    _Alignas(32) float t[8];
                    _mm256_store_ps(t, _mm256_add_ps(r[i], b));
                    memcpy(dst, t, (size_t)cnt * sizeof *dst);
                }
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

/* Up to four kiln_dot_avx2 at once: per row the same two chains, tail and reduction, so each
 * result is bit for bit dot's; the rows' chains and reductions overlap instead of running back to
 * back, and there is no call per key. */
static ALWAYS_INLINE void dot4_avx2(float *out, const float *a, const float *const *b, const int R,
                                    int64_t n) {
    __m256 acc0[4], acc1[4];
    _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) acc0[q] = acc1[q] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 a0 = _mm256_loadu_ps(a + i), a1 = _mm256_loadu_ps(a + i + 8);
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {
            acc0[q] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b[q] + i), acc0[q]);
            acc1[q] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(b[q] + i + 8), acc1[q]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 a0 = _mm256_loadu_ps(a + i);
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) acc0[q] =
            _mm256_fmadd_ps(a0, _mm256_loadu_ps(b[q] + i), acc0[q]);
    }
    _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {
        float s = hsum8(_mm256_add_ps(acc0[q], acc1[q]));
        for (int64_t t = i; t < n; t++) s += a[t] * b[q][t];
        out[q] = s;
    }
}

void kiln_dot_rows_avx2(float *out, const float *a, const float *rows, int64_t stride,
                        int64_t count, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= count; i += 4) {
        const float *b[4] = {rows + i * stride, rows + (i + 1) * stride, rows + (i + 2) * stride,
                             rows + (i + 3) * stride};
        dot4_avx2(out + i, a, b, 4, n);
    }
    for (; i < count; i++) {
        const float *b[1] = {rows + i * stride};
        dot4_avx2(out + i, a, b, 1, n);
    }
}

/* y[c0 .. c0 + 8*NV) += coef[i] * rows[i] for every row in order, y held in registers: per
 * element the same FMA in the same order as kiln_axpy_avx2 row by row (whole 8-lane vectors
 * only; the caller does the last n % 8 elements as axpy's scalar tail does). */
static ALWAYS_INLINE void axpy_rows_chunk_avx2(float *y, const float *coef, const float *rows,
                                               int64_t stride, int64_t count, int64_t c0,
                                               const int NV) {
    __m256 acc[8];
    _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) acc[v] = _mm256_loadu_ps(y + c0 + 8 * v);
    for (int64_t i = 0; i < count; i++) {
        const __m256 av = _mm256_set1_ps(coef[i]);
        const float *r = rows + i * stride + c0;
        _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) acc[v] =
            _mm256_fmadd_ps(av, _mm256_loadu_ps(r + 8 * v), acc[v]);
    }
    _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) _mm256_storeu_ps(y + c0 + 8 * v, acc[v]);
}

void kiln_axpy_rows_avx2(float *y, const float *coef, const float *rows, int64_t stride,
                         int64_t count, int64_t n) {
    int64_t c0 = 0;
    for (; c0 + 64 <= n; c0 += 64) axpy_rows_chunk_avx2(y, coef, rows, stride, count, c0, 8);
    for (; c0 + 8 <= n; c0 += 8) axpy_rows_chunk_avx2(y, coef, rows, stride, count, c0, 1);
    for (int64_t i = 0; i < count && c0 < n; i++) /* axpy's scalar tail, row by row */
        for (int64_t t = c0; t < n; t++) y[t] += coef[i] * rows[i * stride + t];
}

/* f16 KV rows to f32 with F16C (vcvtph2ps: exact; NaNs stay NaN, quieted). */
void kiln_f16_to_f32_avx2(const uint16_t *in, int64_t n, float *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
    for (; i < n; i++) out[i] = _cvtsh_ss(in[i]);
}

/* bf16 KV rows to f32: the bits shifted into the high half (exact for every value). */
void kiln_bf16_to_f32_avx2(const uint16_t *in, int64_t n, float *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_si256(
            (__m256i *)(out + i),
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(in + i))),
                              16));
    for (; i < n; i++) {
        const uint32_t u = (uint32_t)in[i] << 16;
        memcpy(out + i, &u, sizeof u);
    }
}

/* exp of 8 floats (Cephes' expf): n = round(x log2 e), r = x - n ln 2 in two parts, a degree-6
 * polynomial for e^r, times 2^n built in the exponent bits. Within 2 ulp of expf on [-87, 88];
 * exactly 0 below -87.3 (e^x would be subnormal or 0), so exp(-inf) is 0. */
static ALWAYS_INLINE __m256 exp8_avx2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

float kiln_exp_sum_avx2(float *x, int64_t n, float shift) {
    const __m256 s = _mm256_set1_ps(shift);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
        _mm256_storeu_ps(x + i, v);
        acc = _mm256_add_ps(acc, v);
    }
    if (i < n) { /* the tail through a buffer padded with -inf (exp: 0) */
        _Alignas(32) float t[8];
        for (int j = 0; j < 8; j++) t[j] = i + j < n ? x[i + j] - shift : -INFINITY;
        const __m256 v = exp8_avx2(_mm256_load_ps(t));
        _mm256_store_ps(t, v);
        for (int64_t j = 0; i + j < n; j++) x[i + j] = t[j];
        acc = _mm256_add_ps(acc, v);
    }
    return hsum8(acc);
}

/* SwiGLU with exp8_avx2: g / (1 + e^-g) * up (e^-g is 0 for g above 87.3, so silu(g) = g). */
void kiln_silu_mul_avx2(float *y, const float *gate, const float *up, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp8_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(
            y + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) {
        const float g = gate[i];
        y[i] = (g / (1.0f + expf(-g))) * up[i];
    }
}
