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
        int64_t k = 0;
        if (w->dtype == KILN_DT_BF16) /* plain loads: masked ones stall in a stream */
            for (; k + 16 <= len; k += 16)
                _mm512_storeu_ps(out + k,
                                 _mm512_castsi512_ps(_mm512_slli_epi32(
                                     _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                         (const __m256i *)((const uint16_t *)row + k0 + k))),
                                     16)));
        for (; k < len; k += 16) {
            __mmask16 m = tail_mask(len - k);
            _mm512_mask_storeu_ps(out + k, m, load_dense16(row, w->dtype, k0 + k, m));
        }
        return;
    }
    int64_t groups_per_row = w->cols / w->group_size;
    const uint8_t *p =
        (const uint8_t *)w->data + r * kiln_matrix_row_code_bytes(w) + k0 * w->bits / 8;
    if ((w->bits == 4 && w->group_size % 32 == 0) || w->bits == 8) {
        /* the common widths without the generic decoder: 8-bit codes zero-extended, 4-bit
         * codes as the low and high nibbles of 16 bytes interleaved back into code order (only
         * the row's own bytes are read) */
        const __m128i low4 = _mm_set1_epi8(15);
        for (int64_t k = 0; k < len; k += w->group_size) {
            int64_t g = r * groups_per_row + (k0 + k) / w->group_size;
            __m512 s = _mm512_set1_ps(group_value(w->scales, w->scale_dtype, g));
            __m512 b = _mm512_set1_ps(group_value(w->biases, w->scale_dtype, g));
            if (w->bits == 8) {
                for (int j = 0; j < w->group_size; j += 16, p += 16)
                    _mm512_storeu_ps(out + k + j,
                                     _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                                         _mm_loadu_si128((const __m128i *)p))),
                                                     s, b));
                continue;
            }
            for (int j = 0; j < w->group_size; j += 32, p += 16) {
                __m128i v = _mm_loadu_si128((const __m128i *)p);
                __m128i lo = _mm_and_si128(v, low4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
                __m512 c0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
                __m512 c1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
                _mm512_storeu_ps(out + k + j, _mm512_fmadd_ps(c0, s, b));
                _mm512_storeu_ps(out + k + j + 16, _mm512_fmadd_ps(c1, s, b));
            }
        }
        return;
    }
    code_decoder d = make_decoder(w);
    for (int64_t k = 0; k < len; k += w->group_size) {
        int64_t g = r * groups_per_row + (k0 + k) / w->group_size;
        __m512 s = _mm512_set1_ps(group_value(w->scales, w->scale_dtype, g));
        __m512 b = _mm512_set1_ps(group_value(w->biases, w->scale_dtype, g));
        for (int j = 0; j < w->group_size; j += 16, p += 2 * w->bits)
            _mm512_storeu_ps(out + k + j, _mm512_fmadd_ps(decode16(&d, p), s, b));
    }
}

/* ---- GEMV (decode) ------------------------------------------------------------------------
 * Every kernel reads R rows per pass (4 for one x row): the x loads are shared by the R rows, R*n
 * accumulator chains run side by side, and the R rows are R far-apart sequential streams (see
 * GEMV_STREAMS) so the hardware prefetcher keeps up.
 * 4/8-bit weights (AVX512-VNNI, group size a power of two >= 16): sum_j (s*q_j + b)*x_j =
 * s*sum_j q_j*x_j + b*sum_j x_j per group, with the group sums of x computed once per call. x is
 * quantized once per call to int8 in blocks of 16 with scale dx = max|x|/127 (in the code order:
 * natural for 8-bit; for 4-bit each 64-byte step's low nibbles are its even codes and the high
 * nibbles the odd ones, so x is stored evens then odds per 128-block), codes are the u8 operands of
 * vpdpbusd, and each 32-bit lane's integer sum times s*dx of its group and block is accumulated in
 * f32; b*sum(x) stays f32. The fast mode uses one int8 x (x rounded to 8 bits); the exact mode
 * splits x into three int8 parts (21 bits relative to the block's max|x|, see quantize_x_int8),
 * which is as accurate as the f32 dot products (~1e-7) and still far fewer instructions than
 * dequantizing to f32.
 * bf16 weights: a 32-bit lane holds elements 2t (low half) and 2t+1 (high half), so shifting left
 * by 16 or masking the low half yields f32 without a widening shuffle, against x permuted once per
 * call (even then odd elements of each 32-block, xp). The fast mode uses vdpbf16ps on bf16 x.
 * Other bit widths and f16/f32 weights use the generic decoder / loads above with natural x. */

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

/* Generic-width quantized GEMV (2/3/5/6 bits, and 4/8 bits with a group size the int8 kernels
 * do not take) for a constant n: decode, s*q+b, f32 dot. */
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

/* The four horizontal sums of a, b, c, d as one vector {sum a, sum b, sum c, sum d}: a transpose
 * tree (two unpack rounds, then the 128-bit lanes folded) instead of four separate reductions. */
