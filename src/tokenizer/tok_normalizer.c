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

static kiln_status unicode_form(const char *s, size_t len, int options, tok_buf *out) {
    if (len == 0) return KILN_OK;
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &res,
                                      (utf8proc_option_t)(options | UTF8PROC_STABLE));
    if (r < 0) {
        free(res);
        return kiln_error(KILN_ERR_INVALID_ARG, "tokenizer: normalization failed: %s",
                          utf8proc_errmsg(r));
    }
    kiln_status st = tok_buf_put(out, res, (size_t)r);
    free(res);
    return st;
}

/* Rust's char::to_lowercase plus str::to_lowercase's final-sigma rule. */
static kiln_status lowercase(const char *s, size_t len, tok_buf *out) {
    for (size_t i = 0; i < len;) {
        int32_t cp;
        size_t k = tok_utf8_decode(s + i, len - i, &cp);
        if (!k) return kiln_error(KILN_ERR_INVALID_ARG, "tokenizer: invalid UTF-8 in Lowercase");
        if (cp == 0x130) { /* İ -> i + combining dot above */
            KILN_TRY(tok_buf_put(out, "i\xcc\x87", 3));
        } else if (cp == 0x3a3) {
            /* final sigma: preceded by a cased letter and not followed by one */
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
            KILN_TRY(tok_buf_put_cp(out, before && !after ? 0x3c2 : 0x3c3));
        } else {
            KILN_TRY(tok_buf_put_cp(out, utf8proc_tolower(cp)));
        }
        i += k;
    }
    return KILN_OK;
}

static kiln_status strip(const tok_normalizer *n, const char *s, size_t len, tok_buf *out) {
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
    return tok_buf_put(out, s + a, b - a);
}

static kiln_status replace(const tok_normalizer *n, const char *s, size_t len, tok_buf *out) {
    size_t *spans, count;
    KILN_TRY(tok_pattern_find(&n->pattern, s, len, &spans, &count));
    kiln_status st = KILN_OK;
    size_t prev = 0;
    for (size_t i = 0; i < count && st == KILN_OK; i++) {
        st = tok_buf_put(out, s + prev, spans[2 * i] - prev);
        if (st == KILN_OK) st = tok_buf_put(out, n->text, n->text_len);
        prev = spans[2 * i + 1];
    }
    if (st == KILN_OK) st = tok_buf_put(out, s + prev, len - prev);
    free(spans);
    return st;
}

kiln_status tok_normalize(const tok_normalizer *n, const char *s, size_t len, tok_buf *out) {
    switch (n->type) {
    case N_NFC:
        return unicode_form(s, len, UTF8PROC_COMPOSE, out);
    case N_NFD:
        return unicode_form(s, len, UTF8PROC_DECOMPOSE, out);
    case N_NFKC:
        return unicode_form(s, len, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out);
    case N_NFKD:
        return unicode_form(s, len, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out);
    case N_LOWER:
        return lowercase(s, len, out);
    case N_STRIP:
        return strip(n, s, len, out);
    case N_PREPEND:
        if (len) KILN_TRY(tok_buf_put(out, n->text, n->text_len));
        return tok_buf_put(out, s, len);
    case N_REPLACE:
        return replace(n, s, len, out);
    case N_SEQ: {
        tok_buf a = {0}, b = {0};
        kiln_status st = tok_buf_put(&a, s, len);
        for (size_t i = 0; i < n->n_subs && st == KILN_OK; i++) {
            b.n = 0;
            st = tok_normalize(n->subs[i], a.p, a.n, &b);
            tok_buf t = a;
            a = b;
            b = t;
        }
        if (st == KILN_OK) st = tok_buf_put(out, a.p, a.n);
        tok_buf_free(&a);
        tok_buf_free(&b);
        return st;
    }
    }
    return kiln_error(KILN_ERR_INTERNAL, "tokenizer: bad normalizer");
}
