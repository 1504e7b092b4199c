/* cuda_shim.h — what the CPU warp emulators (fa_emulate.cc, tc_gemm_emulate.cc,
 * gdn_emulate.cc, qgemv_emulate.cc, attention_emulate.cc, paged_attention_emulate.cc,
 * moe_emulate.cc) share to compile a kernel source as host C++: the CUDA qualifiers as nothing,
 * the vector types the kernels use, the math API's bit casts, and the block / thread
 * coordinates (each emulated CUDA thread is a std::thread, so threadIdx / blockIdx and the warp /
 * lane are thread_local; qgemv_emulate.cc runs its threads as fibers on one OS thread and sets
 * them at every switch). The std::thread emulators take barriers, shuffles and the block runner
 * from thread_blocks.h; the others keep their own (fibers, mma and warp counts differ). */
#ifndef KILN_TESTS_EMU_CUDA_SHIM_H
#define KILN_TESTS_EMU_CUDA_SHIM_H

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__

#include <cmath>
#include <cstdint>
#include <cstring>

struct uint2 {
    unsigned x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};
static inline uint2 make_uint2(unsigned a, unsigned b) {
    return {a, b};
}
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) {
    return {a, b, c, d};
}
struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
static inline float4 make_float4(float a, float b, float c, float d) {
    return {a, b, c, d};
}
struct emu_dim3 {
    unsigned x, y, z;
};
inline thread_local emu_dim3 threadIdx, blockIdx;
inline emu_dim3 blockDim, gridDim;
inline thread_local int t_warp, t_lane;

/* the bit casts and conversions of the CUDA math API */
template <typename To, typename From> static inline To emu_bits(From v) {
    static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
    To r;
    memcpy(&r, &v, sizeof r);
    return r;
}
static inline float __uint_as_float(uint32_t u) {
    return emu_bits<float>(u);
}
static inline int __float_as_int(float f) {
    return emu_bits<int>(f);
}
static inline float __int_as_float(int i) {
    return emu_bits<float>(i);
}
static inline int __float2int_rn(float v) {
    return (int)nearbyintf(v); /* round to nearest even (the default mode) */
}

#endif
