/* toolcall.c — native tool-call text -> structured calls (see toolcall.h). */
#include "server/toolcall.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static cJSON *call_from_object(const cJSON *o) {
    if (!cJSON_IsObject(o)) return NULL;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!cJSON_IsString(name) || !name->valuestring[0]) return NULL;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    char *args_text = NULL;
    if (!args)
        args_text = strdup("{}");
    else if (cJSON_IsString(args))
        args_text = strdup(args->valuestring);
    else
        args_text = cJSON_PrintUnformatted(args);
    if (!args_text) return NULL;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "name", name->valuestring);
    cJSON_AddStringToObject(c, "arguments", args_text);
    free(args_text);
    return c;
}

static bool add_json_calls(cJSON *out, const char *json, size_t len) {
    char *s = strndup(json, len);
    if (!s) return false;
    cJSON *v = cJSON_ParseWithOpts(s, NULL, true); /* no trailing text */
    free(s);
    if (!v) return false;
    bool ok = true;
    if (cJSON_IsArray(v)) {
        const cJSON *it;
        int n = 0;
        cJSON_ArrayForEach(it, v) {
            cJSON *c = call_from_object(it);
            if (!c) {
                ok = false;
                break;
            }
            cJSON_AddItemToArray(out, c);
            n++;
        }
        ok = ok && n > 0;
    } else {
        cJSON *c = call_from_object(v);
        if (c)
            cJSON_AddItemToArray(out, c);
        else
            ok = false;
    }
    cJSON_Delete(v);
    return ok;
}

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
    return p;
}

cJSON *toolcall_parse(const char *text) {
    if (!text) return NULL;
    cJSON *out = cJSON_CreateArray();
    const char *p = skip_ws(text);
    bool ok = true;
    if (strncmp(p, "<tool_call>", 11) == 0) {
        while (ok && strncmp(p, "<tool_call>", 11) == 0) {
            p += 11;
            const char *end = strstr(p, "</tool_call>");
            size_t len = end ? (size_t)(end - p) : strlen(p);
            ok = add_json_calls(out, p, len);
            p = end ? skip_ws(end + 12) : p + len;
        }
        ok = ok && *p == '\0';
    } else if (*p == '{' || *p == '[') {
        /* Llama 3: one JSON value, or several objects separated by ';' */
        ok = add_json_calls(out, p, strlen(p));
        if (!ok) {
            cJSON_Delete(out);
            out = cJSON_CreateArray();
            ok = true;
            char *copy = strdup(p), *save = NULL;
            int n = 0;
            for (char *tok = strtok_r(copy, ";", &save); tok && ok;
                 tok = strtok_r(NULL, ";", &save)) {
                const char *q = skip_ws(tok);
                if (*q) ok = add_json_calls(out, q, strlen(q)), n++;
            }
            ok = ok && n > 1;
            free(copy);
        }
    } else {
        ok = false;
    }
    if (!ok || cJSON_GetArraySize(out) == 0) {
        cJSON_Delete(out);
        return NULL;
    }
    return out;
}

void toolcall_new_id(char *buf, size_t size, const char *prefix) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t state;
    pthread_mutex_lock(&mu);
    if (!state) state = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull | 1;
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    uint64_t a = state;
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    uint64_t b = state;
    pthread_mutex_unlock(&mu);
    snprintf(buf, size, "%s%016llx%08llx", prefix, (unsigned long long)a,
             (unsigned long long)(b & 0xffffffffu));
}
