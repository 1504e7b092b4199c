/* kiln_gpu_bench.c — device ceilings and the CUDA backend's kernels, timed on the GPU.
 * Prints: device-to-device copy bandwidth (bytes read + written), kiln matmul at Llama-3-8B layer
 * shapes (4096x4096, 14336x4096, 4096x14336, 1024x4096) for bf16 / q8g64 / q4g32 / q4g64 (GEMV
 * n=1 and n=4 for every GEMV kernel variant, as µs, GB/s of weight bytes (codes + scales + biases)
 * and fraction of the copy bandwidth, then the best variant; GEMM n=512 as TFLOP/s), a large bf16
 * GEMM, decode attention, prefill attention (CUDA-core vs tensor-core kernel, n = 512 / 4096;
 * `kiln_gpu_bench prefill` runs only that), the gated delta rule, recurrent and chunked kernels
 * at n = 1 / 512 / 4096 on Qwen3-Next and Qwen3.5 head shapes (`kiln_gpu_bench gdn` runs only
 * that) and the tensor-core GEMM of gemm_tc.cu against the paths it replaces at n = 1, 8, 64, 512
 * (`kiln_gpu_bench tc` runs only that).
 * Weights rotate over enough copies to exceed the 60 MB L2, so numbers are HBM numbers.
 * Built and run by bench/gpu_bench.sh against build/libkiln.so. */
#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"
#include "util/half.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static kiln_backend *be;
static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint64_t xr(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return rs;
}
static float xn(void) { /* rough normal: sum of uniforms */
    float s = 0;
    for (int i = 0; i < 4; i++) s += (float)(xr() >> 40) / (float)(1ull << 24);
    return (s - 2.0f) * 1.7f;
}
#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double copy_bw;

static double time_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms;
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

static void bench_copy(void) {
    size_t bytes = (size_t)2 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    double best = 1e30;
    for (int i = 0; i < 10; i++) {
        cudaEventRecord(e0, 0);
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
        cudaEventRecord(e1, 0);
        double ms = time_ms(e0, e1);
        if (ms < best) best = ms;
    }
    copy_bw = 2.0 * bytes / (best * 1e-3) / 1e9;
    printf("copy  D2D 2 GiB: %.3f ms  %.0f GB/s (read+write)\n", best, copy_bw);
    cudaFree(a), cudaFree(b);
}

typedef struct {
    kiln_matrix host;
    void *d, *s, *b;
} hmat;

static hmat make_host(const char *fmt, int64_t rows, int64_t cols) {
    hmat h;
    memset(&h, 0, sizeof h);
    h.host.rows = rows, h.host.cols = cols;
    if (!strcmp(fmt, "bf16")) {
        uint16_t *p = malloc((size_t)(rows * cols) * 2);
        for (int64_t i = 0; i < rows * cols; i++) p[i] = kiln_f32_to_bf16(0.02f * xn());
        h.host.dtype = KILN_DT_BF16, h.host.data = h.d = p;
    } else {
        int bits = fmt[1] - '0', group = atoi(fmt + 3);
        int64_t words = rows * cols * bits / 32, groups = rows * cols / group;
        uint32_t *q = malloc((size_t)words * 4);
        for (int64_t i = 0; i < words; i++) q[i] = (uint32_t)xr();
        uint16_t *s = malloc((size_t)groups * 2), *b = malloc((size_t)groups * 2);
        for (int64_t g = 0; g < groups; g++) {
            s[g] = kiln_f32_to_f16(0.01f),
            b[g] = kiln_f32_to_f16(-0.01f * (float)(1 << (bits - 1)));
        }
        h.host = (kiln_matrix){.dtype = KILN_DT_U32,
                               .rows = rows,
                               .cols = cols,
                               .data = q,
                               .bits = bits,
                               .group_size = group,
                               .scale_dtype = KILN_DT_F16,
                               .scales = s,
                               .biases = b};
        h.d = q, h.s = s, h.b = b;
    }
    return h;
}

