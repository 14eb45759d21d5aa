//! `bench/gpu_goals.py`, which judges a device run of `scripts/gpu-check.sh`: on a run folder
//! written here (two GEMM processes' rows, flash and paged rows, SDPA's timings) it merges the rows,
//! names each kernel form's fastest config, and prints each goal's ratio and verdict, with
//! its exit status saying whether any was missed.

use std::path::Path;
use std::process::Command;

fn goals(folder: &Path) -> (i32, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/gpu_goals.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(folder)
        .output()
        .expect("python3 runs (README, Set-up)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap_or(-1), stdout)
}

const PREFILL: &str = "gemm:m=2048,n=7168,k=8192,dtype=bf16,b=nk";
const FLASH: &str =
    "flash:batch=1,q_len=2048,kv_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16";
const LATENT: &str = "paged:num_seqs=32,context_len=4096,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=64,dtype=bf16,scale=0.1352";

/// A row as gpu-check writes it; `timed` fastest first, so its first config is the best. A
/// config written `CONFIG|REGISTERS|SPILLED` is timed with its resources, as gpu-check writes
/// since session 43; one without, as runs before wrote.
fn row(problem: &str, default_us: f64, cublas_us: Option<f64>, timed: &[(&str, f64)]) -> String {
    let best = timed[0].0.split('|').next().unwrap();
    let best_us = timed[0].1;
    let list: Vec<String> = timed
        .iter()
        .map(|(c, us)| match c.split('|').collect::<Vec<_>>()[..] {
            [c, regs, spilled] => format!("[\"{c}\", {}, {regs}, {spilled}]", us * 1e3),
            _ => format!("[\"{c}\", {}]", us * 1e3),
        })
        .collect();
    format!(
        r#"{{"problem": "{problem}", "candidates": 3, "verified": 3, "failed": [],
            "default_ns": {}, "best_ns": {}, "best": "{best}", "cublas_ns": {},
            "cublas_f32_ns": {}, "timed": [{}]}}"#,
        default_us * 1e3,
        best_us * 1e3,
        cublas_us.map_or("null".to_string(), |u| (u * 1e3).to_string()),
        // cuBLAS writing f32 (kerntune's output) in this test takes 1.1 times its 16-bit run.
        cublas_us.map_or("null".to_string(), |u| (u * 1.1e3).to_string()),
        list.join(", ")
    )
}

