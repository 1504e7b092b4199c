# common.sh — sourced by the one-call GPU scripts in bench/gpu: runs from the repository root,
# names the build (B) and model (M) folders, exports the carried data and libraries, and gives
# the helpers every call uses. A script sets LIMIT (its time budget, s) before sourcing.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
B=${B:-/tmp/b}
M=${M:-/dev/shm/kiln_models}
LIMIT=${LIMIT:-570}
export KILN_SHARED=$PWD/.gpu-data/shared
export LD_LIBRARY_PATH=$PWD/.deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
mkdir -p "$M"
stamp() { echo "== [t=${SECONDS}s] $*"; }
left() { [ "$SECONDS" -lt $((LIMIT - $1)) ]; } # more than $1 s of LIMIT left
build_kiln() {
    KILN_STAGES=none bash bench/gpu_bench.sh "$B" 2>&1 | grep -E "error|\[t=" | head -20
    stamp "built"
}
make_model() { # shape: random weights in $M/shape (bench/make_random_model.py; Qwen3.5, Gemma 4
    # and Qwen3-MoE shapes by bench/make_family_model.py from the carried fixtures)
    [ -f "$M/$1/config.json" ] && ls "$M/$1"/*.safetensors >/dev/null 2>&1 && return 0
    case $1 in
    qwen3.5-* | gemma-4-*)
        KILN_FIXTURES=$KILN_SHARED/fixtures python3 bench/make_family_model.py --shape "$1" \
            --out "$M/$1" >/dev/null 2>&1 ;;
    *-l[0-9]*) # shape-lN: the first N layers of a family shape (qwen3-30b-a3b-l8)
        KILN_FIXTURES=$KILN_SHARED/fixtures python3 bench/make_family_model.py \
            --shape "${1%-l*}" --layers "${1##*-l}" --out "$M/$1" >/dev/null 2>&1 ;;
    *) python3 bench/make_random_model.py --shape "$1" --out "$M/$1" >/dev/null 2>&1 ;;
    esac
}
models_in_background() { # shape ...: make_model of each in the background; MODELS = its pid
    (for s in "$@"; do make_model "$s"; done) &
    MODELS=$!
}
models_converted_in_background() { # shape[:bits] ...: each shape's random model, and once kiln
    # is built its MLX conversion (--bits bits --group 64) into $M/shape-qbits; MODELS = the pid
    (
        for m in "$@"; do make_model "${m%%:*}"; done
        while [ ! -x "$B/kiln" ]; do sleep 2; done
        for m in "$@"; do
            local s=${m%%:*} b=${m#*:}
            [ "$b" = "$m" ] || [ -f "$M/$s-q$b/config.json" ] ||
                "$B/kiln" convert --model "$M/$s" --out "$M/$s-q$b" --bits "$b" --group 64 \
                    --quiet >/dev/null 2>&1 &
        done
        wait
        stamp "models converted"
    ) &
    MODELS=$!
}
build_gpu_bench() { # $B/kiln_gpu_bench (bench/gpu/kiln_gpu_bench.c) against the built libkiln
    gcc -O2 -std=c17 -D_GNU_SOURCE -DKILN_HAVE_CUDA=1 -Iinclude -Isrc -I/usr/local/cuda/include \
        bench/gpu/kiln_gpu_bench.c -o "$B/kiln_gpu_bench" -L"$B" -lkiln -Wl,-rpath,"$B" \
        -L/usr/local/cuda/lib64 -lcudart -lm 2>&1 | head -5
}
build_minimal() { # target ...: a Release build of libkiln, the CLI and those test targets only
    # (no server), faster than build_kiln's for short calls
    stamp "build"
    cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_SERVER=OFF -DKILN_CUDA=ON \
        -DKILN_DEPS_PREFIX="$PWD/.deps/root" >/tmp/configure.log 2>&1 || tail -20 /tmp/configure.log
    cmake --build "$B" -j16 --target kiln_shared kiln_cli "$@" >/tmp/build.log 2>&1 ||
        grep -E "error" /tmp/build.log | head -20
    stamp "built"
}
ctx() { # model kv batch [VAR=value ...]: decode tok/s at context 8128 (median of 3): 8192
    # positions with the prompt and decode, the limit of a model whose max_position_embeddings is
    # 8192 (Llama-3-8B's shape)
    local m=$1 kv=$2 b=$3
    shift 3
    env "$@" timeout 90 "$B/kiln" bench --device cuda --model "$M/$m" --kv $kv --context 8128 \
        --prompt 16 --gen 32 --batch "$b" --runs 3 --json --quiet 2>&1 |
        grep -oE '"decode_tok_s":[0-9.]*' | cut -d: -f2
}
bench_tok_s() { # model batch prompt gen [VAR=value ...]: "prefill decode" tok/s of kiln bench on
    # $M/model (--device cuda, median of 2 runs)
    local m=$1 b=$2 p=$3 g=$4
    shift 4
    env "$@" "$B/kiln" bench --device cuda --model "$M/$m" --prompt "$p" --gen "$g" \
        --batch "$b" --runs 2 --json --quiet 2>&1 |
        grep -oE '"(prefill|decode)_tok_s":[0-9.]*' | cut -d: -f2 | tr '\n' ' '
}
op_profile() { # model batch [seconds]: the per-op profile (KILN_CUDA_PROFILE=1) of a decode at
    # that batch (prompt 16 at batch 1, else 128), when more than that many s (40) of LIMIT are left
    local secs=${3:-40} prompt=128
    [ "$2" = 1 ] && prompt=16
    left "$secs" || return 0
    stamp "profile: $1 batch $2"
    KILN_CUDA_PROFILE=1 timeout "$secs" "$B/kiln" bench --device cuda --model "$M/$1" \
        --prompt $prompt --gen 8 --batch "$2" --runs 1 2>&1 | grep -vE "^\s*$" | tail -28 |
        cut -c1-150
}
batch1_profile() { op_profile "$1" 1; } # model: op_profile at batch 1
run_test() { # test [VAR=value ...]: its summary line and first failures; the log stays in /tmp
    local t=$1
    shift
    local t0=$SECONDS
    env "$@" timeout "${TEST_TIMEOUT:-200}" "$B/$t" >"/tmp/$t$*.log" 2>&1
    echo "$t $* rc=$? $((SECONDS - t0)) s | $(grep -E "checks, " "/tmp/$t$*.log" | tail -1)"
    grep -E "CHECK failed|flip" "/tmp/$t$*.log" | head -6 | cut -c1-300
}
run_tests() { # "test [VAR=value ...]" ...: run_test of each, all at once; results in the given order
    local i=0 n=$# pids=()
    for spec in "$@"; do
        run_test $spec >"/tmp/run_tests.$i.out" &
        pids+=($!)
        i=$((i + 1))
    done
    wait "${pids[@]}"
    for ((i = 0; i < n; i++)); do cat "/tmp/run_tests.$i.out"; done
}
gemv_micro() { # mode (exact|fast) pattern: the decode GEMVs alone (kiln_gpu_bench gemv, q4g64 and
    # q8g64 at Llama-3-8B shapes), the one-token lines matching pattern
    KILN_MATMUL=$1 KILN_BENCH_GEMV_FMTS="q4g64 q8g64" timeout 60 "$B/kiln_gpu_bench" gemv 2>&1 |
        grep -E "$2" | grep -v "n=4" | cut -c1-120
}
ab_bench() { # bench/gpu/ab_bench.sh under the caller's SHAPES / FORMATS / VARIANTS ..., when more
    # than 40 s of LIMIT are left
    left 40 && bash bench/gpu/ab_bench.sh "$B/kiln" 2>&1 | grep -vE "^\s*$" | cut -c1-200
}
