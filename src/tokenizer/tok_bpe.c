/* tok_bpe.c — the BPE model of tokenizer.json ("type": "BPE"): vocab, merge ranks, byte-level and
 * SentencePiece-style options (byte_fallback, unk_token, fuse_unk, ignore_merges,
 * continuing_subword_prefix, end_of_word_suffix).
 *
 * Merging follows HF's Word::merge_all: every adjacent pair with a merge goes into a min-heap
 * ordered by (rank, position); the best pair is merged, stale heap entries are skipped, and the
 * new neighbour pairs are pushed. Pair -> (rank, new id) lives in a u64 hash. Results of words
 * are kept in a small direct-mapped cache (thread-safe: a mutex guards it). */
#include "tokenizer/tok_internal.h"

#include "util/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CACHE_SLOTS    16384
#define CACHE_MAX_WORD 256

typedef struct cache_slot {
    uint64_t hash;
    char *word; /* NULL = empty */
    size_t len;
    int32_t *ids; /* n_ids ids, then their n_ids byte lengths */
    size_t n_ids;
} cache_slot;

struct tok_bpe {
    char *arena;           /* every vocab string, NUL-separated */
    const char **id_tok;   /* [n_ids] token string of each id, NULL for holes */
    uint32_t *id_len;      /* [n_ids] */
    int32_t n_ids;         /* max id + 1 */
    tok_strmap vocab;      /* token -> id */
    tok_u64map merges;     /* (left << 32 | right) -> (rank << 32 | new id) */
    int32_t unk_id;        /* -1 if no unk_token */
    char *prefix, *suffix; /* continuing_subword_prefix / end_of_word_suffix ("" if unset) */
    size_t prefix_len, suffix_len;
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_ids[256]; /* id of "<0xXX>", -1 if absent */

    pthread_mutex_t cache_lock;
    cache_slot *cache; /* [CACHE_SLOTS] */
};

static const char *opt_string(const cJSON *model, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool opt_bool(const cJSON *model, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, key));
}

/* Splits one merge entry ("a b" or ["a", "b"]) into its two halves. */
static kiln_status merge_halves(const cJSON *m, size_t rank, const char **a, size_t *alen,
                                const char **b, size_t *blen) {
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return kiln_error(KILN_ERR_FORMAT,
                              "tokenizer.json: merge %zu '%s' is not two tokens separated by one "
                              "space",
                              rank, s);
        *a = s;
        *alen = (size_t)(sp - s);
        *b = sp + 1;
        *blen = strlen(sp + 1);
        return KILN_OK;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
        cJSON_IsString(m->child->next)) {
        *a = m->child->valuestring;
        *alen = strlen(*a);
        *b = m->child->next->valuestring;
        *blen = strlen(*b);
        return KILN_OK;
    }
    return kiln_error(KILN_ERR_FORMAT,
                      "tokenizer.json: merge %zu must be a string \"a b\" or a pair [\"a\", \"b\"]",
                      rank);
}

