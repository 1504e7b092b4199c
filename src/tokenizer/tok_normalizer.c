/* tok_normalizer.c — tokenizer.json normalizers: NFC/NFD/NFKC/NFKD (utf8proc), Lowercase (full
 * Unicode lowercase as Rust's str::to_lowercase), Strip, Prepend, Replace (literal or regex) and
 * Sequence. Unknown types fail naming the type. */
#include "tokenizer/tok_internal.h"

#include "util/status.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

typedef enum { N_NFC, N_NFD, N_NFKC, N_NFKD, N_LOWER, N_STRIP, N_PREPEND, N_REPLACE, N_SEQ } ntype;

struct tok_normalizer {
    ntype type;
    bool strip_left, strip_right;
    char *text; /* Prepend: prepend; Replace: content */
    size_t text_len;
    tok_pattern pattern;
    tok_normalizer **subs;
    size_t n_subs;
};

void tok_normalizer_free(tok_normalizer *n) {
    if (!n) return;
    free(n->text);
    tok_pattern_free(&n->pattern);
    for (size_t i = 0; i < n->n_subs; i++) tok_normalizer_free(n->subs[i]);
    free(n->subs);
    free(n);
}

static kiln_status dup_field(const cJSON *j, const char *key, const char *type, char **out,
                             size_t *len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsString(v))
        return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: normalizer %s needs string '%s'", type,
                          key);
    *len = strlen(v->valuestring);
    *out = strdup(v->valuestring);
    return *out ? KILN_OK : kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
}

kiln_status tok_normalizer_parse(const cJSON *j, tok_normalizer **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return KILN_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t))
        return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: normalizer without a \"type\"");
    const char *type = t->valuestring;
    tok_normalizer *n = calloc(1, sizeof *n);
    if (!n) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    kiln_status st = KILN_OK;
    if (!strcmp(type, "NFC"))
        n->type = N_NFC;
    else if (!strcmp(type, "NFD"))
        n->type = N_NFD;
    else if (!strcmp(type, "NFKC"))
        n->type = N_NFKC;
    else if (!strcmp(type, "NFKD"))
        n->type = N_NFKD;
    else if (!strcmp(type, "Lowercase"))
        n->type = N_LOWER;
    else if (!strcmp(type, "Strip")) {
        n->type = N_STRIP;
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "strip_left");
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "strip_right");
        n->strip_left = l ? cJSON_IsTrue(l) : true;
        n->strip_right = r ? cJSON_IsTrue(r) : true;
    } else if (!strcmp(type, "Prepend")) {
        n->type = N_PREPEND;
        st = dup_field(j, "prepend", type, &n->text, &n->text_len);
    } else if (!strcmp(type, "Replace")) {
        n->type = N_REPLACE;
        st = dup_field(j, "content", type, &n->text, &n->text_len);
        if (st == KILN_OK)
            st = tok_pattern_parse(cJSON_GetObjectItemCaseSensitive(j, "pattern"),
                                   "normalizer Replace", &n->pattern);
    } else if (!strcmp(type, "Sequence")) {
        n->type = N_SEQ;
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "normalizers");
        if (!cJSON_IsArray(list)) {
            st = kiln_error(KILN_ERR_FORMAT,
                            "tokenizer.json: normalizer Sequence needs a 'normalizers' array");
        } else {
            size_t cnt = (size_t)cJSON_GetArraySize(list);
            n->subs = calloc(cnt ? cnt : 1, sizeof *n->subs);
            if (!n->subs) st = kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
            for (const cJSON *e = list->child; e && st == KILN_OK; e = e->next) {
                tok_normalizer *sub = NULL;
                st = tok_normalizer_parse(e, &sub);
                if (st == KILN_OK && sub) n->subs[n->n_subs++] = sub;
            }
        }
    } else {
        st = kiln_error(KILN_ERR_UNSUPPORTED, "tokenizer.json: unsupported normalizer type '%s'",
                        type);
    }
    if (st != KILN_OK) {
        tok_normalizer_free(n);
        return st;
    }
    *out = n;
    return KILN_OK;
}

