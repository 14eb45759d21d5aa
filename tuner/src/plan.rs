//! The offline GPU plan (`tune plan`): for a GPU model and a model's shapes, every candidate of
//! the GPU space compiled for the model's target in parallel (the HIP compiler for AMD, NVRTC
//! for NVIDIA), its registers, LDS, scratch and
//! spills read from the code object, its occupancy computed, and what is not worth timing on
//! the device pruned with the reason. Compiles are cached in the database by kernel source
//! hash, target, compiler and build, so neither a later plan nor the device run repeats them.
//! With `--emulate`, each kept build also runs on the host emulator against the reference (on
//! a reduced problem of the same build), and wrong or failing builds are pruned before any
//! device time is spent on them. Needs no GPU.

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use kerntune_db::{CompileRecord, Db};
use kerntune_kernels::device::{GpuModel, Vendor};
use kerntune_kernels::gpu::emulator::{self, Emulator};
use kerntune_kernels::gpu::hip::HipCompiler;
use kerntune_kernels::gpu::metadata::{self, KernelResources};
use kerntune_kernels::gpu::nvrtc::NvrtcCompiler;
use kerntune_kernels::gpu::{judge, KernelBuild, Verdict, GPU_SOURCE_HASH};
use kerntune_kernels::{Config, Device, GpuSpace, Problem, Space};
use rayon::prelude::*;
use serde::Serialize;

use crate::error::{usage, Result, TuneError};
use crate::progress::Progress;
use crate::shapes::Derived;

/// Seconds the device run spends on a candidate besides its kernel time: module load, the
/// verification launch and its copy back, event setup.
pub const PER_CANDIDATE_S: f64 = 0.05;
/// Timed launches per candidate (warm-up included) the estimate assumes.
const LAUNCHES: f64 = 30.0;
/// Fraction of peak a good kernel reaches, for the estimate's kernel times.
const EFFICIENCY: f64 = 0.5;

/// One candidate of one problem.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub config: Config,
    pub build: String,
    #[serde(flatten)]
    pub verdict: Verdict,
    /// The main kernel's resources, when it compiled.
    pub resources: Option<KernelResources>,
}

/// The plan of one problem.
#[derive(Debug, Clone, Serialize)]
pub struct ProblemPlan {
    pub problem: String,
    pub origin: String,
    pub candidates: Vec<Candidate>,
    pub kept: usize,
    /// Estimated device seconds to time the kept candidates.
    pub estimate_s: f64,
}

/// The whole plan.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub device: String,
    pub target: String,
    pub warning: Option<String>,
    pub compiler: String,
    pub source_hash: String,
    pub min_waves: f64,
    pub problems: Vec<ProblemPlan>,
    /// Distinct builds, and how many were compiled now (the rest came from the cache).
    pub builds: usize,
    pub compiled: usize,
    pub estimate_s: f64,
    /// Pruning reasons by kind (`spills`, `over-LDS`, `low occupancy`, ...), counted.
    pub pruned: BTreeMap<String, usize>,
    /// What the host emulator checked, when asked to.
    pub emulated: Option<Emulated>,
}

impl Plan {
    /// Whether `g` can load this plan's code: a stand-in target (gfx940 for gfx942 where the
    /// compiler predates gfx942) serves the offline plan, but its code objects do not load on
    /// the device.
    pub fn check_loadable_on(&self, g: &GpuModel) -> Result<()> {
        if self.target == g.arch {
            return Ok(());
        }
        Err(usage(format!(
            "--device {}: the device loads {} code objects only, and {} builds {} (the offline plan's stand-in); install clang-19 and lld-19 (Debian 12) or ROCm 6, or set KERNTUNE_HIP_CLANG to a clang that knows {}",
            g.name, g.arch, self.compiler, self.target, g.arch
        )))
    }
}

/// The host emulator's part of a plan.
#[derive(Debug, Clone, Serialize)]
pub struct Emulated {
    /// The C++ compiler that built the kernels for the host.
    pub compiler: String,
    /// Distinct (build, reduced problem) pairs run, and how many failed or were wrong.
    pub runs: usize,
    pub failed: usize,
}

