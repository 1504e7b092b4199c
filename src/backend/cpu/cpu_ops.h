/* cpu_ops.h — the CPU kernels. Each op has a plain-C reference (`*_ref`, obviously correct, used by
 * tests as the oracle for every other backend) and a fast path chosen at run time from the CPU's
 * features (AVX2+FMA baseline, AVX-512 / AVX512-BF16 / VNNI where present). Fast paths are
 * multithreaded through the pool passed in (NULL = single thread). All activations are f32;
 * accumulation is f32. Shapes: n = tokens (rows of x), leading dims are contiguous. */
#ifndef KILN_BACKEND_CPU_OPS_H
#define KILN_BACKEND_CPU_OPS_H

#include "backend/matrix.h"
#include "util/threadpool.h"

#include <stdbool.h>
#include <stdint.h>

/* Which SIMD level the fast paths use: "avx512-bf16", "avx512", "avx2", "scalar". */
const char *kiln_cpu_simd_name(void);
/* Forces a level (tests, benchmarks): "scalar", "avx2", "avx512" or NULL for auto. Returns 0 if
 * the CPU supports it. */
int kiln_cpu_simd_force(const char *level);

/* Matmul mode: "exact" (default: f32 activations, matches the reference to ~1e-6) or "fast"
 * (decode GEMV quantizes activations to int8 in blocks of 16 for 4/8-bit weights and rounds them
 * to bf16 for bf16 weights; prefill GEMM rounds x and the weights to bf16 and runs vdpbf16ps;
 * AVX512-VNNI / AVX512-BF16; ~1e-3 relative error). NULL
 * re-reads env KILN_MATMUL. Returns 0, or -1 for an unknown name. Fast needs the AVX-512 level
 * and a CPU with VNNI and BF16; elsewhere the exact kernels run. */
int kiln_cpu_matmul_mode_set(const char *mode);
/* The mode in effect for the active SIMD level: "exact" or "fast". */
const char *kiln_cpu_matmul_mode(void);

/* y[n, w->rows] = x[n, w->cols] @ W^T (+ w->bias). Any kiln_matrix format. */
void kiln_cpu_matmul(kiln_threadpool *pool, float *y, const float *x, int64_t n,
                     const kiln_matrix *w);
void kiln_cpu_matmul_ref(float *y, const float *x, int64_t n, const kiln_matrix *w);

/* out[n, w->cols] = rows ids[i] of W, dequantized / converted to f32 (embedding lookup). */
void kiln_cpu_embed(float *out, const int32_t *ids, int64_t n, const kiln_matrix *w);

/* y[n, dim] = x * rsqrt(mean(x^2) + eps) * (w or 1+w); w f32 [dim] or NULL (no weight). */
void kiln_cpu_rmsnorm(float *y, const float *x, const float *w, int64_t n, int64_t dim, float eps,
                      bool plus_one);
void kiln_cpu_rmsnorm_ref(float *y, const float *x, const float *w, int64_t n, int64_t dim,
                          float eps, bool plus_one);

/* Rotary embedding in place on x[n, n_heads, head_dim]; the first rot_dim dims of each head are
 * rotated in "half" (neox / HF rotate_half) layout: pairs (i, i + rot_dim/2) with angle
 * pos[t] * inv_freq[i], i < rot_dim/2. */
void kiln_cpu_rope(float *x, const int32_t *pos, int64_t n, int n_heads, int head_dim, int rot_dim,
                   const float *inv_freq);

/* y[i] = silu(gate[i]) * up[i] over n elements (SwiGLU). y may alias gate. */
void kiln_cpu_silu_mul(float *y, const float *gate, const float *up, int64_t n);
/* y[i] = gelu_tanh(gate[i]) * up[i] (GeGLU, tanh approximation). */
void kiln_cpu_gelu_tanh_mul(float *y, const float *gate, const float *up, int64_t n);
/* y[i] = a[i] + b[i]. y may alias a. */
void kiln_cpu_add(float *y, const float *a, const float *b, int64_t n);
/* x[i] *= s */
void kiln_cpu_scale(float *x, float s, int64_t n);
/* Dot product of two f32 vectors (attention inner loop). */
float kiln_cpu_dot(const float *a, const float *b, int64_t n);
/* y[i] += a * x[i] (attention value accumulation). */
void kiln_cpu_axpy(float *y, float a, const float *x, int64_t n);
/* out[i] = kiln_cpu_dot(a, rows + i*stride, n) for i < count, bit for bit (attention scores). */
void kiln_cpu_dot_rows(float *out, const float *a, const float *rows, int64_t stride, int64_t count,
                       int64_t n);
/* kiln_cpu_axpy(y, coef[i], rows + i*stride, n) for i = 0, 1, .., count-1 in that order, bit for
 * bit (attention value sums; y stays in registers across the rows). */
void kiln_cpu_axpy_rows(float *y, const float *coef, const float *rows, int64_t stride,
                        int64_t count, int64_t n);
/* In-place softmax over x[n]; returns nothing. */
void kiln_cpu_softmax(float *x, int64_t n);

#endif
