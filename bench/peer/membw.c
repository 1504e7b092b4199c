/* membw.c — the machine's multi-threaded memory read bandwidth, the ceiling for memory-bound
 * decode.
 *
 *   cc -O2 -march=native -pthread bench/peer/membw.c -o membw && ./membw [threads=2] [MiB=1024]
 * [reps=7]
 *
 * Each thread streams its own slice of one buffer (much larger than the last-level cache) with
 * 256-bit loads into four XOR accumulators; prints the median GB/s (1e9 bytes/s) over the reps as
 * one JSON line. Pages are touched first so page faults are not timed. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char *buf;
static size_t slice;
static int nthr;
static pthread_barrier_t bar;
static volatile uint64_t sink;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *reader(void *arg) {
    size_t t = (size_t)(uintptr_t)arg;
    const __m256i *p = (const __m256i *)(buf + t * slice), *e = p + slice / sizeof(__m256i);
    memset((void *)p, (int)t + 1, slice); /* first touch from the reading thread */
    pthread_barrier_wait(&bar);
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (; p < e; p += 4) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(p));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256(p + 1));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256(p + 2));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256(p + 3));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    sink ^= (uint64_t)_mm256_extract_epi64(a0, 0);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    nthr = argc > 1 ? atoi(argv[1]) : 2;
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    int reps = argc > 3 ? atoi(argv[3]) : 7;
    if (nthr < 1 || nthr > 256 || reps < 1 || reps > 1000 || mib < 16) return 2;
    slice = (mib << 20) / (size_t)nthr / 128 * 128;
    if (posix_memalign((void **)&buf, 4096, slice * (size_t)nthr)) return 1;
    double *gbs = malloc((size_t)(reps + 1) * sizeof *gbs);
    pthread_t *th = malloc((size_t)nthr * sizeof *th);
    for (int r = -1; r < reps; r++) { /* rep -1: first touch + warm-up */
        pthread_barrier_init(&bar, NULL, (unsigned)nthr + 1);
        for (int t = 0; t < nthr; t++) pthread_create(&th[t], NULL, reader, (void *)(uintptr_t)t);
        pthread_barrier_wait(&bar);
        double t0 = now_s();
        for (int t = 0; t < nthr; t++) pthread_join(th[t], NULL);
        double dt = now_s() - t0;
        pthread_barrier_destroy(&bar);
        if (r >= 0) gbs[r] = (double)slice * nthr / dt / 1e9;
    }
    qsort(gbs, (size_t)reps, sizeof *gbs, cmp);
    printf("{\"threads\":%d,\"mib\":%zu,\"reps\":%d,\"read_gb_s\":%.2f,\"best_gb_s\":%.2f}\n", nthr,
           mib, reps, gbs[reps / 2], gbs[reps - 1]);
    free(th);
    free(gbs);
    free(buf);
    return 0;
}