static ALWAYS_INLINE __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512 abcd = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(abcd), _mm512_extractf32x8_ps(abcd, 1));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* y[rr[q]] = the horizontal sum of v[q], q < R, always through the same sum4 tree (so a row's
 * result does not depend on R, i.e. on the batch size n or where a thread's rows end). */
static ALWAYS_INLINE void store_sums(float *y, const int64_t *rr, const int R, const __m512 *v) {
    const __m512 z = _mm512_setzero_ps();
    __m128 t = sum4(v[0], R > 1 ? v[1] : z, R > 2 ? v[2] : z, R > 3 ? v[3] : z);
    _mm_store_ss(y + rr[0], t);
    if (R > 1) y[rr[1]] = _mm_cvtss_f32(_mm_shuffle_ps(t, t, 1));
    if (R > 2) y[rr[2]] = _mm_cvtss_f32(_mm_shuffle_ps(t, t, 2));
    if (R > 3) y[rr[3]] = _mm_cvtss_f32(_mm_shuffle_ps(t, t, 3));
}

/* The GEMV kernels work on R rows at once (x loads shared, R*n accumulator chains). Adjacent rows
 * side by side would make R strided streams inside a page, which the hardware stream prefetcher
 * does not follow; so a thread's rows [r0, r1) are cut into R equal runs read in parallel, R
 * long sequential streams (rr[q] = the current row of run q); the rows left over run singly.
 * GEMV_PREFETCH: bytes ahead in each stream to prefetch in software (0: none). */
#define GEMV_PREFETCH 2048
#define GEMV_STREAMS(R, BODY_R, BODY_1)                                                            \
    do {                                                                                           \
        int64_t len_ = (r1 - r0) / (R), rr[4];                                                     \
        for (int64_t t_ = 0; t_ < len_; t_++) {                                                    \
            for (int q_ = 0; q_ < (R); q_++) rr[q_] = r0 + q_ * len_ + t_;                         \
            BODY_R;                                                                                \
        }                                                                                          \
        for (int64_t r_ = r0 + (R)*len_; r_ < r1; r_++) {                                          \
            rr[0] = r_;                                                                            \
            BODY_1;                                                                                \
        }                                                                                          \
    } while (0)

/* bf16 GEMV for a constant n on R consecutive rows at once (the x loads shared by the R rows,
 * R*2 independent accumulator chains per x row, R streams in flight), against xp (even/odd
 * permuted 32-blocks); the last cols % 32 elements against natural x. fast: the same streams and
 * aligned-block reads, one vdpbf16ps per 32 weights against bf16 x (xb) instead. */
static ALWAYS_INLINE void gemv_bf16_rows(const kiln_matrix *w, const kiln_gemv_x *px, const int n,
                                         const int R, const bool shifted, const bool fast, float *y,
                                         int64_t ldy, const int64_t *rr) {
    const int64_t cols = w->cols, full = cols / 32 * 32;
    const float *xp = px->xp, *x = px->x;
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    const uint16_t *rows[4];
    _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) rows[q] =
        (const uint16_t *)w->data + rr[q] * cols;
    /* shifted: the rows start m = 4..60 bytes past a 64-byte boundary (a safetensors file puts
     * tensors at any 8-byte offset); a 64-byte load across two cache lines halves the streaming
     * rate, so the row is read as aligned blocks and each step is put together from two of them
     * (the block after the last step holds the row's last bytes: never past a page). */
    const int m = (int)((uintptr_t)w->data & 63);
    __m512i sh_idx = _mm512_setzero_si512(), lo[4];
    const uint8_t *ab[4];
    if (shifted) {
        sh_idx =
            _mm512_add_epi32(_mm512_set1_epi32(m / 4), _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9,
                                                                        8, 7, 6, 5, 4, 3, 2, 1, 0));
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {
            ab[q] = (const uint8_t *)rows[q] - m;
            lo[q] = _mm512_load_si512(ab[q]);
        }
    }
    __m512 acc[KILN_GEMV_MAX_N][4][2];
    _Pragma("GCC unroll 4") for (int i = 0; i < n; i++)
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) acc[i][q][0] = acc[i][q][1] =
            _mm512_setzero_ps();
    for (int64_t k = 0; k < full; k += 32) {
        __m512 we[4], wo[4];
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {
            if (GEMV_PREFETCH)
                _mm_prefetch((const char *)(rows[q] + k) + GEMV_PREFETCH, _MM_HINT_T0);
            __m512i v;
            if (shifted) {
                __m512i hi = _mm512_load_si512(ab[q] + 2 * k + 64);
                v = _mm512_permutex2var_epi32(lo[q], sh_idx, hi);
                lo[q] = hi;
            } else {
                v = _mm512_loadu_si512(rows[q] + k);
            }
            if (fast) { /* vdpbf16ps on the pairs as they are, against bf16 x */
                _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][q][0] = _mm512_dpbf16_ps(
                    acc[i][q][0], (__m512bh)v, (__m512bh)_mm512_loadu_si512(px->xb + i * cols + k));
                continue;
            }
            we[q] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            wo[q] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
        }
        if (fast) continue;
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
            __m512 xe = _mm512_loadu_ps(xp + i * cols + k);
            __m512 xo = _mm512_loadu_ps(xp + i * cols + k + 16);
            _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {
                acc[i][q][0] = _mm512_fmadd_ps(we[q], xe, acc[i][q][0]);
                acc[i][q][1] = _mm512_fmadd_ps(wo[q], xo, acc[i][q][1]);
            }
        }
    }
    for (int64_t k = full; fast && k < cols; k += 32) {
        int64_t rem = cols - k;
        __mmask32 m = rem >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << rem) - 1);
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {
            __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi16(m, rows[q] + k);
            _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][q][0] = _mm512_dpbf16_ps(
                acc[i][q][0], w0, (__m512bh)_mm512_maskz_loadu_epi16(m, px->xb + i * cols + k));
        }
    }
    for (int64_t k = full; !fast && k < cols; k += 16) {
        __mmask16 m = tail_mask(cols - k);
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {
            __m512 w0 = load_dense16(rows[q], KILN_DT_BF16, k, m);
            _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) acc[i][q][0] =
                _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x + i * cols + k), acc[i][q][0]);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
        __m512 v[4];
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) v[q] =
            _mm512_add_ps(acc[i][q][0], acc[i][q][1]);
        store_sums(y + i * ldy, rr, R, v);
    }
}

/* bf16 GEMV for a constant n: 4 rows per pass for n <= 2, 2 for n = 3, 4 (register budget), single
 * rows for the remainder. */
