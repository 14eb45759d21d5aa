//! The final round of a sweep: the default and the fastest candidates of the search timed
//! again, side by side, and the winner and its speedup taken from those timings.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use indicatif::ProgressBar;
use kerntune_db::{Db, MeasurementRecord, ProblemRecord, ProblemResult, RunStatus, Stats, Status};
use kerntune_e2e::{job, panicking_config, small_problems, FakeBackend};
use kerntune_kernels::{Config, CpuSpace, Device, Problem, Space};
use kerntune_tuner::measure::{stats, Failure, Policy, Workload};
use kerntune_tuner::tune::{self, sweep_candidates, Measured, Swept, TimeTogether};

/// Five distinct configs of a small GEMM, the default first.
fn configs(device: &Device) -> (Problem, Vec<Config>) {
    let problem = small_problems()[0].problem;
    let mut list = vec![CpuSpace.default_config(&problem, device)];
    for c in CpuSpace.candidates(&problem, device) {
        if list.len() < 5 && !list.contains(&c) {
            list.push(c);
        }
    }
    assert_eq!(list.len(), 5);
    (problem, list)
}

/// What one sweep of the five configs did.
struct Run {
    list: Vec<Config>,
    swept: Swept,
    /// Calls of the search's `measure` closure.
    measured: usize,
    /// The configs the final round was given, when it ran side by side.
    finalists: Option<Vec<Config>>,
}

/// Sweeps the five configs exhaustively with scripted timings: `search[i]` is config i's in
/// the search (and when re-measured), `together[i]` in a side-by-side final round.
async fn sweep(search: [f64; 5], together: Option<[Result<f64, Failure>; 5]>) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("k.db")).await.unwrap();
    let device = Device::host();
    let (problem, list) = configs(&device);
    let index: HashMap<Config, usize> = list.iter().enumerate().map(|(i, c)| (*c, i)).collect();
    let timing = |ns: f64| stats(&problem, vec![ns; 3], true);
    let mut measured = 0;
    let mut measure = |c: &Config, _: Option<f64>| -> Measured {
        measured += 1;
        Ok((1e-7, timing(search[index[c]])))
    };
    let mut finalists = None;
    let mut side_by_side = |cs: &[Config]| -> Vec<Result<Stats, Failure>> {
        finalists = Some(cs.to_vec());
        let t = together.as_ref().expect("side by side only when given");
        cs.iter().map(|c| t[index[c]].clone().map(timing)).collect()
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
        together
            .is_some()
            .then_some(&mut side_by_side as &mut TimeTogether<'_>),
    )
    .expect("not interrupted");
    db.close().await;
    Run {
        list,
        swept,
        measured,
        finalists,
    }
}

fn config_of(run: &Run, record: usize) -> Config {
    Config::from_json(&run.swept.records[record].config).unwrap()
}

fn median(run: &Run, record: usize) -> f64 {
    run.swept.records[record].stats.as_ref().unwrap().median_ns
}

#[tokio::test]
async fn a_lucky_search_timing_loses_the_final_round() {
    // Config 1 was fastest in the search, but side by side config 2 is.
    let run = sweep(
        [150.0, 90.0, 100.0, 120.0, 300.0],
        Some([Ok(150.0), Ok(110.0), Ok(100.0), Ok(118.0), Ok(300.0)]),
    )
    .await;
    // The three fastest besides the default, and the default; the slowest stays out.
    let finalists = run.finalists.clone().unwrap();
    assert_eq!(finalists, [1, 2, 3, 0].map(|i| run.list[i]));
    assert_eq!(run.measured, 5);
    assert_eq!(run.swept.final_round, 4);
    assert_eq!(run.swept.records.len(), 9);
    for r in &run.swept.records[5..] {
        assert_eq!(r.status, Status::Ok);
        assert_eq!(
            r.message.as_deref(),
            Some("final round: timed side by side with 3 others")
        );
        assert_eq!(
            r.error,
            Some(1e-7),
            "the search's verification error is kept"
        );
    }
    let winner = run.swept.winner.unwrap();
    assert!(winner >= 5, "the winner is a final-round record");
    assert_eq!(config_of(&run, winner), run.list[2]);
    let default = run.swept.default.unwrap();
    assert!(
        default >= 5,
        "the default's speedup is against its final-round timing"
    );
    assert_eq!(config_of(&run, default), run.list[0]);
    assert_eq!(median(&run, default) / median(&run, winner), 1.5);
}

