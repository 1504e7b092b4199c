/* jinja_value.c — the render arena and Jinja values: construction, truthiness, equality and
 * ordering with Python semantics, str()/repr() text, HF-style tojson, and values from JSON. */
#include "tokenizer/jinja.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena and errors --------------------------------------------------------------------- */
struct jarena_chunk {
    jarena_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

_Noreturn void jinja_fail(jinja_ctx *c, int line, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0)
        snprintf(c->err, sizeof c->err, "chat template line %d: %s", line, msg);
    else
        snprintf(c->err, sizeof c->err, "chat template: %s", msg);
    longjmp(*c->fail, 1);
}

void *jinja_alloc(jinja_ctx *c, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    jarena_chunk *ch = c->chunks;
    if (!ch || ch->cap - ch->used < n) {
        size_t cap = n > (64u << 10) ? n : (64u << 10);
        if (c->arena_used + cap > JINJA_MAX_ARENA)
            jinja_fail(c, 0, "memory limit exceeded (%u MiB)", JINJA_MAX_ARENA >> 20);
        ch = malloc(sizeof *ch + cap);
        if (!ch) jinja_fail(c, 0, "out of memory");
        ch->cap = cap;
        ch->used = 0;
        c->arena_used += cap;
        /* Keep the current (partly used) chunk first when this one is a one-off big block. */
        if (c->chunks && cap == n) {
            ch->next = c->chunks->next;
            c->chunks->next = ch;
        } else {
            ch->next = c->chunks;
            c->chunks = ch;
        }
    }
    void *p = ch->data + ch->used;
    ch->used += n;
    memset(p, 0, n);
    return p;
}

void jinja_arena_free(jinja_ctx *c) {
    jarena_chunk *ch = c->chunks;
    while (ch) {
        jarena_chunk *next = ch->next;
        free(ch);
        ch = next;
    }
    c->chunks = NULL;
    c->arena_used = 0;
}

char *jinja_strndup(jinja_ctx *c, const char *s, size_t n) {
    char *p = jinja_alloc(c, n + 1);
    if (n) memcpy(p, s, n);
    return p;
}

