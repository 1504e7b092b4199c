#!/usr/bin/env bash
# session11b_run.sh — where batch-64 decode loses to llama.cpp (session11_run.sh measured 8B
# bf16 0.86x, q8 / q4 0.52x in exact mode): the per-op profile of Llama-3-8B bf16 at batch 64,
# then A/B of the quantized batch-64 path in exact mode — the tensor-core GEMM on codes (default
# below 128 tokens) against dequantize + cuBLAS from 64 or 32 tokens (KILN_CUDA_DEQUANT_MIN_N) —
# and of fast mode at batch 8 (dequantize + cuBLAS from 8 tokens, KILN_CUDA_DEQUANT_MIN_N_FAST),
# with test_parity_cuda run with the cuBLAS path from 16 tokens (the fixtures' prompts take it).
LIMIT=${LIMIT:-420}
source "$(dirname "$0")/common.sh"
models_converted_in_background qwen3-0.6b:4 llama-3-8b:4 llama-3-8b:8
build_kiln
run_tests "test_parity_cuda KILN_CUDA_DEQUANT_MIN_N=16"
wait $MODELS
bench() { # model batch env...: decode tok/s (median of 2, prompt 128, gen 64)
    local m=$1 b=$2
    shift 2
    env "$@" "$B/kiln" bench --device cuda --model "$M/$m" --prompt 128 --gen 64 --batch "$b" \
        --runs 2 --json --quiet 2>&1 | grep -o '"decode_tok_s":[0-9.]*' | cut -d: -f2
}
stamp "profile llama-3-8b bf16 batch 64"
KILN_CUDA_PROFILE=1 $B/kiln bench --device cuda --model $M/llama-3-8b --prompt 128 --gen 8 \
    --batch 64 --runs 1 --json --quiet 2>&1 | grep -E "cuda profile" | head -12 | cut -c1-150
for m in llama-3-8b-q4 llama-3-8b-q8 qwen3-0.6b-q4; do
    left 40 || break
    echo "$m b64 exact: codes GEMM $(bench $m 64) | cuBLAS from 64 $(bench $m 64 KILN_CUDA_DEQUANT_MIN_N=64) | from 32 $(bench $m 64 KILN_CUDA_DEQUANT_MIN_N=32)"
done
for m in llama-3-8b-q4 llama-3-8b-q8; do
    left 30 || break
    echo "$m b8 fast: codes GEMM $(bench $m 8 KILN_MATMUL=fast) | cuBLAS from 8 $(bench $m 8 KILN_MATMUL=fast KILN_CUDA_DEQUANT_MIN_N_FAST=8)"
done
stamp "end"
