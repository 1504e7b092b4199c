/* quant_words.cuh — a lane's 32 codes of an MLX affine-quantized row (backend/matrix.h): the
 * `B` words that hold them, loaded as 16-, 8- or 4-byte pieces, and code j of them as the float
 * 1 + q*2^-B. Plain device functions with no other include, so that the CPU warp emulators
 * (tests/emu) compile them as host C++ (they supply __ldg, __funnelshift_r, __uint_as_float). */
#ifndef KILN_CUDA_QUANT_WORDS_CUH
#define KILN_CUDA_QUANT_WORDS_CUH

#include <stdint.h>

/* The B words at p (32 codes of B bits; p aligned to 16 bytes when B % 4 == 0, 8 when even). */
template <int B> __device__ __forceinline__ void load_words(const uint32_t *p, uint32_t (&wd)[B]) {
    if constexpr (B % 4 == 0) {
#pragma unroll
        for (int i = 0; i < B / 4; i++) {
            uint4 u = __ldg((const uint4 *)p + i);
            wd[4 * i] = u.x, wd[4 * i + 1] = u.y, wd[4 * i + 2] = u.z, wd[4 * i + 3] = u.w;
        }
    } else if constexpr (B % 2 == 0) {
#pragma unroll
        for (int i = 0; i < B / 2; i++) {
            uint2 u = __ldg((const uint2 *)p + i);
            wd[2 * i] = u.x, wd[2 * i + 1] = u.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < B; i++) wd[i] = __ldg(p + i);
    }
}

/* Code j of the lane's 32 as the float 1 + q*2^-B: the code lands in the top mantissa bits of 1.0f
 * (one shift and one and-or, no int->float conversion). Then sum_j q_j x_j =
 * 2^B * (sum_j f_j x_j - sum_j x_j); the products f_j*x_j round relative to |x_j|, which is
 * ~sqrt(12)*2^-23 of the signal q_j*x_j, well inside f32 accuracy of the result. */
template <int B> __device__ __forceinline__ float code_f1(const uint32_t (&wd)[B], int j) {
    const int bit = j * B, w = bit >> 5, sh = bit & 31;
    uint32_t v = sh + B <= 32 ? wd[w] >> sh : __funnelshift_r(wd[w], wd[w + 1], sh);
    return __uint_as_float(0x3F800000u | ((v & ((1u << B) - 1u)) << (23 - B)));
}

#endif
