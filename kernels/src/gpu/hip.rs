//! The offline HIP compile: clang in HIP mode writes one raw code object per candidate for a
//! gfx target, reading the source from standard input and writing the object to standard
//! output. No GPU and no HIP runtime are needed, only clang, the HIP headers and the ROCm
//! device libraries (Debian: `hipcc` and `libamdhip64-dev`, ROCm 5.2 with clang 15; Debian's
//! `clang-19` also targets gfx942).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use super::compiler_io::{first_errors, run_with_input};
use super::KernelBuild;
use crate::device::GpuModel;
use crate::KernelError;

/// Where Debian and ROCm install the device libraries (`ocml.bc` and friends).
const DEVICE_LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode",
    "/opt/rocm/amdgcn/bitcode",
    "/opt/rocm/lib/llvm/lib/clang/amdgcn/bitcode",
];

/// Compilers tried in order: newer clangs know newer targets (gfx942 needs clang 17 or later).
const CLANGS: &[&str] = &[
    "clang++-19",
    "clang++-18",
    "clang++-17",
    "clang++-16",
    "clang++-15",
    "/opt/rocm/llvm/bin/clang++",
    "clang++",
];

/// A clang that compiles HIP for AMD targets, with the paths it needs.
#[derive(Debug)]
pub struct HipCompiler {
    pub clang: PathBuf,
    /// `clang --version`'s first line: part of the compile cache key.
    pub version: String,
    rocm_path: PathBuf,
    device_libs: PathBuf,
    /// Targets probed so far: whether this clang compiles for them.
    probed: Mutex<HashMap<String, bool>>,
    /// Where each compile's temporary directory is made. clang's driver leaves an empty
    /// directory behind (`--XXXXXX`, named after the input `-`) in its temporary directory for
    /// every HIP compile from standard input: hundreds for one `tune plan`. Each compile gets
    /// a directory of its own as `TMPDIR`, removed with whatever clang left in it.
    scratch: PathBuf,
}

fn unavailable(reason: impl Into<String>) -> KernelError {
    KernelError::BackendUnavailable {
        backend: "hip",
        reason: reason.into(),
    }
}

impl HipCompiler {
    /// Finds a working compiler: `$KERNTUNE_HIP_CLANG` if set, else the first of [`CLANGS`]
    /// that compiles a probe kernel for gfx90a.
    pub fn find() -> Result<HipCompiler, KernelError> {
        let rocm_path = ["/usr", "/opt/rocm"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.join("include/hip/hip_runtime.h").exists())
            .ok_or_else(|| {
                unavailable(
                    "no HIP headers (hip/hip_runtime.h under /usr/include or /opt/rocm/include); install hipcc and libamdhip64-dev (Debian) or ROCm",
                )
            })?;
        let device_libs = std::env::var_os("KERNTUNE_ROCM_DEVICE_LIBS")
            .map(PathBuf::from)
            .into_iter()
            .chain(DEVICE_LIB_DIRS.iter().map(PathBuf::from))
            .find(|d| d.join("ocml.bc").exists())
            .ok_or_else(|| {
                unavailable(
                    "no ROCm device libraries (ocml.bc); install rocm-device-libs (Debian, pulled in by hipcc) or ROCm, or set KERNTUNE_ROCM_DEVICE_LIBS",
                )
            })?;
        let chosen: Vec<PathBuf> = match std::env::var_os("KERNTUNE_HIP_CLANG") {
            Some(c) => vec![PathBuf::from(c)],
            None => CLANGS.iter().map(PathBuf::from).collect(),
        };
        let mut tried = Vec::new();
        for clang in chosen {
            let Some(version) = version_of(&clang) else {
                continue;
            };
            let compiler = HipCompiler {
                clang: clang.clone(),
                version,
                rocm_path: rocm_path.clone(),
                device_libs: device_libs.clone(),
                probed: Mutex::new(HashMap::new()),
                scratch: std::env::temp_dir(),
            };
            if compiler.supports("gfx90a") {
                return Ok(compiler);
            }
            tried.push(clang.display().to_string());
        }
        Err(unavailable(if tried.is_empty() {
            "no clang on PATH; install hipcc (Debian: pulls in clang-15) or set KERNTUNE_HIP_CLANG"
                .to_string()
        } else {
            format!(
                "none of {} compiles HIP for gfx90a here; install hipcc and libamdhip64-dev",
                tried.join(", ")
            )
        }))
    }

