//! The GPU kernels on the CPU. The sources of `kernels/hip/` compile as C++ with the host
//! target of their prelude and the SIMT runtime in `kernels/emulator/simt.h` (every GPU thread
//! a fiber, barriers and warp-wide operations exchanged through the block, NVIDIA's mma.sync
//! and AMD's MFMA computed in their documented fragment layouts). A build runs through the
//! same [`launches`](super::launch::launches) as on a device, so a GPU config is verified
//! against the reference, awkward sizes included, on any machine with a C++ compiler.
//!
//! What a launch finds beyond a wrong answer: a block whose threads reach different barriers
//! or leave while others wait, a warp-wide operation in a wave the block does not fill, and
//! writes outside the output buffers (each buffer sits between guard bytes that are checked
//! after the launch). Input guard bytes are NaN, so a read past an input that reaches the
//! output fails verification. Timing means nothing here: it is a correctness tool.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use libloading::Library;

use super::compiler_io::{first_errors, run_with_input};
use super::launch::{input_alignment, launches, partial_floats, DevicePtrs};
use super::source::{body_of, PRELUDE};
use super::KernelBuild;
use crate::data::ProblemData;
use crate::device::GpuModel;
use crate::problem::{FlashProblem, GemmProblem, PagedProblem};
use crate::reference::relative_error;
use crate::space::{has_mfma, has_mma, has_wgmma};
use crate::{Config, Device, GpuSpace, KernelError, Problem, Space, TensorBuf};

const SIMT: &str = include_str!("../../emulator/simt.h");

/// Compilers tried in order when `$KERNTUNE_HOST_CXX` is not set.
const COMPILERS: &[&str] = &["c++", "g++", "clang++", "clang++-19", "clang++-15"];

/// Guard bytes on each side of every buffer: a write this far outside is caught; one further
/// out lands in other memory and may crash the process instead.
const GUARD: usize = 64 * 1024;

/// `kt_host_launch` of a build (kernels/emulator/simt.h).
type LaunchFn = unsafe extern "C" fn(
    entry: i32,
    grid: *const u32,
    threads: u32,
    params: *mut *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> i32;

fn unavailable(reason: impl Into<String>) -> KernelError {
    KernelError::BackendUnavailable {
        backend: "emulator",
        reason: reason.into(),
    }
}

fn fault(build: &KernelBuild, reason: impl Into<String>) -> KernelError {
    KernelError::EmulatorFault {
        build: build.key(),
        reason: reason.into(),
    }
}

/// A problem of the same build as `problem` under `config` (dtype, B layout, head size, block
/// size, GQA group are the build's or the kernel's indexing), small enough to emulate: each
/// size cut to one tile and a ragged one beyond it (two partitions for paged attention), two
/// KV heads at most, one batch, two sequences. `problem` when it is already that small.
pub fn reduced(problem: &Problem, config: &Config) -> Problem {
    let heads = |q: usize, kv: usize| {
        let kv2 = kv.min(2);
        (q / kv * kv2, kv2)
    };
    let small = match (problem, config) {
        (Problem::Gemm(p), Config::GpuGemm(c)) => {
            // Builds that copy or load rows in 16-byte pieces (8 values, 4 of f32): their
            // ragged part stays a multiple of 8 (the original sizes are, or the config would
            // not be valid for them).
            let pieces = input_alignment(problem, config) == 16;
            let (dn, dk) = if pieces { (8, 8) } else { (3, 5) };
            GemmProblem::new(
                p.m.min(c.bm + 1),
                p.n.min(c.bn + dn),
                p.k.min(c.bk + dk),
                p.dtype,
                p.b_layout,
            )
            .map(Problem::Gemm)
        }
        (Problem::Flash(p), Config::GpuFlash(c)) => {
            let q_len = p.q_len.min(c.br + 1);
            let kv_len = p.kv_len.min(c.bc + 3).max(q_len.min(p.kv_len));
            let (q_heads, kv_heads) = heads(p.q_heads, p.kv_heads);
            FlashProblem::new(
                1, q_len, kv_len, q_heads, kv_heads, p.head_dim, p.causal, p.scale, p.dtype,
            )
            .map(Problem::Flash)
        }
        (Problem::Paged(p), Config::GpuPaged(c)) => {
            let (q_heads, kv_heads) = heads(p.q_heads, p.kv_heads);
            PagedProblem::new(
                p.num_seqs.min(2),
                p.context_len.min(c.partition + 7),
                q_heads,
                kv_heads,
                p.head_dim,
                p.block_size,
                p.scale,
                p.dtype,
            )
            .map(Problem::Paged)
        }
        _ => Ok(*problem),
    };
    // Every size only shrinks, so the smaller problem is valid whenever the original is.
    small.unwrap_or(*problem)
}

/// What [`Emulator::verify`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct Verification {
    /// The problem it ran: [`reduced`] from the one asked about.
    pub problem: Problem,
    /// Relative error against the reference.
    pub error: f64,
    pub tolerance: f64,
}

