/* model_config.c — owns parsing of config.json (+ generation_config.json) into kiln_config:
 * sizes, both rope spellings (rope_parameters / rope_theta + rope_scaling), Gemma-style nested
 * text_config, eos/bos ids, MLX quantization defaults and per-module overrides, and the typed
 * getters over the raw JSON. Wrong JSON types are errors naming the key and the file.
 */
#include "format/model_config.h"

#include "util/status.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Typed field readers. Absent or null keys keep the default; a present key of the wrong type is
 * a KILN_ERR_FORMAT naming the key and the file.
 * ------------------------------------------------------------------------------------------- */

static const cJSON *get_item(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static bool is_integral(const cJSON *v) {
    return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) &&
           fabs(v->valuedouble) <= 2147483647.0;
}

static kiln_status read_int(const cJSON *obj, const char *key, const char *label, int *out) {
    const cJSON *v = get_item(obj, key);
    if (!v) return KILN_OK;
    if (!is_integral(v))
        return kiln_error(KILN_ERR_FORMAT, "%s: key '%s': expected an integer", label, key);
    *out = (int)v->valuedouble;
    return KILN_OK;
}

static kiln_status read_float(const cJSON *obj, const char *key, const char *label, float *out) {
    const cJSON *v = get_item(obj, key);
    if (!v) return KILN_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return kiln_error(KILN_ERR_FORMAT, "%s: key '%s': expected a number", label, key);
    *out = (float)v->valuedouble;
    return KILN_OK;
}

static kiln_status read_bool(const cJSON *obj, const char *key, const char *label, bool *out) {
    const cJSON *v = get_item(obj, key);
    if (!v) return KILN_OK;
    if (!cJSON_IsBool(v))
        return kiln_error(KILN_ERR_FORMAT, "%s: key '%s': expected true or false", label, key);
    *out = cJSON_IsTrue(v);
    return KILN_OK;
}

static kiln_status read_string(const cJSON *obj, const char *key, const char *label, char *out,
                               size_t cap) {
    const cJSON *v = get_item(obj, key);
    if (!v) return KILN_OK;
    if (!cJSON_IsString(v))
        return kiln_error(KILN_ERR_FORMAT, "%s: key '%s': expected a string", label, key);
    if (strlen(v->valuestring) >= cap)
        return kiln_error(KILN_ERR_FORMAT, "%s: key '%s': value longer than %zu characters", label,
                          key, cap - 1);
    memcpy(out, v->valuestring, strlen(v->valuestring) + 1);
    return KILN_OK;
}

