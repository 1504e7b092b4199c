#!/usr/bin/env bash
# test_attention_emulate.sh — the short decode attention kernel (attention_decode.cuh) and the
# contiguous cache's flash-style kernel with its split merge (attention.cu k_attn, k_attn_merge) run
# on the CPU by tests/emu/attention_emulate.cc (emulated threads, barriers, warp shuffles, shared
# memory) against softmax attention in double; needs no GPU. Skipped (77) without a C++20 g++. Env:
# KILN_BUILD (where the binary goes; default /tmp).
# kiln-test-labels: slow
set -u
cd "$(dirname "$0")/.."
source tests/emu/emu_common.sh
emu_require_cxx20
dir="${KILN_BUILD:-/tmp}/attention_emulate.d"
mkdir -p "$dir"
g++ -std=c++20 -O2 -pthread -Isrc -Iinclude -D_GNU_SOURCE -Wall -Wextra -Werror \
    -Wno-unknown-pragmas tests/emu/attention_emulate.cc -lm -o "$dir/attention_emulate" ||
    { echo "the emulator does not build"; exit 1; }
"$dir/attention_emulate"
