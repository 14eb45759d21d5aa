//! The tuning loop: for each problem, prune, verify, time, pick the winner, commit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar};
use kerntune_db::Stats;
use kerntune_db::{
    Claim, Db, DeviceRecord, KernelRecord, MeasurementRecord, ProblemRecord, ProblemResult,
    RunStatus, Status,
};
use kerntune_kernels::{Backend, Config, Device, Problem, Space};

use crate::error::{Result, TuneError};
use crate::measure::{Failure, Policy, Workload};
use crate::operands::Operands;
use crate::pace::{search_over, Pace};
use crate::progress::{fmt_time, Progress};
use crate::search::{search, Strategy};
use crate::shapes::Derived;

/// Everything a tuning job needs besides the problems and the backend that sweeps them.
pub struct Job<'a> {
    pub db: &'a Db,
    pub device: &'a Device,
    pub strategy: Strategy,
    pub budget: Duration,
    pub total_budget: Duration,
    pub max_configs: usize,
    pub retune: bool,
    pub policy: Policy,
    pub command_line: String,
    pub progress: Progress,
    /// Raised to stop the job (the `tune` binary raises it on Ctrl-C): the loop stops
    /// between candidates, commits the problems it finished and returns
    /// [`TuneError::Interrupted`]. A flag per job, so that a program running jobs side by
    /// side can stop one of them.
    pub stop: &'a AtomicBool,
}

impl std::fmt::Debug for Job<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("device", &self.device.name())
            .field("strategy", &self.strategy)
            .finish()
    }
}

/// One row of the summary.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    pub problem: String,
    pub origin: String,
    /// `tuned`, `skipped` (already tuned, by an earlier run or one at the same time),
    /// `no-winner`, `device-lost`, `budget` (not reached), `elsewhere` (another run was still
    /// tuning it when this one's budget ran out).
    pub status: String,
    pub winner: Option<String>,
    pub median_ns: Option<f64>,
    pub throughput: Option<f64>,
    pub unit: Option<String>,
    pub speedup: Option<f64>,
    /// What its search could take: `--budget`, or less where the run was paced to fit
    /// `--total-budget` (see [`crate::pace`]).
    pub search_budget_s: Option<f64>,
    /// Candidates the search measured.
    pub measured: usize,
    /// Measurements of the final round, besides the search's.
    pub final_round: usize,
    pub pruned: usize,
    pub failed: usize,
}

pub const TOOL_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What sweeps the candidates of one problem: the CPU kernels in this process
/// ([`CpuSweep`]), or a GPU's ([`crate::gpu_sweep::GpuSweep`]).
pub trait Sweep {
    /// Stored with each measurement: `cpu`, `hip` or `cuda`.
    fn backend(&self) -> &str;
    /// The hash of the kernel sources the results are bound to.
    fn source_hash(&self) -> &str;
    /// Runtime and driver versions, stored with the device (empty on the CPU).
    fn runtime(&self) -> String {
        String::new()
    }
    /// Measures the candidates of one problem, searching for up to `budget`, but for
    /// `crashed` (configs as JSON that left the device unusable in earlier runs, recorded as
    /// pruned); `None` when interrupted (nothing of it is committed).
    fn sweep(
        &mut self,
        job: &Job<'_>,
        budget: Duration,
        problem: &Problem,
        crashed: &[String],
        bar: &ProgressBar,
    ) -> Option<Swept>;
}

/// One problem's sweep: every record (pruned ones included), which won, which is the default.
#[derive(Debug)]
pub struct Swept {
    pub records: Vec<MeasurementRecord>,
    /// How many of the records (the last ones) are the final round's.
    pub final_round: usize,
    pub winner: Option<usize>,
    pub default: Option<usize>,
    pub pruned: usize,
    /// How long the search took, the final round not included.
    pub searched: Duration,
    /// The config that left the device unusable, and why: the sweep stopped there, no
    /// winner, and nothing more can run in this process.
    pub lost: Option<(Config, String)>,
}

