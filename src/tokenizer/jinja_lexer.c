/* jinja_lexer.c — turns template source into tokens with Jinja2's whitespace rules as transformers
 * configures them: newlines normalized and one trailing newline dropped, trim_blocks (a newline
 * after a block or comment tag is removed), lstrip_blocks (spaces/tabs before a block or comment
 * tag at line start are removed), `-` strips all whitespace on that side, `+` disables both.
 * Comments vanish; {% raw %} bodies become text. */
#include "tokenizer/jinja.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

typedef struct lexer {
    jinja_ctx *c;
    const char *s;
    size_t n, p;
    int line;
    jtok *toks;
    int ntoks, cap;
} lexer;

static jtok *emit(lexer *L, jtok_type type, const char *s, size_t len) {
    if (L->ntoks == L->cap) {
        int cap = L->cap ? L->cap * 2 : 256;
        jtok *t = jinja_alloc(L->c, (size_t)cap * sizeof *t);
        if (L->ntoks) memcpy(t, L->toks, (size_t)L->ntoks * sizeof *t);
        L->toks = t;
        L->cap = cap;
    }
    jtok *t = &L->toks[L->ntoks++];
    t->type = type;
    t->line = L->line;
    t->s = s;
    t->len = len;
    return t;
}

static bool is_ws(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}

