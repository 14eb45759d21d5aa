//! rocBLAS GEMM solutions as candidates beside our own kernels (Cargo feature `rocm`), the
//! way PyTorch's TunableOp does it: `rocblas_gemm_ex_get_solutions` lists the solutions that
//! can run a GEMM, and `rocblas_gemm_ex` with `rocblas_gemm_algo_solution_index` runs one.
//!
//! The library is loaded at run time (librocblas.so.4 from ROCm 6, .so.0 from ROCm 5) and its
//! half-dozen entry points are declared by hand: no maintained crate binds rocBLAS without
//! linking it at build time, and a binary must still start where rocBLAS is absent (it is not
//! even packaged in Debian 12). The declarations follow rocBLAS's C API, unchanged from ROCm 5
//! to 6. Never run on a device in this project's sessions (no AMD GPU is lent).

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use libloading::Library;

use super::launch::DevicePtrs;
use crate::config::RocblasConfig;
use crate::problem::GemmProblem;
use crate::{BLayout, Config, DType, KernelError};

type Status = c_int;
type Handle = *mut c_void;

const LIBRARIES: &[&str] = &["librocblas.so.4", "librocblas.so.0", "librocblas.so"];

// rocblas_operation, rocblas_datatype and rocblas_gemm_algo values from rocblas-types.h.
const OP_NONE: c_int = 111;
const OP_TRANSPOSE: c_int = 112;
const F16: c_int = 150;
const F32: c_int = 151;
const BF16: c_int = 168;
const ALGO_STANDARD: c_int = 0;
const ALGO_SOLUTION_INDEX: c_int = 1;

fn unavailable(reason: impl Into<String>) -> KernelError {
    KernelError::BackendUnavailable {
        backend: "rocblas",
        reason: reason.into(),
    }
}

fn check(what: &str, status: Status) -> Result<(), KernelError> {
    if status == 0 {
        Ok(())
    } else {
        Err(unavailable(format!(
            "{what} failed with rocBLAS status {status}"
        )))
    }
}

#[allow(clippy::type_complexity)]
type GemmEx = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
    i32,
    u32,
) -> Status;

#[allow(clippy::type_complexity)]
type GetSolutions = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
    u32,
    *mut c_int,
    *mut c_int,
) -> Status;

/// The loaded library.
pub struct Rocblas {
    _library: Library,
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    set_stream: unsafe extern "C" fn(Handle, *mut c_void) -> Status,
    gemm_ex: GemmEx,
    get_solutions: GetSolutions,
    /// `major·10000 + minor·100 + patch`, as [`RocblasConfig::version`] stores it.
    pub version: u32,
    pub version_text: String,
}

impl std::fmt::Debug for Rocblas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rocBLAS {}", self.version_text)
    }
}

/// `4.2.0.abc-xyz` → 40200.
pub fn parse_version(text: &str) -> Option<u32> {
    let mut parts = text
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().ok());
    let (major, minor, patch) = (parts.next()??, parts.next()??, parts.next()??);
    (minor < 100 && patch < 100).then_some(major * 10_000 + minor * 100 + patch)
}

