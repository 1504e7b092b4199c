/* tok_util.c — the tokenizer's small shared helpers: byte buffers, id lists, two open-addressing
 * hash maps (string -> id, u64 -> u64), UTF-8 decoding/validation/lossy repair, the Unicode
 * predicates HF's Rust code uses (char::is_whitespace, is_numeric, punctuation), the GPT-2
 * byte <-> code point table and the piece list. */
#include "tokenizer/tok_internal.h"

#include "util/status.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- buffers ------------------------------------------------------------------------------- */
kiln_status tok_buf_reserve(tok_buf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return KILN_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (%zu bytes)", cap);
    b->p = p;
    b->cap = cap;
    return KILN_OK;
}

kiln_status tok_buf_put(tok_buf *b, const void *s, size_t n) {
    KILN_TRY(tok_buf_reserve(b, n));
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return KILN_OK;
}

kiln_status tok_buf_putc(tok_buf *b, char c) {
    return tok_buf_put(b, &c, 1);
}

kiln_status tok_buf_put_cp(tok_buf *b, int32_t cp) {
    uint8_t tmp[4];
    utf8proc_ssize_t n = utf8proc_encode_char(cp, tmp);
    if (n <= 0) return kiln_error(KILN_ERR_INTERNAL, "tokenizer: cannot encode U+%04X", cp);
    return tok_buf_put(b, tmp, (size_t)n);
}

void tok_buf_free(tok_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

kiln_status tok_buf_take(tok_buf *b, char **out) {
    KILN_TRY(tok_buf_reserve(b, 0));
    b->p[b->n] = 0;
    *out = b->p;
    b->p = NULL;
    b->n = b->cap = 0;
    return KILN_OK;
}

kiln_status tok_ids_push(tok_ids *a, int32_t id) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (%zu ids)", cap);
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return KILN_OK;
}

void tok_ids_free(tok_ids *a) {
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

/* ---- hashing ------------------------------------------------------------------------------- */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

uint64_t tok_hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0x100000001b3ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = mix64(h ^ w) * 0x9e3779b97f4a7c15ULL;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)s[i] << (8 * i);
    return mix64(h ^ w ^ 0xa0761d6478bd642fULL);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

kiln_status tok_strmap_init(tok_strmap *m, size_t expected) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expected * 2 + 1);
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->klen = calloc(m->cap, sizeof *m->klen);
    m->vals = calloc(m->cap, sizeof *m->vals);
    if (!m->keys || !m->klen || !m->vals) {
        tok_strmap_free(m);
        return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (string map)");
    }
    return KILN_OK;
}

static kiln_status strmap_grow(tok_strmap *m) {
    tok_strmap g;
    KILN_TRY(tok_strmap_init(&g, m->cap));
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i]) tok_strmap_put(&g, m->keys[i], m->klen[i], m->vals[i]);
    tok_strmap_free(m);
    *m = g;
    return KILN_OK;
}

kiln_status tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val) {
    if ((m->n + 1) * 2 > m->cap) KILN_TRY(strmap_grow(m));
    size_t mask = m->cap - 1, i = tok_hash_bytes(key, len) & mask;
    while (m->keys[i]) {
        if (m->klen[i] == len && memcmp(m->keys[i], key, len) == 0) {
            m->vals[i] = val;
            return KILN_OK;
        }
        i = (i + 1) & mask;
    }
    m->keys[i] = key;
    m->klen[i] = (uint32_t)len;
    m->vals[i] = val;
    m->n++;
    return KILN_OK;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    size_t mask = m->cap - 1, i = tok_hash_bytes(key, len) & mask;
    while (m->keys[i]) {
        if (m->klen[i] == len && memcmp(m->keys[i], key, len) == 0) return m->vals[i];
        i = (i + 1) & mask;
    }
    return -1;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->keys);
    free(m->klen);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

kiln_status tok_u64map_init(tok_u64map *m, size_t expected) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expected * 2 + 1);
    m->keys = malloc(m->cap * sizeof *m->keys);
    m->vals = malloc(m->cap * sizeof *m->vals);
    if (!m->keys || !m->vals) {
        tok_u64map_free(m);
        return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (u64 map)");
    }
    memset(m->keys, 0xff, m->cap * sizeof *m->keys);
    return KILN_OK;
}

kiln_status tok_u64map_put(tok_u64map *m, uint64_t key, uint64_t val) {
    if ((m->n + 1) * 2 > m->cap) {
        tok_u64map g;
        KILN_TRY(tok_u64map_init(&g, m->cap));
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i] != UINT64_MAX) tok_u64map_put(&g, m->keys[i], m->vals[i]);
        tok_u64map_free(m);
        *m = g;
    }
    size_t mask = m->cap - 1, i = mix64(key) & mask;
    while (m->keys[i] != UINT64_MAX) {
        if (m->keys[i] == key) {
            m->vals[i] = val;
            return KILN_OK;
        }
        i = (i + 1) & mask;
    }
    m->keys[i] = key;
    m->vals[i] = val;
    m->n++;
    return KILN_OK;
}

