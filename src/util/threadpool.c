/* threadpool.c — parallel-for over a fixed set of pthreads. Workers spin briefly on a generation
 * counter before sleeping on a condition variable, so back-to-back decode kernels do not pay a
 * futex wake each time. */
#include "util/threadpool.h"

#include "util/status.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct kiln_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_int generation; /* bumped once per parallel_for */
    atomic_int pending;    /* helpers still working on the current job */
    atomic_bool stop;
    /* current job */
    kiln_range_fn fn;
    void *ctx;
    int64_t n, grain;
};

typedef struct {
    kiln_threadpool *pool;
    int index;
} worker_arg;

static void run_slice(kiln_threadpool *p, int t) {
    int64_t chunks = (p->n + p->grain - 1) / p->grain;
    int64_t per = chunks / p->n_threads, extra = chunks % p->n_threads;
    int64_t c0 = t * per + (t < extra ? t : extra);
    int64_t c1 = c0 + per + (t < extra ? 1 : 0);
    int64_t b = c0 * p->grain, e = c1 * p->grain;
    if (e > p->n) e = p->n;
    if (b < e) p->fn(p->ctx, b, e, t);
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    kiln_threadpool *p = wa->pool;
    int t = wa->index;
    free(wa);
    int seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&p->generation, memory_order_acquire) == seen &&
               !atomic_load(&p->stop) && spins < 20000) {
            spins++;
            if ((spins & 63) == 0) sched_yield();
        }
        if (atomic_load_explicit(&p->generation, memory_order_acquire) == seen &&
            !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        run_slice(p, t);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
}

int kiln_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

kiln_status kiln_threadpool_new(int n_threads, kiln_threadpool **out) {
    *out = NULL;
    if (n_threads <= 0) n_threads = kiln_cpu_count();
    if (n_threads > 256) return kiln_error(KILN_ERR_INVALID_ARG, "threads: %d is too many", n_threads);
    kiln_threadpool *p = calloc(1, sizeof *p);
    if (!p) return kiln_error(KILN_ERR_OOM, "threadpool: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!p->threads) {
        free(p);
        return kiln_error(KILN_ERR_OOM, "threadpool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (worker_arg){.pool = p, .index = i};
        if (!wa || pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n_threads = i;
            kiln_threadpool_free(p);
            return kiln_error(KILN_ERR_INTERNAL, "threadpool: cannot start thread %d", i);
        }
    }
    *out = p;
    return KILN_OK;
}

void kiln_threadpool_free(kiln_threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    free(p->threads);
    free(p);
}

int kiln_threadpool_size(const kiln_threadpool *p) { return p ? p->n_threads : 1; }

void kiln_parallel_for(kiln_threadpool *p, int64_t n, int64_t grain, kiln_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->n_threads == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->grain = grain;
    atomic_store(&p->pending, p->n_threads - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    run_slice(p, 0);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) { /* spin: slices are short */
    }
}
