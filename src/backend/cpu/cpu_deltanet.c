/* cpu_deltanet.c — CPU Gated DeltaNet kernels (see cpu_deltanet.h). The chunked form follows the WY
 * representation: inside a chunk of L tokens with cumulative log decay c_i,
 *   A = -(beta_i k_i . k_j) e^{c_i - c_j} (j < i), T = (I - A')^{-1} by forward substitution,
 *   U = T (beta v), W = T (beta k e^{c}),  v' = U - W S,
 *   o_i = e^{c_i} q_i S + sum_{j<=i} (q_i . k_j) e^{c_i - c_j} v'_j,
 *   S <- e^{c_L} S + sum_j e^{c_L - c_j} k_j v'_j^T.
 * Heads are independent, so both forms run heads in parallel on the pool. */
#include "backend/cpu/cpu_deltanet.h"

#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void kiln_gdn_conv(float *out, const float *x, int64_t n, int C, const float *w, int K,
                   float *state) {
    const int P = K - 1;
    for (int64_t t = 0; t < n; t++) {
        for (int c = 0; c < C; c++) {
            float acc = 0;
            for (int j = 0; j < K; j++) {
                int64_t src = t - P + j; /* input row; negative rows live in the state */
                float xv = src >= 0 ? x[src * C + c] : state[(P + src) * C + c];
                acc += w[(int64_t)c * K + j] * xv;
            }
            out[t * C + c] = acc / (1.0f + expf(-acc));
        }
    }
    /* new state: the last P inputs of (state ++ x) */
    if (P <= 0) return;
    if (n >= P) {
        memcpy(state, x + (n - P) * C, (size_t)P * C * sizeof(float));
    } else {
        memmove(state, state + n * C, (size_t)(P - n) * C * sizeof(float));
        memcpy(state + (P - n) * C, x, (size_t)n * C * sizeof(float));
    }
}

void kiln_gdn_l2norm(float *x, int64_t rows, int dim, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        float *p = x + r * dim;
        float ss = 0;
        for (int i = 0; i < dim; i++) ss += p[i] * p[i];
        float inv = 1.0f / sqrtf(ss + eps);
        for (int i = 0; i < dim; i++) p[i] *= inv;
    }
}

typedef struct gdn_job {
    const kiln_gdn_dims *d;
    int64_t n;
    int chunk;
    const float *q, *k, *v, *g, *beta;
    float *S, *out;
} gdn_job;

/* One decode step per head, two passes over S [dk, dv] with SIMD dot/axpy over dv:
 *   r = S^T k;  d = beta (v - e^g r);  S = e^g S + k d^T (row by row);  o = S^T q / sqrt(dk). */
static void recurrent_heads(void *ctx, int64_t h0, int64_t h1, int thread) {
    (void)thread;
    const gdn_job *j = ctx;
    const kiln_gdn_dims *d = j->d;
    const int nk = d->n_k_heads, nv = d->n_v_heads, dk = d->dk, dv = d->dv, r = nv / nk;
    const float scale = 1.0f / sqrtf((float)dk);
    float *dlt = malloc((size_t)dv * sizeof(float));
    if (!dlt) return;
    for (int64_t h = h0; h < h1; h++) {
        float *S = j->S + h * dk * dv; /* [dk, dv] */
        const int64_t kh = h / r;
        for (int64_t t = 0; t < j->n; t++) {
            const float *q = j->q + (t * nk + kh) * dk;
            const float *k = j->k + (t * nk + kh) * dk;
            const float *v = j->v + (t * nv + h) * dv;
            const float decay = expf(j->g[t * nv + h]), b = j->beta[t * nv + h];
            memset(dlt, 0, (size_t)dv * sizeof(float));
            for (int i = 0; i < dk; i++) kiln_cpu_axpy(dlt, k[i], S + (int64_t)i * dv, dv);
            for (int c = 0; c < dv; c++) dlt[c] = (v[c] - decay * dlt[c]) * b;
            float *o = j->out + (t * nv + h) * dv;
            memset(o, 0, (size_t)dv * sizeof(float));
            for (int i = 0; i < dk; i++) {
                float *row = S + (int64_t)i * dv;
                kiln_cpu_scale(row, decay, dv);
                kiln_cpu_axpy(row, k[i], dlt, dv);
                kiln_cpu_axpy(o, q[i] * scale, row, dv);
            }
        }
    }
    free(dlt);
}