impl Verification {
    pub fn passed(&self) -> bool {
        self.error <= self.tolerance
    }
}

/// Runs GPU builds of one catalog model on the host: its wave width and matrix instructions.
#[derive(Debug)]
pub struct Emulator {
    model: &'static GpuModel,
    cxx: PathBuf,
    /// `cxx --version`'s first line: part of the cache key.
    version: String,
    cache: PathBuf,
    /// Switch fibers with ucontext even where the assembly switch exists.
    portable: bool,
}

/// A compiled build, loaded for the life of the process: its code and thread-local shared
/// memory must outlive every launch, and a process loads each build once.
#[derive(Debug, Clone, Copy)]
pub struct EmulatedBuild {
    launch: LaunchFn,
}

fn loaded() -> &'static Mutex<HashMap<PathBuf, EmulatedBuild>> {
    static LOADED: OnceLock<Mutex<HashMap<PathBuf, EmulatedBuild>>> = OnceLock::new();
    LOADED.get_or_init(Default::default)
}

fn version_of(cxx: &Path) -> Option<String> {
    let out = Command::new(cxx).arg("--version").output().ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_string()
    })
}

/// FNV-1a over the parts of a cache key: stable across Rust versions and runs.
fn fnv(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes().chain([0]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

impl Emulator {
    /// An emulator of `model`, with the C++ compiler of `$KERNTUNE_HOST_CXX` or the first of
    /// [`COMPILERS`] found. Builds are cached in `$KERNTUNE_EMULATOR_CACHE`, or in
    /// `kerntune-emulator` under the system's temporary folder.
    pub fn new(model: &'static GpuModel) -> Result<Emulator, KernelError> {
        let (cxx, version) = match std::env::var_os("KERNTUNE_HOST_CXX") {
            Some(cxx) => {
                let cxx = PathBuf::from(cxx);
                let version = version_of(&cxx).ok_or_else(|| {
                    unavailable(format!(
                        "KERNTUNE_HOST_CXX={} does not run as a C++ compiler",
                        cxx.display()
                    ))
                })?;
                (cxx, version)
            }
            None => COMPILERS
                .iter()
                .find_map(|c| version_of(Path::new(c)).map(|v| (PathBuf::from(c), v)))
                .ok_or_else(|| {
                    unavailable(format!(
                        "no C++ compiler found (tried {}); install one (Debian: apt-get install g++) or set KERNTUNE_HOST_CXX",
                        COMPILERS.join(", ")
                    ))
                })?,
        };
        let cache = std::env::var_os("KERNTUNE_EMULATOR_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join("kerntune-emulator"));
        Ok(Emulator {
            model,
            cxx,
            version,
            cache,
            portable: false,
        })
    }

    /// The same emulator switching fibers with ucontext, as on hosts other than x86-64.
    pub fn with_portable_fibers(mut self) -> Emulator {
        self.portable = true;
        self
    }

    pub fn model(&self) -> &'static GpuModel {
        self.model
    }

    /// The compiler and its version.
    pub fn compiler(&self) -> String {
        format!("{} ({})", self.cxx.display(), self.version)
    }

    /// The build's macros for this model's emulation.
    fn defines(&self, build: &KernelBuild) -> Vec<String> {
        let flag = |b: bool| usize::from(b);
        let mut defines = vec![
            ("KT_HOST", 1),
            ("KT_HOST_WAVE", self.model.wave_size as usize),
            ("KT_HOST_MMA", flag(has_mma(self.model))),
            ("KT_HOST_MFMA", flag(has_mfma(self.model))),
            // As on the device, where only the arch-specific target (sm_90a) has wgmma.
            (
                "KT_HOST_WGMMA",
                flag(has_wgmma(self.model) && build.arch_specific),
            ),
        ];
        if self.portable {
            defines.push(("KT_HOST_UCONTEXT", 1));
        }
        defines.extend(build.defines.iter().copied());
        defines
            .into_iter()
            .map(|(name, value)| format!("-D{name}={value}"))
            .collect()
    }

    /// The translation unit: the runtime, the prelude, the kernel (with `#line` marks, so
    /// compiler messages and barrier sites name the source files' lines) and the entry table.
    fn source(&self, build: &KernelBuild, body: &str) -> String {
        let entries: Vec<String> = build
            .entries
            .iter()
            .map(|e| format!("kt_host::entry_of(&{e})"))
            .collect();
        format!(
            "{SIMT}\n#line 1 \"prelude.h\"\n{PRELUDE}\n#line 1 \"{}\"\n{}\nKT_HOST_ENTRIES({})\n",
            build.file,
            body.replacen("#include \"prelude.h\"", "", 1),
            entries.join(", ")
        )
    }

    /// Compiles `build` (or finds it in the cache) and loads it.
    pub fn load(&self, build: &KernelBuild) -> Result<EmulatedBuild, KernelError> {
        self.load_source(build, body_of(build.family))
    }

    /// Compiles `body` in place of the build's source file (`kernels/hip/<family>.hip`), with
    /// the build's macros.
    fn load_source(&self, build: &KernelBuild, body: &str) -> Result<EmulatedBuild, KernelError> {
        let source = self.source(build, body);
        let defines = self.defines(build);
        let mut key: Vec<&str> = vec![&source, &self.version];
        key.extend(defines.iter().map(String::as_str));
        let path = self.cache.join(format!("{}.so", fnv(&key)));
        if let Some(b) = loaded()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&path)
        {
            return Ok(*b);
        }
        if !path.exists() {
            self.compile(build, &source, &defines, &path)?;
        }
        // SAFETY: the library is our own build of kernels/emulator/simt.h and a kernel; its
        // initialisers only set up thread-local storage.
        let library = unsafe { Library::new(&path) }
            .map_err(|e| fault(build, format!("cannot load {}: {e}", path.display())))?;
        // SAFETY: `kt_host_launch` is defined by KT_HOST_ENTRIES with exactly this signature.
        let launch = unsafe { library.get::<LaunchFn>(b"kt_host_launch\0") }
            .map(|f| *f)
            .map_err(|e| {
                fault(
                    build,
                    format!("{} lacks kt_host_launch: {e}", path.display()),
                )
            })?;
        // Never unloaded: see EmulatedBuild.
        std::mem::forget(library);
        let b = EmulatedBuild { launch };
        loaded()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path, b);
        Ok(b)
    }

    fn compile(
        &self,
        build: &KernelBuild,
        source: &str,
        defines: &[String],
        path: &Path,
    ) -> Result<(), KernelError> {
        std::fs::create_dir_all(&self.cache).map_err(|e| {
            unavailable(format!(
                "cannot create the build cache {}: {e}",
                self.cache.display()
            ))
        })?;
        // A private name, then a rename: concurrent tests and tuners share the cache.
        let tmp = path.with_extension(format!(
            "{}.{:?}.tmp",
            std::process::id(),
            std::thread::current().id()
        ));
        let out = run_with_input(
            Command::new(&self.cxx)
                .args(["-std=c++17", "-O1", "-fPIC", "-shared", "-w", "-pthread"])
                .args(defines)
                .args(["-x", "c++", "-", "-o"])
                .arg(&tmp),
            source,
        )
        .map_err(unavailable)?;
        if !out.status.success() {
            let _ = std::fs::remove_file(&tmp);
            let errors = first_errors(&String::from_utf8_lossy(&out.stderr), || {
                out.status.to_string()
            });
            return Err(fault(
                build,
                format!(
                    "does not compile for the host with {}: {errors}",
                    self.cxx.display()
                ),
            ));
        }
        std::fs::rename(&tmp, path).map_err(|e| {
            unavailable(format!(
                "cannot store the build in {}: {e}",
                self.cache.display()
            ))
        })
    }

    /// Runs `config` on `data`'s inputs and returns the output. The config must be valid
    /// for the model (the space says why not).
    pub fn run(&self, data: &ProblemData, config: &Config) -> Result<Vec<f32>, KernelError> {
        self.run_source(data, config, body_of(data.problem.family()))
    }

    /// Runs `config` on the [`reduced`] form of `problem` (for paged attention with a second
    /// sequence of one token) and compares the output with the reference.
    pub fn verify(&self, problem: &Problem, config: &Config) -> Result<Verification, KernelError> {
        let small = reduced(problem, config);
        let mut data = ProblemData::random(&small, 0x6b74);
        if let Problem::Paged(p) = &small {
            if p.num_seqs == 2 {
                data = data.with_context_lens(vec![p.context_len as u32, 1]);
            }
        }
        let out = self.run(&data, config)?;
        Ok(Verification {
            problem: small,
            error: relative_error(&out, &data.reference()),
            tolerance: small.tolerance(),
        })
    }

    /// [`run`](Self::run) with `body` in place of the family's kernel source: a kernel under
    /// development, before it replaces the file in `kernels/hip/`.
    pub fn run_source(
        &self,
        data: &ProblemData,
        config: &Config,
        body: &str,
    ) -> Result<Vec<f32>, KernelError> {
        let device = Device::Gpu(self.model);
        GpuSpace.validate(config, &data.problem, &device)?;
        let build = KernelBuild::new(&data.problem, config)?;
        let loaded = self.load_source(&build, body)?;
        let problem = &data.problem;

        let mut inputs: Vec<Guarded> = data.inputs.iter().map(Guarded::input).collect();
        let mut tables = Guarded::words(&data.block_tables);
        let mut lens = Guarded::words(&data.context_lens);
        let mut out = Guarded::output(data.out.len());
        let mut partials = partial_floats(problem, config).map(Guarded::output);
        let mut ptrs = DevicePtrs {
            out: out.addr(),
            block_tables: tables.addr(),
            context_lens: lens.addr(),
            max_blocks_per_seq: data.max_blocks_per_seq,
            ..DevicePtrs::default()
        };
        for (slot, buf) in ptrs.inputs.iter_mut().zip(&mut inputs) {
            *slot = buf.addr();
        }
        for (slot, buf) in ptrs.partials.iter_mut().zip(&mut partials) {
            *slot = buf.addr();
        }
        for launch in launches(problem, config, &ptrs)? {
            let mut args = launch.args.clone();
            let mut params: Vec<*mut c_void> = args.iter_mut().map(|a| a.as_param()).collect();
            let mut err = [0 as c_char; 640];
            let entry = launch.entry as i32;
            // SAFETY: `params` point at values of the kernel's argument types in order (the
            // argument lists of launch.rs follow the signatures), every address among them is
            // a live buffer of this function sized as `launches` expects, and `err` is a
            // writable buffer of the given length.
            let rc = unsafe {
                (loaded.launch)(
                    entry,
                    launch.grid.as_ptr(),
                    launch.block,
                    params.as_mut_ptr(),
                    err.as_mut_ptr(),
                    err.len(),
                )
            };
            if rc != 0 {
                // SAFETY: the runtime writes a NUL-terminated message into `err`.
                let text = unsafe { CStr::from_ptr(err.as_ptr()) };
                return Err(fault(
                    &build,
                    format!(
                        "{}: {}",
                        build.entries[launch.entry],
                        text.to_string_lossy()
                    ),
                ));
            }
            let partial_names = match problem {
                Problem::Gemm(_) => ["split-K partial products", "", ""],
                _ => ["partial outputs", "partial maxima", "partial sums"],
            };
            for (name, buf) in [("out", &out)]
                .into_iter()
                .chain(partial_names.into_iter().zip(&partials))
            {
                if let Some(at) = buf.damaged_guard() {
                    return Err(fault(
                        &build,
                        format!(
                            "{} wrote outside `{name}` ({at})",
                            build.entries[launch.entry]
                        ),
                    ));
                }
            }
        }
        Ok(out.floats())
    }
}