static ALWAYS_INLINE void gemv_bf16(const kiln_matrix *w, const kiln_gemv_x *px, const int n,
                                    const bool fast, float *y, int64_t ldy, int64_t r0,
                                    int64_t r1) {
    const int R = n <= 2 ? 4 : 2;
    int64_t m = (int64_t)((uintptr_t)w->data & 63);
    if (m == 0 || m % 4 || w->cols % 32) {
        GEMV_STREAMS(R, gemv_bf16_rows(w, px, n, R, false, fast, y, ldy, rr),
                     gemv_bf16_rows(w, px, n, 1, false, fast, y, ldy, rr));
        return;
    }
    /* misaligned rows: aligned block reads, except the matrix's last row (its last block may
     * end past the allocation) */
    int64_t r1s = r1 == w->rows ? r1 - 1 : r1;
    {
        int64_t r1_ = r1;
        r1 = r1s;
        GEMV_STREAMS(R, gemv_bf16_rows(w, px, n, R, true, fast, y, ldy, rr),
                     gemv_bf16_rows(w, px, n, 1, true, fast, y, ldy, rr));
        r1 = r1_;
    }
    for (int64_t r = r1s; r < r1; r++) gemv_bf16_rows(w, px, n, 1, false, fast, y, ldy, &r);
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

/* 4/8-bit GEMV on int8 x for a constant n, number of x parts (1: fast, 3: exact split) and R
 * consecutive rows per pass (x loads shared by the R rows, R streams in flight). A step is 64
 * bytes of codes (128 4-bit / 64 8-bit codes; the last step of a row may be shorter and is
 * masked). 32-bit lane j of the vpdpbusd sum covers codes [step + j*cpl, +cpl), cpl = 32/bits,
 * so its group is known: a row's scales stay in a register 16 groups at a time and a permute
 * spreads them over the lanes (no store/reload of converted scales), dx comes per lane from xdl,
 * and the bias term b*sum(x) of the same 16 groups is accumulated in a second vector. With three
 * parts a lane's sums are combined in int32 as ((d0 << 7) + d1) << 7 + d2. */
static ALWAYS_INLINE __m512i q_dot_part(__m512i d, __m512i lo, __m512i hi, const int8_t *xp,
                                        int64_t half, __mmask64 m, const bool masked,
                                        const int bits) {
    if (!masked) {
        d = _mm512_dpbusd_epi32(d, lo, _mm512_loadu_si512(xp));
        if (bits == 4) d = _mm512_dpbusd_epi32(d, hi, _mm512_loadu_si512(xp + half));
    } else { /* short last step */
        d = _mm512_dpbusd_epi32(d, lo, _mm512_maskz_loadu_epi8(m, xp));
        if (bits == 4) d = _mm512_dpbusd_epi32(d, hi, _mm512_maskz_loadu_epi8(m, xp + half));
    }
    return d;
}

/* The lane sums of one step against all parts of x (independent chains, combined at the end). */
static ALWAYS_INLINE __m512i q_dot_parts(__m512i lo, __m512i hi, const int8_t *xq, int64_t part,
                                         int64_t half, __mmask64 m, const bool masked,
                                         const int parts, const int bits) {
    __m512i d = q_dot_part(_mm512_setzero_si512(), lo, hi, xq, half, m, masked, bits);
    if (parts == 3) { /* one chain: ((d0 << 7) + d1) << 7 + d2, no adds */
        d = q_dot_part(_mm512_slli_epi32(d, 7), lo, hi, xq + part, half, m, masked, bits);
        d = q_dot_part(_mm512_slli_epi32(d, 7), lo, hi, xq + 2 * part, half, m, masked, bits);
    }
    return d;
}

/* One step (64 bytes of codes at column k, len codes, masked when short) of R rows. */
static ALWAYS_INLINE void q48_step(const uint8_t *const *rows, const kiln_gemv_x *px, const int n,
                                   const int bits, const int parts, const int R, int64_t k,
                                   int64_t len, const bool masked, __m512i sidx, const __m512 *sv,
                                   __m512 (*acc)[4]) {
    const int64_t cpl = 32 / bits;
    const __m512i low4 = _mm512_set1_epi8(15);
    const __mmask64 m = masked ? ((__mmask64)1 << (len * bits / 8)) - 1 : ~(__mmask64)0;
    __m512 dx[KILN_GEMV_MAX_N];
    _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) dx[i] =
        _mm512_loadu_ps(px->xdl + i * px->xdl_stride + k / cpl);
    _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {
        const uint8_t *p = rows[q] + k * bits / 8;
        __m512i v;
        if (!masked) { /* plain load: masked ones stall in a stream here */
            if (GEMV_PREFETCH) _mm_prefetch((const char *)p + GEMV_PREFETCH, _MM_HINT_T0);
            v = _mm512_loadu_si512(p);
        } else {
            v = _mm512_maskz_loadu_epi8(m, p);
        }
        __m512i lo = v, hi = v;
        if (bits == 4) {
            lo = _mm512_and_si512(v, low4);
            hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        }
        __m512 s = _mm512_permutexvar_ps(sidx, sv[q]);
        _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
            __m512i d = q_dot_parts(lo, hi, px->xq + i * px->xq_stride + k, px->xq_part, len / 2, m,
                                    masked, parts, bits);
            acc[i][q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(s, dx[i]), acc[i][q]);
        }
    }
}

static ALWAYS_INLINE void gemv_q48_int8_rows(const kiln_matrix *w, const kiln_gemv_x *px,
                                             const int n, const int bits, const int parts,
                                             const int R, __m512i idx_base, float *y, int64_t ldy,
                                             const int64_t *rr) {
    const int64_t cols = w->cols, gs = w->group_size, groups = cols / gs;
    const int64_t step = 512 / bits, row_bytes = cols * bits / 8;
    const int gsh = __builtin_ctzll((unsigned long long)gs); /* gs is a power of two */
    const uint8_t *rows[4];
    _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) rows[q] =
        (const uint8_t *)w->data + rr[q] * row_bytes;
    __m512 acc[KILN_GEMV_MAX_N][4], bacc[KILN_GEMV_MAX_N][4];
    _Pragma("GCC unroll 4") for (int i = 0; i < n; i++)
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) acc[i][q] = bacc[i][q] =
            _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < groups; g0 += 16) {
        const int64_t cnt = groups - g0 < 16 ? groups - g0 : 16;
        __m512 sv[4];
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {
            sv[q] = load_groups16(w->scales, w->scale_dtype, rr[q] * groups + g0, cnt);
            __m512 bv = load_groups16(w->biases, w->scale_dtype, rr[q] * groups + g0, cnt);
            _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
                const float *xs = px->xsum + i * groups + g0;
                __m512 xsv =
                    cnt == 16 ? _mm512_loadu_ps(xs) : _mm512_maskz_loadu_ps(tail_mask(cnt), xs);
                bacc[i][q] = _mm512_fmadd_ps(bv, xsv, bacc[i][q]);
            }
        }
        const int64_t kb = g0 << gsh, ke = (g0 + cnt) << gsh;
        int64_t k = kb;
        for (; k + step <= ke; k += step) {
            __m512i sidx = _mm512_add_epi32(idx_base, _mm512_set1_epi32((int)((k - kb) >> gsh)));
            q48_step(rows, px, n, bits, parts, R, k, step, false, sidx, sv, acc);
        }
        if (k < ke) {
            __m512i sidx = _mm512_add_epi32(idx_base, _mm512_set1_epi32((int)((k - kb) >> gsh)));
            q48_step(rows, px, n, bits, parts, R, k, ke - k, true, sidx, sv, acc);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < n; i++) {
        __m512 v[4];
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) v[q] =
            _mm512_add_ps(acc[i][q], bacc[i][q]);
        store_sums(y + i * ldy, rr, R, v);
    }
}

static ALWAYS_INLINE void gemv_q48_int8(const kiln_matrix *w, const kiln_gemv_x *px, const int n,
                                        const int bits, const int parts, float *y, int64_t ldy,
                                        int64_t r0, int64_t r1) {
    const int64_t gs = w->group_size, step = 512 / bits, cpl = 32 / bits;
    uint32_t idx_a[16]; /* the group of each 32-bit lane of a step, relative to its first */
    for (int j = 0; j < 16; j++) idx_a[j] = step > gs ? (uint32_t)(j * cpl / gs) : 0;
    const __m512i idx_base = _mm512_loadu_si512(idx_a);
    const int R = n == 1 ? 4 : 2;
    GEMV_STREAMS(R, gemv_q48_int8_rows(w, px, n, bits, parts, R, idx_base, y, ldy, rr),
                 gemv_q48_int8_rows(w, px, n, bits, parts, 1, idx_base, y, ldy, rr));
}

/* x quantized to int8 in blocks of 16 (finer than any weight group and a whole number of 32-bit
 * lanes, so a lane's integer sum has one x scale): dx = max|x|/127, xq = round(x/dx), in the
 * natural order (8-bit) or with each 128-block (a shorter last block likewise) holding its even
 * elements then its odd ones (4-bit); xdl[lane] = dx of every 32-bit lane (cpl codes) of a row.
 * With parts = 3 (the exact mode) the remainder is quantized twice more at 1/128 of the step:
 * t = x/dx = q0 + q1/2^7 + q2/2^14 + e, |q0| <= 127, |q1|, |q2| <= 64, |e| <= 2^-15, and xdl holds
 * dx/2^14 so that a lane's ((d0*2^7 + d1)*2^7 + d2) (which fits in int32: |d0| <= 4*255*127) times
 * xdl is its dot product with x to within 2^-15*dx per element (~2.4e-7 of the block's max|x|),
 * well inside f32 round-off of a long dot product. */
