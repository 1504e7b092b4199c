/* engine.c — the public model/sequence/forward API: loads a model folder (config, weights,
 * family), creates per-sequence caches on the model's backend, validates batches and runs the
 * family's batched forward. */
#include "kiln.h"

#include "kv/kv_factory.h"
#include "model/model.h"
#include "util/log.h"
#include "util/status.h"

#include <dirent.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* "q_proj", "mlp.gate", ...: the module path without "model.layers.N." and ".weight". */
static void module_kind(const char *tensor, char *out, size_t cap) {
    const char *s = tensor;
    const char *layers = strstr(s, "layers.");
    if (layers) {
        s = layers + 7;
        while (*s >= '0' && *s <= '9') s++;
        if (*s == '.') s++;
    } else if (strncmp(s, "model.", 6) == 0) {
        s += 6;
    }
    snprintf(out, cap, "%s", s);
    char *dot = strrchr(out, '.');
    if (dot) *dot = 0;
    /* experts.17.gate_proj -> experts.*.gate_proj */
    char *ex = strstr(out, "experts.");
    if (ex && ex[8] >= '0' && ex[8] <= '9') {
        char *end = ex + 8;
        while (*end >= '0' && *end <= '9') end++;
        ex[8] = '*';
        memmove(ex + 9, end, strlen(end) + 1);
    }
}

/* Parameter count, stored bytes and a per-module-kind quantization summary. */
static kiln_status describe_weights(kiln_model *m) {
    int n = kiln_st_count(m->archive);
    int64_t params = 0, bytes = 0;
    size_t cap = 4096, len = 0;
    char *summary = calloc(cap, 1);
    if (!summary) return kiln_error(KILN_ERR_OOM, "out of memory");
    int64_t expert_bytes = 0; /* routed experts' tensors (HF `experts.`, mlx-lm `switch_mlp.`) */
    for (int i = 0; i < n; i++) {
        const kiln_st_tensor *t = kiln_st_at(m->archive, i);
        bytes += (int64_t)t->nbytes;
        if (strstr(t->name, ".experts.") || strstr(t->name, ".switch_mlp."))
            expert_bytes += (int64_t)t->nbytes;
        size_t nl = strlen(t->name);
        bool is_qaux = (nl > 7 && strcmp(t->name + nl - 7, ".scales") == 0) ||
                       (nl > 7 && strcmp(t->name + nl - 7, ".biases") == 0);
        if (is_qaux) continue;
        char entry[160], kind[128];
        module_kind(t->name, kind, sizeof kind);
        if (t->dtype == KILN_DT_U32 && nl > 7 && strcmp(t->name + nl - 7, ".weight") == 0) {
            char module[512];
            snprintf(module, sizeof module, "%.*s", (int)(nl - 7), t->name);
            int bits = m->cfg.quant_bits, group = m->cfg.quant_group_size;
            kiln_config_module_quant(&m->cfg, module, &bits, &group);
            if (bits > 0) params += t->numel * 32 / bits;
            snprintf(entry, sizeof entry, "%s=%d-bit/g%d", kind, bits, group);
        } else {
            params += t->numel;
            if (t->ndim < 2) continue; /* norms and biases: not worth listing */
            snprintf(entry, sizeof entry, "%s=%s", kind, kiln_dtype_name(t->dtype));
        }
        /* list each distinct kind=format once */
        bool seen = false;
        for (const char *p = summary; (p = strstr(p, entry)) != NULL; p++) {
            size_t el = strlen(entry);
            if ((p == summary || p[-1] == ' ') && (p[el] == 0 || p[el] == ' ')) {
                seen = true;
                break;
            }
        }
        if (seen) continue;
        size_t el = strlen(entry);
        if (len + el + 2 > cap) {
            char *ns = realloc(summary, cap *= 2);
            if (!ns) {
                free(summary);
                return kiln_error(KILN_ERR_OOM, "out of memory");
            }
            summary = ns;
        }
        len += (size_t)snprintf(summary + len, cap - len, "%s%s", len ? " " : "", entry);
    }
    m->info.n_params = params;
    m->info.weight_bytes = bytes;
    /* a decode token reads top_k of the E experts of each MoE layer */
    const kiln_config *c = &m->cfg;
    const int E = kiln_config_int(c, "num_experts", kiln_config_int(c, "num_local_experts", 0));
    const int K = kiln_config_int(c, "num_experts_per_tok", kiln_config_int(c, "top_k_experts", 0));
    const bool moe = E > 0 && K > 0 && K <= E && expert_bytes > 0;
    m->info.active_weight_bytes = moe ? bytes - expert_bytes + expert_bytes / E * K : bytes;
    m->info.n_experts = moe ? E : 0;
    m->info.experts_per_token = moe ? K : 0;
    m->quant_summary = summary;
    m->info.quant_summary = summary;
    return KILN_OK;
}

