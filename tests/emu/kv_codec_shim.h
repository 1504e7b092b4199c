/* kv_codec_shim.h — what an emulator needs to compile src/backend/cuda/kv_codec.cuh (the device KV
 * record codecs and the paged layer geometry) as host C++: the explicitly rounded CUDA intrinsics
 * as plain float / double operations (the emulators build without FMA contraction), the 16-bit
 * conversions through util/half.h. Include after cuda_shim.h. Used by paged_attention_emulate.cc
 * and fa_emulate.cc. */
#ifndef KILN_TESTS_EMU_KV_CODEC_SHIM_H
#define KILN_TESTS_EMU_KV_CODEC_SHIM_H

#include <cmath>
#include <cstring>

extern "C" {
#include "util/half.h"
}

#define KCU_HOST_EMU         1
#define __fadd_rn(a, b)      ((float)(a) + (float)(b))
#define __fsub_rn(a, b)      ((float)(a) - (float)(b))
#define __fmul_rn(a, b)      ((float)(a) * (float)(b))
#define __fdiv_rn(a, b)      ((float)(a) / (float)(b))
#define __frcp_rn(a)         (1.0f / (float)(a))
#define __fsqrt_rn(a)        sqrtf(a)
#define __dadd_rn(a, b)      ((double)(a) + (double)(b))
#define __dmul_rn(a, b)      ((double)(a) * (double)(b))
#define __ddiv_rn(a, b)      ((double)(a) / (double)(b))
#define __dsqrt_rn(a)        sqrt(a)
#define __double2float_rn(a) ((float)(a))
#define __float2half_rn(x)   kiln_f32_to_f16(x)
#define __half_as_ushort(h)  (h)
static inline float kcu_f16(uint16_t h) {
    return kiln_f16_to_f32(h);
}
static inline float kcu_bf16(uint16_t h) {
    return kiln_bf16_to_f32(h);
}

#include "backend/cuda/kv_codec.cuh"

#endif
