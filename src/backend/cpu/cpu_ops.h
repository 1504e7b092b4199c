/* cpu_ops.h — the CPU kernels. Each op has a plain-C reference (`*_ref`, obviously correct, used by
 * tests as the oracle for every other backend) and a fast path chosen at run time from the CPU's
 * features (AVX2+FMA baseline, AVX-512 / AVX512-BF16 / VNNI where present). Fast paths are
 * multithreaded through the pool passed in (NULL = single thread). All activations are f32;
 * accumulation is f32. Shapes: n = tokens (rows of x), leading dims are contiguous. */
#ifndef KILN_BACKEND_CPU_OPS_H
#define KILN_BACKEND_CPU_OPS_H

#include "backend/backend.h"
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
/* ys[m][n, ws[m]->rows] = x @ ws[m]^T for count matrices on one x: at decode sizes (n <= 4) with
 * matrices of one format, x is prepared once and one parallel loop runs all their rows (same
 * results bit for bit as one kiln_cpu_matmul each, which it falls back to otherwise). */
#define KILN_MATMUL_MULTI_MAX 8
void kiln_cpu_matmul_multi(kiln_threadpool *pool, int count, float *const *ys, const float *x,
                           int64_t n, const kiln_matrix *const *ws);
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

/* Residual add then RMSNorm, as one op: x[n, dim] += h, then y = rmsnorm(x) as kiln_cpu_rmsnorm. */
void kiln_cpu_add_rmsnorm(float *x, const float *h, float *y, const float *w, int64_t n,
                          int64_t dim, float eps, bool plus_one);

/* Post-norm residual as one op: h = rmsnorm(h) as kiln_cpu_rmsnorm (in place), x[n, dim] += h,
 * then x *= scale unless scale is 1. */
void kiln_cpu_norm_add(float *x, float *h, const float *w, int64_t n, int64_t dim, float eps,
                       bool plus_one, float scale);

/* The attention inputs' per-head steps as one op: q[n, n_heads, head_dim] and
 * k[n, n_kv_heads, head_dim] are RMSNorm'd per head with q_norm / k_norm [head_dim] (each skipped
 * when NULL), then rotated as kiln_cpu_rope. */
void kiln_cpu_qk_norm_rope(float *q, float *k, const int32_t *pos, int64_t n, int n_heads,
                           int n_kv_heads, int head_dim, int rot_dim, const float *inv_freq,
                           const float *q_norm, const float *k_norm, float eps);

/* y[i] = silu(gate[i]) * up[i] over n elements (SwiGLU). y may alias gate. The reference uses
 * expf; the AVX2 / AVX-512 levels the polynomial exp of exp_sum (within 1e-6 of it). */
void kiln_cpu_silu_mul(float *y, const float *gate, const float *up, int64_t n);
void kiln_cpu_silu_mul_ref(float *y, const float *gate, const float *up, int64_t n);
/* y[i] = gelu_tanh(gate[i]) * up[i] (GeGLU, tanh approximation). */
void kiln_cpu_gelu_tanh_mul(float *y, const float *gate, const float *up, int64_t n);
/* y[i] = a[i] + b[i]. y may alias a. */
void kiln_cpu_add(float *y, const float *a, const float *b, int64_t n);
/* x[i] *= s */
void kiln_cpu_scale(float *x, float s, int64_t n);
/* x[i] = cap * tanhf(x[i] / cap) (Gemma's logit soft-capping); cap > 0. */
void kiln_cpu_softcap(float *x, float cap, int64_t n);
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
/* out[i] = in[i] (IEEE half / bfloat16 bits) as f32 for i < n: exact, the same floats at every
 * level as kiln_f16_to_f32 / kiln_bf16_to_f32 of util/half.h (f16 / bf16 KV rows). */
void kiln_cpu_f16_to_f32(const uint16_t *in, int64_t n, float *out);
void kiln_cpu_bf16_to_f32(const uint16_t *in, int64_t n, float *out);
/* x[i] = exp(x[i] - shift) for i < n; returns the sum of the new x (the attention softmax's
 * numerators and denominator). The scalar level uses expf and sums in order (the reference,
 * kiln_cpu_exp_sum_ref); the AVX2 / AVX-512 levels a polynomial exp within 2 ulp of it and 8-lane
 * partial sums. One level gives the same floats for the same inputs (the paged and contiguous
 * attentions rely on it). */
float kiln_cpu_exp_sum(float *x, int64_t n, float shift);
float kiln_cpu_exp_sum_ref(float *x, int64_t n, float shift);
/* In-place softmax over x[n]; returns nothing. */
void kiln_cpu_softmax(float *x, int64_t n);

/* ---- hybrid (Gated DeltaNet) and MoE ops: each of these is its own plain-C reference ---- */

/* dst[r * dst_stride + c] = src[r * src_stride + c] for r < rows, c < cols (strided block copy:
 * splits and interleaves of projection outputs). dst and src must not overlap. */
