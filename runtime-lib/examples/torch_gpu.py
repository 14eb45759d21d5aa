"""kerntune's GPU dispatch from a PyTorch server, through ctypes: tensors on the GPU pass their
`data_ptr()`, the launch goes on PyTorch's current stream, the shapes kerntune has no kernel
for fall back to PyTorch's own, and a CUDA graph captures the tuned kernel as vLLM captures its
decode steps, replayed after the database was reloaded (the builds a graph captured stay
loaded).

    cargo build --release -p kerntune-runtime --features cuda
    python3 runtime-lib/examples/torch_gpu.py target/release/libkerntune.so tuned.db h200

`tuned.db` is a database `tune --device h200` wrote with Llama-70B TP8's decode GEMM
(n = 1280, k = 8192, bf16, weights [N, K]) at m = 16, as scripts/gpu-check.sh does. Exits 0
when every result is right, 1 when one is wrong, 2 when there is no usable device (the
library is asked first, so without one the script needs no PyTorch).

A[i][p] = ((3i + p) % 9 - 4) / 8 and W[j][p] = ((j + 2p) % 7 - 3) / 8 are exact in bf16, and
every partial sum is a multiple of 1/64 below 2^11 (within f32's 24 bits), so any order of
summation in f32, split-K included, gives the exact result: the check is equality with a
float64 product. The types mirror include/kerntune.h.
"""

import ctypes
import sys

KT_STATUS_OK = 0
KT_STATUS_NOT_TUNED = 6
KT_DTYPE_BF16 = 2
MATCH = {0: "exact", 1: "bucket", 2: "nearest", 3: "default"}


class KtStats(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("exact", "bucket", "nearest", "defaults", "loaded", "rejected", "stale", "untuned")
    ]


class KtGpuStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("builds", "missing", "failed", "resident")]


# The C ABI these types mirror (KERNTUNE_ABI_VERSION in include/kerntune.h).
KERNTUNE_ABI_VERSION = 8


def load(path):
    lib = ctypes.CDLL(path)
    lib.kt_abi_version.restype = ctypes.c_uint32
    lib.kt_abi_version.argtypes = []
    if lib.kt_abi_version() != KERNTUNE_ABI_VERSION:
        sys.exit(f"{path} speaks C ABI {lib.kt_abi_version()}, this script {KERNTUNE_ABI_VERSION}")
    lib.kt_last_error.restype = ctypes.c_char_p
    lib.kt_last_error.argtypes = []
    lib.kt_gpu_open.restype = ctypes.c_int
    lib.kt_gpu_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.kt_gpu_free.restype = None
    lib.kt_gpu_free.argtypes = [ctypes.c_void_p]
    lib.kt_gpu_gemm_scratch_bytes.restype = ctypes.c_size_t
    lib.kt_gpu_gemm_scratch_bytes.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_bool,
    ]
    lib.kt_gpu_gemm.restype = ctypes.c_int
    lib.kt_gpu_gemm.argtypes = [
        ctypes.c_void_p,  # dispatcher
        ctypes.c_size_t,  # m
        ctypes.c_size_t,  # n
        ctypes.c_size_t,  # k
        ctypes.c_int,  # KtDtype
        ctypes.c_bool,  # b_is_nk
        ctypes.c_void_p,  # a
        ctypes.c_void_p,  # b
        ctypes.c_void_p,  # c (float)
        ctypes.c_void_p,  # scratch
        ctypes.c_size_t,  # scratch_bytes
        ctypes.c_void_p,  # stream (cudaStream_t)
        ctypes.POINTER(ctypes.c_int),  # KtMatch out, or None
    ]
    lib.kt_gpu_reload.restype = ctypes.c_int
    lib.kt_gpu_reload.argtypes = [ctypes.c_void_p]
    lib.kt_gpu_stats.restype = ctypes.c_int
    lib.kt_gpu_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(KtStats), ctypes.POINTER(KtGpuStats)]
    return lib


