/* threadpool.c — parallel-for over a fixed set of pthreads.
 *
 * A job is split into one slice per thread. Every participant (the caller and the woken workers)
 * claims slices with a compare-and-swap on the slice's flag, starting from its own index, so a
 * worker that is slow to wake (a busy machine) never holds the caller up: the caller simply runs
 * that slice itself. The caller then waits only for slices that others are executing. Workers
 * spin briefly (pause, an occasional sched_yield) on a generation counter before sleeping on a
 * condition variable, so back-to-back decode kernels rarely pay a futex wake.
 *
 * A worker that wakes late may claim a slice of the *next* job; that is safe because the caller
 * writes the job's fields before it resets the slice flags (release) and a claim is an acquire. */
#include "util/threadpool.h"

#include "util/status.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define KILN_MAX_THREADS 256

/* Waiting: a pause-spin that calls sched_yield every SPIN_YIELD_MASK + 1 turns (a yield is a
 * system call, costly under a hypervisor, and a busy waiter on an idle core gains nothing from
 * it; yielding now and then still lets a descheduled worker run on a busy machine). Workers go
 * to sleep on the condition variable after SPIN_LIMIT turns (~0.1-0.5 ms). */
#define SPIN_YIELD_MASK 255
#define SPIN_LIMIT      8192

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

struct kiln_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_int generation; /* bumped once per parallel_for */
    atomic_int done;       /* slices finished in the current job */
    atomic_bool stop;
    atomic_int claimed[KILN_MAX_THREADS]; /* slice flags of the current job */
    /* current job */
    kiln_range_fn fn;
    void *ctx;
    int64_t n, grain;
};

typedef struct {
    kiln_threadpool *pool;
    int index;
} worker_arg;

static void run_slice(kiln_threadpool *p, int slice, int thread) {
    int64_t chunks = (p->n + p->grain - 1) / p->grain;
    int64_t per = chunks / p->n_threads, extra = chunks % p->n_threads;
    int64_t c0 = slice * per + (slice < extra ? slice : extra);
    int64_t c1 = c0 + per + (slice < extra ? 1 : 0);
    int64_t b = c0 * p->grain, e = c1 * p->grain;
    if (e > p->n) e = p->n;
    if (b < e) p->fn(p->ctx, b, e, thread);
}

/* Claims and runs every slice still free, starting at `first`. */
static void claim_slices(kiln_threadpool *p, int first, int thread) {
    for (int k = 0; k < p->n_threads; k++) {
        int s = (first + k) % p->n_threads;
        int expected = 0;
        if (atomic_load_explicit(&p->claimed[s], memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong_explicit(&p->claimed[s], &expected, 1,
                                                    memory_order_acq_rel, memory_order_relaxed)) {
            run_slice(p, s, thread);
            atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel);
        }
    }
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
               !atomic_load(&p->stop) && spins < SPIN_LIMIT) {
            spins++;
            if ((spins & SPIN_YIELD_MASK) == 0)
                sched_yield();
            else
                cpu_relax();
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
        claim_slices(p, t, t);
    }
}

int kiln_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

kiln_status kiln_threadpool_new(int n_threads, kiln_threadpool **out) {
    *out = NULL;
    if (n_threads <= 0) n_threads = kiln_cpu_count();
    if (n_threads > KILN_MAX_THREADS)
        return kiln_error(KILN_ERR_INVALID_ARG, "threads: %d is too many (max %d)", n_threads,
                          KILN_MAX_THREADS);
    kiln_threadpool *p = calloc(1, sizeof *p);
    if (!p) return kiln_error(KILN_ERR_OOM, "threadpool: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    for (int i = 0; i < KILN_MAX_THREADS; i++) atomic_init(&p->claimed[i], 1);
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

int kiln_threadpool_size(const kiln_threadpool *p) {
    return p ? p->n_threads : 1;
}

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
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    for (int i = 0; i < p->n_threads; i++)
        atomic_store_explicit(&p->claimed[i], 0, memory_order_release);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    claim_slices(p, 0, 0);
    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < p->n_threads) {
        if ((++spins & SPIN_YIELD_MASK) == 0)
            sched_yield(); /* a slice is running elsewhere (or its thread is descheduled) */
        else
            cpu_relax();
    }
}
