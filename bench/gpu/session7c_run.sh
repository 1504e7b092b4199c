#!/usr/bin/env bash
# session7c_run.sh — the seventh session's last GPU call (about 4 minutes of device time left):
# build; the short decode attention kernel (attention_decode.cuh) in test_cuda_ops' attention
# groups (short kernel by default, forced for every context, off) and in test_parity_cuda (decode
# steps replayed from graphs, positions in device memory); then its A/B at batch 1 against the
# split kernel + merge (KILN_CUDA_ATT_SHORT=0), Qwen3-0.6B and Llama-3-8B bf16. LIMIT s in all.
LIMIT=${LIMIT:-250}
source "$(dirname "$0")/common.sh"
models_in_background qwen3-0.6b llama-3-8b
build_kiln
P=()
(KILN_TEST_ONLY="attention(),attention_prep" run_test test_cuda_ops) >/tmp/a.out &
P+=($!)
run_test test_parity_cuda >/tmp/b.out &
P+=($!)
wait "${P[@]}"
cat /tmp/a.out /tmp/b.out
stamp "tests done"
wait $MODELS
stamp "A/B short decode attention (KILN_CUDA_ATT_SHORT=0: split kernel + merge), batch 1, bf16"
for s in qwen3-0.6b llama-3-8b; do
    left 25 || break
    SHAPES=$s FORMATS=bf16 BATCHES=1 ROUNDS=2 GEN=64 VARIANTS="KILN_CUDA_ATT_SHORT=0;default" \
        bash bench/gpu/ab_decode.sh $B/kiln 2>&1 | grep -vE "^\s*$" | cut -c1-160
done
left 25 && SHAPES=qwen3-0.6b FORMATS=bf16 BATCHES=8 ROUNDS=1 GEN=64 \
    VARIANTS="KILN_CUDA_ATT_SHORT=0;default" bash bench/gpu/ab_decode.sh $B/kiln 2>&1 | grep -vE "^\s*$" | cut -c1-160
stamp "end"
