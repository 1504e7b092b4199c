#!/usr/bin/env bash
# session10e_run.sh — the dp4a GEMV with its next chunks' loads issued a turn ahead (QG_PF,
# KILN_CUDA_QGEMV_PF=1, n = 1): its test_cuda_ops checks (the qgemv groups), the CUDA parity
# tests with it on, the GEMV alone at Llama-3-8B shapes with and without it (exact and fast), and
# batch-1 decode A/B on Qwen3-0.6B and Llama-3-8B q4g64 / q8g64 (medians of 2, interleaved).
# The variant was slower and is not in the tree (docs/gpu.md, tenth session); this script ran
# against the commit that had it and is kept as the record of that measurement.
LIMIT=${LIMIT:-420}
source "$(dirname "$0")/common.sh"
models_converted_in_background qwen3-0.6b:4 llama-3-8b:4 llama-3-8b:8
build_kiln
build_gpu_bench
run_tests "test_cuda_ops KILN_TEST_ONLY=qgemv,qfused" "test_parity_cuda KILN_CUDA_QGEMV_PF=1"
stamp "tests done"
for mode in exact fast; do
    stamp "GEMV alone, $mode"
    gemv_micro $mode "^copy|\[dp4a R=0 KS=0\]|\[dp4a R=0 KS=0 pf\]"
done
wait $MODELS
for s in qwen3-0.6b llama-3-8b; do
    left 40 || break
    stamp "$s b1 decode: loads a turn ahead or not"
    SHAPES="$s" FORMATS="q4 q8" BATCH=1 PROMPT=128 GEN=64 ROUNDS=2 \
        VARIANTS="default;KILN_CUDA_QGEMV_PF=1" ab_bench
done
stamp "end"
