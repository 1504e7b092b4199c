/* kv_turbo.c — the TurboQuant value codec: a row already rotated by the randomized Hadamard
 * transform has near-Gaussian coordinates, so each group is scaled by its RMS (f16) and each
 * coordinate coded with the Lloyd-Max codebook of a unit Gaussian at 1..4 bits. The attention
 * output is accumulated in the rotated basis and unrotated once (kv_paged.c). */
#include "kv/kv_codec.h"
#include "util/half.h"

#include <math.h>
#include <string.h>

size_t kv_lloyd_row_bytes(int dim, int bits, int group) {
    int ng = dim / group;
    return (size_t)ng * 2 + (size_t)(ng * ((group * bits + 7) / 8));
}

/* Record: [ng x f16 scale (the RMS, refit by least squares)] then ng packed code groups. */
void kv_lloyd_encode(const kiln_lloyd_max *lm, const float *x, int dim, int group, uint8_t *out) {
    const int ng = dim / group, gbytes = (group * lm->bits + 7) / 8;
    uint8_t codes[256];
    uint8_t *packed = out + (size_t)ng * 2;
    for (int g = 0; g < ng; g++) {
        const float *xg = x + g * group;
        double ss = 0;
        for (int i = 0; i < group; i++) ss += (double)xg[i] * xg[i];
        uint16_t r16 = kiln_f32_to_f16((float)sqrt(ss / group));
        float r = kiln_f16_to_f32(r16);
        float inv = r > 0 ? 1.0f / r : 0.0f;
        double xc = 0, cc = 0;
        for (int i = 0; i < group; i++) {
            codes[i] = (uint8_t)kiln_lloyd_max_encode(lm, xg[i] * inv);
            xc += (double)xg[i] * lm->centroid[codes[i]];
            cc += (double)lm->centroid[codes[i]] * lm->centroid[codes[i]];
        }
        /* the codes fixed, the least-squares scale sum(x c) / sum(c^2) lowers the error further */
        if (cc > 0) r16 = kiln_f32_to_f16((float)(xc / cc));
        memcpy(out + 2 * g, &r16, 2);
        kiln_pack_bits(codes, group, lm->bits, packed + g * gbytes);
    }
}

void kv_lloyd_decode(const kiln_lloyd_max *lm, const uint8_t *in, int dim, int group, float *out) {
    const int ng = dim / group, gbytes = (group * lm->bits + 7) / 8;
    const uint8_t *packed = in + (size_t)ng * 2;
    uint8_t codes[256];
    for (int g = 0; g < ng; g++) {
        uint16_t r16;
        memcpy(&r16, in + 2 * g, 2);
        float r = kiln_f16_to_f32(r16);
        float *o = out + g * group;
        if (lm->bits == 4) { /* two codes per byte, low nibble first (kiln_pack_bits' layout) */
            float tab[16];   /* r * centroid, the same products as below */
            for (int q = 0; q < 16; q++) tab[q] = r * lm->centroid[q];
            const uint8_t *c = packed + g * gbytes;
            for (int i = 0; i < group / 2; i++) {
                o[2 * i] = tab[c[i] & 15];
                o[2 * i + 1] = tab[c[i] >> 4];
            }
            continue;
        }
        kiln_unpack_bits(packed + g * gbytes, group, lm->bits, codes);
        for (int i = 0; i < group; i++) o[i] = r * lm->centroid[codes[i]];
    }
}
