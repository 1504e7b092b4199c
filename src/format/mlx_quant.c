/* mlx_quant.c — MLX affine quantization: codes packed as one little-endian bit stream per row
 * (code j at bit j*bits; for 3/5/6 bits MLX's byte packs of 8 codes in 3/5 bytes and 4 codes in
 * 3 bytes are exactly this stream), quantize as mlx.core.quantize does on the CPU, dequantize.
 *
 * Affine quantize, per group of group_size values, as mlx-lm wrote the team's fixtures (checked
 * bit-exact against the shared fixtures <family>-mlx-q4g32 and -q8g64):
 *   scale = max((max - min) / (2^bits - 1), 1e-7) in f32, then rounded to the scale dtype; a
 *           constant group (max == min, e.g. an all-zero padding row) gets scale 1;
 *   bias  = min, rounded to the scale dtype;
 *   code  = clamp(rint((w - bias) / scale), 0, 2^bits - 1) in f32 with the ROUNDED scale/bias.
 * (Recent MLX releases instead anchor the zero point: they negate the scale unless |min| > |max|,
 * take edge = min or max accordingly and, when q0 = rint(edge/scale) != 0, use scale = edge/q0 and
 * bias = edge. Those codes differ from the fixtures' in ~60% of places, so kiln follows the
 * fixtures; both decode with the same w = scale*code + bias.) */
#include "format/mlx_quant.h"

#include "util/half.h"
#include "util/status.h"

#include <math.h>
#include <string.h>

bool kiln_quant_supported(int bits, int group_size) {
    return bits >= 2 && bits <= 8 && (group_size == 32 || group_size == 64 || group_size == 128);
}

uint32_t kiln_quant_get_code(const uint32_t *row_words, int64_t j, int bits) {
    const uint8_t *bytes = (const uint8_t *)row_words; /* words are little-endian on disk */
    int64_t bit = j * bits;
    int shift = (int)(bit & 7);
    uint32_t v = bytes[bit >> 3];
    if (shift + bits > 8) v |= (uint32_t)bytes[(bit >> 3) + 1] << 8;
    return (v >> shift) & ((1u << bits) - 1u);
}

void kiln_quant_set_code(uint32_t *row_words, int64_t j, int bits, uint32_t code) {
    uint8_t *bytes = (uint8_t *)row_words;
    int64_t bit = j * bits;
    int shift = (int)(bit & 7);
    uint32_t v = (code & ((1u << bits) - 1u)) << shift;
    bytes[bit >> 3] |= (uint8_t)(v & 0xffu);
    if (shift + bits > 8) bytes[(bit >> 3) + 1] |= (uint8_t)(v >> 8);
}

static void store_scale(void *dst, kiln_dtype dt, int64_t i, float v) {
    switch (dt) {
    case KILN_DT_F16:
        ((uint16_t *)dst)[i] = kiln_f32_to_f16(v);
        break;
    case KILN_DT_BF16:
        ((uint16_t *)dst)[i] = kiln_f32_to_bf16(v);
        break;
    default:
        ((float *)dst)[i] = v;
        break;
    }
}

static float load_scale(const void *src, kiln_dtype dt, int64_t i) {
    switch (dt) {
    case KILN_DT_F16:
        return kiln_f16_to_f32(((const uint16_t *)src)[i]);
    case KILN_DT_BF16:
        return kiln_bf16_to_f32(((const uint16_t *)src)[i]);
    default:
        return ((const float *)src)[i];
    }
}

kiln_status kiln_quant_quantize(const float *w, int64_t rows, int64_t cols, int bits,
                                int group_size, kiln_dtype scale_dtype, uint32_t *words,
                                void *scales, void *biases) {
    if (!kiln_quant_supported(bits, group_size))
        return kiln_error(KILN_ERR_UNSUPPORTED, "quantize: %d bits with group size %d", bits,
                          group_size);
    if (rows < 0 || cols <= 0 || cols % group_size != 0)
        return kiln_error(KILN_ERR_INVALID_ARG,
                          "quantize: %lld columns is not a multiple of the group size %d",
                          (long long)cols, group_size);
    if (scale_dtype != KILN_DT_F16 && scale_dtype != KILN_DT_BF16 && scale_dtype != KILN_DT_F32)
        return kiln_error(KILN_ERR_UNSUPPORTED, "quantize: scales in %s",
                          kiln_dtype_name(scale_dtype));
    const float n_bins = (float)((1 << bits) - 1);
    const float min_scale = 1e-7f;
    const int64_t words_per_row = cols * bits / 32, groups_per_row = cols / group_size;
    for (int64_t r = 0; r < rows; r++) {
        uint32_t *row_words = words + r * words_per_row;
        memset(row_words, 0, (size_t)words_per_row * sizeof *row_words);
        for (int64_t g = 0; g < groups_per_row; g++) {
            const float *v = w + r * cols + g * group_size;
            float lo = INFINITY, hi = -INFINITY;
            for (int j = 0; j < group_size; j++) {
                lo = fminf(lo, v[j]);
                hi = fmaxf(hi, v[j]);
            }
            int64_t gi = r * groups_per_row + g;
            store_scale(scales, scale_dtype, gi,
                        hi > lo ? fmaxf((hi - lo) / n_bins, min_scale) : 1.0f);
            store_scale(biases, scale_dtype, gi, lo);
            float scale = load_scale(scales, scale_dtype, gi);
            float bias = load_scale(biases, scale_dtype, gi);
            for (int j = 0; j < group_size; j++) {
                float q = rintf((v[j] - bias) / scale);
                q = fminf(fmaxf(q, 0.0f), n_bins);
                kiln_quant_set_code(row_words, g * group_size + j, bits, (uint32_t)q);
            }
        }
    }
    return KILN_OK;
}

void kiln_quant_dequantize_rows(const kiln_matrix *m, int64_t r0, int64_t n, float *out) {
    const int64_t groups_per_row = m->cols / m->group_size;
    const int64_t row_bytes = kiln_matrix_row_code_bytes(m);
    for (int64_t i = 0; i < n; i++) {
        int64_t r = r0 + i;
        const uint32_t *row_words = (const uint32_t *)((const uint8_t *)m->data + r * row_bytes);
        for (int64_t c = 0; c < m->cols; c++) {
            int64_t g = r * groups_per_row + c / m->group_size;
            float s = load_scale(m->scales, m->scale_dtype, g);
            float b = load_scale(m->biases, m->scale_dtype, g);
            out[i * m->cols + c] = s * (float)kiln_quant_get_code(row_words, c, m->bits) + b;
        }
    }
}
