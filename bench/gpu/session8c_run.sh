#!/usr/bin/env bash
# session8c_run.sh — the eighth session's third GPU call: build; the CUDA tests after the dp4a
# GEMV's and the short decode attention's loads lost their dtype branches; the dp4a GEMV alone at
# Llama-3-8B shapes (exact, then fast) against the session's first call (q4g64 14336x4096 n = 1
# 20.9 us); batch-1 decode of the quantized models (exact and --fast-math) and of bf16 with f32 vs
# f16 KV. LIMIT s in all.
LIMIT=${LIMIT:-400}
source "$(dirname "$0")/common.sh"
models_converted_in_background qwen3-0.6b:4 qwen3-0.6b:8 llama-3-8b:4 llama-3-8b:8
build_kiln
build_gpu_bench
run_tests test_cuda_ops test_parity_cuda test_kv_cuda test_parity_cuda_kv test_parity_cuda_hybrid
stamp "tests done"
for mode in exact fast; do
    left 100 || break
    stamp "micro: dp4a GEMV, $mode"
    gemv_micro $mode "^copy|\[dp4a R=0 KS=0\]"
done
wait $MODELS
stamp "batch 1 decode, quantized: exact vs fast"
SHAPES="llama-3-8b qwen3-0.6b" FORMATS="q4 q8" PROMPT=128 GEN=64 ROUNDS=2 \
    VARIANTS="default;--fast-math" ab_bench
stamp "batch 1 decode, bf16: f32 vs f16 KV"
SHAPES="qwen3-0.6b llama-3-8b" FORMATS="bf16" PROMPT=128 GEN=64 ROUNDS=2 \
    VARIANTS="default;--kv f16" ab_bench
stamp "end"
