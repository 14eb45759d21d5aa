//! The C ABI: an opaque dispatcher handle, the three kernels, statistics, and a thread-local
//! last-error message. No panic crosses the boundary: every entry point catches unwinding and
//! reports `KT_STATUS_PANIC`.
//!
//! The header `runtime-lib/include/kerntune.h` is generated from this file by cbindgen and
//! checked in; a test fails when it is stale.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use half::{bf16, f16};
use kerntune_kernels::kernel::{FlashArgs, GemmArgs, GemmScales, KvScales, PagedArgs};
use kerntune_kernels::problem::{BLayout, FlashProblem, GemmProblem, PagedProblem, Scale};
use kerntune_kernels::{DType, Fp8, Problem, Tensor};

use crate::{Dispatcher, Match, Stats};

/// The version of this C ABI: the header's, which a program compares with kt_abi_version()
/// (the library's) before its first call, since a struct that grew (2: `window` in the
/// attention problems; 3: `sinks` and `softcap`; 4: fp8 KV caches, `kv_dtype`, `k_scale`
/// and `v_scale` in the paged problem; 5: latent caches, `v_head_dim` in the paged problem;
/// 6: narrow value heads, `v_head_dim` in the flash problem; 7: ALiBi, `alibi_slopes` in
/// both attention problems) would otherwise be read past the end a program built against an
/// older header passes, and an enum value the library does not know (8: the fp8 `KtDtype`s
/// of kt_gemm_scaled) would be read as none of its values.
pub const KERNTUNE_ABI_VERSION: u32 = 8;

/// Result of every call.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KtStatus {
    Ok = 0,
    /// A NULL pointer, an invalid problem, or buffers that do not fit it; see kt_last_error().
    InvalidArgument = 1,
    /// The kernel failed; see kt_last_error().
    KernelError = 2,
    /// A bug inside kerntune was caught at the boundary; see kt_last_error().
    Panic = 3,
    /// Reloading or writing a file failed; see kt_last_error().
    IoError = 4,
    /// kt_gpu_open(): no usable GPU of that model, or this library was built without its
    /// vendor's backend; see kt_last_error().
    NoDevice = 5,
    /// kt_gpu_*(): this shape class was never tuned on the device, so no compiled kernel is
    /// loaded for it; run your own kernel for it (see kt_last_error()).
    NotTuned = 6,
}

/// Element type of input buffers. Outputs are always float.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KtDtype {
    F32 = 0,
    F16 = 1,
    Bf16 = 2,
    /// OCP E4M3 (`float8_e4m3fn`): an FP8 checkpoint's GEMMs through kt_gemm_scaled().
    Fp8E4m3 = 3,
    /// E4M3 with no negative zero (`float8_e4m3fnuz`, MI300X's): kt_gemm_scaled() only.
    Fp8E4m3Fnuz = 4,
    /// OCP E5M2 (`float8_e5m2`): kt_gemm_scaled() only.
    Fp8E5m2 = 5,
}

/// What a paged problem's KV caches hold (vLLM's `--kv-cache-dtype`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KtKvCacheDtype {
    /// The query's dtype (vLLM's `auto`).
    Auto = 0,
    /// OCP E4M3 (`float8_e4m3fn`; vLLM's `fp8` on NVIDIA GPUs).
    Fp8E4m3 = 1,
    /// E4M3 with no negative zero (`float8_e4m3fnuz`; vLLM's `fp8` on MI300X).
    Fp8E4m3Fnuz = 2,
    /// OCP E5M2 (`float8_e5m2`).
    Fp8E5m2 = 3,
}

/// How a call's config was found.
pub type KtMatch = Match;

/// Dispatch statistics.
pub type KtStats = Stats;

/// A dispatcher. Create with kt_open(), release with kt_free(). Thread-safe: one handle may
/// serve many threads.
#[derive(Debug)]
pub struct KtDispatcher {
    inner: Dispatcher,
}

