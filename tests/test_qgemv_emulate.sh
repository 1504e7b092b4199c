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
command -v g++ >/dev/null || { echo "g++ is not installed"; exit 77; }
command -v gcc >/dev/null || { echo "gcc is not installed"; exit 77; }
echo 'int main() { return 0; }' | g++ -std=c++20 -x c++ - -o /dev/null 2>/dev/null ||
    { echo "g++ has no C++20"; exit 77; }
dir="${KILN_BUILD:-/tmp}/qgemv_emulate.d"
mkdir -p "$dir"
# a compile failure here is a failure of the kernel or reference source, not a reason to skip;
# the CPU references link without the rest of libkiln (unused functions dropped)
objs=()
for c in src/backend/cpu/cpu_matmul.c src/backend/cpu/cpu_ops.c \
    src/backend/cpu/cpu_kernels_scalar.c tests/emu/gdn_emu_cpu.c; do
    o="$dir/$(basename "$c" .c).o"
    gcc -std=c17 -O2 -D_GNU_SOURCE -Isrc -Iinclude -Wall -Wextra -Werror -Wno-unused-parameter \
        -fno-strict-aliasing -ffunction-sections -fdata-sections -c "$c" -o "$o" ||
        { echo "$c does not build"; exit 1; }
    objs+=("$o")
done
g++ -std=c++20 -O2 -Isrc -Iinclude -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-unknown-pragmas \
    -ffunction-sections -fdata-sections tests/emu/qgemv_emulate.cc "${objs[@]}" \
    -Wl,--gc-sections -lm -o "$dir/qgemv_emulate" || { echo "the emulator does not build"; exit 1; }
"$dir/qgemv_emulate" ${KILN_QGEMV_EMU:-}
