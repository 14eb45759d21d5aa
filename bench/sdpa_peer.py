"""The flash-attention peer on an NVIDIA GPU: PyTorch's scaled_dot_product_attention on the
gpu-check shape (Llama-3.1-70B TP8 prefill: batch 1, 2048 tokens, 8 query heads sharing 1 KV
head, head_dim 128, causal, bf16), timed like kerntune's kernels: CUDA events around each call,
L2 flushed before it, the median of the repetitions.

PyTorch picks among several attention backends (FlashAttention-2, memory-efficient, cuDNN) by
device and version, so the default dispatch is timed and then each backend forced on its own:
the goal compares kerntune with the default, and the fastest backend is printed beside it so
no peer is flattered by the choice.

    python3 bench/sdpa_peer.py [--reps 20] [--device cuda] [--json FILE]

`--device cpu` runs the same steps on the host (wall-clock timing, small shape), to check the
script without a GPU.
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = [
    ("flash", SDPBackend.FLASH_ATTENTION),
    ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ("cudnn", SDPBackend.CUDNN_ATTENTION),
]


def timer(dev, l2_bytes):
    """Median microseconds of `reps` calls of `fn`, each after an L2 flush."""
    flush = torch.empty(max(2 * l2_bytes, 64 << 20), dtype=torch.uint8, device=dev)

    def median_us(fn, reps):
        fn()
        times = []
        for _ in range(reps):
            flush.zero_()
            if dev.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)

    return median_us


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", help="also write the medians here, for bench/gpu_goals.py")
    args = parser.parse_args()
    dev = torch.device(args.device)
    # The host check uses a shape small enough to run in a moment.
    b, s, hq, hkv, d = (1, 2048, 8, 1, 128) if dev.type == "cuda" else (1, 256, 8, 1, 128)
    g = torch.Generator(device=dev).manual_seed(7)
    q = torch.rand(b, hq, s, d, device=dev, dtype=torch.bfloat16, generator=g) * 2 - 1
    k = torch.rand(b, hkv, s, d, device=dev, dtype=torch.bfloat16, generator=g) * 2 - 1
    v = torch.rand(b, hkv, s, d, device=dev, dtype=torch.bfloat16, generator=g) * 2 - 1
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    else:
        name, l2 = "host CPU", 32 << 20
    median_us = timer(dev, l2)

    def call():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    flops = 4 * b * hq * s * s * d / 2  # causal: half the score matrix
    shape = f"flash:q_len={s},q_heads={hq},kv_heads={hkv},head_dim={d},causal,bf16"
    default = median_us(call, args.reps)
    print(
        f"PyTorch {torch.__version__} SDPA, {name}: {shape} "
        f"median {default:.1f} us ({flops / default / 1e6:.1f} TFLOP/s) over {args.reps} cold-L2 calls"
    )
    # Each backend forced: one the device or version lacks is said to be unavailable.
    reference = call().float()
    timed = {"default": default}
    for label, backend in BACKENDS:
        try:
            with sdpa_kernel(backend):
                out = call().float()
                us = median_us(call, args.reps)
        except RuntimeError as e:
            print(f"  {label:<9}  unavailable: {str(e).splitlines()[0][:120]}")
            continue
        err = ((out - reference).abs().max() / reference.abs().max()).item()
        timed[label] = us
        print(
            f"  {label:<9}  median {us:.1f} us ({flops / us / 1e6:.1f} TFLOP/s), "
            f"max difference from the default {err:.1e}"
        )
    best = min(timed, key=timed.get)
    print(f"  fastest: {best}, {timed[best]:.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": shape, "device": name, "torch": torch.__version__, "us": timed}, f)


if __name__ == "__main__":
    main()
