//! GPU devices from the command line on a host without them: the offline plan with the real
//! HIP compiler (cached in the database), and the clear no-device answers of `tune`.
//!
//! The plan needs the HIP compiler (Debian: hipcc, libamdhip64-dev); without it the plan test
//! checks the clear error instead and says so. `.ci/run` installs both and sets
//! `KERNTUNE_REQUIRE_HIP=1`, under which a missing compiler fails.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

mod common;

use common::{ctrl_c, files_in, sql_count, text, tune, tune_cmd, wait_for};

const SHAPES: [&str; 6] = [
    "--shapes",
    "gemm:m=16,n=1280,k=8192,dtype=bf16",
    "--shapes",
    "flash:q_len=512,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
    "--shapes",
    "paged:num_seqs=8,context_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
];

#[test]
fn plan_compiles_prunes_and_caches_for_mi250() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut args = vec![
        "--db",
        "plan.db",
        "--json",
        "plan",
        "--device",
        "mi250",
        "--max-candidates",
        "3",
    ];
    args.extend(SHAPES);
    let out = tune(&args, d);
    let have_compiler = kerntune_kernels::gpu::hip::HipCompiler::find();
    if let Err(e) = have_compiler {
        assert!(
            std::env::var_os("KERNTUNE_REQUIRE_HIP").is_none(),
            "KERNTUNE_REQUIRE_HIP is set but {e}"
        );
        eprintln!("plan_compiles_prunes_and_caches_for_mi250 checked only the missing-compiler error: {e}");
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains("hipcc"), "{}", text(&out));
        assert!(files_in(d).is_empty(), "{:?}", files_in(d));
        return;
    }
    assert!(out.status.success(), "{}", text(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["target"], "gfx90a");
    let problems = plan["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 3);
    for p in problems {
        let candidates = p["candidates"].as_array().unwrap();
        // Three sampled, the default and the heuristic.
        assert!((3..=5).contains(&candidates.len()), "{p}");
        assert!(p["kept"].as_u64().unwrap() >= 1, "{p}");
        for c in candidates {
            match c["verdict"].as_str().unwrap() {
                "keep" => {
                    assert!(c["resources"]["vgpr"].as_u64().unwrap() > 0, "{c}");
                    assert_eq!(c["resources"]["vgpr_spill"], 0, "{c}");
                    assert!(c["occupancy"]["waves_per_simd"].as_f64().unwrap() >= 1.0);
                }
                "pruned" => assert!(!c["reason"].as_str().unwrap().is_empty(), "{c}"),
                other => panic!("verdict {other}"),
            }
        }
    }
    let builds = plan["builds"].as_u64().unwrap();
    assert_eq!(plan["compiled"].as_u64().unwrap(), builds);
    // The second plan reads every compile from the database.
    let again = tune(&args, d);
    assert!(again.status.success(), "{}", text(&again));
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(again["compiled"], 0);
    assert_eq!(again["problems"], plan["problems"]);
}

/// Whether the HIP compiler is here; a test that needs it and returns without it says so, and
/// fails under `KERNTUNE_REQUIRE_HIP`.
fn hip_compiler(test: &str) -> bool {
    match kerntune_kernels::gpu::hip::HipCompiler::find() {
        Ok(_) => true,
        Err(e) => {
            assert!(
                std::env::var_os("KERNTUNE_REQUIRE_HIP").is_none(),
                "KERNTUNE_REQUIRE_HIP is set but {e}"
            );
            eprintln!("{test} did NOT run: {e}");
            false
        }
    }
}

/// Ctrl-C in the middle of a plan, as a terminal sends it: to `tune` and to the compilers it
/// started. The compiles in flight finish (the signal does not kill them, so none is cached as
/// a failure it caused) and are cached with those before; `tune` exits 130 saying how many,
/// and the next plan compiles only the rest. A second Ctrl-C exits at once.
#[test]
fn ctrl_c_during_a_plan_keeps_what_it_compiled() {
    if !hip_compiler("ctrl_c_during_a_plan_keeps_what_it_compiled") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let all_at_once = [
        "--db",
        "plan.db",
        "--json",
        "plan",
        "--device",
        "mi250",
        "--max-candidates",
        "48",
        "--shapes",
        SHAPES[1],
    ];
    // The interrupted runs compile one build at a time (a quarter to half a second each here,
    // the HIP headers precompiled), and the plan holds about 50 builds, so that on any machine
    // they are stopped with builds left (with 14, the second run sometimes finished before its
    // Ctrl-C); without --json, they log their progress.
    let mut args: Vec<&str> = all_at_once
        .iter()
        .filter(|a| **a != "--json")
        .copied()
        .collect();
    args.extend(["--jobs", "1"]);
    let db = d.join("plan.db");
    let cached = || sql_count(&db, "SELECT count(*) FROM gpu_compiles");
    let failed = || {
        sql_count(
            &db,
            "SELECT count(*) FROM gpu_compiles WHERE status != 'ok'",
        )
    };
    // The compilers' temporary directories, which must not outlive the runs.
    let tmp = tempfile::tempdir().unwrap();
    let start = || {
        tune_cmd(&args, d)
            .env("TMPDIR", tmp.path())
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };

    let child = start();
    wait_for("the first cached compile", || cached() > 0);
    ctrl_c(&child);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    let first = cached();
    assert!(
        text(&out).contains(&format!("interrupted: {first} builds compiled and cached")),
        "{first} cached; {}",
        text(&out)
    );
    assert_eq!(failed(), 0, "{}", text(&out));
    assert!(
        text(&out).contains(" builds for gfx90a (0 cached)"),
        "{}",
        text(&out)
    );

    let child = start();
    wait_for("a compile of the second run", || cached() > first);
    ctrl_c(&child);
    std::thread::sleep(std::time::Duration::from_millis(10));
    ctrl_c(&child);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert!(!text(&out).contains("interrupted:"), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(" builds for gfx90a ({first} cached)")),
        "{}",
        text(&out)
    );
    let second = cached();
    assert_eq!(failed(), 0);
    // The precompiled headers (11 MB) are gone with the run that exited at once. (Not
    // checked: the directory of the compile in flight, which clang may still be writing in
    // as `tune` removes it.)
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("kerntune-hip-pch-"))
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");

    let out = tune(&all_at_once, d);
    assert!(out.status.success(), "{}", text(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let builds = plan["builds"].as_u64().unwrap() as usize;
    assert!(second < builds, "{second} of {builds} were cached before");
    assert_eq!(plan["compiled"].as_u64().unwrap() as usize, builds - second);
    assert_eq!(cached(), builds);
}

#[test]
fn tune_on_an_absent_gpu_says_why_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (device, needle) in [
        ("mi250", "no gfx90a device was found"),
        ("MI300X", "no gfx942 device was found"),
        ("h200", "no sm_90 device could be used"),
        ("b200", "no sm_100 device could be used"),
    ] {
        let mut args = vec!["--device", device];
        args.extend(SHAPES);
        let out = tune(&args, d);
        assert_eq!(out.status.code(), Some(2), "{device}: {}", text(&out));
        assert!(text(&out).contains(needle), "{device}: {}", text(&out));
        assert!(text(&out).contains("Nothing was written"), "{}", text(&out));
        // A build without the vendor's feature says how to get it; one with it names what the
        // host lacks (CI runs this test both ways).
        let nvidia = matches!(device, "h200" | "b200");
        let built = [cfg!(feature = "rocm"), cfg!(feature = "cuda")];
        let expect = match (nvidia, built[usize::from(nvidia)]) {
            (true, false) => "--features cuda",
            (false, false) => "--features rocm",
            (true, true) => "no CUDA driver",
            (false, true) => "libamdhip64",
        };
        assert!(text(&out).contains(expect), "{device}: {}", text(&out));
        if !nvidia {
            assert!(text(&out).contains("tune plan --device"), "{}", text(&out));
            // With the HIP runtime installed (CI), its own answer is quoted.
            if std::env::var_os("KERNTUNE_REQUIRE_HIP").is_some() {
                assert!(text(&out).contains("hipInit"), "{}", text(&out));
            }
        }
    }
    assert!(files_in(d).is_empty(), "{:?}", files_in(d));
    // Int4 weights go the same way: GPU kernels unpack them, and the device is what is missing.
    for (device, needle) in [
        ("mi250", "no gfx90a device was found"),
        ("h200", "no sm_90 device could be used"),
    ] {
        let int4 = "gemm:m=1,n=1280,k=8192,dtype=f16,b=kn,int4=128";
        let out = tune(&["--device", device, "--shapes", int4], d);
        assert_eq!(out.status.code(), Some(2), "{device}: {}", text(&out));
        for needle in [needle, "Nothing was written"] {
            assert!(text(&out).contains(needle), "{device}: {}", text(&out));
        }
    }
    assert!(files_in(d).is_empty(), "{:?}", files_in(d));
    let out = tune(&["plan", "--shapes", "llama8b"], d);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("needs --device"), "{}", text(&out));
    assert!(files_in(d).is_empty(), "{:?}", files_in(d));
}

