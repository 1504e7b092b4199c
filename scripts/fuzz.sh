#!/usr/bin/env bash
# fuzz.sh — builds the libFuzzer targets (clang, ASan+UBSan) and runs each for a while, then
# merges what it found into a minimized corpus under fuzz/corpus/<name>/ (kept small: every
# file there is replayed by the fuzz_<name>_corpus CTest in every build).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET=180] [TARGET...]   (targets: safetensors config ...)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-180}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for f in fuzz/fuzz_*.c; do n=${f#fuzz/fuzz_}; targets+=("${n%.c}"); done
fi
build=build-fuzz
CC=clang cmake -S . -B "$build" -DKILN_FUZZ=ON -DKILN_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
for t in "${targets[@]}"; do
    cmake --build "$build" -j2 --target "fuzz_${t}_libfuzzer"
    work="$build/fuzz-work/$t"
    mkdir -p "$work" "fuzz/corpus/$t"
    # explore: new inputs go to $work, seeded from the committed corpus
    "$build/fuzz_${t}_libfuzzer" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 \
        -artifact_prefix="$build/fuzz-work/${t}-" "$work" "fuzz/corpus/$t"
    # minimize: keep only inputs that add coverage
    mkdir -p "$work.min"
    "$build/fuzz_${t}_libfuzzer" -merge=1 -max_len=4096 "$work.min" "fuzz/corpus/$t" "$work"
    rm -f "fuzz/corpus/$t"/*
    cp "$work.min"/* "fuzz/corpus/$t"/
    rm -rf "$work.min"
    echo "fuzz_$t: $(ls "fuzz/corpus/$t" | wc -l) corpus files"
done
