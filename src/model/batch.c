/* batch.c — what every family's forward does first with a batch: the token ids and positions
 * uploaded to the backend, and the caches gathered for one batched store + attend per layer. */
#include "model/model.h"

#include "util/hash.h"
#include "util/status.h"

#include <stdlib.h>

int kiln_graph_max_batch(void) {
    static int cached = -1; /* read once: the environment does not change under a running model */
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("KILN_GRAPH_MAX_BATCH");
        v = e && *e ? atoi(e) : 64;
        if (v < 0) v = 0;
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

bool kiln_decode_step_recordable(const kiln_backend *be, const kiln_batch_kv *b, int64_t T,
                                 int n_entries) {
    return be->graph_begin && b->ok && T == n_entries && T <= kiln_graph_max_batch();
}

uint64_t kiln_decode_step_key(const void *family, const void *acts, const void *ids,
                              const kiln_batch_kv *b, int n_entries) {
    uint64_t key = kiln_hash_mix(kiln_hash_mix(0, (uintptr_t)family), (uintptr_t)acts);
    key = kiln_hash_mix(key, (uintptr_t)ids);
    key = kiln_hash_mix(key, (uint64_t)n_entries);
    for (int i = 0; i < n_entries; i++) {
        if (!b->kvs[i]->vt->graph_key) return 0;
        const uint64_t k = b->kvs[i]->vt->graph_key(b->kvs[i], b->n[i]);
        if (!k) return 0;
        key = kiln_hash_mix(key, k);
    }
    return key;
}

kiln_status kiln_batch_kv_init(kiln_batch_kv *b, const kiln_batch_entry *e, int n_entries) {
    b->vt = e[0].seq->kv->vt;
    b->ok = b->vt->store_attend_batch != NULL;
    for (int i = 1; b->ok && i < n_entries; i++) b->ok = e[i].seq->kv->vt == b->vt;
    b->kvs = NULL;
    b->n = NULL;
    if (!b->ok) return KILN_OK;
    b->kvs = malloc((size_t)n_entries * sizeof *b->kvs);
    b->n = malloc((size_t)n_entries * sizeof *b->n);
    if (!b->kvs || !b->n) {
        kiln_batch_kv_free(b);
        return kiln_error(KILN_ERR_OOM, "out of memory (batch of %d)", n_entries);
    }
    for (int i = 0; i < n_entries; i++) b->kvs[i] = e[i].seq->kv, b->n[i] = e[i].n_tokens;
    return KILN_OK;
}

void kiln_batch_kv_free(kiln_batch_kv *b) {
    free(b->kvs);
    free(b->n);
    b->kvs = NULL;
    b->n = NULL;
    b->ok = false;
}

kiln_status kiln_batch_upload_ids(kiln_backend *be, const kiln_batch_entry *e, int n_entries,
                                  int64_t T, int32_t *tok_pos) {
    int32_t *host = malloc((size_t)(2 * T) * sizeof *host);
    if (!host) return kiln_error(KILN_ERR_OOM, "out of memory for %lld tokens", (long long)T);
    for (int i = 0, t = 0; i < n_entries; i++)
        for (int j = 0; j < e[i].n_tokens; j++, t++) {
            host[t] = e[i].tokens[j];
            host[T + t] = e[i].seq->kv->len + j;
        }
    be->upload(be, tok_pos, host, (size_t)(2 * T) * sizeof *host);
    free(host);
    return KILN_OK;
}

kiln_status kiln_batch_reserve(kiln_batch_entry *e, int n_entries) {
    for (int i = 0; i < n_entries; i++)
        KILN_TRY(e[i].seq->kv->vt->reserve(e[i].seq->kv, e[i].n_tokens));
    return KILN_OK;
}

kiln_status kiln_batch_begin(kiln_backend *be, kiln_batch_kv *b, const kiln_batch_entry *e,
                             int n_entries, int64_t T, int32_t *tok_pos) {
    KILN_TRY(kiln_batch_kv_init(b, e, n_entries));
    const kiln_status st = kiln_batch_upload_ids(be, e, n_entries, T, tok_pos);
    if (st != KILN_OK) kiln_batch_kv_free(b);
    return st;
}

void kiln_batch_commit(kiln_batch_entry *e, int n_entries) {
    for (int i = 0; i < n_entries; i++) e[i].seq->kv->vt->commit(e[i].seq->kv, e[i].n_tokens);
}
