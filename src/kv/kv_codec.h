/* kv_codec.h — how one K or V row of one head (dim floats) is stored in a KV block: f32, f16,
 * bf16, affine-quantized per group (kv_quant.c), or TurboQuant Lloyd-Max codes of the
 * Hadamard-rotated row (kv_turbo.c). Rows are fixed-size records so a block is an array of them. */
#ifndef KILN_KV_CODEC_H
#define KILN_KV_CODEC_H

#include "kv/lloyd_max.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    KV_CODEC_F32 = 0,
    KV_CODEC_F16,
    KV_CODEC_BF16,
    KV_CODEC_AFFINE, /* per group: f16 scale + f16 bias, bits-wide codes; x = scale*q + bias */
    KV_CODEC_LLOYD,  /* per group: f16 rms, bits-wide Lloyd-Max codes; x = rms*centroid[q] */
} kv_codec_kind;

typedef struct kv_codec {
    kv_codec_kind kind;
    int bits;    /* AFFINE: 2..8, LLOYD: 1..4 */
    int group;   /* elements per scale group (divides dim) */
    bool rotate; /* rows are Hadamard-rotated before encoding; decode yields the rotated row */
    kiln_lloyd_max lm; /* LLOYD codebook */
} kv_codec;

/* Bytes of one encoded row of dim elements. */
size_t kv_codec_row_bytes(const kv_codec *c, int dim);
/* Encodes x[dim] (tmp: scratch of dim floats, used when rotating). */
void kv_codec_encode(const kv_codec *c, const float *x, int dim, uint8_t *out, float *tmp);
/* Decodes a row (in the rotated basis when c->rotate). */
void kv_codec_decode(const kv_codec *c, const uint8_t *in, int dim, float *out);
/* Bits per element including scales, for reports. */
double kv_codec_bits_per_elem(const kv_codec *c, int dim);

/* Affine / Lloyd-Max group codecs (kv_quant.c, kv_turbo.c). */
void kv_affine_encode(const float *x, int dim, int bits, int group, uint8_t *out);
void kv_affine_decode(const uint8_t *in, int dim, int bits, int group, float *out);
size_t kv_affine_row_bytes(int dim, int bits, int group);
void kv_lloyd_encode(const kiln_lloyd_max *lm, const float *x, int dim, int group, uint8_t *out);
void kv_lloyd_decode(const kiln_lloyd_max *lm, const uint8_t *in, int dim, int group, float *out);
size_t kv_lloyd_row_bytes(int dim, int bits, int group);

#endif
