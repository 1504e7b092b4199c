/* jinja_filters.c — Jinja2's built-in filters (`x | name(args)`) and tests (`x is name`) that chat
 * templates use, with Jinja2/Python semantics; `tojson` follows transformers' override
 * (json.dumps, ensure_ascii=False, optional indent / separators / sort_keys). */
#include "tokenizer/jinja.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

jv jargs_get(const jargs *a, int i, const char *name, jv def) {
    if (i >= 0 && i < a->npos) return a->pos[i];
    if (name)
        for (int k = 0; k < a->nkw; k++)
            if (!strcmp(a->kw_names[k], name)) return a->kw[k];
    return def;
}

static jv need_str(jinja_ctx *c, jv v) {
    return jv_to_str(c, v);
}

static int64_t need_int(jinja_ctx *c, int line, jv v, const char *what) {
    if (v.kind == JV_INT) return v.u.i;
    if (v.kind == JV_BOOL) return v.u.b;
    jinja_fail(c, line, "%s must be an integer, not %s", what, jv_type_name(v));
}

/* attribute="a.b.0" lookup as Jinja's make_attrgetter. */
static jv attr_path(jinja_ctx *c, jv v, jv attr) {
    if (attr.kind == JV_INT) {
        if (v.kind == JV_LIST && attr.u.i >= 0 && (size_t)attr.u.i < v.u.list->n)
            return v.u.list->items[attr.u.i];
        return jv_undef(NULL);
    }
    jv s = jv_to_str(c, attr);
    const char *p = s.u.str.s, *end = p + s.u.str.len;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        size_t len = (size_t)(dot - p);
        bool numeric = len > 0;
        for (size_t i = 0; i < len; i++) numeric = numeric && p[i] >= '0' && p[i] <= '9';
        if (v.kind == JV_DICT) {
            jv *x = jdict_find(v.u.dict, p, len);
            v = x ? *x : jv_undef(NULL);
        } else if (v.kind == JV_LIST && numeric) {
            size_t idx = (size_t)strtoull(p, NULL, 10);
            v = idx < v.u.list->n ? v.u.list->items[idx] : jv_undef(NULL);
        } else
            v = jv_undef(NULL);
        if (dot == end) break;
        p = dot + 1;
    }
    return v;
}

/* Arguments after skip positional ones, as a new jargs (for select/map passing through). */
static jargs shift_args(const jargs *a, int skip) {
    jargs r = *a;
    r.npos = a->npos > skip ? a->npos - skip : 0;
    r.pos = a->npos > skip ? a->pos + skip : NULL;
    return r;
}

static jv lowered(jinja_ctx *c, jv v) {
    return v.kind == JV_STR ? jinja_str_case(c, v, 'l') : v;
}

/* ---- sorting ------------------------------------------------------------------------------ */
typedef struct sort_item {
    jv key, val;
} sort_item;

static void merge_sort(jinja_ctx *c, int line, sort_item *a, sort_item *tmp, size_t n, bool rev) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(c, line, a, tmp, h, rev);
    merge_sort(c, line, a + h, tmp, n - h, rev);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = jv_cmp(c, line, a[j].key, a[i].key);
        if (rev) r = -r;
        tmp[k++] = r < 0 ? a[j++] : a[i++];
    }
    while (i < h) tmp[k++] = a[i++];
    while (j < n) tmp[k++] = a[j++];
    memcpy(a, tmp, n * sizeof *a);
}

static jv sorted(jinja_ctx *c, int line, jlist *l, bool rev, bool case_sensitive, jv attr) {
    sort_item *items = jinja_alloc(c, (l->n + 1) * sizeof *items);
    sort_item *tmp = jinja_alloc(c, (l->n + 1) * sizeof *tmp);
    for (size_t i = 0; i < l->n; i++) {
        jv k = attr.kind == JV_NONE ? l->items[i] : attr_path(c, l->items[i], attr);
        items[i].key = case_sensitive ? k : lowered(c, k);
        items[i].val = l->items[i];
    }
    merge_sort(c, line, items, tmp, l->n, rev);
    jv out = jv_list(c, l->n);
    for (size_t i = 0; i < l->n; i++) out.u.list->items[i] = items[i].val;
    out.u.list->n = l->n;
    return out;
}

