/* lloyd_max.c — Lloyd-Max codebooks for the unit Gaussian and bit packing. The iteration
 * alternates boundaries = midpoints of centroids and centroids = conditional means
 * E[x | a < x < b] = (pdf(a) - pdf(b)) / (cdf(b) - cdf(a)). */
#include "kv/lloyd_max.h"

#include <math.h>
#include <string.h>

static double pdf(double x) {
    return isinf(x) ? 0.0 : exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
}
static double cdf(double x) {
    return 0.5 * erfc(-x / sqrt(2.0));
}

void kiln_lloyd_max_gaussian(int bits, kiln_lloyd_max *out) {
    memset(out, 0, sizeof *out);
    if (bits < 1) bits = 1;
    if (bits > KILN_LM_MAX_BITS) bits = KILN_LM_MAX_BITS;
    int L = 1 << bits;
    double c[1 << KILN_LM_MAX_BITS], b[(1 << KILN_LM_MAX_BITS) + 1];
    for (int i = 0; i < L; i++) c[i] = -3.0 + 6.0 * (i + 0.5) / L;
    for (int it = 0; it < 2000; it++) {
        b[0] = -INFINITY;
        b[L] = INFINITY;
        for (int i = 1; i < L; i++) b[i] = 0.5 * (c[i - 1] + c[i]);
        for (int i = 0; i < L; i++)
            c[i] = (pdf(b[i]) - pdf(b[i + 1])) / (cdf(b[i + 1]) - cdf(b[i]));
    }
    for (int i = 1; i < L; i++) b[i] = 0.5 * (c[i - 1] + c[i]);
    /* distortion = E[x^2] - sum_i P_i c_i^2 (centroids are conditional means) */
    double mse = 1.0;
    for (int i = 0; i < L; i++) mse -= (cdf(b[i + 1]) - cdf(b[i])) * c[i] * c[i];
    out->bits = bits;
    out->levels = L;
    for (int i = 0; i < L; i++) out->centroid[i] = (float)c[i];
    for (int i = 0; i + 1 < L; i++) out->boundary[i] = (float)b[i + 1];
    out->mse = mse;
}

int kiln_lloyd_max_encode(const kiln_lloyd_max *q, float x) {
    int lo = 0, hi = q->levels - 1; /* first boundary >= x, by bisection */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (x > q->boundary[mid])
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void kiln_pack_bits(const uint8_t *codes, int n, int bits, uint8_t *out) {
    /* an LSB-first bit stream: code j at bits [j*bits, (j+1)*bits) */
    const uint32_t mask = (1u << bits) - 1u;
    uint32_t acc = 0;
    int have = 0;
    size_t o = 0;
    for (int j = 0; j < n; j++) {
        acc |= (codes[j] & mask) << have;
        have += bits;
        while (have >= 8) {
            out[o++] = (uint8_t)acc;
            acc >>= 8;
            have -= 8;
        }
    }
    if (have > 0) out[o] = (uint8_t)acc;
}

void kiln_unpack_bits(const uint8_t *in, int n, int bits, uint8_t *codes) {
    const int nbytes = (n * bits + 7) / 8;
    const unsigned mask = (1u << bits) - 1u;
    for (int j = 0; j < n; j++) {
        int bit = j * bits, byte = bit >> 3;
        unsigned w = in[byte];
        if (byte + 1 < nbytes) w |= (unsigned)in[byte + 1] << 8; /* a code spans at most 2 bytes */
        codes[j] = (uint8_t)((w >> (bit & 7)) & mask);
    }
}