/* ---- alignment tracking --------------------------------------------------------------------- */
/* One output char of a transform and its HF "change": 0 replaces the next input char, -k also
 * removes the k chars after it, +1 is inserted (and takes the span of the byte before it). */
typedef struct tchar {
    int32_t cp;
    int change;
    int ccc;
} tchar;

/* HF NormalizedString::transform over s[0..len) with spans al: writes each output char to out and
 * its span to oal; skip = chars removed before the first output char. */
static kiln_status transform(const char *s, size_t len, const tok_span *al, const tchar *tc,
                             size_t n, size_t skip, tok_buf *out, tok_spans *oal) {
    size_t off = 0;
    for (; skip > 0 && off < len; skip--) {
        int32_t cp;
        size_t k = tok_utf8_decode(s + off, len - off, &cp);
        off += k ? k : 1;
    }
    tok_span base = len ? (tok_span){al[0].a, al[0].a} : (tok_span){0, 0};
    for (size_t i = 0; i < n; i++) {
        tok_span sp;
        if (tc[i].change > 0)
            sp = off ? al[off - 1] : base;
        else
            sp = off < len ? al[off] : (len ? al[len - 1] : base);
        for (int r = tc[i].change > 0 ? 0 : 1 - tc[i].change; r > 0 && off < len; r--) {
            int32_t cp;
            size_t k = tok_utf8_decode(s + off, len - off, &cp);
            off += k ? k : 1;
        }
        size_t at = out->n;
        KILN_TRY(tok_buf_put_cp(out, tc[i].cp));
        KILN_TRY(tok_spans_put(oal, sp, out->n - at));
    }
    return KILN_OK;
}

typedef struct tchars {
    tchar *v;
    size_t n, cap;
} tchars;

static kiln_status tchars_push(tchars *t, int32_t cp, int change) {
    if (t->n == t->cap) {
        size_t c = t->cap ? t->cap * 2 : 64;
        tchar *v = realloc(t->v, c * sizeof *v);
        if (!v) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (normalizer)");
        t->v = v;
        t->cap = c;
    }
    t->v[t->n++] = (tchar){cp, change, utf8proc_get_property(cp)->combining_class};
    return KILN_OK;
}

/* The primary composite of a + b, or -1 (canonical composition incl. Hangul, via utf8proc). */
static int32_t compose_pair(int32_t a, int32_t b) {
    utf8proc_int32_t buf[2] = {a, b};
    utf8proc_ssize_t r = utf8proc_normalize_utf32(buf, 2, UTF8PROC_COMPOSE | UTF8PROC_STABLE);
    return r == 1 ? buf[0] : -1;
}

/* unicode-normalization-alignments (what HF uses): decomposition marks each char's first
 * decomposed char 0 and the rest +1, canonical ordering keeps the marks with their chars, and
 * composition gives composee+ch the change composee.change + ch.change - 1. */