/* Adds the ids of an int-or-list key to cfg's eos set, skipping duplicates. */
static kiln_status add_eos(kiln_config *cfg, const cJSON *obj, const char *label) {
    const cJSON *v = get_item(obj, "eos_token_id");
    if (!v) return KILN_OK;
    const cJSON *single = NULL;
    if (cJSON_IsNumber(v))
        single = v;
    else if (!cJSON_IsArray(v))
        return kiln_error(KILN_ERR_FORMAT, "%s: key 'eos_token_id': expected an integer or a list",
                          label);
    for (const cJSON *e = single ? single : v->child; e; e = single ? NULL : e->next) {
        if (!is_integral(e) || e->valuedouble < 0)
            return kiln_error(KILN_ERR_FORMAT,
                              "%s: key 'eos_token_id': expected non-negative integer ids", label);
        int id = (int)e->valuedouble;
        bool dup = false;
        for (int i = 0; i < cfg->n_eos && !dup; i++) dup = cfg->eos_token_ids[i] == id;
        if (dup) continue;
        if (cfg->n_eos == KILN_MAX_EOS)
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: key 'eos_token_id': more than %d ids",
                              label, KILN_MAX_EOS);
        cfg->eos_token_ids[cfg->n_eos++] = id;
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Rope
 * ------------------------------------------------------------------------------------------- */

/* Reads the scaling keys shared by rope_parameters and rope_scaling from one object. */
static kiln_status read_rope_block(const cJSON *obj, const char *key_name, const char *label,
                                   kiln_rope_config *rope) {
    char ctx[128];
    snprintf(ctx, sizeof ctx, "%s: %s", label, key_name);
    KILN_TRY(read_float(obj, "rope_theta", ctx, &rope->theta));
    /* old rope_scaling spells the kind "type", new ones "rope_type" */
    KILN_TRY(read_string(obj, "type", ctx, rope->type, sizeof rope->type));
    KILN_TRY(read_string(obj, "rope_type", ctx, rope->type, sizeof rope->type));
    KILN_TRY(read_float(obj, "factor", ctx, &rope->factor));
    KILN_TRY(read_float(obj, "low_freq_factor", ctx, &rope->low_freq_factor));
    KILN_TRY(read_float(obj, "high_freq_factor", ctx, &rope->high_freq_factor));
    KILN_TRY(read_int(obj, "original_max_position_embeddings", ctx, &rope->original_max_position));
    KILN_TRY(read_float(obj, "partial_rotary_factor", ctx, &rope->partial_rotary_factor));
    return KILN_OK;
}

static kiln_status parse_rope(const cJSON *root, const char *label, kiln_rope_config *rope) {
    rope->theta = 10000.0f;
    snprintf(rope->type, sizeof rope->type, "default");
    rope->factor = 1.0f;
    rope->low_freq_factor = 1.0f;
    rope->high_freq_factor = 4.0f;
    rope->original_max_position = 0;
    rope->partial_rotary_factor = 1.0f;

    /* old form: top-level rope_theta + rope_scaling {type|rope_type, factor, ...} */
    KILN_TRY(read_float(root, "rope_theta", label, &rope->theta));
    KILN_TRY(read_float(root, "partial_rotary_factor", label, &rope->partial_rotary_factor));
    const cJSON *scaling = get_item(root, "rope_scaling");
    if (scaling) {
        if (!cJSON_IsObject(scaling))
            return kiln_error(KILN_ERR_FORMAT, "%s: key 'rope_scaling': expected an object", label);
        KILN_TRY(read_rope_block(scaling, "rope_scaling", label, rope));
    }
    /* new form: rope_parameters {...}, or keyed by layer type (Gemma): take full_attention */
    const cJSON *params = get_item(root, "rope_parameters");
    if (params) {
        if (!cJSON_IsObject(params))
            return kiln_error(KILN_ERR_FORMAT, "%s: key 'rope_parameters': expected an object",
                              label);
        const cJSON *full = cJSON_GetObjectItemCaseSensitive(params, "full_attention");
        bool by_layer_type = cJSON_IsObject(full);
        if (!by_layer_type && params->child && cJSON_IsObject(params->child)) {
            full = params->child; /* keyed by some other layer type: first one */
            by_layer_type = true;
        }
        if (by_layer_type)
            KILN_TRY(read_rope_block(full, "rope_parameters.full_attention", label, rope));
        else
            KILN_TRY(read_rope_block(params, "rope_parameters", label, rope));
    }
    if (!(rope->theta > 0))
        return kiln_error(KILN_ERR_FORMAT, "%s: rope_theta must be positive", label);
    if (!(rope->partial_rotary_factor > 0 && rope->partial_rotary_factor <= 1))
        return kiln_error(KILN_ERR_FORMAT, "%s: partial_rotary_factor must be in (0, 1]", label);
    return KILN_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Quantization block
 * ------------------------------------------------------------------------------------------- */

static kiln_status parse_quantization(const cJSON *root, const char *label, kiln_config *cfg) {
    const char *block_key = "quantization";
    const cJSON *q = get_item(root, block_key);
    if (!q) q = get_item(root, block_key = "quantization_config");
    if (!q) return KILN_OK;
    if (!cJSON_IsObject(q))
        return kiln_error(KILN_ERR_FORMAT, "%s: key '%s': expected an object", label, block_key);
    char ctx[160];
    snprintf(ctx, sizeof ctx, "%s: %s", label, block_key);
    const cJSON *bits = get_item(q, "bits");
    if (!bits) return KILN_OK; /* another quantizer's block (gptq, fp8...): not MLX affine */
    cfg->quant_bits = 0;
    cfg->quant_group_size = 64;
    KILN_TRY(read_int(q, "bits", ctx, &cfg->quant_bits));
    KILN_TRY(read_int(q, "group_size", ctx, &cfg->quant_group_size));
    if (cfg->quant_bits < 1 || cfg->quant_bits > 8 || cfg->quant_group_size < 1)
        return kiln_error(KILN_ERR_FORMAT, "%s: bits %d / group_size %d out of range", ctx,
                          cfg->quant_bits, cfg->quant_group_size);
    cfg->quantized = true;
    int n = 0;
    for (const cJSON *e = q->child; e; e = e->next)
        if (cJSON_IsObject(e) || cJSON_IsFalse(e)) n++;
    if (n == 0) return KILN_OK;
    cfg->quant_overrides = calloc((size_t)n, sizeof *cfg->quant_overrides);
    if (!cfg->quant_overrides) return kiln_error(KILN_ERR_OOM, "%s: out of memory", label);
    for (const cJSON *e = q->child; e; e = e->next) {
        if (!cJSON_IsObject(e) && !cJSON_IsFalse(e)) continue;
        kiln_quant_override *o = &cfg->quant_overrides[cfg->n_quant_overrides];
        o->path = strdup(e->string ? e->string : "");
        if (!o->path) return kiln_error(KILN_ERR_OOM, "%s: out of memory", label);
        cfg->n_quant_overrides++;
        o->quantized = cJSON_IsObject(e);
        o->bits = cfg->quant_bits;
        o->group_size = cfg->quant_group_size;
        if (o->quantized) {
            char octx[256];
            snprintf(octx, sizeof octx, "%s.%s", ctx, o->path);
            KILN_TRY(read_int(e, "bits", octx, &o->bits));
            KILN_TRY(read_int(e, "group_size", octx, &o->group_size));
            if (o->bits < 1 || o->bits > 8 || o->group_size < 1)
                return kiln_error(KILN_ERR_FORMAT, "%s: bits %d / group_size %d out of range", octx,
                                  o->bits, o->group_size);
        }
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------------------------------------
 * config.json
 * ------------------------------------------------------------------------------------------- */

/* Copies every key of text_config over the top level (the text model's values win). */
static kiln_status merge_text_config(cJSON *root, const char *label) {
    const cJSON *found = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!found || cJSON_IsNull(found)) return KILN_OK;
    if (!cJSON_IsObject(found))
        return kiln_error(KILN_ERR_FORMAT, "%s: key 'text_config': expected an object", label);
    /* detached while merging so a nested "text_config" key cannot replace it under our feet */
    cJSON *text = cJSON_DetachItemFromObjectCaseSensitive(root, "text_config");
    kiln_status st = KILN_OK;
    for (const cJSON *e = text->child; e && st == KILN_OK; e = e->next) {
        if (!e->string || strcmp(e->string, "text_config") == 0) continue;
        cJSON *copy = cJSON_Duplicate(e, 1);
        if (!copy) {
            st = kiln_error(KILN_ERR_OOM, "%s: out of memory", label);
        } else if (cJSON_GetObjectItemCaseSensitive(root, e->string)) {
            cJSON_ReplaceItemInObjectCaseSensitive(root, e->string, copy);
        } else {
            cJSON_AddItemToObject(root, e->string, copy);
        }
    }
    cJSON_AddItemToObject(root, "text_config", text);
    return st;
}

static kiln_status require_positive(int v, const char *key, const char *label) {
    if (v <= 0)
        return kiln_error(KILN_ERR_FORMAT, "%s: key '%s': must be a positive integer (got %d)",
                          label, key, v);
    return KILN_OK;
}

static kiln_status fill_config(cJSON *root, const char *label, kiln_config *cfg) {
    KILN_TRY(merge_text_config(root, label));
    KILN_TRY(read_string(root, "model_type", label, cfg->model_type, sizeof cfg->model_type));
    const cJSON *archs = get_item(root, "architectures");
    if (archs) {
        if (!cJSON_IsArray(archs))
            return kiln_error(KILN_ERR_FORMAT, "%s: key 'architectures': expected a list", label);
        if (archs->child) {
            if (!cJSON_IsString(archs->child))
                return kiln_error(KILN_ERR_FORMAT,
                                  "%s: key 'architectures': expected a list of strings", label);
            snprintf(cfg->architecture, sizeof cfg->architecture, "%s", archs->child->valuestring);
        }
    }
    KILN_TRY(read_int(root, "vocab_size", label, &cfg->vocab_size));
    KILN_TRY(read_int(root, "hidden_size", label, &cfg->hidden_size));
    KILN_TRY(read_int(root, "intermediate_size", label, &cfg->intermediate_size));
    KILN_TRY(read_int(root, "num_hidden_layers", label, &cfg->n_layers));
    KILN_TRY(read_int(root, "num_attention_heads", label, &cfg->n_heads));
    KILN_TRY(require_positive(cfg->vocab_size, "vocab_size", label));
    KILN_TRY(require_positive(cfg->hidden_size, "hidden_size", label));
    KILN_TRY(require_positive(cfg->n_layers, "num_hidden_layers", label));
    KILN_TRY(require_positive(cfg->n_heads, "num_attention_heads", label));
    if (cfg->intermediate_size < 0)
        return kiln_error(KILN_ERR_FORMAT, "%s: key 'intermediate_size': negative", label);
    cfg->n_kv_heads = cfg->n_heads;
    KILN_TRY(read_int(root, "num_key_value_heads", label, &cfg->n_kv_heads));
    KILN_TRY(require_positive(cfg->n_kv_heads, "num_key_value_heads", label));
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return kiln_error(KILN_ERR_FORMAT,
                          "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                          label, cfg->n_heads, cfg->n_kv_heads);
    cfg->head_dim = cfg->hidden_size / cfg->n_heads;
    KILN_TRY(read_int(root, "head_dim", label, &cfg->head_dim));
    KILN_TRY(require_positive(cfg->head_dim, "head_dim", label));
    cfg->rms_norm_eps = 1e-6f;
    KILN_TRY(read_float(root, "rms_norm_eps", label, &cfg->rms_norm_eps));
    if (!(cfg->rms_norm_eps >= 0))
        return kiln_error(KILN_ERR_FORMAT, "%s: key 'rms_norm_eps': negative", label);
    KILN_TRY(parse_rope(root, label, &cfg->rope));

    cfg->tie_word_embeddings = strncmp(cfg->model_type, "gemma", 5) == 0;
    KILN_TRY(read_bool(root, "tie_word_embeddings", label, &cfg->tie_word_embeddings));
    cfg->attention_bias = strcmp(cfg->model_type, "qwen2") == 0;
    KILN_TRY(read_bool(root, "attention_bias", label, &cfg->attention_bias));
    if (strcmp(cfg->model_type, "qwen2") == 0) cfg->attention_bias = true;
    KILN_TRY(read_bool(root, "mlp_bias", label, &cfg->mlp_bias));
    KILN_TRY(read_int(root, "max_position_embeddings", label, &cfg->max_position_embeddings));

    cfg->bos_token_id = -1;
    const cJSON *bos = get_item(root, "bos_token_id");
    if (bos && cJSON_IsArray(bos)) bos = bos->child; /* a few configs list it */
    if (bos) {
        if (!is_integral(bos) || bos->valuedouble < 0)
            return kiln_error(KILN_ERR_FORMAT, "%s: key 'bos_token_id': expected an integer id",
                              label);
        cfg->bos_token_id = (int)bos->valuedouble;
    }
    KILN_TRY(add_eos(cfg, root, label));
    KILN_TRY(parse_quantization(root, label, cfg));
    return KILN_OK;
}

kiln_status kiln_config_parse(const char *text, size_t len, const char *label, kiln_config *out) {
    memset(out, 0, sizeof *out);
    out->bos_token_id = -1;
    if (!label) label = "config.json";
    if (!text) return kiln_error(KILN_ERR_INVALID_ARG, "%s: no text", label);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root)
        return kiln_error(KILN_ERR_FORMAT, "%s: not valid JSON (near byte %td)", label,
                          end ? end - text : (ptrdiff_t)-1);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kiln_error(KILN_ERR_FORMAT, "%s: top level is not a JSON object", label);
    }
    out->json = root;
    kiln_status st = fill_config(root, label, out);
    if (st != KILN_OK) kiln_config_free(out);
    return st;
}

void kiln_config_free(kiln_config *cfg) {
    if (!cfg) return;
    for (int i = 0; i < cfg->n_quant_overrides; i++) free(cfg->quant_overrides[i].path);
    free(cfg->quant_overrides);
    cJSON_Delete(cfg->json);
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_token_id = -1;
}

/* ---------------------------------------------------------------------------------------------
 * Loading a folder: config.json + generation_config.json
 * ------------------------------------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len, int *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *err = errno;
        return NULL;
    }
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1))) {
        if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        } else {
            buf[n] = 0;
            *len = (size_t)n;
        }
    }
    *err = buf ? 0 : (errno ? errno : EIO);
    fclose(f);
    return buf;
}

static kiln_status parse_generation(const char *text, size_t len, const char *label,
                                    kiln_config *cfg) {
    cJSON *g = cJSON_ParseWithLength(text, len);
    if (!g) return kiln_error(KILN_ERR_FORMAT, "%s: not valid JSON", label);
    kiln_status st = KILN_OK;
    if (!cJSON_IsObject(g)) {
        st = kiln_error(KILN_ERR_FORMAT, "%s: top level is not a JSON object", label);
        goto done;
    }
#define GEN_FIELD(reader, key, field, flag)                                                        \
    if (get_item(g, key)) {                                                                        \
        if ((st = reader(g, key, label, &cfg->field)) != KILN_OK) goto done;                       \
        cfg->flag = true;                                                                          \
    }
    GEN_FIELD(read_float, "temperature", gen_temperature, has_temperature);
    GEN_FIELD(read_float, "top_p", gen_top_p, has_top_p);
    GEN_FIELD(read_int, "top_k", gen_top_k, has_top_k);
    GEN_FIELD(read_float, "repetition_penalty", gen_repetition_penalty, has_repetition_penalty);
#undef GEN_FIELD
    if ((st = read_bool(g, "do_sample", label, &cfg->gen_do_sample)) != KILN_OK) goto done;
    st = add_eos(cfg, g, label);
done:
    cJSON_Delete(g);
    return st;
}

kiln_status kiln_config_load(const char *dir, kiln_config *out) {
    memset(out, 0, sizeof *out);
    out->bos_token_id = -1;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return kiln_error(KILN_ERR_INVALID_ARG, "%s: path too long", dir);
    size_t len = 0;
    int err = 0;
    char *text = read_file(path, &len, &err);
    if (!text)
        return kiln_error(err == ENOENT ? KILN_ERR_NOT_FOUND : KILN_ERR_IO, "%s: cannot read: %s",
                          path, strerror(err));
    kiln_status st = kiln_config_parse(text, len, path, out);
    free(text);
    if (st != KILN_OK) return st;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    text = read_file(path, &len, &err);
    if (!text) {
        if (err == ENOENT) return KILN_OK;
        kiln_config_free(out);
        return kiln_error(KILN_ERR_IO, "%s: cannot read: %s", path, strerror(err));
    }
    st = parse_generation(text, len, path, out);
    free(text);
    if (st != KILN_OK) kiln_config_free(out);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Queries
 * ------------------------------------------------------------------------------------------- */

/* Does override key `key` name `module`? Exact, or equal after dropping a leading
 * "language_model." and/or "model." from either side (mlx-lm writes both spellings). */
static const char *strip_prefixes(const char *s) {
    if (strncmp(s, "language_model.", 15) == 0) s += 15;
    if (strncmp(s, "model.", 6) == 0) s += 6;
    return s;
}

static bool override_matches(const char *key, const char *module) {
    return strcmp(key, module) == 0 || strcmp(strip_prefixes(key), strip_prefixes(module)) == 0;
}

bool kiln_config_module_quant(const kiln_config *cfg, const char *module, int *bits, int *group) {
    if (!cfg || !cfg->quantized || !module) return false;
    const kiln_quant_override *found = NULL;
    for (int i = 0; i < cfg->n_quant_overrides && !found; i++)
        if (strcmp(cfg->quant_overrides[i].path, module) == 0) found = &cfg->quant_overrides[i];
    for (int i = 0; i < cfg->n_quant_overrides && !found; i++)
        if (override_matches(cfg->quant_overrides[i].path, module))
            found = &cfg->quant_overrides[i];
    if (found && !found->quantized) return false;
    if (bits) *bits = found ? found->bits : cfg->quant_bits;
    if (group) *group = found ? found->group_size : cfg->quant_group_size;
    return true;
}

int kiln_config_int(const kiln_config *cfg, const char *key, int dflt) {
    const cJSON *v = cfg && cfg->json ? get_item(cfg->json, key) : NULL;
    return v && is_integral(v) ? (int)v->valuedouble : dflt;
}

float kiln_config_float(const kiln_config *cfg, const char *key, float dflt) {
    const cJSON *v = cfg && cfg->json ? get_item(cfg->json, key) : NULL;
    return v && cJSON_IsNumber(v) ? (float)v->valuedouble : dflt;
}

bool kiln_config_bool(const kiln_config *cfg, const char *key, bool dflt) {
    const cJSON *v = cfg && cfg->json ? get_item(cfg->json, key) : NULL;
    return v && cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

const char *kiln_config_string(const kiln_config *cfg, const char *key, const char *dflt) {
    const cJSON *v = cfg && cfg->json ? get_item(cfg->json, key) : NULL;
    return v && cJSON_IsString(v) ? v->valuestring : dflt;
}
