#!/usr/bin/env bash
# session21_run.sh — the twenty-first session's GPU calls: quantized batch-1 decode, where each
# of the 8B's four GEMVs a layer is two launches (x's digits, pass 1, then the GEMV) or one with
# the digits made in every block (QG_INL, taken today only where the grid is small).
# PART=1: build; Llama-3-8B q4 / q8 at batch 1, exact and fast, with the digits in the blocks
# wherever they fit (KILN_CUDA_QGEMV_INLINE=1) against the default; the batch-1 per-op profile;
# then the eighteenth session's leftovers as time allows (the batch-64 per-op profile).
# PART=2: what pass 1 costs the 8B's batch-1 decode (see below), and decode attention alone.
# PART=3: decode attention's key splits at mid contexts (fewer keys a split, more blocks).
# PART=4: everything in one call: qg_link's tests and batch-1 A/B, then PART=3's A/B.
# PART=5: PART=4 cut to its first half, for the last ~300 s of device time.
LIMIT=${LIMIT:-560}
PART=${PART:-1}
source "$(dirname "$0")/common.sh"
exec > >(tee "${OUT:-/tmp}/log") 2>&1
export KILN_BIN=$B/kiln
b1_ab() { # model [VAR=value ...]: batch-1 decode tok/s, the default against digits in the blocks
    local m=$1
    shift
    left 40 || return 0
    echo "$m b1 $* (prefill decode tok/s): default $(bench_tok_s "$m" 1 128 64 "$@")" \
        "| inline $(bench_tok_s "$m" 1 128 64 "$@" KILN_CUDA_QGEMV_INLINE=1)" \
        "| never $(bench_tok_s "$m" 1 128 64 "$@" KILN_CUDA_QGEMV_INLINE=0)"
}
if [ "$PART" = 1 ]; then
    models_converted_in_background llama-3-8b:4 llama-3-8b:8
    build_kiln
    build_gpu_bench
    stamp "gemv micro, exact: q4g64 / q8g64 n=1"
    gemv_micro exact "n=1:.*(R=0 KS=0\]|inline|pass 1)"
    gemv_micro fast "n=1:.*(R=0 KS=0\]|inline|pass 1)"
    wait $MODELS
    for m in llama-3-8b-q4 llama-3-8b-q8; do
        b1_ab $m
        b1_ab $m KILN_MATMUL=fast
    done
    op_profile llama-3-8b-q4 1 40
    KILN_CUDA_QGEMV_INLINE=1 op_profile llama-3-8b-q4 1 40
    op_profile llama-3-8b-q4 64 60
fi
if [ "$PART" = 2 ]; then
    # the ceiling of handing x's digits from the kernel that makes x to the GEMV: the same decode
    # with pass 1 not launched (KILN_CUDA_QGEMV_SKIP1, a measurement-only patch: the digits are
    # stale, the work and bytes of pass 2 the same); decode attention alone at short contexts
    models_converted_in_background llama-3-8b:4 llama-3-8b:8
    build_kiln
    build_gpu_bench
    timeout 60 "$B/kiln_gpu_bench" attn 2>&1 | grep -E "^attn"
    wait $MODELS
    for m in llama-3-8b-q4 llama-3-8b-q8; do
        for v in KILN_MATMUL=exact KILN_MATMUL=fast; do
            left 40 && echo "$m b1 $v (prefill decode tok/s): default $(bench_tok_s $m 1 128 64 $v)" \
                "| no pass 1 $(bench_tok_s $m 1 128 64 $v KILN_CUDA_QGEMV_SKIP1=1)"
        done
    done
