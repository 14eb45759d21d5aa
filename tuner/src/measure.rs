//! Verifying a candidate once and timing it properly.
//!
//! Timing runs the kernel on copies of the operands in rotation, enough copies to exceed the
//! last-level cache twice over, so every call starts cold as it does in a server where other
//! layers evicted the weights. The rotation runs on from one config to the next. Repetitions
//! continue until the 95% confidence interval of the median (order statistics) is within
//! `target_ci` of it, or the repetition or time cap is hit. A sweep's finalists are timed side
//! by side ([`Workload::time_together`]).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kerntune_db::Stats;
use kerntune_kernels::data::ProblemData;
use kerntune_kernels::kernel::Scratch;
use kerntune_kernels::{Backend, Config, Problem};

/// How hard to measure.
#[derive(Debug, Clone)]
pub struct Policy {
    pub min_reps: usize,
    pub max_reps: usize,
    pub max_time: Duration,
    /// Relative half-width of the median's 95% CI at which to stop.
    pub target_ci: f64,
    /// Total bytes the operand copies should exceed (twice the LLC for cold-cache timing; 0
    /// times warm).
    pub rotate_bytes: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            min_reps: 5,
            max_reps: 200,
            max_time: Duration::from_millis(500),
            target_ci: 0.02,
            rotate_bytes: 2 * kerntune_kernels::CpuInfo::detect().l3_bytes,
        }
    }
}

/// Rotation copies beyond this many would be for problems so small (under 16 KiB) that the
/// rotation's bookkeeping is what gets timed.
const MAX_COPIES: usize = 1 << 16;

/// The operands of one problem: the verification copy with its reference rows, and the
/// rotation copies for timing.
#[derive(Debug)]
pub struct Workload {
    pub problem: Problem,
    copies: Vec<ProblemData>,
    /// Timed calls so far, the rotation's position.
    next: usize,
    rows: Vec<usize>,
    reference: Vec<Vec<f64>>,
    scratch: Scratch,
}

/// Why a candidate did not produce a timing.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// Output differs from the reference; the relative error seen.
    Wrong(f64),
    /// The kernel returned an error or panicked.
    Error(String),
}

impl Workload {
    pub fn new(problem: &Problem, policy: &Policy) -> Workload {
        let first = ProblemData::random(problem, 0x6b65_726e);
        let rows = first.verify_rows();
        let reference = first.reference_rows(&rows);
        let per_copy = first.bytes().max(1);
        // Copy 0 is verified and warms up; timing rotates through the others, so between two
        // calls on one copy the rest, `rotate_bytes` of them, pass through the caches.
        let wanted = if policy.rotate_bytes == 0 {
            1
        } else {
            policy.rotate_bytes.div_ceil(per_copy) + 1
        };
        // A quarter of the host's memory at most: a problem that large dwarfs any cache.
        let fit = (crate::host_memory_bytes() as usize / 4 / per_copy).max(1);
        let copies = wanted.min(fit).min(MAX_COPIES);
        // The copies need other addresses, not other values: cloning the first is quicker
        // than drawing and converting fresh random data, and the kernels' speed does not
        // depend on the values.
        let mut all = Vec::with_capacity(copies);
        all.push(first);
        for _ in 1..copies {
            all.push(all[0].clone());
        }
        Workload {
            problem: *problem,
            copies: all,
            next: 0,
            rows,
            reference,
            scratch: Scratch::new(),
        }
    }

    /// How many copies of the operands there are: the verification copy and the rotation's.
    pub fn copies(&self) -> usize {
        self.copies.len()
    }

    /// The copy the next timed call runs on: the one least recently timed. The rotation
    /// goes on across configs; restarting it for each would hand a config the copies the
    /// previous one just read, still in a large last-level cache.
    fn timing_copy(&mut self) -> usize {
        let n = self.copies.len();
        if n == 1 {
            return 0;
        }
        self.next += 1;
        1 + self.next % (n - 1)
    }

