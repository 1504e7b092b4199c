/* cpu_internal.h — what the CPU kernel files share among themselves (not a public interface):
 * the SIMD level chosen at run time, the matmul mode (exact / fast), helpers to read quantized
 * codes and group scales, and the per-level matmul building blocks that cpu_matmul.c drives:
 *   decode  : one weight row segment -> f32 (dense convert or s*q+b dequantize)
 *   prepare : the activations of one GEMV call, rearranged once before the rows are split
 *             (per-group sums of x, x in the level's decode order, int8 / bf16 x in fast mode)
 *   gemv    : y[n<=4, r0..r1) for a range of weight rows, weights streamed once (decode path)
 *   tile    : an MR x NR micro-tile c += x[MR, kc] @ wp[kc, NR] on a packed f32 weight block.
 * Invariants the callers keep: for quantized matrices k0 and len are multiples of group_size. */
#ifndef KILN_BACKEND_CPU_INTERNAL_H
#define KILN_BACKEND_CPU_INTERNAL_H

#include "backend/matrix.h"
#include "util/half.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kiln_simd_level {
    KILN_SIMD_SCALAR = 0,
    KILN_SIMD_AVX2 = 1,   /* AVX2 + FMA + F16C */
    KILN_SIMD_AVX512 = 2, /* AVX-512 F/BW/VL/DQ */
} kiln_simd_level;

kiln_simd_level kiln_cpu_simd_level(void);

/* True when GEMV may use the approximate VNNI / BF16 kernels: mode "fast" (env KILN_MATMUL or
 * kiln_cpu_matmul_mode_set), the AVX-512 level active and the CPU has AVX512-VNNI and -BF16. */
bool kiln_cpu_matmul_fast_active(void);

/* True when the CPU has AVX512-VNNI (cached): the exact 4/8-bit GEMV then runs on x split into
 * three int8 parts (vpdpbusd); without it, on the f32 dequantizing kernel. */
bool kiln_cpu_has_vnni(void);

/* The panel GEMM (levels with a tile_t kernel): x is transposed once per call into panels of
 * XP rows ([cols][XP] f32, zero rows past n), each weight row is decoded to f32 once per call, and
 * a WR x XP tile c[j][i] = W[r0 + j, :] . x[p*XP + i, :] runs over the full depth (WR broadcasts of
 * weights against XP/16 vectors of x per k: 2*WR FMAs for WR + 2 loads). */
#define KILN_GEMM_XP 32
#define KILN_GEMM_WR 12
/* n at or below this runs the GEMV (decode) path. */
#define KILN_GEMV_MAX_N 4
/* n up to this runs as ceil(n / KILN_GEMV_MAX_N) GEMV passes instead of the blocked GEMM. */
#define KILN_GEMV_CHUNKED_MAX_N 16

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

/* Scratch carving for prepare: returns the next 64-byte aligned block of `bytes` (advancing *off);
 * base == NULL only counts. */
static inline void *kiln_scratch_take(void *base, size_t *off, size_t bytes) {
    void *p = base ? (char *)base + *off : NULL;
    *off += (bytes + 63) & ~(size_t)63;
    return p;
}

/* out[i*groups + g] = sum of x[i, g*gs .. (g+1)*gs) (f32, 8 partial sums per group). */
static inline void kiln_group_sums(const float *x, int n, int64_t cols, int64_t gs, float *out) {
    int64_t groups = cols / gs;
    for (int i = 0; i < n; i++)
        for (int64_t g = 0; g < groups; g++) {
            const float *xg = x + i * cols + g * gs;
            float part[8] = {0};
            for (int64_t k = 0; k < gs; k += 8)
                for (int u = 0; u < 8; u++) part[u] += xg[k + u];
            out[i * groups + g] = ((part[0] + part[1]) + (part[2] + part[3])) +
                                  ((part[4] + part[5]) + (part[6] + part[7]));
        }
}

/* out[len] = W[r, k0 .. k0+len) as f32. */
typedef void (*kiln_decode_fn)(const kiln_matrix *w, int64_t r, int64_t k0, int64_t len,
                               float *out);
/* The activations of one GEMV call as a level's gemv reads them, filled by its prepare. Pointers
 * a level does not use stay NULL. Rows i < n of each array are contiguous ([n][len]). */
typedef struct kiln_gemv_x {
    const float *x; /* [n, cols] as given */
    int n;
    const float *xp;    /* [n, cols] x permuted to the level's code order (exact 4-bit, bf16) */
    const float *xsum;  /* [n, groups] sum of x over each weight group (quantized) */
    bool fast;          /* the VNNI / BF16 kernels below are in use */
    const int8_t *xq;   /* int8 x: [n][parts][cols + pad] in the code order (see xq_parts) */
    const float *xdl;   /* int8 x: [n, lanes + pad] scale of each 32-bit lane's x block */
    const uint16_t *xb; /* fast bf16: [n, cols] x rounded to bf16 */
    int xq_parts;       /* 1: fast, x ~ dx*q0; 3: exact split, x ~ dx*(q0*2^14 + q1*2^7 + q2) */
    int64_t xq_part;    /* elements from one part of a row of xq to the next */
    int64_t xq_stride;  /* elements per row of xq (xq_parts * xq_part) */
    int64_t xdl_stride; /* elements per row of xdl (and of xc) */
    const int32_t *xc;  /* AVX2 fast 8-bit: [n, cols/4] 128 * the sum of each 4-code lane's xq */
} kiln_gemv_x;

