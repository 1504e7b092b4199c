#!/usr/bin/env bash
# check_run.sh — a short GPU call: build, every CUDA test with a one-line summary (and its first
# failures), device vs host sampling ids, tensor-core prefill end to end (--kv bf16, FA off / on).
# Logs stay in /tmp (few files come back from the device); the summary goes to stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=/tmp/b
M=/dev/shm/kiln_models
KILN_STAGES=none bash bench/gpu_bench.sh "$B" 2>&1 | grep -E "error|\[t=" | head -20
export KILN_SHARED=$PWD/.gpu-data/shared
for t in test_parity_cuda test_parity_cuda_hybrid test_parity_cuda_gemma test_kv_cuda test_parity_cuda_kv test_cuda_ops; do
    timeout 120 "$B/$t" >"/tmp/$t.log" 2>&1
    echo "$t rc=$? | $(grep -E "checks, " "/tmp/$t.log" | tail -1)"
    grep -E "CHECK failed|flip" "/tmp/$t.log" | head -6 | cut -c1-260
done
grep -E "sampl|attention tc|fused" /tmp/test_cuda_ops.log | head -8 | cut -c1-200
echo "== sampling ids: device, host (must match) t=$SECONDS"
for g in 1 0; do
    KILN_GPU_SAMPLING=$g timeout 30 $B/kiln generate --device cuda --model models/demo-q8 --prompt "def f(x):" \
        --max-tokens 48 --temperature 0.8 --top-k 40 --top-p 0.9 --seed 5 --print-ids 2>/dev/null | tail -1
done
echo "== tensor-core prefill end to end (0.6B, 4096 tokens, --kv bf16) t=$SECONDS"
[ -f "$M/qwen3-0.6b/model.safetensors" ] || python3 bench/make_random_model.py --shape qwen3-0.6b --out "$M/qwen3-0.6b" >/dev/null
for fa in 0 1; do
    KILN_CUDA_FA=$fa timeout 60 $B/kiln bench --device cuda --model $M/qwen3-0.6b --kv bf16 --prompt 4096 --gen 16 --runs 2 --json --quiet 2>&1 | tail -1 | cut -c1-200
done
echo "== end t=$SECONDS"
