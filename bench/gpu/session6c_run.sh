#!/usr/bin/env bash
# session6c_run.sh — the sixth session's last GPU call: build, the CUDA tests (the prep kernel
# forced in test_cuda_ops and, in a second run, in test_parity_cuda), then the new defaults
# measured: bf16 tensor-core GEMM for small matrices up to 64 tokens (A/B against
# KILN_CUDA_TC_DENSE_SMALL=0), the prep kernel only at 32+ sequences. LIMIT s in all.
LIMIT=${LIMIT:-400}
source "$(dirname "$0")/common.sh"
models_in_background qwen3-0.6b llama-3-8b
build_kiln
P=()
run_test test_cuda_ops >/tmp/a.out &
P+=($!)
run_test test_parity_cuda >/tmp/b.out &
P+=($!)
run_test test_parity_cuda KILN_CUDA_ATT_PREP=1 >/tmp/c.out &
P+=($!)
run_test test_parity_cuda_hybrid >/tmp/d.out &
P+=($!)
wait "${P[@]}"
cat /tmp/a.out /tmp/b.out /tmp/c.out /tmp/d.out
wait $MODELS
stamp "A/B bf16 tensor-core GEMM for small matrices (KILN_CUDA_TC_DENSE_SMALL=0 = cuBLAS split above 16 tokens)"
for b in 64 32; do
    left 40 || break
    SHAPES=qwen3-0.6b FORMATS=bf16 BATCHES=$b ROUNDS=3 GEN=64 VARIANTS="KILN_CUDA_TC_DENSE_SMALL=0;default" \
        bash bench/gpu/ab_decode.sh $B/kiln 2>&1 | grep -vE "^\s*$" | cut -c1-160
done
stamp "defaults: batch 1 and 64"
for line in "qwen3-0.6b 1" "llama-3-8b 1" "llama-3-8b 64"; do
    left 40 || break
    read -r s b <<<"$line"
    SHAPES=$s FORMATS=bf16 BATCHES=$b ROUNDS=3 GEN=64 VARIANTS="default" \
        bash bench/gpu/ab_decode.sh $B/kiln 2>&1 | grep -vE "^\s*$" | cut -c1-160
done
stamp "end"