/// The compiler of a vendor (one a plan; HIP's is the larger by its caches).
enum Toolchain {
    Hip(Box<HipCompiler>),
    Nvrtc(NvrtcCompiler),
}

impl Toolchain {
    fn find(g: &GpuModel) -> Result<Toolchain> {
        match g.vendor {
            Vendor::Amd => HipCompiler::find_for(g)
                .map(|h| Toolchain::Hip(Box::new(h)))
                .map_err(|e| {
                usage(format!(
                    "{e}. The offline plan compiles every candidate with the HIP compiler; on Debian 12: apt-get install hipcc libamdhip64-dev"
                ))
            }),
            Vendor::Nvidia => NvrtcCompiler::find().map(Toolchain::Nvrtc).map_err(|e| {
                usage(format!(
                    "{e}. The offline plan for {} compiles every candidate with NVRTC",
                    g.name
                ))
            }),
        }
    }

    fn version(&self) -> &str {
        match self {
            Toolchain::Hip(h) => &h.version,
            Toolchain::Nvrtc(n) => &n.version,
        }
    }

    fn target_for(&self, g: &GpuModel) -> Result<(String, Option<String>)> {
        match self {
            Toolchain::Hip(h) => Ok(h.target_for(g)?),
            Toolchain::Nvrtc(_) => Ok((g.arch.to_string(), None)),
        }
    }

    /// The code object (AMD) or CUBIN (NVIDIA) and each kernel's resources.
    fn compile(
        &self,
        build: &KernelBuild,
        target: &str,
    ) -> std::result::Result<(Vec<u8>, Vec<KernelResources>), String> {
        match self {
            Toolchain::Hip(h) => {
                let object = h.compile(build, target)?;
                let resources = metadata::read(&object)?;
                Ok((object, resources))
            }
            Toolchain::Nvrtc(n) => n
                .compile(build, target, build.threads as u32)
                .map(|out| (out.cubin, out.kernels)),
        }
    }
}

/// Compiled builds: the main resources of each, or the compile error.
type Compiled = HashMap<String, Result<Vec<KernelResources>, String>>;

fn model(device: &Device) -> Result<&'static GpuModel> {
    match device {
        Device::Gpu(g) => Ok(g),
        Device::Cpu(_) => Err(usage(
            "tune plan is for GPU devices (e.g. --device mi250); the CPU needs no offline plan",
        )),
    }
}

/// How a plan is made, besides its device and problems.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlanOptions<'a> {
    /// Builds whose occupancy is below this many waves per SIMD (AMD) or warps per scheduler
    /// (NVIDIA) are pruned.
    pub min_waves: f64,
    /// Each problem's candidates are sampled evenly down to this many (the default and the
    /// heuristic always included).
    pub max_candidates: Option<usize>,
    /// Runs each kept build on the host emulator against the reference.
    pub emulate: bool,
    /// Compiles run at once; `None`: one per core.
    pub jobs: Option<usize>,
    /// How the compiles and emulator runs show their progress.
    pub progress: Progress,
    /// Raised to stop (the `tune` binary raises it on Ctrl-C): no compile or emulator run is
    /// handed to a worker after it, those in flight (at most one per job) finish and are
    /// cached, and the plan returns [`TuneError::PlanInterrupted`].
    pub stop: Option<&'a AtomicBool>,
}

impl PlanOptions<'_> {
    fn stopped(&self) -> bool {
        self.stop.is_some_and(|s| s.load(Ordering::SeqCst))
    }
}