/// How a candidate that left the device unusable is recorded (its measurement's message
/// says so): later runs skip it.
pub const LOST: &str = "left the device unusable";

/// The CPU kernels, run in this process.
pub struct CpuSweep<'a> {
    pub backend: &'a dyn Backend,
    pub space: &'a dyn Space,
    /// The operands' memory, handed from each problem's workload to the next.
    operands: Operands,
}

impl<'a> CpuSweep<'a> {
    pub fn new(backend: &'a dyn Backend, space: &'a dyn Space) -> CpuSweep<'a> {
        CpuSweep {
            backend,
            space,
            operands: Operands::default(),
        }
    }
}

impl std::fmt::Debug for CpuSweep<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuSweep")
            .field("backend", &self.backend.name())
            .finish()
    }
}

pub fn device_record(device: &Device) -> DeviceRecord {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into());
    match device {
        Device::Cpu(c) => DeviceRecord {
            identity: device.identity(),
            kind: "cpu".into(),
            model: c.model.clone(),
            arch: c.isa.to_string(),
            compute_units: c.threads as i64,
            runtime: String::new(),
            host,
        },
        Device::Gpu(g) => DeviceRecord {
            identity: device.identity(),
            kind: "gpu".into(),
            model: g.name.into(),
            arch: g.arch.into(),
            compute_units: g.compute_units as i64,
            runtime: String::new(),
            host,
        },
    }
}

pub fn kernel_record(problem: &Problem, backend: &str, source_hash: &str) -> KernelRecord {
    KernelRecord {
        family: problem.family().to_string(),
        backend: backend.into(),
        variant: backend.into(),
        source_hash: source_hash.into(),
    }
}