/* ---- HTML escape -------------------------------------------------------------------------- */
static jv html_escape(jinja_ctx *c, jv s) {
    jbuf b = {0};
    for (size_t i = 0; i < s.u.str.len; i++) {
        char ch = s.u.str.s[i];
        switch (ch) {
        case '&':
            jbuf_puts(c, &b, "&amp;");
            break;
        case '<':
            jbuf_puts(c, &b, "&lt;");
            break;
        case '>':
            jbuf_puts(c, &b, "&gt;");
            break;
        case '"':
            jbuf_puts(c, &b, "&#34;");
            break;
        case '\'':
            jbuf_puts(c, &b, "&#39;");
            break;
        default:
            jbuf_putc(c, &b, ch);
        }
    }
    return jv_str(b.s ? b.s : "", b.n);
}

/* Python splitlines on \n, \r\n, \r. */
static jlist *split_lines(jinja_ctx *c, jv s) {
    jlist *l = jv_list(c, 0).u.list;
    const char *p = s.u.str.s, *end = p + s.u.str.len;
    while (p < end) {
        const char *q = p;
        while (q < end && *q != '\n' && *q != '\r') q++;
        jlist_push(c, l, jv_str(p, (size_t)(q - p)));
        if (q < end && *q == '\r' && q + 1 < end && q[1] == '\n') q++;
        p = q < end ? q + 1 : end;
    }
    return l;
}

static jv filter_indent(jinja_ctx *c, int line, jv v, const jargs *a) {
    jv width = jargs_get(a, 0, "width", jv_int(4));
    bool first = jv_truthy(jargs_get(a, 1, "first", jv_bool(false)));
    bool blank = jv_truthy(jargs_get(a, 2, "blank", jv_bool(false)));
    jv ind;
    if (width.kind == JV_STR)
        ind = width;
    else {
        int64_t w = need_int(c, line, width, "indent width");
        if (w < 0) w = 0;
        if (w > 4096) jinja_fail(c, line, "indent width too large");
        char *sp = jinja_alloc(c, (size_t)w + 1);
        memset(sp, ' ', (size_t)w);
        ind = jv_str(sp, (size_t)w);
    }
    jv s = need_str(c, v);
    jbuf tmp = {0};
    jbuf_put(c, &tmp, s.u.str.s, s.u.str.len);
    jbuf_putc(c, &tmp, '\n');
    jlist *lines = split_lines(c, jv_str(tmp.s, tmp.n));
    jbuf out = {0};
    if (first) jbuf_put(c, &out, ind.u.str.s, ind.u.str.len);
    for (size_t i = 0; i < lines->n; i++) {
        jv ln = lines->items[i];
        if (i) {
            jbuf_putc(c, &out, '\n');
            if (blank || ln.u.str.len) jbuf_put(c, &out, ind.u.str.s, ind.u.str.len);
        }
        jbuf_put(c, &out, ln.u.str.s, ln.u.str.len);
    }
    return jv_str(out.s ? out.s : "", out.n);
}

static jv filter_tojson(jinja_ctx *c, int line, jv v, const jargs *a) {
    jv indent = jargs_get(a, 0, "indent", jv_none());
    jv seps = jargs_get(a, -1, "separators", jv_none());
    bool sort_keys = jv_truthy(jargs_get(a, -1, "sort_keys", jv_bool(false)));
    int ind = -1;
    if (indent.kind != JV_NONE) {
        int64_t w = need_int(c, line, indent, "tojson indent");
        if (w > 64) jinja_fail(c, line, "tojson indent too large");
        ind = w < 0 ? 0 : (int)w;
    }
    const char *isep = NULL, *ksep = NULL;
    if (seps.kind == JV_LIST && seps.u.list->n == 2 && seps.u.list->items[0].kind == JV_STR &&
        seps.u.list->items[1].kind == JV_STR) {
        jv x = seps.u.list->items[0], y = seps.u.list->items[1];
        isep = jinja_strndup(c, x.u.str.s, x.u.str.len);
        ksep = jinja_strndup(c, y.u.str.s, y.u.str.len);
    } else if (seps.kind != JV_NONE) {
        jinja_fail(c, line, "tojson separators must be a pair of strings");
    }
    jbuf b = {0};
    jv_tojson(c, line, &b, v, ind, isep, ksep, sort_keys);
    return jv_str(b.s ? b.s : "", b.n);
}

