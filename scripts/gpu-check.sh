#!/usr/bin/env bash
# kerntune's GPU check on a machine with an NVIDIA GPU, in under 5 minutes: the GPU kernels
# compiled by NVRTC for the device and verified there against the CPU reference (every
# family, awkward sizes), a few Llama-3.1-70B TP8 problems per family tuned, and tuned vs
# default vs cuBLAS / PyTorch SDPA printed as ratios.
#
#   scripts/gpu-check.sh            build (when cargo is here) and run
#   scripts/gpu-check.sh --build    only build .gpu/gpu-check, for a GPU machine without Rust
#
# The binary loads the CUDA driver, cuBLAS and NVRTC 13 at run time: nothing of CUDA is
# needed to build it, and a machine without Rust runs a .gpu/gpu-check built elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.gpu}"
mkdir -p .gpu "$out"

if command -v cargo >/dev/null; then
    cargo build --release -p kerntune-tuner --features cuda --bin gpu-check
    cp target/release/gpu-check .gpu/gpu-check
fi
[ "${1:-}" = "--build" ] && exit 0
[ -x .gpu/gpu-check ] || { echo "no .gpu/gpu-check: run scripts/gpu-check.sh --build where cargo is" >&2; exit 2; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
# cuBLAS and NVRTC 13 from the CUDA toolkit or NVIDIA's wheels next to PyTorch.
site=$(python3 -c 'import sys; print(":".join(p + "/nvidia/cu13/lib" for p in sys.path if p))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64:${site}"

status=0
timeout 270 .gpu/gpu-check --json "$out/gpu-check.json" 2>&1 | tee "$out/gpu-check.txt" || status=$?
PYTHONUNBUFFERED=1 timeout 60 python3 bench/sdpa_peer.py 2>&1 | tee -a "$out/gpu-check.txt" || status=$?
exit "$status"