/* Median time (ms) of one matmul, rotating over copies of W. */
static double time_matmul(kiln_matrix *w, int copies, int64_t n, int path, int iters) {
    float *x = be->alloc(be, (size_t)(n * w[0].cols) * 4),
          *y = be->alloc(be, (size_t)(n * w[0].rows) * 4);
    float *hx = malloc((size_t)(n * w[0].cols) * 4);
    for (int64_t i = 0; i < n * w[0].cols; i++) hx[i] = xn();
    be->upload(be, x, hx, (size_t)(n * w[0].cols) * 4);
    free(hx);
    kiln_cuda_force_matmul_path(path);
    for (int i = 0; i < copies + 2; i++) be->matmul(be, y, x, n, &w[i % copies]);
    be->synchronize(be);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    double *t = malloc(sizeof(double) * (size_t)iters);
    /* each sample: `copies` back-to-back launches (one per copy), timed together */
    for (int it = 0; it < iters; it++) {
        be->synchronize(be);
        cudaEventRecord(e0, (cudaStream_t)kiln_cuda_stream(be));
        for (int c = 0; c < copies; c++) be->matmul(be, y, x, n, &w[c]);
        cudaEventRecord(e1, (cudaStream_t)kiln_cuda_stream(be));
        t[it] = time_ms(e0, e1) / copies;
    }
    kiln_cuda_force_matmul_path(0);
    for (int i = 0; i < iters; i++)
        for (int j = i + 1; j < iters; j++)
            if (t[j] < t[i]) {
                double z = t[i];
                t[i] = t[j], t[j] = z;
            }
    double med = t[iters / 2];
    free(t);
    be->free(be, x), be->free(be, y);
    return med;
}

