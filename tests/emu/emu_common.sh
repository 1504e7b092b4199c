# emu_common.sh — sourced by the tests/test_*_emulate.sh scripts (run from the repository root):
# the skip when no C++20 compiler is installed, and the build of the plain-C reference sources an
# emulator links against.

# Exits 77 (skipped) unless gcc and a C++20 g++ are installed.
emu_require_cxx20() {
    command -v g++ >/dev/null || { echo "g++ is not installed"; exit 77; }
    command -v gcc >/dev/null || { echo "gcc is not installed"; exit 77; }
    echo 'int main() { return 0; }' | g++ -std=c++20 -x c++ - -o /dev/null 2>/dev/null ||
        { echo "g++ has no C++20"; exit 77; }
}

# emu_objects DIR [gcc flags ...] -- SOURCES ...: compiles each C source into DIR and sets the
# array objs to the objects. A compile failure is a failure of that source (exit 1), not a skip.
emu_objects() {
    local dir=$1
    shift
    local flags=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
    shift
    mkdir -p "$dir"
    objs=()
    for c in "$@"; do
        local o="$dir/$(basename "$c" .c).o"
        gcc -std=c17 -O2 -D_GNU_SOURCE -Isrc -Iinclude -Wall -Wextra -Werror \
            -Wno-unused-parameter -fno-strict-aliasing "${flags[@]}" -c "$c" -o "$o" ||
            { echo "$c does not build"; exit 1; }
        objs+=("$o")
    done
}

# emu_kv_codec_objects DIR: emu_objects of the CPU KV codecs (and the CPU pieces they call) that
# the emulators reading a paged block pool link (tests/emu/paged_pool.h).
emu_kv_codec_objects() {
    emu_objects "$1" -- src/kv/kv_quant.c src/kv/kv_turbo.c src/kv/lloyd_max.c src/kv/hadamard.c \
        src/backend/cpu/cpu_ops.c src/backend/cpu/cpu_kernels_scalar.c tests/emu/gdn_emu_cpu.c
}