void kiln_model_free(kiln_model *m) {
    if (!m) return;
    if (m->family && m->family->free) m->family->free(m);
    kiln_kv_shared_free(m->kv_shared);
    if (m->be) kiln_scratch_free(m->be, &m->sample_ids);
    free(m->sample_host_row);
    kiln_backend_free(m->be);
    kiln_st_close(m->archive);
    kiln_config_free(&m->cfg);
    free(m->kv_layers);
    free(m->quant_summary);
    free(m->layer_pattern);
    free(m->layer_moe);
    free(m->dir);
    free(m);
}

/* Bytes of the folder's *.safetensors files (0 if it cannot be read). */
static uint64_t safetensors_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t total = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len <= 12 || strcmp(e->d_name + len - 12, ".safetensors") != 0) continue;
        struct stat sb;
        if (fstatat(dirfd(d), e->d_name, &sb, 0) == 0) total += (uint64_t)sb.st_size;
    }
    closedir(d);
    return total;
}

/* MemAvailable of /proc/meminfo in bytes (0 if unknown). */
static uint64_t memory_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* kiln_weights_mode AUTO: read the files in for the CPU when they take at most half of the
 * available memory. */
static bool weights_in_memory(const char *dir, const kiln_load_options *o) {
    if (o->weights == KILN_WEIGHTS_MMAP) return false;
    if (o->weights == KILN_WEIGHTS_MEMORY) return true;
    if (o->device != KILN_DEVICE_CPU) return false;
    const uint64_t files = safetensors_bytes(dir), avail = memory_available();
    const bool fit = files > 0 && avail > 0 && files <= avail / 2;
    KILN_LOG_I("weights: %.1f MB of files, %.1f MB available: %s", (double)files / 1e6,
               (double)avail / 1e6, fit ? "read into memory" : "mapped");
    return fit;
}

