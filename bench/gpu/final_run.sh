#!/usr/bin/env bash
# final_run.sh — the fifth session's GPU call: build, every CUDA test (in parallel, summaries and
# first failures), the paged diagnostics, then interleaved A/B speed of this session's changes
# (quantized decode fusions, tensor-core GEMM for n > 1, decode graphs above 8 sequences, chunked
# gated delta rule) on random-weight Qwen3-0.6B, each stage only while time remains (LIMIT s).
# Summaries to stdout, logs in /tmp (few files come back from the device).
LIMIT=${LIMIT:-570}
source "$(dirname "$0")/common.sh"
build_kiln
(
    make_model qwen3-0.6b
    for b in 4 8; do $B/kiln convert --model $M/qwen3-0.6b --out $M/qwen3-0.6b-q$b --bits $b --group 64 --quiet >/dev/null 2>&1; done
) &
MODELS=$!
# tests: three at a time (they share the GPU; results, not timings)
stamp "tests"
P=()
run_test test_cuda_ops >/tmp/t1.out &
P+=($!)
run_test test_parity_cuda >/tmp/t2.out &
P+=($!)
run_test test_parity_cuda_hybrid >/tmp/t3.out &
P+=($!)
wait "${P[@]}"
P=()
run_test test_parity_cuda_kv >/tmp/t4.out &
P+=($!)
run_test test_kv_cuda >/tmp/t5.out &
P+=($!)
run_test test_parity_cuda_gemma >/tmp/t6.out &
P+=($!)
run_test test_parity_cuda_hybrid KILN_CUDA_GDN_CHUNK=2 >/tmp/t7.out &
P+=($!)
wait "${P[@]}"
cat /tmp/t[1-7].out
grep -E "codec noise" /tmp/test_parity_cuda_kv.log | head -30 | cut -c1-200
KILN_TEST_PLAIN_PAGED=1 timeout 40 $B/test_kv_cuda >/tmp/plain.log 2>&1
grep -E "first differing|records, " /tmp/plain.log | tail -5 | cut -c1-300
wait $MODELS
j() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print('prefill %.0f decode %.1f' % (d['prefill_tok_s'], d['decode_tok_s']))" 2>/dev/null || echo "failed"; }
if left 100; then
    stamp "prefill 512 (0.6B): variants ${PP_VARIANTS:-KILN_CUDA_TC_GEMM=0 default}"
    for f in "" -q4 -q8; do
        for v in ${PP_VARIANTS:-KILN_CUDA_TC_GEMM=0 default}; do
            envs=()
            [ "$v" = default ] || IFS=',' read -r -a envs <<<"$v"
            echo "0.6B$f $v: $(env "${envs[@]}" $B/kiln bench --device cuda --model $M/qwen3-0.6b$f --prompt 512 --gen 1 --runs 3 --json --quiet 2>/dev/null | j)"
        done
    done
fi
stamp "A/B decode (medians of interleaved rounds)"
# EXTRA_AB: more variant lines, "FORMAT BATCH VARIANTS" separated by '|'
AB_LINES=${AB_LINES:-"q4 1 KILN_CUDA_FUSED=0;default|q4 64 KILN_CUDA_TC_GEMM=0;default|bf16 8 KILN_CUDA_TC_GEMM=0;default|q8 1 KILN_CUDA_FUSED=0;default|q8 8 KILN_CUDA_TC_GEMM=0;default|bf16 64 KILN_GRAPH_MAX_BATCH=8;KILN_GRAPH_MAX_BATCH=64"}
IFS='|' read -r -a ABS <<<"$AB_LINES"
for line in "${ABS[@]}"; do
    left 45 || { stamp "out of time before A/B $line"; break; }
    read -r f b v <<<"$line"
    SHAPES=qwen3-0.6b FORMATS=$f BATCHES=$b ROUNDS=${ROUNDS:-2} GEN=${GEN:-32} VARIANTS="$v" \
        bash bench/gpu/ab_decode.sh $B/kiln 2>&1 | grep -vE "^\s*$" | cut -c1-160
done
if left 60; then
    stamp "micro: tensor-core GEMM [tc] vs the old paths [old], then the gated delta rule"
    gcc -O2 -std=c17 -D_GNU_SOURCE -DKILN_HAVE_CUDA=1 -Iinclude -Isrc -I/usr/local/cuda/include \
        bench/gpu/kiln_gpu_bench.c -o $B/kiln_gpu_bench -L$B -lkiln -Wl,-rpath,$B \
        -L/usr/local/cuda/lib64 -lcudart -lm 2>&1 | head -5
    timeout 100 $B/kiln_gpu_bench tc 2>&1 | grep -E "\[(tc|old)\]" | cut -c1-120
    left 30 && timeout $((LIMIT - SECONDS - 10)) $B/kiln_gpu_bench gdn 2>&1 | tail -14 | cut -c1-160
fi
stamp "end"
