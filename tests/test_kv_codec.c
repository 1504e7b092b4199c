/* test_kv_codec.c — the KV codecs on their own: the randomized Hadamard rotation is orthonormal
 * and undone by its inverse, bit packing round-trips at every width, Lloyd-Max codebooks reach
 * the known Gaussian distortion, and affine / TurboQuant rows decode within their error bounds. */
#include "kv/hadamard.h"
#include "kv/kv_codec.h"
#include "kv/lloyd_max.h"
#include "util/half.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_hadamard(void) {
    uint64_t rng = 7;
    for (int n = 1; n <= 256; n *= 2) {
        /* orthonormal: the image of the identity has orthonormal columns */
        float *m = calloc((size_t)n * n, sizeof *m);
        for (int i = 0; i < n; i++) {
            m[i * n + i] = 1.0f;
            kiln_hadamard_rotate(m + i * n, n);
        }
        double worst = 0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                double d = 0;
                for (int k = 0; k < n; k++) d += (double)m[i * n + k] * m[j * n + k];
                worst = fmax(worst, fabs(d - (i == j)));
            }
        CHECK_MSG(worst < 1e-5, "n=%d: |R R^T - I| = %g", n, worst);
        free(m);
        float x[256], y[256];
        for (int i = 0; i < n; i++) x[i] = y[i] = test_rand_normal(&rng);
        kiln_hadamard_rotate(y, n);
        if (n >= 4) {
            double diff = 0;
            for (int i = 0; i < n; i++) diff += fabs(y[i] - x[i]);
            CHECK_MSG(diff > 1e-3, "n=%d: rotation is the identity", n);
        }
        kiln_hadamard_unrotate(y, n);
        double err = 0;
        for (int i = 0; i < n; i++) err = fmax(err, fabs(y[i] - x[i]));
        CHECK_MSG(err < 1e-5, "n=%d: unrotate(rotate(x)) off by %g", n, err);
    }
    /* plain FWHT applied twice is n times the identity */
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, w[8];
    memcpy(w, v, sizeof v);
    kiln_fwht(w, 8);
    CHECK(w[0] == 36.0f && w[1] == -4.0f);
    kiln_fwht(w, 8);
    for (int i = 0; i < 8; i++) CHECK(w[i] == 8 * v[i]);
}

static void test_pack(void) {
    uint64_t rng = 3;
    for (int bits = 1; bits <= 8; bits++) {
        for (int n = 1; n <= 67; n += 11) {
            uint8_t codes[67], back[67], packed[67];
            for (int i = 0; i < n; i++)
                codes[i] = (uint8_t)(test_rand_u64(&rng) & ((1u << bits) - 1));
            kiln_pack_bits(codes, n, bits, packed);
            kiln_unpack_bits(packed, n, bits, back);
            CHECK_MSG(memcmp(codes, back, (size_t)n) == 0, "bits=%d n=%d", bits, n);
        }
    }
    /* little-endian layout: code j at bits j*b.. */
    uint8_t c[4] = {1, 2, 3, 0}, p[2];
    kiln_pack_bits(c, 4, 3, p);
    CHECK(p[0] == (1 | 2 << 3 | (3 & 3) << 6) && p[1] == (3 >> 2));
}

static void test_lloyd_max(void) {
    static const double theory[5] = {0, 0.3634, 0.1175, 0.03454, 0.009497};
    uint64_t rng = 11;
    const int N = 400000;
    float *x = malloc((size_t)N * sizeof *x);
    for (int i = 0; i < N; i++) x[i] = test_rand_normal(&rng);
    for (int bits = 1; bits <= 4; bits++) {
        kiln_lloyd_max q;
        kiln_lloyd_max_gaussian(bits, &q);
        CHECK(q.levels == 1 << bits);
        for (int i = 1; i < q.levels; i++) CHECK(q.centroid[i] > q.centroid[i - 1]);
        CHECK_MSG(fabs(q.mse - theory[bits]) < 0.01 * theory[bits], "bits=%d analytic mse %g", bits,
                  q.mse);
        double se = 0;
        for (int i = 0; i < N; i++) {
            double d = x[i] - q.centroid[kiln_lloyd_max_encode(&q, x[i])];
            se += d * d;
        }
        double mse = se / N;
        printf("lloyd-max %d bits: mse %.5f (theory %.5f)\n", bits, mse, theory[bits]);
        CHECK_MSG(fabs(mse - theory[bits]) < 0.1 * theory[bits], "bits=%d sampled mse %g", bits,
                  mse);
    }
    kiln_lloyd_max q3;
    kiln_lloyd_max_gaussian(3, &q3);
    CHECK(fabs(q3.centroid[7] - 2.1520) < 1e-3 && fabs(q3.centroid[4] - 0.2451) < 1e-3);
    free(x);
}