static int count_lines(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* Finds the next tag opener at or after p; returns n if none. */
static size_t find_open(const lexer *L, size_t p) {
    for (size_t i = p; i + 1 < L->n; i++)
        if (L->s[i] == '{' && (L->s[i + 1] == '{' || L->s[i + 1] == '%' || L->s[i + 1] == '#'))
            return i;
    return L->n;
}

/* Emits text s[from, to) after applying the strip flags. */
static void emit_text(lexer *L, size_t from, size_t to, bool lstrip_all, int strip_right) {
    const char *s = L->s;
    size_t a = from, b = to;
    if (lstrip_all)
        while (a < b && is_ws(s[a])) a++;
    if (strip_right == 1) { /* `-`: all whitespace */
        while (b > a && is_ws(s[b - 1])) b--;
    } else if (strip_right == 2) { /* lstrip_blocks: spaces/tabs back to a line start */
        size_t q = to;
        while (q > from && (s[q - 1] == ' ' || s[q - 1] == '\t')) q--;
        if (q == 0 || s[q - 1] == '\n') b = q > a ? q : a;
    }
    if (b > a) emit(L, JT_TEXT, jinja_strndup(L->c, s + a, b - a), b - a);
    L->line += count_lines(s + from, to - from);
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static size_t put_utf8(char *o, unsigned long cp) {
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Lexes a string literal starting at the quote; decodes Python escapes. */
static void lex_string(lexer *L) {
    char q = L->s[L->p];
    size_t start = L->p++;
    int line0 = L->line;
    char *out = jinja_alloc(L->c, L->n - start + 1);
    size_t o = 0;
    while (true) {
        if (L->p >= L->n) {
            L->line = line0;
            jinja_fail(L->c, line0, "unterminated string literal");
        }
        char ch = L->s[L->p++];
        if (ch == q) break;
        if (ch == '\n') L->line++;
        if (ch != '\\' || L->p >= L->n) {
            out[o++] = ch;
            continue;
        }
        char e = L->s[L->p++];
        int digits = 0;
        switch (e) {
        case 'n':
            out[o++] = '\n';
            break;
        case 't':
            out[o++] = '\t';
            break;
        case 'r':
            out[o++] = '\r';
            break;
        case 'b':
            out[o++] = '\b';
            break;
        case 'f':
            out[o++] = '\f';
            break;
        case 'v':
            out[o++] = '\v';
            break;
        case 'a':
            out[o++] = '\a';
            break;
        case '0':
            out[o++] = '\0';
            break;
        case '\\':
            out[o++] = '\\';
            break;
        case '\'':
            out[o++] = '\'';
            break;
        case '"':
            out[o++] = '"';
            break;
        case '\n':
            L->line++;
            break; /* line continuation */
        case 'x':
            digits = 2;
            break;
        case 'u':
            digits = 4;
            break;
        case 'U':
            digits = 8;
            break;
        default:
            out[o++] = '\\';
            out[o++] = e;
        }
        if (digits) {
            unsigned long cp = 0;
            int k = 0;
            while (k < digits && L->p < L->n && hexval(L->s[L->p]) >= 0)
                cp = cp * 16 + (unsigned long)hexval(L->s[L->p++]), k++;
            if (k != digits) jinja_fail(L->c, L->line, "bad \\%c escape in string literal", e);
            o += put_utf8(out + o, cp);
        }
    }
    jtok *t = emit(L, JT_STRING, out, o);
    t->line = line0;
}

static void lex_number(lexer *L) {
    size_t a = L->p;
    char buf[128];
    size_t k = 0;
    bool is_float = false;
    while (L->p < L->n) {
        char ch = L->s[L->p];
        if (isdigit((unsigned char)ch))
            buf[k < 127 ? k++ : k] = ch;
        else if (ch == '_' && L->p > a && L->p + 1 < L->n && isdigit((unsigned char)L->s[L->p + 1]))
            ;
        else if (ch == '.' && !is_float && L->p + 1 < L->n &&
                 isdigit((unsigned char)L->s[L->p + 1])) {
            is_float = true;
            buf[k < 127 ? k++ : k] = ch;
        } else if ((ch == 'e' || ch == 'E') && L->p + 1 < L->n &&
                   (isdigit((unsigned char)L->s[L->p + 1]) ||
                    ((L->s[L->p + 1] == '+' || L->s[L->p + 1] == '-') && L->p + 2 < L->n &&
                     isdigit((unsigned char)L->s[L->p + 2])))) {
            is_float = true;
            buf[k < 127 ? k++ : k] = ch;
            L->p++;
            buf[k < 127 ? k++ : k] = L->s[L->p];
        } else
            break;
        L->p++;
    }
    buf[k] = 0;
    if (is_float) {
        jtok *t = emit(L, JT_FLOAT, NULL, 0);
        t->f = strtod(buf, NULL);
    } else {
        char *end;
        unsigned long long v = strtoull(buf, &end, 10);
        if (k > 18 && (v > (unsigned long long)INT64_MAX || k > 19))
            jinja_fail(L->c, L->line, "integer literal too large");
        jtok *t = emit(L, JT_INT, NULL, 0);
        t->i = (int64_t)v;
    }
}

static const char *const ops3[] = {NULL};
static const char *const ops2[] = {"**", "//", "==", "!=", "<=", ">=", NULL};
static const char ops1[] = "+-*/%~<>()[]{},.:|=";

/* Lexes the inside of a {{ }} or {% %} tag. Returns the index just after the closing delimiter
 * and whether it had `-` (strip after) or `+`. */
static void lex_tag(lexer *L, bool block, bool *strip_after, bool *plus_after) {
    char close = block ? '%' : '}';
    int depth = 0;
    (void)ops3;
    while (true) {
        while (L->p < L->n && is_ws(L->s[L->p])) {
            if (L->s[L->p] == '\n') L->line++;
            L->p++;
        }
        if (L->p >= L->n)
            jinja_fail(L->c, L->line, "unexpected end of template, expected '%s'",
                       block ? "%}" : "}}");
        const char *s = L->s + L->p;
        size_t left = L->n - L->p;
        if (depth == 0) {
            if ((s[0] == '-' || s[0] == '+') && left >= 3 && s[1] == close && s[2] == '}') {
                *strip_after = s[0] == '-';
                *plus_after = s[0] == '+';
                L->p += 3;
                return;
            }
            if (left >= 2 && s[0] == close && s[1] == '}') {
                L->p += 2;
                return;
            }
        }
        char ch = s[0];
        if (ch == '\'' || ch == '"') {
            lex_string(L);
        } else if (isdigit((unsigned char)ch)) {
            lex_number(L);
        } else if (isalpha((unsigned char)ch) || ch == '_') {
            size_t a = L->p;
            while (L->p < L->n && (isalnum((unsigned char)L->s[L->p]) || L->s[L->p] == '_')) L->p++;
            emit(L, JT_NAME, jinja_strndup(L->c, L->s + a, L->p - a), L->p - a);
        } else {
            const char *op = NULL;
            for (int i = 0; ops2[i]; i++)
                if (left >= 2 && memcmp(s, ops2[i], 2) == 0) op = ops2[i];
            if (op) {
                emit(L, JT_OP, op, 2);
                L->p += 2;
            } else if (strchr(ops1, ch) && ch) {
                if (ch == '(' || ch == '[' || ch == '{') depth++;
                if ((ch == ')' || ch == ']' || ch == '}') && depth > 0) depth--;
                emit(L, JT_OP, jinja_strndup(L->c, s, 1), 1);
                L->p++;
            } else {
                jinja_fail(L->c, L->line, "unexpected character '%c'", ch);
            }
        }
    }
}

/* After `{%` (and an optional -/+), if the tag is `raw`, consumes through {% endraw %} and emits
 * the body as text. Returns true if it was a raw block. */
static bool lex_raw(lexer *L, size_t tag_start, bool *strip_after) {
    size_t p = L->p;
    while (p < L->n && is_ws(L->s[p])) p++;
    if (L->n - p < 3 || memcmp(L->s + p, "raw", 3) != 0) return false;
    p += 3;
    while (p < L->n && is_ws(L->s[p])) p++;
    bool strip_body_left = false;
    if (p < L->n && (L->s[p] == '-' || L->s[p] == '+')) strip_body_left = L->s[p++] == '-';
    if (L->n - p < 2 || L->s[p] != '%' || L->s[p + 1] != '}') return false;
    p += 2;
    size_t body = p;
    /* Find {%[-+]? endraw [-+]?%} */
    for (size_t i = body; i + 1 < L->n; i++) {
        if (L->s[i] != '{' || L->s[i + 1] != '%') continue;
        size_t q = i + 2;
        bool strip_body_right = false;
        if (q < L->n && (L->s[q] == '-' || L->s[q] == '+')) strip_body_right = L->s[q++] == '-';
        while (q < L->n && is_ws(L->s[q])) q++;
        if (L->n - q < 6 || memcmp(L->s + q, "endraw", 6) != 0) continue;
        q += 6;
        while (q < L->n && is_ws(L->s[q])) q++;
        bool sa = false;
        if (q < L->n && (L->s[q] == '-' || L->s[q] == '+')) sa = L->s[q++] == '-';
        if (L->n - q < 2 || L->s[q] != '%' || L->s[q + 1] != '}') continue;
        size_t a = body, b = i;
        if (strip_body_left)
            while (a < b && is_ws(L->s[a])) a++;
        else if (a < b && L->s[a] == '\n')
            a++; /* trim_blocks after {% raw %} */
        if (strip_body_right)
            while (b > a && is_ws(L->s[b - 1])) b--;
        L->line += count_lines(L->s + tag_start, a - tag_start);
        if (b > a) emit(L, JT_TEXT, jinja_strndup(L->c, L->s + a, b - a), b - a);
        L->line += count_lines(L->s + a, q + 2 - a);
        L->p = q + 2;
        *strip_after = sa;
        if (!sa && L->p < L->n && L->s[L->p] == '\n') {
            L->p++;
            L->line++;
        }
        return true;
    }
    jinja_fail(L->c, L->line, "unclosed raw block (missing {%% endraw %%})");
}

void jinja_lex(jinja_ctx *c, const char *src, size_t len, jtok **toks, int *ntoks) {
    /* Normalize \r\n and \r to \n; drop one trailing newline (keep_trailing_newline=False). */
    char *s = jinja_alloc(c, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else
            s[n++] = src[i];
    }
    if (n && s[n - 1] == '\n') n--;
    lexer L = {.c = c, .s = s, .n = n, .line = 1};
    bool strip_next = false; /* previous tag ended with `-` */
    while (L.p < L.n) {
        size_t open = find_open(&L, L.p);
        if (open >= L.n) {
            emit_text(&L, L.p, L.n, strip_next, 0);
            L.p = L.n;
            break;
        }
        char kind = s[open + 1];
        char mod = open + 2 < n ? s[open + 2] : 0;
        int strip_right = 0;
        if (mod == '-')
            strip_right = 1;
        else if (mod != '+' && kind != '{')
            strip_right = 2;
        emit_text(&L, L.p, open, strip_next, strip_right);
        L.p = open + 2 + (mod == '-' || mod == '+');
        strip_next = false;
        if (kind == '#') {
            size_t i = L.p;
            while (i + 1 < n && !(s[i] == '#' && s[i + 1] == '}')) i++;
            if (i + 1 >= n) jinja_fail(c, L.line, "unclosed comment (missing '#}')");
            bool minus = i > L.p && s[i - 1] == '-', plus = i > L.p && s[i - 1] == '+';
            L.line += count_lines(s + L.p, i - L.p);
            L.p = i + 2;
            if (minus)
                strip_next = true;
            else if (!plus && L.p < n && s[L.p] == '\n') {
                L.p++;
                L.line++;
            }
            continue;
        }
        bool block = kind == '%';
        if (block && lex_raw(&L, open, &strip_next)) continue;
        emit(&L, block ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, NULL, 0);
        bool strip_after = false, plus_after = false;
        lex_tag(&L, block, &strip_after, &plus_after);
        emit(&L, block ? JT_BLOCK_END : JT_VAR_END, NULL, 0);
        if (strip_after)
            strip_next = true;
        else if (block && !plus_after && L.p < n && s[L.p] == '\n') {
            L.p++;
            L.line++;
        }
    }
    emit(&L, JT_EOF, NULL, 0);
    *toks = L.toks;
    *ntoks = L.ntoks;
}