    /// Whether this compiler builds code for `arch` (probed once with a tiny kernel).
    pub fn supports(&self, arch: &str) -> bool {
        if let Some(&known) = self.lock().get(arch) {
            return known;
        }
        let probe = "#include <hip/hip_runtime.h>\nextern \"C\" __global__ void kt_probe(float* x) { x[threadIdx.x] = 1.0f; }";
        let ok = self.run(probe, arch, &[]).is_ok();
        self.lock().insert(arch.to_string(), ok);
        ok
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, bool>> {
        // A panic while holding the map leaves it usable: it only caches probe answers.
        self.probed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The target to compile for a model, and a warning when it is a stand-in: gfx942
    /// (MI300X) falls back to gfx940, the same CDNA3 ISA, where this clang predates gfx942.
    pub fn target_for(&self, g: &GpuModel) -> Result<(String, Option<String>), KernelError> {
        if self.supports(g.arch) {
            return Ok((g.arch.to_string(), None));
        }
        if g.arch == "gfx942" && self.supports("gfx940") {
            return Ok((
                "gfx940".into(),
                Some(format!(
                    "{} does not know gfx942; compiling for gfx940 (same CDNA3 ISA, so register and LDS use carry over); install clang-19 for exact gfx942 code objects",
                    self.version
                )),
            ));
        }
        Err(unavailable(format!(
            "{} cannot compile for {} ({}); a newer clang (clang-19 on Debian 12) can",
            self.version, g.name, g.arch
        )))
    }

    /// Compiles one build for `target`; the error is the compiler's first messages.
    pub fn compile(&self, build: &KernelBuild, target: &str) -> Result<Vec<u8>, String> {
        let defines: Vec<String> = build
            .defines
            .iter()
            .map(|(name, value)| format!("-D{name}={value}"))
            .collect();
        self.run(&build.source(), target, &defines)
    }

    fn run(&self, source: &str, target: &str, extra: &[String]) -> Result<Vec<u8>, String> {
        let tmp = tempfile::Builder::new()
            .prefix("kerntune-hip-")
            .tempdir_in(&self.scratch)
            .map_err(|e| {
                format!(
                    "cannot make a temporary directory for clang in {}: {e}",
                    self.scratch.display()
                )
            })?;
        let out = run_with_input(
            Command::new(&self.clang)
                .env("TMPDIR", tmp.path())
                .args([
                    "-x",
                    "hip",
                    "--cuda-device-only",
                    "--no-gpu-bundle-output",
                    "-O3",
                ])
                .arg(format!("--rocm-path={}", self.rocm_path.display()))
                .arg(format!(
                    "--rocm-device-lib-path={}",
                    self.device_libs.display()
                ))
                .arg(format!("--offload-arch={target}"))
                .args(extra)
                .args(["-", "-o", "-"]),
            source,
        )?;
        if out.status.success() && !out.stdout.is_empty() {
            return Ok(out.stdout);
        }
        Err(first_errors(&String::from_utf8_lossy(&out.stderr), || {
            format!("compiler exited with {}", out.status)
        }))
    }
}

fn version_of(clang: &Path) -> Option<String> {
    let out = Command::new(clang).arg("--version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(|l| l.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries of the system temporary directory named as clang names the directory it leaves.
    fn clang_leftovers() -> Vec<std::ffi::OsString> {
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .filter(|n| n.to_string_lossy().starts_with("--"))
            .collect()
    }

    #[test]
    fn compiles_leave_nothing_in_the_temporary_directory() {
        let mut hip = match HipCompiler::find() {
            Ok(c) => c,
            Err(e) if std::env::var_os("KERNTUNE_REQUIRE_HIP").is_some() => {
                panic!("KERNTUNE_REQUIRE_HIP is set but {e}")
            }
            Err(e) => {
                eprintln!("compiles_leave_nothing_in_the_temporary_directory did not run: {e}");
                return;
            }
        };
        let scratch = tempfile::tempdir().unwrap();
        hip.scratch = scratch.path().to_path_buf();
        let before = clang_leftovers();
        let kernel = "#include <hip/hip_runtime.h>\nextern \"C\" __global__ void kt_k(float* x) { x[threadIdx.x] = 2.0f; }";
        for _ in 0..3 {
            hip.run(kernel, "gfx90a", &[]).unwrap();
        }
        // A failed compile cleans up too.
        assert!(hip.run("not C++", "gfx90a", &[]).is_err());
        let left: Vec<_> = std::fs::read_dir(scratch.path()).unwrap().collect();
        assert!(left.is_empty(), "left in the scratch directory: {left:?}");
        let new: Vec<_> = clang_leftovers()
            .into_iter()
            .filter(|n| !before.contains(n))
            .collect();
        assert!(
            new.is_empty(),
            "clang left {new:?} in the temporary directory"
        );
    }
}
