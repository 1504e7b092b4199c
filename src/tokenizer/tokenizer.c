/* tokenizer.c — the public tokenizer API: loading tokenizer.json (+ tokenizer_config.json and
 * chat_template.jinja) into the pipeline, added-token matching, encode and decode, as Hugging Face
 * `tokenizers` does them.
 *
 * Encode: split the raw text on added tokens with normalized=false (leftmost-longest, honouring
 * single_word/lstrip/rstrip) -> normalize each remaining piece -> split on normalized added
 * tokens -> pre-tokenize -> BPE per piece -> post-process when add_special.
 * Input that is not valid UTF-8 is rejected with KILN_ERR_INVALID_ARG (HF's bindings only accept
 * Unicode strings, so there is no byte-exact behaviour to copy; kiln refuses rather than guesses).
 */
#include "tokenizer/tok_internal.h"

#include "util/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- added-token trie ----------------------------------------------------------------------- */
static kiln_status trie_init(tok_trie *t) {
    memset(t, 0, sizeof *t);
    KILN_TRY(tok_u64map_init(&t->edges, 64));
    t->cap_nodes = 64;
    t->terminal = malloc(t->cap_nodes * sizeof *t->terminal);
    if (!t->terminal) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    t->terminal[0] = -1;
    t->n_nodes = 1;
    return KILN_OK;
}

static void trie_free(tok_trie *t) {
    tok_u64map_free(&t->edges);
    free(t->terminal);
    memset(t, 0, sizeof *t);
}

static kiln_status trie_insert(tok_trie *t, const char *s, size_t n, int32_t index) {
    uint64_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = node << 8 | (uint8_t)s[i], child;
        if (!tok_u64map_get(&t->edges, key, &child)) {
            if (t->n_nodes == t->cap_nodes) {
                size_t c = t->cap_nodes * 2;
                int32_t *v = realloc(t->terminal, c * sizeof *v);
                if (!v) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
                t->terminal = v;
                t->cap_nodes = c;
            }
            child = t->n_nodes++;
            t->terminal[child] = -1;
            KILN_TRY(tok_u64map_put(&t->edges, key, child));
        }
        node = child;
    }
    if (n) t->terminal[node] = index;
    return KILN_OK;
}

/* Longest added token starting at s[0]: its index, or -1; *len gets its byte length. */
static int32_t trie_longest(const tok_trie *t, const char *s, size_t n, size_t *len) {
    uint64_t node = 0;
    int32_t best = -1;
    for (size_t i = 0; i < n; i++) {
        uint64_t child;
        if (!tok_u64map_get(&t->edges, node << 8 | (uint8_t)s[i], &child)) break;
        node = child;
        if (t->terminal[node] >= 0) {
            best = t->terminal[node];
            *len = i + 1;
        }
    }
    return best;
}

static bool last_char_is_word(const char *s, size_t n) {
    if (!n) return false;
    size_t p = n - 1;
    while (p > 0 && ((uint8_t)s[p] & 0xc0) == 0x80) p--;
    int32_t cp;
    return tok_utf8_decode(s + p, n - p, &cp) && tok_is_alnum(cp);
}

static bool first_char_is_word(const char *s, size_t n) {
    int32_t cp;
    return n && tok_utf8_decode(s, n, &cp) && tok_is_alnum(cp);
}

