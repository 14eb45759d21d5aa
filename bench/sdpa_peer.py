"""The flash-attention peer on an NVIDIA GPU: PyTorch's scaled_dot_product_attention on the
gpu-check shape (Llama-3.1-70B TP8 prefill: batch 1, 2048 tokens, 8 query heads sharing 1 KV
head, head_dim 128, causal, bf16), timed like kerntune's kernels: CUDA events around each call,
L2 flushed before it, the median of the repetitions.

    python3 bench/sdpa_peer.py [--reps 20]
"""

import argparse
import statistics

import torch
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    dev = torch.device("cuda")
    b, s, hq, hkv, d = 1, 2048, 8, 1, 128
    g = torch.Generator(device=dev).manual_seed(7)
    q = torch.rand(b, hq, s, d, device=dev, dtype=torch.bfloat16, generator=g) * 2 - 1
    k = torch.rand(b, hkv, s, d, device=dev, dtype=torch.bfloat16, generator=g) * 2 - 1
    v = torch.rand(b, hkv, s, d, device=dev, dtype=torch.bfloat16, generator=g) * 2 - 1
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    flush = torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device=dev)

    def call():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    call()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.reps):
        flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    median = statistics.median(times)
    flops = 4 * b * hq * s * s * d / 2  # causal: half the score matrix
    print(
        f"PyTorch {torch.__version__} SDPA, {torch.cuda.get_device_name(dev)}: "
        f"flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=128,causal,bf16 "
        f"median {median:.1f} us ({flops / median / 1e6:.1f} TFLOP/s) over {args.reps} cold-L2 calls"
    )


if __name__ == "__main__":
    main()
