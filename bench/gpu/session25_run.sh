#!/usr/bin/env bash
# session25_run.sh — the twenty-fifth session's GPU call: the MoE expert GEMM from 16 pairs (was
# 64; the first call's A/B: one token's 8 pairs faster on the grouped gather, 2-7 tokens 1.1-1.85x
# faster on the expert GEMM) checked and measured against the gather (KILN_CUDA_MOE_TC=0), the
# CUDA parity and op tests over it, and the quantized GEMV's hand-off at batch 4 (qg_emit without
# the arrival count where a block holds a whole 32-row group); Llama-3-8B bf16 batch 64 with the
# fused q/k/v and gate/up weights (KILN_CUDA_FUSE_WEIGHTS=1: +5% in the first call) once more.
LIMIT=${LIMIT:-330}
source "$(dirname "$0")/common.sh"
exec > >(tee "${OUT:-/tmp}/log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# SHAPES: the models to make (a short call: SHAPES=qwen3-30b-a3b-l4:4 LIMIT=190, tests and MoE)
models_converted_in_background ${SHAPES:-qwen3-30b-a3b-l4:4 llama-3-8b:4}
build_minimal test_parity_cuda_hybrid test_cuda_ops test_parity_cuda
stamp "tests"
TEST_TIMEOUT=120 run_tests test_parity_cuda_hybrid "test_parity_cuda KILN_CUDA_FUSE_WEIGHTS=1" \
    "test_cuda_ops KILN_TEST_ONLY=test_moe,test_qgemv_link,test_upload_matrices"
while kill -0 "$MODELS" 2>/dev/null && left 60; do sleep 2; done
m=qwen3-30b-a3b-l4-q4
for b in 1 2 4; do
    left 40 && echo "$m batch $b (prefill decode tok/s): default $(bench_tok_s $m $b 128 64)" \
        "| KILN_CUDA_MOE_TC=0 $(bench_tok_s $m $b 128 64 KILN_CUDA_MOE_TC=0)"
done
left 90 && echo "llama-3-8b bf16 batch 64 (prefill decode tok/s): default" \
    "$(bench_tok_s llama-3-8b 64 128 64) | KILN_CUDA_FUSE_WEIGHTS=1" \
    "$(bench_tok_s llama-3-8b 64 128 64 KILN_CUDA_FUSE_WEIGHTS=1) | default" \
    "$(bench_tok_s llama-3-8b 64 128 64)"
for b in 4 1; do
    left 40 && echo "llama-3-8b-q4 batch $b exact (prefill decode tok/s): no link" \
        "$(bench_tok_s llama-3-8b-q4 $b 128 64) | link 1" \
        "$(bench_tok_s llama-3-8b-q4 $b 128 64 KILN_CUDA_QGEMV_LINK=1) | no link" \
        "$(bench_tok_s llama-3-8b-q4 $b 128 64)"
done
stamp "end"
