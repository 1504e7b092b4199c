/* matrix.c — size accounting and row views of kiln_matrix. */
#include "backend/matrix.h"

int64_t kiln_matrix_bytes(const kiln_matrix *m) {
    if (kiln_matrix_is_quantized(m)) {
        int64_t groups = m->rows * (m->cols / m->group_size);
        return m->rows * kiln_matrix_row_code_bytes(m) +
               2 * groups * (int64_t)kiln_dtype_size(m->scale_dtype);
    }
    return m->rows * m->cols * (int64_t)kiln_dtype_size(m->dtype);
}

kiln_matrix kiln_matrix_rows(const kiln_matrix *m, int64_t r0, int64_t n) {
    kiln_matrix v = *m;
    v.rows = n;
    if (kiln_matrix_is_quantized(m)) {
        int64_t gpr = m->cols / m->group_size;
        size_t ss = kiln_dtype_size(m->scale_dtype);
        v.data = (const uint8_t *)m->data + r0 * kiln_matrix_row_code_bytes(m);
        v.scales = (const uint8_t *)m->scales + r0 * gpr * (int64_t)ss;
        v.biases = (const uint8_t *)m->biases + r0 * gpr * (int64_t)ss;
    } else {
        v.data = (const uint8_t *)m->data + r0 * m->cols * (int64_t)kiln_dtype_size(m->dtype);
    }
    if (m->bias) v.bias = m->bias + r0;
    return v;
}
