//! The offline NVIDIA compile: NVRTC (through cudarc, loaded at run time) compiles the same
//! kernel sources for sm_80 or sm_90 to PTX and on to a CUBIN, the machine code the driver
//! loads, and its ptxas log gives each kernel's registers, shared memory, stack and spill
//! bytes. No GPU and no driver are needed, only `libnvrtc.so.13` (CUDA 13, the version this
//! build is pinned to): from a CUDA toolkit, or from PyPI (`pip install nvidia-cuda-nvrtc`).
//!
//! The CUBIN, not the PTX, is what runs: loading PTX makes the driver compile it again, one
//! module at a time (on an H200 that serial step, not NVRTC's parallel compiles, set the pace
//! of a flash-attention check), and a driver older than NVRTC cannot read newer PTX at all,
//! while it loads the newer toolkit's CUBIN for its architecture.

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

use cudarc::nvrtc::{result, sys};

use super::metadata::KernelResources;
use super::KernelBuild;
use crate::env::path_var;
use crate::KernelError;

/// Static shared memory a kernel may declare on sm_80 and sm_90.
const STATIC_SMEM_MAX: u32 = 48 * 1024;

/// NVRTC's library, by the names cudarc looks up.
const LIBRARY: &str = "libnvrtc.so.13";

/// An NVRTC that was found and loaded.
#[derive(Debug)]
pub struct NvrtcCompiler {
    /// `NVRTC 12.9`: part of the compile cache key.
    pub version: String,
    /// NVRTC 12.9 and later keep a cache of their own, and a build served from it comes with
    /// no ptxas report: on an H200 every build an earlier process had compiled was pruned for
    /// want of one. kerntune caches compiles itself (with their resources), so NVRTC's is
    /// turned off where it exists.
    no_cache: bool,
    /// Keeps a library preloaded by path alive, so cudarc's by-name lookup finds it.
    _preloaded: Option<libloading::Library>,
}

fn unavailable(reason: impl Into<String>) -> KernelError {
    KernelError::BackendUnavailable {
        backend: "cuda",
        reason: reason.into(),
    }
}

/// Directories that may hold `libnvrtc.so.12` outside the loader's search path.
fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"] {
        if let Some(root) = std::env::var_os(var) {
            dirs.push(Path::new(&root).join("lib64"));
            dirs.push(Path::new(&root).join("lib"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    // NVIDIA's Python wheels put it under site-packages/nvidia/cuda_nvrtc/lib: ask the
    // interpreter where its packages live rather than guessing every layout.
    if let Ok(out) = Command::new("python3")
        .args(["-c", "import sys; print('\\n'.join(sys.path))"])
        .output()
    {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // CUDA 13 wheels share nvidia/cu13/lib; CUDA 12 ones had a folder per library.
            dirs.push(Path::new(line.trim()).join("nvidia/cu13/lib"));
            dirs.push(Path::new(line.trim()).join("nvidia/cuda_nvrtc/lib"));
        }
    }
    dirs
}

impl NvrtcCompiler {
    /// Finds NVRTC: `$KERNTUNE_NVRTC` (a path to the library) if set, else the loader's search
    /// path, the CUDA toolkit, or NVIDIA's Python wheel.
    pub fn find() -> Result<NvrtcCompiler, KernelError> {
        let mut preloaded = None;
        let explicit = path_var("KERNTUNE_NVRTC");
        // SAFETY: checks whether the library can be opened by name; loading it only runs
        // NVRTC's initialisers.
        let by_name = unsafe { sys::is_culib_present() };
        if explicit.is_some() || !by_name {
            let paths = explicit
                .into_iter()
                .chain(candidate_dirs().into_iter().map(|d| d.join(LIBRARY)));
            for path in paths.filter(|p| p.exists()) {
                // SAFETY: as above; loaded by path so the later by-name lookup, which matches
                // loaded libraries by soname, finds this one.
                if let Ok(lib) = unsafe { libloading::Library::new(&path) } {
                    preloaded = Some(lib);
                    break;
                }
            }
        }
        // SAFETY: as above.
        if preloaded.is_none() && !unsafe { sys::is_culib_present() } {
            return Err(unavailable(format!(
                "NVRTC ({LIBRARY}) not found: pip install nvidia-cuda-nvrtc (CUDA 13), install the CUDA 13 toolkit, or set KERNTUNE_NVRTC=/path/to/{LIBRARY}"
            )));
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: the library is present (checked above), and both pointers are valid.
        let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
        if status != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(unavailable(format!("nvrtcVersion failed: {status:?}")));
        }
        Ok(NvrtcCompiler {
            version: format!("NVRTC {major}.{minor}"),
            no_cache: (major, minor) >= (12, 9),
            _preloaded: preloaded,
        })
    }

    /// Compiles one build for `arch` (`sm_80`, `sm_90`; `sm_90a` for a build using
    /// architecture-specific instructions): its PTX, its CUBIN (what the driver loads) and
    /// each kernel's resources as ptxas reports them for that architecture, or the compiler's
    /// messages on failure.
    pub fn compile(
        &self,
        build: &KernelBuild,
        arch: &str,
        threads: u32,
    ) -> Result<NvrtcOutput, String> {
        let source = CString::new(build.source()).map_err(|e| e.to_string())?;
        let suffix = if build.arch_specific { "a" } else { "" };
        let mut options = vec![format!("-arch={arch}{suffix}"), "-Xptxas=-v".to_string()];
        if self.no_cache {
            options.push("--no-cache".to_string());
        }
        options.extend(
            build
                .defines
                .iter()
                .map(|(name, value)| format!("-D{name}={value}")),
        );
        let name = CString::new(build.file).map_err(|e| e.to_string())?;
        let program = result::create_program(&source, Some(&name)).map_err(|e| e.to_string())?;
        // SAFETY: `program` comes from create_program and is destroyed once, below; the
        // source and name outlive it.
        unsafe {
            let compiled = result::compile_program(program, &options);
            let log = result::get_program_log(program)
                .map(|l| String::from_utf8_lossy(&c_text(&l)).into_owned())
                .unwrap_or_default();
            let code = compiled.map_err(|e| e.to_string()).and_then(|()| {
                let text = result::get_ptx(program).map_err(|e| e.to_string())?;
                Ok((c_text(&text), cubin(program)?))
            });
            let _ = result::destroy_program(program);
            match code {
                Ok((ptx, cubin)) => {
                    let kernels = parse_log(&log, threads);
                    if let Some(k) = kernels
                        .iter()
                        .find(|k| k.name == build.entries[0] && k.vgpr < build.launch_registers)
                    {
                        return Err(format!(
                            "{} launches with {} registers a thread, fewer than the {} its setmaxnreg split shares out: its warpgroups asking for more would wait forever",
                            k.name, k.vgpr, build.launch_registers
                        ));
                    }
                    Ok(NvrtcOutput {
                        ptx,
                        cubin,
                        kernels,
                        log,
                    })
                }
                Err(e) => {
                    // ptxas refuses static shared memory over 48 KiB without saying so in the
                    // log; its report of the kernel's smem shows it.
                    if let Some(k) = parse_log(&log, threads)
                        .into_iter()
                        .find(|k| k.lds > STATIC_SMEM_MAX)
                    {
                        return Err(format!(
                            "too much shared data: {} uses {} bytes, {STATIC_SMEM_MAX} max",
                            k.name, k.lds
                        ));
                    }
                    Err(super::compiler_io::first_errors(&log, || e))
                }
            }
        }
    }
}

/// One build compiled by NVRTC.
#[derive(Debug, Clone)]
pub struct NvrtcOutput {
    /// The PTX, for reading which instructions the build uses.
    pub ptx: Vec<u8>,
    /// The machine code for the architecture compiled for: what the driver loads.
    pub cubin: Vec<u8>,
    /// Each kernel's resources from ptxas's report.
    pub kernels: Vec<KernelResources>,
    /// The compiler's messages: ptxas's report, and its notes (e.g. `wgmma` instructions it
    /// had to serialize, a performance loss the resources do not show).
    pub log: String,
}

/// The CUBIN of a compiled program (NVRTC makes one when compiling for a real `sm_` target).
///
/// # Safety
///
/// `program` was compiled successfully and is not yet destroyed.
unsafe fn cubin(program: sys::nvrtcProgram) -> Result<Vec<u8>, String> {
    let mut size = 0usize;
    // SAFETY: per the function's contract; `size` is a valid out-pointer.
    let status = unsafe { sys::nvrtcGetCUBINSize(program, &mut size) };
    if status != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return Err(format!("NVRTC made no CUBIN: {status:?}"));
    }
    let mut bytes = vec![0u8; size];
    // SAFETY: `bytes` holds the `size` bytes NVRTC said it writes.
    let status = unsafe { sys::nvrtcGetCUBIN(program, bytes.as_mut_ptr().cast()) };
    if status != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("reading NVRTC's CUBIN failed: {status:?}"));
    }
    Ok(bytes)
}

