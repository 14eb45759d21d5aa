//! `tune db ...` as users run it, and the database under real processes: four tuners writing
//! one file at once, three dividing the same problems, and tuners killed with SIGKILL at
//! arbitrary moments.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

use common::{ctrl_c, sql_count, text, tune, tune_cmd, wait_for};

/// Small problems, each tuned in a few milliseconds.
const PROBLEMS: [&str; 8] = [
    "gemm:m=1,n=40,k=24",
    "gemm:m=2,n=24,k=40",
    "gemm:m=3,n=32,k=17",
    "gemm:m=5,n=16,k=33",
    "gemm:m=7,n=8,k=9,dtype=bf16",
    "flash:q_len=5,q_heads=2,kv_heads=1,head_dim=16",
    "flash:q_len=7,kv_len=9,q_heads=2,kv_heads=2,head_dim=8",
    "paged:num_seqs=2,context_len=9,q_heads=2,kv_heads=1,head_dim=16,block_size=8",
];

fn tune_args<'a>(db: &'a str, problems: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--db",
        db,
        "--budget",
        "150ms",
        "--max-configs",
        "4",
        "--strategy",
        "random",
        "--json",
    ];
    for p in problems {
        args.extend(["--shapes", p]);
    }
    args
}

fn verify_ok(db: &str, cwd: &Path) {
    let out = tune(&["db", "verify", db], cwd);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

fn winners(db: &str, cwd: &Path) -> Vec<serde_json::Value> {
    let out = tune(&["--db", db, "--json", "show"], cwd);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Problems of a few hundred milliseconds each, so runs overlap and can be cut anywhere.
fn longer(count: usize) -> Vec<String> {
    (1..=count)
        .map(|i| format!("gemm:m={},n=512,k=1024", 8 * i))
        .collect()
}

fn rows_in(db: &str, cwd: &Path) -> usize {
    let out = tune(
        &["--db", db, "db", "export", "--all", "-o", "all.jsonl"],
        cwd,
    );
    assert!(out.status.success(), "{}", text(&out));
    std::fs::read_to_string(cwd.join("all.jsonl"))
        .unwrap()
        .lines()
        .count()
        - 2
}

#[test]
fn four_tuners_share_one_database_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let problems = longer(12);
    let children: Vec<_> = problems
        .chunks(3)
        .map(|mine| {
            let mine: Vec<&str> = mine.iter().map(String::as_str).collect();
            tune_cmd(&tune_args("shared.db", &mine), d)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut written = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let summary: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            summary.iter().all(|o| o["status"] == "tuned"),
            "{summary:#?}"
        );
        written += summary
            .iter()
            .map(|o| {
                ["measured", "final_round", "pruned"]
                    .map(|f| o[f].as_u64().unwrap())
                    .iter()
                    .sum::<u64>()
            })
            .sum::<u64>() as usize;
    }
    // Every winner and every measurement each process wrote is there.
    assert_eq!(winners("shared.db", d).len(), problems.len());
    assert_eq!(rows_in("shared.db", d), written);
    verify_ok("shared.db", d);
}

/// Tuners started together on one database with the same problems (one a GPU of a node, each
/// with its own CUDA_VISIBLE_DEVICES) divide them: each problem is tuned by one of them, which
/// claimed it first; the others pass it by and find it tuned when they are done with theirs.
#[test]
fn tuners_given_the_same_problems_divide_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let problems = longer(9);
    let problems: Vec<&str> = problems.iter().map(String::as_str).collect();
    let children: Vec<_> = (0..3)
        .map(|_| {
            tune_cmd(&tune_args("shared.db", &problems), d)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut tuned_by = vec![0; problems.len()];
    let mut written = 0;
    let mut tuners = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let summary: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary.len(), problems.len());
        tuners += usize::from(summary.iter().any(|o| o["status"] == "tuned"));
        for (i, o) in summary.iter().enumerate() {
            match o["status"].as_str().unwrap() {
                "tuned" => tuned_by[i] += 1,
                "skipped" => {}
                other => panic!("{}: {other}", o["problem"]),
            }
            written += ["measured", "final_round", "pruned"]
                .map(|f| o[f].as_u64().unwrap())
                .iter()
                .sum::<u64>() as usize;
        }
    }
    assert_eq!(tuned_by, vec![1; problems.len()], "each tuned once");
    assert!(tuners > 1, "the runs shared the work");
    assert_eq!(winners("shared.db", d).len(), problems.len());
    assert_eq!(rows_in("shared.db", d), written, "nothing measured twice");
    // Every claim was released (the table is there: the count reads 0 without it too).
    let db = d.join("shared.db");
    let table = "SELECT COUNT(*) FROM sqlite_master WHERE name = 'claims'";
    assert_eq!(sql_count(&db, table), 1);
    assert_eq!(sql_count(&db, "SELECT COUNT(*) FROM claims"), 0);
    verify_ok("shared.db", d);
}

