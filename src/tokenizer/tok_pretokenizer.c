/* tok_pretokenizer.c — tokenizer.json pre-tokenizers: Split (literal/regex, the five delimiter
 * behaviours, invert), ByteLevel (add_prefix_space, use_regex with the GPT-2 pattern, byte ->
 * printable code point mapping), Metaspace (replacement, prepend_scheme, split), Digits,
 * Punctuation, Whitespace, WhitespaceSplit, BertPreTokenizer, CharDelimiterSplit and Sequence.
 * Each splits the non-token pieces further, with HF's PreTokenizedString semantics (empty pieces
 * are dropped). */
#include "tokenizer/tok_internal.h"

#include "util/status.h"

#include <stdlib.h>
#include <string.h>

typedef enum {
    P_SPLIT,
    P_BYTELEVEL,
    P_METASPACE,
    P_DIGITS,
    P_PUNCT,
    P_WHITESPACE,
    P_WSSPLIT,
    P_BERT,
    P_CHARDELIM,
    P_SEQ
} ptype;

typedef enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS } behavior;

typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } prepend_scheme;

struct tok_pretok {
    ptype type;
    tok_pattern pattern; /* Split, Whitespace, ByteLevel (GPT-2 regex) */
    behavior behavior;
    bool invert;
    bool add_prefix_space, use_regex; /* ByteLevel */
    int32_t replacement;              /* Metaspace */
    char rep_utf8[5];
    size_t rep_len;
    prepend_scheme scheme;
    bool split;
    bool individual_digits;
    int32_t delimiter; /* CharDelimiterSplit */
    tok_pretok **subs;
    size_t n_subs;
};

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char WHITESPACE_PATTERN[] = "\\w+|[^\\w\\s]+";

void tok_pretok_free(tok_pretok *p) {
    if (!p) return;
    tok_pattern_free(&p->pattern);
    for (size_t i = 0; i < p->n_subs; i++) tok_pretok_free(p->subs[i]);
    free(p->subs);
    free(p);
}

static kiln_status regex_pattern(const char *re, const char *what, tok_pattern *out) {
    cJSON *j = cJSON_CreateObject();
    if (!j || !cJSON_AddStringToObject(j, "Regex", re)) {
        cJSON_Delete(j);
        return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    }
    kiln_status st = tok_pattern_parse(j, what, out);
    cJSON_Delete(j);
    return st;
}

static bool get_bool(const cJSON *j, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static kiln_status parse_behavior(const cJSON *j, const char *type, behavior dflt, behavior *out) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "behavior");
    if (!b) {
        *out = dflt;
        return KILN_OK;
    }
    const char *s = cJSON_IsString(b) ? b->valuestring : "";
    if (!strcmp(s, "Removed"))
        *out = B_REMOVED;
    else if (!strcmp(s, "Isolated"))
        *out = B_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious"))
        *out = B_MERGED_PREV;
    else if (!strcmp(s, "MergedWithNext"))
        *out = B_MERGED_NEXT;
    else if (!strcmp(s, "Contiguous"))
        *out = B_CONTIGUOUS;
    else
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "tokenizer.json: pre-tokenizer %s: unknown behavior '%s'", type, s);
    return KILN_OK;
}

static kiln_status parse_char(const cJSON *j, const char *key, const char *type, int32_t dflt,
                              int32_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v) {
        *out = dflt;
        return KILN_OK;
    }
    int32_t cp;
    if (!cJSON_IsString(v) || !v->valuestring[0] ||
        tok_utf8_decode(v->valuestring, strlen(v->valuestring), &cp) != strlen(v->valuestring))
        return kiln_error(KILN_ERR_FORMAT,
                          "tokenizer.json: pre-tokenizer %s: '%s' must be a single character", type,
                          key);
    *out = cp;
    return KILN_OK;
}

