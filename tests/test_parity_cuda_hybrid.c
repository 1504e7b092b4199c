/* test_parity_cuda_hybrid.c — test_families.c's Qwen hybrid and MoE fixtures on the GPU:
 * qwen3_next (Gated DeltaNet + gated attention + MoE with a shared expert), qwen3_5_text (unfused
 * DeltaNet projections, dense MLP) and qwen3_moe (attention + MoE), HF bf16 and MLX 4/8-bit,
 * loaded with device = KILN_DEVICE_CUDA. Through fixture_parity_check, as test_parity_cuda.c does
 * for the Llama family: logits of one full forward (DeltaNet prefill over all tokens) and of
 * token-by-token decoding (recurrent state in device memory) match transformers' float32 logits
 * within relative L2 1e-3, the greedy continuation matches (a flip at a near-tie is reported, not
 * failed), and a batch of three sequences with their own recurrent states gives each the logits it
 * gets alone. Decode steps of the dense hybrid (qwen3_5_text: conv and delta-rule states as
 * recorded launch arguments) and of the MoE models (routing on the device: moe_route,
 * matmul_gather, moe_combine) replay from CUDA graphs with the same bits as launched ops; the MoE
 * fixtures pass again with host routing (KILN_MOE_DEVICE_TOKENS=0) and with the gathers on the
 * tensor-core expert GEMM (kiln_cuda_set_moe_tc). Without a GPU the test exits 77 with the
 * reason. */
#include "kiln.h"
#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#endif
#include "cuda_graph_check.h"
#include "fixture_parity.h"
#include "model/moe.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#define TOL 1e-3

static const char *fixtures[] = {
    "qwen3_next", "qwen3_next-mlx-q4g32", "qwen3_next-mlx-q8g64", "qwen3_5_text",
    "qwen3_moe",  "qwen3_moe-mlx-q4g32",  "qwen3_moe-mlx-q8g64",
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
    /* the MoE blocks above routed on the device (up to 64 tokens: all of these forwards); the
     * bucketed forward with host routing, which longer prefills take, once more */
    const long device_calls = kiln_moe_device_calls();
    CHECK_MSG(device_calls > 0, "no MoE block routed on the device");
    setenv("KILN_MOE_DEVICE_TOKENS", "0", 1);
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
        if (strstr(fixtures[i], "moe")) fixture_parity_check(fixtures[i], &o);
    CHECK_MSG(kiln_moe_device_calls() == device_calls, "KILN_MOE_DEVICE_TOKENS=0 still routed "
                                                       "on the device");
    unsetenv("KILN_MOE_DEVICE_TOKENS");
    /* and with every gather on the tensor-core expert GEMM (by default batches of 16 pairs and
     * more take it; this puts the decode steps' few pairs on it too) */
    kiln_cuda_set_moe_tc(1);
    const long long tc0 = kiln_cuda_tc_gemm_launches();
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
        if (strstr(fixtures[i], "moe") || strstr(fixtures[i], "next"))
            fixture_parity_check(fixtures[i], &o);
    CHECK_MSG(kiln_cuda_tc_gemm_launches() > tc0, "the expert GEMM never ran");
    kiln_cuda_set_moe_tc(-2);
    cuda_graph_replay_check("qwen3_5_text", test_shared("fixtures/qwen3_5_text"));
    /* MoE decode steps (routing on the device) now record as graphs too */
    cuda_graph_replay_check("qwen3_moe", test_shared("fixtures/qwen3_moe"));
    cuda_graph_replay_check("qwen3_next-mlx-q4g32", test_shared("fixtures/qwen3_next-mlx-q4g32"));
    return test_finish();
#endif
}
