/* log.h — leveled logging to stderr ("kiln: info: loaded 3 tensors ..."). */
#ifndef KILN_UTIL_LOG_H
#define KILN_UTIL_LOG_H

#include "kiln.h"

void kiln_log(kiln_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
kiln_log_level kiln_get_log_level(void);

#define KILN_LOG_E(...) kiln_log(KILN_LOG_ERROR, __VA_ARGS__)
#define KILN_LOG_W(...) kiln_log(KILN_LOG_WARN, __VA_ARGS__)
#define KILN_LOG_I(...) kiln_log(KILN_LOG_INFO, __VA_ARGS__)
#define KILN_LOG_D(...) kiln_log(KILN_LOG_DEBUG, __VA_ARGS__)

#endif
