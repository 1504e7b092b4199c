#!/usr/bin/env bash
# session10d_run.sh — q/k norm + RoPE as one op on the hybrid full-attention layers (their
# norms' 1 + w folded into the weights at load; decode steps hand it to the contiguous cache's
# store + attention) and on Gemma 3: the hybrid, Gemma and KV-kind parity tests on the GPU, then
# Qwen3.5-4B decode (bf16 b1 / b8, q4g64 b1; medians of 2) and Gemma-4-E4B bf16 b1.
LIMIT=${LIMIT:-500}
source "$(dirname "$0")/common.sh"
models_converted_in_background qwen3.5-4b:4 gemma-4-e4b
build_kiln
run_tests test_parity_cuda_hybrid test_parity_cuda_gemma test_parity_cuda_kv
stamp "tests done"
wait $MODELS
for b in 1 8; do
    stamp "qwen3.5-4b bf16 b$b"
    SHAPES="qwen3.5-4b" FORMATS="bf16" BATCH=$b PROMPT=128 GEN=64 ROUNDS=2 VARIANTS="default" ab_bench
done
stamp "qwen3.5-4b q4 b1"
SHAPES="qwen3.5-4b" FORMATS="q4" BATCH=1 PROMPT=128 GEN=64 ROUNDS=2 VARIANTS="default" ab_bench
stamp "gemma-4-e4b bf16 b1"
SHAPES="gemma-4-e4b" FORMATS="bf16" BATCH=1 PROMPT=128 GEN=64 ROUNDS=2 VARIANTS="default" ab_bench
stamp "end"
