#!/usr/bin/env bash
# session8d_run.sh — the eighth session's last GPU call (about 6 minutes of device time left):
# build; test_parity_cuda_gemma (not run since the short attention's dtype change); the dp4a GEMV
# alone with every rows-per-warp / split variant (best per shape, exact); batch-8 decode of the
# quantized models with the new GEMV (exact and fast + f16 KV); Llama-3-8B q4 batch 1 in
# llama.cpp's configuration (--fast-math --kv f16); a per-op profile of Llama-3-8B q4 batch 1.
LIMIT=${LIMIT:-330}
source "$(dirname "$0")/common.sh"
models_converted_in_background qwen3-0.6b:4 llama-3-8b:4 llama-3-8b:8
build_kiln
build_gpu_bench
run_test test_parity_cuda_gemma >/tmp/g.out &
T=$!
stamp "micro: dp4a GEMV, every variant, exact (best per shape)"
KILN_BENCH_GEMV_FMTS="q4g64 q8g64" timeout 90 $B/kiln_gpu_bench gemv 2>&1 | grep -E "^best" | grep "n=1" | cut -c1-110
wait $T
cat /tmp/g.out
wait $MODELS
stamp "batch 8 decode, quantized"
SHAPES="llama-3-8b qwen3-0.6b" FORMATS="q4" BATCH=8 PROMPT=128 GEN=32 ROUNDS=1 \
    VARIANTS="default;--fast-math --kv f16" ab_bench
SHAPES="llama-3-8b" FORMATS="q8" BATCH=8 PROMPT=128 GEN=32 ROUNDS=1 \
    VARIANTS="default;--fast-math --kv f16" ab_bench
stamp "batch 1, Llama-3-8B q4/q8 as llama.cpp runs (--fast-math --kv f16)"
SHAPES="llama-3-8b" FORMATS="q4 q8" BATCH=1 PROMPT=128 GEN=64 ROUNDS=1 VARIANTS="--fast-math --kv f16" ab_bench
if left 30; then
    stamp "profile Llama-3-8B q4 b1"
    KILN_CUDA_PROFILE=1 timeout 30 $B/kiln bench --device cuda --model $M/llama-3-8b-q4 \
        --prompt 4 --gen 16 --batch 1 --runs 1 --json --quiet 2>&1 | grep -E "cuda profile" | head -9 | cut -c15-130
fi
stamp "end"
