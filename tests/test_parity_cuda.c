/* test_parity_cuda.c — test_parity.c on the GPU: the same Llama-family fixtures loaded with
 * device = KILN_DEVICE_CUDA. Logits of one full forward (cuBLAS path) and of token-by-token
 * decoding (GEMV path) match transformers' float32 logits within relative L2 1e-3; the greedy
 * continuation must match transformers wherever the reference's top-2 logit margin is larger than
 * the error could move it (a flip at a near-tie is reported, not failed); a batch of three
 * sequences gives each sequence the logits it gets alone (1e-3). Decode steps replayed from a
 * recorded CUDA graph give the same bits as the same steps launched op by op, across attention
 * split buckets and cache growth. kiln_forward_sample's GPU sampling picks the ids the host
 * sampler picks from the same device logits (and so does the KILN_GPU_SAMPLING=0 fallback).
 * Without a GPU the test exits 77 with the reason. */
#include "kiln.h"
#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#endif
#include "fixture_parity.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-3

static const char *fixtures[] = {
    "llama",           "llama-tied",      "qwen2",           "qwen3",
    "llama-mlx-q4g32", "llama-mlx-q8g64", "qwen3-mlx-q4g32", "qwen3-mlx-q8g64",
};

#ifdef KILN_HAVE_CUDA
/* A model whose backend has decode-step graphs and programmatic dependent launches on (1) or
 * both off (0: every op launched in plain stream order). */
static kiln_model *load_with_graphs(const char *dir, int on) {
    kiln_cuda_set_graph_mode(on);
    kiln_cuda_set_pdl_mode(on);
    kiln_load_options lo;
    kiln_load_options_default(&lo);
    lo.device = KILN_DEVICE_CUDA;
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_load(dir, &lo, &m));
    kiln_cuda_set_graph_mode(-1);
    kiln_cuda_set_pdl_mode(-1);
    return m;
}

/* Two sequences (one alone, then both as a batch of two) decode 300 steps with graphs + PDL off
 * and on: the logits must be the same bits at every step (a kernel reading before its PDL wait
 * would show up as a difference), and most steps must have been replays. The lengths cross the
 * attention buckets (128, 256, ...) and the cache's growth from 256 rows. */
static void graph_replay_check(const char *name) {
    char rel[256], dir[4000];
    snprintf(rel, sizeof rel, "fixtures/%s", name);
    snprintf(dir, sizeof dir, "%s", test_shared(rel));
    kiln_model *m[2] = {load_with_graphs(dir, 0), load_with_graphs(dir, 1)};
    if (!m[0] || !m[1]) {
        kiln_model_free(m[0]);
        kiln_model_free(m[1]);
        return;
    }
    const int V = kiln_model_get_info(m[0])->vocab_size, STEPS = 300;
    kiln_seq *s[2][2] = {{0}};
    float *row[2][2];
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < 2; i++) {
            CHECK_OK(kiln_seq_new(m[g], &s[g][i]));
            row[g][i] = malloc((size_t)V * sizeof(float));
        }
    const int32_t prompt[7] = {1, 5, 9, 2, 7, 3, 11};
    long long replays0 = kiln_cuda_graph_replays();
    int mismatches = 0, first_bad = -1;
    for (int g = 0; g < 2; g++) { /* seq 0: 7 prompt tokens, seq 1: 3 */
        kiln_batch_entry e = {s[g][0], prompt, 7, KILN_LOGITS_NONE, NULL};
        CHECK_OK(kiln_forward(m[g], &e, 1));
        e = (kiln_batch_entry){s[g][1], prompt, 3, KILN_LOGITS_NONE, NULL};
        CHECK_OK(kiln_forward(m[g], &e, 1));
    }
    for (int t = 0; t < STEPS; t++) {
        int32_t tok[2] = {(int32_t)((t * 7919 + 13) % V), (int32_t)((t * 104729 + 5) % V)};
        /* steps 0..99: seq 0 alone (batch of 1); then both sequences as one batch of 2 */
        int n = t < 100 ? 1 : 2;
        for (int g = 0; g < 2; g++) {
            kiln_batch_entry e[2];
            for (int i = 0; i < n; i++)
                e[i] = (kiln_batch_entry){s[g][i], &tok[i], 1, KILN_LOGITS_LAST, row[g][i]};
            CHECK_OK(kiln_forward(m[g], e, n));
        }
        for (int i = 0; i < n; i++)
            if (memcmp(row[0][i], row[1][i], (size_t)V * sizeof(float)) != 0) {
                if (first_bad < 0) first_bad = t;
                mismatches++;
            }
    }
    long long replays = kiln_cuda_graph_replays() - replays0;
    CHECK_MSG(mismatches == 0, "%s: graph replay differs from launched ops at %d steps (first %d)",
              name, mismatches, first_bad);
    CHECK_MSG(replays >= STEPS - 20, "%s: only %lld of %d decode steps were replayed", name,
              replays, STEPS);
    fprintf(stderr, "%-18s graph replay   %d steps, %lld replayed, %d differ\n", name, STEPS,
            replays, mismatches);
    for (int g = 0; g < 2; g++) {
        for (int i = 0; i < 2; i++) {
            kiln_seq_free(s[g][i]);
            free(row[g][i]);
        }
        kiln_model_free(m[g]);
    }
}
#endif

int main(void) {
#ifndef KILN_HAVE_CUDA
    (void)fixtures; /* compiled everywhere, run only with CUDA */
    return test_skip("built without CUDA (no nvcc at configure time)");
#else
    char why[200];
    if (kiln_cuda_device_count(why, sizeof why) == 0) return test_skip(why);
    const fixture_parity_opts o = {.device = KILN_DEVICE_CUDA, .tol = TOL, .allow_near_tie = true};
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
        fixture_parity_check(fixtures[i], &o);
    fixture_sampling_check("qwen3", KILN_DEVICE_CUDA);
    fixture_sampling_check("llama-mlx-q4g32", KILN_DEVICE_CUDA);
    setenv("KILN_GPU_SAMPLING", "0", 1); /* the host fallback: downloaded logits */
    fixture_sampling_check("qwen3", KILN_DEVICE_CUDA);
    unsetenv("KILN_GPU_SAMPLING");
    graph_replay_check("qwen3");
    graph_replay_check("llama-mlx-q4g32");
    return test_finish();
#endif
}
