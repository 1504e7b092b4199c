/* cpu_kernels_avx512.c — the AVX-512 (F/BW/VL/DQ) level of the matmul building blocks and
 * dot/axpy, plus the opt-in fast GEMV on AVX512-VNNI / AVX512-BF16 (this file is compiled with
 * -mavx512*; only called after run-time detection; the fast kernels only when the CPU has them).
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

/* ---- GEMV (decode) ------------------------------------------------------------------------
 * Exact path (f32 x): sum_j (s*q_j + b)*x_j = s*sum_j q_j*x_j + b*sum_j x_j per group, with the
 * group sums of x computed once per call. 8-bit codes zero-extend straight to 16 lanes; 4-bit
 * codes come 32 per 16 bytes: byte t holds codes 2t (low nibble) and 2t+1 (high nibble), so the
 * low nibbles of a 16-byte load are the even codes of a 32-block and the high ones the odd codes,
 * and x is read in that order from a copy permuted once per call (xp). bf16 weights use the same
 * split: a 32-bit lane holds elements 2t (low half) and 2t+1 (high half), so shifting left by 16
 * or masking the low half yields f32 without a widening shuffle. Other bit widths and f16/f32
 * weights use the generic decoder / loads above with natural x.
 * Fast path (int8 / bf16 x, VNNI / BF16 units): x is quantized to int8 in blocks of 16 with
 * scale dx = max|x|/127 (in the code order), codes are u8 operands of vpdpbusd, each 32-bit lane's
 * integer sum times s*dx of its group and block is accumulated in f32; b*sum(x) stays exact. */

#define FAST_XQ_PAD  128 /* bytes past each xq row that a full-width step may read */
#define FAST_XDL_PAD 16  /* lanes past each xdl row */

/* 16 group values (scales or biases) from element i, count < 16 masked to zero (masked loads
 * only for the short case: on this CPU they stall when they sit in a streaming loop). */
static ALWAYS_INLINE __m512 load_groups16(const void *p, kiln_dtype dt, int64_t i, int64_t count) {
    if (count >= 16) {
        switch (dt) {
        case KILN_DT_F16:
            return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
        case KILN_DT_BF16:
            return _mm512_castsi512_ps(
                _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                      (const __m256i *)((const uint16_t *)p + i))),
                                  16));
        default:
            return _mm512_loadu_ps((const float *)p + i);
        }
    }
    __mmask16 m = tail_mask(count);
    switch (dt) {
    case KILN_DT_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
    case KILN_DT_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i)), 16));
    default:
        return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    }
}

/* sum_g biases[r, g] * xsum[g] over the row's groups (scalar for short rows: a masked load per
 * row costs more than the few products). */
static ALWAYS_INLINE float bias_term(const kiln_matrix *w, int64_t r, const float *xsum,
                                     int64_t groups) {
    if (groups < 16) {
        float acc = 0.0f;
        for (int64_t g = 0; g < groups; g++)
            acc += group_value(w->biases, w->scale_dtype, r * groups + g) * xsum[g];
        return acc;
    }
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g += 16) {
        __m512 b = load_groups16(w->biases, w->scale_dtype, r * groups + g, groups - g);
        acc = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(tail_mask(groups - g), xsum + g), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* Writes x[n, cols] permuted into dst: inside each full block of `block` elements the even
 * elements first, then the odd ones; a shorter last block is copied. */
static void permute_even_odd(const float *x, int n, int64_t cols, int64_t block, float *dst) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + i * cols;
        float *di = dst + i * cols;
        for (int64_t k = 0; k < cols; k += block) {
            int64_t len = cols - k < block ? cols - k : block;
            if (len < block) {
                memcpy(di + k, xi + k, (size_t)len * sizeof *di);
                break;
            }
            for (int64_t t = 0; t < len / 2; t++) {
                di[k + t] = xi[k + 2 * t];
                di[k + len / 2 + t] = xi[k + 2 * t + 1];
            }
        }
    }
}

