#!/usr/bin/env bash
# test_fa_emulate.sh — the tensor-core prefill attention kernel (attention_prefill_tc.cu, both
# variants, f16 / bf16 / f32 caches) run on the CPU by tests/emu/fa_emulate.cc (emulated warps,
# mma.sync and ldmatrix modelled from the PTX ISA) against a double-precision reference; needs no
# GPU. Skipped (77) without a C++20 g++. Env: KILN_BUILD (where the binary goes; default /tmp).
# kiln-test-labels: slow
set -u
cd "$(dirname "$0")/.."
source tests/emu/emu_common.sh
emu_require_cxx20
dir="${KILN_BUILD:-/tmp}/fa_emulate.d"
emu_kv_codec_objects "$dir" # the CPU codecs that encode the paged pool
# a compile failure here is a failure of the kernel source, not a reason to skip
g++ -std=c++20 -O2 -pthread -Isrc -Iinclude -D_GNU_SOURCE -DFA_HOST_EMU -Wall -Wextra -Werror \
    -Wno-unknown-pragmas tests/emu/fa_emulate.cc "${objs[@]}" -lm -o "$dir/fa_emulate" ||
    { echo "the emulator does not build"; exit 1; }
"$dir/fa_emulate"
