/* logits_head.c — the end of every family's forward pass: the final RMSNorm on just the rows whose
 * logits were asked for, the LM head, optional final soft-capping (Gemma; the backend's softcap op,
 * so the logits are final in backend memory), the copy into each
 * entry's logits_out — one download when the entries' buffers lie end to end (a batch decoding
 * into one array), so a GPU step waits once — and the token choice of entries that carry a
 * sampler: on a device backend by its `sample` op, copying back only the ids; on the CPU (or with
 * KILN_GPU_SAMPLING=0, or soft-capped logits) by kiln_sampler_sample on host logits. */
#include "model/model.h"

#include "engine/sampler_rows.h"
#include "util/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int64_t entry_rows(const kiln_batch_entry *e) {
    return e->logits == KILN_LOGITS_ALL ? e->n_tokens : e->logits == KILN_LOGITS_LAST;
}

void kiln_batch_sizes(const kiln_batch_entry *e, int n_entries, int64_t *tokens, int64_t *rows) {
    *tokens = *rows = 0;
    for (int i = 0; i < n_entries; i++) {
        *tokens += e[i].n_tokens;
        *rows += entry_rows(&e[i]);
    }
}

/* Whether the backend's sample op picks the tokens: on device backends unless
 * KILN_GPU_SAMPLING=0 (the logits row is downloaded and the host samples); KILN_GPU_SAMPLING=force
 * also routes the CPU backend through its op (the reference), so tests cover this path without a
 * GPU. Soft-capped logits are already final in backend memory. */
static bool use_sample_op(const kiln_backend *be, const kiln_logits_head *h) {
    const char *v = getenv("KILN_GPU_SAMPLING");
    (void)h;
    if (!be->sample || (v && strcmp(v, "0") == 0)) return false;
    return be->device != KILN_DEVICE_CPU || (v && strcmp(v, "force") == 0);
}

/* The sample requests of the batch (m->sample_requests, parallel to e[]) pick their tokens from
 * logits [R, V] (backend memory): an entry's row is the last of its rows. */
static kiln_status sample_entries(kiln_model *m, const kiln_logits_head *h, kiln_batch_entry *e,
                                  int n_entries, float *logits) {
    kiln_backend *be = m->be;
    const int64_t V = h->vocab;
    const kiln_sample_request *q = m->sample_requests;
    int n_sampled = 0, n_window = 0;
    for (int i = 0; q && i < n_entries; i++)
        if (q[i].sampler) n_sampled++, n_window += q[i].n_history;
    if (n_sampled == 0) return KILN_OK;
    if (!use_sample_op(be, h)) {
        int64_t r = 0;
        for (int i = 0; i < n_entries; r += entry_rows(&e[i]), i++) {
            if (!q[i].sampler) continue;
            const int64_t row = r + entry_rows(&e[i]) - 1;
            float *x = logits + row * V; /* host memory on the CPU backend: sampled in place */
            if (be->device != KILN_DEVICE_CPU) {
                if (!m->sample_host_row &&
                    !(m->sample_host_row = malloc((size_t)V * sizeof(float))))
                    return kiln_error(KILN_ERR_OOM, "out of memory (sampling row)");
                x = m->sample_host_row;
                be->download(be, x, logits + row * V, (size_t)V * sizeof(float));
            }
            *q[i].token_out = kiln_sampler_sample(q[i].sampler, x, q[i].history, q[i].n_history);
        }
        return KILN_OK;
    }
    kiln_sample_row *rows = malloc((size_t)n_sampled * sizeof *rows);
    int32_t *window = malloc((size_t)(n_window > 0 ? n_window : 1) * sizeof *window);
    int32_t *ids = malloc((size_t)n_sampled * sizeof *ids);
    kiln_status st = rows && window && ids ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
    if (st == KILN_OK)
        st = kiln_scratch_reserve(be, &m->sample_ids, (size_t)n_sampled * sizeof(int32_t));
    if (st == KILN_OK) {
        int k = 0, n_copied = 0;
        int64_t r = 0;
        for (int i = 0; i < n_entries; r += entry_rows(&e[i]), i++) {
            if (!q[i].sampler) continue;
            kiln_sample_row *row = &rows[k++];
            int start =
                kiln_sampler_fill_row(q[i].sampler, q[i].n_history, r + entry_rows(&e[i]) - 1, row);
            row->history_offset = n_copied;
            if (row->n_history > 0)
                memcpy(window + n_copied, q[i].history + start,
                       (size_t)row->n_history * sizeof *window);
            n_copied += row->n_history;
        }
        be->sample(be, m->sample_ids.ptr, logits, V, n_sampled, rows, window);
        be->download(be, ids, m->sample_ids.ptr, (size_t)n_sampled * sizeof *ids);
        if (be->synchronize) st = be->synchronize(be);
        for (int i = 0, j = 0; st == KILN_OK && i < n_entries; i++)
            if (q[i].sampler) *q[i].token_out = ids[j++];
    }
    free(rows);
    free(window);
    free(ids);
    return st;
}

kiln_status kiln_logits_head_run(kiln_model *m, const kiln_logits_head *h, kiln_batch_entry *e,
                                 int n_entries, const float *x, float *rows,
                                 kiln_scratch *logits_scratch) {
    kiln_backend *be = m->be;
    const int64_t H = h->hidden, V = h->vocab;
    int64_t R = 0;
    for (int i = 0, t = 0; i < n_entries; t += e[i].n_tokens, i++) {
        int64_t nr = entry_rows(&e[i]);
        if (!nr) continue;
        be->rmsnorm(be, rows + R * H, x + (int64_t)(t + e[i].n_tokens - nr) * H, h->final_norm, nr,
                    H, h->eps, h->plus_one);
        R += nr;
    }
    if (R == 0) return KILN_OK;
    KILN_TRY(kiln_scratch_reserve(be, logits_scratch, (size_t)(R * V) * sizeof(float)));
    float *logits = logits_scratch->ptr; /* [R, vocab] on the backend */
    be->matmul(be, logits, rows, R, h->lm_head);
    if (h->softcap > 0) be->softcap(be, logits, h->softcap, R * V);

    bool one_copy = true;
    float *dst0 = NULL;
    int64_t r = 0;
    for (int i = 0; one_copy && i < n_entries; i++) {
        int64_t nr = entry_rows(&e[i]);
        if (!nr) continue;
        if (!e[i].logits_out) {
            one_copy = false;
            break;
        }
        if (!dst0) dst0 = e[i].logits_out - r * V;
        one_copy = e[i].logits_out == dst0 + r * V;
        r += nr;
    }
    if (one_copy && dst0 && r == R) {
        be->download(be, dst0, logits, (size_t)(R * V) * sizeof(float));
        return sample_entries(m, h, e, n_entries, logits);
    }
    r = 0;
    for (int i = 0; i < n_entries; i++) {
        int64_t nr = entry_rows(&e[i]);
        if (nr && e[i].logits_out) {
            be->download(be, e[i].logits_out, logits + r * V, (size_t)(nr * V) * sizeof(float));
        }
        r += nr;
    }
    return sample_entries(m, h, e, n_entries, logits);
}
