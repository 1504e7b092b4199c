/* mlx_quant.h — MLX affine quantization of weight rows: quantize (for `kiln convert`), pack and
 * unpack codes of 2..8 bits in MLX's bit-stream layout (see backend/matrix.h), dequantize. */
#ifndef KILN_FORMAT_MLX_QUANT_H
#define KILN_FORMAT_MLX_QUANT_H

#include "backend/matrix.h"
#include "kiln.h"

/* Is (bits, group_size) a supported combination (bits 2..8, group 32/64/128)? */
bool kiln_quant_supported(int bits, int group_size);

/* Reads code j of a packed row. */
uint32_t kiln_quant_get_code(const uint32_t *row_words, int64_t j, int bits);
/* Writes code j of a packed row (row must be zeroed first). */
void kiln_quant_set_code(uint32_t *row_words, int64_t j, int bits, uint32_t code);

/* Quantizes W[rows, cols] (f32) as MLX does (mlx.core.quantize, affine mode): per group
 * scale = (max-min)/(2^bits-1) with the sign/edge handling of MLX, bias = min (rounded as MLX
 * rounds it), codes = round((w-bias)/scale) clamped. Outputs: words [rows, cols*bits/32],
 * scales/biases [rows, cols/group] in scale_dtype (F16 or BF16). */
kiln_status kiln_quant_quantize(const float *w, int64_t rows, int64_t cols, int bits,
                                int group_size, kiln_dtype scale_dtype, uint32_t *words,
                                void *scales, void *biases);

/* Dequantizes rows [r0, r0+n) of a quantized matrix into out[n, cols] (f32). */
void kiln_quant_dequantize_rows(const kiln_matrix *m, int64_t r0, int64_t n, float *out);

#endif