static jv filter_round(jinja_ctx *c, int line, jv v, const jargs *a) {
    int64_t prec = need_int(c, line, jargs_get(a, 0, "precision", jv_int(0)), "precision");
    jv method = jargs_get(a, 1, "method", jv_str("common", 6));
    if (!jv_is_num(v)) jinja_fail(c, line, "round: '%s' is not a number", jv_type_name(v));
    if (prec > 300 || prec < -300) jinja_fail(c, line, "round: precision out of range");
    double x = jv_num(v), p = pow(10.0, (double)prec), r;
    const char *m = method.kind == JV_STR ? method.u.str.s : "common";
    if (!strncmp(m, "common", 6)) {
        if (v.kind != JV_FLOAT)
            return prec >= 0 ? jv_int(v.kind == JV_BOOL ? v.u.b : v.u.i)
                             : jv_float(nearbyint(x * p) / p);
        r = nearbyint(x * p) / p;
    } else if (!strncmp(m, "floor", 5))
        r = floor(x * p) / p;
    else if (!strncmp(m, "ceil", 4))
        r = ceil(x * p) / p;
    else
        jinja_fail(c, line, "round: method must be common, ceil or floor");
    return jv_float(r);
}

static jv filter_center(jinja_ctx *c, int line, jv v, const jargs *a) {
    int64_t width = need_int(c, line, jargs_get(a, 0, "width", jv_int(80)), "center width");
    if (width > 1 << 20) jinja_fail(c, line, "center width too large");
    jv s = need_str(c, v);
    int64_t len = (int64_t)jutf8_len(s.u.str.s, s.u.str.len);
    if (width <= len) return s;
    int64_t pad = width - len, left = pad / 2 + (pad & width & 1);
    jbuf b = {0};
    for (int64_t i = 0; i < left; i++) jbuf_putc(c, &b, ' ');
    jbuf_put(c, &b, s.u.str.s, s.u.str.len);
    for (int64_t i = 0; i < pad - left; i++) jbuf_putc(c, &b, ' ');
    return jv_str(b.s, b.n);
}

static bool is_word_byte(unsigned char ch) {
    return ch >= 0x80 || (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') ||
           (ch >= 'A' && ch <= 'Z') || ch == '_';
}

static jv filter_int(jinja_ctx *c, jv v, const jargs *a) {
    jv def = jargs_get(a, 0, "default", jv_int(0));
    if (v.kind == JV_INT) return v;
    if (v.kind == JV_BOOL) return jv_int(v.u.b);
    if (v.kind == JV_FLOAT) {
        if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18) return def;
        return jv_int((int64_t)v.u.f);
    }
    if (v.kind == JV_STR) {
        char *s = jinja_strndup(c, v.u.str.s, v.u.str.len), *end;
        while (*s == ' ' || *s == '\t' || *s == '\n') s++;
        if (!*s) return def;
        long long i = strtoll(s, &end, 10);
        while (*end == ' ' || *end == '\t' || *end == '\n') end++;
        if (!*end) return jv_int(i);
        double d = strtod(s, &end); /* Jinja falls back to int(float(s)) */
        while (*end == ' ' || *end == '\t' || *end == '\n') end++;
        if (!*end && isfinite(d) && fabs(d) < 9.2e18) return jv_int((int64_t)d);
    }
    return def;
}

static jv filter_float(jinja_ctx *c, jv v, const jargs *a) {
    jv def = jargs_get(a, 0, "default", jv_float(0.0));
    if (jv_is_num(v)) return jv_float(jv_num(v));
    if (v.kind == JV_STR) {
        char *s = jinja_strndup(c, v.u.str.s, v.u.str.len), *end;
        double d = strtod(s, &end);
        while (*end == ' ' || *end == '\t' || *end == '\n') end++;
        if (end != s && !*end) return jv_float(d);
    }
    return def;
}

static jv minmax(jinja_ctx *c, int line, jv v, const jargs *a, bool want_max) {
    jlist *l = jv_iterable(c, line, v, want_max ? "max" : "min");
    bool cs = jv_truthy(jargs_get(a, 0, "case_sensitive", jv_bool(false)));
    jv attr = jargs_get(a, 1, "attribute", jv_none());
    if (l->n == 0) return jv_undef(NULL);
    jv best = l->items[0];
    for (size_t i = 1; i < l->n; i++) {
        jv x = l->items[i];
        jv kx = attr.kind == JV_NONE ? x : attr_path(c, x, attr);
        jv kb = attr.kind == JV_NONE ? best : attr_path(c, best, attr);
        if (!cs) {
            kx = lowered(c, kx);
            kb = lowered(c, kb);
        }
        int r = jv_cmp(c, line, kx, kb);
        if (want_max ? r > 0 : r < 0) best = x;
    }
    return best;
}