/// The bytes of a NUL-terminated text NVRTC returned (`c_char` is `i8` on x86-64, `u8` on
/// aarch64, so no cast fits both).
fn c_text(text: &[c_char]) -> Vec<u8> {
    text.iter()
        .take_while(|&&c| c != 0)
        .map(|c| c.to_ne_bytes()[0])
        .collect()
}

/// The number before `unit` in `line` (`Used 48 registers` → 48 for `registers`).
fn count_before(line: &str, unit: &str) -> u32 {
    line.find(unit)
        .and_then(|at| line[..at].split([' ', ',']).rfind(|w| !w.is_empty()))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Reads ptxas's `-v` report: per entry function, registers per thread, shared memory, stack
/// frame and spill bytes (stores; a spilled 32-bit register is 4 bytes).
fn parse_log(log: &str, threads: u32) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(KernelResources {
                name,
                vgpr: 0,
                agpr: 0,
                sgpr: 0,
                lds: 0,
                scratch: 0,
                vgpr_spill: 0,
                sgpr_spill: 0,
                wave_size: 32,
                max_threads: threads,
            });
        } else if let Some(k) = out.last_mut() {
            if line.contains("stack frame") {
                k.scratch = count_before(line, "bytes stack");
                k.vgpr_spill = count_before(line, "bytes spill stores").div_ceil(4);
            } else if line.contains("Used") && line.contains("registers") {
                k.vgpr = count_before(line, "registers");
                k.lds = count_before(line, "bytes smem");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::parse_log;

    #[test]
    fn reads_a_ptxas_report() {
        let log = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'kt_paged' for 'sm_80'
ptxas info    : Function properties for kt_paged
ptxas         .     8 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 48 registers, used 1 barriers, 2592 bytes smem, 436 bytes cmem[0]
ptxas info    : Compiling entry function 'kt_paged_reduce' for 'sm_80'
ptxas info    : Function properties for kt_paged_reduce
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 392 bytes cmem[0]
";
        let k = parse_log(log, 256);
        assert_eq!(k.len(), 2);
        assert_eq!(
            (
                k[0].name.as_str(),
                k[0].vgpr,
                k[0].lds,
                k[0].scratch,
                k[0].vgpr_spill
            ),
            ("kt_paged", 48, 2592, 8, 3)
        );
        assert_eq!(
            (k[1].name.as_str(), k[1].vgpr, k[1].lds),
            ("kt_paged_reduce", 32, 0)
        );
    }
}