kiln_status kiln_model_load(const char *dir, const kiln_load_options *opts, kiln_model **out) {
    if (!out) return kiln_error(KILN_ERR_INVALID_ARG, "kiln_model_load: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return kiln_error(KILN_ERR_INVALID_ARG, "kiln_model_load: no model folder");
    kiln_load_options defaults;
    if (!opts) {
        kiln_load_options_default(&defaults);
        opts = &defaults;
    }
    double t0 = now_ms();
    kiln_model *m = calloc(1, sizeof *m);
    if (!m) return kiln_error(KILN_ERR_OOM, "out of memory");
    static _Atomic long models_loaded;
    m->serial = atomic_fetch_add(&models_loaded, 1) + 1;
    m->dir = strdup(dir);
    m->kv_opts = opts->kv;
    kiln_status st = kiln_config_load(dir, &m->cfg);
    if (st != KILN_OK) goto fail;
    m->family = kiln_family_find(&m->cfg);
    if (!m->family) {
        st = kiln_error(KILN_ERR_UNSUPPORTED,
                        "%s/config.json: model_type '%s' is not supported "
                        "(supported: %s)",
                        dir, m->cfg.model_type, kiln_family_supported_types());
        goto fail;
    }
    const bool in_memory = weights_in_memory(dir, opts);
    st = kiln_st_open_dir_with(dir, in_memory, &m->archive);
    if (st != KILN_OK) goto fail;
    st = kiln_backend_new(opts->device, opts->n_threads, &m->be);
    if (st != KILN_OK) goto fail;
    m->info.architecture = m->cfg.model_type;
    m->info.vocab_size = m->cfg.vocab_size;
    m->info.hidden_size = m->cfg.hidden_size;
    m->info.n_layers = m->cfg.n_layers;
    m->info.n_heads = m->cfg.n_heads;
    m->info.n_kv_heads = m->cfg.n_kv_heads;
    m->info.head_dim = m->cfg.head_dim;
    m->info.max_position = m->cfg.max_position_embeddings;
    m->info.bos_id = m->cfg.bos_token_id;
    m->info.n_eos = m->cfg.n_eos;
    memcpy(m->eos_ids, m->cfg.eos_token_ids, sizeof m->eos_ids);
    m->info.eos_ids = m->eos_ids;
    m->max_tokens = m->cfg.max_position_embeddings > 0 ? m->cfg.max_position_embeddings : 4096;
    st = describe_weights(m);
    if (st != KILN_OK) goto fail;
    st = m->family->load(m);
    if (st != KILN_OK) goto fail;
    m->info.kv_bytes_per_token = kiln_kv_bytes_per_token(m->kv_layers, m->n_kv_layers, &m->kv_opts);
    /* layer pattern: F = full attention, S = sliding window, L = linear (no KV); +M = MoE MLP */
    m->layer_pattern = calloc((size_t)m->n_kv_layers * 4 + 1, 1);
    if (!m->layer_pattern) {
        st = kiln_error(KILN_ERR_OOM, "out of memory");
        goto fail;
    }
    for (int i = 0, o = 0; i < m->n_kv_layers; i++) {
        const kiln_kv_layer_desc *d = &m->kv_layers[i];
        if (i) m->layer_pattern[o++] = ' ';
        m->layer_pattern[o++] = !d->is_attention ? 'L' : d->window > 0 ? 'S' : 'F';
        if (m->layer_moe && m->layer_moe[i]) {
            m->layer_pattern[o++] = '+';
            m->layer_pattern[o++] = 'M';
        }
    }
    m->info.layer_pattern = m->layer_pattern;
    double t1 = now_ms();
    KILN_LOG_I("loaded %s: %s, %lld params, %.1f MB of weights on %s in %.0f ms", dir,
               m->cfg.model_type, (long long)m->info.n_params, m->info.weight_bytes / 1e6,
               m->be->name, t1 - t0);
    *out = m;
    return KILN_OK;
fail:
    kiln_model_free(m);
    return st;
}

const kiln_model_info *kiln_model_get_info(const kiln_model *m) {
    return m ? &m->info : NULL;
}

/* f32 / f16 / bf16: kinds a device backend keeps in its contiguous caches */
static bool plain_kind(const char *kind) {
    return !kind[0] || !strcmp(kind, "f32") || !strcmp(kind, "f16") || !strcmp(kind, "bf16");
}
/* On a device with paged kernels: explicit blocks (--kv-block / --kv-budget) of any kind, and the
 * quantized / TurboQuant kinds, live in the device pool; plain kinds without blocks stay in the
 * contiguous caches (tensor-core prefill). (Plain-float blocks were refused until 2026-12-03,
 * when their records lost the low byte of each 16-bit value; fixed, test_kv_cuda covers them.) */
static bool device_paged(const kiln_kv_options *o) {
    return o->block_tokens > 0 || o->budget_bytes > 0 ||
           (kiln_kv_wants_paged(o) && !plain_kind(o->kind));
}

kiln_status kiln_seq_new(kiln_model *m, kiln_seq **out) {
    if (!m || !out) return kiln_error(KILN_ERR_INVALID_ARG, "kiln_seq_new: NULL argument");
    *out = NULL;
    kiln_seq *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OOM, "out of memory");
    s->model = m;
    /* paged caches share one pool per model: in host memory on the CPU, in the backend's memory
     * where it offers paged kernels (device_paged) */
    kiln_status st;
    if (m->be->device == KILN_DEVICE_CPU)
        st = kiln_kv_cpu_new_shared(&m->kv_shared, m->dir, m->kv_layers, m->n_kv_layers,
                                    &m->kv_opts, m->max_tokens, &s->kv);
    else if (m->be->kv_paged_ops && device_paged(&m->kv_opts))
        st = kiln_kv_backend_new_shared(&m->kv_shared, m->be, m->dir, m->kv_layers, m->n_kv_layers,
                                        &m->kv_opts, m->max_tokens, &s->kv);
    else /* the backend's contiguous caches (CUDA: f32 / f16 / bf16; tensor-core prefill) */
        st = m->be->kv_new(m->be, m->kv_layers, m->n_kv_layers, &m->kv_opts, m->max_tokens, &s->kv);
    if (st != KILN_OK) {
        free(s);
        return st;
    }
    *out = s;
    return KILN_OK;
}

