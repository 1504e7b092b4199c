/* backend.h — the one backend interface. The model's forward pass is written once against this
 * table; each backend (cpu/, cuda/) fills it in. Pointers passed to ops (activations, ids,
 * positions, weights inside kiln_matrix) live in the backend's memory: host memory for the CPU,
 * device memory for CUDA. Every op has the semantics of its CPU reference in cpu/cpu_ops.h
 * (l2norm and gdn_conv: kiln_gdn_l2norm / kiln_gdn_conv in cpu/cpu_deltanet.h), and
 * each backend's kernels are tested against that reference.
 */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include "backend/matrix.h"
#include "kv/kv_cache.h"
#include "util/threadpool.h"

typedef struct kiln_backend kiln_backend;

/* Activation of a gated linear unit: act(gate) * up. */
typedef enum kiln_glu_act { KILN_GLU_SILU = 0, KILN_GLU_GELU_TANH = 1 } kiln_glu_act;

/* Geometry of a Gated DeltaNet layer (Qwen3-Next / Qwen3.5 linear attention). */
typedef struct kiln_gdn_dims {
    int n_k_heads, n_v_heads; /* n_v_heads is a multiple of n_k_heads */
    int dk, dv;               /* key / value head dims */
} kiln_gdn_dims;

/* One row to sample by the `sample` op: which row of the logits, the sampler's parameters and the
 * uniform number it drew (kiln_sampler_draw_uniform), and its penalty window in the history. */
typedef struct kiln_sample_row {
    int64_t logits_row;       /* row of the [rows, vocab] logits */
    float temperature;        /* <= 0: greedy (argmax, lowest id on ties) */
    float inv_temperature;    /* 1.0f / temperature, computed on the host as the sampler does */
    int32_t top_k;            /* 0 = off; 1 = greedy */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    int32_t history_offset;   /* penalty window: history[history_offset .. + n_history) */
    int32_t n_history;        /* 0 when the penalties are off */
    double u;                 /* uniform in [0, 1) for the inverse-CDF draw (unused when greedy) */
} kiln_sample_row;

/* What every backend's moe_route takes (CUDA keeps a token's logits in shared memory). */
#define KILN_MOE_ROUTE_MAX_EXPERTS 4096
#define KILN_MOE_ROUTE_MAX_K       64

struct kiln_backend {
    const char *name; /* "cpu", "cuda" */
    kiln_device device;
    kiln_threadpool *pool; /* CPU worker threads (also used by CPU-side work of other backends) */
    void *impl;            /* backend private state */

    void (*destroy)(kiln_backend *be);

    /* ---- memory ---- */
    void *(*alloc)(kiln_backend *be, size_t bytes); /* NULL on failure */
    void (*free)(kiln_backend *be, void *p);
    void (*upload)(kiln_backend *be, void *dst, const void *src, size_t bytes);   /* host -> be */
    void (*download)(kiln_backend *be, void *dst, const void *src, size_t bytes); /* be -> host */
    /* Makes a weight usable by this backend: CPU keeps the mmap'd pointers (no copy); CUDA copies
     * codes/scales/biases/bias to the device, keeping the stored format. */
    kiln_status (*upload_matrix)(kiln_backend *be, const kiln_matrix *host, kiln_matrix *out);
    /* Optional (NULL: not offered): count matrices of one format and width (q/k/v, gate/up)
     * uploaded as consecutive row ranges of one allocation, so that outs[0..count) read
     * together are one [sum of rows, cols] matrix (codes, scales, biases and output biases each
     * contiguous); outs[1..] are views (freed with outs[0]). KILN_ERR_UNSUPPORTED: not done for
     * these (the caller uploads them one by one). */
    kiln_status (*upload_matrices)(kiln_backend *be, int count, const kiln_matrix *hosts,
                                   kiln_matrix *outs);
    /* Optional (NULL: not offered): count matrices of one format and shape uploaded as one
     * [count*rows, cols] matrix, matrix i its rows [i*rows, (i+1)*rows) (the experts of a MoE
     * layer stored one tensor each, for matmul_gather). KILN_ERR_UNSUPPORTED: not for these. */
    kiln_status (*upload_stack)(kiln_backend *be, int count, const kiln_matrix *hosts,
                                kiln_matrix *out);
    void (*free_matrix)(kiln_backend *be, kiln_matrix *m);
    kiln_status (*synchronize)(kiln_backend *be);
    /* Optional (NULL: not offered). Bracket a run of ops that the backend may record and replay
     * as one unit (CUDA: a graph of the decode step). Between them, only ops may be called; a
     * call that must wait (download, synchronize, alloc) ends the recording early, and the ops
     * run in order either way. `key` names the run: the same non-zero key promises the same ops
     * with the same arguments (values in backend memory, such as positions, may differ). When
     * graph_begin returns true, the backend has already replayed the run recorded under `key`:
     * the caller skips the ops and does not call graph_end. Key 0 records without keeping. */
    bool (*graph_begin)(kiln_backend *be, uint64_t key);
    void (*graph_end)(kiln_backend *be);