static void quantize_x_int8(const float *x, int n, int64_t cols, int bits, int parts, int8_t *xq,
                            int64_t xq_part, float *xdl, int64_t xdl_stride) {
    const int64_t cpl = 32 / bits, step = 512 / bits;
    const __m512 c128 = _mm512_set1_ps(128.0f);
    for (int i = 0; i < n; i++) {
        const float *xi = x + i * cols;
        float *di = xdl + i * xdl_stride;
        int8_t *q0 = xq + (int64_t)i * parts * xq_part;
        for (int64_t k = 0; k < cols; k += 16) {
            __m512 v = _mm512_loadu_ps(xi + k);
            float amax = _mm512_reduce_max_ps(_mm512_abs_ps(v));
            float dx = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            float dl = parts == 3 ? dx * (1.0f / 16384.0f) : dx;
            for (int64_t l = k / cpl; l < (k + 16) / cpl; l++) di[l] = dl;
            __m512 t = _mm512_mul_ps(v, _mm512_set1_ps(inv));
            for (int p = 0; p < parts; p++) {
                __m512i q = _mm512_cvtps_epi32(t); /* round to nearest even */
                _mm_storeu_si128((__m128i *)(q0 + p * xq_part + k), _mm512_cvtsepi32_epi8(q));
                t = _mm512_mul_ps(_mm512_sub_ps(t, _mm512_cvtepi32_ps(q)), c128); /* exact */
            }
        }
        memset(di + cols / cpl, 0, FAST_XDL_PAD * sizeof *di);
        for (int p = 0; p < parts; p++) {
            int8_t *qi = q0 + p * xq_part;
            memset(qi + cols, 0, FAST_XQ_PAD);
            if (bits == 4) {
                /* full 128-blocks: a byte shuffle puts each 16 bytes' evens before its odds, a
                 * qword permute gathers the evens of both halves, then the odds */
                const __m512i eo = _mm512_broadcast_i32x4(
                    _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
                const __m512i ev = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
                const __m512i od = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
                int64_t k0 = 0;
                for (; k0 + step <= cols; k0 += step) {
                    __m512i a = _mm512_shuffle_epi8(_mm512_loadu_si512(qi + k0), eo);
                    __m512i b = _mm512_shuffle_epi8(_mm512_loadu_si512(qi + k0 + 64), eo);
                    _mm512_storeu_si512(qi + k0, _mm512_permutex2var_epi64(a, ev, b));
                    _mm512_storeu_si512(qi + k0 + 64, _mm512_permutex2var_epi64(a, od, b));
                }
                int8_t tmp[128];
                for (int64_t k = k0; k < cols; k += step) { /* a shorter last block */
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
    fast = fast && fast_kind(w); /* the caller checked VNNI / BF16 */
    bool int8_kind = kiln_matrix_is_quantized(w) && fast_kind(w) && (fast || kiln_cpu_has_vnni());
    size_t off = 0;
    kiln_gemv_x p = {.x = x, .n = n, .fast = fast};
    if (kiln_matrix_is_quantized(w)) {
        int64_t groups = cols / w->group_size;
        float *xsum = kiln_scratch_take(scratch, &off, (size_t)(n * groups) * sizeof(float));
        if (scratch) kiln_group_sums(x, n, cols, w->group_size, xsum);
        p.xsum = xsum;
        if (int8_kind) { /* 4/8-bit: int8 x, one part (fast) or three (exact split) */
            p.xq_parts = fast ? 1 : 3;
            p.xq_part = (cols + FAST_XQ_PAD + 63) / 64 * 64;
            p.xq_stride = p.xq_parts * p.xq_part;
            p.xdl_stride = (cols * w->bits / 32 + FAST_XDL_PAD + 15) / 16 * 16;
            int8_t *xq = kiln_scratch_take(scratch, &off, (size_t)(n * p.xq_stride));
            float *xdl =
                kiln_scratch_take(scratch, &off, (size_t)(n * p.xdl_stride) * sizeof(float));
            if (scratch)
                quantize_x_int8(x, n, cols, w->bits, p.xq_parts, xq, p.xq_part, xdl, p.xdl_stride);
            p.xq = xq, p.xdl = xdl;
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
#define Q48F(N, B)  gemv_q48_int8(w, px, N, B, 1, y, ldy, r0, r1)
#define Q48S(N, B)  gemv_q48_int8(w, px, N, B, 3, y, ldy, r0, r1)
#define QGEN(N, _)  gemv_quant(w, px->x, N, y, ldy, r0, r1)
#define BF(N, _)    gemv_bf16(w, px, N, false, y, ldy, r0, r1)
#define BFF(N, _)   gemv_bf16(w, px, N, true, y, ldy, r0, r1)
#define DENSE(N, _) gemv_dense(w, px->x, N, y, ldy, r0, r1)

void kiln_gemv_avx512(const kiln_matrix *w, const kiln_gemv_x *px, float *y, int64_t ldy,
                      int64_t r0, int64_t r1) {
    if (kiln_matrix_is_quantized(w)) {
        if (w->bits == 4 && px->xq_parts == 1) {
            EACH_N(Q48F, 4)
        } else if (w->bits == 8 && px->xq_parts == 1) {
            EACH_N(Q48F, 8)
        } else if (w->bits == 4 && px->xq_parts == 3) {
            EACH_N(Q48S, 4)
        } else if (w->bits == 8 && px->xq_parts == 3) {
            EACH_N(Q48S, 8)
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

/* WR x XP panel tile: WR*XP/16 accumulators; per k XP/16 x vectors and WR weight broadcasts. */
void kiln_tile_t_avx512(int64_t cols, const float *xt, const float *wd, int64_t ldw, float *c) {
    enum { WR = KILN_GEMM_WR, XV = KILN_GEMM_XP / 16 };
    _Static_assert(WR * XV <= 26, "panel tile registers");
    __m512 acc[WR][XV];
    _Pragma("GCC unroll 16") for (int j = 0; j < WR; j++)
        _Pragma("GCC unroll 4") for (int v = 0; v < XV; v++) acc[j][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < cols; k++) {
        __m512 xv[XV];
        _Pragma("GCC unroll 4") for (int v = 0; v < XV; v++) xv[v] =
            _mm512_load_ps(xt + k * KILN_GEMM_XP + 16 * v);
        _Pragma("GCC unroll 16") for (int j = 0; j < WR; j++) {
            __m512 wv = _mm512_set1_ps(wd[j * ldw + k]);
            _Pragma("GCC unroll 4") for (int v = 0; v < XV; v++) acc[j][v] =
                _mm512_fmadd_ps(wv, xv[v], acc[j][v]);
        }
    }
    _Pragma("GCC unroll 16") for (int j = 0; j < WR; j++)
        _Pragma("GCC unroll 4") for (int v = 0; v < XV; v++)
            _mm512_storeu_ps(c + j * KILN_GEMM_XP + 16 * v, acc[j][v]);
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

/* Four kiln_dot_avx512 at once (the same two chains and reduction per row, so each result is bit
 * for bit dot's; the four reductions overlap instead of running back to back). */
static ALWAYS_INLINE void dot4_avx512(float *out, const float *a, const float *const *b,
                                      const int R, int64_t n) {
    __m512 acc0[4], acc1[4];
    _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) acc0[q] = acc1[q] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 a0 = _mm512_loadu_ps(a + i), a1 = _mm512_loadu_ps(a + i + 16);
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {
            acc0[q] = _mm512_fmadd_ps(a0, _mm512_loadu_ps(b[q] + i), acc0[q]);
            acc1[q] = _mm512_fmadd_ps(a1, _mm512_loadu_ps(b[q] + i + 16), acc1[q]);
        }
    }
    for (; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 a0 = _mm512_maskz_loadu_ps(m, a + i);
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) acc0[q] =
            _mm512_fmadd_ps(a0, _mm512_maskz_loadu_ps(m, b[q] + i), acc0[q]);
    }
    _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) out[q] =
        _mm512_reduce_add_ps(_mm512_add_ps(acc0[q], acc1[q]));
}

void kiln_dot_rows_avx512(float *out, const float *a, const float *rows, int64_t stride,
                          int64_t count, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= count; i += 4) {
        const float *b[4] = {rows + i * stride, rows + (i + 1) * stride, rows + (i + 2) * stride,
                             rows + (i + 3) * stride};
        dot4_avx512(out + i, a, b, 4, n);
    }
    for (; i < count; i++) {
        const float *b[1] = {rows + i * stride};
        dot4_avx512(out + i, a, b, 1, n);
    }
}

/* y[c0 .. c0 + 16*NV) (masked past n) += coef[i] * rows[i] for every row in order, y held in
 * registers: per element the same FMAs in the same order as kiln_axpy_avx512 row by row. */
static ALWAYS_INLINE void axpy_rows_chunk(float *y, const float *coef, const float *rows,
                                          int64_t stride, int64_t count, int64_t n, int64_t c0,
                                          const int NV) {
    __m512 acc[8];
    __mmask16 m[8];
    _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) {
        int64_t left = n - c0 - 16 * v;
        m[v] = left <= 0 ? 0 : tail_mask(left);
        acc[v] = _mm512_maskz_loadu_ps(m[v], y + c0 + 16 * v);
    }
    for (int64_t i = 0; i < count; i++) {
        const __m512 av = _mm512_set1_ps(coef[i]);
        const float *r = rows + i * stride + c0;
        _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) acc[v] =
            _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m[v], r + 16 * v), acc[v]);
    }
    _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++)
        _mm512_mask_storeu_ps(y + c0 + 16 * v, m[v], acc[v]);
}

void kiln_axpy_rows_avx512(float *y, const float *coef, const float *rows, int64_t stride,
                           int64_t count, int64_t n) {
    int64_t c0 = 0;
    for (; c0 + 128 <= n; c0 += 128) axpy_rows_chunk(y, coef, rows, stride, count, n, c0, 8);
    for (; c0 < n; c0 += 64) axpy_rows_chunk(y, coef, rows, stride, count, n, c0, 4);
}

void kiln_pack_x_bf16_avx512(const float *x, int64_t np, int64_t cols, uint32_t *xt) {
    const int64_t pairs = cols / 2;
    for (int64_t i = 0; i < KILN_GEMM_XP; i++) {
        if (i >= np) {
            for (int64_t kk = 0; kk < pairs; kk++) xt[kk * KILN_GEMM_XP + i] = 0;
            continue;
        }
        const float *xi = x + i * cols;
        int64_t kk = 0;
        for (; kk + 16 <= pairs; kk += 16) { /* 32 values -> 16 pairs */
            __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(xi + 2 * kk + 16),
                                             _mm512_loadu_ps(xi + 2 * kk));
            _Alignas(64) uint32_t tmp[16];
            _mm512_store_si512(tmp, (__m512i)b);
            for (int t = 0; t < 16; t++) xt[(kk + t) * KILN_GEMM_XP + i] = tmp[t];
        }
        for (; kk < pairs; kk++) {
            __m128bh b = _mm_cvtneps_pbh(_mm_setr_ps(xi[2 * kk], xi[2 * kk + 1], 0.0f, 0.0f));
            uint32_t v;
            memcpy(&v, &b, sizeof v);
            xt[kk * KILN_GEMM_XP + i] = v;
        }
    }
}

void kiln_f32_to_bf16_avx512(const float *src, int64_t n, uint16_t *dst) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm256_mask_storeu_epi16(dst + i, m,
                                 (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i)));
    }
}

