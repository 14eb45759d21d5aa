#!/usr/bin/env python3
"""How long a causal flash prefill's blocks keep the GPU busy, by the order they start in: an
arithmetic model, not a measurement.

Under a causal mask query tile t of 128 rows reads t + 1 key tiles, so the last tile's block
is the kernel's critical path; split-KV (`split` 2 or 4) cuts each tile's keys into equal runs
of whole tiles, one block each. The hardware starts blocks in grid order as SMs free up. This
model gives each SM one block at a time (the 128-row tiles' registers allow no second), a
block's time its key tiles, and hands blocks out greedily in the order of the grid, for the
order kernels/hip/flash.hip used before session 41 (tiles first first, x = tile, y = head,
z = key run) and the one it uses now (x = head, then key run; y = the tile, last first).

    python3 bench/flash_schedule.py [--q-len 2048] [--heads 8] [--sms 132] [--tile 128]

For Llama-3.1-70B TP8 at 2048 queries (16 tiles, 8 heads, 132 SMs of an H200) it prints, in
units of one key tile's time, 16 unsplit either way, 14 against 9 split in two, 11 against 10
split in four, where the work divided evenly over the SMs is 8.2.
"""
import argparse
import heapq


def work(tile, run, split, tiles):
    """Key tiles block (tile, run) reads: its run's share of the tile + 1 it may see."""
    per = -(-tiles // split)
    return max(0, min(tile + 1, (run + 1) * per) - run * per)


def makespan(blocks, sms):
    """When the last block ends, blocks started in order on the first free SM (a block of no
    keys ends at once)."""
    free = [0.0] * sms
    end = 0.0
    for w in blocks:
        start = heapq.heappop(free)
        end = max(end, start + w)
        heapq.heappush(free, start + w)
    return end


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--q-len", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--tile", type=int, default=128)
    a = ap.parse_args()
    tiles = -(-a.q_len // a.tile)
    print(f"{tiles} query tiles of {a.tile} x {a.heads} heads on {a.sms} SMs (key tiles' time)")
    for split in (1, 2, 4):
        before = [
            work(t, r, split, tiles)
            for r in range(split)
            for _ in range(a.heads)
            for t in range(tiles)
        ]
        now = [
            work(t, r, split, tiles)
            for t in reversed(range(tiles))
            for r in range(split)
            for _ in range(a.heads)
        ]
        even = sum(before) / a.sms
        print(
            f"  split {split}: first tile first {makespan(before, a.sms):5.1f}, "
            f"last tile first {makespan(now, a.sms):5.1f}, evenly {even:4.1f}"
        )


if __name__ == "__main__":
    main()
