/* ref_matmul.c — kiln_cpu_matmul_ref over row slices in threads (ref_matmul.h). The reference is
 * scalar (a dequantized weight and a double product per element): 1024 x 4096 at 130 tokens takes
 * about a second on one core, and test_cuda_ops' tensor-core groups run hundreds of such cases. */
#include "ref_matmul.h"

#include "backend/cpu/cpu_ops.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REF_THREADS_MAX 32

typedef struct {
    float *y; /* [n, rows] of the whole matrix */
    const float *x;
    int64_t n;
    const kiln_matrix *w;
    int64_t r0, r1; /* this job's rows */
    int ok;
} ref_job;

static void *ref_rows(void *arg) {
    ref_job *j = arg;
    const int64_t nr = j->r1 - j->r0;
    const kiln_matrix v = kiln_matrix_rows(j->w, j->r0, nr);
    float *t = malloc((size_t)(j->n * nr) * sizeof(float)); /* [n, nr] */
    if (!t) return NULL;
    kiln_cpu_matmul_ref(t, j->x, j->n, &v);
    for (int64_t i = 0; i < j->n; i++)
        memcpy(j->y + i * j->w->rows + j->r0, t + i * nr, (size_t)nr * sizeof(float));
    free(t);
    j->ok = 1;
    return NULL;
}

void ref_matmul(float *y, const float *x, int64_t n, const kiln_matrix *w) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cores < 1 ? 1 : cores > REF_THREADS_MAX ? REF_THREADS_MAX : (int)cores;
    if ((double)n * (double)w->rows * (double)w->cols < 4e6) threads = 1; /* not worth a thread */
    if (threads > w->rows) threads = (int)w->rows;
    if (threads <= 1) {
        kiln_cpu_matmul_ref(y, x, n, w);
        return;
    }
    pthread_t th[REF_THREADS_MAX];
    ref_job jobs[REF_THREADS_MAX];
    int started[REF_THREADS_MAX] = {0};
    for (int k = 0; k < threads; k++) {
        jobs[k] = (ref_job){y, x, n, w, w->rows * k / threads, w->rows * (k + 1) / threads, 0};
        started[k] = pthread_create(&th[k], NULL, ref_rows, &jobs[k]) == 0;
        if (!started[k]) ref_rows(&jobs[k]); /* no thread: this one does it */
    }
    for (int k = 0; k < threads; k++)
        if (started[k]) pthread_join(th[k], NULL);
    for (int k = 0; k < threads; k++)
        if (!jobs[k].ok) { /* a slice without memory: the whole matrix in one call */
            kiln_cpu_matmul_ref(y, x, n, w);
            return;
        }
}