void kiln_seq_free(kiln_seq *s) {
    if (!s) return;
    kiln_kv_free(s->kv);
    free(s);
}

int kiln_seq_len(const kiln_seq *s) {
    return s ? s->kv->len : 0;
}

kiln_status kiln_seq_truncate(kiln_seq *s, int len) {
    if (!s) return kiln_error(KILN_ERR_INVALID_ARG, "kiln_seq_truncate: NULL sequence");
    return s->kv->vt->truncate(s->kv, len);
}

kiln_status kiln_seq_fill_synthetic(kiln_seq *s, int n_tokens, uint64_t seed) {
    if (!s) return kiln_error(KILN_ERR_INVALID_ARG, "kiln_seq_fill_synthetic: NULL sequence");
    if (n_tokens < 0)
        return kiln_error(KILN_ERR_INVALID_ARG, "kiln_seq_fill_synthetic: negative token count");
    kiln_model *m = s->model;
    kiln_kv *kv = s->kv;
    if (n_tokens > m->max_tokens - kv->len)
        return kiln_error(KILN_ERR_CACHE_FULL,
                          "kiln_seq_fill_synthetic: %d + %d tokens exceed the context limit %d",
                          kv->len, n_tokens, m->max_tokens);
    int64_t width = 1; /* widest K or V row over the layers */
    for (int l = 0; l < kv->n_layers; l++) {
        const kiln_kv_layer_desc *d = &kv->layers[l];
        int64_t kw = (int64_t)d->n_kv_heads * d->head_dim,
                vw = (int64_t)d->n_kv_heads * d->v_head_dim;
        if (kw > width) width = kw;
        if (vw > width) width = vw;
    }
    enum { CHUNK = 256 };
    const size_t bytes = (size_t)CHUNK * (size_t)width * sizeof(float);
    float *host = malloc(2 * bytes);
    float *dk = m->be->alloc(m->be, bytes), *dv = m->be->alloc(m->be, bytes); /* backend memory */
    kiln_status st = host && dk && dv ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int done = 0; st == KILN_OK && done < n_tokens;) {
        const int c = n_tokens - done < CHUNK ? n_tokens - done : CHUNK;
        st = kv->vt->reserve(kv, c);
        for (int l = 0; st == KILN_OK && l < kv->n_layers; l++) {
            const kiln_kv_layer_desc *d = &kv->layers[l];
            if (!d->is_attention) continue;
            const int64_t kw = (int64_t)d->n_kv_heads * d->head_dim,
                          vw = (int64_t)d->n_kv_heads * d->v_head_dim;
            for (int64_t i = 0; i < (int64_t)c * (kw + vw); i++) { /* uniform, variance 1 */
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                host[i] = (float)((double)(x >> 11) * 0x1.0p-53 * 3.4641016151377544 -
                                  1.7320508075688772);
            }
            m->be->upload(m->be, dk, host, (size_t)(c * kw) * sizeof(float));
            m->be->upload(m->be, dv, host + c * kw, (size_t)(c * vw) * sizeof(float));
            kv->vt->store(kv, l, dk, dv, c);
        }
        if (st == KILN_OK) {
            kv->vt->commit(kv, c);
            done += c;
        }
    }
    if (st == KILN_OK && m->be->synchronize) st = m->be->synchronize(m->be);
    free(host);
    if (dk) m->be->free(m->be, dk);
    if (dv) m->be->free(m->be, dv);
    return st;
}