static kiln_status unicode_changes(const char *s, size_t len, int options, bool compose,
                                   tchars *res) {
    tchars d = {0};
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < len && st == KILN_OK;) {
        int32_t cp;
        size_t k = tok_utf8_decode(s + i, len - i, &cp);
        if (!k) return kiln_error(KILN_ERR_INVALID_ARG, "tokenizer: invalid UTF-8 in normalizer");
        i += k;
        utf8proc_int32_t buf[32];
        int bc = 0;
        utf8proc_ssize_t m = utf8proc_decompose_char(cp, buf, 32, (utf8proc_option_t)options, &bc);
        if (m < 1 || m > 32) {
            buf[0] = cp;
            m = 1;
        }
        for (utf8proc_ssize_t j = 0; j < m && st == KILN_OK; j++)
            st = tchars_push(&d, buf[j], j > 0);
    }
    /* canonical ordering: stable sort of each run of non-starters by combining class */
    for (size_t i = 1; i < d.n; i++) {
        tchar x = d.v[i];
        if (!x.ccc) continue;
        size_t j = i;
        while (j > 0 && d.v[j - 1].ccc > x.ccc) {
            d.v[j] = d.v[j - 1];
            j--;
        }
        d.v[j] = x;
    }
    if (!compose || st != KILN_OK) {
        *res = d;
        return st;
    }
    /* Recompositions::next */
    tchars buffer = {0};
    bool have = false, have_last = false;
    tchar comp = {0};
    int last_ccc = 0;
    for (size_t i = 0; i < d.n && st == KILN_OK; i++) {
        tchar ch = d.v[i];
        if (!have) {
            if (ch.ccc != 0) {
                st = tchars_push(res, ch.cp, ch.change);
                continue;
            }
            comp = ch;
            have = true;
            continue;
        }
        int32_t r;
        if (!have_last) {
            if ((r = compose_pair(comp.cp, ch.cp)) >= 0) {
                comp = (tchar){r, comp.change + ch.change - 1, 0};
                continue;
            }
            if (ch.ccc == 0) {
                st = tchars_push(res, comp.cp, comp.change);
                comp = ch;
                continue;
            }
            st = tchars_push(&buffer, ch.cp, ch.change);
            last_ccc = ch.ccc;
            have_last = true;
            continue;
        }
        if (last_ccc >= ch.ccc) {
            if (ch.ccc == 0) {
                st = tchars_push(res, comp.cp, comp.change);
                for (size_t b = 0; b < buffer.n && st == KILN_OK; b++)
                    st = tchars_push(res, buffer.v[b].cp, buffer.v[b].change);
                buffer.n = 0;
                comp = ch;
                have_last = false;
                continue;
            }
            st = tchars_push(&buffer, ch.cp, ch.change);
            last_ccc = ch.ccc;
            continue;
        }
        if ((r = compose_pair(comp.cp, ch.cp)) >= 0) {
            comp = (tchar){r, comp.change + ch.change - 1, 0};
            continue;
        }
        st = tchars_push(&buffer, ch.cp, ch.change);
        last_ccc = ch.ccc;
    }
    if (have && st == KILN_OK) st = tchars_push(res, comp.cp, comp.change);
    for (size_t b = 0; b < buffer.n && st == KILN_OK; b++)
        st = tchars_push(res, buffer.v[b].cp, buffer.v[b].change);
    free(buffer.v);
    free(d.v);
    return st;
}

static kiln_status unicode_form(const char *s, size_t len, const tok_span *al, int options,
                                tok_buf *out, tok_spans *oal) {
    if (len == 0) return KILN_OK;
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &res,
                                      (utf8proc_option_t)(options | UTF8PROC_STABLE));
    if (r < 0) {
        free(res);
        return kiln_error(KILN_ERR_INVALID_ARG, "tokenizer: normalization failed: %s",
                          utf8proc_errmsg(r));
    }
    tchars tc = {0};
    tok_buf mine = {0};
    tok_spans mal = {0};
    int dopt = UTF8PROC_DECOMPOSE | (options & UTF8PROC_COMPAT);
    kiln_status st = unicode_changes(s, len, dopt, (options & UTF8PROC_COMPOSE) != 0, &tc);
    if (st == KILN_OK) st = transform(s, len, al, tc.v, tc.n, 0, &mine, &mal);
    if (st == KILN_OK) st = tok_buf_put(out, res, (size_t)r);
    if (st == KILN_OK) {
        if (mine.n == (size_t)r && memcmp(mine.p, res, (size_t)r) == 0) {
            st = tok_spans_append(oal, mal.v, mal.n);
        } else {
            /* not expected: fall back to the whole piece's span for every byte */
            tok_span w = al[0];
            for (size_t i = 1; i < len; i++) {
                if (al[i].a < w.a) w.a = al[i].a;
                if (al[i].b > w.b) w.b = al[i].b;
            }
            st = tok_spans_put(oal, w, (size_t)r);
        }
    }
    free(res);
    free(tc.v);
    tok_buf_free(&mine);
    tok_spans_free(&mal);
    return st;
}

