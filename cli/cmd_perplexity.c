/* cmd_perplexity.c — `kiln perplexity`: mean negative log-likelihood (nats/token) over windows
 * of N int32 ids; in each window tokens 1..N-1 are predicted from the ones before. Several
 * windows run as one batch (one sequence each). Last line: `nll <mean>`. */
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void help(FILE *f) {
    fprintf(f, "usage: kiln perplexity --model DIR --ids-file FILE.i32 --window N [--batch B] "
               "[--max-windows K]\n\n"
               "  --ids-file FILE   consecutive windows of N int32 little-endian token ids\n"
               "  --window N        tokens per window\n"
               "  --batch B         windows per forward pass (default 2)\n"
               "  --max-windows K   only the first K windows\n\n");
    cli_model_opts_help(f);
}

/* -log softmax(row)[target], computed in double. */
static double token_nll(const float *row, int V, int target) {
    double mx = row[0];
    for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)row[i] - mx);
    return -((double)row[target] - mx - log(sum));
}

int cmd_perplexity(int argc, char **argv) {
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    const char *path = NULL;
    long long window = 0, batch = 2, max_windows = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_model_opts_parse(&mo, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i], *v;
        if (cli_is_help(a)) {
            help(stdout);
            return 0;
        } else if (strcmp(a, "--ids-file") == 0) {
            if (!(path = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(a, "--window") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(v, 2, 1 << 20, &window))
                return cli_error("--window: need an integer >= 2");
        } else if (strcmp(a, "--batch") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(v, 1, 256, &batch))
                return cli_error("--batch: need an integer in 1..256");
        } else if (strcmp(a, "--max-windows") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(v, 1, 1 << 30, &max_windows))
                return cli_error("--max-windows: need a positive integer");
        } else {
            return cli_error("perplexity: unknown option '%s' (see kiln perplexity --help)", a);
        }
    }
    if (!path || !window) return cli_error("perplexity: --ids-file and --window are required");
    FILE *f = fopen(path, "rb");
    if (!f) return cli_error("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (size <= 0 || size % (long)(4 * window) != 0) {
        fclose(f);
        return cli_error("%s: %ld bytes is not a whole number of %lld-token int32 windows", path,
                         size, window);
    }
    long n_windows = size / (4 * window);
    if (max_windows && n_windows > max_windows) n_windows = max_windows;
    int32_t *ids = malloc((size_t)(n_windows * window) * sizeof *ids);
    if (!ids || fread(ids, 4, (size_t)(n_windows * window), f) != (size_t)(n_windows * window)) {
        fclose(f);
        free(ids);
        return cli_error("cannot read %s", path);
    }
    fclose(f);
    kiln_model *model = cli_load_model(&mo);
    if (!model) return free(ids), 1;
    int V = kiln_model_get_info(model)->vocab_size;
    for (long i = 0; i < n_windows * window; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            cli_error("%s: id %d at index %ld is outside the vocabulary [0, %d)", path, ids[i], i,
                      V);
            kiln_model_free(model);
            free(ids);
            return 2;
        }
    int B = (int)batch;
    float *logits = malloc((size_t)B * (size_t)window * (size_t)V * sizeof(float));
    kiln_seq **seqs = calloc((size_t)B, sizeof *seqs);
    kiln_batch_entry *e = calloc((size_t)B, sizeof *e);
    int rc = 1;
    double total = 0;
    long count = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!logits || !seqs || !e) goto done;
    for (long w0 = 0; w0 < n_windows; w0 += B) {
        int nb = (int)(n_windows - w0 < B ? n_windows - w0 : B);
        for (int b = 0; b < nb; b++) {
            kiln_status st =
                seqs[b] ? kiln_seq_truncate(seqs[b], 0) : kiln_seq_new(model, &seqs[b]);
            if (st != KILN_OK) {
                cli_fail_status(st, "perplexity");
                goto done;
            }
            e[b] = (kiln_batch_entry){seqs[b], ids + (w0 + b) * window, (int)window,
                                      KILN_LOGITS_ALL, logits + (size_t)b * window * V};
        }
        kiln_status st = kiln_forward(model, e, nb);
        if (st != KILN_OK) {
            cli_fail_status(st, "forward");
            goto done;
        }
        for (int b = 0; b < nb; b++) {
            double wsum = 0;
            const int32_t *w = ids + (w0 + b) * window;
            for (long t = 0; t + 1 < window; t++)
                wsum += token_nll(logits + ((size_t)b * window + t) * V, V, w[t + 1]);
            total += wsum;
            count += window - 1;
            fprintf(stderr, "window %ld/%ld: nll %.5f\n", w0 + b + 1, n_windows,
                    wsum / (window - 1));
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    fprintf(stderr, "kiln: %ld tokens in %.2f s (%.0f tok/s), perplexity %.4f\n", count, secs,
            n_windows * window / secs, exp(total / count));
    printf("nll %.6f\n", total / count);
    rc = 0;
done:
    if (seqs)
        for (int b = 0; b < B; b++) kiln_seq_free(seqs[b]);
    free(seqs);
    free(e);
    free(logits);
    free(ids);
    kiln_model_free(model);
    return rc;
}