kiln_status tok_pretok_parse(const cJSON *j, tok_pretok **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return KILN_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t))
        return kiln_error(KILN_ERR_FORMAT, "tokenizer.json: pre-tokenizer without a \"type\"");
    const char *type = t->valuestring;
    tok_pretok *p = calloc(1, sizeof *p);
    if (!p) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    kiln_status st = KILN_OK;
    if (!strcmp(type, "Split")) {
        p->type = P_SPLIT;
        p->invert = get_bool(j, "invert", false);
        st = parse_behavior(j, type, B_ISOLATED, &p->behavior);
        if (st == KILN_OK)
            st = tok_pattern_parse(cJSON_GetObjectItemCaseSensitive(j, "pattern"),
                                   "pre-tokenizer Split", &p->pattern);
    } else if (!strcmp(type, "ByteLevel")) {
        p->type = P_BYTELEVEL;
        p->add_prefix_space = get_bool(j, "add_prefix_space", true);
        p->use_regex = get_bool(j, "use_regex", true);
        if (p->use_regex) st = regex_pattern(GPT2_PATTERN, "pre-tokenizer ByteLevel", &p->pattern);
    } else if (!strcmp(type, "Metaspace")) {
        p->type = P_METASPACE;
        st = parse_char(j, "replacement", type, 0x2581, &p->replacement);
        p->split = get_bool(j, "split", true);
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
        if (cJSON_IsString(ps)) {
            if (!strcmp(ps->valuestring, "always"))
                p->scheme = PREPEND_ALWAYS;
            else if (!strcmp(ps->valuestring, "first"))
                p->scheme = PREPEND_FIRST;
            else if (!strcmp(ps->valuestring, "never"))
                p->scheme = PREPEND_NEVER;
            else
                st = kiln_error(KILN_ERR_UNSUPPORTED,
                                "tokenizer.json: Metaspace: unknown prepend_scheme '%s'",
                                ps->valuestring);
        } else {
            p->scheme = get_bool(j, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
        }
        if (st == KILN_OK) {
            tok_buf b = {0};
            st = tok_buf_put_cp(&b, p->replacement);
            if (st == KILN_OK) {
                memcpy(p->rep_utf8, b.p, b.n);
                p->rep_len = b.n;
            }
            tok_buf_free(&b);
        }
    } else if (!strcmp(type, "Digits")) {
        p->type = P_DIGITS;
        p->individual_digits = get_bool(j, "individual_digits", false);
    } else if (!strcmp(type, "Punctuation")) {
        p->type = P_PUNCT;
        st = parse_behavior(j, type, B_ISOLATED, &p->behavior);
    } else if (!strcmp(type, "Whitespace")) {
        p->type = P_WHITESPACE;
        st = regex_pattern(WHITESPACE_PATTERN, "pre-tokenizer Whitespace", &p->pattern);
    } else if (!strcmp(type, "WhitespaceSplit")) {
        p->type = P_WSSPLIT;
    } else if (!strcmp(type, "BertPreTokenizer")) {
        p->type = P_BERT;
    } else if (!strcmp(type, "CharDelimiterSplit")) {
        p->type = P_CHARDELIM;
        st = parse_char(j, "delimiter", type, ' ', &p->delimiter);
    } else if (!strcmp(type, "Sequence")) {
        p->type = P_SEQ;
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers");
        if (!cJSON_IsArray(list)) {
            st = kiln_error(KILN_ERR_FORMAT,
                            "tokenizer.json: pre-tokenizer Sequence needs a 'pretokenizers' array");
        } else {
            size_t cnt = (size_t)cJSON_GetArraySize(list);
            p->subs = calloc(cnt ? cnt : 1, sizeof *p->subs);
            if (!p->subs) st = kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
            for (const cJSON *e = list->child; e && st == KILN_OK; e = e->next) {
                tok_pretok *sub = NULL;
                st = tok_pretok_parse(e, &sub);
                if (st == KILN_OK && sub) p->subs[p->n_subs++] = sub;
            }
        }
    } else {
        st = kiln_error(KILN_ERR_UNSUPPORTED, "tokenizer.json: unsupported pre-tokenizer type '%s'",
                        type);
    }
    if (st != KILN_OK) {
        tok_pretok_free(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

/* ---- segments: (start, end, is_match) over one piece ---------------------------------------- */
typedef struct seg {
    size_t a, b;
    bool match;
} seg;

typedef struct segs {
    seg *v;
    size_t n, cap;
} segs;

static kiln_status segs_push(segs *s, size_t a, size_t b, bool match) {
    if (s->n == s->cap) {
        size_t c = s->cap ? s->cap * 2 : 16;
        seg *v = realloc(s->v, c * sizeof *v);
        if (!v) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory (splits)");
        s->v = v;
        s->cap = c;
    }
    s->v[s->n++] = (seg){a, b, match};
    return KILN_OK;
}

static kiln_status segs_from_pattern(const tok_pattern *pat, const char *s, size_t n, segs *out) {
    if (n == 0) return segs_push(out, 0, 0, false);
    size_t *spans, count;
    KILN_TRY(tok_pattern_find(pat, s, n, &spans, &count));
    kiln_status st = KILN_OK;
    size_t prev = 0;
    for (size_t i = 0; i < count && st == KILN_OK; i++) {
        size_t a = spans[2 * i], b = spans[2 * i + 1];
        if (prev != a) st = segs_push(out, prev, a, false);
        if (st == KILN_OK) st = segs_push(out, a, b, true);
        prev = b;
    }
    if (st == KILN_OK && prev != n) st = segs_push(out, prev, n, false);
    free(spans);
    return st;
}

typedef bool (*char_pred)(int32_t cp, const tok_pretok *p);

static kiln_status segs_from_pred(char_pred pred, const tok_pretok *p, const char *s, size_t n,
                                  segs *out) {
    if (n == 0) return segs_push(out, 0, 0, false);
    size_t last = 0, i = 0;
    while (i < n) {
        int32_t cp;
        size_t k = tok_utf8_decode(s + i, n - i, &cp);
        if (!k) {
            k = 1;
            cp = 0xfffd;
        }
        if (pred(cp, p)) {
            if (last < i) KILN_TRY(segs_push(out, last, i, false));
            KILN_TRY(segs_push(out, i, i + k, true));
            last = i + k;
        }
        i += k;
    }
    if (n > last) KILN_TRY(segs_push(out, last, n, false));
    return KILN_OK;
}

static bool pred_ws(int32_t cp, const tok_pretok *p) {
    return tok_is_whitespace(cp);
}
static bool pred_punct(int32_t cp, const tok_pretok *p) {
    return tok_is_punctuation(cp);
}
static bool pred_digit(int32_t cp, const tok_pretok *p) {
    return tok_is_numeric(cp);
}
static bool pred_delim(int32_t cp, const tok_pretok *p) {
    return cp == p->delimiter;
}
static bool pred_rep(int32_t cp, const tok_pretok *p) {
    return cp == p->replacement;
}

/* Applies a delimiter behaviour to segs (in place) and emits the non-empty pieces. */
static kiln_status emit(tok_pieces *out, const char *s, const tok_span *al, segs *sg, behavior bh,
                        bool invert, bool origin) {
    if (invert)
        for (size_t i = 0; i < sg->n; i++) sg->v[i].match = !sg->v[i].match;
    size_t m = 0;
    bool prev_match = false;
    switch (bh) {
    case B_ISOLATED:
        m = sg->n;
        break;
    case B_REMOVED:
        for (size_t i = 0; i < sg->n; i++)
            if (!sg->v[i].match) sg->v[m++] = sg->v[i];
        break;
    case B_MERGED_PREV:
        for (size_t i = 0; i < sg->n; i++) {
            seg e = sg->v[i];
            if (e.match && !prev_match && m > 0)
                sg->v[m - 1].b = e.b;
            else
                sg->v[m++] = e;
            prev_match = e.match;
        }
        break;
    case B_CONTIGUOUS:
        for (size_t i = 0; i < sg->n; i++) {
            seg e = sg->v[i];
            if (e.match == prev_match && m > 0)
                sg->v[m - 1].b = e.b;
            else
                sg->v[m++] = e;
            prev_match = e.match;
        }
        break;
    case B_MERGED_NEXT: {
        /* walk backwards, extending the following piece's start */
        size_t w = sg->n;
        for (size_t i = sg->n; i-- > 0;) {
            seg e = sg->v[i];
            if (e.match && !prev_match && w < sg->n)
                sg->v[w].a = e.a;
            else
                sg->v[--w] = e;
            prev_match = e.match;
        }
        memmove(sg->v, sg->v + w, (sg->n - w) * sizeof *sg->v);
        m = sg->n - w;
        break;
    }
    }
    for (size_t i = 0; i < m; i++) {
        seg e = sg->v[i];
        if (e.a == e.b) continue;
        KILN_TRY(tok_pieces_push(out, s + e.a, e.b - e.a, al + e.a, -1, origin && e.a == 0));
    }
    return KILN_OK;
}

static kiln_status split_piece(const tok_pretok *p, const char *s, const tok_span *al, size_t n,
                               bool origin, tok_pieces *out, tok_buf *scratch, tok_spans *sal,
                               segs *sg);

/* Runs a whole pre-tokenizer over *ps, replacing it. */
kiln_status tok_pretok_apply(const tok_pretok *p, tok_pieces *ps) {
    if (p->type == P_SEQ) {
        for (size_t i = 0; i < p->n_subs; i++) KILN_TRY(tok_pretok_apply(p->subs[i], ps));
        return KILN_OK;
    }
    tok_pieces out = {0};
    tok_buf scratch = {0};
    tok_spans sal = {0};
    segs sg = {0};
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < ps->n && st == KILN_OK; i++) {
        tok_piece pc = ps->v[i];
        const char *s = ps->text.p + pc.off;
        const tok_span *al = ps->al.v + pc.off;
        if (pc.id >= 0)
            st = tok_pieces_push(&out, s, pc.len, al, pc.id, pc.origin);
        else
            st = split_piece(p, s, al, pc.len, pc.origin, &out, &scratch, &sal, &sg);
    }
    tok_buf_free(&scratch);
    tok_spans_free(&sal);
    free(sg.v);
    if (st != KILN_OK) {
        tok_pieces_free(&out);
        return st;
    }
    tok_pieces_free(ps);
    *ps = out;
    return KILN_OK;
}

/* Each byte becomes one printable char with the byte's span (the first char of a multi-byte char
 * replaces it, the others are inserted after it: all take its span). */
static kiln_status bytelevel_map(const char *s, const tok_span *al, size_t n, tok_buf *out,
                                 tok_spans *oal) {
    for (size_t i = 0; i < n; i++) {
        size_t at = out->n;
        KILN_TRY(tok_buf_put_cp(out, tok_byte_to_cp((uint8_t)s[i])));
        KILN_TRY(tok_spans_put(oal, al[i], out->n - at));
    }
    return KILN_OK;
}

static kiln_status split_piece(const tok_pretok *p, const char *s, const tok_span *al, size_t n,
                               bool origin, tok_pieces *out, tok_buf *scratch, tok_spans *sal,
                               segs *sg) {
    sg->n = 0;
    switch (p->type) {
    case P_SPLIT:
        KILN_TRY(segs_from_pattern(&p->pattern, s, n, sg));
        return emit(out, s, al, sg, p->behavior, p->invert, origin);
    case P_PUNCT:
        KILN_TRY(segs_from_pred(pred_punct, p, s, n, sg));
        return emit(out, s, al, sg, p->behavior, false, origin);
    case P_DIGITS:
        KILN_TRY(segs_from_pred(pred_digit, p, s, n, sg));
        return emit(out, s, al, sg, p->individual_digits ? B_ISOLATED : B_CONTIGUOUS, false,
                    origin);
    case P_WSSPLIT:
        KILN_TRY(segs_from_pred(pred_ws, p, s, n, sg));
        return emit(out, s, al, sg, B_REMOVED, false, origin);
    case P_CHARDELIM:
        KILN_TRY(segs_from_pred(pred_delim, p, s, n, sg));
        return emit(out, s, al, sg, B_REMOVED, false, origin);
    case P_WHITESPACE:
        KILN_TRY(segs_from_pattern(&p->pattern, s, n, sg));
        return emit(out, s, al, sg, B_REMOVED, true, origin);
    case P_BERT: {
        tok_pieces tmp = {0};
        kiln_status st = segs_from_pred(pred_ws, p, s, n, sg);
        if (st == KILN_OK) st = emit(&tmp, s, al, sg, B_REMOVED, false, origin);
        for (size_t i = 0; i < tmp.n && st == KILN_OK; i++) {
            sg->n = 0;
            const char *t = tmp.text.p + tmp.v[i].off;
            st = segs_from_pred(pred_punct, p, t, tmp.v[i].len, sg);
            if (st == KILN_OK)
                st = emit(out, t, tmp.al.v + tmp.v[i].off, sg, B_ISOLATED, false, tmp.v[i].origin);
        }
        tok_pieces_free(&tmp);
        return st;
    }
    case P_BYTELEVEL: {
        scratch->n = 0;
        sal->n = 0;
        if (p->add_prefix_space && (n == 0 || s[0] != ' ')) {
            /* HF prepend: the space takes the span of the first char */
            KILN_TRY(tok_buf_putc(scratch, ' '));
            KILN_TRY(tok_spans_put(sal, n ? al[0] : (tok_span){0, 0}, 1));
        }
        KILN_TRY(tok_buf_put(scratch, s, n));
        KILN_TRY(tok_spans_append(sal, al, n));
        const char *t = scratch->p;
        const tok_span *tal = sal->v;
        size_t tn = scratch->n;
        if (p->use_regex) {
            KILN_TRY(segs_from_pattern(&p->pattern, t, tn, sg));
        } else {
            KILN_TRY(segs_push(sg, 0, tn, false));
        }
        tok_buf mapped = {0};
        tok_spans mal = {0};
        kiln_status st = KILN_OK;
        for (size_t i = 0; i < sg->n && st == KILN_OK; i++) {
            seg e = sg->v[i];
            if (e.a == e.b) continue;
            mapped.n = 0;
            mal.n = 0;
            st = bytelevel_map(t + e.a, tal + e.a, e.b - e.a, &mapped, &mal);
            if (st == KILN_OK)
                st = tok_pieces_push(out, mapped.p, mapped.n, mal.v, -1, origin && e.a == 0);
        }
        tok_buf_free(&mapped);
        tok_spans_free(&mal);
        return st;
    }
    case P_METASPACE: {
        scratch->n = 0;
        /* prepend when the piece does not already start with the replacement */
        bool starts = false;
        if (n >= 1) {
            int32_t cp;
            size_t k = tok_utf8_decode(s, n, &cp);
            starts = (k && cp == p->replacement) || (s[0] == ' ');
        }
        sal->n = 0;
        /* the prepended replacement takes the span of the first char, a replaced space its own */
        if (!starts && n &&
            (p->scheme == PREPEND_ALWAYS || (p->scheme == PREPEND_FIRST && origin))) {
            KILN_TRY(tok_buf_put(scratch, p->rep_utf8, p->rep_len));
            KILN_TRY(tok_spans_put(sal, al[0], p->rep_len));
        }
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') {
                KILN_TRY(tok_buf_put(scratch, p->rep_utf8, p->rep_len));
                KILN_TRY(tok_spans_put(sal, al[i], p->rep_len));
            } else {
                KILN_TRY(tok_buf_putc(scratch, s[i]));
                KILN_TRY(tok_spans_put(sal, al[i], 1));
            }
        }
        if (!p->split) {
            if (scratch->n == 0) return KILN_OK;
            return tok_pieces_push(out, scratch->p, scratch->n, sal->v, -1, origin);
        }
        KILN_TRY(segs_from_pred(pred_rep, p, scratch->p, scratch->n, sg));
        return emit(out, scratch->p, sal->v, sg, B_MERGED_NEXT, false, origin);
    }
    case P_SEQ:
        break;
    }
    return kiln_error(KILN_ERR_INTERNAL, "tokenizer: bad pre-tokenizer");
}