/* The per-lane sums of one 8-bit group of gs codes at p against x (natural order). */
static ALWAYS_INLINE void q8_group_dot(const uint8_t *p, const float *x, int64_t cols, int64_t k0,
                                       int64_t gs, const int n, __m512 *out) {
    __m512 pa[KILN_GEMV_MAX_N], pb[KILN_GEMV_MAX_N];
    __m512 c0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
    __m512 c1 =
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))));
    _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
        pa[i] = _mm512_mul_ps(c0, _mm512_loadu_ps(x + i * cols + k0));
        pb[i] = _mm512_mul_ps(c1, _mm512_loadu_ps(x + i * cols + k0 + 16));
    }
    for (int64_t k = 32; k < gs; k += 32) {
        c0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + k))));
        c1 = _mm512_cvtepi32_ps(
            _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + k + 16))));
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
            pa[i] = _mm512_fmadd_ps(c0, _mm512_loadu_ps(x + i * cols + k0 + k), pa[i]);
            pb[i] = _mm512_fmadd_ps(c1, _mm512_loadu_ps(x + i * cols + k0 + k + 16), pb[i]);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) out[i] = _mm512_add_ps(pa[i], pb[i]);
}

/* The same for a 4-bit group (gs/2 bytes at p) against xp (even/odd permuted 32-blocks). */
static ALWAYS_INLINE void q4_group_dot(const uint8_t *p, const float *xp, int64_t cols, int64_t k0,
                                       int64_t gs, const int n, __m512 *out) {
    const __m512i low4 = _mm512_set1_epi32(15);
    __m512 pa[KILN_GEMV_MAX_N], pb[KILN_GEMV_MAX_N];
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    __m512 ce = _mm512_cvtepi32_ps(_mm512_and_si512(v, low4));
    __m512 co = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
    _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
        pa[i] = _mm512_mul_ps(ce, _mm512_loadu_ps(xp + i * cols + k0));
        pb[i] = _mm512_mul_ps(co, _mm512_loadu_ps(xp + i * cols + k0 + 16));
    }
    for (int64_t k = 32; k < gs; k += 32) {
        v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + k / 2)));
        ce = _mm512_cvtepi32_ps(_mm512_and_si512(v, low4));
        co = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
            pa[i] = _mm512_fmadd_ps(ce, _mm512_loadu_ps(xp + i * cols + k0 + k), pa[i]);
            pb[i] = _mm512_fmadd_ps(co, _mm512_loadu_ps(xp + i * cols + k0 + k + 16), pb[i]);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) out[i] = _mm512_add_ps(pa[i], pb[i]);
}

/* Exact 4/8-bit GEMV for a constant n: groups in pairs into two accumulators per x row, the
 * row's scales converted 16 at a time. */
static ALWAYS_INLINE void gemv_q48(const kiln_matrix *w, const kiln_gemv_x *px, const int n,
                                   const int bits, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols, gs = w->group_size, groups = cols / gs;
    const int64_t group_bytes = gs * bits / 8;
    const float *xv = bits == 4 ? px->xp : px->x;
    _Alignas(64) float sbuf[16];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * (cols * bits / 8);
        __m512 acc[KILN_GEMV_MAX_N][2];
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] = acc[i][1] =
            _mm512_setzero_ps();
        for (int64_t g0 = 0; g0 < groups; g0 += 16) {
            int64_t cnt = groups - g0 < 16 ? groups - g0 : 16;
            _mm512_store_ps(sbuf, load_groups16(w->scales, w->scale_dtype, r * groups + g0, cnt));
            int64_t j = 0;
            for (; j + 2 <= cnt; j += 2) {
                int64_t g = g0 + j;
                __m512 d0[KILN_GEMV_MAX_N], d1[KILN_GEMV_MAX_N];
                if (bits == 4) {
                    q4_group_dot(row + g * group_bytes, xv, cols, g * gs, gs, n, d0);
                    q4_group_dot(row + (g + 1) * group_bytes, xv, cols, (g + 1) * gs, gs, n, d1);
                } else {
                    q8_group_dot(row + g * group_bytes, xv, cols, g * gs, gs, n, d0);
                    q8_group_dot(row + (g + 1) * group_bytes, xv, cols, (g + 1) * gs, gs, n, d1);
                }
                __m512 s0 = _mm512_set1_ps(sbuf[j]), s1 = _mm512_set1_ps(sbuf[j + 1]);
                _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
                    acc[i][0] = _mm512_fmadd_ps(d0[i], s0, acc[i][0]);
                    acc[i][1] = _mm512_fmadd_ps(d1[i], s1, acc[i][1]);
                }
            }
            if (j < cnt) {
                int64_t g = g0 + j;
                __m512 d0[KILN_GEMV_MAX_N];
                if (bits == 4)
                    q4_group_dot(row + g * group_bytes, xv, cols, g * gs, gs, n, d0);
                else
                    q8_group_dot(row + g * group_bytes, xv, cols, g * gs, gs, n, d0);
                __m512 s0 = _mm512_set1_ps(sbuf[j]);
                _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] =
                    _mm512_fmadd_ps(d0[i], s0, acc[i][0]);
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) y[i * ldy + r] =
            _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1])) +
            bias_term(w, r, px->xsum + i * groups, groups);
    }
}

