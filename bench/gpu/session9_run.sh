#!/usr/bin/env bash
# session9_run.sh — prepared for the next GPU call: build; test_cuda_ops (its test_qgemv_mma group
# runs the int8 tensor-core GEMV, k_qgemv_mma, for the first time on a GPU) and test_parity_cuda
# with the kernel on (KILN_CUDA_QGEMV_MMA=1); the decode GEMVs alone (the "mma" variant against
# dp4a's); batch-1 decode of the quantized models, dp4a (default) vs mma, exact and fast.
LIMIT=${LIMIT:-540}
source "$(dirname "$0")/common.sh"
models_converted_in_background qwen3-0.6b:4 qwen3-0.6b:8 llama-3-8b:4 llama-3-8b:8
build_kiln
build_gpu_bench
run_tests test_cuda_ops "test_parity_cuda KILN_CUDA_QGEMV_MMA=1" test_parity_cuda
stamp "tests done"
for mode in exact fast; do
    left 120 || break
    stamp "micro: decode GEMVs, $mode (mma vs dp4a)"
    gemv_micro $mode "^copy|^best|\[dp4a R=0 KS=0\]|\[mma"
done
wait $MODELS
stamp "batch 1 decode: dp4a vs mma"
SHAPES="llama-3-8b qwen3-0.6b" FORMATS="q4 q8" PROMPT=128 GEN=64 ROUNDS=2 \
    VARIANTS="default;KILN_CUDA_QGEMV_MMA=1;--fast-math;--fast-math KILN_CUDA_QGEMV_MMA=1" ab_bench
stamp "end"
