#!/usr/bin/env bash
# gpu_bench.sh — on the GPU machine, in one call: builds kiln (CUDA on, carried .deps), then runs
# the stages named in KILN_STAGES (default: all, in this order):
#   tests  test_cuda_ops (KILN_CUDA_QGEMV=0: default = dp4a for 4/8 bits; 1, 2: the older quant
#          GEMV kernels; test_qgemv_dp4a forces dp4a in every run), test_parity_cuda and
#          test_parity_cuda_hybrid (Qwen3-Next / Qwen3.5 / Qwen3-MoE fixtures) (KILN_PARITY_GEMMS:
#          cuBLAS x as a bf16 hi+lo pair "split" by default, "bf16" on request), and `kiln
#          generate --device cuda` on the demo model vs the CPU's ids
#   micro  bench/gpu/kiln_gpu_bench.c: copy bandwidth, matmul GEMV (every kernel variant, n=1/4,
#          with a `best` line per shape) and GEMM at Llama-3-8B layer shapes, big bf16 GEMM,
#          decode attention, gated delta rule; torch's copy/GEMM ceilings
#   e2e    random-weight models (bench/make_random_model.py; qwen3.5-*, gemma-4-* shapes by
#          bench/make_family_model.py), bf16, then `kiln convert --bits 8/4`
#          for each shape in KILN_SHAPES; `kiln bench --device cuda --json`: prefill 512, decode
#          batch 1/8/64 at context 128; decode bandwidth as a fraction of the copy bandwidth
#   graph  decode at batches KILN_GRAPH_BATCHES (default "1 8") with the decode-step CUDA graphs
#          off (KILN_CUDA_GRAPH=0) and on, for each shape in KILN_SHAPES (bf16; q4 too for
#          KILN_QUANT_SHAPES)
#   ctx    decode at context KILN_CTX (default 8192; cache filled by `kiln bench --context`, kv bf16)
#          for each shape, batches KILN_CTX_BATCHES (default "1 8")
#   profile KILN_CUDA_PROFILE=1 decode of each shape (bf16) at the batches in KILN_PROFILE_BATCHES
#   hf     transformers generate (bf16, sdpa, static cache) on the same shapes; generate's automatic
#          torch.compile of static-cache decoding is off (its compile time swamps a short run)
#          unless KILN_HF_COMPILE=1
#   nsys   (if nsys is installed) `nsys profile --stats=true` of a short batch-1 decode of the first
#          shape: CUDA API and kernel summaries into $OUT/nsys.txt
# KILN_FORMATS (default "bf16 q8 q4") picks the e2e formats of the quantized shapes; KILN_K2=0 skips
# the extra batch-1 run with quant GEMV kernel 2; KILN_COPY_GBS sets the copy bandwidth the e2e
# table divides by when the micro stage did not run (default 4268, H200 measured).
# Each stage is skipped once the script has run KILN_DEADLINE_S seconds (default 500).
# Usage (device): bash bench/gpu_bench.sh [build-dir]   Logs go to $OUT when set.
# Data: .gpu-data/shared/fixtures (copied here from /work/shared, carried); the smoke test uses
# .gpu-data/shared/models/demo-bf16 when it was copied too, else the bundled models/demo-q8.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-/tmp/b}
O=${OUT:-/tmp/kiln_gpu_out}
STAGES=${KILN_STAGES:-tests micro e2e hf}
SHAPES=${KILN_SHAPES:-qwen3-0.6b llama-3.2-1b}
QUANT_SHAPES=${KILN_QUANT_SHAPES-qwen3-0.6b llama-3.2-1b}
HF_BATCHES=${KILN_HF_BATCHES:-1 8 64}
DEADLINE=${KILN_DEADLINE_S:-500}
M=${KILN_MODELS:-/dev/shm/kiln_models}
mkdir -p "$O" "$M"
DEPS=$PWD/.deps/root
export PKG_CONFIG_PATH=$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
export KILN_SHARED=$PWD/.gpu-data/shared
# random-weight model of shape $1 in $M/$1: Qwen3.5 / Gemma 4 shapes by make_family_model.py (its
# config starts from the carried fixture), Qwen3 / Llama ones by make_random_model.py
make_model() {
    [ -f "$M/$1/model.safetensors" ] && return 0
    case $1 in
    qwen3.5-* | gemma-4-*) KILN_FIXTURES=$KILN_SHARED/fixtures python3 bench/make_family_model.py --shape "$1" --out "$M/$1" ;;
    *) python3 bench/make_random_model.py --shape "$1" --out "$M/$1" ;;
    esac
}
has() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }
late() { [ "$SECONDS" -ge "$DEADLINE" ] && { echo "!! deadline: skipping $1 (t=${SECONDS}s)"; return 0; }; return 1; }
stamp() { echo "== [t=${SECONDS}s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee "$O/gpu.txt"
if [ ! -f "$B/libkiln.so" ] || [ "${KILN_REBUILD:-1}" = 1 ]; then
    stamp build
    cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_SERVER=OFF -DKILN_CUDA=ON \
        -DKILN_DEPS_PREFIX="$DEPS" >"$O/configure.log" 2>&1 || { tail -30 "$O/configure.log"; exit 1; }
    cmake --build "$B" -j16 --target kiln_shared kiln_cli test_cuda_ops test_parity_cuda test_parity_cuda_hybrid test_parity_cuda_gemma test_kv_cuda test_parity_cuda_kv >"$O/build.log" 2>&1 ||
        { grep -E "error" "$O/build.log" | head -30; tail -20 "$O/build.log"; exit 1; }
fi
K=$B/kiln

if has tests; then
    for v in ${KILN_QGEMV_VARIANTS:-0 1 2}; do
        stamp "test_cuda_ops KILN_CUDA_QGEMV=$v"
        KILN_CUDA_QGEMV=$v "$B/test_cuda_ops" >"$O/test_cuda_ops_v$v.log" 2>&1
        echo "test_cuda_ops (qgemv $v) rc=$?"
        grep -E "CHECK failed|checks" "$O/test_cuda_ops_v$v.log" | head -20
    done
    for g in ${KILN_PARITY_GEMMS:-split}; do
        for t in test_parity_cuda test_parity_cuda_hybrid test_parity_cuda_gemma test_kv_cuda test_parity_cuda_kv; do
            stamp "$t KILN_CUDA_GEMM=$g"
            KILN_CUDA_GEMM=$g "$B/$t" >"$O/${t}_$g.log" 2>&1
            echo "$t ($g) rc=$?"
            cat "$O/${t}_$g.log" | head -80
        done
    done
    D=$KILN_SHARED/models/demo-bf16
    [ -d "$D" ] || D=models/demo-q8
    stamp "smoke: kiln generate --device cuda ($D)"
    for dev in cpu cuda; do
        "$K" generate --device $dev --model "$D" --prompt "The quick brown fox" -n 48 --temperature 0 \
            --print-ids >"$O/smoke_$dev.txt" 2>"$O/smoke_$dev.err"
        echo "generate $dev rc=$?"
    done
    cat "$O/smoke_cuda.txt"
    if diff <(tail -1 "$O/smoke_cpu.txt") <(tail -1 "$O/smoke_cuda.txt") >/dev/null; then
        echo "smoke: cuda ids == cpu ids"
    else
        echo "smoke: ids differ"; tail -1 "$O/smoke_cpu.txt"
    fi
fi

if has micro && ! late micro; then
    stamp kiln_gpu_bench
    gcc -O2 -std=c17 -D_GNU_SOURCE -DKILN_HAVE_CUDA=1 -Iinclude -Isrc -I/usr/local/cuda/include \
        bench/gpu/kiln_gpu_bench.c -o "$B/kiln_gpu_bench" -L"$B" -lkiln -Wl,-rpath,"$B" \
        -L/usr/local/cuda/lib64 -lcudart -lm || exit 1
    "$B/kiln_gpu_bench" 2>&1 | tee "$O/bench.txt"
    stamp "torch ceilings"
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
fi
COPY=$(grep -oE "copy  D2D 2 GiB: [0-9.]+ ms  [0-9]+" "$O/bench.txt" 2>/dev/null | awk '{print $NF}')
COPY=${COPY:-${KILN_COPY_GBS:-4268}}

if has e2e; then
    for s in $SHAPES; do
        late "e2e $s" && break
        stamp "model $s"
        make_model "$s" || continue
        fmts="bf16"
        case " $QUANT_SHAPES " in *" $s "*) fmts=${KILN_FORMATS:-bf16 q8 q4} ;; esac
        for f in $fmts; do
            late "e2e $s $f" && break
            d=$M/$s
            if [ "$f" != bf16 ]; then
                d=$M/$s-$f
                bits=${f#q}; grp=64; [ "$bits" = 4 ] && grp=32
                [ -f "$d/config.json" ] || "$K" convert --model "$M/$s" --out "$d" --bits "$bits" --group "$grp" --quiet \
                    >"$O/convert.log" 2>&1 || { tail -3 "$O/convert.log"; continue; }
            fi
            stamp "kiln bench $s $f"
            "$K" bench --device cuda --model "$d" --prompt 512 --gen 1 --runs 3 --json --quiet 2>>"$O/e2e.err" |
                sed "s/^/{\"shape\":\"$s\",\"fmt\":\"$f\",\"what\":\"prefill512\"} /" | tee -a "$O/e2e.jsonl"
            if [ "$f" != bf16 ] && [ "${KILN_K2:-1}" = 1 ]; then
                KILN_CUDA_QGEMV=2 "$K" bench --device cuda --model "$d" --prompt 128 --gen 32 --batch 1 --runs 3 --json --quiet 2>>"$O/e2e.err" |
                    sed "s/^/{\"shape\":\"$s\",\"fmt\":\"$f\",\"what\":\"decode_b1_k2\"} /" | tee -a "$O/e2e.jsonl"
            fi
            for b in 1 8 64; do
                "$K" bench --device cuda --model "$d" --prompt 128 --gen 32 --batch $b --runs 3 --json --quiet 2>>"$O/e2e.err" |
                    sed "s/^/{\"shape\":\"$s\",\"fmt\":\"$f\",\"what\":\"decode_b$b\"} /" | tee -a "$O/e2e.jsonl"
            done
        done
    done
    tail -5 "$O/e2e.err" 2>/dev/null
    python3 - "$O/e2e.jsonl" "$COPY" <<'PY'
import json, sys
copy = float(sys.argv[2])
print(f"{'shape':14} {'fmt':5} {'what':11} {'tok/s':>10} {'weights GB/s':>12} {'of copy':>8}")
for line in open(sys.argv[1]):
    tag, _, rest = line.partition("} ")
    t = json.loads(tag + "}"); r = json.loads(rest)
    if t["what"] == "prefill512":
        print(f"{t['shape']:14} {t['fmt']:5} {'prefill512':11} {r['prefill_tok_s']:10.0f}")
    else:
        g = r["decode_weight_gb_s"]
        print(f"{t['shape']:14} {t['fmt']:5} {t['what']:11} {r['decode_tok_s']:10.1f} {g:12.0f} {100*g/copy:7.0f}%")
PY
fi

if has graph; then
    for s in $SHAPES; do
        late "graph $s" && break
        make_model "$s" >/dev/null || continue
        fmts="bf16"
        case " $QUANT_SHAPES " in *" $s "*) fmts="bf16 q4" ;; esac
        for f in $fmts; do
            d=$M/$s
            if [ "$f" = q4 ]; then
                d=$M/$s-q4
                [ -f "$d/config.json" ] || "$K" convert --model "$M/$s" --out "$d" --bits 4 --group 32 --quiet >/dev/null 2>&1 || continue
            fi
            for b in ${KILN_GRAPH_BATCHES:-1 8}; do
                for g in 0 1; do
                    KILN_CUDA_GRAPH=$g "$K" bench --device cuda --model "$d" --prompt 128 --gen 32 --batch $b --runs 3 --json --quiet 2>>"$O/graph.err" |
                        python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print(f'graph=$g $s $f b$b: {r[\"decode_tok_s\"]:.1f} tok/s, {r[\"decode_weight_gb_s\"]:.0f} GB/s ({100*r[\"decode_weight_gb_s\"]/$COPY:.0f}% of copy)')" |
                        tee -a "$O/graph.txt"
                done
            done
        done
    done
    tail -3 "$O/graph.err" 2>/dev/null
