#!/usr/bin/env bash
# bench_server.sh — kiln serve throughput: aggregate tok/s and time to first token with 1, 8 and
# 32 concurrent streaming clients (tests/server/bench.mjs). Prints a Markdown table for docs/server.md.
#   bench/bench_server.sh [MODEL_DIR]     env: BENCH_CLIENTS=1,8,32 BENCH_TOKENS=64 BENCH_SECONDS=20
#                                              BENCH_ARGS="--threads 2"  KILN_BIN=build/kiln
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export KILN_BIN="${KILN_BIN:-$root/build/kiln}"
if [ -n "${1:-}" ]; then export BENCH_MODEL="$1"
elif [ -f "$root/models/demo-q8/config.json" ]; then export BENCH_MODEL="$root/models/demo-q8"
else export BENCH_MODEL="$root/../shared/models/demo-bf16"; fi
echo "model: $BENCH_MODEL  cpus: $(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
cd "$root/tests/server"
exec node bench.mjs
