#!/usr/bin/env bash
# bench_kv.sh — decode speed and KV bytes per token of each KV cache kind on the CPU at a long
# context of N tokens. The demo model's context limit (4096) is raised in a temporary copy of its
# config (weights and tokenizer are symlinked), so 8k and 32k run. By default (FILL=1) the first
# N-16 positions are synthetic K/V written through each cache's own encoder (`kiln bench
# --context`) and 16 real prompt tokens follow, so a 32k context costs seconds instead of a
# quadratic 32k prefill (~20 min per kind on 2 cores); FILL=0 prefills all N tokens.
# usage: bench/bench_kv.sh [CONTEXT...]   (default: 1024 8192 32768)
# env: KILN_BIN (default build-kv/kiln), KILN_SHARED (default ../shared), KINDS, GEN (decode
#      steps), RUNS (medians of, default 3), FILL
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${KILN_BIN:-$here/build-kv/kiln}
shared=${KILN_SHARED:-$here/../shared}
kinds=${KINDS:-"f32 bf16 q8 q4 turbo:k8v4 turbo:k8v3 turbo:k4v4:rotk:kg64"}
gen=${GEN:-16}
runs=${RUNS:-3}
fill=${FILL:-1}
contexts=("$@")
[ ${#contexts[@]} -eq 0 ] && contexts=(1024 8192 32768)
src=$shared/models/demo-bf16
[ -x "$bin" ] || { echo "no kiln binary at $bin" >&2; exit 1; }
[ -d "$src" ] || { echo "no demo model at $src" >&2; exit 77; }
model=$(mktemp -d)
trap 'rm -rf "$model"' EXIT
for f in "$src"/*; do ln -s "$f" "$model/$(basename "$f")"; done
rm "$model/config.json"
sed 's/"max_position_embeddings": [0-9]*/"max_position_embeddings": 40960/' "$src/config.json" \
    > "$model/config.json"
printf '%-12s %8s %12s %14s\n' kind context decode_tok/s kv_bytes/token
for ctx in "${contexts[@]}"; do
    for kind in $kinds; do
        # pool budget: the context plus the decode steps, with room to spare
        if [ "$fill" = 1 ] && [ "$ctx" -gt 16 ]; then
            shape=(--context $((ctx - 16)) --prompt 16)
        else
            shape=(--prompt "$ctx")
        fi
        out=$("$bin" bench --model "$model" --kv "$kind" "${shape[@]}" --gen "$gen" --runs "$runs" \
              --json --quiet 2>/dev/null) || { printf '%-12s %8s failed\n' "$kind" "$ctx"; continue; }
        tps=$(sed -n 's/.*"decode_tok_s": *\([0-9.]*\).*/\1/p' <<<"$out")
        bpt=$("$bin" info --model "$model" --kv "$kind" 2>/dev/null |
              sed -n "s/^kv cache: *[^,]*, \([0-9]*\) bytes.*/\1/p" | head -1)
        printf '%-12s %8s %12s %14s\n' "$kind" "$ctx" "${tps:-?}" "${bpt:-?}"
    done
done
