//! The GPU kernels on the CPU. The sources of `kernels/hip/` compile as C++ with the host
//! target of their prelude and the SIMT runtime in `kernels/emulator/simt.h` (every GPU thread
//! a fiber, barriers and warp-wide operations exchanged through the block, NVIDIA's mma.sync,
//! wgmma (swizzled or not), mbarriers and TMA boxes and AMD's MFMA computed in their
//! documented layouts). A build runs through the
//! same [`launches`](super::launch::launches) as on a device, so a GPU config is verified
//! against the reference, awkward sizes included, on any machine with a C++ compiler.
//!
//! What a launch finds beyond a wrong answer: a block whose threads reach different barriers
//! or leave while others wait, a warp-wide operation in a wave the block does not fill, and
//! writes outside the output buffers (each buffer sits between guard bytes that are checked
//! after the launch). Input guard bytes are NaN, so a read past an input that reaches the
//! output fails verification. Timing means nothing here: it is a correctness tool.
//!
//! Each build is compiled once and cached by a hash of its source ([`unit`]); a caller about
//! to run many builds hands them to [`Emulator::prepare`] first, which compiles them several
//! to a translation unit.

mod guarded;
mod unit;

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use libloading::Library;
use rayon::prelude::*;

use super::compiler_io::{first_errors, run_with_input};
use super::launch::{input_alignment, launches, partial_floats, DevicePtrs, GemmScalePtrs};
use super::source::body_of;
use super::KernelBuild;
use crate::data::ProblemData;
use crate::device::GpuModel;
use crate::env::path_var;
use crate::problem::{FlashProblem, GemmProblem, PagedProblem};
use crate::reference::relative_error;
use crate::space::{has_mfma, has_mma, has_wgmma};
use crate::{Config, Device, GpuSpace, KernelError, Problem, Space};
use guarded::Guarded;
use unit::{loaded, runtime_name, EmulatedBuild, LaunchFn, Part};

/// Compilers tried in order when `$KERNTUNE_HOST_CXX` is not set.
const COMPILERS: &[&str] = &["c++", "g++", "clang++", "clang++-19", "clang++-15"];

/// The compiler's options for every unit. `-Og`: most of a unit's compile is its kernels',
/// which run little of the emulator's time (the runtime, which g++ optimizes further by a
/// pragma of its own, runs most of it): the GPU emulator tests from an empty cache took 223 s
/// against 251 at `-O1`, from a full one 71 against 68. No contraction of `a * b + c` into a fused
/// multiply-add (clang's default where the target has one): the kernels' arithmetic is what
/// they write, and the same with every host compiler.
const OPTIONS: &[&str] = &[
    "-std=c++17",
    "-Og",
    "-fPIC",
    "-shared",
    "-w",
    "-pthread",
    "-ffp-contract=off",
];

/// Options for the host's own instructions: on x86-64 hosts with FMA, `fmaf` (the kernels',
/// and every emulated matrix instruction's, multiply-add) is one instruction instead of a call
/// into the C library (9% of the emulator tests' time); its result is the same, correctly
/// rounded either way. Part of the cache key, so a cache shared with a host without FMA
/// holds each its own objects.
fn host_options() -> &'static [&'static str] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        return &["-mfma"];
    }
    &[]
}

/// Guard bytes on each side of every buffer: a write this far outside is caught; one further
/// out lands in other memory and may crash the process instead.
const GUARD: usize = 64 * 1024;

/// Most builds [`Emulator::prepare`] puts in one translation unit: past about this many the
/// fixed cost it saves is small beside the builds' own, and fewer units would leave threads
/// idle.
pub const UNIT_BUILDS: usize = 16;

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

/// Why a translation unit did not compile.
enum Compile {
    /// The compiler or the cache could not be used.
    Unavailable(String),
    /// The compiler refused the source.
    Fails(String),
}

