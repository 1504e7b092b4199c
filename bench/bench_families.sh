#!/usr/bin/env bash
# bench_families.sh — prefill and decode tok/s of the non-Llama families at real layer shapes on the
# CPU: random-weight bf16 models from bench/make_family_model.py (Qwen3.5-0.8B, Qwen3.5-4B,
# Gemma-4-E4B shapes) plus an MLX 4-bit conversion (kiln convert --bits 4 --group 64) of the first,
# each through `kiln bench --prompt 128 --gen 32 --runs R --json` (medians of R runs). Prints one
# JSON line per model, prefixed with the load average before the run.
# usage: bench/bench_families.sh [SHAPE[:LAYERS]...]
#   default: qwen3.5-0.8b qwen3.5-4b gemma-4-e4b; SHAPE:N keeps the first N layers (smaller machines)
# env: KILN_BIN (default build-fam2/kiln), OUT (default /tmp/kiln-families), RUNS (default 3),
#      THREADS (kiln --threads; default all cores), Q4 (shape to convert to 4-bit; "" skips)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${KILN_BIN:-$here/build-fam2/kiln}
out=${OUT:-/tmp/kiln-families}
runs=${RUNS:-3}
q4=${Q4-qwen3.5-0.8b}
threads=()
[ -n "${THREADS:-}" ] && threads=(--threads "$THREADS")
shapes=("$@")
[ ${#shapes[@]} -eq 0 ] && shapes=(qwen3.5-0.8b qwen3.5-4b gemma-4-e4b)
[ -x "$bin" ] || { echo "no kiln binary at $bin" >&2; exit 1; }
mkdir -p "$out"
bench() { # DIR
    local j
    j=$("$bin" bench --model "$1" --prompt 128 --gen 32 --runs "$runs" --json --quiet "${threads[@]}")
    printf '{"load_avg":"%s","cores":%s,"bench":%s}\n' "$(cut -d' ' -f1-3 /proc/loadavg)" \
        "$(nproc)" "$j"
}
for spec in "${shapes[@]}"; do
    shape=${spec%%:*}
    layers=0
    [[ $spec == *:* ]] && layers=${spec##*:}
    dir=$out/$shape
    [ "$layers" != 0 ] && dir=$out/$shape-l$layers
    [ -f "$dir/model.safetensors" ] ||
        /usr/bin/python3 "$here/bench/make_family_model.py" --shape "$shape" --layers "$layers" \
            --out "$dir" >&2
    n=$("$bin" info --model "$dir" 2>/dev/null | sed -n 's/^layers: *\([0-9]*\).*/\1/p')
    echo "== $shape ($n layers), bf16" >&2
    bench "$dir"
    if [ "$shape" = "$q4" ]; then
        [ -f "$dir-mlx-q4g64/config.json" ] ||
            "$bin" convert --model "$dir" --out "$dir-mlx-q4g64" --bits 4 --group 64 2>&1 | tail -1 >&2
        echo "== $shape, MLX 4-bit group 64" >&2
        bench "$dir-mlx-q4g64"
    fi
done