/* ---- buffers ------------------------------------------------------------------------------ */
void jbuf_put(jinja_ctx *c, jbuf *b, const char *s, size_t n) {
    if (n == 0) return;
    if (n > JINJA_MAX_OUTPUT || b->n + n > JINJA_MAX_OUTPUT)
        jinja_fail(c, 0, "output exceeds the size limit (%u MiB)", JINJA_MAX_OUTPUT >> 20);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = jinja_alloc(c, cap);
        if (b->n) memcpy(p, b->s, b->n);
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

void jbuf_puts(jinja_ctx *c, jbuf *b, const char *s) {
    jbuf_put(c, b, s, strlen(s));
}
void jbuf_putc(jinja_ctx *c, jbuf *b, char ch) {
    jbuf_put(c, b, &ch, 1);
}

/* ---- UTF-8 -------------------------------------------------------------------------------- */
size_t jutf8_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

size_t *jutf8_offsets(jinja_ctx *c, const char *s, size_t len, size_t *npoints) {
    size_t n = jutf8_len(s, len);
    size_t *off = jinja_alloc(c, (n + 1) * sizeof *off);
    size_t k = 0;
    for (size_t i = 0; i < len; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) off[k++] = i;
    off[n] = len;
    *npoints = n;
    return off;
}

/* ---- construction ------------------------------------------------------------------------- */
jv jv_undef(const char *name) {
    return (jv){.kind = JV_UNDEF, .u.undef_name = name};
}
jv jv_none(void) {
    return (jv){.kind = JV_NONE};
}
jv jv_bool(bool b) {
    return (jv){.kind = JV_BOOL, .u.b = b};
}
jv jv_int(int64_t i) {
    return (jv){.kind = JV_INT, .u.i = i};
}
jv jv_float(double f) {
    return (jv){.kind = JV_FLOAT, .u.f = f};
}
jv jv_str(const char *s, size_t len) {
    return (jv){.kind = JV_STR, .u.str = {s ? s : "", len}};
}
jv jv_cstr(jinja_ctx *c, const char *s) {
    return jv_strdup(c, s, strlen(s));
}
jv jv_strdup(jinja_ctx *c, const char *s, size_t len) {
    return jv_str(jinja_strndup(c, s, len), len);
}

jv jv_list(jinja_ctx *c, size_t cap) {
    jlist *l = jinja_alloc(c, sizeof *l);
    if (cap) {
        if (cap > JINJA_MAX_ARENA / sizeof(jv)) jinja_fail(c, 0, "list too large");
        l->items = jinja_alloc(c, cap * sizeof(jv));
        l->cap = cap;
    }
    return (jv){.kind = JV_LIST, .u.list = l};
}

jlist *jv_iterable(jinja_ctx *c, int line, jv v, const char *filter) {
    switch (v.kind) {
    case JV_UNDEF:
        return jv_list(c, 0).u.list;
    case JV_LIST:
        return v.u.list; /* a loop reads only the first n items, which stay valid */
    case JV_DICT: {
        jlist *l = jv_list(c, v.u.dict->n).u.list;
        if (v.u.dict->n) memcpy(l->items, v.u.dict->keys, v.u.dict->n * sizeof(jv));
        l->n = v.u.dict->n;
        return l;
    }
    case JV_STR: {
        size_t np;
        size_t *off = jutf8_offsets(c, v.u.str.s, v.u.str.len, &np);
        jlist *l = jv_list(c, np).u.list;
        for (size_t i = 0; i < np; i++)
            l->items[i] = jv_str(v.u.str.s + off[i], off[i + 1] - off[i]);
        l->n = np;
        return l;
    }
    default:
        if (filter)
            jinja_fail(c, line, "filter '%s': '%s' object is not iterable", filter,
                       jv_type_name(v));
        jinja_fail(c, line, "'%s' object is not iterable", jv_type_name(v));
    }
}

jv jv_dict(jinja_ctx *c, jdict_flavor flavor) {
    jdict *d = jinja_alloc(c, sizeof *d);
    d->flavor = flavor;
    return (jv){.kind = JV_DICT, .u.dict = d};
}

void jlist_push(jinja_ctx *c, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        jv *items = jinja_alloc(c, cap * sizeof(jv));
        if (l->n) memcpy(items, l->items, l->n * sizeof(jv));
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n++] = v;
}

jv *jdict_find(const jdict *d, const char *key, size_t len) {
    for (size_t i = 0; i < d->n; i++) {
        const jv *k = &d->keys[i];
        if (k->kind == JV_STR && k->u.str.len == len && memcmp(k->u.str.s, key, len) == 0)
            return &d->vals[i];
    }
    return NULL;
}

jv *jdict_find_v(const jdict *d, jv key) {
    if (key.kind == JV_STR) return jdict_find(d, key.u.str.s, key.u.str.len);
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->keys[i], key)) return &d->vals[i];
    return NULL;
}

