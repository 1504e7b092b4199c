#!/usr/bin/env bash
# ab_decode.sh — decode tok/s of random-weight models on the GPU under environment variants, the
# variants interleaved round by round so clock and thermal drift hit them alike; medians printed.
#
#   bash bench/gpu/ab_decode.sh [kiln-binary]
#   SHAPES="qwen3-0.6b llama-3-8b" FORMATS="bf16 q4" BATCHES="1 8" ROUNDS=3 \
#   VARIANTS="KILN_CUDA_PDL=0,KILN_CUDA_FUSED=0;KILN_CUDA_PDL=0;default" bash bench/gpu/ab_decode.sh
#
# A variant is a comma-separated list of VAR=value (or "default"). Models: bench/make_random_model.py
# into $MODELS_DIR (default /dev/shm/kiln_models), q4/q8 by `kiln convert --bits B --group 64`.
# Output: one line per shape / format / batch / variant: median decode tok/s and weight GB/s.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/model_dir.sh
K=${1:-/tmp/b/kiln}
M=${MODELS_DIR:-/dev/shm/kiln_models}
SHAPES=${SHAPES:-qwen3-0.6b llama-3-8b}
FORMATS=${FORMATS:-bf16}
BATCHES=${BATCHES:-1}
ROUNDS=${ROUNDS:-3}
GEN=${GEN:-64}
VARIANTS=${VARIANTS:-KILN_CUDA_PDL=0,KILN_CUDA_FUSED=0;KILN_CUDA_PDL=0;KILN_CUDA_FUSED=0;default}
mkdir -p "$M"
IFS=';' read -r -a VS <<<"$VARIANTS"
for s in $SHAPES; do
    for f in $FORMATS; do
        d=$(model_dir "$K" "$M" "$s" "$f") || continue
        for b in $BATCHES; do
            declare -A R=()
            for r in $(seq "$ROUNDS"); do
                for v in "${VS[@]}"; do
                    envs=()
                    [ "$v" = default ] || IFS=',' read -r -a envs <<<"$v"
                    out=$(env "${envs[@]}" "$K" bench --device cuda --model "$d" --prompt 128 --gen "$GEN" \
                        --batch "$b" --runs 1 --json --quiet 2>/dev/null | tail -1)
                    t=$(python3 -c "import json,sys; r=json.loads(sys.argv[1]); print(r['decode_tok_s'], r['decode_weight_gb_s'])" "$out" 2>/dev/null)
                    R[$v]="${R[$v]:-} ${t:-nan nan}"
                done
            done
            for v in "${VS[@]}"; do
                python3 - "$s" "$f" "$b" "$v" ${R[$v]} <<'EOF'
import statistics, sys
s, f, b, v, *vals = sys.argv[1:]
tok = [float(x) for x in vals[0::2] if x != "nan"]
gbs = [float(x) for x in vals[1::2] if x != "nan"]
if tok:
    print(f"{s:12} {f:5} b{b:<3} {v:40} {statistics.median(tok):9.1f} tok/s {statistics.median(gbs):7.0f} GB/s  runs {' '.join(f'{x:.0f}' for x in tok)}")
else:
    print(f"{s:12} {f:5} b{b:<3} {v:40} failed")
EOF
            done
            unset R
        done
    done
done
