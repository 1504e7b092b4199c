/* status.c — the thread-local last-error buffer behind kiln_last_error(). */
#include "util/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[2048];

const char *kiln_last_error(void) {
    return last_error;
}

void kiln_error_clear(void) {
    last_error[0] = 0;
}

kiln_status kiln_error(kiln_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

kiln_status kiln_error_wrap(kiln_status status, const char *fmt, ...) {
    char prev[sizeof last_error];
    memcpy(prev, last_error, sizeof prev);
    char ctx[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    size_t n = strlen(ctx);
    if (n > sizeof last_error - 3) n = sizeof last_error - 3;
    memcpy(last_error, ctx, n);
    memcpy(last_error + n, ": ", 2);
    size_t rest = sizeof last_error - n - 3;
    size_t plen = strnlen(prev, rest);
    memcpy(last_error + n + 2, prev, plen);
    last_error[n + 2 + plen] = 0;
    return status;
}

const char *kiln_status_name(kiln_status status) {
    switch (status) {
    case KILN_OK:
        return "ok";
    case KILN_ERR_INVALID_ARG:
        return "invalid argument";
    case KILN_ERR_IO:
        return "I/O error";
    case KILN_ERR_FORMAT:
        return "format error";
    case KILN_ERR_UNSUPPORTED:
        return "unsupported";
    case KILN_ERR_NOT_FOUND:
        return "not found";
    case KILN_ERR_OOM:
        return "out of memory";
    case KILN_ERR_CACHE_FULL:
        return "cache full";
    case KILN_ERR_CANCELLED:
        return "cancelled";
    case KILN_ERR_DEVICE:
        return "device error";
    case KILN_ERR_INTERNAL:
        return "internal error";
    }
    return "unknown status";
}