class Linear:
    """`x @ w.T` into float32 by kerntune's tuned kernel, PyTorch's where kerntune has none."""

    def __init__(self, lib, d, torch, w):
        self.lib, self.d, self.torch, self.w = lib, d, torch, w
        self.scratch = {}

    def scratch_for(self, m):
        n, k = self.w.shape
        size = self.lib.kt_gpu_gemm_scratch_bytes(self.d, m, n, k, KT_DTYPE_BF16, True)
        # One buffer per size, kept: a captured graph holds its address.
        if size and size not in self.scratch:
            self.scratch[size] = self.torch.empty(size, dtype=self.torch.uint8, device="cuda")
        return (self.scratch[size].data_ptr() if size else None), size

    def __call__(self, x, out):
        m, k = x.shape
        n = self.w.shape[0]
        scratch, size = self.scratch_for(m)
        how = ctypes.c_int(-1)
        status = self.lib.kt_gpu_gemm(
            self.d, m, n, k, KT_DTYPE_BF16, True, x.data_ptr(), self.w.data_ptr(), out.data_ptr(),
            scratch, size, self.torch.cuda.current_stream().cuda_stream, ctypes.byref(how),
        )
        if status == KT_STATUS_NOT_TUNED:
            # Never tuned on this GPU: the server's own kernel, as before kerntune.
            torch = self.torch
            torch.matmul(x.float(), self.w.float().T, out=out)
            return "not tuned: PyTorch"
        if status != KT_STATUS_OK:
            raise RuntimeError(f"kt_gpu_gemm: status {status}: {self.lib.kt_last_error().decode()}")
        return MATCH[how.value]


def operands(torch, m, n, k, shift=0):
    i = torch.arange(m).view(m, 1)
    j = torch.arange(n).view(n, 1)
    p = torch.arange(k).view(1, k)
    a = (((3 * i + p + shift) % 9) - 4).double() / 8
    w = (((j + 2 * p) % 7) - 3).double() / 8
    return a, w


def check(torch, name, x, w, out):
    torch.cuda.synchronize()
    want = x.double().cpu() @ w.double().cpu().T
    wrong = int((out.double().cpu() != want).sum())
    print(f"{name}: {wrong} of {out.numel()} values wrong")
    return wrong == 0


def main(lib_path, db, device):
    lib = load(lib_path)
    d = ctypes.c_void_p()
    # The library first: without the device, or built without CUDA, it says which.
    if lib.kt_gpu_open(db.encode(), device.encode(), ctypes.byref(d)) != KT_STATUS_OK:
        print(f"kt_gpu_open: {lib.kt_last_error().decode()}", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        lib.kt_gpu_free(d)
        print("this example needs PyTorch with CUDA (pip install torch)", file=sys.stderr)
        return 2
    ok = True
    try:
        n, k = 1280, 8192
        for m, n_ in ((16, n), (5, n), (16, 96)):
            a, w = operands(torch, m, n_, k)
            x, weight = a.to("cuda", torch.bfloat16), w.to("cuda", torch.bfloat16)
            out = torch.zeros(m, n_, device="cuda", dtype=torch.float32)
            how = Linear(lib, d, torch, weight)(x, out)
            ok &= check(torch, f"gemm m={m} n={n_} k={k} ({how})", x, weight, out)

        # A CUDA graph captures the tuned kernel's launch; the database is reloaded, the
        # inputs changed in place, and the graph replayed: it reads the new inputs with the
        # build it captured, which the reload kept loaded.
        m = 16
        a, w = operands(torch, m, n, k)
        x, weight = a.to("cuda", torch.bfloat16), w.to("cuda", torch.bfloat16)
        out = torch.zeros(m, n, device="cuda", dtype=torch.float32)
        linear = Linear(lib, d, torch, weight)
        linear.scratch_for(m)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            how = linear(x, out)
        if lib.kt_gpu_reload(d) != KT_STATUS_OK:
            raise RuntimeError(f"kt_gpu_reload: {lib.kt_last_error().decode()}")
        x.copy_(operands(torch, m, n, k, shift=5)[0].to("cuda", torch.bfloat16))
        out.zero_()
        graph.replay()
        ok &= check(torch, f"graph of gemm m={m} n={n} k={k} ({how}), replayed after a reload", x, weight, out)

        s, held = KtStats(), KtGpuStats()
        lib.kt_gpu_stats(d, ctypes.byref(s), ctypes.byref(held))
        print(
            f"calls: {s.exact} exact, {s.bucket} bucket, {s.nearest} nearest, {s.defaults} default; "
            f"builds: {held.builds} launched, {held.resident} loaded"
        )
    finally:
        lib.kt_gpu_free(d)
    print("all results exact" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print("usage: torch_gpu.py LIBKERNTUNE_SO DATABASE DEVICE", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
