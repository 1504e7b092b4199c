/* cpu_ops.c — the non-matmul CPU ops: embedding gather, RMSNorm (reference and fast), rotary
 * embedding, gated activations, elementwise add/scale, dot/axpy (dispatched to the SIMD level)
 * and softmax. Numerics follow torch's f32 CPU kernels where the model parity tests depend on
 * them: RMSNorm computes (x * rsqrt(mean(x^2) + eps)) * w, RoPE angles are f32 products pos*freq,
 * SiLU is x / (1 + exp(-x)), GELU is torch's tanh approximation. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <string.h>

void kiln_cpu_embed(float *out, const int32_t *ids, int64_t n, const kiln_matrix *w) {
    const kiln_cpu_kernels *kernels = kiln_cpu_kernels_active();
    for (int64_t i = 0; i < n; i++) kernels->decode(w, ids[i], 0, w->cols, out + i * w->cols);
}

static inline float rmsnorm_weight(const float *w, int64_t j, bool plus_one) {
    if (!w) return 1.0f;
    return plus_one ? 1.0f + w[j] : w[j];
}

void kiln_cpu_rmsnorm_ref(float *y, const float *x, const float *w, int64_t n, int64_t dim,
                          float eps, bool plus_one) {
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * dim;
        double sum_sq = 0.0;
        for (int64_t j = 0; j < dim; j++) sum_sq += (double)xi[j] * xi[j];
        float inv_rms = 1.0f / sqrtf((float)(sum_sq / (double)dim) + eps);
        for (int64_t j = 0; j < dim; j++)
            y[i * dim + j] = (xi[j] * inv_rms) * rmsnorm_weight(w, j, plus_one);
    }
}

/* Same formula; the sum of squares runs in 16 f32 lanes (what torch's vectorized reduction does,
 * and what a compiler turns into SIMD). */
void kiln_cpu_rmsnorm(float *y, const float *x, const float *w, int64_t n, int64_t dim, float eps,
                      bool plus_one) {
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * dim;
        float lanes[16] = {0};
        int64_t j = 0;
        for (; j + 16 <= dim; j += 16)
            for (int u = 0; u < 16; u++) lanes[u] += xi[j + u] * xi[j + u];
        for (; j < dim; j++) lanes[0] += xi[j] * xi[j];
        for (int width = 8; width >= 1; width /= 2)
            for (int u = 0; u < width; u++) lanes[u] += lanes[u + width];
        float inv_rms = 1.0f / sqrtf(lanes[0] / (float)dim + eps);
        float *yi = y + i * dim;
        if (!w) {
            for (j = 0; j < dim; j++) yi[j] = xi[j] * inv_rms;
        } else if (plus_one) {
            for (j = 0; j < dim; j++) yi[j] = (xi[j] * inv_rms) * (1.0f + w[j]);
        } else {
            for (j = 0; j < dim; j++) yi[j] = (xi[j] * inv_rms) * w[j];
        }
    }
}

void kiln_cpu_rope(float *x, const int32_t *pos, int64_t n, int n_heads, int head_dim, int rot_dim,
                   const float *inv_freq) {
    int half = rot_dim / 2;
    float cos_t[512], sin_t[512]; /* rot_dim/2 <= 512 covers every model we load */
    for (int64_t t = 0; t < n; t++) {
        int64_t done = 0;
        while (done < half) { /* chunks of 512 frequencies */
            int chunk = half - done < 512 ? (int)(half - done) : 512;
            for (int i = 0; i < chunk; i++) {
                float angle = (float)pos[t] * inv_freq[done + i];
                cos_t[i] = cosf(angle);
                sin_t[i] = sinf(angle);
            }
            for (int h = 0; h < n_heads; h++) {
                float *xh = x + (t * n_heads + h) * head_dim;
                for (int i = 0; i < chunk; i++) {
                    float x1 = xh[done + i], x2 = xh[done + i + half];
                    xh[done + i] = x1 * cos_t[i] - x2 * sin_t[i];
                    xh[done + i + half] = x2 * cos_t[i] + x1 * sin_t[i];
                }
            }
            done += chunk;
        }
    }
}

void kiln_cpu_silu_mul_ref(float *y, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        y[i] = (g / (1.0f + expf(-g))) * up[i];
    }
}

void kiln_cpu_silu_mul(float *y, const float *gate, const float *up, int64_t n) {
    const kiln_cpu_kernels *k = kiln_cpu_kernels_active();
    (k->silu_mul ? k->silu_mul : kiln_cpu_silu_mul_ref)(y, gate, up, n);
}