    /* ---- ops (semantics: cpu/cpu_ops.h) ---- */
    void (*matmul)(kiln_backend *be, float *y, const float *x, int64_t n, const kiln_matrix *w);
    void (*embed)(kiln_backend *be, float *out, const int32_t *ids, int64_t n,
                  const kiln_matrix *w);
    void (*rmsnorm)(kiln_backend *be, float *y, const float *x, const float *w, int64_t n,
                    int64_t dim, float eps, bool plus_one);
    void (*rope)(kiln_backend *be, float *x, const int32_t *pos, int64_t n, int n_heads,
                 int head_dim, int rot_dim, const float *inv_freq);
    void (*silu_mul)(kiln_backend *be, float *y, const float *gate, const float *up, int64_t n);
    void (*gelu_tanh_mul)(kiln_backend *be, float *y, const float *gate, const float *up,
                          int64_t n);
    void (*add)(kiln_backend *be, float *y, const float *a, const float *b, int64_t n);
    /* x[n] *= s (in place) */
    void (*scale)(kiln_backend *be, float *x, float s, int64_t n);
    /* x[n] = cap * tanh(x / cap) (in place; logit soft-capping, cap > 0) */
    void (*softcap)(kiln_backend *be, float *x, float cap, int64_t n);
    /* fused forms of the ops above, fewer launches per decoder layer (same results as the
     * unfused sequence on the CPU; within the op tolerance on other backends):
     * ys[i][n, ws[i]->rows] = x[n, cols] @ ws[i]^T for count <= 4 matrices of the same cols */
    void (*matmul_multi)(kiln_backend *be, int count, float *const *ys, const float *x, int64_t n,
                         const kiln_matrix *const *ws);
    /* x[n, dim] += h; y = rmsnorm(x) */
    void (*add_rmsnorm)(kiln_backend *be, float *x, const float *h, float *y, const float *w,
                        int64_t n, int64_t dim, float eps, bool plus_one);
    /* x[n, dim] = (x + rmsnorm(h; w)) * scale: a post-norm residual (Gemma's sandwich norms, its
     * layer_scalar as scale); h [n, dim] may be overwritten with rmsnorm(h) */
    void (*norm_add)(kiln_backend *be, float *x, float *h, const float *w, int64_t n, int64_t dim,
                     float eps, bool plus_one, float scale);
    /* per-head RMSNorm of q and k (norm weights may be NULL: skipped), then RoPE of both */
    void (*qk_norm_rope)(kiln_backend *be, float *q, float *k, const int32_t *pos, int64_t n,
                         int n_heads, int n_kv_heads, int head_dim, int rot_dim,
                         const float *inv_freq, const float *q_norm, const float *k_norm,
                         float eps);
    /* Decode-layer fusions around the matmuls (CPU: kiln_backend_*_composed, the unfused ops in
     * order; CUDA: one GEMV launch each for dense weights and n <= 8, else the composition).
     * Work buffers may be overwritten with the intermediate values, or left alone.
     * ys[i][n, ws[i]->rows] = rmsnorm(x[n, cols]; norm_w) @ ws[i]^T, count <= 4; h [n, cols] */
    void (*matmul_norm)(kiln_backend *be, int count, float *const *ys, const float *x, float *h,
                        int64_t n, const kiln_matrix *const *ws, const float *norm_w, float eps,
                        bool plus_one);
    /* y[n, w->rows] += x[n, cols] @ w^T; tmp [n, w->rows] */
    void (*matmul_add)(kiln_backend *be, float *y, const float *x, float *tmp, int64_t n,
                       const kiln_matrix *w);
    /* out[n, F] = act(h @ wg^T) * (h @ wu^T) with h = rmsnorm(x; norm_w); F = wg->rows = wu->rows.
     * Work: h [n, cols], up [n, F] (out serves as the gate's buffer) */
    void (*matmul_norm_glu)(kiln_backend *be, float *out, const float *x, float *h, float *up,
                            int64_t n, const kiln_matrix *wg, const kiln_matrix *wu,
                            const float *norm_w, float eps, bool plus_one, kiln_glu_act act);
    /* Optional hint (NULL: none): these matrices are read soon, after a few ops that read little
     * (attention at a decode step); the backend may start moving part of them closer to the
     * compute (CUDA: into L2). The first is read first; the others together. Changes no result. */
    void (*prefetch)(kiln_backend *be, const kiln_matrix *const *ws, int count);
    /* Optional hint (NULL: none): the next op, which writes x (matmul_add's y, matmul_norm_glu's
     * out, or the KV cache's store_attend_batch's out), is followed directly by a matmul of x:
     * through matmul_norm / matmul_norm_glu with norm_w (eps, plus_one) when norm_w is set, else
     * matmul / matmul_add. The backend may prepare that matmul's input while writing x (CUDA: the
     * digits of x that its quantized GEMV reads, which else take a launch of their own). Changes no
     * result; a hint that is not followed so is dropped. */
    void (*feeds_next)(kiln_backend *be, const float *x, const float *norm_w, float eps,
                       bool plus_one);
    void (*copy2d)(kiln_backend *be, float *dst, int64_t dst_stride, const float *src,
                   int64_t src_stride, int64_t rows, int64_t cols);
    void (*copy3d)(kiln_backend *be, float *dst, int64_t dst_s0, int64_t dst_s1, const float *src,
                   int64_t src_s0, int64_t src_s1, int64_t n0, int64_t n1, int64_t cols);
    void (*zero)(kiln_backend *be, float *x, int64_t n);
    void (*sigmoid_mul)(kiln_backend *be, float *y, const float *x, const float *gate, int64_t n);
    void (*l2norm)(kiln_backend *be, float *x, int64_t rows, int dim, float eps);
    /* The delta rule's inputs from the conv output as one op: conv [n, C] rows hold q [nk*dk] |
     * k [nk*dk] | v [vd] (C >= 2*nk*dk + vd); q, k [n, nk*dk] get them L2-normalized per dk
     * head (as l2norm), v [n, vd] a copy. */
    void (*gdn_split_qkv)(kiln_backend *be, float *q, float *k, float *v, const float *conv,
                          int64_t n, int64_t C, int nk, int dk, int64_t vd, float eps);
    /* Gated RMSNorm (the DeltaNet output norm): y [rows, dim] = rmsnorm(x; w) * silu(z), as
     * rmsnorm then silu_mul(y, z, y); y may alias x. */
    void (*gated_rmsnorm)(kiln_backend *be, float *y, const float *x, const float *z,
                          const float *w, int64_t rows, int dim, float eps);
    /* Gated DeltaNet pieces (hybrid qwen3_next / qwen3_5 layers). gdn_conv and gdn_delta take a
     * batch of n_seqs sequences whose tokens lie stacked in the activations: sequence i owns
     * n_tokens[i] rows (0 allowed) after those of sequences 0..i-1, and carries its own state
     * states[i] (backend memory; distinct sequences, distinct states). n_tokens and states are
     * host arrays. Per sequence the result is that of the CPU kernels on its rows alone. */
    /* causal conv + SiLU: out, x [T, channels]; w [channels, kernel]; states[i] [kernel-1, C] */
    void (*gdn_conv)(kiln_backend *be, float *out, const float *x, int n_seqs, const int *n_tokens,
                     int channels, const float *w, int kernel, float *const *states);
    void (*gdn_gates)(kiln_backend *be, float *g, float *beta, const float *a, const float *b,
                      int64_t n, int n_v_heads, const float *neg_a, const float *dt_bias);
    /* gated delta rule: q, k [T, n_k, dk]; v, out [T, n_v, dv]; g, beta [T, n_v];
     * states[i] [n_v, dk, dv] */
    void (*gdn_delta)(kiln_backend *be, const kiln_gdn_dims *d, int n_seqs, const int *n_tokens,
                      const float *q, const float *k, const float *v, const float *g,
                      const float *beta, float *const *states, float *out);
    /* MoE row routing */
    void (*gather_rows)(kiln_backend *be, float *dst, const float *src, const int32_t *rows,
                        int64_t n, int64_t width);
    void (*scatter_add_rows)(kiln_backend *be, float *y, const float *src, const int32_t *rows,
                             const float *weights, int64_t n, int64_t width);
    /* The MoE block with its routing on the backend (optional; all four or none, NULL: the
     * router logits go to the host for the top-k choice and the experts run bucket by bucket).
     * CPU references: kiln_cpu_moe_route_ref, kiln_cpu_matmul_gather_ref,
     * kiln_cpu_matmul_gather_glu_ref, kiln_cpu_moe_combine_ref. Nothing waits for the host, so a
     * decode step can be recorded. moe_route: per token t the top k of softmax(logits[t, 0..E))
     * (ties: lower index) into experts [T, k], weights [T, k] (renormalised over the k when
     * norm_topk), each times expert_scale[expert] when expert_scale [E] is given; n_experts <=
     * KILN_MOE_ROUTE_MAX_EXPERTS, top_k <= KILN_MOE_ROUTE_MAX_K (callers route larger ones on the
     * host) */
    void (*moe_route)(kiln_backend *be, int32_t *experts, float *weights, const float *logits,
                      int64_t T, int n_experts, int top_k, bool norm_topk,
                      const float *expert_scale);
    /* y[i, rows] = x[i / x_div, cols] @ W_e^T (+ bias rows) for i < n, e = experts[i], W_e the
     * rows [e*rows, (e+1)*rows) of stack [E*rows, cols] */
    void (*matmul_gather)(kiln_backend *be, float *y, const float *x, int64_t x_div, int64_t n,
                          const int32_t *experts, const kiln_matrix *stack, int64_t rows);
    /* y[i, rows] = act(x_i @ G_e^T) * (x_i @ U_e^T), x_i = x[i / x_div], e = experts[i], G_e
     * the rows [e*stride, + rows) of gate, U_e the rows [e*stride + up_offset, + rows) of up (one
     * format; gate and up may be the same stack: Gemma's gate_up, stride 2F, up_offset F) */
    void (*matmul_gather_glu)(kiln_backend *be, float *y, const float *x, int64_t x_div, int64_t n,
                              const int32_t *experts, const kiln_matrix *gate,
                              const kiln_matrix *up, int64_t rows, int64_t stride,
                              int64_t up_offset, kiln_glu_act act);
    /* y[t, H] = sum_j weights[t*k + j] * ye[t*k + j, H] (+ sigmoid(shared_logit[t]) *
     * shared[t, H] when shared is given; weight 1 when shared_logit is NULL); y may not alias */
    void (*moe_combine)(kiln_backend *be, float *y, const float *ye, const float *weights,
                        int64_t T, int top_k, int64_t hidden, const float *shared,
                        const float *shared_logit);
    /* Forwards of up to this many tokens route on the backend with the ops above (0: never;
     * CPU 0: its bucketed experts read each one once; CUDA 64: decode steps). */
    int moe_device_max_tokens;
    /* Whether the gathers over `pairs` (token, expert) pairs of stack w run grouped, each weight
     * tile read once per many pairs (CUDA: the tensor-core expert GEMM): then longer forwards
     * (prefill) route on the backend too. NULL: never. */
    bool (*moe_gather_grouped)(const kiln_backend *be, const kiln_matrix *w, int64_t pairs);
    /* KILN_MOE_DEVICE_TOKENS=N in the environment when kiln_backend_new made the backend: up to
     * N tokens route on the backend and no more (moe_gather_grouped is not asked) */
    bool moe_device_tokens_set;

