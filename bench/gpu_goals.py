"""kerntune's NVIDIA goals, read off one `scripts/gpu-check.sh` run: tuned bf16 GEMM at least
0.7x cuBLAS on the Llama-3.1-70B TP8 decode and prefill shapes, tuned flash attention at least
0.7x PyTorch SDPA (its default dispatch), and every tuned config at least as fast as the
family's default. Every ratio is a speed ratio (the other's median time over kerntune's
tuned median), all from the same run on the same device. Beside the GEMM goal, not judged:
cuBLAS writing f32 as kerntune's GEMM does (the goal's cuBLAS writes bf16, as servers call it).

    python3 bench/gpu_goals.py DIR    # DIR holds gpu-check-*.json and sdpa.json

Needs nothing beyond Python; a file the run did not write is reported missing, not guessed.
"""

import glob
import json
import os
import re
import sys

PEER_GOAL = 0.7


def verdict(ok):
    return "met" if ok else "MISSED"


def form(config):
    """A config's kernel form, as its display names it: the variant, then the choices that
    change the kernel's structure (`gpu wgmma 128x256x64 tile 1x256 stages=4 swizzle=128
    specialized tma block-tiles=4 cluster=2` -> `wgmma swizzled specialized tma block-tiles
    cluster`; `gpu mma br=128 bc=32 lanes=1 split=2` -> `mma 32-row-warps split`); tile sizes,
    stages and counts are left out."""
    words = config.split()
    variant = words[1] if len(words) > 1 and "=" not in words[1] else "rows"
    # Paged attention's (`gpu partition=512 threads=128 heads=16 mma` -> `paged heads mma`):
    # a thread a token, groups of lanes, several heads a block, tensor cores.
    paged = len(words) > 1 and words[1].startswith("partition=")
    if paged:
        variant = "paged"
    flags = []
    for w in words[2:]:
        if paged and w.startswith(("lanes=", "heads=")):
            flags.append(w.split("=")[0])
        elif paged and w == "mma":
            flags.append(w)
        elif w.startswith("swizzle="):
            flags.append("swizzled")
        elif variant == "mma" and w == "lanes=1":
            # The flash mma tiles' one thread a row: warps of 32 query rows.
            flags.append("32-row-warps")
        elif w.startswith(("split=", "split-k=", "block-tiles=", "cluster=")):
            flags.append(w.split("=")[0])
        elif w in ("paired", "specialized", "pingpong", "tma", "wgmma"):
            flags.append(w)
    return " ".join([variant] + flags)