#[test]
fn plan_for_h100_with_nvrtc() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut args = vec![
        "--db",
        "plan.db",
        "--json",
        "plan",
        "--device",
        "h100",
        "--max-candidates",
        "2",
        "--emulate",
    ];
    args.extend(SHAPES);
    // An FP8 checkpoint's decode GEMM (W8A8) beside them, and a block-scaled one, which the
    // wgmma tiles do not compute.
    args.extend(["--shapes", "gemm:m=16,n=1280,k=8192,dtype=fp8_e4m3"]);
    let blocked = "gemm:m=16,n=1280,k=8192,dtype=fp8_e4m3,b=nk,block=128";
    args.extend(["--shapes", blocked]);
    // And a GPTQ checkpoint's (int4 words), which the wgmma and pipelined tiles do not read.
    let int4 = "gemm:m=16,n=1280,k=8192,dtype=f16,b=kn,int4=128";
    args.extend(["--shapes", int4]);
    let out = tune(&args, d);
    if let Err(e) = kerntune_kernels::gpu::nvrtc::NvrtcCompiler::find() {
        assert!(
            std::env::var_os("KERNTUNE_REQUIRE_NVRTC").is_none(),
            "KERNTUNE_REQUIRE_NVRTC is set but {e}"
        );
        eprintln!("plan_for_h100_with_nvrtc checked only the missing-NVRTC error: {e}");
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains("nvidia-cuda-nvrtc"), "{}", text(&out));
        assert!(files_in(d).is_empty(), "{:?}", files_in(d));
        return;
    }
    assert!(out.status.success(), "{}", text(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["target"], "sm_90");
    assert!(plan["compiler"].as_str().unwrap().starts_with("NVRTC 13"));
    let mut problems = plan["problems"].as_array().unwrap().clone();
    assert_eq!(problems.len(), 6);
    let at = problems.iter().position(|p| p["problem"] == int4).unwrap();
    let words = problems.remove(at);
    assert!(words["kept"].as_u64().unwrap() >= 1, "{words}");
    for c in words["candidates"].as_array().unwrap() {
        let build = c["build"].as_str().unwrap();
        assert!(
            build.contains("KT_INT4=128")
                && build.contains("KT_STAGES=1")
                && !build.contains("KT_VARIANT=3"),
            "{c}"
        );
    }
    // The block-scaled problem: builds of its blocks, none on the wgmma tiles (3), some on
    // the mma tiles (2).
    let at = problems
        .iter()
        .position(|p| p["problem"] == blocked)
        .unwrap();
    let blocks = problems.remove(at);
    assert!(blocks["kept"].as_u64().unwrap() >= 1, "{blocks}");
    for c in blocks["candidates"].as_array().unwrap() {
        let build = c["build"].as_str().unwrap();
        assert!(
            build.contains("KT_BLOCK=128") && !build.contains("KT_VARIANT=3"),
            "{c}"
        );
    }
    assert!(
        blocks["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["build"].as_str().unwrap().contains("KT_VARIANT=2")),
        "{blocks}"
    );
    assert!(
        problems.iter().any(|p| p["problem"]
            .as_str()
            .is_some_and(|s| s.contains("fp8_e4m3"))),
        "{problems:?}"
    );
    for p in &problems {
        assert!(p["kept"].as_u64().unwrap() >= 1, "{p}");
        for c in p["candidates"].as_array().unwrap() {
            if c["verdict"] == "keep" {
                let regs = c["resources"]["vgpr"].as_u64().unwrap();
                assert!((1..=255).contains(&regs), "{c}");
                assert_eq!(c["resources"]["wave_size"], 32, "{c}");
            }
        }
    }
    // --emulate ran every kept build on the host emulator (at least one per family), and none
    // of our kernels is wrong there.
    let emulated = &plan["emulated"];
    assert!(emulated["runs"].as_u64().unwrap() >= 4, "{emulated}");
    assert_eq!(emulated["failed"], 0, "{emulated}");
    assert!(!emulated["compiler"].as_str().unwrap().is_empty());
}

#[test]
fn plan_emulate_without_a_host_compiler_says_so_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = Command::new(env!("CARGO_BIN_EXE_tune"))
        .args(["--db", "plan.db", "plan", "--device", "mi250", "--emulate"])
        .args(SHAPES)
        .current_dir(d)
        .env_remove("KERNTUNE_DB")
        .env("KERNTUNE_HOST_CXX", d.join("no-such-compiler"))
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains("KERNTUNE_HOST_CXX") && t.contains("--emulate needs a C++ compiler"),
        "{t}"
    );
    assert!(files_in(d).is_empty(), "{:?}", files_in(d));
}