/* WR x XP tile on bf16 pairs: per pair of k, XP/16 x vectors and WR broadcast weight pairs, each
 * vdpbf16ps two multiply-adds per lane (twice the f32 FMA tile's rate). */
void kiln_tile_bf16_avx512(int64_t pairs, const uint32_t *xt, const uint16_t *const *wrows,
                           float *c) {
    enum { WR = KILN_GEMM_WR, XV = KILN_GEMM_XP / 16 };
    __m512 acc[WR][XV];
    _Pragma("GCC unroll 16") for (int j = 0; j < WR; j++)
        _Pragma("GCC unroll 4") for (int v = 0; v < XV; v++) acc[j][v] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < pairs; kk++) {
        __m512bh xv[XV];
        _Pragma("GCC unroll 4") for (int v = 0; v < XV; v++) xv[v] =
            (__m512bh)_mm512_load_si512(xt + kk * KILN_GEMM_XP + 16 * v);
        _Pragma("GCC unroll 16") for (int j = 0; j < WR; j++) {
            uint32_t wp;
            memcpy(&wp, wrows[j] + 2 * kk, sizeof wp);
            __m512bh wv = (__m512bh)_mm512_set1_epi32((int)wp);
            _Pragma("GCC unroll 4") for (int v = 0; v < XV; v++) acc[j][v] =
                _mm512_dpbf16_ps(acc[j][v], wv, xv[v]);
        }
    }
    _Pragma("GCC unroll 16") for (int j = 0; j < WR; j++)
        _Pragma("GCC unroll 4") for (int v = 0; v < XV; v++)
            _mm512_storeu_ps(c + j * KILN_GEMM_XP + 16 * v, acc[j][v]);
}

/* r[16] (16 rows of 16) transposed in place: 4x4 blocks inside each 128-bit lane by two unpack
 * rounds, then the lanes gathered across the four row groups by two shuffle_f32x4 rounds. */
