/* tok_pattern.c — the patterns of Split pre-tokenizers and Replace normalizers/decoders: a
 * literal string or an Oniguruma-style regex run with PCRE2 (UTF + UCP, JIT). HF compiles these
 * regexes with Oniguruma, whose Unicode \s also matches U+0085 (NEL); PCRE2's does not, so \s and
 * \S are widened on compile to keep splits identical. */
#include "tokenizer/tok_internal.h"

#include "util/status.h"

#include <stdlib.h>
#include <string.h>

/* Rewrites \s / \S to include U+0085 (see the file comment). */
static kiln_status widen_space_classes(const char *src, size_t n, tok_buf *out) {
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        if (c == '\\' && i + 1 < n) {
            char e = src[i + 1];
            if (e == 's') {
                KILN_TRY(in_class ? tok_buf_put(out, "\\s\\x{85}", 8)
                                  : tok_buf_put(out, "[\\s\\x{85}]", 10));
            } else if (e == 'S' && !in_class) {
                KILN_TRY(tok_buf_put(out, "[^\\s\\x{85}]", 11));
            } else {
                KILN_TRY(tok_buf_put(out, src + i, 2));
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            KILN_TRY(tok_buf_putc(out, c));
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < n && src[i + 1] == '^') KILN_TRY(tok_buf_putc(out, src[++i]));
            if (i + 1 < n && src[i + 1] == ']') KILN_TRY(tok_buf_putc(out, src[++i]));
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && src[i + 1] == ':') {
            const char *end = strstr(src + i + 2, ":]");
            if (end && (size_t)(end - src) < n) {
                size_t k = (size_t)(end - src) + 2 - i;
                KILN_TRY(tok_buf_put(out, src + i, k));
                i += k - 1;
                continue;
            }
        }
        if (in_class && c == ']') in_class = false;
        KILN_TRY(tok_buf_putc(out, c));
    }
    return KILN_OK;
}

kiln_status tok_pattern_parse(const cJSON *j, const char *what, tok_pattern *out) {
    memset(out, 0, sizeof *out);
    if (!cJSON_IsObject(j))
        return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: %s: pattern must be an object", what);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "Regex");
    if (cJSON_IsString(s)) {
        out->literal_len = strlen(s->valuestring);
        out->literal = strdup(s->valuestring);
        if (!out->literal) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
        return KILN_OK;
    }
    if (!cJSON_IsString(r))
        return kiln_error(KILN_ERR_FORMAT,
                          "tokenizer.json: %s: pattern needs a \"String\" or \"Regex\" field",
                          what);
    tok_buf src = {0};
    kiln_status st = widen_space_classes(r->valuestring, strlen(r->valuestring), &src);
    if (st != KILN_OK) return st;
    int err;
    PCRE2_SIZE erroff;
    out->re = pcre2_compile((PCRE2_SPTR)src.p, src.n, PCRE2_UTF | PCRE2_UCP, &err, &erroff, NULL);
    tok_buf_free(&src);
    if (!out->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: %s: bad regex '%s' at offset %zu: %s",
                          what, r->valuestring, (size_t)erroff, (const char *)msg);
    }
    pcre2_jit_compile(out->re, PCRE2_JIT_COMPLETE); /* best effort: falls back to the interpreter */
    return KILN_OK;
}

void tok_pattern_free(tok_pattern *p) {
    free(p->literal);
    if (p->re) pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

static kiln_status push_span(size_t **spans, size_t *count, size_t *cap, size_t a, size_t b) {
    if (*count == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        size_t *v = realloc(*spans, c * 2 * sizeof *v);
        if (!v) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (matches)");
        *spans = v;
        *cap = c;
    }
    (*spans)[2 * *count] = a;
    (*spans)[2 * *count + 1] = b;
    (*count)++;
    return KILN_OK;
}

kiln_status tok_pattern_find(const tok_pattern *p, const char *s, size_t n, size_t **spans,
                             size_t *count) {
    *spans = NULL;
    *count = 0;
    size_t cap = 0;
    kiln_status st = KILN_OK;
    if (p->literal) {
        if (p->literal_len == 0) return KILN_OK;
        for (size_t i = 0; i + p->literal_len <= n;) {
            const char *hit = memmem(s + i, n - i, p->literal, p->literal_len);
            if (!hit) break;
            size_t a = (size_t)(hit - s);
            if ((st = push_span(spans, count, &cap, a, a + p->literal_len)) != KILN_OK) break;
            i = a + p->literal_len;
        }
    } else {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->re, NULL);
        if (!md) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (regex)");
        size_t pos = 0;
        while (pos <= n) {
            int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(rc, msg, sizeof msg);
                st = kiln_error(KILN_ERR_INVALID_ARG, "tokenizer: regex match failed: %s",
                                (const char *)msg);
                break;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t a = ov[0], b = ov[1];
            if (b < a) b = a; /* \K tricks: treat as empty */
            if ((st = push_span(spans, count, &cap, a, b)) != KILN_OK) break;
            if (b > a) {
                pos = b;
            } else {
                /* empty match: step one character, as Oniguruma's iterator does */
                if (b >= n) break;
                int32_t cp;
                size_t k = tok_utf8_decode(s + b, n - b, &cp);
                pos = b + (k ? k : 1);
            }
        }
        pcre2_match_data_free(md);
    }
    if (st != KILN_OK) {
        free(*spans);
        *spans = NULL;
        *count = 0;
    }
    return st;
}
