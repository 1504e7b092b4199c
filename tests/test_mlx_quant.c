/* test_mlx_quant.c — MLX affine quantization: the bit-stream packing of every width against an
 * independent bit-by-bit packer (and MLX's own per-width byte layouts), quantize error bounds and
 * edge cases, dequantize, and bit-exact reproduction of mlx-lm's quantized fixtures from the
 * dense bf16 weights of the same model. */
#include "format/mlx_quant.h"
#include "format/safetensors.h"
#include "test_util.h"
#include "util/half.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const int all_bits[] = {2, 3, 4, 5, 6, 8};
static const int all_groups[] = {32, 64, 128};

/* Packs codes one bit at a time: bit t of code j goes to stream bit j*bits+t. */
static void pack_bitwise(const uint32_t *codes, int64_t n, int bits, uint8_t *bytes) {
    memset(bytes, 0, (size_t)(n * bits / 8));
    for (int64_t j = 0; j < n; j++)
        for (int t = 0; t < bits; t++)
            if ((codes[j] >> t) & 1u) {
                int64_t bit = j * bits + t;
                bytes[bit >> 3] |= (uint8_t)(1u << (bit & 7));
            }
}

static void test_pack_roundtrip(void) {
    uint64_t rng = 7;
    for (int bits = 2; bits <= 8; bits++) {
        int64_t n = 256;
        uint32_t codes[256];
        uint32_t words[64] = {0};
        uint8_t expect[256];
        for (int64_t j = 0; j < n; j++) codes[j] = (uint32_t)(test_rand_u64(&rng) % (1u << bits));
        for (int64_t j = 0; j < n; j++) kiln_quant_set_code(words, j, bits, codes[j]);
        pack_bitwise(codes, n, bits, expect);
        CHECK_MSG(memcmp(words, expect, (size_t)(n * bits / 8)) == 0, "bits %d packing", bits);
        int bad = 0;
        for (int64_t j = 0; j < n; j++) bad += kiln_quant_get_code(words, j, bits) != codes[j];
        CHECK_MSG(bad == 0, "bits %d: %d codes differ after round trip", bits, bad);
    }
    /* MLX's documented layouts: 4-bit code j of a word at bits 4j; 3-bit: 8 codes in 3 bytes with
     * code 2 split as bits 6-7 of byte 0 and bit 0 of byte 1; 6-bit: code 1 = byte0>>6 | (byte1 &
     * 0xf) << 2; 5-bit code 3 = byte1>>7 | (byte2 & 0xf) << 1. */
    uint32_t w4[1] = {0x76543210u};
    for (int j = 0; j < 8; j++) CHECK(kiln_quant_get_code(w4, j, 4) == (uint32_t)j);
    uint8_t b[8] = {0xC5, 0x2B, 0x9E, 0x71, 0x00, 0, 0, 0};
    uint32_t wb[2];
    memcpy(wb, b, 8);
    CHECK(kiln_quant_get_code(wb, 2, 3) == (uint32_t)(((b[0] & 0xc0) >> 6) + ((b[1] & 0x1) << 2)));
    CHECK(kiln_quant_get_code(wb, 5, 3) == (uint32_t)(((b[1] & 0x80) >> 7) + ((b[2] & 0x3) << 1)));
    CHECK(kiln_quant_get_code(wb, 1, 6) == (uint32_t)(((b[0] >> 6) & 3) + ((b[1] & 0xf) << 2)));
    CHECK(kiln_quant_get_code(wb, 3, 6) == (uint32_t)((b[2] >> 2) & 0x3f));
    CHECK(kiln_quant_get_code(wb, 3, 5) == (uint32_t)(((b[1] & 0x80) >> 7) + ((b[2] & 0xf) << 1)));
    CHECK(kiln_quant_get_code(wb, 4, 5) == (uint32_t)(((b[2] & 0xf0) >> 4) + ((b[3] & 0x1) << 4)));
}

static kiln_matrix quant_matrix(int64_t rows, int64_t cols, int bits, int group, kiln_dtype sdt,
                                uint32_t *words, void *scales, void *biases) {
    kiln_matrix m = {.dtype = KILN_DT_U32,
                     .rows = rows,
                     .cols = cols,
                     .data = words,
                     .bits = bits,
                     .group_size = group,
                     .scale_dtype = sdt,
                     .scales = scales,
                     .biases = biases};
    return m;
}