impl Rocblas {
    /// Loads rocBLAS; a clear error where it is not installed.
    pub fn load() -> Result<Rocblas, KernelError> {
        let (library, name) = LIBRARIES
            .iter()
            // SAFETY: loading rocBLAS runs only its own initialisers.
            .find_map(|n| unsafe { Library::new(n) }.ok().map(|l| (l, *n)))
            .ok_or_else(|| {
                unavailable(format!(
                    "no rocBLAS: none of {} loads (ROCm's rocblas package provides it)",
                    LIBRARIES.join(", ")
                ))
            })?;
        macro_rules! sym {
            ($s:literal) => {
                // SAFETY: the field's type is rocBLAS's C signature of this symbol.
                *unsafe { library.get(concat!($s, "\0").as_bytes()) }
                    .map_err(|e| unavailable(format!("{name} lacks {}: {e}", $s)))?
            };
        }
        let version_size: unsafe extern "C" fn(*mut usize) -> Status =
            sym!("rocblas_get_version_string_size");
        let version_string: unsafe extern "C" fn(*mut c_char, usize) -> Status =
            sym!("rocblas_get_version_string");
        let mut len = 0usize;
        // SAFETY: a valid out-pointer.
        check("rocblas_get_version_string_size", unsafe {
            version_size(&mut len)
        })?;
        let mut buf = vec![0 as c_char; len.max(1)];
        // SAFETY: `buf` holds `len` bytes.
        check("rocblas_get_version_string", unsafe {
            version_string(buf.as_mut_ptr(), buf.len())
        })?;
        // SAFETY: rocBLAS wrote a NUL-terminated string into `buf`.
        let version_text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let version = parse_version(&version_text).ok_or_else(|| {
            unavailable(format!(
                "{name} reports an unreadable version `{version_text}`"
            ))
        })?;
        Ok(Rocblas {
            create: sym!("rocblas_create_handle"),
            destroy: sym!("rocblas_destroy_handle"),
            set_stream: sym!("rocblas_set_stream"),
            gemm_ex: sym!("rocblas_gemm_ex"),
            get_solutions: sym!("rocblas_gemm_ex_get_solutions"),
            version,
            version_text,
            _library: library,
        })
    }

    /// A handle for one thread at a time (rocBLAS handles are not shared between threads).
    pub fn handle(self: &Arc<Self>) -> Result<RocblasHandle, KernelError> {
        let mut h = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        check("rocblas_create_handle", unsafe { (self.create)(&mut h) })?;
        Ok(RocblasHandle {
            lib: self.clone(),
            h,
        })
    }
}

/// A rocBLAS handle, destroyed on drop.
#[derive(Debug)]
pub struct RocblasHandle {
    lib: Arc<Rocblas>,
    h: Handle,
}

// SAFETY: a handle may move between threads; it is used by one at a time (`&mut self`).
unsafe impl Send for RocblasHandle {}

impl Drop for RocblasHandle {
    fn drop(&mut self) {
        // SAFETY: created by `handle`, destroyed once.
        unsafe { (self.lib.destroy)(self.h) };
    }
}

/// One GEMM as rocBLAS's column-major call: row-major `C = A·B` is column-major
/// `Cᵀ = Bᵀ·Aᵀ`, so rocBLAS's first operand is B.
struct Call {
    trans_a: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    a: *const c_void,
    lda: c_int,
    b: *const c_void,
    ldb: c_int,
    c: *mut c_void,
    ldc: c_int,
    dtype: c_int,
}

fn call(p: &GemmProblem, ptrs: &DevicePtrs) -> Result<Call, KernelError> {
    let int = |v: usize| {
        c_int::try_from(v).map_err(|_| unavailable(format!("dimension {v} exceeds rocBLAS's int")))
    };
    let (trans_a, lda) = match p.b_layout {
        BLayout::Kn => (OP_NONE, p.n),
        BLayout::Nk => (OP_TRANSPOSE, p.k),
    };
    Ok(Call {
        trans_a,
        m: int(p.n)?,
        n: int(p.m)?,
        k: int(p.k)?,
        a: ptrs.inputs[1] as usize as *const c_void,
        lda: int(lda)?,
        b: ptrs.inputs[0] as usize as *const c_void,
        ldb: int(p.k)?,
        c: ptrs.out as usize as *mut c_void,
        ldc: int(p.n)?,
        dtype: match p.dtype {
            DType::F32 => F32,
            DType::F16 => F16,
            DType::Bf16 => BF16,
            DType::Fp8(f) => return Err(unavailable(format!("a GEMM on {f:?} inputs"))),
        },
    })
}

