#!/usr/bin/env bash
# peer_llamacpp.sh — kiln vs llama.cpp, same machine, same run: prefill and decode tok/s for the demo
# model and a random-weight Qwen3-0.6B-shaped model at bf16, 8-bit (MLX q8 vs Q8_0) and 4-bit
# (MLX q4 vs Q4_0), with decode weight GB/s, the kiln/llama.cpp ratio and the machine's read bandwidth.
#
#   bench/peer_llamacpp.sh                     # everything: fetch, build, convert, measure, table
#   KILN_PEER_DIR=/tmp/kiln-peer RUNS=5 THREADS=2 bench/peer_llamacpp.sh
#   MODELS="demo" FORMATS="bf16 q8 q4" bench/peer_llamacpp.sh
#
# Everything third-party lives OUTSIDE the repository under $KILN_PEER_DIR (default
# ~/.cache/kiln-peer): llama.cpp comes from the git bundle inside the npm package
# node-llama-cpp@3.21.1 (llama/gitRelease.bundle), is cloned and built there (llama-bench and
# llama-quantize only, CPU, GGML_NATIVE). Models are converted there too: GGUF bf16 by
# bench/peer/hf_to_gguf.py (numpy + llama.cpp's gguf-py; upstream convert_hf_to_gguf.py needs torch,
# which apt/npm cannot provide), then llama-quantize --pure to Q8_0 / Q4_0 (every tensor, the tied
# embedding included, at that type — like MLX quantization, which also quantizes the embedding);
# kiln's MLX models are made by `kiln convert --bits B --group G`. Never commit any of it.
#
# Env: KILN_PEER_DIR, KILN_BIN (default build-bench/kiln), RUNS (5), THREADS (2), PROMPT (128),
# GEN (64), MODELS ("demo q06b"), FORMATS ("bf16 q8 q4"), MLX_GROUPS ("64 32": MLX group sizes; g64 has
# the same bits/weight as Q8_0/Q4_0 (8.5 / 4.5), g32 the same block length), NODE_LLAMA_CPP
# (node-llama-cpp@3.21.1). Results: $KILN_PEER_DIR/results/<stamp>.{jsonl,md}; the table is printed.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PEER=${KILN_PEER_DIR:-$HOME/.cache/kiln-peer}
KILN=${KILN_BIN:-$REPO/build-bench/kiln}
RUNS=${RUNS:-5}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-128}
GEN=${GEN:-64}
MODELS=${MODELS:-demo q06b}
FORMATS=${FORMATS:-bf16 q8 q4}
GROUPS_=${MLX_GROUPS:-64 32}
PKG=${NODE_LLAMA_CPP:-node-llama-cpp@3.21.1}
PY=/usr/bin/python3
DEMO=${DEMO_MODEL:-$REPO/../shared/models/demo-bf16}
[ -d "$DEMO" ] || DEMO=/work/shared/models/demo-bf16

