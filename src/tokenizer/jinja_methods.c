/* jinja_methods.c — Python methods templates call on values (str: strip/split/startswith/
 * replace/format/...; dict: items/keys/values/get; list: append/pop/...) and the template globals
 * transformers provides: range, namespace, dict, raise_exception, strftime_now. */
#include "tokenizer/jinja.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

/* ---- UTF-8 code point walking ------------------------------------------------------------- */
static int32_t next_cp(const char *s, size_t n, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k =
        utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) {
        cp = (unsigned char)s[*i];
        k = 1;
    }
    *i += (size_t)k;
    return cp;
}

static void put_cp(jinja_ctx *c, jbuf *b, int32_t cp) {
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, tmp);
    if (k <= 0) return;
    jbuf_put(c, b, (const char *)tmp, (size_t)k);
}

static bool py_isspace(int32_t cp) {
    return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85 ||
           cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

static bool is_cased_letter(int32_t cp) {
    return utf8proc_islower(cp) || utf8proc_isupper(cp) ||
           utf8proc_category(cp) == UTF8PROC_CATEGORY_LT;
}

jv jinja_str_case(jinja_ctx *c, jv s, int mode) {
    jbuf b = {0};
    size_t i = 0;
    bool start = true; /* at a word start (title) / string start (capitalize) */
    while (i < s.u.str.len) {
        int32_t cp = next_cp(s.u.str.s, s.u.str.len, &i);
        int32_t o = cp;
        switch (mode) {
        case 'u':
            o = utf8proc_toupper(cp);
            break;
        case 'l':
            o = utf8proc_tolower(cp);
            break;
        case 'c':
            o = start ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            start = false;
            break;
        case 'T': /* Jinja's title filter: words split at whitespace, -, (, {, [, < */
            o = start ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            start = py_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
            break;
        case 't': /* str.title(): a cased letter after an uncased character starts a word */
            o = start ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            start = !is_cased_letter(cp);
            break;
        }
        put_cp(c, &b, o);
    }
    return jv_str(b.s ? b.s : "", b.n);
}

static bool in_chars(int32_t cp, jv chars) {
    size_t i = 0;
    while (i < chars.u.str.len)
        if (next_cp(chars.u.str.s, chars.u.str.len, &i) == cp) return true;
    return false;
}

jv jinja_str_strip(jinja_ctx *c, jv s, jv chars, bool left, bool right) {
    bool ws = chars.kind != JV_STR;
    size_t np;
    size_t *off = jutf8_offsets(c, s.u.str.s, s.u.str.len, &np);
    size_t a = 0, b = np;
    while (left && a < b) {
        size_t i = off[a];
        int32_t cp = next_cp(s.u.str.s, s.u.str.len, &i);
        if (ws ? !py_isspace(cp) : !in_chars(cp, chars)) break;
        a++;
    }
    while (right && b > a) {
        size_t i = off[b - 1];
        int32_t cp = next_cp(s.u.str.s, s.u.str.len, &i);
        if (ws ? !py_isspace(cp) : !in_chars(cp, chars)) break;
        b--;
    }
    return jv_str(s.u.str.s + off[a], off[b] - off[a]);
}

jv jinja_str_replace(jinja_ctx *c, int line, jv s, jv old, jv new_, int64_t count) {
    jbuf b = {0};
    const char *p = s.u.str.s, *end = p + s.u.str.len;
    (void)line;
    if (old.u.str.len == 0) { /* Python inserts new_ between every code point */
        size_t i = 0;
        int64_t k = 0;
        while (true) {
            if (count < 0 || k < count) {
                jbuf_put(c, &b, new_.u.str.s, new_.u.str.len);
                k++;
            }
            if (i >= s.u.str.len) break;
            size_t j = i;
            next_cp(s.u.str.s, s.u.str.len, &j);
            jbuf_put(c, &b, s.u.str.s + i, j - i);
            i = j;
        }
        return jv_str(b.s ? b.s : "", b.n);
    }
    int64_t k = 0;
    while (p < end) {
        const char *q = (count < 0 || k < count)
                            ? memmem(p, (size_t)(end - p), old.u.str.s, old.u.str.len)
                            : NULL;
        if (!q) {
            jbuf_put(c, &b, p, (size_t)(end - p));
            break;
        }
        jbuf_put(c, &b, p, (size_t)(q - p));
        jbuf_put(c, &b, new_.u.str.s, new_.u.str.len);
        p = q + old.u.str.len;
        k++;
    }
    return jv_str(b.s ? b.s : "", b.n);
}

/* ---- str methods -------------------------------------------------------------------------- */
static jv str_split(jinja_ctx *c, int line, jv s, jv sep, int64_t maxsplit, bool from_right) {
    jv out = jv_list(c, 0);
    const char *p = s.u.str.s, *end = p + s.u.str.len;
    if (sep.kind == JV_STR) {
        if (sep.u.str.len == 0) jinja_fail(c, line, "split: empty separator");
        if (from_right) {
            /* Collect from the right, then reverse. */
            jv rev = jv_list(c, 0);
            const char *e = end;
            int64_t k = 0;
            while (maxsplit < 0 || k < maxsplit) {
                const char *hit = NULL;
                for (const char *q = e - sep.u.str.len; q >= p; q--)
                    if (!memcmp(q, sep.u.str.s, sep.u.str.len)) {
                        hit = q;
                        break;
                    }
                if (!hit) break;
                jlist_push(c, rev.u.list,
                           jv_str(hit + sep.u.str.len, (size_t)(e - hit - sep.u.str.len)));
                e = hit;
                k++;
            }
            jlist_push(c, rev.u.list, jv_str(p, (size_t)(e - p)));
            for (size_t i = rev.u.list->n; i-- > 0;)
                jlist_push(c, out.u.list, rev.u.list->items[i]);
            return out;
        }
        int64_t k = 0;
        while (true) {
            const char *q = (maxsplit < 0 || k < maxsplit)
                                ? memmem(p, (size_t)(end - p), sep.u.str.s, sep.u.str.len)
                                : NULL;
            if (!q) {
                jlist_push(c, out.u.list, jv_str(p, (size_t)(end - p)));
                break;
            }
            jlist_push(c, out.u.list, jv_str(p, (size_t)(q - p)));
            p = q + sep.u.str.len;
            k++;
        }
        return out;
    }
    /* Whitespace split: runs of whitespace, no empty strings. (rsplit treated like split.) */
    size_t i = 0, n = s.u.str.len;
    int64_t k = 0;
    while (i < n) {
        size_t j = i;
        while (j < n) { /* skip whitespace */
            size_t t = j;
            if (!py_isspace(next_cp(s.u.str.s, n, &t))) break;
            j = t;
        }
        if (j >= n) break;
        if (maxsplit >= 0 && k >= maxsplit) {
            jv rest = jinja_str_strip(c, jv_str(s.u.str.s + j, n - j), jv_none(), false, true);
            jlist_push(c, out.u.list, rest);
            break;
        }
        size_t w = j;
        while (w < n) {
            size_t t = w;
            if (py_isspace(next_cp(s.u.str.s, n, &t))) break;
            w = t;
        }
        jlist_push(c, out.u.list, jv_str(s.u.str.s + j, w - j));
        k++;
        i = w;
    }
    return out;
}

static bool affix_match(jv s, jv x, bool prefix) {
    if (x.kind != JV_STR || x.u.str.len > s.u.str.len) return false;
    const char *at = prefix ? s.u.str.s : s.u.str.s + s.u.str.len - x.u.str.len;
    return !memcmp(at, x.u.str.s, x.u.str.len);
}

static jv str_format(jinja_ctx *c, int line, jv fmt, const jargs *a) {
    jbuf b = {0};
    const char *s = fmt.u.str.s;
    size_t n = fmt.u.str.len;
    int auto_idx = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '{' && i + 1 < n && s[i + 1] == '{') {
            jbuf_putc(c, &b, '{');
            i++;
        } else if (s[i] == '}' && i + 1 < n && s[i + 1] == '}') {
            jbuf_putc(c, &b, '}');
            i++;
        } else if (s[i] == '{') {
            const char *close = memchr(s + i, '}', n - i);
            if (!close) jinja_fail(c, line, "format: single '{' encountered");
            const char *field = s + i + 1;
            size_t flen = (size_t)(close - field);
            const char *colon = memchr(field, ':', flen);
            if (colon) flen = (size_t)(colon - field); /* format specs are ignored */
            jv v;
            if (flen == 0)
                v = jargs_get(a, auto_idx++, NULL, jv_undef(NULL));
            else if (field[0] >= '0' && field[0] <= '9')
                v = jargs_get(a, atoi(field), NULL, jv_undef(NULL));
            else {
                char name[64];
                snprintf(name, sizeof name, "%.*s", (int)(flen < 63 ? flen : 63), field);
                v = jargs_get(a, -1, name, jv_undef(NULL));
            }
            if (v.kind == JV_UNDEF) jinja_fail(c, line, "format: missing argument for a field");
            jv_to_buf(c, &b, v);
            i = (size_t)(close - s);
        } else
            jbuf_putc(c, &b, s[i]);
    }
    return jv_str(b.s ? b.s : "", b.n);
}