impl RocblasHandle {
    /// The solutions rocBLAS can run `p` with, as configs of this rocBLAS version.
    ///
    /// # Safety
    /// `ptrs` holds device memory of `p`'s operands (rocBLAS may inspect the pointers).
    pub unsafe fn solutions(
        &mut self,
        p: &GemmProblem,
        ptrs: &DevicePtrs,
    ) -> Result<Vec<Config>, KernelError> {
        let c = call(p, ptrs)?;
        let (alpha, beta) = (1f32, 0f32);
        let list = |array: *mut c_int, size: &mut c_int| {
            // SAFETY: the arguments describe a valid gemm_ex call (caller contract);
            // `array` is NULL or holds `size` entries.
            check("rocblas_gemm_ex_get_solutions", unsafe {
                (self.lib.get_solutions)(
                    self.h,
                    c.trans_a,
                    OP_NONE,
                    c.m,
                    c.n,
                    c.k,
                    (&alpha as *const f32).cast(),
                    c.a,
                    c.dtype,
                    c.lda,
                    c.b,
                    c.dtype,
                    c.ldb,
                    (&beta as *const f32).cast(),
                    c.c,
                    F32,
                    c.ldc,
                    c.c,
                    F32,
                    c.ldc,
                    F32,
                    ALGO_SOLUTION_INDEX,
                    0,
                    array,
                    size,
                )
            })
        };
        let mut size = 0;
        list(std::ptr::null_mut(), &mut size)?;
        let mut indices = vec![0 as c_int; size.max(0) as usize];
        if !indices.is_empty() {
            list(indices.as_mut_ptr(), &mut size)?;
            indices.truncate(size.max(0) as usize);
        }
        Ok(indices
            .into_iter()
            .map(|solution| {
                Config::Rocblas(RocblasConfig {
                    solution,
                    version: self.lib.version,
                })
            })
            .collect())
    }

    /// Queues `C = A·B` on `stream` with `solution` (`None`: rocBLAS's own choice).
    ///
    /// # Safety
    /// `ptrs` holds device memory of `p`'s operands; `stream` is null or a live stream of the
    /// device.
    pub unsafe fn gemm(
        &mut self,
        p: &GemmProblem,
        ptrs: &DevicePtrs,
        solution: Option<i32>,
        stream: *mut c_void,
    ) -> Result<(), KernelError> {
        let c = call(p, ptrs)?;
        let (alpha, beta) = (1f32, 0f32);
        let (algo, index) = match solution {
            Some(s) => (ALGO_SOLUTION_INDEX, s),
            None => (ALGO_STANDARD, 0),
        };
        // SAFETY: the caller's promise on stream and addresses; the scalars live for the call.
        unsafe {
            check("rocblas_set_stream", (self.lib.set_stream)(self.h, stream))?;
            check(
                "rocblas_gemm_ex",
                (self.lib.gemm_ex)(
                    self.h,
                    c.trans_a,
                    OP_NONE,
                    c.m,
                    c.n,
                    c.k,
                    (&alpha as *const f32).cast(),
                    c.a,
                    c.dtype,
                    c.lda,
                    c.b,
                    c.dtype,
                    c.ldb,
                    (&beta as *const f32).cast(),
                    c.c,
                    F32,
                    c.ldc,
                    c.c,
                    F32,
                    c.ldc,
                    F32,
                    algo,
                    index,
                    0,
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_as_configs_store_them() {
        assert_eq!(parse_version("4.2.0.d1a2b3c-dirty"), Some(40200));
        assert_eq!(parse_version("2.47.0"), Some(24700));
        assert_eq!(parse_version("4.2"), None);
        assert_eq!(parse_version("unknown"), None);
    }

    #[test]
    fn without_rocblas_the_answer_says_so() {
        // rocBLAS is not packaged in Debian 12, so CI never has it; where it exists this
        // checks that it loads and reports its version.
        match Rocblas::load() {
            Ok(r) => assert!(r.version > 0, "{r:?}"),
            Err(e) => assert!(e.to_string().contains("librocblas"), "{e}"),
        }
    }
}
