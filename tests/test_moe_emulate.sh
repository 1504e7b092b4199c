#!/usr/bin/env bash
# test_moe_emulate.sh — the MoE device-routing kernels (src/backend/cuda/moe_gather.cuh: top-k
# route, gathered matmuls on dense and quantized expert stacks, the weighted sum) run on the CPU by
# tests/emu/moe_emulate.cc (emulated threads, barriers, warp shuffles, shared memory) against the
# CPU reference ops. Needs no GPU. Skipped (77) without a C++20 g++. Env: KILN_BUILD (where the
# objects and binary go; default /tmp).
# kiln-test-labels: slow
set -u
cd "$(dirname "$0")/.."
source tests/emu/emu_common.sh
emu_require_cxx20
dir="${KILN_BUILD:-/tmp}/moe_emulate.d"
# the CPU references link without the rest of libkiln (unused functions dropped)
emu_objects "$dir" -ffunction-sections -fdata-sections -- src/backend/cpu/cpu_matmul.c \
    src/backend/cpu/cpu_ops.c src/backend/cpu/cpu_kernels_scalar.c src/backend/matrix.c \
    src/format/dtype.c tests/emu/gdn_emu_cpu.c
g++ -std=c++20 -O2 -pthread -Isrc -Iinclude -D_GNU_SOURCE -Wall -Wextra -Werror \
    -Wno-unknown-pragmas -ffunction-sections -fdata-sections tests/emu/moe_emulate.cc \
    "${objs[@]}" -Wl,--gc-sections -lm -o "$dir/moe_emulate" ||
    { echo "the emulator does not build"; exit 1; }
"$dir/moe_emulate"