/// A flash attention prefill problem (see the kerntune README for layouts).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KtFlashProblem {
    pub batch: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub causal: bool,
    /// Softmax scale; 0 means 1/sqrt(head_dim).
    pub scale: f32,
    pub dtype: KtDtype,
    /// A sliding window (causal only): each query sees the `window` keys ending at its own
    /// position, itself included (FlashAttention's `window_size = (window - 1, 0)`); 0 for
    /// every key the mask leaves it.
    pub window: usize,
    /// Attention sinks (gpt-oss): `q_heads` floats, each query head's learned logit, which
    /// joins its softmax as a key whose value is zero, in the units of the scaled scores;
    /// host memory for kt_flash_attention(), device memory of the GPU for
    /// kt_gpu_flash_attention(). NULL for none. Problems with and without sinks are tuned
    /// apart, each finding its own winners.
    pub sinks: *const f32,
    /// A logit soft-cap (Gemma 2's `attn_logit_softcapping`): each scaled score `s` becomes
    /// `softcap · tanh(s / softcap)` before the mask; 0 for none.
    pub softcap: f32,
    /// Values per value head and output row; 0 means `head_dim`. Below `head_dim`, value heads
    /// narrower than the keys, as multi-head latent attention's prefill has (DeepSeek-V2 and
    /// V3, Kimi K2: keys of 192, values of 128): V `[batch, kv_len, kv_heads, v_head_dim]`,
    /// the output `[batch, q_len, q_heads, v_head_dim]`.
    pub v_head_dim: usize,
    /// ALiBi (Bloom, MPT, Baichuan 13B, Falcon-RW, JAIS; causal only): `q_heads` floats, each
    /// query head's slope `m`, and the score of the query at position `pos` for key `j`
    /// gains `m · (j − pos)` after the soft-cap (vLLM's `alibi_slopes`: a tensor-parallel
    /// rank passes its own heads'); host or device memory as `sinks`. NULL for none. Problems
    /// with and without ALiBi are tuned apart.
    pub alibi_slopes: *const f32,
}

/// A paged attention decode problem (vLLM cache layout).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KtPagedProblem {
    pub num_seqs: usize,
    /// The longest context any sequence of the call has.
    pub context_len: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Softmax scale; 0 means 1/sqrt(head_dim).
    pub scale: f32,
    pub dtype: KtDtype,
    /// A sliding window: each sequence's new token sees the last `window` tokens of its
    /// context, itself included; 0 for the whole context.
    pub window: usize,
    /// Attention sinks (gpt-oss): `q_heads` floats, as in KtFlashProblem (host memory for
    /// kt_paged_attention(), device memory for kt_gpu_paged_attention()); NULL for none.
    pub sinks: *const f32,
    /// A logit soft-cap, as in KtFlashProblem; 0 for none.
    pub softcap: f32,
    /// What the caches hold: AUTO (the query's dtype), or one byte of fp8 per value under an
    /// f16 or bf16 query.
    pub kv_dtype: KtKvCacheDtype,
    /// fp8 caches: each cached key is its fp8 value times `k_scale`, each value its times
    /// `v_scale` (vLLM's per-layer scales). 0 means 1; other caches take 0 or 1.
    pub k_scale: f32,
    pub v_scale: f32,
    /// Values per output row; 0 means `head_dim`. Below `head_dim`, multi-head latent
    /// attention's decode (DeepSeek-V2 and V3, Kimi K2): one latent cache whose rows are the
    /// keys and whose values are each row's first `v_head_dim`; the value cache is then NULL
    /// (or the key cache again), the output `[num_seqs, q_heads, v_head_dim]`, and an fp8
    /// cache's `v_scale` must equal its `k_scale` (or be 0).
    pub v_head_dim: usize,
    /// ALiBi: `q_heads` slopes, as in KtFlashProblem; the score of token `t` of a context of
    /// `ctx` gains `m · (t − (ctx − 1))`. NULL for none; not on a latent cache.
    pub alibi_slopes: *const f32,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_error(msg: impl Into<String>) {
    let msg = CString::new(msg.into().replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
}

/// Runs an entry point's body, turning errors and panics into a status and a message.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), (KtStatus, String)>) -> KtStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => KtStatus::Ok,
        Ok(Err((status, msg))) => {
            set_error(msg);
            status
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            set_error(format!("internal error (please report): {msg}"));
            KtStatus::Panic
        }
    }
}

pub(crate) fn invalid(msg: impl Into<String>) -> (KtStatus, String) {
    (KtStatus::InvalidArgument, msg.into())
}

