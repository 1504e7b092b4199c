#!/usr/bin/env bash
# session15_run.sh — why the tensor-core GEMM streams quantized W at ~1.1 TB/s at 1-8 tokens (the
# fourteenth session's kiln_gpu_bench tc: q8g64 14336x4096 n=8 57 us, q4g64 6144x4096 n=8 25.5 us,
# where the dp4a GEMV reads the same q8 matrix at n=1 in 20.6 us) and reaches ~40 TFLOP/s at 64:
# Nsight Compute on its three kernels (k_tc_prep, k_tc_gemm, k_tc_reduce) at n = 8 and 64, one
# launch each (KILN_BENCH_TC_NS / KILN_BENCH_TC_VARIANTS pick it), then the same shapes timed.
# Full reports in $OUT, the lines that place the time on stdout. First, the paged-cache attention
# with the fourteenth session's row-wise tile loader (attention_paged.cu, emulated only): its
# tests (test_kv_cuda, test_parity_cuda_kv), decode at 8k context on Qwen3-0.6B with the
# quantized (paged) caches against the contiguous f32 one (before: q8 85 tok/s, f32 340), and
# 4096-token prefill into paged blocks on the tensor-core kernel against the CUDA-core one.
# One call, LIMIT s.
LIMIT=${LIMIT:-540}
source "$(dirname "$0")/common.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
models_in_background qwen3-0.6b
build_kiln
build_gpu_bench
run_tests test_kv_cuda test_parity_cuda_kv >/tmp/tests.out &
T=$!
wait $MODELS
for kv in f32 q8 q4 turbo:k4v4:rotk:kg64 "bf16 --kv-block 16"; do
    left 60 || break
    echo "qwen3-0.6b --kv $kv, context 8192: $(timeout 60 "$B/kiln" bench --device cuda \
        --model "$M/qwen3-0.6b" --kv $kv --context 8192 --prompt 16 --gen 32 --runs 3 --json \
        --quiet 2>&1 | grep -oE '"decode_tok_s":[0-9.]*')"
done
for kv in q8 turbo:k8v4 turbo:k4v4:rotk:kg64 "bf16 --kv-block 16"; do # paged prefill: tensor cores | CUDA cores
    left 60 || break
    pf() { timeout 60 "$B/kiln" bench --device cuda --model "$M/qwen3-0.6b" --kv $kv --prompt 4096 \
        --gen 1 --runs 2 --json --quiet 2>&1 | grep -oE '"prefill_tok_s":[0-9.]*'; }
    echo "qwen3-0.6b --kv $kv, prefill 4096: $(pf) | KILN_CUDA_FA=0 $(KILN_CUDA_FA=0 pf)"
done
wait $T
cat /tmp/tests.out
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
for spec in q4g64:6144x4096:8 q8g64:14336x4096:8 q4g64:6144x4096:64 q8g64:14336x4096:64; do
    IFS=: read -r fmt shape n <<<"$spec"
    left 90 || break
    stamp "$fmt $shape n=$n"
    KILN_BENCH_TC_FMTS=$fmt KILN_BENCH_TC_SHAPES=$shape KILN_BENCH_TC_NS=$n \
        KILN_BENCH_TC_VARIANTS=",tc,old," timeout 60 "$B/kiln_gpu_bench" tc 2>&1 | grep -E "^tc "
    [ -n "$NCU" ] || continue
    KILN_BENCH_TC_FMTS=$fmt KILN_BENCH_TC_SHAPES=$shape KILN_BENCH_TC_NS=$n \
        KILN_BENCH_TC_VARIANTS=",tc," timeout 120 "$NCU" --clock-control none \
        --kernel-name regex:k_tc_ --launch-skip 6 --launch-count 3 --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters \
        "$B/kiln_gpu_bench" tc >"$OUT/ncu_${fmt}_${shape}_n$n.txt" 2>&1
    grep -E "^  k_tc_|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Waves Per SM|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall (Long|Short|Barrier|Wait|MIO|Math)|Shared.*Bank|L2 Hit" \
        "$OUT/ncu_${fmt}_${shape}_n$n.txt" | head -60 | cut -c1-130
done
# the dp4a GEMV at one token on the small layer matrices (o 4096x4096: ~14% of copy, q/k/v
# 6144x4096: ~17% in the per-op profile, against 72% on the LM head): ramp, tail, occupancy
for shape in 4096x4096 6144x4096; do
    [ -n "$NCU" ] && left 60 || break
    stamp "ncu: dp4a GEMV q4g64 $shape n=1"
    KILN_BENCH_GEMV_FMTS=q4g64 KILN_BENCH_GEMV_SHAPES=$shape timeout 90 "$NCU" --clock-control none \
        --kernel-name regex:k_qgemv --launch-skip 6 --launch-count 1 --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section SchedulerStats \
        "$B/kiln_gpu_bench" gemv >"$OUT/ncu_gemv_q4_$shape.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Waves Per SM|Warp Cycles Per Issued|No Eligible|Stall (Long|Short|Barrier|Wait)" \
        "$OUT/ncu_gemv_q4_$shape.txt" | head -24 | cut -c1-130
done
stamp "end"