kiln_status tok_bpe_parse(const cJSON *model, tok_bpe **out) {
    *out = NULL;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab))
        return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: model.vocab must be an object");
    if (merges && !cJSON_IsArray(merges) && !cJSON_IsNull(merges))
        return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: model.merges must be an array");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0.0 && dropout->valuedouble < 1.0)
        return kiln_error(KILN_ERR_UNSUPPORTED, "tokenizer.json: BPE dropout is not supported");

    tok_bpe *m = calloc(1, sizeof *m);
    if (!m) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    pthread_mutex_init(&m->cache_lock, NULL);
    m->unk_id = -1;
    kiln_status st = KILN_OK;

    /* vocab: copy the strings into one arena */
    size_t total = 0, count = 0;
    int32_t max_id = -1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 16777216.0 ||
            e->valuedouble != (double)(int32_t)e->valuedouble) {
            st = kiln_error(KILN_ERR_FORMAT, "tokenizer.json: model.vocab['%s'] is not a valid id",
                            e->string ? e->string : "?");
            goto fail;
        }
        total += strlen(e->string) + 1;
        count++;
        if (e->valueint > max_id) max_id = e->valueint;
    }
    m->n_ids = max_id + 1;
    m->arena = malloc(total ? total : 1);
    m->id_tok = calloc((size_t)m->n_ids + 1, sizeof *m->id_tok);
    m->id_len = calloc((size_t)m->n_ids + 1, sizeof *m->id_len);
    m->cache = calloc(CACHE_SLOTS, sizeof *m->cache);
    if (!m->arena || !m->id_tok || !m->id_len || !m->cache) {
        st = kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (vocab of %zu)", count);
        goto fail;
    }
    if ((st = tok_strmap_init(&m->vocab, count)) != KILN_OK) goto fail;
    char *w = m->arena;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        size_t len = strlen(e->string);
        memcpy(w, e->string, len + 1);
        if ((st = tok_strmap_put(&m->vocab, w, len, e->valueint)) != KILN_OK) goto fail;
        m->id_tok[e->valueint] = w;
        m->id_len[e->valueint] = (uint32_t)len;
        w += len + 1;
    }

    const char *unk = opt_string(model, "unk_token");
    const char *prefix = opt_string(model, "continuing_subword_prefix");
    const char *suffix = opt_string(model, "end_of_word_suffix");
    m->prefix = strdup(prefix ? prefix : "");
    m->suffix = strdup(suffix ? suffix : "");
    if (!m->prefix || !m->suffix) {
        st = kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
        goto fail;
    }
    m->prefix_len = strlen(m->prefix);
    m->suffix_len = strlen(m->suffix);
    m->fuse_unk = opt_bool(model, "fuse_unk");
    m->byte_fallback = opt_bool(model, "byte_fallback");
    m->ignore_merges = opt_bool(model, "ignore_merges");
    if (unk) {
        m->unk_id = tok_strmap_get(&m->vocab, unk, strlen(unk));
        /* HF only fails when an unknown character actually needs it; keep -2 = "named but absent"
         */
        if (m->unk_id < 0) m->unk_id = -2;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->byte_ids[b] = tok_strmap_get(&m->vocab, name, 6);
    }

    /* merges */
    size_t n_merges = merges ? (size_t)cJSON_GetArraySize(merges) : 0;
    if ((st = tok_u64map_init(&m->merges, n_merges)) != KILN_OK) goto fail;
    size_t rank = 0;
    tok_buf joined = {0};
    for (const cJSON *e = merges ? merges->child : NULL; e; e = e->next, rank++) {
        const char *a = "", *b = "";
        size_t alen = 0, blen = 0;
        if ((st = merge_halves(e, rank, &a, &alen, &b, &blen)) != KILN_OK) break;
        int32_t ia = tok_strmap_get(&m->vocab, a, alen), ib = tok_strmap_get(&m->vocab, b, blen);
        if (ia < 0 || ib < 0) {
            st = kiln_error(KILN_ERR_FORMAT,
                            "tokenizer.json: merge %zu: token '%.*s' is not in the vocab", rank,
                            (int)(ia < 0 ? alen : blen), ia < 0 ? a : b);
            break;
        }
        /* the merged token drops b's continuing-subword prefix */
        size_t skip =
            (m->prefix_len && blen >= m->prefix_len && memcmp(b, m->prefix, m->prefix_len) == 0)
                ? m->prefix_len
                : 0;
        joined.n = 0;
        if ((st = tok_buf_put(&joined, a, alen)) != KILN_OK ||
            (st = tok_buf_put(&joined, b + skip, blen - skip)) != KILN_OK)
            break;
        int32_t nid = tok_strmap_get(&m->vocab, joined.p, joined.n);
        if (nid < 0) {
            st = kiln_error(KILN_ERR_FORMAT,
                            "tokenizer.json: merge %zu: result '%s' is not in the vocab", rank,
                            joined.p);
            break;
        }
        st = tok_u64map_put(&m->merges, (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib,
                            (uint64_t)rank << 32 | (uint32_t)nid);
        if (st != KILN_OK) break;
    }
    tok_buf_free(&joined);
    if (st != KILN_OK) goto fail;
    *out = m;
    return KILN_OK;
fail:
    tok_bpe_free(m);
    return st;
}

void tok_bpe_free(tok_bpe *m) {
    if (!m) return;
    free(m->arena);
    free(m->id_tok);
    free(m->id_len);
    tok_strmap_free(&m->vocab);
    tok_u64map_free(&m->merges);
    free(m->prefix);
    free(m->suffix);
    if (m->cache) {
        for (size_t i = 0; i < CACHE_SLOTS; i++) {
            free(m->cache[i].word);
            free(m->cache[i].ids);
        }
        free(m->cache);
    }
    pthread_mutex_destroy(&m->cache_lock);
    free(m);
}

int32_t tok_bpe_token_id(const tok_bpe *m, const char *s, size_t len) {
    return tok_strmap_get(&m->vocab, s, len);
}

const char *tok_bpe_id_to_token(const tok_bpe *m, int32_t id, size_t *len) {
    if (id < 0 || id >= m->n_ids || !m->id_tok[id]) return NULL;
    *len = m->id_len[id];
    return m->id_tok[id];
}