static bool str_method(jinja_ctx *c, int line, jv s, const char *m, const jargs *a, jv *out) {
    jv a0 = jargs_get(a, 0, NULL, jv_none());
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        *out = jinja_str_strip(c, s, jargs_get(a, 0, "chars", jv_none()), m[0] != 'r', m[0] != 'l');
        return true;
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        jv sep = jargs_get(a, 0, "sep", jv_none());
        jv maxs = jargs_get(a, 1, "maxsplit", jv_int(-1));
        *out = str_split(c, line, s, sep, maxs.kind == JV_INT ? maxs.u.i : -1, m[0] == 'r');
        return true;
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        bool prefix = m[0] == 's', hit = false;
        if (a0.kind == JV_LIST) {
            for (size_t i = 0; i < a0.u.list->n && !hit; i++)
                hit = affix_match(s, a0.u.list->items[i], prefix);
        } else if (a0.kind == JV_STR)
            hit = affix_match(s, a0, prefix);
        else
            jinja_fail(c, line, "%s: argument must be str or a tuple of str", m);
        *out = jv_bool(hit);
        return true;
    }
    if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") ||
        !strcmp(m, "capitalize")) {
        *out = jinja_str_case(c, s,
                              m[0] == 'u'   ? 'u'
                              : m[0] == 'l' ? 'l'
                              : m[0] == 't' ? 't'
                                            : 'c');
        return true;
    }
    if (!strcmp(m, "replace")) {
        jv old = jargs_get(a, 0, NULL, jv_none()), nw = jargs_get(a, 1, NULL, jv_none());
        jv cnt = jargs_get(a, 2, "count", jv_int(-1));
        if (old.kind != JV_STR || nw.kind != JV_STR)
            jinja_fail(c, line, "replace: arguments must be strings");
        *out = jinja_str_replace(c, line, s, old, nw, cnt.kind == JV_INT ? cnt.u.i : -1);
        return true;
    }
    if (!strcmp(m, "format")) {
        *out = str_format(c, line, s, a);
        return true;
    }
    if (!strcmp(m, "join")) {
        jbuf b = {0};
        if (a0.kind != JV_LIST) jinja_fail(c, line, "join: expected a list");
        for (size_t i = 0; i < a0.u.list->n; i++) {
            if (i) jbuf_put(c, &b, s.u.str.s, s.u.str.len);
            jv x = a0.u.list->items[i];
            if (x.kind != JV_STR) jinja_fail(c, line, "join: sequence item %zu: expected str", i);
            jbuf_put(c, &b, x.u.str.s, x.u.str.len);
        }
        *out = jv_str(b.s ? b.s : "", b.n);
        return true;
    }
    if (!strcmp(m, "find") || !strcmp(m, "count")) {
        if (a0.kind != JV_STR) jinja_fail(c, line, "%s: argument must be str", m);
        if (m[0] == 'f') {
            const char *q =
                a0.u.str.len ? memmem(s.u.str.s, s.u.str.len, a0.u.str.s, a0.u.str.len) : s.u.str.s;
            *out = jv_int(q ? (int64_t)jutf8_len(s.u.str.s, (size_t)(q - s.u.str.s)) : -1);
        } else {
            int64_t k = 0;
            if (a0.u.str.len == 0)
                k = (int64_t)jutf8_len(s.u.str.s, s.u.str.len) + 1;
            else
                for (const char *p = s.u.str.s, *end = p + s.u.str.len;
                     (p = memmem(p, (size_t)(end - p), a0.u.str.s, a0.u.str.len));
                     p += a0.u.str.len)
                    k++;
            *out = jv_int(k);
        }
        return true;
    }
    if (!strcmp(m, "splitlines")) {
        jv l = jv_list(c, 0);
        const char *p = s.u.str.s, *end = p + s.u.str.len;
        while (p < end) {
            const char *q = p;
            while (q < end && *q != '\n' && *q != '\r') q++;
            jlist_push(c, l.u.list, jv_str(p, (size_t)(q - p)));
            if (q < end && *q == '\r' && q + 1 < end && q[1] == '\n') q++;
            p = q < end ? q + 1 : end;
        }
        *out = l;
        return true;
    }
    if (!strcmp(m, "isdigit") || !strcmp(m, "isalpha") || !strcmp(m, "isalnum") ||
        !strcmp(m, "isspace")) {
        bool ok = s.u.str.len > 0;
        size_t i = 0;
        while (ok && i < s.u.str.len) {
            int32_t cp = next_cp(s.u.str.s, s.u.str.len, &i);
            utf8proc_category_t cat = utf8proc_category(cp);
            bool digit = cat == UTF8PROC_CATEGORY_ND;
            bool alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
            if (m[2] == 'd')
                ok = digit;
            else if (m[2] == 's')
                ok = py_isspace(cp);
            else if (!strcmp(m, "isalpha"))
                ok = alpha;
            else
                ok = alpha || digit;
        }
        *out = jv_bool(ok);
        return true;
    }
    return false;
}

