#!/usr/bin/env bash
# session10c_run.sh — the DeltaNet layer's small ops fused (gdn_split_qkv: the q/k/v split of the
# conv output with the q/k L2 norms; gated_rmsnorm: the output norm times silu(z)) on the GPU:
# their test_cuda_ops checks and the gdn/attention/norm groups (KILN_TEST_ONLY), the hybrid parity
# test, Qwen3.5-4B decode (bf16 b1 / b8, q4g64 b1 exact and --fast-math; medians of 2), a
# decode-only per-op profile, and the transformers peer on the same shape.
LIMIT=${LIMIT:-570}
source "$(dirname "$0")/common.sh"
models_converted_in_background qwen3.5-4b:4
build_kiln
run_tests "test_cuda_ops KILN_TEST_ONLY=gdn,gated,norm,attention" test_parity_cuda_hybrid
stamp "tests done"
wait $MODELS
for b in 1 8; do
    stamp "qwen3.5-4b bf16 b$b"
    SHAPES="qwen3.5-4b" FORMATS="bf16" BATCH=$b PROMPT=128 GEN=64 ROUNDS=2 VARIANTS="default" ab_bench
done
stamp "qwen3.5-4b q4 b1"
SHAPES="qwen3.5-4b" FORMATS="q4" BATCH=1 PROMPT=128 GEN=64 ROUNDS=2 VARIANTS="default;--fast-math" ab_bench
stamp "qwen3.5-4b bf16 b1: weight bytes per token, decode-only profile"
"$B/kiln" bench --device cuda --model "$M/qwen3.5-4b" --prompt 128 --gen 64 --runs 1 --json --quiet 2>/dev/null |
    tail -1 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in d if 'decode' in k or 'weight' in k})"
KILN_CUDA_PROFILE=1 timeout 40 "$B/kiln" bench --device cuda --model "$M/qwen3.5-4b" --prompt 4 \
    --gen 32 --runs 1 --json --quiet 2>&1 | grep -E "cuda profile" | head -16 | cut -c14-140
if left 60; then
    stamp "transformers generate: qwen3.5-4b"
    KILN_STAGES=hf KILN_SHAPES=qwen3.5-4b KILN_HF_BATCHES="1 8 64" KILN_HF_TIMEOUT=$((LIMIT - SECONDS - 15)) \
        bash bench/gpu_bench.sh "$B" 2>&1 | grep -E "^hf |^transformers|Error" | cut -c1-200
fi
stamp "end"