static kiln_status forward_checked(kiln_model *m, kiln_batch_entry *e, int n,
                                   const kiln_sample_request *req) {
    if (!m || (n > 0 && !e)) return kiln_error(KILN_ERR_INVALID_ARG, "kiln_forward: NULL argument");
    if (n < 0) return kiln_error(KILN_ERR_INVALID_ARG, "kiln_forward: negative entry count");
    for (int i = 0; i < n; i++) {
        if (!e[i].seq || e[i].seq->model != m)
            return kiln_error(KILN_ERR_INVALID_ARG,
                              "batch entry %d: sequence is NULL or belongs "
                              "to another model",
                              i);
        if (e[i].n_tokens < 0 || (e[i].n_tokens > 0 && !e[i].tokens))
            return kiln_error(KILN_ERR_INVALID_ARG, "batch entry %d: bad token array", i);
        if (e[i].n_tokens == 0 && e[i].logits != KILN_LOGITS_NONE)
            return kiln_error(KILN_ERR_INVALID_ARG,
                              "batch entry %d: logits requested for zero "
                              "tokens",
                              i);
        const kiln_sample_request *q = req && req[i].sampler ? &req[i] : NULL;
        if (e[i].logits != KILN_LOGITS_NONE && !e[i].logits_out && !q)
            return kiln_error(KILN_ERR_INVALID_ARG,
                              "batch entry %d: logits requested but "
                              "logits_out is NULL",
                              i);
        if (q && (e[i].logits != KILN_LOGITS_LAST || !q->token_out || q->n_history < 0 ||
                  (q->n_history > 0 && !q->history) ||
                  kiln_sampler_vocab(q->sampler) != m->cfg.vocab_size))
            return kiln_error(KILN_ERR_INVALID_ARG,
                              "batch entry %d: sampling needs logits = KILN_LOGITS_LAST, "
                              "token_out, a history array for n_history > 0 and a sampler of "
                              "the model's vocabulary size (%d; the sampler has %d)",
                              i, m->cfg.vocab_size, kiln_sampler_vocab(q->sampler));
        for (int j = 0; j < e[i].n_tokens; j++)
            if (e[i].tokens[j] < 0 || e[i].tokens[j] >= m->cfg.vocab_size)
                return kiln_error(KILN_ERR_INVALID_ARG,
                                  "batch entry %d: token id %d at index %d "
                                  "is outside the vocabulary [0, %d)",
                                  i, e[i].tokens[j], j, m->cfg.vocab_size);
        if ((int64_t)e[i].seq->kv->len + e[i].n_tokens > m->max_tokens)
            return kiln_error(KILN_ERR_CACHE_FULL,
                              "batch entry %d: %d + %d tokens exceed the "
                              "context limit of %d",
                              i, e[i].seq->kv->len, e[i].n_tokens, m->max_tokens);
        for (int k = 0; k < i; k++)
            if (e[k].seq == e[i].seq)
                return kiln_error(KILN_ERR_INVALID_ARG,
                                  "batch entries %d and %d name the same "
                                  "sequence",
                                  k, i);
    }
    for (int i = 0; i < n; i++) /* token ids let paged caches register prefix blocks */
        kiln_kv_note_tokens(e[i].seq->kv, e[i].tokens, e[i].n_tokens);
    for (int i = 0; req && i < n; i++)
        if (req[i].sampler) *req[i].token_out = -1;
    m->sample_requests = req; /* read by the logits head (logits_head.c) */
    kiln_status st = m->family->forward(m, e, n);
    m->sample_requests = NULL;
    for (int i = 0; st == KILN_OK && req && i < n; i++)
        if (req[i].sampler && *req[i].token_out < 0)
            st = kiln_error(KILN_ERR_INTERNAL, "batch entry %d: the forward picked no token", i);
    return st;
}

kiln_status kiln_forward(kiln_model *m, kiln_batch_entry *e, int n) {
    return forward_checked(m, e, n, NULL);
}

kiln_status kiln_forward_sample(kiln_model *m, kiln_batch_entry *e, int n,
                                const kiln_sample_request *samples) {
    if (n > 0 && !samples)
        return kiln_error(KILN_ERR_INVALID_ARG, "kiln_forward_sample: samples is NULL");
    return forward_checked(m, e, n, samples);
}

void kiln_model_default_sampling(const kiln_model *m, kiln_sampler_params *p) {
    if (!m || !p) return;
    const kiln_config *c = &m->cfg;
    bool sample = c->gen_do_sample; /* transformers: greedy unless do_sample */
    p->temperature = sample && c->has_temperature ? c->gen_temperature : sample ? 1.0f : 0.0f;
    p->top_k = sample && c->has_top_k ? c->gen_top_k : 0;
    p->top_p = sample && c->has_top_p ? c->gen_top_p : 1.0f;
    p->repetition_penalty = c->has_repetition_penalty ? c->gen_repetition_penalty : 1.0f;
}
