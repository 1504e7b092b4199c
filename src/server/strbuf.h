/* strbuf.h — a growable byte buffer for building response bodies and SSE events (server only). */
#ifndef KILN_SERVER_STRBUF_H
#define KILN_SERVER_STRBUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct strbuf {
    char *data; /* NUL-terminated when non-NULL */
    size_t len, cap;
    bool oom; /* an append failed; the content is truncated */
} strbuf;

void sb_append(strbuf *b, const char *s, size_t n);
void sb_puts(strbuf *b, const char *s);
void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Removes the first n bytes. */
void sb_consume(strbuf *b, size_t n);
void sb_clear(strbuf *b);
void sb_free(strbuf *b);
/* Returns the buffer's string ("" if empty) and leaves b empty; the caller frees it. */
char *sb_take(strbuf *b);

#endif