pub(crate) fn dtype(d: KtDtype) -> DType {
    match d {
        KtDtype::F32 => DType::F32,
        KtDtype::F16 => DType::F16,
        KtDtype::Bf16 => DType::Bf16,
        KtDtype::Fp8E4m3 => DType::Fp8(Fp8::E4m3),
        KtDtype::Fp8E4m3Fnuz => DType::Fp8(Fp8::E4m3Fnuz),
        KtDtype::Fp8E5m2 => DType::Fp8(Fp8::E5m2),
    }
}

fn scale(s: f32, head_dim: usize) -> Result<Scale, (KtStatus, String)> {
    if s == 0.0 {
        return Ok(Scale::default_for(head_dim.max(1)));
    }
    Scale::new(s).ok_or_else(|| {
        invalid(format!(
            "scale {s} must be finite and positive, or 0 for 1/sqrt(head_dim)"
        ))
    })
}

pub(crate) fn flash_problem(f: &KtFlashProblem) -> Result<FlashProblem, (KtStatus, String)> {
    FlashProblem::new(
        f.batch,
        f.q_len,
        f.kv_len,
        f.q_heads,
        f.kv_heads,
        f.head_dim,
        f.causal,
        scale(f.scale, f.head_dim)?,
        dtype(f.dtype),
    )
    .and_then(|p| match f.v_head_dim {
        0 => Ok(p),
        v => p.with_v_head_dim(v),
    })
    .and_then(|p| p.with_window((f.window > 0).then_some(f.window)))
    .map(|p| p.with_sinks(!f.sinks.is_null()))
    .and_then(|p| p.with_softcap((f.softcap != 0.0).then_some(f.softcap)))
    .and_then(|p| p.with_alibi(!f.alibi_slopes.is_null()))
    .map_err(|e| invalid(e.to_string()))
}

pub(crate) fn paged_problem(f: &KtPagedProblem) -> Result<PagedProblem, (KtStatus, String)> {
    PagedProblem::new(
        f.num_seqs,
        f.context_len,
        f.q_heads,
        f.kv_heads,
        f.head_dim,
        f.block_size,
        scale(f.scale, f.head_dim)?,
        dtype(f.dtype),
    )
    .and_then(|p| {
        let kv = match f.kv_dtype {
            KtKvCacheDtype::Auto => p.dtype,
            KtKvCacheDtype::Fp8E4m3 => DType::Fp8(Fp8::E4m3),
            KtKvCacheDtype::Fp8E4m3Fnuz => DType::Fp8(Fp8::E4m3Fnuz),
            KtKvCacheDtype::Fp8E5m2 => DType::Fp8(Fp8::E5m2),
        };
        p.with_kv_dtype(kv)
    })
    .and_then(|p| match f.v_head_dim {
        0 => Ok(p),
        v => p.with_v_head_dim(v),
    })
    .and_then(|p| p.with_window((f.window > 0).then_some(f.window)))
    .map(|p| p.with_sinks(!f.sinks.is_null()))
    .and_then(|p| p.with_softcap((f.softcap != 0.0).then_some(f.softcap)))
    .and_then(|p| p.with_alibi(!f.alibi_slopes.is_null()))
    .map_err(|e| invalid(e.to_string()))
}

/// A paged problem's cache scales, 0 read as 1, checked against its caches.
pub(crate) fn kv_scales(
    f: &KtPagedProblem,
    p: &PagedProblem,
) -> Result<KvScales, (KtStatus, String)> {
    let one = |v: f32| if v == 0.0 { 1.0 } else { v };
    let k = one(f.k_scale);
    // A latent cache has one scale: a `v_scale` left 0 takes `k_scale`.
    let v = if p.is_latent() && f.v_scale == 0.0 {
        k
    } else {
        one(f.v_scale)
    };
    let s = KvScales { k, v };
    s.check(p).map_err(|e| invalid(e.to_string()))?;
    Ok(s)
}

/// The value cache a paged call reads: `value_cache`, or for a latent problem (values read
/// from the key rows) the key cache's address, standing for an empty one, where the caller
/// passed NULL or the key cache; another buffer there would be ignored, so it is refused.
pub(crate) fn latent_values(
    p: &PagedProblem,
    key_cache: *const c_void,
    value_cache: *const c_void,
) -> Result<*const c_void, (KtStatus, String)> {
    if !p.is_latent() {
        return Ok(value_cache);
    }
    if !value_cache.is_null() && value_cache != key_cache {
        return Err(invalid(format!(
            "value_cache: with v_head_dim = {} below head_dim = {} the problem reads one latent cache, its values the first v_head_dim of each key row; pass NULL (or the key cache) as value_cache",
            p.v_head_dim, p.head_dim
        )));
    }
    Ok(key_cache)
}

