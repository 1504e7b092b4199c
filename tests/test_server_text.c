/* test_server_text.c — the server's text pipeline without a model: stop strings with streaming
 * hold-back (fed byte by byte and whole), the <think> split, tool-call withholding and parsing
 * (Qwen/Hermes <tool_call> and Llama 3 JSON), and the UTF-8 validator. Built only with the server.
 */
#include "test_util.h"

#ifdef KILN_HAVE_SERVER
#include "server/server_internal.h"
#include "server/textstream.h"
#include "server/toolcall.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    strbuf content, reasoning;
    bool stopped;
} run_out;

/* Feeds text in pieces of `step` bytes (0 = all at once); checks nothing is released that a later
 * stop match would have to take back. */
static run_out run(const char *text, size_t step, const char *const *stops, int n_stops, bool think,
                   bool tools, textstream *t) {
    run_out o = {0};
    ts_init(t, stops, n_stops, think, false, tools);
    size_t n = strlen(text);
    if (step == 0) step = n ? n : 1;
    for (size_t i = 0; i < n && !o.stopped; i += step)
        o.stopped = ts_push(t, text + i, i + step > n ? n - i : step, &o.content, &o.reasoning);
    ts_finish(t, &o.content, &o.reasoning);
    return o;
}

static const char *s_or(const strbuf *b) {
    return b->data ? b->data : "";
}

static void check_case(const char *text, const char *const *stops, int n_stops, bool think,
                       bool tools, const char *want_content, const char *want_reasoning,
                       bool want_stop, const char *want_tool_text) {
    for (size_t step = 0; step <= 3; step++) {
        textstream t;
        run_out o = run(text, step, stops, n_stops, think, tools, &t);
        CHECK_MSG(strcmp(s_or(&o.content), want_content) == 0, "step %zu: content '%s' want '%s'",
                  step, s_or(&o.content), want_content);
        CHECK_MSG(strcmp(s_or(&o.reasoning), want_reasoning) == 0,
                  "step %zu: reasoning '%s' want '%s'", step, s_or(&o.reasoning), want_reasoning);
        CHECK_MSG(o.stopped == want_stop, "step %zu: stopped %d", step, o.stopped);
        CHECK_MSG(strcmp(s_or(&t.tool_text), want_tool_text) == 0,
                  "step %zu: tool text '%s' want '%s'", step, s_or(&t.tool_text), want_tool_text);
        sb_free(&o.content);
        sb_free(&o.reasoning);
        ts_free(&t);
    }
}

static void test_hold_back(void) {
    /* While "ab" could still become the stop "abc", it must not be released. */
    const char *stops[] = {"abc"};
    textstream t;
    strbuf c = {0}, r = {0};
    ts_init(&t, stops, 1, false, false, false);
    CHECK(!ts_push(&t, "xxab", 4, &c, &r));
    CHECK(strcmp(s_or(&c), "xx") == 0);
    CHECK(!ts_push(&t, "d", 1, &c, &r));
    CHECK(strcmp(s_or(&c), "xxabd") == 0);
    CHECK(!ts_push(&t, "a", 1, &c, &r));
    CHECK(strcmp(s_or(&c), "xxabd") == 0);
    CHECK(ts_push(&t, "bcZZ", 4, &c, &r));
    CHECK(t.matched_stop == 0);
    ts_finish(&t, &c, &r);
    CHECK(strcmp(s_or(&c), "xxabd") == 0);
    sb_free(&c), sb_free(&r), ts_free(&t);
}

static void test_toolcall_parse(void) {
    cJSON *a = toolcall_parse("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                              "\"Paris\"}}\n</tool_call>\n"
                              "<tool_call>{\"name\":\"now\",\"arguments\":{}}</tool_call>");
    CHECK(a && cJSON_GetArraySize(a) == 2);
    if (a && cJSON_GetArraySize(a) == 2) {
        CHECK(strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(a, 0), "name")->valuestring,
                     "get_weather") == 0);
        CHECK(strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(a, 0), "arguments")->valuestring,
                     "{\"city\":\"Paris\"}") == 0);
        CHECK(strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(a, 1), "name")->valuestring, "now") ==
              0);
    }
    cJSON_Delete(a);
    cJSON *l = toolcall_parse("{\"name\": \"search\", \"parameters\": {\"q\": \"kiln\"}}");
    CHECK(l && cJSON_GetArraySize(l) == 1 &&
          strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(l, 0), "arguments")->valuestring,
                 "{\"q\":\"kiln\"}") == 0);
    cJSON_Delete(l);
    cJSON *semi = toolcall_parse(
        "{\"name\":\"a\",\"parameters\":{}}; {\"name\":\"b\",\"parameters\":{\"x\":1}}");
    CHECK(semi && cJSON_GetArraySize(semi) == 2);
    cJSON_Delete(semi);
    CHECK(toolcall_parse("<tool_call>{not json}</tool_call>") == NULL);
    CHECK(toolcall_parse("{\"no_name\": 1}") == NULL);
    CHECK(toolcall_parse("plain text") == NULL);
    CHECK(toolcall_parse("<tool_call>{\"name\":\"a\"}</tool_call> trailing words") == NULL);
    char id[48];
    toolcall_new_id(id, sizeof id, "call_");
    CHECK(strncmp(id, "call_", 5) == 0 && strlen(id) == 5 + 24);
}

static void test_utf8(void) {
    CHECK(utf8_valid("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15));
    CHECK(!utf8_valid("\xff", 1));
    CHECK(!utf8_valid("\xc3", 1));             /* truncated */
    CHECK(!utf8_valid("\xc0\xaf", 2));         /* overlong */
    CHECK(!utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    CHECK(!utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    CHECK(utf8_valid("", 0));
}

int main(void) {
    const char *stops[] = {"STOP", "\n\n"};
    check_case("hello STOP world", stops, 2, false, false, "hello ", "", true, "");
    check_case("no stop here", stops, 2, false, false, "no stop here", "", false, "");
    check_case("line\n\nnext", stops, 2, false, false, "line", "", true, "");
    check_case("ends with ST", stops, 2, false, false, "ends with ST", "", false, "");
    check_case("<think>plan it</think>\n\nThe answer", NULL, 0, true, false, "The answer",
               "plan it", false, "");
    check_case("<think>a STOP b</think>c", stops, 2, true, false, "", "a ", true, "");
    check_case("Sure.<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>", NULL, 0, false,
               true, "Sure.", "", false,
               "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>");
    check_case("  {\"name\":\"f\",\"parameters\":{}}", NULL, 0, false, true, "  ", "", false,
               "{\"name\":\"f\",\"parameters\":{}}");
    check_case("a <tool_ca b", NULL, 0, false, true, "a <tool_ca b", "", false, "");
    check_case("<think>x</think><tool_call>{}</tool_call>", NULL, 0, true, true, "", "x", false,
               "<tool_call>{}</tool_call>");
    test_hold_back();
    test_toolcall_parse();
    test_utf8();
    return test_finish();
}
#else
int main(void) {
    fprintf(stderr, "built without the server: skipping\n");
    return 77;
}
#endif
