/* status.h — setting and reading the thread's last error (the message half of kiln_status). */
#ifndef KILN_UTIL_STATUS_H
#define KILN_UTIL_STATUS_H

#include "kiln.h"

/* Records a formatted message as this thread's last error and returns status, so callers write
 * `return kiln_error(KILN_ERR_FORMAT, "%s: tensor %s: ...", path, name);` */
kiln_status kiln_error(kiln_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepends context to the current last error: "context: <previous message>". Returns status. */
kiln_status kiln_error_wrap(kiln_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void kiln_error_clear(void);

/* Propagate a failing status unchanged. */
#define KILN_TRY(expr)                                                                             \
    do {                                                                                           \
        kiln_status kiln_try_st_ = (expr);                                                         \
        if (kiln_try_st_ != KILN_OK) return kiln_try_st_;                                          \
    } while (0)

#endif
