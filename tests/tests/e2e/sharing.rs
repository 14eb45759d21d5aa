//! Sharing tuning results between databases: the two-machine walk-through, the import winner
//! rules, merge laws on random databases, conflicts, diff, verify, gc, and every kind of bad
//! input leaving the target unchanged.

use std::path::{Path, PathBuf};

use kerntune::{Dispatcher, Match};
use kerntune_db::{
    Db, MeasurementRecord, Prefer, ProblemRecord, ProblemResult, RunStatus, Stats, Status,
};
use kerntune_e2e::{cpu, job, small_problems};
use kerntune_kernels::{CpuBackend, CpuSpace, Device, Problem, Space};
use kerntune_tuner::share::{self, format::Format};
use kerntune_tuner::tune::{self, device_record, kernel_record};
use proptest::prelude::*;

const HOSTS: [&str; 3] = ["host-a", "host-b", "host-c"];

/// One synthetic measurement: (problem, candidate, median ns, host), all as indices.
type Spec = (usize, usize, u32, usize);

fn problems() -> Vec<Problem> {
    small_problems().into_iter().map(|d| d.problem).collect()
}

/// Writes measurements as tuners on `HOSTS` would: one run per host, each problem's fastest
/// measurement of the run its winner, its first the default.
async fn build(path: &Path, specs: &[Spec], hash: &str, tool: &str) {
    let db = Db::open(path).await.unwrap();
    let device = Device::host();
    let dev = db.device_id(&device_record(&device)).await.unwrap();
    let problems = problems();
    for (h, host) in HOSTS.iter().enumerate() {
        let mine: Vec<&Spec> = specs.iter().filter(|s| s.3 == h).collect();
        if mine.is_empty() {
            continue;
        }
        let run = db.begin_run(tool, "synthetic", dev, host).await.unwrap();
        for (pi, p) in problems.iter().enumerate() {
            let candidates = CpuSpace.candidates(p, &device);
            let ms: Vec<MeasurementRecord> = mine
                .iter()
                .filter(|s| s.0 % problems.len() == pi)
                .map(|s| MeasurementRecord {
                    config: candidates[s.1 % candidates.len()].to_json(),
                    status: Status::Ok,
                    message: None,
                    error: Some(0.0),
                    stats: Some(Stats {
                        median_ns: f64::from(s.2),
                        min_ns: f64::from(s.2),
                        p20_ns: f64::from(s.2),
                        p80_ns: f64::from(s.2),
                        reps: 5,
                        throughput: 1.0,
                        unit: "FLOP/s".into(),
                        cold_cache: true,
                    }),
                })
                .collect();
            if ms.is_empty() {
                continue;
            }
            let best = (0..ms.len())
                .min_by(|&a, &b| {
                    let m = |i: usize| ms[i].stats.as_ref().unwrap().median_ns;
                    m(a).total_cmp(&m(b))
                })
                .unwrap();
            let kid = db.kernel_id(&kernel_record(p, "cpu", hash)).await.unwrap();
            db.record_problem(&ProblemResult {
                run_id: run,
                device_id: dev,
                kernel_id: kid,
                problem: &ProblemRecord {
                    family: p.family().to_string(),
                    key: p.key(),
                    fields: serde_json::to_string(p).unwrap(),
                },
                measurements: &ms,
                winner: Some(best),
                default: Some(0),
                final_round: 0,
                tool_version: tool,
            })
            .await
            .unwrap();
        }
        db.finish_run(run, RunStatus::Done).await.unwrap();
    }
    db.close().await;
}

/// A database's content as merge laws compare it: every measurement with its run, device,
/// kernel, problem and whether it is the winner, in id order.
async fn content(path: &Path) -> Vec<String> {
    let db = Db::open_existing(path).await.unwrap();
    let mut rows: Vec<String> = db
        .export_rows(None, true)
        .await
        .unwrap()
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    db.close().await;
    rows.sort();
    rows
}