/* Splits s on the added tokens of trie t (HF AddedVocabulary::find_matches) into out. */
static kiln_status split_added(const kiln_tokenizer *tok, const tok_trie *t, const char *s,
                               const tok_span *al, size_t n, bool origin, tok_pieces *out,
                               bool *any) {
    size_t start_offset = 0;
    *any = false;
    if (t->n_nodes > 1) {
        for (size_t i = 0; i < n;) {
            size_t mlen = 0;
            int32_t idx = trie_longest(t, s + i, n - i, &mlen);
            if (idx < 0) {
                i++;
                continue;
            }
            const tok_added *a = &tok->added[idx];
            size_t start = i, stop = i + mlen;
            i = stop; /* the matcher resumes after the raw match */
            if (a->single_word && ((start > 0 && last_char_is_word(s, start)) ||
                                   (stop < n && first_char_is_word(s + stop, n - stop))))
                continue;
            if (a->lstrip) {
                size_t ns = start;
                while (ns > 0) {
                    size_t p = ns - 1;
                    while (p > 0 && ((uint8_t)s[p] & 0xc0) == 0x80) p--;
                    int32_t cp;
                    if (!tok_utf8_decode(s + p, ns - p, &cp) || !tok_is_whitespace(cp)) break;
                    ns = p;
                }
                start = ns > start_offset ? ns : start_offset;
            }
            if (a->rstrip) {
                while (stop < n) {
                    int32_t cp;
                    size_t k = tok_utf8_decode(s + stop, n - stop, &cp);
                    if (!k || !tok_is_whitespace(cp)) break;
                    stop += k;
                }
            }
            if (start_offset < start)
                KILN_TRY(tok_pieces_push(out, s + start_offset, start - start_offset,
                                         al + start_offset, -1, origin && start_offset == 0));
            KILN_TRY(tok_pieces_push(out, s + start, stop - start, al + start, a->id,
                                     origin && start == 0));
            *any = true;
            start_offset = stop;
            if (i < stop) i = stop;
        }
    }
    if (start_offset < n)
        KILN_TRY(tok_pieces_push(out, s + start_offset, n - start_offset, al + start_offset, -1,
                                 origin && start_offset == 0));
    return KILN_OK;
}

/* ---- loading -------------------------------------------------------------------------------- */
static bool get_flag(const cJSON *j, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static kiln_status parse_added(kiln_tokenizer *tok, const cJSON *list) {
    if (!list || cJSON_IsNull(list)) return KILN_OK;
    if (!cJSON_IsArray(list))
        return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: added_tokens must be an array");
    size_t cnt = (size_t)cJSON_GetArraySize(list);
    tok->added = calloc(cnt ? cnt : 1, sizeof *tok->added);
    if (!tok->added) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    KILN_TRY(tok_u64map_init(&tok->added_by_id, cnt));
    KILN_TRY(tok_strmap_init(&tok->added_by_content, cnt));
    for (const cJSON *e = list->child; e; e = e->next) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 16777216.0 ||
            !cJSON_IsString(content))
            return kiln_error(KILN_ERR_FORMAT,
                              "tokenizer.json: added_tokens[%zu] needs an id and a content",
                              tok->n_added);
        tok_added *a = &tok->added[tok->n_added];
        a->len = strlen(content->valuestring);
        if (a->len == 0)
            return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: added_tokens[%zu] is empty",
                              tok->n_added);
        if (tok_utf8_validate(content->valuestring, a->len) != a->len)
            return kiln_error(KILN_ERR_FORMAT,
                              "tokenizer.json: added_tokens[%zu] is not valid UTF-8", tok->n_added);
        a->content = strdup(content->valuestring);
        if (!a->content) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
        a->id = id->valueint;
        a->special = get_flag(e, "special", false);
        a->lstrip = get_flag(e, "lstrip", false);
        a->rstrip = get_flag(e, "rstrip", false);
        a->single_word = get_flag(e, "single_word", false);
        a->normalized = get_flag(e, "normalized", !a->special);
        size_t idx = tok->n_added++;
        KILN_TRY(tok_u64map_put(&tok->added_by_id, (uint64_t)a->id, idx));
        KILN_TRY(tok_strmap_put(&tok->added_by_content, a->content, a->len, (int32_t)idx));
        KILN_TRY(trie_insert(a->normalized ? &tok->trie_norm : &tok->trie_raw, a->content, a->len,
                             (int32_t)idx));
        if (a->id + 1 > tok->vocab_size) tok->vocab_size = a->id + 1;
    }
    return KILN_OK;
}

