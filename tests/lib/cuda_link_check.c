/* cuda_link_check.c — cuda_link_check (cuda_link_check.h): decode with qg_link against decode
 * without it, bit for bit, on a real model. Compiled into every test; the body only with CUDA. */
#include "cuda_link_check.h"

#include "kiln.h"
#include "test_util.h"

#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cuda_link_check(const char *label, const char *dir, long long min_links) {
    kiln_load_options lo;
    kiln_load_options_default(&lo);
    lo.device = KILN_DEVICE_CUDA;
    kiln_model *m[2] = {NULL, NULL}; /* [0]: link off, [1]: on */
    for (int g = 0; g < 2; g++) CHECK_OK(kiln_model_load(dir, &lo, &m[g]));
    if (!m[0] || !m[1]) {
        kiln_model_free(m[0]);
        kiln_model_free(m[1]);
        return;
    }
    kiln_cuda_set_qgemv_inline(0); /* pass 1 and its hand-offs, not digits made in the blocks */
    const int V = kiln_model_get_info(m[0])->vocab_size, STEPS = 40;
    kiln_seq *s[2][2] = {{0}};
    float *row[2][2];
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < 2; i++) {
            CHECK_OK(kiln_seq_new(m[g], &s[g][i]));
            row[g][i] = malloc((size_t)V * sizeof(float));
        }
    const int32_t prompt[5] = {1, 4, 9, 16, 25};
    long long links = 0;
    int mismatches = 0, first_bad = -1;
    for (int g = 0; g < 2; g++) { /* seq 0: 5 prompt tokens, seq 1: 2 */
        kiln_cuda_set_qgemv_link(g);
        kiln_batch_entry e = {s[g][0], prompt, 5, KILN_LOGITS_NONE, NULL};
        CHECK_OK(kiln_forward(m[g], &e, 1));
        e = (kiln_batch_entry){s[g][1], prompt, 2, KILN_LOGITS_NONE, NULL};
        CHECK_OK(kiln_forward(m[g], &e, 1));
    }
    for (int t = 0; t < STEPS; t++) {
        int32_t tok[2] = {(int32_t)((t * 7919 + 3) % V), (int32_t)((t * 104729 + 11) % V)};
        const int n = t < STEPS / 2 ? 1 : 2; /* seq 0 alone, then both as one batch */
        for (int g = 0; g < 2; g++) {
            kiln_cuda_set_qgemv_link(g);
            const long long l0 = kiln_cuda_qgemv_links_total();
            kiln_batch_entry e[2];
            for (int i = 0; i < n; i++)
                e[i] = (kiln_batch_entry){s[g][i], &tok[i], 1, KILN_LOGITS_LAST, row[g][i]};
            CHECK_OK(kiln_forward(m[g], e, n));
            if (g) links += kiln_cuda_qgemv_links_total() - l0;
        }
        for (int i = 0; i < n; i++)
            if (memcmp(row[0][i], row[1][i], (size_t)V * sizeof(float)) != 0) {
                if (first_bad < 0) first_bad = t;
                mismatches++;
            }
    }
    kiln_cuda_set_qgemv_link(-1);
    kiln_cuda_set_qgemv_inline(-1);
    CHECK_MSG(mismatches == 0, "%s: decode with the link differs at %d steps (first %d)", label,
              mismatches, first_bad);
    CHECK_MSG(links >= min_links, "%s: %lld hand-offs taken in %d steps (want >= %lld)", label,
              links, STEPS, min_links);
    fprintf(stderr, "%-18s qgemv link     %d steps, %lld hand-offs, %d differ\n", label, STEPS,
            links, mismatches);
    for (int g = 0; g < 2; g++) {
        for (int i = 0; i < 2; i++) {
            kiln_seq_free(s[g][i]);
            free(row[g][i]);
        }
        kiln_model_free(m[g]);
    }
}
#else
void cuda_link_check(const char *label, const char *dir, long long min_links) {
    (void)label, (void)dir, (void)min_links;
    CHECK_MSG(0, "cuda_link_check called in a build without CUDA");
}
#endif