/* ---- dispatch ----------------------------------------------------------------------------- */
static const char *const FILTERS[] = {
    "abs",        "attr",     "batch",     "capitalize", "center", "count",  "d",
    "default",    "dictsort", "e",         "escape",     "first",  "float",  "forceescape",
    "format",     "indent",   "int",       "items",      "join",   "keys",   "last",
    "length",     "list",     "lower",     "map",        "max",    "min",    "reject",
    "rejectattr", "replace",  "reverse",   "round",      "safe",   "select", "selectattr",
    "sort",       "string",   "sum",       "title",      "tojson", "trim",   "unique",
    "upper",      "values",   "wordcount", NULL};

static const char *const TESTS[] = {
    "boolean",      "callable", "defined",  "divisibleby", "eq",        "equalto", "escaped",
    "even",         "false",    "filter",   "float",       "ge",        "gt",      "greaterthan",
    "in",           "integer",  "iterable", "le",          "lessthan",  "lower",   "lt",
    "mapping",      "ne",       "none",     "number",      "odd",       "sameas",  "sequence",
    "startingwith", "string",   "test",     "true",        "undefined", "upper",   "==",
    "!=",           "<",        "<=",       ">",           ">=",        NULL};

static bool listed(const char *const *list, const char *name) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], name)) return true;
    return false;
}

bool jinja_has_filter(const char *name) {
    return listed(FILTERS, name);
}
bool jinja_has_test(const char *name) {
    return listed(TESTS, name);
}

static jv apply_test_list(jinja_ctx *c, int line, jv v, const jargs *a, bool by_attr, bool keep) {
    jlist *l = jv_iterable(c, line, v, by_attr ? "selectattr" : "select");
    jv out = jv_list(c, 0);
    int skip = by_attr ? 1 : 0;
    jv attr = by_attr ? jargs_get(a, 0, NULL, jv_undef(NULL)) : jv_none();
    if (by_attr && attr.kind == JV_UNDEF) jinja_fail(c, line, "selectattr needs an attribute name");
    jv test = jargs_get(a, skip, NULL, jv_none());
    jargs rest = shift_args(a, skip + 1);
    char name[64] = "";
    if (test.kind == JV_STR) {
        snprintf(name, sizeof name, "%.*s", (int)test.u.str.len, test.u.str.s);
        if (!jinja_has_test(name)) jinja_fail(c, line, "unknown test '%s'", name);
    }
    for (size_t i = 0; i < l->n; i++) {
        jv x = by_attr ? attr_path(c, l->items[i], attr) : l->items[i];
        bool t = name[0] ? jinja_test(c, line, name, x, &rest) : jv_truthy(x);
        if (t == keep) jlist_push(c, out.u.list, l->items[i]);
    }
    return out;
}

