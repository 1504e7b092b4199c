/* threadpool.h — a persistent pool of worker threads running parallel-for loops.
 * The calling thread takes part as worker 0, so a pool of n threads starts n-1 helpers. */
#ifndef KILN_UTIL_THREADPOOL_H
#define KILN_UTIL_THREADPOOL_H

#include "kiln.h"

typedef struct kiln_threadpool kiln_threadpool;

/* Runs one slice [begin, end) of the n items; thread is 0..n_threads-1. */
typedef void (*kiln_range_fn)(void *ctx, int64_t begin, int64_t end, int thread);

kiln_status kiln_threadpool_new(int n_threads, kiln_threadpool **out); /* n_threads<=0: all cores */
void kiln_threadpool_free(kiln_threadpool *pool);
int kiln_threadpool_size(const kiln_threadpool *pool);

/* Splits [0, n) into contiguous slices (each a multiple of grain, except the last) across the
 * threads and waits for all. pool may be NULL (runs inline). Not re-entrant. */
void kiln_parallel_for(kiln_threadpool *pool, int64_t n, int64_t grain, kiln_range_fn fn,
                       void *ctx);

int kiln_cpu_count(void);

#endif