static double row_rel_err(const kv_codec *c, int dim, uint64_t *rng) {
    float x[256], y[256], tmp[256];
    uint8_t rec[2048];
    double num = 0, den = 0;
    for (int r = 0; r < 200; r++) {
        for (int i = 0; i < dim; i++) x[i] = test_rand_normal(rng) * (1.0f + (i % 7));
        kv_codec_encode(c, x, dim, rec, tmp);
        kv_codec_decode(c, rec, dim, y);
        if (c->rotate) kiln_hadamard_unrotate(y, dim);
        for (int i = 0; i < dim; i++) {
            num += (double)(y[i] - x[i]) * (y[i] - x[i]);
            den += (double)x[i] * x[i];
        }
    }
    return sqrt(num / den);
}

static void test_rows(void) {
    uint64_t rng = 5;
    const int dim = 128;
    kv_codec c = {.kind = KV_CODEC_F32};
    CHECK(kv_codec_row_bytes(&c, dim) == 512 && row_rel_err(&c, dim, &rng) == 0.0);
    c.kind = KV_CODEC_F16;
    CHECK(kv_codec_row_bytes(&c, dim) == 256 && row_rel_err(&c, dim, &rng) < 1e-3);
    c.kind = KV_CODEC_BF16;
    CHECK(row_rel_err(&c, dim, &rng) < 5e-3);
    c = (kv_codec){.kind = KV_CODEC_AFFINE, .bits = 8, .group = 64};
    CHECK(kv_codec_row_bytes(&c, dim) == 128 + 8);
    double e8 = row_rel_err(&c, dim, &rng);
    c.bits = 4;
    CHECK(kv_codec_row_bytes(&c, dim) == 64 + 8);
    double e4 = row_rel_err(&c, dim, &rng);
    printf("affine q8g64 rel err %.4f, q4g64 %.4f\n", e8, e4);
    CHECK(e8 < 0.01 && e4 < 0.15 && e4 > e8 * 8);
    double prev = 1.0;
    for (int bits = 2; bits <= 4; bits++) {
        c = (kv_codec){.kind = KV_CODEC_LLOYD, .bits = bits, .group = 32, .rotate = true};
        kiln_lloyd_max_gaussian(bits, &c.lm);
        CHECK(kv_codec_row_bytes(&c, dim) == (size_t)(4 * 2 + 4 * 4 * bits));
        double e = row_rel_err(&c, dim, &rng);
        /* rotated rows are near-Gaussian: relative error close to sqrt(distortion) */
        printf("turbo v%d rel err %.4f (sqrt(D) = %.4f)\n", bits, e, sqrt(c.lm.mse));
        CHECK_MSG(e < 1.25 * sqrt(c.lm.mse) && e < prev, "bits=%d err %g", bits, e);
        prev = e;
    }
}

/* Every bit width's Lloyd-Max decode (4 bits has its own nibble path) equals the record read
 * the long way: f16 scale per group times the centroid of each unpacked code. */
static void test_lloyd_decode_layout(void) {
    uint64_t rng = 29;
    for (int bits = 1; bits <= 4; bits++) {
        kiln_lloyd_max lm;
        kiln_lloyd_max_gaussian(bits, &lm);
        enum { DIM = 128, GROUP = 32, NG = DIM / GROUP };
        float x[DIM], got[DIM];
        for (int i = 0; i < DIM; i++)
            x[i] = (float)((double)(test_rand_u64(&rng) >> 11) * 0x1.0p-53 * 4.0 - 2.0);
        uint8_t rec[512];
        CHECK(kv_lloyd_row_bytes(DIM, bits, GROUP) <= sizeof rec);
        kv_lloyd_encode(&lm, x, DIM, GROUP, rec);
        kv_lloyd_decode(&lm, rec, DIM, GROUP, got);
        const int gbytes = (GROUP * bits + 7) / 8;
        bool same = true;
        for (int g = 0; g < NG; g++) {
            uint16_t r16;
            memcpy(&r16, rec + 2 * g, 2);
            uint8_t codes[GROUP];
            kiln_unpack_bits(rec + 2 * NG + g * gbytes, GROUP, bits, codes);
            for (int i = 0; i < GROUP; i++)
                same = same && got[g * GROUP + i] == kiln_f16_to_f32(r16) * lm.centroid[codes[i]];
        }
        CHECK_MSG(same, "bits=%d", bits);
    }
}

int main(void) {
    test_hadamard();
    test_lloyd_decode_layout();
    test_pack();
    test_lloyd_max();
    test_rows();
    return test_finish();
}