fi
if [ "$PART" = 3 ]; then
    # decode attention's key splits at mid contexts: the fewest keys a split takes (256 today,
    # KILN_CUDA_ATT_SPLIT_KEYS) against 128 / 64 / 32; alone, in the attention tests, end to end
    models_converted_in_background llama-3-8b:4
    build_kiln
    build_gpu_bench
    for k in 0 128 64 32; do
        echo "split keys $k:"
        KILN_CUDA_ATT_SPLIT_KEYS=$k timeout 60 "$B/kiln_gpu_bench" attn 2>&1 | grep -E "^attn"
    done
    TEST_TIMEOUT=150 run_tests "test_cuda_ops KILN_TEST_ONLY=test_attention KILN_CUDA_ATT_SPLIT_KEYS=64" \
        "test_kv_cuda KILN_CUDA_ATT_SPLIT_KEYS=64"
    wait $MODELS
    for pb in "1024 1" "4096 1" "1024 8" "128 1"; do
        set -- $pb
        left 60 && echo "llama-3-8b-q4 prompt $1 batch $2 (prefill decode tok/s): default" \
            "$(bench_tok_s llama-3-8b-q4 $2 $1 32) | 64 $(bench_tok_s llama-3-8b-q4 $2 $1 32 \
                KILN_CUDA_ATT_SPLIT_KEYS=64) | 128 $(bench_tok_s llama-3-8b-q4 $2 $1 32 \
                KILN_CUDA_ATT_SPLIT_KEYS=128)"
    done
fi
if [ "$PART" = 4 ]; then
    # one call for all of it (the session's last device minutes): x's digits handed from GEMV to
    # GEMV (qg_link, opt-in: KILN_CUDA_QGEMV_LINK=1) tested and A/B'd against the default on the 8B at
    # batch 1; then PART=3's attention split A/B
    models_converted_in_background llama-3-8b:4 llama-3-8b:8
    build_kiln
    build_gpu_bench
    stamp "tests"
    TEST_TIMEOUT=240 run_tests "test_cuda_ops KILN_TEST_ONLY=test_qgemv_link,test_qgemv_fused" \
        "test_parity_cuda KILN_CUDA_QGEMV_LINK=1" \
        "test_parity_cuda_hybrid KILN_CUDA_QGEMV_LINK=1" \
        "test_parity_cuda_gemma KILN_CUDA_QGEMV_LINK=1" \
        "test_cuda_ops KILN_TEST_ONLY=test_attention KILN_CUDA_ATT_SPLIT_KEYS=64" \
        "test_kv_cuda KILN_CUDA_ATT_SPLIT_KEYS=64"
    wait $MODELS
    for m in llama-3-8b-q4 llama-3-8b-q8; do
        for v in KILN_MATMUL=exact KILN_MATMUL=fast; do
            left 40 && echo "$m b1 $v (prefill decode tok/s): link $(bench_tok_s $m 1 128 64 $v \
                KILN_CUDA_QGEMV_LINK=1) | no link $(bench_tok_s $m 1 128 64 $v)" \
                "| link $(bench_tok_s $m 1 128 64 $v KILN_CUDA_QGEMV_LINK=1)"
        done
    done
    for k in 0 64; do
        left 30 && echo "split keys $k:" && KILN_CUDA_ATT_SPLIT_KEYS=$k timeout 30 \
            "$B/kiln_gpu_bench" attn 2>&1 | grep -E "^attn"
    done
    for pb in "1024 1" "4096 1" "1024 8"; do
        set -- $pb
        left 45 && echo "llama-3-8b-q4 prompt $1 batch $2 (prefill decode tok/s): default" \
            "$(bench_tok_s llama-3-8b-q4 $2 $1 32) | split keys 64 $(bench_tok_s llama-3-8b-q4 \
                $2 $1 32 KILN_CUDA_ATT_SPLIT_KEYS=64)"
    done
    op_profile llama-3-8b-q4 1 30
fi
if [ "$PART" = 5 ]; then
    # PART=4 cut to what ~250 s hold: qg_link's tests and the q4 (then q8) batch-1 A/B
    models_converted_in_background llama-3-8b:4 llama-3-8b:8
    build_kiln
    stamp "tests"
    TEST_TIMEOUT=100 run_tests "test_cuda_ops KILN_TEST_ONLY=test_qgemv_link" \
        "test_parity_cuda KILN_CUDA_QGEMV_LINK=1" "test_parity_cuda_hybrid KILN_CUDA_QGEMV_LINK=1"
    while kill -0 "$MODELS" 2>/dev/null && left 40; do sleep 2; done
    for m in llama-3-8b-q4 llama-3-8b-q8; do
        for v in KILN_MATMUL=exact KILN_MATMUL=fast; do
            left 25 && echo "$m b1 $v (prefill decode tok/s): link $(bench_tok_s $m 1 128 64 $v \
                KILN_CUDA_QGEMV_LINK=1) | no link $(bench_tok_s $m 1 128 64 $v)"
        done
    done
fi
stamp "end"