/// The per-head floats (sink logits, ALiBi slopes) `values` points to: `q_heads` of them, or
/// none where NULL.
///
/// # Safety
/// `values` is NULL or valid for `q_heads` floats.
unsafe fn per_head<'a>(values: *const f32, q_heads: usize) -> &'a [f32] {
    if values.is_null() {
        return &[];
    }
    // SAFETY: caller contract.
    unsafe { std::slice::from_raw_parts(values, q_heads) }
}

/// A GEMM's scales from the C arguments, as [`floats`] reads each.
///
/// # Safety
/// Each pointer must be NULL or valid for its length in floats.
unsafe fn gemm_scales<'a>(
    a: *const f32,
    a_len: usize,
    b: *const f32,
    b_len: usize,
) -> Result<GemmScales<'a>, (KtStatus, String)> {
    // SAFETY: caller contract.
    unsafe {
        Ok(GemmScales {
            a: values("a_scales", a, a_len)?,
            b: values("b_scales", b, b_len)?,
            zeros: &[],
        })
    }
}

/// `len` values at `ptr` (scales, zero points, a checkpoint's words); NULL stands for none,
/// and is refused where `len` is not 0.
///
/// # Safety
/// `ptr` must be NULL or valid for `len` values.
pub(crate) unsafe fn values<'a, T>(
    name: &str,
    ptr: *const T,
    len: usize,
) -> Result<&'a [T], (KtStatus, String)> {
    match (ptr.is_null(), len) {
        (_, 0) => Ok(&[]),
        (true, _) => Err(invalid(format!("`{name}` is NULL with a length of {len}"))),
        // SAFETY: caller contract.
        (false, _) => Ok(unsafe { std::slice::from_raw_parts(ptr, len) }),
    }
}

/// # Safety
/// `ptr` must be NULL or valid for `len` elements of `dtype`.
unsafe fn tensor<'a>(
    name: &str,
    ptr: *const c_void,
    len: usize,
    dtype: DType,
) -> Result<Tensor<'a>, (KtStatus, String)> {
    if ptr.is_null() {
        return Err(invalid(format!("`{name}` is NULL")));
    }
    // SAFETY: caller contract.
    Ok(unsafe {
        match dtype {
            DType::F32 => Tensor::F32(std::slice::from_raw_parts(ptr.cast::<f32>(), len)),
            DType::F16 => Tensor::F16(std::slice::from_raw_parts(ptr.cast::<f16>(), len)),
            DType::Bf16 => Tensor::Bf16(std::slice::from_raw_parts(ptr.cast::<bf16>(), len)),
            DType::Fp8(f) => Tensor::Fp8(f, std::slice::from_raw_parts(ptr.cast::<u8>(), len)),
        }
    })
}

/// # Safety
/// `ptr` must be NULL or valid for `len` writable floats.
unsafe fn out<'a>(
    name: &str,
    ptr: *mut f32,
    len: usize,
) -> Result<&'a mut [f32], (KtStatus, String)> {
    if ptr.is_null() {
        return Err(invalid(format!("`{name}` is NULL")));
    }
    // SAFETY: caller contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

fn dispatcher<'a>(d: *const KtDispatcher) -> Result<&'a Dispatcher, (KtStatus, String)> {
    // SAFETY: a non-NULL handle comes from kt_open and is alive until kt_free.
    unsafe { d.as_ref() }
        .map(|d| &d.inner)
        .ok_or_else(|| invalid("dispatcher handle is NULL"))
}

pub(crate) fn report(matched: *mut KtMatch, m: Match) {
    if !matched.is_null() {
        // SAFETY: a non-NULL `matched` points to writable memory (documented).
        unsafe { *matched = m };
    }
}

/// The library's C ABI version: a program built against this header checks that it equals
/// KERNTUNE_ABI_VERSION before any other call (a mismatch: rebuild against the library's own
/// header).
#[no_mangle]
pub extern "C" fn kt_abi_version() -> u32 {
    KERNTUNE_ABI_VERSION
}