#[tokio::test]
async fn the_default_wins_when_it_is_fastest_side_by_side() {
    let run = sweep(
        [150.0, 90.0, 100.0, 120.0, 300.0],
        Some([Ok(95.0), Ok(110.0), Ok(100.0), Ok(118.0), Ok(300.0)]),
    )
    .await;
    let winner = run.swept.winner.unwrap();
    assert_eq!(Some(winner), run.swept.default);
    assert_eq!(config_of(&run, winner), run.list[0]);
}

#[tokio::test]
async fn a_finalist_that_fails_in_the_final_round_cannot_win() {
    let run = sweep(
        [150.0, 90.0, 100.0, 120.0, 300.0],
        Some([
            Ok(150.0),
            Err(Failure::Error("the kernel crashed".into())),
            Err(Failure::Wrong(0.5)),
            Ok(118.0),
            Ok(300.0),
        ]),
    )
    .await;
    let winner = run.swept.winner.unwrap();
    assert_eq!(config_of(&run, winner), run.list[3]);
    let finals = &run.swept.records[5..];
    assert_eq!(finals[0].status, Status::Error);
    assert_eq!(
        finals[0].message.as_deref(),
        Some("final round: timed side by side with 3 others: the kernel crashed")
    );
    assert_eq!(finals[1].status, Status::FailedVerification);
    assert!(finals[1]
        .message
        .as_deref()
        .unwrap()
        .starts_with("final round: timed side by side with 3 others: relative error"));
}

#[tokio::test]
async fn without_side_by_side_timing_the_finalists_are_re_measured_in_turn() {
    let run = sweep([150.0, 90.0, 100.0, 120.0, 300.0], None).await;
    assert_eq!(run.measured, 5 + 4, "each finalist measured once more");
    assert_eq!(run.swept.final_round, 4);
    assert_eq!(
        run.swept.records[5].message.as_deref(),
        Some("final round: re-timed in turn with 3 others")
    );
    let winner = run.swept.winner.unwrap();
    assert!(winner >= 5);
    assert_eq!(config_of(&run, winner), run.list[1]);
}

#[test]
fn side_by_side_timing_times_each_config_and_keeps_a_crash_to_its_own() {
    let device = Device::host();
    let (problem, list) = configs(&device);
    let policy = Policy {
        min_reps: 4,
        max_reps: 6,
        max_time: Duration::from_millis(20),
        target_ci: 0.0,
        rotate_bytes: 3 << 20,
    };
    let mut w = Workload::new(&problem, &policy);
    let configs = [list[0], panicking_config(), list[1]];
    let out = w.time_together(&FakeBackend, &configs, &policy, &AtomicBool::new(false));
    assert_eq!(out.len(), 3);
    for i in [0, 2] {
        let s = out[i].as_ref().expect("times");
        assert!(s.reps >= 4, "{s:?}");
        assert!(s.cold_cache, "rotated through copies");
        assert!(s.min_ns > 0.0 && s.min_ns <= s.median_ns, "{s:?}");
    }
    assert!(
        matches!(&out[1], Err(Failure::Error(m)) if m.contains("the fake kernel crashed")),
        "{:?}",
        out[1]
    );
}

