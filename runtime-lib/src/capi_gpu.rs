//! The C ABI of [`GpuDispatcher`]: device memory and a stream instead of host buffers. Device
//! addresses are `const void *` (what `hipMalloc` and `cudaMalloc` return), streams `void *`
//! (`hipStream_t`, `cudaStream_t`; NULL for the default stream). Calls queue the kernel and
//! return without waiting. Layouts are those of the host calls in [`crate::capi`].

use std::ffi::{c_char, c_void, CStr};

use kerntune_kernels::gpu::launch::{DevicePtrs, GemmScalePtrs};
use kerntune_kernels::{GemmProblem, KernelError, Problem};

use crate::capi::{
    flash_problem, free_handle, gemm_problem, guard, invalid, kt_last_error, kv_scales,
    latent_values, paged_problem, path_arg, report, set_error, KtDtype, KtFlashProblem, KtMatch,
    KtPagedProblem, KtStats, KtStatus,
};
use crate::{GpuDispatcher, GpuStats, RuntimeError};

/// What a GPU dispatcher holds on its device: builds the winners launch, winners without
/// compiled code or that the device refused, and builds kept loaded since it opened.
pub type KtGpuStats = GpuStats;

/// A GPU dispatcher. Create with kt_gpu_open(), release with kt_gpu_free(). Thread-safe.
///
/// Launches check the buffers' addresses first: a tuned kernel that reads its inputs in
/// 16-byte pieces needs each to start on a 16-byte boundary, the others on their element
/// size, and one that stores its results in pairs (the mma and wgmma GEMMs) needs C on an
/// 8-byte boundary; a misaligned one returns KT_STATUS_INVALID_ARGUMENT naming it, and
/// nothing runs.
#[derive(Debug)]
pub struct KtGpuDispatcher {
    inner: GpuDispatcher,
}

impl KtGpuDispatcher {
    /// A handle for C code of a Rust host that opened its dispatcher itself (with a device
    /// of its own, [`GpuDispatcher::with_device`]); release it with kt_gpu_free().
    pub fn into_raw(inner: GpuDispatcher) -> *mut KtGpuDispatcher {
        Box::into_raw(Box::new(KtGpuDispatcher { inner }))
    }
}

fn gpu<'a>(d: *const KtGpuDispatcher) -> Result<&'a GpuDispatcher, (KtStatus, String)> {
    // SAFETY: a non-NULL handle comes from kt_gpu_open and is alive until kt_gpu_free.
    unsafe { d.as_ref() }
        .map(|d| &d.inner)
        .ok_or_else(|| invalid("GPU dispatcher handle is NULL"))
}

fn status(e: RuntimeError) -> (KtStatus, String) {
    let code = match &e {
        RuntimeError::NoGpuKernel { .. } => KtStatus::NotTuned,
        RuntimeError::Kernel(KernelError::BackendUnavailable { .. }) => KtStatus::NoDevice,
        // The kernel faulted; the message says the device is gone for the process.
        RuntimeError::Kernel(KernelError::DeviceLost { .. }) => KtStatus::KernelError,
        RuntimeError::Kernel(_) | RuntimeError::NoScratch { .. } => KtStatus::InvalidArgument,
        _ => KtStatus::KernelError,
    };
    (code, e.to_string())
}

fn addr(name: &str, p: *const c_void) -> Result<u64, (KtStatus, String)> {
    if p.is_null() {
        return Err(invalid(format!("`{name}` is NULL")));
    }
    Ok(p as usize as u64)
}

/// Launches `problem` with the dispatcher's tuned kernel.
///
/// # Safety
/// As [`GpuDispatcher::launch`].
unsafe fn launch(
    d: &GpuDispatcher,
    problem: &Problem,
    ptrs: &DevicePtrs,
    (scratch, scratch_bytes): (*mut c_void, usize),
    stream: *mut c_void,
    matched: *mut KtMatch,
) -> Result<(), (KtStatus, String)> {
    let scratch = scratch as usize as u64;
    // SAFETY: the caller's promise, passed on.
    let how = unsafe {
        d.launch(
            problem,
            ptrs,
            scratch,
            scratch_bytes,
            stream as usize as u64,
        )
    }
    .map_err(status)?;
    report(matched, how);
    Ok(())
}