case "$PEER" in "$REPO"/*) echo "KILN_PEER_DIR must be outside the repository" >&2; exit 2 ;; esac
mkdir -p "$PEER/models" "$PEER/results"
log() { echo "[peer] $*" >&2; }

# ---- 1. llama.cpp from the npm package ------------------------------------------------------------
LCPP=$PEER/llama.cpp
if [ ! -d "$LCPP/.git" ]; then
    if [ ! -f "$PEER/package/llama/gitRelease.bundle" ]; then
        log "npm pack $PKG"
        (cd "$PEER" && npm pack "$PKG" --silent >/dev/null && tar xzf node-llama-cpp-*.tgz)
    fi
    BUNDLE=$(find "$PEER/package" -name gitRelease.bundle | head -1)
    [ -n "$BUNDLE" ] || { echo "no llama/gitRelease.bundle in $PKG" >&2; exit 1; }
    git clone -q "$BUNDLE" "$LCPP"
fi
LB=$LCPP/build/bin/llama-bench
LQ=$LCPP/build/bin/llama-quantize
if [ ! -x "$LB" ] || [ ! -x "$LQ" ]; then
    # Build batching only, to make the build feasible on 2 busy cores: compile libllama's ~150
    # per-model graph builders (src/models/*.cpp) as unity batches. No code is changed.
    if [ "${LLAMA_UNITY:-1}" = 1 ] && ! grep -q kiln-peer "$LCPP/src/CMakeLists.txt"; then
        cat >>"$LCPP/src/CMakeLists.txt" <<'EOF'
# kiln-peer: unity-build the per-model graph builders (build batching only; 2-core machine)
set_target_properties(llama PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 24)
file(GLOB _kiln_peer_nonmodel ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
set_source_files_properties(${_kiln_peer_nonmodel} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
# gemma4.cpp and gemma3n.cpp both define a static ggml_view_2d_slice
set_source_files_properties(models/gemma4.cpp PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
EOF
    fi
    log "building llama-bench, llama-quantize (CPU, native) in $LCPP/build"
    cmake -S "$LCPP" -B "$LCPP/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF >"$PEER/cmake.log"
    cmake --build "$LCPP/build" --target llama-bench llama-quantize -j"${JOBS:-2}" >"$PEER/build.log"
fi
LCPP_REV=$(git -C "$LCPP" log -1 --format=%h 2>/dev/null || echo '?')

if ! $PY -c 'import numpy' 2>/dev/null; then
    log "installing Debian python3-numpy"
    apt-get install -y python3-numpy >/dev/null
fi

# ---- 2. models ------------------------------------------------------------------------------------
M=$PEER/models
[ -x "$KILN" ] || { echo "no kiln binary at $KILN (build build-bench first)" >&2; exit 1; }
src_dir() { case $1 in demo) echo "$DEMO" ;; q06b) echo "$M/q06b-bf16" ;; esac; }
for m in $MODELS; do
    src=$(src_dir "$m")
    if [ "$m" = q06b ] && [ ! -f "$src/model.safetensors" ]; then
        log "random-weight Qwen3-0.6B-shaped model -> $src"
        $PY "$REPO/bench/make_random_model.py" --out "$src" --shape qwen3-0.6b --tokenizer-from "$DEMO" >&2
    fi
    [ -f "$M/$m-bf16.gguf" ] || $PY "$REPO/bench/peer/hf_to_gguf.py" --model "$src" --out "$M/$m-bf16.gguf" \
        --gguf-py "$LCPP/gguf-py"
    for q in Q8_0 Q4_0; do
        [ -f "$M/$m-$q.gguf" ] || "$LQ" --pure "$M/$m-bf16.gguf" "$M/$m-$q.gguf" $q "$THREADS" >"$M/$m-$q.log" 2>&1
    done
    for b in 8 4; do for g in $GROUPS_; do
        [ -f "$M/$m-mlx-q${b}g$g/config.json" ] ||
            "$KILN" convert --model "$src" --out "$M/$m-mlx-q${b}g$g" --bits $b --group $g --quiet
    done; done
done

# ---- 3. measure -----------------------------------------------------------------------------------
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=$PEER/results/$STAMP.jsonl
cc -O2 -march=native -pthread "$REPO/bench/peer/membw.c" -o "$PEER/membw"
echo "{\"kind\":\"machine\",\"cpu\":\"$(lscpu | sed -n 's/^Model name: *//p' | head -1)\",\"cores\":$(nproc),\"load_before\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"llama_cpp\":\"$LCPP_REV\",\"kiln\":\"$(git -C "$REPO" log -1 --format=%h)\",\"threads\":$THREADS,\"runs\":$RUNS,\"prompt\":$PROMPT,\"gen\":$GEN}" >"$OUT"
log "memory read bandwidth ($THREADS threads)"
echo "{\"kind\":\"membw\",$("$PEER/membw" "$THREADS" 1024 9 | sed 's/^{//')" >>"$OUT"

kiln_run() { # model fmt dir
    log "kiln $1 $2"
    local j
    j=$("$KILN" bench --model "$3" --prompt "$PROMPT" --gen "$GEN" --runs "$RUNS" --threads "$THREADS" --json)
    echo "{\"kind\":\"run\",\"engine\":\"kiln\",\"model\":\"$1\",\"format\":\"$2\",\"bench\":$j}" >>"$OUT"
}
llama_run() { # model fmt gguf
    log "llama.cpp $1 $2"
    local p d
    # prefill: pp$PROMPT from an empty context; decode: tg$GEN after a $PROMPT-token context, like kiln bench
    p=$("$LB" -m "$3" -p "$PROMPT" -n 0 -t "$THREADS" -r "$RUNS" -o json 2>/dev/null | tr -d '\n')
    d=$("$LB" -m "$3" -p 0 -n "$GEN" -d "$PROMPT" -t "$THREADS" -r "$RUNS" -o json 2>/dev/null | tr -d '\n')
    echo "{\"kind\":\"run\",\"engine\":\"llama.cpp\",\"model\":\"$1\",\"format\":\"$2\",\"pp\":$p,\"tg\":$d}" >>"$OUT"
}
for m in $MODELS; do
    for f in $FORMATS; do
        case $f in
        bf16) llama_run "$m" bf16 "$M/$m-bf16.gguf"; kiln_run "$m" bf16 "$(src_dir "$m")" ;;
        q8) llama_run "$m" Q8_0 "$M/$m-Q8_0.gguf"
            for g in $GROUPS_; do kiln_run "$m" "mlx-q8g$g" "$M/$m-mlx-q8g$g"; done ;;
        q4) llama_run "$m" Q4_0 "$M/$m-Q4_0.gguf"
            for g in $GROUPS_; do kiln_run "$m" "mlx-q4g$g" "$M/$m-mlx-q4g$g"; done ;;
        esac
    done
done
echo "{\"kind\":\"end\",\"load_after\":\"$(cut -d' ' -f1-3 /proc/loadavg)\"}" >>"$OUT"

# ---- 4. table -------------------------------------------------------------------------------------
$PY "$REPO/bench/peer/table.py" "$OUT" | tee "${OUT%.jsonl}.md"
log "results: $OUT"
