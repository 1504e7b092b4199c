#!/usr/bin/env bash
# session10b_run.sh — Gemma's post-norm residuals as one op (norm_add: x = (x + rmsnorm(h)) * s)
# on the GPU: test_cuda_ops (its kernel against the CPU reference) and the Gemma parity test,
# Gemma-4-E4B bf16 decode at batch 1 / 8 against KILN_CUDA_FUSED=0 (medians of 2, interleaved),
# batch 64 of the Qwen3.5-4B and Gemma-4-E4B shapes, and the transformers peer (generate, bf16,
# sdpa, static cache) on both shapes at batch 1 / 8 / 64, same call.
LIMIT=${LIMIT:-570}
source "$(dirname "$0")/common.sh"
models_in_background qwen3.5-4b gemma-4-e4b
build_kiln
TEST_TIMEOUT=200 run_tests test_cuda_ops test_parity_cuda_gemma
stamp "tests done"
wait $MODELS
for b in 1 8; do
    stamp "gemma-4-e4b bf16 b$b"
    SHAPES="gemma-4-e4b" FORMATS="bf16" BATCH=$b PROMPT=128 GEN=64 ROUNDS=2 \
        VARIANTS="default;KILN_CUDA_FUSED=0" ab_bench
done
for s in qwen3.5-4b gemma-4-e4b; do
    stamp "$s bf16 b64"
    SHAPES="$s" FORMATS="bf16" BATCH=64 PROMPT=128 GEN=32 ROUNDS=1 VARIANTS="default" ab_bench
done
for s in qwen3.5-4b gemma-4-e4b; do
    left 60 || break
    stamp "transformers generate: $s"
    KILN_STAGES=hf KILN_SHAPES=$s KILN_HF_BATCHES="1 8 64" KILN_HF_TIMEOUT=$((LIMIT - SECONDS - 15)) \
        bash bench/gpu_bench.sh "$B" 2>&1 | grep -E "^hf |transformers|Error|error" | head -8 | cut -c1-200
done
stamp "end"