void jdict_set(jinja_ctx *c, jdict *d, jv key, jv val) {
    jv *slot = jdict_find_v(d, key);
    if (slot) {
        *slot = val;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        jv *keys = jinja_alloc(c, cap * sizeof(jv));
        jv *vals = jinja_alloc(c, cap * sizeof(jv));
        if (d->n) {
            memcpy(keys, d->keys, d->n * sizeof(jv));
            memcpy(vals, d->vals, d->n * sizeof(jv));
        }
        d->keys = keys;
        d->vals = vals;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = val;
    d->n++;
}

void jdict_set_s(jinja_ctx *c, jdict *d, const char *key, jv val) {
    jdict_set(c, d, jv_str(key, strlen(key)), val);
}

/* ---- semantics ---------------------------------------------------------------------------- */
bool jv_truthy(jv v) {
    switch (v.kind) {
    case JV_UNDEF:
    case JV_NONE:
        return false;
    case JV_BOOL:
        return v.u.b;
    case JV_INT:
        return v.u.i != 0;
    case JV_FLOAT:
        return v.u.f != 0.0;
    case JV_STR:
        return v.u.str.len > 0;
    case JV_LIST:
        return v.u.list->n > 0;
    case JV_DICT:
        return v.u.dict->n > 0;
    case JV_FUNC:
        return true;
    }
    return false;
}

bool jv_is_num(jv v) {
    return v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL;
}

double jv_num(jv v) {
    if (v.kind == JV_INT) return (double)v.u.i;
    if (v.kind == JV_FLOAT) return v.u.f;
    if (v.kind == JV_BOOL) return v.u.b ? 1.0 : 0.0;
    return 0.0;
}

bool jv_eq(jv a, jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) {
            int64_t x = a.kind == JV_BOOL ? a.u.b : a.u.i, y = b.kind == JV_BOOL ? b.u.b : b.u.i;
            return x == y;
        }
        return jv_num(a) == jv_num(b);
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case JV_UNDEF:
    case JV_NONE:
        return true;
    case JV_STR:
        return a.u.str.len == b.u.str.len && memcmp(a.u.str.s, b.u.str.s, a.u.str.len) == 0;
    case JV_LIST:
        if (a.u.list->n != b.u.list->n) return false;
        for (size_t i = 0; i < a.u.list->n; i++)
            if (!jv_eq(a.u.list->items[i], b.u.list->items[i])) return false;
        return true;
    case JV_DICT:
        if (a.u.dict == b.u.dict) return true;
        if (a.u.dict->n != b.u.dict->n) return false;
        for (size_t i = 0; i < a.u.dict->n; i++) {
            jv *o = jdict_find_v(b.u.dict, a.u.dict->keys[i]);
            if (!o || !jv_eq(a.u.dict->vals[i], *o)) return false;
        }
        return true;
    case JV_FUNC:
        return a.u.fn == b.u.fn;
    default:
        return false;
    }
}

const char *jv_type_name(jv v) {
    switch (v.kind) {
    case JV_UNDEF:
        return "Undefined";
    case JV_NONE:
        return "NoneType";
    case JV_BOOL:
        return "bool";
    case JV_INT:
        return "int";
    case JV_FLOAT:
        return "float";
    case JV_STR:
        return "str";
    case JV_LIST:
        return v.u.list->tuple ? "tuple" : "list";
    case JV_DICT:
        return v.u.dict->flavor == JD_NAMESPACE ? "Namespace" : "dict";
    case JV_FUNC:
        return "function";
    }
    return "?";
}

int jv_cmp(jinja_ctx *c, int line, jv a, jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) {
            int64_t x = a.kind == JV_BOOL ? a.u.b : a.u.i, y = b.kind == JV_BOOL ? b.u.b : b.u.i;
            return (x > y) - (x < y);
        }
        double x = jv_num(a), y = jv_num(b);
        return (x > y) - (x < y);
    }
    if (a.kind == JV_STR && b.kind == JV_STR) {
        size_t n = a.u.str.len < b.u.str.len ? a.u.str.len : b.u.str.len;
        int r = n ? memcmp(a.u.str.s, b.u.str.s, n) : 0;
        if (r) return r < 0 ? -1 : 1;
        return (a.u.str.len > b.u.str.len) - (a.u.str.len < b.u.str.len);
    }
    if (a.kind == JV_LIST && b.kind == JV_LIST) {
        size_t n = a.u.list->n < b.u.list->n ? a.u.list->n : b.u.list->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_eq(a.u.list->items[i], b.u.list->items[i])) continue;
            return jv_cmp(c, line, a.u.list->items[i], b.u.list->items[i]);
        }
        return (a.u.list->n > b.u.list->n) - (a.u.list->n < b.u.list->n);
    }
    jinja_fail(c, line, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a),
               jv_type_name(b));
}