def forms(rows):
    """Each problem's fastest verified config of each form, over every run's rows: which
    kernel structure pays on this device, beside the tuned winner. Its registers and spilled
    registers where the run recorded them (`[config, ns, registers, spilled]`; runs before
    session 43 wrote `[config, ns]`)."""
    best = {}
    for r in rows:
        for timed in r.get("timed") or []:
            config, ns = timed[0], timed[1]
            key = (r["problem"], form(config))
            if key not in best or ns < best[key][0]:
                best[key] = (ns, config, timed[2:4])
    print("\n== the fastest config of each kernel form (medians from this run)")
    problem = None
    for (p, f), (ns, config, regs) in sorted(best.items(), key=lambda kv: (kv[0][0], kv[1][0])):
        if p != problem:
            print(f"  {p}")
            problem = p
        used = f"{regs[0]:>3} regs {regs[1]:>2} spilled" if len(regs) == 2 else ""
        print(f"    {ns / 1e3:10.1f} us  {f:<52} {used:<18} {config}")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 bench/gpu_goals.py DIR (the folder gpu-check.sh wrote)")
    folder = sys.argv[1]
    rows = []
    for path in sorted(glob.glob(os.path.join(folder, "gpu-check-*.json"))):
        with open(path) as f:
            rows += json.load(f)
    sdpa_path = os.path.join(folder, "sdpa.json")
    sdpa = None
    if os.path.exists(sdpa_path):
        with open(sdpa_path) as f:
            sdpa = json.load(f)
    if not rows:
        print(f"goals: no gpu-check-*.json in {folder}: no kerntune timings to judge")
        return 1

    # The GEMM runs (wgmma apart from the rest) each write rows: a problem's best is the
    # fastest over them, its default and cuBLAS timings whichever run took them.
    merged = {}
    for r in rows:
        m = merged.setdefault(r["problem"], {"best_ns": None, "best": None})
        peers = ("cublas_ns", "cublas_f32_ns", "cublaslt_ns", "cublaslt_scales")
        for key in ("default_ns",) + peers:
            if r.get(key) is not None and m.get(key) is None:
                m[key] = r[key]
        if r.get("best_ns") is not None and (m["best_ns"] is None or r["best_ns"] < m["best_ns"]):
            m["best_ns"], m["best"] = r["best_ns"], r["best"]

    forms(rows)
    print("\n== goals (speed ratios: the other's median time over kerntune's tuned median)")
    missed = 0
    for problem, m in merged.items():
        best = m["best_ns"]
        if best is None:
            print(f"  {problem}: nothing verified and timed: every goal MISSED")
            missed += 1
            continue
        default = m.get("default_ns")
        if default is None:
            print(f"  {problem}: the default was not timed (it failed or was not run): MISSED")
            missed += 1
        else:
            ok = best <= default
            missed += not ok
            print(f"  {problem}: tuned vs default {default / best:.2f}x (goal >= 1): {verdict(ok)}")
        family = problem.split(":")[0]
        peer, label = None, None
        if family == "gemm":
            peer, label = m.get("cublas_ns"), "cuBLAS"
        elif family == "flash" and sdpa is not None:
            peer, label = sdpa["us"]["default"] * 1e3, "PyTorch SDPA"
        elif family == "flash":
            print(f"  {problem}: no sdpa.json, so no SDPA timing: MISSED")
            missed += 1
        if peer is not None:
            ok = peer / best >= PEER_GOAL
            missed += not ok
            print(
                f"  {problem}: tuned vs {label} {peer / best:.2f}x "
                f"(goal >= {PEER_GOAL}): {verdict(ok)}"
            )
            if family == "gemm" and m.get("cublas_f32_ns") is not None:
                # Information beside the goal: cuBLAS on the same work to the byte (its f32
                # output, as kerntune writes), which says how much of a gap the wider
                # output explains.
                print(
                    f"  {problem}: tuned vs cuBLAS writing f32 as kerntune does "
                    f"{m['cublas_f32_ns'] / best:.2f}x"
                )
            if family == "flash":
                fastest = min(sdpa["us"], key=sdpa["us"].get)
                print(
                    f"  {problem}: tuned vs SDPA's fastest backend ({fastest}) "
                    f"{sdpa['us'][fastest] * 1e3 / best:.2f}x"
                )
    # An FP8 checkpoint's GEMM beside the same shape in bf16 (information, no goal): what
    # reading half the weight bytes bought.
    for problem, m in merged.items():
        if "dtype=fp8_" not in problem or m["best_ns"] is None:
            continue
        fmt = problem.split("dtype=")[1].split(",")[0]
        bf16 = merged.get(problem.replace(f"dtype={fmt}", "dtype=bf16"))
        if bf16 is not None and bf16["best_ns"] is not None:
            print(f"  {problem}: tuned fp8 vs tuned bf16 {bf16['best_ns'] / m['best_ns']:.2f}x")
        if m.get("cublaslt_ns") is not None:
            # Which scales cuBLASLt took: per token and channel as kerntune's, or per tensor.
            scales = m.get("cublaslt_scales") or "scales not recorded"
            print(
                f"  {problem}: tuned vs cuBLASLt fp8 {m['cublaslt_ns'] / m['best_ns']:.2f}x"
                f" ({scales})"
            )
    # A 4-bit checkpoint's GEMM beside the same shape in bf16 (information, no goal; cuBLAS
    # takes no int4 words): what reading a quarter of the weight bytes bought.
    for problem, m in merged.items():
        if ",int4=" not in problem or m["best_ns"] is None:
            continue
        bf16 = merged.get(re.sub(r",b=kn,int4=\d+", ",b=nk", problem))
        if bf16 is None:
            continue
        if bf16["best_ns"] is not None:
            print(f"  {problem}: tuned int4 vs tuned bf16 {bf16['best_ns'] / m['best_ns']:.2f}x")
        if bf16.get("cublas_ns") is not None:
            print(f"  {problem}: tuned int4 vs cuBLAS bf16 {bf16['cublas_ns'] / m['best_ns']:.2f}x")
    print(f"{missed} goals missed")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
