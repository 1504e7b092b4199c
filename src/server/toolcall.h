/* toolcall.h — parsing a model's native tool-call text into structured calls: Qwen/Hermes
 * `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (one or more) and Llama 3 bare JSON
 * `{"name": ..., "parameters": {...}}` (an object, an array, or objects separated by ';'). */
#ifndef KILN_SERVER_TOOLCALL_H
#define KILN_SERVER_TOOLCALL_H

#include <cjson/cJSON.h>

/* Returns a cJSON array of {"name": string, "arguments": string (JSON text)}, or NULL when text
 * holds no well-formed call (the caller then treats it as ordinary content). */
cJSON *toolcall_parse(const char *text);

/* Fills buf with a fresh call id ("call_" + 24 hex digits); prefix e.g. "call_" or "toolu_". */
void toolcall_new_id(char *buf, size_t size, const char *prefix);

#endif
