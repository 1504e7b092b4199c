/* convert.c — owns `kiln convert`: HF folder -> mlx-community folder. Reads every tensor of the
 * source (safetensors.c), quantizes Linear/Embedding weights with MLX affine quantization
 * (mlx_quant.c) into <m>.weight/.scales/.biases, copies or casts the rest, writes one
 * model.safetensors with {"format":"mlx"}, config.json with the quantization block, and copies the
 * tokenizer and generation files.
 *
 * Choices that match the MLX reference folders in shared/fixtures (made by mlx-lm):
 *  - scales/biases are stored as f16 (whatever the source dtype);
 *  - MoE routers (`*.mlp.gate`, `*.shared_expert_gate`) are quantized at 8 bits / group 64 and
 *    recorded as per-module overrides, as mlx-lm's quantization predicate does;
 *  - tied models get no lm_head.
 * Quantization runs on all cores (rows split across a thread pool); the output is the same whatever
 * the thread count. Model-specific reshaping (stacking per-expert weights into switch_mlp,
 * Qwen3-Next's 1+w norms) is not done here: tensors keep their source names and shapes.
 */
#include "convert/convert.h"

#include "format/mlx_quant.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "util/half.h"
#include "util/status.h"
#include "util/threadpool.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void kiln_convert_options_default(kiln_convert_options *o) {
    memset(o, 0, sizeof *o);
    o->group_size = 64;
    o->dtype = KILN_DT_F16;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

bool kiln_convert_is_quantizable(const char *name, int ndim, const int64_t *shape, int group_size) {
    if (!ends_with(name, ".weight") || (ndim != 2 && ndim != 3)) return false;
    if (strstr(name, "norm") || strstr(name, "conv1d")) return false;
    return group_size > 0 && shape[ndim - 1] > 0 && shape[ndim - 1] % group_size == 0;
}

/* Routers stay at 8 bits / group 64 (mlx-lm's predicate for MoE gates). */
static bool is_router(const char *module) {
    return ends_with(module, ".mlp.gate") || ends_with(module, ".shared_expert_gate");
}

static bool is_float_dtype(kiln_dtype dt) {
    return dt == KILN_DT_F32 || dt == KILN_DT_F16 || dt == KILN_DT_BF16;
}

/* Converts n elements of a float tensor to f32. */
static void to_f32(const void *src, kiln_dtype dt, int64_t n, float *dst) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) {
        if (dt == KILN_DT_F32)
            memcpy(&dst[i], (const float *)src + i, 4);
        else if (dt == KILN_DT_BF16)
            dst[i] = kiln_bf16_to_f32(h[i]);
        else
            dst[i] = kiln_f16_to_f32(h[i]);
    }
}

/* A malloc'd copy of a float tensor cast to dt. */
static void *cast_tensor(const kiln_st_tensor *t, kiln_dtype dt) {
    float *f = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *f);
    void *out = malloc((size_t)(t->numel ? t->numel : 1) * kiln_dtype_size(dt));
    if (!f || !out) {
        free(f);
        free(out);
        return NULL;
    }
    to_f32(t->data, t->dtype, t->numel, f);
    for (int64_t i = 0; i < t->numel; i++) {
        if (dt == KILN_DT_F32)
            ((float *)out)[i] = f[i];
        else if (dt == KILN_DT_BF16)
            ((uint16_t *)out)[i] = kiln_f32_to_bf16(f[i]);
        else
            ((uint16_t *)out)[i] = kiln_f32_to_f16(f[i]);
    }
    free(f);
    return out;
}

static kiln_status copy_file_if_present(const char *src_dir, const char *dst_dir,
                                        const char *name) {
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/%s", src_dir, name);
    snprintf(dst, sizeof dst, "%s/%s", dst_dir, name);
    FILE *in = fopen(src, "rb");
    if (!in) return KILN_OK; /* optional */
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return kiln_error(KILN_ERR_IO, "%s: cannot create: %s", dst, strerror(errno));
    }
    char buf[65536];
    size_t n;
    bool ok = true;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    fclose(in);
    if (fclose(out) != 0) ok = false;
    if (!ok) return kiln_error(KILN_ERR_IO, "%s: copy to %s failed", src, dst);
    return KILN_OK;
}

