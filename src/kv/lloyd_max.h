/* lloyd_max.h — Lloyd-Max (MSE-optimal scalar) quantizer for a unit Gaussian, the distribution of
 * coordinates after a random rotation, and the LE bit packing of its codes. */
#ifndef KILN_KV_LLOYD_MAX_H
#define KILN_KV_LLOYD_MAX_H

#include <stdint.h>

#define KILN_LM_MAX_BITS 4

typedef struct kiln_lloyd_max {
    int bits;
    int levels;                                  /* 1 << bits */
    float centroid[1 << KILN_LM_MAX_BITS];       /* ascending */
    float boundary[(1 << KILN_LM_MAX_BITS) - 1]; /* midpoints between centroids */
    double mse;                                  /* expected distortion per unit variance */
} kiln_lloyd_max;

/* Codebook for N(0,1) at 1..4 bits (iterated to convergence from the Gaussian pdf/cdf). */
void kiln_lloyd_max_gaussian(int bits, kiln_lloyd_max *out);
/* Index of the nearest centroid of x. */
int kiln_lloyd_max_encode(const kiln_lloyd_max *q, float x);

/* Packs n codes of `bits` bits each into a little-endian bitstream (code j at bits j*b..j*b+b-1);
 * out holds (n*bits+7)/8 bytes. */
void kiln_pack_bits(const uint8_t *codes, int n, int bits, uint8_t *out);
void kiln_unpack_bits(const uint8_t *in, int n, int bits, uint8_t *codes);

#endif
