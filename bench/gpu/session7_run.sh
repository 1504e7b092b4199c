#!/usr/bin/env bash
# session7_run.sh — the seventh session's first GPU call: build; the dequantize + cuBLAS GEMM
# (test_cuda_ops' dequant and matmul groups; test_kv_cuda with the plain-float paged kinds after
# the 16-bit record stores; test_parity_cuda as shipped and with the exact
# three-product path forced from 9 tokens); then prefill 512 and batch-64 decode under exact /
# fast (--fast-math) matmuls and f32 / f16 KV caches, interleaved (ab_bench.sh). LIMIT s in all.
LIMIT=${LIMIT:-560}
source "$(dirname "$0")/common.sh"
models_in_background qwen3-0.6b llama-3-8b
build_kiln
(
    wait $MODELS 2>/dev/null
    while [ ! -f $M/llama-3-8b/model.safetensors ]; do sleep 2; done
    $B/kiln convert --model $M/qwen3-0.6b --out $M/qwen3-0.6b-q4 --bits 4 --group 64 --quiet >/dev/null 2>&1 &
    $B/kiln convert --model $M/llama-3-8b --out $M/llama-3-8b-q4 --bits 4 --group 64 --quiet >/dev/null 2>&1 &
    $B/kiln convert --model $M/llama-3-8b --out $M/llama-3-8b-q8 --bits 8 --group 64 --quiet >/dev/null 2>&1 &
    wait
    echo "== [t=${SECONDS}s] converted"
) &
CONV=$!
P=()
(KILN_TEST_ONLY="dequant_gemm,matmul()" run_test test_cuda_ops) >/tmp/a.out &
P+=($!)
run_test test_parity_cuda >/tmp/b.out &
P+=($!)
run_test test_parity_cuda KILN_CUDA_DEQUANT_MIN_N=9 >/tmp/c.out &
P+=($!)
run_test test_kv_cuda KILN_TEST_PLAIN_PAGED=1 >/tmp/d.out &
P+=($!)
wait "${P[@]}"
cat /tmp/a.out /tmp/b.out /tmp/c.out /tmp/d.out
stamp "tests done"
wait $MODELS
AB() { left 45 && bash bench/gpu/ab_bench.sh $B/kiln 2>&1 | grep -vE "^\s*$" | cut -c1-230; }
stamp "prefill 512, bf16"
SHAPES="qwen3-0.6b llama-3-8b" FORMATS=bf16 PROMPT=512 GEN=16 ROUNDS=2 \
    VARIANTS="default;--kv f16;--fast-math;--fast-math --kv f16" AB
wait $CONV
stamp "prefill 512, quantized (DEQUANT_MIN_N=100000: the tensor-core GEMM as before)"
SHAPES="qwen3-0.6b llama-3-8b" FORMATS="q4" PROMPT=512 GEN=16 ROUNDS=2 \
    VARIANTS="KILN_CUDA_DEQUANT_MIN_N=100000;default;--fast-math --kv f16" AB
SHAPES="llama-3-8b" FORMATS="q8" PROMPT=512 GEN=16 ROUNDS=2 \
    VARIANTS="KILN_CUDA_DEQUANT_MIN_N=100000;default;--fast-math --kv f16" AB
stamp "batch 64 decode"
SHAPES="llama-3-8b qwen3-0.6b" FORMATS="bf16" BATCH=64 PROMPT=128 GEN=32 ROUNDS=2 \
    VARIANTS="default;--fast-math;--fast-math --kv f16" AB
SHAPES="llama-3-8b qwen3-0.6b" FORMATS="q4" BATCH=64 PROMPT=128 GEN=32 ROUNDS=2 \
    VARIANTS="default;--fast-math KILN_CUDA_DEQUANT_MIN_N_FAST=100000;--fast-math" AB
stamp "end"
