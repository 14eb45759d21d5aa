"""kerntune's runtime library from Python, through ctypes: how a Python server (vLLM, TGI)
calls the C ABI without building an extension. Opens a tuning database, runs one GEMM on
buffers Python owns, prints the result and the dispatch statistics, and records the shapes
that had no exact winner.

    cargo build --release -p kerntune-runtime
    python3 runtime-lib/examples/gemm.py target/release/libkerntune.so kerntune.db untuned.txt

The buffers here are `array` objects; a contiguous CPU tensor passes `t.data_ptr()` the same
way (float32 for KT_DTYPE_F32, bfloat16 for KT_DTYPE_BF16; C is always float32). The types
below mirror include/kerntune.h.

A is 3x5 with A[i][p] = i + p, B is stored [N, K] (a Linear layer's weights) with
B[j][p] = j - p, so C[i][j] = sum_p (i + p)(j - p), as in gemm.c.
"""

import ctypes
import sys
from array import array

KT_STATUS_OK = 0
KT_STATUS_INVALID_ARGUMENT = 1
KT_DTYPE_F32 = 0


class KtStats(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "exact",
            "bucket",
            "nearest",
            "defaults",
            "loaded",
            "rejected",
            "stale",
            "untuned",
        )
    ]


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
    lib.kt_open.restype = ctypes.c_int
    lib.kt_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.kt_free.restype = None
    lib.kt_free.argtypes = [ctypes.c_void_p]
    lib.kt_note.restype = ctypes.c_char_p
    lib.kt_note.argtypes = [ctypes.c_void_p]
    lib.kt_gemm.restype = ctypes.c_int
    lib.kt_gemm.argtypes = [
        ctypes.c_void_p,  # dispatcher
        ctypes.c_size_t,  # m
        ctypes.c_size_t,  # n
        ctypes.c_size_t,  # k
        ctypes.c_int,  # KtDtype
        ctypes.c_bool,  # b_is_nk
        ctypes.c_void_p,  # a
        ctypes.c_void_p,  # b
        ctypes.c_void_p,  # c (float)
        ctypes.POINTER(ctypes.c_int),  # KtMatch out, or None
    ]
    lib.kt_stats.restype = ctypes.c_int
    lib.kt_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(KtStats)]
    lib.kt_write_untuned.restype = ctypes.c_int
    lib.kt_write_untuned.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return lib


def address(buf):
    """The address of an array's first element (a tensor's `data_ptr()`)."""
    return buf.buffer_info()[0]


def main(lib_path, db, untuned):
    lib = load(lib_path)
    d = ctypes.c_void_p()
    if lib.kt_open(db.encode(), ctypes.byref(d)) != KT_STATUS_OK:
        sys.exit(f"kt_open: {lib.kt_last_error().decode()}")
    try:
        note = lib.kt_note(d).decode()
        if note:
            print(f"note: {note}", file=sys.stderr)

        m, n, k = 3, 4, 5
        a = array("f", [i + p for i in range(m) for p in range(k)])
        b = array("f", [j - p for j in range(n) for p in range(k)])
        c = array("f", [0.0] * (m * n))
        how = ctypes.c_int()
        status = lib.kt_gemm(
            d, m, n, k, KT_DTYPE_F32, True, address(a), address(b), address(c), ctypes.byref(how)
        )
        if status != KT_STATUS_OK:
            sys.exit(f"kt_gemm: {lib.kt_last_error().decode()}")
        for i in range(m):
            print(" ".join(f"{c[i * n + j]:g}" for j in range(n)))

        # A bad call reports an error instead of crashing the server.
        status = lib.kt_gemm(d, 0, n, k, KT_DTYPE_F32, True, address(a), address(b), address(c), None)
        assert status == KT_STATUS_INVALID_ARGUMENT, status
        print(f"error: {lib.kt_last_error().decode()}")

        s = KtStats()
        lib.kt_stats(d, ctypes.byref(s))
        print(
            f"match={how.value} exact={s.exact} bucket={s.bucket} nearest={s.nearest} "
            f"defaults={s.defaults} loaded={s.loaded} untuned={s.untuned}"
        )
        if lib.kt_write_untuned(d, untuned.encode()) != KT_STATUS_OK:
            sys.exit(f"kt_write_untuned: {lib.kt_last_error().decode()}")
    finally:
        lib.kt_free(d)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: gemm.py LIBKERNTUNE_SO DATABASE UNTUNED_FILE")
    main(*sys.argv[1:])
