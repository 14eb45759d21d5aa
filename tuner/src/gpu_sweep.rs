//! Tuning on a GPU: the offline plan compiles and prunes every candidate (its compiles cached
//! in the database), then each kept candidate is loaded from the cache onto the device, run
//! once and verified against the CPU reference, and timed with the device's events, caches
//! flushed before each launch. A vendor library's solutions for the problem (rocBLAS on AMD)
//! are measured in the same sweep as more candidates. Pruned candidates are stored with their
//! reason, failures with theirs, exactly as the CPU sweep stores its own.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use kerntune_db::{Db, MeasurementRecord};
use kerntune_kernels::data::ProblemData;
use kerntune_kernels::gpu::device::{min_partition, GpuDevice, GpuProblem};
use kerntune_kernels::gpu::{KernelBuild, Verdict, GPU_SOURCE_HASH};
use kerntune_kernels::{Config, Device, GpuSpace, Problem, Space};

use crate::error::Result;
use crate::measure::{check_rows, settled, stats, Failure};
use crate::plan::{plan, Candidate, Plan, PlanOptions};
use crate::shapes::Derived;
use crate::tune::{crashed_before, invalid, sweep_candidates, Job, Measured, Sweep, Swept};

/// Launches timed per batch; batches continue until the policy's confidence, repetition or
/// time limit.
const BATCH: usize = 10;
/// Seed of the operands every candidate of a problem runs on.
const SEED: u64 = 0x6b65_726e;

/// A problem's operands and the CPU reference of its verification rows.
#[derive(Debug)]
struct Truth {
    data: ProblemData,
    rows: Vec<usize>,
    reference: Vec<Vec<f64>>,
}

impl Truth {
    fn new(problem: &Problem) -> Truth {
        let data = ProblemData::random(problem, SEED);
        let rows = data.verify_rows();
        let reference = data.reference_rows(&rows);
        Truth {
            data,
            rows,
            reference,
        }
    }
}

/// The sweep of one GPU: its plan and the compiled code of every kept candidate.
#[derive(Debug)]
pub struct GpuSweep<'g> {
    gpu: &'g dyn GpuDevice,
    runtime: String,
    /// Candidates with their verdicts, by problem key.
    candidates: HashMap<String, Vec<Candidate>>,
    /// Code objects (AMD) or CUBINs (NVIDIA), by build key.
    code: HashMap<String, Vec<u8>>,
    /// What the sweep could not do, said once each (e.g. rocBLAS missing).
    pub notes: Vec<String>,
}

impl<'g> GpuSweep<'g> {
    /// Plans `problems` for `device` (compiling what the database's cache lacks) and loads the
    /// compiled code of every kept candidate, as `options` say (the device run does not
    /// emulate: the device verifies each candidate itself).
    pub async fn prepare(
        db: &Db,
        device: &Device,
        gpu: &'g dyn GpuDevice,
        problems: &[Derived],
        options: &PlanOptions<'_>,
    ) -> Result<(GpuSweep<'g>, Plan)> {
        let plan = plan(Some(db), device, problems, options).await?;
        let code = db
            .compiles(GPU_SOURCE_HASH, &plan.target, &plan.compiler)
            .await?
            .into_iter()
            .filter_map(|(key, r)| r.code_object.map(|c| (key, c)))
            .collect();
        let candidates = plan
            .problems
            .iter()
            .map(|p| (p.problem.clone(), p.candidates.clone()))
            .collect();
        let runtime = format!("{}; {}; {}", gpu.name(), gpu.runtime(), plan.compiler);
        Ok((
            GpuSweep {
                gpu,
                runtime,
                candidates,
                code,
                notes: Vec::new(),
            },
            plan,
        ))
    }

