#!/usr/bin/env bash
# test_qgemv_emulate.sh — the dp4a GEMV and its decode fusions (src/backend/cuda/qgemv.cu:
# matmul_norm, q/k/v in one launch, matmul_add, matmul_norm_glu, digits from pass 1 or made in the
# blocks) run on the CPU by tests/emu/qgemv_emulate.cc (threads as fibers, shuffles and barriers
# warp- / block-collective, guard pages around every buffer, NaN-poisoned outputs, scratch and
# shared memory) against the CPU reference ops, over test_cuda_ops' check_qfused_case shapes.
# Needs no GPU. Skipped (77) without a C++20 g++. Env: KILN_BUILD (where the objects and binary
# go; default /tmp), KILN_QGEMV_EMU=quick|all (fewer / more cases).
# kiln-test-labels: slow
set -u
cd "$(dirname "$0")/.."
source tests/emu/emu_common.sh
emu_require_cxx20
dir="${KILN_BUILD:-/tmp}/qgemv_emulate.d"
# the CPU references link without the rest of libkiln (unused functions dropped)
emu_objects "$dir" -ffunction-sections -fdata-sections -- src/backend/cpu/cpu_matmul.c \
    src/backend/cpu/cpu_ops.c src/backend/cpu/cpu_kernels_scalar.c tests/emu/gdn_emu_cpu.c
g++ -std=c++20 -O2 -Isrc -Iinclude -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-unknown-pragmas \
    -ffunction-sections -fdata-sections tests/emu/qgemv_emulate.cc "${objs[@]}" \
    -Wl,--gc-sections -lm -o "$dir/qgemv_emulate" || { echo "the emulator does not build"; exit 1; }
"$dir/qgemv_emulate" ${KILN_QGEMV_EMU:-}