/* Fills *px for x[n, w->cols] using scratch; with scratch == NULL only returns the bytes of
 * scratch needed (64-byte aligned scratch). */
typedef size_t (*kiln_gemv_prepare_fn)(const kiln_matrix *w, const float *x, int n, bool fast,
                                       kiln_gemv_x *px, void *scratch);
/* For rows r in [r0, r1) and i < px->n (n <= KILN_GEMV_MAX_N): y[i*ldy + r] = x[i, :] . W[r, :]
 * (no output bias; the driver adds it). */
typedef void (*kiln_gemv_fn)(const kiln_matrix *w, const kiln_gemv_x *px, float *y, int64_t ldy,
                             int64_t r0, int64_t r1);
/* c[j*XP + i] = sum_k wd[j*ldw + k] * xt[k*XP + i], j < WR, i < XP, k < cols (overwrites c). */
typedef void (*kiln_tile_t_fn)(int64_t cols, const float *xt, const float *wd, int64_t ldw,
                               float *c);

typedef struct kiln_cpu_kernels {
    kiln_decode_fn decode;
    kiln_gemv_prepare_fn prepare;
    kiln_gemv_fn gemv;
    float (*dot)(const float *a, const float *b, int64_t n);
    void (*axpy)(float *y, float a, const float *x, int64_t n);
    kiln_tile_t_fn tile_t; /* NULL: GEMV passes */
    /* Many dots / axpys in one call, bit for bit what dot / axpy give row by row (NULL: that
     * loop): the attention inner loops. */
    void (*dot_rows)(float *out, const float *a, const float *rows, int64_t stride, int64_t count,
                     int64_t n);
    void (*axpy_rows)(float *y, const float *coef, const float *rows, int64_t stride, int64_t count,
                      int64_t n);
    /* The panel GEMM's x transpose and tile store with register transposes (NULL: scalar loops):
     * xt[k*XP + i] = x[i*cols + k] for i < np (0 for np <= i < XP); y[i*ldy + j] = c[j*XP + i]
     * (+ bias[j]) for i < np, j < nr. */
    void (*pack_x)(const float *x, int64_t np, int64_t cols, float *xt);
    void (*store_tile)(const float *c, int64_t np, int64_t nr, const float *bias, float *y,
                       int64_t ldy);
    /* out[i] = the f16 / bf16 in[i] as f32, i < n (NULL: the scalar conversion of util/half.h;
     * conversions are exact, so every level gives the same floats): f16 / bf16 KV rows. */
    void (*f16_to_f32)(const uint16_t *in, int64_t n, float *out);
    void (*bf16_to_f32)(const uint16_t *in, int64_t n, float *out);
    /* x[i] = exp(x[i] - shift), returns their sum (NULL: expf and a running sum in order): the
     * attention softmax. */
    float (*exp_sum)(float *x, int64_t n, float shift);
    /* y[i] = silu(gate[i]) * up[i] (NULL: kiln_cpu_silu_mul_ref). */
    void (*silu_mul)(float *y, const float *gate, const float *up, int64_t n);
} kiln_cpu_kernels;

/* The kernels of the active level. */
const kiln_cpu_kernels *kiln_cpu_kernels_active(void);

/* Per-level implementations (the AVX ones live in files built with those ISA flags). */
void kiln_decode_scalar(const kiln_matrix *w, int64_t r, int64_t k0, int64_t len, float *out);
size_t kiln_gemv_prepare_scalar(const kiln_matrix *w, const float *x, int n, bool fast,
                                kiln_gemv_x *px, void *scratch);
void kiln_gemv_scalar(const kiln_matrix *w, const kiln_gemv_x *px, float *y, int64_t ldy,
                      int64_t r0, int64_t r1);
void kiln_tile_t_scalar(int64_t cols, const float *xt, const float *wd, int64_t ldw, float *c);
float kiln_dot_scalar(const float *a, const float *b, int64_t n);
void kiln_axpy_scalar(float *y, float a, const float *x, int64_t n);

void kiln_decode_avx2(const kiln_matrix *w, int64_t r, int64_t k0, int64_t len, float *out);
size_t kiln_gemv_prepare_avx2(const kiln_matrix *w, const float *x, int n, bool fast,
                              kiln_gemv_x *px, void *scratch);
void kiln_gemv_avx2(const kiln_matrix *w, const kiln_gemv_x *px, float *y, int64_t ldy, int64_t r0,
                    int64_t r1);