/* ---- dict and list methods ---------------------------------------------------------------- */
static bool dict_method(jinja_ctx *c, int line, jv d, const char *m, const jargs *a, jv *out) {
    if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
        *out = jinja_filter(c, line, m, d, &(jargs){0});
        return true;
    }
    if (!strcmp(m, "get")) {
        jv *v = jdict_find_v(d.u.dict, jargs_get(a, 0, NULL, jv_none()));
        *out = v ? *v : jargs_get(a, 1, NULL, jv_none());
        return true;
    }
    if (!strcmp(m, "update")) {
        jv other = jargs_get(a, 0, NULL, jv_none());
        if (other.kind == JV_DICT)
            for (size_t i = 0; i < other.u.dict->n; i++)
                jdict_set(c, d.u.dict, other.u.dict->keys[i], other.u.dict->vals[i]);
        for (int i = 0; i < a->nkw; i++) jdict_set_s(c, d.u.dict, a->kw_names[i], a->kw[i]);
        *out = jv_none();
        return true;
    }
    if (!strcmp(m, "copy")) {
        jv r = jv_dict(c, JD_PLAIN);
        for (size_t i = 0; i < d.u.dict->n; i++)
            jdict_set(c, r.u.dict, d.u.dict->keys[i], d.u.dict->vals[i]);
        *out = r;
        return true;
    }
    return false;
}

