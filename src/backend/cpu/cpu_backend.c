/* cpu_backend.c — the CPU backend: fills the kiln_backend table with the kernels of cpu_ops.h.
 * Weights stay in the mmap'd file (upload_matrix copies only the small f32 bias); activations
 * live in ordinary heap memory. */
#include "backend/backend.h"
#include "backend/cpu/cpu_deltanet.h"
#include "backend/cpu/cpu_ops.h"
#include "kv/kv_factory.h"
#include "util/status.h"

#include <stdlib.h>
#include <string.h>

static void cpu_destroy(kiln_backend *be) {
    kiln_threadpool_free(be->pool);
    free(be);
}

static void *cpu_alloc(kiln_backend *be, size_t bytes) {
    (void)be;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}
static void cpu_free(kiln_backend *be, void *p) {
    free(p);
}
static void cpu_copy(kiln_backend *be, void *dst, const void *src, size_t n) {
    if (dst != src) memcpy(dst, src, n);
}

static kiln_status cpu_upload_matrix(kiln_backend *be, const kiln_matrix *host, kiln_matrix *out) {
    *out = *host;
    out->bias = NULL;
    if (host->bias) {
        float *b = malloc((size_t)host->rows * sizeof(float));
        if (!b) return kiln_error(KILN_ERR_OOM, "out of memory for bias");
        memcpy(b, host->bias, (size_t)host->rows * sizeof(float));
        out->bias = b;
    }
    return KILN_OK;
}

static void cpu_free_matrix(kiln_backend *be, kiln_matrix *m) {
    free((void *)m->bias);
    m->bias = NULL;
}

static kiln_status cpu_sync(kiln_backend *be) {
    return KILN_OK;
}

static void cpu_matmul(kiln_backend *be, float *y, const float *x, int64_t n,
                       const kiln_matrix *w) {
    kiln_cpu_matmul(be->pool, y, x, n, w);
}
static void cpu_embed(kiln_backend *be, float *out, const int32_t *ids, int64_t n,
                      const kiln_matrix *w) {
    kiln_cpu_embed(out, ids, n, w);
}
/* The elementwise and per-row ops below run on the pool when they have at least PAR_MIN
 * elements (prefill; a decode step's vectors stay on the caller, where a pool round would cost
 * more than it saves). Each element / row is computed exactly as by the serial kernel, so the
 * results do not depend on the split. */
#define PAR_MIN   32768
#define PAR_GRAIN 4096 /* elements per slice unit of the elementwise ops */

typedef struct {
    float *y;
    const float *a, *b, *w;
    const int32_t *pos;
    int64_t dim;
    float eps;
    bool plus_one;
    int n_heads, head_dim, rot_dim;
    int op; /* 0 rmsnorm, 1 rope, 2 silu_mul, 3 gelu_tanh_mul, 4 add */
} rowwise_job;

static void rowwise_slice(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const rowwise_job *j = ctx;
    switch (j->op) {
    case 0: /* rows [b, e) */
        kiln_cpu_rmsnorm(j->y + b * j->dim, j->a + b * j->dim, j->w, e - b, j->dim, j->eps,
                         j->plus_one);
        break;
    case 1: /* tokens [b, e) */
        kiln_cpu_rope(j->y + b * j->n_heads * j->head_dim, j->pos + b, e - b, j->n_heads,
                      j->head_dim, j->rot_dim, j->w);
        break;
    case 2:
        kiln_cpu_silu_mul(j->y + b, j->a + b, j->b + b, e - b);
        break;
    case 3:
        kiln_cpu_gelu_tanh_mul(j->y + b, j->a + b, j->b + b, e - b);
        break;
    default:
        kiln_cpu_add(j->y + b, j->a + b, j->b + b, e - b);
        break;
    }
}

