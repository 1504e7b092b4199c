/* attention_cpu.c — causal multi-head attention (GQA, optional sliding window and logit
 * soft-capping) of new queries against K/V rows held contiguously. This is the CPU reference
 * every cache kind's attention is compared with. Work is split over (query, kv head) pairs, each
 * with the query heads of its GQA group. The scores and the weighted sum run through
 * kiln_cpu_dot_rows / kiln_cpu_axpy_rows: the same arithmetic as a dot / axpy per key, without a
 * call (and, for the sum, a load and store of the output) per key. */
#include "backend/cpu/cpu_ops.h"
#include "kv/kv_cache.h"

#include <math.h>
#include <stdlib.h>

typedef struct attn_job {
    const float *q;      /* [n, n_heads*head_dim] */
    const float *k_rows; /* [n_keys, n_kv_heads*head_dim] */
    const float *v_rows; /* [n_keys, n_kv_heads*v_head_dim] */
    float *out;          /* [n, n_heads*v_head_dim] */
    int n, pos0, n_keys, key_pos0, n_kv_heads, head_dim, v_head_dim, window;
    const kiln_attn_params *p;
} attn_job;

/* One work item: query t and kv head g with the `group` query heads that share it, so each K and
 * V row is read once for all of them (GQA). Per query head the operations and their order are
 * those of a loop over that head alone: scores in key order, softmax, weighted sum in key order. */
static void attn_slice(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const attn_job *j = ctx;
    const int n_heads = j->p->n_heads, group = n_heads / j->n_kv_heads;
    const int64_t kstride = (int64_t)j->n_kv_heads * j->head_dim;
    const int64_t vstride = (int64_t)j->n_kv_heads * j->v_head_dim;
    const size_t keys = (size_t)(j->n_keys > 0 ? j->n_keys : 1);
    float *scores = malloc((size_t)group * keys * sizeof(float)); /* [group, n_keys] */
    float *mx = malloc((size_t)group * 2 * sizeof(float));        /* max, then 1/sum, per head */
    if (!scores || !mx) { /* cannot happen in practice; leaves out untouched */
        free(scores);
        free(mx);
        return;
    }
    for (int64_t w = begin; w < end; w++) {
        /* queries in the order 0, n-1, 1, n-2, ...: causal rows grow with t, so contiguous
         * slices of work items then carry equal work (plain order gave the last thread ~3/4 of a
         * prefill's attention) */
        const int qi = (int)(w / j->n_kv_heads), g = (int)(w % j->n_kv_heads), h0 = g * group;
        const int t = qi % 2 == 0 ? qi / 2 : j->n - 1 - qi / 2;
        const int pos = j->pos0 + t;
        int first = j->window > 0 ? pos - j->window + 1 : 0;
        if (first < j->key_pos0) first = j->key_pos0;
        const int last = pos < j->key_pos0 + j->n_keys - 1 ? pos : j->key_pos0 + j->n_keys - 1;
        const float *q0 = j->q + (int64_t)t * n_heads * j->head_dim + (int64_t)h0 * j->head_dim;
        float *o0 = j->out + (int64_t)t * n_heads * j->v_head_dim + (int64_t)h0 * j->v_head_dim;
        for (int64_t d = 0; d < (int64_t)group * j->v_head_dim; d++) o0[d] = 0.0f;
        if (last < first) continue;
        const int cnt = last - first + 1;
        const float *k0 =
            j->k_rows + (int64_t)(first - j->key_pos0) * kstride + (int64_t)g * j->head_dim;
        const float *v0 =
            j->v_rows + (int64_t)(first - j->key_pos0) * vstride + (int64_t)g * j->v_head_dim;
        for (int r = 0; r < group; r++) {
            float *sc = scores + (size_t)r * keys;
            kiln_cpu_dot_rows(sc, q0 + (int64_t)r * j->head_dim, k0, kstride, cnt, j->head_dim);
            mx[r] = -INFINITY;
            for (int i = 0; i < cnt; i++) {
                float s = sc[i] * j->p->scale;
                if (j->p->softcap > 0) s = j->p->softcap * tanhf(s / j->p->softcap);
                sc[i] = s;
                if (s > mx[r]) mx[r] = s;
            }
        }
        for (int r = 0; r < group; r++) {
            float *sc = scores + (size_t)r * keys;
            mx[group + r] = 1.0f / kiln_cpu_exp_sum(sc, cnt, mx[r]);
            for (int i = 0; i < cnt; i++) sc[i] *= mx[group + r]; /* the weight of key i */
            kiln_cpu_axpy_rows(o0 + (int64_t)r * j->v_head_dim, sc, v0, vstride, cnt,
                               j->v_head_dim);
        }
    }
    free(scores);
    free(mx);
}

void kiln_attention_contiguous(const float *q, int n, int pos0, const float *k_rows,
                               const float *v_rows, int n_keys, int key_pos0, int n_kv_heads,
                               int head_dim, int v_head_dim, int window, float *out,
                               const kiln_attn_params *p, kiln_threadpool *pool) {
    attn_job j = {.q = q,
                  .k_rows = k_rows,
                  .v_rows = v_rows,
                  .out = out,
                  .n = n,
                  .pos0 = pos0,
                  .n_keys = n_keys,
                  .key_pos0 = key_pos0,
                  .n_kv_heads = n_kv_heads,
                  .head_dim = head_dim,
                  .v_head_dim = v_head_dim,
                  .window = window,
                  .p = p};
    int64_t work = (int64_t)n * n_kv_heads;
    kiln_parallel_for(pool, work, 1, attn_slice, &j);
}