static bool g_gemv_only; /* bench_matmul: no n = 512 GEMM (the gemv mode) */
static void bench_matmul(const char *fmt, int64_t rows, int64_t cols) {
    hmat h = make_host(fmt, rows, cols);
    int64_t bytes = kiln_matrix_bytes(&h.host);
    int copies = (int)((int64_t)(768 << 20) / bytes) + 1;
    if (copies > 64) copies = 64;
    kiln_matrix *w = calloc((size_t)copies, sizeof *w);
    for (int c = 0; c < copies; c++)
        if (be->upload_matrix(be, &h.host, &w[c]) != KILN_OK) {
            fprintf(stderr, "upload failed\n");
            exit(1);
        }
    const int64_t ns[] = {1, 4};
    /* quantized: every GEMV kernel. k1 = 4 warps split the columns of 4 rows; k2 = a warp owns R
     * whole rows (R by shape); dp4a = qgemv.cu (4/8-bit only): rows per warp R and warps per row KS
     * by shape (0) or forced, programmatic dependent launch on (the default) or off, x's digits
     * made by pass 1 or in every block (inl: -1 the environment's / default choice, 0 pass 1, 1
     * in the blocks wherever they fit) */
    static const struct {
        const char *name;
        int variant, rows, split, pdl, mma, inl;
    } variants[] = {{"k1", 1, 0, 0, 1, 0, -1},
                    {"k2", 2, 0, 0, 1, 0, -1},
                    {"dp4a R=0 KS=0", 3, 0, 0, 1, 0, -1},
                    {"dp4a inline", 3, 0, 0, 1, 0, 1},
                    {"dp4a pass 1", 3, 0, 0, 1, 0, 0},
                    {"mma (int8 tensor cores, n = 1)", 3, 0, 0, 1, 1, -1},
                    {"dp4a R=0 KS=0 pdl=0", 3, 0, 0, 0, 0, -1},
                    {"dp4a R=1 KS=0", 3, 1, 0, 1, 0, -1},
                    {"dp4a R=2 KS=0", 3, 2, 0, 1, 0, -1},
                    {"dp4a R=4 KS=0", 3, 4, 0, 1, 0, -1},
                    {"dp4a R=0 KS=1", 3, 0, 1, 1, 0, -1},
                    {"dp4a R=0 KS=2", 3, 0, 2, 1, 0, -1},
                    {"dp4a R=0 KS=4", 3, 0, 4, 1, 0, -1},
                    {"dp4a R=0 KS=8", 3, 0, 8, 1, 0, -1}};
    /* bf16: k_gemv_dense (dense) and the row-streaming kernel with its split by shape or forced */
    static const struct {
        const char *name;
        int variant, split;
    } dense_variants[] = {{"dense", 1, 0},     {"rows KS=0", 2, 0}, {"rows KS=1", 2, 1},
                          {"rows KS=2", 2, 2}, {"rows KS=4", 2, 4}, {"rows KS=8", 2, 8}};
    const bool quant = h.host.dtype == KILN_DT_U32;
    const int nv = !quant ? (h.host.dtype == KILN_DT_BF16 ? 6 : 1)
                   : h.host.bits == 4 || h.host.bits == 8
                       ? (int)(sizeof variants / sizeof variants[0])
                       : 2;
    for (int i = 0; i < 2; i++) {
        double best = 1e30;
        int best_v = 0;
        for (int v = 0; v < nv; v++) {
            const char *name = quant ? variants[v].name : dense_variants[v].name;
            if (quant) {
                kiln_cuda_set_qgemv_variant(variants[v].variant, 0);
                kiln_cuda_set_qgemv_dp4a(variants[v].rows, variants[v].split, variants[v].pdl);
                kiln_cuda_set_qgemv_mma(variants[v].mma);
                kiln_cuda_set_qgemv_inline(variants[v].inl);
            } else {
                kiln_cuda_set_gemv_dense_variant(dense_variants[v].variant,
                                                 dense_variants[v].split);
            }
            double ms = time_matmul(w, copies, ns[i], 1, 15);
            double gbs = bytes / (ms * 1e-3) / 1e9;
            printf("gemv  %-5s %5lldx%-5lld n=%lld: %8.2f us  %6.0f GB/s  %4.0f%% of copy", fmt,
                   (long long)rows, (long long)cols, (long long)ns[i], ms * 1e3, gbs,
                   100.0 * gbs / copy_bw);
            if (nv > 1) printf("  [%s]", name);
            printf("\n");
            if (ms < best) best = ms, best_v = v;
        }
        if (nv > 1)
            printf("best  %-5s %5lldx%-5lld n=%lld: %s (%.2f us, %.0f%% of copy)\n", fmt,
                   (long long)rows, (long long)cols, (long long)ns[i],
                   quant ? variants[best_v].name : dense_variants[best_v].name, best * 1e3,
                   100.0 * bytes / (best * 1e-3) / 1e9 / copy_bw);
    }
    kiln_cuda_set_qgemv_dp4a(-1, -1, -1);
    kiln_cuda_set_qgemv_mma(-1);
    kiln_cuda_set_gemv_dense_variant(-1, 0);
    kiln_cuda_set_qgemv_variant(-1, 0);
    double ms = g_gemv_only ? 0.0 : time_matmul(w, copies < 4 ? copies : 4, 512, 2, 7);
    if (!g_gemv_only)
        printf("gemm  %-5s %5lldx%-5lld n=512: %8.1f us  %6.1f TFLOP/s\n", fmt, (long long)rows,
               (long long)cols, ms * 1e3, 2.0 * 512 * rows * cols / (ms * 1e-3) / 1e12);
    for (int c = 0; c < copies; c++) be->free_matrix(be, &w[c]);
    free(w);
    free(h.d), free(h.s), free(h.b);
}

/* Whether the space-separated integers of list hold v. */
static bool list_has_int(const char *list, int64_t v) {
    char *end = NULL;
    for (const char *p = list; *p; p = end) {
        long long x = strtoll(p, &end, 10);
        if (end == p) {
            end = (char *)p + 1;
            continue;
        }
        if (x == v) return true;
    }
    return false;
}

/* The tensor-core GEMM (gemm_tc.cu) at one shape: n = 1, 8, 64, 512 with its default block shape
 * and split ([tc]; n = 1 forced onto it), a few forced block shapes / splits, its int8 variant for
 * quantized weights in exact and fast mode ([int8], [int8 fast]; gemm_tc_int8.cuh), its one-product
 * fast mode ([tc fast]), what fast mode runs by default ([default fast]: dequantize + cuBLAS from
 * 32 tokens), and the path it replaces ([old]: KILN_CUDA_TC_GEMM=0 — GEMV / dp4a for n <= 8,
 * cuBLAS precise split above; [old fast] the same in fast mode):
 * µs, GB/s of the matrix's bytes and % of copy, and TFLOP/s (2 n rows cols) for n >= 64. */
