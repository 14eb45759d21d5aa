//! Verifying a candidate once and timing it properly.
//!
//! Timing runs the kernel on copies of the operands in rotation, enough copies to exceed the
//! last-level cache twice over, so every call starts cold as it does in a server where other
//! layers evicted the weights. The rotation runs on from one config to the next, and the
//! operands' memory from one problem to the next ([`Operands`]). Repetitions
//! continue until the 95% confidence interval of the median (order statistics) is within
//! `target_ci` of it, or lies above the search's best median ([`settled`]), or the repetition
//! or time cap is hit. A sweep's finalists race side by side ([`Workload::time_together`]).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kerntune_db::Stats;
use kerntune_kernels::kernel::Scratch;
use kerntune_kernels::{Backend, Config, Problem};

use crate::operands::Operands;

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

/// A call at least this long has no untimed call before its timed one in a final round's
/// burst. What the switch from another config costs (caches, clock and AMX state) is a
/// transient of at most half a millisecond: the largest seen, a decode kernel after two AMX
/// kernels, took 1.5 times its ~1 ms; on the Xeon without AMX the untimed call of a burst
/// was within 0.5% of the timed ones from 2 ms calls up (session 35). Against 50 ms it is
/// under 1%, while the untimed call was a third of a slow problem's final round.
const SWITCH_DWARFED: Duration = Duration::from_millis(50);

/// The operands of one problem: the verification copy with its reference rows, and the
/// rotation copies for timing.
#[derive(Debug)]
pub struct Workload {
    pub problem: Problem,
    /// The verification copy (copy 0, on which each config's first call runs) and the
    /// rotation's copies.
    operands: Operands,
    /// Timed calls so far, the rotation's position.
    next: usize,
    /// The config verified last and how long its call took, while nothing else ran since:
    /// that call was its warm-up.
    verified: Option<(Config, Duration)>,
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
    /// The kernel left the device unusable to the process (a GPU's sticky fault): nothing
    /// more can run on it.
    Lost(String),
}

impl Workload {
    pub fn new(problem: &Problem, policy: &Policy) -> Workload {
        Workload::reusing(problem, policy, Operands::default())
    }

    /// A workload in `operands`' memory, which an earlier problem's workload gave back with
    /// [`Workload::into_operands`].
    pub fn reusing(problem: &Problem, policy: &Policy, mut operands: Operands) -> Workload {
        let first = operands.draw(problem, 0x6b65_726e);
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
        // The copies need other addresses, not other values: copying the first is quicker
        // than drawing and converting fresh random data, and the kernels' speed does not
        // depend on the values.
        operands.rotate(copies - 1);
        Workload {
            problem: *problem,
            operands,
            next: 0,
            verified: None,
            rows,
            reference,
            scratch: Scratch::new(),
        }
    }

    /// How many copies of the operands there are: the verification copy and the rotation's.
    pub fn copies(&self) -> usize {
        self.operands.copies()
    }

    /// The operands' memory, for the next problem's workload ([`Workload::reusing`]).
    pub fn into_operands(self) -> Operands {
        self.operands
    }

    /// The copy the next timed call runs on: the one least recently timed. The rotation
    /// goes on across configs; restarting it for each would hand a config the copies the
    /// previous one just read, still in a large last-level cache.
    fn timing_copy(&mut self) -> usize {
        let n = self.copies();
        if n == 1 {
            return 0;
        }
        self.next += 1;
        1 + self.next % (n - 1)
    }

