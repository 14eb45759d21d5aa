//! Cold-cache timing: the rotation through operand copies runs on from one config to the
//! next, so no config is timed on copies another config just read.

use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::Duration;

use kerntune_e2e::small_problems;
use kerntune_kernels::data::ProblemData;
use kerntune_kernels::kernel::Args;
use kerntune_kernels::{
    Backend, Config, CpuBackend, CpuSpace, Device, KernelError, Problem, Space,
};
use kerntune_tuner::measure::{Failure, Policy, Workload};

/// The CPU backend, noting which output buffer (so which copy) each call wrote.
#[derive(Default)]
struct Recorder {
    outputs: Mutex<Vec<usize>>,
}

impl Backend for Recorder {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn scratch_len(&self, problem: &Problem, config: &Config) -> usize {
        CpuBackend.scratch_len(problem, config)
    }
    fn run(
        &self,
        problem: &Problem,
        config: &Config,
        args: Args<'_>,
        scratch: &mut [f32],
    ) -> Result<(), KernelError> {
        if let Args::Gemm(g) = &args {
            self.outputs.lock().unwrap().push(g.c.as_ptr() as usize);
        }
        CpuBackend.run(problem, config, args, scratch)
    }
}

/// A workload of a small GEMM whose rotation holds `copies` copies' worth of bytes (0: warm
/// timing), timed with exactly `reps` repetitions (or stopped), and `n` configs of it.
fn setup(copies: usize, reps: usize, n: usize) -> (Workload, Policy, Vec<Config>) {
    let problem = small_problems()[0].problem;
    let policy = Policy {
        min_reps: reps,
        max_reps: reps,
        max_time: Duration::from_secs(60),
        target_ci: 0.0,
        rotate_bytes: copies * ProblemData::random(&problem, 1).bytes(),
    };
    let configs = CpuSpace
        .candidates(&problem, &Device::host())
        .into_iter()
        .take(n)
        .collect();
    (Workload::new(&problem, &policy), policy, configs)
}

#[test]
fn timing_rotates_through_every_copy_before_reusing_one_across_configs() {
    let (mut w, policy, configs) = setup(8, 3, 3);
    // The verification copy and enough others to hold `rotate_bytes` between two calls on one.
    assert_eq!(w.copies(), 9);
    let r = Recorder::default();
    let mut verified = None;
    let mut timed = Vec::new();
    for (i, c) in configs.iter().enumerate() {
        r.outputs.lock().unwrap().clear();
        // The tuner times a candidate right after verifying it, and that call is its warm-up;
        // timed alone (as `tune bench` does; the second config here), a config warms up first.
        if i != 1 {
            w.verify(&r, c).unwrap();
        }
        let s = w.time(&r, c, &policy, None).unwrap();
        assert!(s.cold_cache);
        let calls = r.outputs.lock().unwrap().clone();
        assert_eq!(
            calls.len(),
            1 + 3,
            "a verification or a warm-up call, and three timed ones"
        );
        let copy0 = *verified.get_or_insert(calls[0]);
        assert_eq!(calls[0], copy0, "both run on the verified copy");
        timed.extend_from_slice(&calls[1..]);
    }
    let verified = verified.unwrap();
    // Nine timed calls over the eight rotation copies: each copy once before any again, and
    // never the verified one (which every warm-up just read).
    assert!(!timed.contains(&verified));
    let mut first_eight = timed[..8].to_vec();
    first_eight.sort_unstable();
    first_eight.dedup();
    assert_eq!(first_eight.len(), 8, "{timed:?}");
    assert_eq!(
        timed[8], timed[0],
        "the ninth call is back at the least recently read"
    );
}

#[test]
fn side_by_side_timing_continues_the_rotation() {
    let (mut w, policy, configs) = setup(100, 2, 2);
    let r = Recorder::default();
    w.time(&r, &configs[0], &policy, None).unwrap();
    let before: Vec<usize> = r.outputs.lock().unwrap()[1..].to_vec();
    r.outputs.lock().unwrap().clear();
    let out = w.time_together(&r, &configs, &policy, &AtomicBool::new(false));
    assert!(
        out.iter().all(|s| s.as_ref().is_ok_and(|s| s.reps == 2)),
        "{out:?}"
    );
    let calls = r.outputs.lock().unwrap().clone();
    // A warm-up each, then one round: a burst of three per config, the first untimed.
    assert_eq!(calls.len(), 2 + 2 * 3);
    let rotated = &calls[2..];
    let mut all: Vec<usize> = before.iter().chain(rotated).copied().collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all.len(),
        before.len() + rotated.len(),
        "no copy read twice"
    );
}

#[test]
fn side_by_side_timing_stops_between_bursts_when_asked() {
    let (mut w, policy, configs) = setup(0, 200, 2);
    let r = Recorder::default();
    let out = w.time_together(&r, &configs, &policy, &AtomicBool::new(true));
    assert_eq!(r.outputs.lock().unwrap().len(), 2, "the warm-ups only");
    assert!(
        out.iter()
            .all(|s| matches!(s, Err(Failure::Error(m)) if m == "interrupted")),
        "{out:?}"
    );
}
