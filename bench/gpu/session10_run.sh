#!/usr/bin/env bash
# session10_run.sh — the tenth session's changes on the GPU in one call: the short decode attention
# for head dims above 128 with a group split over blocks (Qwen3.5-4B: 4 heads of 256 per KV head;
# Gemma 4: 256 / 512), Gemma's decode layers on the fused ops, the register-resident delta rule
# as the default. Tests (test_cuda_ops, the CUDA parity tests), then A/B decode on the Qwen3.5-4B
# and Gemma-4-E4B shapes (bf16, batch 1 and 8; variants interleaved, medians of 2) against
# KILN_CUDA_ATT_SHORT=0 (the split kernel + merge), KILN_CUDA_GDN=1 (the column-per-thread delta
# rule) and KILN_CUDA_FUSED=0 (fused ops as compositions), a Qwen3-0.6B batch-1 check, and a
# decode-only per-op profile of Gemma-4-E4B.
LIMIT=${LIMIT:-560}
source "$(dirname "$0")/common.sh"
models_in_background qwen3.5-4b gemma-4-e4b qwen3-0.6b
build_kiln
TEST_TIMEOUT=240 run_tests test_cuda_ops test_parity_cuda_gemma test_parity_cuda_hybrid \
    test_parity_cuda test_kv_cuda
stamp "tests done"
wait $MODELS
for b in 1 8; do
    stamp "qwen3.5-4b bf16 b$b"
    SHAPES="qwen3.5-4b" FORMATS="bf16" BATCH=$b PROMPT=128 GEN=64 ROUNDS=2 \
        VARIANTS="default;KILN_CUDA_ATT_SHORT=0;KILN_CUDA_GDN=1" ab_bench
    stamp "gemma-4-e4b bf16 b$b"
    SHAPES="gemma-4-e4b" FORMATS="bf16" BATCH=$b PROMPT=128 GEN=64 ROUNDS=2 \
        VARIANTS="default;KILN_CUDA_ATT_SHORT=0;KILN_CUDA_FUSED=0" ab_bench
done
stamp "qwen3-0.6b bf16 b1"
SHAPES="qwen3-0.6b" FORMATS="bf16" BATCH=1 PROMPT=128 GEN=64 ROUNDS=2 VARIANTS="default" ab_bench
if left 45; then
    stamp "gemma-4-e4b bf16 b1 decode-only profile"
    KILN_CUDA_PROFILE=1 timeout 40 "$B/kiln" bench --device cuda --model "$M/gemma-4-e4b" --prompt 4 \
        --gen 32 --runs 1 --json --quiet 2>&1 | grep -E "cuda profile" | head -16 | cut -c14-140
fi
stamp "end"