async fn merged(dir: &Path, name: &str, inputs: &[&Path]) -> PathBuf {
    let out = dir.join(name);
    let inputs: Vec<PathBuf> = inputs.iter().map(|p| p.to_path_buf()).collect();
    share::merge(&inputs, &out, 1.5).await.unwrap();
    out
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn specs() -> impl Strategy<Value = Vec<Spec>> {
    prop::collection::vec((0..4usize, 0..40usize, 1..1000u32, 0..3usize), 1..12)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// merge is idempotent, commutative and associative on random databases, some of which
    /// share rows (B starts from an import of A).
    #[test]
    fn merge_laws(a in specs(), b in specs(), c in specs(), overlap in any::<bool>()) {
        rt().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path();
            let hash = kerntune_kernels::CPU_SOURCE_HASH;
            let (pa, pb, pc) = (d.join("a.db"), d.join("b.db"), d.join("c.db"));
            build(&pa, &a, hash, "0.1.0").await;
            if overlap {
                let export = d.join("a.jsonl");
                share::export(&pa, None, true, Format::Jsonl, &export).await.unwrap();
                share::import(&pb, &export, Prefer::Best, true).await.unwrap();
            }
            build(&pb, &b, hash, "0.1.0").await;
            build(&pc, &c, hash, "0.1.0").await;

            let a1 = merged(d, "a1.db", &[&pa]).await;
            let aa = merged(d, "aa.db", &[&pa, &pa]).await;
            prop_assert_eq!(content(&a1).await, content(&aa).await);
            let a1a1 = merged(d, "a1a1.db", &[&a1, &a1]).await;
            prop_assert_eq!(content(&a1).await, content(&a1a1).await);

            let ab = merged(d, "ab.db", &[&pa, &pb]).await;
            let ba = merged(d, "ba.db", &[&pb, &pa]).await;
            prop_assert_eq!(content(&ab).await, content(&ba).await);

            let bc = merged(d, "bc.db", &[&pb, &pc]).await;
            let ab_c = merged(d, "ab_c.db", &[&ab, &pc]).await;
            let a_bc = merged(d, "a_bc.db", &[&pa, &bc]).await;
            let abc = merged(d, "abc.db", &[&pa, &pb, &pc]).await;
            let left = content(&ab_c).await;
            prop_assert_eq!(&left, &content(&a_bc).await);
            prop_assert_eq!(&left, &content(&abc).await);
            // Each winner is its problem's fastest verified measurement.
            let db = Db::open_existing(&abc).await.unwrap();
            for w in db.winners(None).await.unwrap() {
                let fastest = db
                    .measurements(&w.problem)
                    .await
                    .unwrap()
                    .iter()
                    .filter(|m| m.1 == "ok")
                    .filter_map(|m| m.2)
                    .fold(f64::INFINITY, f64::min);
                prop_assert_eq!(w.median_ns, fastest);
            }
            db.close().await;
            Ok(())
        })?;
    }
}