static ALWAYS_INLINE void transpose16(__m512 *r) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; c++) { /* lane L of r[4g + c]: column 4L + c of rows 4g .. 4g+3 */
        __m512 ab0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        __m512 ab1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
        __m512 de0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        __m512 de1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
        t[c] = _mm512_shuffle_f32x4(ab0, de0, 0x88);
        t[8 + c] = _mm512_shuffle_f32x4(ab0, de0, 0xdd);
        t[4 + c] = _mm512_shuffle_f32x4(ab1, de1, 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(ab1, de1, 0xdd);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

void kiln_pack_x_avx512(const float *x, int64_t np, int64_t cols, float *xt) {
    const int64_t full = cols / 16 * 16;
    for (int64_t k0 = 0; k0 < full; k0 += 16)
        for (int i0 = 0; i0 < KILN_GEMM_XP; i0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] =
                    i0 + i < np ? _mm512_loadu_ps(x + (i0 + i) * cols + k0) : _mm512_setzero_ps();
            transpose16(r);
            for (int c = 0; c < 16; c++) _mm512_store_ps(xt + (k0 + c) * KILN_GEMM_XP + i0, r[c]);
        }
    for (int64_t k = full; k < cols; k++) {
        float *dst = xt + k * KILN_GEMM_XP;
        int64_t i = 0;
        for (; i < np; i++) dst[i] = x[i * cols + k];
        for (; i < KILN_GEMM_XP; i++) dst[i] = 0.0f;
    }
}

void kiln_store_tile_avx512(const float *c, int64_t np, int64_t nr, const float *bias, float *y,
                            int64_t ldy) {
    _Static_assert(KILN_GEMM_WR <= 16 && KILN_GEMM_XP == 32, "tile store shape");
    const __mmask16 m = tail_mask(nr);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias) : _mm512_setzero_ps();
    for (int i0 = 0; i0 < KILN_GEMM_XP && i0 < np; i0 += 16) {
        __m512 r[16];
        for (int j = 0; j < 16; j++)
            r[j] =
                j < KILN_GEMM_WR ? _mm512_loadu_ps(c + j * KILN_GEMM_XP + i0) : _mm512_setzero_ps();
        transpose16(r); /* r[i] = c[0..15][i0 + i] */
        for (int i = 0; i < 16 && i0 + i < np; i++)
            _mm512_mask_storeu_ps(y + (i0 + i) * ldy, m, _mm512_add_ps(r[i], b));
    }
}

/* ---- exact VNNI panel GEMM (4/8-bit weights, x split into three int8 digits) ----------------
 * The prefill counterpart of the exact int8 GEMV: y[i, r] = sum_g s[r,g] * sum_{k in g} q[r,k] *
 * x[i,k] + b[r,g] * sum_{k in g} x[i,k]. x is split per token and block of kb elements (kb =
 * min(group, 64)) as x ~ dx/2^14 * (q0*2^14 + q1*2^7 + q2) with dx = max|x|/127 of the block,
 * |q0| <= 127, |q1|, |q2| <= 64 (quantize_x_int8's recipe, per kb-block instead of 16); a panel of
 * XP tokens holds, per block and digit, kb/4 lines of XP dwords (4 consecutive digits of one
 * token), the s8 operand of vpdpbusd; the u8 operand is 4 codes of one weight row broadcast to
 * all lanes (8-bit codes read in place; 4-bit rows expanded to a byte per code once per row
 * block). A lane's integer sum over a block is converted to f32 once per block and scaled by
 * s * dx/2^14 into the f32 tile c (in memory: once per block per accumulator is cheap); the bias
 * term b*sum(x) is one f32 FMA per group. Integer ranges: 4-bit codes, one chain per block
 * ((d0 << 7) + d1) << 7 + d2: |.| <= 64*15*(127*2^14 + 64*2^7 + 64) < 2^31; 8-bit codes, digit 0
 * in its own chain (|d0| <= 64*255*127) and (d1 << 7) + d2 in another, joined in f32 as
 * d0*2^14 + d12. Per element the representation error is <= 2^-15*dx (~2.4e-7 of the block's
 * max|x|), as in the exact GEMV; the sums are exact integers until the per-block conversion. */

/* The 3 digits (xmm of 16 int8) of 16 elements of x already scaled to t = x/dx. */
static ALWAYS_INLINE void xq_digits(__m512 t, __m128i *d) {
    const __m512 c128 = _mm512_set1_ps(128.0f);
    for (int p = 0; p < 3; p++) {
        __m512i q = _mm512_cvtps_epi32(t); /* round to nearest even */
        d[p] = _mm512_cvtsepi32_epi8(q);
        t = _mm512_mul_ps(_mm512_sub_ps(t, _mm512_cvtepi32_ps(q)), c128); /* exact */
    }
}

/* z[0..3]: lane t of z[g] = 4 dwords of token g + 4t; out: o[d] = dword d of tokens 0..15. */
static ALWAYS_INLINE void transpose_4x16(const __m512i *z, __m512i *o) {
    __m512i a = _mm512_unpacklo_epi32(z[0], z[1]), b = _mm512_unpackhi_epi32(z[0], z[1]);
    __m512i c = _mm512_unpacklo_epi32(z[2], z[3]), d = _mm512_unpackhi_epi32(z[2], z[3]);
    o[0] = _mm512_unpacklo_epi64(a, c), o[1] = _mm512_unpackhi_epi64(a, c);
    o[2] = _mm512_unpacklo_epi64(b, d), o[3] = _mm512_unpackhi_epi64(b, d);
}

void kiln_pack_xq_avx512(const float *x, int64_t np, int64_t cols, int kb, int8_t *xd, float *dxp) {
    enum { XP = KILN_GEMM_XP };
    const int64_t blocks = cols / kb, kq = kb / 4;
    for (int64_t i0 = 0; i0 < XP; i0 += 16) /* 16 tokens at a time: one zmm line per dword */
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t k0 = b * kb;
            float inv[16];
            for (int i = 0; i < 16; i++) {
                float amax = 0.0f;
                if (i0 + i < np) {
                    __m512 m = _mm512_setzero_ps();
                    for (int c = 0; c < kb; c += 16)
                        m = _mm512_max_ps(
                            m, _mm512_abs_ps(_mm512_loadu_ps(x + (i0 + i) * cols + k0 + c)));
                    amax = _mm512_reduce_max_ps(m);
                }
                inv[i] = amax > 0.0f ? 127.0f / amax : 0.0f;
                dxp[b * XP + i0 + i] = amax / 127.0f * (1.0f / 16384.0f);
            }
            int8_t *blk = xd + b * 3 * kq * XP * 4 + i0 * 4;
            for (int c = 0; c < kb; c += 16) {
                __m512i z[3][4];
                for (int g = 0; g < 4; g++) {
                    __m128i d[4][3]; /* token g + 4t, digit p */
                    for (int t = 0; t < 4; t++) {
                        const int i = g + 4 * t;
                        d[t][0] = d[t][1] = d[t][2] = _mm_setzero_si128();
                        if (i0 + i < np)
                            xq_digits(_mm512_mul_ps(_mm512_loadu_ps(x + (i0 + i) * cols + k0 + c),
                                                    _mm512_set1_ps(inv[i])),
                                      d[t]);
                    }
                    for (int p = 0; p < 3; p++)
                        z[p][g] = _mm512_inserti32x4(
                            _mm512_inserti32x4(
                                _mm512_inserti32x4(_mm512_castsi128_si512(d[0][p]), d[1][p], 1),
                                d[2][p], 2),
                            d[3][p], 3);
                }
                for (int p = 0; p < 3; p++) {
                    __m512i o[4];
                    transpose_4x16(z[p], o);
                    for (int d = 0; d < 4; d++)
                        _mm512_store_si512(blk + (p * kq + c / 4 + d) * XP * 4, o[d]);
                }
            }
        }
}

