/* thread_blocks.h — the block runner of the emulators that run every CUDA thread of a block as a
 * std::thread (attention_emulate.cc, paged_attention_emulate.cc, gdn_emulate.cc, moe_emulate.cc):
 * __syncthreads as a block barrier, warp shuffles (float or int, by xor mask or source lane) as an
 * exchange between two barriers of the warp's 32 threads (warps may run different numbers of
 * rounds, so a block-wide barrier would not do), the warp sum / max of cuda_common.cuh, atomics
 * and fences, and emu_run, which walks a grid's blocks in order with NaN-poisoned dynamic shared
 * memory (emu_smem) followed by a guard zone checked after each block. Include after cuda_shim.h
 * and before the kernel source; the emulator counts its cases and failures in the two counters
 * here. */
#ifndef KILN_TESTS_EMU_THREAD_BLOCKS_H
#define KILN_TESTS_EMU_THREAD_BLOCKS_H

#include "cuda_shim.h"

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

enum { EMU_MAX_WARPS = 32, EMU_MAX_THREADS = EMU_MAX_WARPS * 32, EMU_GUARD = 1024 };
inline int failures = 0, cases = 0;
static float *emu_smem;                             /* the running block's dynamic shared memory */
static std::barrier<> *emu_bar;                     /* the running block's __syncthreads */
static std::barrier<> *emu_warp_bar[EMU_MAX_WARPS]; /* each warp's shuffles */
static uint32_t emu_xchg[EMU_MAX_THREADS];          /* shuffle exchange (bit patterns) */

inline void __syncthreads() {
    emu_bar->arrive_and_wait();
}
inline uint32_t emu_exchange(uint32_t v, int from_lane) {
    emu_xchg[threadIdx.x] = v;
    emu_warp_bar[t_warp]->arrive_and_wait();
    const uint32_t r = emu_xchg[t_warp * 32 + from_lane];
    emu_warp_bar[t_warp]->arrive_and_wait();
    return r;
}
inline float emu_exchange_f(float v, int from_lane) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u = emu_exchange(u, from_lane);
    memcpy(&v, &u, 4);
    return v;
}
inline float __shfl_sync(unsigned, float v, int src) {
    return emu_exchange_f(v, src);
}
inline float __shfl_xor_sync(unsigned, float v, int mask) {
    return emu_exchange_f(v, t_lane ^ mask);
}
inline int __shfl_xor_sync(unsigned, int v, int mask) {
    return (int)emu_exchange((uint32_t)v, t_lane ^ mask);
}
/* atomics and fences between the block's threads (arrival counters, bucket cursors) */
inline void __threadfence() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
}
inline unsigned atomicAdd(unsigned *p, unsigned v) {
    return std::atomic_ref<unsigned>(*p).fetch_add(v);
}
inline int atomicAdd(int *p, int v) {
    return std::atomic_ref<int>(*p).fetch_add(v);
}
inline float __ldcg(const float *p) { /* the L2-only load of split partials */
    return *p;
}
inline float kcu_warp_sum(float v) { /* cuda_common.cuh */
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
inline float kcu_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Runs fn() as the kernel of every block of grid: `threads` std::threads walk the blocks in
 * order (x fastest); thread 0 poisons the smem_bytes of shared memory with NaN before a block and
 * checks the guard zone after it (a write past the end is a failure of `name`). */
template <typename F>
static void emu_run(const char *name, emu_dim3 grid, size_t smem_bytes, const F &fn,
                    int threads = 128) {
    const size_t floats = (smem_bytes + 3) / 4;
    std::vector<float> sm(floats + EMU_GUARD + 4);
    float *base = (float *)(((uintptr_t)sm.data() + 15) & ~(uintptr_t)15);
    blockDim = {(unsigned)threads, 1, 1};
    gridDim = grid;
    emu_smem = base;
    std::barrier<> bar(threads);
    emu_bar = &bar;
    std::vector<std::unique_ptr<std::barrier<>>> wb;
    for (int w = 0; w < threads / 32; w++) {
        wb.push_back(std::make_unique<std::barrier<>>(32));
        emu_warp_bar[w] = wb.back().get();
    }
    std::vector<std::thread> th;
    for (int t = 0; t < threads; t++)
        th.emplace_back([&, t] {
            threadIdx = {(unsigned)t, 0, 0};
            t_warp = t >> 5, t_lane = t & 31;
            for (unsigned z = 0; z < grid.z; z++)
                for (unsigned y = 0; y < grid.y; y++)
                    for (unsigned x = 0; x < grid.x; x++) {
                        if (t == 0) {
                            for (size_t i = 0; i < floats; i++) base[i] = NAN;
                            for (int i = 0; i < EMU_GUARD; i++) base[floats + i] = 1234.5f;
                        }
                        bar.arrive_and_wait();
                        blockIdx = {x, y, z};
                        fn();
                        bar.arrive_and_wait();
                        if (t != 0) continue;
                        for (int i = 0; i < EMU_GUARD; i++)
                            if (base[floats + i] != 1234.5f) {
                                printf("FAIL %s block (%u, %u, %u) wrote past its shared memory\n",
                                       name, x, y, z);
                                failures++;
                                break;
                            }
                    }
        });
    for (auto &t : th) t.join();
}

#endif