/// Writes one run of the five configs: the search's timings, and (when `finals` is given)
/// a final round of configs 1, 2 and the default, whose fastest is the winner.
async fn one_run(path: &std::path::Path, host: &str, search: [f64; 5], finals: Option<[f64; 3]>) {
    let db = Db::open(path).await.unwrap();
    let device = Device::host();
    let (problem, list) = configs(&device);
    let mut record = tune::device_record(&device);
    record.host = host.into();
    let dev = db.device_id(&record).await.unwrap();
    let kernel = tune::kernel_record(&problem, "cpu", kerntune_kernels::CPU_SOURCE_HASH);
    let kid = db.kernel_id(&kernel).await.unwrap();
    let run = db.begin_run("test", "test", dev, host).await.unwrap();
    let ok = |c: &Config, ns: f64, message: Option<&str>| MeasurementRecord {
        config: c.to_json(),
        status: Status::Ok,
        message: message.map(String::from),
        error: Some(0.0),
        stats: Some(stats(&problem, vec![ns; 3], true)),
    };
    let mut ms: Vec<MeasurementRecord> = list
        .iter()
        .zip(search)
        .map(|(c, ns)| ok(c, ns, None))
        .collect();
    let (winner, default, final_round) = match finals {
        Some(f) => {
            let round = [1, 2, 0];
            for (&i, ns) in round.iter().zip(f) {
                ms.push(ok(
                    &list[i],
                    ns,
                    Some("final round: timed side by side with 2 others"),
                ));
            }
            let best = (0..3).min_by(|&a, &b| f[a].total_cmp(&f[b])).unwrap();
            (5 + best, 7, 3)
        }
        None => {
            let best = (0..5)
                .min_by(|&a, &b| search[a].total_cmp(&search[b]))
                .unwrap();
            (best, 0, 0)
        }
    };
    db.record_problem(&ProblemResult {
        run_id: run,
        device_id: dev,
        kernel_id: kid,
        problem: &ProblemRecord {
            family: problem.family().to_string(),
            key: problem.key(),
            fields: serde_json::to_string(&problem).unwrap(),
        },
        measurements: &ms,
        winner: Some(winner),
        default: Some(default),
        final_round,
        tool_version: "test",
    })
    .await
    .unwrap();
    db.finish_run(run, RunStatus::Done).await.unwrap();
    db.close().await;
}

async fn merged_winner(inputs: &[std::path::PathBuf], out: &std::path::Path) -> (Config, f64) {
    kerntune_tuner::share::merge(inputs, out, 10.0)
        .await
        .unwrap();
    let db = Db::open_existing(out).await.unwrap();
    let w = db.winners(None).await.unwrap();
    db.close().await;
    assert_eq!(w.len(), 1);
    (Config::from_json(&w[0].config).unwrap(), w[0].median_ns)
}

#[tokio::test]
async fn a_merge_chooses_winners_among_final_rounds_not_lucky_search_timings() {
    let dir = tempfile::tempdir().unwrap();
    let device = Device::host();
    let (_, list) = configs(&device);
    // Config 1's search timing (90) was lucky: side by side config 2 is faster.
    let a = dir.path().join("a.db");
    one_run(
        &a,
        "host-a",
        [150.0, 90.0, 100.0, 120.0, 300.0],
        Some([110.0, 100.0, 150.0]),
    )
    .await;
    let (config, ns) = merged_winner(std::slice::from_ref(&a), &dir.path().join("m1.db")).await;
    assert_eq!((config, ns), (list[2], 100.0));
    // The mark survives the merge: merging the merge again picks the same.
    let (config, _) = merged_winner(&[dir.path().join("m1.db")], &dir.path().join("m2.db")).await;
    assert_eq!(config, list[2]);
    // A run without a final round (written before there was one) offers every timing.
    let b = dir.path().join("b.db");
    one_run(&b, "host-b", [150.0, 95.0, 100.0, 120.0, 300.0], None).await;
    let (config, ns) = merged_winner(&[a, b], &dir.path().join("m3.db")).await;
    assert_eq!((config, ns), (list[1], 95.0));
}