jv jinja_filter(jinja_ctx *c, int line, const char *name, jv v, const jargs *a) {
    jinja_step(c, line);
    const char *f = name;
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        jv def = jargs_get(a, 0, "default_value", jv_str("", 0));
        bool boolean = jv_truthy(jargs_get(a, 1, "boolean", jv_bool(false)));
        if (v.kind == JV_UNDEF || (boolean && !jv_truthy(v))) return def;
        return v;
    }
    if (!strcmp(f, "tojson")) return filter_tojson(c, line, v, a);
    if (!strcmp(f, "safe")) return v;
    if (!strcmp(f, "string")) return jv_to_str(c, v);
    if (!strcmp(f, "trim"))
        return jinja_str_strip(c, need_str(c, v), jargs_get(a, 0, "chars", jv_none()), true, true);
    if (!strcmp(f, "upper")) return jinja_str_case(c, need_str(c, v), 'u');
    if (!strcmp(f, "lower")) return jinja_str_case(c, need_str(c, v), 'l');
    if (!strcmp(f, "capitalize")) return jinja_str_case(c, need_str(c, v), 'c');
    if (!strcmp(f, "title")) return jinja_str_case(c, need_str(c, v), 'T');
    if (!strcmp(f, "e") || !strcmp(f, "escape") || !strcmp(f, "forceescape"))
        return html_escape(c, need_str(c, v));
    if (!strcmp(f, "replace")) {
        jv count = jargs_get(a, 2, "count", jv_none());
        return jinja_str_replace(c, line, need_str(c, v),
                                 need_str(c, jargs_get(a, 0, "old", jv_str("", 0))),
                                 need_str(c, jargs_get(a, 1, "new", jv_str("", 0))),
                                 count.kind == JV_NONE ? -1 : need_int(c, line, count, "count"));
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        switch (v.kind) {
        case JV_STR:
            return jv_int((int64_t)jutf8_len(v.u.str.s, v.u.str.len));
        case JV_LIST:
            return jv_int((int64_t)v.u.list->n);
        case JV_DICT:
            return jv_int((int64_t)v.u.dict->n);
        case JV_UNDEF:
            return jv_int(0);
        default:
            jinja_fail(c, line, "object of type '%s' has no len()", jv_type_name(v));
        }
    }
    if (!strcmp(f, "items") || !strcmp(f, "keys") || !strcmp(f, "values")) {
        if (v.kind == JV_UNDEF) return jv_list(c, 0);
        if (v.kind != JV_DICT)
            jinja_fail(c, line, "filter '%s': can only be used on mappings, not %s", f,
                       jv_type_name(v));
        jv out = jv_list(c, v.u.dict->n);
        for (size_t i = 0; i < v.u.dict->n; i++) {
            jv x;
            if (f[0] == 'k')
                x = v.u.dict->keys[i];
            else if (f[0] == 'v')
                x = v.u.dict->vals[i];
            else {
                x = jv_list(c, 2);
                x.u.list->tuple = true;
                jlist_push(c, x.u.list, v.u.dict->keys[i]);
                jlist_push(c, x.u.list, v.u.dict->vals[i]);
            }
            jlist_push(c, out.u.list, x);
        }
        return out;
    }
    if (!strcmp(f, "dictsort")) {
        if (v.kind != JV_DICT) jinja_fail(c, line, "dictsort: expected a mapping");
        bool cs = jv_truthy(jargs_get(a, 0, "case_sensitive", jv_bool(false)));
        jv by = jargs_get(a, 1, "by", jv_str("key", 3));
        bool rev = jv_truthy(jargs_get(a, 2, "reverse", jv_bool(false)));
        jv pairs = jinja_filter(c, line, "items", v, &(jargs){0});
        jv idx = jv_int(by.kind == JV_STR && by.u.str.len == 5 && !memcmp(by.u.str.s, "value", 5));
        return sorted(c, line, pairs.u.list, rev, cs, idx);
    }
    if (!strcmp(f, "join")) {
        jv sep = need_str(c, jargs_get(a, 0, "d", jv_str("", 0)));
        jv attr = jargs_get(a, 1, "attribute", jv_none());
        jlist *l = jv_iterable(c, line, v, "join");
        jbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i) jbuf_put(c, &b, sep.u.str.s, sep.u.str.len);
            jv x = attr.kind == JV_NONE ? l->items[i] : attr_path(c, l->items[i], attr);
            jv_to_buf(c, &b, x);
        }
        return jv_str(b.s ? b.s : "", b.n);
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        jlist *l = jv_iterable(c, line, v, f);
        if (l->n == 0) return jv_undef(f);
        return f[0] == 'f' ? l->items[0] : l->items[l->n - 1];
    }
    if (!strcmp(f, "list")) {
        jlist *l = jv_iterable(c, line, v, "list");
        jv out = jv_list(c, l->n);
        for (size_t i = 0; i < l->n; i++) jlist_push(c, out.u.list, l->items[i]);
        return out;
    }
    if (!strcmp(f, "reverse")) {
        if (v.kind == JV_STR) {
            size_t np;
            size_t *off = jutf8_offsets(c, v.u.str.s, v.u.str.len, &np);
            jbuf b = {0};
            for (size_t i = np; i-- > 0;) jbuf_put(c, &b, v.u.str.s + off[i], off[i + 1] - off[i]);
            return jv_str(b.s ? b.s : "", b.n);
        }
        jlist *l = jv_iterable(c, line, v, "reverse");
        jv out = jv_list(c, l->n);
        for (size_t i = l->n; i-- > 0;) jlist_push(c, out.u.list, l->items[i]);
        return out;
    }
    if (!strcmp(f, "sort")) {
        bool rev = jv_truthy(jargs_get(a, 0, "reverse", jv_bool(false)));
        bool cs = jv_truthy(jargs_get(a, 1, "case_sensitive", jv_bool(false)));
        jv attr = jargs_get(a, 2, "attribute", jv_none());
        return sorted(c, line, jv_iterable(c, line, v, "sort"), rev, cs, attr);
    }
    if (!strcmp(f, "unique")) {
        bool cs = jv_truthy(jargs_get(a, 0, "case_sensitive", jv_bool(false)));
        jv attr = jargs_get(a, 1, "attribute", jv_none());
        jlist *l = jv_iterable(c, line, v, "unique");
        jv out = jv_list(c, 0), seen = jv_list(c, 0);
        for (size_t i = 0; i < l->n; i++) {
            jv k = attr.kind == JV_NONE ? l->items[i] : attr_path(c, l->items[i], attr);
            if (!cs) k = lowered(c, k);
            bool dup = false;
            for (size_t j = 0; j < seen.u.list->n && !dup; j++)
                dup = jv_eq(seen.u.list->items[j], k);
            if (dup) continue;
            jlist_push(c, seen.u.list, k);
            jlist_push(c, out.u.list, l->items[i]);
        }
        return out;
    }
    if (!strcmp(f, "selectattr")) return apply_test_list(c, line, v, a, true, true);
    if (!strcmp(f, "rejectattr")) return apply_test_list(c, line, v, a, true, false);
    if (!strcmp(f, "select")) return apply_test_list(c, line, v, a, false, true);
    if (!strcmp(f, "reject")) return apply_test_list(c, line, v, a, false, false);
    if (!strcmp(f, "map")) {
        jlist *l = jv_iterable(c, line, v, "map");
        jv out = jv_list(c, l->n);
        jv attr = jargs_get(a, -1, "attribute", jv_undef(NULL));
        if (attr.kind != JV_UNDEF) {
            jv def = jargs_get(a, -1, "default", jv_undef(NULL));
            for (size_t i = 0; i < l->n; i++) {
                jv x = attr_path(c, l->items[i], attr);
                jlist_push(c, out.u.list, x.kind == JV_UNDEF && def.kind != JV_UNDEF ? def : x);
            }
            return out;
        }
        jv fname = jargs_get(a, 0, NULL, jv_none());
        if (fname.kind != JV_STR) jinja_fail(c, line, "map: expected a filter name or attribute=");
        char name2[64];
        snprintf(name2, sizeof name2, "%.*s", (int)fname.u.str.len, fname.u.str.s);
        if (!jinja_has_filter(name2)) jinja_fail(c, line, "unknown filter '%s'", name2);
        jargs rest = shift_args(a, 1);
        for (size_t i = 0; i < l->n; i++)
            jlist_push(c, out.u.list, jinja_filter(c, line, name2, l->items[i], &rest));
        return out;
    }
    if (!strcmp(f, "attr")) {
        jv nm = need_str(c, jargs_get(a, 0, "name", jv_str("", 0)));
        if (v.kind != JV_DICT) return jv_undef(NULL);
        jv *x = jdict_find(v.u.dict, nm.u.str.s, nm.u.str.len);
        return x ? *x : jv_undef(NULL);
    }
    if (!strcmp(f, "int")) return filter_int(c, v, a);
    if (!strcmp(f, "float")) return filter_float(c, v, a);
    if (!strcmp(f, "abs")) {
        if (v.kind == JV_FLOAT) return jv_float(fabs(v.u.f));
        if (v.kind == JV_INT || v.kind == JV_BOOL) {
            int64_t x = v.kind == JV_BOOL ? v.u.b : v.u.i;
            if (x == INT64_MIN) jinja_fail(c, line, "integer overflow");
            return jv_int(x < 0 ? -x : x);
        }
        jinja_fail(c, line, "bad operand type for abs(): '%s'", jv_type_name(v));
    }
    if (!strcmp(f, "round")) return filter_round(c, line, v, a);
    if (!strcmp(f, "sum")) {
        jlist *l = jv_iterable(c, line, v, "sum");
        jv attr = jargs_get(a, 0, "attribute", jv_none());
        jv total = jargs_get(a, 1, "start", jv_int(0));
        for (size_t i = 0; i < l->n; i++) {
            jv x = attr.kind == JV_NONE ? l->items[i] : attr_path(c, l->items[i], attr);
            if (!jv_is_num(x) || !jv_is_num(total))
                jinja_fail(c, line, "sum: unsupported operand '%s'", jv_type_name(x));
            if (x.kind == JV_FLOAT || total.kind == JV_FLOAT)
                total = jv_float(jv_num(total) + jv_num(x));
            else {
                int64_t r;
                if (__builtin_add_overflow((int64_t)jv_num(total), (int64_t)jv_num(x), &r))
                    jinja_fail(c, line, "integer overflow");
                total = jv_int(r);
            }
        }
        return total;
    }
    if (!strcmp(f, "min")) return minmax(c, line, v, a, false);
    if (!strcmp(f, "max")) return minmax(c, line, v, a, true);
    if (!strcmp(f, "batch")) {
        int64_t n = need_int(c, line, jargs_get(a, 0, "linecount", jv_int(1)), "batch size");
        if (n <= 0) jinja_fail(c, line, "batch size must be positive");
        jv fill = jargs_get(a, 1, "fill_with", jv_none());
        jlist *l = jv_iterable(c, line, v, "batch");
        jv out = jv_list(c, 0), cur = jv_none();
        for (size_t i = 0; i < l->n; i++) {
            if (cur.kind == JV_NONE || (int64_t)cur.u.list->n == n) {
                cur = jv_list(c, 0);
                jlist_push(c, out.u.list, cur);
            }
            jlist_push(c, cur.u.list, l->items[i]);
        }
        if (cur.kind == JV_LIST && fill.kind != JV_NONE)
            while ((int64_t)cur.u.list->n < n) jlist_push(c, cur.u.list, fill);
        return out;
    }
    if (!strcmp(f, "indent")) return filter_indent(c, line, v, a);
    if (!strcmp(f, "center")) return filter_center(c, line, v, a);
    if (!strcmp(f, "wordcount")) {
        jv s = need_str(c, v);
        int64_t n = 0;
        bool in_word = false;
        for (size_t i = 0; i < s.u.str.len; i++) {
            bool w = is_word_byte((unsigned char)s.u.str.s[i]);
            if (w && !in_word) n++;
            in_word = w;
        }
        return jv_int(n);
    }
    if (!strcmp(f, "format")) {
        jv fmt = need_str(c, v);
        jbuf b = {0};
        int k = 0;
        for (size_t i = 0; i < fmt.u.str.len; i++) {
            char ch = fmt.u.str.s[i];
            if (ch != '%' || i + 1 >= fmt.u.str.len) {
                jbuf_putc(c, &b, ch);
                continue;
            }
            char spec = fmt.u.str.s[++i];
            if (spec == '%')
                jbuf_putc(c, &b, '%');
            else if (spec == 's' || spec == 'd' || spec == 'r') {
                if (k >= a->npos) jinja_fail(c, line, "format: not enough arguments");
                jv x = a->pos[k++];
                if (spec == 'r')
                    jv_repr_buf(c, &b, x);
                else if (spec == 'd') {
                    if (!jv_is_num(x)) jinja_fail(c, line, "format: %%d needs a number");
                    jv_to_buf(c, &b, jv_int((int64_t)jv_num(x)));
                } else
                    jv_to_buf(c, &b, x);
            } else
                jinja_fail(c, line, "format: unsupported conversion '%%%c'", spec);
        }
        return jv_str(b.s ? b.s : "", b.n);
    }
    jinja_fail(c, line, "unknown filter '%s'", name);
}