static void cpu_rmsnorm(kiln_backend *be, float *y, const float *x, const float *w, int64_t n,
                        int64_t dim, float eps, bool plus_one) {
    if (n < 2 || n * dim < PAR_MIN) {
        kiln_cpu_rmsnorm(y, x, w, n, dim, eps, plus_one);
        return;
    }
    rowwise_job j = {.y = y, .a = x, .w = w, .dim = dim, .eps = eps, .plus_one = plus_one, .op = 0};
    kiln_parallel_for(be->pool, n, 1, rowwise_slice, &j);
}
static void cpu_rope(kiln_backend *be, float *x, const int32_t *pos, int64_t n, int n_heads,
                     int head_dim, int rot_dim, const float *inv_freq) {
    if (n < 2 || n * n_heads * head_dim < PAR_MIN) {
        kiln_cpu_rope(x, pos, n, n_heads, head_dim, rot_dim, inv_freq);
        return;
    }
    rowwise_job j = {.y = x,
                     .w = inv_freq,
                     .pos = pos,
                     .n_heads = n_heads,
                     .head_dim = head_dim,
                     .rot_dim = rot_dim,
                     .op = 1};
    kiln_parallel_for(be->pool, n, 1, rowwise_slice, &j);
}
static void elementwise(kiln_backend *be, int op, float *y, const float *a, const float *b,
                        int64_t n) {
    rowwise_job j = {.y = y, .a = a, .b = b, .op = op};
    if (n < PAR_MIN)
        rowwise_slice(&j, 0, n, 0);
    else
        kiln_parallel_for(be->pool, n, PAR_GRAIN, rowwise_slice, &j);
}
static void cpu_silu_mul(kiln_backend *be, float *y, const float *g, const float *u, int64_t n) {
    elementwise(be, 2, y, g, u, n);
}
static void cpu_gelu_tanh_mul(kiln_backend *be, float *y, const float *g, const float *u,
                              int64_t n) {
    elementwise(be, 3, y, g, u, n);
}
static void cpu_add(kiln_backend *be, float *y, const float *a, const float *b, int64_t n) {
    elementwise(be, 4, y, a, b, n);
}
static void cpu_scale(kiln_backend *be, float *x, float s, int64_t n) {
    kiln_cpu_scale(x, s, n);
}
static void cpu_softcap(kiln_backend *be, float *x, float cap, int64_t n) {
    kiln_cpu_softcap(x, cap, n);
}
static void cpu_matmul_multi(kiln_backend *be, int count, float *const *ys, const float *x,
                             int64_t n, const kiln_matrix *const *ws) {
    kiln_cpu_matmul_multi(be->pool, count, ys, x, n, ws);
}
/* The fused ops run the unfused ones in order (so on the pool at prefill sizes): the CPU gains
 * nothing from fusing them and keeps its results bit for bit. */