/* Generic-width quantized GEMV (2/3/5/6 bits) for a constant n: decode, s*q+b, f32 dot. */
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

/* bf16 GEMV for a constant n against xp (even/odd permuted 32-blocks); the last cols % 32
 * elements against natural x. */
static ALWAYS_INLINE void gemv_bf16(const kiln_matrix *w, const kiln_gemv_x *px, const int n,
                                    float *y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols, full = cols / 32 * 32;
    const float *xp = px->xp, *x = px->x;
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *row = (const uint16_t *)w->data + r * cols;
        __m512 acc[KILN_GEMV_MAX_N][2];
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] = acc[i][1] =
            _mm512_setzero_ps();
        for (int64_t k = 0; k < full; k += 32) {
            __m512i v = _mm512_loadu_si512(row + k);
            __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, high));
            _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
                acc[i][0] = _mm512_fmadd_ps(we, _mm512_loadu_ps(xp + i * cols + k), acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(wo, _mm512_loadu_ps(xp + i * cols + k + 16), acc[i][1]);
            }
        }
        for (int64_t k = full; k < cols; k += 16) {
            __mmask16 m = tail_mask(cols - k);
            __m512 w0 = load_dense16(row, KILN_DT_BF16, k, m);
            _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] =
                _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x + i * cols + k), acc[i][0]);
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) y[i * ldy + r] =
            _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
    }
}

/* Dense (f16 / f32) GEMV for a constant n (1..4). */
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

/* ---- fast path: VNNI (int8 x) and BF16 (bf16 x) ---- */

/* 4/8-bit fast GEMV for a constant n. A step is 64 bytes of codes (128 4-bit / 64 8-bit codes;
 * the last step of a row may be shorter and is masked). 32-bit lane j of the vpdpbusd sum covers
 * codes [step + j*cpl, +cpl), cpl = 32/bits, so its group is known: the row's scales are
 * converted to f32 once (a chunk of FAST_SCALE_CHUNK groups at a time), a permute spreads them
 * over the lanes, and dx comes per lane from xdl. */
#define FAST_SCALE_CHUNK 512
static ALWAYS_INLINE void gemv_q48_fast(const kiln_matrix *w, const kiln_gemv_x *px, const int n,
                                        const int bits, float *y, int64_t ldy, int64_t r0,
                                        int64_t r1) {
    const int64_t cols = w->cols, gs = w->group_size, groups = cols / gs;
    const int64_t step = 512 / bits, cpl = 32 / bits, row_bytes = cols * bits / 8;
    const int gsh = __builtin_ctzll((unsigned long long)gs); /* gs is a power of two */
    const int64_t chunk_cols = FAST_SCALE_CHUNK * gs;        /* a multiple of step */
    uint32_t idx_a[16];
    for (int j = 0; j < 16; j++) idx_a[j] = step > gs ? (uint32_t)(j * cpl / gs) : 0;
    const __m512i idx = _mm512_loadu_si512(idx_a);
    const __m512i low4 = _mm512_set1_epi8(15);
    _Alignas(64) float sb[FAST_SCALE_CHUNK + 16];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * row_bytes;
        __m512 acc[KILN_GEMV_MAX_N];
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i] = _mm512_setzero_ps();
        for (int64_t c0 = 0; c0 < cols; c0 += chunk_cols) {
            int64_t c1 = cols - c0 < chunk_cols ? cols : c0 + chunk_cols;
            int64_t g0 = c0 >> gsh, ng = (c1 - c0) >> gsh;
            for (int64_t g = 0; g < ng; g += 16)
                _mm512_store_ps(
                    sb + g, load_groups16(w->scales, w->scale_dtype, r * groups + g0 + g, ng - g));
            _mm512_store_ps(sb + ((ng + 15) & ~(int64_t)15), _mm512_setzero_ps());
            for (int64_t k = c0; k < c1; k += step) {
                __m512i v;
                int64_t len = step;
                if (k + step <= c1) { /* plain load: masked ones stall in a stream here */
                    v = _mm512_loadu_si512(row + k * bits / 8);
                } else {
                    len = c1 - k;
                    v = _mm512_maskz_loadu_epi8(((__mmask64)1 << (len * bits / 8)) - 1,
                                                row + k * bits / 8);
                }
                __m512 s = step > gs
                               ? _mm512_permutexvar_ps(idx, _mm512_loadu_ps(sb + ((k - c0) >> gsh)))
                               : _mm512_set1_ps(group_value(w->scales, w->scale_dtype,
                                                            r * groups + (k >> gsh)));
                if (bits == 4) {
                    __m512i lo = _mm512_and_si512(v, low4);
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
                    _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
                        const int8_t *xq = px->xq + i * px->xq_stride + k;
                        __m512i d =
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq));
                        d = _mm512_dpbusd_epi32(d, hi, _mm512_loadu_si512(xq + len / 2));
                        __m512 dx = _mm512_loadu_ps(px->xdl + i * px->xdl_stride + k / cpl);
                        acc[i] =
                            _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(s, dx), acc[i]);
                    }
                } else {
                    _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
                        const int8_t *xq = px->xq + i * px->xq_stride + k;
                        __m512i d =
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, _mm512_loadu_si512(xq));
                        __m512 dx = _mm512_loadu_ps(px->xdl + i * px->xdl_stride + k / cpl);
                        acc[i] =
                            _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(s, dx), acc[i]);
                    }
                }
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) y[i * ldy + r] =
            _mm512_reduce_add_ps(acc[i]) + bias_term(w, r, px->xsum + i * groups, groups);
    }
}