/* ---- str() and repr() --------------------------------------------------------------------- */
/* Python's repr(float): shortest text that round-trips, with Python's exponent rules. */
static void float_repr(jinja_ctx *c, jbuf *b, double f) {
    if (isnan(f)) return jbuf_puts(c, b, "nan");
    if (isinf(f)) return jbuf_puts(c, b, f < 0 ? "-inf" : "inf");
    char digits[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(digits, sizeof digits, "%.*e", prec - 1, f);
        if (strtod(digits, NULL) == f) break;
    }
    /* digits: [-]d[.ddd]e[+-]XX */
    char *e = strchr(digits, 'e');
    int exp10 = atoi(e + 1);
    *e = 0;
    char mant[40];
    size_t m = 0;
    bool neg = digits[0] == '-';
    for (char *p = digits + neg; *p; p++)
        if (*p != '.') mant[m++] = *p;
    mant[m] = 0;
    char out[64];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp10 < -4 || exp10 >= 16) {
        out[o++] = mant[0];
        if (m > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < m; i++) out[o++] = mant[i];
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", exp10 < 0 ? '-' : '+',
                              exp10 < 0 ? -exp10 : exp10);
    } else if (exp10 < 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -exp10 - 1; i++) out[o++] = '0';
        for (size_t i = 0; i < m; i++) out[o++] = mant[i];
        out[o] = 0;
    } else {
        for (int i = 0; i <= exp10; i++) out[o++] = (size_t)i < m ? mant[i] : '0';
        out[o++] = '.';
        if ((size_t)exp10 + 1 < m)
            for (size_t i = (size_t)exp10 + 1; i < m; i++) out[o++] = mant[i];
        else
            out[o++] = '0';
        out[o] = 0;
    }
    jbuf_puts(c, b, out);
}

static void str_repr(jinja_ctx *c, jbuf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jbuf_putc(c, b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char tmp[8];
        if (ch == '\\')
            jbuf_puts(c, b, "\\\\");
        else if (ch == (unsigned char)q) {
            jbuf_putc(c, b, '\\');
            jbuf_putc(c, b, q);
        } else if (ch == '\n')
            jbuf_puts(c, b, "\\n");
        else if (ch == '\r')
            jbuf_puts(c, b, "\\r");
        else if (ch == '\t')
            jbuf_puts(c, b, "\\t");
        else if (ch < 0x20 || ch == 0x7f) {
            snprintf(tmp, sizeof tmp, "\\x%02x", ch);
            jbuf_puts(c, b, tmp);
        } else
            jbuf_putc(c, b, (char)ch);
    }
    jbuf_putc(c, b, q);
}

void jv_repr_buf(jinja_ctx *c, jbuf *b, jv v) {
    if (++c->depth > JINJA_MAX_DEPTH) jinja_fail(c, 0, "value nested too deeply");
    switch (v.kind) {
    case JV_STR:
        str_repr(c, b, v.u.str.s, v.u.str.len);
        break;
    case JV_LIST: {
        jlist *l = v.u.list;
        jbuf_putc(c, b, l->tuple ? '(' : '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) jbuf_puts(c, b, ", ");
            jv_repr_buf(c, b, l->items[i]);
        }
        if (l->tuple && l->n == 1) jbuf_putc(c, b, ',');
        jbuf_putc(c, b, l->tuple ? ')' : ']');
        break;
    }
    case JV_DICT: {
        jdict *d = v.u.dict;
        if (d->flavor == JD_NAMESPACE) jbuf_puts(c, b, "<Namespace ");
        jbuf_putc(c, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) jbuf_puts(c, b, ", ");
            jv_repr_buf(c, b, d->keys[i]);
            jbuf_puts(c, b, ": ");
            jv_repr_buf(c, b, d->vals[i]);
        }
        jbuf_putc(c, b, '}');
        if (d->flavor == JD_NAMESPACE) jbuf_putc(c, b, '>');
        break;
    }
    case JV_UNDEF:
        jbuf_puts(c, b, "Undefined");
        break;
    default:
        jv_to_buf(c, b, v);
        break;
    }
    c->depth--;
}