static void cpu_add_rmsnorm(kiln_backend *be, float *x, const float *h, float *y, const float *w,
                            int64_t n, int64_t dim, float eps, bool plus_one) {
    cpu_add(be, x, x, h, n * dim);
    cpu_rmsnorm(be, y, x, w, n, dim, eps, plus_one);
}
static void cpu_norm_add(kiln_backend *be, float *x, float *h, const float *w, int64_t n,
                         int64_t dim, float eps, bool plus_one, float scale) {
    cpu_rmsnorm(be, h, h, w, n, dim, eps, plus_one);
    cpu_add(be, x, x, h, n * dim);
    if (scale != 1.0f) cpu_scale(be, x, scale, n * dim);
}
static void cpu_qk_norm_rope(kiln_backend *be, float *q, float *k, const int32_t *pos, int64_t n,
                             int n_heads, int n_kv_heads, int head_dim, int rot_dim,
                             const float *inv_freq, const float *q_norm, const float *k_norm,
                             float eps) {
    if (q_norm) cpu_rmsnorm(be, q, q, q_norm, n * n_heads, head_dim, eps, false);
    if (k_norm) cpu_rmsnorm(be, k, k, k_norm, n * n_kv_heads, head_dim, eps, false);
    cpu_rope(be, q, pos, n, n_heads, head_dim, rot_dim, inv_freq);
    cpu_rope(be, k, pos, n, n_kv_heads, head_dim, rot_dim, inv_freq);
}
static void cpu_copy2d(kiln_backend *be, float *dst, int64_t ds, const float *src, int64_t ss,
                       int64_t rows, int64_t cols) {
    kiln_cpu_copy2d(dst, ds, src, ss, rows, cols);
}
static void cpu_copy3d(kiln_backend *be, float *dst, int64_t d0, int64_t d1, const float *src,
                       int64_t s0, int64_t s1, int64_t n0, int64_t n1, int64_t cols) {
    kiln_cpu_copy3d(dst, d0, d1, src, s0, s1, n0, n1, cols);
}
static void cpu_zero(kiln_backend *be, float *x, int64_t n) {
    kiln_cpu_zero(x, n);
}
static void cpu_sigmoid_mul(kiln_backend *be, float *y, const float *x, const float *g, int64_t n) {
    kiln_cpu_sigmoid_mul(y, x, g, n);
}
static void cpu_sample(kiln_backend *be, int32_t *ids, float *logits, int64_t vocab, int n_rows,
                       const kiln_sample_row *rows, const int32_t *history) {
    kiln_cpu_sample_ref(ids, logits, vocab, n_rows, rows, history);
}
static void cpu_l2norm(kiln_backend *be, float *x, int64_t rows, int dim, float eps) {
    kiln_gdn_l2norm(x, rows, dim, eps);
}
/* the two fused DeltaNet ops as the unfused ones in order (bit for bit) */
static void cpu_gdn_split_qkv(kiln_backend *be, float *q, float *k, float *v, const float *conv,
                              int64_t n, int64_t C, int nk, int dk, int64_t vd, float eps) {
    const int64_t KD = (int64_t)nk * dk;
    kiln_cpu_copy2d(q, KD, conv, C, n, KD);
    kiln_cpu_copy2d(k, KD, conv + KD, C, n, KD);
    kiln_cpu_copy2d(v, vd, conv + 2 * KD, C, n, vd);
    kiln_gdn_l2norm(q, n * nk, dk, eps);
    kiln_gdn_l2norm(k, n * nk, dk, eps);
}
static void cpu_gated_rmsnorm(kiln_backend *be, float *y, const float *x, const float *z,
                              const float *w, int64_t rows, int dim, float eps) {
    cpu_rmsnorm(be, y, x, w, rows, dim, eps, false);
    cpu_silu_mul(be, y, z, y, rows * dim);
}
/* the batched DeltaNet ops run the single-sequence kernels sequence by sequence */
static void cpu_gdn_conv(kiln_backend *be, float *out, const float *x, int n_seqs,
                         const int *n_tokens, int channels, const float *w, int kernel,
                         float *const *states) {
    for (int i = 0; i < n_seqs; i++) {
        if (n_tokens[i] > 0) kiln_gdn_conv(out, x, n_tokens[i], channels, w, kernel, states[i]);
        out += (int64_t)n_tokens[i] * channels;
        x += (int64_t)n_tokens[i] * channels;
    }
}
static void cpu_gdn_gates(kiln_backend *be, float *g, float *beta, const float *a, const float *b,
                          int64_t n, int nv, const float *neg_a, const float *dt_bias) {
    kiln_cpu_gdn_gates(g, beta, a, b, n, nv, neg_a, dt_bias);
}
/* per sequence: decode steps run the recurrence, prefill the chunked WY form (chunks of 64) */
static void cpu_gdn_delta(kiln_backend *be, const kiln_gdn_dims *d, int n_seqs, const int *n_tokens,
                          const float *q, const float *k, const float *v, const float *g,
                          const float *beta, float *const *states, float *out) {
    const int64_t KD = (int64_t)d->n_k_heads * d->dk, VD = (int64_t)d->n_v_heads * d->dv;
    int64_t o = 0; /* first row of sequence i */
    for (int i = 0; i < n_seqs; o += n_tokens[i], i++) {
        const int n = n_tokens[i];
        if (n <= 0) continue;
        if (n == 1)
            kiln_gdn_recurrent(d, n, q + o * KD, k + o * KD, v + o * VD, g + o * d->n_v_heads,
                               beta + o * d->n_v_heads, states[i], out + o * VD, be->pool);
        else
            kiln_gdn_chunked(d, n, 64, q + o * KD, k + o * KD, v + o * VD, g + o * d->n_v_heads,
                             beta + o * d->n_v_heads, states[i], out + o * VD, be->pool);
    }
}
static void cpu_gather_rows(kiln_backend *be, float *dst, const float *src, const int32_t *rows,
                            int64_t n, int64_t width) {
    kiln_cpu_gather_rows(dst, src, rows, n, width);
}
static void cpu_moe_route(kiln_backend *be, int32_t *experts, float *weights, const float *logits,
                          int64_t T, int n_experts, int top_k, bool norm_topk,
                          const float *expert_scale) {
    (void)be;
    kiln_cpu_moe_route_ref(experts, weights, logits, T, n_experts, top_k, norm_topk, expert_scale);
}
/* The CPU routes on the host by default (moe_device_max_tokens 0): these run only when
 * KILN_MOE_DEVICE_TOKENS forces the device forward (tests), so they are the references. */
