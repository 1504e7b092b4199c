#!/usr/bin/env bash
# session9b_run.sh — the hybrid and Gemma decode steps as CUDA graphs: build; the CUDA parity tests
# (their graph-replay checks now cover qwen3_5_text, gemma3_text, gemma4_text and the dense
# synthetic Gemma 4 with KV-shared layers) and the op tests; then batch-1 and batch-8 decode of
# the Qwen3.5-4B and Gemma-4-E4B shapes (bench/make_family_model.py, random bf16 weights) with
# graphs (default) and without (KILN_CUDA_GRAPH=0), interleaved.
LIMIT=${LIMIT:-560}
source "$(dirname "$0")/common.sh"
models_in_background qwen3.5-4b gemma-4-e4b
build_kiln
run_tests test_parity_cuda_hybrid test_parity_cuda_gemma test_parity_cuda test_kv_cuda \
    test_parity_cuda_kv test_cuda_ops
stamp "tests done"
wait $MODELS
for b in 1 8; do
    stamp "batch $b decode: graphs vs launched ops"
    SHAPES="qwen3.5-4b gemma-4-e4b" FORMATS="bf16" BATCH=$b PROMPT=128 GEN=64 ROUNDS=2 \
        VARIANTS="default;KILN_CUDA_GRAPH=0" ab_bench
done
stamp "qwen3.5-4b q4"
SHAPES="qwen3.5-4b" FORMATS="q4" BATCH=1 PROMPT=128 GEN=64 ROUNDS=2 \
    VARIANTS="default;KILN_CUDA_GRAPH=0;--fast-math" ab_bench
stamp "end"
