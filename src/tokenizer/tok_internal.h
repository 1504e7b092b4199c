/* tok_internal.h — the tokenizer's internal model: the pipeline pieces parsed from a Hugging Face
 * tokenizer.json (normalizer -> added-token split -> pre-tokenizer -> BPE -> post-processor, and
 * the decoder chain), plus the small string/hash/UTF-8 helpers they share. Only files under
 * src/tokenizer/ (and tests/fuzzers) include it. */
#ifndef KILN_TOKENIZER_INTERNAL_H
#define KILN_TOKENIZER_INTERNAL_H

#include "kiln.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* ---- growable byte buffer and id list ------------------------------------------------------ */
typedef struct tok_buf {
    char *p;
    size_t n, cap;
} tok_buf;

kiln_status tok_buf_reserve(tok_buf *b, size_t extra);
kiln_status tok_buf_put(tok_buf *b, const void *s, size_t n);
kiln_status tok_buf_putc(tok_buf *b, char c);
kiln_status tok_buf_put_cp(tok_buf *b, int32_t cp); /* UTF-8 encode one code point */
void tok_buf_free(tok_buf *b);
/* Detaches the contents as a malloc'd NUL-terminated string (never NULL on KILN_OK). */
kiln_status tok_buf_take(tok_buf *b, char **out);

typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;
kiln_status tok_ids_push(tok_ids *a, int32_t id);
void tok_ids_free(tok_ids *a);

/* Alignment of one byte of a transformed string: the [a, b) byte range of the original input it
 * comes from (HF NormalizedString alignments; every byte of a char carries the same span). */
typedef struct tok_span {
    uint32_t a, b;
} tok_span;
typedef struct tok_spans {
    tok_span *v;
    size_t n, cap;
} tok_spans;
kiln_status tok_spans_put(tok_spans *s, tok_span sp, size_t count); /* count copies of sp */
kiln_status tok_spans_append(tok_spans *s, const tok_span *v, size_t n);
void tok_spans_free(tok_spans *s);

/* ---- hashing ------------------------------------------------------------------------------- */
uint64_t tok_hash_bytes(const void *p, size_t n);

/* String -> int32 map over borrowed keys (open addressing). */
typedef struct tok_strmap {
    const char **keys;
    uint32_t *klen;
    int32_t *vals;
    size_t cap, n;
} tok_strmap;
kiln_status tok_strmap_init(tok_strmap *m, size_t expected);
/* Inserts or overwrites; key memory must outlive the map. */
kiln_status tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val);
int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len); /* -1 if absent */
void tok_strmap_free(tok_strmap *m);

/* u64 -> u64 map (merge pairs, trie edges). Key UINT64_MAX is reserved. */
typedef struct tok_u64map {
    uint64_t *keys;
    uint64_t *vals;
    size_t cap, n;
} tok_u64map;
kiln_status tok_u64map_init(tok_u64map *m, size_t expected);
kiln_status tok_u64map_put(tok_u64map *m, uint64_t key, uint64_t val);
bool tok_u64map_get(const tok_u64map *m, uint64_t key, uint64_t *val);
void tok_u64map_free(tok_u64map *m);

/* ---- UTF-8 and Unicode ---------------------------------------------------------------------- */
/* Decodes one code point at s[0..n); returns its byte length, or 0 if invalid/truncated. */
size_t tok_utf8_decode(const char *s, size_t n, int32_t *cp);
/* Byte offset of the first invalid sequence, or n if s is valid UTF-8. */
size_t tok_utf8_validate(const char *s, size_t n);
/* Appends s as UTF-8, replacing each maximal invalid subpart with U+FFFD (Rust from_utf8_lossy). */
kiln_status tok_utf8_lossy(tok_buf *out, const char *s, size_t n);
bool tok_is_whitespace(int32_t cp);  /* Unicode White_Space (Rust char::is_whitespace) */
bool tok_is_punctuation(int32_t cp); /* general category P* or ASCII punctuation */
bool tok_is_numeric(int32_t cp);     /* general category N* (Rust char::is_numeric) */
bool tok_is_alnum(int32_t cp);       /* letters, marks of letters, numbers */

/* GPT-2 byte <-> printable code point table of the ByteLevel components. */
int32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(int32_t cp); /* -1 if cp is not in the table */

/* ---- pieces: the pre-tokenized string ------------------------------------------------------- */
typedef struct tok_piece {
    size_t off, len; /* bytes in the owning tok_pieces.text */
    int32_t id;      /* >= 0: already a token (added token); the model skips it */
    bool origin;     /* starts at offset 0 of the original input (Metaspace prepend "first") */
} tok_piece;

typedef struct tok_pieces {
    tok_buf text;
    tok_spans al; /* al.v[i]: original span of text.p[i] */
    tok_piece *v;
    size_t n, cap;
} tok_pieces;
/* al: the original spans of s[0..len) */
kiln_status tok_pieces_push(tok_pieces *ps, const char *s, size_t len, const tok_span *al,
                            int32_t id, bool origin);
void tok_pieces_reset(tok_pieces *ps);
void tok_pieces_free(tok_pieces *ps);