    /// Loads, verifies and times one candidate on the uploaded problem.
    fn measure(
        &self,
        job: &Job<'_>,
        on_device: &mut dyn GpuProblem,
        truth: &Truth,
        config: &Config,
        beat: Option<f64>,
    ) -> Measured {
        let problem = &truth.data.problem;
        let error = |e: kerntune_kernels::KernelError| match e {
            kerntune_kernels::KernelError::DeviceLost { .. } => Failure::Lost(e.to_string()),
            _ => Failure::Error(e.to_string()),
        };
        // A vendor library's solution (rocBLAS) runs without a build of ours.
        if !matches!(config, Config::Rocblas(_)) {
            let build = KernelBuild::new(problem, config).map_err(error)?;
            let code = self.code.get(&build.key()).ok_or_else(|| {
                Failure::Error(format!(
                    "build {} has no compiled code in the database's cache",
                    build.key()
                ))
            })?;
            on_device.load(&build, code).map_err(error)?;
        }
        let out = on_device.run(config).map_err(error)?;
        let err = check_rows(
            problem,
            &out,
            truth.data.row_len(),
            &truth.rows,
            &truth.reference,
        )?;
        let policy = &job.policy;
        let started = Instant::now();
        let mut samples = Vec::new();
        while samples.len() < policy.max_reps.max(BATCH) {
            samples.extend(on_device.time(config, BATCH).map_err(error)?);
            if settled(&samples, policy.min_reps, started.elapsed(), policy, beat) {
                break;
            }
        }
        Ok((err, stats(problem, samples, true)))
    }
}

impl Sweep for GpuSweep<'_> {
    fn backend(&self) -> &str {
        self.gpu.backend()
    }

    fn source_hash(&self) -> &str {
        GPU_SOURCE_HASH
    }

    fn runtime(&self) -> String {
        self.runtime.clone()
    }

    fn sweep(
        &mut self,
        job: &Job<'_>,
        budget: Duration,
        problem: &Problem,
        crashed: &[String],
        bar: &ProgressBar,
    ) -> Option<Swept> {
        let planned = self
            .candidates
            .get(&problem.key())
            .cloned()
            .unwrap_or_default();
        let mut pruned: Vec<MeasurementRecord> = Vec::new();
        let mut runnable = Vec::new();
        for c in &planned {
            match &c.verdict {
                Verdict::Keep { .. } if crashed.contains(&c.config.to_json()) => {
                    pruned.push(crashed_before(&c.config));
                }
                Verdict::Keep { .. } => runnable.push(c.config),
                Verdict::Pruned { reason } => {
                    pruned.push(invalid(&c.config, format!("pruned offline: {reason}")));
                }
            }
        }
        let default = GpuSpace.default_config(problem, job.device);
        let truth = Truth::new(problem);
        let gpu = self.gpu;
        let mut on_device = match gpu.upload(&truth.data, min_partition(&runnable)) {
            Ok(d) => d,
            Err(e) => {
                // Nothing can run: every candidate is recorded with the reason, none wins.
                let why = format!("uploading the problem failed: {e}");
                return sweep_candidates(
                    job,
                    budget,
                    problem,
                    default,
                    &runnable,
                    pruned,
                    bar,
                    &mut |_, _| Err(Failure::Error(why.clone())),
                    None,
                );
            }
        };
        // The vendor library's solutions compete in the same sweep; without the library the
        // sweep goes on with ours and says why once.
        match on_device.library_candidates() {
            Ok(list) => runnable.extend(list),
            Err(e) => {
                let note = format!("vendor library candidates skipped: {e}");
                if !self.notes.contains(&note) {
                    self.notes.push(note);
                }
            }
        }
        let me = &*self;
        // The final round re-times each finalist in turn, back to back: side by side would
        // load each finalist's module again for every batch of launches.
        sweep_candidates(
            job,
            budget,
            problem,
            default,
            &runnable,
            pruned,
            bar,
            &mut |c, beat| me.measure(job, on_device.as_mut(), &truth, c, beat),
            None,
        )
    }
}
