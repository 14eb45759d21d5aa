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
B[j][p] = j - p, so C[i][j] = sum_p (i + p)(j - p), as in gemm.c. Then the same product in
fp8 (W8A8) through kt_gemm_scaled, as an FP8 checkpoint's Linear layer runs it: the E4M3
bytes (a `torch.float8_e4m3fn` tensor's `data_ptr()`) and float32 scales per token and per
output channel.
"""

import ctypes
import sys
from array import array

KT_STATUS_OK = 0
KT_STATUS_INVALID_ARGUMENT = 1
KT_DTYPE_F32 = 0
KT_DTYPE_FP8_E4M3 = 3


def e4m3(v):
    """The E4M3 byte of v, a whole number of at most four significant bits (exact in E4M3)."""
    sign, a = (0x80, -v) if v < 0 else (0, v)
    if a == 0:
        return sign
    e = a.bit_length() - 1
    mantissa = (a >> (e - 3) if e >= 3 else a << (3 - e)) & 7
    return sign | (e + 7) << 3 | mantissa


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
    lib.kt_gemm_scaled.restype = ctypes.c_int
    lib.kt_gemm_scaled.argtypes = [
        ctypes.c_void_p,  # dispatcher
        ctypes.c_size_t,  # m
        ctypes.c_size_t,  # n
        ctypes.c_size_t,  # k
        ctypes.c_int,  # KtDtype (fp8)
        ctypes.c_bool,  # b_is_nk
        ctypes.c_void_p,  # a (fp8 bytes)
        ctypes.c_void_p,  # a_scales (float)
        ctypes.c_size_t,  # a_scales_len: 1 or m
        ctypes.c_void_p,  # b (fp8 bytes)
        ctypes.c_void_p,  # b_scales (float)
        ctypes.c_size_t,  # b_scales_len: 1 or n
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

        # fp8: A's row i stored as (i + p) / a_scales[i] with a_scales[i] = 2^-i, B's row j
        # as (j - p) / b_scales[j] with b_scales[j] = 1/2; powers of two, so C is exact.
        a8 = array("B", [e4m3((i + p) << i) for i in range(m) for p in range(k)])
        b8 = array("B", [e4m3((j - p) * 2) for j in range(n) for p in range(k)])
        a_scales = array("f", [2.0**-i for i in range(m)])
        b_scales = array("f", [0.5] * n)
        c8 = array("f", [0.0] * (m * n))
        status = lib.kt_gemm_scaled(
            d, m, n, k, KT_DTYPE_FP8_E4M3, True, address(a8), address(a_scales), m,
            address(b8), address(b_scales), n, address(c8), None,
        )
        if status != KT_STATUS_OK:
            sys.exit(f"kt_gemm_scaled: {lib.kt_last_error().decode()}")
        assert c8 == c, (list(c8), list(c))
        print("fp8: matches")

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
