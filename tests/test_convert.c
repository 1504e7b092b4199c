/* test_convert.c — `kiln convert` on the qwen3 fixture: layout, shapes and dtypes of the output,
 * dequantized weights within the quantization error bound, bit-parity with the MLX-made
 * qwen3-mlx-q4g32 / q8g64 folders, config blocks, CLI error paths. */
#include "convert/convert.h"
#include "format/mlx_quant.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "util/half.h"

#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float load_f(const kiln_st_tensor *t, int64_t i) {
    const uint16_t *h = t->data;
    if (t->dtype == KILN_DT_F32) return ((const float *)t->data)[i];
    return t->dtype == KILN_DT_BF16 ? kiln_bf16_to_f32(h[i]) : kiln_f16_to_f32(h[i]);
}

/* Converts qwen3 at (bits, group) and checks layout and error bound; then compares codes, scales
 * and biases with the MLX reference folder. */
static void check_conversion(int bits, int group, const char *reference) {
    char out[600];
    snprintf(out, sizeof out, "%s/qwen3-q%dg%d", test_tmpdir(), bits, group);
    kiln_convert_options o;
    kiln_convert_options_default(&o);
    o.src_dir = test_shared("fixtures/qwen3");
    o.dst_dir = out;
    o.bits = bits;
    o.group_size = group;
    CHECK_OK(kiln_convert(&o));

    kiln_st_archive *src = NULL, *dst = NULL, *ref = NULL;
    CHECK_OK(kiln_st_open_dir(test_shared("fixtures/qwen3"), &src));
    CHECK_OK(kiln_st_open_dir(out, &dst));
    CHECK_OK(kiln_st_open_dir(test_shared(reference), &ref));
    if (!src || !dst || !ref) goto done;
    /* same tensor names and shapes as the MLX-made folder (82 tensors: 23 quantized modules) */
    CHECK_MSG(kiln_st_count(dst) == kiln_st_count(ref), "%d vs %d", kiln_st_count(dst),
              kiln_st_count(ref));
    for (int i = 0; i < kiln_st_count(ref); i++) {
        const kiln_st_tensor *r = kiln_st_at(ref, i), *d = kiln_st_find(dst, r->name);
        CHECK_MSG(d && d->dtype == r->dtype && d->ndim == r->ndim &&
                      memcmp(d->shape, r->shape, sizeof(int64_t) * (size_t)r->ndim) == 0,
                  "%s", r->name);
    }
    const void *md = kiln_st_metadata(dst);
    CHECK(md != NULL);

    long long codes_total = 0, codes_equal = 0, sb_total = 0, sb_equal = 0;
    int n_quantized = 0;
    double worst_excess = 0;
    for (int i = 0; i < kiln_st_count(src); i++) {
        const kiln_st_tensor *w = kiln_st_at(src, i);
        char module[512], name[600];
        snprintf(module, sizeof module, "%.*s", (int)strlen(w->name) - 7, w->name);
        snprintf(name, sizeof name, "%s.scales", module);
        const kiln_st_tensor *sc = kiln_st_find(dst, name);
        bool quantizable = kiln_convert_is_quantizable(w->name, w->ndim, w->shape, group);
        CHECK_MSG((sc != NULL) == quantizable, "%s", w->name);
        if (!sc) {
            /* copied unchanged */
            const kiln_st_tensor *d = kiln_st_find(dst, w->name);
            CHECK(d && d->nbytes == w->nbytes && memcmp(d->data, w->data, w->nbytes) == 0);
            continue;
        }
        n_quantized++;
        snprintf(name, sizeof name, "%s.biases", module);
        const kiln_st_tensor *bi = kiln_st_find(dst, name);
        const kiln_st_tensor *q = kiln_st_find(dst, w->name);
        CHECK(q && bi && q->dtype == KILN_DT_U32 && sc->dtype == KILN_DT_F16);
        if (!q || !bi) continue;
        int64_t rows = w->shape[0], cols = w->shape[1];
        kiln_matrix m = {.dtype = KILN_DT_U32,
                         .rows = rows,
                         .cols = cols,
                         .data = q->data,
                         .bits = bits,
                         .group_size = group,
                         .scale_dtype = KILN_DT_F16,
                         .scales = sc->data,
                         .biases = bi->data};
        float *deq = malloc((size_t)(rows * cols) * sizeof *deq);
        kiln_quant_dequantize_rows(&m, 0, rows, deq);
        /* |w - w^| <= scale/2 per group, plus f16 rounding of scale and bias (scale*q with q up
         * to 2^bits-1 carries the scale's relative error 2^-11; the bias its own) */
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < cols; c++) {
                int64_t g = r * (cols / group) + c / group;
                float scale = fabsf(kiln_f16_to_f32(((const uint16_t *)sc->data)[g]));
                float bias = fabsf(kiln_f16_to_f32(((const uint16_t *)bi->data)[g]));
                float bound = scale / 2 + scale * (float)((1 << bits) - 1) * 0x1p-11f +
                              bias * 0x1p-11f + 1e-6f;
                double err = fabs(load_f(w, r * cols + c) - deq[r * cols + c]);
                if (err - bound > worst_excess) worst_excess = err - bound;
            }
        }
        free(deq);
        /* parity with the MLX folder */
        const kiln_st_tensor *rq = kiln_st_find(ref, w->name), *rs = kiln_st_find(ref, sc->name),
                             *rb = kiln_st_find(ref, bi->name);
        if (!rq || !rs || !rb || rq->nbytes != q->nbytes || rs->nbytes != sc->nbytes) continue;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                const uint32_t *a = (const uint32_t *)q->data + r * (cols * bits / 32);
                const uint32_t *b = (const uint32_t *)rq->data + r * (cols * bits / 32);
                codes_equal += kiln_quant_get_code(a, c, bits) == kiln_quant_get_code(b, c, bits);
                codes_total++;
            }
        for (size_t k = 0; k < sc->nbytes / 2; k++) {
            sb_equal += ((const uint16_t *)sc->data)[k] == ((const uint16_t *)rs->data)[k];
            sb_equal += ((const uint16_t *)bi->data)[k] == ((const uint16_t *)rb->data)[k];
            sb_total += 2;
        }
    }
    CHECK(n_quantized == 23); /* 7 per layer x 3 + embed_tokens + lm_head */
    CHECK_MSG(worst_excess <= 0, "dequantization error exceeds the bound by %g", worst_excess);
    fprintf(stderr, "q%dg%d vs %s: codes %lld/%lld equal (%.4f%%), scales+biases %lld/%lld equal\n",
            bits, group, reference, codes_equal, codes_total,
            100.0 * (double)codes_equal / (double)codes_total, sb_equal, sb_total);
    CHECK(codes_total > 0 && codes_equal == codes_total);
    CHECK(sb_total > 0 && sb_equal == sb_total);

    /* config.json: the source's keys plus both quantization blocks, loadable */
    kiln_config c;
    CHECK_OK(kiln_config_load(out, &c));
    CHECK(c.quantized && c.quant_bits == bits && c.quant_group_size == group &&
          c.vocab_size == 512);
    CHECK(c.json && cJSON_IsObject(cJSON_GetObjectItem(c.json, "quantization_config")));
    kiln_config_free(&c);
    char path[700];
    snprintf(path, sizeof path, "%s/generation_config.json", out);
    size_t len;
    char *gen = test_read_file(path, &len);
    CHECK(gen != NULL);
    free(gen);
