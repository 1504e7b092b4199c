#!/usr/bin/env bash
# session8_run.sh — the eighth session's first GPU call: build; every CUDA test, and test_cuda_ops'
# quantized decode fusion checks (KILN_TEST_QFUSED=1, three runs: the race they showed was
# intermittent) now that kernels read activations, caches and scratch with coherent loads instead
# of __ldg, also with 8 chunks in flight (KILN_CUDA_QGEMV_INFLIGHT=8); the dp4a GEMV alone at
# Llama-3-8B shapes, 4 vs 8 chunks in flight; batch-1 decode A/B of the fusions and the in-flight
# knob; a per-op profile of Llama-3-8B q4 decode; bf16 Qwen3-0.6B batch 1 with f32 vs f16 KV at
# gen 64. LIMIT s in all.
LIMIT=${LIMIT:-560}
source "$(dirname "$0")/common.sh"
models_converted_in_background qwen3-0.6b qwen3-0.6b:4 llama-3-8b:4 llama-3-8b:8
build_kiln
build_gpu_bench
Q="test_cuda_ops KILN_TEST_QFUSED=1 KILN_TEST_ONLY=qgemv"
run_tests test_cuda_ops "$Q" "$Q" "$Q" "$Q KILN_CUDA_QGEMV_INFLIGHT=8" test_parity_cuda \
    "test_parity_cuda KILN_CUDA_QFUSED=1" test_parity_cuda_hybrid test_parity_cuda_gemma test_kv_cuda \
    test_parity_cuda_kv
stamp "tests done"
if left 120; then
    stamp "micro: dp4a GEMV at Llama-3-8B shapes, 4 (default) vs 8 chunks in flight"
    for inf in 4 8; do
        KILN_CUDA_QGEMV_INFLIGHT=$inf KILN_BENCH_GEMV_FMTS="q4g64 q8g64" \
            timeout 60 $B/kiln_gpu_bench gemv 2>&1 | grep -E "^copy|^best|\[dp4a R=0 KS=0\]" |
            sed "s/^/if=$inf /" | cut -c1-130
    done
fi
wait $MODELS
AB() { left 40 && bash bench/gpu/ab_decode.sh $B/kiln 2>&1 | grep -vE "^\s*$" | cut -c1-170; }
stamp "batch 1 decode: quantized fusions (QFUSED) and 8 chunks in flight"
SHAPES="llama-3-8b" FORMATS="q4 q8" BATCHES=1 ROUNDS=2 GEN=64 \
    VARIANTS="default;KILN_CUDA_QFUSED=1;KILN_CUDA_QFUSED=1,KILN_CUDA_QGEMV_INFLIGHT=8" AB
SHAPES="qwen3-0.6b" FORMATS="q4" BATCHES=1 ROUNDS=2 GEN=64 \
    VARIANTS="default;KILN_CUDA_QFUSED=1;KILN_CUDA_QFUSED=1,KILN_CUDA_QGEMV_INFLIGHT=8" AB
if left 40; then
    stamp "profile Llama-3-8B q4 b1 (QFUSED=1)"
    KILN_CUDA_QFUSED=1 KILN_CUDA_PROFILE=1 timeout 40 $B/kiln bench --device cuda --model $M/llama-3-8b-q4 \
        --prompt 4 --gen 16 --batch 1 --runs 1 --json --quiet 2>&1 | grep -E "cuda profile" | head -16 | cut -c15-130
fi
if left 40; then
    stamp "bf16 0.6B b1, f32 vs f16 KV, gen 64"
    for r in 1 2; do
        for kv in f32 f16; do
            v=$(timeout 30 $B/kiln bench --device cuda --model $M/qwen3-0.6b --prompt 128 --gen 64 --batch 1 \
                --runs 1 --kv $kv --json --quiet 2>/dev/null | grep -oE '"decode_tok_s":[^,]*')
            echo "kv $kv round $r: $v"
        done
    done
fi
stamp "end"
