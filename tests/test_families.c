/* test_families.c — the non-Llama families (qwen3_moe, qwen3_next, qwen3_5_text, gemma3_text,
 * gemma4_text; HF bf16 and MLX 4/8-bit layouts) are numerically the reference model: logits of
 * one full forward (chunked DeltaNet prefill) and of token-by-token decoding (recurrent step,
 * sliding windows past their edge) match transformers' float32 logits (relative L2 <= 1e-4), the
 * 24-token greedy continuation is identical both ways, and a batch of sequences with per-sequence
 * recurrent state gives each sequence the logits it gets alone. Also checks the layer pattern. */
#include "fixture_parity.h"
#include "kiln.h"
#include "model/moe.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char *fixtures[] = {
    "qwen3_moe",
    "qwen3_moe-mlx-q4g32",
    "qwen3_moe-mlx-q8g64",
    "qwen3_next",
    "qwen3_next-mlx-q4g32",
    "qwen3_next-mlx-q8g64",
    "qwen3_5_text",
    "gemma3_text",
    "gemma3_text-mlx-q4g32",
    "gemma3_text-mlx-q8g64",
    "gemma4_text",
};

static void check_pattern(const char *name, const char *want) {
    char rel[256];
    snprintf(rel, sizeof rel, "fixtures/%s", name);
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_load(test_shared(rel), NULL, &m));
    if (!m) return;
    const kiln_model_info *info = kiln_model_get_info(m);
    CHECK_MSG(strcmp(info->layer_pattern, want) == 0, "%s: layer pattern '%s', want '%s'", name,
              info->layer_pattern, want);
    bool recurrent = strchr(want, 'L') != NULL;
    CHECK_MSG(recurrent == (info->state_bytes_fixed > 0), "%s: state_bytes_fixed %lld", name,
              (long long)info->state_bytes_fixed);
    kiln_model_free(m);
}

/* The routing log: a line worked out by hand, then the lines the MoE fixtures' CPU runs wrote
 * (KILN_MOE_LOG, set before the first model loads): parseable, distinct experts, margin >= 0. */
static void check_route_log(const char *path) {
    const float logits[4] = {0.5f, 2.0f, 1.0f, 3.0f};
    int idx[2];
    float w[2];
    kiln_moe_route(logits, 4, 2, false, idx, w);
    char buf[128] = {0};
    FILE *mem = fmemopen(buf, sizeof buf - 1, "w");
    kiln_moe_route_print(mem, "cpu", 7, 5, logits, 4, 2, idx);
    fclose(mem);
    CHECK_MSG(strcmp(buf, "moe cpu 7 5 3,1 1\n") == 0, "route log line: '%s'", buf);
    FILE *f = fopen(path, "r");
    CHECK_MSG(f != NULL, "KILN_MOE_LOG %s was not written", path);
    if (!f) return;
    char line[256];
    int lines = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        char run[64];
        long call, t;
        int e0, e1, used = 0;
        double margin;
        lines++;
        if (sscanf(line, "moe %63s %ld %ld %d,%d %lf%n", run, &call, &t, &e0, &e1, &margin,
                   &used) != 6 ||
            strncmp(run, "cpu#", 4) != 0 || e0 < 0 || e1 < 0 || e0 == e1 || margin < 0 ||
            call < 0 || t < 0)
            bad++;
    }
    fclose(f);
    CHECK_MSG(lines > 0 && bad == 0, "route log: %d lines, %d malformed", lines, bad);
}

int main(void) {
    char route_log[512];
    snprintf(route_log, sizeof route_log, "%s/moe_routes.log", test_tmpdir());
    remove(route_log);
    setenv("KILN_MOE_LOG", route_log, 1);
    const fixture_parity_opts o = {.device = KILN_DEVICE_CPU, .tol = 1e-4, .allow_near_tie = false};
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
        fixture_parity_check(fixtures[i], &o);
    check_pattern("qwen3_next", "L+M F+M L+M F+M");
    check_pattern("qwen3_next-mlx-q4g32", "L+M F+M L+M F+M");
    check_pattern("qwen3_5_text", "L F L F");
    check_pattern("qwen3_moe", "F+M F+M F+M");
    check_pattern("qwen3_moe-mlx-q4g32", "F+M F+M F+M");
    check_pattern("gemma3_text", "S F S F");
    check_pattern("gemma4_text", "S S S F");
    fixture_gemma4_moe_check(KILN_DEVICE_CPU, 1e-4, false);
    check_route_log(route_log);
    return test_finish();
}