static void cpu_matmul_gather(kiln_backend *be, float *y, const float *x, int64_t x_div, int64_t n,
                              const int32_t *experts, const kiln_matrix *stack, int64_t rows) {
    (void)be;
    kiln_cpu_matmul_gather_ref(y, x, x_div, n, experts, stack, rows);
}
static void cpu_matmul_gather_glu(kiln_backend *be, float *y, const float *x, int64_t x_div,
                                  int64_t n, const int32_t *experts, const kiln_matrix *gate,
                                  const kiln_matrix *up, int64_t rows, int64_t stride,
                                  int64_t up_offset, kiln_glu_act act) {
    (void)be;
    kiln_cpu_matmul_gather_glu_ref(y, x, x_div, n, experts, gate, up, rows, stride, up_offset,
                                   (int)act);
}
static void cpu_moe_combine(kiln_backend *be, float *y, const float *ye, const float *weights,
                            int64_t T, int top_k, int64_t hidden, const float *shared,
                            const float *shared_logit) {
    (void)be;
    kiln_cpu_moe_combine_ref(y, ye, weights, T, top_k, hidden, shared, shared_logit);
}
static void cpu_scatter_add_rows(kiln_backend *be, float *y, const float *src, const int32_t *rows,
                                 const float *w, int64_t n, int64_t width) {
    kiln_cpu_scatter_add_rows(y, src, rows, w, n, width);
}
static kiln_status cpu_kv_new(kiln_backend *be, const kiln_kv_layer_desc *layers, int n_layers,
                              const kiln_kv_options *opts, int max_tokens, kiln_kv **out) {
    return kiln_kv_cpu_new(layers, n_layers, opts, max_tokens, out);
}

kiln_status kiln_backend_cpu_new(int n_threads, kiln_backend **out) {
    *out = NULL;
    kiln_backend *be = calloc(1, sizeof *be);
    if (!be) return kiln_error(KILN_ERR_OOM, "out of memory");
    kiln_status st = kiln_threadpool_new(n_threads, &be->pool);
    if (st != KILN_OK) {
        free(be);
        return st;
    }
    be->name = "cpu";
    be->device = KILN_DEVICE_CPU;
    be->destroy = cpu_destroy;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->upload_matrix = cpu_upload_matrix;
    be->free_matrix = cpu_free_matrix;
    be->synchronize = cpu_sync;
    be->matmul = cpu_matmul;
    be->embed = cpu_embed;
    be->rmsnorm = cpu_rmsnorm;
    be->rope = cpu_rope;
    be->silu_mul = cpu_silu_mul;
    be->gelu_tanh_mul = cpu_gelu_tanh_mul;
    be->add = cpu_add;
    be->scale = cpu_scale;
    be->softcap = cpu_softcap;
    be->matmul_multi = cpu_matmul_multi;
    be->add_rmsnorm = cpu_add_rmsnorm;
    be->norm_add = cpu_norm_add;
    be->matmul_norm = kiln_backend_matmul_norm_composed;
    be->matmul_add = kiln_backend_matmul_add_composed;
    be->matmul_norm_glu = kiln_backend_matmul_norm_glu_composed;
    be->qk_norm_rope = cpu_qk_norm_rope;
    be->copy2d = cpu_copy2d;
    be->copy3d = cpu_copy3d;
    be->zero = cpu_zero;
    be->sigmoid_mul = cpu_sigmoid_mul;
    be->l2norm = cpu_l2norm;
    be->gdn_split_qkv = cpu_gdn_split_qkv;
    be->gated_rmsnorm = cpu_gated_rmsnorm;
    be->gdn_conv = cpu_gdn_conv;
    be->gdn_gates = cpu_gdn_gates;
    be->gdn_delta = cpu_gdn_delta;
    be->gather_rows = cpu_gather_rows;
    be->scatter_add_rows = cpu_scatter_add_rows;
    be->moe_route = cpu_moe_route;
    be->matmul_gather = cpu_matmul_gather;
    be->matmul_gather_glu = cpu_matmul_gather_glu;
    be->moe_combine = cpu_moe_combine;
    be->moe_device_max_tokens = 0; /* the bucketed experts read each selected one once */
    be->sample = cpu_sample;
    be->kv_new = cpu_kv_new;
    *out = be;
    return KILN_OK;
}

kiln_status kiln_set_cpu_matmul_mode(const char *mode) {
    if (!mode || kiln_cpu_matmul_mode_set(mode) != 0)
        return kiln_error(KILN_ERR_INVALID_ARG, "matmul mode '%s': use exact or fast",
                          mode ? mode : "(null)");
    return KILN_OK;
}
