#!/usr/bin/env bash
# session16_run.sh — the fifteenth session's decode-attention and fused-weight changes, written
# without a GPU. PART=1: build; the attention op tests and the fused-upload test
# (test_cuda_ops' test_attention* / test_upload_matrices), test_parity_cuda (also with
# KILN_CUDA_FUSE_WEIGHTS=1), test_kv_cuda, test_parity_cuda_kv; then Qwen3-0.6B decode at 8k
# context against the previous paths (KILN_CUDA_ATT_SHORT=512: k_attn + merge past 512 keys;
# KILN_CUDA_PAGED_DECODE=0: k_paged_attn for the paged kinds), batch 1 at prompt 128 on two
# paged kinds, and batch 64 with the PREP kernel (default) against prep + store + the one-launch
# kernel (KILN_CUDA_ATT_PREP=0) and against q/k/v, gate/up fused (KILN_CUDA_FUSE_WEIGHTS=1).
# PART=2 (the same warm machine, started within 30 s): Llama-3-8B bf16 batch 64 and prefill 512
# with the same A/Bs, 8k context decode, the per-op profile at batch 64, and the tensor-core
# GEMM at 64 tokens with forced splits / block shapes, and at 8 / 64 tokens with its split-K
# summed in the kernel (KILN_CUDA_TC_REDUCE=1, opt-in). Summaries to stdout and $OUT/log.
# PART=3 (again within 30 s): the MoE block with its routing on the device (sixteenth session,
# written without a GPU): test_cuda_ops' MoE groups, the MoE parity tests (test_parity_cuda_hybrid
# also replays MoE decode steps from graphs; test_parity_cuda_gemma's Gemma 4 MoE), then
# Qwen3-30B-A3B's shape cut to 8 layers (bf16, and 4-bit by kiln convert) at batch 1 / 8 / 64,
# device routing (default) against host routing (KILN_MOE_DEVICE_TOKENS=0), the grouped gather
# against the per-pair one at batch 64, prefill 512 routed on the device against the host, and
# the batch-1 profile.
# PART=0 (one call, where machines are scarce): every test of PART=1 and PART=3 first, then one
# A/B of each new path: 8k-context decode (contiguous f32 and paged q8), batch 64 with the fused
# weights, and Qwen3-30B-A3B's shape cut to 4 layers in 4-bit at batch 1 / 64 and prefill 512,
# routed on the device against the host (prefill through the tensor-core expert GEMM).
LIMIT=${LIMIT:-540}
PART=${PART:-1}
source "$(dirname "$0")/common.sh"
exec > >(tee "${OUT:-/tmp}/log") 2>&1
short() { # kv [VAR=value ...]: Qwen3-0.6B batch 1 decode tok/s, prompt 128
    local kv=$1
    shift
    env "$@" timeout 60 "$B/kiln" bench --device cuda --model "$M/qwen3-0.6b" --kv $kv \
        --prompt 128 --gen 64 --runs 3 --json --quiet 2>&1 | grep -oE '"decode_tok_s":[0-9.]*' |
        cut -d: -f2
}
b64() { # model: batch 64 (prefill decode tok/s), default | ATT_PREP=0 | FUSE_WEIGHTS=1
    echo "$1 bf16 batch 64 (prefill decode tok/s): default $(bench_tok_s $1 64 128 64) |" \
        "KILN_CUDA_ATT_PREP=0 $(bench_tok_s $1 64 128 64 KILN_CUDA_ATT_PREP=0) |" \
        "KILN_CUDA_FUSE_WEIGHTS=1 $(bench_tok_s $1 64 128 64 KILN_CUDA_FUSE_WEIGHTS=1)"
}
if [ "$PART" = 0 ]; then
    # LIMIT under 300 s: the tests only (no models made, no A/B)
    [ "$LIMIT" -ge 300 ] && models_converted_in_background qwen3-0.6b qwen3-30b-a3b-l4:4
    build_kiln
    run_tests "test_cuda_ops KILN_TEST_ONLY=test_attention,test_upload_matrices,test_tc_,test_moe" \
        test_parity_cuda_hybrid test_parity_cuda test_kv_cuda test_parity_cuda_kv \
        "test_parity_cuda KILN_CUDA_FUSE_WEIGHTS=1 KILN_CUDA_TC_REDUCE=1" test_parity_cuda_gemma
    [ "$LIMIT" -ge 300 ] || { stamp "end (tests only)"; exit 0; }
    wait $MODELS
    left 60 && echo "qwen3-0.6b --kv f32 batch 1 context 8192 decode tok/s: new" \
        "$(ctx qwen3-0.6b f32 1) | KILN_CUDA_ATT_SHORT=512 $(ctx qwen3-0.6b f32 1 KILN_CUDA_ATT_SHORT=512)"
    left 60 && echo "qwen3-0.6b --kv q8 batch 1 context 8192 decode tok/s: new" \
        "$(ctx qwen3-0.6b q8 1) | KILN_CUDA_PAGED_DECODE=0 $(ctx qwen3-0.6b q8 1 KILN_CUDA_PAGED_DECODE=0)"
    left 60 && b64 qwen3-0.6b
    m=qwen3-30b-a3b-l4-q4
    "$B/kiln" info --model "$M/$m" 2>&1 | grep -E "^weights"
    for b in 1 64; do
        left 50 && echo "$m batch $b (prefill decode tok/s): device routing $(bench_tok_s $m $b 128 64)" \
            "| KILN_MOE_DEVICE_TOKENS=0 $(bench_tok_s $m $b 128 64 KILN_MOE_DEVICE_TOKENS=0)"
    done
    left 50 && echo "$m prefill 512 (prefill decode tok/s): host routing $(bench_tok_s $m 1 512 4)" \
        "| KILN_MOE_DEVICE_TOKENS=4096 $(bench_tok_s $m 1 512 4 KILN_MOE_DEVICE_TOKENS=4096)" \
        "| and KILN_CUDA_MOE_TC=0 $(bench_tok_s $m 1 512 4 KILN_MOE_DEVICE_TOKENS=4096 KILN_CUDA_MOE_TC=0)"