    fn run(&mut self, backend: &dyn Backend, config: &Config, copy: usize) -> Result<(), Failure> {
        let len = backend.scratch_len(&self.problem, config);
        let problem = &self.problem;
        let scratch = self.scratch.get(len);
        let data = &mut self.copies[copy];
        match catch_unwind(AssertUnwindSafe(|| {
            backend.run(problem, config, data.args(), scratch)
        })) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Failure::Error(e.to_string())),
            Err(panic) => Err(Failure::Error(format!(
                "panicked: {}",
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)")
            ))),
        }
    }

    /// Runs once on the reference copy and compares the verification rows.
    pub fn verify(&mut self, backend: &dyn Backend, config: &Config) -> Result<f64, Failure> {
        self.copies[0].out.fill(f32::NAN);
        self.run(backend, config, 0)?;
        let data = &self.copies[0];
        check_rows(
            &self.problem,
            &data.out,
            data.row_len(),
            &self.rows,
            &self.reference,
        )
    }

    /// Times a verified config.
    pub fn time(
        &mut self,
        backend: &dyn Backend,
        config: &Config,
        policy: &Policy,
    ) -> Result<Stats, Failure> {
        // Warm-up: first-touch page faults, thread-pool start, code in the i-cache.
        let warm = Instant::now();
        self.run(backend, config, 0)?;
        // Slow candidates get fewer repetitions so a budget still covers several of them.
        let min_reps = if warm.elapsed() * policy.min_reps as u32 > policy.max_time {
            policy.min_reps.min(3)
        } else {
            policy.min_reps
        };
        let start = Instant::now();
        let mut samples = Vec::with_capacity(policy.min_reps);
        let n = self.copies.len();
        while samples.len() < policy.max_reps {
            let copy = self.timing_copy();
            let t = Instant::now();
            self.run(backend, config, copy)?;
            samples.push(t.elapsed().as_nanos() as f64);
            if samples.len() >= min_reps
                && (start.elapsed() >= policy.max_time
                    || ci_half_width(&samples) <= policy.target_ci)
            {
                break;
            }
        }
        Ok(stats(&self.problem, samples, n > 1))
    }

    /// Times verified configs side by side: each round runs every config in turn, a short
    /// burst each, so a host whose speed drifts (a shared VM moves 5-10% within a minute)
    /// slows them all alike and their medians compare. The sweep's own timings of two configs can be minutes
    /// apart; this is what picks the winner among the best of them and the default. Stops
    /// when every config has `min_reps` samples and either their medians' CIs are all within
    /// `target_ci` or `max_time` per config has passed.
    ///
    /// `stop` is looked at between bursts: once set, the round ends early (the caller
    /// discards what it got), so Ctrl-C is not kept waiting on a round of slow calls.
    pub fn time_together(
        &mut self,
        backend: &dyn Backend,
        configs: &[Config],
        policy: &Policy,
        stop: &AtomicBool,
    ) -> Vec<Result<Stats, Failure>> {
        let mut failed: Vec<Option<Failure>> = vec![None; configs.len()];
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
        let warm = Instant::now();
        for (c, f) in configs.iter().zip(&mut failed) {
            *f = self.run(backend, c, 0).err();
        }
        let live = failed.iter().filter(|f| f.is_none()).count() as u32;
        let budget = policy.max_time * live.max(1);
        let min_reps = if warm.elapsed() * policy.min_reps as u32 > budget {
            policy.min_reps.min(3)
        } else {
            policy.min_reps
        };
        let n = self.copies.len();
        let start = Instant::now();
        while samples.iter().map(Vec::len).max().unwrap_or(0) < policy.max_reps {
            for (i, c) in configs.iter().enumerate() {
                if stop.load(Ordering::SeqCst) {
                    return interrupted(configs.len());
                }
                // A burst per config: its first call is not timed, since it pays for the
                // switch from the config before it (a decode kernel called after two AMX
                // kernels took 1.5 times as long as after itself, on a cold cache all the
                // same), which the search's timings, one config after another, do not.
                for timed in [false, true, true] {
                    if failed[i].is_some() {
                        break;
                    }
                    let copy = self.timing_copy();
                    let t = Instant::now();
                    match self.run(backend, c, copy) {
                        Ok(()) if timed => samples[i].push(t.elapsed().as_nanos() as f64),
                        Ok(()) => {}
                        Err(e) => failed[i] = Some(e),
                    }
                }
            }
            let timed = samples.iter().zip(&failed).filter(|(_, f)| f.is_none());
            let reps = timed.clone().map(|(s, _)| s.len()).min().unwrap_or(0);
            if reps >= min_reps
                && (start.elapsed() >= budget
                    || timed
                        .clone()
                        .all(|(s, _)| ci_half_width(s) <= policy.target_ci))
            {
                break;
            }
            if reps == 0 && failed.iter().all(Option::is_some) {
                break;
            }
        }
        samples
            .into_iter()
            .zip(failed)
            .map(|(s, f)| match f {
                Some(f) => Err(f),
                None => Ok(stats(&self.problem, s, n > 1)),
            })
            .collect()
    }
}

/// What a side-by-side round stopped early answers for each of its configs.
fn interrupted(configs: usize) -> Vec<Result<Stats, Failure>> {
    vec![Err(Failure::Error("interrupted".into())); configs]
}

/// The worst relative error of `out` over the verification `rows` (of `row_len` values each)
/// against their `reference`; `Wrong` beyond the problem's tolerance. NaN counts as infinite.
pub fn check_rows(
    problem: &Problem,
    out: &[f32],
    row_len: usize,
    rows: &[usize],
    reference: &[Vec<f64>],
) -> Result<f64, Failure> {
    let mut worst = 0f64;
    for (&r, reference) in rows.iter().zip(reference) {
        let err = out
            .get(r * row_len..(r + 1) * row_len)
            .map_or(f64::INFINITY, |row| {
                kerntune_kernels::reference::relative_error(row, reference)
            });
        worst = worst.max(if err.is_nan() { f64::INFINITY } else { err });
    }
    if worst > problem.tolerance() {
        return Err(Failure::Wrong(worst));
    }
    Ok(worst)
}

/// Relative half-width of the 95% confidence interval of the median by order statistics.
pub fn ci_half_width(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len() as f64;
    let half = 0.98 * n.sqrt();
    let lo = ((n / 2.0 - half).floor().max(0.0)) as usize;
    let hi = ((n / 2.0 + half).ceil() as usize).min(s.len() - 1);
    let median = percentile(&s, 0.5);
    (s[hi] - s[lo]) / 2.0 / median
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// The statistics stored for a candidate's timing samples (nanoseconds each); `cold` when
/// every sample started with caches flushed.
pub fn stats(problem: &Problem, mut samples: Vec<f64>, cold: bool) -> Stats {
    samples.sort_by(f64::total_cmp);
    let median = percentile(&samples, 0.5);
    let (throughput, unit) = if problem.memory_bound() {
        (problem.min_bytes() / (median * 1e-9), "B/s")
    } else {
        (problem.flops() / (median * 1e-9), "FLOP/s")
    };
    Stats {
        median_ns: median,
        min_ns: samples[0],
        p20_ns: percentile(&samples, 0.2),
        p80_ns: percentile(&samples, 0.8),
        reps: samples.len() as i64,
        throughput,
        unit: unit.into(),
        cold_cache: cold,
    }
}
