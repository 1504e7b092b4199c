/* fuzz_tokenizer_json.c — fuzzes the tokenizer.json loader: the input bytes are a tokenizer.json;
 * when it loads, a fixed string is encoded (with and without special tokens), decoded and
 * streamed back. Any input must give a clean status, never a crash, leak or hang. */
#include "kiln.h"
#include "tokenizer/tok_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char TEXT[] = "Hello, world!  It's 2024: naïve café 日本語 <|im_start|>user\n\t"
                           "x = [1, 2]  # ok\r\n😀👨\u200d👩 <bos> ab aab\xe2\x96\x81z";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_tokenizer *tok = NULL;
    if (kiln_tokenizer_load_json((const char *)data, size, NULL, 0, &tok) != KILN_OK) return 0;
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        int n = 0;
        if (kiln_tokenize(tok, TEXT, sizeof TEXT - 1, special, &ids, &n) != KILN_OK) continue;
        char *text = NULL;
        if (kiln_detokenize(tok, ids, n, special, &text) == KILN_OK) free(text);
        kiln_detok_stream *s = NULL;
        if (kiln_detok_stream_new(tok, special, &s) == KILN_OK) {
            for (int i = 0; i < n; i++) {
                char *t = NULL;
                if (kiln_detok_stream_push(s, ids[i], &t) != KILN_OK) break;
                free(t);
            }
            char *t = NULL;
            if (kiln_detok_stream_flush(s, &t) == KILN_OK) free(t);
            kiln_detok_stream_free(s);
        }
        free(ids);
    }
    kiln_tokenizer_free(tok);
    return 0;
}
