/* cmd_generate.c — `kiln generate`: prefill a prompt (text, chat or ids), then sample tokens one
 * at a time (each forward picks the next token itself: kiln_forward_sample), streaming the
 * decoded text; prints prompt and decode speed at the end. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void help(FILE *f) {
    fprintf(f, "usage: kiln generate [--model DIR] (--prompt TEXT | --ids 1,2,3) [options]\n\n"
               "  --prompt TEXT            prompt text (tokenized with the model's tokenizer)\n"
               "  --chat                   wrap --prompt as a user message in the chat template\n"
               "  --ids LIST               prompt as comma-separated token ids\n"
               "  --max-tokens N           tokens to generate (default 128)\n"
               "  --temperature T          0 = greedy (default: generation_config.json, else 0)\n"
               "  --top-k K  --top-p P  --min-p P\n"
               "  --repetition-penalty R  --presence-penalty P  --frequency-penalty F\n"
               "  --seed S                 sampling seed (default 0)\n"
               "  --ignore-eos             do not stop at end-of-sequence tokens\n"
               "  --print-ids              end the output with a line of the generated ids\n\n");
    cli_model_opts_help(f);
}

static bool is_eos(const kiln_model_info *info, int32_t id) {
    for (int i = 0; i < info->n_eos; i++)
        if (info->eos_ids[i] == id) return true;
    return false;
}

int cmd_generate(int argc, char **argv) {
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    const char *prompt = NULL, *ids_text = NULL;
    long long max_tokens = 128;
    bool chat = false, print_ids = false, ignore_eos = false;
    bool set_temp = false, set_top_k = false, set_top_p = false, set_rep = false;
    kiln_sampler_params sp;
    kiln_sampler_params_default(&sp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        double d;
        long long n;
        int r = cli_model_opts_parse(&mo, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (cli_is_help(a)) {
            help(stdout);
            return 0;
        } else if (strcmp(a, "--prompt") == 0 || strcmp(a, "-p") == 0) {
            if (!(prompt = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(a, "--ids") == 0) {
            if (!(ids_text = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(a, "--chat") == 0) {
            chat = true;
        } else if (strcmp(a, "--print-ids") == 0) {
            print_ids = true;
        } else if (strcmp(a, "--ignore-eos") == 0) {
            ignore_eos = true;
        } else if (strcmp(a, "--max-tokens") == 0 || strcmp(a, "-n") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!cli_parse_int(v, 0, 1 << 24, &max_tokens))
                return cli_error("--max-tokens: bad value '%s'", v);
        } else if (strcmp(a, "--seed") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!cli_parse_int(v, 0, INT64_MAX, &n)) return cli_error("--seed: bad value '%s'", v);
            sp.seed = (uint64_t)n;
        } else if (strcmp(a, "--top-k") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!cli_parse_int(v, 0, 1 << 30, &n)) return cli_error("--top-k: bad value '%s'", v);
            sp.top_k = (int)n;
            set_top_k = true;
        } else if (strcmp(a, "--temperature") == 0 || strcmp(a, "--temp") == 0 ||
                   strcmp(a, "--top-p") == 0 || strcmp(a, "--min-p") == 0 ||
                   strcmp(a, "--repetition-penalty") == 0 || strcmp(a, "--presence-penalty") == 0 ||
                   strcmp(a, "--frequency-penalty") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!cli_parse_float(v, &d)) return cli_error("%s: bad value '%s'", a, v);
            if (strncmp(a, "--temp", 6) == 0)
                sp.temperature = (float)d, set_temp = true;
            else if (strcmp(a, "--top-p") == 0)
                sp.top_p = (float)d, set_top_p = true;
            else if (strcmp(a, "--min-p") == 0)
                sp.min_p = (float)d;
            else if (strcmp(a, "--repetition-penalty") == 0)
                sp.repetition_penalty = (float)d, set_rep = true;
            else if (strcmp(a, "--presence-penalty") == 0)
                sp.presence_penalty = (float)d;
            else
                sp.frequency_penalty = (float)d;
        } else {
            return cli_error("generate: unknown option '%s' (see kiln generate --help)", a);
        }
    }
    if (!prompt == !ids_text) return cli_error("generate: give exactly one of --prompt or --ids");

    int32_t *ids = NULL;
    int n_ids = 0;
    if (ids_text && !cli_parse_ids(ids_text, &ids, &n_ids)) return 2;
    kiln_model *model = cli_load_model(&mo);
    if (!model) return free(ids), 1;
    const kiln_model_info *info = kiln_model_get_info(model);
    { /* generation_config.json supplies what the command line did not */
        kiln_sampler_params d = sp;
        kiln_model_default_sampling(model, &d);
        if (!set_temp) sp.temperature = d.temperature;
        if (!set_top_k) sp.top_k = d.top_k;
        if (!set_top_p) sp.top_p = d.top_p;
        if (!set_rep) sp.repetition_penalty = d.repetition_penalty;
    }
    const char *dir = mo.model_dir ? mo.model_dir : cli_default_model_dir();
    kiln_tokenizer *tok = NULL;
    kiln_status st = kiln_tokenizer_load(dir, &tok);
    if (st != KILN_OK) {
        if (prompt) {
            kiln_model_free(model);
            return cli_fail_status(st, "cannot load tokenizer");
        }
        tok = NULL; /* ids in, ids out */
    }
    int rc = 1;
    char *rendered = NULL;
    int32_t *hist = NULL;
    kiln_seq *seq = NULL;
    kiln_sampler *sampler = NULL;
    kiln_detok_stream *stream = NULL;
    if (prompt) {
        const char *text = prompt;
        if (chat) {
            size_t plen = strlen(prompt);
            char *json = malloc(plen * 6 + 64);
            if (!json) goto done;
            char *w = json + sprintf(json, "[{\"role\":\"user\",\"content\":\"");
            for (const char *c = prompt; *c; c++) {
                unsigned char ch = (unsigned char)*c;
                if (ch == '"' || ch == '\\')
                    *w++ = '\\', *w++ = (char)ch;
                else if (ch == '\n')
                    *w++ = '\\', *w++ = 'n';
                else if (ch < 0x20)
                    w += sprintf(w, "\\u%04x", ch);
                else
                    *w++ = (char)ch;
            }
            strcpy(w, "\"}]");
            st = kiln_chat_render(tok, json, NULL, true, NULL, &rendered);
            free(json);
            if (st != KILN_OK) {
                cli_fail_status(st, "chat template");
                goto done;
            }
            text = rendered;
        }
        st = kiln_tokenize(tok, text, strlen(text), !chat, &ids, &n_ids);
        if (st != KILN_OK) {
            cli_fail_status(st, "tokenize");
            goto done;
        }
        if (n_ids == 0) {
            cli_error("generate: the prompt tokenizes to nothing");
            goto done;
        }
    }
    hist = malloc((size_t)(n_ids + max_tokens + 1) * sizeof *hist);
    if (!hist) goto done;
    memcpy(hist, ids, (size_t)n_ids * sizeof *ids);
    if ((st = kiln_seq_new(model, &seq)) != KILN_OK ||
        (st = kiln_sampler_new(&sp, info->vocab_size, &sampler)) != KILN_OK) {
        cli_fail_status(st, "generate");
        goto done;
    }
    if (tok && (st = kiln_detok_stream_new(tok, true, &stream)) != KILN_OK) {
        cli_fail_status(st, "detokenizer");
        goto done;
    }
    if (prompt && !chat) fputs(prompt, stdout); /* the completion continues the prompt */
    fflush(stdout);
    double t0 = now_s();
    /* the forward also picks the next token (on the GPU for --device cuda: only the id comes
     * back), exactly as kiln_sampler_sample on the last logits would */
    int32_t next = 0, fed = 0;
    kiln_batch_entry e = {.seq = seq, .tokens = ids, .n_tokens = n_ids, .logits = KILN_LOGITS_LAST};
    kiln_sample_request pick = {
        .sampler = sampler, .history = hist, .n_history = n_ids, .token_out = &next};
    if ((st = kiln_forward_sample(model, &e, 1, &pick)) != KILN_OK) {
        cli_fail_status(st, "prefill");
        goto done;
    }
    double t1 = now_s();
    int n_gen = 0;
    while (n_gen < max_tokens) {
        hist[n_ids + n_gen++] = next;
        if (!ignore_eos && is_eos(info, next)) break;
        if (stream) {
            char *piece = NULL;
            if (kiln_detok_stream_push(stream, next, &piece) == KILN_OK && piece)
                fputs(piece, stdout);
            free(piece);
        } else {
            printf("%s%d", n_gen > 1 ? " " : "", next);
        }
        fflush(stdout);
        if (n_gen >= max_tokens) break;
        fed = next;
        e = (kiln_batch_entry){
            .seq = seq, .tokens = &fed, .n_tokens = 1, .logits = KILN_LOGITS_LAST};
        pick.n_history = n_ids + n_gen;
        if ((st = kiln_forward_sample(model, &e, 1, &pick)) != KILN_OK) {
            if (st == KILN_ERR_CACHE_FULL) {
                fprintf(stderr, "\nkiln: stopped: %s\n", kiln_last_error());
                break;
            }
            cli_fail_status(st, "decode");
            goto done;
        }
    }
    double t2 = now_s();
    if (stream) {
        char *tail = NULL;
        if (kiln_detok_stream_flush(stream, &tail) == KILN_OK && tail) fputs(tail, stdout);
        free(tail);
    }
    printf("\n");
    if (print_ids) {
        for (int i = 0; i < n_gen; i++) printf("%s%d", i ? "," : "", hist[n_ids + i]);
        printf("\n");
    }
    fflush(stdout);
    fprintf(stderr, "kiln: prompt %d tokens, %.1f tok/s | decode %d tokens, %.1f tok/s\n", n_ids,
            n_ids / (t1 - t0), n_gen, n_gen > 1 ? (n_gen - 1) / (t2 - t1) : 0.0);
    rc = 0;
done:
    kiln_detok_stream_free(stream);
    kiln_sampler_free(sampler);
    kiln_seq_free(seq);
    free(hist);
    free(rendered);
    free(ids);
    kiln_tokenizer_free(tok);
    kiln_model_free(model);
    return rc;
}
