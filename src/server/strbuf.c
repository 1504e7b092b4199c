/* strbuf.c — growable byte buffer (see strbuf.h). */
#include "server/strbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool sb_reserve(strbuf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

void sb_append(strbuf *b, const char *s, size_t n) {
    if (!sb_reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void sb_puts(strbuf *b, const char *s) {
    sb_append(b, s, strlen(s));
}

void sb_printf(strbuf *b, const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n > 0 && sb_reserve(b, (size_t)n)) {
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
}

void sb_consume(strbuf *b, size_t n) {
    if (n >= b->len) {
        sb_clear(b);
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = '\0';
}

void sb_clear(strbuf *b) {
    b->len = 0;
    if (b->data) b->data[0] = '\0';
}

void sb_free(strbuf *b) {
    free(b->data);
    *b = (strbuf){0};
}

char *sb_take(strbuf *b) {
    char *s = b->data ? b->data : strdup("");
    *b = (strbuf){0};
    return s;
}
