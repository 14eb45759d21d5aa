//! The offline HIP compile: clang in HIP mode writes one raw code object per candidate for a
//! gfx target, reading the source from standard input and writing the object to standard
//! output. No GPU and no HIP runtime are needed, only clang, the HIP headers and the ROCm
//! device libraries (Debian: `hipcc` and `libamdhip64-dev`, ROCm 5.2 with clang 15; Debian's
//! `clang-19` with `lld-19` also targets gfx942, with the device libraries of gfx940).
//!
//! Most of a compile was clang parsing the HIP headers (0.45 s of a 0.6-0.75 s compile with
//! clang 15; clang 19 adds its own wrapper header), the same for every candidate: each
//! compiler precompiles them once per target and every compile for it reads them from there
//! (`tune plan --device mi300x`'s 329 builds of Llama-3.1-70B: 72 s against 145). The code
//! it generates is the same either way.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use super::compiler_io::{first_errors, run_with_input};
use super::scratch::Scratch;
use super::KernelBuild;
use crate::device::GpuModel;
use crate::env::path_var;
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

/// Targets and an older target of the same ISA that stands in for them: for the whole
/// compile where clang predates the target ([`HipCompiler::target_for`]), and for the
/// ISA-version library (`oclc_isa_version_<n>.bc`, one constant the device libraries branch
/// on) where older device libraries lack it. ROCm 5.2's (Debian 12's) stop at gfx940. Its
/// ocml and ockl compare the constant only with thresholds of the ISAs they knew (below 8000
/// or 9000, 9006, 10000, equal to 9008 or 9010), where gfx942's 9402 takes every branch
/// gfx940's 9400 takes; the code itself is then generated for the real target.
const ISA_STAND_INS: &[(&str, &str)] = &[("gfx942", "gfx940")];

fn stand_in(target: &str) -> Option<&'static str> {
    ISA_STAND_INS
        .iter()
        .find(|(t, _)| *t == target)
        .map(|(_, s)| *s)
}

/// The headers the prelude (`kernels/hip/prelude.h`) includes under HIP: what is precompiled.
const HEADERS: &str = "#include <hip/hip_runtime.h>\n#include <hip/hip_fp16.h>\n";

/// A tiny kernel: whether a clang compiles for a target, and whether it reads the headers it
/// precompiled for it.
const PROBE: &str = "#include <hip/hip_runtime.h>\nextern \"C\" __global__ void kt_probe(float* x) { x[threadIdx.x] = 1.0f; }";

/// The ISA-version library of `target`, as the driver looks it up.
fn isa_library(target: &str) -> String {
    format!("oclc_isa_version_{}.bc", target.trim_start_matches("gfx"))
}

