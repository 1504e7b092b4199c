/* cmd_bench.c — `kiln bench`: prefill and decode speed on random token ids, median of several
 * runs, with time to first token, the weight bandwidth decode achieves, and peak RSS. Decode steps
 * pick a greedy token inside the forward (kiln_forward_sample), as `kiln generate` does. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void help(FILE *f) {
    fprintf(
        f, "usage: kiln bench [--model DIR] [--prompt N] [--gen N] [--batch B] [--context N] "
           "[--runs R]\n"
           "                  [--json]\n\n"
           "  --prompt N   prompt tokens for the prefill measurement (default 128)\n"
           "  --gen N      decode steps (default 64)\n"
           "  --batch B    sequences decoded together (default 1)\n"
           "  --context N  before the prompt, fill each sequence's cache with N positions of "
           "synthetic\n"
           "               keys/values (kiln_seq_fill_synthetic; default 0): decode speed at long\n"
           "               context without a long prefill. Speed only, not quality.\n"
           "  --runs R     repetitions; medians are reported (default 5)\n"
           "  --json       one JSON line instead of the table\n\n");
    cli_model_opts_help(f);
}

int cmd_bench(int argc, char **argv) {
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    long long P = 128, G = 64, B = 1, R = 5, C = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        int r = cli_model_opts_parse(&mo, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i], *v;
        long long *dst = NULL, lo = 1, hi = 1 << 20;
        if (cli_is_help(a)) {
            help(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
            continue;
        } else if (strcmp(a, "--prompt") == 0)
            dst = &P;
        else if (strcmp(a, "--gen") == 0)
            dst = &G;
        else if (strcmp(a, "--context") == 0)
            dst = &C, lo = 0;
        else if (strcmp(a, "--batch") == 0)
            dst = &B, hi = 1024;
        else if (strcmp(a, "--runs") == 0)
            dst = &R, hi = 1000;
        else
            return cli_error("bench: unknown option '%s' (see kiln bench --help)", a);
        if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(v, lo, hi, dst))
            return cli_error("%s: bad value", a);
    }
    kiln_model *model = cli_load_model(&mo);
    if (!model) return 1;
    const kiln_model_info *in = kiln_model_get_info(model);
    int V = in->vocab_size;
    int nb = (int)B;
    int32_t *prompt = malloc((size_t)P * sizeof *prompt);
    int32_t *next = malloc((size_t)nb * sizeof *next);
    int32_t *picked = malloc((size_t)nb * sizeof *picked);
    kiln_sampler **greedy = calloc((size_t)nb, sizeof *greedy);
    kiln_sample_request *picks = calloc((size_t)nb, sizeof *picks);
    float *logits = malloc((size_t)nb * V * sizeof(float));
    kiln_seq **seqs = calloc((size_t)nb, sizeof *seqs);
    kiln_batch_entry *e = calloc((size_t)nb, sizeof *e);
    double *pre = calloc((size_t)R, sizeof(double)), *dec = calloc((size_t)R, sizeof(double));
    int rc = 1;
    if (!prompt || !next || !picked || !greedy || !picks || !logits || !seqs || !e || !pre || !dec)
        goto done;
    kiln_sampler_params gp; /* decode picks its token greedily inside the forward, as generate */
    kiln_sampler_params_default(&gp);
    for (int b = 0; b < nb; b++)
        if (kiln_sampler_new(&gp, V, &greedy[b]) != KILN_OK) {
            cli_fail_status(KILN_ERR_OOM, "bench");
            goto done;
        } else {
            picks[b] = (kiln_sample_request){.sampler = greedy[b], .token_out = &picked[b]};
        }
    uint64_t x = 12345;
    for (int i = 0; i < P; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
    for (int b = 0; b < nb; b++)
        if (kiln_seq_new(model, &seqs[b]) != KILN_OK) {
            cli_fail_status(KILN_ERR_OOM, "bench");
            goto done;
        }
    for (int run = -1; run < R; run++) { /* run -1 warms up */
        for (int b = 0; b < nb; b++) {
            kiln_seq_truncate(seqs[b], 0);
            kiln_status st =
                C > 0 ? kiln_seq_fill_synthetic(seqs[b], (int)C, (uint64_t)b + 1) : KILN_OK;
            if (st != KILN_OK) {
                cli_fail_status(st, "context fill");
                goto done;
            }
        }
        double t0 = now_s();
        for (int b = 0; b < nb; b++) {
            kiln_batch_entry pe = {seqs[b], prompt, (int)P, KILN_LOGITS_LAST,
                                   logits + (size_t)b * V};
            kiln_status st = kiln_forward(model, &pe, 1);
            if (st != KILN_OK) {
                cli_fail_status(st, "prefill");
                goto done;
            }
        }
        double t1 = now_s();
        for (int step = 0; step < G; step++) {
            for (int b = 0; b < nb; b++) {
                next[b] = (int32_t)((prompt[(step + b) % P] + step) % V);
                /* the fed ids stay synthetic (the same work every run); the greedy pick is
                 * made and copied back as a real decode step does, on the device for cuda */
                e[b] = (kiln_batch_entry){
                    .seq = seqs[b], .tokens = &next[b], .n_tokens = 1, .logits = KILN_LOGITS_LAST};
            }
            kiln_status st = kiln_forward_sample(model, e, nb, picks);
            if (st != KILN_OK) {
                cli_fail_status(st, "decode");
                goto done;
            }
        }
        double t2 = now_s();
        if (run >= 0) {
            pre[run] = (double)(P * nb) / (t1 - t0);
            dec[run] = (double)(G * nb) / (t2 - t1);
        }
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double p50 = median(pre, (int)R), d50 = median(dec, (int)R);
    double ttft_ms = 1e3 * P / p50;
    double gbps = (double)in->active_weight_bytes * (d50 / nb) / 1e9;
    if (json) {
        printf("{\"model\":\"%s\",\"arch\":\"%s\",\"context\":%lld,\"prompt\":%lld,\"gen\":%lld,"
               "\"batch\":%lld,"
               "\"runs\":%lld,\"prefill_tok_s\":%.2f,\"decode_tok_s\":%.2f,\"ttft_ms\":%.2f,"
               "\"decode_weight_gb_s\":%.2f,\"peak_rss_mb\":%.1f,\"weight_bytes\":%lld,"
               "\"active_weight_bytes\":%lld}\n",
               mo.model_dir ? mo.model_dir : cli_default_model_dir(), in->architecture, C, P, G, B,
               R, p50, d50, ttft_ms, gbps, ru.ru_maxrss / 1024.0, (long long)in->weight_bytes,
               (long long)in->active_weight_bytes);
    } else {
        printf("model        %s (%s, %.1fM params, %.1f MB weights)\n",
               mo.model_dir ? mo.model_dir : cli_default_model_dir(), in->architecture,
               in->n_params / 1e6, in->weight_bytes / 1e6);
        if (C > 0) printf("context      %lld synthetic positions per sequence\n", C);
        printf("prefill      %lld tokens x %lld seq: %.1f tok/s (median of %lld), TTFT %.1f ms\n",
               P, B, p50, R, ttft_ms);
        printf("decode       %lld steps x %lld seq: %.1f tok/s (median of %lld), weights read at "
               "%.1f GB/s\n",
               G, B, d50, R, gbps);
        printf("peak RSS     %.1f MB\n", ru.ru_maxrss / 1024.0);
    }
    rc = 0;
done:
    if (seqs)
        for (int b = 0; b < nb; b++) kiln_seq_free(seqs[b]);
    free(seqs);
    free(e);
    free(pre);
    free(dec);
    free(prompt);
    free(next);
    free(picked);
    if (greedy)
        for (int b = 0; b < nb; b++) kiln_sampler_free(greedy[b]);
    free(greedy);
    free(picks);
    free(logits);
    kiln_model_free(model);
    return rc;
}
