/* cpu_deltanet.h — the Gated DeltaNet token mixer's CPU kernels (Qwen3-Next, Qwen3.5 linear
 * layers): the depthwise causal conv1d with SiLU and a carried conv state, L2 normalisation, and
 * the gated delta rule in two equivalent forms — the per-token recurrence (decode) and the chunked
 * WY form (prefill, chunks of 64). Per value head h (key head h / (n_v/n_k)), with state S [dk,
 * dv]: S = exp(g) S;  d = beta (v - S^T k);  S += k d^T;  o = S^T (q / sqrt(dk)). All f32. */
#ifndef KILN_BACKEND_CPU_DELTANET_H
#define KILN_BACKEND_CPU_DELTANET_H

#include "backend/backend.h" /* kiln_gdn_dims */
#include "util/threadpool.h"

#include <stdint.h>

/* Depthwise causal conv over n tokens of C channels, then SiLU:
 * out[t, c] = silu(sum_j w[c, j] * x[t - (K-1) + j, c]); rows before t = 0 come from state
 * [K-1, C] (oldest first), which is updated to the last K-1 inputs. out may not alias x. */
void kiln_gdn_conv(float *out, const float *x, int64_t n, int C, const float *w, int K,
                   float *state);

/* x[rows, dim] /= sqrt(sum(x^2) + eps) per row, in place. */
void kiln_gdn_l2norm(float *x, int64_t rows, int dim, float eps);

/* Gated delta rule over n tokens, state S [n_v, dk, dv] read and updated in place.
 * q, k [n, n_k, dk] (already L2-normed, unscaled); v [n, n_v, dv]; g (log decay) and beta
 * [n, n_v]; out [n, n_v, dv]. */
void kiln_gdn_recurrent(const kiln_gdn_dims *d, int64_t n, const float *q, const float *k,
                        const float *v, const float *g, const float *beta, float *S, float *out,
                        kiln_threadpool *pool);
/* Same result through the chunked algorithm (chunk tokens per block, 64 in the models). */
void kiln_gdn_chunked(const kiln_gdn_dims *d, int64_t n, int chunk, const float *q, const float *k,
                      const float *v, const float *g, const float *beta, float *S, float *out,
                      kiln_threadpool *pool);

#endif
