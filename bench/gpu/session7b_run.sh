#!/usr/bin/env bash
# session7b_run.sh — the seventh session's second GPU call: build; every CUDA test (test_cuda_ops
# with the fast-mode dp4a and dequantize checks, the parity tests, test_kv_cuda and
# test_parity_cuda_kv with the plain-float paged kinds); then batch-1 decode of the quantized
# models, exact vs --fast-math (x as one int8 digit in the dp4a GEMV), interleaved. LIMIT s in all.
LIMIT=${LIMIT:-520}
source "$(dirname "$0")/common.sh"
(
    for s in qwen3-0.6b llama-3-8b; do
        make_model $s
    done
    while [ ! -x $B/kiln ]; do sleep 2; done # (the first run converted before the build: none)
    $B/kiln convert --model $M/qwen3-0.6b --out $M/qwen3-0.6b-q4 --bits 4 --group 64 --quiet >/dev/null 2>&1 &
    $B/kiln convert --model $M/qwen3-0.6b --out $M/qwen3-0.6b-q8 --bits 8 --group 64 --quiet >/dev/null 2>&1 &
    $B/kiln convert --model $M/llama-3-8b --out $M/llama-3-8b-q4 --bits 4 --group 64 --quiet >/dev/null 2>&1 &
    $B/kiln convert --model $M/llama-3-8b --out $M/llama-3-8b-q8 --bits 8 --group 64 --quiet >/dev/null 2>&1 &
    wait
    echo "== [t=${SECONDS}s] models converted"
) &
MODELS=$!
build_kiln
P=()
run_test test_cuda_ops >/tmp/a.out &
P+=($!)
run_test test_parity_cuda >/tmp/b.out &
P+=($!)
run_test test_parity_cuda_hybrid >/tmp/c.out &
P+=($!)
run_test test_parity_cuda_gemma >/tmp/d.out &
P+=($!)
run_test test_kv_cuda >/tmp/e.out &
P+=($!)
run_test test_parity_cuda_kv >/tmp/f.out &
P+=($!)
wait "${P[@]}"
cat /tmp/a.out /tmp/b.out /tmp/c.out /tmp/d.out /tmp/e.out /tmp/f.out
stamp "tests done"
wait $MODELS
AB() { left 45 && bash bench/gpu/ab_bench.sh $B/kiln 2>&1 | grep -vE "^\s*$" | cut -c1-230; }
stamp "batch 1, quantized: exact vs fast (one int8 digit of x)"
SHAPES="llama-3-8b qwen3-0.6b" FORMATS="q4 q8" PROMPT=128 GEN=64 ROUNDS=2 \
    VARIANTS="default;--fast-math;--fast-math --kv f16" AB
stamp "batch 8 / 64, quantized 0.6B and 8B, fast"
SHAPES="qwen3-0.6b llama-3-8b" FORMATS="q4 q8" BATCH=8 PROMPT=128 GEN=32 ROUNDS=1 \
    VARIANTS="default;--fast-math --kv f16" AB
SHAPES="qwen3-0.6b llama-3-8b" FORMATS="q8" BATCH=64 PROMPT=128 GEN=32 ROUNDS=1 \
    VARIANTS="default;--fast-math --kv f16" AB
stamp "bf16 batch 8, exact vs fast"
SHAPES="qwen3-0.6b llama-3-8b" FORMATS="bf16" BATCH=8 PROMPT=128 GEN=32 ROUNDS=1 \
    VARIANTS="default;--fast-math --kv f16" AB
stamp "end"