/// The message of the last failed call on this thread ("" if none). Valid until the next
/// failing call on the same thread.
#[no_mangle]
pub extern "C" fn kt_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Opens a tuning database for the host CPU and stores a new handle in `*out`. A missing or
/// unreadable database is not an error: the dispatcher runs on default configs (kt_note()
/// says why).
///
/// # Safety
/// `db_path` is a NUL-terminated path; `out` points to writable memory.
#[no_mangle]
pub unsafe extern "C" fn kt_open(db_path: *const c_char, out: *mut *mut KtDispatcher) -> KtStatus {
    guard(|| {
        if db_path.is_null() || out.is_null() {
            return Err(invalid("kt_open needs a path and an output pointer"));
        }
        // SAFETY: caller contract.
        let path = unsafe { CStr::from_ptr(db_path) }
            .to_str()
            .map_err(|_| invalid("db_path is not UTF-8"))?;
        let handle = Box::new(KtDispatcher {
            inner: Dispatcher::open(path),
        });
        // SAFETY: caller contract.
        unsafe { *out = Box::into_raw(handle) };
        Ok(())
    })
}

/// Releases a handle; NULL is accepted and ignored.
///
/// # Safety
/// `d` is NULL or a handle from kt_open() not yet freed.
#[no_mangle]
pub unsafe extern "C" fn kt_free(d: *mut KtDispatcher) {
    // SAFETY: caller contract.
    unsafe { free_handle(d) }
}

/// Drops a handle made by `Box::into_raw`; NULL is ignored, a panic in a destructor stays on
/// this side of the boundary.
///
/// # Safety
/// `p` is NULL or came from `Box::into_raw` and is not yet freed.
pub(crate) unsafe fn free_handle<T>(p: *mut T) {
    if !p.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: caller contract.
            drop(unsafe { Box::from_raw(p) })
        }));
    }
}

/// Why the dispatcher runs on defaults, or "" when it loaded a database. Valid until the next
/// failing call on this thread.
///
/// # Safety
/// `d` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn kt_note(d: *const KtDispatcher) -> *const c_char {
    let note = dispatcher(d)
        .ok()
        .and_then(|d| d.note())
        .unwrap_or_default();
    set_error(note);
    kt_last_error()
}

/// `C[m, n] = A[m, k] · B` where B is `[n, k]` (`b_is_nk`, a Linear layer's weights) or
/// `[k, n]`. A and B are of `dtype` (f32, f16 or bf16: fp8 GEMMs take scales, through
/// kt_gemm_scaled()), C is float. `*matched` (if not NULL) tells how the config was found.
///
/// # Safety
/// Buffers must hold m·k, k·n and m·n elements.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kt_gemm(
    d: *const KtDispatcher,
    m: usize,
    n: usize,
    k: usize,
    dtype_: KtDtype,
    b_is_nk: bool,
    a: *const c_void,
    b: *const c_void,
    c: *mut f32,
    matched: *mut KtMatch,
) -> KtStatus {
    guard(|| {
        let d = dispatcher(d)?;
        let p = gemm_problem(m, n, k, dtype_, b_is_nk)?;
        if p.fp8().is_some() {
            return Err(invalid(format!(
                "dtype {} takes scales: call kt_gemm_scaled() with A's and B's",
                p.dtype
            )));
        }
        // SAFETY: caller contract on sizes.
        unsafe { run_gemm(d, p, a, b, GemmScales::NONE, c, matched) }
    })
}