int32_t tok_bpe_max_id(const tok_bpe *m) {
    return m->n_ids - 1;
}

/* ---- the word cache ------------------------------------------------------------------------- */
static bool cache_get(tok_bpe *m, uint64_t h, const char *word, size_t len, tok_ids *out,
                      tok_ids *lens, kiln_status *st) {
    bool hit = false;
    pthread_mutex_lock(&m->cache_lock);
    cache_slot *c = &m->cache[h & (CACHE_SLOTS - 1)];
    if (c->word && c->hash == h && c->len == len && memcmp(c->word, word, len) == 0) {
        hit = true;
        for (size_t i = 0; i < c->n_ids && *st == KILN_OK; i++) *st = tok_ids_push(out, c->ids[i]);
        for (size_t i = 0; lens && i < c->n_ids && *st == KILN_OK; i++)
            *st = tok_ids_push(lens, c->ids[c->n_ids + i]);
    }
    pthread_mutex_unlock(&m->cache_lock);
    return hit;
}

static void cache_put(tok_bpe *m, uint64_t h, const char *word, size_t len, const int32_t *ids,
                      const int32_t *lens, size_t n) {
    char *w = malloc(len);
    int32_t *v = malloc(2 * n * sizeof *v + 1);
    if (!w || !v) {
        free(w);
        free(v);
        return; /* caching is optional */
    }
    memcpy(w, word, len);
    memcpy(v, ids, n * sizeof *v);
    memcpy(v + n, lens, n * sizeof *v);
    pthread_mutex_lock(&m->cache_lock);
    cache_slot *c = &m->cache[h & (CACHE_SLOTS - 1)];
    char *old_w = c->word;
    int32_t *old_ids = c->ids;
    *c = (cache_slot){h, w, len, v, n};
    pthread_mutex_unlock(&m->cache_lock);
    free(old_w);
    free(old_ids);
}

/* ---- merging -------------------------------------------------------------------------------- */
typedef struct sym {
    int32_t id;
    int32_t prev, next; /* -1 = none */
    int32_t len;        /* 0 = merged away */
} sym;

typedef struct heap_ent {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
} heap_ent;

