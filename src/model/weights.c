/* weights.c — turning named safetensors tensors into kiln_matrix weights and f32 vectors, with
 * every shape and quantization parameter checked against the config. Quantized modules are
 * recognised by the presence of "<module>.scales"; bits and group come from the config
 * (per-module overrides included) and must agree with the stored shapes. */
#include "model/model.h"

#include "util/half.h"
#include "util/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool kiln_weights_has(const kiln_model *m, const char *name) {
    return kiln_st_find(m->archive, name) != NULL;
}

kiln_status kiln_weights_embed_head(kiln_model *m, int64_t vocab, int64_t hidden,
                                    kiln_matrix *embed, kiln_matrix *lm_head, bool *tied,
                                    float **final_norm) {
    KILN_TRY(kiln_weights_matrix(m, "model.embed_tokens", vocab, hidden, false, embed));
    *tied = m->cfg.tie_word_embeddings || !kiln_weights_has(m, "lm_head.weight");
    if (*tied)
        *lm_head = *embed;
    else
        KILN_TRY(kiln_weights_matrix(m, "lm_head", vocab, hidden, false, lm_head));
    return kiln_weights_vector(m, "model.norm.weight", hidden, false, final_norm);
}

static const kiln_st_tensor *find_tensor(const kiln_model *m, const char *name) {
    const kiln_st_tensor *t = kiln_st_find(m->archive, name);
    if (!t) kiln_error(KILN_ERR_NOT_FOUND, "%s: tensor '%s' is missing", m->dir, name);
    return t;
}

static const char *tensor_file(const kiln_model *m, const kiln_st_tensor *t) {
    const char *p = kiln_st_file_path(m->archive, t->file_index);
    const char *slash = p ? strrchr(p, '/') : NULL;
    return slash ? slash + 1 : (p ? p : "?");
}

static kiln_status shape_error(const kiln_model *m, const kiln_st_tensor *t, const char *want) {
    char got[128] = "";
    size_t off = 0;
    for (int i = 0; i < t->ndim && off < sizeof got - 24; i++)
        off += (size_t)snprintf(got + off, sizeof got - off, "%s%lld", i ? ", " : "",
                                (long long)t->shape[i]);
    return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s' (%s) has shape [%s], expected %s",
                      tensor_file(m, t), t->name, kiln_dtype_name(t->dtype), got, want);
}

/* Converts a 1-D tensor of any float dtype to f32 (host, malloc'd). */
static kiln_status vector_to_f32(const kiln_model *m, const kiln_st_tensor *t, int64_t n,
                                 bool add_one, float **out) {
    if (t->ndim != 1 || t->shape[0] != n) {
        char want[64];
        snprintf(want, sizeof want, "[%lld]", (long long)n);
        return shape_error(m, t, want);
    }
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return kiln_error(KILN_ERR_OOM, "out of memory for '%s'", t->name);
    for (int64_t i = 0; i < n; i++) {
        float x;
        switch (t->dtype) {
        case KILN_DT_F32:
            memcpy(&x, (const char *)t->data + 4 * i, 4);
            break;
        case KILN_DT_F16:
            x = kiln_f16_to_f32(((const uint16_t *)t->data)[i]);
            break;
        case KILN_DT_BF16:
            x = kiln_bf16_to_f32(((const uint16_t *)t->data)[i]);
            break;
        default:
            free(v);
            return kiln_error(KILN_ERR_FORMAT,
                              "%s: tensor '%s' has dtype %s, expected a float type",
                              tensor_file(m, t), t->name, kiln_dtype_name(t->dtype));
        }
        v[i] = add_one ? 1.0f + x : x;
    }
    *out = v;
    return KILN_OK;
}

kiln_status kiln_weights_vector(kiln_model *m, const char *name, int64_t n, bool add_one,
                                float **out) {
    const kiln_st_tensor *t = find_tensor(m, name);
    if (!t) return KILN_ERR_NOT_FOUND;
    float *host;
    KILN_TRY(vector_to_f32(m, t, n, add_one, &host));
    float *dev = m->be->alloc(m->be, (size_t)n * sizeof(float));
    if (!dev) {
        free(host);
        return kiln_error(KILN_ERR_OOM, "out of backend memory for '%s'", name);
    }
    m->be->upload(m->be, dev, host, (size_t)n * sizeof(float));
    free(host);
    *out = dev;
    return KILN_OK;
}

void kiln_weights_free_vector(kiln_model *m, float *v) {
    if (v) m->be->free(m->be, v);
}

void kiln_weights_free_matrix(kiln_model *m, kiln_matrix *w) {
    if (w && w->data && !w->view) m->be->free_matrix(m->be, w);
    if (w) memset(w, 0, sizeof *w);
}

static bool is_scale_dtype(kiln_dtype d) {
    return d == KILN_DT_F16 || d == KILN_DT_BF16 || d == KILN_DT_F32;
}