/* bf16 fast GEMV for a constant n: vdpbf16ps on bf16 weights and bf16-rounded x. */
static ALWAYS_INLINE void gemv_bf16_fast(const kiln_matrix *w, const kiln_gemv_x *px, const int n,
                                         float *y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols;
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *row = (const uint16_t *)w->data + r * cols;
        __m512 acc[KILN_GEMV_MAX_N][2];
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] = acc[i][1] =
            _mm512_setzero_ps();
        int64_t k = 0;
        for (; k + 64 <= cols; k += 64) {
            __m512bh w0 = (__m512bh)_mm512_loadu_si512(row + k);
            __m512bh w1 = (__m512bh)_mm512_loadu_si512(row + k + 32);
            _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
                const uint16_t *xb = px->xb + i * cols + k;
                acc[i][0] = _mm512_dpbf16_ps(acc[i][0], w0, (__m512bh)_mm512_loadu_si512(xb));
                acc[i][1] = _mm512_dpbf16_ps(acc[i][1], w1, (__m512bh)_mm512_loadu_si512(xb + 32));
            }
        }
        for (; k < cols; k += 32) {
            int64_t rem = cols - k;
            __mmask32 m = rem >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << rem) - 1);
            __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi16(m, row + k);
            _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][0] = _mm512_dpbf16_ps(
                acc[i][0], w0, (__m512bh)_mm512_maskz_loadu_epi16(m, px->xb + i * cols + k));
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) y[i * ldy + r] =
            _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
    }
}

/* x quantized to int8 in blocks of 16 (finer than any weight group and a whole number of 32-bit
 * lanes, so a lane's integer sum has one x scale): dx = max|x|/127, xq = round(x/dx), in the
 * natural order (8-bit) or with each 128-block (a shorter last block likewise) holding its even
 * elements then its odd ones (4-bit); xdl[lane] = dx of every 32-bit lane (cpl codes) of a row. */
static void quantize_x_fast(const float *x, int n, int64_t cols, int bits, int8_t *xq,
                            int64_t xq_stride, float *xdl, int64_t xdl_stride) {
    const int64_t cpl = 32 / bits, step = 512 / bits;
    for (int i = 0; i < n; i++) {
        const float *xi = x + i * cols;
        int8_t *qi = xq + i * xq_stride;
        float *di = xdl + i * xdl_stride;
        for (int64_t k = 0; k < cols; k += 16) {
            __m512 v = _mm512_loadu_ps(xi + k);
            float amax = _mm512_reduce_max_ps(_mm512_abs_ps(v));
            float dx = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            for (int64_t l = k / cpl; l < (k + 16) / cpl; l++) di[l] = dx;
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(inv)));
            _mm_storeu_si128((__m128i *)(qi + k), _mm512_cvtsepi32_epi8(q));
        }
        memset(di + cols / cpl, 0, FAST_XDL_PAD * sizeof *di);
        memset(qi + cols, 0, FAST_XQ_PAD);
        if (bits == 4) {
            int8_t tmp[128];
            for (int64_t k = 0; k < cols; k += step) {
                int64_t len = cols - k < step ? cols - k : step;
                for (int64_t t = 0; t < len / 2; t++) {
                    tmp[t] = qi[k + 2 * t];
                    tmp[len / 2 + t] = qi[k + 2 * t + 1];
                }
                memcpy(qi + k, tmp, (size_t)len);
            }
        }
    }
}