#[test]
fn sigkill_at_any_moment_leaves_a_sound_database_that_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let problems = longer(6);
    let problems: Vec<&str> = problems.iter().map(String::as_str).collect();
    let args = tune_args("k.db", &problems);
    let mut retune = args.clone();
    retune.push("--retune");
    // Kill moments spread over a whole run (about 2.5 s here), from a fixed linear
    // congruential sequence: the same on every run of the test, different within it. Every
    // attempt re-tunes everything, so each kill lands mid-run.
    let mut x: u64 = 0x2545_f491;
    for _ in 0..10 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let after = Duration::from_millis(20 + (x >> 33) % 2500);
        let mut child = tune_cmd(&retune, d)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(after);
        // SIGKILL: no handler runs, nothing is flushed.
        let _ = child.kill();
        child.wait().unwrap();
        if d.join("k.db").exists() {
            verify_ok("k.db", d);
        }
    }
    let before = if d.join("k.db").exists() {
        winners("k.db", d).len()
    } else {
        0
    };
    let out = tune(&args, d);
    assert!(out.status.success(), "{}", text(&out));
    let summary: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let count = |s: &str| summary.iter().filter(|o| o["status"] == s).count();
    // What killed runs committed is kept and not redone; the rest is tuned now.
    assert_eq!(count("skipped"), before, "{summary:#?}");
    assert_eq!(count("tuned"), problems.len() - before, "{summary:#?}");
    // The problems the killed runs held are taken over at once (their processes are gone),
    // not after their leases.
    assert!(!text(&out).contains("being tuned by"), "{}", text(&out));
    assert_eq!(winners("k.db", d).len(), problems.len());
    verify_ok("k.db", d);
}

/// Ctrl-C as a terminal sends it: the run stops after the candidate in flight, commits the
/// problems it finished, exits 130 saying so, and the next run tunes only the rest.
#[test]
fn ctrl_c_stops_a_run_that_the_next_run_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let problems = longer(12);
    let problems: Vec<&str> = problems.iter().map(String::as_str).collect();
    let args = tune_args("k.db", &problems);
    let child = tune_cmd(&args, d)
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the first winner", || {
        sql_count(&d.join("k.db"), "SELECT count(*) FROM winners") > 0
    });
    ctrl_c(&child);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    let committed = winners("k.db", d).len();
    assert!(committed < problems.len(), "{}", text(&out));
    let said = format!(
        "interrupted: {committed} problems committed, {} left for the next run",
        problems.len() - committed
    );
    assert!(text(&out).contains(&said), "{}", text(&out));
    assert!(text(&out).contains("Ctrl-C again to exit at once"));
    verify_ok("k.db", d);

    let out = tune(&args, d);
    assert!(out.status.success(), "{}", text(&out));
    let summary: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let count = |s: &str| summary.iter().filter(|o| o["status"] == s).count();
    assert_eq!(count("skipped"), committed, "{summary:#?}");
    assert_eq!(count("tuned"), problems.len() - committed, "{summary:#?}");
}

#[test]
fn db_commands_exit_codes_and_messages() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = tune(&tune_args("a.db", &PROBLEMS[..3]), d);
    assert!(out.status.success(), "{}", text(&out));

    // The file alone is the whole database: what `tune` wrote is in it, not in a WAL beside it.
    std::fs::copy(d.join("a.db"), d.join("copy.db")).unwrap();
    verify_ok("copy.db", d);
    assert_eq!(winners("copy.db", d).len(), 3);

    let out = tune(&["--db", "a.db", "db", "export", "-o", "a.jsonl"], d);
    assert!(out.status.success(), "{}", text(&out));
    let out = tune(
        &[
            "--db", "a.db", "db", "export", "--all", "--format", "csv", "-o", "a.csv",
        ],
        d,
    );
    assert!(out.status.success(), "{}", text(&out));
    let csv = std::fs::read_to_string(d.join("a.csv")).unwrap();
    assert!(
        csv.starts_with("device,") && csv.lines().count() > 3,
        "{csv}"
    );

    let out = tune(&["--db", "b.db", "db", "import", "a.jsonl"], d);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("3 new"), "{}", text(&out));
    let out = tune(&["--json", "db", "diff", "a.db", "b.db"], d);
    let diff: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(diff["same"].as_array().unwrap().len(), 3);
    let out = tune(&["db", "merge", "a.db", "b.db", "-o", "m.db"], d);
    assert!(out.status.success(), "{}", text(&out));
    verify_ok("m.db", d);
    let out = tune(&["--db", "m.db", "db", "migrate"], d);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("schema 5"), "{}", text(&out));

    // Usage errors: exit 2, a message naming the input and the fix, nothing written.
    let text_of = |path: &str| std::fs::read_to_string(d.join(path)).unwrap();
    let exported = text_of("a.jsonl");
    std::fs::write(
        d.join("cut.jsonl"),
        &exported[..exported.rfind("{\"end\"").unwrap()],
    )
    .unwrap();
    let b_before = std::fs::read(d.join("b.db")).unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--db", "b.db", "db", "import", "cut.jsonl"], "cut short"),
        (&["--db", "b.db", "db", "import", "a.csv"], "CSV export"),
        (
            &["--db", "b.db", "db", "import", "none.jsonl"],
            "cannot read export",
        ),
        (&["db", "merge", "a.db", "-o", "m.db"], "exists"),
        (
            &["db", "merge", "a.db", "absent.db", "-o", "n.db"],
            "no tuning database at absent.db",
        ),
        (
            &["--db", "absent.db", "db", "export", "-o", "x.jsonl"],
            "no tuning database at absent.db",
        ),
        (&["--db", "a.db", "db", "gc"], "--stale-kernels"),
        (
            &[
                "db",
                "merge",
                "a.db",
                "-o",
                "n.db",
                "--conflict-ratio",
                "0.5",
            ],
            "--conflict-ratio",
        ),
        (
            &["db", "verify", "absent.db"],
            "no tuning database at absent.db",
        ),
        (
            &["--db", "absent.db", "db", "migrate"],
            "no tuning database at absent.db",
        ),
    ];
    for (args, needle) in cases {
        let out = tune(args, d);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(needle), "{args:?}: {}", text(&out));
    }
    assert_eq!(std::fs::read(d.join("b.db")).unwrap(), b_before);
    for absent in ["n.db", "x.jsonl", "absent.db"] {
        assert!(!d.join(absent).exists(), "{absent} was written");
    }

    // verify on a damaged database: exit 1 with the list.
    let status = Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); \
             c.execute(\"UPDATE winners SET config = json_set(config, '$.threads', 100000)\"); \
             c.execute(\"UPDATE measurements SET config = json_set(config, '$.threads', 100000) WHERE id IN (SELECT measurement_id FROM winners)\"); \
             c.commit()",
        )
        .arg(d.join("m.db"))
        .status()
        .expect("python3 with sqlite3 is available");
    assert!(status.success());
    let out = tune(&["db", "verify", "m.db"], d);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("threads"), "{}", text(&out));
    assert!(text(&out).contains("3 problems"), "{}", text(&out));

    // gc: counts on --dry-run, drops only when asked.
    let out = tune(
        &[
            "--db",
            "a.db",
            "db",
            "gc",
            "--stale-kernels",
            "--old-tools",
            "--dry-run",
        ],
        d,
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("would drop 0 measurements"),
        "{}",
        text(&out)
    );
}

