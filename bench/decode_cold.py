#!/usr/bin/env python3
"""Decode GEMMs (M = 1) cold, kerntune against its peer, alternating on the same machine.

`bench/peers.py` repeats each call on the same buffers, so whatever part of the weights the L3
keeps between calls is read warm, and how much it keeps varies from run to run on a shared
machine (PyTorch's bf16 gate_up at M = 1 took 2.09 ms in one run and 3.72 ms in the next).
A server never calls one layer twice in a row: the other layers' weights pass through the cache
in between. This script times both sides as `tune` does: the weights rotate through copies
that together exceed twice the L3 (one copy when a single one does), and the two sides run in
turn, `--rounds` times, so a drift in the machine's memory bandwidth touches both.

    cargo build --release -p kerntune-tuner
    python3 bench/decode_cold.py [--tune target/release/tune] [--threads 2] [--rounds 3]

Ours is `tune bench --config heuristic` (the untuned path for these shapes, also what a tuned
database holds when nothing beat it); the peers are numpy (OpenBLAS) `x @ w.T` for f32 and
PyTorch `linear` for bf16.
"""
import argparse
import json
import statistics
import subprocess
import time

from peers import LLAMA70B_TP8


def l3_bytes():
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            text = f.read().strip()
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
        return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        return 32 << 20


def ours(tune, n, k, dtype, threads):
    spec = f"gemm:m=1,n={n},k={k},dtype={dtype},b=nk"
    config = json.loads(subprocess.run(
        [tune, "bench", "--shapes", spec, "--config", "heuristic", "--json"],
        check=True, capture_output=True, text=True).stdout)[0]["config"]
    config["threads"] = threads
    out = subprocess.run(
        [tune, "bench", "--shapes", spec, "--config", json.dumps(config), "--json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)[0]["stats"]["median_ns"] / 1e9


class Peer:
    """The peer's weights for one shape, in enough copies to rotate through."""

    def __init__(self, n, k, dtype, threads):
        import numpy as np
        import torch

        itemsize = 4 if dtype == "f32" else 2
        copies = min(64, max(1, -(-2 * l3_bytes() // (n * k * itemsize))))
        if dtype == "f32":
            rng = np.random.default_rng(0)
            self.ws = [rng.random((n, k), dtype=np.float32) for _ in range(copies)]
            x = rng.random((1, k), dtype=np.float32)
            self.call = lambda w: x @ w.T
        else:
            torch.set_num_threads(threads)
            self.ws = [torch.rand(n, k).to(torch.bfloat16) for _ in range(copies)]
            x = torch.rand(1, k).to(torch.bfloat16)
            self.call = lambda w: torch.nn.functional.linear(x, w)
        self.threads = threads

    def time(self, reps=30):
        from threadpoolctl import threadpool_limits

        times = []
        with threadpool_limits(self.threads):
            for w in self.ws:
                self.call(w)
            for i in range(reps):
                w = self.ws[i % len(self.ws)]
                start = time.perf_counter()
                self.call(w)
                times.append(time.perf_counter() - start)
        return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tune", default="target/release/tune")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"L3 {l3_bytes() >> 20} MiB, {args.threads} threads, {args.rounds} alternating rounds")
    for dtype in ["f32", "bf16"]:
        for name, n, k in LLAMA70B_TP8:
            peer = Peer(n, k, dtype, args.threads)
            a, b = [], []
            for _ in range(args.rounds):
                a.append(ours(args.tune, n, k, dtype, args.threads))
                b.append(peer.time())
            del peer
            mine, theirs = statistics.median(a), statistics.median(b)
            gbs = n * k * (4 if dtype == "f32" else 2) / mine / 1e9
            lib = "numpy" if dtype == "f32" else "torch"
            print(f"{name:<8} {dtype:<5} ours {mine * 1e3:7.3f} ms ({gbs:5.1f} GB/s)  "
                  f"{lib} {theirs * 1e3:7.3f} ms  ratio {theirs / mine:5.2f}  "
                  f"ours {' '.join(f'{t * 1e3:.2f}' for t in a)}  "
                  f"{lib} {' '.join(f'{t * 1e3:.2f}' for t in b)}", flush=True)


if __name__ == "__main__":
    main()