/// A clang that compiles HIP for AMD targets, with the paths it needs.
#[derive(Debug)]
pub struct HipCompiler {
    pub clang: PathBuf,
    /// `clang --version`'s first line: part of the compile cache key.
    pub version: String,
    rocm_path: PathBuf,
    device_libs: PathBuf,
    /// The device libraries with the stand-ins of [`ISA_STAND_INS`] they lack, as links,
    /// made on first use.
    with_stand_ins: OnceLock<Result<Scratch, String>>,
    /// Targets probed so far: whether this clang compiles for them.
    probed: Mutex<HashMap<String, bool>>,
    /// Whether compiles read the headers precompiled ([`HipCompiler::compile`]).
    precompile: bool,
    /// The precompiled headers of each target compiled for so far: made by the first compile
    /// for it (the others wait for them), `None` where clang could not make them (those
    /// compiles parse the headers, as without).
    headers: Mutex<HashMap<String, Arc<OnceLock<Option<Scratch>>>>>,
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
        Self::pick(Self::installed(Self::clangs())?, "gfx90a")
    }

    /// `clang` as the HIP compiler, if it compiles a probe kernel for gfx90a.
    pub fn with_clang(clang: impl Into<PathBuf>) -> Result<HipCompiler, KernelError> {
        Self::pick(Self::installed(vec![clang.into()])?, "gfx90a")
    }

    /// The compiler for `g`: the first that builds `g`'s own target, else the first that
    /// builds its stand-in, else any that works, whose [`HipCompiler::target_for`] then says
    /// why it cannot. A host with Debian's clang 15 and a newer clang builds gfx942 with the
    /// newer one.
    pub fn find_for(g: &GpuModel) -> Result<HipCompiler, KernelError> {
        let mut installed = Self::installed(Self::clangs())?;
        // Each compiler keeps its probes' answers, so the second search probes nothing twice.
        let own = installed.iter().position(|c| c.supports(g.arch));
        match own.or_else(|| installed.iter().position(|c| c.target_for(g).is_ok())) {
            Some(i) => Ok(installed.swap_remove(i)),
            None => Self::pick(installed, "gfx90a"),
        }
    }

    /// `$KERNTUNE_HIP_CLANG` if set, else [`CLANGS`].
    fn clangs() -> Vec<PathBuf> {
        match path_var("KERNTUNE_HIP_CLANG") {
            Some(c) => vec![c],
            None => CLANGS.iter().map(PathBuf::from).collect(),
        }
    }

    /// Those of `clangs` that run, in order, with the headers and device libraries found
    /// here; none probed yet.
    fn installed(clangs: Vec<PathBuf>) -> Result<Vec<HipCompiler>, KernelError> {
        let rocm_path = ["/usr", "/opt/rocm"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.join("include/hip/hip_runtime.h").exists())
            .ok_or_else(|| {
                unavailable(
                    "no HIP headers (hip/hip_runtime.h under /usr/include or /opt/rocm/include); install hipcc and libamdhip64-dev (Debian) or ROCm",
                )
            })?;
        let device_libs = path_var("KERNTUNE_ROCM_DEVICE_LIBS")
            .into_iter()
            .chain(DEVICE_LIB_DIRS.iter().map(PathBuf::from))
            .find(|d| d.join("ocml.bc").exists())
            .ok_or_else(|| {
                unavailable(
                    "no ROCm device libraries (ocml.bc); install rocm-device-libs (Debian, pulled in by hipcc) or ROCm, or set KERNTUNE_ROCM_DEVICE_LIBS",
                )
            })?;
        let missing = match clangs.as_slice() {
            [one] => format!(
                "{} does not run here; install it or name another clang",
                one.display()
            ),
            _ => "no clang on PATH; install hipcc (Debian: pulls in clang-15) or set KERNTUNE_HIP_CLANG"
                .to_string(),
        };
        let installed: Vec<HipCompiler> = clangs
            .into_iter()
            .filter_map(|clang| {
                let version = version_of(&clang)?;
                Some(HipCompiler {
                    clang,
                    version,
                    rocm_path: rocm_path.clone(),
                    device_libs: device_libs.clone(),
                    with_stand_ins: OnceLock::new(),
                    probed: Mutex::new(HashMap::new()),
                    precompile: true,
                    headers: Mutex::new(HashMap::new()),
                    scratch: std::env::temp_dir(),
                })
            })
            .collect();
        if installed.is_empty() {
            return Err(unavailable(missing));
        }
        Ok(installed)
    }

    /// The first of `installed` that builds `arch`.
    fn pick(mut installed: Vec<HipCompiler>, arch: &str) -> Result<HipCompiler, KernelError> {
        match installed.iter().position(|c| c.supports(arch)) {
            Some(i) => Ok(installed.swap_remove(i)),
            None => Err(unavailable(format!(
                "none of {} compiles HIP for {arch} here; install hipcc and libamdhip64-dev (clang 15: gfx90a and gfx940), or clang-19 and lld-19 (gfx942)",
                installed
                    .iter()
                    .map(|c| c.clang.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// Whether this compiler builds code for `arch` (probed once with a tiny kernel).
    pub fn supports(&self, arch: &str) -> bool {
        if let Some(&known) = self.lock().get(arch) {
            return known;
        }
        let ok = self.run(PROBE, arch, &[]).is_ok();
        self.lock().insert(arch.to_string(), ok);
        ok
    }

    /// This compiler parsing the HIP headers in every compile, as clang does by default.
    pub fn without_precompiled_headers(mut self) -> HipCompiler {
        self.precompile = false;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, bool>> {
        // A panic while holding the map leaves it usable: it only caches probe answers.
        self.probed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The target to compile for a model, and a warning when it is a stand-in: gfx942
    /// (MI300X) falls back to gfx940, the same CDNA3 ISA, where this clang predates gfx942.
    /// Such code objects serve the offline plan (registers and LDS carry over) but do not
    /// load on the device.
    pub fn target_for(&self, g: &GpuModel) -> Result<(String, Option<String>), KernelError> {
        if self.supports(g.arch) {
            return Ok((g.arch.to_string(), None));
        }
        if let Some(older) = stand_in(g.arch).filter(|older| self.supports(older)) {
            return Ok((
                older.into(),
                Some(format!(
                    "{} does not know {}; compiling for {older} (same ISA, so register and LDS use carry over); for {} code objects install clang-19 and lld-19 (Debian 12) or ROCm 6, or set KERNTUNE_HIP_CLANG",
                    self.version, g.arch, g.arch
                )),
            ));
        }
        let library = isa_library(g.arch);
        if stand_in(g.arch).is_none() && !self.device_libs.join(&library).exists() {
            return Err(unavailable(format!(
                "the ROCm device libraries in {} have no {library}, so nothing compiles for {} ({}) with them; set KERNTUNE_ROCM_DEVICE_LIBS to the amdgcn/bitcode folder of a ROCm that supports {}",
                self.device_libs.display(),
                g.name,
                g.arch,
                g.arch
            )));
        }
        Err(unavailable(format!(
            "{} cannot compile for {} ({}); a newer clang (clang-19 and lld-19 on Debian 12) can",
            self.version, g.name, g.arch
        )))
    }

    /// The device libraries to compile `target` with: the installed ones, or a folder that
    /// adds the stand-in of `target`'s ISA-version library where they lack it.
    fn device_libs_for(&self, target: &str) -> Result<&Path, String> {
        if stand_in(target).is_none() || self.device_libs.join(isa_library(target)).exists() {
            return Ok(&self.device_libs);
        }
        self.with_stand_ins
            .get_or_init(|| self.link_stand_ins())
            .as_ref()
            .map(|d| d.path())
            .map_err(Clone::clone)
    }

    fn link_stand_ins(&self) -> Result<Scratch, String> {
        let failed = |e: std::io::Error| {
            format!(
                "cannot link the device libraries of {} with stand-ins: {e}",
                self.device_libs.display()
            )
        };
        let dir = Scratch::new("kerntune-rocm-libs-", &self.scratch).map_err(failed)?;
        for entry in std::fs::read_dir(&self.device_libs).map_err(failed)? {
            let entry = entry.map_err(failed)?;
            std::os::unix::fs::symlink(entry.path(), dir.path().join(entry.file_name()))
                .map_err(failed)?;
        }
        for (target, stand_in) in ISA_STAND_INS {
            let (own, theirs) = (isa_library(target), isa_library(stand_in));
            if !self.device_libs.join(&own).exists() && self.device_libs.join(&theirs).exists() {
                std::os::unix::fs::symlink(self.device_libs.join(theirs), dir.path().join(own))
                    .map_err(failed)?;
            }
        }
        Ok(dir)
    }

    /// Compiles one build for `target`; the error is the compiler's first messages.
    pub fn compile(&self, build: &KernelBuild, target: &str) -> Result<Vec<u8>, String> {
        let mut extra: Vec<String> = build
            .defines
            .iter()
            .map(|(name, value)| format!("-D{name}={value}"))
            .collect();
        if let Some(pch) = self.precompiled(target) {
            extra.extend(include_pch(&pch));
        }
        self.run(&build.source(), target, &extra)
    }

    /// The precompiled headers for `target`, made on first use; `None` when precompiling is
    /// off or clang could not do it.
    pub fn precompiled(&self, target: &str) -> Option<PathBuf> {
        if !self.precompile {
            return None;
        }
        let slot = self
            .headers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(target.to_string())
            .or_default()
            .clone();
        let dir = slot
            .get_or_init(|| self.precompile_headers(target))
            .as_ref()?;
        Some(dir.path().join("hip_headers.pch"))
    }

    /// [`HEADERS`] precompiled for `target`, with every option of a compile but the macros
    /// (which clang lets differ, as long as the headers do not use them). clang's driver knows
    /// no HIP header input to make one from, so its front end is asked directly.
    fn precompile_headers(&self, target: &str) -> Option<Scratch> {
        let dir = Scratch::new("kerntune-hip-pch-", &self.scratch).ok()?;
        let header = dir.path().join("hip_headers.h");
        std::fs::write(&header, HEADERS).ok()?;
        let pch = dir.path().join("hip_headers.pch");
        let out = self
            .command(target, dir.path())
            .ok()?
            .args([
                "-fsyntax-only",
                "-Xclang",
                "-emit-pch",
                "-Xclang",
                "-o",
                "-Xclang",
            ])
            .arg(&pch)
            .arg(&header)
            .stdin(std::process::Stdio::null())
            .output()
            .ok()?;
        // A clang that writes headers it then refuses to read would fail every compile.
        let usable = out.status.success() && self.run(PROBE, target, &include_pch(&pch)).is_ok();
        usable.then_some(dir)
    }

    /// clang compiling HIP for `target`'s device alone, at the optimisation of every compile,
    /// its temporary files in `tmp`.
    fn command(&self, target: &str, tmp: &Path) -> Result<Command, String> {
        let device_libs = self.device_libs_for(target)?;
        let mut command = Command::new(&self.clang);
        command
            .env("TMPDIR", tmp)
            .args([
                "-x",
                "hip",
                "--cuda-device-only",
                "--no-gpu-bundle-output",
                "-O3",
            ])
            .arg(format!("--rocm-path={}", self.rocm_path.display()))
            .arg(format!("--rocm-device-lib-path={}", device_libs.display()))
            .arg(format!("--offload-arch={target}"));
        Ok(command)
    }

    fn run(&self, source: &str, target: &str, extra: &[String]) -> Result<Vec<u8>, String> {
        let tmp = Scratch::new("kerntune-hip-", &self.scratch).map_err(|e| {
            format!(
                "cannot make a temporary directory for clang in {}: {e}",
                self.scratch.display()
            )
        })?;
        let out = run_with_input(
            self.command(target, tmp.path())?
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

/// clang's options to read the headers precompiled in `pch` first: their include guards then
/// skip the prelude's includes.
fn include_pch(pch: &Path) -> Vec<String> {
    let pch = pch.display().to_string();
    ["-Xclang", "-include-pch", "-Xclang", &pch]
        .map(String::from)
        .to_vec()
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
    use crate::Device;

    fn compiler(test: &str) -> Option<HipCompiler> {
        match HipCompiler::find() {
            Ok(c) => Some(c),
            Err(e) if std::env::var_os("KERNTUNE_REQUIRE_HIP").is_some() => {
                panic!("{test}: KERNTUNE_REQUIRE_HIP is set but {e}")
            }
            Err(e) => {
                eprintln!("{test} did not run: {e}");
                None
            }
        }
    }

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
        let Some(mut hip) = compiler("compiles_leave_nothing_in_the_temporary_directory") else {
            return;
        };
        let scratch = tempfile::tempdir().unwrap();
        hip.scratch = scratch.path().to_path_buf();
        let before = clang_leftovers();
        let kernel = "#include <hip/hip_runtime.h>\nextern \"C\" __global__ void kt_k(float* x) { x[threadIdx.x] = exp2f(x[1]); }";
        for _ in 0..3 {
            hip.run(kernel, "gfx90a", &[]).unwrap();
        }
        // A failed compile cleans up too.
        assert!(hip.run("not C++", "gfx90a", &[]).is_err());
        // So do the precompiled headers, with the compiler.
        use crate::Space;
        let p: crate::Problem = "gemm:m=37,n=100,k=61,dtype=f32".parse().unwrap();
        let config = crate::GpuSpace.heuristic(&p, &Device::lookup("mi250").unwrap());
        hip.compile(&KernelBuild::new(&p, &config).unwrap(), "gfx90a")
            .unwrap();
        assert!(hip
            .precompiled("gfx90a")
            .unwrap()
            .starts_with(scratch.path()));
        // So does the folder of device libraries with stand-ins, with the compiler.
        if hip.supports("gfx942") {
            hip.run(kernel, "gfx942", &[]).unwrap();
        }
        drop(hip);
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

    /// The precompiled headers are the prelude's: a header it includes that they lacked would
    /// be parsed in every compile again.
    #[test]
    fn the_precompiled_headers_are_what_the_prelude_includes() {
        let included: Vec<&str> = crate::gpu::source::PRELUDE
            .lines()
            .filter(|l| l.trim_start().starts_with("#include"))
            .collect();
        assert_eq!(included, HEADERS.lines().collect::<Vec<_>>());
    }

    #[test]
    fn a_target_the_device_libraries_lack_is_refused_naming_them() {
        let Some(hip) = compiler("a_target_the_device_libraries_lack_is_refused_naming_them")
        else {
            return;
        };
        let Device::Gpu(g) = Device::lookup("rx7900xtx").unwrap() else {
            unreachable!()
        };
        let library = isa_library(g.arch);
        assert_eq!(library, "oclc_isa_version_1100.bc");
        match hip.target_for(g) {
            Ok((target, warning)) => {
                assert!(
                    hip.device_libs.join(&library).exists(),
                    "{target} {warning:?}"
                );
                assert_eq!((target.as_str(), warning), ("gfx1100", None));
            }
            Err(e) => {
                assert!(!hip.device_libs.join(&library).exists(), "{e}");
                let e = e.to_string();
                assert!(
                    e.contains(&library) && e.contains("KERNTUNE_ROCM_DEVICE_LIBS"),
                    "{e}"
                );
            }
        }
    }
}
