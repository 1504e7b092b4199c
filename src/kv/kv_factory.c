/* kv_factory.c — maps a --kv option string to a cache kind (storage codecs per layer), creates
 * caches (contiguous f32 by default, paged for every other kind or when a block size / budget
 * is given), and reports the kinds' byte costs. */
#include "kv/kv_factory.h"

#include "backend/backend.h"
#include "kv/hadamard.h"
#include "kv/kv_pool.h"
#include "util/status.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kiln_load_options_default(kiln_load_options *o) {
    memset(o, 0, sizeof *o);
    o->device = KILN_DEVICE_CPU;
    snprintf(o->kv.kind, sizeof o->kv.kind, "f32");
}

static kiln_status bad_kind(const char *text) {
    return kiln_error(KILN_ERR_UNSUPPORTED,
                      "KV cache kind '%s' is not supported (supported: f32, "
                      "f16, bf16, q8, q4 with optional :gN, turbo:kXvY with X in 4..8, Y in "
                      "1..4, optional :rotk, :gN, :kgN, :vgN)",
                      text);
}

/* Parses ":gN" / ":kgN" / ":vgN" / ":rotk" suffixes starting at s. */
static bool parse_suffixes(const char *s, kv_kind_spec *o, bool allow_rotk) {
    while (*s) {
        if (*s != ':') return false;
        s++;
        if (strncmp(s, "rotk", 4) == 0 && allow_rotk) {
            o->rotk = true;
            s += 4;
        } else if (*s == 'g' || ((s[0] == 'k' || s[0] == 'v') && s[1] == 'g')) {
            /* :gN sets both groups; :kgN / :vgN only the keys' / values' group */
            const char which = *s == 'g' ? 'g' : s[0];
            const char *num = which == 'g' ? s + 1 : s + 2;
            char *end;
            long g = strtol(num, &end, 10);
            if (end == num || g < 8 || g > 256 || !kiln_is_pow2((int)g)) return false;
            if (which != 'v') o->k_group = (int)g;
            if (which != 'k') o->v_group = (int)g;
            s = end;
        } else {
            return false;
        }
    }
    return true;
}

kiln_status kv_kind_parse(const char *text, kv_kind_spec *o) {
    memset(o, 0, sizeof *o);
    if (!text) return bad_kind("(null)");
    o->k_group = o->v_group = 64;
    if (strcmp(text, "f32") == 0) {
        o->k_kind = o->v_kind = KV_CODEC_F32;
    } else if (strcmp(text, "f16") == 0) {
        o->k_kind = o->v_kind = KV_CODEC_F16;
    } else if (strcmp(text, "bf16") == 0) {
        o->k_kind = o->v_kind = KV_CODEC_BF16;
    } else if (text[0] == 'q' && (text[1] == '8' || text[1] == '4') &&
               (text[2] == 0 || text[2] == ':')) {
        o->k_kind = o->v_kind = KV_CODEC_AFFINE;
        o->k_bits = o->v_bits = text[1] - '0';
        o->affine_config = true;
        if (!parse_suffixes(text + 2, o, false)) return bad_kind(text);
    } else if (strncmp(text, "turbo:k", 7) == 0) {
        const char *s = text + 7;
        if (s[0] < '4' || s[0] > '8' || s[1] != 'v' || s[2] < '1' || s[2] > '4')
            return bad_kind(text);
        o->k_kind = KV_CODEC_AFFINE;
        o->k_bits = s[0] - '0';
        o->v_kind = KV_CODEC_LLOYD;
        o->v_bits = s[2] - '0';
        o->rotv = true;
        o->k_group = o->v_group = 32;
        if (!parse_suffixes(s + 3, o, true)) return bad_kind(text);
    } else {
        return bad_kind(text);
    }
    return KILN_OK;
}

kiln_status kiln_kv_options_parse(const char *text, kiln_kv_options *out) {
    kv_kind_spec spec;
    KILN_TRY(kv_kind_parse(text, &spec));
    if (strlen(text) >= sizeof out->kind) return bad_kind(text);
    memset(out, 0, sizeof *out);
    snprintf(out->kind, sizeof out->kind, "%s", text);
    out->paged = strcmp(text, "f32") != 0; /* every kind but the default is stored in blocks */
    return KILN_OK;
}

static kiln_status make_codec(kv_codec_kind kind, int bits, int group, bool rotate, int dim,
                              int layer, kv_codec *c) {
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->bits = bits;
    c->rotate = rotate;
    if (rotate && (!kiln_is_pow2(dim) || dim > 1024))
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "KV layer %d: TurboQuant rotation needs a power-of-"
                          "two head dim up to 1024, got %d",
                          layer, dim);
    if (kind == KV_CODEC_AFFINE || kind == KV_CODEC_LLOYD) {
        if (group > dim) group = dim;
        if (group <= 0 || dim % group != 0 || group > 256)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "KV layer %d: head dim %d is not a multiple "
                              "of the quantization group %d",
                              layer, dim, group);
        c->group = group;
    }
    if (kind == KV_CODEC_LLOYD) kiln_lloyd_max_gaussian(bits, &c->lm);
    return KILN_OK;
}