static void test_quantize_error_bound(void) {
    uint64_t rng = 11;
    const kiln_dtype sdts[] = {KILN_DT_F16, KILN_DT_BF16, KILN_DT_F32};
    for (size_t bi = 0; bi < sizeof all_bits / sizeof *all_bits; bi++) {
        for (size_t gi = 0; gi < 3; gi++) {
            int bits = all_bits[bi], group = all_groups[gi];
            int64_t rows = 5, cols = group * 3;
            kiln_dtype sdt = sdts[(bi + gi) % 3];
            float *w = malloc(sizeof(float) * rows * cols),
                  *deq = malloc(sizeof(float) * rows * cols);
            uint32_t *words = calloc((size_t)(rows * cols * bits / 32), 4);
            float *scales = calloc((size_t)(rows * cols / group), 4),
                  *biases = calloc((size_t)(rows * cols / group), 4);
            for (int64_t i = 0; i < rows * cols; i++)
                w[i] = 0.05f * test_rand_normal(&rng) + (i % 7 == 0 ? 0.02f : 0.0f);
            CHECK_OK(kiln_quant_quantize(w, rows, cols, bits, group, sdt, words, scales, biases));
            kiln_matrix m = quant_matrix(rows, cols, bits, group, sdt, words, scales, biases);
            kiln_quant_dequantize_rows(&m, 0, rows, deq);
            int bad = 0;
            for (int64_t r = 0; r < rows; r++) {
                for (int64_t g = 0; g < cols / group; g++) {
                    float lo = INFINITY, hi = -INFINITY;
                    for (int j = 0; j < group; j++) {
                        lo = fminf(lo, w[r * cols + g * group + j]);
                        hi = fmaxf(hi, w[r * cols + g * group + j]);
                    }
                    /* half a step, plus the rounding of scale and bias to 16 bits (bf16: 2^-8
                     * relative over up to 2^bits-1 steps) */
                    float step = (hi - lo) / (float)((1 << bits) - 1);
                    float tol = 0.5f * step +
                                (sdt == KILN_DT_F32
                                     ? 1e-6f
                                     : 3.0f * (hi - lo + fmaxf(fabsf(lo), fabsf(hi))) / 256.0f);
                    for (int j = 0; j < group; j++) {
                        int64_t i = r * cols + g * group + j;
                        bad += fabsf(deq[i] - w[i]) > tol;
                    }
                }
            }
            CHECK_MSG(bad == 0, "bits %d group %d: %d values outside the error bound", bits, group,
                      bad);
            if (sdt == KILN_DT_F32) {
                double err = test_rel_l2(deq, w, (size_t)(rows * cols));
                /* uniform rounding error ~ step/sqrt(12); step ~ 6 sigma / (2^bits - 1) */
                CHECK_MSG(err < 2.0 / ((1 << bits) - 1), "bits %d: rel err %g", bits, err);
            }
            free(w), free(deq), free(words), free(scales), free(biases);
        }
    }
}

static void test_quantize_edges(void) {
    /* A constant group, an all-zero group and a ramp whose ends are min and max. */
    float w[96];
    for (int j = 0; j < 32; j++) w[j] = 0.375f;
    for (int j = 0; j < 32; j++) w[32 + j] = 0.0f;
    for (int j = 0; j < 32; j++) w[64 + j] = -1.0f + (float)j * 0.5f / 31.0f;
    uint32_t words[12] = {0};
    float scales[3], biases[3], deq[96];
    CHECK_OK(kiln_quant_quantize(w, 1, 96, 4, 32, KILN_DT_F32, words, scales, biases));
    kiln_matrix m = quant_matrix(1, 96, 4, 32, KILN_DT_F32, words, scales, biases);
    kiln_quant_dequantize_rows(&m, 0, 1, deq);
    for (int j = 0; j < 64; j++) CHECK(deq[j] == w[j]); /* constant groups are exact */
    CHECK(biases[0] == 0.375f && biases[1] == 0.0f && scales[0] == 1.0f && scales[1] == 1.0f);
    CHECK(biases[2] == -1.0f && scales[2] == 0.5f / 15.0f); /* bias = min, scale = range/15 */
    CHECK(kiln_quant_get_code(words, 64, 4) == 0 && kiln_quant_get_code(words, 95, 4) == 15);
    CHECK(deq[64] == -1.0f && fabsf(deq[95] - (-0.5f)) < 1e-6f);
    /* Codes use the stored (rounded) scale: with bf16 scales, every code must be the nearest
     * level of the stored scale/bias. */
    uint64_t rng = 5;
    float v[64];
    uint16_t s16[1], b16[1];
    for (int j = 0; j < 64; j++) v[j] = test_rand_normal(&rng);
    CHECK_OK(kiln_quant_quantize(v, 1, 64, 3, 64, KILN_DT_BF16, words, s16, b16));
    float s = kiln_bf16_to_f32(s16[0]), b = kiln_bf16_to_f32(b16[0]);
    int worse = 0;
    for (int j = 0; j < 64; j++) {
        float q = (float)kiln_quant_get_code(words, j, 3);
        for (int alt = 0; alt < 8; alt++)
            worse += fabsf(s * (float)alt + b - v[j]) < fabsf(s * q + b - v[j]) - 1e-6f;
    }
    CHECK_MSG(worse == 0, "%d codes are not the nearest level", worse);
    CHECK_ERR(kiln_quant_quantize(v, 1, 32, 4, 48, KILN_DT_F16, words, s16, b16),
              KILN_ERR_UNSUPPORTED, "group");
    CHECK_ERR(kiln_quant_quantize(v, 1, 40, 4, 32, KILN_DT_F16, words, s16, b16),
              KILN_ERR_INVALID_ARG, "multiple");
    CHECK(!kiln_quant_supported(1, 32) && !kiln_quant_supported(4, 16) &&
          kiln_quant_supported(3, 128));
}