static kiln_status parse_model(kiln_tokenizer *tok, const cJSON *model) {
    if (!cJSON_IsObject(model))
        return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: missing 'model' object");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(model, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : NULL;
    if (!type && cJSON_GetObjectItemCaseSensitive(model, "merges")) type = "BPE";
    if (!type) return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: model without a \"type\"");
    if (strcmp(type, "BPE") != 0)
        return kiln_error(KILN_ERR_UNSUPPORTED, "tokenizer.json: unsupported model type '%s'",
                          type);
    return tok_bpe_parse(model, &tok->model);
}

/* tokenizer_config.json: chat_template (string or [{name, template}] -> "default"), bos/eos. */
static kiln_status token_string(const cJSON *v, char **out) {
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) return KILN_OK;
    *out = strdup(v->valuestring);
    return *out ? KILN_OK : kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
}

static kiln_status parse_config(kiln_tokenizer *tok, const char *json, size_t len) {
    cJSON *cfg = cJSON_ParseWithLength(json, len);
    if (!cfg || !cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        return kiln_error(KILN_ERR_FORMAT, "tokenizer_config.json: not a valid JSON object");
    }
    kiln_status st = KILN_OK;
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    const char *tmpl = NULL;
    if (cJSON_IsString(ct)) {
        tmpl = ct->valuestring;
    } else if (cJSON_IsArray(ct)) {
        for (const cJSON *e = ct->child; e; e = e->next) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *src = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (cJSON_IsString(name) && cJSON_IsString(src) &&
                !strcmp(name->valuestring, "default"))
                tmpl = src->valuestring;
        }
    }
    if (tmpl && !(tok->chat_template = strdup(tmpl)))
        st = kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    if (st == KILN_OK)
        st = token_string(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token"), &tok->bos_token);
    if (st == KILN_OK)
        st = token_string(cJSON_GetObjectItemCaseSensitive(cfg, "eos_token"), &tok->eos_token);
    cJSON_Delete(cfg);
    return st;
}