void kiln_pack_wq_avx512(const uint8_t *codes, int64_t row_bytes, int64_t nr, int64_t cols,
                         int bits, int kb, uint8_t *wq) {
    enum { WR = KILN_GEMM_WR };
    const __m256i low4 = _mm256_set1_epi8(15);
    const uint8_t *rows[WR];
    for (int j = 0; j < WR; j++)
        rows[j] = codes + (j < nr ? j : 0) * row_bytes; /* past nr: row 0 */
    /* block by block, row by row: the output is written in order (wq is cold: the panels' x
     * streamed through the cache since the last block) */
    for (int64_t k0 = 0; k0 < cols; k0 += kb)
        for (int j = 0; j < WR; j++)
            for (int64_t k = k0; k < k0 + kb; k += 32, wq += 32) {
                __m256i v;
                if (bits == 4) { /* 16 bytes -> 32 codes: low and high nibbles interleaved */
                    __m256i b =
                        _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(rows[j] + k / 2)));
                    v = _mm256_and_si256(_mm256_or_si256(b, _mm256_slli_epi16(b, 4)), low4);
                } else {
                    v = _mm256_loadu_si256((const __m256i *)(rows[j] + k));
                }
                _mm256_store_si256((__m256i *)wq, v);
            }
}

void kiln_scales_f32_avx512(const void *p, kiln_dtype dt, int64_t i, int64_t n, float *out) {
    for (int64_t g = 0; g < n; g += 16)
        _mm512_mask_storeu_ps(out + g, tail_mask(n - g), load_groups16(p, dt, i + g, n - g));
}

/* A zero accumulator of its own: accumulators all set from one (CSE'd) zero value would have to
 * be copied apart before the first tied vpdpbusd. */
static ALWAYS_INLINE __m512i zero_acc(void) {
    __m512i z;
    __asm__ volatile("vpxord %0, %0, %0" : "=v"(z));
    return z;
}

/* One digit pass of 6 weight rows over a block: for kq steps of 4 codes, acc[j][v] +=
 * vpdpbusd(broadcast dword of row j, x line v), row j at w + j*KB, x lines XP dwords apart.
 * The whole loop is one asm statement because GCC 12 does not keep a tile's tied vpdpbusd
 * accumulators in place across a loop: depending on the variant it copies every accumulator per
 * step or spills them (the intrinsics' instructions are the same). 12 "+v" accumulators and 3
 * "+r" pointers are GCC's limit of 30 operands; KB is spelled into the displacements (an "i"
 * operand would not fit, nor work unoptimized). zmm29-31 are scratch. */
#define QX_ROW(J, KB, A0, A1)                                                                      \
    "vpbroadcastd " #J "*" #KB "(%[w]), %%zmm29\n\t"                                               \
    "vpdpbusd %%zmm30, %%zmm29, %" #A0 "\n\t"                                                      \
    "vpdpbusd %%zmm31, %%zmm29, %" #A1 "\n\t"
#define QX_LOOP_FN(NAME, ROWS, ...)                                                                \
    static ALWAYS_INLINE void NAME(__m512i(*acc)[2], const int8_t *x, const uint8_t *w,            \
                                   int64_t kq) {                                                   \
        __asm__("1:\n\t"                                                                           \
                "vmovdqa64 (%[x]), %%zmm30\n\t"                                                    \
                "vmovdqa64 64(%[x]), %%zmm31\n\t" ROWS "sub $-128, %[x]\n\t"                       \
                "add $4, %[w]\n\t"                                                                 \
                "dec %[n]\n\t"                                                                     \
                "jnz 1b\n\t"                                                                       \
                : __VA_ARGS__, [x] "+r"(x), [w] "+r"(w), [n] "+r"(kq)                              \
                :                                                                                  \
                : "zmm29", "zmm30", "zmm31", "cc", "memory");                                      \
    }
QX_LOOP_FN(qx_loop6_64,
           QX_ROW(0, 64, 0, 1) QX_ROW(1, 64, 2, 3) QX_ROW(2, 64, 4, 5) QX_ROW(3, 64, 6, 7)
               QX_ROW(4, 64, 8, 9) QX_ROW(5, 64, 10, 11),
           "+v"(acc[0][0]), "+v"(acc[0][1]), "+v"(acc[1][0]), "+v"(acc[1][1]), "+v"(acc[2][0]),
           "+v"(acc[2][1]), "+v"(acc[3][0]), "+v"(acc[3][1]), "+v"(acc[4][0]), "+v"(acc[4][1]),
           "+v"(acc[5][0]), "+v"(acc[5][1]))
QX_LOOP_FN(qx_loop6_32,
           QX_ROW(0, 32, 0, 1) QX_ROW(1, 32, 2, 3) QX_ROW(2, 32, 4, 5) QX_ROW(3, 32, 6, 7)
               QX_ROW(4, 32, 8, 9) QX_ROW(5, 32, 10, 11),
           "+v"(acc[0][0]), "+v"(acc[0][1]), "+v"(acc[1][0]), "+v"(acc[1][1]), "+v"(acc[2][0]),
           "+v"(acc[2][1]), "+v"(acc[3][0]), "+v"(acc[3][1]), "+v"(acc[4][0]), "+v"(acc[4][1]),
           "+v"(acc[5][0]), "+v"(acc[5][1]))

/* ACC += one digit pass over a block (kq >= 1 steps against x lines XD and the block's packed
 * rows WQ; R = 6 or 12 rows of KB codes). */
#define QX_PASS(ACC, XD, WQ, KQ, KB, R)                                                            \
    _Pragma("GCC unroll 2") for (int h_ = 0; h_ < (R); h_ += 6) {                                  \
        if ((KB) == 64)                                                                            \
            qx_loop6_64(ACC + h_, (XD), (WQ) + h_ * (KB), (KQ));                                   \
        else                                                                                       \
            qx_loop6_32(ACC + h_, (XD), (WQ) + h_ * (KB), (KQ));                                   \
    }
