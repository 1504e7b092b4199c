#!/usr/bin/env bash
# peer_llamacpp_cuda.sh — kiln vs llama.cpp (CUDA) on the GPU machine, same machine, same run:
# decode tok/s at batch 1 / 8 / 64 (context 128) and prefill 512 for random-weight models at real
# shapes, bf16 and 8-/4-bit (MLX q8g64 vs Q8_0, MLX q4g64 vs Q4_0; same bits per weight).
#
#   KILN_PEER_STAGES="build" bash bench/peer_llamacpp_cuda.sh      # call 1: build llama.cpp
#   KILN_PEER_STAGES="models bench" bash bench/peer_llamacpp_cuda.sh # call 2: convert + measure
#
# The GPU machine has no network: llama.cpp's source comes as a tarball made on the dev machine
# from the git bundle inside the npm package node-llama-cpp@3.21.1 (see docs/gpu.md: `git archive`
# of CMakeLists.txt cmake common ggml include src tools vendor gguf-py app LICENSE licenses) and carried in the ignored
# .gpu-data/ folder ($LCPP_TGZ). It is unpacked and built OUTSIDE the repository ($PEER_DIR, default
# /tmp/kiln-peer-cuda), CUDA on, for sm_90a only, tools llama-bench, llama-batched-bench,
# llama-quantize. Never commit any of it.
# Models: bench/make_random_model.py (bf16 HF folder) -> bench/peer/hf_to_gguf.py (bf16 GGUF) ->
# llama-quantize --pure (Q8_0 / Q4_0); kiln's are `kiln convert --bits B --group 64`.
# Measurements: llama-bench -ngl 99 -fa $LCPP_FA -p 512 (prefill) and -n 128 -d 128 (decode after 128
# tokens of context), -r $RUNS (batch 1), and
# llama-batched-bench -npp 128 -ntg 128 -npl 8,64 (aggregate decode tok/s of the batch);
# kiln bench --device cuda --json: --prompt 512 --gen 1 (prefill), --prompt 128 --gen 128 --batch B.
# Env: PEER_DIR, LCPP_TGZ (.gpu-data/lcpp.tgz), KILN_BIN (/tmp/b/kiln), SHAPES ("qwen3-0.6b
# llama-3-8b"), FORMATS ("bf16 q8 q4"), RUNS (3), MODELS_DIR (/dev/shm/kiln_models).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PEER=${PEER_DIR:-/tmp/kiln-peer-cuda}
TGZ=${LCPP_TGZ:-$REPO/.gpu-data/lcpp.tgz}
KILN=${KILN_BIN:-/tmp/b/kiln}
SHAPES=${SHAPES:-qwen3-0.6b llama-3-8b}
FORMATS=${FORMATS:-bf16 q8 q4}
RUNS=${RUNS:-3}
M=${MODELS_DIR:-/dev/shm/kiln_models}
STAGES=${KILN_PEER_STAGES:-build models bench}
# LCPP_FA=0 builds llama.cpp without its FlashAttention path (GGML_CUDA_NO_FA; it compiles the
# same files) and benches with -fa off; default on, as llama.cpp is usually run on GPUs
FA=${LCPP_FA:-1}
FA_BUILD=$([ "$FA" = 1 ] && echo ON || echo OFF)
FA_ONOFF=$([ "$FA" = 1 ] && echo on || echo off)
O=${OUT:-/tmp/kiln_peer_out}
export PATH=/usr/local/cuda/bin:$PATH
DEPS=$REPO/.deps/root
export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
mkdir -p "$PEER" "$M" "$O"
has() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }
stamp() { echo "== [t=${SECONDS}s] $*"; }
L=$PEER/llama.cpp
LB=$L/build/bin

if has build; then
    if [ ! -x "$LB/llama-bench" ]; then
        stamp "unpack + build llama.cpp (CUDA, sm_90a)"
        mkdir -p "$L" && tar xzf "$TGZ" -C "$L" || exit 1
        cmake -S "$L" -B "$L/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
            -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
            -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_FA="$FA_BUILD" \
            >"$O/lcpp_configure.log" 2>&1 || { tail -30 "$O/lcpp_configure.log"; exit 1; }
        cmake --build "$L/build" -j"$(nproc)" --target llama-bench llama-batched-bench llama-quantize \
            >"$O/lcpp_build.log" 2>&1 || { grep -E "error" "$O/lcpp_build.log" | head -20; exit 1; }
    fi
    stamp "llama.cpp built: $(ls "$LB" | tr '\n' ' ')"
fi

