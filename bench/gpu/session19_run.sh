#!/usr/bin/env bash
# session19_run.sh — the nineteenth session's GPU calls: why the tensor-core GEMM on codes runs at
# ~40 TFLOP/s at 64 tokens (Llama-3-8B quantized batch 64 is 0.51x llama.cpp), and the batch-64
# baselines it is measured against.
# PART=1: build; Llama-3-8B (random bf16, then q4g64 by kiln convert) made in the background;
# test_cuda_ops' tensor-core groups; the GEMM with the lean main loop (default) against the old
# one (KILN_CUDA_TC_LEAN=0) on the 8B's shapes at 8 / 64 / 512 tokens, forced block shapes /
# splits; Nsight Compute on one k_tc_gemm launch (q4g64 14336x4096, n=64): stall reasons as
# metrics and the SASS lines with the most stall samples ($OUT/ncu_*); then `kiln bench` batch
# 64 of the 8B in q4 (lean / old) and bf16 (cuBLAS / the tensor-core GEMM) and the per-op
# profile of the q4 batch-64 step.
# PART=2: the kernel as changed after PART=1's profile: tests, micro A/B, the 8B at batch 64 / 16 in
# 4- and 8-bit and bf16 on cuBLAS or the tensor-core GEMM. PART=3: PART=2 cut to ~280 s.
LIMIT=${LIMIT:-540}
PART=${PART:-1}
source "$(dirname "$0")/common.sh"
exec > >(tee "${OUT:-/tmp}/log") 2>&1
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
tc_micro() { # fmts shapes ns variants: kiln_gpu_bench tc lines
    KILN_BENCH_TC_FMTS="$1" KILN_BENCH_TC_SHAPES="$2" KILN_BENCH_TC_NS="$3" \
        KILN_BENCH_TC_VARIANTS="$4" timeout 90 "$B/kiln_gpu_bench" tc 2>&1 | grep -E "^tc " |
        cut -c1-110
}
stall_metrics="smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
for r in long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected \
    selected dispatch_stall lg_throttle no_instruction branch_resolving drain membar sleeping \
    imc_miss tex_throttle; do
    stall_metrics="$stall_metrics,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
other_metrics="gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum,launch__registers_per_thread,launch__grid_size,sm__cycles_active.avg,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum"
ncu_tc() { # fmt shape n variants tag: stall metrics, then the SASS lines with most samples
    [ -n "$NCU" ] || { echo "no ncu"; return; }
    stamp "ncu $5: $1 $2 n=$3 [$4]"
    KILN_BENCH_TC_FMTS=$1 KILN_BENCH_TC_SHAPES=$2 KILN_BENCH_TC_NS=$3 KILN_BENCH_TC_VARIANTS="$4" \
        timeout 150 "$NCU" --clock-control none --kernel-name regex:k_tc_gemm --launch-skip 4 \
        --launch-count 1 --metrics "$stall_metrics,$other_metrics" --section WarpStateStats \
        --section SourceCounters --import-source no -o "/tmp/ncu_$5" -f \
        "$B/kiln_gpu_bench" tc >/tmp/ncu_$5.log 2>&1
    "$NCU" --import "/tmp/ncu_$5.ncu-rep" --page raw --csv >"$OUT/ncu_$5_raw.csv" 2>&1
    "$NCU" --import "/tmp/ncu_$5.ncu-rep" --print-units base >"$OUT/ncu_$5.txt" 2>&1
    "$NCU" --import "/tmp/ncu_$5.ncu-rep" --page source --csv --print-source sass \
        >"$OUT/ncu_$5_sass.csv" 2>&1
    python3 bench/gpu/ncu_summary.py "$OUT/ncu_$5_raw.csv" "$OUT/ncu_$5_sass.csv" 2>&1 | head -70
}
lean_ab() { # fmts shapes ns: the lean main loop (default) against the old one
    for l in 1 0; do
        echo "KILN_CUDA_TC_LEAN=$l"
        KILN_CUDA_TC_LEAN=$l tc_micro "$1" "$2" "$3" ",tc,"
    done
}
if [ "$PART" = 1 ]; then
    models_converted_in_background llama-3-8b:4
    build_kiln
    build_gpu_bench
    stamp "tests: test_cuda_ops test_tc_ groups"
    TEST_TIMEOUT=150 run_tests "test_cuda_ops KILN_TEST_ONLY=test_tc_"
    grep -E "^group " /tmp/test_cuda_ops*test_tc_*.log
    stamp "codes GEMM: lean loop vs old"
    lean_ab "q4g64 q8g64 bf16" "14336x4096 4096x14336 6144x4096" "8 64"
    lean_ab "q4g64 bf16" "14336x4096" "512"
    # (the kiln commit of the first call, 1904f0d, also timed the 64-token block with one stage
    # left out, KILN_CUDA_TC_ABLATE, and other warp layouts / depths, KILN_CUDA_TC_SHAPE64:
    # docs/gpu.md "Nineteenth session"; both knobs were removed after it)
    tc_micro "q4g64 bf16" "14336x4096" 64 ",tc splits=1,tc splits=2,tc splits=4,tc bn=16,tc bn=128,old,"
    ncu_tc q4g64 14336x4096 64 ",tc," q4n64
    wait $MODELS
    m=llama-3-8b-q4
    left 70 && echo "$m batch 64 (prefill decode tok/s): default $(bench_tok_s $m 64 128 32)" \
        "| KILN_CUDA_TC_LEAN=0 $(bench_tok_s $m 64 128 32 KILN_CUDA_TC_LEAN=0)"
    m=llama-3-8b
    left 70 && echo "$m batch 64 (prefill decode tok/s): default $(bench_tok_s $m 64 128 32)" \
        "| bf16 on the tc GEMM $(bench_tok_s $m 64 128 32 KILN_CUDA_TC_DENSE_SMALL=100000000000)"
    op_profile llama-3-8b-q4 64 45