static void bench_tc(const char *fmt, int64_t rows, int64_t cols) {
    hmat h = make_host(fmt, rows, cols);
    int64_t bytes = kiln_matrix_bytes(&h.host);
    int copies = (int)((int64_t)(768 << 20) / bytes) + 1;
    if (copies > 64) copies = 64;
    kiln_matrix *w = calloc((size_t)copies, sizeof *w);
    for (int c = 0; c < copies; c++)
        if (be->upload_matrix(be, &h.host, &w[c]) != KILN_OK) {
            fprintf(stderr, "upload failed\n");
            exit(1);
        }
    static const struct {
        const char *name;
        int mode, bn, splits, int8, fast; /* fast: --fast-math (one product / one digit) */
    } variants[] = {{"tc", 2, 0, 0, 0, 0},
                    {"tc bn=8", 2, 8, 0, 0, 0},
                    {"tc bn=16", 2, 16, 0, 0, 0},
                    {"tc bn=64", 2, 64, 0, 0, 0},
                    {"tc bn=128", 2, 128, 0, 0, 0},
                    {"tc splits=1", 2, 0, 1, 0, 0},
                    {"tc splits=2", 2, 0, 2, 0, 0},
                    {"tc splits=3", 2, 0, 3, 0, 0},
                    {"tc splits=4", 2, 0, 4, 0, 0},
                    {"tc splits=6", 2, 0, 6, 0, 0},
                    {"tc bn=16 splits=2", 2, 16, 2, 0, 0},
                    {"int8", 2, 0, 0, 1, 0},
                    {"int8 fast", 2, 0, 0, 1, 1},
                    {"tc fast", 2, 0, 0, 0, 1},
                    {"tc fast splits=1", 2, 0, 1, 0, 1},
                    {"tc fast splits=2", 2, 0, 2, 0, 1},
                    {"default fast", 1, 0, 0, 0, 1},
                    {"old fast", 0, 0, 0, 0, 1},
                    {"old", 0, 0, 0, 0, 0}};
    const bool quant = kiln_matrix_is_quantized(&h.host);
    const int64_t ns[] = {1, 8, 64, 512};
    /* env KILN_BENCH_TC_NS ("8 64") and KILN_BENCH_TC_VARIANTS (",tc,old,": names between
     * commas) keep only those: one launch to profile */
    const char *ns_env = getenv("KILN_BENCH_TC_NS"), *var_env = getenv("KILN_BENCH_TC_VARIANTS");
    for (int i = 0; i < 4; i++) {
        const int64_t n = ns[i];
        if (ns_env && *ns_env && !list_has_int(ns_env, n)) continue;
        for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
            const int bn = variants[v].bn, sp = variants[v].splits;
            char key[32];
            snprintf(key, sizeof key, ",%s,", variants[v].name);
            if (var_env && *var_env && !strstr(var_env, key)) continue;
            /* block shapes that fit n (8/16 for n <= 16, 16/64/128 above), splits at n <= 64 */
            if (bn && n <= 16 && bn > 16) continue;
            if (bn && n > 16 && bn < 16) continue;
            if (sp && n > 64) continue;
            if (variants[v].int8 && !quant) continue;
            kiln_cuda_set_tc_gemm(variants[v].mode, -1, bn, sp);
            kiln_cuda_set_tc_int8(variants[v].int8 ? 1 : 0);
            kiln_cuda_set_gemm_split(!variants[v].fast);
            const int cp = n >= 64 && copies > 8 ? 8 : copies;
            double ms = time_matmul(w, cp, n, 0, n >= 64 ? 7 : 15);
            double gbs = bytes / (ms * 1e-3) / 1e9;
            printf("tc    %-5s %5lldx%-5lld n=%-3lld: %8.2f us  %6.0f GB/s  %4.0f%% of copy", fmt,
                   (long long)rows, (long long)cols, (long long)n, ms * 1e3, gbs,
                   100.0 * gbs / copy_bw);
            if (n >= 64) printf("  %6.1f TFLOP/s", 2.0 * n * rows * cols / (ms * 1e-3) / 1e12);
            printf("  [%s]\n", variants[v].name);
        }
    }
    kiln_cuda_set_tc_gemm(-1, -1, 0, 0);
    kiln_cuda_set_tc_int8(-1);
    kiln_cuda_set_gemm_split(1);
    for (int c = 0; c < copies; c++) be->free_matrix(be, &w[c]);
    free(w);
    free(h.d), free(h.s), free(h.b);
}

