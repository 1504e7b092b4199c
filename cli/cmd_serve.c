/* cmd_serve.c — `kiln serve`: loads a model (and its tokenizer when present) and runs the
 * OpenAI/Anthropic-compatible HTTP server until SIGINT/SIGTERM, then drains and exits 0. */
#include "cli.h"

#ifdef KILN_HAVE_SERVER
#include "server/server.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void help(FILE *f) {
    fprintf(
        f,
        "usage: kiln serve [--model DIR] [options]\n\n"
        "server options:\n"
        "  --host ADDR            IPv4 address to bind (default 127.0.0.1)\n"
        "  --port N               port (default 8080; 0 = any free port)\n"
        "  --api-key KEY          require 'Authorization: Bearer KEY' or 'x-api-key: KEY'\n"
        "  --max-batch N          sequences decoded together (default 8)\n"
        "  --ctx N                max tokens per request, prompt + output (default: model max)\n"
        "  --step-tokens N        tokens per batched step, decode + prefill chunks (default 256)\n"
        "  --kv-tokens N          KV admission budget in tokens (default max-batch * ctx)\n"
        "  --max-waiting N        queued requests before 503 (default 256)\n"
        "  --prefix-cache N       finished sequences kept for prefix reuse (default max-batch, 0 "
        "off)\n"
        "  --max-tokens N         default max_tokens when a request names none (default 2048)\n"
        "  --max-body BYTES       request body limit (default 8388608)\n"
        "  --max-connections N    concurrent connections (default 512)\n"
        "  --drain-ms N           on SIGINT/SIGTERM, time to finish requests (default 10000)\n"
        "  --model-id NAME        model name reported by /v1/models (default: folder name)\n\n");
    cli_model_opts_help(f);
}

int cmd_serve(int argc, char **argv) {
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    kiln_server_config c;
    kiln_server_config_default(&c);
    bool cache_set = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long n;
        int r = cli_model_opts_parse(&mo, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (cli_is_help(a)) {
            help(stdout);
            return 0;
        }
#define INT_OPT(flag, lo, hi, dst)                                                                 \
    if (strcmp(a, flag) == 0) {                                                                    \
        if (!(v = cli_value(argc, argv, &i))) return 2;                                            \
        if (!cli_parse_int(v, lo, hi, &n)) return cli_error(flag ": bad value '%s'", v);           \
        dst = n;                                                                                   \
        continue;                                                                                  \
    }
        INT_OPT("--port", 0, 65535, c.port)
        INT_OPT("--max-batch", 1, 1024, c.sched.max_batch)
        INT_OPT("--ctx", 16, 1 << 24, c.sched.ctx)
        INT_OPT("--step-tokens", 1, 1 << 20, c.sched.step_tokens)
        INT_OPT("--kv-tokens", 16, INT64_MAX, c.sched.kv_tokens)
        INT_OPT("--max-waiting", 1, 1 << 20, c.sched.max_waiting)
        INT_OPT("--max-tokens", 1, 1 << 24, c.default_max_tokens)
        INT_OPT("--max-body", 1024, 1ll << 32, c.max_body_bytes)
        INT_OPT("--max-connections", 1, 65536, c.max_connections)
        INT_OPT("--drain-ms", 0, 3600000, c.drain_ms)
#undef INT_OPT
        if (strcmp(a, "--prefix-cache") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!cli_parse_int(v, 0, 1 << 16, &n))
                return cli_error("--prefix-cache: bad value '%s'", v);
            c.sched.cache_entries = n == 0 ? -1 : (int)n;
            cache_set = true;
            continue;
        }
        if (strcmp(a, "--host") == 0) {
            if (!(c.host = cli_value(argc, argv, &i))) return 2;
            continue;
        }
        if (strcmp(a, "--api-key") == 0) {
            if (!(c.api_key = cli_value(argc, argv, &i))) return 2;
            continue;
        }
        if (strcmp(a, "--model-id") == 0) {
            if (!(c.model_id = cli_value(argc, argv, &i))) return 2;
            continue;
        }
        return cli_error("serve: unknown option '%s' (see kiln serve --help)", a);
    }
    (void)cache_set;
    const char *dir = mo.model_dir ? mo.model_dir : cli_default_model_dir();
    static char id[256];
    if (strcmp(c.model_id, "kiln") == 0) {
        const char *base = strrchr(dir, '/');
        base = base && base[1] ? base + 1 : dir;
        snprintf(id, sizeof id, "%s", base);
        c.model_id = id;
    }
    kiln_model *model = cli_load_model(&mo);
    if (!model) return 1;
    kiln_tokenizer *tok = NULL;
    if (kiln_tokenizer_load(dir, &tok) != KILN_OK) {
        fprintf(stderr,
                "kiln: warning: no tokenizer (%s); only token-id prompts on /v1/completions\n",
                kiln_last_error());
        tok = NULL;
    }
    kiln_server_load_generation_config(&c, dir);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    kiln_status st = kiln_server_run(model, tok, &c, &g_stop);
    kiln_tokenizer_free(tok);
    kiln_model_free(model);
    if (st != KILN_OK) return cli_fail_status(st, "serve");
    return 0;
}
#else
int cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("'serve' needs libmicrohttpd; this kiln was built without it");
}
#endif