#define QX_SHIFT7(ACC, R)                                                                          \
    _Pragma("GCC unroll 16") for (int j = 0; j < (R); j++)                                         \
        _Pragma("GCC unroll 4") for (int v = 0; v < XV; v++) ACC[j][v] =                           \
            _mm512_slli_epi32(ACC[j][v], 7)

/* c[j*XP + i] (+)= s_j * dx_i * F (+ b_j * xs_i at a group's end) for j < R: the per-block
 * epilogue, F the block's lane sums as f32 (one chain, or digit 0 * 2^14 + the other chain). */
static ALWAYS_INLINE void qx_epilogue(float *c, const float *dxp, const float *xs, const float *sc,
                                      const float *bi, int64_t ldsc, int64_t g, bool group_end,
                                      const __m512i (*acc)[KILN_GEMM_XP / 16],
                                      const __m512i (*acc0)[KILN_GEMM_XP / 16], const int R) {
    enum { XP = KILN_GEMM_XP, XV = KILN_GEMM_XP / 16 };
    __m512 dx[XV];
    _Pragma("GCC unroll 4") for (int v = 0; v < XV; v++) dx[v] = _mm512_load_ps(dxp + 16 * v);
    _Pragma("GCC unroll 16") for (int j = 0; j < R; j++) {
        const __m512 s = _mm512_set1_ps(sc[j * ldsc + g]);
        _Pragma("GCC unroll 4") for (int v = 0; v < XV; v++) {
            __m512 f = _mm512_cvtepi32_ps(acc[j][v]);
            if (acc0)
                f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc0[j][v]), _mm512_set1_ps(16384.0f), f);
            __m512 cv = _mm512_loadu_ps(c + j * XP + 16 * v);
            cv = _mm512_fmadd_ps(f, _mm512_mul_ps(s, dx[v]), cv);
            if (group_end)
                cv = _mm512_fmadd_ps(_mm512_set1_ps(bi[j * ldsc + g]),
                                     _mm512_load_ps(xs + g * XP + 16 * v), cv);
            _mm512_storeu_ps(c + j * XP + 16 * v, cv);
        }
    }
}

/* 4-bit codes: the 12 rows of wq in one pass per digit, one chain ((d0 << 7) + d1) << 7 + d2. */
static ALWAYS_INLINE void tile_qx4(int64_t cols, int gs, const int8_t *xd, const float *dxp,
                                   const float *xs, const uint8_t *wq, const float *sc,
                                   const float *bi, int64_t ldsc, float *c, const int KB) {
    enum { WR = KILN_GEMM_WR, XP = KILN_GEMM_XP, XV = KILN_GEMM_XP / 16, R = 12 };
    const int kb = KB;
    const int64_t blocks = cols / kb, kq = kb / 4;
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t k0 = b * kb;
        const int8_t *xb = xd + b * 3 * kq * XP * 4;
        const uint8_t *wb = wq + k0 * WR;
        __m512i acc[R][XV];
        _Pragma("GCC unroll 16") for (int j = 0; j < R; j++)
            _Pragma("GCC unroll 4") for (int v = 0; v < XV; v++) acc[j][v] = _mm512_setzero_si512();
        QX_PASS(acc, xb, wb, kq, KB, R)
        QX_SHIFT7(acc, R);
        QX_PASS(acc, xb + kq * XP * 4, wb, kq, KB, R)
        QX_SHIFT7(acc, R);
        QX_PASS(acc, xb + 2 * kq * XP * 4, wb, kq, KB, R)
        qx_epilogue(c, dxp + b * XP, xs, sc, bi, ldsc, k0 >> __builtin_ctz((unsigned)gs),
                    ((k0 + kb) & (gs - 1)) == 0, (const __m512i(*)[XV])acc, NULL, R);
    }
}

/* 8-bit codes: 6 rows (wq + 4*j) per pass; digit 0 in its own chain, (d1 << 7) + d2 in another. */
static ALWAYS_INLINE void tile_qx8(int64_t cols, int gs, const int8_t *xd, const float *dxp,
                                   const float *xs, const uint8_t *wq, const float *sc,
                                   const float *bi, int64_t ldsc, float *c, const int KB) {
    enum { WR = KILN_GEMM_WR, XP = KILN_GEMM_XP, XV = KILN_GEMM_XP / 16, R = 6 };
    const int kb = KB;
    const int64_t blocks = cols / kb, kq = kb / 4;
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t k0 = b * kb;
        const int8_t *xb = xd + b * 3 * kq * XP * 4;
        const uint8_t *wb = wq + k0 * WR;
        __m512i acc[R][XV], acc0[R][XV];
        _Pragma("GCC unroll 16") for (int j = 0; j < R; j++)
            _Pragma("GCC unroll 4") for (int v = 0; v < XV; v++) acc0[j][v] = zero_acc();
        QX_PASS(acc0, xb, wb, kq, KB, R)
        _Pragma("GCC unroll 16") for (int j = 0; j < R; j++)
            _Pragma("GCC unroll 4") for (int v = 0; v < XV; v++) acc[j][v] = zero_acc();
        QX_PASS(acc, xb + kq * XP * 4, wb, kq, KB, R)
        QX_SHIFT7(acc, R);
        QX_PASS(acc, xb + 2 * kq * XP * 4, wb, kq, KB, R)
        qx_epilogue(c, dxp + b * XP, xs, sc, bi, ldsc, k0 >> __builtin_ctz((unsigned)gs),
                    ((k0 + kb) & (gs - 1)) == 0, (const __m512i(*)[XV])acc,
                    (const __m512i(*)[XV])acc0, R);
    }
}

void kiln_tile_qx_avx512(int64_t cols, int kb, int gs, int bits, const int8_t *xd, const float *dxp,
                         const float *xs, const uint8_t *wq, const float *sc, const float *bi,
                         int64_t ldsc, float *c) {
    _Static_assert(KILN_GEMM_WR == 12 && KILN_GEMM_XP == 32, "qx tile shape");
    memset(c, 0, sizeof(float) * KILN_GEMM_WR * KILN_GEMM_XP);
    /* kb a compile-time constant: the 12 rows of a block sit at fixed offsets j*kb */
    if (bits == 4) {
        if (kb == 64)
            tile_qx4(cols, gs, xd, dxp, xs, wq, sc, bi, ldsc, c, 64);
        else
            tile_qx4(cols, gs, xd, dxp, xs, wq, sc, bi, ldsc, c, 32);
        return;
    }
    for (int h = 0; h < 12; h += 6) {
        if (kb == 64)
            tile_qx8(cols, gs, xd, dxp, xs, wq + h * 64, sc + h * ldsc, bi + h * ldsc, ldsc,
                     c + h * KILN_GEMM_XP, 64);
        else
            tile_qx8(cols, gs, xd, dxp, xs, wq + h * 32, sc + h * ldsc, bi + h * ldsc, ldsc,
                     c + h * KILN_GEMM_XP, 32);
    }
}