    /* Token choice (kiln_cpu_sample_ref): ids[i] = the token kiln_sampler_sample would pick from
     * logits row rows[i].logits_row with rows[i]'s parameters, penalty window and uniform draw.
     * logits [.., vocab] and ids [n_rows] are in backend memory (logits are modified in place by
     * the penalties, as the sampler does); rows and history are host memory (the backend copies
     * what it needs). NULL: not offered (the engine samples on the host). */
    void (*sample)(kiln_backend *be, int32_t *ids, float *logits, int64_t vocab, int n_rows,
                   const kiln_sample_row *rows, const int32_t *history);

    /* ---- KV caches living in this backend's memory ---- */
    kiln_status (*kv_new)(kiln_backend *be, const kiln_kv_layer_desc *layers, int n_layers,
                          const kiln_kv_options *opts, int max_tokens, kiln_kv **out);
    /* Optional (NULL: none): kernels of paged caches whose pool lives in this backend's memory
     * (kv_pool_new_on; the engine uses them for every kind but the default f32). */
    const struct kv_device_ops *kv_paged_ops;
};

/* The decode-layer fusions as the unfused ops of `be` in order: the CPU's implementation (same
 * bits as calling them one by one) and other backends' fallback where their kernel does not apply.
 */
void kiln_backend_matmul_norm_composed(kiln_backend *be, int count, float *const *ys,
                                       const float *x, float *h, int64_t n,
                                       const kiln_matrix *const *ws, const float *norm_w, float eps,
                                       bool plus_one);
void kiln_backend_matmul_add_composed(kiln_backend *be, float *y, const float *x, float *tmp,
                                      int64_t n, const kiln_matrix *w);
void kiln_backend_matmul_norm_glu_composed(kiln_backend *be, float *out, const float *x, float *h,
                                           float *up, int64_t n, const kiln_matrix *wg,
                                           const kiln_matrix *wu, const float *norm_w, float eps,
                                           bool plus_one, kiln_glu_act act);

kiln_status kiln_backend_cpu_new(int n_threads, kiln_backend **out);
#ifdef KILN_HAVE_CUDA
kiln_status kiln_backend_cuda_new(int n_threads, kiln_backend **out);
#endif
/* Creates the backend for a device ("cuda" fails with a clear message when not built / no GPU). */
kiln_status kiln_backend_new(kiln_device device, int n_threads, kiln_backend **out);

static inline void kiln_backend_free(kiln_backend *be) {
    if (be) be->destroy(be);
}

#endif
