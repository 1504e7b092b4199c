/* gdn_emu_cpu.c — the two pieces of the CPU library that the emulators replace when they link
 * CPU sources without the rest of libkiln (gdn_emulate.cc: the DeltaNet kernels, cpu_ops.c,
 * cpu_kernels_scalar.c; paged_attention_emulate.cc: the KV codecs, which convert rows through
 * cpu_ops.c): the scalar kernel table (no run-time SIMD choice) and a serial parallel_for. */
#include "backend/cpu/cpu_internal.h"
#include "util/threadpool.h"

const kiln_cpu_kernels *kiln_cpu_kernels_active(void) {
    static const kiln_cpu_kernels scalar = {.decode = kiln_decode_scalar,
                                            .prepare = kiln_gemv_prepare_scalar,
                                            .gemv = kiln_gemv_scalar,
                                            .dot = kiln_dot_scalar,
                                            .axpy = kiln_axpy_scalar,
                                            .tile_t = kiln_tile_t_scalar};
    return &scalar;
}

void kiln_parallel_for(kiln_threadpool *pool, int64_t n, int64_t grain, kiln_range_fn fn,
                       void *ctx) {
    (void)pool, (void)grain;
    if (n > 0) fn(ctx, 0, n, 0);
}