#[test]
fn a_run_folder_is_judged_form_by_form_and_goal_by_goal() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The wgmma process's rows and the other GEMM process's: the problem's best is the
    // fastest over both.
    let wgmma = row(
        PREFILL,
        2000.0,
        Some(295.0),
        &[
            (
                "gpu wgmma 128x256x64 tile 1x256 stages=4 swizzle=128 specialized",
                400.0,
            ),
            (
                "gpu wgmma 128x224x64 tile 1x224 stages=4 swizzle=128 specialized tma block-tiles=4",
                410.0,
            ),
            (
                "gpu wgmma 128x224x64 tile 1x224 stages=4 swizzle=128 specialized tma",
                420.0,
            ),
            (
                "gpu wgmma 128x224x64 tile 1x224 stages=4 swizzle=128 specialized tma cluster=2",
                430.0,
            ),
            (
                "gpu wgmma 128x256x64 tile 1x256 stages=3 swizzle=128",
                700.0,
            ),
            ("gpu wgmma 128x256x32 tile 1x256 stages=4", 1285.0),
        ],
    );
    let mma = row(
        PREFILL,
        2000.0,
        Some(295.0),
        &[("gpu mma 128x128x64 tile 4x4 stages=3", 965.0)],
    );
    let flash = row(
        FLASH,
        500.0,
        None,
        &[
            ("gpu mma br=64 bc=128 split=4|244|0", 50.0),
            ("gpu mma br=128 bc=128|242|0", 82.0),
            ("gpu mma br=128 bc=64 lanes=1 split=2|255|4", 47.0),
            ("gpu mma br=128 bc=32 lanes=1|255|0", 60.0),
        ],
    );
    std::fs::write(d.join("gpu-check-gemm-wgmma.json"), format!("[{wgmma}]")).unwrap();
    // A decode GEMM in bf16 and as an FP8 checkpoint runs it: fp8 has no cuBLAS row, and its
    // speed over bf16's is shown beside the goals.
    let decode = "gemm:m=1,n=1280,k=8192,dtype=bf16,b=nk";
    let bf16_decode = row(
        decode,
        100.0,
        Some(8.0),
        &[("gpu skinny 1x16x512 tile 1x4 split-k=4", 8.0)],
    );
    // cuBLASLt's fp8 GEMM, 6 us, as gpu-check adds it to fp8 rows.
    let fp8_decode = row(
        &decode.replace("bf16", "fp8_e4m3"),
        100.0,
        None,
        &[("gpu skinny 1x16x1024 tile 1x4 split-k=4", 5.0)],
    )
    .replacen(
        r#""timed""#,
        r#""cublaslt_ns": 6000.0, "cublaslt_scales": "per-token and per-channel scales", "timed""#,
        1,
    );
    // And as a 4-bit checkpoint runs it: no peer of its own (cuBLAS takes no int4 words), its
    // speed over bf16's and over cuBLAS's bf16 shown beside the goals.
    let int4_decode = row(
        "gemm:m=1,n=1280,k=8192,dtype=bf16,b=kn,int4=128",
        50.0,
        None,
        &[("gpu skinny 1x32x512 tile 1x8 split-k=8", 4.0)],
    );
    std::fs::write(
        d.join("gpu-check-gemm.json"),
        format!("[{mma}, {bf16_decode}, {fp8_decode}, {int4_decode}]"),
    )
    .unwrap();
    std::fs::write(d.join("gpu-check-flash.json"), format!("[{flash}]")).unwrap();
    // Paged attention's forms: a thread a token, groups of lanes, several heads a block on
    // CUDA cores, and on tensor cores.
    let paged = row(
        LATENT,
        900.0,
        None,
        &[
            ("gpu partition=512 threads=128 heads=16 mma|184|0", 90.0),
            ("gpu partition=256 threads=128 lanes=16", 450.0),
            ("gpu partition=128 threads=128 heads=16", 300.0),
            ("gpu partition=512 threads=128", 900.0),
        ],
    );
    std::fs::write(d.join("gpu-check-paged.json"), format!("[{paged}]")).unwrap();
    // The flash tiles by warpgroup MMA in a process of their own: the best over both again.
    let flash_wgmma = row(
        FLASH,
        500.0,
        None,
        &[
            ("gpu mma br=128 bc=128 wgmma", 48.0),
            ("gpu mma br=128 bc=128 wgmma specialized pingpong", 49.0),
        ],
    );
    std::fs::write(
        d.join("gpu-check-flash-wgmma.json"),
        format!("[{flash_wgmma}]"),
    )
    .unwrap();

    // Without SDPA's timings the flash goal cannot be judged: missed, and said why.
    let (code, out) = goals(d);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("no sdpa.json"), "{out}");

    std::fs::write(
        d.join("sdpa.json"),
        r#"{"us": {"default": 40.0, "flash": 38.0, "cudnn": 35.0}}"#,
    )
    .unwrap();
    let (code, out) = goals(d);
    let line = |needle: &str| {
        out.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with `{needle}` in:\n{out}"))
            .to_string()
    };
    // Each form's fastest, fastest first within a problem.
    let specialized = line("wgmma swizzled specialized  ");
    assert!(specialized.contains("400.0 us"), "{specialized}");
    assert!(
        line("specialized tma block-tiles").contains("410.0 us"),
        "{out}"
    );
    assert!(line("specialized tma  ").contains("420.0 us"), "{out}");
    assert!(
        line("specialized tma cluster").contains("430.0 us"),
        "{out}"
    );
    assert!(line("wgmma swizzled  ").contains("700.0 us"), "{out}");
    assert!(line("mma split").contains("50.0 us"), "{out}");
    // Warps of 32 query rows are a form of their own, split or not; registers and spills
    // where the run recorded them.
    let split_32 = line("mma 32-row-warps split");
    assert!(split_32.contains("47.0 us"), "{split_32}");
    assert!(split_32.contains("255 regs  4 spilled"), "{split_32}");
    assert!(line("mma 32-row-warps  ").contains("60.0 us"), "{out}");
    assert!(!specialized.contains("regs"), "{specialized}");
    assert!(line("mma wgmma  ").contains("48.0 us"), "{out}");
    assert!(
        line("mma wgmma specialized pingpong").contains("49.0 us"),
        "{out}"
    );
    assert!(
        out.find("400.0 us").unwrap() < out.find("965.0 us").unwrap(),
        "{out}"
    );
    let tensor = line("paged heads mma  ");
    assert!(tensor.contains("90.0 us"), "{tensor}");
    assert!(tensor.contains("184 regs  0 spilled"), "{tensor}");
    assert!(line("paged heads  ").contains("300.0 us"), "{out}");
    assert!(line("paged lanes  ").contains("450.0 us"), "{out}");
    assert!(line("paged  ").contains("900.0 us"), "{out}");
    assert!(
        line(&format!("{LATENT}: tuned vs default")).contains("10.00x"),
        "{out}"
    );
    // The goals: 295 / 400 = 0.74 of cuBLAS, 40 / 48 = 0.83 of SDPA's default (0.73 of its
    // fastest backend), both over the default.
    assert!(
        line("tuned vs cuBLAS").contains("0.74x (goal >= 0.7): met"),
        "{out}"
    );
    assert!(
        line("tuned vs PyTorch SDPA").contains("0.83x (goal >= 0.7): met"),
        "{out}"
    );
    assert!(
        line("SDPA's fastest backend (cudnn)").contains("0.73x"),
        "{out}"
    );
    // Beside the goal, not judged: cuBLAS writing f32, 324.5 / 400.
    assert!(
        line("cuBLAS writing f32 as kerntune does").contains("0.81x"),
        "{out}"
    );
    assert!(!line("cuBLAS writing f32").contains("goal"), "{out}");
    assert!(
        line(&format!("{PREFILL}: tuned vs default")).contains("5.00x"),
        "{out}"
    );
    assert!(
        line("dtype=fp8_e4m3,b=nk: tuned fp8 vs tuned bf16").contains("1.60x"),
        "{out}"
    );
    assert!(
        !out.contains("dtype=fp8_e4m3,b=nk: tuned vs cuBLAS "),
        "{out}"
    );
    assert!(
        line("dtype=fp8_e4m3,b=nk: tuned vs cuBLASLt fp8")
            .contains("1.20x (per-token and per-channel scales)"),
        "{out}"
    );
    // Int4: 8 / 4 over both bf16 timings, no goal against a peer of its own.
    assert!(
        line("int4=128: tuned int4 vs tuned bf16").contains("2.00x"),
        "{out}"
    );
    assert!(
        line("int4=128: tuned int4 vs cuBLAS bf16").contains("2.00x"),
        "{out}"
    );
    assert!(!out.contains("int4=128: tuned vs cuBLAS"), "{out}");
    assert!(
        line("int4=128: tuned vs default").contains("12.50x (goal >= 1): met"),
        "{out}"
    );
    assert!(out.contains("0 goals missed"), "{out}");
    assert_eq!(code, 0, "{out}");
}

#[test]
fn a_folder_without_timings_is_reported_not_guessed() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = goals(dir.path());
    assert_eq!(code, 1);
    assert!(out.contains("no gpu-check-*.json"), "{out}");
}