kiln_status kiln_tokenizer_load_json(const char *json, size_t len, const char *config_json,
                                     size_t config_len, kiln_tokenizer **out) {
    *out = NULL;
    /* JSON is UTF-8 (RFC 8259); checking it here keeps every string the pipeline uses valid, which
     * the regex matcher relies on */
    size_t bad = tok_utf8_validate(json, len);
    if (bad != len)
        return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: not valid UTF-8 (byte offset %zu)",
                          bad);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: not a valid JSON object");
    }
    kiln_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) {
        cJSON_Delete(root);
        return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    }
    kiln_status st = trie_init(&tok->trie_raw);
    if (st == KILN_OK) st = trie_init(&tok->trie_norm);
    if (st == KILN_OK) st = parse_model(tok, cJSON_GetObjectItemCaseSensitive(root, "model"));
    if (st == KILN_OK) {
        int32_t m = tok_bpe_max_id(tok->model) + 1;
        if (m > tok->vocab_size) tok->vocab_size = m;
        st = parse_added(tok, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
    }
    if (st == KILN_OK)
        st = tok_normalizer_parse(cJSON_GetObjectItemCaseSensitive(root, "normalizer"),
                                  &tok->normalizer);
    if (st == KILN_OK)
        st =
            tok_pretok_parse(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), &tok->pretok);
    if (st == KILN_OK)
        st = tok_post_parse(cJSON_GetObjectItemCaseSensitive(root, "post_processor"), &tok->post);
    if (st == KILN_OK)
        st = tok_decoder_parse(cJSON_GetObjectItemCaseSensitive(root, "decoder"), &tok->decoder);
    cJSON_Delete(root);
    if (st == KILN_OK && config_json) st = parse_config(tok, config_json, config_len);
    if (st != KILN_OK) {
        kiln_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return KILN_OK;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 1 << 20;
            char *b = realloc(buf, cap);
            if (!b) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = b;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    bool err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

kiln_status kiln_tokenizer_load(const char *model_dir, kiln_tokenizer **out) {
    if (!out) return kiln_error(KILN_ERR_INVALID_ARG, "kiln_tokenizer_load: out is NULL");
    *out = NULL;
    if (!model_dir) return kiln_error(KILN_ERR_INVALID_ARG, "kiln_tokenizer_load: no folder");
    size_t plen = strlen(model_dir) + 32;
    char *path = malloc(plen);
    if (!path) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    snprintf(path, plen, "%s/tokenizer.json", model_dir);
    size_t len = 0, clen = 0;
    char *json = read_file(path, &len);
    if (!json) {
        kiln_status st = kiln_error(KILN_ERR_IO, "%s: cannot read", path);
        free(path);
        return st;
    }
    snprintf(path, plen, "%s/tokenizer_config.json", model_dir);
    char *cfg = read_file(path, &clen);
    kiln_tokenizer *tok = NULL;
    kiln_status st = kiln_tokenizer_load_json(json, len, cfg, clen, &tok);
    free(json);
    free(cfg);
    if (st != KILN_OK) {
        kiln_error_wrap(st, "%s", model_dir);
        free(path);
        return st;
    }
    if (!tok->chat_template) {
        snprintf(path, plen, "%s/chat_template.jinja", model_dir);
        tok->chat_template = read_file(path, &clen); /* optional */
    }
    free(path);
    *out = tok;
    return KILN_OK;
}

void kiln_tokenizer_free(kiln_tokenizer *tok) {
    if (!tok) return;
    tok_normalizer_free(tok->normalizer);
    tok_pretok_free(tok->pretok);
    tok_bpe_free(tok->model);
    tok_post_free(tok->post);
    tok_decoder_free(tok->decoder);
    for (size_t i = 0; i < tok->n_added; i++) free(tok->added[i].content);
    free(tok->added);
    tok_u64map_free(&tok->added_by_id);
    tok_strmap_free(&tok->added_by_content);
    trie_free(&tok->trie_raw);
    trie_free(&tok->trie_norm);
    free(tok->chat_template);
    free(tok->bos_token);
    free(tok->eos_token);
    free(tok);
}

/* ---- encode ----------------------------------------------------------------------------- */
/* Original byte range of piece bytes [p, q): the smallest range covering their spans (HF
 * NormalizedString::convert_offsets). */
static tok_span span_of(const tok_span *al, size_t p, size_t q) {
    tok_span r = al[p];
    for (size_t i = p + 1; i < q; i++) {
        if (al[i].a < r.a) r.a = al[i].a;
        if (al[i].b > r.b) r.b = al[i].b;
    }
    return r;
}

/* Counts the leading (or trailing) chars of s that are 'Ġ' or whitespace (HF ByteLevel
 * process_offsets). */
static size_t count_spaces(const char *s, size_t n, bool trailing) {
    size_t cnt = 0;
    if (!trailing) {
        for (size_t i = 0; i < n;) {
            int32_t cp;
            size_t k = tok_utf8_decode(s + i, n - i, &cp);
            if (!k || !(cp == 0x120 || tok_is_whitespace(cp))) break;
            cnt++;
            i += k;
        }
        return cnt;
    }
    for (size_t e = n; e > 0;) {
        size_t p = e - 1;
        while (p > 0 && ((uint8_t)s[p] & 0xc0) == 0x80) p--;
        int32_t cp;
        if (!tok_utf8_decode(s + p, e - p, &cp) || !(cp == 0x120 || tok_is_whitespace(cp))) break;
        cnt++;
        e = p;
    }
    return cnt;
}

/* Encodes text; when offs is non-NULL it gets two entries per id: the [start, end) char offsets
 * of the id in text, as HF's Python and Node bindings report them. */
static kiln_status encode(const kiln_tokenizer *tok, const char *text, size_t len, bool add_special,
                          tok_ids *ids, tok_ids *offs) {
    tok_pieces raw = {0}, ps = {0};
    tok_buf norm = {0};
    tok_spans nal = {0}, text_al = {0};
    tok_ids model_ids = {0}, lens = {0}, moffs = {0}, marks = {0}, post = {0};
    int32_t *char_at = NULL;
    bool any;
    kiln_status st = KILN_OK;
    /* every byte of a char starts out mapped to the whole char */
    for (size_t i = 0; i < len && st == KILN_OK;) {
        int32_t cp;
        size_t k = tok_utf8_decode(text + i, len - i, &cp);
        if (!k) k = 1;
        st = tok_spans_put(&text_al, (tok_span){(uint32_t)i, (uint32_t)(i + k)}, k);
        i += k;
    }
    if (st == KILN_OK)
        st = split_added(tok, &tok->trie_raw, text, text_al.v, len, true, &raw, &any);
    for (size_t i = 0; i < raw.n && st == KILN_OK; i++) {
        tok_piece pc = raw.v[i];
        const char *s = raw.text.p + pc.off;
        const tok_span *al = raw.al.v + pc.off;
        if (pc.id >= 0) {
            st = tok_pieces_push(&ps, s, pc.len, al, pc.id, pc.origin);
            continue;
        }
        if (tok->normalizer) {
            norm.n = 0;
            nal.n = 0;
            st = tok_normalize(tok->normalizer, s, pc.len, al, &norm, &nal);
            if (st != KILN_OK) break;
            s = norm.p ? norm.p : "";
            al = nal.v;
            pc.len = norm.n;
        }
        st = split_added(tok, &tok->trie_norm, s, al, pc.len, pc.origin, &ps, &any);
    }
    if (st == KILN_OK && tok->pretok) st = tok_pretok_apply(tok->pretok, &ps);
    for (size_t i = 0; i < ps.n && st == KILN_OK; i++) {
        tok_piece pc = ps.v[i];
        const tok_span *al = ps.al.v + pc.off;
        if (pc.id >= 0) {
            st = tok_ids_push(&model_ids, pc.id);
            if (st == KILN_OK && offs) {
                tok_span r = span_of(al, 0, pc.len);
                st = tok_ids_push(&moffs, (int32_t)r.a);
                if (st == KILN_OK) st = tok_ids_push(&moffs, (int32_t)r.b);
            }
            continue;
        }
        size_t first = model_ids.n;
        lens.n = 0;
        st =
            tok_bpe_encode(tok->model, ps.text.p + pc.off, pc.len, &model_ids, offs ? &lens : NULL);
        for (size_t t = 0, p = 0; offs && t < lens.n && st == KILN_OK; t++) {
            size_t q = p + (size_t)lens.v[t];
            if (q > pc.len || q <= p) q = p < pc.len ? pc.len : p + 1; /* not expected */
            tok_span r = p < pc.len ? span_of(al, p, q) : span_of(al, pc.len - 1, pc.len);
            st = tok_ids_push(&moffs, (int32_t)r.a);
            if (st == KILN_OK) st = tok_ids_push(&moffs, (int32_t)r.b);
            p = q;
        }
        if (st == KILN_OK && offs && moffs.n != 2 * model_ids.n)
            st = kiln_error(KILN_ERR_INTERNAL, "tokenizer: offsets of %zu tokens lost",
                            model_ids.n - first);
    }
    if (st == KILN_OK && offs) {
        /* byte -> char offsets (HF BytesToCharOffsetConverter) */
        char_at = malloc((len + 1) * sizeof *char_at);
        if (!char_at) st = kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
        int32_t c = 0;
        for (size_t i = 0; i < len && char_at;) {
            int32_t cp;
            size_t k = tok_utf8_decode(text + i, len - i, &cp);
            if (!k) k = 1;
            for (size_t j = 0; j < k && i + j < len; j++) char_at[i + j] = c;
            i += k;
            c++;
        }
        for (size_t t = 0; t < model_ids.n && st == KILN_OK; t++) {
            size_t a = (size_t)moffs.v[2 * t], b = (size_t)moffs.v[2 * t + 1];
            if (a >= len) continue; /* HF keeps the byte offsets */
            moffs.v[2 * t] = char_at[a];
            moffs.v[2 * t + 1] = b < len ? char_at[b] : (b > 0 ? char_at[b - 1] : char_at[a]) + 1;
        }
        bool prefix = false;
        if (tok_post_trims_offsets(tok->post, &prefix)) {
            for (size_t t = 0; t < model_ids.n; t++) {
                size_t n;
                const char *v = tok_id_to_token(tok, model_ids.v[t], &n);
                if (!v) continue;
                int32_t lead = (int32_t)count_spaces(v, n, false);
                int32_t trail = (int32_t)count_spaces(v, n, true);
                int32_t *o = moffs.v + 2 * t;
                if (lead > 0) {
                    if ((t == 0 || o[0] == 0) && prefix && lead == 1) lead = 0;
                    o[0] = o[0] + lead < o[1] ? o[0] + lead : o[1];
                }
                if (trail > 0 && o[1] >= trail) o[1] = o[1] - trail > o[0] ? o[1] - trail : o[0];
            }
        }
    }
    if (st == KILN_OK && add_special && tok->post) {
        /* run the processor over markers -2-i to see where each model token lands */
        for (size_t i = 0; i < model_ids.n && st == KILN_OK; i++)
            st = tok_ids_push(&marks, -2 - (int32_t)i);
        if (st == KILN_OK) st = tok_post_apply(tok->post, &marks, &post);
        for (size_t i = 0; i < post.n && st == KILN_OK; i++) {
            int32_t m = post.v[i];
            size_t k = m <= -2 ? (size_t)(-2 - m) : 0;
            st = tok_ids_push(ids, m <= -2 ? model_ids.v[k] : m);
            if (st == KILN_OK && offs) st = tok_ids_push(offs, m <= -2 ? moffs.v[2 * k] : 0);
            if (st == KILN_OK && offs) st = tok_ids_push(offs, m <= -2 ? moffs.v[2 * k + 1] : 0);
        }
    } else {
        for (size_t i = 0; i < model_ids.n && st == KILN_OK; i++) {
            st = tok_ids_push(ids, model_ids.v[i]);
            if (st == KILN_OK && offs) st = tok_ids_push(offs, moffs.v[2 * i]);
            if (st == KILN_OK && offs) st = tok_ids_push(offs, moffs.v[2 * i + 1]);
        }
    }
    free(char_at);
    tok_ids_free(&model_ids);
    tok_ids_free(&lens);
    tok_ids_free(&moffs);
    tok_ids_free(&marks);
    tok_ids_free(&post);
    tok_pieces_free(&raw);
    tok_pieces_free(&ps);
    tok_buf_free(&norm);
    tok_spans_free(&nal);
    tok_spans_free(&text_al);
    return st;
}

static kiln_status tokenize(const kiln_tokenizer *tok, const char *text, size_t len,
                            bool add_special, int32_t **out, int32_t (**offsets)[2], int *n_out,
                            const char *fn) {
    if (!tok || !out || !n_out || (!text && len))
        return kiln_error(KILN_ERR_INVALID_ARG, "%s: NULL argument", fn);
    *out = NULL;
    *n_out = 0;
    if (offsets) *offsets = NULL;
    if (len > (size_t)1 << 31)
        return kiln_error(KILN_ERR_INVALID_ARG, "%s: text of %zu bytes is too long", fn, len);
    size_t bad = tok_utf8_validate(text ? text : "", len);
    if (bad != len)
        return kiln_error(KILN_ERR_INVALID_ARG,
                          "%s: text is not valid UTF-8 (byte 0x%02x at offset %zu)", fn,
                          (uint8_t)text[bad], bad);
    tok_ids ids = {0}, offs = {0};
    kiln_status st = encode(tok, text ? text : "", len, add_special, &ids, offsets ? &offs : NULL);
    if (st == KILN_OK && !ids.v && !(ids.v = malloc(sizeof *ids.v)))
        st = kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    if (st == KILN_OK && offsets && !offs.v && !(offs.v = malloc(2 * sizeof *offs.v)))
        st = kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    if (st != KILN_OK) {
        tok_ids_free(&ids);
        tok_ids_free(&offs);
        return st;
    }
    *out = ids.v;
    *n_out = (int)ids.n;
    if (offsets) *offsets = (int32_t(*)[2])offs.v;
    return KILN_OK;
}

kiln_status kiln_tokenize(const kiln_tokenizer *tok, const char *text, size_t len, bool add_special,
                          int32_t **out, int *n_out) {
    return tokenize(tok, text, len, add_special, out, NULL, n_out, "kiln_tokenize");
}

kiln_status kiln_tokenize_offsets(const kiln_tokenizer *tok, const char *text, size_t len,
                                  bool add_special, int32_t **ids, int32_t (**offsets)[2],
                                  int *n_out) {
    if (!offsets) return kiln_error(KILN_ERR_INVALID_ARG, "kiln_tokenize_offsets: NULL argument");
    return tokenize(tok, text, len, add_special, ids, offsets, n_out, "kiln_tokenize_offsets");
}

/* ---- decode --------------------------------------------------------------------------------- */
const char *tok_id_to_token(const kiln_tokenizer *tok, int32_t id, size_t *len) {
    uint64_t idx;
    if (tok_u64map_get(&tok->added_by_id, (uint64_t)id, &idx)) {
        *len = tok->added[idx].len;
        return tok->added[idx].content;
    }
    return tok_bpe_id_to_token(tok->model, id, len);
}

bool tok_is_special_id(const kiln_tokenizer *tok, int32_t id) {
    size_t len;
    const char *s = tok_id_to_token(tok, id, &len);
    if (!s) return false;
    int32_t idx = tok_strmap_get(&tok->added_by_content, s, len);
    return idx >= 0 && tok->added[idx].special;
}

kiln_status kiln_detokenize(const kiln_tokenizer *tok, const int32_t *ids, int n, bool skip_special,
                            char **out) {
    size_t len;
    return kiln_detokenize_len(tok, ids, n, skip_special, out, &len);
}

kiln_status kiln_detokenize_len(const kiln_tokenizer *tok, const int32_t *ids, int n,
                                bool skip_special, char **out, size_t *out_len) {
    if (!tok || !out || !out_len || n < 0 || (!ids && n))
        return kiln_error(KILN_ERR_INVALID_ARG, "kiln_detokenize: bad arguments");
    *out_len = 0;
    *out = NULL;
    const char **toks = malloc(((size_t)n + 1) * sizeof *toks);
    size_t *lens = malloc(((size_t)n + 1) * sizeof *lens);
    if (!toks || !lens) {
        free(toks);
        free(lens);
        return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    }
    kiln_status st = KILN_OK;
    size_t m = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->vocab_size) {
            st = kiln_error(KILN_ERR_INVALID_ARG,
                            "kiln_detokenize: token id %d at position %d is outside the vocabulary "
                            "(size %d)",
                            ids[i], i, tok->vocab_size);
            break;
        }
        size_t len;
        const char *s = tok_id_to_token(tok, ids[i], &len);
        if (!s) continue; /* a hole in the vocab: HF skips it too */
        if (skip_special && tok_is_special_id(tok, ids[i])) continue;
        toks[m] = s;
        lens[m++] = len;
    }
    tok_buf res = {0};
    if (st == KILN_OK) {
        if (tok->decoder) {
            st = tok_decode_tokens(tok->decoder, toks, lens, m, &res);
        } else {
            for (size_t i = 0; i < m && st == KILN_OK; i++) {
                if (i) st = tok_buf_putc(&res, ' ');
                if (st == KILN_OK) st = tok_buf_put(&res, toks[i], lens[i]);
            }
        }
    }
    *out_len = res.n;
    if (st == KILN_OK) st = tok_buf_take(&res, out);
    tok_buf_free(&res);
    free(toks);
    free(lens);
    return st;
}

int kiln_tokenizer_vocab_size(const kiln_tokenizer *tok) {
    return tok ? tok->vocab_size : 0;
}

int32_t kiln_tokenizer_token_id(const kiln_tokenizer *tok, const char *token) {
    if (!tok || !token) return -1;
    size_t len = strlen(token);
    int32_t idx = tok_strmap_get(&tok->added_by_content, token, len);
    if (idx >= 0) return tok->added[idx].id;
    return tok_bpe_token_id(tok->model, token, len);
}