    fn run(&mut self, backend: &dyn Backend, config: &Config, copy: usize) -> Result<(), Failure> {
        self.verified = None;
        let len = backend.scratch_len(&self.problem, config);
        let problem = &self.problem;
        let scratch = self.scratch.get(len);
        let args = self.operands.args(copy);
        match catch_unwind(AssertUnwindSafe(|| {
            backend.run(problem, config, args, scratch)
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
        self.operands.first_mut().out.fill(f32::NAN);
        let call = Instant::now();
        self.run(backend, config, 0)?;
        self.verified = Some((*config, call.elapsed()));
        let data = self.operands.first();
        check_rows(
            &self.problem,
            &data.out,
            data.row_len(),
            &self.rows,
            &self.reference,
        )
    }

    /// Times a verified config; `beat` is the search's best median so far, when it has one
    /// (see [`settled`]).
    pub fn time(
        &mut self,
        backend: &dyn Backend,
        config: &Config,
        policy: &Policy,
        beat: Option<f64>,
    ) -> Result<Stats, Failure> {
        // Warm-up: first-touch page faults, thread-pool start, code in the i-cache. The
        // verification call just before did all of that (a seventh of the search's calls
        // were warm-ups again after it).
        let warm = match self.verified.take() {
            Some((verified, call)) if verified == *config => call,
            _ => {
                let warm = Instant::now();
                self.run(backend, config, 0)?;
                warm.elapsed()
            }
        };
        // Slow candidates get fewer repetitions so a budget still covers several of them.
        let min_reps = if warm * policy.min_reps as u32 > policy.max_time {
            policy.min_reps.min(3)
        } else {
            policy.min_reps
        };
        let start = Instant::now();
        let mut samples = Vec::with_capacity(policy.min_reps);
        let n = self.copies();
        while samples.len() < policy.max_reps {
            let copy = self.timing_copy();
            let t = Instant::now();
            self.run(backend, config, copy)?;
            samples.push(t.elapsed().as_nanos() as f64);
            if settled(&samples, min_reps, start.elapsed(), policy, beat) {
                break;
            }
        }
        Ok(stats(&self.problem, samples, n > 1))
    }

    /// Times verified configs side by side: each round runs every config in turn, a short
    /// burst each, so a host whose speed drifts (a shared VM moves 5-10% within a minute)
    /// slows them all alike and their medians compare. The sweep's own timings of two configs can be minutes
    /// apart; this is what picks the winner among the best of them and the default.
    ///
    /// A race: once every config has `min_reps` samples, a config whose median's CI lies
    /// wholly above the leader's (the config with the lowest median) is out, keeping the
    /// samples it has; it cannot win, and timing it on would only spend the round's time (a
    /// default eight times slower than the finalists took three quarters of it). Stops when
    /// one config is left, when the CIs of those left are all within `target_ci`, or when
    /// `max_time` per config given has passed.
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
        let mut bursts: Vec<&[bool]> = Vec::with_capacity(configs.len());
        for (c, f) in configs.iter().zip(&mut failed) {
            let call = Instant::now();
            *f = self.run(backend, c, 0).err();
            bursts.push(if call.elapsed() >= SWITCH_DWARFED {
                &[true]
            } else {
                &[false, true, true]
            });
        }
        let live = failed.iter().filter(|f| f.is_none()).count() as u32;
        let budget = policy.max_time * live.max(1);
        let min_reps = if warm.elapsed() * policy.min_reps as u32 > budget {
            policy.min_reps.min(3)
        } else {
            policy.min_reps
        };
        let n = self.copies();
        let start = Instant::now();
        // Configs still racing: not failed and not yet beaten.
        let mut racing: Vec<bool> = failed.iter().map(Option::is_none).collect();
        loop {
            for (i, c) in configs.iter().enumerate() {
                if stop.load(Ordering::SeqCst) {
                    return interrupted(configs.len());
                }
                // A burst per config: its first call is not timed, since it pays for the
                // switch from the config before it (a decode kernel called after two AMX
                // kernels took 1.5 times as long as after itself, on a cold cache all the
                // same), which the search's timings, one config after another, do not; a
                // call that dwarfs the switch is timed alone.
                for &timed in bursts[i] {
                    if !racing[i] {
                        break;
                    }
                    let copy = self.timing_copy();
                    let t = Instant::now();
                    match self.run(backend, c, copy) {
                        Ok(()) if timed => samples[i].push(t.elapsed().as_nanos() as f64),
                        Ok(()) => {}
                        Err(e) => {
                            failed[i] = Some(e);
                            racing[i] = false;
                        }
                    }
                }
            }
            let left: Vec<usize> = (0..configs.len()).filter(|&i| racing[i]).collect();
            let reps = left.iter().map(|&i| samples[i].len()).min().unwrap_or(0);
            if left.is_empty() || reps >= policy.max_reps {
                break;
            }
            if reps < min_reps {
                continue;
            }
            let cis: Vec<MedianCi> = left.iter().map(|&i| MedianCi::of(&samples[i])).collect();
            let leader = (0..left.len())
                .min_by(|&a, &b| cis[a].median.total_cmp(&cis[b].median))
                .expect("configs are left");
            for (ci, &i) in cis.iter().zip(&left) {
                if ci.low > cis[leader].high {
                    racing[i] = false;
                }
            }
            let mut still = cis.iter().zip(&left).filter(|(_, &i)| racing[i]);
            if still.clone().count() <= 1
                || start.elapsed() >= budget
                || still.all(|(ci, _)| ci.relative_half_width() <= policy.target_ci)
            {
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

/// Whether a candidate's timing can stop: it has `min_reps` samples and its median's CI is
/// within `target_ci`, or `max_time` has passed, or its CI lies wholly above `beat` (the
/// search's best median so far). A candidate slower than the best beyond doubt cannot win,
/// and by how much it is slower the search need not know to 2%: timing it on to the CI
/// target spent two fifths of the main job's search time on such candidates, time the
/// search's budget now spends on others.
pub fn settled(
    samples: &[f64],
    min_reps: usize,
    elapsed: Duration,
    policy: &Policy,
    beat: Option<f64>,
) -> bool {
    if samples.len() < min_reps {
        return false;
    }
    let ci = MedianCi::of(samples);
    elapsed >= policy.max_time
        || ci.relative_half_width() <= policy.target_ci
        || beat.is_some_and(|beat| ci.low > beat)
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

/// The 95% confidence interval of a median by order statistics, which assume no
/// distribution, as timings (skewed, with a long tail of interrupted calls) need.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MedianCi {
    pub low: f64,
    pub median: f64,
    pub high: f64,
}

impl MedianCi {
    pub fn of(samples: &[f64]) -> MedianCi {
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len() as f64;
        let half = 0.98 * n.sqrt();
        let lo = ((n / 2.0 - half).floor().max(0.0)) as usize;
        let hi = ((n / 2.0 + half).ceil() as usize).min(s.len() - 1);
        MedianCi {
            low: s[lo],
            median: percentile(&s, 0.5),
            high: s[hi],
        }
    }

    /// Half the interval's width, relative to the median.
    pub fn relative_half_width(&self) -> f64 {
        (self.high - self.low) / 2.0 / self.median
    }
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