/* Llama-3-8B layer shapes in every format, or the shapes of env KILN_BENCH_TC_SHAPES ("ROWSxCOLS
 * ...") in the formats of KILN_BENCH_TC_FMTS (default bf16) */
static void bench_tc_all(void) {
    const char *env = getenv("KILN_BENCH_TC_SHAPES");
    if (env && *env) {
        char fm[256], *fsave = NULL;
        snprintf(fm, sizeof fm, "%s",
                 getenv("KILN_BENCH_TC_FMTS") ? getenv("KILN_BENCH_TC_FMTS") : "bf16");
        for (char *f = strtok_r(fm, " ", &fsave); f; f = strtok_r(NULL, " ", &fsave)) {
            char *save = NULL, sh[512];
            snprintf(sh, sizeof sh, "%s", env);
            for (char *t = strtok_r(sh, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
                long long r = 0, c = 0;
                if (sscanf(t, "%lldx%lld", &r, &c) == 2 && r > 0 && c > 0) bench_tc(f, r, c);
            }
        }
        return;
    }
    const char *fmts[] = {"bf16", "q8g64", "q4g64", "q4g32"};
    const int64_t shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {1024, 4096}};
    for (int f = 0; f < 4; f++)
        for (int s = 0; s < 4; s++) bench_tc(fmts[f], shapes[s][0], shapes[s][1]);
}

/* The GEMV kernels alone: env KILN_BENCH_GEMV_FMTS (default "q4g64 q8g64") at the shapes of
 * KILN_BENCH_GEMV_SHAPES ("ROWSxCOLS ...", default Llama-3-8B's layer matrices and LM head), every
 * kernel variant, in the matmul mode of env KILN_MATMUL (exact, or fast: one int8 digit of x). */