/* The host matrix of `module` as the file stores it, checked against [rows, cols]; *bias_host:
 * its f32 output bias (malloc'ed; the caller frees it after the upload) or NULL. */
static kiln_status weights_host_matrix(kiln_model *m, const char *module, int64_t rows,
                                       int64_t cols, bool want_bias, kiln_matrix *out,
                                       float **bias_host_out) {
    char name[512];
    memset(out, 0, sizeof *out);
    *bias_host_out = NULL;
    snprintf(name, sizeof name, "%s.weight", module);
    const kiln_st_tensor *w = find_tensor(m, name);
    if (!w) return KILN_ERR_NOT_FOUND;
    snprintf(name, sizeof name, "%s.scales", module);
    const kiln_st_tensor *scales = kiln_st_find(m->archive, name);
    kiln_matrix host = {0};
    host.rows = rows;
    host.cols = cols;
    char want[128];
    if (scales) {
        snprintf(name, sizeof name, "%s.biases", module);
        const kiln_st_tensor *biases = find_tensor(m, name);
        if (!biases) return KILN_ERR_NOT_FOUND;
        int bits = 0, group = 0;
        if (!kiln_config_module_quant(&m->cfg, module, &bits, &group)) {
            /* stored quantized although the config says otherwise: infer from shapes */
            bits = m->cfg.quant_bits;
            group = m->cfg.quant_group_size;
        }
        if (bits <= 0 || group <= 0) {
            /* No quantization block: infer group from scales and bits from packed width. */
            if (scales->ndim == 2 && scales->shape[1] > 0) group = (int)(cols / scales->shape[1]);
            if (w->ndim == 2 && cols > 0) bits = (int)(w->shape[1] * 32 / cols);
        }
        if (w->dtype != KILN_DT_U32)
            return kiln_error(KILN_ERR_FORMAT,
                              "%s: tensor '%s.weight' is quantized (has .scales) "
                              "but has dtype %s, expected U32",
                              tensor_file(m, w), module, kiln_dtype_name(w->dtype));
        if (bits < 2 || bits > 8 || (group != 32 && group != 64 && group != 128))
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: module '%s': %d-bit group %d quantization "
                              "is not supported (bits 2..8, group 32/64/128)",
                              m->dir, module, bits, group);
        if (cols % group || (cols * bits) % 32)
            return kiln_error(KILN_ERR_FORMAT,
                              "module '%s': in-features %lld not divisible by "
                              "group %d",
                              module, (long long)cols, group);
        snprintf(want, sizeof want, "[%lld, %lld] (U32, %d-bit)", (long long)rows,
                 (long long)(cols * bits / 32), bits);
        if (w->ndim != 2 || w->shape[0] != rows || w->shape[1] != cols * bits / 32)
            return shape_error(m, w, want);
        snprintf(want, sizeof want, "[%lld, %lld] (group %d)", (long long)rows,
                 (long long)(cols / group), group);
        if (scales->ndim != 2 || scales->shape[0] != rows || scales->shape[1] != cols / group)
            return shape_error(m, scales, want);
        if (biases->ndim != 2 || biases->shape[0] != rows || biases->shape[1] != cols / group)
            return shape_error(m, biases, want);
        if (!is_scale_dtype(scales->dtype) || biases->dtype != scales->dtype)
            return kiln_error(KILN_ERR_FORMAT,
                              "%s: module '%s': scales/biases dtypes %s/%s (want "
                              "matching F16, BF16 or F32)",
                              tensor_file(m, scales), module, kiln_dtype_name(scales->dtype),
                              kiln_dtype_name(biases->dtype));
        host.dtype = KILN_DT_U32;
        host.bits = bits;
        host.group_size = group;
        host.scale_dtype = scales->dtype;
        host.data = w->data;
        host.scales = scales->data;
        host.biases = biases->data;
    } else {
        if (w->dtype != KILN_DT_F32 && w->dtype != KILN_DT_F16 && w->dtype != KILN_DT_BF16)
            return kiln_error(KILN_ERR_FORMAT,
                              "%s: tensor '%s.weight' has dtype %s (want F32, F16, "
                              "BF16, or U32 with .scales/.biases)",
                              tensor_file(m, w), module, kiln_dtype_name(w->dtype));
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)cols);
        if (w->ndim != 2 || w->shape[0] != rows || w->shape[1] != cols)
            return shape_error(m, w, want);
        host.dtype = w->dtype;
        host.data = w->data;
    }
    float *bias_host = NULL;
    if (want_bias) {
        snprintf(name, sizeof name, "%s.bias", module);
        const kiln_st_tensor *b = kiln_st_find(m->archive, name);
        if (b) {
            KILN_TRY(vector_to_f32(m, b, rows, false, &bias_host));
            host.bias = bias_host;
        }
    }
    *out = host;
    *bias_host_out = bias_host;
    return KILN_OK;
}

