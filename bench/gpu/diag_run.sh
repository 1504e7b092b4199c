#!/usr/bin/env bash
# diag_run.sh — a short GPU call of the fifth session: build, the paged-cache diagnostics
# (plain-float records, the paged parity test with its codec-noise bound), decode-only per-op
# profiles at batch 64, decode graphs above 8 sequences (KILN_GRAPH_MAX_BATCH) and the bf16 KV
# cache's prefill, interleaved A/B. Summaries to stdout, logs in /tmp.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=/tmp/b
M=/dev/shm/kiln_models
export KILN_SHARED=$PWD/.gpu-data/shared
stamp() { echo "== [t=${SECONDS}s] $*"; }
KILN_STAGES=none bash bench/gpu_bench.sh "$B" 2>&1 | grep -E "error|\[t=" | head -20
mk() { [ -f "$M/$1/model.safetensors" ] || python3 bench/make_random_model.py --shape "$1" --out "$M/$1" >/dev/null; }
mk qwen3-0.6b &
stamp "plain-float paged rows"
KILN_TEST_PLAIN_PAGED=1 timeout 100 $B/test_kv_cuda >/tmp/plain.log 2>&1
grep -E "first differing|records, " /tmp/plain.log | head -12 | cut -c1-300
stamp "paged parity (codec-noise bound)"
timeout 150 $B/test_parity_cuda_kv >/tmp/pkv.log 2>&1
grep -E "CHECK failed|checks, |codec noise" /tmp/pkv.log | head -30 | cut -c1-260
wait
j() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print('prefill %.0f decode %.1f' % (d['prefill_tok_s'], d['decode_tok_s']))" 2>/dev/null || echo "failed"; }
stamp "decode-only profile 0.6B bf16 b64"
KILN_CUDA_PROFILE=1 $B/kiln bench --device cuda --model $M/qwen3-0.6b --prompt 4 --gen 32 --batch 64 --runs 1 --json --quiet 2>&1 | grep -E "cuda profile" | head -16 | cut -c14-130
stamp "graphs above 8 sequences, 0.6B bf16 (A: max 8, B: max 64), 2 rounds"
for r in 1 2; do
    for g in 8 64; do
        echo "max $g b64: $(KILN_GRAPH_MAX_BATCH=$g $B/kiln bench --device cuda --model $M/qwen3-0.6b --prompt 128 --gen 64 --batch 64 --runs 3 --json --quiet 2>/dev/null | j)"
        echo "max $g b16: $(KILN_GRAPH_MAX_BATCH=$g $B/kiln bench --device cuda --model $M/qwen3-0.6b --prompt 128 --gen 64 --batch 16 --runs 3 --json --quiet 2>/dev/null | j)"
    done
done
stamp "prefill 512, KV f32 vs bf16 (0.6B)"
for kv in f32 bf16 f32 bf16; do
    echo "kv $kv: $($B/kiln bench --device cuda --model $M/qwen3-0.6b --kv $kv --prompt 512 --gen 16 --runs 3 --json --quiet 2>/dev/null | j)"
done
stamp "Qwen3.5-4B shape, bf16 (e2e stage)"
KILN_STAGES=e2e KILN_SHAPES="qwen3.5-4b" KILN_QUANT_SHAPES="" KILN_DEADLINE_S=$((560 - SECONDS)) \
    timeout $((580 - SECONDS)) bash bench/gpu_bench.sh "$B" 2>&1 | grep -vE "^\s*$" | tail -25 | cut -c1-200
stamp "end"
