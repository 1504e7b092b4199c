/* detok_stream.c — the streaming detokenizer: ids arrive one at a time and only complete text
 * leaves. Pending ids are decoded behind a fixed context token (so decoders that treat the first
 * token specially, e.g. Metaspace dropping a leading space, behave as mid-text once something has
 * been emitted) and the text beyond the context's own decode is emitted once it no longer ends in
 * U+FFFD (an incomplete UTF-8 or byte-fallback sequence). Emitted ids are dropped, so the cost per
 * id stays constant. Flush emits whatever is held, invalid bytes rendered as U+FFFD. Chunks are
 * NUL-terminated, so a decoded U+0000 is dropped from them (kiln_detokenize_len keeps it). */
#include "tokenizer/tok_internal.h"

#include "util/status.h"

#include <stdlib.h>
#include <string.h>

struct kiln_detok_stream {
    const kiln_tokenizer *tok;
    bool skip_special;
    bool at_start;  /* nothing emitted yet: decode pending ids as the start of the text */
    int32_t ctx_id; /* a plain token decoded in front of pending ids (-1: none found) */
    char *ctx_text; /* its decode on its own */
    size_t ctx_len;
    tok_ids ids; /* [ctx_id] + pending ids */
};

static bool ends_with_replacement(const char *s, size_t n) {
    return n >= 3 && memcmp(s + n - 3, "\xef\xbf\xbd", 3) == 0;
}

/* A token that decodes to plain, complete text on its own: the context for pending ids. */
static bool usable_ctx(const kiln_tokenizer *tok, int32_t id, char **text) {
    *text = NULL;
    if (id < 0 || tok_is_special_id(tok, id)) return false;
    char *s = NULL;
    if (kiln_detokenize(tok, &id, 1, false, &s) != KILN_OK) return false;
    size_t n = strlen(s);
    if (n == 0 || ends_with_replacement(s, n) || memchr(s, 0xef, n)) {
        free(s);
        return false;
    }
    *text = s;
    return true;
}

static void pick_ctx(kiln_detok_stream *s) {
    static const char *candidates[] = {"a",
                                       "\xe2\x96\x81"
                                       "a",
                                       "\xc4\xa0"
                                       "a",
                                       "the",
                                       "e",
                                       "."};
    char *text = NULL;
    s->ctx_id = -1;
    for (size_t i = 0; i < sizeof candidates / sizeof *candidates; i++) {
        int32_t id = kiln_tokenizer_token_id(s->tok, candidates[i]);
        if (usable_ctx(s->tok, id, &text)) {
            s->ctx_id = id;
            break;
        }
    }
    for (int32_t id = 0; s->ctx_id < 0 && id < s->tok->vocab_size && id < 100000; id++)
        if (usable_ctx(s->tok, id, &text)) s->ctx_id = id;
    s->ctx_text = text;
    s->ctx_len = text ? strlen(text) : 0;
}

kiln_status kiln_detok_stream_new(const kiln_tokenizer *tok, bool skip_special,
                                  kiln_detok_stream **out) {
    if (!tok || !out)
        return kiln_error(KILN_ERR_INVALID_ARG, "kiln_detok_stream_new: NULL argument");
    *out = NULL;
    kiln_detok_stream *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    s->tok = tok;
    s->skip_special = skip_special;
    s->at_start = true;
    pick_ctx(s);
    *out = s;
    return KILN_OK;
}

void kiln_detok_stream_free(kiln_detok_stream *s) {
    if (!s) return;
    tok_ids_free(&s->ids);
    free(s->ctx_text);
    free(s);
}

/* Decodes the window; *skip is how many leading bytes belong to the context. */
static kiln_status decode_window(kiln_detok_stream *s, char **str, size_t *n, size_t *skip) {
    KILN_TRY(kiln_detokenize_len(s->tok, s->ids.v, (int)s->ids.n, s->skip_special, str, n));
    *skip = 0;
    if (!s->at_start && s->ctx_id >= 0) {
        if (*n >= s->ctx_len && memcmp(*str, s->ctx_text, s->ctx_len) == 0) *skip = s->ctx_len;
    }
    return KILN_OK;
}

/* Copies str[skip..n) out; U+0000 cannot travel in a NUL-terminated chunk, so it is dropped
 * (the rest of the text is kept). */
static kiln_status take(const char *str, size_t n, size_t skip, char **text) {
    *text = malloc(n - skip + 1);
    if (!*text) return kiln_error(KILN_ERR_OOM, "tokenizer: out of memory");
    size_t w = 0;
    for (size_t i = skip; i < n; i++)
        if (str[i]) (*text)[w++] = str[i];
    (*text)[w] = 0;
    return KILN_OK;
}

/* Forgets the pending ids after they were emitted. */
static kiln_status reset_window(kiln_detok_stream *s) {
    s->ids.n = 0;
    if (s->ctx_id >= 0 && !s->at_start) KILN_TRY(tok_ids_push(&s->ids, s->ctx_id));
    return KILN_OK;
}

kiln_status kiln_detok_stream_push(kiln_detok_stream *s, int32_t id, char **text) {
    if (!s || !text)
        return kiln_error(KILN_ERR_INVALID_ARG, "kiln_detok_stream_push: NULL argument");
    *text = NULL;
    if (id < 0 || id >= s->tok->vocab_size)
        return kiln_error(KILN_ERR_INVALID_ARG,
                          "kiln_detok_stream_push: token id %d is outside the vocabulary (size %d)",
                          id, s->tok->vocab_size);
    KILN_TRY(tok_ids_push(&s->ids, id));
    char *str;
    size_t n, skip;
    KILN_TRY(decode_window(s, &str, &n, &skip));
    kiln_status st;
    if (n <= skip || ends_with_replacement(str, n)) {
        st = take("", 0, 0, text); /* nothing complete yet: hold */
    } else {
        st = take(str, n, skip, text);
        if (st == KILN_OK) {
            s->at_start = false;
            st = reset_window(s);
        }
    }
    free(str);
    return st;
}

kiln_status kiln_detok_stream_flush(kiln_detok_stream *s, char **text) {
    if (!s || !text)
        return kiln_error(KILN_ERR_INVALID_ARG, "kiln_detok_stream_flush: NULL argument");
    *text = NULL;
    char *str;
    size_t n, skip;
    KILN_TRY(decode_window(s, &str, &n, &skip));
    kiln_status st = take(str, n, skip, text);
    free(str);
    if (st == KILN_OK) {
        if ((*text)[0]) s->at_start = false;
        st = reset_window(s);
    }
    return st;
}