done:
    kiln_st_close(src);
    kiln_st_close(dst);
    kiln_st_close(ref);
}

static void test_cast_and_tied(void) {
    char out[600];
    snprintf(out, sizeof out, "%s/llama-tied-f32", test_tmpdir());
    kiln_convert_options o;
    kiln_convert_options_default(&o);
    o.src_dir = test_shared("fixtures/llama-tied");
    o.dst_dir = out;
    o.cast = true;
    o.dtype = KILN_DT_F32;
    CHECK_OK(kiln_convert(&o));
    kiln_st_archive *src = NULL, *dst = NULL;
    CHECK_OK(kiln_st_open_dir(o.src_dir, &src));
    CHECK_OK(kiln_st_open_dir(out, &dst));
    if (src && dst) {
        CHECK(kiln_st_count(dst) == kiln_st_count(src)); /* no lm_head in source or output */
        CHECK(kiln_st_find(dst, "lm_head.weight") == NULL);
        int exact = 0;
        for (int i = 0; i < kiln_st_count(src); i++) {
            const kiln_st_tensor *s = kiln_st_at(src, i), *d = kiln_st_find(dst, s->name);
            bool ok = d && d->dtype == KILN_DT_F32 && d->numel == s->numel;
            for (int64_t k = 0; ok && k < s->numel; k++) ok = load_f(s, k) == load_f(d, k);
            exact += ok;
        }
        CHECK(exact == kiln_st_count(src)); /* bf16 -> f32 is exact */
    }
    kiln_st_close(src);
    kiln_st_close(dst);
    kiln_config c;
    CHECK_OK(kiln_config_load(out, &c));
    CHECK(!c.quantized && c.tie_word_embeddings);
    kiln_config_free(&c);
}