/// Builds the plan. `db` caches compiles, stored as they finish, so that neither a later plan
/// nor the device run repeats them, even after a crash or Ctrl-C.
pub async fn plan(
    db: Option<&Db>,
    device: &Device,
    problems: &[Derived],
    options: &PlanOptions<'_>,
) -> Result<Plan> {
    let PlanOptions {
        min_waves,
        max_candidates,
        emulate,
        progress,
        ..
    } = *options;
    let g = model(device)?;
    let emulator = emulate
        .then(|| {
            Emulator::new(g).map_err(|e| {
                usage(format!(
                    "{e}. --emulate needs a C++ compiler: it runs each kept build on this CPU"
                ))
            })
        })
        .transpose()?;
    let toolchain = Toolchain::find(g)?;
    let (target, warning) = toolchain.target_for(g)?;
    let version = toolchain.version().to_string();

    // Every candidate (and the default, which the device run always times) of every problem.
    let mut per_problem = Vec::new();
    let mut builds: BTreeMap<String, KernelBuild> = BTreeMap::new();
    for d in problems {
        let mut configs = GpuSpace.candidates(&d.problem, device);
        if let Some(max) = max_candidates.filter(|&m| m > 0 && m < configs.len()) {
            let step = configs.len() as f64 / max as f64;
            configs = (0..max)
                .map(|i| configs[(i as f64 * step) as usize])
                .collect();
        }
        // The default first (the device run always times it), then the heuristic: a
        // budgeted search takes candidates in this order, the space's likeliest first.
        let default = GpuSpace.default_config(&d.problem, device);
        let heuristic = GpuSpace.heuristic(&d.problem, device);
        configs.retain(|c| *c != default && *c != heuristic);
        if heuristic != default && GpuSpace.validate(&heuristic, &d.problem, device).is_ok() {
            configs.insert(0, heuristic);
        }
        configs.insert(0, default);
        // A config the space refuses (a stored default of a variant that cannot compute the
        // problem) is pruned with the space's reason, never compiled.
        let mut list = Vec::new();
        for c in configs {
            if let Err(e) = GpuSpace.validate(&c, &d.problem, device) {
                list.push((c, Err(e.to_string())));
                continue;
            }
            let build = KernelBuild::new(&d.problem, &c)?;
            let key = build.key();
            builds.entry(key.clone()).or_insert(build);
            list.push((c, Ok(key)));
        }
        per_problem.push((d, list));
    }

    let mut compiled: Compiled = HashMap::new();
    if let Some(db) = db {
        for (key, r) in db.compiles(GPU_SOURCE_HASH, &target, &version).await? {
            if builds.contains_key(&key) {
                let resources = match (r.ok, r.resources) {
                    (true, Some(json)) => serde_json::from_str(&json)
                        .map_err(|e| format!("cached resources unreadable: {e}")),
                    _ => Err(r.message.unwrap_or_else(|| "compile failed".into())),
                };
                compiled.insert(key, resources);
            }
        }
    }
    let missing: Vec<KernelBuild> = builds
        .iter()
        .filter(|(k, _)| !compiled.contains_key(*k))
        .map(|(_, b)| b.clone())
        .collect();
    let bar = progress.bar(
        missing.len() as u64,
        "compiling for {msg} {bar:30} {pos}/{len} {eta}",
    );
    bar.set_message(target.clone());
    let left = missing.len();
    let compiling = Instant::now();
    if left > 0 {
        progress.line(format_args!(
            "compiling {left} builds for {target} ({} cached)",
            compiled.len()
        ));
    }
    let compile: Arc<CompileFn> = {
        let target = target.clone();
        Arc::new(move |build: &KernelBuild| toolchain.compile(build, &target))
    };
    let fresh = compile_all(compile, missing, &target, &version, db, options, &bar).await?;
    bar.finish_and_clear();
    if left > 0 && !options.stopped() {
        progress.line(format_args!(
            "compiled {} builds in {:.0} s",
            fresh.len(),
            compiling.elapsed().as_secs_f64()
        ));
    }
    if options.stopped() {
        return Err(TuneError::PlanInterrupted {
            compiled: fresh.len(),
            left: left - fresh.len(),
        });
    }
    let compiled_now = fresh.len();
    for r in fresh {
        let resources = match (r.ok, r.resources) {
            (true, Some(json)) => serde_json::from_str(&json).map_err(|e| e.to_string()),
            _ => Err(r.message.unwrap_or_default()),
        };
        compiled.insert(r.build, resources);
    }

    let mut pruned: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for (d, list) in per_problem {
        let kernel_s = (d.problem.flops() / (g.peak_f16_tflops * 1e12))
            .max(d.problem.min_bytes() / (g.bandwidth_gbs * 1e9))
            / EFFICIENCY;
        let mut candidates = Vec::new();
        for (config, key) in list {
            let key = match key {
                Ok(key) => key,
                Err(reason) => {
                    candidates.push(Candidate {
                        config,
                        build: String::new(),
                        verdict: Verdict::Pruned {
                            reason: format!("invalid: {reason}"),
                        },
                        resources: None,
                    });
                    continue;
                }
            };
            let result = &compiled[&key];
            let build = &builds[&key];
            let verdict = judge(build, result, g, min_waves);
            let resources = result
                .as_ref()
                .ok()
                .and_then(|ks| ks.iter().find(|k| k.name == build.entries[0]))
                .map(|k| build.at_launch(k));
            candidates.push(Candidate {
                config,
                build: key,
                verdict,
                resources,
            });
        }
        out.push((d, kernel_s, candidates));
    }
    let emulated = emulator
        .as_ref()
        .map(|emu| emulate_kept(emu, &mut out, options));
    if options.stopped() {
        // Every build is compiled and cached; only the emulator's verdicts are lost.
        return Err(TuneError::PlanInterrupted {
            compiled: compiled_now,
            left: 0,
        });
    }
    let out: Vec<ProblemPlan> = out
        .into_iter()
        .map(|(d, kernel_s, candidates)| {
            let kept = candidates.iter().filter(|c| c.verdict.is_kept()).count();
            for c in &candidates {
                if let Verdict::Pruned { reason } = &c.verdict {
                    let kind = reason.split(':').next().unwrap_or(reason).to_string();
                    *pruned.entry(kind).or_default() += 1;
                }
            }
            ProblemPlan {
                problem: d.problem.key(),
                origin: d.origin.clone(),
                estimate_s: kept as f64 * (PER_CANDIDATE_S + LAUNCHES * kernel_s),
                candidates,
                kept,
            }
        })
        .collect();
    Ok(Plan {
        device: device.identity(),
        target,
        warning,
        compiler: version,
        source_hash: GPU_SOURCE_HASH.into(),
        min_waves,
        estimate_s: out.iter().map(|p| p.estimate_s).sum(),
        problems: out,
        builds: builds.len(),
        compiled: compiled_now,
        pruned,
        emulated,
    })
}