void kiln_cpu_gelu_tanh_mul(float *y, const float *gate, const float *up, int64_t n) {
    const float sqrt_2_over_pi = 0.7978845608028654f; /* sqrt(2/pi), as torch's kBeta */
    const float kappa = 0.044715f;
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        float inner = sqrt_2_over_pi * (g + kappa * g * g * g);
        y[i] = (0.5f * g * (1.0f + tanhf(inner))) * up[i];
    }
}

void kiln_cpu_add(float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

void kiln_cpu_add_rmsnorm(float *x, const float *h, float *y, const float *w, int64_t n,
                          int64_t dim, float eps, bool plus_one) {
    kiln_cpu_add(x, x, h, n * dim);
    kiln_cpu_rmsnorm(y, x, w, n, dim, eps, plus_one);
}

void kiln_cpu_norm_add(float *x, float *h, const float *w, int64_t n, int64_t dim, float eps,
                       bool plus_one, float scale) {
    kiln_cpu_rmsnorm(h, h, w, n, dim, eps, plus_one);
    kiln_cpu_add(x, x, h, n * dim);
    if (scale != 1.0f) kiln_cpu_scale(x, scale, n * dim);
}

void kiln_cpu_qk_norm_rope(float *q, float *k, const int32_t *pos, int64_t n, int n_heads,
                           int n_kv_heads, int head_dim, int rot_dim, const float *inv_freq,
                           const float *q_norm, const float *k_norm, float eps) {
    if (q_norm) kiln_cpu_rmsnorm(q, q, q_norm, n * n_heads, head_dim, eps, false);
    if (k_norm) kiln_cpu_rmsnorm(k, k, k_norm, n * n_kv_heads, head_dim, eps, false);
    kiln_cpu_rope(q, pos, n, n_heads, head_dim, rot_dim, inv_freq);
    kiln_cpu_rope(k, pos, n, n_kv_heads, head_dim, rot_dim, inv_freq);
}

void kiln_cpu_scale(float *x, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

void kiln_cpu_softcap(float *x, float cap, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

float kiln_cpu_dot(const float *a, const float *b, int64_t n) {
    return kiln_cpu_kernels_active()->dot(a, b, n);
}

void kiln_cpu_axpy(float *y, float a, const float *x, int64_t n) {
    kiln_cpu_kernels_active()->axpy(y, a, x, n);
}

void kiln_cpu_dot_rows(float *out, const float *a, const float *rows, int64_t stride, int64_t count,
                       int64_t n) {
    const kiln_cpu_kernels *k = kiln_cpu_kernels_active();
    if (k->dot_rows) {
        k->dot_rows(out, a, rows, stride, count, n);
        return;
    }
    for (int64_t i = 0; i < count; i++) out[i] = k->dot(a, rows + i * stride, n);
}

void kiln_cpu_axpy_rows(float *y, const float *coef, const float *rows, int64_t stride,
                        int64_t count, int64_t n) {
    const kiln_cpu_kernels *k = kiln_cpu_kernels_active();
    if (k->axpy_rows) {
        k->axpy_rows(y, coef, rows, stride, count, n);
        return;
    }
    for (int64_t i = 0; i < count; i++) k->axpy(y, coef[i], rows + i * stride, n);
}

void kiln_cpu_f16_to_f32(const uint16_t *in, int64_t n, float *out) {
    const kiln_cpu_kernels *k = kiln_cpu_kernels_active();
    if (k->f16_to_f32) {
        k->f16_to_f32(in, n, out);
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = kiln_f16_to_f32(in[i]);
}

void kiln_cpu_bf16_to_f32(const uint16_t *in, int64_t n, float *out) {
    const kiln_cpu_kernels *k = kiln_cpu_kernels_active();
    if (k->bf16_to_f32) {
        k->bf16_to_f32(in, n, out);
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = kiln_bf16_to_f32(in[i]);
}

float kiln_cpu_exp_sum_ref(float *x, int64_t n, float shift) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - shift);
        sum += x[i];
    }
    return sum;
}

float kiln_cpu_exp_sum(float *x, int64_t n, float shift) {
    const kiln_cpu_kernels *k = kiln_cpu_kernels_active();
    return k->exp_sum ? k->exp_sum(x, n, shift) : kiln_cpu_exp_sum_ref(x, n, shift);
}

void kiln_cpu_softmax(float *x, int64_t n) {
    if (n <= 0) return;
    float max = x[0];
    for (int64_t i = 1; i < n; i++) max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void kiln_cpu_copy2d(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                     int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++)
        memcpy(dst + r * dst_stride, src + r * src_stride, (size_t)cols * sizeof(float));
}

void kiln_cpu_copy3d(float *dst, int64_t dst_s0, int64_t dst_s1, const float *src, int64_t src_s0,
                     int64_t src_s1, int64_t n0, int64_t n1, int64_t cols) {
    for (int64_t i = 0; i < n0; i++)
        for (int64_t j = 0; j < n1; j++)
            memcpy(dst + i * dst_s0 + j * dst_s1, src + i * src_s0 + j * src_s1,
                   (size_t)cols * sizeof(float));
}

void kiln_cpu_zero(float *x, int64_t n) {
    if (n > 0) memset(x, 0, (size_t)n * sizeof(float));
}

void kiln_cpu_sigmoid_mul(float *y, const float *x, const float *gate, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * (1.0f / (1.0f + expf(-gate[i])));
}

void kiln_cpu_gdn_gates(float *g, float *beta, const float *a, const float *b, int64_t n,
                        int n_v_heads, const float *neg_a, const float *dt_bias) {
    for (int64_t t = 0; t < n; t++)
        for (int h = 0; h < n_v_heads; h++) {
            const int64_t i = t * n_v_heads + h;
            float xa = a[i] + dt_bias[h];
            float sp = xa > 20.0f ? xa : log1pf(expf(xa));
            g[i] = neg_a[h] * sp;
            beta[i] = 1.0f / (1.0f + expf(-b[i]));
        }
}

void kiln_cpu_gdn_delta_ref(const kiln_gdn_dims *d, int64_t n, const float *q, const float *k,
                            const float *v, const float *g, const float *beta, float *S,
                            float *out) {
    const int nk = d->n_k_heads, nv = d->n_v_heads, dk = d->dk, dv = d->dv, r = nv / nk;
    const float scale = 1.0f / sqrtf((float)dk);
    for (int h = 0; h < nv; h++) {
        float *Sh = S + (int64_t)h * dk * dv; /* [dk, dv] */
        const int kh = h / r;
        for (int64_t t = 0; t < n; t++) {
            const float *qt = q + (t * nk + kh) * dk, *kt = k + (t * nk + kh) * dk;
            const float *vt = v + (t * nv + h) * dv;
            float *ot = out + (t * nv + h) * dv;
            const float decay = expf(g[t * nv + h]), bt = beta[t * nv + h];
            for (int c = 0; c < dv; c++) {
                float kS = 0; /* (S^T k)[c] before the decay */
                for (int i = 0; i < dk; i++) kS += kt[i] * Sh[(int64_t)i * dv + c];
                const float delta = bt * (vt[c] - decay * kS);
                float o = 0;
                for (int i = 0; i < dk; i++) {
                    float *s = &Sh[(int64_t)i * dv + c];
                    *s = decay * *s + kt[i] * delta;
                    o += qt[i] * *s;
                }
                ot[c] = o * scale;
            }
        }
    }
}

void kiln_cpu_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t n,
                          int64_t width) {
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + i * width, src + (int64_t)rows[i] * width, (size_t)width * sizeof(float));
}