/* One tensor's quantization, split by rows across the pool: rows [r0, r1) of the source are
 * converted to f32 and quantized into their own slices of words / scales / biases. */
typedef struct {
    const kiln_st_tensor *t;
    int64_t cols, words_per_row, groups;
    int bits, group;
    float *f;       /* [threads][rows_per_slice * cols] f32 scratch */
    int64_t f_rows; /* rows of scratch per thread */
    uint32_t *words;
    uint16_t *scales, *biases;
    kiln_status st[64]; /* per thread */
} quant_job;

static void quant_rows(void *ctx, int64_t r0, int64_t r1, int thread) {
    quant_job *q = ctx;
    float *f = q->f + (int64_t)thread * q->f_rows * q->cols;
    const size_t esz = kiln_dtype_size(q->t->dtype);
    for (int64_t a = r0; a < r1 && q->st[thread] == KILN_OK; a += q->f_rows) {
        int64_t nr = r1 - a < q->f_rows ? r1 - a : q->f_rows;
        to_f32((const char *)q->t->data + (size_t)(a * q->cols) * esz, q->t->dtype, nr * q->cols,
               f);
        q->st[thread] = kiln_quant_quantize(f, nr, q->cols, q->bits, q->group, KILN_DT_F16,
                                            q->words + a * q->words_per_row,
                                            q->scales + a * q->groups, q->biases + a * q->groups);
    }
}