/// Tune on machine A, export, import on machine B: the runtime on B dispatches A's winners.
#[tokio::test]
async fn two_machines_tune_export_import_dispatch() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let export = dir.path().join("winners.jsonl");
    let device = Device::host();
    let problems = small_problems();
    {
        let db = Db::open(&a).await.unwrap();
        tune::run(
            &job(&db, &device),
            &mut cpu(&CpuBackend, &CpuSpace),
            &problems,
        )
        .await
        .unwrap();
        db.close().await;
    }
    let n = share::export(&a, None, false, Format::Jsonl, &export)
        .await
        .unwrap();
    assert!(n >= problems.len());
    let report = share::import(&b, &export, Prefer::Best, true)
        .await
        .unwrap();
    assert!(report.rejected.is_empty(), "{:?}", report.rejected);
    assert_eq!(report.counts.winners_added as usize, problems.len());
    assert!(share::verify(&b).await.unwrap().is_empty());

    let d = Dispatcher::open(&b);
    assert_eq!(d.stats().loaded as usize, problems.len());
    let diff = share::diff(&a, &b).await.unwrap();
    assert!(diff.only_a.is_empty() && diff.only_b.is_empty() && diff.different.is_empty());
    for p in &problems {
        let sel = d.select(&p.problem);
        assert_eq!(sel.matched, Match::Exact);
        let stored = diff
            .same
            .iter()
            .find(|c| c.problem == p.problem.key())
            .unwrap();
        assert_eq!(
            sel.config,
            kerntune_kernels::Config::from_json(&stored.a.config).unwrap()
        );
    }
    // Imported rows keep their origin: the measuring host and run travel with them.
    let rows = Db::open_existing(&b)
        .await
        .unwrap()
        .export_rows(None, false)
        .await
        .unwrap();
    let original = Db::open_existing(&a)
        .await
        .unwrap()
        .export_rows(None, false)
        .await
        .unwrap();
    assert_eq!(rows, original);
}

/// Builds a source database with one winner of `median` for the first small problem on a
/// fresh host, exported to a file.
async fn offer(dir: &Path, name: &str, median: u32) -> PathBuf {
    let db = dir.join(format!("{name}.db"));
    build(
        &db,
        &[(0, 1, median, 1)],
        kerntune_kernels::CPU_SOURCE_HASH,
        "0.1.0",
    )
    .await;
    let file = dir.join(format!("{name}.jsonl"));
    share::export(&db, None, false, Format::Jsonl, &file)
        .await
        .unwrap();
    file
}

async fn winner_ns(path: &Path) -> f64 {
    let db = Db::open_existing(path).await.unwrap();
    let w = db.winners(None).await.unwrap();
    db.close().await;
    w[0].median_ns
}

#[tokio::test]
async fn import_keeps_or_replaces_winners_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let local = |name: &str| {
        let path = d.join(name);
        async move {
            build(
                &path,
                &[(0, 0, 100, 0)],
                kerntune_kernels::CPU_SOURCE_HASH,
                "0.1.0",
            )
            .await;
            path
        }
    };
    let (fast, slow) = (offer(d, "fast", 50).await, offer(d, "slow", 200).await);

    let t = local("best.db").await;
    share::import(&t, &slow, Prefer::Best, true).await.unwrap();
    assert_eq!(winner_ns(&t).await, 100.0);
    let r = share::import(&t, &fast, Prefer::Best, true).await.unwrap();
    assert_eq!((r.counts.winners_replaced, winner_ns(&t).await), (1, 50.0));

    let t = local("local.db").await;
    let r = share::import(&t, &fast, Prefer::Local, true).await.unwrap();
    assert_eq!((r.counts.winners_kept, winner_ns(&t).await), (1, 100.0));

    let t = local("imported.db").await;
    share::import(&t, &slow, Prefer::Imported, true)
        .await
        .unwrap();
    assert_eq!(winner_ns(&t).await, 200.0);
    // A later local run replaces an imported winner only when it is faster.
    build(
        &t,
        &[(0, 2, 300, 0)],
        kerntune_kernels::CPU_SOURCE_HASH,
        "0.1.0",
    )
    .await;
    assert_eq!(winner_ns(&t).await, 200.0);
    build(
        &t,
        &[(0, 2, 20, 0)],
        kerntune_kernels::CPU_SOURCE_HASH,
        "0.1.0",
    )
    .await;
    assert_eq!(winner_ns(&t).await, 20.0);
}

/// Replaces line `index` (0 = header) of an export.
fn edit_line(file: &Path, out: &Path, index: usize, f: impl Fn(&mut serde_json::Value)) {
    let text = std::fs::read_to_string(file).unwrap();
    let lines: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == index {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                f(&mut v);
                v.to_string()
            } else {
                l.to_string()
            }
        })
        .collect();
    std::fs::write(out, lines.join("\n") + "\n").unwrap();
}

