/* test_parity_cuda.c — test_parity.c on the GPU: the same Llama-family fixtures loaded with
 * device = KILN_DEVICE_CUDA. Logits of one full forward (cuBLAS path) and of token-by-token
 * decoding (GEMV path) match transformers' float32 logits within relative L2 1e-3; the greedy
 * continuation must match transformers wherever the reference's top-2 logit margin is larger than
 * the error could move it (a flip at a near-tie is reported, not failed); a batch of three
 * sequences gives each sequence the logits it gets alone (1e-3). Without a GPU the test exits 77
 * with the reason. */
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
    return test_finish();
#endif
}
