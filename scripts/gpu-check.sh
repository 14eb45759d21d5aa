#!/usr/bin/env bash
# kerntune's GPU check on a machine with an NVIDIA GPU, in under 5 minutes: the GPU kernels
# compiled by NVRTC for the device and verified there against the CPU reference (every
# family, awkward sizes), a few Llama-3.1-70B TP8 problems per family and DeepSeek-V3's
# TP8 latent decode tuned, tuned vs default vs cuBLAS / PyTorch SDPA printed as ratios and
# judged against the goals (bench/gpu_goals.py); then `tune --device h200` itself on one problem per family, its
# results stored in a database and shown, and the runtime library serving them on the device.
#
#   scripts/gpu-check.sh            build (when cargo is here) and run
#   scripts/gpu-check.sh --build    only build .gpu/ (gpu-check, tune, cuda-dispatch, the C
#                                   ABI's cuda-gemm and libkerntune.so, the CPU GEMM tests),
#                                   for a GPU machine without Rust
#
# The binary loads the CUDA driver, cuBLAS and NVRTC 13 at run time: nothing of CUDA is
# needed to build it, and a machine without Rust runs a .gpu/gpu-check built elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.gpu}"
mkdir -p .gpu "$out"

if command -v cargo >/dev/null; then
    cargo build --release -p kerntune-tuner --features cuda --bin gpu-check --bin tune
    cargo build --release -p kerntune-runtime --features cuda --lib --example cuda_dispatch
    cp target/release/gpu-check target/release/tune .gpu/
    cp target/release/examples/cuda_dispatch .gpu/cuda-dispatch
    # The C ABI as a C server links it: the CUDA build of the shared library beside the
    # program, which finds it by its run path.
    cp target/release/libkerntune.so .gpu/
    "${CC:-cc}" runtime-lib/examples/cuda_gemm.c -I runtime-lib/include -L .gpu -lkerntune -ldl \
        -Wl,-rpath,'$ORIGIN' -Wall -Wextra -Werror -o .gpu/cuda-gemm
    # The CPU GEMM tests too: on an Intel host with AMX they run the AMX kernel on its tiles.
    tests=$(cargo test --release -p kerntune-kernels --test gemm --no-run --message-format=json \
        | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gemm":
        print(m["executable"])' | tail -1)
    cp "$tests" .gpu/gemm-tests
    # Smaller to carry to the GPU machine.
    strip .gpu/gpu-check .gpu/tune .gpu/cuda-dispatch .gpu/gemm-tests .gpu/cuda-gemm \
        .gpu/libkerntune.so 2>/dev/null || true
fi
[ "${1:-}" = "--build" ] && exit 0
[ -x .gpu/gpu-check ] || { echo "no .gpu/gpu-check: run scripts/gpu-check.sh --build where cargo is" >&2; exit 2; }

# The check stays under 5 minutes whatever its steps do: each step's own limit is cut to what
# is left of 285 s from here, and a step with under 5 s left is skipped, saying so (and
# counted as timed out). The steps come in the order of what the goals need first.
SECONDS=0
step() {
    local limit=$1 left=$((285 - SECONDS))
    shift
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        echo "skipped, the check's 5 minutes are spent: $*"
        return 124
    fi
    timeout "$limit" "$@"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
# The host CPU too: kerntune's CPU kernels have met two-core Zen 4 and Xeon (AMX) guests so far;
# a larger host checks them at its own thread count.
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) threads," \
    "AMX: $(grep -o -m1 'amx_bf16' /proc/cpuinfo || echo none)" | tee "$out/host.txt"
# cuBLAS and NVRTC 13 from the CUDA toolkit or NVIDIA's wheels next to PyTorch.
site=$(python3 -c 'import sys; print(":".join(p + "/nvidia/cu13/lib" for p in sys.path if p))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64:${site}"

status=0
: > "$out/gpu-check.txt"
# The flash goal's peer first: PyTorch SDPA on the flash shape.
PYTHONUNBUFFERED=1 step 45 python3 bench/sdpa_peer.py --json "$out/sdpa.json" 2>&1 \
    | tee -a "$out/gpu-check.txt" || status=$?
# One process a family: a kernel that leaves the CUDA context unusable costs only its family.
# The wgmma kernels (the GEMM's variant, the flash tiles by warpgroup MMA), new to devices,
# have processes of their own too, and the GEMM's clusters one more. Last, Llama's largest
# prefill GEMM as an FP8 checkpoint runs it, on the bytes themselves (wgmma m64nNk32 and
# mma m16n8k32): gpu_goals.py sets it beside its bf16 row and cuBLASLt's fp8 GEMM.
for run in "gemm:90:--skip-variant wgmma" "flash:80:--skip-variant wgmma" \
    "gemm-wgmma:60:--only-variant wgmma --skip-variant cluster" "flash-wgmma:60:--only-variant wgmma" \
    "gemm-cluster:45:--only-variant cluster" paged:40: \
    "gemm-fp8:40:--only-variant wgmma --only-variant mma --problem gemm:m=2048,n=7168,k=8192,dtype=fp8_e4m3"; do
    IFS=: read -r name limit extra <<< "$run"
    # shellcheck disable=SC2086 # $extra is a list of arguments
    step "$limit" .gpu/gpu-check --family "${name%-*}" $extra --json "$out/gpu-check-$name.json" \
        2>&1 | tee -a "$out/gpu-check.txt" || status=$?
done
# The goals, each a speed ratio from this run: tuned vs cuBLAS, SDPA and the default. Goals
# are benchmarks: a missed one is printed, and the check's status stays the verification's.
python3 bench/gpu_goals.py "$out" 2>&1 | tee -a "$out/gpu-check.txt" || true

# The tuner's own device path: plan, compile, verify, time and store, as users run it.
if [ -x .gpu/tune ]; then
    model=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z' 'a-z' | grep -o 'b200\|h200\|h100\|a100' || echo h200)
    step 60 .gpu/tune --device "$model" --db "$out/tuned.db" --strategy exhaustive \
        --max-configs 8 --budget 5s --total-budget 40s \
        --shapes gemm:m=16,n=1280,k=8192,dtype=bf16 \
        --shapes gemm:m=16,n=1280,k=8192,dtype=fp8_e4m3 \
        --shapes gemm:m=16,n=1280,k=8192,dtype=fp8_e4m3,block=128 \
        --shapes flash:q_len=512,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16 \
        --shapes paged:num_seqs=8,context_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16 \
        2>&1 | tee -a "$out/gpu-check.txt" || status=$?
    .gpu/tune --device "$model" --db "$out/tuned.db" show 2>&1 | tee -a "$out/gpu-check.txt" || status=$?
fi

# The runtime library serving those winners, as a server links it: inputs in the caller's
# device memory, the kernel launched on the caller's stream, the output checked against the
# CPU reference. The tuned shapes match exactly; the others take the nearest tuned kernel.
if [ -x .gpu/cuda-dispatch ] && [ -f "$out/tuned.db" ]; then
    step 30 .gpu/cuda-dispatch "$out/tuned.db" "$model" \
        gemm:m=16,n=1280,k=8192,dtype=bf16 gemm:m=5,n=1280,k=8192,dtype=bf16 \
        gemm:m=100,n=1280,k=8192,dtype=bf16 \
        flash:q_len=512,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16 \
        flash:q_len=300,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16 \
        paged:num_seqs=8,context_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16 \
        paged:num_seqs=3,context_len=3000,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16 \
        2>&1 | tee -a "$out/gpu-check.txt" || status=$?
fi
# The same through the C ABI (kt_gpu_open, kt_gpu_gemm on the program's own memory and
# stream), from C: exact, bucket and nearest GEMMs, and the fp8 ones through
# kt_gpu_gemm_scaled and kt_gpu_gemm_block_scaled, each checked for equality.
if [ -x .gpu/cuda-gemm ] && [ -f "$out/tuned.db" ]; then
    step 30 .gpu/cuda-gemm "$out/tuned.db" "$model" 2>&1 | tee -a "$out/gpu-check.txt" \
        || status=$?
fi

# Where the time goes in the goals' hardest problems, kerntune's fastest config of each:
# Nsight Compute's speed of light (SM, L2 and DRAM throughput) and occupancy, where ncu is
# installed and the check has time left for it. The largest prefill GEMM (bf16, the goal's) beside cuBLAS's own
# kernel (whose name gives its tile and cluster shape); flash attention at 2048 queries (its
# kernels and, split, the combining one).
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
# profile NAME MATCH KERNELS: the fastest row whose problem contains MATCH, under ncu.
profile() {
    local name=$1 match=$2 kernels=$3 picked problem best
    picked=$(python3 - "$out" "$match" <<'PY'
import glob, json, os, sys
rows = [r for f in glob.glob(os.path.join(sys.argv[1], "gpu-check-*.json")) for r in json.load(open(f))]
rows = [r for r in rows if sys.argv[2] in r["problem"] and r.get("best_config")]
if rows:
    r = min(rows, key=lambda r: r["best_ns"])
    print(r["problem"])
    print(json.dumps(r["best_config"]))
PY
)
    [ -n "$picked" ] || return 0
    problem=$(sed -n 1p <<< "$picked")
    best=$(sed -n 2p <<< "$picked")
    step 60 "$ncu" --clock-control none --section SpeedOfLight --section Occupancy -c 4 \
        -k "regex:$kernels" \
        .gpu/gpu-check --problem "$problem" --config "$best" --reps 1 > "$out/ncu-$name.txt" 2>&1 \
        || echo "ncu: exit $? (its output in ncu-$name.txt)"
    grep -E '^  [A-Za-z_].*\(|Duration|Throughput|SM Busy|Achieved Occupancy' "$out/ncu-$name.txt" \
        | tee -a "$out/gpu-check.txt" || true
}
if [ -n "$ncu" ] && [ "$SECONDS" -lt 200 ]; then
    profile prefill "gemm:m=2048,n=7168,k=8192,dtype=bf16," 'kt_gemm|gemm|nvjet|xmma|cutlass'
fi
if [ -n "$ncu" ] && [ "$SECONDS" -lt 220 ]; then
    profile flash "q_len=2048," 'kt_flash'
fi

# The same from PyTorch, as a vLLM-style server calls it (ctypes; tensors' data_ptr(), the
# current stream), a shape never tuned falling back to PyTorch, and a CUDA graph that captured
# the tuned kernel replayed after a reload of the database.
# After the profiles, which the goals need more.
if [ -f "$out/tuned.db" ] && [ -f .gpu/libkerntune.so ] && [ "$SECONDS" -lt 255 ] \
    && python3 -c 'import torch' 2>/dev/null; then
    step 60 python3 runtime-lib/examples/torch_gpu.py .gpu/libkerntune.so "$out/tuned.db" "$model" \
        2>&1 | tee -a "$out/gpu-check.txt" || status=$?
fi

# AMX, where the host has it: every CPU GEMM kernel verified on this host (the AMX ones on
# the tiles), then Llama-70B TP8 gate_up timed with the heuristic (amx-direct on AMX hosts),
# the packed AMX kernel and PyTorch (oneDNN, which uses AMX), all on every thread.
# Extras: only with the time they need left.
if grep -q amx_bf16 /proc/cpuinfo && [ -x .gpu/gemm-tests ] && [ -x .gpu/tune ] \
    && [ "$SECONDS" -lt 150 ]; then
    t=$(nproc)
    amx="{\"family\":\"gemm\",\"variant\":\"amx\",\"isa\":\"avx512-amx\",\"mr\":32,\"nr\":32,\"mc\":128,\"kc\":1024,\"nc\":256,\"split\":\"n\",\"threads\":$t}"
    step 60 .gpu/gemm-tests --nocapture 2>&1 | tee "$out/amx.txt" || status=$?
    for m in 128 2048; do
        for config in heuristic "$amx"; do
            step 30 .gpu/tune bench --device cpu --config "$config" \
                --shapes "gemm:m=$m,n=7168,k=8192,dtype=bf16,b=nk" 2>&1 | tee -a "$out/amx.txt" || status=$?
        done
    done
    step 60 python3 bench/peers.py --threads "$t" --only gemm-bf16 --tokens 128,2048 2>&1 \
        | tee -a "$out/amx.txt" || status=$?
fi
exit "$status"
