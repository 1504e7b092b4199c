/* cuda_graph_check.c — cuda_graph_replay_check (cuda_graph_check.h): graph-replayed decode steps
 * against the same steps launched op by op. Compiled into every test; the body only with CUDA. */
#include "cuda_graph_check.h"

#include "decode_pair.h"
#include "kiln.h"
#include "test_util.h"

#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"

#include <stdio.h>

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
    if (m[0] && m[1]) {
        const int STEPS = 300; /* steps 0..99: seq 0 alone (batch of 1); then a batch of 2 */
        const long long replays0 = kiln_cuda_graph_replays();
        int first_bad;
        const int mismatches = decode_pair_mismatches(m, STEPS, 100, NULL, NULL, &first_bad);
        const long long replays = kiln_cuda_graph_replays() - replays0;
        CHECK_MSG(mismatches == 0,
                  "%s: graph replay differs from launched ops at %d steps (first %d)", label,
                  mismatches, first_bad);
        CHECK_MSG(replays >= STEPS - 20, "%s: only %lld of %d decode steps were replayed", label,
                  replays, STEPS);
        fprintf(stderr, "%-18s graph replay   %d steps, %lld replayed, %d differ\n", label, STEPS,
                replays, mismatches);
    }
    kiln_model_free(m[0]);
    kiln_model_free(m[1]);
}
#else
void cuda_graph_replay_check(const char *label, const char *dir) {
    (void)label, (void)dir;
    CHECK_MSG(0, "cuda_graph_replay_check called in a build without CUDA");
}
#endif
