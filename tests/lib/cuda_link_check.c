/* cuda_link_check.c — cuda_link_check (cuda_link_check.h): decode with qg_link against decode
 * without it, bit for bit, on a real model. Compiled into every test; the body only with CUDA. */
#include "cuda_link_check.h"

#include "decode_pair.h"
#include "kiln.h"
#include "test_util.h"

#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"

#include <stdio.h>

/* before each forward of copy g: the link off (0) or on (1) */
static void set_link(int copy, void *ctx) {
    (void)ctx;
    kiln_cuda_set_qgemv_link(copy);
}

void cuda_link_check(const char *label, const char *dir, long long min_links) {
    kiln_load_options lo;
    kiln_load_options_default(&lo);
    lo.device = KILN_DEVICE_CUDA;
    kiln_model *m[2] = {NULL, NULL}; /* [0]: link off, [1]: on */
    for (int g = 0; g < 2; g++) CHECK_OK(kiln_model_load(dir, &lo, &m[g]));
    if (m[0] && m[1]) {
        const int STEPS = 40;          /* 20 with one sequence, 20 with two */
        kiln_cuda_set_qgemv_inline(0); /* pass 1 and its hand-offs, not digits in the blocks */
        const long long links0 = kiln_cuda_qgemv_links_total();
        int first_bad;
        const int mismatches =
            decode_pair_mismatches(m, STEPS, STEPS / 2, set_link, NULL, &first_bad);
        const long long links = kiln_cuda_qgemv_links_total() - links0;
        kiln_cuda_set_qgemv_link(-1);
        kiln_cuda_set_qgemv_inline(-1);
        CHECK_MSG(mismatches == 0, "%s: decode with the link differs at %d steps (first %d)", label,
                  mismatches, first_bad);
        CHECK_MSG(links >= min_links, "%s: %lld hand-offs taken in %d steps (want >= %lld)", label,
                  links, STEPS, min_links);
        fprintf(stderr, "%-18s qgemv link     %d steps, %lld hand-offs, %d differ\n", label, STEPS,
                links, mismatches);
    }
    kiln_model_free(m[0]);
    kiln_model_free(m[1]);
}
#else
void cuda_link_check(const char *label, const char *dir, long long min_links) {
    (void)label, (void)dir, (void)min_links;
    CHECK_MSG(0, "cuda_link_check called in a build without CUDA");
}
#endif
