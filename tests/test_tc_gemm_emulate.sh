#!/usr/bin/env bash
# test_tc_gemm_emulate.sh — the tensor-core GEMM (src/backend/cuda/gemm_tc.cu: x split, GEMM at
# every block shape, split-K reduce) run on the CPU by tests/emu/tc_gemm_emulate.cc (emulated
# warps, mma.sync m16n8k16 modelled from the PTX ISA, cp.async landing as late and as early as
# allowed) against a double-precision reference: 4/8-bit codes with group 32/64/128 and
# f16/bf16/f32 scales, dense bf16, shapes off the tiles, several matrices, fused norm and add.
# Needs no GPU. Skipped (77) without a C++20 g++. Env: KILN_BUILD (where the binary goes; default
# /tmp), KILN_TC_EMU_QUICK=1 (one cp.async pass).
# kiln-test-labels: slow
set -u
cd "$(dirname "$0")/.."
source tests/emu/emu_common.sh
emu_require_cxx20
out="${KILN_BUILD:-/tmp}/tc_gemm_emulate"
# a compile failure here is a failure of the kernel source, not a reason to skip
g++ -std=c++20 -O2 -pthread -Isrc -DTC_HOST_EMU -Wall -Wextra -Werror -Wno-unknown-pragmas \
    tests/emu/tc_gemm_emulate.cc -o "$out" || { echo "the emulator does not build"; exit 1; }
if [ "${KILN_TC_EMU_QUICK:-0}" = 1 ]; then "$out" quick; else "$out"; fi
