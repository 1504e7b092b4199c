/* textstream.c — stop strings, think split and tool-call withholding (see textstream.h). */
#include "server/textstream.h"

#include <stdlib.h>
#include <string.h>

void ts_init(textstream *t, const char *const *stops, int n_stops, bool think, bool start_in_think,
             bool tools) {
    memset(t, 0, sizeof *t);
    for (int i = 0; i < n_stops && t->n_stops < TS_MAX_STOPS; i++)
        if (stops[i] && stops[i][0]) t->stops[t->n_stops++] = strdup(stops[i]);
    t->think = think;
    t->in_think = think && start_in_think;
    t->tools = tools;
    t->matched_stop = -1;
}

void ts_free(textstream *t) {
    for (int i = 0; i < t->n_stops; i++) free(t->stops[i]);
    sb_free(&t->pending);
    sb_free(&t->tagbuf);
    sb_free(&t->tool_text);
    memset(t, 0, sizeof *t);
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t partial_suffix(const char *s, size_t n, const char *tag) {
    size_t tl = strlen(tag);
    size_t max = n < tl - 1 ? n : tl - 1;
    for (size_t k = max; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

static void emit_content(textstream *t, const char *s, size_t n, strbuf *content) {
    while (t->after_think && n > 0 && (*s == '\n' || *s == '\r')) s++, n--;
    if (n > 0) t->after_think = false;
    if (t->tool_mode) {
        sb_append(&t->tool_text, s, n);
        return;
    }
    if (t->tools && !t->saw_content) { /* Llama 3 style: the reply is a bare JSON object */
        size_t i = 0;
        while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
        if (i < n) {
            t->saw_content = true;
            if (s[i] == '{' || s[i] == '[') {
                t->tool_mode = true;
                sb_append(content, s, i);
                sb_append(&t->tool_text, s + i, n - i);
                return;
            }
        }
    }
    sb_append(content, s, n);
}

/* Routes text that passed the stop matcher through the think / tool-call tag machine. */
static void route(textstream *t, const char *s, size_t n, bool final, strbuf *content,
                  strbuf *reasoning) {
    sb_append(&t->tagbuf, s, n);
    for (;;) {
        const char *buf = t->tagbuf.data ? t->tagbuf.data : "";
        size_t len = t->tagbuf.len;
        if (len == 0) return;
        if (t->tool_mode) {
            emit_content(t, buf, len, content);
            sb_clear(&t->tagbuf);
            return;
        }
        const char *tag = NULL;
        if (t->think) tag = t->in_think ? "</think>" : "<think>";
        const char *tool_tag = t->tools && !(t->think && t->in_think) ? "<tool_call>" : NULL;
        const char *hit = tag ? strstr(buf, tag) : NULL;
        const char *thit = tool_tag ? strstr(buf, tool_tag) : NULL;
        if (thit && (!hit || thit < hit)) {
            emit_content(t, buf, (size_t)(thit - buf), content);
            t->tool_mode = true;
            sb_append(&t->tool_text, thit, len - (size_t)(thit - buf));
            sb_clear(&t->tagbuf);
            return;
        }
        if (hit) {
            size_t pre = (size_t)(hit - buf);
            if (t->in_think)
                sb_append(reasoning, buf, pre);
            else
                emit_content(t, buf, pre, content);
            t->in_think = !t->in_think;
            if (!t->in_think) t->after_think = true;
            sb_consume(&t->tagbuf, pre + strlen(tag));
            continue;
        }
        size_t hold = 0;
        if (!final) {
            if (tag) hold = partial_suffix(buf, len, tag);
            if (tool_tag) {
                size_t h2 = partial_suffix(buf, len, tool_tag);
                if (h2 > hold) hold = h2;
            }
        }
        if (t->in_think)
            sb_append(reasoning, buf, len - hold);
        else
            emit_content(t, buf, len - hold, content);
        sb_consume(&t->tagbuf, len - hold);
        return;
    }
}

bool ts_push(textstream *t, const char *text, size_t len, strbuf *content, strbuf *reasoning) {
    if (t->stopped) return true;
    sb_append(&t->pending, text, len);
    const char *buf = t->pending.data ? t->pending.data : "";
    size_t n = t->pending.len;
    /* earliest full stop match */
    const char *first = NULL;
    for (int i = 0; i < t->n_stops; i++) {
        const char *h = strstr(buf, t->stops[i]);
        if (h && (!first || h < first)) first = h, t->matched_stop = i;
    }
    if (first) {
        route(t, buf, (size_t)(first - buf), false, content, reasoning);
        sb_clear(&t->pending);
        t->stopped = true;
        return true;
    }
    size_t hold = 0;
    for (int i = 0; i < t->n_stops; i++) {
        size_t h = partial_suffix(buf, n, t->stops[i]);
        if (h > hold) hold = h;
    }
    route(t, buf, n - hold, false, content, reasoning);
    sb_consume(&t->pending, n - hold);
    return false;
}

void ts_finish(textstream *t, strbuf *content, strbuf *reasoning) {
    if (!t->stopped && t->pending.len)
        route(t, t->pending.data, t->pending.len, true, content, reasoning);
    else
        route(t, "", 0, true, content, reasoning);
    sb_clear(&t->pending);
}