elif [ "$PART" = 3 ]; then
    [ -x "$B/kiln" ] || build_kiln
    models_converted_in_background qwen3-30b-a3b-l8:4
    run_tests "test_cuda_ops KILN_TEST_ONLY=test_moe" test_parity_cuda_hybrid \
        test_parity_cuda_gemma
    wait $MODELS
    for m in qwen3-30b-a3b-l8 qwen3-30b-a3b-l8-q4; do
        "$B/kiln" info --model "$M/$m" 2>&1 | grep -E "^weights"
        for b in 1 8 64; do
            left 60 || break
            echo "$m batch $b (prefill decode tok/s): device routing $(bench_tok_s $m $b 128 64)" \
                "| KILN_MOE_DEVICE_TOKENS=0 $(bench_tok_s $m $b 128 64 KILN_MOE_DEVICE_TOKENS=0)"
        done
        left 60 && echo "$m batch 64, per-pair gather: $(bench_tok_s $m 64 128 64 \
            KILN_CUDA_MOE_GROUPED=0)"
        # prefill 512 routed on the device too (grouped gather on CUDA cores) against the host's
        # per-expert GEMMs (the default past 64 tokens)
        # (the tensor-core expert GEMM from 1024 pairs at the time, seventeenth session; =0: the grouped
        # gather on CUDA cores)
        left 60 && echo "$m prefill 512 (prefill decode tok/s): host routing" \
            "$(bench_tok_s $m 1 512 4) | KILN_MOE_DEVICE_TOKENS=4096" \
            "$(bench_tok_s $m 1 512 4 KILN_MOE_DEVICE_TOKENS=4096) | and KILN_CUDA_MOE_TC=0" \
            "$(bench_tok_s $m 1 512 4 KILN_MOE_DEVICE_TOKENS=4096 KILN_CUDA_MOE_TC=0)"
    done
    batch1_profile qwen3-30b-a3b-l8
