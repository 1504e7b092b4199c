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
make_model() { # shape: random weights in $M/shape (bench/make_random_model.py)
    [ -f "$M/$1/model.safetensors" ] ||
        python3 bench/make_random_model.py --shape "$1" --out "$M/$1" >/dev/null 2>&1
}
models_in_background() { # shape ...: make_model of each in the background; MODELS = its pid
    (for s in "$@"; do make_model "$s"; done) &
    MODELS=$!
}
run_test() { # test [VAR=value ...]: its summary line and first failures; the log stays in /tmp
    local t=$1
    shift
    env "$@" timeout "${TEST_TIMEOUT:-200}" "$B/$t" >"/tmp/$t$*.log" 2>&1
    echo "$t $* rc=$? | $(grep -E "checks, " "/tmp/$t$*.log" | tail -1)"
    grep -E "CHECK failed|flip" "/tmp/$t$*.log" | head -6 | cut -c1-300
}
