#!/usr/bin/env bash
# session_run.sh — one GPU call that validates and measures everything (docs/perf.md "Fourth
# session"): llama.cpp CUDA build in the background, the CUDA test suite, prefill attention micro,
# device sampling vs host sampling, paged device KV at 8k context, tensor-core prefill end to end,
# then (once llama.cpp is built) the peer comparison and interleaved decode A/B. Every section is
# cut off by the time left (LIMIT seconds, default 585) so the call returns what it has.
set -uo pipefail
cd "$(dirname "$0")/../.."
LIMIT=${LIMIT:-585}
B=/tmp/b
M=/dev/shm/kiln_models
O=${OUT:-/tmp/kiln_session}
mkdir -p "$O" "$M"
left() { echo $((LIMIT - SECONDS)); }
(KILN_PEER_STAGES=build bash bench/peer_llamacpp_cuda.sh >"$O/peer_build.log" 2>&1; echo "peer build rc=$? t=$SECONDS" >>"$O/peer_build.log") &
PB=$!
KILN_STAGES="tests" KILN_QGEMV_VARIANTS=0 timeout "$(left)" bash bench/gpu_bench.sh >"$O/tests.txt" 2>&1
grep -E "rc=|checks,|CHECK|differ|smoke|LEFT|\[t=|flip" "$O/tests.txt" | head -70
echo "== prefill micro t=$SECONDS"
gcc -O2 -std=c17 -D_GNU_SOURCE -DKILN_HAVE_CUDA=1 -Iinclude -Isrc -I/usr/local/cuda/include bench/gpu/kiln_gpu_bench.c \
    -o $B/gb -L$B -lkiln -Wl,-rpath,$B -L/usr/local/cuda/lib64 -lcudart -lm && timeout 60 $B/gb prefill 2>&1 | tail -10
echo "== sampling (device vs host: ids must match) t=$SECONDS"
for g in 1 0; do
    KILN_GPU_SAMPLING=$g timeout 30 $B/kiln generate --device cuda --model models/demo-q8 --prompt "def f(x):" \
        --max-tokens 48 --temperature 0.8 --top-k 40 --top-p 0.9 --seed 5 --print-ids 2>&1 | tail -1
done
echo "== paged device KV, 8k context t=$SECONDS"
[ -f "$M/qwen3-0.6b/model.safetensors" ] || python3 bench/make_random_model.py --shape qwen3-0.6b --out "$M/qwen3-0.6b" >/dev/null
for kv in f32 bf16 q8 turbo:k4v4:rotk:kg64; do
    timeout 40 $B/kiln bench --device cuda --model $M/qwen3-0.6b --kv $kv --context 8192 --prompt 16 --gen 32 --runs 3 --json --quiet 2>&1 | tail -1 | cut -c1-230
done
echo "== tensor-core prefill end to end (8B, 4096 tokens, bf16 cache) t=$SECONDS"
[ -f "$M/llama-3-8b/model.safetensors" ] || python3 bench/make_random_model.py --shape llama-3-8b --out "$M/llama-3-8b" >/dev/null
for fa in 0 1; do
    KILN_CUDA_FA=$fa timeout 60 $B/kiln bench --device cuda --model $M/llama-3-8b --kv bf16 --prompt 4096 --gen 1 --runs 2 --json --quiet 2>&1 | tail -1 | cut -c1-230
done
echo "== wait for llama.cpp t=$SECONDS"
while kill -0 $PB 2>/dev/null && [ "$(left)" -gt 200 ]; do sleep 5; done
tail -2 "$O/peer_build.log"
echo "== peer 0.6B t=$SECONDS"
SHAPES=qwen3-0.6b FORMATS="bf16 q4" RUNS=3 KILN_PEER_STAGES="models bench" timeout $(($(left) - 90)) bash bench/peer_llamacpp_cuda.sh >"$O/peer.txt" 2>&1
grep -E "kiln decode|rror|Trace|No such" "$O/peer.txt" | head -12
echo "== decode A/B t=$SECONDS"
ROUNDS=2 SHAPES="qwen3-0.6b llama-3-8b" BATCHES=1 VARIANTS="KILN_CUDA_FUSED=0;default" timeout $(($(left) - 25)) bash bench/gpu/ab_decode.sh $B/kiln
ROUNDS=1 SHAPES="qwen3-0.6b llama-3-8b" BATCHES="64" VARIANTS="default" timeout $(($(left) - 2)) bash bench/gpu/ab_decode.sh $B/kiln
echo "== end t=$SECONDS"