#[tokio::test]
async fn bad_rows_are_rejected_one_by_one_with_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = d.join("src.db");
    // Several winners, so each edited line spoils one row and leaves the rest.
    build(
        &src,
        &[(0, 0, 10, 0), (1, 0, 10, 0), (2, 0, 10, 0), (3, 0, 10, 0)],
        kerntune_kernels::CPU_SOURCE_HASH,
        "0.1.0",
    )
    .await;
    let file = d.join("src.jsonl");
    share::export(&src, None, false, Format::Jsonl, &file)
        .await
        .unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    let rows = text.lines().count() - 2;
    assert_eq!(rows, 4);

    type Edit = (&'static str, fn(&mut serde_json::Value));
    let edits: [Edit; 10] = [
        ("out-of-range config", |v| v["config"]["nc"] = 0.into()),
        ("enormous threads", |v| {
            v["config"]["threads"] = 1_000_000.into()
        }),
        ("unknown backend", |v| v["kernel"]["backend"] = "tpu".into()),
        ("unknown device kind", |v| {
            v["device"]["kind"] = "fpga".into()
        }),
        ("unknown GPU", |v| {
            v["device"]["kind"] = "gpu".into();
            v["device"]["model"] = "Voodoo 2".into();
        }),
        ("identity mismatch", |v| {
            v["device"]["compute_units"] = 64.into()
        }),
        ("non-canonical problem", |v| {
            v["problem"] = v["problem"]
                .as_str()
                .unwrap()
                .replace(",dtype=", ",  dtype=")
                .into()
        }),
        ("error beyond tolerance", |v| v["error"] = 0.5.into()),
        ("impossible timings", |v| {
            v["stats"]["median_ns"] = (-1.0).into()
        }),
        ("median above p80", |v| {
            v["stats"]["median_ns"] = 1e300.into()
        }),
    ];
    for (what, edit) in edits {
        let target = d.join(format!("{}.db", what.replace(' ', "-")));
        let bad = d.join("bad.jsonl");
        edit_line(&file, &bad, 1, edit);
        let r = share::import(&target, &bad, Prefer::Best, false)
            .await
            .unwrap();
        assert_eq!(r.rejected.len(), 1, "{what}: {:?}", r.rejected);
        assert!(
            r.rejected[0].source.ends_with(":2"),
            "{what}: {:?}",
            r.rejected
        );
        assert_eq!(r.counts.added as usize, rows - 1, "{what}");
        assert!(share::verify(&target).await.unwrap().is_empty(), "{what}");
        // --strict refuses the whole file and writes nothing.
        let strict = d.join(format!("{}-strict.db", what.replace(' ', "-")));
        let err = share::import(&strict, &bad, Prefer::Best, true)
            .await
            .unwrap_err();
        assert!(
            err.is_usage() && err.to_string().contains("nothing imported"),
            "{err}"
        );
        assert!(!strict.exists());
    }
    // A line that is not JSON at all is one more rejected row.
    let garbage = d.join("garbage.jsonl");
    let mut lines: Vec<&str> = text.lines().collect();
    lines[2] = "{\"uid\": \"not a row";
    std::fs::write(&garbage, lines.join("\n")).unwrap();
    let r = share::import(&d.join("g.db"), &garbage, Prefer::Best, false)
        .await
        .unwrap();
    assert_eq!((r.rejected.len(), r.counts.added), (1, 3));
    assert!(r.rejected[0].reason.contains("unreadable row"));
}

