//! Helpers shared by the `tune` binary's tests: running it as a user would, and reading what
//! it printed and wrote.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// `tune ARGS` in `cwd`, with no `KERNTUNE_DB` from the environment.
pub fn tune_cmd(args: &[&str], cwd: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tune"));
    c.args(args).current_dir(cwd).env_remove("KERNTUNE_DB");
    c
}

/// Runs `tune ARGS` in `cwd` to completion.
pub fn tune(args: &[&str], cwd: &Path) -> Output {
    tune_cmd(args, cwd).output().expect("tune runs")
}

/// What a run printed, standard output then standard error.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The names of the files in `dir`, sorted.
pub fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The single number a query on the database at `path` returns, read by another process (a
/// user's `sqlite3`, or a second tuner) through python3's sqlite3 module; 0 while the file or
/// its tables do not exist yet.
pub fn sql_count(path: &Path, query: &str) -> usize {
    let out = Command::new("python3")
        .args([
            "-c",
            // Read-only: opening a missing file would create it.
            "import pathlib, sqlite3, sys\nuri = pathlib.Path(sys.argv[1]).absolute().as_uri() + '?mode=ro'\ntry:\n    print(sqlite3.connect(uri, uri=True).execute(sys.argv[2]).fetchone()[0])\nexcept sqlite3.OperationalError:\n    print(0)",
        ])
        .arg(path)
        .arg(query)
        .output()
        .expect("python3 with its sqlite3 module runs (README, Set-up)");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{query}: {}", text(&out)))
}

/// Waits until `ready` holds, polling; panics with `what` after a minute.
pub fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !ready() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "waited a minute for {what}"
        );
        // Each look starts a process (python3 for the database): a few a second.
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Sends SIGINT to the process group `child` leads, as Ctrl-C at a terminal does: to the
/// program and every process it started. `child` must have been spawned with
/// `process_group(0)`.
pub fn ctrl_c(child: &std::process::Child) {
    let status = Command::new("kill")
        .args(["-INT", "--", &format!("-{}", child.id())])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -INT -{} failed", child.id());
}