static void bench_gemv_all(void) {
    const char *fe = getenv("KILN_BENCH_GEMV_FMTS"), *se = getenv("KILN_BENCH_GEMV_SHAPES");
    char fm[256], *fsave = NULL;
    snprintf(fm, sizeof fm, "%s", fe && *fe ? fe : "q4g64 q8g64");
    for (char *f = strtok_r(fm, " ", &fsave); f; f = strtok_r(NULL, " ", &fsave)) {
        char sh[512], *save = NULL;
        snprintf(sh, sizeof sh, "%s",
                 se && *se ? se : "4096x4096 1024x4096 14336x4096 4096x14336 128256x4096");
        for (char *t = strtok_r(sh, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
            long long r = 0, c = 0;
            if (sscanf(t, "%lldx%lld", &r, &c) == 2 && r > 0 && c > 0) bench_matmul(f, r, c);
        }
    }
}

static void bench_big_gemm(void) {
    hmat h = make_host("bf16", 8192, 8192);
    kiln_matrix w;
    be->upload_matrix(be, &h.host, &w);
    double ms = time_matmul(&w, 1, 8192, 2, 7);
    printf("gemm  bf16 8192x8192 n=8192 (incl. x->bf16): %.2f ms  %.0f TFLOP/s\n", ms,
           2.0 * 8192 * 8192 * 8192 / (ms * 1e-3) / 1e12);
    be->free_matrix(be, &w);
    free(h.d);
}

static void bench_attention(const char *kind, int ctx) {
    kiln_kv_layer_desc l = {
        .n_kv_heads = 8, .head_dim = 128, .v_head_dim = 128, .is_attention = true};
    kiln_kv_options o;
    memset(&o, 0, sizeof o);
    snprintf(o.kind, sizeof o.kind, "%s", kind);
    kiln_kv *kv;
    if (be->kv_new(be, &l, 1, &o, ctx + 1, &kv) != KILN_OK) exit(1);
    int64_t kw = 8 * 128;
    float *hk = malloc((size_t)(ctx * kw) * 4);
    for (int64_t i = 0; i < ctx * kw; i++) hk[i] = xn();
    float *dk = be->alloc(be, (size_t)(ctx * kw) * 4), *q = be->alloc(be, 32 * 128 * 4),
          *out = be->alloc(be, 32 * 128 * 4);
    be->upload(be, dk, hk, (size_t)(ctx * kw) * 4);
    be->upload(be, q, hk, 32 * 128 * 4);
    kiln_attn_params p = {.n_heads = 32, .scale = 0.088f, .softcap = 0};
    kv->vt->reserve(kv, ctx);
    kv->vt->store(kv, 0, dk, dk, ctx);
    kv->vt->commit(kv, ctx - 1);
    for (int i = 0; i < 5; i++) kv->vt->attend(kv, 0, q, 1, out, &p, NULL);
    be->synchronize(be);
    struct timespec a, b;
    int iters = 200;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < iters; i++) kv->vt->attend(kv, 0, q, 1, out, &p, NULL);
    be->synchronize(be);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double us = ((b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3) / iters;
    double kvbytes = 2.0 * ctx * kw * (strcmp(kind, "f32") ? 2 : 4);
    printf("attn  decode %s ctx=%d 32q/8kv hd128: %.1f us  %.0f GB/s of KV\n", kind, ctx, us,
           kvbytes / (us * 1e-6) / 1e9);
    kiln_kv_free(kv);
    be->free(be, dk), be->free(be, q), be->free(be, out);
    free(hk);
}

/* Prefill attention at the Llama-3-8B shape (32 query / 8 kv heads, hd 128), n tokens from
 * position 0 against an f16 / bf16 cache: the CUDA-core kernel (KILN_CUDA_FA=0) vs the tensor-core
 * ones (pipelined default, simple), as ms and TFLOP/s of causal attention (2 * 2 * n * n / 2 *
 * heads * hd). */
static void bench_prefill_attention(const char *kind, int n) {
    kiln_kv_layer_desc l = {
        .n_kv_heads = 8, .head_dim = 128, .v_head_dim = 128, .is_attention = true};
    kiln_kv_options o;
    memset(&o, 0, sizeof o);
    snprintf(o.kind, sizeof o.kind, "%s", kind);
    kiln_kv *kv;
    if (be->kv_new(be, &l, 1, &o, n, &kv) != KILN_OK) exit(1);
    int64_t kw = 8 * 128, qw = 32 * 128;
    float *h = malloc((size_t)(n * qw) * 4);
    for (int64_t i = 0; i < n * qw; i++) h[i] = xn();
    float *dk = be->alloc(be, (size_t)(n * kw) * 4), *dv = be->alloc(be, (size_t)(n * kw) * 4);
    float *q = be->alloc(be, (size_t)(n * qw) * 4), *out = be->alloc(be, (size_t)(n * qw) * 4);
    be->upload(be, q, h, (size_t)(n * qw) * 4);
    be->upload(be, dk, h + 7, (size_t)(n * kw) * 4);
    be->upload(be, dv, h + 13, (size_t)(n * kw) * 4);
    kiln_attn_params p = {.n_heads = 32, .scale = 0.088f, .softcap = 0};
    kv->vt->reserve(kv, n);
    kv->vt->store(kv, 0, dk, dv, n); /* not committed: every attend is the prefill at 0..n-1 */
    double flops = 2.0 * 2.0 * n * (double)n / 2.0 * 32 * 128;
    kiln_cuda_set_fa_f32(1); /* f32 cache: both tensor-core rows are the simple kernel */
    static const char *names[3] = {"cuda-core        ", "tensor-core      ", "tensor-core simple"};
    for (int tc = 0; tc < 3; tc++) { /* CUDA-core, tensor-core pipelined, tensor-core simple */
        kiln_cuda_set_fa_mode(tc ? 1 : 0);
        kiln_cuda_set_fa_simple(tc == 2);
        long long l0 = kiln_cuda_fa_launches();
        for (int i = 0; i < 3; i++) kv->vt->attend(kv, 0, q, n, out, &p, NULL);
        be->synchronize(be);
        int iters = n >= 4096 ? 10 : 50;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int i = 0; i < iters; i++) kv->vt->attend(kv, 0, q, n, out, &p, NULL);
        be->synchronize(be);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ms = ((b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6) / iters;
        bool ran_tc = kiln_cuda_fa_launches() > l0;
        printf("attn  prefill %s n=%d 32q/8kv hd128 %s: %.3f ms  %.1f TFLOP/s%s\n", kind, n,
               names[tc], ms, flops / (ms * 1e-3) / 1e12,
               tc && !ran_tc ? "  (tensor-core kernel NOT RUN)" : "");
    }
    kiln_cuda_set_fa_mode(-1);
    kiln_cuda_set_fa_simple(-1);
    kiln_cuda_set_fa_f32(-1);
    kiln_kv_free(kv);
    be->free(be, dk), be->free(be, dv), be->free(be, q), be->free(be, out);
    free(h);
}

/* The gated delta rule at the Qwen3-Next / Qwen3.5-4B shape (16 key / 32 value heads) and the
 * Qwen3.5-0.8B one (16 / 16), dk = dv = 128: one decode step and prefills of 512 and 4096 tokens,
 * by kernel: the recurrent ones (register-resident, column-per-thread) and the chunked WY form
 * (gdn_chunked.cu; prefill only). The chunked line gives its speed-up over the faster recurrent
 * kernel. Then decode steps of 8 and 64 sequences (one token and one state each) in one call. */
static double time_gdn(const kiln_gdn_dims *d, int n_seqs, int n, const float *q, const float *k,
                       const float *v, const float *g, const float *beta, float *const *S,
                       float *out) {
    int ns[64];
    for (int i = 0; i < n_seqs; i++) ns[i] = n;
    const int iters = n == 1 ? 500 : n <= 512 ? 20 : 5;
    for (int i = 0; i < 2; i++) be->gdn_delta(be, d, n_seqs, ns, q, k, v, g, beta, S, out);
    be->synchronize(be);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < iters; i++) be->gdn_delta(be, d, n_seqs, ns, q, k, v, g, beta, S, out);
    be->synchronize(be);
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3) / iters;
}

