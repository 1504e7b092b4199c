#!/usr/bin/env bash
# session6d_run.sh — the sixth session's short last GPU call: build, test_cuda_ops and
# test_parity_cuda (the q/k prep + K/V store kernel before the decode attention), then its A/B
# against the separate launches (KILN_CUDA_QK_STORE=0) at batch 1, Llama-3-8B and Qwen3-0.6B bf16.
LIMIT=${LIMIT:-290}
source "$(dirname "$0")/common.sh"
models_in_background ${AB_SHAPES:-llama-3-8b qwen3-0.6b}
build_kiln
(KILN_TEST_ONLY=attention_prep,qk_norm_rope timeout 150 $B/test_cuda_ops >/tmp/ops.log 2>&1; echo "test_cuda_ops rc=$? | $(grep -E "checks, " /tmp/ops.log | tail -1)"; grep -E "CHECK failed" /tmp/ops.log | head -6 | cut -c1-300) >/tmp/a.out &
A=$!
(timeout 150 $B/test_parity_cuda >/tmp/par.log 2>&1; echo "test_parity_cuda rc=$? | $(grep -E "checks, " /tmp/par.log | tail -1)"; grep -E "CHECK failed" /tmp/par.log | head -6 | cut -c1-300) >/tmp/b.out &
Bp=$!
wait $A $Bp
cat /tmp/a.out /tmp/b.out
wait $MODELS
stamp "A/B q/k prep + store kernel (=0: separate; default: one launch), batch 1"
for s in ${AB_SHAPES:-llama-3-8b qwen3-0.6b}; do
    left 30 || break
    SHAPES=$s FORMATS=bf16 BATCHES=1 ROUNDS=2 GEN=64 VARIANTS="KILN_CUDA_QK_STORE=0;default" \
        bash bench/gpu/ab_decode.sh $B/kiln 2>&1 | grep -vE "^\s*$" | cut -c1-160
done
stamp "end"