/* Appends the lowercase of the char at s with the span sp for each of its bytes. */
static kiln_status put_cp_al(tok_buf *out, tok_spans *oal, int32_t cp, tok_span sp) {
    size_t at = out->n;
    KILN_TRY(tok_buf_put_cp(out, cp));
    return tok_spans_put(oal, sp, out->n - at);
}

/* Rust's char::to_lowercase plus str::to_lowercase's final-sigma rule; every output char keeps
 * the span of the char it comes from. */
static kiln_status lowercase(const char *s, size_t len, const tok_span *al, tok_buf *out,
                             tok_spans *oal) {
    for (size_t i = 0; i < len;) {
        int32_t cp;
        size_t k = tok_utf8_decode(s + i, len - i, &cp);
        if (!k) return kiln_error(KILN_ERR_INVALID_ARG, "tokenizer: invalid UTF-8 in Lowercase");
        tok_span sp = al[i];
        if (cp == 0x130) { /* İ -> i + combining dot above */
            KILN_TRY(put_cp_al(out, oal, 'i', sp));
            KILN_TRY(put_cp_al(out, oal, 0x307, sp));
        } else if (cp ==
                   0x3a3) { /* final sigma: preceded by a cased letter and not followed by one */
            bool before = false, after = false;
            for (size_t j = i; j > 0;) {
                size_t b = j - 1;
                while (b > 0 && ((uint8_t)s[b] & 0xc0) == 0x80) b--;
                int32_t c;
                tok_utf8_decode(s + b, j - b, &c);
                const utf8proc_property_t *p = utf8proc_get_property(c);
                if (p->ignorable || utf8proc_category(c) == UTF8PROC_CATEGORY_MN ||
                    utf8proc_category(c) == UTF8PROC_CATEGORY_ME ||
                    utf8proc_category(c) == UTF8PROC_CATEGORY_CF) {
                    j = b;
                    continue;
                }
                before = utf8proc_tolower(c) != c || utf8proc_toupper(c) != c;
                break;
            }
            for (size_t j = i + k; j < len;) {
                int32_t c;
                size_t kk = tok_utf8_decode(s + j, len - j, &c);
                if (!kk) break;
                if (utf8proc_category(c) == UTF8PROC_CATEGORY_MN ||
                    utf8proc_category(c) == UTF8PROC_CATEGORY_ME ||
                    utf8proc_category(c) == UTF8PROC_CATEGORY_CF) {
                    j += kk;
                    continue;
                }
                after = utf8proc_tolower(c) != c || utf8proc_toupper(c) != c;
                break;
            }
            KILN_TRY(put_cp_al(out, oal, before && !after ? 0x3c2 : 0x3c3, sp));
        } else {
            KILN_TRY(put_cp_al(out, oal, utf8proc_tolower(cp), sp));
        }
        i += k;
    }
    return KILN_OK;
}

static kiln_status strip(const tok_normalizer *n, const char *s, size_t len, const tok_span *al,
                         tok_buf *out, tok_spans *oal) {
    size_t a = 0, b = len;
    while (n->strip_left && a < b) {
        int32_t cp;
        size_t k = tok_utf8_decode(s + a, b - a, &cp);
        if (!k || !tok_is_whitespace(cp)) break;
        a += k;
    }
    while (n->strip_right && b > a) {
        size_t p = b - 1;
        while (p > a && ((uint8_t)s[p] & 0xc0) == 0x80) p--;
        int32_t cp;
        size_t k = tok_utf8_decode(s + p, b - p, &cp);
        if (!k || !tok_is_whitespace(cp)) break;
        b = p;
    }
    KILN_TRY(tok_buf_put(out, s + a, b - a));
    return tok_spans_append(oal, al + a, b - a);
}

