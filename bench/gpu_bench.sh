#!/usr/bin/env bash
# gpu_bench.sh — on the GPU machine, in one call: builds kiln (CUDA on, carried .deps), runs the
# CUDA op tests, then bench/gpu/kiln_gpu_bench.c (copy bandwidth, matmul GEMV/GEMM at Llama-3-8B
# layer shapes, big bf16 GEMM, decode attention) and torch's copy/GEMM ceilings for comparison.
# Usage (device): bash bench/gpu_bench.sh [build-dir]   Logs go to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-/tmp/b}
O=${OUT:-/tmp/kiln_gpu_out}
mkdir -p "$O"
DEPS=$PWD/.deps/root
export PKG_CONFIG_PATH=$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$O/gpu.txt"
if [ ! -f "$B/libkiln.so" ] || [ "${KILN_REBUILD:-1}" = 1 ]; then
    cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_SERVER=OFF -DKILN_CUDA=ON \
        -DKILN_DEPS_PREFIX="$DEPS" >"$O/configure.log" 2>&1 || { tail -30 "$O/configure.log"; exit 1; }
    cmake --build "$B" -j16 --target kiln_shared test_cuda_ops >"$O/build.log" 2>&1 ||
        { grep -E "error" "$O/build.log" | head -30; tail -20 "$O/build.log"; exit 1; }
fi
echo "== test_cuda_ops"
KILN_TEST_VERBOSE=${KILN_TEST_VERBOSE:-0} "$B/test_cuda_ops" >"$O/test_cuda_ops.log" 2>&1
echo "test_cuda_ops rc=$?"
grep -E "CHECK failed|checks" "$O/test_cuda_ops.log" | head -40
[ "${KILN_TESTS_ONLY:-0}" = 1 ] && exit 0
echo "== kiln_gpu_bench"
gcc -O2 -std=c17 -D_GNU_SOURCE -DKILN_HAVE_CUDA=1 -Iinclude -Isrc -I/usr/local/cuda/include \
    bench/gpu/kiln_gpu_bench.c -o "$B/kiln_gpu_bench" -L"$B" -lkiln -Wl,-rpath,"$B" \
    -L/usr/local/cuda/lib64 -lcudart -lm || exit 1
"$B/kiln_gpu_bench" 2>&1 | tee "$O/bench.txt"
echo "== torch ceilings"
python3 - <<'PY' 2>&1 | tee "$O/torch.txt"
import torch
a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(10):
    e0.record(); b.copy_(a); e1.record(); torch.cuda.synchronize(); ts.append(e0.elapsed_time(e1))
ts.sort(); print(f"torch copy 1 GiB: {2 * a.numel() / (ts[5] * 1e-3) / 1e9:.0f} GB/s (read+write)")
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); w = torch.randn_like(x)
for _ in range(3): x @ w
ts = []
for _ in range(10):
    e0.record(); x @ w; e1.record(); torch.cuda.synchronize(); ts.append(e0.elapsed_time(e1))
ts.sort(); print(f"torch bf16 8192^3: {2 * 8192**3 / (ts[5] * 1e-3) / 1e12:.0f} TFLOP/s")
PY