kiln_status kiln_weights_matrix(kiln_model *m, const char *module, int64_t rows, int64_t cols,
                                bool want_bias, kiln_matrix *out) {
    kiln_matrix host;
    float *bias_host = NULL;
    memset(out, 0, sizeof *out);
    KILN_TRY(weights_host_matrix(m, module, rows, cols, want_bias, &host, &bias_host));
    kiln_status st = m->be->upload_matrix(m->be, &host, out);
    free(bias_host);
    return st;
}

/* same stored format: dtype, width, quantization, scale dtype, output bias or not */
static bool same_format(const kiln_matrix *a, const kiln_matrix *b) {
    return a->dtype == b->dtype && a->cols == b->cols && a->bits == b->bits &&
           a->group_size == b->group_size && a->scale_dtype == b->scale_dtype &&
           (a->bias != NULL) == (b->bias != NULL);
}

kiln_status kiln_weights_matrices(kiln_model *m, int count, const char *const *modules,
                                  const int64_t *rows, int64_t cols, bool want_bias,
                                  kiln_matrix *outs) {
    if (count < 1 || count > KILN_WEIGHTS_MAX_FUSED)
        return kiln_error(KILN_ERR_INVALID_ARG, "kiln_weights_matrices: %d matrices", count);
    for (int i = 0; i < count; i++) memset(&outs[i], 0, sizeof outs[i]);
    kiln_matrix hosts[KILN_WEIGHTS_MAX_FUSED];
    float *bias_host[KILN_WEIGHTS_MAX_FUSED] = {0};
    kiln_status st = KILN_OK;
    int parsed = 0;
    for (; parsed < count && st == KILN_OK; parsed++)
        st = weights_host_matrix(m, modules[parsed], rows[parsed], cols, want_bias, &hosts[parsed],
                                 &bias_host[parsed]);
    bool fuse = st == KILN_OK && count > 1 && m->be->upload_matrices;
    for (int i = 1; fuse && i < count; i++) fuse = same_format(&hosts[0], &hosts[i]);
    if (fuse) {
        st = m->be->upload_matrices(m->be, count, hosts, outs);
        if (st == KILN_ERR_UNSUPPORTED) {
            kiln_error_clear();
            fuse = false;
            st = KILN_OK;
        }
    }
    for (int i = 0; !fuse && st == KILN_OK && i < count; i++) {
        st = m->be->upload_matrix(m->be, &hosts[i], &outs[i]);
        if (st != KILN_OK)
            for (int j = 0; j < i; j++) kiln_weights_free_matrix(m, &outs[j]);
    }
    for (int i = 0; i < count; i++) free(bias_host[i]);
    return st;
}

kiln_status kiln_weights_stack(kiln_model *m, int count, const char *const *modules, int64_t rows,
                               int64_t cols, kiln_matrix *out) {
    memset(out, 0, sizeof *out);
    if (!m->be->upload_stack || count < 1) return KILN_ERR_UNSUPPORTED;
    kiln_matrix *hosts = calloc((size_t)count, sizeof *hosts);
    if (!hosts) return kiln_error(KILN_ERR_OOM, "out of memory for %d matrices", count);
    kiln_status st = KILN_OK;
    for (int i = 0; i < count && st == KILN_OK; i++) {
        float *no_bias = NULL; /* want_bias false: none */
        st = weights_host_matrix(m, modules[i], rows, cols, false, &hosts[i], &no_bias);
        if (st == KILN_OK && !same_format(&hosts[0], &hosts[i])) st = KILN_ERR_UNSUPPORTED;
    }
    if (st == KILN_OK) st = m->be->upload_stack(m->be, count, hosts, out);
    free(hosts);
    if (st == KILN_OK || st == KILN_ERR_OOM || st == KILN_ERR_DEVICE) return st;
    kiln_error_clear(); /* the one-by-one load that follows says what is wrong, if anything */
    return KILN_ERR_UNSUPPORTED;
}

kiln_status kiln_scratch_reserve(kiln_backend *be, kiln_scratch *s, size_t bytes) {
    if (bytes <= s->cap) return KILN_OK;
    if (s->ptr) be->free(be, s->ptr);
    size_t cap = bytes + bytes / 2;
    s->ptr = be->alloc(be, cap);
    if (!s->ptr) {
        s->cap = 0;
        return kiln_error(KILN_ERR_OOM, "cannot allocate %zu bytes of scratch memory", cap);
    }
    s->cap = cap;
    return KILN_OK;
}

void kiln_scratch_free(kiln_backend *be, kiln_scratch *s) {
    if (s->ptr) be->free(be, s->ptr);
    s->ptr = NULL;
    s->cap = 0;
}