static bool list_method(jinja_ctx *c, int line, jv l, const char *m, const jargs *a, jv *out) {
    jlist *x = l.u.list;
    jv a0 = jargs_get(a, 0, NULL, jv_undef(NULL));
    if (!strcmp(m, "append")) {
        if (a0.kind == JV_UNDEF && a->npos == 0) jinja_fail(c, line, "append takes one argument");
        jlist_push(c, x, a0);
        *out = jv_none();
        return true;
    }
    if (!strcmp(m, "extend")) {
        if (a0.kind != JV_LIST) jinja_fail(c, line, "extend: expected a list");
        jlist *src = a0.u.list;
        size_t n = src->n;
        for (size_t i = 0; i < n; i++) jlist_push(c, x, src->items[i]);
        *out = jv_none();
        return true;
    }
    if (!strcmp(m, "pop")) {
        if (x->n == 0) jinja_fail(c, line, "pop from empty list");
        int64_t i = a0.kind == JV_INT ? a0.u.i : -1;
        if (i < 0) i += (int64_t)x->n;
        if (i < 0 || i >= (int64_t)x->n) jinja_fail(c, line, "pop index out of range");
        *out = x->items[i];
        memmove(x->items + i, x->items + i + 1, (x->n - (size_t)i - 1) * sizeof(jv));
        x->n--;
        return true;
    }
    if (!strcmp(m, "index") || !strcmp(m, "count")) {
        int64_t k = 0, first = -1;
        for (size_t i = 0; i < x->n; i++)
            if (jv_eq(x->items[i], a0)) {
                if (first < 0) first = (int64_t)i;
                k++;
            }
        if (m[0] == 'i' && first < 0) jinja_fail(c, line, "index: value is not in list");
        *out = jv_int(m[0] == 'i' ? first : k);
        return true;
    }
    if (!strcmp(m, "copy")) {
        *out = jinja_filter(c, line, "list", l, &(jargs){0});
        return true;
    }
    return false;
}

bool jinja_method(jinja_ctx *c, int line, jv obj, const char *name, const jargs *a, jv *out) {
    jinja_step(c, line);
    switch (obj.kind) {
    case JV_STR:
        return str_method(c, line, obj, name, a, out);
    case JV_DICT:
        if (obj.u.dict->flavor == JD_PLAIN) return dict_method(c, line, obj, name, a, out);
        return false;
    case JV_LIST:
        return list_method(c, line, obj, name, a, out);
    default:
        return false;
    }
}

