#!/usr/bin/env bash
# session18_run.sh — after PART=0 of session16_run.sh (eighteenth session). PART=1 (default): the
# test_cuda_ops groups that timed out there (upload, attention, MoE and, unless TC=0, the
# tensor-core groups; one process each in parallel, TEST_TIMEOUT s each (120), while the models
# convert; each group's time and the logs in $OUT), then the numbers that set the MoE defaults:
# Qwen3-30B-A3B's shape cut to 4 layers in 4-bit, decode at batch 64 / 8 on the grouped gather,
# on the tensor-core expert GEMM (KILN_CUDA_MOE_TC=1) and routed on the host; prefill 2048 / 512
# by default against the host; Qwen3-0.6B batch 64 with and without the PREP attention kernel
# and the fused weights, and batch 1 at prompt 128 with the old short-attention limit.
# PART=2 (what the eighteenth session left unmeasured): MoE decode of 1 / 2 / 4 sequences (8–32
# pairs) on the grouped gather (default) against the expert GEMM forced, the batch-1 per-op
# profile of that shape, and test_cuda_ops' tensor-core groups (their in-kernel split-K sum).
LIMIT=${LIMIT:-560}
source "$(dirname "$0")/common.sh"
exec > >(tee "${OUT:-/tmp}/log") 2>&1
PART=${PART:-1}
if [ "$PART" = 2 ]; then
    models_converted_in_background qwen3-30b-a3b-l4:4
    build_kiln
    TEST_TIMEOUT=${TEST_TIMEOUT:-200} run_tests "test_cuda_ops KILN_TEST_ONLY=test_tc_" &
    TESTS=$!
    wait $MODELS
    wait $TESTS
    grep -E "^group " /tmp/test_cuda_ops*test_tc_*.log
    m=qwen3-30b-a3b-l4-q4
    for b in 1 2 4; do
        left 40 && echo "$m batch $b (prefill decode tok/s): gather $(bench_tok_s $m $b 128 64)" \
            "| KILN_CUDA_MOE_TC=1 $(bench_tok_s $m $b 128 64 KILN_CUDA_MOE_TC=1)"
    done
    batch1_profile $m
    stamp "end"
    exit 0
fi
models_converted_in_background qwen3-0.6b qwen3-30b-a3b-l4:4
build_kiln
stamp "tests"
# TC=0: without the tensor-core groups (they passed before; the expert GEMM is in test_moe)
groups="test_upload_matrices test_attention test_moe"
[ "${TC:-1}" = 1 ] && groups="$groups test_tc_"
specs=()
for g in $groups; do specs+=("test_cuda_ops KILN_TEST_ONLY=$g"); done
TEST_TIMEOUT=${TEST_TIMEOUT:-120} run_tests "${specs[@]}"
i=0
for f in /tmp/test_cuda_ops*.log; do
    grep -E "^group " "$f" | sed "s|^|$(basename "$f" .log | sed 's/.*=//'): |"
    cp "$f" "${OUT:-/tmp}/test_cuda_ops.$i.log"
    i=$((i + 1))
done
wait $MODELS
m=qwen3-30b-a3b-l4-q4
for b in 64 8; do
    left 40 && echo "$m batch $b (prefill decode tok/s): device $(bench_tok_s $m $b 128 64)" \
        "| KILN_CUDA_MOE_TC=1 $(bench_tok_s $m $b 128 64 KILN_CUDA_MOE_TC=1)" \
        "| host $(bench_tok_s $m $b 128 64 KILN_MOE_DEVICE_TOKENS=0)"
done
for p in 2048 512; do
    left 40 && echo "$m prefill $p (prefill decode tok/s): default $(bench_tok_s $m 1 $p 4)" \
        "| host $(bench_tok_s $m 1 $p 4 KILN_MOE_DEVICE_TOKENS=0)"
done
for r in 1; do
    left 40 && echo "qwen3-0.6b bf16 batch 64 round $r (prefill decode tok/s):" \
        "default $(bench_tok_s qwen3-0.6b 64 128 64) |" \
        "KILN_CUDA_ATT_PREP=0 $(bench_tok_s qwen3-0.6b 64 128 64 KILN_CUDA_ATT_PREP=0) |" \
        "FUSE_WEIGHTS=1 $(bench_tok_s qwen3-0.6b 64 128 64 KILN_CUDA_FUSE_WEIGHTS=1) |" \
        "both $(bench_tok_s qwen3-0.6b 64 128 64 KILN_CUDA_ATT_PREP=0 KILN_CUDA_FUSE_WEIGHTS=1)"
done
left 30 && echo "qwen3-0.6b bf16 batch 1 prompt 128 (prefill decode tok/s): default" \
    "$(bench_tok_s qwen3-0.6b 1 128 128) | KILN_CUDA_ATT_SHORT=512" \
    "$(bench_tok_s qwen3-0.6b 1 128 128 KILN_CUDA_ATT_SHORT=512)"
stamp "end"
