/* tok_decoder.c — tokenizer.json decoders as HF's decode_chain: ByteLevel (printable code points
 * back to bytes, lossy UTF-8), ByteFallback (<0xXX> runs -> UTF-8 or one U+FFFD per byte),
 * Metaspace, Fuse, Strip, Replace and Sequence. Each step maps a list of token strings to a new
 * list; the result is their concatenation. */
#include "tokenizer/tok_internal.h"

#include "util/status.h"

#include <stdlib.h>
#include <string.h>

typedef enum { D_BYTELEVEL, D_BYTEFALLBACK, D_METASPACE, D_FUSE, D_STRIP, D_REPLACE, D_SEQ } dtype;

struct tok_decoder {
    dtype type;
    int32_t replacement; /* Metaspace */
    bool prepend;        /* Metaspace: prepend_scheme != never */
    int32_t content_cp;  /* Strip */
    size_t start, stop;  /* Strip */
    char *content;       /* Replace */
    size_t content_len;
    tok_pattern pattern;
    tok_decoder **subs;
    size_t n_subs;
};

void tok_decoder_free(tok_decoder *d) {
    if (!d) return;
    free(d->content);
    tok_pattern_free(&d->pattern);
    for (size_t i = 0; i < d->n_subs; i++) tok_decoder_free(d->subs[i]);
    free(d->subs);
    free(d);
}

static kiln_status single_char(const cJSON *j, const char *key, const char *type, int32_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    int32_t cp;
    if (!cJSON_IsString(v) || !v->valuestring[0] ||
        tok_utf8_decode(v->valuestring, strlen(v->valuestring), &cp) != strlen(v->valuestring))
        return kiln_error(KILN_ERR_FORMAT,
                          "tokenizer.json: decoder %s: '%s' must be a single character", type, key);
    *out = cp;
    return KILN_OK;
}

static size_t get_size(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsNumber(v) && v->valuedouble > 0 && v->valuedouble < 1e6 ? (size_t)v->valueint
                                                                           : 0;
}

kiln_status tok_decoder_parse(const cJSON *j, tok_decoder **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return KILN_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t))
        return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: decoder without a \"type\"");
    const char *type = t->valuestring;
    tok_decoder *d = calloc(1, sizeof *d);
    if (!d) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    kiln_status st = KILN_OK;
    if (!strcmp(type, "ByteLevel"))
        d->type = D_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback"))
        d->type = D_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse"))
        d->type = D_FUSE;
    else if (!strcmp(type, "Metaspace")) {
        d->type = D_METASPACE;
        if (cJSON_GetObjectItemCaseSensitive(j, "replacement"))
            st = single_char(j, "replacement", type, &d->replacement);
        else
            d->replacement = 0x2581;
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
        if (cJSON_IsString(ps))
            d->prepend = strcmp(ps->valuestring, "never") != 0;
        else {
            const cJSON *aps = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
            d->prepend = aps ? cJSON_IsTrue(aps) : true;
        }
    } else if (!strcmp(type, "Strip")) {
        d->type = D_STRIP;
        st = single_char(j, "content", type, &d->content_cp);
        d->start = get_size(j, "start");
        d->stop = get_size(j, "stop");
    } else if (!strcmp(type, "Replace")) {
        d->type = D_REPLACE;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (!cJSON_IsString(c)) {
            st = kiln_error(KILN_ERR_FORMAT, "tokenizer.json: decoder Replace needs 'content'");
        } else {
            d->content_len = strlen(c->valuestring);
            d->content = strdup(c->valuestring);
            if (!d->content) st = kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
        }
        if (st == KILN_OK)
            st = tok_pattern_parse(cJSON_GetObjectItemCaseSensitive(j, "pattern"),
                                   "decoder Replace", &d->pattern);
    } else if (!strcmp(type, "Sequence")) {
        d->type = D_SEQ;
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "decoders");
        if (!cJSON_IsArray(list)) {
            st = kiln_error(KILN_ERR_FORMAT,
                            "tokenizer.json: decoder Sequence needs a 'decoders' array");
        } else {
            size_t cnt = (size_t)cJSON_GetArraySize(list);
            d->subs = calloc(cnt ? cnt : 1, sizeof *d->subs);
            if (!d->subs) st = kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
            for (const cJSON *e = list->child; e && st == KILN_OK; e = e->next) {
                tok_decoder *sub = NULL;
                st = tok_decoder_parse(e, &sub);
                if (st == KILN_OK && sub) d->subs[d->n_subs++] = sub;
            }
        }
    } else {
        st =
            kiln_error(KILN_ERR_UNSUPPORTED, "tokenizer.json: unsupported decoder type '%s'", type);
    }
    if (st != KILN_OK) {
        tok_decoder_free(d);
        return st;
    }
    *out = d;
    return KILN_OK;
}

