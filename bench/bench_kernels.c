/* bench_kernels.c — throughput of the CPU matmul kernels against the machine's memory bandwidth.
 * GEMV (decode, n=1): weight GB/s for bf16, q8g64, q4g64 and q4g32 at 4096x4096 and 1024x3072
 * (or, with the shape set "q06b", the Qwen3-0.6B projections and its 151936x1024 LM head), in the
 * exact matmul mode and the fast one (int8 / bf16 activations on VNNI / BF16; "=" when the CPU or
 * level lacks it); GEMM (prefill, n=128): GFLOP/s, best of 9, for 4/8-bit also the f32 panel GEMM
 * (KILN_QGEMM=f32) interleaved with it; memory read bandwidth measured with the same
 * thread pool summing a 1 GiB buffer. Medians of several runs. Build (after building
 * build-kernels):
 *   gcc -O2 -std=c17 -D_GNU_SOURCE -Iinclude -Isrc bench/bench_kernels.c build-kernels/libkiln.a \
 *       -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd -lpthread -lm -o build-kernels/bench_kernels
 * Run: build-kernels/bench_kernels [threads=2] [simd level|auto] [shape set: big|q06b|lm]
 *     [formats, e.g. "bf16 q4g64"] */
#include "backend/cpu/cpu_ops.h"
#include "util/half.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* ---- memory read bandwidth: a SIMD dot of each slice with itself (one read stream) ---- */
typedef struct {
    const float *buf;
    float sums[256];
} read_job;

static void read_slice(void *ctx, int64_t b, int64_t e, int thread) {
    read_job *job = ctx;
    job->sums[thread] += kiln_cpu_dot(job->buf + b, job->buf + b, e - b);
}

static double read_bandwidth(kiln_threadpool *pool) {
    int64_t n = (int64_t)1 << 28; /* 1 GiB of floats */
    float *buf = malloc((size_t)n * sizeof(float));
    memset(buf, 0x3f, (size_t)n * sizeof(float)); /* 0.747f: no denormals */
    read_job job = {buf, {0}};
    double gbs[7];
    for (int r = 0; r < 7; r++) {
        double t0 = now_s();
        kiln_parallel_for(pool, n, 1 << 16, read_slice, &job);
        gbs[r] = (double)n * sizeof(float) / (now_s() - t0) / 1e9;
    }
    if (job.sums[0] == 42.0f) printf(" ");
    free(buf);
    return median(gbs, 7);
}

/* ---- matrices ---- */
static kiln_matrix make(int64_t rows, int64_t cols, int bits, int group) {
    kiln_matrix m = {.rows = rows, .cols = cols};
    uint64_t state = 88172645463325252ull;
    if (bits == 0) {
        m.dtype = KILN_DT_BF16;
        uint16_t *w = malloc((size_t)(rows * cols) * 2);
        for (int64_t i = 0; i < rows * cols; i++) {
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            w[i] = kiln_f32_to_bf16((float)((int64_t)(state % 2001) - 1000) * 1e-4f);
        }
        m.data = w;
        return m;
    }
    m.dtype = KILN_DT_U32, m.bits = bits, m.group_size = group, m.scale_dtype = KILN_DT_F16;
    int64_t bytes = rows * cols * bits / 8, groups = rows * cols / group;
    uint8_t *codes = malloc((size_t)bytes);
    for (int64_t i = 0; i < bytes; i++) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        codes[i] = (uint8_t)state;
    }
    uint16_t *s = malloc((size_t)groups * 2), *b = malloc((size_t)groups * 2);
    for (int64_t g = 0; g < groups; g++)
        s[g] = kiln_f32_to_f16(0.01f), b[g] = kiln_f32_to_f16(-0.08f);
    m.data = codes, m.scales = s, m.biases = b;
    return m;
}

