//! The C example, compiled with the system C compiler against `kerntune.h` and the shared
//! library, run on a database, its output checked against a GEMM computed here.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `libkerntune.so` and returns its directory. `cargo test` builds the library only as
/// an rlib for the tests, so the shared library is built here, into a target directory of its
/// own (the one `cargo test` holds is locked while tests run).
fn lib_dir(crate_dir: &Path) -> PathBuf {
    let target = crate_dir.join("../target/c-abi");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--lib",
            "-p",
            "kerntune-runtime",
            "--manifest-path",
        ])
        .arg(crate_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building libkerntune.so failed");
    target.join("debug")
}

#[test]
fn c_example_runs_a_gemm_and_reports_stats() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let libs = lib_dir(crate_dir);
    assert!(
        libs.join("libkerntune.so").exists(),
        "libkerntune.so not found in {}",
        libs.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("gemm");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .arg(crate_dir.join("examples/gemm.c"))
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg("-L")
        .arg(&libs)
        .args(["-lkerntune", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .status()
        .unwrap_or_else(|e| panic!("the C compiler `{cc}` could not be run: {e}"));
    assert!(status.success(), "compiling examples/gemm.c failed");

    let out = Command::new(&exe)
        .arg(dir.path().join("none.db"))
        .env("LD_LIBRARY_PATH", &libs)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("no tuning database"));

    let (m, n, k) = (3, 4, 5);
    let lines: Vec<&str> = stdout.lines().collect();
    for (i, line) in lines.iter().enumerate().take(m) {
        let got: Vec<f64> = line.split(' ').map(|v| v.parse().unwrap()).collect();
        let want: Vec<f64> = (0..n)
            .map(|j| {
                (0..k)
                    .map(|p| ((i + p) as f64) * (j as f64 - p as f64))
                    .sum()
            })
            .collect();
        assert_eq!(got, want, "row {i}");
    }
    assert!(
        lines[m].starts_with("error: invalid gemm problem: m = 0"),
        "{}",
        lines[m]
    );
    assert_eq!(
        lines[m + 1],
        "match=3 exact=0 bucket=0 nearest=0 defaults=1 loaded=0"
    );
    // The library is built without the `rocm` feature here: the GPU entry point answers
    // KT_STATUS_NO_DEVICE and names the feature.
    assert!(
        lines[m + 2].starts_with("gpu: status=5 ") && lines[m + 2].contains("--features rocm"),
        "{}",
        lines[m + 2]
    );
}