static inline bool ent_less(heap_ent a, heap_ent b) {
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static void heap_push(heap_ent *h, size_t *n, heap_ent e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ent_less(e, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, size_t *n) {
    heap_ent top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && ent_less(h[c + 1], h[c])) c++;
        if (!ent_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static bool merge_lookup(const tok_bpe *m, int32_t a, int32_t b, uint32_t *rank, int32_t *nid) {
    uint64_t v;
    if (!tok_u64map_get(&m->merges, (uint64_t)(uint32_t)a << 32 | (uint32_t)b, &v)) return false;
    *rank = (uint32_t)(v >> 32);
    *nid = (int32_t)(uint32_t)v;
    return true;
}

static kiln_status sym_add(sym **s, size_t *n, size_t *cap, int32_t id, int32_t len) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 32;
        sym *v = realloc(*s, c * sizeof *v);
        if (!v) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (BPE word)");
        *s = v;
        *cap = c;
    }
    (*s)[*n] = (sym){id, (int32_t)*n - 1, (int32_t)*n + 1, len};
    (*n)++;
    return KILN_OK;
}

kiln_status tok_bpe_encode(const tok_bpe *cm, const char *word, size_t len, tok_ids *out,
                           tok_ids *lens) {
    tok_bpe *m = (tok_bpe *)cm; /* only the cache mutates, under its lock */
    if (len == 0) return KILN_OK;
    kiln_status st = KILN_OK;
    uint64_t h = 0;
    bool cacheable = len <= CACHE_MAX_WORD;
    if (cacheable) {
        h = tok_hash_bytes(word, len);
        if (cache_get(m, h, word, len, out, lens, &st)) return st;
    }
    if (m->ignore_merges) {
        int32_t id = tok_strmap_get(&m->vocab, word, len);
        if (id >= 0) {
            KILN_TRY(tok_ids_push(out, id));
            return lens ? tok_ids_push(lens, (int32_t)len) : KILN_OK;
        }
    }

    sym *s = NULL;
    size_t n = 0, cap = 0;
    heap_ent *heap = NULL;
    tok_buf tmp = {0};
    tok_ids lv = {0};                 /* byte length of each output token */
    int32_t unk_id = -1, unk_len = 0; /* pending unknown run */
    for (size_t i = 0; i < len;) {
        int32_t cp;
        size_t k = tok_utf8_decode(word + i, len - i, &cp);
        if (!k) k = 1;
        const char *piece = word + i;
        size_t plen = k;
        bool first = i == 0, last = i + k == len;
        if ((!first && m->prefix_len) || (last && m->suffix_len)) {
            tmp.n = 0;
            if (!first && (st = tok_buf_put(&tmp, m->prefix, m->prefix_len)) != KILN_OK) goto done;
            if ((st = tok_buf_put(&tmp, word + i, k)) != KILN_OK) goto done;
            if (last && (st = tok_buf_put(&tmp, m->suffix, m->suffix_len)) != KILN_OK) goto done;
            piece = tmp.p;
            plen = tmp.n;
        }
        int32_t id = tok_strmap_get(&m->vocab, piece, plen);
        if (id >= 0) {
            if (unk_len) {
                if ((st = sym_add(&s, &n, &cap, unk_id, unk_len)) != KILN_OK) goto done;
                unk_len = 0;
            }
            if ((st = sym_add(&s, &n, &cap, id, (int32_t)k)) != KILN_OK) goto done;
            i += k;
            continue;
        }
        if (m->byte_fallback) {
            bool all = true;
            for (size_t j = 0; j < plen; j++)
                if (m->byte_ids[(uint8_t)piece[j]] < 0) all = false;
            if (all) {
                /* HF adds the bytes without flushing a pending unk first */
                for (size_t j = 0; j < plen; j++)
                    if ((st = sym_add(&s, &n, &cap, m->byte_ids[(uint8_t)piece[j]], 1)) != KILN_OK)
                        goto done;
                i += k;
                continue;
            }
        }
        if (m->unk_id == -2) {
            st = kiln_error(KILN_ERR_FORMAT, "tokenizer.json: unk_token is not in the vocab");
            goto done;
        }
        if (m->unk_id >= 0) {
            if (unk_len && m->fuse_unk) {
                unk_len += (int32_t)k;
            } else {
                if (unk_len && (st = sym_add(&s, &n, &cap, unk_id, unk_len)) != KILN_OK) goto done;
                unk_id = m->unk_id;
                unk_len = (int32_t)k;
            }
        }
        i += k;
    }
    if (unk_len && (st = sym_add(&s, &n, &cap, unk_id, unk_len)) != KILN_OK) goto done;
    if (n == 0) goto done;
    s[n - 1].next = -1;

    /* merge_all */
    size_t hn = 0, hcap = n * 2 + 8;
    heap = malloc(hcap * sizeof *heap);
    if (!heap) {
        st = kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (BPE heap)");
        goto done;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t rank;
        int32_t nid;
        if (merge_lookup(m, s[i].id, s[i + 1].id, &rank, &nid))
            heap_push(heap, &hn, (heap_ent){rank, (uint32_t)i, nid});
    }
    while (hn) {
        heap_ent top = heap_pop(heap, &hn);
        sym *cur = &s[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        int32_t next_pos = cur->next;
        sym right = s[next_pos];
        uint32_t rank;
        int32_t nid;
        if (!merge_lookup(m, cur->id, right.id, &rank, &nid) || nid != top.new_id) continue;
        cur->id = top.new_id;
        cur->len += right.len;
        cur->next = right.next;
        s[next_pos].len = 0;
        if (right.next >= 0) s[right.next].prev = (int32_t)top.pos;
        if (hn + 2 > hcap) {
            hcap *= 2;
            heap_ent *nh = realloc(heap, hcap * sizeof *nh);
            if (!nh) {
                st = kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (BPE heap)");
                goto done;
            }
            heap = nh;
        }
        if (cur->prev >= 0 && merge_lookup(m, s[cur->prev].id, cur->id, &rank, &nid))
            heap_push(heap, &hn, (heap_ent){rank, (uint32_t)cur->prev, nid});
        if (cur->next >= 0 && merge_lookup(m, cur->id, s[cur->next].id, &rank, &nid))
            heap_push(heap, &hn, (heap_ent){rank, top.pos, nid});
    }
    size_t start = out->n;
    for (int32_t i = 0; i >= 0 && (size_t)i < n; i = s[i].next) {
        if ((st = tok_ids_push(out, s[i].id)) != KILN_OK) goto done;
        if ((st = tok_ids_push(&lv, s[i].len)) != KILN_OK) goto done;
    }
    for (size_t i = 0; lens && i < lv.n; i++)
        if ((st = tok_ids_push(lens, lv.v[i])) != KILN_OK) goto done;
    if (cacheable) cache_put(m, h, word, len, out->v + start, lv.v, out->n - start);
done:
    free(s);
    free(heap);
    tok_buf_free(&tmp);
    tok_ids_free(&lv);
    return st;
}