/// What compiles a build: its code object (AMD) or CUBIN (NVIDIA) and each kernel's
/// resources, or the compiler's error.
type CompileFn = dyn Fn(&KernelBuild) -> std::result::Result<(Vec<u8>, Vec<KernelResources>), String>
    + Send
    + Sync;

/// Compiles stored together: a crash loses at most this many finished compiles, or those of
/// the last few seconds.
const STORE_EVERY: usize = 16;
const STORE_AFTER: Duration = Duration::from_secs(2);

/// Compiles `missing`, `options.jobs` (or one per core) at a time, storing the results in `db` as they
/// finish; returns them. Once `options.stop` is raised no compile is handed to a worker, and
/// those in flight finish and are stored.
///
/// Each compile runs on tokio's blocking pool rather than rayon's, so that this task stores
/// finished compiles while the rest run (a parallel iterator would hold every result until
/// the slowest build of its batch finished).
async fn compile_all(
    compile: Arc<CompileFn>,
    missing: Vec<KernelBuild>,
    target: &str,
    version: &str,
    db: Option<&Db>,
    options: &PlanOptions<'_>,
    bar: &ProgressBar,
) -> Result<Vec<CompileRecord>> {
    let threads = options
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let mut queue = missing.into_iter();
    let mut running = tokio::task::JoinSet::new();
    let mut fresh: Vec<CompileRecord> = Vec::new();
    let mut stored = 0;
    let mut last_store = Instant::now();
    loop {
        while running.len() < threads && !options.stopped() {
            let Some(build) = queue.next() else { break };
            let compile = Arc::clone(&compile);
            running.spawn_blocking(move || {
                // A compile that panics is a failed build, not a reason to lose the others.
                let out = std::panic::catch_unwind(AssertUnwindSafe(|| compile(&build)))
                    .unwrap_or_else(|panic| {
                        let why = (panic.downcast_ref::<String>().map(String::as_str))
                            .or_else(|| panic.downcast_ref::<&str>().copied())
                            .unwrap_or("no message");
                        Err(format!("the compile panicked: {why}"))
                    });
                compile_record(build.key(), out)
            });
        }
        if options.stopped() && !running.is_empty() {
            bar.set_message(format!("{target}: stopping after the compiles in flight"));
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        // Compiles' panics are caught above and nothing cancels these tasks: an error here is
        // a panic of this module's own code.
        fresh.push(done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())));
        bar.inc(1);
        if fresh.len() - stored >= STORE_EVERY || last_store.elapsed() >= STORE_AFTER {
            if let Some(db) = db {
                db.store_compiles(GPU_SOURCE_HASH, target, version, &fresh[stored..])
                    .await?;
            }
            stored = fresh.len();
            last_store = Instant::now();
        }
    }
    if let Some(db) = db {
        db.store_compiles(GPU_SOURCE_HASH, target, version, &fresh[stored..])
            .await?;
    }
    Ok(fresh)
}

