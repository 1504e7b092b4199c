#!/usr/bin/env bash
# session13_run.sh — first GPU run of what the thirteenth session wrote with no GPU (checked only
# by the CPU emulators): the tensor-core GEMM's int8 variant (gemm_tc_int8.cuh: x as signed-byte
# digits, mma m16n8k32 on the codes; KILN_CUDA_TC_INT8=1) and the tensor-core prefill attention
# over f32 caches as bf16 hi + lo pairs (attention_prefill_tc.cu SPLIT; KILN_CUDA_FA_F32=2), and
# the L2 prefetch hint before decode attention (prefetch.cu; KILN_CUDA_PREFETCH_MB). Two calls on
# one warm machine:
#  PART=1: build; test_cuda_ops' tensor-core tests (GEMM: f16 kernels, then the int8 variant in
#    exact and fast mode; prefill attention, the split among them); test_parity_cuda with each on
#    (the attention forced onto every step, KILN_CUDA_FA=2); the per-matrix times of both GEMM
#    kernels at Llama-3-8B shapes (kiln_gpu_bench tc, 4/8-bit g64); the qwen3_next --kv q4
#    parity case alone with the MoE routing log (bench/gpu/moe_route_diff.py names the first
#    routing difference between the CPU model and the device one).
#  PART=2: batch-1 decode of Llama-3-8B q4 / q8 / bf16 with prefetch budgets 0 / 16 / 32 / 48 MB;
#    exact-mode prefill 512 / 4096 of Qwen3-0.6B and Llama-3-8B bf16 with the f32 cache's
#    attention on CUDA cores (default) | as bf16 | as pairs; then decode at batch 64 (and 16) and
#    prefill 512 on Llama-3-8B q4 / q8 and Qwen3-0.6B q4, exact and fast mode, most wanted first:
#    the default path, the f16 codes GEMM and the int8 variant (both kept past the sizes that go
#    to dequantize + cuBLAS by default).
# Logs stay in /tmp; summaries go to stdout.
LIMIT=${LIMIT:-570}
PART=${PART:-1}
source "$(dirname "$0")/common.sh"
models_converted_in_background qwen3-0.6b:4 llama-3-8b:4 llama-3-8b:8
if [ "$PART" = 1 ]; then
    build_kiln
    build_gpu_bench
    run_tests "test_cuda_ops KILN_TEST_ONLY=test_tc_gemm,test_tc_fused,test_attention_tc,test_prefetch" \
        "test_parity_cuda KILN_CUDA_TC_INT8=1" "test_parity_cuda KILN_CUDA_FA=2 KILN_CUDA_FA_F32=2" \
        "test_parity_cuda KILN_CUDA_PREFETCH_MB=48"
    stamp "kiln_gpu_bench tc"
    KILN_BENCH_TC_SHAPES="14336x4096 4096x14336 6144x4096" KILN_BENCH_TC_FMTS="q4g64 q8g64" \
        timeout 150 "$B/kiln_gpu_bench" tc 2>&1 | grep -E "copy|\[(tc|int8|int8 fast|old)\]" |
        cut -c1-140
    if left 60; then
        stamp "qwen3_next --kv q4 parity with the MoE routing log"
        KILN_TEST_FIXTURE=qwen3_next KILN_TEST_KV=q4 KILN_MOE_LOG=/tmp/routes.log timeout 120 \
            "$B/test_parity_cuda_kv" >/tmp/kv.log 2>&1
        echo "test_parity_cuda_kv (qwen3_next q4) rc=$? | $(grep -E "checks, " /tmp/kv.log | tail -1)"
        grep -E "CHECK failed|qwen3_next" /tmp/kv.log | head -4 | cut -c1-300
        python3 bench/gpu/moe_route_diff.py --consecutive /tmp/routes.log | head -8
    fi
else
    [ -x "$B/kiln" ] || build_kiln
    wait $MODELS
    # the GEMM past the sizes that go to dequantize + cuBLAS (exact from 128 tokens, fast from 32)
    GEMM="KILN_CUDA_DEQUANT_MIN_N=100000 KILN_CUDA_DEQUANT_MIN_N_FAST=100000"
    line() { # model mode batch prompt gen: default | the f16 codes GEMM | the int8 variant
        left 45 || return 1
        echo "$1 $2 batch $3 prompt $4 (prefill decode tok/s): default $(bench_tok_s "$1" "$3" "$4" "$5" \
            KILN_MATMUL=$2) | f16 codes $(bench_tok_s "$1" "$3" "$4" "$5" KILN_MATMUL=$2 $GEMM) | int8 \
$(bench_tok_s "$1" "$3" "$4" "$5" KILN_MATMUL=$2 $GEMM KILN_CUDA_TC_INT8=1)"
    }
    line_fa() { # model prompt: exact-mode prefill, the f32 cache's attention 0 | 1 | 2
        left 45 || return 1
        echo "$1 exact prefill $2 (prefill decode tok/s): CUDA cores $(bench_tok_s "$1" 1 "$2" 1) | bf16 \
$(bench_tok_s "$1" 1 "$2" 1 KILN_CUDA_FA_F32=1) | pairs $(bench_tok_s "$1" 1 "$2" 1 KILN_CUDA_FA_F32=2)"
    }
    line_pf() { # model: batch-1 decode tok/s with L2 prefetch budgets 0 / 16 / 32 / 48 MB
        left 45 || return 1
        echo "$1 batch 1 decode (prefill decode tok/s), prefetch 0 / 16 / 32 / 48 MB: $(bench_tok_s "$1" \
            1 128 128) | $(bench_tok_s "$1" 1 128 128 KILN_CUDA_PREFETCH_MB=16) | $(bench_tok_s "$1" 1 128 128 \
            KILN_CUDA_PREFETCH_MB=32) | $(bench_tok_s "$1" 1 128 128 KILN_CUDA_PREFETCH_MB=48)"
    }
    # most wanted first; each stops when under 45 s are left
    line_pf llama-3-8b-q4
    line llama-3-8b-q4 exact 64 128 32
    line llama-3-8b-q8 exact 64 128 32
    line_fa qwen3-0.6b 512
    line_fa llama-3-8b 512
    line_pf llama-3-8b-q8
    line_pf llama-3-8b
    line llama-3-8b-q4 fast 64 128 32
    line llama-3-8b-q8 fast 64 128 32
    line llama-3-8b-q4 exact 1 512 1
    line_fa qwen3-0.6b 4096
    line llama-3-8b-q4 fast 1 512 1
    line llama-3-8b-q4 exact 16 128 32
    line qwen3-0.6b-q4 exact 64 128 32
    line qwen3-0.6b-q4 fast 64 128 32
    line_fa llama-3-8b 4096
    line llama-3-8b-q8 exact 1 512 1
fi
stamp "end"