void jv_to_buf(jinja_ctx *c, jbuf *b, jv v) {
    char tmp[32];
    switch (v.kind) {
    case JV_UNDEF:
        break;
    case JV_NONE:
        jbuf_puts(c, b, "None");
        break;
    case JV_BOOL:
        jbuf_puts(c, b, v.u.b ? "True" : "False");
        break;
    case JV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.u.i);
        jbuf_puts(c, b, tmp);
        break;
    case JV_FLOAT:
        float_repr(c, b, v.u.f);
        break;
    case JV_STR:
        jbuf_put(c, b, v.u.str.s, v.u.str.len);
        break;
    case JV_LIST:
    case JV_DICT:
        jv_repr_buf(c, b, v);
        break;
    case JV_FUNC:
        snprintf(tmp, sizeof tmp, "<function>");
        jbuf_puts(c, b, tmp);
        break;
    }
}

jv jv_to_str(jinja_ctx *c, jv v) {
    if (v.kind == JV_STR) return v;
    if (v.kind == JV_UNDEF) return jv_str("", 0);
    jbuf b = {0};
    jv_to_buf(c, &b, v);
    return jv_str(b.s, b.n);
}

/* ---- tojson ------------------------------------------------------------------------------- */
static void json_str(jinja_ctx *c, jbuf *b, const char *s, size_t n) {
    jbuf_putc(c, b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char tmp[8];
        switch (ch) {
        case '"':
            jbuf_puts(c, b, "\\\"");
            break;
        case '\\':
            jbuf_puts(c, b, "\\\\");
            break;
        case '\n':
            jbuf_puts(c, b, "\\n");
            break;
        case '\r':
            jbuf_puts(c, b, "\\r");
            break;
        case '\t':
            jbuf_puts(c, b, "\\t");
            break;
        case '\b':
            jbuf_puts(c, b, "\\b");
            break;
        case '\f':
            jbuf_puts(c, b, "\\f");
            break;
        default:
            if (ch < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", ch);
                jbuf_puts(c, b, tmp);
            } else
                jbuf_putc(c, b, (char)ch);
        }
    }
    jbuf_putc(c, b, '"');
}

static void json_newline(jinja_ctx *c, jbuf *b, int indent, int level) {
    jbuf_putc(c, b, '\n');
    for (int i = 0; i < indent * level; i++) jbuf_putc(c, b, ' ');
}

static int key_cmp_ctx(const void *x, const void *y) {
    const jv *a = *(const jv *const *)x, *bb = *(const jv *const *)y;
    size_t n = a->u.str.len < bb->u.str.len ? a->u.str.len : bb->u.str.len;
    int r = n ? memcmp(a->u.str.s, bb->u.str.s, n) : 0;
    if (r) return r;
    return (a->u.str.len > bb->u.str.len) - (a->u.str.len < bb->u.str.len);
}