/* kv_config.json: [{"layer_idx": i, "bits": b, "group_size": g}, ...] overrides affine layers. */
static void apply_kv_config(const char *dir, int layer, int *bits, int *group) {
    if (!dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/kv_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = n > 0 ? malloc((size_t)n + 1) : NULL;
    if (text && fread(text, 1, (size_t)n, f) == (size_t)n) {
        text[n] = 0;
        cJSON *j = cJSON_Parse(text);
        cJSON *it;
        cJSON_ArrayForEach(it, j) {
            cJSON *li = cJSON_GetObjectItem(it, "layer_idx"), *b = cJSON_GetObjectItem(it, "bits"),
                  *g = cJSON_GetObjectItem(it, "group_size");
            if (!cJSON_IsNumber(li) || li->valueint != layer) continue;
            if (cJSON_IsNumber(b) && (b->valueint == 8 || b->valueint == 4 || b->valueint == 2))
                *bits = b->valueint;
            if (cJSON_IsNumber(g) && g->valueint >= 8 && g->valueint <= 256 &&
                kiln_is_pow2(g->valueint))
                *group = g->valueint;
        }
        cJSON_Delete(j);
    }
    free(text);
    fclose(f);
}

kiln_status kv_layer_formats(const kv_kind_spec *s, const kiln_kv_layer_desc *layers, int n_layers,
                             const char *model_dir, kv_layer_fmt *fmt) {
    for (int l = 0; l < n_layers; l++) {
        const kiln_kv_layer_desc *d = &layers[l];
        memset(&fmt[l], 0, sizeof fmt[l]);
        if (!d->is_attention) continue;
        int kb = s->k_bits, vb = s->v_bits, kg = s->k_group, vg = s->v_group;
        if (s->affine_config) {
            apply_kv_config(model_dir, l, &kb, &kg);
            vb = kb;
            vg = kg;
        }
        KILN_TRY(make_codec(s->k_kind, kb, kg, s->rotk, d->head_dim, l, &fmt[l].k));
        KILN_TRY(make_codec(s->v_kind, vb, vg, s->rotv, d->v_head_dim, l, &fmt[l].v));
        fmt[l].k_rec = kv_codec_row_bytes(&fmt[l].k, d->head_dim);
        fmt[l].v_rec = kv_codec_row_bytes(&fmt[l].v, d->v_head_dim);
    }
    return KILN_OK;
}

bool kiln_kv_wants_paged(const kiln_kv_options *o) {
    return o && (o->paged || (o->kind[0] && strcmp(o->kind, "f32") != 0));
}

kiln_status kiln_kv_cpu_new(const kiln_kv_layer_desc *layers, int n_layers,
                            const kiln_kv_options *opts, int max_tokens, kiln_kv **out) {
    *out = NULL;
    if (!kiln_kv_wants_paged(opts))
        return kiln_kv_contiguous_new(layers, n_layers, max_tokens, out);
    kv_pool *p;
    KILN_TRY(kv_pool_new(layers, n_layers, opts, max_tokens, NULL, &p));
    kiln_status st = kv_paged_new(p, true, max_tokens, out);
    if (st != KILN_OK) kv_pool_free(p);
    return st;
}

kiln_status kiln_kv_cpu_new_shared(void **shared, const char *model_dir,
                                   const kiln_kv_layer_desc *layers, int n_layers,
                                   const kiln_kv_options *opts, int max_tokens, kiln_kv **out) {
    *out = NULL;
    if (!kiln_kv_wants_paged(opts))
        return kiln_kv_contiguous_new(layers, n_layers, max_tokens, out);
    if (!*shared) {
        kv_pool *p;
        KILN_TRY(kv_pool_new(layers, n_layers, opts, max_tokens, model_dir, &p));
        *shared = p;
    }
    return kv_paged_new(*shared, false, max_tokens, out);
}

kiln_status kiln_kv_backend_new_shared(void **shared, kiln_backend *be, const char *model_dir,
                                       const kiln_kv_layer_desc *layers, int n_layers,
                                       const kiln_kv_options *opts, int max_tokens, kiln_kv **out) {
    *out = NULL;
    if (!be || !be->kv_paged_ops || !kiln_kv_wants_paged(opts))
        return kiln_error(KILN_ERR_UNSUPPORTED, "paged KV caches are not offered on %s",
                          be ? be->name : "(no backend)");
    if (!*shared) {
        kv_pool *p;
        KILN_TRY(kv_pool_new_on(be, be->kv_paged_ops, layers, n_layers, opts, max_tokens, model_dir,
                                &p));
        *shared = p;
    }
    return kv_paged_new(*shared, false, max_tokens, out);
}

void kiln_kv_shared_free(void *shared) {
    kv_pool_free(shared);
}

int64_t kiln_kv_bytes_per_token(const kiln_kv_layer_desc *layers, int n_layers,
                                const kiln_kv_options *opts) {
    kv_kind_spec spec;
    kv_layer_fmt *fmt = calloc((size_t)(n_layers > 0 ? n_layers : 1), sizeof *fmt);
    bool ok = fmt && kv_kind_parse(opts && opts->kind[0] ? opts->kind : "f32", &spec) == KILN_OK &&
              kv_layer_formats(&spec, layers, n_layers, NULL, fmt) == KILN_OK;
    int64_t b = 0;
    for (int i = 0; i < n_layers; i++)
        if (layers[i].is_attention)
            b += ok ? (int64_t)layers[i].n_kv_heads * (int64_t)(fmt[i].k_rec + fmt[i].v_rec)
                    : (int64_t)layers[i].n_kv_heads * (layers[i].head_dim + layers[i].v_head_dim) *
                          4;
    free(fmt);
    return b;
}
