#!/usr/bin/env bash
# peer_run.sh — one GPU call of the fifth session: build kiln, start the llama.cpp CUDA build in
# the background, run the diagnostics that need no peer (plain-float paged rows, the paged parity
# failures, per-op profiles at batch 1 and 64), then the llama.cpp peer on the shapes in SHAPES
# (bench/peer_llamacpp_cuda.sh, models and bench stages) while time remains (LIMIT seconds).
# A second call with KILN_PEER_ONLY=1 skips the diagnostics (the builds are reused when the machine
# is still warm). Logs stay in /tmp; summaries go to stdout.
LIMIT=${LIMIT:-570}
source "$(dirname "$0")/common.sh"
[ -x "$B/kiln" ] || KILN_STAGES=none bash bench/gpu_bench.sh "$B" 2>&1 | grep -E "error|\[t=" | head -20
stamp "kiln built"
(KILN_PEER_STAGES=build bash bench/peer_llamacpp_cuda.sh >/tmp/peer_build.log 2>&1; echo "rc=$?" >>/tmp/peer_build.log) &
BUILD_PID=$!
if [ "${KILN_PEER_ONLY:-0}" != 1 ]; then
    stamp "plain-float paged rows"
    KILN_TEST_PLAIN_PAGED=1 timeout 120 $B/test_kv_cuda >/tmp/plain.log 2>&1
    grep -E "first differing|checks|CHECK failed" /tmp/plain.log | head -12 | cut -c1-400
    stamp "paged parity"
    timeout 150 $B/test_parity_cuda_kv >/tmp/pkv.log 2>&1
    grep -E "CHECK failed|flip|checks, |margin|step" /tmp/pkv.log | head -14 | cut -c1-300
    make_model qwen3-0.6b
    for b in 1 64; do
        stamp "profile 0.6B bf16 batch $b"
        KILN_CUDA_PROFILE=1 $B/kiln bench --device cuda --model $M/qwen3-0.6b --prompt 128 --gen 16 \
            --batch $b --runs 1 --json --quiet 2>&1 | grep -E "cuda profile|decode_tok_s" | head -18 | cut -c1-150
    done
fi
wait $BUILD_PID
tail -3 /tmp/peer_build.log
for s in ${SHAPES:-qwen3-0.6b llama-3-8b}; do
    [ $SECONDS -lt $((LIMIT - 150)) ] || { stamp "out of time before $s"; break; }
    stamp "peer $s"
    SHAPES=$s FORMATS="${FORMATS:-bf16 q8 q4}" RUNS=${RUNS:-2} KILN_PEER_STAGES="models bench" \
        bash bench/peer_llamacpp_cuda.sh 2>&1 | grep -E "kiln decode|\[t=|failed|rror" | cut -c1-220
done
stamp "end"
