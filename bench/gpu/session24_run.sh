#!/usr/bin/env bash
# session24_run.sh — the twenty-fourth session's GPU calls.
# PART=1: the CUDA tests the twenty-third session wrote after its last call (cuda_link_check in
# test_parity_cuda and test_parity_cuda_gemma: qg_link's hand-offs on the tiny fixtures, inline
# digits off) with the other parity suites, then what the eighteenth session left unmeasured:
# Llama-3-8B bf16 batch 64 (default and fused q/k/v + gate/up weights) and prefill 512, decode at
# 8k context, the batch-64 per-op profile, and MoE decode of 1 / 2 / 4 sequences (4-layer 4-bit
# Qwen3-30B-A3B shape) on the grouped gather against the expert GEMM.
LIMIT=${LIMIT:-560}
PART=${PART:-1}
source "$(dirname "$0")/common.sh"
exec > >(tee "${OUT:-/tmp}/log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ctx() { # model kv batch [VAR=value ...]: decode tok/s at context 8192
    local m=$1 kv=$2 b=$3
    shift 3
    env "$@" timeout 90 "$B/kiln" bench --device cuda --model "$M/$m" --kv $kv --context 8192 \
        --prompt 16 --gen 32 --batch "$b" --runs 3 --json --quiet 2>&1 |
        grep -oE '"decode_tok_s":[0-9.]*' | cut -d: -f2
}
if [ "$PART" = 1 ]; then
    models_converted_in_background llama-3-8b qwen3-30b-a3b-l4:4
    build_kiln
    stamp "tests"
    TEST_TIMEOUT=200 run_tests test_parity_cuda test_parity_cuda_gemma test_parity_cuda_hybrid \
        "test_cuda_ops KILN_TEST_ONLY=test_qgemv"
    grep -E "link|replay" /tmp/test_parity_cuda.log /tmp/test_parity_cuda_gemma.log | head -12 |
        cut -c1-200
    wait $MODELS
    left 120 && echo "llama-3-8b bf16 batch 64 (prefill decode tok/s): default" \
        "$(bench_tok_s llama-3-8b 64 128 64) | KILN_CUDA_FUSE_WEIGHTS=1" \
        "$(bench_tok_s llama-3-8b 64 128 64 KILN_CUDA_FUSE_WEIGHTS=1)"
    left 60 && echo "llama-3-8b bf16 prefill 512 (prefill decode tok/s):" \
        "$(bench_tok_s llama-3-8b 1 512 4)"
    left 60 && echo "llama-3-8b --kv f32 batch 1 context 8192 decode tok/s: $(ctx llama-3-8b f32 1)"
    m=qwen3-30b-a3b-l4-q4
    for b in 1 2 4; do
        left 40 && echo "$m batch $b (prefill decode tok/s): gather $(bench_tok_s $m $b 128 64)" \
            "| KILN_CUDA_MOE_TC=1 $(bench_tok_s $m $b 128 64 KILN_CUDA_MOE_TC=1)"
    done
    op_profile llama-3-8b 64 50
fi
stamp "end"
