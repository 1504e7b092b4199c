/* cmd_detokenize.c — `kiln detokenize`: prints the text of comma-separated token ids. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: kiln detokenize [--model DIR] --ids 1,2,3 [--skip-special]\n\n"
               "Prints the decoded text of the ids (as Hugging Face tokenizers decode does).\n"
               "  --model DIR      model folder with tokenizer.json (default: the bundled model)\n"
               "  --ids LIST       comma-separated token ids\n"
               "  --skip-special   leave out special tokens\n");
}

int cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL, *list = NULL;
    bool skip = false;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            help(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--ids")) {
            if (!(list = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--skip-special")) {
            skip = true;
        } else {
            help(stderr);
            return cli_error("detokenize: unknown option '%s'", argv[i]);
        }
    }
    if (!list) {
        help(stderr);
        return cli_error("detokenize: --ids is required");
    }
    int32_t *ids = NULL;
    int n = 0;
    if (!cli_parse_ids(list, &ids, &n)) return 2;
    kiln_tokenizer *tok = NULL;
    kiln_status st = kiln_tokenizer_load(dir ? dir : cli_default_model_dir(), &tok);
    if (st != KILN_OK) {
        free(ids);
        return cli_fail_status(st, "cannot load tokenizer");
    }
    char *text = NULL;
    st = kiln_detokenize(tok, ids, n, skip, &text);
    free(ids);
    kiln_tokenizer_free(tok);
    if (st != KILN_OK) return cli_fail_status(st, "cannot detokenize");
    fputs(text, stdout);
    putchar('\n');
    free(text);
    return 0;
}
