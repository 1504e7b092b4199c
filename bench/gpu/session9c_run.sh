#!/usr/bin/env bash
# session9c_run.sh — where the hybrid and Gemma batch-1 decode steps spend their time now that they
# replay graphs: the register-resident delta rule (KILN_CUDA_GDN=2) through the hybrid parity test
# and A/B against the default kernel (Qwen3.5-4B shape, batch 1 and 8); decode-only per-op
# profiles (KILN_CUDA_PROFILE=1: every op waited for, ~4 us of sync in each) of the Qwen3.5-4B and
# Gemma-4-E4B shapes; kiln bench's weight bytes per token for the % of copy.
LIMIT=${LIMIT:-480}
source "$(dirname "$0")/common.sh"
models_in_background qwen3.5-4b gemma-4-e4b
build_kiln
run_tests "test_parity_cuda_hybrid KILN_CUDA_GDN=2"
wait $MODELS
for s in qwen3.5-4b gemma-4-e4b; do
    stamp "$s bf16 b1: weight bytes per token, decode tok/s"
    "$B/kiln" bench --device cuda --model "$M/$s" --prompt 128 --gen 64 --runs 2 --json --quiet 2>/dev/null |
        tail -1 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in d if 'decode' in k or 'weight' in k or 'gb' in k})"
    stamp "$s bf16 b1 decode-only profile"
    KILN_CUDA_PROFILE=1 "$B/kiln" bench --device cuda --model "$M/$s" --prompt 4 --gen 32 --runs 1 \
        --json --quiet 2>&1 | grep -E "cuda profile" | head -22 | cut -c14-140
done
for b in 1 8; do
    stamp "qwen3.5-4b b$b: delta rule kernels"
    SHAPES="qwen3.5-4b" FORMATS="bf16" BATCH=$b PROMPT=128 GEN=64 ROUNDS=2 \
        VARIANTS="default;KILN_CUDA_GDN=2" ab_bench
done
stamp "end"