/// Opens GPU 0 (after HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES), which must be a `device`
/// ("mi250", "mi300x", "h100", ...), loads its winners and their compiled kernels from
/// `db_path`, and stores a new handle in `*out`. KT_STATUS_NO_DEVICE when there is no such
/// GPU or this library lacks its vendor's backend.
///
/// # Safety
/// `db_path` and `device` are NUL-terminated; `out` points to writable memory.
#[no_mangle]
pub unsafe extern "C" fn kt_gpu_open(
    db_path: *const c_char,
    device: *const c_char,
    out: *mut *mut KtGpuDispatcher,
) -> KtStatus {
    // SAFETY: caller contract, passed on.
    unsafe { kt_gpu_open_on(db_path, device, 0, out) }
}

/// As kt_gpu_open(), on GPU `ordinal` of those the process sees: for a server whose
/// tensor-parallel workers each drive one of several GPUs they all see. The handle's kernels
/// are loaded on that GPU, and its calls take streams of that GPU.
///
/// # Safety
/// As kt_gpu_open().
#[no_mangle]
pub unsafe extern "C" fn kt_gpu_open_on(
    db_path: *const c_char,
    device: *const c_char,
    ordinal: usize,
    out: *mut *mut KtGpuDispatcher,
) -> KtStatus {
    guard(|| {
        if db_path.is_null() || device.is_null() || out.is_null() {
            return Err(invalid(
                "kt_gpu_open needs a path, a device name and an output pointer",
            ));
        }
        // SAFETY: caller contract.
        let (path, name) = unsafe { (CStr::from_ptr(db_path), CStr::from_ptr(device)) };
        let path = path.to_str().map_err(|_| invalid("db_path is not UTF-8"))?;
        let name = name.to_str().map_err(|_| invalid("device is not UTF-8"))?;
        let inner = GpuDispatcher::open_on(path, name, ordinal).map_err(|e| match e {
            RuntimeError::Kernel(KernelError::UnknownDevice { .. }) => invalid(e.to_string()),
            e => status(e),
        })?;
        // SAFETY: caller contract.
        unsafe { *out = Box::into_raw(Box::new(KtGpuDispatcher { inner })) };
        Ok(())
    })
}

/// Releases a handle; NULL is accepted and ignored. Wait for its launches first.
///
/// # Safety
/// `d` is NULL or a handle from kt_gpu_open() not yet freed.
#[no_mangle]
pub unsafe extern "C" fn kt_gpu_free(d: *mut KtGpuDispatcher) {
    // SAFETY: caller contract.
    unsafe { free_handle(d) }
}

/// `C[m, n] = A[m, k] · B` on the device, B `[n, k]` (`b_is_nk`) or `[k, n]`, C float;
/// `scratch` is `scratch_bytes` bytes of device memory (NULL and 0 where the call needs none),
/// at least kt_gpu_gemm_scratch_bytes() of this shape, or the call is refused
/// (KT_STATUS_INVALID_ARGUMENT) with nothing launched.
///
/// # Safety
/// `d` is a live handle; `a`, `b`, `c` are device memory of m·k, k·n and m·n elements on its
/// GPU, `scratch` NULL or `scratch_bytes` bytes of device memory; `stream` is NULL or a
/// stream of that GPU.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kt_gpu_gemm(
    d: *const KtGpuDispatcher,
    m: usize,
    n: usize,
    k: usize,
    dtype_: KtDtype,
    b_is_nk: bool,
    a: *const c_void,
    b: *const c_void,
    c: *mut f32,
    scratch: *mut c_void,
    scratch_bytes: usize,
    stream: *mut c_void,
    matched: *mut KtMatch,
) -> KtStatus {
    guard(|| {
        let d = gpu(d)?;
        let p = gemm_problem(m, n, k, dtype_, b_is_nk)?;
        if p.fp8().is_some() {
            return Err(invalid(format!(
                "dtype {} takes scales: call kt_gpu_gemm_scaled() with A's and B's",
                p.dtype
            )));
        }
        let ptrs = DevicePtrs {
            inputs: [addr("a", a)?, addr("b", b)?, 0],
            out: addr("c", c.cast_const().cast())?,
            ..DevicePtrs::default()
        };
        let scratch = (scratch, scratch_bytes);
        // SAFETY: caller contract.
        unsafe { launch(d, &Problem::Gemm(p), &ptrs, scratch, stream, matched) }
    })
}