/// An fp8 GEMM (W8A8), as vLLM's `cutlass_scaled_mm`: `C[i, j] = a_scales[i] · b_scales[j]
/// · Σ_p A[i, p] · B[p, j]` with A and B of an fp8 `dtype`, B `[n, k]` (`b_is_nk`) or `[k,
/// n]`. `a_scales` holds 1 (per tensor) or m (per token) floats, `b_scales` 1 or n (per
/// output channel), as `a_scales_len` and `b_scales_len` say; every scale finite and
/// positive. For f32, f16 and bf16 inputs both lengths are 0 (the pointers may be NULL) and
/// this is kt_gemm().
///
/// # Safety
/// Buffers must hold m·k, k·n and m·n elements, the scales their lengths in floats.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kt_gemm_scaled(
    d: *const KtDispatcher,
    m: usize,
    n: usize,
    k: usize,
    dtype_: KtDtype,
    b_is_nk: bool,
    a: *const c_void,
    a_scales: *const f32,
    a_scales_len: usize,
    b: *const c_void,
    b_scales: *const f32,
    b_scales_len: usize,
    c: *mut f32,
    matched: *mut KtMatch,
) -> KtStatus {
    guard(|| {
        let d = dispatcher(d)?;
        let p = gemm_problem(m, n, k, dtype_, b_is_nk)?;
        // SAFETY: caller contract on lengths.
        let scales = unsafe { gemm_scales(a_scales, a_scales_len, b_scales, b_scales_len)? };
        // SAFETY: caller contract on sizes.
        unsafe { run_gemm(d, p, a, b, scales, c, matched) }
    })
}

/// A block-scaled fp8 GEMM (W8A8 with DeepSeek-V3's scales: `weight_block_size` = [block,
/// block], activations quantized per token and `block` values of k, as vLLM's
/// `per_token_group_quant_fp8` writes them): `C[i, j] = Σ_g a_scales[i][g] · b_scales[j /
/// block][g] · Σ_{p in group g} A[i, p] · B[j, p]`, B `[n, k]`. `a_scales` holds m rows of
/// ⌈k / block⌉ floats, `b_scales` ⌈n / block⌉ rows of ⌈k / block⌉ (a checkpoint's
/// `weight_scale_inv`), as `a_scales_len` and `b_scales_len` say; every scale finite and
/// positive; `block` a multiple of 32 (the checkpoints' 128).
///
/// # Safety
/// Buffers must hold m·k, n·k and m·n elements, the scales their lengths in floats.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kt_gemm_block_scaled(
    d: *const KtDispatcher,
    m: usize,
    n: usize,
    k: usize,
    dtype_: KtDtype,
    block: usize,
    a: *const c_void,
    a_scales: *const f32,
    a_scales_len: usize,
    b: *const c_void,
    b_scales: *const f32,
    b_scales_len: usize,
    c: *mut f32,
    matched: *mut KtMatch,
) -> KtStatus {
    guard(|| {
        let d = dispatcher(d)?;
        let p = gemm_problem(m, n, k, dtype_, true)?
            .with_block(block)
            .map_err(|e| invalid(e.to_string()))?;
        // SAFETY: caller contract on lengths.
        let scales = unsafe { gemm_scales(a_scales, a_scales_len, b_scales, b_scales_len)? };
        // SAFETY: caller contract on sizes.
        unsafe { run_gemm(d, p, a, b, scales, c, matched) }
    })
}

/// An int4 GEMM (W4A16: GPTQ's, AWQ's and compressed-tensors' 4-bit weights): `C[i, j] =
/// Σ_p A[i, p] · scales[p / group][j] · (q[p, j] − zeros[p / group][j])`, A `[m, k]` of `dtype`
/// (f32, f16 or bf16), the weights `b_words` GPTQ's `qweight`: `[k / 8, n]` 32-bit words,
/// word `(r, j)` holding `q[8r + i, j]` in bits `4i..4i + 4`, unsigned (AWQ's `[k, n / 8]`
/// words, whose values are interleaved, are repacked to it once as the model loads:
/// kt_int4_words()). `scales` and `zeros` are `[k / group, n]` floats (`scales_len`,
/// `zeros_len`: the checkpoint's `scales` widened and its `qzeros` as kt_int4_zeros() unpacks
/// them, GPTQ's plus one; `zeros` NULL with a length of 0 for symmetric checkpoints, whose zero
/// point is 8); `group` a multiple of 8 that divides `k` (`k` itself for one group).
///
/// # Safety
/// Buffers must hold m·k elements, k / 8 · n words and m·n floats, the scales and zero points
/// their lengths in floats.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kt_gemm_int4(
    d: *const KtDispatcher,
    m: usize,
    n: usize,
    k: usize,
    dtype_: KtDtype,
    group: usize,
    a: *const c_void,
    b_words: *const u32,
    scales: *const f32,
    scales_len: usize,
    zeros: *const f32,
    zeros_len: usize,
    c: *mut f32,
    matched: *mut KtMatch,
) -> KtStatus {
    guard(|| {
        let d = dispatcher(d)?;
        let p = gemm_problem(m, n, k, dtype_, false)?
            .with_int4(group)
            .map_err(|e| invalid(e.to_string()))?;
        // SAFETY: caller contract on lengths.
        let given = unsafe {
            GemmScales::int4(
                values("scales", scales, scales_len)?,
                values("zeros", zeros, zeros_len)?,
            )
        };
        // SAFETY: caller contract on sizes.
        unsafe { run_gemm(d, p, a, b_words.cast(), given, c, matched) }
    })
}