/* A list of strings stored back to back in one buffer. */
typedef struct strlist {
    tok_buf text;
    size_t *off, *len;
    size_t n, cap;
} strlist;

static kiln_status sl_begin(strlist *l) {
    if (l->n == l->cap) {
        size_t c = l->cap ? l->cap * 2 : 16;
        size_t *o = realloc(l->off, c * sizeof *o);
        if (!o) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (decode)");
        l->off = o;
        size_t *n = realloc(l->len, c * sizeof *n);
        if (!n) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (decode)");
        l->len = n;
        l->cap = c;
    }
    l->off[l->n] = l->text.n;
    l->len[l->n] = 0;
    l->n++;
    return KILN_OK;
}

/* Appends to the last string. */
static kiln_status sl_put(strlist *l, const char *s, size_t n) {
    KILN_TRY(tok_buf_put(&l->text, s, n));
    l->len[l->n - 1] += n;
    return KILN_OK;
}

static kiln_status sl_add(strlist *l, const char *s, size_t n) {
    KILN_TRY(sl_begin(l));
    return sl_put(l, s, n);
}

static void sl_free(strlist *l) {
    tok_buf_free(&l->text);
    free(l->off);
    free(l->len);
    memset(l, 0, sizeof *l);
}

#define SL_STR(l, i) ((l)->text.p ? (l)->text.p + (l)->off[i] : "")

static bool byte_token(const char *s, size_t n, uint8_t *byte) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return false;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : (c == '+' && i == 3) ? 0
                                       : -1;
        if (d < 0) return false;
        v = v * 16 + d;
    }
    *byte = (uint8_t)v;
    return true;
}

static kiln_status flush_bytes(strlist *out, tok_buf *bytes) {
    if (!bytes->n) return KILN_OK;
    kiln_status st;
    if (tok_utf8_validate(bytes->p, bytes->n) == bytes->n) {
        st = sl_add(out, bytes->p, bytes->n);
    } else {
        st = KILN_OK;
        for (size_t i = 0; i < bytes->n && st == KILN_OK; i++) st = sl_add(out, "\xef\xbf\xbd", 3);
    }
    bytes->n = 0;
    return st;
}

