#!/usr/bin/env python3
"""GEMMs cold, kerntune against its peer, alternating on the same machine (decode, M = 1, unless asked).

`bench/peers.py` repeats each call on the same buffers, so whatever part of the weights the L3
keeps between calls is read warm, and how much it keeps varies from run to run on a shared
machine (PyTorch's bf16 gate_up at M = 1 took 2.09 ms in one run and 3.72 ms in the next).
A server never calls one layer twice in a row: the other layers' weights pass through the cache
in between. This script times both sides as `tune` does: the weights rotate through copies
that together exceed twice the L3 (one copy when a single one does), and the two sides run in
turn, `--rounds` times, so a drift in the machine's memory bandwidth touches both.

    cargo build --release -p kerntune-tuner
    python3 bench/gemm_cold.py [--tune target/release/tune] [--threads 2] [--rounds 3]
        [--tokens 1,2048] [--square] [--dtypes f32,bf16] [--config heuristic|best --db FILE]

Ours is `tune bench --config heuristic` by default (the untuned path for these shapes, also
what a tuned database holds when nothing beat it), or `--config best` (the winner `tune`
stored in `--db`). The peers are numpy (OpenBLAS) `x @ w.T` for f32 and PyTorch `linear` for
bf16; `--square` adds f32 2048³ (`a @ b`, B stored `[K, N]`). Prompt-sized rows (`--tokens
2048`) are bound by arithmetic, not by the weights' reads, so there the rotation matters less
than the alternation: criterion and `bench/peers.py` run minutes apart, and this host's speed
moves by 5-10% in that time, more than the margins between the two.
"""
import argparse
import json
import os
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


def bench(args, spec, config, db=(), env=None):
    """`tune bench` of `config` (a name or JSON) on `spec`: its config and median seconds."""
    out = json.loads(subprocess.run(
        [args.tune, "bench", "--shapes", spec, "--config", config, "--json", *db],
        check=True, capture_output=True, text=True, env=env).stdout)[0]
    return out["config"], out["stats"]["median_ns"] / 1e9


def our_config(args, spec):
    """`args.config` on `spec` as JSON, on `args.threads` threads (looked up once a shape).

    The heuristic and the default are those of a host with `args.threads` threads (rayon's
    thread count is the detected one), as the heuristic sizes blocks by each thread's share;
    a database's winners are those of this host, run on `args.threads` threads."""
    if args.config == "best":
        config, _ = bench(args, spec, args.config, ["--db", args.db] if args.db else [])
    else:
        env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
        config, _ = bench(args, spec, args.config, env=env)
    config["threads"] = args.threads
    return json.dumps(config)


class Peer:
    """The peer's weights for one shape, in enough copies to rotate through."""

    def __init__(self, m, n, k, dtype, threads, b_kn=False):
        import numpy as np
        import torch

        itemsize = 4 if dtype == "f32" else 2
        copies = min(64, max(1, -(-2 * l3_bytes() // (n * k * itemsize))))
        if dtype == "f32":
            rng = np.random.default_rng(0)
            shape = (k, n) if b_kn else (n, k)
            self.ws = [rng.random(shape, dtype=np.float32) for _ in range(copies)]
            x = rng.random((m, k), dtype=np.float32)
            self.call = (lambda w: x @ w) if b_kn else (lambda w: x @ w.T)
        else:
            torch.set_num_threads(threads)
            self.ws = [torch.rand(n, k).to(torch.bfloat16) for _ in range(copies)]
            x = torch.rand(m, k).to(torch.bfloat16)
            self.call = lambda w: torch.nn.functional.linear(x, w)
        self.threads = threads
        # As many calls as `tune bench` makes of a long one: its timing stops after 0.5 s.
        self.reps = 30 if m * n * k < 1 << 30 else 7

    def time(self):
        from threadpoolctl import threadpool_limits

        times = []
        with threadpool_limits(self.threads):
            for w in self.ws:
                self.call(w)
            for i in range(self.reps):
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
    parser.add_argument("--tokens", default="1", help="GEMM rows M (default: %(default)s)")
    parser.add_argument("--dtypes", default="f32,bf16")
    parser.add_argument("--square", action="store_true", help="also f32 2048x2048x2048")
    parser.add_argument("--config", default="heuristic", help="heuristic, default or best")
    parser.add_argument("--db", help="the database whose winners --config best runs")
    args = parser.parse_args()
    print(f"L3 {l3_bytes() >> 20} MiB, {args.threads} threads, {args.rounds} alternating rounds, "
          f"ours: {args.config}")
    shapes = [("2048^3", 2048, 2048, 2048, "f32", True)] if args.square else []
    for dtype in args.dtypes.split(","):
        for m in map(int, args.tokens.split(",")):
            shapes += [(f"{name} m={m}", m, n, k, dtype, False) for name, n, k in LLAMA70B_TP8]
    for name, m, n, k, dtype, b_kn in shapes:
        spec = f"gemm:m={m},n={n},k={k},dtype={dtype},b={'kn' if b_kn else 'nk'}"
        peer = Peer(m, n, k, dtype, args.threads, b_kn)
        config = our_config(args, spec)
        a, b = [], []
        for _ in range(args.rounds):
            a.append(bench(args, spec, config)[1])
            b.append(peer.time())
        del peer
        mine, theirs = statistics.median(a), statistics.median(b)
        gbs = n * k * (4 if dtype == "f32" else 2) / mine / 1e9
        rate = f"{gbs:5.1f} GB/s" if m <= 16 else f"{2 * m * n * k / mine / 1e9:5.0f} GF/s"
        lib = "numpy" if dtype == "f32" else "torch"
        print(f"{name:<14} {dtype:<5} ours {mine * 1e3:8.3f} ms ({rate})  "
              f"{lib} {theirs * 1e3:8.3f} ms  ratio {theirs / mine:5.2f}  "
              f"ours {' '.join(f'{t * 1e3:.2f}' for t in a)}  "
              f"{lib} {' '.join(f'{t * 1e3:.2f}' for t in b)}", flush=True)


if __name__ == "__main__":
    main()
