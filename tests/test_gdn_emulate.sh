#!/usr/bin/env bash
# test_gdn_emulate.sh — the chunked gated delta rule kernels (gdn_chunked.cu) and the batched
# conv / recurrent delta rule kernels (gdn_recurrent.cuh) run on the CPU by tests/emu/gdn_emulate.cc
# (emulated threads, barriers, shared memory and shuffles) against the CPU's kernels and
# token-by-token reference; needs no GPU. Skipped (77) without a C++20 g++. Env:
# KILN_BUILD (where the objects and binary go; default /tmp).
# kiln-test-labels: slow
set -u
cd "$(dirname "$0")/.."
source tests/emu/emu_common.sh
emu_require_cxx20
dir="${KILN_BUILD:-/tmp}/gdn_emulate.d"
emu_objects "$dir" -- src/backend/cpu/cpu_deltanet.c src/backend/cpu/cpu_ops.c \
    src/backend/cpu/cpu_kernels_scalar.c tests/emu/gdn_emu_cpu.c
g++ -std=c++20 -O2 -pthread -Isrc -Iinclude -D_GNU_SOURCE -DGDN_HOST_EMU -Wall -Wextra -Werror \
    -Wno-unknown-pragmas tests/emu/gdn_emulate.cc "${objs[@]}" -lm -o "$dir/gdn_emulate" ||
    { echo "the emulator does not build"; exit 1; }
"$dir/gdn_emulate"
