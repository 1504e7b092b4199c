#!/usr/bin/env bash
# session6b_run.sh — the sixth session's second GPU call: build, the CUDA tests (the decode
# attention with q/k prep + store + merge inside, graphs up to 64 sequences), then interleaved
# A/B of the prep kernel (KILN_CUDA_ATT_PREP=0 = the four launches it replaces) on Qwen3-0.6B
# bf16 / q4 and Llama-3-8B bf16, batch 1 and 64. Each stage only while time remains (LIMIT s).
LIMIT=${LIMIT:-570}
source "$(dirname "$0")/common.sh"
models_in_background qwen3-0.6b llama-3-8b
build_kiln
TEST_TIMEOUT=220
P=()
for t in test_cuda_ops test_parity_cuda test_parity_cuda_kv test_parity_cuda_hybrid; do
    run_test $t >/tmp/$t.out &
    P+=($!)
done
run_test test_cuda_ops KILN_TEST_QFUSED=1 >/tmp/qf.out &
P+=($!)
wait "${P[@]}"
cat /tmp/test_cuda_ops.out /tmp/qf.out /tmp/test_parity_cuda.out /tmp/test_parity_cuda_kv.out /tmp/test_parity_cuda_hybrid.out
P=()
run_test test_parity_cuda KILN_CUDA_QFUSED=1 >/tmp/pq.out &
P+=($!)
run_test test_parity_cuda_gemma >/tmp/pg.out &
P+=($!)
run_test test_kv_cuda >/tmp/kc.out &
P+=($!)
wait "${P[@]}"
cat /tmp/pq.out /tmp/pg.out /tmp/kc.out
wait $MODELS
[ -f $M/qwen3-0.6b-q4/config.json ] || $B/kiln convert --model $M/qwen3-0.6b --out $M/qwen3-0.6b-q4 --bits 4 --group 64 --quiet >/dev/null 2>&1
stamp "A/B decode: prep kernel off / on (medians of interleaved rounds)"
AB_LINES=${AB_LINES:-"qwen3-0.6b bf16 1|qwen3-0.6b bf16 64|llama-3-8b bf16 1|llama-3-8b bf16 64"}
IFS='|' read -r -a ABS <<<"$AB_LINES"
for line in "${ABS[@]}"; do
    left 40 || { stamp "out of time before A/B $line"; break; }
    read -r s f b <<<"$line"
    SHAPES=$s FORMATS=$f BATCHES=$b ROUNDS=${ROUNDS:-3} GEN=${GEN:-64} VARIANTS="KILN_CUDA_ATT_PREP=0;default" \
        bash bench/gpu/ab_decode.sh $B/kiln 2>&1 | grep -vE "^\s*$" | cut -c1-160
done
if left 60; then
    stamp "A/B quantized decode fusions (KILN_CUDA_QFUSED=1), Qwen3-0.6B q4 batch 1"
    SHAPES="qwen3-0.6b" FORMATS=q4 BATCHES=1 ROUNDS=3 GEN=64 VARIANTS="default;KILN_CUDA_QFUSED=1" \
        bash bench/gpu/ab_decode.sh $B/kiln 2>&1 | grep -vE "^\s*$" | cut -c1-160
fi
if left 60; then
    stamp "Qwen3.5-4B shape (bf16) decode, batched DeltaNet ops"
    python3 bench/make_family_model.py --help >/dev/null 2>&1
    KILN_FIXTURES=$KILN_SHARED/fixtures python3 bench/make_family_model.py --shape qwen3.5-4b --out $M/qwen3.5-4b >/dev/null 2>&1
    for b in 1 8 64; do
        echo "qwen3.5-4b b$b: $($B/kiln bench --device cuda --model $M/qwen3.5-4b --prompt 128 --gen 32 --batch $b --runs 2 --json --quiet 2>/dev/null | tail -1 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print('decode %.1f tok/s' % d['decode_tok_s'])" 2>&1 | tail -1)"
    done
fi
if left 60; then
    stamp "A/B bf16 GEMV variant (row-streaming, KILN_CUDA_GEMV_DENSE=2), batch 1"
    SHAPES="qwen3-0.6b llama-3-8b" FORMATS=bf16 BATCHES=1 ROUNDS=2 GEN=64 VARIANTS="KILN_CUDA_GEMV_DENSE=2;default" \
        bash bench/gpu/ab_decode.sh $B/kiln 2>&1 | grep -vE "^\s*$" | cut -c1-160
fi
if left 30; then
    stamp "profile 0.6B bf16 b1 (prep on)"
    KILN_CUDA_PROFILE=1 timeout 30 $B/kiln bench --device cuda --model $M/qwen3-0.6b --prompt 4 --gen 64 --batch 1 --runs 1 --json --quiet 2>&1 |
        grep -E "cuda profile" | head -8 | cut -c15-130
fi
if left 45; then
    stamp "micro: bf16 GEMM at n = 64 (0.6B and 8B shapes), tensor-core [tc*] vs cuBLAS split [old]"
    gcc -O2 -std=c17 -D_GNU_SOURCE -DKILN_HAVE_CUDA=1 -Iinclude -Isrc -I/usr/local/cuda/include \
        bench/gpu/kiln_gpu_bench.c -o $B/kiln_gpu_bench -L$B -lkiln -Wl,-rpath,$B \
        -L/usr/local/cuda/lib64 -lcudart -lm 2>&1 | head -5
    KILN_BENCH_TC_SHAPES="2048x1024 1024x2048 3072x1024 1024x3072 6144x4096 14336x4096 4096x14336" \
        timeout $((LIMIT - SECONDS - 5)) $B/kiln_gpu_bench tc 2>&1 | grep -E "n=64 " | cut -c1-120
fi
stamp "end"
