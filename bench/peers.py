#!/usr/bin/env python3
"""Times kerntune's benchmark shapes with the peers users compare against, on this machine.

numpy (OpenBLAS) for f32 GEMM, PyTorch's CPU build for bf16 GEMM and scaled_dot_product_attention,
and a plain PyTorch matmul-softmax-matmul over gathered K/V for paged decode. Medians of repeated
runs, per thread count. Run beside `cargo bench -p kerntune-kernels` on the same machine:

    python3 bench/peers.py [--threads 1,2] [--only gemm|gemm-bf16|flash|paged] [--tokens 128,2048]
"""
import argparse
import statistics
import time

import numpy as np

LLAMA70B_TP8 = [("qkv", 1280, 8192), ("o", 8192, 1024), ("gate_up", 7168, 8192), ("down", 8192, 3584)]
TOKENS = [1, 16, 128, 2048]


def median_time(fn, reps=7, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def report(name, threads, seconds, flops=None, nbytes=None):
    parts = [f"{name:<34} t={threads} median {seconds * 1e3:9.3f} ms"]
    if flops:
        parts.append(f"{flops / seconds / 1e9:8.1f} GFLOP/s")
    if nbytes:
        parts.append(f"{nbytes / seconds / 1e9:6.1f} GB/s")
    print("  ".join(parts), flush=True)


def bandwidth(threads):
    """Memory read bandwidth: summing a 1 GiB array (numpy's sum is a vectorised streaming
    read) on `threads` threads, each summing its own half."""
    import threading

    data = np.ones(1 << 28, dtype=np.float32)
    parts = np.array_split(data, threads)

    def run():
        workers = [threading.Thread(target=np.sum, args=(p,)) for p in parts]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    report("memory read bandwidth (numpy sum 1 GiB)", threads, median_time(run, reps=5), nbytes=data.nbytes)


def gemm(threads, tokens=TOKENS):
    gemm_f32(threads, tokens)
    gemm_bf16(threads, tokens)


def gemm_f32(threads, tokens=TOKENS):
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    with threadpool_limits(threads):
        a = rng.random((2048, 2048), dtype=np.float32)
        b = rng.random((2048, 2048), dtype=np.float32)
        report("numpy gemm_f32_2048", threads, median_time(lambda: a @ b), 2 * 2048**3)
        for name, n, k in LLAMA70B_TP8:
            w = rng.random((n, k), dtype=np.float32)
            for m in tokens:
                x = rng.random((m, k), dtype=np.float32)
                t = median_time(lambda: x @ w.T, reps=5 if m >= 2048 else 11)
                report(f"numpy llama70b_tp8_{name}_m{m}_f32", threads, t, 2 * m * n * k,
                       (m * k + n * k) * 4 + m * n * 4)


def gemm_bf16(threads, tokens=TOKENS):
    """PyTorch's CPU bf16 Linear (oneDNN, on AMX tiles where the CPU has them)."""
    import torch

    torch.set_num_threads(threads)
    for name, n, k in LLAMA70B_TP8:
        w = torch.rand(n, k).to(torch.bfloat16)
        for m in tokens:
            x = torch.rand(m, k).to(torch.bfloat16)
            t = median_time(lambda: torch.nn.functional.linear(x, w), reps=5 if m >= 2048 else 11)
            report(f"torch llama70b_tp8_{name}_m{m}_bf16", threads, t, 2 * m * n * k,
                   (m * k + n * k) * 2 + m * n * 2)


def flash(threads):
    import torch

    torch.set_num_threads(threads)
    seq, d = 2048, 128
    for hq, hkv in [(8, 1), (64, 8)]:
        for dtype in [torch.float32, torch.bfloat16]:
            q = torch.rand(1, hq, seq, d, dtype=dtype)
            k = torch.rand(1, hkv, seq, d, dtype=dtype)
            v = torch.rand(1, hkv, seq, d, dtype=dtype)
            fn = lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True)
            flops = 4 * hq * d * seq * (seq + 1) / 2
            name = f"torch sdpa causal {seq} {hq}q/{hkv}kv {str(dtype)[6:]}"
            report(name, threads, median_time(fn, reps=5), flops)


def paged(threads):
    """Decode the way a plain PyTorch server does it: gather each sequence's K/V blocks
    through the block table, then matmul, softmax, matmul per sequence."""
    import torch

    torch.set_num_threads(threads)
    # Llama-3.1-70B on one TP8 shard (f32 and bf16), and Llama-3.1-8B on one device (bf16),
    # whose cache rows hold 8 KV heads side by side.
    for name, seqs, ctx, hq, hkv, d, bs, dtypes in [
            ("", 32, 4096, 8, 1, 128, 16, [torch.float32, torch.bfloat16]),
            (" llama8b", 8, 4096, 32, 8, 128, 16, [torch.bfloat16])]:
        paged_shape(name, seqs, ctx, hq, hkv, d, bs, dtypes, threads)


def paged_shape(name, seqs, ctx, hq, hkv, d, bs, dtypes, threads):
    import torch

    blocks = seqs * ctx // bs
    for dtype in dtypes:
        kc = torch.rand(blocks, bs, hkv, d, dtype=dtype)
        vc = torch.rand(blocks, bs, hkv, d, dtype=dtype)
        table = torch.randperm(blocks).reshape(seqs, ctx // bs)
        q = torch.rand(seqs, hq, d, dtype=dtype)
        scale = d ** -0.5

        def run():
            out = []
            for s in range(seqs):
                k = kc[table[s]].reshape(ctx, hkv, d).transpose(0, 1)  # [hkv, ctx, d]
                v = vc[table[s]].reshape(ctx, hkv, d).transpose(0, 1)
                qs = q[s].reshape(hkv, hq // hkv, d)
                p = torch.softmax((qs @ k.transpose(1, 2)) * scale, dim=-1)
                out.append((p @ v).reshape(hq, d))
            return torch.stack(out)

        nbytes = 2 * seqs * ctx * hkv * d * kc.element_size()
        report(f"torch paged gather decode{name} {str(dtype)[6:]}", threads, median_time(run, reps=5),
               4 * seqs * hq * d * ctx, nbytes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--only", choices=["bandwidth", "gemm", "gemm-bf16", "flash", "paged"])
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)),
                        help="GEMM rows M to time (default: %(default)s)")
    args = parser.parse_args()
    tokens = [int(m) for m in args.tokens.split(",")]
    runs = [("bandwidth", bandwidth), ("gemm", lambda t: gemm(t, tokens)),
            ("gemm-bf16", lambda t: gemm_bf16(t, tokens)), ("flash", flash), ("paged", paged)]
    for threads in [int(t) for t in args.threads.split(",")]:
        for name, fn in runs:
            # `gemm` includes the bf16 half; run it alone only when asked for.
            if args.only == name or (args.only is None and name != "gemm-bf16"):
                fn(threads)


if __name__ == "__main__":
    main()