/// An fp8 GEMM (W8A8) on the device, as kt_gemm_scaled() on the host: `a_scales` and
/// `b_scales` are device memory of `a_scales_len` (1 or m) and `b_scales_len` (1 or n)
/// floats, which the kernel reads as it stores C. Their values stay on the device unread by
/// the host: each finite and positive is the caller's promise. For f32, f16 and bf16 inputs
/// both lengths are 0 (the pointers may be NULL) and this is kt_gpu_gemm(). Scratch as for
/// kt_gpu_gemm().
///
/// # Safety
/// As kt_gpu_gemm(); `a_scales` and `b_scales` are device memory of their lengths in floats
/// on the same GPU.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kt_gpu_gemm_scaled(
    d: *const KtGpuDispatcher,
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
    scratch: *mut c_void,
    scratch_bytes: usize,
    stream: *mut c_void,
    matched: *mut KtMatch,
) -> KtStatus {
    guard(|| {
        let d = gpu(d)?;
        let p = gemm_problem(m, n, k, dtype_, b_is_nk)?;
        let ptrs = scaled_ptrs(a, (a_scales, a_scales_len), b, (b_scales, b_scales_len), c)?;
        let scratch = (scratch, scratch_bytes);
        // SAFETY: caller contract.
        unsafe { launch(d, &Problem::Gemm(p), &ptrs, scratch, stream, matched) }
    })
}

/// A block-scaled fp8 GEMM on the device, as kt_gemm_block_scaled() on the host (DeepSeek-V3's
/// scales: `a_scales` m rows of ⌈k / block⌉ floats, `b_scales` ⌈n / block⌉ rows of as many, B
/// `[n, k]`), both device memory of `a_scales_len` and `b_scales_len` floats, read by the
/// kernel as it reads each group of k. Its winners are the block-scaled ones (kernels that
/// scale each group of k), never a per-channel GEMM's. Scratch from
/// kt_gpu_gemm_block_scratch_bytes().
///
/// # Safety
/// As kt_gpu_gemm_scaled().
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kt_gpu_gemm_block_scaled(
    d: *const KtGpuDispatcher,
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
    scratch: *mut c_void,
    scratch_bytes: usize,
    stream: *mut c_void,
    matched: *mut KtMatch,
) -> KtStatus {
    guard(|| {
        let d = gpu(d)?;
        let p = block_problem(m, n, k, dtype_, block)?;
        let ptrs = scaled_ptrs(a, (a_scales, a_scales_len), b, (b_scales, b_scales_len), c)?;
        let scratch = (scratch, scratch_bytes);
        // SAFETY: caller contract.
        unsafe { launch(d, &Problem::Gemm(p), &ptrs, scratch, stream, matched) }
    })
}

/// An int4 GEMM (W4A16) on the device, as kt_gemm_int4() on the host: `b_words` GPTQ's
/// `[k / 8, n]` words, `scales` and `zeros` `[k / group, n]` floats (`zeros` NULL with a
/// length of 0 for symmetric checkpoints, whose zero point is 8), all device memory, read by
/// the kernel as it unpacks the words. Its winners are int4 ones (kernels that unpack the
/// words), never a dense GEMM's. Scratch from kt_gpu_gemm_int4_scratch_bytes().
///
/// # Safety
/// As kt_gpu_gemm(); `b_words` holds k / 8 · n words, `scales` and `zeros` their lengths in
/// floats, on the same GPU.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kt_gpu_gemm_int4(
    d: *const KtGpuDispatcher,
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
    scratch: *mut c_void,
    scratch_bytes: usize,
    stream: *mut c_void,
    matched: *mut KtMatch,
) -> KtStatus {
    guard(|| {
        let d = gpu(d)?;
        let p = int4_problem(m, n, k, dtype_, group)?;
        let ptrs = DevicePtrs {
            inputs: [addr("a", a)?, addr("b_words", b_words.cast())?, 0],
            out: addr("c", c.cast_const().cast())?,
            gemm_scales: GemmScalePtrs {
                b: scales as u64,
                b_len: scales_len,
                zeros: zeros as u64,
                zeros_len,
                ..GemmScalePtrs::default()
            },
            ..DevicePtrs::default()
        };
        let scratch = (scratch, scratch_bytes);
        // SAFETY: caller contract.
        unsafe { launch(d, &Problem::Gemm(p), &ptrs, scratch, stream, matched) }
    })
}

/// Device scratch bytes `d`'s winner for `problem` needs; 0 on error, the reason kept for
/// kt_last_error().
fn scratch_bytes(
    d: *const KtGpuDispatcher,
    problem: impl FnOnce() -> Result<Problem, (KtStatus, String)>,
) -> usize {
    let mut bytes = 0;
    guard(|| {
        bytes = gpu(d)?.scratch_bytes(&problem()?);
        Ok(())
    });
    bytes
}