/// Tunes every problem with `sweep`; returns the summary. Interrupted runs return
/// `TuneError::Interrupted` after committing what was finished.
pub async fn run(
    job: &Job<'_>,
    sweep: &mut dyn Sweep,
    problems: &[Derived],
) -> Result<Vec<Outcome>> {
    let mut record = device_record(job.device);
    record.runtime = sweep.runtime();
    let device_id = job.db.device_id(&record).await?;
    let run_id = job
        .db
        .begin_run(TOOL_VERSION, &job.command_line, device_id, &record.host)
        .await?;
    // Re-tuning passes by only what another run re-tuned since this one began.
    let tuned_since = if job.retune {
        Some(job.db.run_started_at(run_id).await?)
    } else {
        None
    };
    let bars = MultiProgress::new();
    if job.progress != Progress::Bars {
        bars.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let overall = bars.add(job.progress.bar(
        problems.len() as u64,
        "{prefix:>8} [{bar:30}] {pos}/{len} problems, ETA {eta}",
    ));
    overall.set_prefix("overall");
    let started = Instant::now();
    // Which problems are to tune decides how the total budget is shared among them.
    let mut kernel_ids = Vec::with_capacity(problems.len());
    let mut pending = Vec::with_capacity(problems.len());
    for d in problems {
        let kernel = kernel_record(&d.problem, sweep.backend(), sweep.source_hash());
        let kernel_id = job.db.kernel_id(&kernel).await?;
        kernel_ids.push(kernel_id);
        pending.push(
            job.retune
                || !job
                    .db
                    .is_tuned(device_id, kernel_id, &d.problem.key())
                    .await?,
        );
    }
    let mut pace = Pace::new(
        job.total_budget,
        job.budget,
        pending.iter().filter(|&&p| p).count(),
    );
    // A claim outlasts the problem's search, its verification and final round; a process
    // killed on another host holds its problem this long (on this host, not at all).
    let lease = job.budget * 4 + CLAIM_MARGIN;
    let mut outcomes: Vec<Option<Outcome>> = vec![None; problems.len()];
    let blank = |i: usize, status: &str| Outcome {
        problem: problems[i].problem.key(),
        origin: problems[i].origin.clone(),
        status: status.into(),
        winner: None,
        median_ns: None,
        throughput: None,
        unit: None,
        speedup: None,
        search_budget_s: None,
        measured: 0,
        final_round: 0,
        pruned: 0,
        failed: 0,
    };
    let mut interrupted = false;
    let mut out_of_budget = false;
    // The problem, config and reason of a candidate that left the device unusable.
    let mut device_lost: Option<(String, Config, String)> = None;
    // Problems another run holds: passed by, then waited for once the rest is done.
    let mut held: Vec<usize> = Vec::new();
    let mut order: Vec<usize> = (0..problems.len()).collect();
    'passes: loop {
        for &i in &order {
            if job.stop.load(Ordering::SeqCst) {
                interrupted = true;
                break 'passes;
            }
            let d = &problems[i];
            let key = d.problem.key();
            let kernel_id = kernel_ids[i];
            // Checked again as its turn comes: another run may have tuned it meanwhile, or
            // be tuning it now.
            let waited = held.contains(&i);
            match job
                .db
                .claim(
                    run_id,
                    device_id,
                    kernel_id,
                    &key,
                    &record.host,
                    lease,
                    tuned_since.as_deref(),
                )
                .await?
            {
                Claim::Tuned => {
                    if pending[i] && !waited {
                        pace.skipped();
                    }
                    held.retain(|&h| h != i);
                    outcomes[i] = Some(blank(i, "skipped"));
                    overall.inc(1);
                    continue;
                }
                Claim::Held { host, pid } => {
                    if !waited {
                        job.progress.line(format_args!(
                            "{key}: being tuned by process {pid} on {host}; going on with the others"
                        ));
                        if pending[i] {
                            pace.skipped();
                        }
                        held.push(i);
                    }
                    continue;
                }
                Claim::Ours => {
                    if waited {
                        // Its run stopped without it: the problem is this run's after all.
                        held.retain(|&h| h != i);
                        if pending[i] {
                            pace.resumed();
                        }
                    }
                }
            }
            if started.elapsed() >= job.total_budget {
                out_of_budget = true;
                break 'passes;
            }
            let bar = bars.add(
                job.progress
                    .bar(0, "{prefix:>8} [{bar:30}] {pos}/{len} configs {msg}"),
            );
            bar.set_prefix(d.problem.family().to_string());
            bar.set_message(key.clone());
            let problem_started = Instant::now();
            let budget = pace.search_budget(started.elapsed());
            // Configs that left the device unusable in an earlier run are not run again (but
            // for --retune, which runs everything afresh).
            let crashed = if job.retune {
                Vec::new()
            } else {
                job.db
                    .crashed_configs(device_id, kernel_id, &key, LOST)
                    .await?
            };
            let result = sweep.sweep(job, budget, &d.problem, &crashed, &bar);
            bar.finish_and_clear();
            bars.remove(&bar);
            let Some(Swept {
                records: measurements,
                final_round,
                winner,
                default,
                pruned,
                searched,
                lost,
            }) = result
            else {
                interrupted = true;
                break 'passes;
            };
            let record = ProblemRecord {
                family: d.problem.family().to_string(),
                key: key.clone(),
                fields: serde_json::to_string(&d.problem).expect("problems serialise"),
            };
            job.db
                .record_problem(&ProblemResult {
                    run_id,
                    device_id,
                    kernel_id,
                    problem: &record,
                    measurements: &measurements,
                    winner,
                    default,
                    final_round,
                    tool_version: TOOL_VERSION,
                })
                .await?;
            let w = winner.map(|w| &measurements[w]);
            let ws = w.and_then(|w| w.stats.as_ref());
            let ds = default.and_then(|d| measurements[d].stats.as_ref());
            outcomes[i] = Some(Outcome {
                winner: w.map(|w| {
                    Config::from_json(&w.config)
                        .map(|c| c.to_string())
                        .unwrap_or_default()
                }),
                median_ns: ws.map(|s| s.median_ns),
                throughput: ws.map(|s| s.throughput),
                unit: ws.map(|s| s.unit.clone()),
                speedup: ws.zip(ds).map(|(w, d)| d.median_ns / w.median_ns),
                search_budget_s: Some(budget.as_secs_f64()),
                measured: measurements.len() - pruned - final_round,
                final_round,
                pruned,
                failed: measurements
                    .iter()
                    .filter(|m| matches!(m.status, Status::Error | Status::FailedVerification))
                    .count(),
                ..blank(
                    i,
                    if winner.is_some() {
                        "tuned"
                    } else if lost.is_some() {
                        "device-lost"
                    } else {
                        "no-winner"
                    },
                )
            });
            let took = problem_started.elapsed();
            pace.finished(took, searched, budget);
            let finished = outcomes.iter().filter(|o| o.is_some()).count();
            job.progress.line(progress_line(
                outcomes[i].as_ref().expect("just stored"),
                (finished, problems.len()),
                took,
                job.budget,
            ));
            overall.inc(1);
            if let Some((config, reason)) = lost {
                device_lost = Some((key, config, reason));
                break 'passes;
            }
        }
        if held.is_empty() {
            break;
        }
        // What is left is held by other runs: wait for them to record it (or to stop
        // without it, leaving it to this run), within this run's budget.
        if started.elapsed() >= job.total_budget {
            out_of_budget = true;
            break;
        }
        if order.len() != held.len() || order.iter().any(|i| !held.contains(i)) {
            job.progress.line(format_args!(
                "waiting for {} problems other runs are tuning",
                held.len()
            ));
        }
        order = held.clone();
        let stop_waiting = started + job.total_budget;
        let nap = CLAIM_POLL.min(stop_waiting.saturating_duration_since(Instant::now()));
        tokio::time::sleep(nap).await;
    }
    overall.finish_and_clear();
    if out_of_budget {
        let left = outcomes.iter().filter(|o| o.is_none()).count() - held.len();
        job.progress.line(format_args!(
            "total budget ({:.0?}) spent: {left} problems left for the next run{}",
            job.total_budget,
            if held.is_empty() {
                String::new()
            } else {
                format!(", {} still being tuned by other runs", held.len())
            }
        ));
    }
    let status = if interrupted || device_lost.is_some() {
        RunStatus::Interrupted
    } else {
        RunStatus::Done
    };
    job.db.finish_run(run_id, status).await?;
    let done = outcomes
        .iter()
        .flatten()
        .filter(|o| o.status == "tuned")
        .count();
    let left = outcomes.iter().filter(|o| o.is_none()).count();
    if let Some((problem, config, reason)) = device_lost {
        return Err(TuneError::DeviceLost {
            problem,
            config: config.to_string(),
            reason,
            done,
            left: left + 1,
        });
    }
    if interrupted {
        return Err(TuneError::Interrupted { done, left });
    }
    Ok(outcomes
        .into_iter()
        .enumerate()
        .map(|(i, o)| {
            o.unwrap_or_else(|| {
                blank(
                    i,
                    if held.contains(&i) {
                        "elsewhere"
                    } else {
                        "budget"
                    },
                )
            })
        })
        .collect())
}

