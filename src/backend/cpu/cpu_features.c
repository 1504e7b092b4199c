/* cpu_features.c — which SIMD level the CPU kernels run at: detected once from the CPU
 * (__builtin_cpu_supports), overridable by env KILN_SIMD=scalar|avx2|avx512 or by
 * kiln_cpu_simd_force (tests and benchmarks walk every level this way); and the matmul mode:
 * "exact" (default, f32 activations) or "fast" (int8 / bf16 activations where a level has such
 * kernels: AVX-512 with VNNI and BF16, AVX2 for the 4/8-bit GEMV), from env KILN_MATMUL or
 * kiln_cpu_matmul_mode_set. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops.h"

#include <cpuid.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const kiln_cpu_kernels kernels_by_level[] = {
    [KILN_SIMD_SCALAR] = {.decode = kiln_decode_scalar,
                          .prepare = kiln_gemv_prepare_scalar,
                          .gemv = kiln_gemv_scalar,
                          .dot = kiln_dot_scalar,
                          .axpy = kiln_axpy_scalar,
                          .tile_t = kiln_tile_t_scalar},
    [KILN_SIMD_AVX2] = {.decode = kiln_decode_avx2,
                        .prepare = kiln_gemv_prepare_avx2,
                        .gemv = kiln_gemv_avx2,
                        .dot = kiln_dot_avx2,
                        .axpy = kiln_axpy_avx2,
                        .tile_t = kiln_tile_t_avx2,
                        .dot_rows = kiln_dot_rows_avx2,
                        .axpy_rows = kiln_axpy_rows_avx2,
                        .f16_to_f32 = kiln_f16_to_f32_avx2,
                        .bf16_to_f32 = kiln_bf16_to_f32_avx2,
                        .exp_sum = kiln_exp_sum_avx2,
                        .silu_mul = kiln_silu_mul_avx2,
                        .pack_x = kiln_pack_x_avx2,
                        .store_tile = kiln_store_tile_avx2},
    [KILN_SIMD_AVX512] = {.decode = kiln_decode_avx512,
                          .prepare = kiln_gemv_prepare_avx512,
                          .gemv = kiln_gemv_avx512,
                          .dot = kiln_dot_avx512,
                          .axpy = kiln_axpy_avx512,
                          .tile_t = kiln_tile_t_avx512,
                          .dot_rows = kiln_dot_rows_avx512,
                          .axpy_rows = kiln_axpy_rows_avx512,
                          .f16_to_f32 = kiln_f16_to_f32_avx2, /* the AVX-512 level has AVX2 */
                          .bf16_to_f32 = kiln_bf16_to_f32_avx2,
                          .exp_sum = kiln_exp_sum_avx2,
                          .silu_mul = kiln_silu_mul_avx2,
                          .pack_x = kiln_pack_x_avx512,
                          .store_tile = kiln_store_tile_avx512},
};

/* -1 = not decided yet. */
static atomic_int active_level = -1;

static bool cpu_has_avx2(void) {
    __builtin_cpu_init();
    /* F16C via CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no "f16c" */
    unsigned eax, ebx, ecx, edx;
    bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}

static bool cpu_has_avx512(void) {
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
}

static bool cpu_has_avx512bf16(void) {
    __builtin_cpu_init();
    return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
}

/* Parses a level name; -1 if unknown or unsupported by this CPU. */
static int level_from_name(const char *name) {
    if (!strcmp(name, "scalar")) return KILN_SIMD_SCALAR;
    if (!strcmp(name, "avx2")) return cpu_has_avx2() ? KILN_SIMD_AVX2 : -1;
    if (!strcmp(name, "avx512") || !strcmp(name, "avx512-bf16"))
        return cpu_has_avx512() ? KILN_SIMD_AVX512 : -1;
    return -1;
}

static int detect_level(void) {
    const char *env = getenv("KILN_SIMD");
    if (env && *env) {
        int level = level_from_name(env);
        if (level >= 0) return level;
    }
    if (cpu_has_avx512()) return KILN_SIMD_AVX512;
    if (cpu_has_avx2()) return KILN_SIMD_AVX2;
    return KILN_SIMD_SCALAR;
}

kiln_simd_level kiln_cpu_simd_level(void) {
    int level = atomic_load_explicit(&active_level, memory_order_relaxed);
    if (level < 0) {
        level = detect_level();
        atomic_store(&active_level, level);
    }
    return (kiln_simd_level)level;
}

const kiln_cpu_kernels *kiln_cpu_kernels_active(void) {
    return &kernels_by_level[kiln_cpu_simd_level()];
}

const char *kiln_cpu_simd_name(void) {
    switch (kiln_cpu_simd_level()) {
    case KILN_SIMD_AVX512:
        return cpu_has_avx512bf16() ? "avx512-bf16" : "avx512";
    case KILN_SIMD_AVX2:
        return "avx2";
    default:
        return "scalar";
    }
}

int kiln_cpu_simd_force(const char *level) {
    if (!level) {
        atomic_store(&active_level, detect_level());
        return 0;
    }
    int parsed = level_from_name(level);
    if (parsed < 0) return -1;
    atomic_store(&active_level, parsed);
    return 0;
}

/* ---- matmul mode ---- */

/* -1 = not decided yet, 0 = exact, 1 = fast. */
static atomic_int matmul_mode = -1;

static bool cpu_has_vnni_bf16(void) { /* cached: CPUID traps (slowly) under a hypervisor */
    static atomic_int has = -1;
    int v = atomic_load_explicit(&has, memory_order_relaxed);
    if (v < 0) {
        __builtin_cpu_init();
        v = cpu_has_avx512bf16() && __builtin_cpu_supports("avx512vnni");
        atomic_store(&has, v);
    }
    return v;
}

bool kiln_cpu_has_vnni(void) {
    static atomic_int has = -1;
    int v = atomic_load_explicit(&has, memory_order_relaxed);
    if (v < 0) {
        __builtin_cpu_init();
        v = cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
        atomic_store(&has, v);
    }
    return v;
}

static int mode_from_name(const char *name) {
    if (!strcmp(name, "exact")) return 0;
    if (!strcmp(name, "fast")) return 1;
    return -1;
}

static int matmul_mode_get(void) {
    int mode = atomic_load_explicit(&matmul_mode, memory_order_relaxed);
    if (mode < 0) {
        const char *env = getenv("KILN_MATMUL");
        mode = env && *env && mode_from_name(env) == 1 ? 1 : 0;
        atomic_store(&matmul_mode, mode);
    }
    return mode;
}

int kiln_cpu_matmul_mode_set(const char *mode) {
    if (!mode) {
        atomic_store(&matmul_mode, -1);
        matmul_mode_get();
        return 0;
    }
    int parsed = mode_from_name(mode);
    if (parsed < 0) return -1;
    atomic_store(&matmul_mode, parsed);
    return 0;
}

const char *kiln_cpu_matmul_mode(void) {
    return kiln_cpu_matmul_fast_active() ? "fast" : "exact";
}

/* Fast mode runs where a level has int8 / bf16 activation kernels: AVX-512 with VNNI and BF16
 * (every 4/8-bit and bf16 matmul), AVX2 (the 4-bit and 8-bit GEMV on vpmaddubsw). */
bool kiln_cpu_matmul_fast_active(void) {
    if (matmul_mode_get() != 1) return false;
    const kiln_simd_level level = kiln_cpu_simd_level();
    return (level == KILN_SIMD_AVX512 && cpu_has_vnni_bf16()) || level == KILN_SIMD_AVX2;
}
