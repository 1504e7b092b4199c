#!/usr/bin/env bash
# session8b_run.sh — the eighth session's second GPU call: build; every CUDA test with the
# quantized decode fusions on by default (test_cuda_ops now runs their checks always) and the
# tensor-core GEMM's norm-without-weight fix; Nsight Compute on the dp4a GEMV (stall reasons,
# occupancy, memory throughput) where ncu exists, and the kernel's SASS into $OUT; a per-op
# profile of Qwen3-0.6B bf16 batch-1 decode with f32 vs f16 KV (f16 steps are ~20% slower);
# batch-8 quantized decode with and without the fusions. LIMIT s in all.
LIMIT=${LIMIT:-540}
source "$(dirname "$0")/common.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
models_converted_in_background qwen3-0.6b qwen3-0.6b:4 llama-3-8b:4
build_kiln
build_gpu_bench
run_tests test_cuda_ops test_parity_cuda test_parity_cuda_hybrid test_parity_cuda_gemma test_kv_cuda \
    test_parity_cuda_kv >/tmp/tests.out &
T=$!
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}  cuobjdump: ${CUOBJ:-none}"
if [ -n "$CUOBJ" ]; then
    $CUOBJ -sass $B/libkiln.so 2>/dev/null | awk '/Function : .*k_qgemv_dp4aILi4ELi1ELi2ELi0E/{p=1} p&&/Function : /&&!/k_qgemv_dp4aILi4ELi1ELi2ELi0E/{p=0} p' >"$OUT/qgemv_q4_rr2.sass"
    $CUOBJ -sass $B/libkiln.so 2>/dev/null | awk '/Function : .*k_qgemv_dp4aILi4ELi1ELi4ELi5E/{p=1} p&&/Function : /&&!/k_qgemv_dp4aILi4ELi1ELi4ELi5E/{p=0} p' >"$OUT/qgemv_q4_glu.sass"
    wc -l "$OUT"/*.sass
fi
wait $T
cat /tmp/tests.out
stamp "tests done"
if [ -n "$NCU" ] && left 150; then
    stamp "ncu: dp4a GEMV q4g64 14336x4096 and 4096x4096, n = 1, exact"
    for shape in 14336x4096 4096x4096; do
        KILN_BENCH_GEMV_FMTS=q4g64 KILN_BENCH_GEMV_SHAPES=$shape timeout 120 $NCU --kernel-name regex:k_qgemv_dp4a \
            --launch-skip 6 --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
            --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
            $B/kiln_gpu_bench gemv >"$OUT/ncu_q4_$shape.txt" 2>&1
        grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Grid Size|Waves Per SM|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" \
            "$OUT/ncu_q4_$shape.txt" | head -40 | cut -c1-120
    done
fi
wait $MODELS
prof() { # label model batch gen [kiln options]
    local l=$1 m=$2 b=$3 g=$4
    shift 4
    stamp "profile $l"
    KILN_CUDA_PROFILE=1 timeout 60 $B/kiln bench --device cuda --model $m --prompt 4 --gen $g --batch $b \
        --runs 1 --json --quiet "$@" 2>&1 | grep -E "cuda profile" | head -10 | cut -c15-130
}
left 60 && prof "0.6B bf16 b1 --kv f32" $M/qwen3-0.6b 1 64 --kv f32
left 60 && prof "0.6B bf16 b1 --kv f16" $M/qwen3-0.6b 1 64 --kv f16
if left 60; then
    stamp "batch 8 quantized decode: fusions on (default) vs off"
    SHAPES="qwen3-0.6b llama-3-8b" FORMATS="q4" BATCHES=8 ROUNDS=1 GEN=32 \
        VARIANTS="KILN_CUDA_QFUSED=0;default" bash bench/gpu/ab_decode.sh $B/kiln 2>&1 | grep -vE "^\s*$" | cut -c1-170
fi
stamp "end"
