/* sse.h — Server-Sent Events framing: `event: name\ndata: {json}\n\n`, OpenAI's `data: [DONE]`. */
#ifndef KILN_SERVER_SSE_H
#define KILN_SERVER_SSE_H

#include "server/strbuf.h"

#include <cjson/cJSON.h>

/* Appends one event carrying json (freed); event NULL = data-only (OpenAI style). */
void sse_json(strbuf *out, const char *event, cJSON *json);
/* OpenAI-style in-stream error: data: {"error":{"message","type"}} */
void sse_error(strbuf *out, const char *type, const char *message);
void sse_done(strbuf *out);

#endif
