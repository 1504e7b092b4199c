/* matrix.h — a weight matrix as the model file stores it: dense (f32/f16/bf16) or MLX affine
 * quantized (packed uint32 codes + per-group scales and biases). Kernels read it in place.
 *
 * Quantized layout (mlx-lm): row r of W[rows=out, cols=in] is a little-endian bit stream of
 * cols codes of `bits` bits each (code j at bit offset j*bits of the row; for 2/4/8 bits that is
 * "element j of a word at bits j*b", for 3/5/6 bits codes straddle words exactly as MLX packs
 * them); the row occupies cols*bits/32 words. w[r][c] = scales[r][c/group] * code +
 * biases[r][c/group].
 */
#ifndef KILN_BACKEND_MATRIX_H
#define KILN_BACKEND_MATRIX_H

#include "format/dtype.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kiln_matrix {
    kiln_dtype dtype;       /* F32, F16, BF16 (dense) or U32 (affine quantized) */
    int64_t rows, cols;     /* logical [out, in] */
    const void *data;       /* dense: [rows, cols]; quantized: uint32 [rows, cols*bits/32] */
    int bits;               /* quantized only: 2..8 */
    int group_size;         /* quantized only: 32, 64, 128 */
    kiln_dtype scale_dtype; /* F16, BF16 or F32: dtype of scales and biases */
    const void *scales;     /* quantized only: [rows, cols/group_size] */
    const void *biases;     /* quantized only: [rows, cols/group_size] */
    const float *bias;      /* optional additive output bias [rows] (f32), NULL if none */
    bool view; /* rows of an allocation another matrix owns (upload_matrices): never freed */
} kiln_matrix;

static inline bool kiln_matrix_is_quantized(const kiln_matrix *m) {
    return m->dtype == KILN_DT_U32;
}

/* Bytes of packed codes per row: cols*bits/8. */
static inline int64_t kiln_matrix_row_code_bytes(const kiln_matrix *m) {
    return m->cols * m->bits / 8;
}

/* Total bytes this matrix occupies as stored (codes + scales + biases, or dense data). */
int64_t kiln_matrix_bytes(const kiln_matrix *m);

/* A view of rows [r0, r0+n) of m (used for stacked experts and fused projections). */
kiln_matrix kiln_matrix_rows(const kiln_matrix *m, int64_t r0, int64_t n);

#endif
