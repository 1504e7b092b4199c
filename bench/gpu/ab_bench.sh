#!/usr/bin/env bash
# ab_bench.sh — prefill and decode tok/s of random-weight models on the GPU under variants that
# may set environment variables and kiln options, interleaved round by round (drift hits every
# variant alike); medians printed. ab_decode.sh is the decode-only, environment-only sibling.
#
#   SHAPES="qwen3-0.6b" FORMATS="bf16 q4" BATCH=1 PROMPT=512 GEN=32 ROUNDS=3 \
#   VARIANTS="default;--fast-math --kv f16;KILN_CUDA_DEQUANT_MIN_N=100000" \
#   bash bench/gpu/ab_bench.sh [kiln-binary]
#
# A variant is a space-separated list of VAR=value words (environment) and kiln options
# (--fast-math, --kv f16, ...), or "default". Models as in ab_decode.sh: $MODELS_DIR/shape
# (bench/make_random_model.py), q4/q8 from `kiln convert --bits B --group 64`.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/model_dir.sh
K=${1:-/tmp/b/kiln}
M=${MODELS_DIR:-/dev/shm/kiln_models}
SHAPES=${SHAPES:-qwen3-0.6b}
FORMATS=${FORMATS:-bf16}
BATCH=${BATCH:-1}
PROMPT=${PROMPT:-512}
GEN=${GEN:-32}
ROUNDS=${ROUNDS:-3}
VARIANTS=${VARIANTS:-default;--fast-math}
IFS=';' read -r -a VS <<<"$VARIANTS"
for s in $SHAPES; do
    for f in $FORMATS; do
        d=$(model_dir "$K" "$M" "$s" "$f") || continue
        declare -A R=()
        for r in $(seq "$ROUNDS"); do
            for v in "${VS[@]}"; do
                envs=() args=()
                if [ "$v" != default ]; then
                    for w in $v; do
                        case $w in
                        -*) args+=("$w") ;;
                        *=*) envs+=("$w") ;;
                        *) args+=("$w") ;;
                        esac
                    done
                fi
                out=$(env "${envs[@]}" "$K" bench --device cuda --model "$d" --prompt "$PROMPT" --gen "$GEN" \
                    --batch "$BATCH" --runs 1 --json --quiet "${args[@]}" 2>/dev/null | tail -1)
                t=$(python3 -c "import json,sys; r=json.loads(sys.argv[1]); print(r['prefill_tok_s'], r['ttft_ms'], r['decode_tok_s'])" "$out" 2>/dev/null)
                R[$v]="${R[$v]:-} ${t:-nan nan nan}"
            done
        done
        for v in "${VS[@]}"; do
            python3 - "$s" "$f" "$BATCH" "$PROMPT" "$v" ${R[$v]} <<'EOF'
import statistics, sys
s, f, b, p, v, *vals = sys.argv[1:]
def med(xs):
    xs = [float(x) for x in xs if x != "nan"]
    return (statistics.median(xs), xs) if xs else (float("nan"), [])
pf, pfs = med(vals[0::3])
tt, _ = med(vals[1::3])
dc, dcs = med(vals[2::3])
print(f"{s:11} {f:4} b{b:<3} p{p:<5} {v:46} prefill {pf:9.0f} tok/s ttft {tt:7.1f} ms  decode {dc:8.1f} tok/s"
      f"  (prefill runs {' '.join(f'{x:.0f}' for x in pfs)}; decode {' '.join(f'{x:.0f}' for x in dcs)})")
EOF
        done
        unset R
    done
done