/* ---- globals ------------------------------------------------------------------------------ */
static jv g_range(jinja_ctx *c, int line, const jargs *a) {
    int64_t v[3] = {0, 0, 1};
    if (a->npos < 1 || a->npos > 3) jinja_fail(c, line, "range expects 1 to 3 arguments");
    for (int i = 0; i < a->npos; i++) {
        jv x = a->pos[i];
        if (x.kind != JV_INT && x.kind != JV_BOOL)
            jinja_fail(c, line, "range: '%s' object cannot be interpreted as an integer",
                       jv_type_name(x));
        v[a->npos == 1 ? 1 : i] = x.kind == JV_BOOL ? x.u.b : x.u.i;
    }
    int64_t start = v[0], stop = v[1], step = v[2];
    if (step == 0) jinja_fail(c, line, "range() arg 3 must not be zero");
    double count = step > 0 ? ((double)stop - (double)start) / (double)step
                            : ((double)start - (double)stop) / (double)-step;
    if (count > JINJA_MAX_RANGE)
        jinja_fail(c, line, "range too large (more than %d items)", JINJA_MAX_RANGE);
    jv out = jv_list(c, 0);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        jlist_push(c, out.u.list, jv_int(i));
        if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
    }
    return out;
}

static jv make_dict(jinja_ctx *c, const jargs *a, jdict_flavor flavor) {
    jv d = jv_dict(c, flavor);
    for (int i = 0; i < a->npos; i++)
        if (a->pos[i].kind == JV_DICT)
            for (size_t k = 0; k < a->pos[i].u.dict->n; k++)
                jdict_set(c, d.u.dict, a->pos[i].u.dict->keys[k], a->pos[i].u.dict->vals[k]);
    for (int i = 0; i < a->nkw; i++) jdict_set_s(c, d.u.dict, a->kw_names[i], a->kw[i]);
    return d;
}

static jv g_namespace(jinja_ctx *c, int line, const jargs *a) {
    (void)line;
    return make_dict(c, a, JD_NAMESPACE);
}

static jv g_dict(jinja_ctx *c, int line, const jargs *a) {
    (void)line;
    return make_dict(c, a, JD_PLAIN);
}

static jv g_raise(jinja_ctx *c, int line, const jargs *a) {
    jv msg = jv_to_str(c, jargs_get(a, 0, NULL, jv_str("", 0)));
    jinja_fail(c, line, "raise_exception: %.*s", (int)(msg.u.str.len > 700 ? 700 : msg.u.str.len),
               msg.u.str.s);
}

static jv g_strftime_now(jinja_ctx *c, int line, const jargs *a) {
    jv fmt = jargs_get(a, 0, NULL, jv_none());
    if (fmt.kind != JV_STR) jinja_fail(c, line, "strftime_now expects a format string");
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    int y, mo, d;
    if (c->fixed_date && sscanf(c->fixed_date, "%d-%d-%d", &y, &mo, &d) == 3) {
        tm.tm_year = y - 1900;
        tm.tm_mon = mo - 1;
        tm.tm_mday = d;
        tm.tm_hour = 12;
        tm.tm_isdst = -1;
        time_t t = mktime(&tm); /* fills in the weekday / day of year */
        localtime_r(&t, &tm);
    } else {
        time_t now = time(NULL);
        localtime_r(&now, &tm);
    }
    char *f = jinja_strndup(c, fmt.u.str.s, fmt.u.str.len);
    char buf[512];
    size_t n = fmt.u.str.len > 200 ? 0 : strftime(buf, sizeof buf, f, &tm);
    return jv_strdup(c, buf, n);
}

static void add_global(jinja_ctx *c, const char *name, jbuiltin_fn fn) {
    jfunc *f = jinja_alloc(c, sizeof *f);
    f->kind = JF_BUILTIN;
    f->name = name;
    f->builtin = fn;
    jdict_set_s(c, c->globals, name, (jv){.kind = JV_FUNC, .u.fn = f});
}

void jinja_install_globals(jinja_ctx *c) {
    add_global(c, "range", g_range);
    add_global(c, "namespace", g_namespace);
    add_global(c, "dict", g_dict);
    add_global(c, "raise_exception", g_raise);
    add_global(c, "strftime_now", g_strftime_now);
}
