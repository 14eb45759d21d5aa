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