/* Chunked form per head; every inner loop is a dot over dk or an axpy over dv / dk. */
static void chunked_heads(void *ctx, int64_t h0, int64_t h1, int thread) {
    (void)thread;
    const gdn_job *j = ctx;
    const kiln_gdn_dims *d = j->d;
    const int nk = d->n_k_heads, nv = d->n_v_heads, dk = d->dk, dv = d->dv, r = nv / nk;
    const int CH = j->chunk;
    const float scale = 1.0f / sqrtf((float)dk);
    float *A = malloc((size_t)CH * CH * sizeof(float)); /* [L, L] */
    float *gc = malloc((size_t)CH * 3 * sizeof(float)); /* [L] cumulative log decay, e^gc, beta */
    float *W = malloc((size_t)CH * dk * sizeof(float)); /* [L, dk] */
    float *U = malloc((size_t)CH * dv * sizeof(float)); /* [L, dv] -> v' */
    if (!A || !gc || !W || !U) goto done;
    float *eg = gc + CH, *bt = gc + 2 * CH;
    for (int64_t h = h0; h < h1; h++) {
        float *S = j->S + h * dk * dv;
        const int64_t kh = h / r;
#define Q(t)  (j->q + ((t)*nk + kh) * dk)
#define K_(t) (j->k + ((t)*nk + kh) * dk)
#define V(t)  (j->v + ((t)*nv + h) * dv)
        for (int64_t c0 = 0; c0 < j->n; c0 += CH) {
            const int L = (int)(j->n - c0 < CH ? j->n - c0 : CH);
            float acc = 0;
            for (int i = 0; i < L; i++) {
                acc += j->g[(c0 + i) * nv + h];
                gc[i] = acc;
                eg[i] = expf(acc);
                bt[i] = j->beta[(c0 + i) * nv + h];
            }
            /* strictly lower A, then forward substitution in place (row i uses updated rows) */
            for (int i = 0; i < L; i++) {
                const float *ki = K_(c0 + i);
                for (int jj = 0; jj < i; jj++)
                    A[i * CH + jj] =
                        -bt[i] * kiln_cpu_dot(ki, K_(c0 + jj), dk) * expf(gc[i] - gc[jj]);
            }
            for (int i = 1; i < L; i++)
                for (int jj = 0; jj < i; jj++) {
                    float s = A[i * CH + jj];
                    for (int m = jj + 1; m < i; m++) s += A[i * CH + m] * A[m * CH + jj];
                    A[i * CH + jj] = s;
                }
            /* U = T (beta v), W = T (beta k e^c) with T = A + I; then v' = U - W S */
            for (int i = 0; i < L; i++) {
                float *u = U + i * dv, *w = W + i * dk;
                memset(u, 0, (size_t)dv * sizeof(float));
                memset(w, 0, (size_t)dk * sizeof(float));
                for (int jj = 0; jj <= i; jj++) {
                    const float t = jj == i ? 1.0f : A[i * CH + jj];
                    kiln_cpu_axpy(u, t * bt[jj], V(c0 + jj), dv);
                    kiln_cpu_axpy(w, t * bt[jj] * eg[jj], K_(c0 + jj), dk);
                }
                for (int x = 0; x < dk; x++) kiln_cpu_axpy(u, -w[x], S + (int64_t)x * dv, dv);
            }
            /* outputs: e^{c_i} q_i S + sum_{j<=i} (q_i . k_j) e^{c_i - c_j} v'_j */
            for (int i = 0; i < L; i++) {
                const float *qi = Q(c0 + i);
                float *o = j->out + ((c0 + i) * nv + h) * dv;
                const float qs = scale * eg[i];
                memset(o, 0, (size_t)dv * sizeof(float));
                for (int x = 0; x < dk; x++) kiln_cpu_axpy(o, qi[x] * qs, S + (int64_t)x * dv, dv);
                for (int jj = 0; jj <= i; jj++) {
                    const float a =
                        kiln_cpu_dot(qi, K_(c0 + jj), dk) * scale * expf(gc[i] - gc[jj]);
                    kiln_cpu_axpy(o, a, U + jj * dv, dv);
                }
            }
            /* state update: S = e^{c_L} S + sum_j e^{c_L - c_j} k_j v'_j^T, row by row */
            const float eL = eg[L - 1];
            for (int jj = 0; jj < L; jj++) W[jj] = expf(gc[L - 1] - gc[jj]); /* W is free now */
            for (int x = 0; x < dk; x++) {
                float *srow = S + (int64_t)x * dv;
                kiln_cpu_scale(srow, eL, dv);
                for (int jj = 0; jj < L; jj++)
                    kiln_cpu_axpy(srow, K_(c0 + jj)[x] * W[jj], U + jj * dv, dv);
            }
        }
#undef Q
#undef K_
#undef V
    }
done:
    free(A);
    free(gc);
    free(W);
    free(U);
}

void kiln_gdn_recurrent(const kiln_gdn_dims *d, int64_t n, const float *q, const float *k,
                        const float *v, const float *g, const float *beta, float *S, float *out,
                        kiln_threadpool *pool) {
    gdn_job j = {d, n, 1, q, k, v, g, beta, S, out};
    kiln_parallel_for(pool, d->n_v_heads, 1, recurrent_heads, &j);
}

void kiln_gdn_chunked(const kiln_gdn_dims *d, int64_t n, int chunk, const float *q, const float *k,
                      const float *v, const float *g, const float *beta, float *S, float *out,
                      kiln_threadpool *pool) {
    gdn_job j = {d, n, chunk > 0 ? chunk : 64, q, k, v, g, beta, S, out};
    kiln_parallel_for(pool, d->n_v_heads, 1, chunked_heads, &j);
}