/// Slack of a claim's lease beyond four times the search budget: compiling, uploading,
/// verifying and the final round.
const CLAIM_MARGIN: Duration = Duration::from_secs(120);

/// How often a run that has only problems other runs hold looks at them again.
const CLAIM_POLL: Duration = Duration::from_millis(500);

/// The line a problem's end writes in a log: where the run is, what won and by how much, what
/// the search cost, and its budget where the run's pace cut it short of `budget`.
fn progress_line(o: &Outcome, (n, of): (usize, usize), took: Duration, budget: Duration) -> String {
    let result = match (o.median_ns, o.speedup) {
        (Some(median), Some(speedup)) => {
            format!("{}, {speedup:.2}x the default", fmt_time(median))
        }
        (Some(median), None) => fmt_time(median),
        (None, _) if o.status == "device-lost" => "a candidate left the device unusable".into(),
        (None, _) => "no candidate passed verification".to_string(),
    };
    let paced = match o.search_budget_s {
        Some(b) if b < budget.as_secs_f64() => format!(", search paced to {b:.1} s"),
        _ => String::new(),
    };
    format!(
        "[{n}/{of}] {} {} in {:.1} s: {result} ({} measured, {} failed{paced})",
        o.status,
        o.problem,
        took.as_secs_f64(),
        o.measured,
        o.failed
    )
}