void kiln_cpu_scatter_add_rows(float *y, const float *src, const int32_t *rows,
                               const float *weights, int64_t n, int64_t width) {
    for (int64_t i = 0; i < n; i++) {
        float *dst = y + (int64_t)rows[i] * width;
        const float *s = src + i * width;
        for (int64_t c = 0; c < width; c++) dst[c] += weights[i] * s[c];
    }
}

void kiln_cpu_moe_route_ref(int32_t *experts, float *weights, const float *logits, int64_t T, int E,
                            int k, bool norm_topk, const float *expert_scale) {
    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + t * E;
        int32_t *idx = experts + t * k;
        float *w = weights + t * k;
        float mx = -INFINITY;
        for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        double sum = 0;
        for (int e = 0; e < E; e++) sum += exp((double)l[e] - mx);
        for (int j = 0; j < k; j++) {
            int best = -1, first_left = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++) taken |= idx[i] == e;
                if (taken) continue;
                if (first_left < 0) first_left = e;
                if (!isnan(l[e]) && (best < 0 || l[e] > l[best])) best = e;
            }
            idx[j] = best >= 0 ? best : first_left;
            w[j] = (float)(exp((double)l[idx[j]] - mx) / sum);
        }
        if (norm_topk) {
            float s = 0;
            for (int j = 0; j < k; j++) s += w[j];
            for (int j = 0; j < k; j++) w[j] /= s;
        }
        for (int j = 0; expert_scale && j < k; j++) w[j] *= expert_scale[idx[j]];
    }
}

void kiln_cpu_moe_combine_ref(float *y, const float *ye, const float *weights, int64_t T, int k,
                              int64_t H, const float *shared, const float *shared_logit) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            float acc = 0.0f;
            for (int j = 0; j < k; j++) acc += weights[t * k + j] * ye[(t * k + j) * H + h];
            if (shared) {
                const float g = shared_logit ? 1.0f / (1.0f + expf(-shared_logit[t])) : 1.0f;
                acc += g * shared[t * H + h];
            }
            y[t * H + h] = acc;
        }
}
