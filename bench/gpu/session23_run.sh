#!/usr/bin/env bash
# session23_run.sh — the twenty-third session's GPU call: why qg_link (x's digits handed from the
# op writing x to the quantized GEMV reading it, KILN_CUDA_QGEMV_LINK=1) gained nothing on the
# 8B at batch 1 (twenty-second session's PART=4, H100: q4 391 vs 397 tok/s, q8 279 vs 280) when
# skipping pass 1 outright gained 8–14%: does the model take the hand-offs (the link's log line),
# and what each kernel of a decode step costs with it and without (Nsight Compute, one metric,
# caches and clocks left alone, launches from the middle of the decode).
# The emission's arrival is now one acquire-release atomic by thread 0 (no fence per thread).
# PART=1: its tests, the A/B, the link's log line and the per-kernel traces;
# PART=2: the per-kernel trace only for q8 and fast mode.
# PART=3: the emission rebuilt after PART=1 (the GEMV's blocks only count their arrival, a few
# digitizer blocks at the grid's end wait for the groups and make the digits): a minimal build,
# its tests and the 8B q4 / q8 exact A/B, for the session's last ~210 s of device time. It
# measured slower (q4 370 vs 389 tok/s) and was taken back out; commit 66a5d15 has it.
LIMIT=${LIMIT:-400}
PART=${PART:-1}
source "$(dirname "$0")/common.sh"
exec > >(tee "${OUT:-/tmp}/log") 2>&1
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
link_log() { # model [VAR=value ...]: the link's log line and the decode rate of one bench run
    # (PART=1 ran it without the shift: env took the model for a command, so no lines came)
    local m=$1
    shift
    env "$@" KILN_CUDA_QGEMV_LINK=1 timeout 60 "$B/kiln" bench --device cuda --model "$M/$m" \
        --prompt 16 --gen 32 --runs 1 --verbose 2>&1 | grep -E "qgemv link|decode steps|^decode"
}
ncu_trace() { # tag model [VAR=value ...]: kernel times of ~1.5 decode steps, from launch 4000
    [ -n "$NCU" ] || { echo "no ncu"; return; }
    left 60 || return 0
    local tag=$1 m=$2
    shift 2
    stamp "ncu trace $tag: $m $*"
    env "$@" timeout 120 "$NCU" --clock-control none --cache-control none --launch-skip 4000 \
        --launch-count 500 --metrics gpu__time_duration.sum -o "/tmp/ncu_$tag" -f \
        "$B/kiln" bench --device cuda --model "$M/$m" --prompt 16 --gen 64 --runs 1 --quiet \
        >"/tmp/ncu_$tag.log" 2>&1 || tail -3 "/tmp/ncu_$tag.log"
    "$NCU" --import "/tmp/ncu_$tag.ncu-rep" --page raw --csv --print-units base \
        >"$OUT/ncu_$tag.csv" 2>&1
    python3 bench/gpu/ncu_trace.py "$OUT/ncu_$tag.csv" --seq 24
}
if [ "$PART" = 1 ]; then
    models_converted_in_background llama-3-8b:4 llama-3-8b:8
    build_kiln
    stamp "tests"
    TEST_TIMEOUT=120 run_tests "test_cuda_ops KILN_TEST_ONLY=test_qgemv_link" \
        "test_parity_cuda KILN_CUDA_QGEMV_LINK=1"
    wait $MODELS
    ab() { # model [VAR=value ...]: batch-1 decode, link / no link / link
        local m=$1
        shift
        left 60 && echo "$m b1 $* (prefill decode tok/s): link $(bench_tok_s $m 1 128 64 "$@" \
            KILN_CUDA_QGEMV_LINK=1) | no link $(bench_tok_s $m 1 128 64 "$@")" \
            "| link $(bench_tok_s $m 1 128 64 "$@" KILN_CUDA_QGEMV_LINK=1)"
    }
    ab llama-3-8b-q4 KILN_MATMUL=exact
    ab llama-3-8b-q8 KILN_MATMUL=exact
    link_log llama-3-8b-q4
    link_log llama-3-8b-q4 KILN_CUDA_GRAPH=0
    ncu_trace q4_nolink llama-3-8b-q4
    ncu_trace q4_link llama-3-8b-q4 KILN_CUDA_QGEMV_LINK=1
    ab llama-3-8b-q4 KILN_MATMUL=fast
    ab llama-3-8b-q8 KILN_MATMUL=fast
fi
if [ "$PART" = 2 ]; then
    models_converted_in_background llama-3-8b:8
    build_kiln
    wait $MODELS
    ncu_trace q8_nolink llama-3-8b-q8
    ncu_trace q8_link llama-3-8b-q8 KILN_CUDA_QGEMV_LINK=1
    ncu_trace q4f_link llama-3-8b-q4 KILN_CUDA_QGEMV_LINK=1 KILN_MATMUL=fast
fi
if [ "$PART" = 3 ]; then
    models_converted_in_background llama-3-8b:4 llama-3-8b:8
    build_minimal test_cuda_ops test_parity_cuda
    stamp "tests"
    TEST_TIMEOUT=60 run_tests "test_cuda_ops KILN_TEST_ONLY=test_qgemv_link" \
        "test_parity_cuda KILN_CUDA_QGEMV_LINK=1"
    while kill -0 "$MODELS" 2>/dev/null && left 30; do sleep 2; done
    for m in llama-3-8b-q4 llama-3-8b-q8; do
        left 25 && echo "$m b1 exact (prefill decode tok/s): link $(bench_tok_s $m 1 128 64 \
            KILN_CUDA_QGEMV_LINK=1) | no link $(bench_tok_s $m 1 128 64)"
    done
fi
stamp "end"