void kiln_cpu_copy2d(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                     int64_t rows, int64_t cols);
/* dst[i * dst_s0 + j * dst_s1 + c] = src[i * src_s0 + j * src_s1 + c] for i < n0, j < n1,
 * c < cols (a batch of strided block copies in one call: per-group splits of fused projections).
 * dst and src must not overlap. */
void kiln_cpu_copy3d(float *dst, int64_t dst_s0, int64_t dst_s1, const float *src, int64_t src_s0,
                     int64_t src_s1, int64_t n0, int64_t n1, int64_t cols);
/* x[i] = 0 over n elements. */
void kiln_cpu_zero(float *x, int64_t n);
/* y[i] = x[i] * sigmoid(gate[i]) (attention output gate). y may alias x. */
void kiln_cpu_sigmoid_mul(float *y, const float *x, const float *gate, int64_t n);
/* Per head h < n_v_heads of each of n tokens (a, b, g, beta all [n, n_v_heads]):
 * g = neg_a[h] * softplus(a + dt_bias[h]) (log decay, neg_a = -exp(A_log)), beta = sigmoid(b). */
void kiln_cpu_gdn_gates(float *g, float *beta, const float *a, const float *b, int64_t n,
                        int n_v_heads, const float *neg_a, const float *dt_bias);
/* Gated delta rule, token by token (the oracle for every backend's gdn_delta; the CPU backend
 * itself runs kiln_gdn_recurrent / kiln_gdn_chunked of cpu_deltanet.h). Per value head h (key
 * head h / (n_v/n_k)), state S [n_v, dk, dv]: S = e^g S; d = beta (v - S^T k); S += k d^T;
 * o = S^T q / sqrt(dk). q, k [n, n_k, dk]; v, out [n, n_v, dv]; g, beta [n, n_v]. */
void kiln_cpu_gdn_delta_ref(const kiln_gdn_dims *d, int64_t n, const float *q, const float *k,
                            const float *v, const float *g, const float *beta, float *S,
                            float *out);
/* dst[i, :] = src[rows[i], :] for i < n (rows of `width` floats). */
void kiln_cpu_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t n,
                          int64_t width);
/* y[rows[i], :] += weights[i] * src[i, :] for i < n; rows must be distinct within one call. */
void kiln_cpu_scatter_add_rows(float *y, const float *src, const int32_t *rows,
                               const float *weights, int64_t n, int64_t width);

/* The MoE ops with routing on the backend (backend.h moe_route, matmul_gather, moe_combine).
 * Route: per token t < T, the top k of softmax(logits[t, 0..E)) (ties: lower index; a NaN logit
 * is chosen only when nothing else is left) into experts [T, k] with weights [T, k] =
 * exp(l - max) / sum (in double, rounded to float), renormalised over the k when norm_topk, then
 * times expert_scale[expert] when expert_scale [E] is given. */
void kiln_cpu_moe_route_ref(int32_t *experts, float *weights, const float *logits, int64_t T,
                            int n_experts, int top_k, bool norm_topk, const float *expert_scale);
/* y[i, rows] = x[i / x_div, cols] @ W_e^T for i < n, e = experts[i], W_e = rows [e*rows,
 * (e+1)*rows) of stack (kiln_cpu_matmul_ref of that row view on one row). */
void kiln_cpu_matmul_gather_ref(float *y, const float *x, int64_t x_div, int64_t n,
                                const int32_t *experts, const kiln_matrix *stack, int64_t rows);
/* y[i, rows] = act(x_i @ G_e^T) * (x_i @ U_e^T) for i < n (backend.h matmul_gather_glu): two
 * kiln_cpu_matmul_ref of row views, then act(g) * u as kiln_cpu_silu_mul_ref / GELU-tanh. */
void kiln_cpu_matmul_gather_glu_ref(float *y, const float *x, int64_t x_div, int64_t n,
                                    const int32_t *experts, const kiln_matrix *gate,
                                    const kiln_matrix *up, int64_t rows, int64_t stride,
                                    int64_t up_offset, int act);
/* y[t, H] = sum_j weights[t*k + j] * ye[t*k + j, H] in j order, then + g * shared[t, H] with
 * g = sigmoid(shared_logit[t]) (1 without shared_logit) when shared is given. */
void kiln_cpu_moe_combine_ref(float *y, const float *ye, const float *weights, int64_t T, int top_k,
                              int64_t hidden, const float *shared, const float *shared_logit);

/* The sampling op's reference (backend.h `sample`, cpu_sample.c): for each row, the token
 * kiln_sampler_sample picks with the row's parameters, penalty window and uniform draw u, by the
 * same arithmetic in the same order (penalties, argmax, softmax at the temperature, top-k, top-p,
 * min-p, inverse CDF) — exactly equal to the sampler. logits rows are modified by the penalties. */
void kiln_cpu_sample_ref(int32_t *ids, float *logits, int64_t vocab, int n_rows,
                         const kiln_sample_row *rows, const int32_t *history);

#endif