static void test_errors(void) {
    kiln_convert_options o;
    kiln_convert_options_default(&o);
    char out[600];
    snprintf(out, sizeof out, "%s/err", test_tmpdir());
    o.src_dir = test_shared("fixtures/qwen3");
    o.dst_dir = out;
    o.bits = 9;
    CHECK_ERR(kiln_convert(&o), KILN_ERR_INVALID_ARG, "bits 9");
    o.bits = 4;
    o.group_size = 48;
    CHECK_ERR(kiln_convert(&o), KILN_ERR_INVALID_ARG, "group size 48");
    o.group_size = 64;
    o.src_dir = "/nonexistent/src";
    CHECK_ERR(kiln_convert(&o), KILN_ERR_NOT_FOUND, "/nonexistent/src");
    o.src_dir = test_shared("fixtures/qwen3");
    o.dst_dir = "/proc/kiln-cannot-write-here";
    CHECK_ERR(kiln_convert(&o), KILN_ERR_IO, "/proc/kiln-cannot-write-here");
    o.src_dir = test_shared("fixtures/qwen3-mlx-q4g32");
    o.dst_dir = out;
    CHECK_ERR(kiln_convert(&o), KILN_ERR_UNSUPPORTED, "already quantized");

    /* the CLI: --help, bad options, and a real run */
    char cmd[2048];
    int status = 0;
    snprintf(cmd, sizeof cmd, "%s convert --help", test_bin());
    char *text = test_run(cmd, &status);
    CHECK(status == 0 && text && strstr(text, "--bits"));
    free(text);
    snprintf(cmd, sizeof cmd, "%s convert --model %s --out %s --bits 1 2>&1", test_bin(),
             test_shared("fixtures/qwen3"), out);
    text = test_run(cmd, &status);
    CHECK(status != 0 && text && strstr(text, "--bits"));
    free(text);
    snprintf(cmd, sizeof cmd, "%s convert --model %s --out %s --group 48 2>&1", test_bin(),
             test_shared("fixtures/qwen3"), out);
    text = test_run(cmd, &status);
    CHECK(status != 0 && text && strstr(text, "--group"));
    free(text);
    snprintf(cmd, sizeof cmd, "%s convert --model %s --out %s/cli --bits 8 --group 64 2>&1",
             test_bin(), test_shared("fixtures/qwen3"), test_tmpdir());
    text = test_run(cmd, &status);
    CHECK(status == 0 && text && strstr(text, "tensor 36/36"));
    free(text);
    snprintf(cmd, sizeof cmd, "%s/cli", test_tmpdir());
    kiln_st_archive *ar = NULL;
    CHECK_OK(kiln_st_open_dir(cmd, &ar));
    CHECK(ar && kiln_st_find(ar, "model.layers.2.mlp.down_proj.scales") != NULL);
    kiln_st_close(ar);
}

int main(void) {
    check_conversion(4, 32, "fixtures/qwen3-mlx-q4g32");
    check_conversion(8, 64, "fixtures/qwen3-mlx-q8g64");
    test_cast_and_tied();
    test_errors();
    return test_finish();
}
