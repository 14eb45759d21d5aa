#!/usr/bin/env python3
"""What each NVIDIA kernel's hottest loop issues: the static instruction mix of the CUBINs a
`tune plan` stored, read back from its database and disassembled. Counts, not timings.

Without a GPU, the plan's registers and spills say whether a build fits; this says what its
inner loop costs the schedulers: instructions issued per tensor-core operation (mma.sync's
HMMA, wgmma's HGMMA), shared-memory fragment loads (LDSM) per operation, barriers, special
function (MUFU: the softmax's exponents) and global copies (LDGSTS, UTMALDG). A kernel
whose loop issues several instructions per HMMA, with one or two warps a scheduler, is
bound by issue and latency before the tensor cores; one whose loop is mostly HMMA and LDSM
is bound by them or by shared memory.

    tune plan --device h200 --shapes flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16 \\
        --max-candidates 1000 --db plan.db
    pip install nvidia-cuda-nvdisasm        # NVIDIA's disassembler, no GPU needed
    python3 bench/sass_mix.py plan.db [--build 'KT_LANES=1'] [--kernel kt_flash] [--top 12]

The hottest loop is the loop (a backward branch's body) with the most tensor-core operations,
the innermost of equals: a flash kernel's key loop, a GEMM's k loop; with --top, its most
frequent instructions too. An HGMMA does the work of many HMMA (m64nNk16 against m16n8k16),
so instructions per operation compare kernels of one instruction only. nvdisasm is looked up
on PATH, then in the NVIDIA wheels beside Python.
"""
import argparse
import collections
import glob
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile

INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T] )?([A-Z0-9_]+)(\S*)")
LABEL = re.compile(r"^(\.L_x_\d+):")
BRANCH = re.compile(r"BRA `\((\.L_x_\d+)\)")
FUNCTION = re.compile(r"^\s*\.section\s+\.text\.([A-Za-z_]\w*),")
TENSOR = ("HMMA", "HGMMA", "IMMA")


def nvdisasm():
    found = shutil.which("nvdisasm")
    if found:
        return found
    for path in sys.path:
        for hit in glob.glob(os.path.join(path, "nvidia", "cu*", "bin", "nvdisasm")):
            return hit
    sys.exit("no nvdisasm: pip install nvidia-cuda-nvdisasm (or put a CUDA toolkit's on PATH)")


def functions(sass):
    """The disassembly's lines, per kernel."""
    out, name = {}, None
    for line in sass.splitlines():
        m = FUNCTION.match(line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name:
            out[name].append(line)
    return out


def hottest_loop(lines):
    """The body of the loop (a backward branch's span) holding the most tensor-core
    operations, the innermost of equals (a paired flash block's key loop, not its loop over
    the two tiles; the multiplying warps' loop, not the producer's); with none, the longest.
    All the lines where the kernel has no loop."""
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := LABEL.match(line))}
    spans = []
    for i, line in enumerate(lines):
        m = BRANCH.search(line)
        if m and labels.get(m.group(1), i) < i:
            body = lines[labels[m.group(1)] : i + 1]
            tensor = sum(mix(body)[op] for op in TENSOR)
            spans.append((tensor, -len(body) if tensor else len(body), body))
    if not spans:
        return lines, False
    return max(spans, key=lambda s: (s[0], s[1]))[2], True


def mix(lines):
    ops = collections.Counter()
    for line in lines:
        m = INSTRUCTION.match(line)
        if m and m.group(1) != "NOP":
            ops[m.group(1)] += 1
    return ops


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db", help="a database `tune plan` wrote (its gpu_compiles table)")
    ap.add_argument("--build", action="append", default=[], help="only builds containing this")
    ap.add_argument("--kernel", help="only this kernel (kt_flash, kt_gemm, ...)")
    ap.add_argument("--top", type=int, default=0, help="the loop's N most frequent instructions")
    args = ap.parse_args()
    tool = nvdisasm()
    db = sqlite3.connect(f"file:{args.db}?mode=ro", uri=True)
    rows = db.execute(
        "SELECT build, target, resources, code_object FROM gpu_compiles "
        "WHERE status = 'ok' AND code_object IS NOT NULL ORDER BY build"
    ).fetchall()
    rows = [r for r in rows if all(b in r[0] for b in args.build)]
    if not rows:
        sys.exit(f"{args.db}: no compiled builds matching {args.build}")
    print(f"{'regs':>4} {'spill':>5} {'loop':>5} {'tensor':>6} {'per op':>6} {'LDSM':>5} "
          f"{'bar':>3} {'MUFU':>4} {'copies':>6}  kernel  build (target)")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        for build, target, resources, code in rows:
            if not code.startswith(b"\x7fELF"):
                continue  # an AMD code object: nvdisasm reads NVIDIA's only
            with open(cubin, "wb") as f:
                f.write(code)
            sass = subprocess.run([tool, "-c", cubin], capture_output=True, text=True, check=True)
            res = {k["name"]: k for k in json.loads(resources or "[]")}
            for name, lines in functions(sass.stdout).items():
                if args.kernel and name != args.kernel:
                    continue
                loop, found = hottest_loop(lines)
                ops = mix(loop)
                total = sum(ops.values())
                tensor = sum(v for k, v in ops.items() if k in TENSOR)
                per = f"{total / tensor:.2f}" if tensor else "-"
                k = res.get(name, {})
                print(f"{k.get('vgpr', '?'):>4} {k.get('vgpr_spill', '?'):>5} "
                      f"{total if found else '-':>5} {tensor:>6} {per:>6} {ops['LDSM']:>5} "
                      f"{ops['BAR']:>3} {ops['MUFU']:>4} {ops['LDGSTS'] + ops['UTMALDG']:>6}  "
                      f"{name}  {build} ({target})")
                if args.top:
                    print("      " + ", ".join(f"{v} {k}" for k, v in ops.most_common(args.top)))


if __name__ == "__main__":
    main()
