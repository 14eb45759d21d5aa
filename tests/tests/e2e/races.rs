//! Timing stops once it has decided: a search candidate slower than the best beyond doubt,
//! and a finalist beaten beyond doubt in the final round, are timed no further.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use kerntune_db::{Db, Status};
use kerntune_e2e::{job, small_problems};
use kerntune_kernels::kernel::Args;
use kerntune_kernels::{Backend, Config, CpuSpace, Device, KernelError, Problem, Space};
use kerntune_tuner::measure::{stats, Policy, Workload};
use kerntune_tuner::tune::{sweep_candidates, Measured};

/// Takes the time given for each config, doing nothing else: timing does not look at the
/// output. Counts each config's calls.
struct Paced(Vec<(Config, Duration)>, Mutex<HashMap<Config, usize>>);

impl Paced {
    fn new(paces: Vec<(Config, Duration)>) -> Paced {
        Paced(paces, Mutex::default())
    }

    fn calls(&self, config: &Config) -> usize {
        self.1.lock().unwrap().get(config).copied().unwrap_or(0)
    }
}

impl Backend for Paced {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn scratch_len(&self, _: &Problem, _: &Config) -> usize {
        0
    }
    fn run(
        &self,
        _: &Problem,
        config: &Config,
        _: Args<'_>,
        _: &mut [f32],
    ) -> Result<(), KernelError> {
        let (_, pace) = self.0.iter().find(|(c, _)| c == config).expect("paced");
        *self.1.lock().unwrap().entry(*config).or_default() += 1;
        let start = Instant::now();
        while start.elapsed() < *pace {
            std::hint::spin_loop();
        }
        Ok(())
    }
}

/// A small GEMM and three distinct configs of it.
fn three() -> (Problem, [Config; 3]) {
    let problem = small_problems()[0].problem;
    let list = CpuSpace.candidates(&problem, &Device::host());
    (problem, [list[0], list[1], list[2]])
}

/// Neither the CI target nor the time ends these timings before `max_reps`.
fn patient(max_reps: usize) -> Policy {
    Policy {
        min_reps: 5,
        max_reps,
        max_time: Duration::from_secs(60),
        target_ci: 0.0,
        rotate_bytes: 0,
    }
}

#[test]
fn a_candidate_slower_than_the_best_beyond_doubt_is_timed_no_further() {
    let (problem, [ruled_out, kept, _]) = three();
    let pace = Duration::from_micros(500);
    let paced = Paced::new(vec![(ruled_out, pace), (kept, pace)]);
    let policy = patient(200);
    let mut w = Workload::new(&problem, &policy);
    // The search's best so far took a tenth of this candidate's time.
    let beat = Some(pace.as_nanos() as f64 / 10.0);
    let s = w.time(&paced, &ruled_out, &policy, beat).unwrap();
    // Out at the first look: every call takes at least its pace, ten times the bar.
    assert_eq!(s.reps, 5, "{s:?}");
    // A candidate the bar does not rule out is timed to the end.
    let policy = patient(30);
    let s = w.time(&paced, &kept, &policy, Some(1e9)).unwrap();
    assert_eq!(s.reps, 30, "{s:?}");
}

#[tokio::test]
async fn the_search_times_each_candidate_against_its_best_so_far() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("k.db")).await.unwrap();
    let device = Device::host();
    let (problem, list) = three();
    let medians = [300.0, 100.0, 200.0];
    let mut bars = Vec::new();
    let mut measure = |c: &Config, beat: Option<f64>| -> Measured {
        bars.push(beat);
        let i = list.iter().position(|l| l == c).unwrap();
        Ok((1e-7, stats(&problem, vec![medians[i]; 3], false)))
    };
    let swept = sweep_candidates(
        &job(&db, &device),
        Duration::from_secs(5),
        &problem,
        list[0],
        &list,
        Vec::new(),
        &ProgressBar::hidden(),
        &mut measure,
        None,
    )
    .expect("not interrupted");
    db.close().await;
    // The default first, with nothing to beat; then the best median so far. The final round
    // (in turn, without side-by-side timing) starts afresh: its first finalist (the search's
    // fastest) has nothing to beat, the others the best of the round so far.
    assert_eq!(
        bars,
        [
            None,
            Some(300.0),
            Some(100.0),
            None,
            Some(100.0),
            Some(100.0)
        ],
        "{:?}",
        swept.records.iter().map(|r| &r.status).collect::<Vec<_>>()
    );
    assert!(swept.records.iter().all(|r| r.status == Status::Ok));
}

#[test]
fn a_finalist_beaten_beyond_doubt_leaves_the_race_and_the_last_one_left_ends_it() {
    let (problem, [slow, fast, _]) = three();
    let paced = Paced::new(vec![
        (slow, Duration::from_millis(2)),
        (fast, Duration::from_micros(20)),
    ]);
    let policy = patient(200);
    let mut w = Workload::new(&problem, &policy);
    let out = w.time_together(&paced, &[slow, fast], &policy, &AtomicBool::new(false));
    let (s, f) = (out[0].as_ref().unwrap(), out[1].as_ref().unwrap());
    assert!(s.median_ns > 50.0 * f.median_ns, "{s:?} {f:?}");
    // The slow config is out at the first look with the minimum repetitions (or a few
    // rounds later, where a preempted call of the fast one widened its CI), and with one
    // config left the round is over.
    assert!((5..=30).contains(&s.reps), "{s:?}");
    assert_eq!(f.reps, s.reps, "{f:?}");
}

#[test]
fn finalists_the_race_cannot_tell_apart_run_to_the_end() {
    let (problem, [a, b, slow]) = three();
    let pace = Duration::from_micros(50);
    let paced = Paced::new(vec![(a, pace), (b, pace), (slow, pace * 40)]);
    let policy = patient(40);
    let mut w = Workload::new(&problem, &policy);
    let out = w.time_together(&paced, &[a, b, slow], &policy, &AtomicBool::new(false));
    let reps: Vec<i64> = out.iter().map(|s| s.as_ref().unwrap().reps).collect();
    // Two equal configs stay in the race together until their repetitions are done (or,
    // rarely, until the noise of calls this short separates them); the slow one leaves.
    assert!(reps[2] < reps[0].min(reps[1]), "{reps:?}");
}

#[test]
fn a_finalist_whose_calls_dwarf_the_switch_between_configs_is_timed_without_a_warm_up_call() {
    let (problem, [slow, fast, _]) = three();
    let paced = Paced::new(vec![
        (slow, Duration::from_millis(60)),
        (fast, Duration::from_millis(1)),
    ]);
    let policy = Policy {
        min_reps: 3,
        ..patient(3)
    };
    let mut w = Workload::new(&problem, &policy);
    let out = w.time_together(&paced, &[slow, fast], &policy, &AtomicBool::new(false));
    assert!(out.iter().all(|s| s.as_ref().unwrap().reps >= 3), "{out:?}");
    // Three rounds: the 60 ms config a timed call in each, the 1 ms one an untimed call
    // and two timed ones; a warm-up each before the first.
    assert_eq!(paced.calls(&slow), 1 + 3);
    assert_eq!(paced.calls(&fast), 1 + 3 * 3);
}