/// A problem of the same build as `problem` under `config` (dtype, B layout, head sizes, block
/// size, cache type, GQA group are the build's or the kernel's indexing), small enough to emulate: each
/// size cut to one tile and a ragged one beyond it (two partitions for paged attention), two
/// KV heads at most, one batch, two sequences. `problem` when it is already that small.
pub fn reduced(problem: &Problem, config: &Config) -> Problem {
    let heads = |q: usize, kv: usize| {
        let kv2 = kv.min(2);
        (q / kv * kv2, kv2)
    };
    let small = match (problem, config) {
        (Problem::Gemm(p), Config::GpuGemm(c)) => {
            // Builds that copy or load rows in 16-byte pieces (8 values, 4 of f32, 16 of fp8):
            // their ragged part stays a multiple of a piece (the original sizes are, or the
            // config would not be valid for them).
            let piece = (16 / p.dtype.size()).max(8);
            let pieces = input_alignment(problem, config) == 16;
            let (dn, dk) = if pieces { (piece, piece) } else { (3, 5) };
            // An int4 problem's k stays whole groups (its build's group is the problem's).
            let k = match p.int4 {
                Some(group) => (c.bk + dk).next_multiple_of(group).min(p.k),
                None => p.k.min(c.bk + dk),
            };
            GemmProblem::new(
                p.m.min(c.bm + 1),
                p.n.min(c.bn + dn),
                k,
                p.dtype,
                p.b_layout,
            )
            // Scale blocks and int4 groups are the build's: kept.
            .and_then(|g| p.block.map_or(Ok(g), |b| g.with_block(b)))
            .and_then(|g| p.int4.map_or(Ok(g), |group| g.with_int4(group)))
            .map(Problem::Gemm)
        }
        (Problem::Flash(p), Config::GpuFlash(c)) => {
            let q_len = p.q_len.min(c.br + 1);
            let kv_len = p.kv_len.min(c.bc + 3).max(q_len.min(p.kv_len));
            let (q_heads, kv_heads) = heads(p.q_heads, p.kv_heads);
            // A window stays shorter than a key tile, so tiles hold keys it has passed.
            let window = p.window.map(|w| w.min((c.bc / 2).max(1)));
            FlashProblem::new(
                1, q_len, kv_len, q_heads, kv_heads, p.head_dim, p.causal, p.scale, p.dtype,
            )
            .and_then(|f| f.with_v_head_dim(p.v_head_dim))
            .and_then(|f| f.with_window(window))
            .and_then(|f| {
                f.with_sinks(p.sinks)
                    .with_cap(p.softcap)
                    .with_alibi(p.alibi)
            })
            .map(Problem::Flash)
        }
        (Problem::Paged(p), Config::GpuPaged(c)) => {
            let (q_heads, kv_heads) = heads(p.q_heads, p.kv_heads);
            // A window stays shorter than the context and, where it is longer than a
            // partition, spans two of them.
            let window = p.window.map(|w| w.min(c.partition + 5));
            let context_len = match window {
                Some(w) => p.context_len.min(w + 19),
                None => p.context_len.min(c.partition + 7),
            };
            PagedProblem::new(
                p.num_seqs.min(2),
                context_len,
                q_heads,
                kv_heads,
                p.head_dim,
                p.block_size,
                p.scale,
                p.dtype,
            )
            .and_then(|q| q.with_v_head_dim(p.v_head_dim))
            .and_then(|q| q.with_kv_dtype(p.kv_dtype))
            .and_then(|q| q.with_window(window))
            .and_then(|q| {
                q.with_sinks(p.sinks)
                    .with_cap(p.softcap)
                    .with_alibi(p.alibi)
            })
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
    /// The version and every compiler option: what the cache key holds of the compiler.
    identity: String,
    cache: PathBuf,
    /// Switch fibers with ucontext even where the assembly switch exists.
    portable: bool,
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

impl Emulator {
    /// An emulator of `model`, with the C++ compiler of `$KERNTUNE_HOST_CXX` or the first of
    /// [`COMPILERS`] found. Builds are cached in `$KERNTUNE_EMULATOR_CACHE`, or in
    /// `kerntune-emulator` under the system's temporary folder.
    pub fn new(model: &'static GpuModel) -> Result<Emulator, KernelError> {
        let (cxx, version) = match path_var("KERNTUNE_HOST_CXX") {
            Some(cxx) => {
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
        let cache = path_var("KERNTUNE_EMULATOR_CACHE")
            .unwrap_or_else(|| std::env::temp_dir().join("kerntune-emulator"));
        let identity = std::iter::once(version.as_str())
            .chain(OPTIONS.iter().copied())
            .chain(host_options().iter().copied())
            .collect::<Vec<_>>()
            .join(" ");
        Ok(Emulator {
            model,
            cxx,
            version,
            identity,
            cache,
            portable: false,
        })
    }

    /// The same emulator keeping its builds in `dir` rather than the default cache.
    pub fn with_cache(mut self, dir: impl Into<PathBuf>) -> Emulator {
        self.cache = dir.into();
        self
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

    /// The build's macros for this model's emulation, the emulator's first.
    fn defines(&self, build: &KernelBuild) -> Vec<(&'static str, usize)> {
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
    }

    fn part<'a>(&self, build: &'a KernelBuild, body: &'a str) -> Part<'a> {
        Part::new(build, body, self.defines(build), &self.identity)
    }

    /// Compiles those of `runs`' builds that are not in the cache yet, up to [`UNIT_BUILDS`]
    /// to a translation unit and the units in parallel, for a caller about to run them all:
    /// most of the compiler's cost per build is the same for every build, and a unit pays it
    /// once. Runs whose config is not valid for their problem are left out, and a unit that
    /// does not compile leaves its builds uncached: [`run`](Self::run) then compiles each
    /// alone and names the one at fault.
    pub fn prepare<'a>(&self, runs: impl IntoIterator<Item = (&'a Problem, &'a Config)>) {
        self.prepare_sources(
            runs.into_iter()
                .map(|(problem, config)| (problem, config, body_of(problem.family()))),
        );
    }

    /// [`prepare`](Self::prepare) for runs of [`run_source`](Self::run_source): each build
    /// with the kernel source it is run with (a test's edits of a source, for one).
    pub fn prepare_sources<'a>(
        &self,
        runs: impl IntoIterator<Item = (&'a Problem, &'a Config, &'a str)>,
    ) {
        let device = Device::Gpu(self.model);
        let builds: Vec<(KernelBuild, &str)> = runs
            .into_iter()
            .filter(|(problem, config, _)| GpuSpace.validate(config, problem, &device).is_ok())
            .filter_map(|(problem, config, body)| {
                KernelBuild::new(problem, config).ok().map(|b| (b, body))
            })
            .collect();
        // Missing builds by their key, grouped by the macros a unit shares.
        let mut groups: BTreeMap<Vec<String>, BTreeMap<String, Part<'_>>> = BTreeMap::new();
        for (build, body) in &builds {
            let part = self.part(build, body);
            if !part.path(&self.cache).exists() {
                groups
                    .entry(part.unit_flags())
                    .or_default()
                    .insert(part.key.clone(), part);
            }
        }
        let groups: Vec<Vec<Part<'_>>> = groups
            .into_values()
            .map(|parts| parts.into_values().collect())
            .collect();
        // Each group's runtime first, so that the units compiled in parallel find it.
        for parts in &groups {
            let _ = self.runtime(&parts[0].unit_flags());
        }
        let threads = rayon::current_num_threads().max(1);
        let units: Vec<&[Part<'_>]> = groups
            .iter()
            .flat_map(|parts| parts.chunks(parts.len().div_ceil(threads).clamp(1, UNIT_BUILDS)))
            .collect();
        units.par_iter().for_each(|unit| {
            // A failure is reported by the build's own compile when it is run.
            let _ = self.compile(unit);
        });
    }

    /// Compiles `body` in place of the build's source file (`kernels/hip/<family>.hip`), with
    /// the build's macros.
    fn load_source(&self, build: &KernelBuild, body: &str) -> Result<EmulatedBuild, KernelError> {
        let part = self.part(build, body);
        let path = part.path(&self.cache);
        if let Some(b) = loaded()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&path)
        {
            return Ok(*b);
        }
        let failed = |e| match e {
            Compile::Unavailable(reason) => unavailable(reason),
            Compile::Fails(reason) => fault(build, reason),
        };
        if path.exists() {
            // The runtime it links, should the cache have lost it since.
            self.runtime(&part.unit_flags()).map_err(failed)?;
        } else {
            self.compile(std::slice::from_ref(&part)).map_err(failed)?;
        }
        // SAFETY: the library is our own build of kernels/emulator/simt.h and kernels; its
        // initialisers only set up thread-local storage.
        let library = unsafe { Library::new(&path) }
            .map_err(|e| fault(build, format!("cannot load {}: {e}", path.display())))?;
        let launcher = part.launcher();
        // SAFETY: every build's launcher is defined by KT_HOST_ENTRIES with exactly this
        // signature.
        let launch = unsafe { library.get::<LaunchFn>(format!("{launcher}\0").as_bytes()) }
            .map(|f| *f)
            .map_err(|e| fault(build, format!("{} lacks {launcher}: {e}", path.display())))?;
        // Never unloaded: see EmulatedBuild. A unit's other builds load the same mapping.
        std::mem::forget(library);
        let b = EmulatedBuild { launch };
        loaded()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path, b);
        Ok(b)
    }

    /// The runtime object that units of `flags` link, compiled into the cache if it is not
    /// there yet.
    fn runtime(&self, flags: &[String]) -> Result<PathBuf, Compile> {
        // One compile of a runtime at a time in this process: the threads that find it
        // missing together would each compile it.
        static COMPILING: Mutex<()> = Mutex::new(());
        let name = runtime_name(flags, &self.identity);
        let path = self.cache.join(&name);
        let _one = COMPILING.lock().unwrap_or_else(|e| e.into_inner());
        if path.exists() {
            return Ok(path);
        }
        self.create_cache()?;
        let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
        let mut args: Vec<OsString> = flags.iter().map(OsString::from).collect();
        args.extend(
            [
                "-DKT_HOST_RUNTIME=1",
                "-fvisibility=hidden",
                "-x",
                "c++",
                "-",
            ]
            .map(OsString::from),
        );
        args.push(format!("-Wl,-soname,{name}").into());
        self.run_cxx(&args, unit::SIMT, &tmp).map_err(|e| match e {
            Compile::Fails(reason) => Compile::Fails(format!("the emulator's runtime {reason}")),
            unavailable => unavailable,
        })?;
        std::fs::rename(&tmp, &path).map_err(|e| {
            Compile::Unavailable(format!(
                "cannot store the emulator's runtime in {}: {e}",
                self.cache.display()
            ))
        })?;
        Ok(path)
    }

    /// Compiles `source` (the compiler's standard input) with every unit's options and
    /// `args` into `out`, which is removed when the compiler refuses it.
    fn run_cxx(&self, args: &[OsString], source: &str, out: &Path) -> Result<(), Compile> {
        let run = run_with_input(
            Command::new(&self.cxx)
                .args(OPTIONS)
                .args(host_options())
                .args(args)
                .arg("-o")
                .arg(out),
            source,
        )
        .map_err(Compile::Unavailable)?;
        if run.status.success() {
            return Ok(());
        }
        let _ = std::fs::remove_file(out);
        let errors = first_errors(&String::from_utf8_lossy(&run.stderr), || {
            run.status.to_string()
        });
        Err(Compile::Fails(format!(
            "does not compile for the host with {}: {errors}",
            self.cxx.display()
        )))
    }

    fn create_cache(&self) -> Result<(), Compile> {
        std::fs::create_dir_all(&self.cache).map_err(|e| {
            Compile::Unavailable(format!(
                "cannot create the build cache {}: {e}",
                self.cache.display()
            ))
        })
    }

    /// Compiles the unit of `parts` and stores it under each one's key.
    fn compile(&self, parts: &[Part<'_>]) -> Result<(), Compile> {
        self.create_cache()?;
        let Some(first) = parts.first() else {
            return Ok(());
        };
        let runtime = self.runtime(&first.unit_flags())?;
        // A private name, then renames: concurrent tests and tuners share the cache.
        let tmp = first.path(&self.cache).with_extension(format!(
            "{}.{:?}.tmp",
            std::process::id(),
            std::thread::current().id()
        ));
        let mut args: Vec<OsString> = first.unit_flags().into_iter().map(OsString::from).collect();
        args.extend(["-x", "c++", "-", "-x", "none"].map(OsString::from));
        args.push(runtime.into_os_string());
        // The runtime is found beside the unit when the unit is loaded.
        args.push("-Wl,-rpath,$ORIGIN".into());
        self.run_cxx(&args, &unit::source(parts), &tmp)?;
        unit::store(&tmp, parts, &self.cache).map_err(|e| {
            Compile::Unavailable(format!(
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
        let mut sinks = Guarded::floats_input(&data.sinks);
        let mut slopes = Guarded::floats_input(&data.slopes);
        let mut a_scales = Guarded::floats_input(&data.a_scales);
        let mut b_scales = Guarded::floats_input(&data.b_scales);
        let mut zeros = Guarded::floats_input(&data.zeros);
        let mut out = Guarded::output(data.out.len());
        let mut partials = partial_floats(problem, config).map(Guarded::output);
        let mut ptrs = DevicePtrs {
            out: out.addr(),
            block_tables: tables.addr(),
            context_lens: lens.addr(),
            max_blocks_per_seq: data.max_blocks_per_seq,
            kv_scales: data.kv_scales,
            sinks: if data.sinks.is_empty() {
                0
            } else {
                sinks.addr()
            },
            slopes: if data.slopes.is_empty() {
                0
            } else {
                slopes.addr()
            },
            gemm_scales: GemmScalePtrs {
                a: a_scales.addr(),
                a_len: data.a_scales.len(),
                b: b_scales.addr(),
                b_len: data.b_scales.len(),
                zeros: zeros.addr(),
                zeros_len: data.zeros.len(),
            },
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
                    [
                        launch.grid[0],
                        launch.grid[1],
                        launch.grid[2],
                        launch.cluster,
                    ]
                    .as_ptr(),
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

#[cfg(test)]
mod tests {
    use super::reduced;
    use crate::gpu::KernelBuild;
    use crate::{Device, GpuSpace, Problem, Space};

    /// The plan emulates each candidate on its reduced problem: every candidate must be valid
    /// there, or the plan would prune it as failing on the emulator, and the same build (an
    /// fp8 or latent cache, narrow values, a window, sinks, a cap or ALiBi, fp8 scale blocks
    /// and int4 groups kept), or the plan would judge another kernel.
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
                "gemm:m=16,n=1280,k=8192,dtype=fp8_e4m3,b=nk",
                "gemm:m=16,n=4608,k=7168,dtype=fp8_e4m3,b=nk,block=128",
                "gemm:m=16,n=1280,k=8192,dtype=f16,b=kn,int4=128",
                "gemm:m=300,n=1000,k=4104,dtype=bf16,b=kn,int4=4104",
                "flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
                "paged:num_seqs=32,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
                "flash:q_len=2048,q_heads=16,head_dim=192,v_head_dim=128,dtype=bf16,window=300,sinks=true",
                "paged:num_seqs=32,context_len=4096,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,dtype=bf16,kv_dtype=fp8_e4m3,block_size=64",
                "paged:num_seqs=8,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,dtype=f16,kv_dtype=fp8_e5m2,softcap=30",
                "flash:q_len=2048,q_heads=14,head_dim=128,dtype=bf16,alibi=true",
                "paged:num_seqs=8,context_len=2048,q_heads=14,head_dim=128,dtype=bf16,alibi=true",
            ] {
                let p: Problem = spec.parse().unwrap();
                for c in GpuSpace.candidates(&p, &device) {
                    let small = reduced(&p, &c);
                    if let Err(e) = GpuSpace.validate(&c, &small, &device) {
                        panic!("{model} {spec} {c}: not valid on {small}: {e}");
                    }
                    // The same kernel: the reduced problem's build is the original's.
                    let build = |p: &Problem| KernelBuild::new(p, &c).unwrap().defines;
                    assert_eq!(build(&small), build(&p), "{model} {spec} {c}: {small}");
                }
            }
        }
    }
}
