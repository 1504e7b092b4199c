#!/usr/bin/env bash
# session16_run.sh — decode attention, one call: the one-launch decode kernel
# (attention_decode.cuh) now splits long contexts over grid z and merges in its last split;
# k_attn's tile loader issues 8 loads a thread before using them; paged caches (every --kv kind
# but f32) decode on their own one-launch kernel (attention_paged_decode.cuh). Build; the
# attention op tests (test_cuda_ops' test_attention*), test_parity_cuda, test_kv_cuda,
# test_parity_cuda_kv; then decode at 8k context against the previous paths
# (KILN_CUDA_ATT_SHORT=512: k_attn + merge past 512 keys; KILN_CUDA_PAGED_DECODE=0: k_paged_attn),
# batch 64 with the PREP kernel (default) against prep + store and the one-launch kernel
# (KILN_CUDA_ATT_PREP=0), and the per-op profile of Llama-3-8B bf16 batch 64.
# Summaries to stdout and $OUT/log. One call, LIMIT s.
LIMIT=${LIMIT:-540}
source "$(dirname "$0")/common.sh"
exec > >(tee "${OUT:-/tmp}/log") 2>&1
models_in_background qwen3-0.6b llama-3-8b
build_kiln
run_tests "test_cuda_ops KILN_TEST_ONLY=test_attention" test_parity_cuda test_kv_cuda \
    test_parity_cuda_kv
ctx() { # model kv batch [VAR=value ...]: decode tok/s at context 8192
    local m=$1 kv=$2 b=$3
    shift 3
    env "$@" timeout 90 "$B/kiln" bench --device cuda --model "$M/$m" --kv $kv --context 8192 \
        --prompt 16 --gen 32 --batch "$b" --runs 3 --json --quiet 2>&1 |
        grep -oE '"decode_tok_s":[0-9.]*' | cut -d: -f2
}
for mk in qwen3-0.6b:f32:1 qwen3-0.6b:f32:8; do
    left 60 || break
    IFS=: read -r m kv b <<<"$mk"
    echo "$m --kv $kv batch $b context 8192 decode tok/s: new $(ctx $m $kv $b) |" \
        "KILN_CUDA_ATT_SHORT=512 $(ctx $m $kv $b KILN_CUDA_ATT_SHORT=512)"
done
for kv in bf16 q8 q4 turbo:k4v4:rotk:kg64 turbo:k8v4; do # paged
    left 60 || break
    echo "qwen3-0.6b --kv $kv batch 1 context 8192 decode tok/s: new $(ctx qwen3-0.6b $kv 1) |" \
        "KILN_CUDA_PAGED_DECODE=0 $(ctx qwen3-0.6b $kv 1 KILN_CUDA_PAGED_DECODE=0)"
done
short() { # kv [VAR=value ...]: Qwen3-0.6B batch 1 decode tok/s, prompt 128
    local kv=$1
    shift
    env "$@" timeout 60 "$B/kiln" bench --device cuda --model "$M/qwen3-0.6b" --kv $kv \
        --prompt 128 --gen 64 --runs 3 --json --quiet 2>&1 | grep -oE '"decode_tok_s":[0-9.]*' |
        cut -d: -f2
}
for kv in q8 bf16; do
    left 60 || break
    echo "qwen3-0.6b --kv $kv batch 1 prompt 128 decode tok/s: new $(short $kv) |" \
        "KILN_CUDA_PAGED_DECODE=0 $(short $kv KILN_CUDA_PAGED_DECODE=0)"
done
for m in qwen3-0.6b llama-3-8b; do
    [ $m = qwen3-0.6b ] || wait $MODELS
    left 90 || break
    echo "$m bf16 batch 64 (prefill decode tok/s): default $(bench_tok_s $m 64 128 64) |" \
        "KILN_CUDA_ATT_PREP=0 $(bench_tok_s $m 64 128 64 KILN_CUDA_ATT_PREP=0)"
done
left 90 && echo "llama-3-8b f32 cache batch 1 context 8192 decode tok/s: new $(ctx llama-3-8b f32 1) |" \
    "KILN_CUDA_ATT_SHORT=512 $(ctx llama-3-8b f32 1 KILN_CUDA_ATT_SHORT=512)"
if left 60; then
    stamp "profile: llama-3-8b bf16 batch 64"
    KILN_CUDA_PROFILE=1 timeout 60 "$B/kiln" bench --device cuda --model "$M/llama-3-8b" \
        --prompt 128 --gen 8 --batch 64 --runs 1 2>&1 | grep -vE "^\s*$" | tail -30 | cut -c1-150
fi
if left 40; then # the codes GEMM at 64 tokens: 96-112 blocks of 8 warps leave SMs idle (ncu, 15th)
    build_gpu_bench
    KILN_BENCH_TC_FMTS="q4g64 q8g64 bf16" KILN_BENCH_TC_SHAPES="6144x4096 14336x4096 4096x14336" \
        KILN_BENCH_TC_NS=64 KILN_BENCH_TC_VARIANTS=",tc,tc splits=3,tc splits=4,tc splits=6,tc bn=16,tc bn=16 splits=2,old," \
        timeout 60 "$B/kiln_gpu_bench" tc 2>&1 | grep -E "^tc " | cut -c1-110
fi
stamp "end"