fi

if has ctx; then
    # decode at a long context: the cache is filled with synthetic K/V (kiln bench --context)
    for s in $SHAPES; do
        late "ctx $s" && break
        make_model "$s" >/dev/null || continue
        for b in ${KILN_CTX_BATCHES:-1 8}; do
            "$K" bench --device cuda --model "$M/$s" --kv bf16 --context "${KILN_CTX:-8192}" --prompt 16 --gen 32 --batch $b --runs 3 --json --quiet 2>>"$O/ctx.err" |
                python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print(f'ctx=${KILN_CTX:-8192} kv=bf16 $s bf16 b$b: {r[\"decode_tok_s\"]:.1f} tok/s, weights {r[\"decode_weight_gb_s\"]:.0f} GB/s')" |
                tee -a "$O/ctx.txt"
        done
    done
    tail -3 "$O/ctx.err" 2>/dev/null
fi

if has profile; then
    # KILN_CUDA_PROFILE=1: every op timed by events (graphs off); totals per op and shape
    for s in $SHAPES; do
        make_model "$s" >/dev/null || continue
        for b in ${KILN_PROFILE_BATCHES:-1}; do
            stamp "profile $s bf16 b$b"
            KILN_CUDA_PROFILE=1 "$K" bench --device cuda --model "$M/$s" --prompt 128 --gen 16 --batch $b --runs 1 --json --quiet 2>&1 |
                grep -E "cuda profile|decode_tok_s" | cut -c1-150 | head -24 | tee -a "$O/profile.txt"
        done
    done
