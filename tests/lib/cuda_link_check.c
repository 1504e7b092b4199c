/* cuda_link_check.c — cuda_link_check (cuda_link_check.h): decode with qg_link against decode
 * without it, bit for bit, on a real model. Compiled into every test; the body only with CUDA. */
#include "cuda_link_check.h"

#include "decode_pair.h"
#include "kiln.h"
#include "test_util.h"

#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"

#include <stdio.h>

/* before each forward of copy g: the link off (copy 0) or in mode *ctx (copy 1) */
static void set_link(int copy, void *ctx) {
    kiln_cuda_set_qgemv_link(copy ? *(const int *)ctx : 0);
}

void cuda_link_check(const char *label, const char *dir, int mode, long long min_links) {
    kiln_load_options lo;
    kiln_load_options_default(&lo);
    lo.device = KILN_DEVICE_CUDA;
    kiln_model *m[2] = {NULL, NULL}; /* [0]: link off, [1]: on */
    for (int g = 0; g < 2; g++) CHECK_OK(kiln_model_load(dir, &lo, &m[g]));
    if (m[0] && m[1]) {
        const int STEPS = 40;          /* 20 with one sequence, 20 with two */
        kiln_cuda_set_qgemv_inline(0); /* pass 1 and its hand-offs, not digits in the blocks */
        const long long links0 = kiln_cuda_qgemv_links_total();
        const long long clusters0 = kiln_cuda_qgemv_cluster_launches_total();
        int first_bad;
        const int mismatches =
            decode_pair_mismatches(m, STEPS, STEPS / 2, set_link, &mode, &first_bad);
        const long long links = kiln_cuda_qgemv_links_total() - links0;
        const long long clusters = kiln_cuda_qgemv_cluster_launches_total() - clusters0;
        kiln_cuda_set_qgemv_link(-1);
        kiln_cuda_set_qgemv_inline(-1);
        CHECK_MSG(mismatches == 0, "%s: decode with the link differs at %d steps (first %d)", label,
                  mismatches, first_bad);
        CHECK_MSG(links >= min_links, "%s: %lld hand-offs taken in %d steps (want >= %lld)", label,
                  links, STEPS, min_links);
        /* mode 2 on sm_90: the emitting GEMVs launched as clusters (as many as hand-offs) */
        CHECK_MSG(mode != 2 || !kiln_cuda_qgemv_clusters_supported() || clusters >= min_links,
                  "%s: %lld launches in clusters in %d steps (want >= %lld)", label, clusters,
                  STEPS, min_links);
        fprintf(
            stderr,
            "%-18s qgemv link %d   %d steps, %lld hand-offs, %lld cluster launches, %d differ\n",
            label, mode, STEPS, links, clusters, mismatches);
    }
    kiln_model_free(m[0]);
    kiln_model_free(m[1]);
}
#else
void cuda_link_check(const char *label, const char *dir, int mode, long long min_links) {
    (void)label, (void)dir, (void)mode, (void)min_links;
    CHECK_MSG(0, "cuda_link_check called in a build without CUDA");
}
#endif
