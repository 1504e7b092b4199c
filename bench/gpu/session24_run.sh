#!/usr/bin/env bash
# session24_run.sh — the twenty-fourth session's GPU calls.
# PART=1: the CUDA tests the twenty-third session wrote after its last call (cuda_link_check in
# test_parity_cuda and test_parity_cuda_gemma: qg_link's hand-offs on the tiny fixtures, inline
# digits off) and this session's cluster meeting (KILN_CUDA_QGEMV_LINK=2: the blocks of a 32-row
# group launched as a thread-block cluster, the leader gathering the group through distributed
# shared memory), test_cuda_ops' GEMV groups (test_qgemv_link runs both modes); then Llama-3-8B
# batch-1 decode, q4 and q8, exact and fast, without the link / link 1 / link 2 / without again;
# then what the eighteenth session left unmeasured as far as time allows: Llama-3-8B bf16 batch
# 64 and prefill 512, decode at 8k context, MoE decode of 1 / 2 / 4 sequences.
# PART=2: the least of PART=1 for a short call (below).
LIMIT=${LIMIT:-560}
PART=${PART:-1}
source "$(dirname "$0")/common.sh"
exec > >(tee "${OUT:-/tmp}/log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ "$PART" = 1 ]; then
    models_converted_in_background llama-3-8b:4 llama-3-8b:8 qwen3-30b-a3b-l4:4
    build_kiln
    stamp "tests"
    TEST_TIMEOUT=200 run_tests test_parity_cuda test_parity_cuda_gemma test_parity_cuda_hybrid \
        "test_cuda_ops KILN_TEST_ONLY=test_qgemv"
    grep -hE "qgemv link|replay" /tmp/test_parity_cuda.log /tmp/test_parity_cuda_gemma.log |
        head -12 | cut -c1-200
    wait $MODELS
    ab3() { # model [VAR=value ...]: batch-1 decode tok/s, no link / link 1 / link 2 / no link
        local m=$1
        shift
        left 60 && echo "$m b1 $* (prefill decode tok/s): no link $(bench_tok_s $m 1 128 64 "$@")" \
            "| link 1 $(bench_tok_s $m 1 128 64 "$@" KILN_CUDA_QGEMV_LINK=1)" \
            "| link 2 $(bench_tok_s $m 1 128 64 "$@" KILN_CUDA_QGEMV_LINK=2)" \
            "| no link $(bench_tok_s $m 1 128 64 "$@")"
    }
    ab3 llama-3-8b-q4 KILN_MATMUL=exact
    ab3 llama-3-8b-q8 KILN_MATMUL=exact
    ab3 llama-3-8b-q4 KILN_MATMUL=fast
    left 60 && KILN_CUDA_QGEMV_LINK=2 timeout 60 "$B/kiln" bench --device cuda \
        --model "$M/llama-3-8b-q4" --prompt 16 --gen 32 --runs 1 --verbose 2>&1 |
        grep -E "qgemv link|cluster|^decode"
    ab3 llama-3-8b-q8 KILN_MATMUL=fast
    left 120 && echo "llama-3-8b bf16 batch 64 (prefill decode tok/s): default" \
        "$(bench_tok_s llama-3-8b 64 128 64) | KILN_CUDA_FUSE_WEIGHTS=1" \
        "$(bench_tok_s llama-3-8b 64 128 64 KILN_CUDA_FUSE_WEIGHTS=1)"
    left 60 && echo "llama-3-8b bf16 prefill 512 (prefill decode tok/s):" \
        "$(bench_tok_s llama-3-8b 1 512 4)"
    left 60 && echo "llama-3-8b --kv f32 batch 1 context 8192 decode tok/s: $(ctx llama-3-8b f32 1)"
    m=qwen3-30b-a3b-l4-q4
    for b in 1 2 4; do
        left 40 && echo "$m batch $b (prefill decode tok/s): gather $(bench_tok_s $m $b 128 64)" \
            "| KILN_CUDA_MOE_TC=1 $(bench_tok_s $m $b 128 64 KILN_CUDA_MOE_TC=1)"
    done
fi
if [ "$PART" = 2 ]; then # the least of PART=1, for a call of ~270 s: a minimal build, the link
    # tests, and the 8B q4 exact A/B of the cluster meeting
    models_converted_in_background llama-3-8b:4
    build_minimal test_cuda_ops test_parity_cuda
    stamp "tests"
    TEST_TIMEOUT=60 run_tests "test_cuda_ops KILN_TEST_ONLY=test_qgemv_link" test_parity_cuda
    grep -hE "qgemv link" /tmp/test_parity_cuda.log | cut -c1-200
    while kill -0 "$MODELS" 2>/dev/null && left 30; do sleep 2; done
    m=llama-3-8b-q4
    left 25 && echo "$m b1 exact (prefill decode tok/s): no link $(bench_tok_s $m 1 128 64) |" \
        "link 2 $(bench_tok_s $m 1 128 64 KILN_CUDA_QGEMV_LINK=2)"
    left 25 && echo "$m b1 exact (prefill decode tok/s): no link $(bench_tok_s $m 1 128 64) |" \
        "link 2 $(bench_tok_s $m 1 128 64 KILN_CUDA_QGEMV_LINK=2)"
    left 15 && echo "$m b1 exact link 1: $(bench_tok_s $m 1 128 64 KILN_CUDA_QGEMV_LINK=1)"
fi
stamp "end"