/// A buffer between guard bytes. The storage is 16-byte words so every element type, and the
/// 16-byte copies of the pipelined kernels, are aligned as on a device.
struct Guarded {
    words: Vec<u128>,
    /// Data bytes, starting at `GUARD`.
    len: usize,
    guard: u8,
}

impl Guarded {
    fn with(len: usize, guard: u8) -> Guarded {
        let total = (2 * GUARD + len).div_ceil(16);
        let mut g = Guarded {
            words: vec![0; total],
            len,
            guard,
        };
        g.bytes_mut().fill(guard);
        g
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.words.len() * 16;
        // SAFETY: the words' storage is n initialised bytes.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), n) }
    }

    fn bytes(&self) -> &[u8] {
        let n = self.words.len() * 16;
        // SAFETY: as above, read-only.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), n) }
    }

    fn data_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.bytes_mut()[GUARD..GUARD + len]
    }

    /// Inputs: a NaN of the element type in every guard byte pair or word (0x7f bytes read
    /// as f32, bf16 and f16 are all NaN), so a stray read poisons the result.
    fn input(t: &TensorBuf) -> Guarded {
        let bytes: Vec<u8> = match t {
            TensorBuf::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorBuf::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            TensorBuf::Bf16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        };
        let mut g = Guarded::with(bytes.len(), 0x7f);
        g.data_mut().copy_from_slice(&bytes);
        g
    }

    /// Block tables and context lengths: zero guards, a valid block index, so a stray read of
    /// a table stays inside the caches.
    fn words(v: &[u32]) -> Guarded {
        let mut g = Guarded::with(4 * v.len(), 0);
        g.data_mut()
            .copy_from_slice(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
        g
    }

    /// Outputs: data and guards NaN (0xff bytes), so an element the kernel never writes fails
    /// verification; the guards are checked after each launch.
    fn output(floats: usize) -> Guarded {
        Guarded::with(4 * floats, 0xff)
    }

    fn addr(&mut self) -> u64 {
        self.bytes_mut()[GUARD..].as_mut_ptr() as u64
    }

    /// Where a guard byte changed, if one did.
    fn damaged_guard(&self) -> Option<String> {
        let b = self.bytes();
        if let Some(i) = b[..GUARD].iter().rposition(|&x| x != self.guard) {
            return Some(format!("{} bytes before its start", GUARD - i));
        }
        let end = GUARD + self.len;
        b[end..end + GUARD]
            .iter()
            .position(|&x| x != self.guard)
            .map(|i| format!("{} bytes past its end", i))
    }

    fn floats(&self) -> Vec<f32> {
        self.bytes()[GUARD..GUARD + self.len]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::reduced;
    use crate::{Device, GpuSpace, Problem, Space};

    /// The plan emulates each candidate on its reduced problem: every candidate must be valid
    /// there, or the plan would prune it as failing on the emulator.
    #[test]
    fn every_candidate_is_valid_on_its_reduced_problem() {
        for model in ["h200", "a100", "mi250", "mi300x", "rx7900xtx"] {
            let device = Device::lookup(model).unwrap();
            for spec in [
                "gemm:m=1,n=8192,k=4096,dtype=bf16,b=nk",
                "gemm:m=16,n=1280,k=8192,dtype=f16,b=nk",
                "gemm:m=3,n=5000,k=1000,dtype=f32,b=nk",
                "gemm:m=2048,n=7168,k=8192,dtype=bf16,b=nk",
                "gemm:m=512,n=1000,k=4104,dtype=f16,b=kn",
                "flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
                "paged:num_seqs=32,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
            ] {
                let p: Problem = spec.parse().unwrap();
                for c in GpuSpace.candidates(&p, &device) {
                    let small = reduced(&p, &c);
                    if let Err(e) = GpuSpace.validate(&c, &small, &device) {
                        panic!("{model} {spec} {c}: not valid on {small}: {e}");
                    }
                }
            }
        }
    }
}
