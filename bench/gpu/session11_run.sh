#!/usr/bin/env bash
# session11_run.sh — the llama.cpp CUDA peer again, same machine and same calls as kiln (it was
# last run in the fifth session). Call 1 (this script, PART=1): build kiln and, in the background,
# llama.cpp (bench/peer_llamacpp_cuda.sh build stage) and the random-weight models; run
# test_parity_cuda_kv (its failure message now also gives the device's distance to the exact
# cache; KILN_S11_TESTS=0 skips it); the models (kiln's q8g64 / q4g64 conversions run in parallel
# from the start: kiln convert is one thread), GGUF, Q8_0 / Q4_0; then the peer on
# Qwen3-0.6B if 200 s are left. Call 2 (PART=2, on the still-warm machine): the peer on SHAPES
# (default Llama-3-8B). Logs stay in /tmp; summaries go to stdout.
LIMIT=${LIMIT:-560}
PART=${PART:-1}
source "$(dirname "$0")/common.sh"
export KILN_BIN=$B/kiln
if [ "$PART" = 1 ]; then
    (KILN_PEER_STAGES=build bash bench/peer_llamacpp_cuda.sh >/tmp/peer_build.log 2>&1
        echo "rc=$?" >>/tmp/peer_build.log) &
    BUILD_PID=$!
    models_converted_in_background qwen3-0.6b:8 qwen3-0.6b:4 llama-3-8b:8 llama-3-8b:4
    build_kiln
    [ "${KILN_S11_TESTS:-1}" = 0 ] || run_tests "test_parity_cuda_kv"
    wait $BUILD_PID
    tail -2 /tmp/peer_build.log
    wait $MODELS
    stamp "models made and converted; GGUF, Q8_0 / Q4_0"
    SHAPES="qwen3-0.6b llama-3-8b" KILN_PEER_STAGES=models bash bench/peer_llamacpp_cuda.sh 2>&1 |
        grep -E "\[t=|failed|rror" | cut -c1-220
    if left 200; then # nothing else runs while the peer measures
        stamp "peer qwen3-0.6b"
        SHAPES=qwen3-0.6b RUNS=${RUNS:-2} KILN_PEER_STAGES=bench \
            bash bench/peer_llamacpp_cuda.sh 2>&1 | grep -E "kiln decode|\[t=|failed|rror" | cut -c1-220
    fi
else
    SHAPES=${SHAPES:-llama-3-8b} RUNS=${RUNS:-2} KILN_PEER_STAGES="models bench" \
        bash bench/peer_llamacpp_cuda.sh 2>&1 | grep -E "kiln decode|\[t=|failed|rror" | cut -c1-220
fi
stamp "end"
