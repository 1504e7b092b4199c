#!/usr/bin/env bash
# test_paged_attention_emulate.sh — the paged-cache attention kernels (attention_paged.cu: the
# attention over records decoded in the kernel, the split merge, the TurboQuant unrotation) and
# their launch plan, run on the CPU by tests/emu/paged_attention_emulate.cc (emulated threads,
# barriers, warp shuffles, shared memory) over a block pool encoded by the CPU codecs, against
# softmax attention in double; needs no GPU. Skipped (77) without a C++20 g++. Env: KILN_BUILD
# (where the binary goes; default /tmp).
# kiln-test-labels: slow
set -u
cd "$(dirname "$0")/.."
source tests/emu/emu_common.sh
emu_require_cxx20
dir="${KILN_BUILD:-/tmp}/paged_attention_emulate.d"
emu_kv_codec_objects "$dir" # the CPU codecs that encode the paged pool
g++ -std=c++20 -O2 -pthread -Isrc -Iinclude -D_GNU_SOURCE -Wall -Wextra -Werror \
    -Wno-unknown-pragmas tests/emu/paged_attention_emulate.cc "${objs[@]}" -lm \
    -o "$dir/paged_attention_emulate" || { echo "the emulator does not build"; exit 1; }
"$dir/paged_attention_emulate"
