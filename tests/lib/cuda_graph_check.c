/* cuda_graph_check.c — cuda_graph_replay_check (cuda_graph_check.h): graph-replayed decode steps
 * against the same steps launched op by op. Compiled into every test; the body only with CUDA. */
#include "cuda_graph_check.h"

#include "kiln.h"
#include "test_util.h"

#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"

#include <stdlib.h>
#include <string.h>

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

void cuda_graph_replay_check(const char *label, const char *dir) {
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
              label, mismatches, first_bad);
    CHECK_MSG(replays >= STEPS - 20, "%s: only %lld of %d decode steps were replayed", label,
              replays, STEPS);
    fprintf(stderr, "%-18s graph replay   %d steps, %lld replayed, %d differ\n", label, STEPS,
            replays, mismatches);
    for (int g = 0; g < 2; g++) {
        for (int i = 0; i < 2; i++) {
            kiln_seq_free(s[g][i]);
            free(row[g][i]);
        }
        kiln_model_free(m[g]);
    }
}
#else
void cuda_graph_replay_check(const char *label, const char *dir) {
    (void)label, (void)dir;
    CHECK_MSG(0, "cuda_graph_replay_check called in a build without CUDA");
}
#endif
