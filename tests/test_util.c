/* test_util.c — implementation of the test harness helpers (see test_util.h). */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int test_failures = 0;
int test_checks = 0;

int test_finish(void) {
    fprintf(stderr, "%d checks, %d failed\n", test_checks, test_failures);
    return test_failures ? 1 : (test_checks ? 0 : (fprintf(stderr, "no checks ran\n"), 1));
}

int test_skip(const char *why) {
    fprintf(stderr, "SKIPPED: %s\n", why);
    return 77;
}

static char path_slots[8][4096];
static int path_slot = 0;

static const char *join(const char *base, const char *rel) {
    char *buf = path_slots[path_slot++ & 7];
    snprintf(buf, 4096, "%s/%s", base, rel);
    return buf;
}

const char *test_shared(const char *rel) {
    const char *s = getenv("KILN_SHARED");
    return join(s ? s : "../shared", rel);
}

const char *test_source(const char *rel) {
    const char *s = getenv("KILN_SOURCE");
    return join(s ? s : ".", rel);
}

const char *test_bin(void) {
    const char *s = getenv("KILN_BIN");
    return s ? s : "build/kiln";
}

const char *test_tmpdir(void) {
    static char dir[256];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/kiln-test-XXXXXX");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            exit(1);
        }
    }
    return dir;
}

char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    buf[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

bool test_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, len, f) == len;
    return fclose(f) == 0 && ok;
}

double test_rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    if (isnan(num)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

char *test_run(const char *cmd, int *status) {
    FILE *p = popen(cmd, "r");
    if (!p) {
        *status = -1;
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len < 2) buf = realloc(buf, cap *= 2);
    }
    buf[len] = 0;
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return buf;
}

uint64_t test_rand_u64(uint64_t *s) {
    uint64_t x = *s += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

float test_rand_uniform(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)((test_rand_u64(s) >> 40) / 16777216.0);
}

float test_rand_normal(uint64_t *s) {
    double u1 = ((test_rand_u64(s) >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (test_rand_u64(s) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
