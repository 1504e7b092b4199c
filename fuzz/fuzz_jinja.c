/* fuzz_jinja.c — libFuzzer target for the chat-template interpreter: the input is a template
 * source, rendered over a fixed conversation (system/user/assistant with a tool call, a tool
 * result), tools and kwargs. Any outcome but a crash, hang or leak is fine. */
#include "tokenizer/chat_template.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *MESSAGES =
    "[{\"role\":\"system\",\"content\":\"You are terse.\"},"
    "{\"role\":\"user\",\"content\":\"Hi <think>x</think> \\u00e9\"},"
    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"type\":\"function\","
    "\"function\":{\"name\":\"get\",\"arguments\":{\"city\":\"Paris\"}}}]},"
    "{\"role\":\"tool\",\"content\":\"{\\\"t\\\": 21}\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image\"}]}]";
static const char *TOOLS = "[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{"
                           "\"type\":\"object\"}}}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 8192) return 0;
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = 0;
    char *out = NULL;
    kiln_chat_template_render(src, MESSAGES, (size & 1) ? TOOLS : NULL, (size & 2) != 0, "<s>",
                              "</s>", "{\"enable_thinking\": false, \"n\": 3}", &out);
    free(out);
    free(src);
    return 0;
}
