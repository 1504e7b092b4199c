/* cli_common.c — option parsing shared by every verb and the common model options. */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kiln: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 2;
}

int cli_fail_status(kiln_status st, const char *what) {
    fprintf(stderr, "kiln: %s: %s (%s)\n", what, kiln_last_error(), kiln_status_name(st));
    return 1;
}

bool cli_is_help(const char *arg) {
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0 || strcmp(arg, "help") == 0;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        cli_error("option %s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

bool cli_parse_int(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_float(const char *s, double *out) {
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || v != v) return false;
    *out = v;
    return true;
}

bool cli_parse_ids(const char *s, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    size_t cap = 16;
    int32_t *buf = malloc(cap * sizeof *buf);
    if (!buf) return false;
    const char *p = s;
    while (*p) {
        while (*p == ' ') p++;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            free(buf);
            cli_error("--ids: '%s' is not a comma-separated list of token ids", s);
            return false;
        }
        if ((size_t)*n == cap) {
            int32_t *nb = realloc(buf, (cap *= 2) * sizeof *buf);
            if (!nb) {
                free(buf);
                return false;
            }
            buf = nb;
        }
        buf[(*n)++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') {
            p++;
            if (!*p) break;
        } else if (*p) {
            free(buf);
            cli_error("--ids: unexpected '%c' in '%s'", *p, s);
            return false;
        }
    }
    if (*n == 0) {
        free(buf);
        cli_error("--ids: no ids given");
        return false;
    }
    *ids = buf;
    return true;
}

void cli_model_opts_init(cli_model_opts *o) {
    memset(o, 0, sizeof *o);
    kiln_load_options_default(&o->load);
    o->load.show_progress = isatty(2);
}

int cli_model_opts_parse(cli_model_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const char *v;
    long long n;
    if (strcmp(a, "--model") == 0 || strcmp(a, "-m") == 0) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        o->model_dir = v;
        return 1;
    }
    if (strcmp(a, "--device") == 0) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (strcmp(v, "cpu") == 0)
            o->load.device = KILN_DEVICE_CPU;
        else if (strcmp(v, "cuda") == 0)
            o->load.device = KILN_DEVICE_CUDA;
        else
            return cli_error("--device: '%s' is not cpu or cuda", v), -1;
        return 1;
    }
    if (strcmp(a, "--threads") == 0 || strcmp(a, "-t") == 0) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (!cli_parse_int(v, 0, 256, &n)) return cli_error("--threads: bad value '%s'", v), -1;
        o->load.n_threads = (int)n;
        return 1;
    }
    if (strcmp(a, "--kv") == 0) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        int block = o->load.kv.block_tokens;
        int64_t budget = o->load.kv.budget_bytes;
        bool paged = o->load.kv.paged;
        if (kiln_kv_options_parse(v, &o->load.kv) != KILN_OK)
            return cli_error("--kv: %s", kiln_last_error()), -1;
        o->load.kv.block_tokens = block;
        o->load.kv.budget_bytes = budget;
        o->load.kv.paged = o->load.kv.paged || paged;
        return 1;
    }
    if (strcmp(a, "--kv-block") == 0) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (!cli_parse_int(v, 1, 4096, &n)) return cli_error("--kv-block: bad value '%s'", v), -1;
        o->load.kv.block_tokens = (int)n;
        o->load.kv.paged = true;
        return 1;
    }
    if (strcmp(a, "--kv-budget") == 0) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (!cli_parse_int(v, 1, INT64_MAX, &n))
            return cli_error("--kv-budget: bad value '%s'", v), -1;
        o->load.kv.budget_bytes = n;
        o->load.kv.paged = true;
        return 1;
    }
    if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) {
        o->verbose = true;
        kiln_set_log_level(KILN_LOG_INFO);
        return 1;
    }
    if (strcmp(a, "--fast-math") == 0) {
        if (kiln_set_matmul_mode("fast") != KILN_OK) return cli_error("%s", kiln_last_error()), -1;
        return 1;
    }
    if (strcmp(a, "--quiet") == 0) {
        o->load.show_progress = false;
        return 1;
    }
    if (strcmp(a, "--mmap") == 0 || strcmp(a, "--no-mmap") == 0) {
        o->load.weights = a[2] == 'm' ? KILN_WEIGHTS_MMAP : KILN_WEIGHTS_MEMORY;
        return 1;
    }
    return 0;
}

void cli_model_opts_help(FILE *f) {
    fprintf(
        f, "model options:\n"
           "  --model DIR        model folder (HF or mlx-community layout); default: bundled demo\n"
           "  --device cpu|cuda  backend (default cpu)\n"
           "  --threads N        CPU threads (default: all cores)\n"
           "  --kv KIND          KV cache: f32 (default), f16, bf16, q8, q4, turbo:kXvY; suffixes\n"
           "                     :gN / :kgN / :vgN (groups), :rotk (turbo: rotated keys), e.g.\n"
           "                     turbo:k4v4:rotk:kg64 (q4's bytes, better quality)\n"
           "  --kv-block N       paged KV cache with N-token blocks\n"
           "  --kv-budget BYTES  paged KV pool size\n"
           "  --fast-math        bf16/int8 activations in the matmuls (CPU and CUDA), as\n"
           "                     llama.cpp and bf16 transformers compute; default: exact\n"
           "  --mmap / --no-mmap map the weight files / read them into (huge-page) memory;\n"
           "                     default: read in on the CPU when they fit in half the free\n"
           "                     memory (faster decode), else map\n"
           "  --verbose          log what happens (loading, timings)\n"
           "  --quiet            no progress output\n");
}

const char *cli_default_model_dir(void) {
    static char path[4096];
    const char *env = getenv("KILN_DEFAULT_MODEL");
    if (env && *env) return env;
    snprintf(path, sizeof path, "%s/models/demo-q8", KILN_SOURCE_DIR);
    return path;
}

kiln_model *cli_load_model(const cli_model_opts *o) {
    const char *dir = o->model_dir ? o->model_dir : cli_default_model_dir();
    kiln_model *m = NULL;
    kiln_status st = kiln_model_load(dir, &o->load, &m);
    if (st != KILN_OK) {
        cli_fail_status(st, "cannot load model");
        return NULL;
    }
    return m;
}