/// Every way a file or database can be unusable as a whole: a clear error, target unchanged.
#[tokio::test]
async fn unusable_inputs_fail_and_leave_the_target_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = d.join("src.db");
    build(
        &src,
        &[(0, 0, 10, 0), (1, 1, 20, 1)],
        kerntune_kernels::CPU_SOURCE_HASH,
        "0.1.0",
    )
    .await;
    let file = d.join("src.jsonl");
    share::export(&src, None, true, Format::Jsonl, &file)
        .await
        .unwrap();
    let target = d.join("target.db");
    build(
        &target,
        &[(2, 0, 10, 0)],
        kerntune_kernels::CPU_SOURCE_HASH,
        "0.1.0",
    )
    .await;
    let before = content(&target).await;
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();

    let write = |name: &str, body: String| {
        let p = d.join(name);
        std::fs::write(&p, body).unwrap();
        p
    };
    let truncated = write("truncated.jsonl", lines[..lines.len() - 1].join("\n"));
    let cut_mid_line = write("cut.jsonl", text[..text.len() / 2].to_string());
    let extra = write(
        "extra.jsonl",
        [&lines[..2], &lines[1..]].concat().join("\n"),
    );
    let newer = d.join("newer.jsonl");
    edit_line(&file, &newer, 0, |v| v["kerntune_export"] = 2.into());
    let csv = d.join("src.csv");
    share::export(&src, None, true, Format::Csv, &csv)
        .await
        .unwrap();
    let empty = write("empty.jsonl", String::new());
    let not_export = write("other.jsonl", "{\"hello\": 1}\n".into());
    let cases = [
        (truncated, "cut short"),
        (cut_mid_line, "cut short"),
        (extra, "lines were added or removed"),
        (newer, "upgrade kerntune"),
        (csv, "CSV export"),
        (empty, "empty"),
        (not_export, "not a kerntune export header"),
        (d.join("absent.jsonl"), "cannot read export"),
    ];
    for (file, why) in cases {
        let err = share::import(&target, &file, Prefer::Best, false)
            .await
            .unwrap_err();
        assert!(err.is_usage(), "{err}");
        assert!(err.to_string().contains(why), "{}: {err}", file.display());
        assert_eq!(content(&target).await, before, "{}", file.display());
    }

    // A corrupt target and a target of a future schema: refused, bytes untouched.
    let corrupt = write(
        "corrupt.db",
        "SQLite format 3\0".to_string() + &"x".repeat(5000),
    );
    let future = d.join("future.db");
    build(
        &future,
        &[(0, 0, 10, 0)],
        kerntune_kernels::CPU_SOURCE_HASH,
        "0.1.0",
    )
    .await;
    // The mark is folded into the main file before its bytes are taken: left in the WAL, it
    // would reach the main file whenever the last connection to close checkpoints it (a
    // refused open among them), and the comparison below would see a change that is none.
    let status = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); \
             c.execute(\"INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (99, 'future', 1, x'00', 0)\"); \
             c.commit(); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()",
        )
        .arg(&future)
        .status()
        .expect("python3 with sqlite3 is available");
    assert!(status.success());
    for db in [&corrupt, &future] {
        let bytes = std::fs::read(db).unwrap();
        let err = share::import(db, &file, Prefer::Best, false)
            .await
            .unwrap_err();
        assert!(err.is_usage(), "{err}");
        assert!(
            err.to_string().contains("not a kerntune") || err.to_string().contains("newer"),
            "{err}"
        );
        assert_eq!(std::fs::read(db).unwrap(), bytes);
        let err = share::merge(&[src.clone(), db.to_path_buf()], &d.join("m.db"), 1.5)
            .await
            .unwrap_err();
        assert!(err.is_usage(), "{err}");
        assert!(!d.join("m.db").exists());
        assert!(share::verify(db).await.is_err());
    }
}