static void bench_matrix(kiln_threadpool *pool, const char *name, int64_t rows, int64_t cols,
                         int bits, int group, double mem_gbs, bool gemm_too) {
    kiln_matrix w = make(rows, cols, bits, group);
    int64_t n_gemm = 128;
    float *x = malloc(sizeof(float) * (size_t)(n_gemm * cols));
    float *y = malloc(sizeof(float) * (size_t)(n_gemm * rows));
    for (int64_t i = 0; i < n_gemm * cols; i++) x[i] = (float)(i % 17) * 0.01f;
    double bytes = (double)kiln_matrix_bytes(&w);
    /* GEMV: repeat enough times per sample that a sample lasts ~20 ms */
    int reps = (int)(2e7 / bytes * 30) + 1;
    double gemv[9], gemv_fast[9];
    for (int r = 0; r < 9; r++) { /* exact and fast interleaved: same machine load for both */
        kiln_cpu_matmul_mode_set("exact");
        double t0 = now_s();
        for (int k = 0; k < reps; k++) kiln_cpu_matmul(pool, y, x, 1, &w);
        gemv[r] = bytes * reps / (now_s() - t0) / 1e9;
        kiln_cpu_matmul_mode_set("fast");
        t0 = now_s();
        for (int k = 0; k < reps; k++) kiln_cpu_matmul(pool, y, x, 1, &w);
        gemv_fast[r] = bytes * reps / (now_s() - t0) / 1e9;
    }
    bool fast = !strcmp(kiln_cpu_matmul_mode(), "fast");
    kiln_cpu_matmul_mode_set("exact");
    /* GEMM: the default path and (4/8-bit) the f32 panel GEMM it replaces on VNNI
     * (KILN_QGEMM=f32), interleaved; best of 9 each (the machine is shared: the best run is the
     * one least disturbed) */
    double gemm[9] = {0}, gemm_f32[9] = {0};
    bool ab = bits == 4 || bits == 8;
    for (int r = 0; r < (gemm_too ? 9 : 0); r++) {
        for (int m = 0; m < (ab ? 2 : 1); m++) {
            setenv("KILN_QGEMM", m ? "f32" : "auto", 1);
            double t0 = now_s();
            kiln_cpu_matmul(pool, y, x, n_gemm, &w);
            (m ? gemm_f32 : gemm)[r] = 2.0 * (double)n_gemm * rows * cols / (now_s() - t0) / 1e9;
        }
    }
    unsetenv("KILN_QGEMM");
    double gemm_best = 0.0, gemm_f32_best = 0.0;
    for (int r = 0; r < 9; r++) {
        if (gemm[r] > gemm_best) gemm_best = gemm[r];
        if (gemm_f32[r] > gemm_f32_best) gemm_f32_best = gemm_f32[r];
    }
    char f32_col[48] = "";
    if (ab && gemm_too) snprintf(f32_col, sizeof f32_col, " (f32 GEMM %6.1f)", gemm_f32_best);
    double g = median(gemv, 9), gf = median(gemv_fast, 9);
    char fast_col[32] = "     =";
    if (fast) snprintf(fast_col, sizeof fast_col, "%6.1f", gf);
    printf("%-6s %5lldx%-5lld  %7.1f MB  GEMV n=1 exact %6.1f GB/s (%3.0f%% of read bw, %6.2f ms)"
           "  fast %s GB/s  GEMM n=128 %6.1f GFLOP/s%s\n",
           name, (long long)rows, (long long)cols, bytes / 1e6, g, 100.0 * g / mem_gbs,
           bytes / g / 1e6, fast_col, gemm_best, f32_col);
    free((void *)w.data), free((void *)w.scales), free((void *)w.biases), free(x), free(y);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (argc > 2 && strcmp(argv[2], "auto") && kiln_cpu_simd_force(argv[2]) != 0) {
        fprintf(stderr, "SIMD level %s not available\n", argv[2]);
        return 1;
    }
    kiln_threadpool *pool = NULL;
    if (kiln_threadpool_new(threads, &pool) != KILN_OK) return 1;
    double bw = read_bandwidth(pool);
    printf("simd %s, %d threads, memory read bandwidth %.1f GB/s\n", kiln_cpu_simd_name(), threads,
           bw);
    static const int64_t big[][2] = {{4096, 4096}, {1024, 3072}, {0, 0}};
    static const int64_t q06b[][2] = {
        {1024, 1024}, {3072, 1024}, {1024, 3072}, {151936, 1024}, {0, 0}};
    const int64_t(*shapes)[2] = big;
    if (argc > 3 && !strcmp(argv[3], "q06b")) shapes = q06b;
    if (argc > 3 && !strcmp(argv[3], "lm")) shapes = q06b + 3; /* the LM head alone */
    for (int s = 0; shapes[s][0]; s++) {
        bool gemm = shapes[s][0] < 100000; /* prefill never runs the LM head on every row */
        static const struct {
            const char *name;
            int bits, group;
        } fmts[] = {
            {"bf16", 0, 0}, {"q8g64", 8, 64}, {"q8g32", 8, 32}, {"q4g64", 4, 64}, {"q4g32", 4, 32}};
        for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++)
            if (argc > 4 ? strstr(argv[4], fmts[f].name) != NULL : strcmp(fmts[f].name, "q8g32"))
                bench_matrix(pool, fmts[f].name, shapes[s][0], shapes[s][1], fmts[f].bits,
                             fmts[f].group, bw, gemm);
    }
    kiln_threadpool_free(pool);
    return 0;
}