void kiln_tile_t_avx2(int64_t cols, const float *xt, const float *wd, int64_t ldw, float *c);
void kiln_pack_x_avx2(const float *x, int64_t np, int64_t cols, float *xt);
void kiln_store_tile_avx2(const float *c, int64_t np, int64_t nr, const float *bias, float *y,
                          int64_t ldy);
float kiln_dot_avx2(const float *a, const float *b, int64_t n);
void kiln_axpy_avx2(float *y, float a, const float *x, int64_t n);
float kiln_exp_sum_avx2(float *x, int64_t n, float shift);
void kiln_silu_mul_avx2(float *y, const float *gate, const float *up, int64_t n);
void kiln_f16_to_f32_avx2(const uint16_t *in, int64_t n, float *out);
void kiln_bf16_to_f32_avx2(const uint16_t *in, int64_t n, float *out);
void kiln_dot_rows_avx2(float *out, const float *a, const float *rows, int64_t stride,
                        int64_t count, int64_t n);
void kiln_axpy_rows_avx2(float *y, const float *coef, const float *rows, int64_t stride,
                         int64_t count, int64_t n);

void kiln_decode_avx512(const kiln_matrix *w, int64_t r, int64_t k0, int64_t len, float *out);
size_t kiln_gemv_prepare_avx512(const kiln_matrix *w, const float *x, int n, bool fast,
                                kiln_gemv_x *px, void *scratch);
void kiln_gemv_avx512(const kiln_matrix *w, const kiln_gemv_x *px, float *y, int64_t ldy,
                      int64_t r0, int64_t r1);
void kiln_tile_t_avx512(int64_t cols, const float *xt, const float *wd, int64_t ldw, float *c);
float kiln_dot_avx512(const float *a, const float *b, int64_t n);
void kiln_axpy_avx512(float *y, float a, const float *x, int64_t n);
/* Fast mode (AVX512-BF16) panel GEMM pieces (bf16 weights with an even number of columns read in
 * place, quantized ones decoded and rounded to bf16 first, f32_to_bf16 = round to nearest even):
 * xt[kk*XP + i] = the bf16 pair (x[i, 2kk], x[i, 2kk+1]) (rounded to nearest even) for the np <= XP
 * rows of one panel, zero pairs for rows past np; then c[j*XP + i] = sum over kk of vdpbf16ps of
 * W[j] and x[i] pairs, j < WR (rows past nrows read row 0 and are discarded by the caller). */
void kiln_pack_x_bf16_avx512(const float *x, int64_t np, int64_t cols, uint32_t *xt);
/* y[i*ldy + j] = c[j*XP + i] (+ bias[j]) for i < np, j < nr: a panel tile into y's rows. */
void kiln_store_tile_avx512(const float *c, int64_t np, int64_t nr, const float *bias, float *y,
                            int64_t ldy);
/* One x panel for the panel GEMM: xt[k*XP + i] = x[i, k] (i < np <= XP, zero rows past np). */
void kiln_pack_x_avx512(const float *x, int64_t np, int64_t cols, float *xt);
void kiln_f32_to_bf16_avx512(const float *src, int64_t n, uint16_t *dst);
void kiln_tile_bf16_avx512(int64_t pairs, const uint32_t *xt, const uint16_t *const *wrows,
                           float *c);
/* Exact VNNI panel GEMM for 4/8-bit weights (AVX512-VNNI; see cpu_kernels_avx512.c). pack_xq:
 * one panel of np <= XP tokens of x[., cols] split into three int8 digits per block of kb
 * elements (xd: [blocks][3][kb/4][XP] dwords; dxp: [blocks][XP] the block's max|x|/127/2^14, zero
 * past np). pack_wq: WR weight rows from codes (rows row_bytes apart, nr <= WR of them; the rest
 * repeat row 0) as wq[cols/kb][WR][kb], one byte per code. tile_qx: c[j*XP + i] = W[row j] . x[i]
 * for the WR rows of wq, with sc / bi the rows' group scales and biases as f32 ([WR][ldsc]) and
 * xs the panel's group sums of x ([groups][XP]). kb divides gs, kb is 32 or 64. */
void kiln_pack_xq_avx512(const float *x, int64_t np, int64_t cols, int kb, int8_t *xd, float *dxp);
void kiln_pack_wq_avx512(const uint8_t *codes, int64_t row_bytes, int64_t nr, int64_t cols,
                         int bits, int kb, uint8_t *wq);
/* out[t] = group value p[i + t] (f16 / bf16 / f32) as f32, t < n. */
void kiln_scales_f32_avx512(const void *p, kiln_dtype dt, int64_t i, int64_t n, float *out);
void kiln_tile_qx_avx512(int64_t cols, int kb, int gs, int bits, const int8_t *xd, const float *dxp,
                         const float *xs, const uint8_t *wq, const float *sc, const float *bi,
                         int64_t ldsc, float *c);
void kiln_dot_rows_avx512(float *out, const float *a, const float *rows, int64_t stride,
                          int64_t count, int64_t n);
void kiln_axpy_rows_avx512(float *y, const float *coef, const float *rows, int64_t stride,
                           int64_t count, int64_t n);

#endif