static kiln_status chain(const tok_decoder *d, const strlist *in, strlist *out) {
    kiln_status st = KILN_OK;
    switch (d->type) {
    case D_BYTELEVEL: {
        tok_buf bytes = {0};
        for (size_t i = 0; i < in->n && st == KILN_OK; i++) {
            const char *s = SL_STR(in, i);
            size_t n = in->len[i], start = bytes.n;
            bool all = true;
            for (size_t k = 0; k < n && st == KILN_OK;) {
                int32_t cp;
                size_t c = tok_utf8_decode(s + k, n - k, &cp);
                int b = c ? tok_cp_to_byte(cp) : -1;
                if (b < 0) {
                    all = false;
                    break;
                }
                uint8_t byte = (uint8_t)b;
                st = tok_buf_put(&bytes, &byte, 1);
                k += c;
            }
            if (!all && st == KILN_OK) {
                bytes.n = start; /* a char outside the table: keep the token's own bytes */
                st = tok_buf_put(&bytes, s, n);
            }
        }
        if (st == KILN_OK) st = sl_begin(out);
        if (st == KILN_OK) {
            size_t before = out->text.n;
            st = tok_utf8_lossy(&out->text, bytes.p ? bytes.p : "", bytes.n);
            out->len[out->n - 1] = out->text.n - before;
        }
        tok_buf_free(&bytes);
        return st;
    }
    case D_BYTEFALLBACK: {
        tok_buf bytes = {0};
        for (size_t i = 0; i < in->n && st == KILN_OK; i++) {
            uint8_t b;
            if (byte_token(SL_STR(in, i), in->len[i], &b)) {
                st = tok_buf_put(&bytes, &b, 1);
            } else {
                st = flush_bytes(out, &bytes);
                if (st == KILN_OK) st = sl_add(out, SL_STR(in, i), in->len[i]);
            }
        }
        if (st == KILN_OK) st = flush_bytes(out, &bytes);
        tok_buf_free(&bytes);
        return st;
    }
    case D_FUSE:
        st = sl_begin(out);
        for (size_t i = 0; i < in->n && st == KILN_OK; i++)
            st = sl_put(out, SL_STR(in, i), in->len[i]);
        return st;
    case D_METASPACE:
        for (size_t i = 0; i < in->n && st == KILN_OK; i++) {
            st = sl_begin(out);
            const char *s = SL_STR(in, i);
            size_t n = in->len[i];
            for (size_t k = 0; k < n && st == KILN_OK;) {
                int32_t cp;
                size_t c = tok_utf8_decode(s + k, n - k, &cp);
                if (!c) c = 1, cp = -1;
                bool lead = i == 0 && k == 0 && d->prepend; /* HF strips one leading space */
                if (cp == d->replacement || (lead && cp == ' ')) {
                    if (!lead) st = sl_put(out, " ", 1);
                } else {
                    st = sl_put(out, s + k, c);
                }
                k += c;
            }
        }
        return st;
    case D_STRIP:
        for (size_t i = 0; i < in->n && st == KILN_OK; i++) {
            const char *s = SL_STR(in, i);
            size_t n = in->len[i], a = 0, b = n;
            for (size_t c = 0; c < d->start && a < n; c++) {
                int32_t cp;
                size_t k = tok_utf8_decode(s + a, n - a, &cp);
                if (!k || cp != d->content_cp) break;
                a += k;
            }
            for (size_t c = 0; c < d->stop && b > a; c++) {
                size_t p = b - 1;
                while (p > a && ((uint8_t)s[p] & 0xc0) == 0x80) p--;
                int32_t cp;
                size_t k = tok_utf8_decode(s + p, b - p, &cp);
                if (!k || cp != d->content_cp) break;
                b = p;
            }
            st = sl_add(out, s + a, b - a);
        }
        return st;
    case D_REPLACE:
        for (size_t i = 0; i < in->n && st == KILN_OK; i++) {
            const char *s = SL_STR(in, i);
            size_t n = in->len[i], *spans, count;
            st = tok_pattern_find(&d->pattern, s, n, &spans, &count);
            if (st != KILN_OK) break;
            st = sl_begin(out);
            size_t prev = 0;
            for (size_t m = 0; m < count && st == KILN_OK; m++) {
                st = sl_put(out, s + prev, spans[2 * m] - prev);
                if (st == KILN_OK) st = sl_put(out, d->content, d->content_len);
                prev = spans[2 * m + 1];
            }
            if (st == KILN_OK) st = sl_put(out, s + prev, n - prev);
            free(spans);
        }
        return st;
    case D_SEQ: {
        strlist a = {0}, b = {0};
        for (size_t i = 0; i < in->n && st == KILN_OK; i++)
            st = sl_add(&a, SL_STR(in, i), in->len[i]);
        for (size_t k = 0; k < d->n_subs && st == KILN_OK; k++) {
            b.n = 0;
            b.text.n = 0;
            st = chain(d->subs[k], &a, &b);
            strlist t = a;
            a = b;
            b = t;
        }
        for (size_t i = 0; i < a.n && st == KILN_OK; i++) st = sl_add(out, SL_STR(&a, i), a.len[i]);
        sl_free(&a);
        sl_free(&b);
        return st;
    }
    }
    return kiln_error(KILN_ERR_INTERNAL, "tokenizer: bad decoder");
}

kiln_status tok_decode_tokens(const tok_decoder *d, const char **tokens, const size_t *lens,
                              size_t n, tok_buf *out) {
    strlist in = {0}, res = {0};
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < n && st == KILN_OK; i++) st = sl_add(&in, tokens[i], lens[i]);
    if (st == KILN_OK) st = chain(d, &in, &res);
    if (st == KILN_OK) st = tok_buf_put(out, res.text.p ? res.text.p : "", res.text.n);
    sl_free(&in);
    sl_free(&res);
    return st;
}