/* Quantizes every U32 tensor's dense bf16 source and compares codes, scales and biases. */
static void check_fixture(const char *dense_dir, const char *quant_dir, int bits, int group) {
    kiln_st_archive *dense = NULL, *quant = NULL;
    CHECK_OK(kiln_st_open_dir(test_shared(dense_dir), &dense));
    CHECK_OK(kiln_st_open_dir(test_shared(quant_dir), &quant));
    if (!dense || !quant) return;
    int64_t codes_total = 0, codes_same = 0, groups_total = 0, scales_same = 0, biases_same = 0;
    int tensors = 0;
    for (int t = 0; t < kiln_st_count(quant); t++) {
        const kiln_st_tensor *qt = kiln_st_at(quant, t);
        size_t len = strlen(qt->name);
        if (qt->dtype != KILN_DT_U32 || len < 7 || strcmp(qt->name + len - 7, ".weight")) continue;
        char base[256];
        snprintf(base, sizeof base, "%.*s", (int)(len - 7), qt->name);
        char sname[300], bname[300];
        snprintf(sname, sizeof sname, "%s.scales", base);
        snprintf(bname, sizeof bname, "%s.biases", base);
        const kiln_st_tensor *st = kiln_st_find(quant, sname), *bt = kiln_st_find(quant, bname);
        const kiln_st_tensor *dt = kiln_st_find(dense, qt->name);
        CHECK_MSG(st && bt && dt, "%s: scales/biases/dense missing", qt->name);
        if (!st || !bt || !dt || dt->dtype != KILN_DT_BF16 || dt->ndim != 2) continue;
        int64_t rows = dt->shape[0], cols = dt->shape[1];
        int tb = bits, tg = group;
        if ((int64_t)(qt->shape[1] * 32) != cols * tb) { /* per-module override (8-bit routers) */
            tb = 8, tg = 64;
        }
        CHECK(qt->shape[0] == rows && qt->shape[1] * 32 == cols * tb);
        float *w = malloc(sizeof(float) * rows * cols);
        /* mlx-lm converts the bf16 checkpoint to f16 before quantizing (hence f16 scales) */
        for (int64_t i = 0; i < rows * cols; i++)
            w[i] =
                kiln_f16_to_f32(kiln_f32_to_f16(kiln_bf16_to_f32(((const uint16_t *)dt->data)[i])));
        int64_t nwords = rows * cols * tb / 32, ngroups = rows * cols / tg;
        uint32_t *words = malloc((size_t)nwords * 4);
        uint16_t *scales = malloc((size_t)ngroups * 2), *biases = malloc((size_t)ngroups * 2);
        CHECK_OK(kiln_quant_quantize(w, rows, cols, tb, tg, KILN_DT_F16, words, scales, biases));
        for (int64_t i = 0; i < rows * cols; i++)
            codes_same += kiln_quant_get_code(words, i, tb) == kiln_quant_get_code(qt->data, i, tb);
        codes_total += rows * cols;
        for (int64_t g = 0; g < ngroups; g++) {
            scales_same += scales[g] == ((const uint16_t *)st->data)[g];
            biases_same += biases[g] == ((const uint16_t *)bt->data)[g];
        }
        groups_total += ngroups;
        tensors++;
        free(w), free(words), free(scales), free(biases);
    }
    printf("%s: %d tensors, codes %lld/%lld equal (%.6f), scales %lld/%lld, biases %lld/%lld\n",
           quant_dir, tensors, (long long)codes_same, (long long)codes_total,
           (double)codes_same / (double)(codes_total ? codes_total : 1), (long long)scales_same,
           (long long)groups_total, (long long)biases_same, (long long)groups_total);
    CHECK(tensors > 0);
    CHECK_MSG(codes_same == codes_total, "codes differ from mlx");
    CHECK_MSG(scales_same == groups_total && biases_same == groups_total,
              "scales/biases differ from mlx");
    kiln_st_close(dense);
    kiln_st_close(quant);
}

int main(void) {
    test_pack_roundtrip();
    test_quantize_error_bound();
    test_quantize_edges();
    check_fixture("fixtures/qwen3", "fixtures/qwen3-mlx-q4g32", 4, 32);
    check_fixture("fixtures/qwen3", "fixtures/qwen3-mlx-q8g64", 8, 64);
    return test_finish();
}
