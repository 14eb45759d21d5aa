//! Finding AMD GPUs through the HIP runtime, loaded at run time: one binary runs on hosts with
//! and without ROCm. The few entry points used are declared by hand (hip-sys links the library
//! at build time and pins old bindings, which would make ROCm a build requirement); only
//! functions whose signatures are stable across ROCm 5 and 6 are used.

use std::ffi::{c_char, c_int, CStr};

use libloading::{Library, Symbol};
use serde::Serialize;

/// Library names tried in order: ROCm 6, ROCm 5 (Debian 12), then the unversioned link.
const LIBRARIES: &[&str] = &["libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"];

/// An AMD GPU the HIP runtime reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HipDevice {
    pub index: i32,
    pub name: String,
    pub memory_bytes: usize,
}

type HipError = c_int;

/// Loads the HIP runtime and lists its devices. The error says what is missing: the library,
/// or a device (`hipInit` and `hipGetDeviceCount` answer "no device" on a GPU-less host).
pub fn probe() -> Result<Vec<HipDevice>, String> {
    let (library, name) = LIBRARIES
        .iter()
        // SAFETY: loading the HIP runtime runs its initialisers, which only register the
        // runtime; no other code of ours runs until the calls below.
        .find_map(|name| unsafe { Library::new(name) }.ok().map(|l| (l, *name)))
        .ok_or_else(|| {
            format!(
                "no HIP runtime: none of {} could be loaded (install ROCm, or Debian's libamdhip64-5)",
                LIBRARIES.join(", ")
            )
        })?;
    // SAFETY: the declared signatures are those of HIP's C API, unchanged from ROCm 5 to 6.
    unsafe {
        let init: Symbol<unsafe extern "C" fn(u32) -> HipError> =
            symbol(&library, b"hipInit\0", name)?;
        let count: Symbol<unsafe extern "C" fn(*mut c_int) -> HipError> =
            symbol(&library, b"hipGetDeviceCount\0", name)?;
        let error_name: Symbol<unsafe extern "C" fn(HipError) -> *const c_char> =
            symbol(&library, b"hipGetErrorString\0", name)?;
        let device_name: Symbol<unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError> =
            symbol(&library, b"hipDeviceGetName\0", name)?;
        let total_mem: Symbol<unsafe extern "C" fn(*mut usize, c_int) -> HipError> =
            symbol(&library, b"hipDeviceTotalMem\0", name)?;
        let describe = |e: HipError| {
            let text = error_name(e);
            if text.is_null() {
                format!("error {e}")
            } else {
                format!("{} (error {e})", CStr::from_ptr(text).to_string_lossy())
            }
        };
        let status = init(0);
        if status != 0 {
            return Err(format!(
                "{name}: hipInit found no usable device: {}",
                describe(status)
            ));
        }
        let mut n: c_int = 0;
        let status = count(&mut n);
        if status != 0 || n == 0 {
            return Err(format!(
                "{name}: hipGetDeviceCount found no device{}",
                if status != 0 {
                    format!(": {}", describe(status))
                } else {
                    String::new()
                }
            ));
        }
        let mut devices = Vec::new();
        for index in 0..n {
            let mut buf = [0 as c_char; 256];
            let mut memory = 0usize;
            if device_name(buf.as_mut_ptr(), buf.len() as c_int, index) != 0
                || total_mem(&mut memory, index) != 0
            {
                continue;
            }
            devices.push(HipDevice {
                index,
                name: CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned(),
                memory_bytes: memory,
            });
        }
        Ok(devices)
    }
}

/// Looks a symbol up, naming the library when it lacks it.
///
/// # Safety
/// `T` must be the symbol's true type.
unsafe fn symbol<'l, T>(
    library: &'l Library,
    symbol: &[u8],
    name: &str,
) -> Result<Symbol<'l, T>, String> {
    // SAFETY: the caller states the type.
    unsafe { library.get(symbol) }.map_err(|e| {
        format!(
            "{name} lacks {}: {e}",
            String::from_utf8_lossy(&symbol[..symbol.len() - 1])
        )
    })
}
