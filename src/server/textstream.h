/* textstream.h — the generated-text pipeline shared by every endpoint: `stop` strings matched on
 * decoded text (the stop text excluded, a possible stop prefix held back while streaming), the
 * `<think>...</think>` split into reasoning, and withholding of tool-call markup (Qwen/Hermes
 * `<tool_call>{json}</tool_call>`, Llama 3 bare JSON) which toolcall.c parses at the end. */
#ifndef KILN_SERVER_TEXTSTREAM_H
#define KILN_SERVER_TEXTSTREAM_H

#include "server/strbuf.h"

#include <stdbool.h>

#define TS_MAX_STOPS 16

typedef struct textstream {
    char *stops[TS_MAX_STOPS];
    int n_stops;
    bool think;       /* split <think>...</think> into reasoning */
    bool in_think;    /* currently inside a think block */
    bool tools;       /* withhold tool-call markup */
    bool tool_mode;   /* all further content goes to tool_text */
    bool saw_content; /* a non-space content byte was emitted (Llama JSON detection) */
    bool stopped;     /* a stop string matched */
    bool after_think; /* drop newlines that follow </think> */
    int matched_stop; /* index into stops of the match, -1 if none */
    strbuf pending;   /* decoded text not yet past the stop matcher */
    strbuf tagbuf;    /* text past the stop matcher, held for a possible tag prefix */
    strbuf tool_text;
} textstream;

/* stops: up to TS_MAX_STOPS strings (copied). start_in_think: the prompt already opened <think>. */
void ts_init(textstream *t, const char *const *stops, int n_stops, bool think, bool start_in_think,
             bool tools);
void ts_free(textstream *t);
/* Feeds decoded text; appends newly releasable content / reasoning. Returns true once a stop
 * string matched (everything from it on is dropped; the caller should end generation). */
bool ts_push(textstream *t, const char *text, size_t len, strbuf *content, strbuf *reasoning);
/* Releases everything held back (end of generation). */
void ts_finish(textstream *t, strbuf *content, strbuf *reasoning);

#endif
