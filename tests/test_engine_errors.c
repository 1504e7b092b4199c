/* test_engine_errors.c — every way a model folder or a call can be wrong gets a clear status and
 * a message naming the culprit: missing or unparsable config, unknown architecture, missing
 * tensor, wrong shape, inconsistent quantization, bad ids, shared sequences in one batch, context
 * overflow, bad truncation — and the CLI turns them into exit codes with messages. */
#include "format/safetensors.h"
#include "kiln.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char fixture[4096];

/* Makes dir with fixture's config.json (text replaced if config_text) and a copy of its tensors,
 * minus `drop`, with `reshape` given a bogus shape. */
static void make_model(const char *dir, const char *config_text, const char *drop,
                       const char *reshape) {
    mkdir(dir, 0755);
    char path[8192];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (config_text) {
        test_write_file(path, config_text, strlen(config_text));
    } else {
        char src[8192];
        snprintf(src, sizeof src, "%s/config.json", fixture);
        size_t n;
        char *cfg = test_read_file(src, &n);
        test_write_file(path, cfg, n);
        free(cfg);
    }
    kiln_st_archive *ar = NULL;
    char src[8192];
    snprintf(src, sizeof src, "%s/model.safetensors", fixture);
    if (kiln_st_open_file(src, &ar) != KILN_OK) return;
    kiln_st_writer *w = NULL;
    kiln_st_writer_new(&w);
    for (int i = 0; i < kiln_st_count(ar); i++) {
        const kiln_st_tensor *t = kiln_st_at(ar, i);
        if (drop && strcmp(t->name, drop) == 0) continue;
        int64_t shape[KILN_ST_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        int ndim = t->ndim;
        if (reshape && strcmp(t->name, reshape) == 0 && ndim == 2) {
            shape[0] = t->shape[1]; /* transpose the shape: same bytes, wrong layout */
            shape[1] = t->shape[0];
            if (shape[0] == shape[1]) shape[0] /= 2, shape[1] *= 2;
        }
        kiln_st_writer_add(w, t->name, t->dtype, ndim, shape, t->data, false);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    kiln_st_writer_finish(w, path);
    kiln_st_writer_free(w);
    kiln_st_close(ar);
}

static void check_load_fails(const char *dir, kiln_status want, const char *needle) {
    kiln_model *m = NULL;
    CHECK_ERR(kiln_model_load(dir, NULL, &m), want, needle);
    CHECK(m == NULL);
}

int main(void) {
    snprintf(fixture, sizeof fixture, "%s", test_shared("fixtures/llama"));
    char probe[8192];
    snprintf(probe, sizeof probe, "%s/config.json", fixture);
    char *cfg_probe = test_read_file(probe, NULL);
    if (!cfg_probe) {
        fprintf(stderr, "%s: missing: the team's shared/ folder must sit beside the repository\n",
                probe);
        return 1;
    }
    free(cfg_probe);
    char dir[4096];
    const char *tmp = test_tmpdir();

    /* folder problems */
    snprintf(dir, sizeof dir, "%s/nothing-here", tmp);
    check_load_fails(dir, KILN_ERR_NOT_FOUND, "config.json");
    snprintf(dir, sizeof dir, "%s/bad-json", tmp);
    make_model(dir, "{\"model_type\": \"llama\", ", NULL, NULL);
    check_load_fails(dir, KILN_ERR_FORMAT, "config.json");
    snprintf(dir, sizeof dir, "%s/unknown-arch", tmp);
    make_model(
        dir,
        "{\"model_type\": \"transmogrifier\", \"hidden_size\": 128, \"num_hidden_layers\": 3,"
        " \"num_attention_heads\": 4, \"vocab_size\": 512, \"intermediate_size\": 256}",
        NULL, NULL);
    check_load_fails(dir, KILN_ERR_UNSUPPORTED, "transmogrifier");
    snprintf(dir, sizeof dir, "%s/missing-tensor", tmp);
    make_model(dir, NULL, "model.layers.1.mlp.up_proj.weight", NULL);
    check_load_fails(dir, KILN_ERR_NOT_FOUND, "model.layers.1.mlp.up_proj.weight");
    snprintf(dir, sizeof dir, "%s/wrong-shape", tmp);
    make_model(dir, NULL, NULL, "model.layers.2.self_attn.k_proj.weight");
    check_load_fails(dir, KILN_ERR_FORMAT, "model.layers.2.self_attn.k_proj.weight");
    snprintf(dir, sizeof dir, "%s/missing-norm", tmp);
    make_model(dir, NULL, "model.norm.weight", NULL);
    check_load_fails(dir, KILN_ERR_NOT_FOUND, "model.norm.weight");

    /* a quantized folder whose config claims other bits than the packed width holds */
    {
        snprintf(fixture, sizeof fixture, "%s", test_shared("fixtures/qwen3-mlx-q4g32"));
        char src[8192];
        snprintf(src, sizeof src, "%s/config.json", fixture);
        char *cfg = test_read_file(src, NULL);
        if (!cfg) cfg = strdup("{}");
        char *p;
        while ((p = strstr(cfg, "\"bits\": 4"))) p[8] = '8';
        snprintf(dir, sizeof dir, "%s/bits-mismatch", tmp);
        make_model(dir, cfg, NULL, NULL);
        free(cfg);
        check_load_fails(dir, KILN_ERR_FORMAT, "8-bit");
        snprintf(fixture, sizeof fixture, "%s", test_shared("fixtures/llama"));
    }

    /* call problems on a good model */
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_load(fixture, NULL, &m));
    if (m) {
        kiln_seq *a = NULL, *b = NULL;
        CHECK_OK(kiln_seq_new(m, &a));
        CHECK_OK(kiln_seq_new(m, &b));
        float logits[512];
        int32_t bad[] = {1, 512};
        kiln_batch_entry e = {a, bad, 2, KILN_LOGITS_LAST, logits};
        CHECK_ERR(kiln_forward(m, &e, 1), KILN_ERR_INVALID_ARG, "outside the vocabulary");
        CHECK(kiln_seq_len(a) == 0);
        int32_t neg[] = {-3};
        e = (kiln_batch_entry){a, neg, 1, KILN_LOGITS_LAST, logits};
        CHECK_ERR(kiln_forward(m, &e, 1), KILN_ERR_INVALID_ARG, "-3");
        int32_t ok[] = {1, 2, 3};
        kiln_batch_entry two[2] = {{a, ok, 3, KILN_LOGITS_NONE, NULL},
                                   {a, ok, 1, KILN_LOGITS_NONE, NULL}};
        CHECK_ERR(kiln_forward(m, two, 2), KILN_ERR_INVALID_ARG, "same sequence");
        e = (kiln_batch_entry){a, ok, 3, KILN_LOGITS_LAST, NULL};
        CHECK_ERR(kiln_forward(m, &e, 1), KILN_ERR_INVALID_ARG, "logits_out");
        CHECK_ERR(kiln_forward(m, NULL, 1), KILN_ERR_INVALID_ARG, NULL);
        CHECK_ERR(kiln_seq_truncate(a, 5), KILN_ERR_INVALID_ARG, NULL);
        /* context limit: the fixture's max_position_embeddings is 512 */
        int32_t *many = calloc(513, sizeof *many);
        e = (kiln_batch_entry){b, many, 513, KILN_LOGITS_NONE, NULL};
        CHECK_ERR(kiln_forward(m, &e, 1), KILN_ERR_CACHE_FULL, "512");
        CHECK(kiln_seq_len(b) == 0);
        e = (kiln_batch_entry){b, many, 512, KILN_LOGITS_NONE, NULL};
        CHECK_OK(kiln_forward(m, &e, 1));
        e = (kiln_batch_entry){b, many, 1, KILN_LOGITS_LAST, logits};
        CHECK_ERR(kiln_forward(m, &e, 1), KILN_ERR_CACHE_FULL, NULL);
        CHECK(kiln_seq_len(b) == 512);
        free(many);
        kiln_seq_free(a);
        kiln_seq_free(b);
        kiln_model_free(m);
    }
    kiln_load_options o;
    kiln_load_options_default(&o);
    CHECK(o.weights == KILN_WEIGHTS_AUTO);
    /* weights mapped and weights read into memory: the same logits, bit for bit */
    float lw[2][3 * 512];
    for (int mode = 0; mode < 2; mode++) {
        o.weights = mode ? KILN_WEIGHTS_MEMORY : KILN_WEIGHTS_MMAP;
        kiln_model *wm = NULL;
        kiln_seq *s = NULL;
        CHECK_OK(kiln_model_load(fixture, &o, &wm));
        if (wm) CHECK_OK(kiln_seq_new(wm, &s));
        int32_t ids[] = {5, 17, 3};
        kiln_batch_entry e = {s, ids, 3, KILN_LOGITS_ALL, lw[mode]};
        if (s) CHECK_OK(kiln_forward(wm, &e, 1));
        kiln_seq_free(s);
        kiln_model_free(wm);
    }
    CHECK_MSG(memcmp(lw[0], lw[1], sizeof lw[0]) == 0, "mapped vs in-memory weights differ");
    o.weights = KILN_WEIGHTS_AUTO;
    CHECK_ERR(kiln_kv_options_parse("q17", &o.kv), KILN_ERR_UNSUPPORTED, "q17");
    /* the matmul mode switch of every backend: a bad name is refused and changes nothing */
    CHECK_ERR(kiln_set_matmul_mode("fastest"), KILN_ERR_INVALID_ARG, "fastest");
    CHECK_ERR(kiln_set_matmul_mode(NULL), KILN_ERR_INVALID_ARG, NULL);
    CHECK_OK(kiln_set_matmul_mode("fast"));
    CHECK_OK(kiln_set_matmul_mode("exact"));

    /* the CLI: messages and exit codes */
    char cmd[16384];
    int status;
    char *out;
    snprintf(cmd, sizeof cmd, "%s logits --model %s --ids 1,x,3 --out %s/l.f32 2>&1", test_bin(),
             fixture, tmp);
    out = test_run(cmd, &status);
    CHECK_MSG(status == 2 && out && strstr(out, "--ids"), "status %d: %s", status, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s logits --model %s/missing-tensor --ids 1,2 --out %s/l.f32 2>&1",
             test_bin(), tmp, tmp);
    out = test_run(cmd, &status);
    CHECK_MSG(status == 1 && out && strstr(out, "model.layers.1.mlp.up_proj.weight"),
              "status %d: %s", status, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids 1,2 --temperature -1 2>&1", test_bin(),
             fixture);
    out = test_run(cmd, &status);
    CHECK_MSG(status != 0 && out && strstr(out, "temperature"), "status %d: %s", status, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s generate --bogus 2>&1", test_bin());
    out = test_run(cmd, &status);
    CHECK_MSG(status == 2 && out && strstr(out, "--bogus"), "status %d: %s", status, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s perplexity --model %s --ids-file %s/config.json --window 7 2>&1",
             test_bin(), fixture, fixture);
    out = test_run(cmd, &status);
    CHECK_MSG(status != 0 && out && strstr(out, "window"), "status %d: %s", status, out);
    free(out);
    const char *verbs[] = {"generate",   "logits",  "tokenize", "detokenize", "chat-template",
                           "perplexity", "convert", "info",     "bench",      "serve"};
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s %s --help", test_bin(), verbs[i]);
        out = test_run(cmd, &status);
        CHECK_MSG(status == 0 && out && strstr(out, "usage"), "%s --help: status %d", verbs[i],
                  status);
        free(out);
    }
    return test_finish();
}