static void bench_gdn_delta(void) {
    static const struct {
        const char *name;
        kiln_gdn_dims d;
    } shapes[] = {{"qwen3-next/qwen3.5-4b 16k/32v", {16, 32, 128, 128}},
                  {"qwen3.5-0.8b 16k/16v", {16, 16, 128, 128}}};
    const int64_t nmax = 4096, qn = nmax * 16 * 128, vn = nmax * 32 * 128, gn = nmax * 32,
                  sn = 32 * 128 * 128;
    float *h = malloc((size_t)vn * 4);
    for (int64_t i = 0; i < vn; i++) h[i] = 0.05f * xn();
    float *q = be->alloc(be, (size_t)qn * 4), *k = be->alloc(be, (size_t)qn * 4),
          *v = be->alloc(be, (size_t)vn * 4), *g = be->alloc(be, (size_t)gn * 4),
          *beta = be->alloc(be, (size_t)gn * 4), *S = be->alloc(be, (size_t)sn * 4),
          *out = be->alloc(be, (size_t)vn * 4);
    be->upload(be, q, h, (size_t)qn * 4), be->upload(be, k, h, (size_t)qn * 4);
    be->upload(be, v, h, (size_t)vn * 4), be->upload(be, S, h, (size_t)sn * 4);
    for (int64_t i = 0; i < gn; i++) h[i] = -0.1f;
    be->upload(be, g, h, (size_t)gn * 4), be->upload(be, beta, h, (size_t)gn * 4);
    float *Sb[64]; /* the batched decode's states */
    for (int i = 0; i < 64; i++) {
        Sb[i] = be->alloc(be, (size_t)sn * 4);
        be->upload(be, Sb[i], h, (size_t)sn * 4);
    }
    for (int sh = 0; sh < 2; sh++) {
        const kiln_gdn_dims *d = &shapes[sh].d;
        const int64_t ns[3] = {1, 512, nmax};
        for (int c = 0; c < 3; c++) {
            double best_rec = 1e30;
            kiln_cuda_set_gdn_chunk(0, 0); /* the recurrent kernels */
            for (int simple = 0; simple < 2; simple++) {
                kiln_cuda_set_gdn_simple(simple);
                const double us = time_gdn(d, 1, (int)ns[c], q, k, v, g, beta, &S, out);
                if (us < best_rec) best_rec = us;
                printf("gdn_delta %s n=%lld %s: %.1f us (%.3f us/token)\n", shapes[sh].name,
                       (long long)ns[c], simple ? "simple  " : "register", us, us / (double)ns[c]);
            }
            kiln_cuda_set_gdn_simple(-1);
            if (ns[c] >= 64) {
                kiln_cuda_set_gdn_chunk(1, 0);
                const double us = time_gdn(d, 1, (int)ns[c], q, k, v, g, beta, &S, out);
                printf("gdn_delta %s n=%lld chunked : %.1f us (%.3f us/token), %.2fx the best "
                       "recurrent\n",
                       shapes[sh].name, (long long)ns[c], us, us / (double)ns[c], best_rec / us);
            }
            kiln_cuda_set_gdn_chunk(-1, 0);
        }
        for (int nb = 8; nb <= 64; nb *= 8)
            for (int simple = 0; simple < 2; simple++) {
                kiln_cuda_set_gdn_simple(simple);
                const double us = time_gdn(d, nb, 1, q, k, v, g, beta, Sb, out);
                printf("gdn_delta %s decode of %d sequences %s: %.1f us (%.3f us/sequence)\n",
                       shapes[sh].name, nb, simple ? "simple  " : "register", us, us / nb);
            }
        kiln_cuda_set_gdn_simple(-1);
    }
    for (int i = 0; i < 64; i++) be->free(be, Sb[i]);
    be->free(be, q), be->free(be, k), be->free(be, v), be->free(be, g), be->free(be, beta);
    be->free(be, S), be->free(be, out);
    free(h);
}