pub(crate) fn gemm_problem(
    m: usize,
    n: usize,
    k: usize,
    dtype_: KtDtype,
    b_is_nk: bool,
) -> Result<GemmProblem, (KtStatus, String)> {
    let layout = if b_is_nk { BLayout::Nk } else { BLayout::Kn };
    GemmProblem::new(m, n, k, dtype(dtype_), layout).map_err(|e| invalid(e.to_string()))
}

/// # Safety
/// `a`, `b` and `c` hold the problem's m·k, k·n (an int4 problem's k / 8 · n words) and m·n
/// elements.
unsafe fn run_gemm(
    d: &Dispatcher,
    p: GemmProblem,
    a: *const c_void,
    b: *const c_void,
    scales: GemmScales<'_>,
    c: *mut f32,
    matched: *mut KtMatch,
) -> Result<(), (KtStatus, String)> {
    // The scales' counts and values are the call's mistakes, not the kernel's.
    scales.check(&p).map_err(|e| invalid(e.to_string()))?;
    let (m, n, k) = (p.m, p.n, p.k);
    // SAFETY: caller contract on sizes.
    let args = unsafe {
        GemmArgs {
            a: tensor("a", a, m * k, p.dtype)?,
            b: match p.int4 {
                Some(_) if b.is_null() => return Err(invalid("`b_words` is NULL".to_string())),
                Some(_) => Tensor::Int4(std::slice::from_raw_parts(b.cast(), p.b_len())),
                None => tensor("b", b, k * n, p.dtype)?,
            },
            scales,
            c: out("c", c, m * n)?,
        }
    };
    let how = d
        .gemm(&Problem::Gemm(p), args)
        .map_err(|e| (KtStatus::KernelError, e.to_string()))?;
    report(matched, how);
    Ok(())
}

/// Flash attention prefill: Q `[batch, q_len, q_heads, head_dim]`, K `[batch, kv_len,
/// kv_heads, head_dim]`, V `[batch, kv_len, kv_heads, v_head_dim]`, O `[batch, q_len,
/// q_heads, v_head_dim]`.
///
/// # Safety
/// `problem` points to a problem; buffers hold the sizes it implies.
#[no_mangle]
pub unsafe extern "C" fn kt_flash_attention(
    d: *const KtDispatcher,
    problem: *const KtFlashProblem,
    q: *const c_void,
    k: *const c_void,
    v: *const c_void,
    o: *mut f32,
    matched: *mut KtMatch,
) -> KtStatus {
    guard(|| {
        let d = dispatcher(d)?;
        // SAFETY: caller contract.
        let f = unsafe { problem.as_ref() }.ok_or_else(|| invalid("problem is NULL"))?;
        let p = flash_problem(f)?;
        // SAFETY: caller contract on sizes.
        let args = unsafe {
            FlashArgs {
                q: tensor("q", q, p.q_len_elems(), p.dtype)?,
                k: tensor("k", k, p.kv_len_elems(), p.dtype)?,
                v: tensor("v", v, p.v_len_elems(), p.dtype)?,
                sinks: per_head(f.sinks, p.q_heads),
                slopes: per_head(f.alibi_slopes, p.q_heads),
                out: out("o", o, p.out_len())?,
            }
        };
        let how = d
            .flash_attention(&Problem::Flash(p), args)
            .map_err(|e| (KtStatus::KernelError, e.to_string()))?;
        report(matched, how);
        Ok(())
    })
}

