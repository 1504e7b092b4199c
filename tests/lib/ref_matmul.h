/* ref_matmul.h — the plain-C matmul reference (kiln_cpu_matmul_ref) split by rows over threads,
 * for tests that check hundreds of large device matmuls against it. */
#pragma once
#include "backend/matrix.h"

#include <stdint.h>

/* y [n, w->rows] = x [n, w->cols] @ w^T (+ bias), the same bits as kiln_cpu_matmul_ref (each
 * element is its own sum); threads only when the product is large. */
void ref_matmul(float *y, const float *x, int64_t n, const kiln_matrix *w);