fi
if [ "$PART" = 2 ]; then
    # the lean loop with the fold's operands kept raw until the fold and the lo products in their
    # own sums (written after PART=1's profile): tests, the micro A/B, then end to end
    models_converted_in_background llama-3-8b:4 llama-3-8b:8
    build_kiln
    build_gpu_bench
    stamp "tests"
    TEST_TIMEOUT=130 run_tests "test_cuda_ops KILN_TEST_ONLY=test_tc_gemm,test_tc_fused" \
        test_parity_cuda test_parity_cuda_hybrid
    grep -E "^group " /tmp/test_cuda_ops*test_tc_gemm*.log
    cp /tmp/test_cuda_ops*test_tc_gemm*.log "${OUT:-/tmp}/test_tc.log" 2>/dev/null
    stamp "codes GEMM: lean loop vs old"
    lean_ab "q4g64 q8g64 bf16" "14336x4096 4096x14336 6144x4096" "8 64"
    lean_ab "q4g64" "14336x4096" "512"
    wait $MODELS
    for m in llama-3-8b-q4 llama-3-8b-q8; do
        for b in 64 16; do
            left 50 && echo "$m batch $b (prefill decode tok/s): default $(bench_tok_s $m $b 128 32)" \
                "| KILN_CUDA_TC_LEAN=0 $(bench_tok_s $m $b 128 32 KILN_CUDA_TC_LEAN=0)"
        done
    done
    m=llama-3-8b
    left 50 && echo "$m batch 64 (prefill decode tok/s): default $(bench_tok_s $m 64 128 32)" \
        "| bf16 on the tc GEMM $(bench_tok_s $m 64 128 32 KILN_CUDA_TC_DENSE_SMALL=100000000000)"
fi
if [ "$PART" = 3 ]; then
    # PART=2 cut to fit ~280 s: the first test_tc_gemm / test_tc_fused pass and test_parity_cuda,
    # the micro A/B on the 8B's largest matrix, then batch 64 of the 8B in 4-bit
    models_converted_in_background llama-3-8b:4
    build_kiln
    build_gpu_bench
    stamp "tests"
    TEST_TIMEOUT=75 run_tests "test_cuda_ops KILN_TEST_ONLY=test_tc_gemm,test_tc_fused" \
        "test_parity_cuda"
    grep -E "^group " /tmp/test_cuda_ops*test_tc_gemm*.log
    cp /tmp/test_cuda_ops*test_tc_gemm*.log "${OUT:-/tmp}/test_tc.log" 2>/dev/null
    stamp "codes GEMM: lean loop vs old"
    lean_ab "q4g64 q8g64 bf16" "14336x4096" "8 64"
    wait $MODELS
    m=llama-3-8b-q4
    left 35 && echo "$m batch 64 (prefill decode tok/s): default $(bench_tok_s $m 64 128 32)" \
        "| KILN_CUDA_TC_LEAN=0 $(bench_tok_s $m 64 128 32 KILN_CUDA_TC_LEAN=0)"
fi
stamp "end"