/// Variables set to nothing (`export KERNTUNE_HIP_CLANG=${CLANG:-}`) count as unset: the plan
/// finds its compilers as without them, and the emulator's builds go to its usual cache, not
/// into the current folder.
#[test]
fn empty_compiler_and_cache_variables_count_as_unset() {
    if !hip_compiler("empty_compiler_and_cache_variables_count_as_unset") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut command = common::tune_cmd(
        &[
            "--db",
            "plan.db",
            "--json",
            "plan",
            "--device",
            "mi250",
            "--max-candidates",
            "1",
            "--emulate",
            "--shapes",
            "gemm:m=3,n=64,k=61,dtype=f32",
        ],
        d,
    );
    for var in [
        "KERNTUNE_HIP_CLANG",
        "KERNTUNE_ROCM_DEVICE_LIBS",
        "KERNTUNE_HOST_CXX",
        "KERNTUNE_EMULATOR_CACHE",
    ] {
        command.env(var, "");
    }
    let out = command.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["target"], "gfx90a");
    assert!(plan["emulated"]["runs"].as_u64().unwrap() >= 1, "{plan}");
    assert_eq!(plan["emulated"]["failed"], 0, "{plan}");
    let files = files_in(d);
    assert!(files.iter().all(|f| f.starts_with("plan.db")), "{files:?}");
}
