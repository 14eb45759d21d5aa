#!/usr/bin/env python3
"""The README's CPU performance table from one benchmark run and one peers run beside it.

    cargo bench -p kerntune-kernels --bench kernels > bench.log 2>&1
    python3 bench/peers.py --threads 1,2 > peers.log
    python3 bench/table.py bench.log peers.log

Ours are criterion's medians of each shape's `default`, `best` and `best_1t`; the peers'
medians are matched to the shape by name (SDPA to the prefill rows, the gather decode to the
decode rows). Ratio = peer time / our time, as everywhere in the README.
"""
import argparse
import re

UNIT_MS = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}
# Benchmark shapes whose peer line names them otherwise.
PEER_NAME = {
    "llama70b_tp8_prefill_f32": "sdpa causal 2048 8q/1kv float32",
    "llama70b_tp8_prefill_bf16": "sdpa causal 2048 8q/1kv bfloat16",
    "llama70b_tp8_decode_f32": "paged gather decode float32",
    "llama70b_tp8_decode_bf16": "paged gather decode bfloat16",
    "llama8b_decode_bf16": "paged gather decode llama8b bfloat16",
}
LABEL = {"sdpa": "SDPA", "paged": "torch gather"}


def ours(text):
    """{(shape, label): median ms} from criterion's report, in the order it ran."""
    out = {}
    # criterion prints `name/label  time: [low median high]`, the name alone on a line when long.
    pattern = r"(\S+)/(default|best|best_1t)\s+time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]"
    for m in re.finditer(pattern, text):
        out[(m.group(1), m.group(2))] = float(m.group(3)) * UNIT_MS[m.group(4)]
    return out


def peers(text):
    """{(name, threads): (library, median ms)} from peers.py's lines."""
    out = {}
    for m in re.finditer(r"^(numpy|torch) (.+?)\s+t=(\d+) median\s+(\S+) ms", text, re.M):
        out[(m.group(2).strip(), int(m.group(3)))] = (m.group(1), float(m.group(4)))
    return out


def cell(x):
    return "" if x is None else f"{x:.4g}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_log")
    parser.add_argument("peers_log")
    parser.add_argument("--threads", type=int, default=2, help="the many-thread column's")
    args = parser.parse_args()
    mine = ours(open(args.bench_log).read())
    theirs = peers(open(args.peers_log).read())
    t = args.threads
    print(f"| shape | ours default, {t}t | ours best, {t}t | peer, {t}t | ratio {t}t "
          "| ours best, 1t | peer, 1t | ratio 1t |")
    print("|---|---|---|---|---|---|---|---|")
    shapes = list(dict.fromkeys(shape for shape, _ in mine))
    for shape in shapes:
        name = PEER_NAME.get(shape, shape)
        many, one = theirs.get((name, t)), theirs.get((name, 1))
        default, best, best_1t = (mine.get((shape, k)) for k in ("default", "best", "best_1t"))
        library = LABEL.get(name.split()[0], many[0] if many else "")
        ratio = f"{many[1] / best:.2f}" if many and best else ""
        ratio_1t = f"{one[1] / best_1t:.2f}" if one and best_1t else ""
        print(f"| {shape} | {cell(default)} | {cell(best)} | {library} {cell(many and many[1])} "
              f"| {ratio} | {cell(best_1t)} | {cell(one and one[1])} | {ratio_1t} |")


if __name__ == "__main__":
    main()
