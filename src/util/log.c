/* log.c — stderr logger with a global level (set once at start-up by the CLI or the embedder). */
#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>

static kiln_log_level current_level = KILN_LOG_WARN;

void kiln_set_log_level(kiln_log_level level) {
    current_level = level;
}
kiln_log_level kiln_get_log_level(void) {
    return current_level;
}

void kiln_log(kiln_log_level level, const char *fmt, ...) {
    if (level > current_level) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kiln: %s: %s\n", names[level], line);
}