/// An int4 GEMM problem from the C arguments (B GPTQ's `[k / 8, n]` words).
fn int4_problem(
    m: usize,
    n: usize,
    k: usize,
    dtype_: KtDtype,
    group: usize,
) -> Result<GemmProblem, (KtStatus, String)> {
    gemm_problem(m, n, k, dtype_, false)?
        .with_int4(group)
        .map_err(|e| invalid(e.to_string()))
}

/// Device scratch bytes a kt_gpu_gemm_int4() call needs, as kt_gpu_gemm_scratch_bytes() for
/// other GEMMs (int4 winners are their own). 0 on error.
///
/// # Safety
/// `d` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn kt_gpu_gemm_int4_scratch_bytes(
    d: *const KtGpuDispatcher,
    m: usize,
    n: usize,
    k: usize,
    dtype_: KtDtype,
    group: usize,
) -> usize {
    scratch_bytes(d, || {
        Ok(Problem::Gemm(int4_problem(m, n, k, dtype_, group)?))
    })
}

/// The device addresses of a scaled GEMM's operands and scales (their counts are checked
/// against the problem as the launch's arguments are made).
fn scaled_ptrs(
    a: *const c_void,
    (a_scales, a_len): (*const f32, usize),
    b: *const c_void,
    (b_scales, b_len): (*const f32, usize),
    c: *mut f32,
) -> Result<DevicePtrs, (KtStatus, String)> {
    Ok(DevicePtrs {
        inputs: [addr("a", a)?, addr("b", b)?, 0],
        out: addr("c", c.cast_const().cast())?,
        gemm_scales: GemmScalePtrs {
            a: a_scales as u64,
            a_len,
            b: b_scales as u64,
            b_len,
            ..GemmScalePtrs::default()
        },
        ..DevicePtrs::default()
    })
}

/// A block-scaled GEMM problem from the C arguments (B `[n, k]`).
fn block_problem(
    m: usize,
    n: usize,
    k: usize,
    dtype_: KtDtype,
    block: usize,
) -> Result<GemmProblem, (KtStatus, String)> {
    gemm_problem(m, n, k, dtype_, true)?
        .with_block(block)
        .map_err(|e| invalid(e.to_string()))
}

/// Device scratch bytes a kt_gpu_gemm_block_scaled() call needs, as
/// kt_gpu_gemm_scratch_bytes() for other GEMMs (block-scaled winners are their own). 0 on
/// error.
///
/// # Safety
/// `d` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn kt_gpu_gemm_block_scratch_bytes(
    d: *const KtGpuDispatcher,
    m: usize,
    n: usize,
    k: usize,
    dtype_: KtDtype,
    block: usize,
) -> usize {
    scratch_bytes(d, || {
        Ok(Problem::Gemm(block_problem(m, n, k, dtype_, block)?))
    })
}

/// Device scratch bytes a kt_gpu_gemm() call needs: the partial products of a split-K
/// kernel, else 0 (then `scratch` may be NULL). Each shape has its own winner, so a smaller
/// shape may need more (a decode GEMM split 16 ways): size one buffer by the most over the
/// shapes served (every m up to the largest batch: each answer takes nanoseconds), and ask
/// again after a reload. 0 on error.
///
/// # Safety
/// `d` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn kt_gpu_gemm_scratch_bytes(
    d: *const KtGpuDispatcher,
    m: usize,
    n: usize,
    k: usize,
    dtype_: KtDtype,
    b_is_nk: bool,
) -> usize {
    scratch_bytes(d, || {
        Ok(Problem::Gemm(gemm_problem(m, n, k, dtype_, b_is_nk)?))
    })
}

/// Device scratch bytes a kt_gpu_flash_attention() call of `problem` needs: the partial
/// results of a kernel that splits each query tile's keys over several blocks, else 0 (then
/// `scratch` may be NULL). Size one buffer by the most over the problems served (each
/// problem has its own winner) and ask again after a reload. 0 on error.
///
/// # Safety
/// `d` is a live handle; `problem` points to a problem.
#[no_mangle]
pub unsafe extern "C" fn kt_gpu_flash_scratch_bytes(
    d: *const KtGpuDispatcher,
    problem: *const KtFlashProblem,
) -> usize {
    scratch_bytes(d, || {
        // SAFETY: caller contract.
        let f = unsafe { problem.as_ref() }.ok_or_else(|| invalid("problem is NULL"))?;
        Ok(Problem::Flash(flash_problem(f)?))
    })
}

