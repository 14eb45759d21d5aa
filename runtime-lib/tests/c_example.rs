//! The C example, compiled with the system C compiler against `kerntune.h` and the shared
//! library, and the Python one, calling the library through ctypes, each run on a database,
//! their output checked against a GEMM computed here.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The directory of `libkerntune.so`: the library crate lists `cdylib` among its crate types,
/// so the `cargo test` that built this test built the shared library with the same profile and
/// features, into the `deps/` directory this test runs from (`cargo build` copies it one level
/// up; `cargo test` does not). Building it again into a target directory of its own took two of
/// the test suite's four minutes.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    exe.parent()
        .expect("a test runs from <target>/<profile>/deps")
        .to_path_buf()
}

/// A run of either example on a missing database: it succeeded, said it runs on defaults,
/// and printed the 3x5 by 5x4 GEMM a row a line, then the bad call's error. Returns its lines
/// and the number of GEMM rows.
fn check_example_run(out: &Output) -> (Vec<String>, usize) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("no tuning database"), "{stderr}");
    let lines: Vec<String> = stdout.lines().map(String::from).collect();
    let (m, n, k) = (3, 4, 5);
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
    (lines, m)
}

/// `examples/<name>` compiled with the system C compiler against `kerntune.h` and the shared
/// library (and `extra` libraries), warnings as errors, into `dir`: the executable's path.
fn compile_example(name: &str, extra: &[&str], dir: &Path) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let libs = lib_dir();
    assert!(
        libs.join("libkerntune.so").exists(),
        "libkerntune.so not found in {}: cargo builds it with the tests of kerntune-runtime",
        libs.display()
    );
    let exe = dir.join(name.trim_end_matches(".c"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .arg(crate_dir.join("examples").join(name))
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg("-L")
        .arg(&libs)
        .arg("-lkerntune")
        .args(extra)
        .args(["-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .status()
        .unwrap_or_else(|e| panic!("the C compiler `{cc}` could not be run: {e}"));
    assert!(status.success(), "compiling examples/{name} failed");
    exe
}

#[test]
fn c_example_runs_a_gemm_and_reports_stats() {
    let libs = lib_dir();
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_example("gemm.c", &[], dir.path());

    let out = Command::new(&exe)
        .arg(dir.path().join("none.db"))
        .env("LD_LIBRARY_PATH", &libs)
        .output()
        .unwrap();
    let (lines, m) = check_example_run(&out);
    // The fp8 product (exact here) equals the f32 one; an fp8 call without scales, and one
    // with a count of A's scales neither 1 nor M, are refused by name.
    assert_eq!(lines[m + 1], "fp8: matches");
    assert!(
        lines[m + 2].starts_with("error: dtype fp8_e4m3 takes scales: call kt_gemm_scaled()"),
        "{}",
        lines[m + 2]
    );
    assert!(
        lines[m + 3].contains("a_scales") && lines[m + 3].contains("one (per tensor) or 3"),
        "{}",
        lines[m + 3]
    );
    // Block-scaled, the same product; B's per-channel scales are not a block's, by name.
    assert_eq!(lines[m + 4], "fp8 blocks: matches");
    assert!(
        lines[m + 5].contains("b_scales") && lines[m + 5].contains("one per 32 × 32 block"),
        "{}",
        lines[m + 5]
    );
    // int4 weights, with zero points and without, the same as the example's loops; scales
    // per column only, refused by name.
    assert_eq!(lines[m + 6], "int4: matches");
    assert!(
        lines[m + 7].contains("b_scales") && lines[m + 7].contains("takes 8, [2, 4]"),
        "{}",
        lines[m + 7]
    );
    // An AWQ checkpoint's packing, converted by the library, the same as the loops.
    assert_eq!(lines[m + 8], "int4 awq: matches");
    assert_eq!(
        lines[m + 9],
        "match=3 exact=0 bucket=0 nearest=0 defaults=6 loaded=0"
    );
    // Without the `rocm` feature the GPU entry point answers KT_STATUS_NO_DEVICE and names the
    // feature; with it, the HIP runtime answers: opened on an MI250, no device elsewhere.
    let gpu = &lines[m + 10];
    if cfg!(feature = "rocm") {
        assert!(
            gpu == "gpu: opened" || gpu.starts_with("gpu: status=5 "),
            "{gpu}"
        );
    } else {
        assert!(
            gpu.starts_with("gpu: status=5 ") && gpu.contains("--features rocm"),
            "{gpu}"
        );
    }

    // Four processes at once, as the workers of a tensor-parallel server, each recording its
    // untuned shapes into the same file when it frees its dispatcher: none is lost.
    let untuned = dir.path().join("untuned.txt");
    let workers: Vec<_> = (0..4)
        .map(|_| {
            Command::new(&exe)
                .arg(dir.path().join("none.db"))
                .env("LD_LIBRARY_PATH", &libs)
                .env("KERNTUNE_RECORD_UNTUNED", &untuned)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for worker in workers {
        assert!(worker.wait_with_output().unwrap().status.success());
    }
    let text = std::fs::read_to_string(&untuned).unwrap();
    let rows: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        rows,
        [
            // Two int4 calls a process: with zero points and without.
            "gemm:m=3,n=4,k=16,dtype=f32,b=kn,int4=8\t8",
            "gemm:m=3,n=4,k=5,dtype=f32,b=nk\t4",
            "gemm:m=3,n=4,k=5,dtype=fp8_e4m3,b=nk\t4",
            "gemm:m=3,n=4,k=5,dtype=fp8_e4m3,b=nk,block=32\t4",
            // The AWQ checkpoint's, eight columns wide.
            "gemm:m=3,n=8,k=16,dtype=f32,b=kn,int4=8\t4",
        ],
        "{text}"
    );
}

/// The attention example in C: flash attention and paged attention through the C ABI, with
/// and without a sliding window, with sinks, with a soft-cap and with ALiBi, flash attention with value
/// heads narrower than the keys, paged attention on an fp8 cache under bf16 queries and on a
/// latent cache, against its own loops; values wider than the keys, an fp8 scale that is not
/// positive, a value cache beside a latent one and a window without the causal mask are
/// refused by name; the program checks the ABI version
/// before its first call.
#[test]
fn c_attention_example_matches_its_loops_with_windows_sinks_softcaps_and_alibi() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_example("attention.c", &["-lm"], dir.path());
    let out = Command::new(&exe)
        .arg(dir.path().join("none.db"))
        .env("LD_LIBRARY_PATH", lib_dir())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    // Each call's line, or (an error's line) what the refusal names.
    let expected = [
        Ok("flash window=0"),
        Ok("flash window=6"),
        Ok("flash window=6 sinks"),
        Ok("flash window=0 softcap"),
        Ok("flash window=0 alibi"),
        Ok("flash v_head_dim=8"),
        Err("v_head_dim"),
        Ok("paged window=0"),
        Ok("paged window=20"),
        Ok("paged window=0 sinks"),
        Ok("paged window=20 softcap"),
        Ok("paged window=20 alibi"),
        Ok("paged fp8_e4m3"),
        Err("v_scale"),
        Ok("paged latent v_head_dim=12"),
        Err("value_cache"),
        Err("causal=true"),
    ];
    assert_eq!(lines.len(), expected.len(), "{stdout}");
    for (line, want) in lines.iter().zip(expected) {
        match want {
            Ok(call) => {
                let difference: f64 = line
                    .strip_prefix(&format!("{call}: max difference "))
                    .unwrap_or_else(|| panic!("{line}"))
                    .parse()
                    .unwrap();
                assert!(difference <= 1e-4, "{line}");
            }
            Err(named) => assert!(
                line.starts_with("error: ") && line.contains(named),
                "{line}"
            ),
        }
    }
}

/// The same GEMM from Python through ctypes, as a Python server would call the library, and
/// its fp8 form through kt_gemm_scaled.
#[test]
fn python_example_runs_the_same_gemm_through_ctypes() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let untuned = dir.path().join("untuned.txt");
    let out = Command::new("python3")
        .arg(crate_dir.join("examples/gemm.py"))
        .arg(lib_dir().join("libkerntune.so"))
        .arg(dir.path().join("none.db"))
        .arg(&untuned)
        .output()
        .expect("python3 runs (README, Set-up)");
    let (lines, m) = check_example_run(&out);
    assert_eq!(lines[m + 1], "fp8: matches");
    assert_eq!(
        lines[m + 2],
        "match=3 exact=0 bucket=0 nearest=0 defaults=2 loaded=0 untuned=2"
    );
    let text = std::fs::read_to_string(&untuned).unwrap();
    for key in [
        "gemm:m=3,n=4,k=5,dtype=f32,b=nk\t1",
        "gemm:m=3,n=4,k=5,dtype=fp8_e4m3,b=nk\t1",
    ] {
        assert!(text.contains(key), "{text}");
    }
}

/// The GPU example in C (`scripts/gpu-check.sh` runs it on an NVIDIA GPU, on the database
/// its tuning wrote): it compiles and links with no CUDA present, and where the library has
/// no usable device it exits 2 with the library's reason, before touching the driver.
#[test]
fn cuda_c_example_builds_and_without_a_device_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_example("cuda_gemm.c", &["-ldl"], dir.path());
    let run = |args: &[&str]| {
        Command::new(&exe)
            .args(args)
            .env("LD_LIBRARY_PATH", lib_dir())
            .output()
            .unwrap()
    };
    let usage = run(&[]);
    assert_eq!(usage.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&usage.stderr).contains("usage:"));

    let db = dir.path().join("none.db");
    let out = run(&[db.to_str().unwrap(), "h200"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing ran");
    assert!(stderr.starts_with("kt_gpu_open: "), "{stderr}");
    if !cfg!(feature = "cuda") {
        assert!(stderr.contains("--features cuda"), "{stderr}");
    }
}

/// The GPU example from PyTorch (`scripts/gpu-check.sh` runs it where PyTorch and an NVIDIA
/// GPU are): the library is asked first, so where it has no usable device the script exits 2
/// with the library's reason, without PyTorch.
#[test]
fn torch_gpu_example_without_a_device_says_why() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/torch_gpu.py");
    let usage = Command::new("python3").arg(&script).output().unwrap();
    assert_eq!(usage.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&usage.stderr).contains("usage:"));

    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("python3")
        .arg(&script)
        .arg(lib_dir().join("libkerntune.so"))
        .arg(dir.path().join("none.db"))
        .arg("h200")
        .output()
        .expect("python3 runs (README, Set-up)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing ran");
    assert!(stderr.starts_with("kt_gpu_open: "), "{stderr}");
    if !cfg!(feature = "cuda") {
        assert!(stderr.contains("--features cuda"), "{stderr}");
    }
}