#[tokio::test]
async fn conflicts_diff_verify_and_gc() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let hash = kerntune_kernels::CPU_SOURCE_HASH;
    // The same config: 100 ns on host-a, 400 ns on host-b.
    let (a, b) = (d.join("a.db"), d.join("b.db"));
    build(&a, &[(0, 3, 100, 0), (1, 0, 50, 0)], hash, "0.1.0").await;
    build(&b, &[(0, 3, 400, 1), (2, 0, 70, 1)], hash, "0.1.0").await;
    let m = d.join("m.db");
    let report = share::merge(&[a.clone(), b.clone()], &m, 1.5)
        .await
        .unwrap();
    assert_eq!(report.conflicts.len(), 1, "{:?}", report.conflicts);
    let c = &report.conflicts[0];
    assert_eq!(
        (c.fast_host.as_str(), c.slow_host.as_str(), c.ratio()),
        ("host-a", "host-b", 4.0)
    );
    // Within the ratio, no conflict.
    let quiet = share::merge(&[a.clone(), b.clone()], &d.join("q.db"), 5.0)
        .await
        .unwrap();
    assert!(quiet.conflicts.is_empty());
    // An existing output is never overwritten.
    let err = share::merge(std::slice::from_ref(&a), &m, 1.5)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("exists"), "{err}");

    let diff = share::diff(&a, &b).await.unwrap();
    let problems = problems();
    assert_eq!(
        diff.only_a,
        [(Device::host().identity(), problems[1].key())]
    );
    assert_eq!(
        diff.only_b,
        [(Device::host().identity(), problems[2].key())]
    );
    assert_eq!(diff.same.len(), 1);
    assert_eq!(diff.same[0].speedup_b_over_a, 0.25);
    let c = d.join("c.db");
    build(&c, &[(0, 5, 90, 0)], hash, "0.1.0").await;
    assert_eq!(share::diff(&a, &c).await.unwrap().different.len(), 1);

    // verify: sound, then broken by hand in three ways.
    assert!(share::verify(&m).await.unwrap().is_empty());
    let status = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); \
             c.execute(\"UPDATE winners SET config = json_set(config, '$.nc', 0) WHERE rowid = 1\"); \
             c.execute(\"UPDATE measurements SET status = 'failed_verification' WHERE id = (SELECT measurement_id FROM winners WHERE rowid = 2)\"); \
             c.execute('PRAGMA foreign_keys = OFF'); \
             c.execute('UPDATE winners SET problem_id = 999 WHERE rowid = 3'); \
             c.commit()",
        )
        .arg(&m)
        .status()
        .unwrap();
    assert!(status.success());
    let problems_found = share::verify(&m).await.unwrap();
    assert!(
        problems_found.iter().any(|p| p.contains("foreign key")),
        "{problems_found:?}"
    );
    assert!(
        problems_found.iter().any(|p| p.contains("config differs")),
        "{problems_found:?}"
    );
    assert!(
        problems_found
            .iter()
            .any(|p| p.contains("status failed_verification")),
        "{problems_found:?}"
    );

    // gc: rows of other kernel sources and tool versions go only when asked.
    let g = d.join("g.db");
    build(&g, &[(0, 0, 10, 0), (1, 0, 10, 0)], hash, "0.1.0").await;
    build(&g, &[(0, 1, 5, 1)], "00000000000000ff", "0.1.0").await;
    build(&g, &[(1, 1, 5, 2)], hash, "0.0.9").await;
    let dry = share::gc(&g, true, true, true).await.unwrap();
    assert_eq!((dry.measurements, dry.winners), (2, 2));
    assert_eq!(content(&g).await.len(), 4);
    let done = share::gc(&g, true, false, false).await.unwrap();
    assert_eq!((done.measurements, done.winners, done.kernels), (1, 1, 1));
    let done = share::gc(&g, false, true, false).await.unwrap();
    assert_eq!((done.measurements, done.winners, done.runs), (1, 1, 1));
    // Problem 1 lost its 0.0.9 winner and got the fastest measurement left.
    assert_eq!(done.winners_rechosen, 1);
    assert_eq!(content(&g).await.len(), 2);
    assert!(share::verify(&g).await.unwrap().is_empty());
    assert_eq!(Dispatcher::open(&g).stats().loaded, 2);
}