/* ---- tests -------------------------------------------------------------------------------- */
static bool str_all_case(jinja_ctx *c, jv v, bool upper) {
    if (v.kind != JV_STR) return false;
    bool cased = false;
    size_t i = 0;
    (void)c;
    while (i < v.u.str.len) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)v.u.str.s + i,
                                              (utf8proc_ssize_t)(v.u.str.len - i), &cp);
        if (k <= 0) {
            i++;
            continue;
        }
        i += (size_t)k;
        if (utf8proc_islower(cp)) {
            if (upper) return false;
            cased = true;
        } else if (utf8proc_isupper(cp)) {
            if (!upper) return false;
            cased = true;
        }
    }
    return cased;
}

bool jinja_test(jinja_ctx *c, int line, const char *name, jv v, const jargs *a) {
    jinja_step(c, line);
    const char *t = name;
    jv arg = jargs_get(a, 0, NULL, jv_undef(NULL));
    if (!strcmp(t, "defined")) return v.kind != JV_UNDEF;
    if (!strcmp(t, "undefined")) return v.kind == JV_UNDEF;
    if (!strcmp(t, "none")) return v.kind == JV_NONE;
    if (!strcmp(t, "string")) return v.kind == JV_STR;
    if (!strcmp(t, "number")) return jv_is_num(v);
    if (!strcmp(t, "integer")) return v.kind == JV_INT;
    if (!strcmp(t, "float")) return v.kind == JV_FLOAT;
    if (!strcmp(t, "boolean")) return v.kind == JV_BOOL;
    if (!strcmp(t, "true")) return v.kind == JV_BOOL && v.u.b;
    if (!strcmp(t, "false")) return v.kind == JV_BOOL && !v.u.b;
    if (!strcmp(t, "mapping")) return v.kind == JV_DICT;
    if (!strcmp(t, "iterable"))
        return v.kind == JV_LIST || v.kind == JV_DICT || v.kind == JV_STR || v.kind == JV_UNDEF;
    if (!strcmp(t, "sequence")) return v.kind == JV_LIST || v.kind == JV_DICT || v.kind == JV_STR;
    if (!strcmp(t, "callable")) return v.kind == JV_FUNC;
    if (!strcmp(t, "escaped")) return false;
    if (!strcmp(t, "lower")) return str_all_case(c, v, false);
    if (!strcmp(t, "upper")) return str_all_case(c, v, true);
    if (!strcmp(t, "filter") || !strcmp(t, "test")) {
        if (v.kind != JV_STR) return false;
        char nm[64];
        snprintf(nm, sizeof nm, "%.*s", (int)v.u.str.len, v.u.str.s);
        return t[0] == 'f' ? jinja_has_filter(nm) : jinja_has_test(nm);
    }
    if (!strcmp(t, "even") || !strcmp(t, "odd") || !strcmp(t, "divisibleby")) {
        if (v.kind != JV_INT && v.kind != JV_BOOL)
            jinja_fail(c, line, "test '%s' needs an integer, not %s", t, jv_type_name(v));
        int64_t x = v.kind == JV_BOOL ? v.u.b : v.u.i;
        if (t[0] == 'e') return x % 2 == 0;
        if (t[0] == 'o') return x % 2 != 0;
        int64_t d = need_int(c, line, arg, "divisibleby argument");
        if (d == 0) jinja_fail(c, line, "integer division or modulo by zero");
        if (d == -1) return true;
        return x % d == 0;
    }
    if (arg.kind == JV_UNDEF && a->npos == 0 && a->nkw == 0 && strcmp(t, "sameas"))
        jinja_fail(c, line, "test '%s' needs an argument", t);
    if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "==")) return jv_eq(v, arg);
    if (!strcmp(t, "ne") || !strcmp(t, "!=")) return !jv_eq(v, arg);
    if (!strcmp(t, "lt") || !strcmp(t, "<") || !strcmp(t, "lessthan"))
        return jv_cmp(c, line, v, arg) < 0;
    if (!strcmp(t, "le") || !strcmp(t, "<=")) return jv_cmp(c, line, v, arg) <= 0;
    if (!strcmp(t, "gt") || !strcmp(t, ">") || !strcmp(t, "greaterthan"))
        return jv_cmp(c, line, v, arg) > 0;
    if (!strcmp(t, "ge") || !strcmp(t, ">=")) return jv_cmp(c, line, v, arg) >= 0;
    if (!strcmp(t, "sameas")) {
        if (v.kind != arg.kind) return false;
        if (v.kind == JV_LIST) return v.u.list == arg.u.list;
        if (v.kind == JV_DICT) return v.u.dict == arg.u.dict;
        return jv_eq(v, arg);
    }
    if (!strcmp(t, "in")) {
        if (arg.kind == JV_STR) {
            if (v.kind != JV_STR) return false;
            return v.u.str.len == 0 ||
                   memmem(arg.u.str.s, arg.u.str.len, v.u.str.s, v.u.str.len) != NULL;
        }
        if (arg.kind == JV_LIST) {
            for (size_t i = 0; i < arg.u.list->n; i++)
                if (jv_eq(v, arg.u.list->items[i])) return true;
            return false;
        }
        if (arg.kind == JV_DICT) return jdict_find_v(arg.u.dict, v) != NULL;
        jinja_fail(c, line, "test 'in': argument of type '%s' is not iterable", jv_type_name(arg));
    }
    if (!strcmp(t, "startingwith")) {
        if (v.kind != JV_STR || arg.kind != JV_STR) return false;
        return v.u.str.len >= arg.u.str.len && !memcmp(v.u.str.s, arg.u.str.s, arg.u.str.len);
    }
    jinja_fail(c, line, "unknown test '%s'", name);
}