/* Replace: the content of each match takes the span of the match's last byte (HF transform_range
 * with every content char inserted). */
static kiln_status replace(const tok_normalizer *n, const char *s, size_t len, const tok_span *al,
                           tok_buf *out, tok_spans *oal) {
    size_t *spans, count;
    KILN_TRY(tok_pattern_find(&n->pattern, s, len, &spans, &count));
    kiln_status st = KILN_OK;
    size_t prev = 0;
    tok_span base = len ? (tok_span){al[0].a, al[0].a} : (tok_span){0, 0};
    for (size_t i = 0; i < count && st == KILN_OK; i++) {
        size_t a = spans[2 * i], b = spans[2 * i + 1];
        st = tok_buf_put(out, s + prev, a - prev);
        if (st == KILN_OK) st = tok_spans_append(oal, al + prev, a - prev);
        if (st == KILN_OK) st = tok_buf_put(out, n->text, n->text_len);
        if (st == KILN_OK) st = tok_spans_put(oal, b ? al[b - 1] : base, n->text_len);
        prev = b;
    }
    if (st == KILN_OK) st = tok_buf_put(out, s + prev, len - prev);
    if (st == KILN_OK) st = tok_spans_append(oal, al + prev, len - prev);
    free(spans);
    return st;
}

kiln_status tok_normalize(const tok_normalizer *n, const char *s, size_t len, const tok_span *al,
                          tok_buf *out, tok_spans *oal) {
    static const tok_span none = {0, 0};
    if (!al) al = &none; /* len == 0 */
    switch (n->type) {
    case N_NFC:
        return unicode_form(s, len, al, UTF8PROC_COMPOSE, out, oal);
    case N_NFD:
        return unicode_form(s, len, al, UTF8PROC_DECOMPOSE, out, oal);
    case N_NFKC:
        return unicode_form(s, len, al, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out, oal);
    case N_NFKD:
        return unicode_form(s, len, al, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out, oal);
    case N_LOWER:
        return lowercase(s, len, al, out, oal);
    case N_STRIP:
        return strip(n, s, len, al, out, oal);
    case N_PREPEND:
        /* HF prepend: the new text takes the span of the first char */
        if (len) {
            KILN_TRY(tok_buf_put(out, n->text, n->text_len));
            KILN_TRY(tok_spans_put(oal, al[0], n->text_len));
        }
        KILN_TRY(tok_buf_put(out, s, len));
        return tok_spans_append(oal, al, len);
    case N_REPLACE:
        return replace(n, s, len, al, out, oal);
    case N_SEQ: {
        tok_buf a = {0}, b = {0};
        tok_spans aa = {0}, ba = {0};
        kiln_status st = tok_buf_put(&a, s, len);
        if (st == KILN_OK) st = tok_spans_append(&aa, al, len);
        for (size_t i = 0; i < n->n_subs && st == KILN_OK; i++) {
            b.n = 0;
            ba.n = 0;
            st = tok_normalize(n->subs[i], a.p ? a.p : "", a.n, aa.v, &b, &ba);
            tok_buf t = a;
            a = b;
            b = t;
            tok_spans ts = aa;
            aa = ba;
            ba = ts;
        }
        if (st == KILN_OK) st = tok_buf_put(out, a.p, a.n);
        if (st == KILN_OK) st = tok_spans_append(oal, aa.v, aa.n);
        tok_buf_free(&a);
        tok_buf_free(&b);
        tok_spans_free(&aa);
        tok_spans_free(&ba);
        return st;
    }
    }
    return kiln_error(KILN_ERR_INTERNAL, "tokenizer: bad normalizer");
}
