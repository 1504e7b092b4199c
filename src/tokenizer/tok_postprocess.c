/* tok_postprocess.c — tokenizer.json post-processors, for add_special_tokens on a single
 * sequence: TemplateProcessing ("single" template), BertProcessing/RobertaProcessing (cls A sep),
 * ByteLevel (offsets only: ids unchanged) and Sequence. Each compiles to a template of ids where
 * -1 stands for the sequence itself. */
#include "tokenizer/tok_internal.h"

#include "util/status.h"

#include <stdlib.h>
#include <string.h>

struct tok_post {
    bool seq;                            /* Sequence: apply subs in order */
    bool trim_offsets, add_prefix_space; /* ByteLevel */
    int32_t *tmpl;                       /* ids, -1 = the input sequence */
    size_t n;
    tok_post **subs;
    size_t n_subs;
};

void tok_post_free(tok_post *p) {
    if (!p) return;
    free(p->tmpl);
    for (size_t i = 0; i < p->n_subs; i++) tok_post_free(p->subs[i]);
    free(p->subs);
    free(p);
}

static kiln_status tmpl_push(tok_post *p, int32_t id) {
    int32_t *v = realloc(p->tmpl, (p->n + 1) * sizeof *v);
    if (!v) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    p->tmpl = v;
    p->tmpl[p->n++] = id;
    return KILN_OK;
}

/* ["[CLS]", 101] -> 101 */
static kiln_status pair_id(const cJSON *j, const char *key, const char *type, int32_t *id) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !cJSON_IsNumber(v->child->next) ||
        v->child->next->valuedouble < 0)
        return kiln_error(KILN_ERR_FORMAT,
                          "tokenizer.json: post-processor %s: '%s' must be [token, id]", type, key);
    *id = v->child->next->valueint;
    return KILN_OK;
}

static kiln_status parse_template(const cJSON *j, tok_post *p) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
    if (!cJSON_IsArray(single))
        return kiln_error(KILN_ERR_FORMAT,
                          "tokenizer.json: TemplateProcessing needs a 'single' array");
    for (const cJSON *e = single->child; e; e = e->next) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(e, "Sequence");
        if (sq) {
            KILN_TRY(tmpl_push(p, -1));
            continue;
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
        if (!cJSON_IsString(name))
            return kiln_error(KILN_ERR_FORMAT,
                              "tokenizer.json: TemplateProcessing: template item must be "
                              "SpecialToken or Sequence");
        const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name->valuestring);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids");
        if (!cJSON_IsArray(ids))
            return kiln_error(KILN_ERR_FORMAT,
                              "tokenizer.json: TemplateProcessing: special token '%s' has no ids",
                              name->valuestring);
        for (const cJSON *i = ids->child; i; i = i->next) {
            if (!cJSON_IsNumber(i) || i->valuedouble < 0)
                return kiln_error(KILN_ERR_FORMAT,
                                  "tokenizer.json: TemplateProcessing: bad id for '%s'",
                                  name->valuestring);
            KILN_TRY(tmpl_push(p, i->valueint));
        }
    }
    return KILN_OK;
}

kiln_status tok_post_parse(const cJSON *j, tok_post **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return KILN_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t))
        return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: post-processor without a \"type\"");
    const char *type = t->valuestring;
    tok_post *p = calloc(1, sizeof *p);
    if (!p) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    kiln_status st = KILN_OK;
    if (!strcmp(type, "TemplateProcessing")) {
        st = parse_template(j, p);
    } else if (!strcmp(type, "ByteLevel")) {
        st = tmpl_push(p, -1);
        const cJSON *tr = cJSON_GetObjectItemCaseSensitive(j, "trim_offsets");
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
        p->trim_offsets = cJSON_IsBool(tr) ? cJSON_IsTrue(tr) : true;
        p->add_prefix_space = cJSON_IsBool(ap) ? cJSON_IsTrue(ap) : true;
    } else if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        int32_t cls, sep;
        st = pair_id(j, "cls", type, &cls);
        if (st == KILN_OK) st = pair_id(j, "sep", type, &sep);
        if (st == KILN_OK) st = tmpl_push(p, cls);
        if (st == KILN_OK) st = tmpl_push(p, -1);
        if (st == KILN_OK) st = tmpl_push(p, sep);
    } else if (!strcmp(type, "Sequence")) {
        p->seq = true;
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "processors");
        if (!cJSON_IsArray(list)) {
            st = kiln_error(KILN_ERR_FORMAT,
                            "tokenizer.json: post-processor Sequence needs a 'processors' array");
        } else {
            size_t cnt = (size_t)cJSON_GetArraySize(list);
            p->subs = calloc(cnt ? cnt : 1, sizeof *p->subs);
            if (!p->subs) st = kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
            for (const cJSON *e = list->child; e && st == KILN_OK; e = e->next) {
                tok_post *sub = NULL;
                st = tok_post_parse(e, &sub);
                if (st == KILN_OK && sub) p->subs[p->n_subs++] = sub;
            }
        }
    } else {
        st = kiln_error(KILN_ERR_UNSUPPORTED,
                        "tokenizer.json: unsupported post-processor type '%s'", type);
    }
    if (st != KILN_OK) {
        tok_post_free(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

kiln_status tok_post_apply(const tok_post *p, const tok_ids *in, tok_ids *out) {
    if (p->seq) {
        tok_ids cur = {0}, next = {0};
        kiln_status st = KILN_OK;
        for (size_t i = 0; i < in->n && st == KILN_OK; i++) st = tok_ids_push(&cur, in->v[i]);
        for (size_t k = 0; k < p->n_subs && st == KILN_OK; k++) {
            next.n = 0;
            st = tok_post_apply(p->subs[k], &cur, &next);
            tok_ids t = cur;
            cur = next;
            next = t;
        }
        for (size_t i = 0; i < cur.n && st == KILN_OK; i++) st = tok_ids_push(out, cur.v[i]);
        tok_ids_free(&cur);
        tok_ids_free(&next);
        return st;
    }
    for (size_t i = 0; i < p->n; i++) {
        if (p->tmpl[i] >= 0) {
            KILN_TRY(tok_ids_push(out, p->tmpl[i]));
        } else {
            for (size_t k = 0; k < in->n; k++) KILN_TRY(tok_ids_push(out, in->v[k]));
        }
    }
    return KILN_OK;
}

bool tok_post_trims_offsets(const tok_post *p, bool *add_prefix_space) {
    if (!p) return false;
    if (p->trim_offsets) {
        *add_prefix_space = p->add_prefix_space;
        return true;
    }
    for (size_t i = 0; i < p->n_subs; i++)
        if (tok_post_trims_offsets(p->subs[i], add_prefix_space)) return true;
    return false;
}
