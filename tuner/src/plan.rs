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

use indicatif::{ProgressBar, ProgressStyle};
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

use crate::error::{usage, Result};
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

/// The host emulator's part of a plan.
#[derive(Debug, Clone, Serialize)]
pub struct Emulated {
    /// The C++ compiler that built the kernels for the host.
    pub compiler: String,
    /// Distinct (build, reduced problem) pairs run, and how many failed or were wrong.
    pub runs: usize,
    pub failed: usize,
}

/// The compiler of a vendor.
enum Toolchain {
    Hip(HipCompiler),
    Nvrtc(NvrtcCompiler),
}

impl Toolchain {
    fn find(g: &GpuModel) -> Result<Toolchain> {
        match g.vendor {
            Vendor::Amd => HipCompiler::find().map(Toolchain::Hip).map_err(|e| {
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
            Toolchain::Nvrtc(n) => n.compile(build, target, build.threads as u32),
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

/// Builds the plan. `db` caches compiles; `max_candidates` samples each problem's candidates
/// evenly (the default always included); `progress` shows a bar on a terminal.
pub async fn plan(
    db: Option<&Db>,
    device: &Device,
    problems: &[Derived],
    min_waves: f64,
    max_candidates: Option<usize>,
    emulate: bool,
    progress: bool,
) -> Result<Plan> {
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
        let mut list = Vec::new();
        for c in configs {
            let build = KernelBuild::new(&d.problem, &c)?;
            let key = build.key();
            builds.entry(key.clone()).or_insert(build);
            list.push((c, key));
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
    let missing: Vec<&KernelBuild> = builds
        .iter()
        .filter(|(k, _)| !compiled.contains_key(*k))
        .map(|(_, b)| b)
        .collect();
    let bar = ProgressBar::new(missing.len() as u64);
    if progress {
        bar.set_style(
            ProgressStyle::with_template("compiling for {msg} {bar:30} {pos}/{len} {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(target.clone());
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let fresh: Vec<CompileRecord> = missing
        .par_iter()
        .map(|build| {
            let out = toolchain.compile(build, &target);
            bar.inc(1);
            match out {
                Ok((object, resources)) => CompileRecord {
                    build: build.key(),
                    ok: true,
                    message: None,
                    resources: serde_json::to_string(&resources).ok(),
                    code_object: Some(object),
                },
                Err(message) => CompileRecord {
                    build: build.key(),
                    ok: false,
                    message: Some(message),
                    resources: None,
                    code_object: None,
                },
            }
        })
        .collect();
    bar.finish_and_clear();
    if let Some(db) = db {
        db.store_compiles(GPU_SOURCE_HASH, &target, &version, &fresh)
            .await?;
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
        .map(|emu| emulate_kept(emu, &mut out, progress));
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

/// Runs every kept candidate's build on the host emulator, once per reduced problem, and
/// prunes the candidates of builds that fail or are wrong there.
fn emulate_kept(
    emu: &Emulator,
    plans: &mut [(&Derived, f64, Vec<Candidate>)],
    progress: bool,
) -> Emulated {
    // One run per distinct (build, reduced problem): builds repeat across a model's problems.
    let mut runs: BTreeMap<(String, String), (Problem, Config)> = BTreeMap::new();
    for (d, _, candidates) in plans.iter() {
        for c in candidates.iter().filter(|c| c.verdict.is_kept()) {
            let small = emulator::reduced(&d.problem, &c.config);
            runs.entry((c.build.clone(), small.key()))
                .or_insert((d.problem, c.config));
        }
    }
    let bar = ProgressBar::new(runs.len() as u64);
    if progress {
        bar.set_style(
            ProgressStyle::with_template(
                "verifying on the host emulator {bar:30} {pos}/{len} {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let failures: HashMap<(String, String), String> = runs
        .par_iter()
        .filter_map(|(key, (problem, config))| {
            let result = emu.verify(problem, config);
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
        })
        .collect();
    bar.finish_and_clear();
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
        let e = emulate_kept(&emu, &mut plans, false);
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
}