static void tojson_rec(jinja_ctx *c, int line, jbuf *b, jv v, int indent, const char *isep,
                       const char *ksep, bool sort_keys, int level) {
    if (level > JINJA_MAX_DEPTH) jinja_fail(c, line, "tojson: value nested too deeply");
    switch (v.kind) {
    case JV_UNDEF:
        jinja_fail(c, line, "tojson: Object of type Undefined is not JSON serializable");
    case JV_NONE:
        jbuf_puts(c, b, "null");
        return;
    case JV_BOOL:
        jbuf_puts(c, b, v.u.b ? "true" : "false");
        return;
    case JV_INT:
        jv_to_buf(c, b, v);
        return;
    case JV_FLOAT:
        if (isnan(v.u.f))
            jbuf_puts(c, b, "NaN");
        else if (isinf(v.u.f))
            jbuf_puts(c, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else
            jv_to_buf(c, b, v);
        return;
    case JV_STR:
        json_str(c, b, v.u.str.s, v.u.str.len);
        return;
    case JV_FUNC:
        jinja_fail(c, line, "tojson: Object of type function is not JSON serializable");
    case JV_LIST: {
        jlist *l = v.u.list;
        if (l->n == 0) return jbuf_puts(c, b, "[]");
        jbuf_putc(c, b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) jbuf_puts(c, b, isep);
            if (indent >= 0) json_newline(c, b, indent, level + 1);
            tojson_rec(c, line, b, l->items[i], indent, isep, ksep, sort_keys, level + 1);
        }
        if (indent >= 0) json_newline(c, b, indent, level);
        jbuf_putc(c, b, ']');
        return;
    }
    case JV_DICT: {
        jdict *d = v.u.dict;
        if (d->n == 0) return jbuf_puts(c, b, "{}");
        /* Keys become strings first (as json.dumps does), then optionally sorted. */
        jv *keys = jinja_alloc(c, d->n * sizeof(jv));
        const jv **order = jinja_alloc(c, d->n * sizeof(jv *));
        for (size_t i = 0; i < d->n; i++) {
            jv k = d->keys[i];
            if (k.kind == JV_STR)
                keys[i] = k;
            else if (k.kind == JV_NONE)
                keys[i] = jv_str("null", 4);
            else if (k.kind == JV_BOOL)
                keys[i] = k.u.b ? jv_str("true", 4) : jv_str("false", 5);
            else if (k.kind == JV_INT || k.kind == JV_FLOAT)
                keys[i] = jv_to_str(c, k);
            else
                jinja_fail(c, line, "tojson: keys must be str, int, float, bool or None, not %s",
                           jv_type_name(k));
            order[i] = &keys[i];
        }
        if (sort_keys) qsort(order, d->n, sizeof *order, key_cmp_ctx);
        jbuf_putc(c, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            size_t k = (size_t)(order[i] - keys);
            if (i) jbuf_puts(c, b, isep);
            if (indent >= 0) json_newline(c, b, indent, level + 1);
            json_str(c, b, keys[k].u.str.s, keys[k].u.str.len);
            jbuf_puts(c, b, ksep);
            tojson_rec(c, line, b, d->vals[k], indent, isep, ksep, sort_keys, level + 1);
        }
        if (indent >= 0) json_newline(c, b, indent, level);
        jbuf_putc(c, b, '}');
        return;
    }
    }
}

void jv_tojson(jinja_ctx *c, int line, jbuf *b, jv v, int indent, const char *item_sep,
               const char *key_sep, bool sort_keys) {
    if (!item_sep) item_sep = indent >= 0 ? "," : ", ";
    if (!key_sep) key_sep = ": ";
    tojson_rec(c, line, b, v, indent, item_sep, key_sep, sort_keys, 0);
}

/* ---- from JSON ---------------------------------------------------------------------------- */
static jv from_cjson(jinja_ctx *c, const cJSON *j, int depth) {
    if (depth > JINJA_MAX_DEPTH) jinja_fail(c, 0, "input JSON nested too deeply");
    if (cJSON_IsNull(j)) return jv_none();
    if (cJSON_IsBool(j)) return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsString(j)) return jv_cstr(c, j->valuestring);
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9.007199254740992e15) return jv_int((int64_t)d);
        return jv_float(d);
    }
    if (cJSON_IsArray(j)) {
        jv l = jv_list(c, 0);
        for (const cJSON *e = j->child; e; e = e->next)
            jlist_push(c, l.u.list, from_cjson(c, e, depth + 1));
        return l;
    }
    if (cJSON_IsObject(j)) {
        jv d = jv_dict(c, JD_PLAIN);
        for (const cJSON *e = j->child; e; e = e->next)
            jdict_set(c, d.u.dict, jv_cstr(c, e->string ? e->string : ""),
                      from_cjson(c, e, depth + 1));
        return d;
    }
    return jv_none();
}

jv jv_from_json(jinja_ctx *c, const char *json, const char *what) {
    if (!json) return jv_none();
    cJSON *j = cJSON_Parse(json);
    if (!j) jinja_fail(c, 0, "%s is not valid JSON", what);
    /* Convert under our own jump so the cJSON tree is freed on failure too. */
    jmp_buf here, *outer = c->fail;
    jv v = jv_none();
    c->fail = &here;
    if (setjmp(here) == 0) {
        v = from_cjson(c, j, 0);
        c->fail = outer;
        cJSON_Delete(j);
        return v;
    }
    c->fail = outer;
    cJSON_Delete(j);
    longjmp(*outer, 1);
}