impl Sweep for CpuSweep<'_> {
    fn backend(&self) -> &str {
        self.backend.name()
    }

    fn source_hash(&self) -> &str {
        kerntune_kernels::CPU_SOURCE_HASH
    }

    fn sweep(
        &mut self,
        job: &Job<'_>,
        budget: Duration,
        problem: &Problem,
        crashed: &[String],
        bar: &ProgressBar,
    ) -> Option<Swept> {
        let device = job.device;
        let default = self.space.default_config(problem, device);
        let heuristic = self.space.heuristic(problem, device);
        let mut candidates = vec![default];
        if heuristic != default {
            candidates.push(heuristic);
        }
        for c in self.space.candidates(problem, device) {
            if !candidates.contains(&c) {
                candidates.push(c);
            }
        }
        // Prune what the device cannot run before anything runs, recording why.
        let mut pruned = Vec::new();
        let mut runnable = Vec::new();
        for c in candidates {
            match self.space.validate(&c, problem, device) {
                Ok(()) if crashed.contains(&c.to_json()) => pruned.push(crashed_before(&c)),
                Ok(()) => runnable.push(c),
                Err(e) => pruned.push(invalid(&c, e.to_string())),
            }
        }
        let operands = std::mem::take(&mut self.operands);
        let workload = std::cell::RefCell::new(Workload::reusing(problem, &job.policy, operands));
        let backend = self.backend;
        let policy = &job.policy;
        let swept = sweep_candidates(
            job,
            budget,
            problem,
            default,
            &runnable,
            pruned,
            bar,
            &mut |c, beat| {
                let mut w = workload.borrow_mut();
                let err = w.verify(backend, c)?;
                Ok((err, w.time(backend, c, policy, beat)?))
            },
            Some(&mut |finalists| {
                workload
                    .borrow_mut()
                    .time_together(backend, finalists, policy, job.stop)
            }),
        );
        self.operands = workload.into_inner().into_operands();
        swept
    }
}

/// The record of a candidate that was not run, and why.
pub fn invalid(config: &Config, why: String) -> MeasurementRecord {
    MeasurementRecord {
        config: config.to_json(),
        status: Status::Invalid,
        message: Some(why),
        error: None,
        stats: None,
    }
}

/// A config that left the device unusable in an earlier run, recorded as pruned (with the
/// same words, so the runs after this one skip it too).
pub fn crashed_before(config: &Config) -> MeasurementRecord {
    invalid(
        config,
        format!("{LOST} in an earlier run: not run again (--retune runs it)"),
    )
}

/// How a candidate fared: its verification error and timing, or why it has none.
pub type Measured = std::result::Result<(f64, Stats), Failure>;

/// Times the finalists of a sweep side by side (see [`Workload::time_together`]), one result
/// each, in their order.
pub type TimeTogether<'a> = dyn FnMut(&[Config]) -> Vec<std::result::Result<Stats, Failure>> + 'a;

/// How many of the fastest candidates besides the default go to the final round.
const FINALISTS: usize = 3;

