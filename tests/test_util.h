/* test_util.h — the tiny test harness: CHECK macros that report file:line, access to ../shared
 * (KILN_SHARED) and to the built CLI (KILN_BIN), file helpers and error metrics.
 * A test program returns test_finish(): 0 if every check passed, 1 otherwise, 77 = skipped
 * (CTest shows it as skipped, never as passed). */
#ifndef KILN_TEST_UTIL_H
#define KILN_TEST_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

extern int test_failures;
extern int test_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(cond)) {                                                                             \
            test_failures++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(cond)) {                                                                             \
            test_failures++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* kiln_status must be KILN_OK; prints kiln_last_error() otherwise. */
#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        test_checks++;                                                                             \
        kiln_status st_ = (expr);                                                                  \
        if (st_ != KILN_OK) {                                                                      \
            test_failures++;                                                                       \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #expr,               \
                    kiln_status_name(st_), kiln_last_error());                                     \
        }                                                                                          \
    } while (0)

/* expr must fail with status want and its message must contain needle (may be NULL). */
#define CHECK_ERR(expr, want, needle)                                                              \
    do {                                                                                           \
        test_checks++;                                                                             \
        kiln_status st_ = (expr);                                                                  \
        if (st_ != (want) || ((needle) && !strstr(kiln_last_error(), (needle) ? (needle) : ""))) { \
            test_failures++;                                                                       \
            fprintf(stderr, "%s:%d: %s: want %s containing '%s', got %s: %s\n", __FILE__,          \
                    __LINE__, #expr, kiln_status_name(want), (needle) ? (needle) : "",             \
                    kiln_status_name(st_), kiln_last_error());                                     \
        }                                                                                          \
    } while (0)

int test_finish(void);
/* Prints the reason and returns 77 (skip). */
int test_skip(const char *why);

/* Path helpers: test_shared("fixtures/llama") -> "<KILN_SHARED>/fixtures/llama" (static buffer
 * rotated over 8 slots). */
const char *test_shared(const char *rel);
const char *test_source(const char *rel); /* relative to the repository root */
const char *test_bin(void);               /* the kiln CLI */
const char *test_tmpdir(void);            /* a fresh directory for this test process */

/* Reads a whole file (malloc'd, NUL-terminated); NULL if unreadable. */
char *test_read_file(const char *path, size_t *len);
bool test_write_file(const char *path, const void *data, size_t len);

/* ||a-b|| / ||b|| over n floats. */
double test_rel_l2(const float *a, const float *b, size_t n);
/* Runs a shell command, captures stdout (malloc'd) and the exit status. */
char *test_run(const char *cmd, int *status);

/* Deterministic pseudo-random numbers for tests. */
uint64_t test_rand_u64(uint64_t *state);
float test_rand_normal(uint64_t *state);
float test_rand_uniform(uint64_t *state, float lo, float hi);

#endif
