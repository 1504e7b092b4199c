/* logits_head.c — the end of every family's forward pass: the final RMSNorm on just the rows whose
 * logits were asked for, the LM head, optional final soft-capping (Gemma; the backend's softcap op,
 * so the logits are final in backend memory), and the copy into each entry's logits_out — one
 * download when the entries' buffers lie end to end (a batch decoding into one array), so a GPU
 * step waits once. */
#include "model/model.h"

#include "util/status.h"

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
        return KILN_OK;
    }
    r = 0;
    for (int i = 0; i < n_entries; i++) {
        int64_t nr = entry_rows(&e[i]);
        if (nr && e[i].logits_out) {
            be->download(be, e[i].logits_out, logits + r * V, (size_t)(nr * V) * sizeof(float));
        }
        r += nr;
    }
    return KILN_OK;
}