/// Paged attention decode: query `[num_seqs, q_heads, head_dim]`, output `[num_seqs, q_heads,
/// v_head_dim]`, caches `[num_blocks, block_size, kv_heads, head_dim]` (a latent problem's
/// `value_cache` NULL or the key cache), `block_tables` `[num_seqs, max_blocks]`,
/// `context_lens` `[num_seqs]`.
///
/// # Safety
/// `problem` points to a problem; buffers hold the sizes it implies.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kt_paged_attention(
    d: *const KtDispatcher,
    problem: *const KtPagedProblem,
    query: *const c_void,
    key_cache: *const c_void,
    value_cache: *const c_void,
    num_blocks: usize,
    block_tables: *const u32,
    max_blocks: usize,
    context_lens: *const u32,
    o: *mut f32,
    matched: *mut KtMatch,
) -> KtStatus {
    guard(|| {
        let d = dispatcher(d)?;
        // SAFETY: caller contract.
        let f = unsafe { problem.as_ref() }.ok_or_else(|| invalid("problem is NULL"))?;
        let p = paged_problem(f)?;
        if block_tables.is_null() || context_lens.is_null() {
            return Err(invalid("block_tables and context_lens must not be NULL"));
        }
        let kv_scales = kv_scales(f, &p)?;
        let cache = num_blocks * p.block_size * p.kv_heads * p.head_dim;
        let value_cache = latent_values(&p, key_cache, value_cache)?;
        // SAFETY: caller contract on sizes.
        let args = unsafe {
            PagedArgs {
                query: tensor("query", query, p.query_len(), p.dtype)?,
                key_cache: tensor("key_cache", key_cache, cache, p.kv_dtype)?,
                // A latent problem's is empty (its values are the key rows').
                value_cache: tensor(
                    "value_cache",
                    value_cache,
                    num_blocks * p.block_size * p.kv_heads * p.cached_v_dim(),
                    p.kv_dtype,
                )?,
                block_tables: std::slice::from_raw_parts(block_tables, p.num_seqs * max_blocks),
                max_blocks_per_seq: max_blocks,
                context_lens: std::slice::from_raw_parts(context_lens, p.num_seqs),
                sinks: per_head(f.sinks, p.q_heads),
                slopes: per_head(f.alibi_slopes, p.q_heads),
                kv_scales,
                out: out("o", o, p.out_len())?,
            }
        };
        let how = d
            .paged_attention(&Problem::Paged(p), args)
            .map_err(|e| (KtStatus::KernelError, e.to_string()))?;
        report(matched, how);
        Ok(())
    })
}

/// Copies the dispatch statistics into `*out`.
///
/// # Safety
/// `d` is a live handle and `out` writable.
#[no_mangle]
pub unsafe extern "C" fn kt_stats(d: *const KtDispatcher, out: *mut KtStats) -> KtStatus {
    guard(|| {
        let d = dispatcher(d)?;
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        // SAFETY: caller contract.
        unsafe { *out = d.stats() };
        Ok(())
    })
}

/// Re-reads the database; calls on other threads continue meanwhile.
///
/// # Safety
/// `d` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn kt_reload(d: *const KtDispatcher) -> KtStatus {
    guard(|| {
        dispatcher(d)?
            .reload()
            .map_err(|e| (KtStatus::IoError, e.to_string()))
    })
}

/// Adds the problems seen without an exact winner, and their calls, to the file at `path` (for
/// `tune --shapes untuned:PATH`): the file is merged under a lock, so that every worker of a
/// server may name the same one.
///
/// # Safety
/// `d` is a live handle; `path` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn kt_write_untuned(d: *const KtDispatcher, path: *const c_char) -> KtStatus {
    guard(|| {
        let d = dispatcher(d)?;
        // SAFETY: caller contract.
        let path = unsafe { path_arg(path) }?;
        d.write_untuned(path)
            .map(|_| ())
            .map_err(|e| (KtStatus::IoError, e.to_string()))
    })
}

/// A file path argument as UTF-8, refused by name when NULL or not UTF-8.
///
/// # Safety
/// `path` is NULL or NUL-terminated, alive for `'a`.
pub(crate) unsafe fn path_arg<'a>(path: *const c_char) -> Result<&'a str, (KtStatus, String)> {
    if path.is_null() {
        return Err(invalid("path is NULL"));
    }
    // SAFETY: caller contract.
    unsafe { CStr::from_ptr(path) }
        .to_str()
        .map_err(|_| invalid("path is not UTF-8"))
}