/// Flash attention prefill on the device (layouts as kt_flash_attention()); `scratch` is
/// `scratch_bytes` bytes of device memory (NULL and 0 where the call needs none), at least
/// kt_gpu_flash_scratch_bytes() of this problem, or the call is refused with nothing
/// launched.
///
/// # Safety
/// `d` is a live handle; `problem` points to a problem; the buffers are device memory of its
/// GPU of the sizes the problem implies, `scratch` NULL or `scratch_bytes` bytes of device
/// memory; `stream` is NULL or a stream of that GPU.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kt_gpu_flash_attention(
    d: *const KtGpuDispatcher,
    problem: *const KtFlashProblem,
    q: *const c_void,
    k: *const c_void,
    v: *const c_void,
    o: *mut f32,
    scratch: *mut c_void,
    scratch_bytes: usize,
    stream: *mut c_void,
    matched: *mut KtMatch,
) -> KtStatus {
    guard(|| {
        let d = gpu(d)?;
        // SAFETY: caller contract.
        let f = unsafe { problem.as_ref() }.ok_or_else(|| invalid("problem is NULL"))?;
        let p = flash_problem(f)?;
        let ptrs = DevicePtrs {
            inputs: [addr("q", q)?, addr("k", k)?, addr("v", v)?],
            out: addr("o", o.cast_const().cast())?,
            sinks: f.sinks as u64,
            slopes: f.alibi_slopes as u64,
            ..DevicePtrs::default()
        };
        let scratch = (scratch, scratch_bytes);
        // SAFETY: caller contract.
        unsafe { launch(d, &Problem::Flash(p), &ptrs, scratch, stream, matched) }
    })
}

/// Device scratch bytes a kt_gpu_paged_attention() call of `problem` needs (partial results
/// of the context partitions): size one buffer by the most over the problems served (each
/// has its own winner) and ask again after a reload. 0 on error.
///
/// # Safety
/// `d` is a live handle; `problem` points to a problem.
#[no_mangle]
pub unsafe extern "C" fn kt_gpu_paged_scratch_bytes(
    d: *const KtGpuDispatcher,
    problem: *const KtPagedProblem,
) -> usize {
    scratch_bytes(d, || {
        // SAFETY: caller contract.
        let f = unsafe { problem.as_ref() }.ok_or_else(|| invalid("problem is NULL"))?;
        Ok(Problem::Paged(paged_problem(f)?))
    })
}

/// Paged attention decode on the device (layouts as kt_paged_attention()); `scratch` is
/// `scratch_bytes` bytes of device memory, at least kt_gpu_paged_scratch_bytes() of this
/// problem, or the call is refused with nothing launched.
///
/// # Safety
/// `d` is a live handle; `problem` points to a problem; the buffers are device memory of its
/// GPU of the sizes the problem implies, `scratch` `scratch_bytes` bytes of it; `stream` is
/// NULL or a stream of that GPU.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kt_gpu_paged_attention(
    d: *const KtGpuDispatcher,
    problem: *const KtPagedProblem,
    query: *const c_void,
    key_cache: *const c_void,
    value_cache: *const c_void,
    block_tables: *const u32,
    max_blocks: usize,
    context_lens: *const u32,
    o: *mut f32,
    scratch: *mut c_void,
    scratch_bytes: usize,
    stream: *mut c_void,
    matched: *mut KtMatch,
) -> KtStatus {
    guard(|| {
        let d = gpu(d)?;
        // SAFETY: caller contract.
        let f = unsafe { problem.as_ref() }.ok_or_else(|| invalid("problem is NULL"))?;
        let paged = paged_problem(f)?;
        let kv_scales = kv_scales(f, &paged)?;
        let value_cache = latent_values(&paged, key_cache, value_cache)?;
        let p = Problem::Paged(paged);
        let ptrs = DevicePtrs {
            inputs: [
                addr("query", query)?,
                addr("key_cache", key_cache)?,
                addr("value_cache", value_cache)?,
            ],
            out: addr("o", o.cast_const().cast())?,
            block_tables: addr("block_tables", block_tables.cast())?,
            context_lens: addr("context_lens", context_lens.cast())?,
            max_blocks_per_seq: max_blocks,
            partials: [0; 3],
            sinks: f.sinks as u64,
            slopes: f.alibi_slopes as u64,
            kv_scales,
            gemm_scales: GemmScalePtrs::default(),
        };
        addr("scratch", scratch.cast_const())?;
        // SAFETY: caller contract.
        unsafe { launch(d, &p, &ptrs, (scratch, scratch_bytes), stream, matched) }
    })
}

