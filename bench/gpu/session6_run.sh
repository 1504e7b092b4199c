#!/usr/bin/env bash
# session6_run.sh — the sixth session's first GPU call: build, test_cuda_ops on its own (the
# fifth session's run was spoiled by the quantized-fusion checks), the fusion checks' first
# failures, per-op profiles of decode-only steps (Qwen3-0.6B bf16 batch 1 and 64, q4 batch 1),
# decode graphs above 8 sequences A/B, then the issue's Qwen3.5-4B shape end to end (bf16).
# Each stage only while time remains (LIMIT s). Summaries to stdout, logs in /tmp.
LIMIT=${LIMIT:-570}
source "$(dirname "$0")/common.sh"
(make_model qwen3-0.6b) &
MODELS=$!
build_kiln
(wait $MODELS 2>/dev/null; $B/kiln convert --model $M/qwen3-0.6b --out $M/qwen3-0.6b-q4 --bits 4 --group 64 --quiet >/dev/null 2>&1) &
CONV=$!
timeout 200 $B/test_cuda_ops >/tmp/ops.log 2>&1 &
T1=$!
KILN_TEST_QFUSED=1 timeout 200 $B/test_cuda_ops >/tmp/opsq.log 2>&1 &
T2=$!
wait $T1; echo "test_cuda_ops rc=$? | $(grep -E "checks, " /tmp/ops.log | tail -1)"
grep -E "CHECK failed" /tmp/ops.log | head -8 | cut -c1-300
wait $T2; echo "test_cuda_ops QFUSED rc=$? | $(grep -E "checks, " /tmp/opsq.log | tail -1)"
grep -E "CHECK failed" /tmp/opsq.log | head -12 | cut -c1-300
wait $MODELS $CONV 2>/dev/null
prof() { # label model batch gen [env]
    local l=$1 m=$2 b=$3 g=$4
    shift 4
    stamp "profile $l"
    env KILN_CUDA_PROFILE=1 "$@" timeout 60 $B/kiln bench --device cuda --model $m --prompt 4 --gen $g --batch $b --runs 1 --json --quiet >/tmp/prof.log 2>&1
    grep -E "cuda profile" /tmp/prof.log | head -22 | cut -c15-130
}
left 60 && prof "0.6B bf16 b1" $M/qwen3-0.6b 1 64
left 60 && prof "0.6B bf16 b64" $M/qwen3-0.6b 64 16
left 60 && prof "0.6B q4 b1" $M/qwen3-0.6b-q4 1 64
if left 80; then
    stamp "A/B graphs above 8 sequences, bf16 b64 and q4 b64"
    SHAPES=qwen3-0.6b FORMATS="bf16 q4" BATCHES=64 ROUNDS=2 GEN=32 VARIANTS="KILN_GRAPH_MAX_BATCH=8;KILN_GRAPH_MAX_BATCH=64" \
        bash bench/gpu/ab_decode.sh $B/kiln 2>&1 | grep -vE "^\s*$" | cut -c1-160
fi
if left 90; then
    stamp "Qwen3.5-4B shape (bf16) end to end"
    KILN_DEADLINE_S=$((LIMIT - SECONDS - 20)) KILN_STAGES="e2e" KILN_SHAPES="qwen3.5-4b" KILN_QUANT_SHAPES="" \
        KILN_FORMATS=bf16 timeout $((LIMIT - SECONDS - 5)) bash bench/gpu_bench.sh "$B" 2>&1 | grep -vE "^\s*$" | grep -v "^-- " | tail -25 | cut -c1-200
fi
stamp "end"
