#!/usr/bin/env bash
# session14_run.sh — the fourteenth session's GPU checks, one call: build; every CUDA test binary
# (the tensor-core prefill attention now takes f32 caches as bf16 hi + lo pairs by default,
# KILN_CUDA_FA_F32=2); then exact-mode prefill with the new default against the CUDA-core kernel
# (KILN_CUDA_FA_F32=0) on Qwen3-0.6B and Llama-3-8B bf16. PART=2: fast mode, whose f32 caches
# now go to the kernel as one bf16: the attention op tests, test_parity_cuda, and fast-mode
# prefill 512 with that default | pairs | CUDA cores. Summaries go to stdout and $OUT/log.
LIMIT=${LIMIT:-570}
PART=${PART:-1}
source "$(dirname "$0")/common.sh"
exec > >(tee "${OUT:-/tmp}/log") 2>&1
models_in_background qwen3-0.6b llama-3-8b
build_kiln
if [ "$PART" = 1 ]; then
    run_tests test_cuda_ops test_kv_cuda test_parity_cuda test_parity_cuda_gemma \
        test_parity_cuda_hybrid test_parity_cuda_kv
    wait $MODELS
    for mp in qwen3-0.6b:512 llama-3-8b:512 qwen3-0.6b:4096; do
        left 60 || break
        m=${mp%%:*} p=${mp#*:}
        echo "$m exact prefill $p (prefill decode tok/s): default $(bench_tok_s "$m" 1 "$p" 1) |" \
            "CUDA cores $(bench_tok_s "$m" 1 "$p" 1 KILN_CUDA_FA_F32=0)"
    done
else # PART=2: fast mode's default for f32 caches is one bf16 (KILN_CUDA_FA_F32=1)
    run_tests "test_cuda_ops KILN_TEST_ONLY=test_attention_tc" test_parity_cuda
    for m in qwen3-0.6b llama-3-8b; do # the 0.6B is made first, long before the build ends
        [ $m = qwen3-0.6b ] || wait $MODELS
        left 40 || break
        echo "$m fast prefill 512 (prefill decode tok/s): default $(bench_tok_s "$m" 1 512 1 \
            KILN_MATMUL=fast) | pairs $(bench_tok_s "$m" 1 512 1 KILN_MATMUL=fast \
            KILN_CUDA_FA_F32=2) | CUDA cores $(bench_tok_s "$m" 1 512 1 KILN_MATMUL=fast \
            KILN_CUDA_FA_F32=0)"
    done
fi
stamp "end"