fi

if has hf && ! late hf; then
    stamp "transformers generate"
    for s in $SHAPES; do  # only config.json is read: transformers makes its own random weights
        [ -f "$M/$s/config.json" ] || make_model "$s" >/dev/null
    done
    PYTHONUNBUFFERED=1 KILN_HF_BATCHES="$HF_BATCHES" timeout "${KILN_HF_TIMEOUT:-240}" python3 - "$M" $SHAPES <<'PY' 2>&1 | grep --line-buffered -v Warning | tee "$O/hf.txt"
import json, os, sys, time, torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM
print("transformers", transformers.__version__, "torch", torch.__version__)
root = sys.argv[1]
for shape in sys.argv[2:]:
    cfg = AutoConfig.from_pretrained(f"{root}/{shape}")
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    V = cfg.vocab_size
    def run(batch, prompt, new):
        ids = torch.randint(0, V, (batch, prompt), device="cuda")
        torch.cuda.synchronize(); t = time.time()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, cache_implementation="static", pad_token_id=0,
                       disable_compile=os.environ.get("KILN_HF_COMPILE", "0") != "1")
        torch.cuda.synchronize(); return time.time() - t
    with torch.inference_mode():
        run(1, 16, 2)
        pre = min(run(1, 512, 1) for _ in range(2))
        print(f"hf {shape} bf16 prefill512: {512 / pre:.0f} tok/s ({pre * 1e3:.1f} ms incl. 1 token)")
        for b in [int(v) for v in os.environ["KILN_HF_BATCHES"].split()]:
            t1 = run(b, 128, 1); t33 = run(b, 128, 33)
            print(f"hf {shape} bf16 decode_b{b}: {32 * b / (t33 - t1):.1f} tok/s (context 128)")
    del model; torch.cuda.empty_cache()
PY
fi
if has nsys && ! late nsys && command -v nsys >/dev/null; then
    stamp "nsys: batch-1 decode"
    s=${SHAPES%% *}
    nsys profile -o "$O/decode_b1" --force-overwrite true --stats=true "$K" bench --device cuda \
        --model "$M/$s" --prompt 128 --gen 16 --batch 1 --runs 1 --json --quiet >"$O/nsys.txt" 2>&1
    grep -A18 -E "cuda_api_sum|cuda_gpu_kern_sum" "$O/nsys.txt" | cut -c1-170 | head -40
    rm -f "$O"/decode_b1.nsys-rep "$O"/decode_b1.sqlite
elif has nsys; then
    echo "nsys: not installed or past the deadline"
fi
stamp done