/* ---- patterns (Split / Replace): a literal string or a PCRE2 regex -------------------------- */
typedef struct tok_pattern {
    char *literal; /* non-NULL: literal pattern */
    size_t literal_len;
    pcre2_code *re; /* non-NULL: regex (UTF + UCP, JIT when available) */
} tok_pattern;
/* Parses {"String": "..."} or {"Regex": "..."}; what names the owner in messages. */
kiln_status tok_pattern_parse(const cJSON *j, const char *what, tok_pattern *out);
void tok_pattern_free(tok_pattern *p);
/* Non-overlapping matches in s[0..n) as [start, end) pairs (malloc'd, 2*count entries). */
kiln_status tok_pattern_find(const tok_pattern *p, const char *s, size_t n, size_t **spans,
                             size_t *count);

/* ---- normalizers ---------------------------------------------------------------------------- */
typedef struct tok_normalizer tok_normalizer;
kiln_status tok_normalizer_parse(const cJSON *j, tok_normalizer **out);
void tok_normalizer_free(tok_normalizer *n);
/* Appends the normalized form of s[0..n) to out and the original span of each of its bytes to
 * out_al (al: the spans of s), as HF's NormalizedString transforms track them. */
kiln_status tok_normalize(const tok_normalizer *n, const char *s, size_t len, const tok_span *al,
                          tok_buf *out, tok_spans *out_al);

/* ---- pre-tokenizers ------------------------------------------------------------------------- */
typedef struct tok_pretok tok_pretok;
kiln_status tok_pretok_parse(const cJSON *j, tok_pretok **out);
void tok_pretok_free(tok_pretok *p);
/* Splits every non-token piece of *ps further (pieces with id >= 0 pass through). */
kiln_status tok_pretok_apply(const tok_pretok *p, tok_pieces *ps);

/* ---- the BPE model -------------------------------------------------------------------------- */
typedef struct tok_bpe tok_bpe;
kiln_status tok_bpe_parse(const cJSON *model, tok_bpe **out);
void tok_bpe_free(tok_bpe *m);
/* lens (may be NULL) gets the byte length within word of each token appended to out. */
kiln_status tok_bpe_encode(const tok_bpe *m, const char *word, size_t len, tok_ids *out,
                           tok_ids *lens);
int32_t tok_bpe_token_id(const tok_bpe *m, const char *s, size_t len);      /* -1 if absent */
const char *tok_bpe_id_to_token(const tok_bpe *m, int32_t id, size_t *len); /* NULL if absent */
int32_t tok_bpe_max_id(const tok_bpe *m);

/* ---- post-processors ------------------------------------------------------------------------ */
typedef struct tok_post tok_post;
/* tok resolves token names of templates; may be NULL when the processor has explicit ids. */
kiln_status tok_post_parse(const cJSON *j, tok_post **out);
void tok_post_free(tok_post *p);
/* Writes the ids of a single sequence with special tokens added (add_special_tokens=true). */
kiln_status tok_post_apply(const tok_post *p, const tok_ids *in, tok_ids *out);
/* True when a ByteLevel processor in p trims offsets; *add_prefix_space gets its setting. */
bool tok_post_trims_offsets(const tok_post *p, bool *add_prefix_space);

/* ---- decoders ------------------------------------------------------------------------------- */
typedef struct tok_decoder tok_decoder;
kiln_status tok_decoder_parse(const cJSON *j, tok_decoder **out);
void tok_decoder_free(tok_decoder *d);
/* Decodes token strings (tokens[i] of lens[i] bytes) into out, as HF Decoder::decode does. */
kiln_status tok_decode_tokens(const tok_decoder *d, const char **tokens, const size_t *lens,
                              size_t n, tok_buf *out);

/* ---- added tokens --------------------------------------------------------------------------- */
typedef struct tok_added {
    char *content;
    size_t len;
    int32_t id;
    bool special, lstrip, rstrip, normalized, single_word;
} tok_added;

/* Byte trie over added-token contents for leftmost-longest matching. */
typedef struct tok_trie {
    tok_u64map edges;  /* (node << 8 | byte) -> child node */
    int32_t *terminal; /* node -> index into added tokens, or -1 */
    size_t n_nodes, cap_nodes;
} tok_trie;

/* ---- the tokenizer -------------------------------------------------------------------------- */
struct kiln_tokenizer {
    tok_normalizer *normalizer; /* NULL = none */
    tok_pretok *pretok;         /* NULL = none */
    tok_bpe *model;
    tok_post *post;       /* NULL = none */
    tok_decoder *decoder; /* NULL = none: tokens joined with " " */

    tok_added *added;
    size_t n_added;
    tok_u64map added_by_id; /* id -> index into added */
    tok_strmap added_by_content;
    tok_trie trie_raw;  /* added tokens with normalized=false: matched on the raw text */
    tok_trie trie_norm; /* normalized=true: matched on the normalized text */
    int32_t vocab_size;

    /* from tokenizer_config.json / chat_template.jinja */
    char *chat_template; /* NULL if none */
    char *bos_token, *eos_token;
};

/* Builds a tokenizer from a tokenizer.json held in memory (config_json may be NULL). */
kiln_status kiln_tokenizer_load_json(const char *json, size_t len, const char *config_json,
                                     size_t config_len, kiln_tokenizer **out);

/* Token string of an id (added tokens first, then the model); NULL if the id has none. */
const char *tok_id_to_token(const kiln_tokenizer *tok, int32_t id, size_t *len);
bool tok_is_special_id(const kiln_tokenizer *tok, int32_t id);

#endif