static bool fast_kind(const kiln_matrix *w) {
    if (kiln_matrix_is_quantized(w))
        return (w->bits == 4 || w->bits == 8) && w->group_size >= 16 &&
               (w->group_size & (w->group_size - 1)) == 0;
    return w->dtype == KILN_DT_BF16;
}

size_t kiln_gemv_prepare_avx512(const kiln_matrix *w, const float *x, int n, bool fast,
                                kiln_gemv_x *px, void *scratch) {
    const int64_t cols = w->cols;
    fast = fast && fast_kind(w);
    size_t off = 0;
    kiln_gemv_x p = {.x = x, .n = n, .fast = fast};
    if (kiln_matrix_is_quantized(w)) {
        int64_t groups = cols / w->group_size;
        float *xsum = kiln_scratch_take(scratch, &off, (size_t)(n * groups) * sizeof(float));
        if (scratch) kiln_group_sums(x, n, cols, w->group_size, xsum);
        p.xsum = xsum;
        if (fast) {
            p.xq_stride = (cols + FAST_XQ_PAD + 63) / 64 * 64;
            p.xdl_stride = (cols * w->bits / 32 + FAST_XDL_PAD + 15) / 16 * 16;
            int8_t *xq = kiln_scratch_take(scratch, &off, (size_t)(n * p.xq_stride));
            float *xdl =
                kiln_scratch_take(scratch, &off, (size_t)(n * p.xdl_stride) * sizeof(float));
            if (scratch) quantize_x_fast(x, n, cols, w->bits, xq, p.xq_stride, xdl, p.xdl_stride);
            p.xq = xq, p.xdl = xdl;
        } else if (w->bits == 4) {
            float *xp = kiln_scratch_take(scratch, &off, (size_t)(n * cols) * sizeof(float));
            if (scratch) permute_even_odd(x, n, cols, 32, xp);
            p.xp = xp;
        }
    } else if (w->dtype == KILN_DT_BF16) {
        if (fast) {
            uint16_t *xb = kiln_scratch_take(scratch, &off, (size_t)(n * cols) * sizeof(uint16_t));
            if (scratch)
                for (int64_t k = 0; k < n * cols; k++) xb[k] = kiln_f32_to_bf16(x[k]);
            p.xb = xb;
        } else {
            float *xp = kiln_scratch_take(scratch, &off, (size_t)(n * cols) * sizeof(float));
            if (scratch) permute_even_odd(x, n, cols, 32, xp);
            p.xp = xp;
        }
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
#define Q48F(N, B)  gemv_q48_fast(w, px, N, B, y, ldy, r0, r1)
#define QGEN(N, _)  gemv_quant(w, px->x, N, y, ldy, r0, r1)
#define BF(N, _)    gemv_bf16(w, px, N, y, ldy, r0, r1)
#define BFF(N, _)   gemv_bf16_fast(w, px, N, y, ldy, r0, r1)
#define DENSE(N, _) gemv_dense(w, px->x, N, y, ldy, r0, r1)

void kiln_gemv_avx512(const kiln_matrix *w, const kiln_gemv_x *px, float *y, int64_t ldy,
                      int64_t r0, int64_t r1) {
    if (kiln_matrix_is_quantized(w)) {
        if (w->bits == 4 && px->fast) {
            EACH_N(Q48F, 4)
        } else if (w->bits == 8 && px->fast) {
            EACH_N(Q48F, 8)
        } else if (w->bits == 4) {
            EACH_N(Q48, 4)
        } else if (w->bits == 8) {
            EACH_N(Q48, 8)
        } else {
            EACH_N(QGEN, 0)
        }
    } else if (w->dtype == KILN_DT_BF16) {
        if (px->fast) {
            EACH_N(BFF, 0)
        } else {
            EACH_N(BF, 0)
        }
    } else {
        EACH_N(DENSE, 0)
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