/// Why the GPU dispatcher has no winners (no database, or none for this device), or "" when
/// it loaded some. Valid until the next failing call on this thread.
///
/// # Safety
/// `d` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn kt_gpu_note(d: *const KtGpuDispatcher) -> *const c_char {
    let note = gpu(d).ok().and_then(|d| d.note()).unwrap_or_default();
    set_error(note);
    kt_last_error()
}

/// Copies the selection counters into `*stats` and what the device holds into `*device`;
/// either may be NULL.
///
/// # Safety
/// `d` is a live handle; `stats` and `device` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kt_gpu_stats(
    d: *const KtGpuDispatcher,
    stats: *mut KtStats,
    device: *mut KtGpuStats,
) -> KtStatus {
    guard(|| {
        let d = gpu(d)?;
        // SAFETY: caller contract: each is NULL or writable.
        unsafe {
            if let Some(out) = stats.as_mut() {
                *out = d.stats();
            }
            if let Some(out) = device.as_mut() {
                *out = d.gpu_stats();
            }
        }
        Ok(())
    })
}

/// Re-reads the database and loads the builds of its winners not loaded yet, then swaps both
/// in at once; calls on other threads go on meanwhile, and a failure leaves the current ones.
/// Builds the new winners no longer launch stay loaded until kt_gpu_free(), so kernels queued
/// before, and CUDA or HIP graphs that captured launches before, still find their code. Ask
/// the kt_gpu_*_scratch_bytes() again after it: the winners may need more.
///
/// # Safety
/// `d` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn kt_gpu_reload(d: *const KtGpuDispatcher) -> KtStatus {
    guard(|| {
        gpu(d)?
            .reload()
            .map_err(|e| (KtStatus::IoError, e.to_string()))
    })
}

/// Adds the problems launched without an exact winner, and their calls, to the file at
/// `path` (for `tune --device <gpu> --shapes untuned:PATH`), merged under a lock as
/// kt_write_untuned() does.
///
/// # Safety
/// `d` is a live handle; `path` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn kt_gpu_write_untuned(
    d: *const KtGpuDispatcher,
    path: *const c_char,
) -> KtStatus {
    guard(|| {
        let d = gpu(d)?;
        // SAFETY: caller contract.
        let path = unsafe { path_arg(path) }?;
        d.write_untuned(path)
            .map(|_| ())
            .map_err(|e| (KtStatus::IoError, e.to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::{kt_gpu_open_on, status, KtStatus};
    use crate::RuntimeError;
    use kerntune_kernels::KernelError;

    /// Opening a GPU other than the first: a missing output pointer is the caller's error, a
    /// host without the device (as here) says so, and no handle is made.
    #[test]
    fn opening_gpu_n_without_it_is_no_device() {
        let (db, device) = (c"none.db", c"h100");
        let mut out = std::ptr::null_mut();
        // SAFETY: NUL-terminated strings; `out` is a local.
        let st = unsafe { kt_gpu_open_on(db.as_ptr(), device.as_ptr(), 3, std::ptr::null_mut()) };
        assert_eq!(st, KtStatus::InvalidArgument);
        // SAFETY: as above.
        let st = unsafe { kt_gpu_open_on(db.as_ptr(), device.as_ptr(), 3, &mut out) };
        assert_eq!(st, KtStatus::NoDevice);
        assert!(out.is_null());
    }

    /// A server told why a GPU call failed: no device, or a kernel that faulted and took the
    /// device with it (every later call fails too), or a bad argument.
    #[test]
    fn gpu_errors_map_to_the_status_a_server_acts_on() {
        let of = |e: KernelError| status(RuntimeError::Kernel(e)).0;
        let unavailable = KernelError::BackendUnavailable {
            backend: "cuda",
            reason: "no CUDA driver".into(),
        };
        assert_eq!(of(unavailable), KtStatus::NoDevice);
        let lost = KernelError::DeviceLost {
            backend: "cuda",
            reason: "a kernel failed: CUDA_ERROR_ILLEGAL_ADDRESS".into(),
        };
        let (code, text) = status(RuntimeError::Kernel(lost));
        assert_eq!(code, KtStatus::KernelError);
        assert!(text.contains("device lost"), "{text}");
    }
}