/// The cache record of one compile.
fn compile_record(
    build: String,
    out: std::result::Result<(Vec<u8>, Vec<KernelResources>), String>,
) -> CompileRecord {
    match out {
        Ok((object, resources)) => CompileRecord {
            build,
            ok: true,
            message: None,
            resources: serde_json::to_string(&resources).ok(),
            code_object: Some(object),
        },
        Err(message) => CompileRecord {
            build,
            ok: false,
            message: Some(message),
            resources: None,
            code_object: None,
        },
    }
}

/// Consecutive slices of `runs` (keyed by build first, and sorted) of at most `builds`
/// distinct builds each.
fn batches_of_builds<T>(
    runs: &[((String, String), T)],
    builds: usize,
) -> Vec<&[((String, String), T)]> {
    let mut batches = Vec::new();
    let (mut start, mut distinct) = (0, 0);
    for (i, ((build, _), _)) in runs.iter().enumerate() {
        if i == 0 || *build != runs[i - 1].0 .0 {
            if distinct == builds {
                batches.push(&runs[start..i]);
                (start, distinct) = (i, 0);
            }
            distinct += 1;
        }
    }
    if start < runs.len() {
        batches.push(&runs[start..]);
    }
    batches
}

/// Runs every kept candidate's build on the host emulator, once per reduced problem, and
/// prunes the candidates of builds that fail or are wrong there.
fn emulate_kept(
    emu: &Emulator,
    plans: &mut [(&Derived, f64, Vec<Candidate>)],
    options: &PlanOptions<'_>,
) -> Emulated {
    // One run per distinct (build, reduced problem): builds repeat across a model's problems.
    let mut runs: BTreeMap<(String, String), (Problem, Config)> = BTreeMap::new();
    for (d, _, candidates) in plans.iter() {
        for c in candidates.iter().filter(|c| c.verdict.is_kept()) {
            let small = emulator::reduced(&d.problem, &c.config);
            runs.entry((c.build.clone(), small.key()))
                .or_insert((small, c.config));
        }
    }
    let bar = options.progress.bar(
        runs.len() as u64,
        "verifying on the host emulator {bar:30} {pos}/{len} {eta}",
    );
    let runs: Vec<_> = runs.into_iter().collect();
    let verifying = Instant::now();
    options.progress.line(format_args!(
        "verifying {} builds on the host emulator",
        runs.len()
    ));
    let mut failures: HashMap<(String, String), String> = HashMap::new();
    // A batch of runs at a time, their builds compiled together first (a translation unit of
    // several for each thread), so a stop waits for one batch at most.
    let builds = emulator::UNIT_BUILDS * rayon::current_num_threads().max(1);
    for batch in batches_of_builds(&runs, builds) {
        // Stopped: the plan is abandoned, so what is left need not run.
        if options.stopped() {
            break;
        }
        emu.prepare(batch.iter().map(|(_, (small, config))| (small, config)));
        failures.par_extend(batch.par_iter().filter_map(|(key, (small, config))| {
            if options.stopped() {
                return None;
            }
            // Already reduced: verify runs it as it is.
            let result = emu.verify(small, config);
            bar.inc(1);
            let why = match result {
                Ok(v) if v.passed() => return None,
                Ok(v) => format!(
                    "wrong on the host emulator: relative error {:.1e} (tolerance {:.0e}) on {}",
                    v.error, v.tolerance, v.problem
                ),
                Err(e) => format!("fails on the host emulator: {e}"),
            };
            Some((key.clone(), why))
        }));
    }
    bar.finish_and_clear();
    if !options.stopped() {
        options.progress.line(format_args!(
            "verified {} builds on the host emulator in {:.0} s, {} failed",
            runs.len(),
            verifying.elapsed().as_secs_f64(),
            failures.len()
        ));
    }
    for (d, _, candidates) in plans.iter_mut() {
        for c in candidates.iter_mut().filter(|c| c.verdict.is_kept()) {
            let key = (
                c.build.clone(),
                emulator::reduced(&d.problem, &c.config).key(),
            );
            if let Some(why) = failures.get(&key) {
                c.verdict = Verdict::Pruned {
                    reason: why.clone(),
                };
            }
        }
    }
    Emulated {
        compiler: emu.compiler(),
        runs: runs.len(),
        failed: failures.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kerntune_kernels::gpu::occupancy::Occupancy;

    fn kept(config: Config, problem: &Problem) -> Candidate {
        Candidate {
            build: KernelBuild::new(problem, &config).unwrap().key(),
            config,
            verdict: Verdict::Keep {
                occupancy: Occupancy {
                    waves_per_simd: 4.0,
                    workgroups_per_cu: 1,
                    limited_by: "waves",
                },
            },
            resources: None,
        }
    }

    #[test]
    fn a_stand_in_target_is_refused_for_the_device_naming_the_compilers_that_know_it() {
        let Device::Gpu(mi300x) = Device::lookup("mi300x").unwrap() else {
            unreachable!()
        };
        let plan = |target: &str| Plan {
            device: "mi300x/gfx942/304cu".into(),
            target: target.into(),
            warning: None,
            compiler: "Debian clang version 15.0.6".into(),
            source_hash: GPU_SOURCE_HASH.into(),
            min_waves: 1.0,
            problems: Vec::new(),
            builds: 0,
            compiled: 0,
            estimate_s: 0.0,
            pruned: BTreeMap::new(),
            emulated: None,
        };
        plan("gfx942").check_loadable_on(mi300x).unwrap();
        let err = plan("gfx940").check_loadable_on(mi300x).unwrap_err();
        assert!(matches!(err, TuneError::Usage(_)), "{err:?}");
        let err = err.to_string();
        for part in [
            "--device mi300x",
            "gfx942 code objects only",
            "Debian clang version 15.0.6 builds gfx940",
            "clang-19 and lld-19",
            "KERNTUNE_HIP_CLANG",
        ] {
            assert!(err.contains(part), "{part:?} not in {err}");
        }
    }

    #[test]
    fn batches_hold_at_most_so_many_builds_and_keep_a_build_s_runs_together() {
        let key = |b: &str, p: &str| ((b.to_string(), p.to_string()), ());
        let runs = [
            key("a", "1"),
            key("a", "2"),
            key("b", "1"),
            key("c", "1"),
            key("c", "2"),
            key("c", "3"),
            key("d", "1"),
        ];
        let builds = |batch: &[((String, String), ())]| -> Vec<String> {
            batch.iter().map(|((b, p), _)| format!("{b}{p}")).collect()
        };
        let batches: Vec<Vec<String>> = batches_of_builds(&runs, 2)
            .into_iter()
            .map(builds)
            .collect();
        assert_eq!(
            batches,
            [vec!["a1", "a2", "b1"], vec!["c1", "c2", "c3", "d1"]]
        );
        assert_eq!(batches_of_builds(&runs, 10).len(), 1);
        assert_eq!(batches_of_builds(&runs, 1).len(), 4);
        assert!(batches_of_builds::<()>(&[], 3).is_empty());
    }

    #[test]
    fn builds_that_fail_on_the_emulator_are_pruned_with_the_reason() {
        let h200 = Device::lookup("h200").unwrap();
        let Device::Gpu(g) = h200 else { unreachable!() };
        let emu = Emulator::new(g).unwrap();
        let d = Derived {
            problem: "gemm:m=5,n=7,k=3,dtype=bf16".parse().unwrap(),
            origin: "test".into(),
        };
        let good = GpuSpace.default_config(&d.problem, &h200);
        // An AMD MFMA config, as a plan built from a stale or hand-edited space might keep.
        let mfma = GpuSpace
            .candidates(&d.problem, &Device::lookup("mi250").unwrap())
            .into_iter()
            .find(|c| c.to_string().contains("mfma"))
            .unwrap();
        let mut plans = vec![(
            &d,
            0.0,
            vec![kept(good, &d.problem), kept(mfma, &d.problem)],
        )];
        // A stopped plan runs nothing more: both stay as they were.
        let stop = AtomicBool::new(true);
        let stopped = PlanOptions {
            stop: Some(&stop),
            ..Default::default()
        };
        let e = emulate_kept(&emu, &mut plans, &stopped);
        assert_eq!(e.failed, 0);
        assert!(plans[0].2.iter().all(|c| c.verdict.is_kept()));

        let e = emulate_kept(&emu, &mut plans, &PlanOptions::default());
        assert_eq!((e.runs, e.failed), (2, 1));
        let [ok, bad] = &plans[0].2[..] else {
            unreachable!()
        };
        assert!(ok.verdict.is_kept());
        let Verdict::Pruned { reason } = &bad.verdict else {
            panic!("{bad:?}")
        };
        assert!(
            reason.starts_with("fails on the host emulator") && reason.contains("MFMA"),
            "{reason}"
        );
    }

    /// `n` distinct builds of one MI250 GEMM problem.
    fn builds(n: usize) -> Vec<KernelBuild> {
        let mi250 = Device::lookup("mi250").unwrap();
        let p: Problem = "gemm:m=64,n=1024,k=4096,dtype=bf16".parse().unwrap();
        let mut seen = std::collections::HashSet::new();
        let all: Vec<KernelBuild> = GpuSpace
            .candidates(&p, &mi250)
            .iter()
            .map(|c| KernelBuild::new(&p, c).unwrap())
            .filter(|b| seen.insert(b.key()))
            .take(n)
            .collect();
        assert_eq!(all.len(), n);
        all
    }

    /// A compile standing in for the compiler: a few milliseconds, then an object.
    fn object_of(
        build: &KernelBuild,
    ) -> std::result::Result<(Vec<u8>, Vec<KernelResources>), String> {
        std::thread::sleep(Duration::from_millis(20));
        Ok((build.key().into_bytes(), Vec::new()))
    }

    async fn cached(db: &Db) -> Vec<String> {
        let mut keys: Vec<String> = db
            .compiles(GPU_SOURCE_HASH, "gfx90a", "stand-in 1")
            .await
            .unwrap()
            .into_keys()
            .collect();
        keys.sort();
        keys
    }

    async fn compile_with(
        compile: Arc<CompileFn>,
        builds: Vec<KernelBuild>,
        db: &Db,
        options: &PlanOptions<'_>,
    ) -> Vec<CompileRecord> {
        let bar = ProgressBar::hidden();
        compile_all(
            compile,
            builds,
            "gfx90a",
            "stand-in 1",
            Some(db),
            options,
            &bar,
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_stopped_plan_caches_every_compile_it_ran_and_starts_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("p.db")).await.unwrap();
        let all = builds(30);
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // The third compile raises the stop, as a Ctrl-C while it runs would.
        let compile: Arc<CompileFn> = {
            let (stop, started) = (Arc::clone(&stop), Arc::clone(&started));
            Arc::new(move |b: &KernelBuild| {
                if started.fetch_add(1, Ordering::SeqCst) == 2 {
                    stop.store(true, Ordering::SeqCst);
                }
                object_of(b)
            })
        };
        let options = PlanOptions {
            stop: Some(&stop),
            jobs: Some(2),
            ..Default::default()
        };
        let fresh = compile_with(compile, all.clone(), &db, &options).await;
        let ran = started.load(Ordering::SeqCst);
        // Besides the third, at most one compile was handed to the two workers; it finished,
        // and none was handed over after.
        assert!((3..=4).contains(&ran), "{ran} compiles ran");
        assert_eq!(fresh.len(), ran);
        assert!(fresh.iter().all(|r| r.ok));
        let mut ran_keys: Vec<String> = fresh.iter().map(|r| r.build.clone()).collect();
        ran_keys.sort();
        assert_eq!(
            cached(&db).await,
            ran_keys,
            "every compile that ran is cached"
        );

        // The next plan compiles the rest only.
        let rest: Vec<KernelBuild> = all
            .iter()
            .filter(|b| !ran_keys.contains(&b.key()))
            .cloned()
            .collect();
        assert_eq!(rest.len(), all.len() - ran);
        let fresh = compile_with(Arc::new(object_of), rest, &db, &PlanOptions::default()).await;
        assert_eq!(fresh.len(), all.len() - ran);
        assert_eq!(cached(&db).await.len(), all.len());
    }

    #[tokio::test]
    async fn compiles_are_cached_while_the_rest_run() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.db");
        let db = Db::open(&path).await.unwrap();
        let all = builds(STORE_EVERY + 2);
        let last = all.last().unwrap().key();
        // Two at a time, the last build starts once STORE_EVERY have finished; it waits until
        // the database, read by another process as after a crash, holds some of them.
        let compile: Arc<CompileFn> = Arc::new(move |b: &KernelBuild| {
            if b.key() == last {
                let count = || {
                    let out = std::process::Command::new("python3")
                        .args([
                            "-c",
                            "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT count(*) FROM gpu_compiles').fetchone()[0])",
                        ])
                        .arg(&path)
                        .output()
                        .expect("python3 with its sqlite3 module runs (README, Set-up)");
                    String::from_utf8_lossy(&out.stdout)
                        .trim()
                        .parse::<usize>()
                        .unwrap_or(0)
                };
                let waited = Instant::now();
                while count() == 0 {
                    if waited.elapsed() > Duration::from_secs(30) {
                        return Err("nothing was cached while this build ran".into());
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            object_of(b)
        });
        let options = PlanOptions {
            jobs: Some(2),
            ..Default::default()
        };
        let fresh = compile_with(compile, all.clone(), &db, &options).await;
        assert!(
            fresh.iter().all(|r| r.ok),
            "{:?}",
            fresh.iter().find(|r| !r.ok)
        );
        assert_eq!(cached(&db).await.len(), all.len());
    }

    #[tokio::test]
    async fn a_compile_that_panics_is_a_failed_build_and_the_others_are_cached() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("p.db")).await.unwrap();
        let all = builds(6);
        let bad = all[2].key();
        let compile: Arc<CompileFn> = Arc::new(move |b: &KernelBuild| {
            assert_ne!(b.key(), bad, "a compiler wrapper's bug");
            object_of(b)
        });
        let fresh = compile_with(compile, all.clone(), &db, &PlanOptions::default()).await;
        assert_eq!(fresh.len(), all.len());
        let failed: Vec<&CompileRecord> = fresh.iter().filter(|r| !r.ok).collect();
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].build, all[2].key());
        let why = failed[0].message.as_deref().unwrap();
        assert!(
            why.starts_with("the compile panicked") && why.contains("a compiler wrapper's bug"),
            "{why}"
        );
        assert_eq!(cached(&db).await.len(), all.len());
    }
}