/// Searches `runnable` with the job's strategy within `budget` (a paced share of the job's,
/// see [`crate::pace`]) and `max_configs`, measuring each candidate
/// with `measure`, which is given the search's best median so far (its timing may stop once
/// it is slower than that beyond doubt); `records` starts with the pruned ones. The default and
/// the heuristic are always measured; a candidate that fails verification or errors is
/// recorded and never wins.
///
/// The winner comes from a final round: the default and the `FINALISTS` (3) fastest candidates
/// of the search timed again, side by side with `together`, or (without it) each re-measured
/// in turn with `measure`, against the round's best so far. A search's timings of two candidates can be minutes apart, and on
/// a shared machine its speed moves by more than the margins between near-equal candidates
/// in that time; the fastest of many noisy timings also tends to be one that was lucky. The
/// final round's timings are stored as measurements of their own, and the winner's speedup
/// is against the default's final-round timing. A finalist that fails there cannot win.
#[allow(clippy::too_many_arguments)]
pub fn sweep_candidates(
    job: &Job<'_>,
    budget: Duration,
    problem: &Problem,
    default: Config,
    runnable: &[Config],
    mut records: Vec<MeasurementRecord>,
    bar: &ProgressBar,
    measure: &mut dyn FnMut(&Config, Option<f64>) -> Measured,
    together: Option<&mut TimeTogether<'_>>,
) -> Option<Swept> {
    let pruned = records.len();
    bar.set_length(runnable.len().min(job.max_configs) as u64);
    let started = Instant::now();
    // The configs measured, in the order of their records after the pruned ones.
    let mut tried: Vec<Config> = Vec::new();
    let mut stopped = false;
    let mut lost: Option<(Config, String)> = None;
    let mut eval = |c: &Config| -> std::result::Result<Option<f64>, ()> {
        if job.stop.load(Ordering::SeqCst) {
            stopped = true;
            return Err(());
        }
        // Nothing more runs on a lost device.
        if lost.is_some() {
            return Err(());
        }
        // The default and the heuristic (the first two of `order`, where every strategy
        // starts) are always measured, so the budget applies after them: a default that
        // takes the whole budget (an fp8 prompt's f32 packing on a CPU, 0.6 s a call, where
        // the heuristic's tiles take 50 ms) would otherwise be the winner.
        if tried.len() >= job.max_configs
            || (tried.len() >= 2 && search_over(started.elapsed(), tried.len(), budget, job.budget))
        {
            return Err(());
        }
        bar.inc(1);
        let beat = records[pruned..]
            .iter()
            .filter(|r| r.status == Status::Ok)
            .map(median_of)
            .min_by(f64::total_cmp);
        let measured = measure(c, beat);
        if let Err(Failure::Lost(why)) = &measured {
            lost = Some((*c, why.clone()));
        }
        let rec = record(problem, c, measured, None);
        let median = rec.stats.as_ref().map(|s| s.median_ns);
        tried.push(*c);
        records.push(rec);
        Ok(median)
    };
    // Strategies start from the first candidates: the default, when it is runnable.
    let mut order: Vec<Config> = runnable.iter().copied().filter(|c| *c == default).collect();
    order.extend(runnable.iter().copied().filter(|c| *c != default));
    search(job.strategy, &order, 0x5eed, &mut eval);
    let searched = started.elapsed();
    if stopped {
        return None;
    }
    // The device is gone: what was measured stands, with the config that lost it, and no
    // winner (the problem is tuned again on the next run).
    if lost.is_some() {
        return Some(Swept {
            final_round: 0,
            winner: None,
            default: tried.iter().position(|c| *c == default).map(|i| pruned + i),
            pruned,
            searched,
            lost,
            records,
        });
    }
    let search = &records[pruned..];
    let mut finalists: Vec<usize> = (0..search.len())
        .filter(|&i| search[i].status == Status::Ok && tried[i] != default)
        .collect();
    finalists.sort_by(|&a, &b| median_of(&search[a]).total_cmp(&median_of(&search[b])));
    // A strategy that measured a config twice puts it in the final round once.
    let mut seen = std::collections::HashSet::new();
    finalists.retain(|&i| seen.insert(tried[i]));
    finalists.truncate(FINALISTS);
    finalists
        .extend((0..search.len()).find(|&i| tried[i] == default && search[i].status == Status::Ok));
    let mut default_idx = tried.iter().position(|c| *c == default).map(|i| pruned + i);
    let mut contenders: Vec<usize> = (pruned..records.len()).collect();
    if finalists.len() > 1 {
        if job.stop.load(Ordering::SeqCst) {
            return None;
        }
        bar.set_message(format!("{}: final round", problem.key()));
        let configs: Vec<Config> = finalists.iter().map(|&i| tried[i]).collect();
        let how = format!(
            "final round: {} with {} others",
            if together.is_some() {
                "timed side by side"
            } else {
                "re-timed in turn"
            },
            configs.len() - 1
        );
        let results: Vec<Measured> = match together {
            Some(together) => together(&configs)
                .into_iter()
                .zip(&finalists)
                .map(|(r, &i)| r.map(|s| (records[pruned + i].error.unwrap_or(0.0), s)))
                .collect(),
            // In turn, each finalist is held to the best of the round so far: one slower
            // beyond doubt cannot win, as in the side-by-side race.
            None => {
                let mut best: Option<f64> = None;
                configs
                    .iter()
                    .map(|c| {
                        let m = measure(c, best);
                        if let Ok((_, s)) = &m {
                            best = Some(best.map_or(s.median_ns, |b| b.min(s.median_ns)));
                        }
                        m
                    })
                    .collect()
            }
        };
        if job.stop.load(Ordering::SeqCst) {
            return None;
        }
        contenders.clear();
        for (c, r) in configs.iter().zip(results) {
            if *c == default {
                default_idx = Some(records.len());
            }
            if let Err(Failure::Lost(why)) = &r {
                lost.get_or_insert((*c, why.clone()));
            }
            contenders.push(records.len());
            records.push(record(problem, c, r, Some(how.clone())));
        }
    }
    let winner = contenders
        .into_iter()
        .filter(|&i| records[i].status == Status::Ok)
        .filter_map(|i| records[i].stats.as_ref().map(|s| (i, s.median_ns)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i)
        // A final round that lost the device names no winner: the round's later timings
        // failed with it.
        .filter(|_| lost.is_none());
    Some(Swept {
        final_round: records.len() - pruned - tried.len(),
        records,
        winner,
        default: default_idx,
        pruned,
        searched,
        lost,
    })
}

fn median_of(r: &MeasurementRecord) -> f64 {
    r.stats.as_ref().map_or(f64::INFINITY, |s| s.median_ns)
}

/// The record of a measured candidate; `round` says which round it was timed in, when it
/// was the final one.
fn record(problem: &Problem, c: &Config, m: Measured, round: Option<String>) -> MeasurementRecord {
    let mut rec = MeasurementRecord {
        config: c.to_json(),
        status: Status::Ok,
        message: None,
        error: None,
        stats: None,
    };
    let why = match m {
        Ok((err, stats)) => {
            rec.error = Some(err);
            rec.stats = Some(stats);
            None
        }
        Err(Failure::Wrong(err)) => {
            rec.status = Status::FailedVerification;
            rec.error = Some(err);
            Some(format!(
                "relative error {err:.3e} exceeds the {} {} tolerance {:.1e}",
                problem.dtype(),
                problem.family(),
                problem.tolerance()
            ))
        }
        Err(Failure::Error(msg)) => {
            rec.status = Status::Error;
            Some(msg)
        }
        Err(Failure::Lost(msg)) => {
            rec.status = Status::Error;
            Some(format!("{LOST}: {msg}"))
        }
    };
    rec.message = match (round, why) {
        (Some(round), Some(why)) => Some(format!("{round}: {why}")),
        (round, why) => round.or(why),
    };
    rec
}