bool tok_u64map_get(const tok_u64map *m, uint64_t key, uint64_t *val) {
    if (!m->cap) return false;
    size_t mask = m->cap - 1, i = mix64(key) & mask;
    while (m->keys[i] != UINT64_MAX) {
        if (m->keys[i] == key) {
            *val = m->vals[i];
            return true;
        }
        i = (i + 1) & mask;
    }
    return false;
}

void tok_u64map_free(tok_u64map *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */
size_t tok_utf8_decode(const char *str, size_t n, int32_t *cp) {
    const uint8_t *s = (const uint8_t *)str;
    if (n == 0) return 0;
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    int32_t v;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        v = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        v = c & 0x0f;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        v = c & 0x07;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        return 0;
    }
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        uint8_t b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) return 0;
        v = (v << 6) | (b & 0x3f);
    }
    *cp = v;
    return len;
}

size_t tok_utf8_validate(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if ((uint8_t)s[i] < 0x80) {
            i++;
            continue;
        }
        int32_t cp;
        size_t k = tok_utf8_decode(s + i, n - i, &cp);
        if (!k) return i;
        i += k;
    }
    return n;
}

/* Length of the maximal prefix of an invalid sequence that could start a valid one (>= 1). */
static size_t utf8_invalid_span(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    size_t len;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else
        return 1;
    size_t i = 1;
    for (; i < len && i < n; i++) {
        uint8_t b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) break;
    }
    return i;
}

kiln_status tok_utf8_lossy(tok_buf *out, const char *str, size_t n) {
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0, run = 0;
    while (i < n) {
        int32_t cp;
        size_t k = s[i] < 0x80 ? 1 : tok_utf8_decode(str + i, n - i, &cp);
        if (k) {
            i += k;
            continue;
        }
        KILN_TRY(tok_buf_put(out, str + run, i - run));
        KILN_TRY(tok_buf_put(out, "\xef\xbf\xbd", 3));
        i += utf8_invalid_span(s + i, n - i);
        run = i;
    }
    return tok_buf_put(out, str + run, n - run);
}

/* ---- Unicode predicates --------------------------------------------------------------------- */
bool tok_is_whitespace(int32_t cp) {
    if (cp >= 0x09 && cp <= 0x0d) return true;
    switch (cp) {
    case 0x20:
    case 0x85:
    case 0xa0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202f:
    case 0x205f:
    case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200a;
    }
}

bool tok_is_numeric(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool tok_is_punctuation(int32_t cp) {
    if (cp < 0x80)
        return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
               (cp >= 123 && cp <= 126);
    utf8proc_category_t c = utf8proc_category(cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

bool tok_is_alnum(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

/* ---- GPT-2 byte table ----------------------------------------------------------------------- */
static bool byte_is_printable(int b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

int32_t tok_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    int k = 0;
    for (int i = 0; i < b; i++)
        if (!byte_is_printable(i)) k++;
    return 256 + k;
}

int tok_cp_to_byte(int32_t cp) {
    if (cp < 256) return byte_is_printable(cp) ? cp : -1;
    if (cp >= 256 + 68) return -1;
    int k = cp - 256;
    for (int b = 0; b < 256; b++)
        if (!byte_is_printable(b) && k-- == 0) return b;
    return -1;
}

/* ---- pieces --------------------------------------------------------------------------------- */
kiln_status tok_spans_put(tok_spans *s, tok_span sp, size_t count) {
    if (s->n + count > s->cap) {
        size_t cap = s->cap ? s->cap : 64;
        while (cap < s->n + count) cap *= 2;
        tok_span *v = realloc(s->v, cap * sizeof *v);
        if (!v) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (alignments)");
        s->v = v;
        s->cap = cap;
    }
    for (size_t i = 0; i < count; i++) s->v[s->n++] = sp;
    return KILN_OK;
}

kiln_status tok_spans_append(tok_spans *s, const tok_span *v, size_t n) {
    if (!n) return KILN_OK;
    size_t at = s->n;
    KILN_TRY(tok_spans_put(s, v[0], n));
    memcpy(s->v + at, v, n * sizeof *v);
    return KILN_OK;
}

void tok_spans_free(tok_spans *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

kiln_status tok_pieces_push(tok_pieces *ps, const char *s, size_t len, const tok_span *al,
                            int32_t id, bool origin) {
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 16;
        tok_piece *v = realloc(ps->v, cap * sizeof *v);
        if (!v) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (pieces)");
        ps->v = v;
        ps->cap = cap;
    }
    size_t off = ps->text.n;
    KILN_TRY(tok_buf_put(&ps->text, s, len));
    KILN_TRY(tok_spans_append(&ps->al, al, len));
    ps->v[ps->n++] = (tok_piece){off, len, id, origin};
    return KILN_OK;
}

void tok_pieces_reset(tok_pieces *ps) {
    ps->n = 0;
    ps->text.n = 0;
    ps->al.n = 0;
}

void tok_pieces_free(tok_pieces *ps) {
    tok_buf_free(&ps->text);
    tok_spans_free(&ps->al);
    free(ps->v);
    memset(ps, 0, sizeof *ps);
}