/* Quantizes one tensor [.., rows, cols] and adds <module>.weight/.scales/.biases to w. */
static kiln_status add_quantized(kiln_st_writer *w, kiln_threadpool *pool, const kiln_st_tensor *t,
                                 const char *module, int bits, int group) {
    int64_t cols = t->shape[t->ndim - 1];
    int64_t rows = t->numel / cols;
    int64_t words_per_row = cols * bits / 32;
    int64_t groups = cols / group;
    int threads = pool ? kiln_threadpool_size(pool) : 1;
    if (threads > 64) threads = 64;
    int64_t f_rows = (1 << 16) / cols > 0 ? (1 << 16) / cols : 1; /* ~256 KB of f32 per thread */
    quant_job q = {t,    cols,   words_per_row, groups, bits, group,
                   NULL, f_rows, NULL,          NULL,   NULL, {0}};
    q.f = malloc((size_t)(threads * f_rows * cols) * sizeof *q.f);
    q.words = calloc((size_t)(rows * words_per_row), sizeof *q.words);
    q.scales = malloc((size_t)(rows * groups) * sizeof *q.scales);
    q.biases = malloc((size_t)(rows * groups) * sizeof *q.biases);
    uint32_t *words = q.words;
    uint16_t *scales = q.scales, *biases = q.biases;
    if (!q.f || !words || !scales || !biases) {
        free(q.f), free(words), free(scales), free(biases);
        return kiln_error(KILN_ERR_OOM, "tensor '%s': out of memory quantizing", t->name);
    }
    /* argument errors (bits, group, cols) are the same for every slice: check them once */
    kiln_status st = kiln_quant_quantize(NULL, 0, cols, bits, group, KILN_DT_F16, NULL, NULL, NULL);
    if (st == KILN_OK) {
        kiln_parallel_for(threads > 1 ? pool : NULL, rows, 1, quant_rows, &q);
        for (int i = 0; i < threads && st == KILN_OK; i++) st = q.st[i];
    }
    free(q.f);
    if (st != KILN_OK) {
        free(words), free(scales), free(biases);
        return kiln_error_wrap(st, "tensor '%s'", t->name);
    }
    int64_t shape[KILN_ST_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    char name[1100];
    shape[t->ndim - 1] = words_per_row;
    snprintf(name, sizeof name, "%s.weight", module);
    KILN_TRY(kiln_st_writer_add(w, name, KILN_DT_U32, t->ndim, shape, words, true));
    shape[t->ndim - 1] = groups;
    snprintf(name, sizeof name, "%s.scales", module);
    KILN_TRY(kiln_st_writer_add(w, name, KILN_DT_F16, t->ndim, shape, scales, true));
    snprintf(name, sizeof name, "%s.biases", module);
    KILN_TRY(kiln_st_writer_add(w, name, KILN_DT_F16, t->ndim, shape, biases, true));
    return KILN_OK;
}

static cJSON *quant_block(int bits, int group, const cJSON *overrides) {
    cJSON *q = cJSON_CreateObject();
    if (!q) return NULL;
    cJSON_AddNumberToObject(q, "group_size", group);
    cJSON_AddNumberToObject(q, "bits", bits);
    cJSON_AddStringToObject(q, "mode", "affine");
    for (const cJSON *o = overrides ? overrides->child : NULL; o; o = o->next)
        cJSON_AddItemToObject(q, o->string, cJSON_Duplicate(o, 1));
    return q;
}

/* Writes dst/config.json: the source file's JSON plus the quantization blocks. */
static kiln_status write_config(const kiln_convert_options *o, const cJSON *overrides) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", o->src_dir);
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_error(KILN_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (text = malloc((size_t)n + 1)) && fread(text, 1, (size_t)n, f) == (size_t)n)
        len = (size_t)n;
    fclose(f);
    cJSON *root = text && len ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    if (!root) return kiln_error(KILN_ERR_FORMAT, "%s: not valid JSON", path);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization_config");
    if (o->bits) {
        cJSON_AddItemToObject(root, "quantization", quant_block(o->bits, o->group_size, overrides));
        cJSON_AddItemToObject(root, "quantization_config",
                              quant_block(o->bits, o->group_size, overrides));
    }
    char *out = cJSON_Print(root);
    cJSON_Delete(root);
    if (!out) return kiln_error(KILN_ERR_OOM, "out of memory writing config.json");
    snprintf(path, sizeof path, "%s/config.json", o->dst_dir);
    f = fopen(path, "wb");
    if (!f) {
        free(out);
        return kiln_error(KILN_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    size_t outlen = strlen(out);
    bool ok = fwrite(out, 1, outlen, f) == outlen && fputc('\n', f) != EOF;
    if (fclose(f) != 0) ok = false;
    free(out);
    if (!ok) return kiln_error(KILN_ERR_IO, "%s: write failed", path);
    return KILN_OK;
}

static kiln_status check_options(const kiln_convert_options *o) {
    if (!o->src_dir || !o->dst_dir)
        return kiln_error(KILN_ERR_INVALID_ARG, "convert: source and output folders are required");
    if (o->bits != 0 && !kiln_quant_supported(o->bits, o->group_size))
        return kiln_error(KILN_ERR_INVALID_ARG,
                          "convert: bits %d / group size %d not supported (bits 2..8, group 32, 64 "
                          "or 128)",
                          o->bits, o->group_size);
    if (o->cast && !is_float_dtype(o->dtype))
        return kiln_error(KILN_ERR_INVALID_ARG, "convert: --dtype must be f32, f16 or bf16");
    struct stat sb;
    if (stat(o->src_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return kiln_error(KILN_ERR_NOT_FOUND, "%s: source model folder not found", o->src_dir);
    if (mkdir(o->dst_dir, 0755) != 0 && errno != EEXIST)
        return kiln_error(KILN_ERR_IO, "%s: cannot create output folder: %s", o->dst_dir,
                          strerror(errno));
    if (stat(o->dst_dir, &sb) != 0 || !S_ISDIR(sb.st_mode) || access(o->dst_dir, W_OK) != 0)
        return kiln_error(KILN_ERR_IO, "%s: output folder is not a writable directory", o->dst_dir);
    char a[4096], b[4096];
    if (realpath(o->src_dir, a) && realpath(o->dst_dir, b) && strcmp(a, b) == 0)
        return kiln_error(KILN_ERR_INVALID_ARG, "convert: output folder is the source folder");
    return KILN_OK;
}

kiln_status kiln_convert(const kiln_convert_options *o) {
    KILN_TRY(check_options(o));
    kiln_config cfg;
    KILN_TRY(kiln_config_load(o->src_dir, &cfg));
    if (cfg.quantized) {
        kiln_config_free(&cfg);
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: source model is already quantized",
                          o->src_dir);
    }
    bool tied = cfg.tie_word_embeddings;
    kiln_config_free(&cfg);

    kiln_st_archive *ar = NULL;
    KILN_TRY(kiln_st_open_dir(o->src_dir, &ar));
    kiln_st_writer *w = NULL;
    kiln_threadpool *pool = NULL; /* NULL (one thread) when no pool can be made */
    if (kiln_threadpool_new(0, &pool) != KILN_OK) pool = NULL;
    cJSON *overrides = cJSON_CreateObject();
    kiln_status st = overrides ? kiln_st_writer_new(&w) : kiln_error(KILN_ERR_OOM, "out of memory");
    int n = kiln_st_count(ar);
    for (int i = 0; i < n && st == KILN_OK; i++) {
        const kiln_st_tensor *t = kiln_st_at(ar, i);
        if (o->progress) fprintf(stderr, "kiln convert: tensor %d/%d %s\n", i + 1, n, t->name);
        if (tied && strcmp(t->name, "lm_head.weight") == 0) continue;
        int bits = o->bits, group = o->group_size;
        char module[1024];
        if (strlen(t->name) >= sizeof module) {
            st = kiln_error(KILN_ERR_UNSUPPORTED, "tensor '%.64s...': name too long", t->name);
            break;
        }
        snprintf(module, sizeof module, "%.*s",
                 (int)(strlen(t->name) - (ends_with(t->name, ".weight") ? 7 : 0)), t->name);
        if (bits && is_router(module) && !(bits == 8 && group == 64)) {
            bits = 8, group = 64;
            cJSON *ov = cJSON_CreateObject();
            cJSON_AddNumberToObject(ov, "group_size", group);
            cJSON_AddNumberToObject(ov, "bits", bits);
            cJSON_AddItemToObject(overrides, module, ov);
        }
        if (bits && is_float_dtype(t->dtype) &&
            kiln_convert_is_quantizable(t->name, t->ndim, t->shape, group)) {
            st = add_quantized(w, pool, t, module, bits, group);
        } else if (o->cast && is_float_dtype(t->dtype) && t->dtype != o->dtype) {
            void *data = cast_tensor(t, o->dtype);
            st = data ? kiln_st_writer_add(w, t->name, o->dtype, t->ndim, t->shape, data, true)
                      : kiln_error(KILN_ERR_OOM, "tensor '%s': out of memory", t->name);
        } else {
            st = kiln_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, false);
        }
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", o->dst_dir);
    if (st == KILN_OK) st = kiln_st_writer_set_metadata(w, "format", "mlx");
    if (st == KILN_OK) st = kiln_st_writer_finish(w, path);
    kiln_st_writer_free(w);
    kiln_threadpool_free(pool);
    kiln_st_close(ar);
    if (st == KILN_OK) st = write_config(o, overrides);
    cJSON_Delete(overrides);
    static const char *extra_files[] = {"tokenizer.json", "tokenizer_config.json",
                                        "generation_config.json", "chat_template.jinja",
                                        "special_tokens_map.json"};
    for (size_t i = 0; i < sizeof extra_files / sizeof extra_files[0] && st == KILN_OK; i++)
        st = copy_file_if_present(o->src_dir, o->dst_dir, extra_files[i]);
    return st;
}