gguf_of() { echo "$M/$1.$2.gguf"; }
# random-weight folders made on the GPU machine carry no tokenizer (/work/shared is not there):
# the bundled model's byte-level BPE stands in (llama-bench feeds random ids anyway)
TOK=$REPO/models/demo-q8/tokenizer.json
if has models; then
    for s in $SHAPES; do
        [ -f "$M/$s/model.safetensors" ] || python3 bench/make_random_model.py --shape "$s" --out "$M/$s" >/dev/null || continue
        G=$(gguf_of "$s" bf16)
        [ -f "$G" ] || { stamp "gguf $s bf16"; python3 bench/peer/hf_to_gguf.py --model "$M/$s" --out "$G" --gguf-py "$L/gguf-py" --tokenizer "$TOK" >"$O/gguf_$s.log" 2>&1 || tail -8 "$O/gguf_$s.log"; }
        for f in $FORMATS; do
            case $f in
            q8) q=Q8_0 b=8 ;;
            q4) q=Q4_0 b=4 ;;
            *) continue ;;
            esac
            [ -f "$(gguf_of "$s" "$f")" ] || { stamp "quantize $s $q"; "$LB/llama-quantize" --pure "$G" "$(gguf_of "$s" "$f")" "$q" 16 >/dev/null 2>&1 || echo "quantize failed"; }
            [ -d "$M/$s-$f" ] || { stamp "kiln convert $s $f"; "$KILN" convert --model "$M/$s" --out "$M/$s-$f" --bits "$b" --group 64 >/dev/null 2>&1 || echo "kiln convert failed"; }
        done
    done
fi

if has bench; then
    R=$O/peer_cuda.txt
    : >"$R"
    for s in $SHAPES; do
        for f in $FORMATS; do
            G=$(gguf_of "$s" "$f")
            K=$M/$s
            [ "$f" = bf16 ] || K=$M/$s-$f
            stamp "llama-bench $s $f"
            { "$LB/llama-bench" -m "$G" -ngl 99 -fa "$FA" -p 512 -n 0 -r "$RUNS" -o jsonl &&
                "$LB/llama-bench" -m "$G" -ngl 99 -fa "$FA" -p 0 -n 128 -d 128 -r "$RUNS" -o jsonl; } \
                >"$O/lb_${s}_$f.jsonl" 2>"$O/lb_${s}_$f.err" || tail -5 "$O/lb_${s}_$f.err"
            stamp "llama-batched-bench $s $f"
            "$LB/llama-batched-bench" -m "$G" -ngl 99 -fa "$FA_ONOFF" -c 20000 -b 2048 -ub 512 -npp 128 -ntg 128 \
                -npl 1,8,64 --output-format jsonl >"$O/lbb_${s}_$f.jsonl" 2>"$O/lbb_${s}_$f.err" ||
                tail -5 "$O/lbb_${s}_$f.err"
            stamp "kiln bench $s $f"
            "$KILN" bench --model "$K" --device cuda --prompt 512 --gen 1 --runs "$RUNS" --json --quiet \
                >"$O/kiln_${s}_${f}_pp.json" 2>"$O/kiln_${s}_${f}_pp.err" || tail -3 "$O/kiln_${s}_${f}_pp.err"
            for b in 1 8 64; do
                "$KILN" bench --model "$K" --device cuda --prompt 128 --gen 128 --batch "$b" --runs "$RUNS" \
                    --json --quiet >"$O/kiln_${s}_${f}_b$b.json" 2>"$O/kiln_${s}_${f}_b$b.err" ||
                    tail -3 "$O/kiln_${s}_${f}_b$b.err"
            done
            python3 - "$O" "$s" "$f" <<'EOF' | tee -a "$R"
import json, sys, statistics
o, s, f = sys.argv[1:]
def rows(p):
    try:
        return [json.loads(l) for l in open(p) if l.strip().startswith("{")]
    except OSError:
        return []
lb = rows(f"{o}/lb_{s}_{f}.jsonl")
pp = [r["avg_ts"] for r in lb if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0]
tg = [r["avg_ts"] for r in lb if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0]
lbb = {r["pl"]: r for r in rows(f"{o}/lbb_{s}_{f}.jsonl") if "pl" in r}
out = []
for b in (1, 8, 64):
    try:
        k = json.load(open(f"{o}/kiln_{s}_{f}_b{b}.json"))
    except (OSError, ValueError):
        k = {}
    kd = k.get("decode_tok_s")
    try:
        kp = json.load(open(f"{o}/kiln_{s}_{f}_pp.json")).get("prefill_tok_s")
    except (OSError, ValueError):
        kp = None
    ld = (tg[0] if tg else None) if b == 1 else (lbb.get(b, {}).get("speed_tg"))
    ratio = f"{kd / ld:.2f}x" if kd and ld else "-"
    out.append(f"{s} {f} b{b}: kiln decode {kd} tok/s, llama.cpp {ld} -> {ratio}"
               + (f"; prefill 512 kiln {kp} llama.cpp {pp[0] if pp else None}" if b == 1 else ""))
print("\n".join(out))
EOF
        done
    done
    stamp "done"
    cat "$R"
fi
