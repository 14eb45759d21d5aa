//! Dispatch overhead: `select()` with 10,000 winners loaded, `open()` of 100,000 winners, and
//! an M = 1 GEMM through the C ABI against the same kernel called directly.
//!
//! `cargo bench -p kerntune-runtime`

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use kerntune::capi::{kt_gemm, kt_open, KtDispatcher, KtDtype, KtMatch};
use kerntune::{Dispatcher, Match};
use kerntune_db::{Db, MeasurementRecord, ProblemRecord, ProblemResult, RunStatus, Status};
use kerntune_kernels::kernel::{GemmArgs, Scratch};
use kerntune_kernels::{
    Backend, CpuBackend, CpuSpace, Device, Problem, Space, Tensor, CPU_SOURCE_HASH,
};
use kerntune_tuner::tune::{device_record, kernel_record};

/// Writes `n` GEMM winners (distinct N, K, M) for the host, as a tuner would; a finished run
/// leaves the snapshot row the runtime reads, an unfinished one only the winner rows.
fn fill(path: &Path, n: usize, finish: bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let db = Db::open(path).await.unwrap();
        let device = Device::host();
        let dev = db.device_id(&device_record(&device)).await.unwrap();
        let run = db
            .begin_run("bench", "bench", dev, "test-host")
            .await
            .unwrap();
        let sample: Problem = "gemm:m=1,n=8,k=8".parse().unwrap();
        let kid = db
            .kernel_id(&kernel_record(&sample, "cpu", CPU_SOURCE_HASH))
            .await
            .unwrap();
        for i in 0..n {
            let p: Problem = format!(
                "gemm:m={},n={},k={}",
                1 << (i % 8),
                64 + i / 8 % 100,
                64 + i / 800
            )
            .parse()
            .unwrap();
            let c = CpuSpace.heuristic(&p, &device);
            let m = MeasurementRecord {
                config: c.to_json(),
                status: Status::Ok,
                message: None,
                error: Some(0.0),
                stats: Some(kerntune_db::Stats {
                    median_ns: 1000.0,
                    min_ns: 900.0,
                    p20_ns: 950.0,
                    p80_ns: 1100.0,
                    reps: 5,
                    throughput: 1e9,
                    unit: "FLOP/s".into(),
                    cold_cache: true,
                }),
            };
            let rec = ProblemRecord {
                family: "gemm".into(),
                key: p.key(),
                fields: String::new(),
            };
            let ms = [m];
            db.record_problem(&ProblemResult {
                run_id: run,
                device_id: dev,
                kernel_id: kid,
                problem: &rec,
                measurements: &ms,
                winner: Some(0),
                default: Some(0),
                final_round: 0,
                tool_version: "bench",
            })
            .await
            .unwrap();
        }
        if finish {
            db.finish_run(run, RunStatus::Done).await.unwrap();
        }
        db.close().await;
    });
}

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("10k.db");
    fill(&small, 10_000, true);
    let d = Dispatcher::open(&small);
    assert_eq!(d.stats().loaded, 10_000);
    let exact: Problem = "gemm:m=4,n=100,k=70".parse().unwrap();
    assert_eq!(d.select(&exact).matched, Match::Exact);
    let bucket: Problem = "gemm:m=3,n=100,k=70".parse().unwrap();
    c.bench_function("select_exact_10k", |b| {
        b.iter(|| black_box(d.select(black_box(&exact))))
    });
    c.bench_function("select_bucket_10k", |b| {
        b.iter(|| black_box(d.select(black_box(&bucket))))
    });

    // p99 of single select() calls, timed in batches of 100 to stay above clock resolution.
    let mut per_call: Vec<f64> = (0..20_000)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..100 {
                black_box(d.select(black_box(&exact)));
            }
            t.elapsed().as_nanos() as f64 / 100.0
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    eprintln!(
        "select_exact_10k: median {:.1} ns, p99 {:.1} ns (batches of 100)",
        per_call[per_call.len() / 2],
        per_call[per_call.len() * 99 / 100]
    );

    let big = dir.path().join("100k.db");
    let rows_only = dir.path().join("100k-rows.db");
    fill(&big, 100_000, true);
    fill(&rows_only, 100_000, false);
    assert_eq!(Dispatcher::open(&big).stats().loaded, 100_000);
    assert_eq!(Dispatcher::open(&rows_only).stats().loaded, 100_000);
    let mut g = c.benchmark_group("open");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.bench_function("open_100k", |b| {
        b.iter(|| black_box(Dispatcher::open(&big)))
    });
    // The same winners without a snapshot (a tuner killed before it finished).
    g.bench_function("open_100k_rows", |b| {
        b.iter(|| black_box(Dispatcher::open(&rows_only)))
    });
    g.finish();

    // An M = 1 GEMM (Llama-3.1-70B TP8 QKV, bf16) through the C ABI versus the kernel called
    // directly with the same config.
    let p: Problem = "gemm:m=1,n=1280,k=8192,dtype=bf16".parse().unwrap();
    let a = vec![half::bf16::from_f32(0.5); 8192];
    let w = vec![half::bf16::from_f32(0.25); 1280 * 8192];
    let mut out = vec![0f32; 1280];
    let path = std::ffi::CString::new(small.to_str().unwrap()).unwrap();
    let mut handle: *mut KtDispatcher = std::ptr::null_mut();
    // SAFETY: valid path and output pointer.
    unsafe { kt_open(path.as_ptr(), &mut handle) };
    let config = d.select(&p).config;
    let mut scratch = Scratch::new();
    let mut g = c.benchmark_group("gemm_m1_qkv_bf16");
    g.bench_function("direct", |b| {
        b.iter(|| {
            let s = scratch.get(CpuBackend.scratch_len(&p, &config));
            let args = GemmArgs::new(Tensor::Bf16(&a), Tensor::Bf16(&w), &mut out);
            CpuBackend
                .run(&p, &config, kerntune_kernels::kernel::Args::Gemm(args), s)
                .unwrap();
        })
    });
    g.bench_function("c_abi", |b| {
        let mut m = KtMatch::Default;
        b.iter(|| {
            // SAFETY: buffers hold m·k, k·n and m·n elements.
            unsafe {
                kt_gemm(
                    handle,
                    1,
                    1280,
                    8192,
                    KtDtype::Bf16,
                    true,
                    a.as_ptr().cast(),
                    w.as_ptr().cast(),
                    out.as_mut_ptr(),
                    &mut m,
                )
            }
        })
    });
    g.finish();
    // SAFETY: handle from kt_open.
    unsafe { kerntune::capi::kt_free(handle) };
}

criterion_group!(dispatch, benches);
criterion_main!(dispatch);
