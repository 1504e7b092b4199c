/* sse.c — Server-Sent Events framing (see sse.h). */
#include "server/sse.h"

#include <stdlib.h>

void sse_json(strbuf *out, const char *event, cJSON *json) {
    char *text = cJSON_PrintUnformatted(json);
    cJSON_Delete(json);
    if (!text) return;
    if (event) sb_printf(out, "event: %s\n", event);
    sb_puts(out, "data: ");
    sb_puts(out, text);
    sb_puts(out, "\n\n");
    free(text);
}

void sse_error(strbuf *out, const char *type, const char *message) {
    cJSON *j = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    sse_json(out, NULL, j);
}

void sse_done(strbuf *out) {
    sb_puts(out, "data: [DONE]\n\n");
}