/// `tune ARGS` run by a user who may read `shared` but not write it or its files: as root
/// (CI), the `nobody` user through util-linux's setpriv; otherwise the caller, with the
/// folder's write permission taken away for the run.
fn as_reader(args: &[&str], cwd: &Path, shared: &Path) -> std::process::Output {
    use std::os::unix::fs::PermissionsExt;
    let set = |mode| std::fs::set_permissions(shared, std::fs::Permissions::from_mode(mode));
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_tune"))
            .args(args)
            .current_dir(cwd)
            .env_remove("KERNTUNE_DB")
            .output()
            .expect("setpriv (util-linux) runs")
    } else {
        set(0o555).unwrap();
        let out = tune(args, cwd);
        set(0o755).unwrap();
        out
    }
}

/// A database shipped read-only (a container image's root-owned file, a read-only mount):
/// SQLite cannot create the index it reads a WAL-mode file through, and used to refuse it,
/// so `tune show` failed and a server linking the runtime ran on defaults.
#[test]
fn a_database_its_reader_may_not_write_is_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let shared = d.join("shared");
    let out_dir = d.join("out");
    for (folder, mode) in [(d, 0o755), (&shared, 0o755), (&out_dir, 0o777)] {
        std::fs::create_dir_all(folder).unwrap();
        std::fs::set_permissions(folder, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let out = tune(&tune_args("shared/k.db", &PROBLEMS[..2]), d);
    assert!(out.status.success(), "{}", text(&out));
    let owner_view = winners("shared/k.db", d);
    assert_eq!(owner_view.len(), 2);
    let before = std::fs::read_dir(&shared).unwrap().count();

    let show = as_reader(&["--db", "shared/k.db", "--json", "show"], d, &shared);
    assert!(show.status.success(), "{}", text(&show));
    let seen: Vec<serde_json::Value> = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(seen, owner_view);
    let verify = as_reader(&["db", "verify", "shared/k.db"], d, &shared);
    assert!(verify.status.success(), "{}", text(&verify));
    let export = ["--db", "shared/k.db", "db", "export", "-o", "out/k.jsonl"];
    let export = as_reader(&export, d, &shared);
    assert!(export.status.success(), "{}", text(&export));

    // What writes is refused, saying why.
    let gc = as_reader(
        &["--db", "shared/k.db", "db", "gc", "--stale-kernels"],
        d,
        &shared,
    );
    assert_eq!(gc.status.code(), Some(2), "{}", text(&gc));
    assert!(
        text(&gc).contains("can be read but not written by this process"),
        "{}",
        text(&gc)
    );
    let more = as_reader(&tune_args("shared/k.db", &PROBLEMS[2..3]), d, &shared);
    assert_eq!(more.status.code(), Some(2), "{}", text(&more));
    assert!(
        text(&more).contains("can be read but not written by this process"),
        "{}",
        text(&more)
    );
    assert_eq!(std::fs::read_dir(&shared).unwrap().count(), before);
}
