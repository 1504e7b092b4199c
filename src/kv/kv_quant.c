/* kv_quant.c — plain and affine-quantized KV rows: f32, f16, bf16 and per-group affine codes
 * (group along head_dim, f16 scale and bias per group, 2..8-bit codes packed little-endian), plus
 * the row codec dispatch shared by every paged cache kind. */
#include "backend/cpu/cpu_ops.h"
#include "kv/hadamard.h"
#include "kv/kv_codec.h"
#include "util/half.h"

#include <math.h>
#include <string.h>

size_t kv_affine_row_bytes(int dim, int bits, int group) {
    int ng = dim / group;
    return (size_t)ng * 4 + (size_t)(ng * ((group * bits + 7) / 8));
}

/* Record: [ng x (f16 scale, f16 bias)] then ng packed code groups. */
void kv_affine_encode(const float *x, int dim, int bits, int group, uint8_t *out) {
    const int ng = dim / group, gbytes = (group * bits + 7) / 8;
    const float qmax = (float)((1 << bits) - 1);
    uint8_t codes[256];
    uint16_t *sb = (uint16_t *)(void *)out;
    uint8_t *packed = out + (size_t)ng * 4;
    for (int g = 0; g < ng; g++) {
        const float *xg = x + g * group;
        float lo = xg[0], hi = xg[0];
        for (int i = 1; i < group; i++) {
            lo = xg[i] < lo ? xg[i] : lo;
            hi = xg[i] > hi ? xg[i] : hi;
        }
        uint16_t s16 = kiln_f32_to_f16((hi - lo) / qmax), b16 = kiln_f32_to_f16(lo);
        float s = kiln_f16_to_f32(s16), b = kiln_f16_to_f32(b16);
        float inv = s > 0 ? 1.0f / s : 0.0f;
        for (int i = 0; i < group; i++) {
            float q = nearbyintf((xg[i] - b) * inv);
            codes[i] = (uint8_t)(q < 0 ? 0 : q > qmax ? qmax : q);
        }
        memcpy(sb + 2 * g, &s16, 2);
        memcpy(sb + 2 * g + 1, &b16, 2);
        if (bits == 8)
            memcpy(packed + g * gbytes, codes, (size_t)group);
        else
            kiln_pack_bits(codes, group, bits, packed + g * gbytes);
    }
}

void kv_affine_decode(const uint8_t *in, int dim, int bits, int group, float *out) {
    const int ng = dim / group, gbytes = (group * bits + 7) / 8;
    const uint8_t *packed = in + (size_t)ng * 4;
    uint8_t codes[256];
    for (int g = 0; g < ng; g++) {
        uint16_t s16, b16;
        memcpy(&s16, in + 4 * g, 2);
        memcpy(&b16, in + 4 * g + 2, 2);
        float s = kiln_f16_to_f32(s16), b = kiln_f16_to_f32(b16);
        const uint8_t *c = packed + g * gbytes;
        if (bits == 4) {
            for (int i = 0; i < group / 2; i++) {
                out[g * group + 2 * i] = s * (float)(c[i] & 15) + b;
                out[g * group + 2 * i + 1] = s * (float)(c[i] >> 4) + b;
            }
            continue;
        }
        if (bits != 8) {
            kiln_unpack_bits(c, group, bits, codes);
            c = codes;
        }
        for (int i = 0; i < group; i++) out[g * group + i] = s * (float)c[i] + b;
    }
}

size_t kv_codec_row_bytes(const kv_codec *c, int dim) {
    switch (c->kind) {
    case KV_CODEC_F32:
        return (size_t)dim * 4;
    case KV_CODEC_F16:
    case KV_CODEC_BF16:
        return (size_t)dim * 2;
    case KV_CODEC_AFFINE:
        return kv_affine_row_bytes(dim, c->bits, c->group);
    case KV_CODEC_LLOYD:
        return kv_lloyd_row_bytes(dim, c->bits, c->group);
    }
    return 0;
}

double kv_codec_bits_per_elem(const kv_codec *c, int dim) {
    return 8.0 * (double)kv_codec_row_bytes(c, dim) / dim;
}

void kv_codec_encode(const kv_codec *c, const float *x, int dim, uint8_t *out, float *tmp) {
    if (c->rotate) {
        memcpy(tmp, x, (size_t)dim * sizeof(float));
        kiln_hadamard_rotate(tmp, dim);
        x = tmp;
    }
    switch (c->kind) {
    case KV_CODEC_F32:
        memcpy(out, x, (size_t)dim * 4);
        break;
    case KV_CODEC_F16:
        for (int i = 0; i < dim; i++) {
            uint16_t h = kiln_f32_to_f16(x[i]);
            memcpy(out + 2 * i, &h, 2);
        }
        break;
    case KV_CODEC_BF16:
        for (int i = 0; i < dim; i++) {
            uint16_t h = kiln_f32_to_bf16(x[i]);
            memcpy(out + 2 * i, &h, 2);
        }
        break;
    case KV_CODEC_AFFINE:
        kv_affine_encode(x, dim, c->bits, c->group, out);
        break;
    case KV_CODEC_LLOYD:
        kv_lloyd_encode(&c->lm, x, dim, c->group, out);
        break;
    }
}

void kv_codec_decode(const kv_codec *c, const uint8_t *in, int dim, float *out) {
    switch (c->kind) {
    case KV_CODEC_F32:
        memcpy(out, in, (size_t)dim * 4);
        break;
    case KV_CODEC_F16: /* records are 2-byte aligned (offsets are multiples of their size) */
        kiln_cpu_f16_to_f32((const uint16_t *)(const void *)in, dim, out);
        break;
    case KV_CODEC_BF16:
        kiln_cpu_bf16_to_f32((const uint16_t *)(const void *)in, dim, out);
        break;
    case KV_CODEC_AFFINE:
        kv_affine_decode(in, dim, c->bits, c->group, out);
        break;
    case KV_CODEC_LLOYD:
        kv_lloyd_decode(&c->lm, in, dim, c->group, out);
        break;
    }
}