int main(int argc, char **argv) {
    if (kiln_backend_cuda_new(1, &be) != KILN_OK) {
        fprintf(stderr, "no CUDA backend: %s\n", kiln_last_error());
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20);
    if (argc > 1 && strcmp(argv[1], "gdn") == 0) { /* just the DeltaNet kernel */
        bench_gdn_delta();
        kiln_backend_free(be);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "tc") == 0) { /* just the tensor-core GEMM */
        bench_copy();
        bench_tc_all();
        kiln_status st = be->synchronize(be);
        if (st != KILN_OK) fprintf(stderr, "error: %s\n", kiln_last_error());
        kiln_backend_free(be);
        return st == KILN_OK ? 0 : 1;
    }
    if (argc > 1 && strcmp(argv[1], "gemv") == 0) { /* just the decode GEMV kernels */
        bench_copy();
        g_gemv_only = true;
        bench_gemv_all();
        kiln_status st = be->synchronize(be);
        if (st != KILN_OK) fprintf(stderr, "error: %s\n", kiln_last_error());
        kiln_backend_free(be);
        return st == KILN_OK ? 0 : 1;
    }
    if (argc > 1 && strcmp(argv[1], "attn") == 0) { /* just decode attention, one sequence */
        const int ctxs[] = {32, 128, 1024, 8192};
        for (int i = 0; i < 4; i++) bench_attention("f32", ctxs[i]);
        for (int i = 0; i < 4; i++) bench_attention("f16", ctxs[i]);
        kiln_status st = be->synchronize(be);
        if (st != KILN_OK) fprintf(stderr, "error: %s\n", kiln_last_error());
        kiln_backend_free(be);
        return st == KILN_OK ? 0 : 1;
    }
    if (argc > 1 && strcmp(argv[1], "prefill") == 0) { /* just prefill attention */
        bench_prefill_attention("bf16", 512);
        bench_prefill_attention("bf16", 4096);
        bench_prefill_attention("f16", 4096);
        bench_prefill_attention("f32", 4096);
        kiln_status st = be->synchronize(be);
        if (st != KILN_OK) fprintf(stderr, "error: %s\n", kiln_last_error());
        kiln_backend_free(be);
        return st == KILN_OK ? 0 : 1;
    }
    bench_copy();
    const char *fmts[] = {"bf16", "q8g64", "q4g32", "q4g64"};
    const int64_t shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {1024, 4096}};
    for (int f = 0; f < 4; f++)
        for (int s = 0; s < 4; s++) bench_matmul(fmts[f], shapes[s][0], shapes[s][1]);
    bench_tc_all();
    bench_big_gemm();
    bench_attention("f16", 8192);
    bench_attention("f32", 8192);
    bench_attention("f16", 32768);
    bench_prefill_attention("bf16", 512);
    bench_prefill_attention("bf16", 4096);
    bench_gdn_delta();
    kiln_status st = be->synchronize(be);
    if (st != KILN_OK) fprintf(stderr, "error: %s\n", kiln_last_error());
    kiln_backend_free(be);
    return st == KILN_OK ? 0 : 1;
}
