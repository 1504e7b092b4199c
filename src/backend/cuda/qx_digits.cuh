/* qx_digits.cuh — the digits of x that the dp4a GEMV (qgemv.cu) reads: one warp turns 32
 * columns of one token into their block exponent, three signed-byte digits (one in fast mode) and
 * the sums of each 16 columns. Pass 1 (k_qx_digits), the GEMV's own blocks (QG_INL), the GEMV
 * that hands its output's digits to the next one (qg_emit) and the decode attention kernel that
 * hands its output's digits to the o projection (attention_decode.cuh) all make them here, so the
 * bits are the same whoever makes them. The emulators (tests/emu) define the device intrinsics
 * it uses before including it. */
#ifndef KILN_CUDA_QX_DIGITS_CUH
#define KILN_CUDA_QX_DIGITS_CUH

#include <stdint.h>

/* Digits of x handed from the kernel that writes x to the next GEMV (qgemv.cu qg_link; for a
 * producer that is not a GEMV, kcu_qg_link_claim): the hand-off buffer's arrays (ssq: the sums
 * of squares where a norm follows, else NULL) and the layout they are in (perm4: the 4-bit order;
 * nd: 3 digits, or 1 in fast mode). */
struct kcu_qx_emit {
    int8_t *dig;
    float *E, *sx16, *ssq;
    int perm4, nd;
};

/* One warp turns lane's v (column g*32 + lane of token t) into its block's exponent and digits:
 * E[t*ng + g], the three digits at dig (layout of k_qx_digits), sx16[t*n16 + 2g + h]. dig, E and
 * sx16 are global (pass 1) or shared memory (QG_INL). */
__device__ __forceinline__ void qx_digit_block(int8_t *dig, float *E, float *sx16, float v, int t,
                                               int g, int ng, int perm4, int lane, int nd) {
    float m = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    /* 4-bit: an 8-column run is stored as its even columns, then its odd ones */
    const int pos = perm4 ? (lane & ~7) | ((lane & 1) << 2) | ((lane & 7) >> 1) : lane;
    /* 16-column unit u = 2g + lane/16, stored at U(u) = u (8-bit) or (u & 1) * ng + u / 2 (4-bit,
     * where a lane reads units 2c and 2c+1 of its chunk c: consecutive lanes, consecutive 16 B) */
    const int h = lane >> 4, unit = perm4 ? h * ng + g : 2 * g + h, n16 = 2 * ng;
    int8_t *o = dig + ((int64_t)t * 3 * n16 + unit) * 16 + (pos & 15);
    float s = v; /* sums of lanes 0..15 and 16..31 */
#pragma unroll
    for (int k = 1; k < 16; k <<= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    if ((lane & 15) == 0) sx16[(int64_t)t * n16 + 2 * g + h] = s;
    if (nd == 1) { /* fast mode: one digit, X = rint(127 x / max|x|) (llama.cpp's Q8_1 steps) */
        const float inv = m > 0.0f ? 127.0f / m : 0.0f;
        const int X = __float2int_rn(v * inv);
        o[0] = (int8_t)(X > 127 ? 127 : X < -127 ? -127 : X);
        if (lane == 0) E[(int64_t)t * ng + g] = m > 0.0f ? m / 127.0f : 0.0f;
        return;
    }
    /* m < 2^e from m's exponent bits, clamped so 2^(22-e) and 2^(e-22) are normal floats (m == 0
     * or tiny: e = -104, every X is 0 or tiny); powers of two built from bits scale exactly */
    int e = ((__float_as_int(m) >> 23) & 0xff) - 126;
    e = e < -104 ? -104 : e > 128 ? 128 : e;
    const int X = __float2int_rn(v * __int_as_float((127 + 22 - e) << 23));
    const int d0 = ((X & 0xff) ^ 0x80) - 0x80;
    const int r1 = (X - d0) / 256;
    const int d1 = ((r1 & 0xff) ^ 0x80) - 0x80;
    const int d2 = (r1 - d1) / 256; /* |d2| <= 64 */
    o[0] = (int8_t)d0;
    o[(int64_t)n16 * 16] = (int8_t)d1;
    o[(int64_t)n16 * 32] = (int8_t)d2;
    if (lane == 0) E[(int64_t)t * ng + g] = __int_as_float((127 + e - 22) << 23);
}

#endif
