/* cmd_tokenize.c — `kiln tokenize`: prints the token ids of a text as a JSON array (last line);
 * with --offsets, a line of [start, end] char offsets (as HF tokenizers reports them) before it. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: kiln tokenize [--model DIR] [--special] [--offsets] --text TEXT\n\n"
               "Prints the token ids of TEXT as a JSON array on the last line.\n"
               "  --model DIR   model folder with tokenizer.json (default: the bundled model)\n"
               "  --special     add special tokens (the post-processor, e.g. BOS)\n"
               "  --offsets     first print each token's [start, end) span of TEXT as a JSON\n"
               "                array of pairs, in Unicode code points (Hugging Face's offsets;\n"
               "                added special tokens get [0, 0])\n"
               "  --text TEXT   the text (UTF-8); '-' reads it from stdin\n");
}

static char *read_stdin(size_t *len) {
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n - 1, stdin);
        n += r;
        if (r == 0) break;
        if (cap - n - 1 == 0) {
            char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *text = NULL;
    bool special = false, offsets = false;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            help(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--text")) {
            if (!(text = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--special")) {
            special = true;
        } else if (!strcmp(argv[i], "--offsets")) {
            offsets = true;
        } else {
            help(stderr);
            return cli_error("tokenize: unknown option '%s'", argv[i]);
        }
    }
    if (!text) {
        help(stderr);
        return cli_error("tokenize: --text is required");
    }
    kiln_tokenizer *tok = NULL;
    kiln_status st = kiln_tokenizer_load(dir ? dir : cli_default_model_dir(), &tok);
    if (st != KILN_OK) return cli_fail_status(st, "cannot load tokenizer");
    char *owned = NULL;
    size_t len = strlen(text);
    if (!strcmp(text, "-")) {
        if (!(owned = read_stdin(&len))) {
            kiln_tokenizer_free(tok);
            return cli_error("tokenize: cannot read stdin");
        }
        text = owned;
    }
    int32_t *ids = NULL;
    int32_t(*offs)[2] = NULL;
    int n = 0;
    if (offsets)
        st = kiln_tokenize_offsets(tok, text, len, special, &ids, &offs, &n);
    else
        st = kiln_tokenize(tok, text, len, special, &ids, &n);
    free(owned);
    kiln_tokenizer_free(tok);
    if (st != KILN_OK) return cli_fail_status(st, "cannot tokenize");
    if (offsets) {
        putchar('[');
        for (int i = 0; i < n; i++) printf(i ? ", [%d, %d]" : "[%d, %d]", offs[i][0], offs[i][1]);
        printf("]\n");
        free(offs);
    }
    putchar('[');
    for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    printf("]\n");
    free(ids);
    return 0;
}
