/* cmd_logits.c — `kiln logits`: float32 logits [T, vocab] of the given ids, row-major,
 * little-endian. --stepwise feeds the ids one at a time through the KV cache instead of one
 * full forward (both must give the same numbers). */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: kiln logits --model DIR --ids 1,2,3 --out FILE [--stepwise]\n\n"
               "  --ids LIST     token ids\n"
               "  --out FILE     where to write float32 logits [T, vocab] (little-endian)\n"
               "  --stepwise     decode token by token through the cache\n\n");
    cli_model_opts_help(f);
}

int cmd_logits(int argc, char **argv) {
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    const char *ids_text = NULL, *out_path = NULL;
    bool stepwise = false;
    for (int i = 1; i < argc; i++) {
        int r = cli_model_opts_parse(&mo, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (cli_is_help(argv[i])) {
            help(stdout);
            return 0;
        } else if (strcmp(argv[i], "--ids") == 0) {
            if (!(ids_text = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(argv[i], "--out") == 0 || strcmp(argv[i], "-o") == 0) {
            if (!(out_path = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(argv[i], "--stepwise") == 0) {
            stepwise = true;
        } else {
            return cli_error("logits: unknown option '%s' (see kiln logits --help)", argv[i]);
        }
    }
    if (!ids_text || !out_path) return cli_error("logits: --ids and --out are required");
    int32_t *ids;
    int n;
    if (!cli_parse_ids(ids_text, &ids, &n)) return 2;
    kiln_model *model = cli_load_model(&mo);
    if (!model) return free(ids), 1;
    int V = kiln_model_get_info(model)->vocab_size;
    int rc = 1;
    kiln_seq *seq = NULL;
    float *logits = malloc((size_t)n * (size_t)V * sizeof(float));
    kiln_status st = logits ? kiln_seq_new(model, &seq) : KILN_ERR_OOM;
    if (st == KILN_OK) {
        if (stepwise) {
            for (int t = 0; t < n && st == KILN_OK; t++) {
                kiln_batch_entry e = {seq, ids + t, 1, KILN_LOGITS_LAST, logits + (size_t)t * V};
                st = kiln_forward(model, &e, 1);
            }
        } else {
            kiln_batch_entry e = {seq, ids, n, KILN_LOGITS_ALL, logits};
            st = kiln_forward(model, &e, 1);
        }
    }
    if (st != KILN_OK) {
        cli_fail_status(st, "forward");
    } else {
        FILE *f = fopen(out_path, "wb");
        if (!f || fwrite(logits, sizeof(float), (size_t)n * V, f) != (size_t)n * V) {
            cli_error("cannot write %s", out_path);
        } else {
            rc = 0;
        }
        if (f && fclose(f) != 0) rc = cli_error("cannot write %s", out_path) ? 1 : 1;
        if (rc == 0) fprintf(stderr, "kiln: wrote logits [%d, %d] to %s\n", n, V, out_path);
    }
    kiln_seq_free(seq);
    free(logits);
    free(ids);
    kiln_model_free(model);
    return rc;
}
