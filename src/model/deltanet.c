/* deltanet.c — CPU Gated DeltaNet kernels (see deltanet.h). The chunked form follows the WY
 * representation: inside a chunk of L tokens with cumulative log decay c_i,
 *   A = -(beta_i k_i . k_j) e^{c_i - c_j} (j < i), T = (I - A')^{-1} by forward substitution,
 *   U = T (beta v), W = T (beta k e^{c}),  v' = U - W S,
 *   o_i = e^{c_i} q_i S + sum_{j<=i} (q_i . k_j) e^{c_i - c_j} v'_j,
 *   S <- e^{c_L} S + sum_j e^{c_L - c_j} k_j v'_j^T.
 * Heads are independent, so both forms run heads in parallel on the pool. */
#include "model/deltanet.h"

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
            float decay = expf(j->g[t * nv + h]), b = j->beta[t * nv + h];
            for (int i = 0; i < dk * dv; i++) S[i] *= decay;
            for (int c = 0; c < dv; c++) dlt[c] = 0;
            for (int i = 0; i < dk; i++)
                for (int c = 0; c < dv; c++) dlt[c] += S[i * dv + c] * k[i];
            for (int c = 0; c < dv; c++) dlt[c] = (v[c] - dlt[c]) * b;
            for (int i = 0; i < dk; i++)
                for (int c = 0; c < dv; c++) S[i * dv + c] += k[i] * dlt[c];
            float *o = j->out + (t * nv + h) * dv;
            for (int c = 0; c < dv; c++) o[c] = 0;
            for (int i = 0; i < dk; i++) {
                float qi = q[i] * scale;
                for (int c = 0; c < dv; c++) o[c] += S[i * dv + c] * qi;
            }
        }
    }
    free(dlt);
}

static void chunked_heads(void *ctx, int64_t h0, int64_t h1, int thread) {
    (void)thread;
    const gdn_job *j = ctx;
    const kiln_gdn_dims *d = j->d;
    const int nk = d->n_k_heads, nv = d->n_v_heads, dk = d->dk, dv = d->dv, r = nv / nk;
    const int CH = j->chunk;
    const float scale = 1.0f / sqrtf((float)dk);
    float *A = malloc((size_t)CH * CH * sizeof(float)); /* [L, L] */
    float *gc = malloc((size_t)CH * sizeof(float));     /* [L] cumulative log decay */
    float *W = malloc((size_t)CH * dk * sizeof(float)); /* [L, dk] */
    float *U = malloc((size_t)CH * dv * sizeof(float)); /* [L, dv] -> v' */
    if (!A || !gc || !W || !U) goto done;
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
            }
            /* strictly lower A, then forward substitution in place (row i uses updated rows) */
            for (int i = 0; i < L; i++) {
                const float bi = j->beta[(c0 + i) * nv + h];
                for (int jj = 0; jj < i; jj++) {
                    const float *ki = K_(c0 + i), *kj = K_(c0 + jj);
                    float dot = 0;
                    for (int x = 0; x < dk; x++) dot += ki[x] * kj[x];
                    A[i * CH + jj] = -bi * dot * expf(gc[i] - gc[jj]);
                }
            }
            for (int i = 1; i < L; i++)
                for (int jj = 0; jj < i; jj++) {
                    float s = A[i * CH + jj];
                    for (int m = jj + 1; m < i; m++) s += A[i * CH + m] * A[m * CH + jj];
                    A[i * CH + jj] = s;
                }
            /* U = T (beta v), W = T (beta k e^c) with T = A + I */
            for (int i = 0; i < L; i++) {
                float *u = U + i * dv, *w = W + i * dk;
                for (int c = 0; c < dv; c++) u[c] = 0;
                for (int x = 0; x < dk; x++) w[x] = 0;
                for (int jj = 0; jj <= i; jj++) {
                    float t = jj == i ? 1.0f : A[i * CH + jj];
                    float bj = j->beta[(c0 + jj) * nv + h];
                    const float *vj = V(c0 + jj), *kj = K_(c0 + jj);
                    float tv = t * bj, tk = t * bj * expf(gc[jj]);
                    for (int c = 0; c < dv; c++) u[c] += tv * vj[c];
                    for (int x = 0; x < dk; x++) w[x] += tk * kj[x];
                }
                /* v' = U - W S */
                for (int x = 0; x < dk; x++) {
                    const float wx = w[x];
                    const float *srow = S + x * dv;
                    for (int c = 0; c < dv; c++) u[c] -= wx * srow[c];
                }
            }
            /* outputs */
            for (int i = 0; i < L; i++) {
                const float *qi = Q(c0 + i);
                float *o = j->out + ((c0 + i) * nv + h) * dv;
                const float ei = expf(gc[i]);
                for (int c = 0; c < dv; c++) o[c] = 0;
                for (int x = 0; x < dk; x++) {
                    const float qx = qi[x] * scale * ei;
                    const float *srow = S + x * dv;
                    for (int c = 0; c < dv; c++) o[c] += qx * srow[c];
                }
                for (int jj = 0; jj <= i; jj++) {
                    const float *kj = K_(c0 + jj);
                    float dot = 0;
                    for (int x = 0; x < dk; x++) dot += qi[x] * kj[x];
                    const float a = dot * scale * expf(gc[i] - gc[jj]);
                    const float *vp = U + jj * dv;
                    for (int c = 0; c < dv; c++) o[c] += a * vp[c];
                }
            }
            /* state update */
            const float eL = expf(gc[L - 1]);
            for (int i = 0; i < dk * dv; i++) S[i] *= eL;
            for (int jj = 0; jj < L; jj++) {
                const float *kj = K_(c0 + jj);
                const float f = expf(gc[L - 1] - gc[jj]);
                const float *vp = U + jj * dv;
                for (int x = 0; x < dk; x++) {
                    const float kx = kj[x] * f;
                    float *srow = S + x * dv;
                    for (int c = 0; c < dv; c++) srow[c] += kx * vp[c];
                }
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