elif [ "$PART" = 1 ]; then
    models_in_background qwen3-0.6b llama-3-8b
    build_kiln
    run_tests "test_cuda_ops KILN_TEST_ONLY=test_attention,test_upload_matrices,test_tc_" \
        "test_cuda_ops KILN_TEST_ONLY=test_moe" test_parity_cuda_hybrid \
        test_parity_cuda test_kv_cuda test_parity_cuda_kv \
        "test_parity_cuda KILN_CUDA_FUSE_WEIGHTS=1 KILN_CUDA_TC_REDUCE=1"
    for b in 1 8; do
        left 60 || break
        echo "qwen3-0.6b --kv f32 batch $b context 8192 decode tok/s: new $(ctx qwen3-0.6b f32 $b)" \
            "| KILN_CUDA_ATT_SHORT=512 $(ctx qwen3-0.6b f32 $b KILN_CUDA_ATT_SHORT=512)"
    done
    for kv in bf16 q8 q4 turbo:k4v4:rotk:kg64 turbo:k8v4; do # paged
        left 60 || break
        echo "qwen3-0.6b --kv $kv batch 1 context 8192 decode tok/s: new $(ctx qwen3-0.6b $kv 1)" \
            "| KILN_CUDA_PAGED_DECODE=0 $(ctx qwen3-0.6b $kv 1 KILN_CUDA_PAGED_DECODE=0)"
    done
    for kv in q8 bf16; do
        left 60 || break
        echo "qwen3-0.6b --kv $kv batch 1 prompt 128 decode tok/s: new $(short $kv) |" \
            "KILN_CUDA_PAGED_DECODE=0 $(short $kv KILN_CUDA_PAGED_DECODE=0)"
    done
    left 60 && b64 qwen3-0.6b
else
    [ -x "$B/kiln" ] || build_kiln
    models_in_background llama-3-8b
    wait $MODELS
    left 120 && b64 llama-3-8b
    left 60 && echo "llama-3-8b bf16 prefill 512: default $(bench_tok_s llama-3-8b 1 512 1) |" \
        "KILN_CUDA_FUSE_WEIGHTS=1 $(bench_tok_s llama-3-8b 1 512 1 KILN_CUDA_FUSE_WEIGHTS=1)"
    left 90 && echo "llama-3-8b --kv f32 batch 1 context 8192 decode tok/s: new" \
        "$(ctx llama-3-8b f32 1) | KILN_CUDA_ATT_SHORT=512 $(ctx llama-3-8b f32 1 KILN_CUDA_ATT_SHORT=512)"
    op_profile llama-3-8b 64 60
    if left 40; then # the codes GEMM at 64 tokens: 96-112 blocks of 8 warps (ncu, 15th session)
        build_gpu_bench
        KILN_BENCH_TC_FMTS="q4g64 q8g64 bf16" KILN_BENCH_TC_SHAPES="6144x4096 14336x4096 4096x14336" \
            KILN_BENCH_TC_NS=64 \
            KILN_BENCH_TC_VARIANTS=",tc,tc splits=3,tc splits=4,tc splits=6,tc bn=16,tc bn=16 splits=2,old," \
            timeout 60 "$B/kiln_gpu_bench" tc 2>&1 | grep -E "^tc " | cut -c1-110
        for r in 0 1; do # split-K summed by k_tc_reduce (0) or by the last split in the kernel
            echo "KILN_CUDA_TC_REDUCE=$r:"
            KILN_CUDA_TC_REDUCE=$r KILN_BENCH_TC_FMTS="q4g64 q8g64" \
                KILN_BENCH_TC_SHAPES="6144x4096 14336x4096 4096x14336" KILN_BENCH_TC_NS="8 64" \
                KILN_BENCH_TC_VARIANTS=",tc," timeout 60 "$B/kiln_gpu_bench" tc 2>&1 |
                grep -E "^tc " | cut -c1-110
        done
    fi
fi
stamp "end"
